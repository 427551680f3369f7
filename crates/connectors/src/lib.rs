//! # ubik-connectors
//!
//! Transports that need no client library: JSON-lines files, stdin, the
//! deterministic `demo://orders` generator, and the stdout sink. Kafka and
//! webhooks live in their own crates. All of them implement the
//! [`ubik_engine::connector`] traits and carry bytes only; decoding is the
//! format layer's job.

pub mod demo;
pub mod file;
pub mod stdout;

pub use demo::DemoSource;
pub use file::FileSource;
pub use stdout::StdoutSink;
