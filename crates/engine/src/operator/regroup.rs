//! An aggregation over a continuous aggregation ([`RegroupPlan`]).
//!
//! The inner aggregation runs as a continuous one: rows are queued by the
//! grid point after their stamp and folded in when the watermark passes
//! it. At each grid point the inner groups that changed give their new
//! result rows; each inner group's last row folded into the outer
//! aggregation is kept (in Arrow's row format), retracted from its outer
//! group and replaced by the new one. The outer aggregates are exact
//! (counts, exact float sums), so retracting and adding in any order gives
//! the same bits: the outer groups then emit as a continuous aggregation
//! does, and a group left without inner rows is retracted.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};

use super::continuous::flush_grid;
use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{EventTime, QueryOptions, RegroupPlan};
use crate::state::{KeyedState, PendingRows, StateEntry};

pub struct RegroupOperator {
    grid: i64,
    has_event_time: bool,
    inner_eval: AggEvaluator,
    /// Computes the inner result rows (HAVING and SELECT), unordered.
    inner_results: Emitter,
    inner: KeyedState,
    /// Per inner group, its result row last folded into the outer
    /// aggregation (`None`: none, or it failed HAVING).
    folded: Vec<Option<Box<[u8]>>>,
    rows: RowConverter,
    inner_schema: SchemaRef,
    outer_eval: AggEvaluator,
    outer_emitter: Emitter,
    outer: KeyedState,
    /// Per outer group, how many inner rows it holds.
    members: Vec<i64>,
    pending: PendingRows,
}

impl RegroupOperator {
    pub fn new(
        plan: &RegroupPlan,
        options: &QueryOptions,
        outer_emitter: Emitter,
        source_schema: SchemaRef,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.inner.event_time, EventTime::Column(_));
        let grid = flush_grid(&plan.inner.event_time, options);
        let fields = plan
            .inner_schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            grid,
            has_event_time,
            inner_eval: AggEvaluator::new(&plan.inner),
            inner_results: Emitter::new(&plan.inner, Arc::clone(&plan.inner_schema), Vec::new()),
            inner: KeyedState::new(
                &plan.inner.group_fields,
                &plan.inner.aggregates,
                true,
                has_event_time,
            )?,
            folded: Vec::new(),
            rows: RowConverter::new(fields)?,
            inner_schema: Arc::clone(&plan.inner_schema),
            outer_eval: AggEvaluator::new(&plan.outer),
            outer_emitter,
            outer: KeyedState::new(
                &plan.outer.group_fields,
                &plan.outer.aggregates,
                true,
                has_event_time,
            )?,
            members: Vec::new(),
            pending: PendingRows::new(source_schema, "__time"),
        })
    }

    fn flush(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let mut list = self.pending.take(tick);
        if list.is_empty() {
            return Ok(());
        }
        list.sort_by_key(|p| p.partition);
        for p in &list {
            let keys = self.inner_eval.keys(&p.batch)?;
            let inputs = self.inner_eval.inputs(&p.batch)?;
            let times = self.has_event_time.then_some(p.values.as_slice());
            self.inner
                .update(&keys, p.batch.num_rows(), &inputs, times)?;
        }
        let changed = self.inner.take_dirty();
        if changed.is_empty() {
            return Ok(());
        }
        let stage = StageRows {
            keys: self.inner.keys(&changed)?,
            window: None,
            values: self.inner.evaluate(&changed)?,
            timestamps: self.inner.max_time(&changed),
            visible: Vec::new(),
            retract: Vec::new(),
        };
        let (results, pass) = self.inner_results.results(&stage)?;
        let encoded = self.rows.convert_columns(results.columns())?;
        let times = &stage.timestamps;
        if self.folded.len() < self.inner.len() {
            self.folded.resize(self.inner.len(), None);
        }
        let mut retracted: Vec<Box<[u8]>> = Vec::new();
        let (mut added, mut added_times) = (Vec::new(), Vec::new());
        for (i, &g) in changed.iter().enumerate() {
            let new = pass
                .as_ref()
                .is_none_or(|p| p.is_valid(i) && p.value(i))
                .then(|| encoded.row(i));
            let old = &mut self.folded[g];
            if old.as_deref() == new.as_ref().map(|r| r.as_ref()) {
                continue;
            }
            if let Some(o) = old.take() {
                retracted.push(o);
            }
            if let Some(r) = new {
                *old = Some(r.as_ref().into());
                added.push(i as u32);
                added_times.push(times[i]);
            }
        }
        if !retracted.is_empty() {
            let parser = self.rows.parser();
            let columns = self
                .rows
                .convert_rows(retracted.iter().map(|r| parser.parse(r)))?;
            let batch = RecordBatch::try_new(Arc::clone(&self.inner_schema), columns)?;
            self.fold_outer(&batch, None, -1)?;
        }
        if !added.is_empty() {
            let batch = take_record_batch(&results, &UInt32Array::from(added))?;
            self.fold_outer(&batch, Some(&added_times), 1)?;
        }
        self.emit_outer(out)
    }

    /// Folds inner result rows into (`sign` 1) or out of (-1) their outer groups.
    fn fold_outer(&mut self, batch: &RecordBatch, times: Option<&[i64]>, sign: i64) -> Result<()> {
        let n = batch.num_rows();
        let keys = self.outer_eval.keys(batch)?;
        let inputs = self.outer_eval.inputs(batch)?;
        let groups = if sign > 0 {
            let times = times.filter(|_| self.has_event_time);
            self.outer.update(&keys, n, &inputs, times)?;
            self.outer.groups_of(&keys, n)?
        } else {
            self.outer.retract(&keys, n, &inputs)?
        };
        if self.members.len() < self.outer.len() {
            self.members.resize(self.outer.len(), 0);
        }
        for g in groups {
            self.members[g] += sign;
        }
        Ok(())
    }

    fn emit_outer(&mut self, out: &mut Output) -> Result<()> {
        let mut groups = self.outer.take_dirty();
        if groups.is_empty() {
            return Ok(());
        }
        groups.sort_unstable();
        let rows = StageRows {
            keys: self.outer.keys(&groups)?,
            window: None,
            values: self.outer.evaluate(&groups)?,
            timestamps: self.outer.max_time(&groups),
            visible: self.outer.visible(&groups),
            retract: groups.iter().map(|&g| self.members[g] == 0).collect(),
        };
        let (batch, visible) = self.outer_emitter.emit(rows)?;
        self.outer.set_visible(&groups, &visible);
        out.changes.extend(batch);
        Ok(())
    }

    /// Every inner group's folded row: the group index, then the row
    /// (nulls where none), then whether there is one.
    fn folded_batch(&self) -> Result<RecordBatch> {
        let present: Vec<usize> = (0..self.folded.len())
            .filter(|&g| self.folded[g].is_some())
            .collect();
        let parser = self.rows.parser();
        let columns = self.rows.convert_rows(
            present
                .iter()
                .map(|&g| parser.parse(self.folded[g].as_deref().expect("present"))),
        )?;
        let mut all: Vec<ArrayRef> = vec![Arc::new(arrow::array::UInt64Array::from_iter_values(
            present.iter().map(|&g| g as u64),
        ))];
        all.extend(columns);
        Ok(RecordBatch::try_new(self.folded_schema(), all)?)
    }

    fn folded_schema(&self) -> SchemaRef {
        let mut fields = vec![Arc::new(arrow::datatypes::Field::new(
            "__group",
            arrow::datatypes::DataType::UInt64,
            false,
        ))];
        fields.extend(
            self.inner_schema
                .fields()
                .iter()
                .map(|f| Arc::new(f.as_ref().clone().with_nullable(true))),
        );
        Arc::new(arrow::datatypes::Schema::new(fields))
    }

    fn restore_folded(&mut self, batch: &RecordBatch) -> Result<()> {
        let groups = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow::array::UInt64Array>()
            .ok_or_else(|| EngineError::Checkpoint("regroup state: bad __group column".into()))?;
        let rows = RecordBatch::try_new(
            Arc::clone(&self.inner_schema),
            batch.columns()[1..].to_vec(),
        )?;
        let encoded = self.rows.convert_columns(rows.columns())?;
        for i in 0..batch.num_rows() {
            let g = groups.value(i) as usize;
            if self.folded.len() <= g {
                self.folded.resize(g + 1, None);
            }
            self.folded[g] = Some(encoded.row(i).as_ref().into());
        }
        // Each outer group's member count, from the rows folded into it.
        let keys = self.outer_eval.keys(&rows)?;
        let outer = self.outer.groups_of(&keys, rows.num_rows())?;
        self.members = vec![0; self.outer.len()];
        for g in outer {
            self.members[g] += 1;
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
        let mut batches = vec![
            (StateEntry::Groups, self.inner.snapshot()?),
            (StateEntry::Folded, self.folded_batch()?),
            (StateEntry::Regroups, self.outer.snapshot()?),
        ];
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        let mut folded = None;
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Groups => self.inner.restore(&batch)?,
                StateEntry::Regroups => self.outer.restore(&batch)?,
                StateEntry::Folded => folded = Some(batch),
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("regroup")),
            }
        }
        // After the outer groups, so member counts find them.
        if let Some(b) = folded {
            self.restore_folded(&b)?;
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.inner.size()
            + self.outer.size()
            + self
                .folded
                .iter()
                .map(|r| r.as_ref().map_or(0, |r| r.len()) + 16)
                .sum::<usize>()
            + self.pending.size()
    }

    fn state_keys(&self) -> usize {
        self.inner.len() + self.outer.len()
    }
}
