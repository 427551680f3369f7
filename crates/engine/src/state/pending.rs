//! Rows held until the watermark passes a grid point: the one "pending
//! rows" table of every operator (continuous flushes, session folds and
//! late updates of closed windows). Each row carries one `i64` beside it
//! (its event time, or the window start it is late for).
//!
//! With a durable store, a checkpoint does not write the rows whole each
//! time: once the rows not in the store yet exceed a small limit
//! ([`super::store::HELD_ROWS_LIMIT`]), they go to the store's table
//! (`pending` under the operator's path), each written once, keyed by its
//! arrival number. Points are taken out in order, so a row is gone once
//! every point up to its own is: the table expires rows by their point
//! (the store's expiry, which compaction drops with no tombstones), up to
//! the point below the first still held. A row whose point is already
//! expired when it comes stays out of the table (whole in each
//! checkpoint), and a logged row taken out above the expired points is
//! deleted. Two marker rows (keys after every arrival number) record the
//! expired points and the next arrival number, so a restore reads back
//! exactly the rows held, and numbers are never reused. The rows stay in
//! memory all along: this is about what a checkpoint costs (an emit
//! interval longer than the checkpoint interval held them many times
//! over), not about memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch, RecordBatchOptions,
    UInt32Array, new_null_array,
};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef, UInt32Type};
use ubik_state::{TableId, has_dictionary};

use super::entry::StateEntry;
use super::store::SharedStore;
use crate::error::{EngineError, Result};
use crate::time::{MIN_TIME, next_tick};

/// Rows of one partition queued for one grid point.
#[derive(Debug)]
pub struct PendingPart {
    pub partition: u32,
    /// Rows in the source schema.
    pub batch: RecordBatch,
    /// One value per row: event time, or the window start it is late for.
    pub values: Vec<i64>,
}

/// A part, the arrival number of its first row (its rows are numbered one
/// after the other) and whether it is in the store's table.
struct Queued {
    seq: u64,
    logged: bool,
    part: PendingPart,
}

/// Parts by grid point, in arrival order per point.
pub struct PendingRows {
    by_tick: BTreeMap<i64, Vec<Queued>>,
    source_schema: SchemaRef,
    /// The source schema plus the value column, as snapshotted.
    snapshot_schema: SchemaRef,
    /// The next row's arrival number.
    next_seq: u64,
    /// The latest point taken out.
    max_taken: i64,
    log: Option<PendingLog>,
}

/// The rows' table in a durable store.
struct PendingLog {
    store: SharedStore,
    table: TableId,
    /// The source columns (nullable: deletions and the marker carry no
    /// row), then [`LOG_COLUMNS`].
    schema: SchemaRef,
    /// Rows of points up to this one are expired in the table.
    through: i64,
    /// Logged parts taken out since the last checkpoint: (first number,
    /// rows, point).
    taken: Vec<(u64, usize, i64)>,
    /// Rows not logged yet go to the table from this size on; below it
    /// they go into the checkpoint whole.
    min_bytes: usize,
}

/// The columns after a logged row's own.
const LOG_COLUMNS: [(&str, DataType); 3] = [
    ("__ubik_partition", DataType::UInt32),
    ("__ubik_value", DataType::Int64),
    ("__ubik_tick", DataType::Int64),
];

/// The markers' keys, after every arrival number; their values are the
/// lowest arrival number a restore may need (rows before it were all taken
/// out: a restore reads from there on), the next arrival number and the
/// last point expired.
const FIRST_LIVE: u64 = u64::MAX - 2;
const NEXT_SEQ: u64 = u64::MAX - 1;
const THROUGH: u64 = u64::MAX;
const MARKERS: usize = 3;

impl PendingRows {
    /// `column` names the value column in snapshots.
    pub fn new(source_schema: SchemaRef, column: &str) -> Self {
        let mut fields: Vec<FieldRef> = source_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(column, DataType::Int64, false)));
        Self {
            by_tick: BTreeMap::new(),
            source_schema,
            snapshot_schema: Arc::new(Schema::new(fields)),
            next_seq: 0,
            max_taken: MIN_TIME,
            log: None,
        }
    }

    /// Keeps the rows in table `name` of `store` across checkpoints when the
    /// store is durable (and the rows' columns can be stored); otherwise
    /// they go into each checkpoint whole.
    pub fn log_to(&mut self, store: Option<&SharedStore>, name: &str) -> Result<()> {
        let Some(store) = store.filter(|s| s.is_durable()) else {
            return Ok(());
        };
        if self
            .source_schema
            .fields()
            .iter()
            .any(|f| has_dictionary(f.data_type()))
        {
            return Ok(());
        }
        let mut fields: Vec<FieldRef> = self
            .source_schema
            .fields()
            .iter()
            .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
            .collect();
        fields.extend(
            LOG_COLUMNS
                .iter()
                .map(|(n, t)| Arc::new(Field::new(*n, t.clone(), true))),
        );
        let schema = Arc::new(Schema::new(fields));
        let table = store.with(|s| Ok(s.table(name, Arc::clone(&schema))?))?;
        self.log = Some(PendingLog {
            store: store.clone(),
            table,
            schema,
            through: MIN_TIME,
            taken: Vec::new(),
            min_bytes: store.held_rows_limit(),
        });
        Ok(())
    }

    pub fn push(&mut self, tick: i64, part: PendingPart) {
        self.push_queued(tick, part, false);
    }

    fn push_queued(&mut self, tick: i64, part: PendingPart, logged: bool) {
        let seq = self.next_seq;
        self.next_seq += part.values.len() as u64;
        self.by_tick
            .entry(tick)
            .or_default()
            .push(Queued { seq, logged, part });
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
        let queued = self.by_tick.remove(&tick).unwrap_or_default();
        self.max_taken = self.max_taken.max(tick);
        if let Some(log) = self.log.as_mut() {
            log.taken.extend(
                queued
                    .iter()
                    .filter(|q| q.logged)
                    .map(|q| (q.seq, q.part.values.len(), tick)),
            );
        }
        queued.into_iter().map(|q| q.part).collect()
    }

    /// Appends one snapshot entry per part the checkpoint holds whole; with
    /// a durable store, first writes the rows not in it yet there (once they
    /// are worth a write) and expires or deletes there the logged rows
    /// taken out since the previous checkpoint. Returns the bytes written
    /// to the store.
    pub fn snapshot(&mut self, out: &mut Vec<(StateEntry, RecordBatch)>) -> Result<u64> {
        let written = match self.log.as_mut() {
            Some(log) => {
                // Every point up to the one below the first held is taken out.
                let gone = match self.by_tick.keys().next() {
                    Some(&first) => self.max_taken.min(first.saturating_sub(1)),
                    None => self.max_taken,
                };
                let through = log.through.max(gone);
                // Rows of later points may still be wanted; none before the
                // lowest arrival number among them.
                let first_live = self
                    .by_tick
                    .range(through.saturating_add(1)..)
                    .flat_map(|(_, parts)| parts.iter().map(|q| q.seq))
                    .min()
                    .unwrap_or(self.next_seq);
                let mut fresh: Vec<(i64, &mut Queued)> = self
                    .by_tick
                    .range_mut(through.saturating_add(1)..)
                    .flat_map(|(&tick, parts)| parts.iter_mut().map(move |q| (tick, q)))
                    .filter(|(_, q)| !q.logged)
                    .collect();
                let bytes: usize = fresh.iter().map(|(_, q)| part_size(&q.part)).sum();
                if bytes < log.min_bytes {
                    fresh.clear();
                }
                log.write(fresh, through, [first_live, self.next_seq])?
            }
            None => 0,
        };
        for (&tick, parts) in &self.by_tick {
            let whole = parts.iter().filter(|q| !q.logged);
            for (seq, q) in whole.enumerate() {
                let p = &q.part;
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
        Ok(written)
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

    /// After the snapshot's parts are restored and the store holds the
    /// checkpoint's state: puts the logged rows back in front of them (a
    /// point's logged rows came before its rows held whole).
    pub fn store_restored(&mut self) -> Result<()> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let whole = std::mem::take(&mut self.by_tick);
        let logged = log.read(&self.source_schema)?;
        log.taken.clear();
        self.max_taken = log.through;
        self.next_seq = logged.next_seq;
        for (tick, q) in logged.parts {
            self.by_tick.entry(tick).or_default().push(q);
        }
        for (tick, parts) in whole {
            for q in parts {
                self.push_queued(tick, q.part, false);
            }
        }
        Ok(())
    }

    /// Approximate bytes held.
    pub fn size(&self) -> usize {
        self.by_tick
            .values()
            .flatten()
            .map(|q| part_size(&q.part))
            .sum()
    }
}

fn part_size(p: &PendingPart) -> usize {
    p.batch.get_array_memory_size() + p.values.len() * 8
}

/// What the table holds: the rows by point, in arrival order, and the
/// next arrival number.
struct Logged {
    parts: Vec<(i64, Queued)>,
    next_seq: u64,
}

impl PendingLog {
    /// Writes `fresh` (marked logged), deletes the logged rows
    /// taken out since the last checkpoint above `through`, expires the
    /// points up to `through`, and records both in the marker; returns the
    /// bytes written.
    fn write(
        &mut self,
        mut fresh: Vec<(i64, &mut Queued)>,
        through: i64,
        [first_live, next_seq]: [u64; 2],
    ) -> Result<u64> {
        let mut taken = std::mem::take(&mut self.taken);
        // In arrival order, the markers last: the keys come sorted (rows
        // deleted were logged before any row logged now), and the store
        // takes them as they are.
        let moved = through > self.through && !taken.is_empty();
        // Rows of points up to `through` expire; the others are deleted.
        taken.retain(|t| t.2 > through);
        taken.sort_unstable_by_key(|t| t.0);
        fresh.sort_unstable_by_key(|(_, q)| q.seq);
        let deleted: usize = taken.iter().map(|t| t.1).sum();
        if fresh.is_empty() && deleted == 0 && !moved {
            return Ok(0);
        }
        let added: usize = fresh.iter().map(|(_, q)| q.part.values.len()).sum();
        let rows = deleted + added + MARKERS;
        let mut keys = Vec::with_capacity(rows);
        for &(first, n, _) in &taken {
            keys.extend((first..first + n as u64).map(u64::to_be_bytes));
        }
        let (mut partitions, mut values, mut ticks) = (Vec::new(), Vec::new(), Vec::new());
        for (tick, q) in &fresh {
            let n = q.part.values.len();
            keys.extend((q.seq..q.seq + n as u64).map(u64::to_be_bytes));
            partitions.extend(std::iter::repeat_n(q.part.partition, n));
            values.extend_from_slice(&q.part.values);
            ticks.extend(std::iter::repeat_n(*tick, n));
        }
        keys.push(FIRST_LIVE.to_be_bytes());
        keys.push(NEXT_SEQ.to_be_bytes());
        keys.push(THROUGH.to_be_bytes());
        let own = self.schema.fields().len() - LOG_COLUMNS.len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for c in 0..own {
            let data_type = self.schema.field(c).data_type();
            let mut pieces: Vec<ArrayRef> = vec![new_null_array(data_type, deleted)];
            pieces.extend(
                fresh
                    .iter()
                    .map(|(_, q)| Arc::clone(q.part.batch.column(c))),
            );
            pieces.push(new_null_array(data_type, MARKERS));
            let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            columns.push(arrow::compute::concat(&refs)?);
        }
        let with = |v: Vec<i64>, markers: [i64; MARKERS]| {
            Arc::new(Int64Array::from_iter(
                pad(deleted)
                    .chain(v.into_iter().map(Some))
                    .chain(markers.map(Some)),
            )) as ArrayRef
        };
        columns.push(Arc::new(UInt32Array::from_iter(
            pad(deleted)
                .chain(partitions.into_iter().map(Some))
                .chain([None; MARKERS]),
        )));
        columns.push(with(values, [first_live as i64, next_seq as i64, through]));
        // The markers never expire.
        columns.push(with(ticks, [i64::MAX; MARKERS]));
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        let keys = BinaryArray::from_iter_values(keys.iter());
        let mask: Vec<bool> = (0..rows).map(|i| i < deleted).collect();
        for (_, q) in fresh {
            q.logged = true;
        }
        let (table, tick_column) = (self.table, own + 2);
        self.through = through;
        self.store.with(|s| {
            let written = s.write(table, &keys, &batch, Some(&mask))?;
            if through > MIN_TIME {
                s.set_expiry(table, tick_column, through)?;
            }
            Ok(written)
        })
    }

    /// The rows the table holds (those of points above the marker's
    /// expired ones), and the next arrival number.
    fn read(&mut self, source: &SchemaRef) -> Result<Logged> {
        let table = self.table;
        let own = source.fields().len();
        let stored = self.store.with(|s| {
            // Rows before the lowest arrival number still wanted are not
            // read (a log written before that marker is read whole).
            let marker = s.get(table, &[FIRST_LIVE.to_be_bytes().as_slice()])?;
            let start = match marker.found.first() {
                Some(_) => {
                    let first = marker.values.column(own + 1).as_primitive::<Int64Type>();
                    first.value(0) as u64
                }
                None => 0,
            };
            let mut stored = Vec::new();
            let mut scan = s.scan_from(table, &start.to_be_bytes())?;
            while let Some(batch) = scan.next_batch()? {
                stored.push(batch);
            }
            Ok(stored)
        })?;
        let damaged = || {
            EngineError::Checkpoint(
                "rows waiting for the watermark: a stored row is damaged".into(),
            )
        };
        let columns: Vec<usize> = (0..own).collect();
        let (mut next_seq, mut through) = (None, None);
        let mut rows_of = Vec::new();
        for (keys, rows) in stored {
            let seqs = keys
                .iter()
                .map(|k| k.and_then(|k| k.try_into().ok()).map(u64::from_be_bytes))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(damaged)?;
            let values = rows.column(own + 1).as_primitive::<Int64Type>();
            for (at, &seq) in seqs.iter().enumerate().rev().take(MARKERS) {
                match seq {
                    NEXT_SEQ => next_seq = Some(values.value(at) as u64),
                    THROUGH => through = Some(values.value(at)),
                    _ => {}
                }
            }
            rows_of.push((seqs, rows));
        }
        let (Some(next_seq), Some(through)) = (next_seq, through) else {
            return Ok(Logged {
                parts: Vec::new(),
                next_seq: 0,
            });
        };
        self.through = through;
        let mut parts: Vec<(i64, Queued)> = Vec::new();
        for (seqs, rows) in rows_of {
            let partitions = rows.column(own).as_primitive::<UInt32Type>();
            let values = rows.column(own + 1).as_primitive::<Int64Type>();
            let ticks = rows.column(own + 2).as_primitive::<Int64Type>();
            let own_rows = rows.project(&columns)?;
            // One part per run of consecutive rows of one point and partition.
            let mut start = 0;
            while start < seqs.len() {
                let (tick, partition) = (ticks.value(start), partitions.value(start));
                let mut end = start + 1;
                while end < seqs.len()
                    && ticks.value(end) == tick
                    && partitions.value(end) == partition
                    && seqs[end] == seqs[end - 1] + 1
                {
                    end += 1;
                }
                if seqs[start] < FIRST_LIVE && tick > through {
                    // Copied out: a slice would hold (and count) the whole batch.
                    let slice = own_rows.slice(start, end - start);
                    let batch = RecordBatch::try_new(
                        Arc::clone(source),
                        arrow::compute::concat_batches(&slice.schema(), [&slice])?
                            .columns()
                            .to_vec(),
                    )?;
                    parts.push((
                        tick,
                        Queued {
                            seq: seqs[start],
                            logged: true,
                            part: PendingPart {
                                partition,
                                batch,
                                values: values.values()[start..end].to_vec(),
                            },
                        },
                    ));
                }
                start = end;
            }
        }
        let table = self.table;
        let tick_column = own + 2;
        if through > MIN_TIME {
            self.store
                .with(|s| Ok(s.set_expiry(table, tick_column, through)?))?;
        }
        Ok(Logged { parts, next_seq })
    }
}

/// `n` nulls (the deletions' slots in a logged column).
fn pad<T>(n: usize) -> impl Iterator<Item = Option<T>> {
    std::iter::repeat_with(|| None).take(n)
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use ubik_state::{StateStore, StoreManifest, StoreOptions};

    use super::*;

    fn source() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
    }

    fn part(first: i64, n: i64) -> PendingPart {
        let v: Vec<i64> = (first..first + n).collect();
        PendingPart {
            partition: 0,
            batch: RecordBatch::try_new(source(), vec![Arc::new(Int64Array::from(v.clone()))])
                .unwrap(),
            values: v,
        }
    }

    /// Rows held for `store` (logging from the first byte on).
    fn held(store: &SharedStore) -> PendingRows {
        let mut rows = PendingRows::new(source(), "__time");
        rows.log_to(Some(&store.clone().with_held_rows_limit(0)), "pending")
            .unwrap();
        rows
    }

    /// Points and the first value of each part, in order.
    fn contents(rows: &PendingRows) -> Vec<(i64, Vec<i64>)> {
        rows.by_tick
            .iter()
            .map(|(&t, parts)| (t, parts.iter().map(|q| q.part.values[0]).collect()))
            .collect()
    }

    /// A checkpoint of the store (its runs written).
    fn manifest(store: &SharedStore) -> StoreManifest {
        store
            .with(|s| {
                let (manifest, durable) = s.checkpoint(0)?;
                durable.wait()?;
                Ok(manifest)
            })
            .unwrap()
    }

    /// `rows` after a restart: the store reopened at its checkpoint, the
    /// snapshot's parts restored.
    fn restart(
        dir: &std::path::Path,
        rows: PendingRows,
        store: SharedStore,
    ) -> (PendingRows, SharedStore) {
        let mut rows = rows;
        let mut entries = Vec::new();
        rows.snapshot(&mut entries).unwrap();
        let manifest = manifest(&store);
        drop((rows, store));
        let store = SharedStore::durable(StateStore::open(dir, StoreOptions::default()).unwrap());
        let mut restored = held(&store);
        store.with(|s| Ok(s.restore(&manifest)?)).unwrap();
        for (entry, batch) in &entries {
            let StateEntry::Pending {
                tick, partition, ..
            } = entry
            else {
                panic!("{entry:?}")
            };
            restored.restore(*tick, *partition, batch).unwrap();
        }
        restored.store_restored().unwrap();
        (restored, store)
    }

    /// A point taken out before an earlier one comes: its logged rows are
    /// deleted (they are above the expired points); a row below the
    /// expired points stays whole; restores from a reopened store hold
    /// exactly the rows held, and arrival numbers are not reused.
    #[test]
    fn restores_hold_exactly_what_was_held_when_points_come_out_of_order() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SharedStore::durable(StateStore::open(dir.path(), StoreOptions::default()).unwrap());
        let mut rows = held(&store);
        let mut entries = Vec::new();
        rows.push(10, part(100, 3));
        rows.push(20, part(200, 3));
        rows.snapshot(&mut entries).unwrap();
        assert!(entries.is_empty(), "both parts are logged");
        assert_eq!(rows.take(10)[0].values, vec![100, 101, 102]);
        rows.push(5, part(50, 2));
        let (mut rows, store) = restart(dir.path(), rows, store);
        assert_eq!(contents(&rows), vec![(5, vec![50]), (20, vec![200])]);

        assert_eq!(rows.take(5)[0].values, vec![50, 51]);
        rows.snapshot(&mut entries).unwrap();
        // Points up to 5 are expired now: a row for 3 stays out of the table.
        rows.push(3, part(30, 1));
        rows.push(20, part(210, 2));
        entries.clear();
        rows.snapshot(&mut entries).unwrap();
        assert_eq!(entries.len(), 1, "the row for point 3 is held whole");
        let (mut rows, store) = restart(dir.path(), rows, store);
        assert_eq!(contents(&rows), vec![(3, vec![30]), (20, vec![200, 210])]);

        rows.push(30, part(300, 1));
        let (rows, _store) = restart(dir.path(), rows, store);
        assert_eq!(
            contents(&rows),
            vec![(3, vec![30]), (20, vec![200, 210]), (30, vec![300])]
        );
        let seqs: Vec<u64> = rows.by_tick.values().flatten().map(|q| q.seq).collect();
        let mut unique = seqs.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seqs.len(), "arrival numbers {seqs:?}");
    }

    /// Once points are taken out, the log records the lowest arrival number
    /// still wanted, and a restore reads from there on (the rows before it
    /// are never read) and holds exactly what was held.
    #[test]
    fn a_restore_reads_the_log_from_the_first_row_still_wanted() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SharedStore::durable(StateStore::open(dir.path(), StoreOptions::default()).unwrap());
        let mut rows = held(&store);
        let mut entries = Vec::new();
        for point in 1..=10 {
            rows.push(point, part(point * 100, 3));
            rows.snapshot(&mut entries).unwrap();
        }
        for point in 1..=8 {
            rows.take(point);
        }
        rows.snapshot(&mut entries).unwrap();
        assert!(entries.is_empty(), "every part is logged");
        let first_live = |rows: &PendingRows, store: &SharedStore| {
            let table = rows.log.as_ref().unwrap().table;
            store
                .with(|s| Ok(s.get(table, &[FIRST_LIVE.to_be_bytes().as_slice()])?))
                .unwrap()
                .values
                .column(2)
                .as_primitive::<Int64Type>()
                .value(0)
        };
        // Point 9's rows arrived 25th to 27th.
        assert_eq!(first_live(&rows, &store), 24);
        let (rows, _store) = restart(dir.path(), rows, store);
        assert_eq!(contents(&rows), vec![(9, vec![900]), (10, vec![1000])]);
    }
}
