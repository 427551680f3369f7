//! # ubik-sqltest
//!
//! Golden SQL tests in sqllogictest format, run against the streaming
//! engine. `CREATE TABLE` declares a source, `INSERT INTO ... VALUES`
//! appends rows to it (in arrival order; `INSERT INTO t PARTITION (n)
//! VALUES ...` to source partition `n`, 0 by default), `SET name = 'value'`
//! sets a query option, and each `query` runs a streaming query over
//! everything inserted and returns its **changelog**: one row per record,
//! first column `+` (upsert) or `-` (tombstone; non-key columns shown as
//! `-`). Numbers are shown as written on the wire (a DECIMAL keeps its
//! scale). After `SET dead_letters = 'show'`, the rows the query rejected
//! follow the changelog as `! <reason code> <row>` (the row's index in
//! insertion order, from 0).
//!
//! Every query also runs with other batchings (one row per batch, odd
//! sizes), with the partitions interleaved differently, and with a
//! checkpoint + restore in the middle; if any of them emits different bytes
//! or rejects other rows, the query fails.

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
