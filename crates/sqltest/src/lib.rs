//! # ubik-sqltest
//!
//! Golden SQL tests in sqllogictest format, run against the streaming
//! engine. `CREATE TABLE` declares a source, `INSERT INTO ... VALUES`
//! appends rows to it (in arrival order), `SET name = 'value'` sets a query
//! option, and each `query` runs a streaming query over everything inserted
//! and returns its **changelog**: one row per record, first column `+`
//! (upsert) or `-` (tombstone; non-key columns shown as `-`).
//!
//! Every query also runs with other batchings (one row per batch, odd
//! sizes) and with a checkpoint + restore in the middle; if any of them
//! emits different bytes, the query fails.

pub mod db;
pub mod harness;

pub use db::StreamDb;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Engine(#[from] ubik_engine::EngineError),
    #[error(transparent)]
    Format(#[from] ubik_format::FormatError),
    #[error(transparent)]
    Runtime(#[from] ubik_runtime::RuntimeError),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Other(String),
}
