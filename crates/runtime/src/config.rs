//! A validated pipeline configuration: what the CLI builds from flags and
//! the pipeline file, and the Python package from keyword arguments, before
//! anything runs.

use std::path::PathBuf;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use ubik_connectors::demo::DemoOptions;
use ubik_engine::QueryOptions;
use ubik_engine::connector::Source;

use crate::error::{Result, RuntimeError};

/// What to do with an input record that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// Stop, naming the record's position and the reason.
    #[default]
    Fail,
    /// Count it, log it, go on.
    Skip,
    /// Write it to the dead-letter output with the reason, go on.
    DeadLetter,
}

impl ErrorPolicy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "fail" => Ok(ErrorPolicy::Fail),
            "skip" => Ok(ErrorPolicy::Skip),
            "dlq" | "dead-letter" => Ok(ErrorPolicy::DeadLetter),
            other => Err(RuntimeError::Config(format!(
                "--on-error {other:?} is not one of fail, skip, dlq"
            ))),
        }
    }
}

/// Where records come from.
pub enum SourceSpec {
    File(PathBuf),
    Stdin,
    Demo {
        table: String,
        options: DemoOptions,
    },
    /// `kafka://host:port/topic?...` plus librdkafka properties (-X, files).
    Kafka {
        url: String,
        properties: std::collections::BTreeMap<String, String>,
    },
    /// `webhook://HOST:PORT/PATH?...`: an HTTP endpoint with a durable buffer.
    Webhook(String),
    /// A source built by the caller (in-process Arrow from Python, tests).
    Provided(Box<dyn Source>),
}

impl std::fmt::Debug for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSpec::File(p) => write!(f, "file://{}", p.display()),
            SourceSpec::Stdin => write!(f, "-"),
            SourceSpec::Demo { table, .. } => write!(f, "demo://{table}"),
            SourceSpec::Kafka { url, .. } => write!(f, "{url}"),
            SourceSpec::Webhook(url) => write!(f, "{url}"),
            SourceSpec::Provided(s) => write!(f, "{}", s.describe()),
        }
    }
}

/// Parses a source URL: `file://path.jsonl`, a bare `*.jsonl` path, `-`,
/// `demo://orders?...`.
pub fn parse_source(url: &str) -> Result<SourceSpec> {
    if url == "-" {
        return Ok(SourceSpec::Stdin);
    }
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(SourceSpec::File(PathBuf::from(path)));
    }
    if url.starts_with("kafka://") {
        ubik_kafka::KafkaUrl::parse(url).map_err(|e| RuntimeError::Config(e.to_string()))?;
        return Ok(SourceSpec::Kafka {
            url: url.to_string(),
            properties: Default::default(),
        });
    }
    if url.starts_with("webhook://") {
        ubik_webhook::WebhookConfig::parse(url).map_err(|e| RuntimeError::Config(e.to_string()))?;
        return Ok(SourceSpec::Webhook(url.to_string()));
    }
    if let Some(rest) = url.strip_prefix("demo://") {
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        if table.is_empty() {
            return Err(RuntimeError::Config(
                "demo:// needs a table name, e.g. demo://orders".into(),
            ));
        }
        return Ok(SourceSpec::Demo {
            table: table.to_string(),
            options: DemoOptions::parse(query)?,
        });
    }
    if !url.contains("://")
        && [".jsonl", ".json", ".ndjson"]
            .iter()
            .any(|e| url.ends_with(e))
    {
        return Ok(SourceSpec::File(PathBuf::from(url)));
    }
    let scheme = url.split("://").next().unwrap_or(url);
    Err(RuntimeError::Config(format!(
        "unsupported source {url:?} (scheme {scheme:?}); use kafka://host:port/topic, webhook://host:port/path, file://path.jsonl, - (stdin) or demo://orders"
    )))
}

/// Refuses any `--to` that is not Kafka: ubik owns no lake writer.
pub fn check_sink_url(url: &str) -> Result<()> {
    if url.starts_with("kafka://") {
        return Ok(());
    }
    Err(RuntimeError::Config(format!(
        "--to {url:?} is not supported: ubik writes no files and owns no lake writer; --to takes kafka://host:port/topic only (omit it to print the changelog on stdout). To land results in a lake table, use the Arrow leg (Python: ubik.pipeline(...)) and commit with your own writer, or point a Kafka Connect sink at the output topic."
    )))
}

#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    /// Checkpoint at least this often (wall clock) ...
    pub interval: Duration,
    /// ... or after this many input records, whichever comes first.
    pub every_records: Option<u64>,
    /// Checkpoints kept on disk.
    pub keep: usize,
}

impl CheckpointConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            interval: Duration::from_secs(10),
            every_records: None,
            keep: 3,
        }
    }
}

#[derive(Debug)]
pub struct PipelineConfig {
    pub sql: String,
    pub source: SourceSpec,
    /// The declared input schema; `None`: the source's own, or inferred.
    pub schema: Option<SchemaRef>,
    pub options: QueryOptions,
    pub checkpoint: Option<CheckpointConfig>,
    pub on_error: ErrorPolicy,
    /// Records per poll (the engine's batch size).
    pub batch_size: usize,
    /// Advance an idle partition's watermark with the wall clock after this long.
    pub idle_timeout: Option<Duration>,
    /// Records sampled to infer a schema.
    pub infer_sample: usize,
    /// The SQL name of the source's table; `None`: the topic, the webhook
    /// path's last segment, or (files, stdin, demo) the table the query reads.
    pub table: Option<String>,
}

impl PipelineConfig {
    pub fn new(sql: impl Into<String>, source: SourceSpec) -> Self {
        Self {
            sql: sql.into(),
            source,
            schema: None,
            options: QueryOptions::default(),
            checkpoint: None,
            on_error: ErrorPolicy::Fail,
            batch_size: 65_536,
            idle_timeout: Some(Duration::from_secs(30)),
            infer_sample: 1000,
            table: None,
        }
    }
}
