//! An aggregation over a continuous aggregation ([`RegroupPlan`]).
//!
//! The inner aggregation runs as a continuous one: rows are queued by the
//! grid point after their stamp and folded in when the watermark passes
//! it. At each grid point the inner groups the point's rows touch give
//! their result row before and after the rows are folded in: the old row
//! is retracted from its outer group and the new one added. An inner
//! group's `visible` flag says whether its result row is folded into the
//! outer aggregation (it is not while it fails HAVING), so no copy of the
//! row is kept: evaluating a group's state gives the same row again. The
//! outer aggregates are exact (counts, exact float sums), so retracting and
//! adding in any order gives the same bits. The outer groups then emit as a
//! continuous aggregation does; the outer plan's last aggregate is a
//! hidden count of inner rows, and a group left without any is retracted
//! and dropped.
//!
//! With a state store, both keyed states live in its tables `inner` and
//! `outer`: cold groups are evicted under the memory budget, and a
//! checkpoint writes the groups changed since the last one. Rows emitted
//! follow the order in which the grid point's rows first touch their
//! groups, never the groups' places in memory, so the output does not
//! depend on what was evicted.

use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{Int64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::continuous::flush_grid;
use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{EventTime, QueryOptions, RegroupPlan};
use crate::state::keyed::Evicted;
use crate::state::{KeyedState, PendingRows, SharedStore, StateEntry};

pub struct RegroupOperator {
    grid: i64,
    has_event_time: bool,
    inner_eval: AggEvaluator,
    /// Computes the inner result rows (HAVING and SELECT), unordered.
    inner_results: Emitter,
    inner: KeyedState,
    /// Compares an inner group's result rows before and after a grid point.
    rows: RowConverter,
    outer_eval: AggEvaluator,
    outer_emitter: Emitter,
    outer: KeyedState,
    /// The store behind both states outlives the process: checkpoints
    /// write the changed groups there, not into the snapshot.
    store_durable: bool,
    pending: PendingRows,
    /// All false between grid points: marks the inner groups a point touches.
    seen: Vec<bool>,
}

/// The result rows of some inner groups: which of them are folded into
/// the outer aggregation, and their event times.
struct InnerRows {
    results: RecordBatch,
    /// Row `i` passes HAVING.
    pass: Vec<bool>,
    times: Vec<i64>,
}

impl RegroupOperator {
    pub fn new(
        plan: &RegroupPlan,
        options: &QueryOptions,
        outer_emitter: Emitter,
        source_schema: SchemaRef,
        store: Option<&SharedStore>,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.inner.event_time, EventTime::Column(_));
        let grid = flush_grid(&plan.inner.event_time, options);
        let fields = plan
            .inner_schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let mut inner = KeyedState::new(
            &plan.inner.group_fields,
            &plan.inner.aggregates,
            true,
            has_event_time,
        )?;
        let mut outer = KeyedState::new(
            &plan.outer.group_fields,
            &plan.outer.aggregates,
            true,
            has_event_time,
        )?;
        if let Some(store) = store {
            inner = inner.with_store(store.clone(), "inner")?;
            outer = outer.with_store(store.clone(), "outer")?;
        }
        let mut pending = PendingRows::new(source_schema, "__time");
        pending.log_to(store, "pending")?;
        Ok(Self {
            grid,
            has_event_time,
            inner_eval: AggEvaluator::new(&plan.inner),
            inner_results: Emitter::new(&plan.inner, Arc::clone(&plan.inner_schema), Vec::new()),
            inner,
            rows: RowConverter::new(fields)?,
            outer_eval: AggEvaluator::new(&plan.outer),
            outer_emitter,
            outer,
            store_durable: store.is_some_and(SharedStore::is_durable),
            pending,
            seen: Vec::new(),
        })
    }

    /// Whether checkpoints keep the groups in the store.
    fn groups_in_store(&self) -> bool {
        self.inner.has_store() && self.store_durable
    }

    fn flush(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let mut list = self.pending.take(tick);
        if list.is_empty() {
            return Ok(());
        }
        list.sort_by_key(|p| p.partition);
        // Every row's group first (loading stored groups), so each touched
        // group's row can be read before anything is folded in.
        let mut grouped = Vec::with_capacity(list.len());
        for p in &list {
            let keys = self.inner_eval.keys(&p.batch)?;
            grouped.push(self.inner.groups_of(&keys, p.batch.num_rows())?);
        }
        let mut touched = Vec::new();
        self.seen.resize(self.inner.len(), false);
        for &g in grouped.iter().flatten() {
            if !std::mem::replace(&mut self.seen[g], true) {
                touched.push(g);
            }
        }
        for &g in &touched {
            self.seen[g] = false;
        }
        // The rows folded into the outer aggregation now.
        let visible = self.inner.visible(&touched);
        let was: Vec<u32> = (0..touched.len() as u32)
            .filter(|&i| visible[i as usize])
            .collect();
        let folded: Vec<usize> = was.iter().map(|&i| touched[i as usize]).collect();
        let before = self.inner_rows(&folded)?;
        for (p, groups) in list.iter().zip(&grouped) {
            let inputs = self.inner_eval.inputs(&p.batch)?;
            let times = self.has_event_time.then_some(p.values.as_slice());
            self.inner.fold_into(groups, &inputs, times)?;
        }
        // Grid points are folded whole: the dirty set is `touched`.
        self.inner.take_dirty();
        let after = self.inner_rows(&touched)?;
        self.inner.set_visible(&touched, &after.pass);

        // Compare each touched group's row before and after.
        let old = self.rows.convert_columns(before.results.columns())?;
        let new = self.rows.convert_columns(after.results.columns())?;
        let mut old_at = vec![None; touched.len()];
        for (j, &i) in was.iter().enumerate() {
            old_at[i as usize] = Some(j);
        }
        let (mut retracted, mut added, mut added_times) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &at) in old_at.iter().enumerate() {
            let now = after.pass[i].then(|| new.row(i));
            let then = at.map(|j| old.row(j));
            if then == now {
                continue;
            }
            if let Some(j) = at {
                retracted.push(j as u32);
            }
            if now.is_some() {
                added.push(i as u32);
                added_times.push(after.times[i]);
            }
        }
        if !retracted.is_empty() {
            let batch = take_record_batch(&before.results, &UInt32Array::from(retracted))?;
            let keys = self.outer_eval.keys(&batch)?;
            let inputs = self.outer_eval.inputs(&batch)?;
            self.outer.retract(&keys, batch.num_rows(), &inputs)?;
        }
        if !added.is_empty() {
            let batch = take_record_batch(&after.results, &UInt32Array::from(added))?;
            let keys = self.outer_eval.keys(&batch)?;
            let inputs = self.outer_eval.inputs(&batch)?;
            let times = self.has_event_time.then_some(added_times.as_slice());
            self.outer.update(&keys, batch.num_rows(), &inputs, times)?;
        }
        self.emit_outer(out)
    }

    /// The result rows of inner `groups`, and whether each passes HAVING.
    fn inner_rows(&mut self, groups: &[usize]) -> Result<InnerRows> {
        let stage = StageRows {
            keys: self.inner.keys(groups)?,
            window: None,
            values: self.inner.evaluate(groups)?,
            timestamps: self.inner.max_time(groups),
            visible: Vec::new(),
            retract: Vec::new(),
        };
        let (results, pass) = self.inner_results.results(&stage)?;
        let pass = match pass {
            Some(p) => (0..p.len()).map(|i| p.is_valid(i) && p.value(i)).collect(),
            None => vec![true; groups.len()],
        };
        Ok(InnerRows {
            results,
            pass,
            times: stage.timestamps,
        })
    }

    fn emit_outer(&mut self, out: &mut Output) -> Result<()> {
        let groups = self.outer.take_dirty();
        if groups.is_empty() {
            return Ok(());
        }
        let mut values = self.outer.evaluate(&groups)?;
        let members = values.pop().expect("the hidden row count");
        let emptied: Vec<bool> = members
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&n| n <= 0)
            .collect();
        let rows = StageRows {
            keys: self.outer.keys(&groups)?,
            window: None,
            values,
            timestamps: self.outer.max_time(&groups),
            visible: self.outer.visible(&groups),
            retract: emptied.clone(),
        };
        let (batch, visible) = self.outer_emitter.emit(rows)?;
        self.outer.set_visible(&groups, &visible);
        out.changes.extend(batch);
        let mut gone: Vec<usize> = groups
            .iter()
            .zip(&emptied)
            .filter(|(_, e)| **e)
            .map(|(&g, _)| g)
            .collect();
        if !gone.is_empty() {
            gone.sort_unstable();
            self.outer.delete_groups(&gone)?;
        }
        Ok(())
    }
}

impl Operator for RegroupOperator {
    fn process_batch(&mut self, input: StampedBatch, _out: &mut Output) -> Result<()> {
        self.pending.push_runs(
            input.partition,
            &input.batch,
            &input.stamps,
            &input.times,
            self.grid,
        );
        Ok(())
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        while let Some(tick) = self.pending.due(watermark) {
            self.flush(tick, out)?;
        }
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let mut batches = Vec::new();
        if self.groups_in_store() {
            self.inner.persist()?;
            self.outer.persist()?;
        } else {
            batches.push((StateEntry::Groups, self.inner.snapshot_all()?));
            batches.push((StateEntry::Regroups, self.outer.snapshot_all()?));
        }
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Groups => self.inner.restore(&batch)?,
                StateEntry::Regroups => self.outer.restore(&batch)?,
                StateEntry::Folded => {
                    return Err(EngineError::Checkpoint(
                        "this checkpoint of an aggregation over an aggregation was written by an older ubik, which kept the inner result rows apart (`folded`); this build keeps them in the inner groups. Resume it with the release that wrote it, or start the pipeline with a new checkpoint directory (it then reads its sources from their configured start)".into(),
                    ));
                }
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("regroup")),
            }
        }
        self.pending.store_restored()?;
        self.inner.store_restored()?;
        self.outer.store_restored()
    }

    fn state_size(&self) -> usize {
        self.inner.size() + self.outer.size() + self.pending.size()
    }

    /// Each state keeps its share of `target`.
    fn spill(&mut self, target: usize) -> Result<Evicted> {
        let target = target.saturating_sub(self.pending.size());
        let (inner, outer) = (self.inner.size(), self.outer.size());
        let held = inner + outer;
        if held <= target {
            return Ok(Evicted::default());
        }
        let share = |part: usize| (target as f64 * part as f64 / held as f64) as usize;
        let mut done = self.inner.evict(share(inner))?;
        done += self.outer.evict(share(outer))?;
        Ok(done)
    }

    fn state_keys(&self) -> usize {
        self.inner.len() + self.outer.len()
    }
}
