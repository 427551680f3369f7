//! # ubik-runtime
//!
//! Runs a pipeline: a source's bytes are decoded into Arrow, go through the
//! engine's query, and come out as a changelog for a sink (the CLI) or as
//! Arrow batches for a host (the Python package). The runtime owns the
//! exactly-once protocol: emit, commit the output, then checkpoint source
//! positions and engine state atomically.

pub mod changes;
pub mod checkpoint;
pub mod config;
pub mod dead_letter;
pub mod error;
pub mod host;
pub mod pipeline;
pub mod runner;

pub use config::{CheckpointConfig, ErrorPolicy, PipelineConfig, SourceSpec, parse_source};
pub use error::{Result, RuntimeError};
pub use pipeline::{Pipeline, Stats, Step, plan_for};
