//! Flags and the pipeline file merged (flags win) into the runtime's
//! [`PipelineSpec`], validated before anything is opened. Every named
//! setting goes through the runtime's one options layer ([`Settings::set`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use arrow::datatypes::SchemaRef;
use ubik_format::schema::{parse_column_list, parse_json_schema};
use ubik_runtime::{
    DeadLetterSpec, GroupSpec, PipelineSpec, RuntimeError, Settings, SinkSpec, SourceSpec,
};

use crate::args::{QueryArgs, RunArgs};
use crate::pipeline_file::{PipelineFile, QueryOrigin};

/// What `ubik run` does: the pipeline, plus the CLI's own reporting.
#[derive(Debug)]
pub struct RunSettings {
    pub spec: PipelineSpec,
    /// Where the query was written, when in a file.
    pub query_origin: Option<QueryOrigin>,
    pub metrics: Option<String>,
    pub quiet: bool,
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
        query_origin: Some(QueryOrigin::whole(path)),
        ..Default::default()
    })
}

/// Where the query that runs was written, when it came from a file (not
/// from the command line).
pub fn query_origin(query: &QueryArgs, file: &PipelineFile) -> Option<QueryOrigin> {
    match query.sql {
        Some(_) => None,
        None => file.query_origin.clone(),
    }
}

/// A query error placed in the file the query came from.
pub fn in_query_file(e: anyhow::Error, origin: Option<&QueryOrigin>) -> anyhow::Error {
    let Some(o) = origin else {
        return e;
    };
    match e.downcast::<RuntimeError>() {
        Ok(RuntimeError::Engine(engine)) => {
            RuntimeError::Engine(engine.in_file(&o.file, o.lines, &o.prefix)).into()
        }
        Ok(other) => other.into(),
        Err(e) => e,
    }
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

/// The sources from `--from` (or the file's `from` and `[sources.NAME]`)
/// with their schemas from `--schema` (or the file's). `validate` may give
/// schemas alone (`schemas_alone`): each is then a source of its own.
pub fn source_specs(
    froms: &[String],
    schemas: &[String],
    table: Option<String>,
    file: &PipelineFile,
    schemas_alone: bool,
) -> Result<Vec<SourceSpec>> {
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    let mut unnamed: Option<String> = None;
    let given: Vec<String> = if schemas.is_empty() {
        file.schema.iter().cloned().collect()
    } else {
        schemas.to_vec()
    };
    for text in &given {
        match ubik_runtime::spec::split_name(text) {
            (Some(name), schema) => {
                named.insert(name.to_string(), schema.to_string());
            }
            _ if unnamed.is_some() => bail!(
                "--schema given twice without a name: write --schema NAME=\"...\" for each source"
            ),
            _ => unnamed = Some(text.clone()),
        }
    }
    for (name, s) in &file.sources {
        if let Some(schema) = &s.schema {
            named.entry(name.clone()).or_insert_with(|| schema.clone());
        }
    }
    let mut sources = Vec::new();
    if froms.is_empty() {
        if let Some(from) = &file.from {
            sources.push(SourceSpec::parse_named(from)?);
        }
        for (name, s) in &file.sources {
            let mut spec = SourceSpec::parse(&s.from)?;
            spec.table = Some(name.clone());
            sources.push(spec);
        }
    } else {
        for from in froms {
            sources.push(SourceSpec::parse_named(from)?);
        }
    }
    if sources.is_empty() && schemas_alone {
        // Schemas without sources (validate): one stand-in source each.
        for (name, schema) in &named {
            let mut spec = SourceSpec::new(ubik_runtime::Endpoint::Stdin);
            spec.table = Some(name.clone());
            spec.schema = resolve_schema(Some(schema))?;
            sources.push(spec);
        }
        if let Some(schema) = unnamed.take() {
            let mut spec = SourceSpec::new(ubik_runtime::Endpoint::Stdin);
            spec.schema = resolve_schema(Some(&schema))?;
            sources.push(spec);
        }
        return Ok(sources);
    }
    if sources.is_empty() {
        bail!(
            "no source: pass --from kafka://host:port/topic (or webhook://, file://, -, demo://orders), or --from NAME=URL once per table"
        );
    }
    if let Some(t) = table.or(file.table.clone()) {
        if sources.len() > 1 {
            bail!("--table names the one source; with several, name each: --from NAME=URL");
        }
        sources[0].table = Some(t);
    }
    let several = sources.len() > 1;
    for spec in &mut sources {
        let name = spec.table.clone().or_else(|| spec.endpoint.own_table());
        let schema = match name.as_deref().and_then(|n| named.remove(n)) {
            Some(s) => Some(s),
            None if several && unnamed.is_some() => {
                bail!("with several sources, name the schema's source: --schema NAME=\"...\"")
            }
            None => unnamed.take(),
        };
        spec.schema = resolve_schema(schema.as_deref())?;
    }
    if let Some((name, _)) = named.into_iter().next() {
        if several || unnamed.is_some() {
            bail!(
                "--schema {name}=...: no source is named {name} (name sources with --from NAME=URL)"
            );
        }
        // One source and one named schema: the name is the source's table.
        let mut text = None;
        for s in given
            .iter()
            .chain(file.sources.values().filter_map(|s| s.schema.as_ref()))
        {
            if let (Some(n), v) = ubik_runtime::spec::split_name(s)
                && n == name
            {
                text = Some(v.to_string());
            }
        }
        sources[0].table.get_or_insert(name);
        sources[0].schema = resolve_schema(text.as_deref())?;
    }
    Ok(sources)
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

/// Sets each named setting given by a flag or, failing that, the file.
fn apply(settings: &mut Settings, pairs: &[(&str, Option<String>, Option<String>)]) -> Result<()> {
    for (name, flag, file) in pairs {
        if let Some(v) = flag.as_ref().or(file.as_ref()) {
            settings.set(name, v)?;
        }
    }
    Ok(())
}

/// The query settings, shared by `run` and `validate`.
pub fn query_settings(query: &QueryArgs, file: &PipelineFile) -> Result<Settings> {
    let mut s = Settings::default();
    let n = |v: Option<usize>| v.map(|n| n.to_string());
    apply(
        &mut s,
        &[
            ("lateness", query.lateness.clone(), file.lateness.clone()),
            ("retention", query.retention.clone(), file.retention.clone()),
            (
                "join_retention",
                query.join_retention.clone(),
                file.join_retention.clone(),
            ),
            (
                "emit_interval",
                query.emit_interval.clone(),
                file.emit_interval.clone(),
            ),
            (
                "max_future",
                query.max_future.clone(),
                file.max_future.clone(),
            ),
            (
                "event_time",
                query.event_time.clone(),
                file.event_time.clone(),
            ),
            ("threads", n(query.threads), n(file.threads)),
            ("key", query.key.clone(), file.key.clone()),
            ("state_ttl", query.state_ttl.clone(), file.state_ttl.clone()),
            (
                "ttl_tombstones",
                query.ttl_tombstones.then(|| "true".to_string()),
                file.ttl_tombstones.map(|b| b.to_string()),
            ),
        ],
    )?;
    Ok(s)
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
    out.extend(property_flags(&args.kafka_property)?);
    Ok(out)
}

/// `-X key=value` flags as librdkafka properties.
pub fn property_flags(flags: &[String]) -> Result<BTreeMap<String, String>> {
    flags
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("-X {kv:?}: expected key=value"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

pub fn run_settings(args: RunArgs) -> Result<RunSettings> {
    let file = load_file(&args.query)?;
    let sql = resolve_sql(&args.query, &file)?;
    let sources = source_specs(
        &args.from,
        &args.query.schema,
        args.table.clone(),
        &file,
        false,
    )?;

    let mut settings = query_settings(&args.query, &file)?;
    let n = |v: Option<usize>| v.map(|n| n.to_string());
    let n64 = |v: Option<u64>| v.map(|n| n.to_string());
    apply(
        &mut settings,
        &[
            ("on_error", args.on_error.clone(), file.on_error.clone()),
            ("batch_size", n(args.batch_size), n(file.batch_size)),
            (
                "idle_timeout",
                args.idle_timeout.clone(),
                file.idle_timeout.clone(),
            ),
            (
                "checkpoint_interval",
                args.checkpoint_interval.clone(),
                file.checkpoint_interval.clone(),
            ),
            (
                "checkpoint_every",
                n64(args.checkpoint_every),
                n64(file.checkpoint_every),
            ),
            ("emit", args.emit.clone(), file.emit.clone()),
            (
                "state_memory",
                args.state_memory.clone(),
                file.state_memory.clone(),
            ),
            (
                "state_dir",
                args.state_dir.as_ref().map(|p| p.display().to_string()),
                file.state_dir.clone(),
            ),
        ],
    )?;

    let mut spec = PipelineSpec::new(sql, SourceSpec::new(ubik_runtime::Endpoint::Stdin));
    spec.sources = sources;
    spec.checkpoint = args
        .checkpoint
        .clone()
        .or(file.checkpoint.as_ref().map(PathBuf::from));
    if spec.checkpoint.is_none()
        && (args.checkpoint_interval.is_some() || args.checkpoint_every.is_some())
    {
        bail!("--checkpoint-interval/--checkpoint-every need --checkpoint DIR");
    }
    spec.sink = match args.to.clone().or(file.to.clone()) {
        None => {
            if args.emit.is_some() {
                bail!("--emit applies to --to kafka://...; stdout has no emit modes");
            }
            SinkSpec::Stdout
        }
        Some(url) => SinkSpec::parse(&url)?,
    };
    if let Some(d) = args.dlq.clone().or(file.dlq.clone()) {
        spec.dead_letters = DeadLetterSpec::parse(&d)?;
    }
    spec.settings = settings;
    spec.kafka = kafka_properties(&args, &file)?;
    spec.group = args
        .group
        .clone()
        .or(file.group.clone())
        .map(|name| GroupSpec {
            name,
            instance_id: args.instance_id.clone().or(file.instance_id.clone()),
            partitioned_by: if args.partitioned_by.is_empty() {
                file.partitioned_by.clone().unwrap_or_default()
            } else {
                args.partitioned_by.clone()
            },
        });
    if spec.group.is_none() && (file.instance_id.is_some() || file.partitioned_by.is_some()) {
        bail!("instance_id and partitioned_by belong to a consumer group: set group too");
    }
    Ok(RunSettings {
        spec,
        query_origin: query_origin(&args.query, &file),
        metrics: args.metrics.clone().or(file.metrics.clone()),
        quiet: args.quiet,
    })
}
