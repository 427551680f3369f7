//! TUMBLE and HOP windows: one [`KeyedState`] per window, created by its
//! first row, emitted when the watermark passes its end, then kept for the
//! retention bound so late rows can update it.
//!
//! Determinism: a row is on time for a window when its stamp (its
//! partition's watermark before it) is before the window's end. The global
//! watermark is the minimum over partitions, so once it passes a window's
//! end every on-time row of that window has been read, and no late row has
//! been folded into it: the first emission is exact whatever the
//! interleaving. Late rows are queued on an event-time grid (by stamp) and
//! applied when the global watermark passes their grid point, again after
//! all of them from every partition have been read.

use std::collections::BTreeMap;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{FieldRef, SchemaRef};

use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, Reject, RejectReason, StampedBatch};
use crate::accumulate::is_order_independent;
use crate::error::{EngineError, Result};
use crate::plan::{AggregatePlan, AggregateSpec, QueryOptions, WindowSpec};
use crate::state::{KeyedState, PendingPart, PendingRows, StateEntry};
use crate::time::{floor_to, next_tick};

/// Window geometry and lateness policy: what classifying a row needs.
#[derive(Debug, Clone, Copy)]
struct Grid {
    size: i64,
    slide: i64,
    retention: i64,
    emit_interval: i64,
}

impl Grid {
    /// Starts of the windows containing `t`, newest first.
    fn windows_of(&self, t: i64, out: &mut Vec<i64>) {
        out.clear();
        let last = floor_to(t, self.slide);
        let mut start = last;
        while start > t - self.size {
            out.push(start);
            start -= self.slide;
        }
    }
}

/// Creates the empty state of one window.
struct StateFactory {
    key_fields: Vec<FieldRef>,
    specs: Vec<AggregateSpec>,
}

impl StateFactory {
    fn create(&self) -> Result<KeyedState> {
        KeyedState::new(&self.key_fields, &self.specs, false, false)
    }
}

/// Rows of one stamped batch (or a contiguous part of it).
struct Rows<'a> {
    partition: u32,
    batch: RecordBatch,
    times: &'a [i64],
    stamps: &'a [i64],
    origin: &'a [u32],
}

/// Late rows of a part, by grid tick: (row in the part, window start).
type LateRows = BTreeMap<i64, (Vec<u32>, Vec<i64>)>;

/// Batches smaller than this are folded on the calling thread: below it a
/// thread's start-up costs more than it saves.
const PARALLEL_MIN_ROWS: usize = 16_384;

pub struct WindowOperator {
    grid: Grid,
    eval: AggEvaluator,
    emitter: Emitter,
    factory: StateFactory,
    open: BTreeMap<i64, KeyedState>,
    /// Per extra thread: partial states of open windows, folded from part of
    /// large batches and merged into `open` before a window is read.
    partials: Vec<BTreeMap<i64, KeyedState>>,
    closed: BTreeMap<i64, KeyedState>,
    /// Late rows by grid point; a row's value is the window start it is
    /// late for (a row late for several HOP windows appears once per window).
    pending: PendingRows,
}

/// Folds the on-time rows of `rows` into `open`; returns the rejects and the
/// late rows (to be queued in order).
fn fold_rows(
    grid: Grid,
    eval: &AggEvaluator,
    factory: &StateFactory,
    open: &mut BTreeMap<i64, KeyedState>,
    rows: &Rows<'_>,
) -> Result<(Vec<Reject>, LateRows)> {
    let n = rows.batch.num_rows();
    let mut rejects = Vec::new();
    let mut on_time: Vec<(i64, Vec<u32>)> = Vec::new();
    let mut late = LateRows::new();
    let mut starts = Vec::new();
    let mut last_slot = usize::MAX;
    for i in 0..n {
        let (t, stamp) = (rows.times[i], rows.stamps[i]);
        grid.windows_of(t, &mut starts);
        let mut kept = false;
        let mut newest_end = 0;
        for &start in &starts {
            let end = start + grid.size;
            if end > stamp {
                kept = true;
                if last_slot == usize::MAX || on_time[last_slot].0 != start {
                    last_slot = match on_time.iter().position(|(s, _)| *s == start) {
                        Some(p) => p,
                        None => {
                            on_time.push((start, Vec::new()));
                            on_time.len() - 1
                        }
                    };
                }
                on_time[last_slot].1.push(i as u32);
            } else if end.saturating_add(grid.retention) > stamp {
                kept = true;
                let e = late
                    .entry(next_tick(stamp, grid.emit_interval))
                    .or_default();
                e.0.push(i as u32);
                e.1.push(start);
            } else {
                newest_end = newest_end.max(end);
            }
        }
        if !kept {
            rejects.push(Reject {
                partition: rows.partition,
                row: rows.origin[i] as usize,
                reason: RejectReason::TooLate {
                    window_end: newest_end,
                    watermark: stamp,
                },
            });
        }
    }
    if !on_time.is_empty() {
        let keys = eval.keys(&rows.batch)?;
        let inputs = eval.inputs(&rows.batch)?;
        for (start, members) in on_time {
            let state = match open.entry(start) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(factory.create()?),
            };
            if members.len() == n {
                // Every row of the batch, in order: no copy.
                state.update(&keys, n, &inputs, None)?;
            } else {
                let idx = UInt32Array::from(members);
                let k = super::emit::take_all(&keys, &idx)?;
                state.update(&k, idx.len(), &inputs.take(&idx)?, None)?;
            }
        }
    }
    Ok((rejects, late))
}

impl WindowOperator {
    pub fn new(
        plan: &AggregatePlan,
        options: &QueryOptions,
        emitter: Emitter,
        source_schema: SchemaRef,
    ) -> Result<Self> {
        let (size, slide) = match plan.window {
            Some(WindowSpec::Tumble { size }) => (size, size),
            Some(WindowSpec::Hop { slide, size }) => (size, slide),
            _ => return Err(EngineError::internal("window operator without TUMBLE/HOP")),
        };
        // Parallel folding needs partial states that merge exactly.
        let threads = if plan.aggregates.iter().all(is_order_independent) {
            options.resolved_threads()
        } else {
            1
        };
        Ok(Self {
            grid: Grid {
                size,
                slide,
                retention: options.retention_us.max(0),
                emit_interval: options.emit_interval_us.max(1),
            },
            eval: AggEvaluator::new(plan),
            emitter,
            factory: StateFactory {
                key_fields: plan.group_fields.clone(),
                specs: plan.aggregates.clone(),
            },
            open: BTreeMap::new(),
            partials: (1..threads.max(1)).map(|_| BTreeMap::new()).collect(),
            closed: BTreeMap::new(),
            pending: PendingRows::new(source_schema, "__window_start"),
        })
    }

    fn new_state(&self) -> Result<KeyedState> {
        self.factory.create()
    }

    /// Merges the partial states of open windows starting before `until` into `open`.
    fn merge_partials(&mut self, until: i64) -> Result<()> {
        for partial in &mut self.partials {
            let rest = partial.split_off(&until);
            for (start, state) in std::mem::replace(partial, rest) {
                match self.open.entry(start) {
                    std::collections::btree_map::Entry::Occupied(mut e) => {
                        e.get_mut().absorb(state)?
                    }
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(state);
                    }
                }
            }
        }
        Ok(())
    }

    /// Folds `input` on up to `1 + partials.len()` threads, each taking a
    /// contiguous part; returns each part's rejects and late rows, in order.
    fn fold_parallel(
        &mut self,
        input: &StampedBatch,
    ) -> Result<Vec<(usize, Vec<Reject>, LateRows)>> {
        let n = input.batch.num_rows();
        let parts = (1 + self.partials.len())
            .min(n / (PARALLEL_MIN_ROWS / 2))
            .max(1);
        let bounds: Vec<usize> = (0..=parts).map(|p| p * n / parts).collect();
        let rows_of = |p: usize| {
            let (a, b) = (bounds[p], bounds[p + 1]);
            Rows {
                partition: input.partition,
                batch: input.batch.slice(a, b - a),
                times: &input.times[a..b],
                stamps: &input.stamps[a..b],
                origin: &input.origin[a..b],
            }
        };
        let (grid, eval, factory) = (self.grid, &self.eval, &self.factory);
        let open = &mut self.open;
        let partials = &mut self.partials[..parts - 1];
        std::thread::scope(|scope| {
            let workers: Vec<_> = partials
                .iter_mut()
                .enumerate()
                .map(|(w, partial)| {
                    let rows = rows_of(w + 1);
                    scope.spawn(move || fold_rows(grid, eval, factory, partial, &rows))
                })
                .collect();
            let mut results = Vec::with_capacity(parts);
            let (rejects, late) = fold_rows(grid, eval, factory, open, &rows_of(0))?;
            results.push((0, rejects, late));
            for (w, worker) in workers.into_iter().enumerate() {
                let (rejects, late) = worker
                    .join()
                    .map_err(|_| EngineError::internal("a fold thread panicked"))??;
                results.push((bounds[w + 1], rejects, late));
            }
            Ok(results)
        })
    }

    fn close(&mut self, start: i64, out: &mut Output) -> Result<()> {
        let Some(mut state) = self.open.remove(&start) else {
            return Ok(());
        };
        let end = start + self.grid.size;
        let n = state.len();
        let (keys, values) = if self.grid.retention > 0 {
            let all: Vec<usize> = (0..n).collect();
            (state.keys(&all)?, state.evaluate(&all)?)
        } else {
            state.drain_all()?
        };
        let rows = StageRows {
            keys,
            window: Some((vec![start; n], vec![end; n])),
            values,
            timestamps: vec![end; n],
            visible: vec![false; n],
            retract: Vec::new(),
        };
        let (batch, visible) = self.emitter.emit(rows)?;
        out.changes.extend(batch);
        if self.grid.retention > 0 {
            let all: Vec<usize> = (0..n).collect();
            state.set_visible(&all, &visible);
            state.set_track_dirty(true);
            self.closed.insert(start, state);
        }
        Ok(())
    }

    fn apply_late(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let batches = self.pending.take(tick);
        if batches.is_empty() {
            return Ok(());
        }
        let mut touched: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
        for p in batches {
            let keys = self.eval.keys(&p.batch)?;
            let inputs = self.eval.inputs(&p.batch)?;
            let mut by_start: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
            for (i, &s) in p.values.iter().enumerate() {
                by_start.entry(s).or_default().push(i as u32);
            }
            for (start, rows) in by_start {
                if !self.closed.contains_key(&start) {
                    let mut s = self.new_state()?;
                    s.set_track_dirty(true);
                    self.closed.insert(start, s);
                }
                let state = self.closed.get_mut(&start).expect("inserted");
                let idx = UInt32Array::from(rows);
                let k = super::emit::take_all(&keys, &idx)?;
                let inp = inputs.take(&idx)?;
                state.update(&k, idx.len(), &inp, None)?;
                touched.insert(start);
            }
        }
        let mut stage = StageRows::default();
        let mut groups_by_window = Vec::new();
        for &start in &touched {
            let state = self.closed.get_mut(&start).expect("touched");
            let groups = state.take_dirty();
            let n = groups.len();
            let end = start + self.grid.size;
            stage.append(StageRows {
                keys: state.keys(&groups)?,
                window: Some((vec![start; n], vec![end; n])),
                values: state.evaluate(&groups)?,
                timestamps: vec![end; n],
                visible: state.visible(&groups),
                retract: Vec::new(),
            })?;
            groups_by_window.push((start, groups));
        }
        let (batch, visible) = self.emitter.emit(stage)?;
        out.changes.extend(batch);
        let mut offset = 0;
        for (start, groups) in groups_by_window {
            let state = self.closed.get_mut(&start).expect("touched");
            state.set_visible(&groups, &visible[offset..offset + groups.len()]);
            offset += groups.len();
        }
        Ok(())
    }
}

impl Operator for WindowOperator {
    fn process_batch(&mut self, input: StampedBatch, out: &mut Output) -> Result<()> {
        if input.batch.num_rows() == 0 {
            return Ok(());
        }
        for (offset, rejects, late) in self.fold_parallel(&input)? {
            out.rejects.extend(rejects);
            for (tick, (rows, starts)) in late {
                let idx =
                    UInt32Array::from_iter_values(rows.into_iter().map(|r| r + offset as u32));
                let batch = take_record_batch(&input.batch, &idx)?;
                self.pending.push(
                    tick,
                    PendingPart {
                        partition: input.partition,
                        batch,
                        values: starts,
                    },
                );
            }
        }
        Ok(())
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        // Windows ending at or before the watermark close now: read them whole.
        self.merge_partials(watermark.saturating_sub(self.grid.size).saturating_add(1))?;
        loop {
            let next_close = self.open.keys().next().map(|s| s + self.grid.size);
            let next_tick = self.pending.first_tick();
            let Some(next) = next_close.into_iter().chain(next_tick).min() else {
                break;
            };
            if next > watermark {
                break;
            }
            if next_close == Some(next) {
                let start = next - self.grid.size;
                self.close(start, out)?;
            } else {
                self.apply_late(next, out)?;
            }
        }
        // Late rows for a window arrive with stamps below end + retention, so
        // they are all applied by end + retention + one grid step.
        let horizon = self.grid.retention.saturating_add(self.grid.emit_interval);
        let size = self.grid.size;
        self.closed
            .retain(|&start, _| (start + size).saturating_add(horizon) > watermark);
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        self.merge_partials(i64::MAX)?;
        let mut batches = Vec::new();
        for (start, state) in self.open.iter_mut() {
            batches.push((StateEntry::Open(*start), state.snapshot()?));
        }
        for (start, state) in self.closed.iter_mut() {
            batches.push((StateEntry::Closed(*start), state.snapshot()?));
        }
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Open(start) => {
                    let mut state = self.new_state()?;
                    state.restore(&batch)?;
                    self.open.insert(start, state);
                }
                StateEntry::Closed(start) => {
                    let mut state = self.new_state()?;
                    state.restore(&batch)?;
                    state.set_track_dirty(true);
                    self.closed.insert(start, state);
                }
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("window")),
            }
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.open
            .values()
            .chain(self.partials.iter().flat_map(|p| p.values()))
            .chain(self.closed.values())
            .map(|s| s.size())
            .sum::<usize>()
            + self.pending.size()
    }

    /// Groups held; a key folded on several threads counts once per thread
    /// until its window closes.
    fn state_keys(&self) -> usize {
        self.open
            .values()
            .chain(self.partials.iter().flat_map(|p| p.values()))
            .chain(self.closed.values())
            .map(|s| s.len())
            .sum()
    }
}
