//! Rows held until the watermark passes a grid point: the one "pending
//! rows" table of every operator (continuous flushes, session folds and
//! late updates of closed windows). Each row carries one `i64` beside it
//! (its event time, or the window start it is late for).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};

use super::entry::StateEntry;
use crate::error::Result;
use crate::time::next_tick;

/// Rows of one partition queued for one grid point.
#[derive(Debug)]
pub struct PendingPart {
    pub partition: u32,
    /// Rows in the source schema.
    pub batch: RecordBatch,
    /// One value per row: event time, or the window start a late row is for.
    pub values: Vec<i64>,
}

/// Parts by grid point, in arrival order per point.
pub struct PendingRows {
    by_tick: BTreeMap<i64, Vec<PendingPart>>,
    source_schema: SchemaRef,
    /// The source schema plus the value column, as snapshotted.
    snapshot_schema: SchemaRef,
}

impl PendingRows {
    /// `column` names the value column in snapshots.
    pub fn new(source_schema: SchemaRef, column: &str) -> Self {
        let mut fields: Vec<FieldRef> = source_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(column, DataType::Int64, false)));
        Self {
            by_tick: BTreeMap::new(),
            source_schema,
            snapshot_schema: Arc::new(Schema::new(fields)),
        }
    }

    pub fn push(&mut self, tick: i64, part: PendingPart) {
        self.by_tick.entry(tick).or_default().push(part);
    }

    /// Queues `batch` by the grid point after each row's stamp. Stamps never
    /// decrease within a partition, so the rows of one point are a run.
    pub fn push_runs(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        stamps: &[i64],
        values: &[i64],
        grid: i64,
    ) {
        let n = batch.num_rows();
        let mut start = 0;
        while start < n {
            let tick = next_tick(stamps[start], grid);
            let mut end = start + 1;
            while end < n && next_tick(stamps[end], grid) == tick {
                end += 1;
            }
            self.push(
                tick,
                PendingPart {
                    partition,
                    batch: batch.slice(start, end - start),
                    values: values[start..end].to_vec(),
                },
            );
            start = end;
        }
    }

    /// The earliest grid point with rows, if the watermark has passed it.
    pub fn due(&self, watermark: i64) -> Option<i64> {
        self.first_tick().filter(|&t| t <= watermark)
    }

    /// The earliest grid point with rows.
    pub fn first_tick(&self) -> Option<i64> {
        self.by_tick.keys().next().copied()
    }

    /// Removes and returns the parts of `tick`, in arrival order.
    pub fn take(&mut self, tick: i64) -> Vec<PendingPart> {
        self.by_tick.remove(&tick).unwrap_or_default()
    }

    /// Appends one snapshot entry per part.
    pub fn snapshot(&self, out: &mut Vec<(StateEntry, RecordBatch)>) -> Result<()> {
        for (&tick, parts) in &self.by_tick {
            for (seq, p) in parts.iter().enumerate() {
                let mut cols = p.batch.columns().to_vec();
                cols.push(Arc::new(Int64Array::from(p.values.clone())));
                out.push((
                    StateEntry::Pending {
                        tick,
                        seq,
                        partition: p.partition,
                    },
                    RecordBatch::try_new(Arc::clone(&self.snapshot_schema), cols)?,
                ));
            }
        }
        Ok(())
    }

    /// Restores one part written by [`Self::snapshot`] (entries come in order).
    pub fn restore(&mut self, tick: i64, partition: u32, batch: &RecordBatch) -> Result<()> {
        let k = batch.num_columns() - 1;
        let values = batch
            .column(k)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        let rows = RecordBatch::try_new(
            Arc::clone(&self.source_schema),
            batch.columns()[..k].to_vec(),
        )?;
        self.push(
            tick,
            PendingPart {
                partition,
                batch: rows,
                values,
            },
        );
        Ok(())
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        self.by_tick
            .values()
            .flatten()
            .map(|p| p.batch.get_array_memory_size() + p.values.len() * 8)
            .sum()
    }
}
