//! Flags and the pipeline file merged (flags win) and validated into the
//! runtime's configuration, before anything is opened.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::SchemaRef;
use ubik_engine::QueryOptions;
use ubik_engine::time::parse_duration;
use ubik_format::schema::{parse_column_list, parse_json_schema};
use ubik_kafka::EmitMode;
use ubik_runtime::config::check_sink_url;
use ubik_runtime::{CheckpointConfig, ErrorPolicy, PipelineConfig, parse_source};

use crate::args::{QueryArgs, RunArgs};
use crate::pipeline_file::PipelineFile;

#[derive(Debug)]
pub enum SinkSettings {
    Stdout,
    Kafka { url: String, emit: EmitMode },
}

#[derive(Debug)]
pub struct RunSettings {
    pub config: PipelineConfig,
    pub sink: SinkSettings,
    pub dlq: Option<String>,
    pub kafka_properties: BTreeMap<String, String>,
    pub metrics: Option<String>,
    pub quiet: bool,
}

fn duration(name: &str, text: &str) -> Result<Duration> {
    let us = parse_duration(text).ok_or_else(|| {
        anyhow!("--{name} {text:?} is not a duration; use e.g. 500ms, 5s, 10m, 1h, 1d")
    })?;
    Ok(Duration::from_micros(us.max(0) as u64))
}

fn micros(name: &str, text: &str) -> Result<i64> {
    Ok(duration(name, text)?.as_micros() as i64)
}

/// Loads `-f`: a pipeline file when it ends in `.toml`, else a SQL file.
pub fn load_file(query: &QueryArgs) -> Result<PipelineFile> {
    let Some(path) = &query.file else {
        return Ok(PipelineFile::default());
    };
    if path.extension().is_some_and(|e| e == "toml") {
        return PipelineFile::load(path);
    }
    let sql =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(PipelineFile {
        query: Some(sql),
        ..Default::default()
    })
}

pub fn resolve_sql(query: &QueryArgs, file: &PipelineFile) -> Result<String> {
    match (&query.sql, &file.query) {
        (Some(sql), _) => Ok(sql.clone()),
        (None, Some(sql)) => Ok(sql.clone()),
        (None, None) => {
            bail!("no query: pass the SQL as an argument, or -f query.sql / -f pipeline.toml")
        }
    }
}

pub fn resolve_schema(text: Option<&str>) -> Result<Option<SchemaRef>> {
    let Some(text) = text else { return Ok(None) };
    if let Some(path) = text.strip_prefix('@') {
        let body = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read schema file {path}"))?;
        return Ok(Some(parse_json_schema(&body)?));
    }
    Ok(Some(parse_column_list(text)?))
}

pub fn query_options(query: &QueryArgs, file: &PipelineFile) -> Result<QueryOptions> {
    let mut o = QueryOptions::default();
    if let Some(v) = query.lateness.as_ref().or(file.lateness.as_ref()) {
        o.lateness_us = micros("lateness", v)?;
    }
    if let Some(v) = query.retention.as_ref().or(file.retention.as_ref()) {
        o.retention_us = micros("retention", v)?;
    }
    if let Some(v) = query.emit_interval.as_ref().or(file.emit_interval.as_ref()) {
        o.emit_interval_us = micros("emit-interval", v)?.max(1);
    }
    if let Some(v) = query.max_future.as_ref().or(file.max_future.as_ref()) {
        o.max_future_us = micros("max-future", v)?;
    }
    o.event_time = query.event_time.clone().or(file.event_time.clone());
    if let Some(n) = query.threads.or(file.threads) {
        if n == 0 {
            bail!("--threads must be at least 1 (omit it for one per core)");
        }
        o.threads = n;
    }
    Ok(o)
}

fn read_properties(path: &PathBuf) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read Kafka properties file {}", path.display()))?;
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            anyhow!(
                "{}:{}: expected key=value, found {line:?}",
                path.display(),
                n + 1
            )
        })?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// librdkafka properties: the pipeline file's [kafka] table, then the
/// properties file, then -X flags (later wins).
fn kafka_properties(args: &RunArgs, file: &PipelineFile) -> Result<BTreeMap<String, String>> {
    let mut out = file.kafka.clone();
    if let Some(path) = &args.kafka_config {
        out.extend(read_properties(path)?);
    }
    for kv in &args.kafka_property {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("-X {kv:?}: expected key=value"))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

pub fn run_settings(args: RunArgs) -> Result<RunSettings> {
    let file = load_file(&args.query)?;
    let sql = resolve_sql(&args.query, &file)?;
    let from = args
        .from
        .clone()
        .or(file.from.clone())
        .ok_or_else(|| anyhow!("no source: pass --from kafka://host:port/topic (or webhook://, file://, -, demo://orders)"))?;
    let mut source = parse_source(&from)?;
    let schema = resolve_schema(args.query.schema.as_deref().or(file.schema.as_deref()))?;
    let options = query_options(&args.query, &file)?;

    let kafka_properties = kafka_properties(&args, &file)?;
    if let ubik_runtime::SourceSpec::Kafka { properties, .. } = &mut source {
        *properties = kafka_properties.clone();
    }
    let mut config = PipelineConfig::new(sql, source);
    config.table = args.table.clone().or(file.table.clone());
    config.schema = schema;
    config.options = options;
    if let Some(p) = args.on_error.as_deref().or(file.on_error.as_deref()) {
        config.on_error = ErrorPolicy::parse(p)?;
    }
    if let Some(n) = args.batch_size.or(file.batch_size) {
        if n == 0 {
            bail!("--batch-size must be positive");
        }
        config.batch_size = n;
    }
    if let Some(t) = args.idle_timeout.as_ref().or(file.idle_timeout.as_ref()) {
        let d = duration("idle-timeout", t)?;
        config.idle_timeout = (!d.is_zero()).then_some(d);
    }
    let checkpoint_dir = args
        .checkpoint
        .clone()
        .or(file.checkpoint.as_ref().map(PathBuf::from));
    if let Some(dir) = checkpoint_dir {
        let mut ck = CheckpointConfig::new(dir);
        if let Some(i) = args
            .checkpoint_interval
            .as_ref()
            .or(file.checkpoint_interval.as_ref())
        {
            ck.interval = duration("checkpoint-interval", i)?;
        }
        ck.every_records = args.checkpoint_every.or(file.checkpoint_every);
        config.checkpoint = Some(ck);
    } else if args.checkpoint_interval.is_some() || args.checkpoint_every.is_some() {
        bail!("--checkpoint-interval/--checkpoint-every need --checkpoint DIR");
    }

    let emit = match args.emit.as_deref().or(file.emit.as_deref()) {
        None | Some("transactional") => EmitMode::Transactional,
        Some("idempotent") => EmitMode::Idempotent,
        Some(other) => bail!("--emit {other:?} is not one of transactional, idempotent"),
    };
    let sink = match args.to.clone().or(file.to.clone()) {
        None => {
            if args.emit.is_some() {
                bail!("--emit applies to --to kafka://...; stdout has no emit modes");
            }
            SinkSettings::Stdout
        }
        Some(url) => {
            check_sink_url(&url)?;
            SinkSettings::Kafka { url, emit }
        }
    };
    let dlq = args
        .dlq
        .clone()
        .or(file.dlq.clone())
        .filter(|d| d != "stderr");
    if let Some(d) = dlq.as_ref().filter(|d| !d.starts_with("kafka://")) {
        bail!("--dlq {d:?}: dead letters go to kafka://host:port/topic or stderr");
    }
    Ok(RunSettings {
        config,
        sink,
        dlq,
        kafka_properties,
        metrics: args.metrics.clone().or(file.metrics.clone()),
        quiet: args.quiet,
    })
}
