//! Runs a [`Pipeline`] into a byte [`Sink`] (stdout, Kafka) with the
//! exactly-once order: write the epoch's records, commit the sink, then
//! checkpoint. If the sink loses an epoch (an aborted transaction after a
//! broker outage), the pipeline rewinds to its last checkpoint and replays,
//! re-emitting the same bytes. Stops cleanly when asked (SIGTERM/SIGINT):
//! what is closed has been emitted; it is committed and checkpointed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use ubik_connector::{ConnectorError, Sink, SinkRecord};
use ubik_engine::Output;
use ubik_format::ChangeEncoder;

use crate::cpu;
use crate::error::{Result, RuntimeError};
use crate::pipeline::{Pipeline, Stats, Step};

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// A bounded input was fully processed.
    Finished,
    /// Stopped on request (signal), after a final commit and checkpoint.
    Stopped,
}

pub struct RunOptions<'a> {
    /// Commit (and checkpoint, if the pipeline has a checkpoint directory)
    /// at least this often ...
    pub commit_interval: Duration,
    /// ... or after this many input records.
    pub commit_records: Option<u64>,
    pub stop: &'a AtomicBool,
    /// Called about every `report_every` with the counters.
    pub report: &'a mut dyn FnMut(&Stats),
    pub report_every: Duration,
}

/// Commits the sink, then checkpoints; on a lost epoch, rewinds.
/// `first_write` is when the epoch's oldest uncommitted record was emitted.
fn commit_epoch(
    pipeline: &mut Pipeline,
    sink: &mut dyn Sink,
    first_write: &mut Option<Instant>,
) -> Result<bool> {
    // A first stage tells every target how far its partitions got, in the
    // epoch's transaction.
    match write_shuffled(pipeline, sink, true) {
        Ok(()) => {}
        Err(ConnectorError::Transient(m)) => {
            *first_write = None;
            recover(pipeline, sink, &m)?;
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    }
    if pipeline.routes_by_key() {
        // A first stage's epoch is in its exchange, uncommitted.
        ubik_connector::failpoint::hit("exchange-before-commit");
    }
    match sink.commit() {
        Ok(()) => {
            if let Some(t) = first_write.take() {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                pipeline.stats.commit_latency_last_ms = ms;
                pipeline.stats.commit_latency_max_ms = pipeline.stats.commit_latency_max_ms.max(ms);
            }
            ubik_connector::failpoint::hit("after-commit");
            pipeline.checkpoint(&[])?;
            Ok(true)
        }
        Err(ConnectorError::Transient(m)) => {
            *first_write = None;
            recover(pipeline, sink, &m)?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes a first stage's routed records (and, with `progress`, its
/// progress records) to their target partitions.
fn write_shuffled(
    pipeline: &mut Pipeline,
    sink: &mut dyn Sink,
    progress: bool,
) -> std::result::Result<(), ConnectorError> {
    pipeline.write_shuffled(progress, &mut |target, bytes| {
        sink.write(SinkRecord {
            key: None,
            value: Some(bytes),
            timestamp_ms: None,
            partition: Some(target),
        })
    })
}

fn recover(pipeline: &mut Pipeline, sink: &mut dyn Sink, why: &str) -> Result<()> {
    pipeline.note_error(why);
    warn!(
        "{why}: rewinding to the last checkpoint (epoch {})",
        pipeline.epoch()
    );
    let mut delay = Duration::from_millis(500);
    loop {
        match sink.abort() {
            Ok(()) => break,
            Err(ConnectorError::Transient(m)) => {
                warn!("aborting the epoch: {m}; retrying in {delay:?}");
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
    pipeline.rewind()
}

/// When to commit: at least every `interval`, or after `records` input records.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    pub interval: Duration,
    pub records: Option<u64>,
}

/// Drives one pipeline into its sink a step at a time, so that one thread
/// can run several (the tasks of a consumer group member).
pub struct Runner {
    encoder: Box<dyn ChangeEncoder>,
    out: Output,
    last_commit: Instant,
    records_at_commit: u64,
    pending: bool,
    first_write: Option<Instant>,
    /// 0: running; 1: draining the source; 2: drained.
    draining: u8,
    /// Leave due commits to the caller ([`Self::defer_commits`]).
    defer: bool,
    /// A commit is due and was left to the caller.
    due: bool,
}

impl Runner {
    /// A runner writing `pipeline`'s changelog through `encoder`.
    pub fn new(pipeline: &Pipeline, encoder: Box<dyn ChangeEncoder>) -> Self {
        Self {
            encoder,
            out: Output::default(),
            last_commit: Instant::now(),
            records_at_commit: pipeline.stats.records_in,
            pending: false,
            first_write: None,
            draining: 0,
            defer: false,
            due: false,
        }
    }

    /// From now on a turn that finds a commit due leaves it to the caller
    /// ([`Self::commit_due`], [`Self::commit`]): a group member commits its
    /// tasks side by side, each waiting on the broker at once, instead of
    /// one round trip after another.
    pub fn defer_commits(mut self) -> Self {
        self.defer = true;
        self
    }

    /// A commit is due (deferred commits only).
    pub fn commit_due(&self) -> bool {
        self.due
    }

    /// The commit a turn left to the caller: commits and checkpoints.
    pub fn commit(&mut self, pipeline: &mut Pipeline, sink: &mut dyn Sink) -> Result<()> {
        on_cpu(pipeline, |p| self.commit_now(p, sink))
    }

    fn commit_now(&mut self, pipeline: &mut Pipeline, sink: &mut dyn Sink) -> Result<()> {
        self.due = false;
        commit_epoch(pipeline, sink, &mut self.first_write)?;
        self.last_commit = Instant::now();
        self.records_at_commit = pipeline.stats.records_in;
        self.pending = false;
        Ok(())
    }

    /// One step: reads a chunk, writes what it emitted, commits (and
    /// checkpoints) when due. With `stop`, drains and stops. Returns how the
    /// run ended, once it has.
    pub fn turn(
        &mut self,
        pipeline: &mut Pipeline,
        sink: &mut dyn Sink,
        cadence: Cadence,
        stop: bool,
    ) -> Result<Option<RunEnd>> {
        on_cpu(pipeline, |p| self.step(p, sink, cadence, stop))
    }

    fn step(
        &mut self,
        pipeline: &mut Pipeline,
        sink: &mut dyn Sink,
        cadence: Cadence,
        stop: bool,
    ) -> Result<Option<RunEnd>> {
        if stop && self.draining == 0 {
            self.draining = if pipeline.begin_drain() { 1 } else { 2 };
            if self.draining == 1 {
                info!("stopping: processing what the source already accepted");
            }
        }
        if self.draining == 2 {
            if commit_epoch(pipeline, sink, &mut self.first_write)? {
                pipeline.settle_checkpoint()?;
                info!("stopped on request after committing and checkpointing");
                return Ok(Some(RunEnd::Stopped));
            }
            return Ok(None);
        }
        self.out.clear();
        let step = pipeline.step(&mut self.out)?;
        let mut written = 0u64;
        let mut lost = None;
        'emit: for change in &self.out.changes {
            let r = self.encoder.encode(change, &mut |rec| {
                written += 1;
                sink.write(rec)
            })?;
            if let Err(e) = r {
                lost = Some(e);
                break 'emit;
            }
        }
        if lost.is_none()
            && let Err(e) = write_shuffled(pipeline, sink, false)
        {
            lost = Some(e);
        }
        match lost {
            None => {}
            Some(ConnectorError::Transient(m)) => {
                self.first_write = None;
                recover(pipeline, sink, &m)?;
                return Ok(None);
            }
            Some(e) => return Err(RuntimeError::Connector(e)),
        }
        if written > 0 {
            self.first_write.get_or_insert_with(Instant::now);
            pipeline.note_emitted(written);
            self.pending = true;
        }
        if self.draining == 1 && step == Step::Idle {
            self.draining = 2;
            return Ok(None);
        }
        if step == Step::Finished {
            if !commit_epoch(pipeline, sink, &mut self.first_write)? {
                return Ok(None);
            }
            pipeline.settle_checkpoint()?;
            return Ok(Some(RunEnd::Finished));
        }
        let due = self.last_commit.elapsed() >= cadence.interval
            || cadence
                .records
                .is_some_and(|n| pipeline.stats.records_in - self.records_at_commit >= n);
        // Without a checkpoint directory there is nothing to checkpoint, but
        // output is still committed promptly when the input pauses.
        let idle_flush = self.pending && step == Step::Idle && !pipeline.has_checkpoints();
        if due && !self.pending && pipeline.quiet_since_checkpoint() {
            self.last_commit = Instant::now();
        } else if (due || idle_flush) && self.defer {
            self.due = true;
        } else if due || idle_flush {
            self.commit_now(pipeline, sink)?;
        }
        Ok(None)
    }

    /// Commits and checkpoints what was emitted, retrying a lost epoch
    /// (after replaying it), before the task is handed to another process.
    pub fn hand_over(&mut self, pipeline: &mut Pipeline, sink: &mut dyn Sink) -> Result<()> {
        loop {
            match self.turn(pipeline, sink, CADENCE_NEVER, true)? {
                Some(_) => return Ok(()),
                None => continue,
            }
        }
    }
}

/// Runs `work`, adding the CPU time this thread spent in it to the
/// pipeline's [`Stats::cpu_seconds`].
fn on_cpu<T>(pipeline: &mut Pipeline, work: impl FnOnce(&mut Pipeline) -> T) -> T {
    let start = cpu::thread_seconds();
    let r = work(pipeline);
    pipeline.stats.cpu_seconds += cpu::thread_seconds() - start;
    r
}

/// A cadence that never asks for a commit (the caller decides).
const CADENCE_NEVER: Cadence = Cadence {
    interval: Duration::MAX,
    records: None,
};

/// Runs until the input ends or `stop` is set.
pub fn run_to_sink(
    pipeline: &mut Pipeline,
    sink: &mut dyn Sink,
    encoder: Box<dyn ChangeEncoder>,
    opts: RunOptions<'_>,
) -> Result<RunEnd> {
    let mut runner = Runner::new(pipeline, encoder);
    let cadence = Cadence {
        interval: opts.commit_interval,
        records: opts.commit_records,
    };
    let mut last_report = Instant::now();
    loop {
        let stop = opts.stop.load(Ordering::Relaxed);
        if let Some(end) = runner.turn(pipeline, sink, cadence, stop)? {
            if end == RunEnd::Finished {
                pipeline.refresh_stats();
                (opts.report)(&pipeline.stats);
            }
            return Ok(end);
        }
        if last_report.elapsed() >= opts.report_every {
            pipeline.refresh_stats();
            (opts.report)(&pipeline.stats);
            last_report = Instant::now();
        }
    }
}
