//! Runs a [`Pipeline`] into a byte [`Sink`] (stdout, Kafka) with the
//! exactly-once order: write the epoch's records, commit the sink, then
//! checkpoint. Stops cleanly when asked (SIGTERM/SIGINT): what is closed has
//! been emitted; it is committed and checkpointed before returning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::info;
use ubik_engine::Output;
use ubik_engine::connector::Sink;
use ubik_format::changelog::ChangelogEncoder;

use crate::config::CheckpointConfig;
use crate::error::Result;
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
    pub checkpoint: Option<&'a CheckpointConfig>,
    pub stop: &'a AtomicBool,
    /// Called about once a second with the counters.
    pub report: &'a mut dyn FnMut(&Stats),
    pub report_every: Duration,
}

/// Runs until the input ends or `stop` is set.
pub fn run_to_sink(
    pipeline: &mut Pipeline,
    sink: &mut dyn Sink,
    opts: RunOptions<'_>,
) -> Result<RunEnd> {
    let plan = pipeline.plan().clone();
    let keyed = matches!(plan.kind, ubik_engine::plan::QueryKind::Aggregate(_));
    let mut encoder = ChangelogEncoder::new(&plan.output_schema, plan.key_columns.clone(), keyed);
    let mut out = Output::default();
    let mut last_checkpoint = Instant::now();
    let mut records_at_checkpoint = pipeline.stats.records_in;
    let mut last_report = Instant::now();
    let mut dirty = false;
    loop {
        if opts.stop.load(Ordering::Relaxed) {
            sink.commit()?;
            pipeline.checkpoint(&[])?;
            info!("stopped on request after committing and checkpointing");
            return Ok(RunEnd::Stopped);
        }
        out.clear();
        let step = pipeline.step(&mut out)?;
        let mut written = 0u64;
        for change in &out.changes {
            encoder.encode(change, |r| {
                written += 1;
                sink.write(r)
            })??;
        }
        if written > 0 {
            pipeline.note_emitted(written);
            dirty = true;
        }
        if step == Step::Finished {
            sink.commit()?;
            pipeline.checkpoint(&[])?;
            (opts.report)(&pipeline.stats);
            return Ok(RunEnd::Finished);
        }
        if let Some(ck) = opts.checkpoint {
            let by_time = last_checkpoint.elapsed() >= ck.interval;
            let by_records = ck
                .every_records
                .is_some_and(|n| pipeline.stats.records_in - records_at_checkpoint >= n);
            if by_time || by_records {
                sink.commit()?;
                pipeline.checkpoint(&[])?;
                last_checkpoint = Instant::now();
                records_at_checkpoint = pipeline.stats.records_in;
                dirty = false;
            }
        } else if dirty && step == Step::Idle {
            // Without checkpoints, still flush output promptly when input pauses.
            sink.commit()?;
            dirty = false;
        }
        if last_report.elapsed() >= opts.report_every {
            (opts.report)(&pipeline.stats);
            last_report = Instant::now();
        }
    }
}
