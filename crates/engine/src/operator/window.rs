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
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};

use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::{Operator, OperatorSnapshot, Output, Reject, RejectReason, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{AggregatePlan, AggregateSpec, QueryOptions, WindowSpec};
use crate::state::{AggInputs, KeyedState};
use crate::time::{floor_to, next_tick};

/// Late rows waiting for their grid point.
struct PendingLate {
    /// Source-schema rows (a row late for several HOP windows appears once per window).
    batch: RecordBatch,
    /// The window start each row is late for.
    starts: Vec<i64>,
}

pub struct WindowOperator {
    size: i64,
    slide: i64,
    retention: i64,
    emit_interval: i64,
    eval: AggEvaluator,
    emitter: Emitter,
    key_fields: Vec<FieldRef>,
    specs: Vec<AggregateSpec>,
    source_schema: SchemaRef,
    open: BTreeMap<i64, KeyedState>,
    closed: BTreeMap<i64, KeyedState>,
    pending: BTreeMap<i64, Vec<PendingLate>>,
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
        Ok(Self {
            size,
            slide,
            retention: options.retention_us.max(0),
            emit_interval: options.emit_interval_us.max(1),
            eval: AggEvaluator::new(plan),
            emitter,
            key_fields: plan.group_fields.clone(),
            specs: plan.aggregates.clone(),
            source_schema,
            open: BTreeMap::new(),
            closed: BTreeMap::new(),
            pending: BTreeMap::new(),
        })
    }

    fn new_state(&self) -> Result<KeyedState> {
        KeyedState::new(&self.key_fields, &self.specs, false, false)
    }

    /// Folds `rows` of the evaluated batch into the open window at `start`.
    fn update_open(
        &mut self,
        start: i64,
        rows: &[u32],
        total: usize,
        keys: &[ArrayRef],
        inputs: &AggInputs,
    ) -> Result<()> {
        if !self.open.contains_key(&start) {
            let s = self.new_state()?;
            self.open.insert(start, s);
        }
        let state = self.open.get_mut(&start).expect("inserted");
        if rows.len() == total {
            // Every row of the batch, in order: no copy.
            state.update(keys, total, inputs, None)
        } else {
            let idx = UInt32Array::from(rows.to_vec());
            let keys = super::emit::take_all(keys, &idx)?;
            let inputs = inputs.take(&idx)?;
            state.update(&keys, rows.len(), &inputs, None)
        }
    }

    fn windows_of(&self, t: i64, out: &mut Vec<i64>) {
        out.clear();
        let last = floor_to(t, self.slide);
        let mut start = last;
        while start > t - self.size {
            out.push(start);
            start -= self.slide;
        }
    }

    fn close(&mut self, start: i64, out: &mut Output) -> Result<()> {
        let Some(mut state) = self.open.remove(&start) else {
            return Ok(());
        };
        let end = start + self.size;
        let n = state.len();
        let (keys, values) = if self.retention > 0 {
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
        if self.retention > 0 {
            let all: Vec<usize> = (0..n).collect();
            state.set_visible(&all, &visible);
            state.set_track_dirty(true);
            self.closed.insert(start, state);
        }
        Ok(())
    }

    fn apply_late(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let Some(batches) = self.pending.remove(&tick) else {
            return Ok(());
        };
        let mut touched: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
        for p in batches {
            let keys = self.eval.keys(&p.batch)?;
            let inputs = self.eval.inputs(&p.batch)?;
            let mut by_start: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
            for (i, &s) in p.starts.iter().enumerate() {
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
            let end = start + self.size;
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

    fn pending_schema(&self) -> SchemaRef {
        let mut fields: Vec<FieldRef> = self.source_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(
            "__window_start",
            DataType::Int64,
            false,
        )));
        Arc::new(Schema::new(fields))
    }
}

impl Operator for WindowOperator {
    fn process_batch(&mut self, input: StampedBatch, out: &mut Output) -> Result<()> {
        let n = input.batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        // Classify each (row, window): on time, late within retention, or too late.
        let mut on_time: Vec<(i64, Vec<u32>)> = Vec::new();
        let mut late: BTreeMap<i64, (Vec<u32>, Vec<i64>)> = BTreeMap::new();
        let mut starts = Vec::new();
        let mut last_slot = usize::MAX;
        for i in 0..n {
            let (t, stamp) = (input.times[i], input.stamps[i]);
            self.windows_of(t, &mut starts);
            let mut kept = false;
            let mut newest_end = 0;
            for &start in &starts {
                let end = start + self.size;
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
                } else if end.saturating_add(self.retention) > stamp {
                    kept = true;
                    let e = late
                        .entry(next_tick(stamp, self.emit_interval))
                        .or_default();
                    e.0.push(i as u32);
                    e.1.push(start);
                } else {
                    newest_end = newest_end.max(end);
                }
            }
            if !kept {
                out.rejects.push(Reject {
                    partition: input.partition,
                    row: input.origin[i] as usize,
                    reason: RejectReason::TooLate {
                        window_end: newest_end,
                        watermark: stamp,
                    },
                });
            }
        }
        if !on_time.is_empty() {
            let keys = self.eval.keys(&input.batch)?;
            let inputs = self.eval.inputs(&input.batch)?;
            for (start, rows) in on_time {
                self.update_open(start, &rows, n, &keys, &inputs)?;
            }
        }
        for (tick, (rows, starts)) in late {
            let batch = take_record_batch(&input.batch, &UInt32Array::from(rows))?;
            self.pending
                .entry(tick)
                .or_default()
                .push(PendingLate { batch, starts });
        }
        Ok(())
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        loop {
            let next_close = self.open.keys().next().map(|s| s + self.size);
            let next_tick = self.pending.keys().next().copied();
            let next = match (next_close, next_tick) {
                (Some(c), Some(t)) => c.min(t),
                (Some(c), None) => c,
                (None, Some(t)) => t,
                (None, None) => break,
            };
            if next > watermark {
                break;
            }
            if next_close == Some(next) {
                let start = next - self.size;
                self.close(start, out)?;
            } else {
                self.apply_late(next, out)?;
            }
        }
        // Late rows for a window arrive with stamps below end + retention, so
        // they are all applied by end + retention + one grid step.
        let horizon = self.retention.saturating_add(self.emit_interval);
        let size = self.size;
        self.closed
            .retain(|&start, _| (start + size).saturating_add(horizon) > watermark);
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let mut batches = Vec::new();
        for (start, state) in self.open.iter_mut() {
            batches.push((format!("open/{start}"), state.snapshot()?));
        }
        for (start, state) in self.closed.iter_mut() {
            batches.push((format!("closed/{start}"), state.snapshot()?));
        }
        let schema = self.pending_schema();
        for (tick, list) in &self.pending {
            for (i, p) in list.iter().enumerate() {
                let mut cols = p.batch.columns().to_vec();
                cols.push(Arc::new(Int64Array::from(p.starts.clone())));
                batches.push((
                    format!("pending/{tick}/{i}"),
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
            let num = |s: &str| -> Result<i64> {
                s.parse()
                    .map_err(|_| EngineError::Checkpoint(format!("bad state entry name {name}")))
            };
            match parts.as_slice() {
                ["open", start] | ["closed", start] => {
                    let mut state = self.new_state()?;
                    state.restore(&batch)?;
                    if parts[0] == "open" {
                        self.open.insert(num(start)?, state);
                    } else {
                        state.set_track_dirty(true);
                        self.closed.insert(num(start)?, state);
                    }
                }
                ["pending", tick, _] => {
                    let k = batch.num_columns() - 1;
                    let starts = batch
                        .column(k)
                        .as_primitive::<Int64Type>()
                        .values()
                        .to_vec();
                    let rows = RecordBatch::try_new(
                        Arc::clone(&self.source_schema),
                        batch.columns()[..k].to_vec(),
                    )?;
                    self.pending
                        .entry(num(tick)?)
                        .or_default()
                        .push(PendingLate {
                            batch: rows,
                            starts,
                        });
                }
                _ => {
                    return Err(EngineError::Checkpoint(format!(
                        "unknown state entry {name}"
                    )));
                }
            }
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.open
            .values()
            .chain(self.closed.values())
            .map(|s| s.size())
            .sum::<usize>()
            + self
                .pending
                .values()
                .flatten()
                .map(|p| p.batch.get_array_memory_size() + p.starts.len() * 8)
                .sum::<usize>()
    }

    fn state_keys(&self) -> usize {
        self.open
            .values()
            .chain(self.closed.values())
            .map(|s| s.len())
            .sum()
    }
}
