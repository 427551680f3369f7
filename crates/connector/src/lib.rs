//! # ubik-connector
//!
//! The contract between the runtime and connectors (transports), and the
//! data that crosses it. Connectors move bytes; formats (`ubik-format`) turn
//! bytes into Arrow; the engine computes. This crate is small on purpose:
//! connector crates (Kafka, webhooks, files) depend on it, not on the engine.
//!
//! Exactly-once comes from three promises, written on the traits and relied
//! on by the checkpoint protocol:
//!
//! 1. a [`Source`] can resume from any position it reported, delivering
//!    exactly the records after it, in the same order per partition;
//! 2. the engine's output after a position is a pure function of those
//!    records, so a replay re-emits byte-identical records;
//! 3. a [`Sink`] makes records durable on [`Sink::commit`], and the runtime
//!    writes a checkpoint only after that commit succeeded.
//!
//! A crash between commit and checkpoint replays the uncommitted tail, whose
//! records are byte-identical duplicates that a latest-per-key consumer or a
//! lake MERGE folds away.

mod change;
mod dead_letter;
mod error;
pub mod failpoint;
mod replica;
mod sink;
mod source;
pub mod time;

pub use change::ChangeBatch;

/// Schema metadata naming a source's primary key (its column names, comma
/// separated). A source with a primary key is a versioned table: each row
/// is the key's version from its event time on, and the engine joins it
/// temporally rather than as a stream.
pub const PRIMARY_KEY_METADATA: &str = "ubik.primary_key";

/// Schema metadata marking a source as a changelog of a table keyed by its
/// primary key (the value names the envelope, `debezium`): its rows are
/// upserts of their key's current row, and its deletions remove the key.
/// The engine applies them to a continuous GROUP BY (taking the old row
/// back out), a versioned table, or a pass-through (an upsert changelog).
pub const CHANGELOG_METADATA: &str = "ubik.changelog";

/// `schema` marked as a changelog whose records are `envelope`'s
/// ([`CHANGELOG_METADATA`]).
pub fn changelog_schema(
    schema: &arrow::datatypes::Schema,
    envelope: &str,
) -> arrow::datatypes::SchemaRef {
    let mut metadata = schema.metadata().clone();
    metadata.insert(CHANGELOG_METADATA.to_string(), envelope.to_string());
    std::sync::Arc::new(schema.clone().with_metadata(metadata))
}

/// Whether a schema marks its source as a changelog ([`CHANGELOG_METADATA`]).
pub fn is_changelog(schema: &arrow::datatypes::Schema) -> bool {
    schema.metadata().contains_key(CHANGELOG_METADATA)
}

/// The primary key columns a schema declares in [`PRIMARY_KEY_METADATA`]
/// (empty: none).
pub fn primary_key(schema: &arrow::datatypes::Schema) -> Vec<&str> {
    schema
        .metadata()
        .get(PRIMARY_KEY_METADATA)
        .map(|k| k.split(',').collect())
        .unwrap_or_default()
}

/// Schema metadata naming a source's event-time column, for a source with
/// several TIMESTAMP columns (Nexmark's auction has `date_time` and
/// `expires`): the engine takes it where it would otherwise need the only
/// TIMESTAMP column (a versioned table's version time, a stream's time).
/// The `event_time` setting and `FOR SYSTEM_TIME AS OF` name one explicitly
/// and take precedence.
pub const EVENT_TIME_METADATA: &str = "ubik.event_time";

/// Field metadata (value `"true"`) marking a column filled from each
/// record's transport timestamp ([`RecordMeta::timestamps`], a Kafka record
/// timestamp) rather than from the record's bytes.
pub const RECORD_TIMESTAMP_METADATA: &str = "ubik.record_timestamp";
pub use dead_letter::{DeadLetter, DeadLetterSink};
pub use error::ConnectorError;
pub use replica::{CheckpointFiles, CheckpointReplica, Replicated, SharedFile};
pub use sink::{Sink, SinkRecord};
pub use source::{
    Chunk, DEFAULT_POLL_TIMEOUT, Payload, RecordMeta, Source, SourceEvent, SourcePosition,
};
