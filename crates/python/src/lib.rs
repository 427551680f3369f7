//! `ubik._ubik`: the native half of the Python package. It converts types
//! (pyarrow <-> arrow-rs through the Arrow C Data Interface, zero-copy) and
//! maps errors to Python exceptions; the work happens in `ubik-runtime`,
//! with the GIL released.

mod errors;

/// mimalloc keeps freed batch buffers for the next batch instead of returning them to
/// the kernel and paying for fresh zeroed pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod options;
mod session;

use pyo3::prelude::*;

#[pymodule]
fn _ubik(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Large frees go back to the kernel at once: mimalloc would keep them
    // for a second, past the memory budget (see `ubik_state::memory`).
    ubik_state::memory::release_with_mimalloc();
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(session::validate, m)?)?;
    m.add_class::<session::Session>()?;
    // The keyword arguments that are settings: the runtime's one list.
    let names: Vec<&str> = ubik_runtime::settings::SETTINGS
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    m.add("SETTINGS", names)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
