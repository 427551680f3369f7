//! The codecs a Kafka URL's `format=` names: which decoder turns a
//! source's records into rows, and which encoder turns the changelog into
//! a sink's records. The registry settings (`schema.registry.*`) come from
//! the same `-X` map as librdkafka's.

use std::collections::BTreeMap;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ubik_avro::encode::TimestampPrecision;
use ubik_avro::{AvroChangelogEncoder, AvroDecoder, AvroError, DebeziumAvro, Registry};
use ubik_engine::QueryPlan;
use ubik_format::ChangeEncoder;
use ubik_format::changelog::ChangelogEncoder;
use ubik_format::debezium::ChangeEvents;
use ubik_format::timestamp::EpochUnit;
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
    DebeziumAvro,
}

/// The format `url` names for a source or an output, refusing one the
/// other side only has, and a `registry=` beside a format that reads or
/// writes no Avro.
fn named(url: &KafkaUrl, output: bool) -> Result<Named> {
    let named = format_named(url, output)?;
    if url.registry.is_some() && !matches!(named, Named::Avro | Named::DebeziumAvro) {
        return Err(RuntimeError::Config(format!(
            "registry= is for format=avro{}; add one (or drop registry=)",
            if output { "" } else { " or debezium-avro" }
        )));
    }
    Ok(named)
}

fn format_named(url: &KafkaUrl, output: bool) -> Result<Named> {
    Ok(match url.format.as_deref() {
        None | Some("json") => Named::Json,
        Some("avro") => Named::Avro,
        Some("json-connect") if output => Named::JsonConnect,
        Some("debezium-json") if !output => Named::DebeziumJson,
        Some("debezium-avro") if !output => Named::DebeziumAvro,
        Some(debezium @ ("debezium-json" | "debezium-avro")) => {
            return Err(RuntimeError::Config(format!(
                "format={debezium} is a source format (Debezium's change events); an output writes json, json-connect or avro"
            )));
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
                    ", debezium-json, debezium-avro (with registry=URL)"
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

/// The registry of a URL [`named`] has checked.
fn registry(url: &KafkaUrl, settings: &BTreeMap<String, String>) -> Result<Registry> {
    Registry::new(url.registry.as_deref(), settings).map_err(avro_error)
}

/// What a number counts in the TIMESTAMP columns of a JSON source's
/// records (`timestamp_unit=`; `None`: milliseconds, or for Debezium what
/// each event's schema says). Avro carries typed times: refused there.
pub fn epoch_unit(endpoint: &Endpoint) -> Result<Option<EpochUnit>> {
    let Endpoint::Kafka(text) = endpoint else {
        return Ok(None);
    };
    let url = kafka_url(text)?;
    match (named(&url, false)?, url.timestamp_unit) {
        (Named::Avro | Named::DebeziumAvro, Some(_)) => Err(RuntimeError::Config(format!(
            "{text}: timestamp_unit= is for JSON records; Avro's timestamps carry their unit (timestamp-millis, timestamp-micros): drop timestamp_unit="
        ))),
        (_, unit) => Ok(unit),
    }
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
        _ => Ok(None),
    }
}

/// The schema the engine sees for columns declared (or not) for
/// `endpoint`: with `_timestamp` where the transport stamps records
/// ([`Endpoint::transport_schema`]), and, for a Debezium source, marked as
/// a changelog keyed by its PRIMARY KEY (which a `debezium-json` source
/// must declare; a `debezium-avro` one may leave its columns to the
/// registry).
pub fn declared_schema(
    endpoint: &Endpoint,
    schema: Option<SchemaRef>,
) -> Result<Option<SchemaRef>> {
    let schema = schema.map(|s| endpoint.transport_schema(s));
    let Endpoint::Kafka(url) = endpoint else {
        return Ok(schema);
    };
    match (named(&kafka_url(url)?, false)?, schema) {
        (Named::DebeziumJson | Named::DebeziumAvro, Some(s))
            if !ubik_connector::primary_key(&s).is_empty() =>
        {
            Ok(Some(ubik_connector::changelog_schema(&s, "debezium")))
        }
        (Named::DebeziumAvro, None) => Ok(None),
        (Named::DebeziumJson | Named::DebeziumAvro, _) => Err(RuntimeError::Config(format!(
            "{url} reads Debezium change events: declare the table's columns with its PRIMARY KEY (--schema \"id BIGINT PRIMARY KEY, ...\"), the columns of Debezium's `after` rows"
        ))),
        (_, schema) => Ok(schema),
    }
}

/// How a changelog source's change events become its table's rows, and
/// that table.
pub struct ChangeSource {
    pub schema: SchemaRef,
    pub events: Box<dyn ChangeEvents>,
}

/// The change-event reading of a Debezium source (`None` for others), over
/// its declared schema ([`declared_schema`]) or, for `debezium-avro`
/// without one, the table the registry describes: the envelope's `after`
/// fields, keyed by the key subject's fields.
pub fn change_source(
    endpoint: &Endpoint,
    settings: &BTreeMap<String, String>,
    declared: Option<&SchemaRef>,
) -> Result<Option<ChangeSource>> {
    let Endpoint::Kafka(text) = endpoint else {
        return Ok(None);
    };
    let url = kafka_url(text)?;
    match named(&url, false)? {
        Named::DebeziumJson => {
            let schema = declared.cloned().ok_or_else(|| {
                RuntimeError::Config(format!(
                    "{text} reads Debezium change events: declare the table's columns with its PRIMARY KEY"
                ))
            })?;
            let unit = url.timestamp_unit.unwrap_or_default();
            Ok(Some(ChangeSource {
                events: Box::new(ubik_format::debezium::DebeziumJson::new(&schema, unit)),
                schema,
            }))
        }
        Named::DebeziumAvro => {
            let registry = registry(&url, settings)?;
            let envelope =
                ubik_avro::topic_decoder(registry.clone(), &url.topic).map_err(avro_error)?;
            let schema = match declared {
                Some(s) => Arc::clone(s),
                None => {
                    let key = ubik_avro::debezium_key(&registry, &url.topic).map_err(avro_error)?;
                    let table =
                        ubik_avro::debezium::table_of(&envelope, &key).map_err(avro_error)?;
                    ubik_connector::changelog_schema(&endpoint.transport_schema(table), "debezium")
                }
            };
            let events = DebeziumAvro::new(envelope, Arc::clone(&schema)).map_err(avro_error)?;
            Ok(Some(ChangeSource {
                schema,
                events: Box::new(events),
            }))
        }
        _ => Ok(None),
    }
}

/// The columns of an Avro source URL (`kafka://…?format=avro&registry=…`)
/// from its registry alone, without opening Kafka: for planning before any
/// record is read (Python's `validate`).
pub fn registry_columns(url: &str, settings: &BTreeMap<String, String>) -> Result<SchemaRef> {
    let endpoint = Endpoint::Kafka(url.to_string());
    if let Some(changes) = change_source(&endpoint, settings, None)? {
        return Ok(changes.schema);
    }
    match source_decoder(&endpoint, settings)? {
        Some(decoder) => Ok(std::sync::Arc::clone(ubik_format::RecordDecoder::schema(
            &decoder,
        ))),
        None => Err(RuntimeError::Config(format!(
            "{url} names no columns of its own: only a format=avro or debezium-avro source's come from its registry; declare the columns instead"
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
    let named = named(&url, true)?;
    let precision = output_precision(&url, named)?;
    Ok(match named {
        // named() refuses a source-only format on an output.
        Named::Json | Named::DebeziumJson | Named::DebeziumAvro => {
            Box::new(ChangelogEncoder::new(schema, keys, keyed))
        }
        Named::JsonConnect => Box::new(ChangelogEncoder::connect(schema, keys, keyed)),
        Named::Avro => Box::new(
            AvroChangelogEncoder::register(
                &registry(&url, settings)?,
                &url.topic,
                schema,
                keys,
                keyed,
                precision,
            )
            .map_err(avro_error)?,
        ),
    })
}

/// What an output's TIMESTAMP columns are written as: `timestamp_unit=ms`
/// (or `us`, the default) on an Avro output; other outputs name no unit
/// (JSON writes RFC 3339 text, `json-connect` Connect's milliseconds).
fn output_precision(url: &KafkaUrl, named: Named) -> Result<TimestampPrecision> {
    match (named, url.timestamp_unit) {
        (_, None) => Ok(TimestampPrecision::Micros),
        (Named::Avro, Some(EpochUnit::Micros)) => Ok(TimestampPrecision::Micros),
        (Named::Avro, Some(EpochUnit::Millis)) => Ok(TimestampPrecision::Millis),
        (Named::Avro, Some(other)) => Err(RuntimeError::Config(format!(
            "timestamp_unit={} on an Avro output: Avro writes timestamp-micros (us, the default) or timestamp-millis (ms, what Kafka Connect's Avro converters read as a Timestamp)",
            other.name()
        ))),
        (_, Some(_)) => Err(RuntimeError::Config(
            "timestamp_unit= on an output is for format=avro (timestamp-millis or -micros); JSON writes RFC 3339 text and json-connect Connect's epoch milliseconds: drop timestamp_unit=".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn precision(query: &str) -> Result<TimestampPrecision> {
        let url = kafka_url(&format!("kafka://b:9092/out?{query}"))?;
        output_precision(&url, named(&url, true)?)
    }

    #[test]
    fn an_avro_output_writes_timestamps_at_the_unit_it_names() {
        for (query, want) in [
            ("format=avro", TimestampPrecision::Micros),
            ("format=avro&timestamp_unit=us", TimestampPrecision::Micros),
            ("format=avro&timestamp_unit=ms", TimestampPrecision::Millis),
            ("format=json", TimestampPrecision::Micros),
        ] {
            assert_eq!(precision(query).unwrap(), want, "{query}");
        }
    }

    #[test]
    fn a_registry_on_an_output_that_writes_no_avro_is_refused() {
        let table = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("x", arrow::datatypes::DataType::Int64, false),
        ]));
        let catalog = ubik_engine::Catalog::new().with_table("t", table);
        let plan =
            ubik_engine::plan_query("SELECT x FROM t", &catalog, Default::default()).unwrap();
        for query in [
            "registry=http://r:8081",
            "format=json-connect&registry=http://r:8081",
        ] {
            let sink = SinkSpec::Kafka(format!("kafka://b:9092/out?{query}"));
            let e = sink_encoder(&sink, &BTreeMap::new(), &plan)
                .err()
                .expect(query)
                .to_string();
            assert!(e.contains("registry= is for format=avro"), "{query}: {e}");
        }
    }

    #[test]
    fn a_unit_avro_cannot_write_or_on_json_is_refused_with_the_fix() {
        for (query, says) in [
            ("format=avro&timestamp_unit=ns", "timestamp-millis (ms"),
            ("format=avro&timestamp_unit=s", "timestamp-millis (ms"),
            ("timestamp_unit=ms", "drop timestamp_unit="),
            (
                "format=json-connect&timestamp_unit=ms",
                "drop timestamp_unit=",
            ),
        ] {
            let e = precision(query).unwrap_err().to_string();
            assert!(e.contains(says), "{query}: {e}");
        }
    }
}
