//! Operator state, declared in one typed layer: group interning and
//! per-group accumulators ([`KeyedState`]), rows held for the watermark
//! ([`PendingRows`]), the typed names of state in a checkpoint
//! ([`StateEntry`]), rows by key ([`KeyedRows`]), and the store that cold state and checkpoints'
//! changes go to ([`SharedStore`]).

pub(crate) mod backing;
pub mod entry;
pub mod interner;
pub mod keyed;
pub mod pending;
pub mod rows;
pub mod store;
pub(crate) mod table;

pub use entry::StateEntry;
pub use interner::Interner;
pub use keyed::{AggInputs, KeyedState};
pub use pending::{PendingPart, PendingRows};
pub use rows::{KeyedRows, Upsert};
pub use store::SharedStore;
