//! # ubik-format
//!
//! Formats, separate from transports: bytes in, Arrow out, and back.
//!
//! - [`decoder`]: the [`RecordDecoder`] trait and the [`Format`] a source
//!   names to pick one.
//! - [`json`]: JSON records (NDJSON lines, Kafka messages, webhook events)
//!   decoded straight into Arrow columns, with per-record error reporting
//!   (flat schemas in one pass by `flat_json`).
//! - [`changelog`]: result rows encoded as canonical JSON key/value pairs
//!   (or Kafka Connect's JSON envelope).
//! - [`debezium`]: Debezium's change events (JSON) unwrapped into a
//!   table's rows and deletions.
//! - [`encoder`]: the [`ChangeEncoder`] trait a sink's output format implements.
//! - [`schema`]: input schemas declared as a SQL column list or a JSON file,
//!   or inferred from a sample.
//! - [`timestamp`]: the fast RFC 3339 / epoch-millis parser.

pub mod changelog;
pub mod debezium;
pub mod decoder;
pub mod encoder;
pub mod error;
mod flat_json;
pub mod json;
pub mod schema;
#[cfg(test)]
mod test_rng;
pub mod timestamp;

pub use decoder::{BadRecord, Decoded, Format, RecordDecoder};
pub use encoder::ChangeEncoder;
pub use error::{FormatError, Result};
