//! Running as one member of a consumer group: processes started with the
//! same pipeline and `--group` share the input topic's partitions as tasks
//! (the Kafka Streams model, with Kafka as the only coordinator).
//!
//! Every task has its own state, watermark, checkpoint (a local directory
//! under `CHECKPOINT`, replicated to the group's compacted state topic) and
//! transactional producer (its id names the task, so a new owner fences the
//! old one). Membership follows the consumer-group protocol with cooperative
//! rebalancing: a task that is revoked commits and checkpoints before it
//! goes, inside the rebalance (so its next owner starts where it stopped);
//! a task that arrives restores the newest checkpoint, local or
//! replicated, and replays from its position. A killed process's tasks move
//! after the session timeout and replay what it emitted after their last
//! replicated checkpoint, byte-identically.
//!
//! All rows of a result key must meet in one task. An input declared
//! partitioned by result key columns (`partitioned_by`) gives one task per
//! partition running the whole query. Any other input runs in two stages:
//! a first stage per input partition stamps and routes rows by key through
//! the repartition topic ([`crate::shuffle`]), and a keyed task per
//! repartition partition runs the query with the stamps given, so lateness
//! is judged as one process would judge it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use ubik_connector::{ConnectorError, Sink};
use ubik_kafka::{Assignment, GroupMember, KafkaUrl};

use crate::connect::{GroupLayout, Opened, TaskKind, open_task, repartition_topic};
use crate::error::{Result, RuntimeError};
use crate::pipeline::{OperatorStatus, PartitionStatus, Pipeline, StageStatus, Stats};
use crate::runner::{Cadence, RunEnd, RunOptions, Runner};
use crate::spec::{Endpoint, PipelineSpec, SinkSpec};

/// Poll wait of a task's source: none, as several tasks share the thread
/// (one waiting would hold up the others); a round in which no task had
/// anything waits in the member's poll instead ([`IDLE_ROUND`]).
const TASK_POLL: Duration = Duration::ZERO;

/// How long the loop waits after a round in which no task read a record.
const IDLE_ROUND: Duration = Duration::from_millis(10);

/// How often a task whose opening met a transient error (a broker moving
/// a partition's leader, a restore's read timing out) is tried again, the
/// first time after [`OPEN_RETRY_FIRST`], then twice as long each time
/// (about a minute in all), before the member gives up with the error.
const OPEN_ATTEMPTS: u32 = 7;
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(500);

/// How many assigned tasks open side by side in one round of the loop:
/// opening in batches of 8 took 5 s for 32 tasks, all at once 1.75 s.
const OPEN_AT_ONCE: usize = 32;

struct Task {
    pipeline: Pipeline,
    sink: Box<dyn Sink>,
    runner: Runner,
    finished: bool,
}

impl Task {
    fn open(spec: &PipelineSpec, kind: TaskKind, layout: &GroupLayout) -> Result<Self> {
        let started = Instant::now();
        let Opened {
            mut pipeline,
            sink,
            encoder,
        } = open_task(spec, kind, layout)?;
        pipeline.set_poll_timeout(TASK_POLL);
        info!(
            task = %kind,
            epoch = pipeline.epoch(),
            ms = started.elapsed().as_millis() as u64,
            "task started"
        );
        Ok(Self {
            runner: Runner::new(&pipeline, encoder).defer_commits(),
            pipeline,
            sink,
            finished: false,
        })
    }
}

/// This member's open tasks, shared by the run loop and the revoke
/// handler (which runs inside the member's poll, never concurrently).
#[derive(Default)]
struct Tasks {
    open: BTreeMap<TaskKind, Task>,
    /// Counters of tasks handed over, so the totals do not go back.
    handed_over: Stats,
}

impl Tasks {
    /// Commits and checkpoints task `kind`, if open here, and closes it.
    fn hand_over(&mut self, kind: TaskKind) {
        let Some(mut t) = self.open.remove(&kind) else {
            return;
        };
        match t.runner.hand_over(&mut t.pipeline, t.sink.as_mut()) {
            Ok(()) => add(&mut self.handed_over, kind, &t.pipeline.stats),
            Err(e) => warn!(task = %kind, "handing over: {e}"),
        }
        let _ = t.sink.close();
    }
}

fn lock(tasks: &Mutex<Tasks>) -> MutexGuard<'_, Tasks> {
    // A panic while holding it ends the run anyway: the state is still
    // the tasks', so take it.
    tasks.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a group splits the query into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The input is partitioned by the result key: one task per partition.
    Partitioned,
    /// A first stage per input partition routes rows by key through the
    /// repartition topic; a keyed task per repartition partition aggregates.
    Repartitioned,
}

/// Checks what a group can run before anything opens: its name, instance
/// id and input topics.
fn check(spec: &PipelineSpec) -> Result<(String, Option<String>, Vec<KafkaUrl>)> {
    let group = spec
        .group
        .clone()
        .ok_or_else(|| RuntimeError::Config("no consumer group given".into()))?;
    if spec.checkpoint.is_none() {
        return Err(RuntimeError::Config(
            "a consumer group member needs --checkpoint DIR (each task checkpoints there and to the group's state topic, which a process taking a task over restores from)".into(),
        ));
    }
    if !matches!(spec.sink, SinkSpec::Kafka(_)) {
        return Err(RuntimeError::Config(
            "a consumer group's output must be a kafka:// topic (--to): the tasks of several processes write it".into(),
        ));
    }
    let urls = spec
        .sources
        .iter()
        .map(|s| match &s.endpoint {
            Endpoint::Kafka(url) => Ok(KafkaUrl::parse(url).map_err(ConnectorError::from)?),
            _ => Err(RuntimeError::Config(
                "a consumer group shares Kafka topics' partitions: every --from must be kafka://"
                    .into(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(u) = urls.iter().find(|u| u.bootstrap != urls[0].bootstrap) {
        return Err(RuntimeError::Config(format!(
            "a consumer group reads one Kafka cluster: {} and {} name different brokers",
            urls[0].display(),
            u.display()
        )));
    }
    if urls.is_empty() {
        return Err(RuntimeError::Config("no source given".into()));
    }
    Ok((group.name, group.instance_id, urls))
}

/// How the group runs `plan` given the declared input partitioning: a
/// stateful query needs all rows of a result key in one task, so without a
/// declaration its rows are repartitioned by key; a declaration must name
/// result key columns.
fn mode(plan: &ubik_engine::QueryPlan, partitioned_by: &[String]) -> Result<Mode> {
    let stateful = plan.is_keyed() || plan.join.is_some();
    if !stateful {
        return Ok(Mode::Partitioned);
    }
    if partitioned_by.is_empty() {
        return Ok(Mode::Repartitioned);
    }
    check_partitioning(plan, partitioned_by)?;
    Ok(Mode::Partitioned)
}

/// A declared partitioning must be by result key columns: only then does
/// one task see every row of a key.
fn check_partitioning(plan: &ubik_engine::QueryPlan, partitioned_by: &[String]) -> Result<()> {
    if plan.is_keyed() {
        let keys = plan.key_names();
        if let Some(c) = partitioned_by.iter().find(|c| !keys.contains(&c.as_str())) {
            return Err(RuntimeError::Config(format!(
                "--partitioned-by {c}: `{c}` is not a column of the result key ({}), so rows of one key can be in several partitions and no task would see them all; leave --partitioned-by out to repartition by key",
                keys.join(", ")
            )));
        }
    }
    Ok(())
}

/// How a consumer group (`--group NAME`, input not declared partitioned by
/// key) runs `plan`, for `ubik validate`: its stages, what each routes by,
/// and the internal topics.
pub fn describe_stages(plan: &ubik_engine::QueryPlan) -> String {
    if !(plan.is_keyed() || plan.join.is_some()) {
        return "in a consumer group: one stage; each task runs the whole query over its input partitions".into();
    }
    match ubik_engine::shuffle::Shuffler::new(plan, 2) {
        Err(e) => format!("in a consumer group: {e}"),
        Ok(shuffler) => {
            let routed = match ubik_engine::shuffle::describe(plan) {
                Some(key) => format!("routes them by {}", key.join(", ")),
                None if shuffler.single() => {
                    "routes them all to one task (its rows must all meet: it regroups, ranks or joins across keys)".into()
                }
                None => "routes them by key".into(),
            };
            format!(
                "in a consumer group: stage 1 (a task per input partition) stamps rows and {routed} through topic NAME-ubik-repartition; stage 2 (a task per repartition partition) runs the {}; checkpoints replicate to NAME-ubik-checkpoints",
                plan.kind_name()
            )
        }
    }
}

/// Adds task `kind`'s counters to `total`. A keyed task's input is the
/// repartition topic, whose rows its first stage already counted (and
/// whose lag is not the input's).
fn add(total: &mut Stats, kind: TaskKind, s: &Stats) {
    if let Some(stage) = total.stages.get_mut(stage_of(kind)) {
        stage.records_in += s.records_in;
        stage.cpu_seconds += s.cpu_seconds;
    }
    total.cpu_seconds += s.cpu_seconds;
    let reads_input = !matches!(kind, TaskKind::Keyed(_));
    if reads_input {
        total.records_in += s.records_in;
        total.bytes_in += s.bytes_in;
        total.lag = match (total.lag, s.lag) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
    total.decode_errors += s.decode_errors;
    total.dead_letters += s.dead_letters;
    total.late_rows += s.late_rows;
    total.changes_out += s.changes_out;
    total.checkpoints += s.checkpoints;
    total.last_checkpoint_ms = total.last_checkpoint_ms.max(s.last_checkpoint_ms);
    total.last_checkpoint_pause_ms = total
        .last_checkpoint_pause_ms
        .max(s.last_checkpoint_pause_ms);
    total.state_bytes += s.state_bytes;
    total.state_keys += s.state_keys;
    total.commit_latency_last_ms = total.commit_latency_last_ms.max(s.commit_latency_last_ms);
    total.commit_latency_max_ms = total.commit_latency_max_ms.max(s.commit_latency_max_ms);
    // What a status page shows per task: its stage and partition name it.
    let task = match kind {
        TaskKind::Whole(p) => format!("task {p}"),
        TaskKind::Shuffle(0, p) => format!("first stage {p}"),
        TaskKind::Shuffle(source, p) => format!("first stage {source}-{p}"),
        TaskKind::Keyed(p) => format!("keyed stage {p}"),
    };
    total
        .partitions
        .extend(s.partitions.iter().map(|p| PartitionStatus {
            source: format!("{task}: {}", p.source),
            ..p.clone()
        }));
    total
        .operators
        .extend(s.operators.iter().map(|o| OperatorStatus {
            name: format!("{task}: {}", o.name),
            ..o.clone()
        }));
    total.store_disk_bytes += s.store_disk_bytes;
    for (reason, n) in &s.dead_letter_reasons {
        *total.dead_letter_reasons.entry(reason).or_default() += n;
    }
    if s.last_dead_letter.is_some() {
        total.last_dead_letter.clone_from(&s.last_dead_letter);
    }
    total.last_checkpoint_at = total.last_checkpoint_at.max(s.last_checkpoint_at);
    if s.last_error.as_ref().map(|e| e.0) > total.last_error.as_ref().map(|e| e.0) {
        total.last_error.clone_from(&s.last_error);
    }
}

fn is_fenced(e: &RuntimeError) -> bool {
    matches!(e, RuntimeError::Connector(ConnectorError::Fenced(_)))
}

fn is_transient(e: &RuntimeError) -> bool {
    matches!(e, RuntimeError::Connector(ConnectorError::Transient(_)))
}

/// Whether task `kind`, assigned but not open, is to be opened at `now`
/// (not waiting for a retry after a transient error).
fn open_due(retry: &BTreeMap<TaskKind, (Instant, u32)>, kind: &TaskKind, now: Instant) -> bool {
    retry.get(kind).is_none_or(|r| r.0 <= now)
}

/// Runs this process's share of the group's tasks until `opts.stop` is set
/// (then every task commits, checkpoints and the member leaves), or, for a
/// bounded input, until it owns every task and all have finished.
pub fn run_group(spec: &PipelineSpec, mut opts: RunOptions<'_>) -> Result<RunEnd> {
    let (group, instance_id, urls) = check(spec)?;
    let url = urls[0].clone();
    let plan = crate::connect::validate(spec.for_task(0)?)?;
    let partitioned_by = spec
        .group
        .as_ref()
        .map(|g| g.partitioned_by.clone())
        .unwrap_or_default();
    let mode = mode(&plan, &partitioned_by)?;
    let inputs = urls
        .iter()
        .map(|u| {
            Ok(ubik_kafka::admin::end_offsets(u, &spec.kafka)
                .map_err(ConnectorError::from)?
                .len() as u32)
        })
        .collect::<Result<Vec<u32>>>()?;
    let layout = GroupLayout { inputs };
    let repartition = repartition_topic(&group);
    let also = match mode {
        Mode::Partitioned => {
            // Task p reads partition p of every input.
            if let Some((u, n)) = urls
                .iter()
                .zip(&layout.inputs)
                .find(|(_, n)| **n != layout.inputs[0])
            {
                return Err(RuntimeError::Config(format!(
                    "inputs partitioned by key must be co-partitioned: {} has {n} partitions, {} has {}; leave --partitioned-by out to repartition them",
                    u.display(),
                    url.display(),
                    layout.inputs[0]
                )));
            }
            Vec::new()
        }
        Mode::Repartitioned => {
            // Refuse what a key routing cannot split before joining.
            let shuffler = ubik_engine::shuffle::Shuffler::new(&plan, layout.repartition())?;
            ubik_kafka::admin::ensure_repartition_topic(
                &url.bootstrap,
                &repartition,
                layout.repartition() as i32,
                &spec.kafka,
            )
            .map_err(ConnectorError::from)?;
            match shuffler.single() {
                true => warn!(
                    group,
                    topic = repartition,
                    "the query's rows must all meet (it regroups, ranks or joins across keys): one keyed task runs it, the others stay idle"
                ),
                false => info!(
                    group,
                    topic = repartition,
                    "repartitioning by the result key"
                ),
            }
            urls[1..]
                .iter()
                .map(|u| u.topic.clone())
                .chain([repartition.clone()])
                .collect()
        }
    };
    let topics: Vec<String> = urls.iter().map(|u| u.topic.clone()).collect();
    let stages = layout_of(spec, &plan, mode, (&topics, &repartition), &layout);
    let member = GroupMember::join(&url, &also, &group, instance_id.as_deref(), &spec.kafka)
        .map_err(ConnectorError::from)?;
    let kind_of = move |topic: &str, p: u32| match mode {
        Mode::Partitioned => TaskKind::Whole(p),
        Mode::Repartitioned => match topics.iter().position(|t| t == topic) {
            Some(source) => TaskKind::Shuffle(source, p),
            None => TaskKind::Keyed(p),
        },
    };
    let tasks_total = layout.tasks(mode == Mode::Repartitioned);
    let cadence = Cadence {
        interval: opts.commit_interval,
        records: opts.commit_records,
    };
    let mut tasks = Tasks::default();
    tasks.handed_over.stages = stages;
    let shared = Arc::new(Mutex::new(tasks));
    {
        let shared = Arc::clone(&shared);
        let kind_of = kind_of.clone();
        member.on_revoke(Box::new(move |ps| {
            let kinds: Vec<TaskKind> = ps.iter().map(|(t, p)| kind_of(t, *p)).collect();
            info!(tasks = ?kinds, "revoked: handing over");
            let mut tasks = lock(&shared);
            for kind in kinds {
                tasks.hand_over(kind);
            }
        }));
    }
    // Assigned, not opened yet.
    let mut opening: BTreeSet<TaskKind> = BTreeSet::new();
    // Tasks whose opening failed on a transient error (a broker moving a
    // partition's leader while the task restored): when to try again, and
    // the attempts so far.
    let mut retry: BTreeMap<TaskKind, (Instant, u32)> = BTreeMap::new();
    // Whether the last round's tasks read anything.
    let mut progressed = true;
    let mut last_report = Instant::now();
    loop {
        let stop = opts.stop.load(Ordering::Relaxed);
        let idle = lock(&shared).open.values().all(|t| t.finished);
        let now = Instant::now();
        let to_open = opening.iter().any(|k| open_due(&retry, k, now));
        let wait = if !to_open && idle {
            Duration::from_millis(100)
        } else if !to_open && !progressed {
            IDLE_ROUND
        } else {
            Duration::ZERO
        };
        // Not holding the tasks: a revocation hands them over in here.
        let changes = member.poll(wait);
        let mut tasks = lock(&shared);
        for change in changes {
            match change {
                Assignment::Assigned(ps) => {
                    let kinds: Vec<TaskKind> = ps.iter().map(|(t, p)| kind_of(t, *p)).collect();
                    info!(group, tasks = ?kinds, "assigned");
                    opening.extend(kinds);
                }
                Assignment::Revoked(ps) => {
                    // Handed over already, unless it was still opening.
                    for (t, p) in ps {
                        opening.remove(&kind_of(&t, p));
                        retry.remove(&kind_of(&t, p));
                    }
                }
            }
        }
        // Assigned tasks open side by side (each waits on the broker: a
        // transactional producer's initialisation, a restore), up to
        // OPEN_AT_ONCE per round (a member's usual share, so in one wait),
        // then the member serves the group protocol again.
        let now = Instant::now();
        let batch: Vec<TaskKind> = match stop {
            true => Vec::new(),
            false => opening
                .iter()
                .copied()
                .filter(|k| open_due(&retry, k, now))
                .take(OPEN_AT_ONCE)
                .collect(),
        };
        if !batch.is_empty() {
            for kind in &batch {
                opening.remove(kind);
            }
            let copies = batch
                .iter()
                .map(|&kind| Ok((kind, spec.group_copy()?)))
                .collect::<Result<Vec<_>>>()?;
            let opened: Vec<(TaskKind, Result<Task>)> = std::thread::scope(|s| {
                let handles: Vec<_> = copies
                    .into_iter()
                    .map(|(kind, spec)| {
                        let layout = &layout;
                        s.spawn(move || (kind, Task::open(&spec, kind, layout)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    })
                    .collect()
            });
            for (kind, t) in opened {
                match t {
                    Ok(t) => {
                        retry.remove(&kind);
                        tasks.open.insert(kind, t);
                    }
                    Err(e)
                        if is_transient(&e)
                            && retry.get(&kind).is_none_or(|r| r.1 < OPEN_ATTEMPTS) =>
                    {
                        let attempts = retry.get(&kind).map_or(1, |r| r.1 + 1);
                        let delay = OPEN_RETRY_FIRST * 2u32.pow(attempts - 1);
                        warn!(task = %kind, attempt = attempts, "opening the task: {e}; retrying in {delay:?}");
                        retry.insert(kind, (Instant::now() + delay, attempts));
                        opening.insert(kind);
                    }
                    Err(e) => {
                        // Dropped, not handed over: the run ends with the error.
                        tasks.open.clear();
                        return Err(e);
                    }
                }
            }
        }
        if stop {
            let kinds: Vec<TaskKind> = tasks.open.keys().copied().collect();
            for kind in kinds {
                tasks.hand_over(kind);
            }
            drop(tasks);
            member.leave();
            return Ok(RunEnd::Stopped);
        }
        for (p, t) in tasks.open.iter_mut().filter(|(_, t)| t.finished) {
            if t.pipeline.resume_if_behind() {
                info!(task = %p, "records came after the end of its input: reading on");
                t.finished = false;
            }
        }
        let read_before = records_read(&tasks);
        let mut fenced = Vec::new();
        let mut failed = None;
        for (&p, t) in tasks.open.iter_mut().filter(|(_, t)| !t.finished) {
            match t
                .runner
                .turn(&mut t.pipeline, t.sink.as_mut(), cadence, false)
            {
                Ok(Some(_)) => {
                    info!(task = %p, "task finished its bounded input");
                    t.finished = true;
                }
                Ok(None) => {}
                Err(e) if is_fenced(&e) => {
                    warn!(task = %p, "another process took the task over: {e}");
                    fenced.push(p);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_none() {
            failed = commit_due(&mut tasks, &mut fenced).err();
        }
        if let Some(e) = failed {
            tasks.open.clear();
            return Err(e);
        }
        progressed = records_read(&tasks) != read_before;
        for p in fenced {
            tasks.open.remove(&p);
        }
        // A bounded run ends when this member alone owns every task (the
        // others are gone); otherwise it keeps its tasks, so they do not move
        // and replay, until it is stopped.
        if tasks.open.len() as u32 == tasks_total
            && opening.is_empty()
            && tasks.open.values().all(|t| t.finished)
        {
            report(&mut tasks, &mut opts);
            // Closed, so leaving (a revocation) has nothing to hand over.
            for (_, mut t) in std::mem::take(&mut tasks.open) {
                let _ = t.sink.close();
            }
            drop(tasks);
            member.leave();
            return Ok(RunEnd::Finished);
        }
        if last_report.elapsed() >= opts.report_every {
            report(&mut tasks, &mut opts);
            last_report = Instant::now();
        }
    }
}

/// Commits (and checkpoints) every task whose commit is due, side by side:
/// each waits on the broker (its transaction's commit, its checkpoint's
/// replication) at the same time. Tasks another process took over go to
/// `fenced`.
fn commit_due(tasks: &mut Tasks, fenced: &mut Vec<TaskKind>) -> Result<()> {
    let mut due: Vec<(TaskKind, &mut Task)> = tasks
        .open
        .iter_mut()
        .filter(|(_, t)| t.runner.commit_due())
        .map(|(&k, t)| (k, t))
        .collect();
    let commit = |t: &mut Task| t.runner.commit(&mut t.pipeline, t.sink.as_mut());
    let results: Vec<(TaskKind, Result<()>)> = match due.as_mut_slice() {
        [] => return Ok(()),
        [(kind, t)] => vec![(*kind, commit(t))],
        several => std::thread::scope(|s| {
            let handles: Vec<_> = several
                .iter_mut()
                .map(|(kind, t)| (*kind, s.spawn(|| commit(t))))
                .collect();
            handles
                .into_iter()
                .map(|(kind, h)| {
                    let r = h
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (kind, r)
                })
                .collect()
        }),
    };
    let mut failed = None;
    for (kind, r) in results {
        match r {
            Ok(()) => {}
            Err(e) if is_fenced(&e) => {
                warn!(task = %kind, "another process took the task over: {e}");
                fenced.push(kind);
            }
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Records the open tasks have read so far.
fn records_read(tasks: &Tasks) -> u64 {
    tasks
        .open
        .values()
        .map(|t| t.pipeline.stats.records_in)
        .sum()
}

/// The group's stages for a status page: what each reads, routes or runs,
/// and writes, over how many tasks.
fn layout_of(
    spec: &PipelineSpec,
    plan: &ubik_engine::QueryPlan,
    mode: Mode,
    (inputs, repartition): (&[String], &str),
    layout: &GroupLayout,
) -> Vec<StageStatus> {
    let output = match &spec.sink {
        SinkSpec::Kafka(u) => KafkaUrl::parse(u).map_or_else(|_| u.clone(), |u| u.topic),
        SinkSpec::Stdout => "stdout".into(),
    };
    let key: Vec<String> = plan.key_names().into_iter().map(String::from).collect();
    let run = |reads: &str, tasks: u32| StageStatus {
        name: plan.kind_name(),
        reads: reads.to_string(),
        writes: output.clone(),
        key: key.clone(),
        tasks,
        here: Vec::new(),
        records_in: 0,
        cpu_seconds: 0.0,
    };
    match mode {
        Mode::Partitioned => vec![run(&inputs.join(", "), layout.inputs[0])],
        Mode::Repartitioned => {
            let routed_by = ubik_engine::shuffle::describe(plan);
            let name = match &routed_by {
                Some(_) => "first stage: stamps rows and routes them by key",
                None => "first stage: stamps rows and routes them all to one task",
            };
            let mut keyed = run(repartition, layout.repartition());
            if routed_by.is_none() {
                keyed.name = format!("{} (one task: its rows must all meet)", keyed.name);
            }
            vec![
                StageStatus {
                    name: name.into(),
                    reads: inputs.join(", "),
                    writes: repartition.to_string(),
                    key: routed_by.unwrap_or_default(),
                    tasks: layout.inputs.iter().sum(),
                    here: Vec::new(),
                    records_in: 0,
                    cpu_seconds: 0.0,
                },
                keyed,
            ]
        }
    }
}

/// The index of task `kind`'s stage in [`layout_of`]'s list.
fn stage_of(kind: TaskKind) -> usize {
    match kind {
        TaskKind::Whole(_) | TaskKind::Shuffle(..) => 0,
        TaskKind::Keyed(_) => 1,
    }
}

fn report(tasks: &mut Tasks, opts: &mut RunOptions<'_>) {
    // The stages as laid out, with the counters of the tasks handed over.
    let mut total = tasks.handed_over.clone();
    // Which of each stage's tasks this member holds now.
    for kind in tasks.open.keys() {
        let p = match *kind {
            TaskKind::Whole(p) | TaskKind::Shuffle(_, p) | TaskKind::Keyed(p) => p,
        };
        if let Some(s) = total.stages.get_mut(stage_of(*kind)) {
            s.here.push(p);
        }
    }
    // Counters add up over the tasks this member held; what it holds now
    // (partitions, state) comes from its open tasks alone.
    total.partitions.clear();
    total.operators.clear();
    total.store_disk_bytes = 0;
    for (&kind, t) in &mut tasks.open {
        t.pipeline.refresh_stats();
        add(&mut total, kind, &t.pipeline.stats);
    }
    // The slowest task's: what every closed window is older than.
    total.watermark = tasks
        .open
        .values()
        .map(|t| t.pipeline.stats.watermark)
        .min()
        .unwrap_or(total.watermark);
    (opts.report)(&total);
}

/// `ubik status --group NAME`: the group's members and their tasks, and
/// each task's last replicated checkpoint (epoch, position, lag behind the
/// input's end, watermark, state), as a text table: the first input's
/// tasks, the keyed tasks (when repartitioned), then each further input's
/// first stages.
pub fn status(inputs: &[String], group: &str, kafka: &BTreeMap<String, String>) -> Result<String> {
    use std::fmt::Write;
    let urls = inputs
        .iter()
        .map(|i| {
            // `NAME=kafka://…` as given to `run`.
            let url = i
                .split_once('=')
                .filter(|(n, _)| !n.contains(':'))
                .map_or(i.as_str(), |(_, u)| u);
            KafkaUrl::parse(url).map_err(|e| RuntimeError::from(ConnectorError::from(e)))
        })
        .collect::<Result<Vec<_>>>()?;
    let url = urls.first().ok_or_else(|| {
        RuntimeError::Config("status needs the group's input topic (--from)".into())
    })?;
    let described = ubik_kafka::group::describe(url, group, kafka).map_err(ConnectorError::from)?;
    let summaries =
        ubik_kafka::state::summaries(&url.bootstrap, &crate::connect::state_topic(group), kafka)
            .map_err(ConnectorError::from)?;
    let ends = urls
        .iter()
        .map(|u| ubik_kafka::admin::end_offsets(u, kafka).map_err(ConnectorError::from))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let layout = GroupLayout {
        inputs: ends.iter().map(|e| e.len() as u32).collect(),
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {group} on {}: {}, {} members, {} tasks",
        urls.iter()
            .map(KafkaUrl::display)
            .collect::<Vec<_>>()
            .join(", "),
        described.state,
        described.members.len(),
        ends[0].len()
    );
    let _ = writeln!(out, "\n{:<24} {:<20} tasks", "member", "host");
    for m in &described.members {
        let tasks: Vec<String> = m.partitions.iter().map(|p| p.to_string()).collect();
        let _ = writeln!(
            out,
            "{:<24} {:<20} {}",
            m.client_id,
            m.host,
            tasks.join(", ")
        );
    }
    let now = ubik_connector::time::now_ms();
    let dash = |v: Option<i64>| v.map_or("-".into(), |v| v.to_string());
    let watermark_of = |s: Option<&serde_json::Value>| {
        s.and_then(|s| s["watermark"].as_i64())
            .filter(|&w| w != i64::MIN)
            .map_or("-".into(), |w| {
                let mut t = Vec::new();
                ubik_engine::time::write_rfc3339_micros(&mut t, w);
                String::from_utf8_lossy(&t).into_owned()
            })
    };
    let age = |s: Option<&serde_json::Value>| {
        s.and_then(|s| s["created_ms"].as_i64())
            .map_or("-".into(), |t| format!("{}s", (now - t).max(0) / 1000))
    };
    // Repartitioned, an input partition's task is its first stage.
    let first_stage = |source: usize, p: u32| {
        summaries
            .get(&TaskKind::Shuffle(source, p).state_id(&layout))
            .filter(|s| s["source"]["topic"].as_str() == Some(urls[source].topic.as_str()))
    };
    let repartitioned = (0..layout.inputs[0]).any(|p| first_stage(0, p).is_some());
    // One input's tasks: who owns each, and where its last checkpoint stood.
    let input_table = |out: &mut String, source: usize| -> Result<()> {
        let owners = match source {
            0 => described.clone(),
            _ => ubik_kafka::group::describe(&urls[source], group, kafka)
                .map_err(ConnectorError::from)?,
        };
        let mut owner: BTreeMap<i32, String> = BTreeMap::new();
        for m in &owners.members {
            for &p in &m.partitions {
                owner.insert(p, m.client_id.clone());
            }
        }
        if source > 0 {
            let _ = writeln!(out, "\nfirst stages of {}:", urls[source].display());
        }
        let _ = writeln!(
            out,
            "\n{:<5} {:<24} {:>6} {:>12} {:>12} {:>10} {:<28} {:>10} {:>8}",
            "task", "owner", "epoch", "position", "end", "lag", "watermark", "keys", "age"
        );
        let topic = &urls[source].topic;
        for (&p, &end) in &ends[source] {
            let s = first_stage(source, p as u32).or_else(|| match source {
                0 => summaries.get(&(p as u32)),
                _ => None,
            });
            let position = s
                .and_then(|s| s["source"]["next"][p.to_string()].as_i64())
                .or_else(|| s.and_then(|s| s["source"][topic]["next"][p.to_string()].as_i64()));
            let field = |name: &str| s.and_then(|s| s[name].as_i64());
            let _ = writeln!(
                out,
                "{:<5} {:<24} {:>6} {:>12} {:>12} {:>10} {:<28} {:>10} {:>8}",
                p,
                owner.get(&p).map_or("(unassigned)", String::as_str),
                dash(field("epoch")),
                dash(position),
                end,
                dash(position.map(|at| (end - at).max(0))),
                watermark_of(s),
                dash(field("state_keys")),
                age(s),
            );
        }
        Ok(())
    };
    input_table(&mut out, 0)?;
    if repartitioned {
        let mut shuffled = url.clone();
        shuffled.topic = crate::connect::repartition_topic(group);
        let ends =
            ubik_kafka::admin::end_offsets(&shuffled, kafka).map_err(ConnectorError::from)?;
        let _ = writeln!(
            out,
            "\nkeyed tasks (reading the repartition topic):\n{:<5} {:>6} {:>12} {:>12} {:>10} {:<28} {:>10} {:>8}",
            "task", "epoch", "position", "end", "lag", "watermark", "keys", "age"
        );
        for (&r, &end) in &ends {
            let s = summaries.get(&(r as u32));
            let field = |name: &str| s.and_then(|s| s[name].as_i64());
            let position = s.and_then(|s| s["source"]["next"][r.to_string()].as_i64());
            let _ = writeln!(
                out,
                "{:<5} {:>6} {:>12} {:>12} {:>10} {:<28} {:>10} {:>8}",
                r,
                dash(field("epoch")),
                dash(position),
                end,
                dash(position.map(|at| (end - at).max(0))),
                watermark_of(s),
                dash(field("state_keys")),
                age(s),
            );
        }
    }
    for source in 1..urls.len() {
        input_table(&mut out, source)?;
    }
    let _ = writeln!(
        out,
        "\n(position, lag, watermark and keys as of each task's last checkpoint)"
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn plan(sql: &str) -> ubik_engine::QueryPlan {
        let schema = Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
        ]));
        crate::connect::plan(sql, &[("t".into(), schema)], Default::default()).unwrap()
    }

    fn by(cols: &[&str]) -> Vec<String> {
        cols.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_stateful_query_is_repartitioned_unless_its_input_is_partitioned_by_its_key() {
        let grouped = plan("SELECT merchant, count(*) AS n FROM t GROUP BY merchant");
        assert_eq!(mode(&grouped, &[]).unwrap(), Mode::Repartitioned);
        assert_eq!(
            mode(&grouped, &by(&["merchant"])).unwrap(),
            Mode::Partitioned
        );
        let other = mode(&grouped, &by(&["amount"])).unwrap_err().to_string();
        assert!(
            other.contains("`amount` is not a column of the result key"),
            "{other}"
        );
        // Stateless: any partitioning, or none, gives the same rows.
        let filter = plan("SELECT * FROM t WHERE amount > 1");
        assert_eq!(mode(&filter, &[]).unwrap(), Mode::Partitioned);
    }
}
