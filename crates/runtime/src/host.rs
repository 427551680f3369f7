//! The Arrow leg: a pipeline driven by a host process (the Python package)
//! that takes result batches, commits them to its own table, and then asks
//! for a checkpoint.
//!
//! Batches have the query's result schema, plus a boolean `_deleted` column
//! when the query can retract keys (HAVING, SESSION). Optionally they are
//! coalesced into right-sized batches (max rows, max bytes, max interval),
//! compacted to the last row per key (a lake MERGE refuses a source batch
//! that matches a target row twice), and spilled to Arrow IPC on disk while
//! they accumulate past a memory bound; a spilled batch is handed out in
//! the pieces it was spilled in (see [`crate::spill`]).

use std::collections::VecDeque;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::StreamWriter;
use ubik_engine::{ChangeBatch, Output};

use crate::error::{Result, RuntimeError};
use crate::pipeline::{Pipeline, Step};
use crate::progress::{Progress, Total};
use crate::spec::PipelineSpec;
use crate::spill::{SpilledFlush, last_per_key};

pub const DELETED: &str = "_deleted";

/// How the host wants its batches.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Coalesce output until this many rows ...
    pub max_rows: Option<usize>,
    /// ... or this many bytes ...
    pub max_bytes: Option<usize>,
    /// ... or until the oldest row waited this long.
    pub max_interval: Option<Duration>,
    /// Keep only the last row per key in a coalesced batch.
    pub compact: bool,
    /// Spill accumulating batches to Arrow IPC files here past `spill_bytes`.
    pub spill_dir: Option<PathBuf>,
    pub spill_bytes: usize,
    /// Resume from the checkpoint a token names (kept in the checkpoint
    /// directory) instead of the latest.
    pub resume_from: Option<String>,
    /// Draw a progress bar on stderr while running, when stderr is a
    /// terminal (`None`: no).
    pub progress: Option<bool>,
}

impl HostOptions {
    fn coalesces(&self) -> bool {
        self.max_rows.is_some()
            || self.max_bytes.is_some()
            || self.max_interval.is_some()
            || self.compact
    }
}

/// The result schema a host receives.
pub fn host_schema(plan: &ubik_engine::QueryPlan) -> SchemaRef {
    if !plan.may_retract() {
        return Arc::clone(&plan.output_schema);
    }
    let mut fields: Vec<Arc<Field>> = plan.output_schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(DELETED, DataType::Boolean, false)));
    Arc::new(Schema::new_with_metadata(
        fields,
        plan.output_schema.metadata().clone(),
    ))
}

/// Batches accumulating for one coalesced output batch.
#[derive(Default)]
struct Accumulator {
    memory: Vec<RecordBatch>,
    spilled: Option<(PathBuf, StreamWriter<BufWriter<std::fs::File>>)>,
    rows: usize,
    bytes: usize,
    memory_bytes: usize,
    since: Option<Instant>,
}

/// Output produced and not handed out yet.
enum Ready {
    Batch(RecordBatch),
    /// A flush that outgrew memory, handed out piece by piece.
    Spilled(Box<SpilledFlush>),
}

pub struct HostPipeline {
    pipeline: Pipeline,
    options: HostOptions,
    schema: SchemaRef,
    key_columns: Vec<usize>,
    /// Output produced and not yet handed out.
    ready: VecDeque<Ready>,
    acc: Accumulator,
    spill_seq: u64,
    out: Output,
    /// The bar on a terminal, and when it was last drawn.
    progress: Option<(Progress, Instant)>,
}

/// How often the bar is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

impl HostPipeline {
    pub fn open(spec: PipelineSpec, options: HostOptions) -> Result<Self> {
        let progress = match options.progress {
            Some(true) => {
                Progress::bar_on_terminal(Total::of(&spec, true)).map(|p| (p, Instant::now()))
            }
            _ => None,
        };
        let mut pipeline = crate::connect::open_pipeline(spec)?;
        if let Some(token) = &options.resume_from {
            let epoch = token_epoch(token, pipeline.fingerprint())?;
            if epoch <= pipeline.epoch() && !pipeline.resume(Some(epoch))? {
                return Err(RuntimeError::Checkpoint(format!(
                    "no checkpoint for token {token:?}"
                )));
            }
        }
        let schema = host_schema(pipeline.plan());
        let key_columns = pipeline.plan().key_columns.clone();
        let mut host = Self {
            pipeline,
            options,
            schema,
            key_columns,
            ready: VecDeque::new(),
            acc: Accumulator::default(),
            spill_seq: 0,
            out: Output::default(),
            progress,
        };
        // Output saved with the checkpoint comes first, as it was.
        for c in host.pipeline.take_restored() {
            let b = host.host_batch(&c)?;
            host.ready.push_back(Ready::Batch(b));
        }
        Ok(host)
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn host_batch(&self, c: &ChangeBatch) -> Result<RecordBatch> {
        if !self.pipeline.plan().may_retract() {
            return Ok(c.rows.clone());
        }
        let mut cols: Vec<ArrayRef> = c.rows.columns().to_vec();
        cols.push(Arc::new(match &c.deletes {
            Some(d) => d.clone(),
            None => BooleanArray::from(vec![false; c.num_rows()]),
        }));
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), cols)?)
    }

    /// The next result batch: `Ok(None)` when nothing arrived within
    /// `timeout` (call again), `Err` on failure; [`Self::is_finished`] tells
    /// when a bounded input is exhausted.
    pub fn next_batch(&mut self, timeout: Duration) -> Result<Option<RecordBatch>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(b) = self.pop_ready()? {
                return Ok(Some(b));
            }
            if self.pipeline.is_finished() {
                self.flush()?;
                return self.pop_ready();
            }
            self.out.clear();
            let step = self.pipeline.step(&mut self.out)?;
            let changes = std::mem::take(&mut self.out.changes);
            let n: u64 = changes.iter().map(|c| c.num_rows() as u64).sum();
            self.pipeline.note_emitted(n);
            for c in &changes {
                let b = self.host_batch(c)?;
                if self.options.coalesces() {
                    self.accumulate(b)?;
                } else if b.num_rows() > 0 {
                    self.ready.push_back(Ready::Batch(b));
                }
            }
            if self.options.coalesces() && self.due() {
                self.flush()?;
            }
            self.draw_progress(step == Step::Finished);
            if step == Step::Finished {
                self.flush()?;
                continue;
            }
            if self.ready.is_empty() && Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Redraws the bar when due, and ends its line when the input `ended`.
    fn draw_progress(&mut self, ended: bool) {
        let Some((bar, last)) = &mut self.progress else {
            return;
        };
        if ended || last.elapsed() >= PROGRESS_EVERY {
            *last = Instant::now();
            bar.report(&self.pipeline.stats);
        }
        if ended {
            bar.finish(&self.pipeline.stats, true);
            self.progress = None;
        }
    }

    /// The next batch or piece produced, if any.
    fn pop_ready(&mut self) -> Result<Option<RecordBatch>> {
        while let Some(front) = self.ready.front_mut() {
            match front {
                Ready::Spilled(flush) => match flush.next_piece()? {
                    Some(piece) => return Ok(Some(piece)),
                    None => drop(self.ready.pop_front()),
                },
                Ready::Batch(_) => {
                    if let Some(Ready::Batch(b)) = self.ready.pop_front() {
                        return Ok(Some(b));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Puts a batch [`Self::next_batch`] returned back in front, when the
    /// host could not take it after all.
    pub fn hand_back(&mut self, batch: RecordBatch) {
        self.ready.push_front(Ready::Batch(batch));
    }

    pub fn is_finished(&self) -> bool {
        self.pipeline.is_finished() && self.ready.is_empty() && self.acc.rows == 0
    }

    fn accumulate(&mut self, b: RecordBatch) -> Result<()> {
        if b.num_rows() == 0 {
            return Ok(());
        }
        let size = b.get_array_memory_size();
        self.acc.rows += b.num_rows();
        self.acc.bytes += size;
        self.acc.since.get_or_insert_with(Instant::now);
        match &mut self.acc.spilled {
            Some((_, w)) => w.write(&b)?,
            None => {
                self.acc.memory_bytes += size;
                self.acc.memory.push(b);
                if let Some(dir) = self.options.spill_dir.clone()
                    && self.options.spill_bytes > 0
                    && self.acc.memory_bytes > self.options.spill_bytes
                {
                    self.spill(&dir)?;
                }
            }
        }
        Ok(())
    }

    /// Moves the accumulating batches to an IPC file.
    fn spill(&mut self, dir: &std::path::Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        self.spill_seq += 1;
        let path = dir.join(format!(
            "ubik-spill-{}-{}.arrow",
            std::process::id(),
            self.spill_seq
        ));
        let mut w =
            StreamWriter::try_new(BufWriter::new(std::fs::File::create(&path)?), &self.schema)?;
        for b in self.acc.memory.drain(..) {
            w.write(&b)?;
        }
        self.acc.memory_bytes = 0;
        self.acc.spilled = Some((path, w));
        Ok(())
    }

    fn due(&self) -> bool {
        let o = &self.options;
        self.acc.rows > 0
            && (o.max_rows.is_some_and(|n| self.acc.rows >= n)
                || o.max_bytes.is_some_and(|n| self.acc.bytes >= n)
                || o.max_interval
                    .is_some_and(|d| self.acc.since.is_some_and(|s| s.elapsed() >= d)))
    }

    /// Emits the accumulated rows as one batch (compacted if asked), or, if
    /// they were spilled, as the pieces of the spill file.
    fn flush(&mut self) -> Result<()> {
        if self.acc.rows == 0 {
            return Ok(());
        }
        let acc = std::mem::take(&mut self.acc);
        let compact = self.options.compact.then_some(self.key_columns.as_slice());
        if let Some((path, mut w)) = acc.spilled {
            for b in &acc.memory {
                w.write(b)?;
            }
            w.finish()?;
            drop(w);
            let flush = SpilledFlush::open(path, compact)?;
            self.ready.push_back(Ready::Spilled(Box::new(flush)));
            return Ok(());
        }
        let mut batch = concat_batches(&self.schema, &acc.memory)?;
        if let Some(keys) = compact {
            batch = last_per_key(&batch, keys)?;
        }
        if batch.num_rows() > 0 {
            self.ready.push_back(Ready::Batch(batch));
        }
        Ok(())
    }

    /// Checkpoints the state as of the last batch handed out; batches
    /// produced but not handed out yet are saved and handed out again after
    /// a resume.
    ///
    /// The checkpoint holds that output in memory while it is written: the
    /// unread pieces of a spilled flush are read back from their file (and
    /// handed out from memory afterwards).
    pub fn checkpoint(&mut self) -> Result<()> {
        // Accumulating rows are handed out later: save them too.
        self.flush()?;
        let mut held = Vec::new();
        while let Some(b) = self.pop_ready()? {
            held.push(b);
        }
        let mut pending: Vec<ChangeBatch> = Vec::with_capacity(held.len());
        for b in &held {
            pending.push(self.change_of(b)?);
        }
        self.ready.extend(held.into_iter().map(Ready::Batch));
        // The host commits its lake tables next: the checkpoint must be current.
        self.pipeline.checkpoint(&pending)?;
        self.pipeline.settle_checkpoint()
    }

    fn change_of(&self, b: &RecordBatch) -> Result<ChangeBatch> {
        let n = self.pipeline.plan().output_schema.fields().len();
        let rows = RecordBatch::try_new(
            Arc::clone(&self.pipeline.plan().output_schema),
            b.columns()[..n].to_vec(),
        )?;
        let deletes =
            (b.num_columns() > n).then(|| arrow::array::AsArray::as_boolean(b.column(n)).clone());
        Ok(ChangeBatch {
            timestamps: arrow::array::Int64Array::new_null(b.num_rows()),
            rows,
            deletes,
        })
    }

    /// Runs a bounded input to the end and returns the final result: the
    /// latest row per key, retracted keys removed, ordered by key.
    pub fn final_table(&mut self) -> Result<RecordBatch> {
        let mut all = Vec::new();
        loop {
            match self.next_batch(Duration::from_millis(200))? {
                Some(b) => all.push(b),
                None if self.is_finished() => break,
                None => {}
            }
        }
        self.fold(&all)
    }

    /// The latest row per key of `batches` (result batches of this
    /// pipeline, in order), retracted keys removed, ordered by key.
    pub fn fold(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let batch = concat_batches(&self.schema, batches)?;
        let output = Arc::clone(&self.pipeline.plan().output_schema);
        let width = output.fields().len();
        if !self.pipeline.plan().is_keyed() {
            return Ok(RecordBatch::try_new(
                output,
                batch.columns()[..width].to_vec(),
            )?);
        }
        let folded = last_per_key(&batch, &self.key_columns)?;
        let mut keep: Vec<u32> = Vec::new();
        if folded.num_columns() > width {
            let d = arrow::array::AsArray::as_boolean(folded.column(width));
            keep.extend((0..folded.num_rows() as u32).filter(|&i| !d.value(i as usize)));
        } else {
            keep.extend(0..folded.num_rows() as u32);
        }
        let folded = take_record_batch(&folded, &UInt32Array::from(keep))?;
        let sorted = sort_by_key(&folded, &self.key_columns)?;
        Ok(RecordBatch::try_new(
            output,
            sorted.columns()[..width].to_vec(),
        )?)
    }

    /// A token naming the checkpoint the next [`Self::checkpoint`] writes,
    /// for the host to store with its own commit.
    pub fn next_token(&self) -> String {
        format!(
            "ubik1:{}:{}",
            self.pipeline.fingerprint(),
            self.pipeline.epoch() + 1
        )
    }
}

/// Parses a token of [`HostPipeline::next_token`] into its epoch, checking
/// that it belongs to this pipeline.
pub fn token_epoch(token: &str, fingerprint: &str) -> Result<u64> {
    let parts: Vec<&str> = token.split(':').collect();
    match parts.as_slice() {
        ["ubik1", fp, epoch] if *fp == fingerprint => epoch
            .parse()
            .map_err(|_| RuntimeError::Checkpoint(format!("malformed position token {token:?}"))),
        ["ubik1", _, _] => Err(RuntimeError::Checkpoint(format!(
            "position token {token:?} belongs to a different pipeline (query, schema or options changed)"
        ))),
        _ => Err(RuntimeError::Checkpoint(format!(
            "{token:?} is not a ubik position token"
        ))),
    }
}

fn sort_by_key(batch: &RecordBatch, key_columns: &[usize]) -> Result<RecordBatch> {
    if key_columns.is_empty() || batch.num_rows() < 2 {
        return Ok(batch.clone());
    }
    let cols: Vec<arrow::compute::SortColumn> = key_columns
        .iter()
        .map(|&i| arrow::compute::SortColumn {
            values: Arc::clone(batch.column(i)),
            options: None,
        })
        .collect();
    let idx = arrow::compute::lexsort_to_indices(&cols, None)?;
    Ok(take_record_batch(batch, &idx)?)
}
