//! # ubik-runtime
//!
//! Runs a pipeline: a source's bytes are decoded into Arrow, go through the
//! engine's query, and come out as a changelog for a sink (the CLI) or as
//! Arrow batches for a host (the Python package). The runtime owns the
//! exactly-once protocol: emit, commit the output, then checkpoint source
//! positions and engine state atomically.
//!
//! - [`spec`] and [`settings`]: what a pipeline is, validated before
//!   anything opens; one parser and one set of defaults for every surface.
//! - [`connect`]: the front door that opens sources, sinks and dead-letter
//!   outputs from a spec; [`codec`] picks their formats.
//! - [`pipeline`], [`runner`], [`host`]: running it into a byte sink or a host.
//! - [`group`]: one process's share of a consumer group's tasks.

pub mod changes;
pub mod checkpoint;
pub mod codec;
mod completion;
pub mod connect;
mod cpu;
pub mod dead_letter;
pub mod error;
pub mod group;
pub mod host;
pub mod pipeline;
pub mod progress;
pub mod record_meta;
pub mod runner;
pub mod settings;
pub mod shuffle;
pub mod spec;
mod spill;

pub use connect::{Opened, open, open_pipeline, validate};
pub use error::{ErrorClass, Result, RuntimeError};
pub use pipeline::{OperatorStatus, PartitionStatus, Pipeline, StageStatus, Stats, Step};
pub use settings::{ErrorPolicy, Settings};
pub use spec::{DeadLetterSpec, Endpoint, GroupSpec, PipelineSpec, SinkSpec, SourceSpec};
