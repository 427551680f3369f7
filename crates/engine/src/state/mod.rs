//! Operator state: group interning and per-group accumulators.

pub mod interner;
pub mod keyed;

pub use keyed::{AggInputs, KeyedState};
