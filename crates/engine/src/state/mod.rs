//! Operator state, declared in one typed layer: group interning and
//! per-group accumulators ([`KeyedState`]), rows held for the watermark
//! ([`PendingRows`]), and the typed names of state in a checkpoint
//! ([`StateEntry`]).

pub mod entry;
pub mod interner;
pub mod keyed;
pub mod pending;

pub use entry::StateEntry;
pub use interner::Interner;
pub use keyed::{AggInputs, KeyedState};
pub use pending::{PendingPart, PendingRows};
