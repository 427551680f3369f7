//! Continuous (non-windowed) GROUP BY: one [`KeyedState`] for the life of
//! the query; at every point of the emit grid the keys that changed are
//! emitted as upserts, and a key that stops satisfying HAVING is retracted.
//!
//! Rows are queued by the grid point after their stamp and folded in only
//! when the global watermark passes that point, all partitions' rows of one
//! point together in partition order. So each emission contains exactly the
//! rows stamped before its grid point, however partitions interleave.

use arrow::datatypes::SchemaRef;

use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::Result;
use crate::plan::{AggregatePlan, EventTime, QueryOptions};
use crate::state::{KeyedState, PendingRows, StateEntry};

/// The grid continuous stages flush on: the emit interval of event time,
/// or every so many rows of a query without event time.
pub(crate) fn flush_grid(event_time: &EventTime, options: &QueryOptions) -> i64 {
    match event_time {
        EventTime::Column(_) => options.emit_interval_us,
        EventTime::Ordinal => options.emit_every_rows,
    }
    .max(1)
}

pub struct ContinuousOperator {
    grid: i64,
    has_event_time: bool,
    eval: AggEvaluator,
    emitter: Emitter,
    state: KeyedState,
    pending: PendingRows,
}

impl ContinuousOperator {
    pub fn new(
        plan: &AggregatePlan,
        options: &QueryOptions,
        emitter: Emitter,
        source_schema: SchemaRef,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.event_time, EventTime::Column(_));
        let grid = flush_grid(&plan.event_time, options);
        Ok(Self {
            grid,
            has_event_time,
            eval: AggEvaluator::new(plan),
            emitter,
            state: KeyedState::new(&plan.group_fields, &plan.aggregates, true, has_event_time)?,
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
            let keys = self.eval.keys(&p.batch)?;
            let inputs = self.eval.inputs(&p.batch)?;
            let times = self.has_event_time.then_some(p.values.as_slice());
            self.state
                .update(&keys, p.batch.num_rows(), &inputs, times)?;
        }
        let groups = self.state.take_dirty();
        if groups.is_empty() {
            return Ok(());
        }
        let rows = StageRows {
            keys: self.state.keys(&groups)?,
            window: None,
            values: self.state.evaluate(&groups)?,
            timestamps: self.state.max_time(&groups),
            visible: self.state.visible(&groups),
            retract: Vec::new(),
        };
        let (batch, visible) = self.emitter.emit(rows)?;
        self.state.set_visible(&groups, &visible);
        out.changes.extend(batch);
        Ok(())
    }
}

impl Operator for ContinuousOperator {
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
        let mut batches = vec![(StateEntry::Groups, self.state.snapshot()?)];
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Groups => self.state.restore(&batch)?,
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("continuous")),
            }
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.state.size() + self.pending.size()
    }

    fn state_keys(&self) -> usize {
        self.state.len()
    }
}
