//! # ubik-connectors
//!
//! Transports that need no client library: JSON-lines files, stdin, the
//! deterministic `demo://orders` generator, the Nexmark benchmark's stream
//! (`nexmark://bid`), in-process Arrow, and the stdout sink. Kafka and
//! webhooks live in their own crates. All of them implement the
//! [`ubik_connector`] traits and carry bytes only; decoding is the
//! format layer's job.

pub mod arrow;
pub mod demo;
pub mod file;
pub mod nexmark;
mod read_ahead;
pub mod stdout;

pub use arrow::ArrowSource;
pub use demo::DemoSource;
pub use file::FileSource;
pub use nexmark::NexmarkSource;
pub use stdout::StdoutSink;
