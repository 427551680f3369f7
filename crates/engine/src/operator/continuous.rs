//! Continuous (non-windowed) GROUP BY: one [`KeyedState`] for the life of
//! the query; at every point of the emit grid the keys that changed are
//! emitted as upserts, and a key that stops satisfying HAVING is retracted.
//!
//! Rows are queued by the grid point after their stamp and folded in only
//! when the global watermark passes that point, all partitions' rows of one
//! point together in partition order. So each emission contains exactly the
//! rows stamped before its grid point, however partitions interleave.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};

use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{AggregatePlan, EventTime, QueryOptions};
use crate::state::KeyedState;
use crate::time::next_tick;

struct Pending {
    partition: u32,
    batch: RecordBatch,
    times: Vec<i64>,
}

pub struct ContinuousOperator {
    grid: i64,
    has_event_time: bool,
    eval: AggEvaluator,
    emitter: Emitter,
    state: KeyedState,
    source_schema: SchemaRef,
    pending: BTreeMap<i64, Vec<Pending>>,
}

impl ContinuousOperator {
    pub fn new(
        plan: &AggregatePlan,
        options: &QueryOptions,
        emitter: Emitter,
        source_schema: SchemaRef,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.event_time, EventTime::Column(_));
        let grid = if has_event_time {
            options.emit_interval_us
        } else {
            options.emit_every_rows
        }
        .max(1);
        Ok(Self {
            grid,
            has_event_time,
            eval: AggEvaluator::new(plan),
            emitter,
            state: KeyedState::new(&plan.group_fields, &plan.aggregates, true, has_event_time)?,
            source_schema,
            pending: BTreeMap::new(),
        })
    }

    fn flush(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let Some(mut list) = self.pending.remove(&tick) else {
            return Ok(());
        };
        list.sort_by_key(|p| p.partition);
        for p in &list {
            let keys = self.eval.keys(&p.batch)?;
            let inputs = self.eval.inputs(&p.batch)?;
            let times = self.has_event_time.then_some(p.times.as_slice());
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

    fn pending_schema(&self) -> SchemaRef {
        let mut fields: Vec<FieldRef> = self.source_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new("__time", DataType::Int64, false)));
        Arc::new(Schema::new(fields))
    }
}

impl Operator for ContinuousOperator {
    fn process_batch(&mut self, input: StampedBatch, _out: &mut Output) -> Result<()> {
        let n = input.batch.num_rows();
        // Stamps never decrease within a partition, so rows of one grid point are a run.
        let mut start = 0;
        while start < n {
            let tick = next_tick(input.stamps[start], self.grid);
            let mut end = start + 1;
            while end < n && next_tick(input.stamps[end], self.grid) == tick {
                end += 1;
            }
            self.pending.entry(tick).or_default().push(Pending {
                partition: input.partition,
                batch: input.batch.slice(start, end - start),
                times: input.times[start..end].to_vec(),
            });
            start = end;
        }
        Ok(())
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        while let Some(&tick) = self.pending.keys().next() {
            if tick > watermark {
                break;
            }
            self.flush(tick, out)?;
        }
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let mut batches = vec![("state".to_string(), self.state.snapshot()?)];
        let schema = self.pending_schema();
        for (tick, list) in &self.pending {
            for (i, p) in list.iter().enumerate() {
                let mut cols = p.batch.columns().to_vec();
                cols.push(Arc::new(Int64Array::from(p.times.clone())));
                batches.push((
                    format!("pending/{tick}/{i}/{}", p.partition),
                    RecordBatch::try_new(Arc::clone(&schema), cols)?,
                ));
            }
        }
        Ok(OperatorSnapshot {
            batches,
            meta: serde_json::Value::Null,
        })
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (name, batch) in snapshot.batches {
            let parts: Vec<&str> = name.split('/').collect();
            let bad = || EngineError::Checkpoint(format!("bad state entry name {name}"));
            match parts.as_slice() {
                ["state"] => self.state.restore(&batch)?,
                ["pending", tick, _, partition] => {
                    let k = batch.num_columns() - 1;
                    let times = batch
                        .column(k)
                        .as_primitive::<Int64Type>()
                        .values()
                        .to_vec();
                    let rows = RecordBatch::try_new(
                        Arc::clone(&self.source_schema),
                        batch.columns()[..k].to_vec(),
                    )?;
                    self.pending
                        .entry(tick.parse().map_err(|_| bad())?)
                        .or_default()
                        .push(Pending {
                            partition: partition.parse().map_err(|_| bad())?,
                            batch: rows,
                            times,
                        });
                }
                _ => return Err(bad()),
            }
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.state.size()
            + self
                .pending
                .values()
                .flatten()
                .map(|p| p.batch.get_array_memory_size() + p.times.len() * 8)
                .sum::<usize>()
    }

    fn state_keys(&self) -> usize {
        self.state.len()
    }
}
