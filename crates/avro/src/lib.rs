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
//! - [`encode`]: changelog rows into Avro, with key and value schemas
//!   derived from the result schema and registered before the first record.
//! - [`types`]: Avro types as ubik's columns.
//! - [`registry`]: the registry client (auth, TLS, retries).
//!
//! Why arrow-avro (arrow-rs's own crate, the same arrow version) and not
//! `apache-avro`: it decodes straight into Arrow builders, column by column,
//! with no per-record value tree, resolves writer to reader schemas, skips
//! the fields a projection leaves out, and knows Confluent's framing.

pub mod decode;
pub mod encode;
pub mod error;
pub mod registry;
pub mod types;

use std::time::Duration;

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

/// A decoder of `topic`'s Avro values whose columns are its value subject's
/// latest schema.
pub fn topic_decoder(registry: Registry, topic: &str) -> Result<AvroDecoder> {
    let subject = value_subject(topic);
    let latest = registry
        .retrying(Some(OPEN_PATIENCE), |r| r.latest(&subject))
        .map_err(|e| match e {
            RegistryError::NotFound(_) => AvroError::Config(format!(
                "the schema registry {} has no subject {subject}: format=avro reads the value schema registered for the topic under {subject} (Confluent's TopicNameStrategy); register it, or check the registry URL",
                registry.url()
            )),
            e => e.into(),
        })?;
    AvroDecoder::new(latest.schema, Box::new(RegistrySchemas(registry)))
}
