//! [`Pipeline`]: opened sources, decoded, through one query, step by step.
//!
//! The caller drives it: [`Pipeline::step`] reads one chunk and returns the
//! changelog it produced; the caller hands the changes on (a sink, a Python
//! host), makes them durable, and then calls [`Pipeline::checkpoint`].
//! Emit, commit, checkpoint: a crash anywhere replays from the last
//! checkpoint and re-emits byte-identical records. A checkpoint holds the
//! pipeline only while it freezes the state; it completes in the
//! background ([`crate::completion`]), and [`Pipeline::settle_checkpoint`]
//! waits for it where the caller needs it durable.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use serde_json::json;
use tracing::{debug, info, warn};
use ubik_connector::{
    Chunk, ConnectorError, DEFAULT_POLL_TIMEOUT, DeadLetter, DeadLetterSink, Payload, Source,
    SourceEvent,
};
use ubik_engine::plan::EventTime;
use ubik_engine::progress::{PARTITION_BITS, partition_id, source_of};
use ubik_engine::query::Query;
use ubik_engine::time::{MIN_TIME, next_tick};
use ubik_engine::{ChangeBatch, Output, QueryPlan, QuerySnapshot, SharedStore, StateOptions};
use ubik_format::debezium::ChangeEvents;
use ubik_format::schema::describe;
use ubik_format::timestamp::EpochUnit;
use ubik_format::{BadRecord, RecordDecoder};

use crate::changes::decode_changes;
use crate::checkpoint::{CHECKPOINT_FORMAT, CheckpointStore, IdleEvent, Manifest, fingerprint};
use crate::completion::{Frozen, InFlight};
use crate::connect::OpenedSource;
use crate::error::{Result, RuntimeError};
use crate::record_meta;
use crate::settings::{ErrorPolicy, Settings};
use crate::shuffle::{ShuffleBuffer, ShuffleRecord};

/// Counters of a running pipeline.
#[derive(Debug, Clone)]
pub struct Stats {
    pub records_in: u64,
    pub bytes_in: u64,
    pub decode_errors: u64,
    pub dead_letters: u64,
    pub late_rows: u64,
    pub changes_out: u64,
    pub checkpoints: u64,
    /// From the freeze to the checkpoint being current (its files synced
    /// and replicated), and how long of it held the pipeline.
    pub last_checkpoint_ms: f64,
    pub last_checkpoint_pause_ms: f64,
    /// Bytes the last checkpoint wrote (its files and new state runs).
    pub last_checkpoint_bytes: u64,
    /// Engine state bytes: the checkpoint blob and the state runs on disk.
    pub state_bytes: u64,
    pub state_keys: u64,
    pub watermark: i64,
    /// Records available in the source but not read yet, when known.
    pub lag: Option<u64>,
    /// Emit-to-commit latency: from the step whose watermark closed a window
    /// (and emitted its records) to the sink's commit returning, worst record
    /// of the last committed epoch, and the maximum over the run.
    pub commit_latency_last_ms: f64,
    pub commit_latency_max_ms: f64,
    /// CPU seconds of the pipeline's own thread in its turns and commits
    /// (decoding, the query, encoding, checkpoints; not librdkafka's
    /// threads nor the store's background merges).
    pub cpu_seconds: f64,
    pub started: Instant,
    /// Each source partition's progress (refreshed for reports).
    pub partitions: Vec<PartitionStatus>,
    /// Each stateful operator's state in memory (refreshed for reports).
    pub operators: Vec<OperatorStatus>,
    /// Bytes of the state store's files (refreshed for reports).
    pub store_disk_bytes: u64,
    pub last_checkpoint_at: Option<SystemTime>,
    /// Dead letters by reason code, and the last one's message.
    pub dead_letter_reasons: BTreeMap<&'static str, u64>,
    pub last_dead_letter: Option<String>,
    /// The last error the pipeline recovered from, and when.
    pub last_error: Option<(SystemTime, String)>,
    /// A consumer group member's stages, and its tasks in each (empty
    /// when the pipeline runs alone).
    pub stages: Vec<StageStatus>,
}

/// One stage of a consumer group's plan, as one member sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct StageStatus {
    /// What its tasks do.
    pub name: String,
    /// The topic its tasks read, and the one they write.
    pub reads: String,
    pub writes: String,
    /// The key its rows are partitioned by on the way out (routing) or in.
    pub key: Vec<String>,
    /// Its task count, and the tasks this member holds.
    pub tasks: u32,
    pub here: Vec<u32>,
    /// What this member's tasks of the stage have read, and the CPU their
    /// turns and commits used ([`Stats::cpu_seconds`]), over the run.
    pub records_in: u64,
    pub cpu_seconds: f64,
}

/// One source partition's event-time progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStatus {
    pub source: String,
    pub partition: u32,
    /// Its watermark (µs; `MIN_TIME` before any row, `MAX_TIME` once ended).
    pub watermark: i64,
    pub rows: u64,
}

/// One stateful operator's state held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorStatus {
    pub name: String,
    pub bytes: u64,
    pub keys: u64,
}

impl Stats {
    /// Counts a dead letter under its reason code (no allocation per
    /// dead letter: the last one's text reuses its buffer).
    fn dead_lettered(&mut self, reason: &'static str, message: &str) {
        use std::fmt::Write;
        self.dead_letters += 1;
        *self.dead_letter_reasons.entry(reason).or_default() += 1;
        let last = self.last_dead_letter.get_or_insert_with(String::new);
        last.clear();
        let _ = write!(last, "{reason}: {message}");
    }
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            records_in: 0,
            bytes_in: 0,
            decode_errors: 0,
            dead_letters: 0,
            late_rows: 0,
            changes_out: 0,
            checkpoints: 0,
            last_checkpoint_ms: 0.0,
            last_checkpoint_pause_ms: 0.0,
            last_checkpoint_bytes: 0,
            commit_latency_last_ms: 0.0,
            commit_latency_max_ms: 0.0,
            cpu_seconds: 0.0,
            state_bytes: 0,
            state_keys: 0,
            watermark: MIN_TIME,
            lag: None,
            started: Instant::now(),
            partitions: Vec::new(),
            operators: Vec::new(),
            store_disk_bytes: 0,
            last_checkpoint_at: None,
            dead_letter_reasons: BTreeMap::new(),
            last_dead_letter: None,
            last_error: None,
            stages: Vec::new(),
        }
    }
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read input (and possibly emitted changes).
    Data,
    /// Nothing arrived before the poll timeout.
    Idle,
    /// A bounded input ended; everything has been emitted.
    Finished,
}

/// Where a pipeline sits in a repartitioned group run ([`crate::group`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Stage {
    /// The whole query.
    #[default]
    Whole,
    /// The first stage: rows are checked, stamped and routed by key to
    /// `partitions` target partitions ([`Pipeline::write_shuffled`]).
    Shuffle { partitions: u32 },
    /// The second stage: reads one target partition of a repartition
    /// topic written by the first stages of every partition of the
    /// `upstream` tables (each with its partition count).
    Shuffled { upstream: Vec<(String, u32)> },
}

/// A table a staged pipeline knows but does not read: a first stage plans
/// the whole query (a join's other table), and a second stage decodes the
/// rows its first stages routed from it.
pub struct UnreadTable {
    pub table: String,
    pub schema: SchemaRef,
    pub decoder: Box<dyn RecordDecoder>,
    /// What numbers count in its TIMESTAMP columns (`timestamp_unit=`).
    pub epoch_unit: Option<EpochUnit>,
}

/// How a second stage decodes the routed rows of one of the query's tables.
struct RoutedTable {
    /// Its index among the plan's sources.
    index: usize,
    schema: SchemaRef,
    decoder: Box<dyn RecordDecoder>,
    /// Decodes the keys of deletions (made when the first one arrives).
    key_decoder: Option<Box<dyn RecordDecoder>>,
    epoch_unit: Option<EpochUnit>,
}

/// Writes one routed record (target partition, bytes).
pub type ShuffleWrite<'a> = dyn FnMut(u32, &[u8]) -> std::result::Result<(), ConnectorError> + 'a;

/// A query for `stage`, its state kept as `state` says.
fn query_for(plan: QueryPlan, stage: &Stage, state: &StateOptions) -> Result<Query> {
    let mut query = Query::with_state(plan, state.clone())?;
    match stage {
        Stage::Whole => {}
        Stage::Shuffle { partitions } => query.set_shuffle(*partitions)?,
        Stage::Shuffled { upstream } => {
            for (table, partitions) in upstream {
                let index = query.plan().source_index(table).ok_or_else(|| {
                    RuntimeError::Config(format!("the query does not read `{table}`"))
                })?;
                for u in 0..*partitions {
                    query.add_partition(partition_id(index, u));
                }
            }
        }
    }
    Ok(query)
}

/// One opened source of a pipeline.
struct Input {
    table: String,
    source: Box<dyn Source>,
    /// How messages name it (its URL or path).
    name: String,
    decoder: Box<dyn RecordDecoder>,
    /// Unwraps a changelog source's change events into rows and deletions.
    changes: Option<Box<dyn ChangeEvents>>,
    /// Decodes the keys of deletions (made when the first one arrives).
    key_decoder: Option<Box<dyn RecordDecoder>>,
    /// What numbers count in its TIMESTAMP columns (`timestamp_unit=`).
    epoch_unit: Option<EpochUnit>,
    schema: SchemaRef,
    /// Its index among the plan's sources (the high bits of its partition ids).
    index: usize,
    /// Where it stood before the first poll (to rewind without a checkpoint).
    initial_position: serde_json::Value,
    /// It reported its end.
    ended: bool,
}

impl Input {
    fn id(&self, partition: u32) -> u32 {
        partition_id(self.index, partition)
    }

    /// Decodes a chunk of values and deletions (`deleted`), whose bytes
    /// are keys, into one batch in record order.
    fn decode_mixed(
        &mut self,
        records: &[&[u8]],
        deleted: &[bool],
    ) -> ubik_format::Result<ubik_format::Decoded> {
        let Input {
            decoder,
            key_decoder,
            schema,
            epoch_unit,
            ..
        } = self;
        ubik_format::decoder::decode_mixed(
            records,
            deleted,
            &mut |values| decoder.decode(values),
            &mut |keys| decode_keys(schema, key_decoder, *epoch_unit, keys),
        )
    }
}

/// Decodes deletions' keys into rows of `schema` holding only the primary
/// key's columns (`decoder` is made when the first one arrives); a key that
/// fits no reading is a bad record.
fn decode_keys(
    schema: &SchemaRef,
    decoder: &mut Option<Box<dyn RecordDecoder>>,
    epoch_unit: Option<EpochUnit>,
    keys: &[&[u8]],
) -> ubik_format::Result<ubik_format::Decoded> {
    let primary_key = ubik_format::schema::primary_key(schema);
    let objects: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| record_meta::key_object(k, &primary_key).unwrap_or_default())
        .collect();
    let decoder = match decoder {
        Some(d) => d,
        None => {
            let mut d = ubik_format::json::JsonDecoder::with_threads(Arc::clone(schema), 1)?;
            if let Some(unit) = epoch_unit {
                RecordDecoder::set_epoch_unit(&mut d, unit)?;
            }
            decoder.insert(Box::new(d))
        }
    };
    let refs: Vec<&[u8]> = objects.iter().map(Vec::as_slice).collect();
    let mut decoded = decoder.decode(&refs)?;
    // A key that fits no reading was decoded as nothing: say what a
    // tombstone's key must look like instead of "empty record".
    for bad in &mut decoded.bad {
        if objects[bad.index].is_empty() {
            bad.field = None;
            bad.reason = format!(
                "a tombstone's key fits no reading of the primary key ({}): expected a plain string or JSON scalar (a one-column key), a JSON array of {} value(s) in key order, or a JSON object of the key columns",
                primary_key.join(", "),
                primary_key.len()
            );
        }
    }
    Ok(decoded)
}

pub struct Pipeline {
    query: Query,
    inputs: Vec<Input>,
    /// The input the next step polls (round-robin).
    next_input: usize,
    policy: ErrorPolicy,
    dead_letters: Box<dyn DeadLetterSink>,
    /// `None` while a checkpoint completes (it has the store) or without one.
    store: Option<CheckpointStore>,
    in_flight: Option<InFlight>,
    identity: serde_json::Value,
    fingerprint: String,
    /// Epoch of the last checkpoint (0: none yet).
    epoch: u64,
    /// Records consumed per partition since the start of the stream.
    consumed: BTreeMap<u32, u64>,
    emitted: u64,
    batch_size: usize,
    poll_timeout: Duration,
    idle_timeout: Option<Duration>,
    last_data: BTreeMap<u32, Instant>,
    last_push: BTreeMap<u32, Instant>,
    /// Idle decisions of a previous run to re-apply at the same positions.
    replay: VecDeque<IdleEvent>,
    restored_output: VecDeque<ChangeBatch>,
    finished: bool,
    stage: Stage,
    /// A first stage's routed records, not yet written.
    shuffled: ShuffleBuffer,
    /// A second stage: the next source offset expected per source
    /// partition id and join leaf ([`routed_lane`]).
    shuffle_next: BTreeMap<u64, u64>,
    /// A second stage: how it decodes the rows of the tables it does not
    /// read itself (a join's other tables).
    routed: Vec<RoutedTable>,
    /// A first stage's last progress record per source partition
    /// (watermark, ended): one is written again only when it changed.
    progress_sent: BTreeMap<u32, (i64, bool)>,
    /// The source positions of the last checkpoint taken (or resume).
    checkpointed_at: Option<serde_json::Value>,
    /// Where the query's state goes when it leaves memory (every query
    /// this pipeline makes shares the one store).
    state: StateOptions,
    pub stats: Stats,
}

/// The state store and memory budget of a pipeline: a durable store in
/// the checkpoint directory's `state/` (or `state_dir`) when there are
/// checkpoints (a consumer group's task replicates its runs to the state
/// topic), else a temporary one for spills only.
fn state_options(
    settings: &Settings,
    checkpoints: Option<&CheckpointStore>,
) -> Result<StateOptions> {
    let options = ubik_engine::ubik_state::StoreOptions {
        cache_bytes: settings
            .state_memory
            .map_or(64 << 20, |m| (m / 16).clamp(1 << 20, 64 << 20)) as usize,
        ..Default::default()
    };
    let store = match checkpoints {
        Some(c) => SharedStore::durable(
            ubik_engine::ubik_state::StateStore::open(c.state_dir(), options)
                .map_err(ubik_engine::EngineError::from)?,
        ),
        None => SharedStore::temporary(settings.state_dir.clone(), options),
    };
    Ok(StateOptions {
        store: Some(store),
        memory: Some(
            settings
                .state_memory
                .unwrap_or_else(crate::settings::default_state_memory) as usize,
        ),
    })
}

impl Pipeline {
    /// Plans the query over the opened sources and, when a checkpoint
    /// directory is given and holds a checkpoint, resumes from it. Opening
    /// is the front door's job ([`crate::connect`]).
    pub fn new(
        sql: &str,
        sources: Vec<OpenedSource>,
        settings: &Settings,
        checkpoint: Option<&Path>,
        dead_letters: Box<dyn DeadLetterSink>,
    ) -> Result<Self> {
        let store = match checkpoint {
            Some(dir) => Some(
                CheckpointStore::open(dir, settings.keep_checkpoints)?
                    .with_state_dir(settings.state_dir.clone()),
            ),
            None => None,
        };
        Self::with_store(
            sql,
            (sources, Vec::new()),
            settings,
            store,
            dead_letters,
            Stage::Whole,
        )
    }

    /// Like [`Self::new`], checkpointing to `store` (which may replicate),
    /// as `stage`; `unread` tables are planned but not read (a staged run).
    pub fn with_store(
        sql: &str,
        (sources, unread): (Vec<OpenedSource>, Vec<UnreadTable>),
        settings: &Settings,
        store: Option<CheckpointStore>,
        dead_letters: Box<dyn DeadLetterSink>,
        stage: Stage,
    ) -> Result<Self> {
        if sources.is_empty() {
            return Err(RuntimeError::Config("a pipeline needs a source".into()));
        }
        let options = settings.query.clone();
        let tables: Vec<(String, SchemaRef)> = sources
            .iter()
            .map(|s| (s.table.clone(), Arc::clone(&s.schema)))
            .chain(
                unread
                    .iter()
                    .map(|u| (u.table.clone(), Arc::clone(&u.schema))),
            )
            .collect();
        let plan = crate::connect::plan(sql, &tables, options.clone())?;
        // One source keeps the identity of the one-source pipelines before
        // it (their checkpoints and transactional ids stay valid).
        let identity = match tables.as_slice() {
            [(table, schema)] => json!({
                "sql": sql,
                "table": table,
                "schema": describe(schema),
                "options": options,
            }),
            several => json!({
                "sql": sql,
                "tables": several
                    .iter()
                    .map(|(t, s)| json!({"table": t, "schema": describe(s)}))
                    .collect::<Vec<_>>(),
                "options": options,
            }),
        };
        let fingerprint = fingerprint(&identity.to_string());
        if stage != Stage::Whole && sources.len() > 1 {
            return Err(RuntimeError::Config(
                "a query over several sources cannot be repartitioned yet".into(),
            ));
        }
        let state = state_options(settings, store.as_ref())?;
        let mut query = query_for(plan, &stage, &state)?;
        let mut inputs = Vec::with_capacity(sources.len());
        for opened in sources {
            let OpenedSource {
                table,
                source,
                schema,
                mut decoder,
                changes,
                epoch_unit,
            } = opened;
            let index = query.plan().source_index(&table).ok_or_else(|| {
                RuntimeError::Config(format!(
                    "source `{table}` is not read by the query; it reads {}",
                    query
                        .plan()
                        .sources
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            decoder.read_only(&query.plan().sources[index].reads)?;
            for p in source.partitions() {
                query.add_partition(partition_id(index, p));
            }
            inputs.push(Input {
                name: source.describe(),
                initial_position: source.position(),
                table,
                source,
                decoder,
                changes,
                key_decoder: None,
                epoch_unit,
                schema,
                index,
                ended: false,
            });
        }
        let mut routed = Vec::with_capacity(unread.len());
        for UnreadTable {
            table,
            schema,
            mut decoder,
            epoch_unit,
        } in unread
        {
            let index = query.plan().source_index(&table).ok_or_else(|| {
                RuntimeError::Config(format!("the query does not read `{table}`"))
            })?;
            decoder.read_only(&query.plan().sources[index].reads)?;
            routed.push(RoutedTable {
                index,
                schema,
                decoder,
                key_decoder: None,
                epoch_unit,
            });
        }
        if let Some(missing) = query.plan().sources.iter().enumerate().find(|(i, s)| {
            !inputs.iter().any(|input| input.table == s.name)
                && !routed.iter().any(|r| r.index == *i)
        }) {
            let missing = missing.1;
            return Err(RuntimeError::Config(format!(
                "the query reads `{}` but no source was given for it",
                missing.name
            )));
        }
        let mut pipeline = Self {
            query,
            inputs,
            next_input: 0,
            policy: settings.on_error,
            dead_letters,
            store: None,
            in_flight: None,
            identity,
            fingerprint,
            epoch: 0,
            consumed: BTreeMap::new(),
            emitted: 0,
            batch_size: settings.batch_size.max(1),
            poll_timeout: DEFAULT_POLL_TIMEOUT,
            idle_timeout: settings.idle_timeout,
            last_data: BTreeMap::new(),
            last_push: BTreeMap::new(),
            replay: VecDeque::new(),
            restored_output: VecDeque::new(),
            finished: false,
            stage,
            shuffled: ShuffleBuffer::default(),
            shuffle_next: BTreeMap::new(),
            routed,
            progress_sent: BTreeMap::new(),
            checkpointed_at: None,
            state,
            stats: Stats::default(),
        };
        if store.is_some() {
            pipeline.store = store;
            pipeline.resume(None)?;
        }
        Ok(pipeline)
    }

    /// Resumes from the latest checkpoint, or from `epoch` if given.
    pub fn resume(&mut self, epoch: Option<u64>) -> Result<bool> {
        self.settle_checkpoint()?;
        let Some(store) = self.store.as_ref() else {
            return Ok(false);
        };
        let loaded = match epoch {
            Some(e) => Some(store.load_epoch(e)?),
            None => store.load_latest()?,
        };
        let Some(loaded) = loaded else {
            return Ok(false);
        };
        let m = &loaded.manifest;
        if m.fingerprint != self.fingerprint {
            return Err(RuntimeError::Checkpoint(format!(
                "the checkpoint in {} was written by a different pipeline (query, schema or options changed).\n  checkpoint: {}\n  now:        {}\nuse a new checkpoint directory for a new pipeline",
                store.dir().display(),
                m.identity,
                self.identity
            )));
        }
        if let Some(input) = self.inputs.iter().find(|i| !i.source.replayable()) {
            return Err(RuntimeError::Config(format!(
                "{} cannot be replayed, so it cannot resume from the checkpoint in {}",
                input.name,
                store.dir().display()
            )));
        }
        let idle = store.read_idle(m.epoch + 1)?;
        let pinned = store.pinned_runs()?;
        let positions = m.source.clone();
        self.seek_all(&positions)?;
        self.finished = false;
        let snapshot = QuerySnapshot::decode(&loaded.engine_state)?;
        let plan = self.query.plan().clone();
        let mut query = query_for(plan, &self.stage, &self.state)?;
        query.restore(snapshot)?;
        // Runs written after that checkpoint (spills, compactions) are
        // garbage now, as are those of checkpoints no longer kept.
        query.retain_state(&pinned)?;
        self.shuffled.clear();
        self.progress_sent.clear();
        self.checkpointed_at = Some(positions);
        self.query = query;
        self.epoch = m.epoch;
        self.consumed = m.consumed.clone();
        self.shuffle_next = m.shuffle_next.clone();
        self.emitted = m.emitted;
        self.replay = idle.into();
        if let Some(p) = &loaded.pending {
            self.restored_output = decode_changes(&self.query.plan().output_schema, p)?.into();
        }
        info!(
            epoch = m.epoch,
            position = %m.source,
            idle_replays = self.replay.len(),
            "resumed from checkpoint"
        );
        Ok(true)
    }

    /// Goes back to the last checkpoint (or the start, if none was taken)
    /// after output since then was lost (an aborted transaction): the
    /// records after it are read again and re-emitted byte-identically.
    pub fn rewind(&mut self) -> Result<()> {
        if self.resume(None)? {
            return Ok(());
        }
        if let Some(input) = self.inputs.iter().find(|i| !i.source.replayable()) {
            return Err(RuntimeError::Config(format!(
                "output was lost and {} cannot be replayed",
                input.name
            )));
        }
        let mut query = query_for(self.query.plan().clone(), &self.stage, &self.state)?;
        self.shuffled.clear();
        self.progress_sent.clear();
        self.checkpointed_at = None;
        for input in &mut self.inputs {
            input.source.seek(&input.initial_position)?;
            input.ended = false;
            for p in input.source.partitions() {
                query.add_partition(input.id(p));
            }
        }
        self.query = query;
        self.consumed.clear();
        self.shuffle_next.clear();
        self.emitted = 0;
        self.finished = false;
        self.replay.clear();
        Ok(())
    }

    /// A clean shutdown begins: the source stops taking in records and hands
    /// out what it holds. True if there is something to drain.
    pub fn begin_drain(&mut self) -> bool {
        let mut any = false;
        for input in &mut self.inputs {
            any |= input.source.begin_drain();
        }
        any
    }

    /// The read position of every source: the source's own for one, an
    /// object by table for several.
    fn positions(&self) -> serde_json::Value {
        match self.inputs.as_slice() {
            [one] => one.source.position(),
            several => serde_json::Value::Object(
                several
                    .iter()
                    .map(|i| (i.table.clone(), i.source.position()))
                    .collect(),
            ),
        }
    }

    /// Moves every source to its position in `positions` (see [`Self::positions`]).
    fn seek_all(&mut self, positions: &serde_json::Value) -> Result<()> {
        if let [one] = self.inputs.as_mut_slice() {
            one.ended = false;
            return Ok(one.source.seek(positions)?);
        }
        for input in &mut self.inputs {
            let at = positions.get(&input.table).ok_or_else(|| {
                RuntimeError::Checkpoint(format!(
                    "the checkpoint has no position for source `{}`",
                    input.table
                ))
            })?;
            input.source.seek(at)?;
            input.ended = false;
        }
        Ok(())
    }

    /// Identity of this pipeline (query, schema, options): stable across
    /// restarts, so it names the Kafka transactional.id.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Fills the report-only parts of the stats: the sources' lag, each
    /// partition's watermark, each operator's state.
    pub fn refresh_stats(&mut self) {
        self.stats.lag = self.lag();
        let progress = self.query.progress();
        let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
        self.stats.partitions = progress
            .partitions
            .iter()
            .map(|(&id, p)| PartitionStatus {
                source: names.get(source_of(id)).unwrap_or(&"").to_string(),
                partition: id & ((1 << PARTITION_BITS) - 1),
                watermark: p.watermark(progress.lateness),
                rows: p.rows,
            })
            .collect();
        self.stats.operators = self
            .query
            .state_by_operator()
            .into_iter()
            .map(|(name, bytes, keys)| OperatorStatus {
                name,
                bytes: bytes as u64,
                keys: keys as u64,
            })
            .collect();
        self.stats.store_disk_bytes = self.query.store_disk_bytes();
    }

    /// Notes an error the pipeline recovers from (shown on status pages).
    pub fn note_error(&mut self, error: &str) {
        self.stats.last_error = Some((SystemTime::now(), error.to_string()));
    }

    /// Asks the source for its lag (records behind), for reporting.
    pub fn lag(&mut self) -> Option<u64> {
        self.inputs
            .iter_mut()
            .filter_map(|i| i.source.lag())
            .reduce(|a, b| a + b)
    }

    pub fn plan(&self) -> &QueryPlan {
        self.query.plan()
    }

    /// The schema of the first source.
    pub fn schema(&self) -> &SchemaRef {
        &self.inputs[0].schema
    }

    /// The sources, as messages name them.
    pub fn source_name(&self) -> String {
        self.inputs
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A second stage that finished at the end of its exchange reads on
    /// when records came after that end: a first stage reopened by another
    /// member (a rebalance) tells its progress again. Those are copies and
    /// change nothing, but the task's checkpoint then shows it caught up.
    /// True when it resumed.
    pub fn resume_if_behind(&mut self) -> bool {
        let resume = self.finished
            && matches!(self.stage, Stage::Shuffled { .. })
            && self.lag().is_some_and(|lag| lag > 0);
        if resume {
            self.finished = false;
        }
        resume
    }

    pub fn is_finished(&self) -> bool {
        self.finished && self.restored_output.is_empty()
    }

    pub fn has_checkpoints(&self) -> bool {
        self.store.is_some() || self.in_flight.is_some()
    }

    /// Records emitted so far (as counted by the caller via [`Self::note_emitted`]).
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    pub fn note_emitted(&mut self, records: u64) {
        self.emitted += records;
        self.stats.changes_out += records;
    }

    pub fn set_poll_timeout(&mut self, t: Duration) {
        self.poll_timeout = t;
    }

    /// Reads one chunk of input and processes it; changes go to `out.changes`.
    pub fn step(&mut self, out: &mut Output) -> Result<Step> {
        if self.in_flight.as_ref().is_some_and(InFlight::is_finished) {
            self.settle_checkpoint()?;
        }
        if let Some(b) = self.restored_output.pop_front() {
            out.changes.push(b);
            return Ok(Step::Data);
        }
        if self.finished {
            return Ok(Step::Finished);
        }
        let several = self.inputs.len() > 1;
        let i = self.pick_input();
        // With several sources, one idle source must not hold the others up.
        let timeout = if several {
            self.poll_timeout.min(Duration::from_millis(10))
        } else {
            self.poll_timeout
        };
        let event = self.inputs[i].source.poll(self.batch_size, timeout)?;
        let step = match event {
            SourceEvent::Chunk(chunk) => {
                self.on_chunk(i, chunk, out)?;
                Step::Data
            }
            SourceEvent::PartitionEnd(p) => {
                let id = self.inputs[i].id(p);
                self.replay_until(id, u64::MAX, out)?;
                self.query.end_partition(id, out)?;
                Step::Data
            }
            SourceEvent::End if !several => {
                self.query.finish(out)?;
                self.finished = true;
                Step::Finished
            }
            SourceEvent::End => {
                self.inputs[i].ended = true;
                let index = self.inputs[i].index;
                let ids: Vec<u32> = self
                    .query
                    .progress()
                    .partitions
                    .keys()
                    .copied()
                    .filter(|&id| source_of(id) == index)
                    .collect();
                for id in ids {
                    self.replay_until(id, u64::MAX, out)?;
                    self.query.end_partition(id, out)?;
                }
                if self.inputs.iter().all(|i| i.ended) {
                    self.query.finish(out)?;
                    self.finished = true;
                    Step::Finished
                } else {
                    Step::Data
                }
            }
            // Caught up after every first stage ended, past the last
            // transaction marker too (the position is the log's end, so
            // the last checkpoint shows no lag).
            SourceEvent::Idle
                if self.upstream_ended() && self.inputs[i].source.lag() == Some(0) =>
            {
                self.finished = true;
                Step::Finished
            }
            SourceEvent::Idle => {
                self.on_idle(out)?;
                Step::Idle
            }
        };
        self.dead_letter_rejects(out, None)?;
        self.stats.watermark = self.query.watermark();
        Ok(step)
    }

    /// The next input to poll: round-robin over those that have not ended.
    fn pick_input(&mut self) -> usize {
        let n = self.inputs.len();
        for k in 0..n {
            let i = (self.next_input + k) % n;
            if !self.inputs[i].ended {
                self.next_input = (i + 1) % n;
                return i;
            }
        }
        0
    }

    fn on_chunk(&mut self, input: usize, chunk: Chunk, out: &mut Output) -> Result<()> {
        let Some(changes) = &mut self.inputs[input].changes else {
            return self.on_records(input, chunk, out);
        };
        // Debezium's events become the table's rows and deletions;
        // the records that become none (bad, tombstones) count as read here.
        let events = chunk.payload.len();
        let unwrapped = changes.unwrap(chunk)?;
        self.stats.records_in += (events - unwrapped.row_count()) as u64;
        for b in &unwrapped.bad {
            self.bad_record(input, &unwrapped.rejected, b)?;
        }
        for run in unwrapped.rows {
            if let Some(units) = &run.epochs {
                self.inputs[input].decoder.set_epoch_units(units)?;
            }
            self.on_records(input, run.chunk, out)?;
        }
        Ok(())
    }

    /// A record that cannot be decoded: the run fails, or it is skipped or
    /// dead-lettered, as `--on-error` says.
    fn bad_record(&mut self, input: usize, chunk: &Chunk, bad: &BadRecord) -> Result<()> {
        self.stats.decode_errors += 1;
        let pos = chunk.positions.get(bad.index).copied();
        let source_name = &self.inputs[input].name;
        let place = match pos {
            Some(pos) => format!("{} {pos} of {source_name}", chunk.position_name),
            None => source_name.clone(),
        };
        match self.policy {
            ErrorPolicy::Fail => {
                return Err(RuntimeError::BadRecord(format!(
                    "bad record at {place}: {}\nuse --on-error skip to skip bad records or --on-error dlq to dead-letter them",
                    bad.message()
                )));
            }
            ErrorPolicy::Skip => {
                warn!("skipping bad record at {place}: {}", bad.message());
            }
            ErrorPolicy::DeadLetter => {
                self.stats.dead_lettered("decode", &bad.message());
                self.dead_letters.write(&DeadLetter {
                    reason: "decode",
                    message: &bad.message(),
                    source: &self.inputs[input].name,
                    partition: chunk.partition,
                    position: pos.map(|x| (x, chunk.position_name)),
                    record: chunk.payload.record(bad.index),
                })?;
            }
        }
        Ok(())
    }

    /// Decodes and feeds records of one partition: values, and deletions
    /// (whose bytes are keys) where the chunk marks them.
    fn on_records(&mut self, input: usize, chunk: Chunk, out: &mut Output) -> Result<()> {
        if let Stage::Shuffled { .. } = self.stage {
            return self.on_shuffled(input, chunk, out);
        }
        let p = self.inputs[input].id(chunk.partition);
        let n = chunk.payload.len() as u64;
        self.stats.records_in += n;
        self.last_data.insert(p, Instant::now());
        let deleted = match chunk.meta.deletions.is_empty() {
            true => Vec::new(),
            false => chunk.meta.deletion_mask(chunk.payload.len()),
        };
        let (batch, record_of): (RecordBatch, Vec<u32>) = match &chunk.payload {
            Payload::Bytes { data, .. } => {
                self.stats.bytes_in += data.len() as u64;
                let records = chunk.payload.records();
                let decoded = match deleted.is_empty() {
                    true => self.inputs[input].decoder.decode(&records)?,
                    false => self.inputs[input].decode_mixed(&records, &deleted)?,
                };
                for bad in &decoded.bad {
                    self.bad_record(input, &chunk, bad)?;
                }
                let record_of = if decoded.records.is_empty() {
                    (0..decoded.batch.num_rows() as u32).collect()
                } else {
                    decoded.records
                };
                (decoded.batch, record_of)
            }
            Payload::Arrow(b) => {
                let b = conform(b, &self.inputs[input].schema)?;
                (b.clone(), (0..b.num_rows() as u32).collect())
            }
        };
        // Each row's deletion mark (none when the chunk has no deletions).
        let deleted: Vec<bool> = match deleted.is_empty() {
            true => Vec::new(),
            false => record_of.iter().map(|&r| deleted[r as usize]).collect(),
        };
        let batch =
            record_meta::fill_record_times(batch, &record_of, &chunk.meta.timestamps, &deleted)?;
        // Feed the batch, splitting it where a previous run pushed an idle watermark.
        let base = self.consumed.get(&p).copied().unwrap_or(0);
        let mut row = 0usize;
        while let Some(ev) = self
            .replay
            .front()
            .filter(|e| e.partition == p && e.position < base + n)
            .cloned()
        {
            let k = ev.position.saturating_sub(base);
            let upto = record_of.partition_point(|&r| (r as u64) < k);
            self.feed(
                p,
                (&batch, &deleted),
                (row, upto),
                (&chunk, input),
                &record_of,
                out,
            )?;
            self.query.push_watermark(p, ev.watermark, out)?;
            self.replay.pop_front();
            row = upto;
        }
        self.feed(
            p,
            (&batch, &deleted),
            (row, batch.num_rows()),
            (&chunk, input),
            &record_of,
            out,
        )?;
        self.consumed.insert(p, base + n);
        Ok(())
    }

    /// Feeds rows `from..to` of a decoded chunk (with each row's deletion
    /// mark, none when it holds no deletions; `chunk` = the chunk and its
    /// input) to the query.
    fn feed(
        &mut self,
        p: u32,
        (batch, deleted): (&RecordBatch, &[bool]),
        (from, to): (usize, usize),
        chunk: (&Chunk, usize),
        record_of: &[u32],
        out: &mut Output,
    ) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        let slice = if from == 0 && to == batch.num_rows() {
            batch.clone()
        } else {
            batch.slice(from, to - from)
        };
        let before = out.rejects.len();
        match deleted.get(from..to) {
            Some(deleted) => self.query.process_changes(p, &slice, deleted, out)?,
            None => self.query.process(p, &slice, out)?,
        }
        for s in out.shuffled.drain(..) {
            for (j, &row) in s.rows.iter().enumerate() {
                let index = record_of.get(from + row as usize).map(|&i| i as usize);
                let found = index
                    .and_then(|i| Some((chunk.0.payload.record(i)?, chunk.0.positions.get(i)?)));
                let Some((record, &offset)) = found else {
                    return Err(RuntimeError::Config(
                        "a first stage reads encoded records (Kafka), not Arrow".into(),
                    ));
                };
                self.shuffled.push_row(
                    s.targets[j],
                    s.partition,
                    (offset, s.times[j], s.stamps[j]),
                    (s.leaf, s.deletion),
                    record,
                );
            }
        }
        if out.rejects.len() > before {
            self.dead_letter_rejects(out, Some((chunk.0, chunk.1, record_of, from)))?;
        }
        Ok(())
    }

    /// Sends engine rejects to the dead-letter output with their original bytes.
    fn dead_letter_rejects(
        &mut self,
        out: &mut Output,
        chunk: Option<(&Chunk, usize, &[u32], usize)>,
    ) -> Result<()> {
        for r in out.rejects.drain(..) {
            if r.reason.code() == "late" {
                self.stats.late_rows += 1;
            }
            let message = r.reason.to_string();
            self.stats.dead_lettered(r.reason.code(), &message);
            let input = &self.inputs
                [chunk.map_or(source_of(r.partition).min(self.inputs.len() - 1), |c| c.1)];
            let rendered;
            let (position, record) = match chunk {
                Some((c, _, record_of, offset)) => {
                    let idx = record_of.get(r.row + offset).map(|&i| i as usize);
                    let record = match (&c.payload, idx) {
                        // Rows that arrived as Arrow (a webhook buffer, a host's
                        // batches) have no bytes of their own: the dead letter
                        // carries the row as JSON.
                        (Payload::Arrow(b), Some(i)) => {
                            rendered = row_json(b, i);
                            rendered.as_deref()
                        }
                        (_, i) => i.and_then(|i| c.payload.record(i)),
                    };
                    (
                        idx.and_then(|i| c.positions.get(i).map(|&x| (x, c.position_name))),
                        record,
                    )
                }
                None => (None, None),
            };
            self.dead_letters.write(&DeadLetter {
                reason: r.reason.code(),
                message: &message,
                source: &input.name,
                partition: r.partition & ((1 << PARTITION_BITS) - 1),
                position,
                record,
            })?;
        }
        Ok(())
    }

    /// Re-applies logged idle decisions of `p` up to `position`.
    fn replay_until(&mut self, p: u32, position: u64, out: &mut Output) -> Result<()> {
        while let Some(ev) = self
            .replay
            .front()
            .filter(|e| e.partition == p && e.position <= position)
            .cloned()
        {
            self.query.push_watermark(p, ev.watermark, out)?;
            self.replay.pop_front();
        }
        Ok(())
    }

    /// Idle close: a partition without data for `idle_timeout` has its
    /// watermark advanced with the wall clock, and at least up to the
    /// furthest data of any partition of another source, so the last
    /// windows of a quiet stream still close and a quiet source does not
    /// hold a join back. The decision is logged first, so a replay makes it
    /// at the same input position.
    fn on_idle(&mut self, out: &mut Output) -> Result<()> {
        // A second stage's watermarks come from its first stages.
        if let Stage::Shuffled { .. } = self.stage {
            return Ok(());
        }
        let Some(timeout) = self.idle_timeout else {
            return Ok(());
        };
        // Logged decisions of a previous run come first; apply those at the
        // current positions, never new ones before them.
        if let Some(ev) = self.replay.front().cloned() {
            if self.consumed.get(&ev.partition).copied().unwrap_or(0) >= ev.position {
                self.replay_until(ev.partition, ev.position, out)?;
            }
            return Ok(());
        }
        let now = Instant::now();
        let progress = self.query.progress().clone();
        if !self.query.plan().uses_watermark() {
            return Ok(());
        }
        let event_time = match &self.query.plan().kind {
            _ if self.query.plan().join.is_some() => true,
            kind => matches!(kind.stage_input(), Some((_, EventTime::Column(_)))),
        };
        let lateness = progress.lateness;
        let grid = self.query.plan().options.emit_every_rows.max(1);
        // How far the data of a partition has got: an idle partition catches
        // up with the furthest partition of another source, so a quiet
        // source (the table side of a join) does not hold the others back.
        let data_watermark = |pp: &ubik_engine::progress::PartitionProgress| {
            (pp.max_time != MIN_TIME).then(|| pp.max_time.saturating_sub(lateness))
        };
        for (&p, pp) in &progress.partitions {
            if pp.ended {
                continue;
            }
            let since = *self.last_data.entry(p).or_insert(self.stats.started);
            let idle_for = now.duration_since(since);
            if idle_for < timeout {
                continue;
            }
            if self
                .last_push
                .get(&p)
                .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1))
            {
                continue;
            }
            // Partitions of the same source that have not ended, as before;
            // partitions of other sources, ended or not.
            let others_max = progress
                .partitions
                .iter()
                .filter(|(q, other)| **q != p && (!other.ended || source_of(**q) != source_of(p)))
                .filter_map(|(_, other)| data_watermark(other))
                .max();
            let other_sources_max = progress
                .partitions
                .iter()
                .filter(|(q, _)| source_of(**q) != source_of(p))
                .filter_map(|(_, other)| data_watermark(other))
                .max();
            let target = if !event_time {
                next_tick(pp.max_time, grid)
            } else if pp.max_time == MIN_TIME {
                match others_max {
                    Some(w) => w,
                    None => continue,
                }
            } else {
                let own = pp
                    .max_time
                    .saturating_sub(lateness)
                    .saturating_add(idle_for.as_micros() as i64);
                own.max(other_sources_max.unwrap_or(MIN_TIME))
            };
            if target <= pp.watermark(lateness) {
                continue;
            }
            let position = self.consumed.get(&p).copied().unwrap_or(0);
            self.settle_checkpoint()?;
            if let Some(store) = &mut self.store {
                store.append_idle(&IdleEvent {
                    epoch: self.epoch + 1,
                    partition: p,
                    position,
                    watermark: target,
                })?;
            }
            debug!(
                partition = p,
                watermark = target,
                "idle partition: watermark advanced"
            );
            self.query.push_watermark(p, target, out)?;
            self.last_push.insert(p, now);
        }
        Ok(())
    }

    /// Takes a checkpoint of the state as of now. `pending` is output the
    /// host received but has not committed yet (it is handed out again on
    /// resume); pass `&[]` when everything emitted is already committed.
    ///
    /// Returns once the state is frozen; the checkpoint becomes current in
    /// the background ([`crate::completion`]), after the previous one did.
    /// [`Self::settle_checkpoint`] waits for it.
    pub fn checkpoint(&mut self, pending: &[ChangeBatch]) -> Result<()> {
        // Dead letters are made durable at every epoch, checkpoints or not.
        self.dead_letters.commit()?;
        // One completes at a time: the wait for the previous one holds the pipeline too.
        let waiting = Instant::now();
        self.settle_checkpoint()?;
        let waited = waiting.elapsed();
        let Some(store) = self.store.take() else {
            return Ok(());
        };
        let started = Instant::now();
        let frozen = match self.freeze(pending) {
            Ok(f) => f,
            Err(e) => {
                self.store = Some(store);
                return Err(e);
            }
        };
        let (epoch, position) = (frozen.manifest.epoch, frozen.manifest.source.clone());
        self.in_flight = Some(InFlight::start(store, frozen, started, waited));
        self.epoch = epoch;
        self.checkpointed_at = Some(position);
        Ok(())
    }

    /// The state as of now, for a checkpoint to complete.
    fn freeze(&mut self, pending: &[ChangeBatch]) -> Result<Frozen> {
        let (snapshot, durability) = self.query.snapshot_deferred()?;
        let state_runs: Vec<String> = snapshot
            .store
            .as_ref()
            .map(|m| m.runs().map(String::from).collect())
            .unwrap_or_default();
        let state_disk = self
            .query
            .store()
            .and_then(|s| s.if_open(|s| s.disk_bytes()))
            .unwrap_or(0);
        let mut pending: Vec<ChangeBatch> = pending.to_vec();
        pending.extend(self.restored_output.iter().cloned());
        let manifest = Manifest {
            format: CHECKPOINT_FORMAT,
            fingerprint: self.fingerprint.clone(),
            identity: self.identity.clone(),
            epoch: self.epoch + 1,
            source: self.positions(),
            consumed: self.consumed.clone(),
            shuffle_next: self.shuffle_next.clone(),
            emitted: self.emitted,
            created_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            // Known once written.
            state_bytes: 0,
            bytes_written: 0,
            state_keys: self.query.state_keys() as u64,
            watermark: self.query.watermark(),
            state_runs,
        };
        Ok(Frozen {
            snapshot,
            durability,
            manifest,
            pending,
            output_schema: Arc::clone(&self.query.plan().output_schema),
            state: self.query.store().cloned(),
            state_disk,
        })
    }

    /// Waits for the checkpoint being completed, if any, then commits the
    /// sources to its positions: what it covers is durable from then on.
    pub fn settle_checkpoint(&mut self) -> Result<()> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(());
        };
        let (started, pause_ms, freeze_ms) = (flight.started, flight.pause_ms, flight.freeze_ms);
        let position = flight.position.clone();
        let (store, result) = flight.join();
        self.store = Some(store);
        let done = result?;
        match self.inputs.as_mut_slice() {
            [one] => one.source.commit(&position)?,
            several => {
                for input in several {
                    if let Some(at) = position.get(&input.table) {
                        input.source.commit(at)?;
                    }
                }
            }
        }
        let m = &done.manifest;
        self.stats.checkpoints += 1;
        self.stats.last_checkpoint_at = Some(SystemTime::now());
        self.stats.last_checkpoint_ms = (done.at - started).as_secs_f64() * 1000.0;
        self.stats.last_checkpoint_pause_ms = pause_ms;
        self.stats.state_bytes = m.state_bytes;
        self.stats.state_keys = m.state_keys;
        self.stats.last_checkpoint_bytes = m.bytes_written;
        debug!(
            epoch = m.epoch,
            bytes = done.state_bytes,
            written = m.bytes_written,
            ms = self.stats.last_checkpoint_ms,
            pause_ms,
            freeze_ms,
            "checkpoint written"
        );
        Ok(())
    }

    /// A second stage whose first stages all ended (a bounded input): its
    /// every window is closed and emitted, and nothing more will come.
    fn upstream_ended(&self) -> bool {
        let Stage::Shuffled { .. } = self.stage else {
            return false;
        };
        let partitions = &self.query.progress().partitions;
        !partitions.is_empty() && partitions.values().all(|p| p.ended)
    }

    /// A first stage's source partitions whose progress (watermark, ended)
    /// changed since their last progress record.
    fn unsent_progress(&self) -> Vec<(u32, (i64, bool))> {
        let lateness = self.query.progress().lateness;
        self.query
            .progress()
            .partitions
            .iter()
            .map(|(&id, p)| (id, (p.watermark(lateness), p.ended)))
            .filter(|(upstream, now)| self.progress_sent.get(upstream) != Some(now))
            .collect()
    }

    /// True when nothing happened since the last checkpoint that one would
    /// record: the sources have not moved and a first stage has no new
    /// progress to tell. A commit then can be skipped (an idle task would
    /// otherwise write, and replicate, the same checkpoint at every interval).
    pub fn quiet_since_checkpoint(&self) -> bool {
        let progress_told = match &self.stage {
            Stage::Shuffle { .. } => self.unsent_progress().is_empty(),
            _ => true,
        };
        progress_told && self.checkpointed_at.as_ref() == Some(&self.positions())
    }

    /// Whether this is a first stage, routing rows by key into an exchange
    /// ([`Self::write_shuffled`]).
    pub fn routes_by_key(&self) -> bool {
        matches!(self.stage, Stage::Shuffle { .. })
    }

    /// Hands a first stage's routed records to `write` (target partition,
    /// bytes), then, with `progress`, a progress record of each of its
    /// source partitions to every target (at a commit). Stops at the first
    /// write error and returns it.
    pub fn write_shuffled(
        &mut self,
        progress: bool,
        write: &mut ShuffleWrite<'_>,
    ) -> std::result::Result<(), ConnectorError> {
        let Stage::Shuffle { partitions } = self.stage else {
            return Ok(());
        };
        if progress {
            for (upstream, (watermark, ended)) in self.unsent_progress() {
                for target in 0..partitions {
                    self.shuffled
                        .push_progress(target, upstream, watermark, ended);
                }
                self.progress_sent.insert(upstream, (watermark, ended));
            }
        }
        let mut result = Ok(());
        for (target, bytes) in self.shuffled.records() {
            if let Err(e) = write(target, bytes) {
                result = Err(e);
                break;
            }
        }
        self.shuffled.clear();
        result
    }

    /// A second stage's records: rows of each source partition, fed with
    /// the event times and stamps their first stage gave them (in runs of
    /// one source partition, join leaf and kind), and that stage's
    /// progress records.
    fn on_shuffled(&mut self, input: usize, chunk: Chunk, out: &mut Output) -> Result<()> {
        let n = chunk.payload.len();
        self.stats.records_in += n as u64;
        let mut run = RoutedRun::default();
        for i in 0..=n {
            let parsed = match chunk.payload.record(i) {
                Some(bytes) if i < n => {
                    self.stats.bytes_in += bytes.len() as u64;
                    let at = || {
                        format!(
                            "{} {} of {}",
                            chunk.position_name,
                            chunk.positions.get(i).copied().unwrap_or_default(),
                            self.inputs[input].name
                        )
                    };
                    Some(crate::shuffle::parse(bytes, &at)?)
                }
                _ => None,
            };
            let continues = matches!(parsed, Some(ShuffleRecord::Row { upstream, leaf, deletion, .. }) if Some((upstream, leaf, deletion)) == run.of);
            if !continues && run.of.is_some() {
                self.feed_routed(input, &mut run, out)?;
            }
            match parsed {
                Some(ShuffleRecord::Row {
                    upstream,
                    offset,
                    time,
                    stamp,
                    leaf,
                    deletion,
                    record,
                }) => {
                    let next = self
                        .shuffle_next
                        .entry(routed_lane(upstream, leaf))
                        .or_insert(0);
                    if offset < *next {
                        // A resumed first stage's copy of a row taken in before.
                        continue;
                    }
                    *next = offset + 1;
                    run.of = Some((upstream, leaf, deletion));
                    run.records.push(record);
                    run.offsets.push(offset);
                    run.times.push(time);
                    run.stamps.push(stamp);
                }
                Some(ShuffleRecord::Progress {
                    upstream,
                    watermark,
                    ended,
                }) => {
                    if ended {
                        self.query.end_partition(upstream, out)?;
                    } else {
                        self.query.push_watermark(upstream, watermark, out)?;
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Decodes and feeds a run of routed rows, and empties it.
    fn feed_routed(
        &mut self,
        input: usize,
        run: &mut RoutedRun<'_>,
        out: &mut Output,
    ) -> Result<()> {
        let Some((upstream, leaf, deletion)) = run.of.take() else {
            return Ok(());
        };
        let source = source_of(upstream);
        let decoded = if source == self.inputs[input].index {
            let i = &mut self.inputs[input];
            match deletion {
                true => decode_keys(&i.schema, &mut i.key_decoder, i.epoch_unit, &run.records)?,
                false => i.decoder.decode(&run.records)?,
            }
        } else {
            let t = self
                .routed
                .iter_mut()
                .find(|t| t.index == source)
                .ok_or_else(|| {
                    RuntimeError::BadRecord(format!(
                        "a repartitioned record names source {source}, which this query does not read"
                    ))
                })?;
            match deletion {
                true => decode_keys(&t.schema, &mut t.key_decoder, t.epoch_unit, &run.records)?,
                false => t.decoder.decode(&run.records)?,
            }
        };
        let partition = upstream & ((1 << PARTITION_BITS) - 1);
        if let Some(bad) = decoded.bad.first() {
            return Err(RuntimeError::BadRecord(format!(
                "a repartitioned record of partition {partition} does not decode ({}): the first stage decoded it with another schema",
                bad.message()
            )));
        }
        let before = out.rejects.len();
        self.query.process_given(
            upstream,
            (leaf, deletion),
            &decoded.batch,
            std::mem::take(&mut run.times),
            std::mem::take(&mut run.stamps),
            out,
        )?;
        if out.rejects.len() > before {
            let rejects: Vec<_> = out.rejects.drain(before..).collect();
            self.dead_letter_shuffled(input, partition, (&run.records, &run.offsets), rejects)?;
        }
        run.records.clear();
        run.offsets.clear();
        Ok(())
    }

    /// Rows of input partition `upstream` a second stage rejected (late, by
    /// their stamps), to the dead letters with their original bytes and
    /// input offsets, as the one process reading the input would send them.
    fn dead_letter_shuffled(
        &mut self,
        input: usize,
        upstream: u32,
        (records, offsets): (&[&[u8]], &[u64]),
        rejects: Vec<ubik_engine::Reject>,
    ) -> Result<()> {
        let source = format!(
            "{} (rows of input partition {upstream})",
            self.inputs[input].name
        );
        for r in rejects {
            if r.reason.code() == "late" {
                self.stats.late_rows += 1;
            }
            let message = r.reason.to_string();
            self.stats.dead_lettered(r.reason.code(), &message);
            self.dead_letters.write(&DeadLetter {
                reason: r.reason.code(),
                message: &message,
                source: &source,
                partition: upstream,
                position: offsets.get(r.row).map(|&o| (o, "offset")),
                record: records.get(r.row).copied(),
            })?;
        }
        Ok(())
    }

    /// Output restored from a checkpoint and not yet handed out again.
    pub fn take_restored(&mut self) -> Vec<ChangeBatch> {
        self.restored_output.drain(..).collect()
    }
}

/// Routed rows of one source partition, join leaf and kind, gathered to be
/// decoded and fed at once.
#[derive(Default)]
struct RoutedRun<'a> {
    /// (upstream, leaf, deletion) of the rows gathered.
    of: Option<(u32, u8, bool)>,
    records: Vec<&'a [u8]>,
    offsets: Vec<u64>,
    times: Vec<i64>,
    stamps: Vec<i64>,
}

/// The key of a second stage's next expected offset: rows of one source
/// partition id (the low 32 bits, as before joins were routed) fed to one
/// join leaf, whose offsets rise.
fn routed_lane(upstream: u32, leaf: u8) -> u64 {
    upstream as u64 | (leaf as u64) << 32
}

/// Row `i` of `batch` as one JSON object (a dead letter's record).
fn row_json(batch: &RecordBatch, i: usize) -> Option<Vec<u8>> {
    if i >= batch.num_rows() {
        return None;
    }
    let mut w = arrow::json::LineDelimitedWriter::new(Vec::new());
    w.write(&batch.slice(i, 1)).ok()?;
    w.finish().ok()?;
    let mut out = w.into_inner();
    while out.last() == Some(&b'\n') {
        out.pop();
    }
    Some(out)
}

/// Casts an in-process Arrow batch to the declared source schema.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch.clone());
    }
    let mut cols = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let c = batch.column_by_name(f.name()).ok_or_else(|| {
            RuntimeError::Config(format!("input batch has no column '{}'", f.name()))
        })?;
        cols.push(if c.data_type() == f.data_type() {
            Arc::clone(c)
        } else {
            arrow::compute::cast(c, f.data_type())?
        });
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
}

impl Drop for Pipeline {
    /// A checkpoint being completed finishes (or fails) before the
    /// pipeline goes: its thread never outlives it.
    fn drop(&mut self) {
        if let Err(e) = self.settle_checkpoint() {
            warn!("the last checkpoint did not complete: {e}");
        }
    }
}
