//! # ubik-state
//!
//! The state store under ubik's stateful operators. Hot state stays in the
//! operators, in memory, in their own layouts; this crate keeps the rest
//! on local disk as immutable sorted runs of keyed Arrow rows:
//!
//! - [`run`]: one run, an Arrow IPC file sorted by key plus an index (the
//!   first key of every block and a bloom filter), read a block at a time;
//! - [`store`]: named tables of runs, point lookups in batches, scans,
//!   checkpoints as lists of runs ([`StoreManifest`]), and deletion of the
//!   files no kept checkpoint names;
//! - [`compact`]: size-tiered merging of runs on a background thread;
//! - [`writer`]: sorting, writing and syncing new runs' files on a
//!   background thread, while the store serves them from memory;
//! - [`cache`] and [`bloom`]: the block cache and the filters;
//! - [`memory`]: returning large frees to the operating system at once.
//!
//! Why runs of our own rather than an embedded LSM: a checkpoint must be
//! a set of immutable files that several kept checkpoints share and that a
//! restore opens without reading them (an LSM without a checkpoint API
//! cannot give that; fjall has none), the rows are already Arrow batches
//! at both ends, and a file is readable by any Arrow tool.

pub mod bloom;
pub mod cache;
pub mod compact;
pub mod error;
pub mod memory;
pub mod merge;
pub mod run;
mod sorting;
pub mod store;
pub mod writer;

pub use error::{Result, StateError};
pub use sorting::KeyEncoder;
pub use store::{
    Lookup, StateStore, StoreManifest, StoreOptions, StoreStats, TableId, has_dictionary,
};
pub use writer::Durability;
