//! The codecs a Kafka URL's `format=` names: which decoder turns a
//! source's records into rows, and which encoder turns the changelog into
//! a sink's records. The registry settings (`schema.registry.*`) come from
//! the same `-X` map as librdkafka's.

use std::collections::BTreeMap;

use ubik_avro::{AvroChangelogEncoder, AvroDecoder, AvroError, Registry};
use ubik_engine::QueryPlan;
use ubik_format::ChangeEncoder;
use ubik_format::changelog::ChangelogEncoder;
use ubik_kafka::KafkaUrl;

use crate::error::{Result, RuntimeError};
use crate::spec::{Endpoint, SinkSpec};

/// The formats a source or sink may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    Json,
    JsonConnect,
    Avro,
    DebeziumJson,
}

fn named(url: &KafkaUrl, output: bool) -> Result<Named> {
    Ok(match url.format.as_deref() {
        None | Some("json") => Named::Json,
        Some("avro") => Named::Avro,
        Some("json-connect") if output => Named::JsonConnect,
        Some("debezium-json") if !output => Named::DebeziumJson,
        Some("debezium-json") => {
            return Err(RuntimeError::Config(
                "format=debezium-json is a source format (Debezium's change events); an output writes json, json-connect or avro".into(),
            ));
        }
        Some("json-connect") => {
            return Err(RuntimeError::Config(
                "format=json-connect is an output format (Kafka Connect's JSON with schemas); a source reads json or avro".into(),
            ));
        }
        Some(other) => {
            return Err(RuntimeError::Config(format!(
                "format={other:?} is unknown; {} takes json{}, avro (with registry=URL)",
                if output { "an output" } else { "a source" },
                if output {
                    ", json-connect"
                } else {
                    ", debezium-json"
                }
            )));
        }
    })
}

fn kafka_url(url: &str) -> Result<KafkaUrl> {
    KafkaUrl::parse(url).map_err(|e| RuntimeError::Config(e.to_string()))
}

fn avro_error(e: AvroError) -> RuntimeError {
    match e {
        AvroError::Config(m) => RuntimeError::Config(m),
        other => RuntimeError::Format(other.into()),
    }
}

fn registry(url: &KafkaUrl, settings: &BTreeMap<String, String>) -> Result<Registry> {
    if url.format.as_deref() != Some("avro") && url.registry.is_some() {
        return Err(RuntimeError::Config(
            "registry= is for format=avro; add format=avro (or drop registry=)".into(),
        ));
    }
    Registry::new(url.registry.as_deref(), settings).map_err(avro_error)
}

/// The Avro decoder of a source whose URL names `format=avro`: its columns
/// are the topic's value subject's latest schema. `None` for other sources.
pub fn source_decoder(
    endpoint: &Endpoint,
    settings: &BTreeMap<String, String>,
) -> Result<Option<AvroDecoder>> {
    let Endpoint::Kafka(url) = endpoint else {
        return Ok(None);
    };
    let url = kafka_url(url)?;
    match named(&url, false)? {
        Named::Avro => Ok(Some(
            ubik_avro::topic_decoder(registry(&url, settings)?, &url.topic).map_err(avro_error)?,
        )),
        _ => {
            if url.registry.is_some() {
                registry(&url, settings)?;
            }
            Ok(None)
        }
    }
}

/// The schema the engine sees for columns declared (or not) for
/// `endpoint`: with `_timestamp` where the transport stamps records
/// ([`Endpoint::transport_schema`]), and, for a `format=debezium-json`
/// source, marked as a changelog keyed by its PRIMARY KEY (which it must
/// declare).
pub fn declared_schema(
    endpoint: &Endpoint,
    schema: Option<arrow::datatypes::SchemaRef>,
) -> Result<Option<arrow::datatypes::SchemaRef>> {
    let schema = schema.map(|s| endpoint.transport_schema(s));
    let Endpoint::Kafka(url) = endpoint else {
        return Ok(schema);
    };
    if named(&kafka_url(url)?, false)? != Named::DebeziumJson {
        return Ok(schema);
    }
    let Some(schema) = schema.filter(|s| !ubik_connector::primary_key(s).is_empty()) else {
        return Err(RuntimeError::Config(format!(
            "{url} reads Debezium change events: declare the table's columns with its PRIMARY KEY (--schema \"id BIGINT PRIMARY KEY, ...\"), the columns of Debezium's `after` rows"
        )));
    };
    Ok(Some(ubik_connector::changelog_schema(&schema, "debezium")))
}

/// The columns of an Avro source URL (`kafka://…?format=avro&registry=…`)
/// from its registry alone, without opening Kafka: for planning before any
/// record is read (Python's `validate`).
pub fn registry_columns(
    url: &str,
    settings: &BTreeMap<String, String>,
) -> Result<arrow::datatypes::SchemaRef> {
    let endpoint = Endpoint::Kafka(url.to_string());
    match source_decoder(&endpoint, settings)? {
        Some(decoder) => Ok(std::sync::Arc::clone(ubik_format::RecordDecoder::schema(
            &decoder,
        ))),
        None => Err(RuntimeError::Config(format!(
            "{url} names no columns of its own: only a format=avro source's come from its registry; declare the columns instead"
        ))),
    }
}

/// Canonical JSON, the changelog's default encoding.
pub fn changelog_encoder(plan: &QueryPlan) -> Box<dyn ChangeEncoder> {
    Box::new(ChangelogEncoder::new(
        &plan.output_schema,
        plan.key_columns.clone(),
        plan.has_record_key(),
    ))
}

/// The encoder of `plan`'s changelog for `sink`: canonical JSON, Kafka
/// Connect's JSON, or Avro with its schemas registered (and checked against
/// the subjects' rules) before the first record.
pub fn sink_encoder(
    sink: &SinkSpec,
    settings: &BTreeMap<String, String>,
    plan: &QueryPlan,
) -> Result<Box<dyn ChangeEncoder>> {
    let (schema, keys, keyed) = (
        &plan.output_schema,
        plan.key_columns.clone(),
        plan.has_record_key(),
    );
    let SinkSpec::Kafka(url) = sink else {
        return Ok(Box::new(ChangelogEncoder::new(schema, keys, keyed)));
    };
    let url = kafka_url(url)?;
    Ok(match named(&url, true)? {
        // named() refuses a source-only format on an output.
        Named::Json | Named::DebeziumJson => Box::new(ChangelogEncoder::new(schema, keys, keyed)),
        Named::JsonConnect => Box::new(ChangelogEncoder::connect(schema, keys, keyed)),
        Named::Avro => Box::new(
            AvroChangelogEncoder::register(
                &registry(&url, settings)?,
                &url.topic,
                schema,
                keys,
                keyed,
            )
            .map_err(avro_error)?,
        ),
    })
}
