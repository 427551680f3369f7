//! TUMBLE and HOP windows: one [`KeyedState`] per window, created by its
//! first row, emitted when the watermark passes its end, then kept for the
//! retention bound so late rows can update it.
//!
//! With a state store, each window's state has a table of its own
//! (`window/<start>`): under the memory budget the closed windows (touched
//! only by late rows) are evicted first, then the open windows' least
//! recently used groups. A window that closes is read back whole (its
//! groups are emitted together, in key order), and its table is dropped
//! once the window is gone. With a durable store, a checkpoint writes a
//! window's changed groups to its table once the window is in the store
//! or large; small windows are written whole into the checkpoint.
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
use crate::state::keyed::Evicted;
use crate::state::{KeyedState, PendingPart, PendingRows, SharedStore, StateEntry};
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

/// Prefix of the store tables of a query's windows (a join side's windows
/// add the side's path before it).
pub const TABLE_FAMILY: &str = "window/";

/// Above this size a window's state goes to the durable store at a
/// checkpoint (its changes from then on) rather than whole into it.
const INLINE_STATE_LIMIT: usize = 4 << 20;

/// Creates the empty state of one window.
struct StateFactory {
    key_fields: Vec<FieldRef>,
    specs: Vec<AggregateSpec>,
    /// The store, and the prefix of the windows' table names in it.
    store: Option<(SharedStore, String)>,
}

impl StateFactory {
    /// The state of the window starting at `start`: with the store behind
    /// it when there is one, unless it is a thread's partial state (`None`).
    fn create(&self, start: Option<i64>) -> Result<KeyedState> {
        let state = KeyedState::new(&self.key_fields, &self.specs, false, false)?;
        match (&self.store, start) {
            (Some((store, family)), Some(start)) => {
                state.with_store(store.clone(), &format!("{family}{start}"))
            }
            _ => Ok(state),
        }
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
    backed: bool,
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
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(factory.create(backed.then_some(start))?)
                }
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
        store: Option<(&SharedStore, String)>,
    ) -> Result<Self> {
        let (size, slide) = match plan.window {
            Some(WindowSpec::Tumble { size }) => (size, size),
            Some(WindowSpec::Hop { slide, size }) => (size, slide),
            _ => return Err(EngineError::internal("window operator without TUMBLE/HOP")),
        };
        if let Some((store, family)) = store.as_ref().filter(|(s, _)| s.is_durable()) {
            // Declared before a restore, which brings the windows' tables back.
            let values = KeyedState::snapshot_schema(&plan.group_fields, &plan.aggregates)?;
            store.with(|s| Ok(s.table_family(family, values)?))?;
        }
        let mut pending = PendingRows::new(source_schema, "__window_start");
        if let Some((store, family)) = &store {
            // `join/0/window/` → `join/0/pending`.
            let path = family.strip_suffix(TABLE_FAMILY).unwrap_or(family);
            pending.log_to(Some(store), &format!("{path}pending"))?;
        }
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
                store: store.map(|(s, family)| (s.clone(), family)),
            },
            open: BTreeMap::new(),
            partials: (1..threads.max(1)).map(|_| BTreeMap::new()).collect(),
            closed: BTreeMap::new(),
            pending,
        })
    }

    fn new_state(&self, start: i64) -> Result<KeyedState> {
        self.factory.create(Some(start))
    }

    /// The state of the window at `start` from a checkpoint's `batch` (and
    /// the store, restored before).
    fn restored_state(&self, start: i64, batch: &RecordBatch) -> Result<KeyedState> {
        let mut state = self.new_state(start)?;
        state.restore(batch)?;
        state.store_restored()?;
        Ok(state)
    }

    /// Whether checkpoints may keep windows' groups in the store.
    fn store_durable(&self) -> bool {
        self.factory
            .store
            .as_ref()
            .is_some_and(|(s, _)| s.is_durable())
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
                    scope.spawn(move || fold_rows(grid, eval, factory, partial, false, &rows))
                })
                .collect();
            let mut results = Vec::with_capacity(parts);
            let (rejects, late) = fold_rows(grid, eval, factory, open, true, &rows_of(0))?;
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
        state.load_all()?;
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
        } else {
            state.drop_store()?;
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
                    let mut s = self.new_state(start)?;
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
        while let Some(mut entry) = self.closed.first_entry() {
            if (entry.key() + size).saturating_add(horizon) > watermark {
                break;
            }
            entry.get_mut().drop_store()?;
            entry.remove();
        }
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        self.merge_partials(i64::MAX)?;
        let mut batches = Vec::new();
        let durable = self.store_durable();
        let open = self.open.iter_mut().map(|(s, w)| (StateEntry::Open(*s), w));
        let closed = self
            .closed
            .iter_mut()
            .map(|(s, w)| (StateEntry::Closed(*s), w));
        for (entry, state) in open.chain(closed) {
            let batch = if durable && (state.in_store() || state.size() >= INLINE_STATE_LIMIT) {
                state.persist()?;
                state.empty_snapshot()?
            } else {
                state.snapshot_all()?
            };
            batches.push((entry, batch));
        }
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Open(start) => {
                    let state = self.restored_state(start, &batch)?;
                    self.open.insert(start, state);
                }
                StateEntry::Closed(start) => {
                    let mut state = self.restored_state(start, &batch)?;
                    state.set_track_dirty(true);
                    self.closed.insert(start, state);
                }
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("window")),
            }
        }
        self.pending.store_restored()
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

    /// Moves closed windows (only late rows touch them) to the store
    /// first, then the open windows' least recently used groups, each
    /// window keeping its share of `target`.
    fn spill(&mut self, target: usize) -> Result<Evicted> {
        if self.factory.store.is_none() {
            return Ok(Evicted::default());
        }
        self.merge_partials(i64::MAX)?;
        let mut done = Evicted::default();
        let target = target.saturating_sub(self.pending.size());
        let open: usize = self.open.values().map(KeyedState::size).sum();
        let mut held = open + self.closed.values().map(KeyedState::size).sum::<usize>();
        for state in self.closed.values_mut() {
            if held <= target {
                return Ok(done);
            }
            let before = state.size();
            done += state.evict(0)?;
            held = held - before + state.size();
        }
        if held <= target || open == 0 {
            return Ok(done);
        }
        let share = (target.saturating_sub(held - open)) as f64 / open as f64;
        for state in self.open.values_mut() {
            done += state.evict((state.size() as f64 * share) as usize)?;
        }
        Ok(done)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;
    use crate::plan::QueryKind;
    use crate::sql::{Catalog, plan_query};
    use crate::state::SharedStore;

    const MINUTE: i64 = 60_000_000;

    fn input_schema() -> SchemaRef {
        let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new("ts", time, true),
            Field::new("amount", DataType::Float64, true),
        ]))
    }

    fn operator(store: Option<&SharedStore>) -> WindowOperator {
        let catalog = Catalog::new().with_table("orders", input_schema());
        let q = "SELECT merchant, HOP(ts, INTERVAL '1 MINUTE', INTERVAL '2 MINUTES') AS w, \
                 count(*) AS n, sum(amount) AS total FROM orders \
                 GROUP BY merchant, HOP(ts, INTERVAL '1 MINUTE', INTERVAL '2 MINUTES') \
                 HAVING count(*) < 4";
        let options = QueryOptions {
            retention_us: MINUTE,
            threads: 1,
            ..QueryOptions::default()
        };
        let plan = plan_query(q, &catalog, options).unwrap();
        let QueryKind::Aggregate(a) = &plan.kind else {
            panic!("an aggregation")
        };
        let emitter = Emitter::new(a, Arc::clone(&plan.output_schema), plan.key_columns.clone());
        WindowOperator::new(
            a,
            &plan.options,
            emitter,
            Arc::clone(&plan.input_schema),
            store.map(|s| (s, TABLE_FAMILY.to_string())),
        )
        .unwrap()
    }

    fn text(out: &Output) -> Vec<String> {
        let mut lines = Vec::new();
        for c in &out.changes {
            let t = arrow::util::pretty::pretty_format_batches(std::slice::from_ref(&c.rows));
            lines.push(format!("{}\n{:?}", t.unwrap(), c.deletes));
        }
        lines
    }

    /// Rounds of rows over 60 merchants (some late, for closed windows)
    /// into HOP windows whose every group goes to the store after each
    /// round, and into the same windows in memory: every emission is the
    /// same, and the tables of windows gone are dropped from the store.
    #[test]
    fn windows_spilled_after_every_round_emit_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let store = SharedStore::temporary(Some(dir.path().to_path_buf()), Default::default());
        let mut spilling = operator(Some(&store));
        let mut memory = operator(None);
        let schema = input_schema();
        let mut evicted = 0;
        for round in 0..12i64 {
            let n = 150;
            let merchant: Vec<String> = (0..n)
                .map(|i| format!("m{:02}", (i * 7 + round) % 60))
                .collect();
            // Event times 20 s apart per round; every fifth row 90 s behind.
            let times: Vec<i64> = (0..n)
                .map(|i| {
                    round * MINUTE / 3 + i * 1000 - if i % 5 == 0 { 3 * MINUTE / 2 } else { 0 }
                })
                .collect();
            let stamps = vec![round * MINUTE / 3 - MINUTE / 6; n as usize];
            let amount: Vec<f64> = (0..n).map(|i| ((i * 13 + round * 5) % 23) as f64).collect();
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringArray::from(merchant)),
                    Arc::new(TimestampMicrosecondArray::from(times.clone()).with_timezone("UTC")),
                    Arc::new(Float64Array::from(amount)),
                ],
            )
            .unwrap();
            let mut emitted = Vec::new();
            for op in [&mut spilling, &mut memory] {
                let mut out = Output::default();
                let input = StampedBatch {
                    partition: 0,
                    batch: batch.clone(),
                    times: times.clone(),
                    stamps: stamps.clone(),
                    origin: (0..n as u32).collect(),
                };
                op.process_batch(input, &mut out).unwrap();
                op.handle_watermark(stamps[0], &mut out).unwrap();
                emitted.push((text(&out), out.rejects.len()));
            }
            assert_eq!(emitted[0], emitted[1], "round {round}");
            evicted += spilling.spill(0).unwrap().groups;
            assert_eq!(
                spilling.state_keys(),
                0,
                "round {round}: every group left memory"
            );
        }
        assert!(evicted > 1000, "{evicted} groups evicted");
        let mut last = [Output::default(), Output::default()];
        spilling
            .handle_watermark(i64::MAX / 2, &mut last[0])
            .unwrap();
        memory.handle_watermark(i64::MAX / 2, &mut last[1]).unwrap();
        assert_eq!(text(&last[0]), text(&last[1]));
        let tables = store
            .if_open(|s| s.manifest())
            .expect("spills opened the store");
        assert!(
            tables.is_empty(),
            "tables of closed windows remain: {tables:?}"
        );
        // A merge of a dropped window's runs may still be running.
        store.with(|s| Ok(s.poll_compaction(true)?)).unwrap();
        let files = std::fs::read_dir(store.if_open(|s| s.dir().to_path_buf()).unwrap())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".arrow"))
            .count();
        assert_eq!(files, 0, "run files of dropped windows remain");
    }
}
