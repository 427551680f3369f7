//! # ubik-avro
//!
//! Avro in Confluent's wire format (a magic byte 0, a 4-byte big-endian
//! schema id, the Avro body), with schemas from a Confluent-compatible
//! registry. Formats never do I/O, except this one's registry lookups,
//! which the [`registry`] module keeps behind one client.
//!
//! - [`decode`]: records into Arrow rows by arrow-avro's vectorised
//!   decoder, each written with its own schema and resolved to the table's
//!   (a subject's latest) by Avro's rules.
//! - [`debezium`]: Debezium's Avro change events unwrapped into a table's
//!   rows and deletions.
//! - [`encode`]: changelog rows into Avro, with key and value schemas
//!   derived from the result schema and registered before the first record.
//! - [`types`]: Avro types as ubik's columns.
//! - [`registry`]: the registry client (auth, TLS, retries).
//!
//! Why arrow-avro (arrow-rs's own crate, the same arrow version) and not
//! `apache-avro`: it decodes straight into Arrow builders, column by column,
//! with no per-record value tree, resolves writer to reader schemas, skips
//! the fields a projection leaves out, and knows Confluent's framing.

pub mod debezium;
pub mod decode;
pub mod encode;
pub mod error;
mod flat;
pub mod registry;
pub mod types;

use std::time::Duration;

pub use debezium::DebeziumAvro;
pub use decode::{AvroDecoder, WriterSchemas, columns_of};
pub use encode::AvroChangelogEncoder;
pub use error::{AvroError, Result};
pub use registry::{Registry, RegistryError};

/// How long opening a pipeline waits for an unreachable registry.
const OPEN_PATIENCE: Duration = Duration::from_secs(60);

/// Writer schemas fetched from a registry by id; while the pipeline runs an
/// unreachable registry is waited for, like a broker outage.
struct RegistrySchemas(Registry);

impl WriterSchemas for RegistrySchemas {
    fn fetch(&mut self, id: u32) -> Result<Option<String>> {
        match self.0.retrying(None, |r| r.schema_by_id(id)) {
            Ok(schema) => Ok(Some(schema)),
            Err(RegistryError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The value subject of `topic` (Confluent's TopicNameStrategy).
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// The key subject of `topic` (Confluent's TopicNameStrategy).
pub fn key_subject(topic: &str) -> String {
    format!("{topic}-key")
}

/// The latest schema of `subject`, waiting for an unreachable registry as
/// long as opening may; a missing subject is a setting to fix (`missing`
/// says which).
fn latest_of(registry: &Registry, subject: &str, missing: &str) -> Result<String> {
    match registry.retrying(Some(OPEN_PATIENCE), |r| r.latest(subject)) {
        Ok(latest) => Ok(latest.schema),
        Err(RegistryError::NotFound(_)) => Err(AvroError::Config(format!(
            "the schema registry {} has no subject {subject}{missing}",
            registry.url()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The primary key of a Debezium `topic`: the fields of its key subject's
/// latest schema (Debezium's key record).
pub fn debezium_key(registry: &Registry, topic: &str) -> Result<Vec<String>> {
    let schema = latest_of(
        registry,
        &key_subject(topic),
        ", so the table's primary key is unknown: give Debezium's connector an Avro key converter, or declare the columns with their PRIMARY KEY (--schema \"id BIGINT PRIMARY KEY, ...\")",
    )?;
    debezium::key_columns(&schema)
}

/// A decoder of `topic`'s Avro values whose columns are its value subject's
/// latest schema.
pub fn topic_decoder(registry: Registry, topic: &str) -> Result<AvroDecoder> {
    let subject = value_subject(topic);
    let schema = latest_of(
        &registry,
        &subject,
        &format!(
            ": format=avro reads the value schema registered for the topic under {subject} (Confluent's TopicNameStrategy); register it, or check the registry URL"
        ),
    )?;
    AvroDecoder::new(schema, Box::new(RegistrySchemas(registry)))
}
