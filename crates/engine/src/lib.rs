//! # ubik-engine
//!
//! The compute core of ubik: SQL planning on DataFusion, window assignment,
//! incremental aggregation with one accumulator state per (group, window),
//! per-partition watermarks, the changelog of upserts and tombstones, and the
//! checkpoint format. It reads Arrow batches and writes Arrow batches; it
//! depends on no I/O client (Kafka, HTTP and files live in connector crates).

pub mod accumulate;
pub mod checkpoint;
pub mod error;
pub(crate) mod inline_bytes;
pub mod operator;
pub mod plan;
pub mod progress;
pub mod query;
pub mod shuffle;
pub mod sql;
pub mod state;
pub mod time;

pub use checkpoint::QuerySnapshot;
pub use error::{EngineError, Result};
pub use operator::{ChangeBatch, Output, Reject, RejectReason};
pub use plan::{QueryOptions, QueryPlan};
pub use query::{Query, SpillStats, StateOptions};
pub use sql::{Catalog, plan_query};
pub use state::SharedStore;
pub use ubik_state;
