//! The front door: the one place that turns a [`PipelineSpec`] into opened
//! sources, a sink and a dead-letter output. The CLI, the Python package and
//! the tests all come through here, so adding a connector, a format or a
//! naming rule is a change in this file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use tracing::info;
use ubik_connector::{ConnectorError, DeadLetterSink, Sink, Source};
use ubik_connectors::{ArrowSource, DemoSource, FileSource, NexmarkSource, StdoutSink};
use ubik_engine::{Catalog, QueryOptions, QueryPlan, plan_query};
use ubik_format::debezium::ChangeEvents;
use ubik_format::schema::describe;
use ubik_format::timestamp::EpochUnit;
use ubik_format::{ChangeEncoder, RecordDecoder};
use ubik_kafka::{EmitMode, KafkaDeadLetters, KafkaSink};

use crate::checkpoint::{CheckpointStore, fingerprint};
use crate::dead_letter::StderrDeadLetters;
use crate::error::{Result, RuntimeError};
use crate::pipeline::{Pipeline, Stage, UnreadTable};
use crate::spec::{DeadLetterSpec, Endpoint, PipelineSpec, SinkSpec, SourceSpec};

/// A source ready to read: its SQL table, schema and decoder.
pub struct OpenedSource {
    pub table: String,
    pub source: Box<dyn Source>,
    pub schema: SchemaRef,
    /// Turns the source's encoded records into rows of `schema`.
    pub decoder: Box<dyn RecordDecoder>,
    /// For a changelog source (Debezium), turns its change events into
    /// rows and deletions first.
    pub changes: Option<Box<dyn ChangeEvents>>,
    /// What numbers count in its TIMESTAMP columns (`timestamp_unit=`),
    /// for the decoders made later (deletions' keys).
    pub epoch_unit: Option<EpochUnit>,
}

/// A pipeline and its changelog sink, opened.
pub struct Opened {
    pub pipeline: Pipeline,
    pub sink: Box<dyn Sink>,
    /// Encodes the changelog in the sink's format.
    pub encoder: Box<dyn ChangeEncoder>,
}

/// The SQL table name of a source: the name given; else the endpoint's own
/// (a Kafka topic, a webhook path's last segment); else (files, stdin, the
/// demo) the one table the query reads; else `fallback`.
pub fn table_name(
    explicit: Option<&str>,
    endpoint: Option<&Endpoint>,
    sql: &str,
    fallback: &str,
) -> String {
    if let Some(t) = explicit {
        return t.to_string();
    }
    if let Some(t) = endpoint.and_then(Endpoint::own_table) {
        return t;
    }
    match ubik_engine::sql::referenced_tables(sql).as_slice() {
        [one] => one.clone(),
        _ => fallback.to_string(),
    }
}

/// Plans `sql` over `tables` without opening anything: the exact result
/// schema and key, before any row is read.
pub fn plan(sql: &str, tables: &[(String, SchemaRef)], options: QueryOptions) -> Result<QueryPlan> {
    let mut catalog = Catalog::new();
    for (name, schema) in tables {
        catalog.add_table(name.clone(), Arc::clone(schema));
    }
    Ok(plan_query(sql, &catalog, options)?)
}

/// What opening a source may depend on besides its endpoint.
struct Opening<'a> {
    /// The source's SQL table (a name for in-process Arrow, which has none).
    table: &'a str,
    sql: &'a str,
    schema: Option<&'a SchemaRef>,
    checkpoint: Option<&'a Path>,
    kafka: &'a BTreeMap<String, String>,
}

/// Opens a source's transport (the only place that knows every connector).
fn open_endpoint(endpoint: Endpoint, at: &Opening<'_>) -> Result<Box<dyn Source>> {
    Ok(match endpoint {
        Endpoint::File(p) => Box::new(FileSource::open(&p.to_string_lossy())?),
        Endpoint::Stdin => Box::new(FileSource::stdin()),
        Endpoint::Demo { table, options } => Box::new(DemoSource::new(&table, options)),
        Endpoint::Nexmark { table, options } => Box::new(NexmarkSource::new(table, options)),
        Endpoint::Kafka(url) => {
            Box::new(ubik_kafka::KafkaSource::open(&url, at.kafka).map_err(ConnectorError::from)?)
        }
        Endpoint::Webhook(url) => {
            let owner = webhook_owner(&url, at);
            // The endpoint decodes at the door: it needs the declared schema.
            Box::new(
                ubik_webhook::WebhookSource::open(&url, &owner, at.schema.cloned())
                    .map_err(ConnectorError::from)?,
            )
        }
        Endpoint::Arrow(reader) => Box::new(ArrowSource::new(at.table, reader)),
        Endpoint::Provided(s) => s,
    })
}

/// A webhook buffer belongs to its pipeline: it lives in the checkpoint
/// directory (or, without one, in `./ubik-webhook-<table>-<identity>`), and
/// it is replayed only by a pipeline with the same query, table, schema and
/// endpoint.
fn webhook_owner(url: &str, at: &Opening<'_>) -> ubik_webhook::BufferOwner {
    let endpoint = url.split('?').next().unwrap_or(url);
    let identity = fingerprint(
        &serde_json::json!({
            "sql": at.sql,
            "table": at.table,
            "schema": at.schema.map(|s| describe(s)),
            "endpoint": endpoint,
        })
        .to_string(),
    );
    let default_dir = match at.checkpoint {
        Some(dir) => dir.join(format!("webhook-{}", at.table)),
        None => PathBuf::from(format!("ubik-webhook-{}-{}", at.table, &identity[..8])),
    };
    ubik_webhook::BufferOwner {
        default_dir,
        identity,
    }
}

/// Opens one source: names its table, resolves its schema (declared, the
/// source's own, or inferred from a sample by its format) and builds its decoder.
pub fn open_source(
    spec: SourceSpec,
    sql: &str,
    spec_settings: &crate::settings::Settings,
    checkpoint: Option<&Path>,
    kafka: &BTreeMap<String, String>,
) -> Result<OpenedSource> {
    let SourceSpec {
        table,
        endpoint,
        schema,
        format,
    } = spec;
    let named = table_name(table.as_deref(), Some(&endpoint), sql, "");
    let epoch_unit = crate::codec::epoch_unit(&endpoint)?;
    let avro = crate::codec::source_decoder(&endpoint, kafka)?;
    if avro.is_some() && schema.is_some() {
        return Err(RuntimeError::Config(
            "format=avro takes the table's columns from the registry (the topic's value subject's latest schema): drop the declared schema".into(),
        ));
    }
    // Only a declared schema (or a Debezium topic's registry) can name a primary key.
    let schema = crate::codec::declared_schema(&endpoint, schema)?;
    let changes = crate::codec::change_source(&endpoint, kafka, schema.as_ref())?;
    let (schema, changes) = match changes {
        Some(c) => (Some(c.schema), Some(c.events)),
        None => (schema, None),
    };
    let mut source = open_endpoint(
        endpoint,
        &Opening {
            table: if named.is_empty() { "input" } else { &named },
            sql,
            schema: schema.as_ref(),
            checkpoint,
            kafka,
        },
    )?;
    let table = if named.is_empty() {
        source.table().to_string()
    } else {
        named
    };
    if let Some(avro) = avro {
        return Ok(OpenedSource {
            table,
            source,
            schema: Arc::clone(avro.schema()),
            decoder: Box::new(avro),
            changes: None,
            epoch_unit: None,
        });
    }
    let schema = match schema.or_else(|| source.schema()) {
        Some(s) => s,
        None => {
            let sample = source.sample(spec_settings.infer_sample)?;
            let refs: Vec<&[u8]> = sample.iter().map(|r| r.as_slice()).collect();
            let s = format.infer_schema(&refs)?;
            info!(schema = %describe(&s), "inferred the input schema from {} records", refs.len());
            s
        }
    };
    let mut decoder =
        format.decoder(Arc::clone(&schema), spec_settings.query.resolved_threads())?;
    if let Some(unit) = epoch_unit {
        decoder.set_epoch_unit(unit)?;
    }
    Ok(OpenedSource {
        table,
        source,
        schema,
        decoder,
        changes,
        epoch_unit,
    })
}

fn open_dead_letters(
    spec: DeadLetterSpec,
    kafka: &BTreeMap<String, String>,
) -> Result<Box<dyn DeadLetterSink>> {
    Ok(match spec {
        DeadLetterSpec::Stderr => Box::new(StderrDeadLetters),
        DeadLetterSpec::Kafka(url) => {
            Box::new(KafkaDeadLetters::open(&url, kafka).map_err(ConnectorError::from)?)
        }
        DeadLetterSpec::Provided(d) => d,
    })
}

/// Opens the sink of `pipeline`'s changelog.
fn open_sink(
    spec: &SinkSpec,
    emit: EmitMode,
    kafka: &BTreeMap<String, String>,
    pipeline: &Pipeline,
    task: Option<(&str, &str)>,
) -> Result<Box<dyn Sink>> {
    Ok(match spec {
        SinkSpec::Stdout => Box::new(StdoutSink::default()),
        SinkSpec::Kafka(url) => {
            // Stable across restarts of the same pipeline (and task), so a
            // restarted (or second) instance fences the previous one.
            let transactional_id = match task {
                None => format!("ubik-{}", pipeline.fingerprint()),
                Some((group, t)) => format!("ubik-{}-{group}-{t}", pipeline.fingerprint()),
            };
            Box::new(
                KafkaSink::open(
                    url,
                    kafka,
                    emit,
                    Some(&transactional_id),
                    pipeline.plan().is_keyed(),
                )
                .map_err(ConnectorError::from)?,
            )
        }
    })
}

/// Opens the pipeline's sources and dead-letter output, plans the query and
/// resumes from the checkpoint, if any. The sink is the caller's (a host).
pub fn open_pipeline(spec: PipelineSpec) -> Result<Pipeline> {
    open_pipeline_replicated(spec, None, (Stage::Whole, Vec::new()))
}

/// [`open_pipeline`], its checkpoints also saved to `replica`, as `stage`
/// knowing `unread` tables besides its sources.
fn open_pipeline_replicated(
    spec: PipelineSpec,
    replica: Option<Box<dyn ubik_connector::CheckpointReplica>>,
    (stage, unread): (Stage, Vec<UnreadTable>),
) -> Result<Pipeline> {
    let PipelineSpec {
        sql,
        sources,
        sink: _,
        dead_letters,
        settings,
        checkpoint,
        kafka,
        group: _,
    } = spec;
    check_source_names(&sources)?;
    let opened = sources
        .into_iter()
        .map(|s| open_source(s, &sql, &settings, checkpoint.as_deref(), &kafka))
        .collect::<Result<Vec<_>>>()?;
    let dead_letters = open_dead_letters(dead_letters, &kafka)?;
    let store = match (&checkpoint, replica) {
        (None, _) => None,
        (Some(dir), replica) => {
            let store = CheckpointStore::open(dir, settings.keep_checkpoints)?
                .with_state_dir(settings.state_dir.clone());
            match replica {
                Some(r) => Some(store.with_replica(r)?),
                None => Some(store),
            }
        }
    };
    Pipeline::with_store(
        &sql,
        (opened, unread),
        &settings,
        store,
        dead_letters,
        stage,
    )
}

/// The compacted topic a group's task checkpoints are replicated to.
pub fn state_topic(group: &str) -> String {
    format!("{group}-ubik-checkpoints")
}

/// The topic a group's first stages route rows through, by key.
pub fn repartition_topic(group: &str) -> String {
    format!("{group}-ubik-repartition")
}

/// The partitions a consumer group's tasks are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLayout {
    /// Each input topic's partitions, in the pipeline's source order.
    pub inputs: Vec<u32>,
}

impl GroupLayout {
    /// The repartition topic's: as many as the largest input has.
    pub fn repartition(&self) -> u32 {
        self.inputs.iter().copied().max().unwrap_or(1)
    }

    /// Every task, and so the state topic's partitions: the keyed tasks
    /// (or whole ones) first, then each input's first stages.
    pub fn tasks(&self, repartitioned: bool) -> u32 {
        match repartitioned {
            true => self.repartition() + self.inputs.iter().sum::<u32>(),
            false => self.repartition(),
        }
    }
}

/// A task of a consumer group's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskKind {
    /// The whole query over partition `p` of inputs partitioned by its key.
    Whole(u32),
    /// The first stage over partition `p` of input `source` (its index
    /// among the pipeline's sources): route rows by key.
    Shuffle(usize, u32),
    /// The query over partition `r` of the repartition topic.
    Keyed(u32),
}

impl TaskKind {
    /// Its number on the state topic: first stages after the others.
    pub(crate) fn state_id(self, layout: &GroupLayout) -> u32 {
        match self {
            TaskKind::Whole(p) | TaskKind::Keyed(p) => p,
            TaskKind::Shuffle(source, p) => {
                layout.repartition() + layout.inputs[..source].iter().sum::<u32>() + p
            }
        }
    }
}

impl std::fmt::Display for TaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskKind::Whole(p) => write!(f, "{p}"),
            TaskKind::Shuffle(0, p) => write!(f, "shuffle-{p}"),
            TaskKind::Shuffle(source, p) => write!(f, "shuffle-{source}-{p}"),
            TaskKind::Keyed(p) => write!(f, "keyed-{p}"),
        }
    }
}

/// A table a staged task plans and decodes but does not read: its
/// declared schema (a group's repartitioned rows are decoded with it).
fn unread_table(
    spec: SourceSpec,
    sql: &str,
    settings: &crate::settings::Settings,
) -> Result<UnreadTable> {
    let table = table_name(spec.table.as_deref(), Some(&spec.endpoint), sql, "input");
    let schema = crate::codec::declared_schema(&spec.endpoint, spec.schema)?.ok_or_else(|| {
        RuntimeError::Config(format!(
            "a repartitioned group reads its rows back from the repartition topic, so the schema of `{table}` must be declared (--schema {table}=...)"
        ))
    })?;
    let mut decoder = spec
        .format
        .decoder(Arc::clone(&schema), settings.query.resolved_threads())?;
    // The routed rows are the source's records: their numbers count its unit.
    let epoch_unit = crate::codec::epoch_unit(&spec.endpoint)?;
    if let Some(unit) = epoch_unit {
        decoder.set_epoch_unit(unit)?;
    }
    Ok(UnreadTable {
        table,
        schema,
        decoder,
        epoch_unit,
    })
}

/// Opens a task of a consumer group's pipeline (`spec` is the whole
/// pipeline's, its inputs having the partitions `layout` says): the task's
/// partition of its source, its checkpoints replicated to the group's state
/// topic, and a sink whose transactional id names the task, so that a new
/// owner fences the old one. A first stage writes to the repartition topic
/// and knows the query's other tables without reading them; a keyed task
/// reads the repartition topic and decodes every table's rows.
pub fn open_task(spec: &PipelineSpec, task: TaskKind, layout: &GroupLayout) -> Result<Opened> {
    let group = spec
        .group
        .clone()
        .ok_or_else(|| RuntimeError::Config("a task needs a consumer group".into()))?;
    let Some(Endpoint::Kafka(url)) = spec.sources.first().map(|s| &s.endpoint) else {
        return Err(RuntimeError::Config(
            "a consumer group shares Kafka partitions: the source must be a kafka:// topic".into(),
        ));
    };
    let bootstrap = ubik_kafka::KafkaUrl::parse(url)
        .map_err(ConnectorError::from)?
        .bootstrap;
    let repartitioned = !matches!(task, TaskKind::Whole(_));
    let replica = ubik_kafka::StateTopic::open(
        &bootstrap,
        &state_topic(&group.name),
        layout.tasks(repartitioned) as i32,
        task.state_id(layout),
        &spec.kafka,
    )
    .map_err(ConnectorError::from)?;
    let (p, read) = match task {
        TaskKind::Whole(p) => (p, None),
        TaskKind::Shuffle(source, p) => (p, Some(source)),
        TaskKind::Keyed(r) => (r, Some(0)),
    };
    let mut task_spec = spec.for_task(p)?;
    task_spec.checkpoint = spec
        .checkpoint
        .as_ref()
        .map(|d| d.join(format!("task-{task}")));
    // Each task's state store is its own (a store directory is locked by one user).
    task_spec.settings.state_dir = spec
        .settings
        .state_dir
        .as_ref()
        .map(|d| d.join(format!("task-{task}")));
    // A staged task reads one source; it knows the others' tables.
    let mut unread = Vec::new();
    if let Some(read) = read {
        let sources = std::mem::take(&mut task_spec.sources);
        for (i, source) in sources.into_iter().enumerate() {
            if i == read {
                task_spec.sources.push(source);
            } else {
                unread.push(unread_table(source, &spec.sql, &task_spec.settings)?);
            }
        }
    }
    let repartition_url = format!("kafka://{bootstrap}/{}", repartition_topic(&group.name));
    let stage = match task {
        TaskKind::Whole(_) => Stage::Whole,
        TaskKind::Shuffle(..) => {
            task_spec.sink = SinkSpec::Kafka(repartition_url);
            Stage::Shuffle {
                partitions: layout.repartition(),
            }
        }
        TaskKind::Keyed(r) => {
            let source = &mut task_spec.sources[0];
            let table = table_name(
                source.table.as_deref(),
                Some(&source.endpoint),
                &spec.sql,
                "input",
            );
            if source.schema.is_none() {
                return Err(RuntimeError::Config(format!(
                    "a repartitioned group reads its rows back from the repartition topic, so the schema of `{table}` must be declared (--schema)"
                )));
            }
            source.table = Some(table.clone());
            // The routed records are the source's bytes: their numbers count its unit.
            let unit = match crate::codec::epoch_unit(&source.endpoint)? {
                Some(unit) => format!("&timestamp_unit={}", unit.name()),
                None => String::new(),
            };
            source.endpoint =
                Endpoint::Kafka(format!("{repartition_url}?assign={r}&purge=true{unit}"));
            // Every table's first stages, in the spec's order.
            let upstream = std::iter::once(table)
                .chain(unread.iter().map(|u| u.table.clone()))
                .zip(layout.inputs.iter().copied())
                .collect();
            Stage::Shuffled { upstream }
        }
    };
    let emit = task_spec.settings.emit;
    let sink_spec = task_spec.sink.clone();
    let kafka = task_spec.kafka.clone();
    let pipeline = open_pipeline_replicated(task_spec, Some(Box::new(replica)), (stage, unread))?;
    let id = match task {
        TaskKind::Whole(p) | TaskKind::Keyed(p) => p.to_string(),
        TaskKind::Shuffle(0, p) => format!("s{p}"),
        TaskKind::Shuffle(source, p) => format!("s{source}-{p}"),
    };
    let sink = open_sink(
        &sink_spec,
        emit,
        &kafka,
        &pipeline,
        Some((&group.name, &id)),
    )?;
    let encoder = crate::codec::sink_encoder(&sink_spec, &kafka, pipeline.plan())?;
    Ok(Opened {
        pipeline,
        sink,
        encoder,
    })
}

/// Several sources must each name their table, once.
fn check_source_names(sources: &[SourceSpec]) -> Result<()> {
    if sources.is_empty() {
        return Err(RuntimeError::Config(
            "no source: give one (--from URL) or several named ones (--from NAME=URL)".into(),
        ));
    }
    if sources.len() == 1 {
        return Ok(());
    }
    let mut seen = std::collections::BTreeSet::new();
    for s in sources {
        let name = s
            .table
            .clone()
            .or_else(|| s.endpoint.own_table())
            .ok_or_else(|| {
                RuntimeError::Config(format!(
                    "with several sources each needs its table name: write --from NAME={:?}",
                    s.endpoint
                ))
            })?;
        if !seen.insert(name.clone()) {
            return Err(RuntimeError::Config(format!(
                "two sources are named `{name}`; give each its own NAME= (--from NAME=URL)"
            )));
        }
    }
    Ok(())
}

/// Opens everything: sources, dead letters, the pipeline, and its sink.
pub fn open(mut spec: PipelineSpec) -> Result<Opened> {
    let sink_spec = std::mem::take(&mut spec.sink);
    let emit = spec.settings.emit;
    let kafka = spec.kafka.clone();
    let pipeline = open_pipeline(spec)?;
    // Schemas are registered (and a refusing subject refused) before the
    // sink opens a transaction.
    let encoder = crate::codec::sink_encoder(&sink_spec, &kafka, pipeline.plan())?;
    let sink = open_sink(&sink_spec, emit, &kafka, &pipeline, None)?;
    Ok(Opened {
        pipeline,
        sink,
        encoder,
    })
}

/// The plan of `spec` without running it: each source's schema is the
/// declared one or, when none is declared, read from the source (its own
/// or inferred from a sample), which opens it.
pub fn validate(spec: PipelineSpec) -> Result<QueryPlan> {
    check_source_names(&spec.sources)?;
    let options = spec.settings.query.clone();
    let mut tables = Vec::with_capacity(spec.sources.len());
    for source in spec.sources {
        match source.schema.clone() {
            Some(schema) => {
                let schema = crate::codec::declared_schema(&source.endpoint, Some(schema))?
                    .expect("a declared schema");
                let referenced = ubik_engine::sql::referenced_tables(&spec.sql);
                let fallback = referenced.first().map_or("input", String::as_str);
                let name = table_name(
                    source.table.as_deref(),
                    Some(&source.endpoint),
                    &spec.sql,
                    fallback,
                );
                tables.push((name, schema));
            }
            None => {
                let opened = open_source(
                    source,
                    &spec.sql,
                    &spec.settings,
                    spec.checkpoint.as_deref(),
                    &spec.kafka,
                )?;
                tables.push((opened.table, opened.schema));
            }
        }
    }
    plan(&spec.sql, &tables, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(sql: &str, url: &str, checkpoint: Option<&Path>) -> ubik_webhook::BufferOwner {
        let kafka = BTreeMap::new();
        webhook_owner(
            url,
            &Opening {
                table: "hooks",
                sql,
                schema: None,
                checkpoint,
                kafka: &kafka,
            },
        )
    }

    #[test]
    fn a_webhook_buffer_belongs_to_its_pipeline() {
        let url = "webhook://127.0.0.1:0/hooks";
        let a = owner("SELECT * FROM hooks", url, None);
        // Flush options may change between runs; the identity does not.
        let same = owner("SELECT * FROM hooks", &format!("{url}?max_rows=5"), None);
        let other = owner("SELECT id FROM hooks", url, None);
        assert_eq!(a.identity, same.identity);
        assert_ne!(a.identity, other.identity);
        assert_ne!(a.default_dir, other.default_dir);
        let ck = Path::new("state/hooks");
        assert_eq!(
            owner("SELECT * FROM hooks", url, Some(ck)).default_dir,
            ck.join("webhook-hooks")
        );
    }
}
