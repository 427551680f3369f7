//! A pipeline spec: what the CLI builds from flags and the pipeline file,
//! Python from keyword arguments, and tests by hand, validated before
//! anything is opened. [`crate::connect`] turns it into opened parts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatchReader;
use ubik_connector::{DeadLetterSink, Source};
use ubik_connectors::demo::DemoOptions;
use ubik_connectors::nexmark::{NexmarkOptions, NexmarkTable};
use ubik_format::Format;

use crate::error::{Result, RuntimeError};
use crate::settings::Settings;

/// Where a source's records come from: the transport and its address.
pub enum Endpoint {
    File(PathBuf),
    Stdin,
    Demo {
        table: String,
        options: DemoOptions,
    },
    /// `nexmark://bid?...`: the Nexmark benchmark's stream, generated in process.
    Nexmark {
        table: NexmarkTable,
        options: NexmarkOptions,
    },
    /// `kafka://host:port/topic?...` (librdkafka properties come from the spec).
    Kafka(String),
    /// `webhook://HOST:PORT/PATH?...`: an HTTP endpoint with a durable buffer.
    Webhook(String),
    /// In-process Arrow handed over by a host (Python's `from_=table`).
    Arrow(Box<dyn RecordBatchReader + Send>),
    /// A source built by the caller (tests).
    Provided(Box<dyn Source>),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::File(p) => write!(f, "file://{}", p.display()),
            Endpoint::Stdin => write!(f, "-"),
            Endpoint::Demo { table, .. } => write!(f, "demo://{table}"),
            Endpoint::Nexmark { table, .. } => write!(f, "nexmark://{}", table.name()),
            Endpoint::Kafka(url) | Endpoint::Webhook(url) => write!(f, "{url}"),
            Endpoint::Arrow(_) => write!(f, "arrow"),
            Endpoint::Provided(s) => write!(f, "{}", s.describe()),
        }
    }
}

impl Endpoint {
    /// Parses a source URL: `kafka://`, `webhook://`, `file://path.jsonl`
    /// (or a bare `*.jsonl` path), `-` (stdin), `demo://orders?...`.
    pub fn parse(url: &str) -> Result<Self> {
        if url == "-" {
            return Ok(Endpoint::Stdin);
        }
        if let Some(path) = url.strip_prefix("file://") {
            return Ok(Endpoint::File(PathBuf::from(path)));
        }
        if url.starts_with("kafka://") {
            ubik_kafka::KafkaUrl::parse(url).map_err(|e| RuntimeError::Config(e.to_string()))?;
            return Ok(Endpoint::Kafka(url.to_string()));
        }
        if url.starts_with("webhook://") {
            ubik_webhook::WebhookConfig::parse(url)
                .map_err(|e| RuntimeError::Config(e.to_string()))?;
            return Ok(Endpoint::Webhook(url.to_string()));
        }
        if let Some(rest) = url.strip_prefix("demo://") {
            let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
            if table.is_empty() {
                return Err(RuntimeError::Config(
                    "demo:// needs a table name, e.g. demo://orders".into(),
                ));
            }
            return Ok(Endpoint::Demo {
                table: table.to_string(),
                options: DemoOptions::parse(query)?,
            });
        }
        if let Some(rest) = url.strip_prefix("nexmark://") {
            let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
            return Ok(Endpoint::Nexmark {
                table: NexmarkTable::parse(table)?,
                options: NexmarkOptions::parse(query)?,
            });
        }
        if !url.contains("://")
            && [".jsonl", ".json", ".ndjson"]
                .iter()
                .any(|e| url.ends_with(e))
        {
            return Ok(Endpoint::File(PathBuf::from(url)));
        }
        let scheme = url.split("://").next().unwrap_or(url);
        Err(RuntimeError::Config(format!(
            "unsupported source {url:?} (scheme {scheme:?}); use kafka://host:port/topic, webhook://host:port/path, file://path.jsonl, - (stdin), demo://orders or nexmark://bid"
        )))
    }

    /// The schema the engine sees for `schema` read from this endpoint: a
    /// versioned table on a transport that stamps records (Kafka) without
    /// a TIMESTAMP column gets `_timestamp`, its records' timestamps.
    pub fn transport_schema(
        &self,
        schema: arrow::datatypes::SchemaRef,
    ) -> arrow::datatypes::SchemaRef {
        match self {
            Endpoint::Kafka(_) => ubik_format::schema::with_record_timestamp(schema),
            _ => schema,
        }
    }

    /// Makes an unbounded log source end where it stands when it opens: a
    /// Kafka topic without `end=` reads to the end offsets taken at start,
    /// a webhook without `end=` reads what its buffer holds and serves no
    /// endpoint. This is the one-shot run (Python's `stream()`); an
    /// explicit `end=` is kept, and other sources are bounded already or
    /// never (stdin, the demo: their own options decide).
    pub fn bound_at_open(&mut self) -> Result<()> {
        let open_ended = match self {
            Endpoint::Kafka(url) => ubik_kafka::KafkaUrl::parse(url)
                .map_err(|e| RuntimeError::Config(e.to_string()))?
                .end
                .is_none(),
            Endpoint::Webhook(url) => {
                !ubik_webhook::WebhookConfig::parse(url)
                    .map_err(|e| RuntimeError::Config(e.to_string()))?
                    .ends
            }
            _ => false,
        };
        if let (true, Endpoint::Kafka(url) | Endpoint::Webhook(url)) = (open_ended, self) {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str("end=latest");
        }
        Ok(())
    }

    /// The table name the endpoint itself suggests: a Kafka topic, the last
    /// segment of a webhook path, a Nexmark table. Files, stdin and the demo have none of
    /// their own: they take the table the query reads.
    pub fn own_table(&self) -> Option<String> {
        match self {
            Endpoint::Kafka(url) => ubik_kafka::KafkaUrl::parse(url).ok().map(|u| u.topic),
            Endpoint::Webhook(url) => ubik_webhook::WebhookConfig::parse(url)
                .ok()
                .map(|c| c.table),
            Endpoint::Provided(s) => Some(s.table().to_string()),
            Endpoint::Nexmark { table, .. } => Some(table.name().to_string()),
            Endpoint::File(_) | Endpoint::Stdin | Endpoint::Demo { .. } | Endpoint::Arrow(_) => {
                None
            }
        }
    }
}

/// One named input of a pipeline.
#[derive(Debug)]
pub struct SourceSpec {
    /// The SQL table name; `None`: see [`crate::connect::table_name`].
    pub table: Option<String>,
    pub endpoint: Endpoint,
    /// The declared schema; `None`: the source's own, or inferred from a sample.
    pub schema: Option<SchemaRef>,
    /// How the records are encoded.
    pub format: Format,
}

impl SourceSpec {
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            table: None,
            endpoint,
            schema: None,
            format: Format::default(),
        }
    }

    /// A source from its URL.
    pub fn parse(url: &str) -> Result<Self> {
        Ok(Self::new(Endpoint::parse(url)?))
    }

    /// A source from `NAME=URL` (named: the SQL table `NAME`) or `URL`.
    pub fn parse_named(text: &str) -> Result<Self> {
        let (name, url) = split_name(text);
        let mut spec = Self::parse(url)?;
        spec.table = name.map(str::to_string);
        Ok(spec)
    }
}

/// Splits `NAME=VALUE` into its name and value; text without a leading
/// SQL-identifier-like name before `=` (a URL, a column list) is all value.
pub fn split_name(text: &str) -> (Option<&str>, &str) {
    if let Some((name, value)) = text.split_once('=') {
        let mut chars = name.chars();
        let identifier = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if identifier {
            return (Some(name), value);
        }
    }
    (None, text)
}

/// Where the changelog goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SinkSpec {
    /// One `{"key":…,"value":…}` line per record.
    #[default]
    Stdout,
    /// `kafka://host:port/topic`, in the spec's emit mode.
    Kafka(String),
}

impl SinkSpec {
    /// `--to`: `kafka://` only, since ubik owns no lake writer.
    pub fn parse(url: &str) -> Result<Self> {
        if url.starts_with("kafka://") {
            return Ok(SinkSpec::Kafka(url.to_string()));
        }
        Err(RuntimeError::Config(format!(
            "--to {url:?} is not supported: ubik writes no files and owns no lake writer; --to takes kafka://host:port/topic only (omit it to print the changelog on stdout). To land results in a lake table, use the Arrow leg (Python: ubik.pipeline(...)) and commit with your own writer, or point a Kafka Connect sink at the output topic."
        )))
    }
}

/// Where records set aside (undecodable, too late) go.
#[derive(Default)]
pub enum DeadLetterSpec {
    /// One JSON line per letter on stderr.
    #[default]
    Stderr,
    /// `kafka://host:port/topic`: the original bytes with the reason in headers.
    Kafka(String),
    /// A dead-letter output built by the caller.
    Provided(Box<dyn DeadLetterSink>),
}

impl std::fmt::Debug for DeadLetterSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetterSpec::Stderr => write!(f, "stderr"),
            DeadLetterSpec::Kafka(url) => write!(f, "{url}"),
            DeadLetterSpec::Provided(_) => write!(f, "provided"),
        }
    }
}

impl DeadLetterSpec {
    /// `--dlq`: `kafka://host:port/topic` or `stderr`.
    pub fn parse(url: &str) -> Result<Self> {
        match url {
            "stderr" => Ok(DeadLetterSpec::Stderr),
            u if u.starts_with("kafka://") => Ok(DeadLetterSpec::Kafka(u.to_string())),
            u => Err(RuntimeError::Config(format!(
                "--dlq {u:?}: dead letters go to kafka://host:port/topic or stderr"
            ))),
        }
    }
}

/// Everything a pipeline is: its query, named sources, outputs and settings.
#[derive(Debug)]
pub struct PipelineSpec {
    pub sql: String,
    /// The inputs, one per SQL table the query reads.
    pub sources: Vec<SourceSpec>,
    pub sink: SinkSpec,
    pub dead_letters: DeadLetterSpec,
    pub settings: Settings,
    /// Resume from and write checkpoints to this directory.
    pub checkpoint: Option<PathBuf>,
    /// librdkafka properties for every Kafka client of the pipeline.
    pub kafka: BTreeMap<String, String>,
    /// Share the input with other processes of this consumer group.
    pub group: Option<GroupSpec>,
}

/// Membership of a consumer group (`--group`): processes with the same
/// pipeline and group share the input's partitions as tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    /// Static membership (`group.instance.id`): a restart within the
    /// session timeout keeps this process's tasks without a rebalance.
    pub instance_id: Option<String>,
    /// How the input topic is partitioned: records with equal values of
    /// these columns are in one partition (see [`crate::group`]).
    pub partitioned_by: Vec<String>,
}

impl PipelineSpec {
    pub fn new(sql: impl Into<String>, source: SourceSpec) -> Self {
        Self {
            sql: sql.into(),
            sources: vec![source],
            sink: SinkSpec::default(),
            dead_letters: DeadLetterSpec::default(),
            settings: Settings::default(),
            checkpoint: None,
            kafka: BTreeMap::new(),
            group: None,
        }
    }

    /// The spec of task `task` of a group: partition `task` of every
    /// (Kafka) source, its own checkpoint directory under the group's.
    pub fn for_task(&self, task: u32) -> Result<PipelineSpec> {
        self.derived(
            |url| {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}assign={task}")
            },
            |dir| dir.join(format!("task-{task}")),
        )
    }

    /// A copy of a group's spec, to open a task on another thread.
    pub fn group_copy(&self) -> Result<PipelineSpec> {
        self.derived(|url| url.to_string(), |dir| dir.to_path_buf())
    }

    /// This spec with each Kafka source's URL and the checkpoint directory
    /// mapped; refused unless every source is a kafka:// topic and the dead
    /// letters go to stderr or Kafka (what a group's tasks can share).
    fn derived(
        &self,
        url_of: impl Fn(&str) -> String,
        checkpoint_of: impl Fn(&std::path::Path) -> PathBuf,
    ) -> Result<PipelineSpec> {
        let sources = self
            .sources
            .iter()
            .map(|s| match &s.endpoint {
                Endpoint::Kafka(url) => Ok(SourceSpec {
                    table: s.table.clone(),
                    endpoint: Endpoint::Kafka(url_of(url)),
                    schema: s.schema.clone(),
                    format: s.format,
                }),
                other => Err(RuntimeError::Config(format!(
                    "a consumer group shares Kafka partitions; source {other:?} is not a kafka:// topic"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let dead_letters = match &self.dead_letters {
            DeadLetterSpec::Stderr => DeadLetterSpec::Stderr,
            DeadLetterSpec::Kafka(url) => DeadLetterSpec::Kafka(url.clone()),
            DeadLetterSpec::Provided(_) => {
                return Err(RuntimeError::Config(
                    "a consumer group's tasks need dead letters on stderr or Kafka".into(),
                ));
            }
        };
        Ok(PipelineSpec {
            sql: self.sql.clone(),
            sources,
            sink: self.sink.clone(),
            dead_letters,
            settings: self.settings.clone(),
            checkpoint: self.checkpoint.as_deref().map(checkpoint_of),
            kafka: self.kafka.clone(),
            group: self.group.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(url: &str) -> String {
        let mut e = Endpoint::parse(url).unwrap();
        e.bound_at_open().unwrap();
        format!("{e:?}")
    }

    #[test]
    fn a_one_shot_run_ends_open_ended_logs_where_they_stand() {
        assert_eq!(
            bounded("kafka://b:9092/orders"),
            "kafka://b:9092/orders?end=latest"
        );
        assert_eq!(
            bounded("kafka://b:9092/orders?start=latest"),
            "kafka://b:9092/orders?start=latest&end=latest"
        );
        let explicit = "kafka://b:9092/orders?end=2024-01-01T00:00:00Z";
        assert_eq!(bounded(explicit), explicit);
        assert_eq!(
            bounded("webhook://h:1/hooks"),
            "webhook://h:1/hooks?end=latest"
        );
        assert_eq!(bounded("file://a.jsonl"), "file://a.jsonl");
    }
}
