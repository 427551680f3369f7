//! `kafka://host:port[,host:port]/topic?option=value&...` and librdkafka
//! properties. Options with a dot (`security.protocol`, `sasl.mechanism`,
//! ...) pass straight to librdkafka; the others are ubik's:
//!
//! | option | meaning |
//! |---|---|
//! | `group` | consumer group (offsets committed for monitoring only) |
//! | `start` | `earliest` (default), `latest`, `group`, or an RFC 3339 time |
//! | `end` | `latest` or an RFC 3339 time: a bounded run (backfill) |
//! | `assign` | read only these partitions (`assign=0,3`); a task of a consumer group reads its own so |
//! | `purge` | `true`: delete the records a durable checkpoint has passed (for a topic only this pipeline reads; a group's repartition topic is read so) |
//! | `partitions`, `replication` | for creating a missing output topic |
//! | `create` | `false` to never create a missing output topic |
//! | `cleanup` | cleanup.policy of a created topic: `compact` (the default for a keyed changelog: the latest record per key is kept, and time-based retention never deletes the old windows of a backfill) or `delete` (the default for append-only output and dead letters) |
//! | `transactional_id` | the producer's transactional.id |
//! | `retention_check` | `refuse` (default) or `warn`: what a keyed changelog does about a record the output topic's time-based retention would delete (see [`crate::retention`]) |
//! | `format` | the records' format: `json` (default), `avro` (Confluent-framed, with `registry`); an output may also be `json-connect` |
//! | `registry` | a Confluent-compatible schema registry's base URL, for `format=avro` |
//!
//! Settings named `schema.registry.*` (registry auth and TLS) are the
//! registry client's: they never reach librdkafka.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use ubik_connector::time::EpochUnit;

use crate::error::Error;
use crate::retention::RetentionCheck;

/// The prefix of the schema registry client's settings, kept from librdkafka.
pub const REGISTRY_SETTINGS: &str = "schema.registry.";

/// How the sink publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitMode {
    /// One Kafka transaction per checkpoint epoch: read_committed consumers
    /// never see part of an epoch (so never part of a window).
    Transactional,
    /// Idempotent producer, flushed at each checkpoint; lower latency.
    Idempotent,
}

/// Where to start (or stop) reading a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    Earliest,
    Latest,
    Group,
    /// Milliseconds since the epoch: the first offset at or after it.
    Time(i64),
}

#[derive(Debug, Clone)]
pub struct KafkaUrl {
    pub bootstrap: String,
    pub topic: String,
    pub group: Option<String>,
    pub start: Bound,
    pub end: Option<Bound>,
    /// Read only these partitions (all when `None`).
    pub assign: Option<Vec<i32>>,
    /// Delete records a durable checkpoint has passed ([`crate::purge`]).
    pub purge: bool,
    pub partitions: i32,
    pub replication: i32,
    pub create: bool,
    /// cleanup.policy for a created topic; `None`: decided by what is written.
    pub cleanup: Option<String>,
    pub transactional_id: Option<String>,
    pub retention_check: RetentionCheck,
    /// The records' format as named (`None`: JSON); the runtime picks the codec.
    pub format: Option<String>,
    /// A schema registry's base URL.
    pub registry: Option<String>,
    /// What a number in a JSON record's TIMESTAMP column counts (`None`:
    /// milliseconds, or what a Debezium event's schema says).
    pub timestamp_unit: Option<EpochUnit>,
    /// librdkafka properties from the URL.
    pub properties: BTreeMap<String, String>,
}

fn parse_time(value: &str) -> Result<i64, Error> {
    // RFC 3339 via the same rules as event times (µs) -> ms.
    let us = ubik_connector::time::parse_rfc3339(value).ok_or_else(|| {
        Error::Config(format!(
            "{value:?} is not latest/earliest or an RFC 3339 time"
        ))
    })?;
    Ok(us.div_euclid(1000))
}

impl KafkaUrl {
    pub fn parse(url: &str) -> Result<Self, Error> {
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| Error::Config(format!("{url:?} is not a kafka:// URL")))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bootstrap, topic) = path.split_once('/').ok_or_else(|| {
            Error::Config(format!("{url:?} has no topic: use kafka://host:port/topic"))
        })?;
        if bootstrap.is_empty() || topic.is_empty() || topic.contains('/') {
            return Err(Error::Config(format!(
                "{url:?} is not kafka://host:port[,host:port]/topic"
            )));
        }
        let mut out = KafkaUrl {
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            group: None,
            start: Bound::Earliest,
            end: None,
            assign: None,
            purge: false,
            partitions: 1,
            replication: 1,
            create: true,
            cleanup: None,
            transactional_id: None,
            retention_check: RetentionCheck::Refuse,
            format: None,
            registry: None,
            timestamp_unit: None,
            properties: BTreeMap::new(),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let num = |v: &str| -> Result<i32, Error> {
                v.parse()
                    .map_err(|_| Error::Config(format!("{k}={v:?} is not a number")))
            };
            match k {
                "group" => out.group = Some(v.to_string()),
                "start" => {
                    out.start = match v {
                        "earliest" => Bound::Earliest,
                        "latest" => Bound::Latest,
                        "group" => Bound::Group,
                        t => Bound::Time(parse_time(t)?),
                    }
                }
                "end" => {
                    out.end = Some(match v {
                        "latest" => Bound::Latest,
                        t => Bound::Time(parse_time(t)?),
                    })
                }
                "assign" => {
                    out.assign = Some(
                        v.split(',')
                            .map(|p| num(p.trim()))
                            .collect::<Result<_, _>>()?,
                    )
                }
                "purge" => out.purge = matches!(v, "true" | "1" | "yes"),
                "partitions" => out.partitions = num(v)?,
                "replication" => out.replication = num(v)?,
                "create" => out.create = !matches!(v, "false" | "0" | "no"),
                "cleanup" if matches!(v, "compact" | "delete" | "compact,delete") => {
                    out.cleanup = Some(v.to_string())
                }
                "cleanup" => {
                    return Err(Error::Config(format!(
                        "cleanup={v:?} is not compact, delete or compact,delete"
                    )));
                }
                "transactional_id" => out.transactional_id = Some(v.to_string()),
                "retention_check" => {
                    out.retention_check = match v {
                        "refuse" => RetentionCheck::Refuse,
                        "warn" => RetentionCheck::Warn,
                        _ => {
                            return Err(Error::Config(format!(
                                "retention_check={v:?} is not refuse or warn"
                            )));
                        }
                    }
                }
                "format" => out.format = Some(v.to_string()),
                "registry" => out.registry = Some(v.to_string()),
                "timestamp_unit" => {
                    out.timestamp_unit = Some(EpochUnit::parse(v).ok_or_else(|| {
                        Error::Config(format!(
                            "timestamp_unit={v:?} is not s, ms, us or ns (what a number in a TIMESTAMP column counts since the epoch)"
                        ))
                    })?)
                }
                k if k.contains('.') => {
                    out.properties.insert(k.to_string(), v.to_string());
                }
                other => {
                    return Err(Error::Config(format!(
                        "unknown kafka:// option {other:?} (known: group, start, end, assign, purge, partitions, replication, create, cleanup, transactional_id, retention_check, format, registry, timestamp_unit; librdkafka properties contain a dot)"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// A librdkafka config: bootstrap servers, then `extra` (from -X and
    /// properties files), then the URL's own properties.
    pub fn client_config(&self, extra: &BTreeMap<String, String>) -> ClientConfig {
        self.client_config_with(&[], extra)
    }

    /// Like [`Self::client_config`], with `defaults` the user's properties may override.
    pub fn client_config_with(
        &self,
        defaults: &[(&str, &str)],
        extra: &BTreeMap<String, String>,
    ) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in defaults {
            c.set(*k, *v);
        }
        for (k, v) in extra.iter().chain(self.properties.iter()) {
            if !k.starts_with(REGISTRY_SETTINGS) {
                c.set(k, v);
            }
        }
        c
    }

    pub fn display(&self) -> String {
        format!("kafka://{}/{}", self.bootstrap, self.topic)
    }
}
