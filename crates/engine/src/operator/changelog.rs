//! The current rows of a changelog source, by primary key ([`TableRows`]),
//! which turn upserts and deletions into signed rows for an aggregation.
//!
//! An upsert of key `k` takes `k`'s current row back out (if any) and puts
//! the new one in; a deletion takes it out. The old row comes from this
//! state, not from the event's `before` image, so the result is right under
//! any replica identity, and a change delivered twice (Debezium is
//! at-least-once) retracts what it adds. Rows of one key keep their order
//! because a key lives in one partition.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::StampedBatch;
use crate::error::Result;
use crate::state::keyed::Evicted;
use crate::state::{KeyedRows, SharedStore, Upsert};

/// Keys whose slots are read ahead of their changes at a time: enough
/// lookups to overlap their cache misses, few enough that the slots stay in
/// the core's cache until changed.
const WARM_BLOCK: usize = 256;

/// The column marking rows taken back out (true) among rows put in.
pub const RETRACT_COLUMN: &str = "__ubik_retract";

/// The input schema with [`RETRACT_COLUMN`] appended: what the operator queues.
pub fn signed_schema(input: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<_> = input.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        RETRACT_COLUMN,
        DataType::Boolean,
        false,
    )));
    Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()))
}

pub struct TableRows {
    schema: SchemaRef,
    signed: SchemaRef,
    key: Vec<usize>,
    keys: RowConverter,
    rows: RowConverter,
    /// Each key's current row (Arrow's row format), inline in its slot
    /// up to 46 bytes. An update rewrites the row in place, so it allocates
    /// nothing unless a longer row's length changes (a new box).
    current: KeyedRows,
    /// The old rows of the changes being applied, end to end.
    old: Vec<u8>,
    old_ends: Vec<usize>,
}

impl TableRows {
    pub fn new(schema: SchemaRef, key: Vec<usize>) -> Result<Self> {
        let sort = |i: usize| SortField::new(schema.field(i).data_type().clone());
        Ok(Self {
            keys: RowConverter::new(key.iter().map(|&i| sort(i)).collect())?,
            rows: RowConverter::new((0..schema.fields().len()).map(sort).collect())?,
            signed: signed_schema(&schema),
            current: KeyedRows::new(Arc::clone(&schema))?,
            schema,
            key,
            old: Vec::new(),
            old_ends: Vec::new(),
        })
    }

    /// Puts table `name` of `store` behind the rows: keys not used lately
    /// leave memory under the budget, and checkpoints write what changed.
    pub fn with_store(mut self, store: &SharedStore, name: &str) -> Result<Self> {
        self.current = self.current.with_store(store.clone(), name)?;
        Ok(self)
    }

    pub fn signed_schema(&self) -> &SchemaRef {
        &self.signed
    }

    /// Applies changes in order: each row is an upsert, or a deletion of
    /// its key where `deleted` says so (`deleted` empty: all upserts).
    /// Returns the rows put in (the upserts themselves) then the rows taken
    /// out, each marked in [`RETRACT_COLUMN`] and carrying the time and
    /// stamp of the change that moved it. An upsert of the row its key
    /// holds already (a change to columns the query does not read, or an
    /// event delivered again) moves nothing.
    pub fn apply(&mut self, input: StampedBatch, deleted: &[bool]) -> Result<StampedBatch> {
        let (old_of, put) = self.replace(&input.batch, deleted)?;
        let all_put = put.iter().all(|&p| p);
        let mut parts = Vec::with_capacity(2);
        let put_in = match all_put {
            true => input.batch.clone(),
            false => filter_record_batch(&input.batch, &BooleanArray::from(put.clone()))?,
        };
        if put_in.num_rows() > 0 {
            parts.push(self.signed_part(put_in.columns().to_vec(), false)?);
        }
        if !old_of.is_empty() {
            let parser = self.rows.parser();
            let (old, mut start) = (&self.old, 0);
            let columns = self.rows.convert_rows(self.old_ends.iter().map(|&end| {
                let row = parser.parse(&old[start..end]);
                start = end;
                row
            }))?;
            parts.push(self.signed_part(columns, true)?);
        }
        let pick = |v: &[i64]| -> Vec<i64> {
            let mut out: Vec<i64> = match all_put {
                true => v.to_vec(),
                false => (0..v.len()).filter(|&i| put[i]).map(|i| v[i]).collect(),
            };
            out.extend(old_of.iter().map(|&i| v[i]));
            out
        };
        let mut origin: Vec<u32> = match all_put {
            true => input.origin.clone(),
            false => (0..input.origin.len())
                .filter(|&i| put[i])
                .map(|i| input.origin[i])
                .collect(),
        };
        origin.extend(old_of.iter().map(|&i| input.origin[i]));
        let batch = match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => concat_batches(&self.signed, &parts)?,
        };
        Ok(StampedBatch {
            partition: input.partition,
            batch,
            times: pick(&input.times),
            stamps: pick(&input.stamps),
            origin,
        })
    }

    /// Puts the rows of `batch` in as their keys' current rows (removes
    /// the keys of the rows `deleted` marks), keeping the rows they replace
    /// in `self.old`; returns the index of each change that replaced one,
    /// and for each row whether it is put in (an upsert that changes its
    /// key's row).
    fn replace(
        &mut self,
        batch: &RecordBatch,
        deleted: &[bool],
    ) -> Result<(Vec<usize>, Vec<bool>)> {
        let key_columns: Vec<ArrayRef> = self
            .key
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        let keys = self.keys.convert_columns(&key_columns)?;
        let rows = match deleted.iter().all(|&d| d) && !deleted.is_empty() {
            false => Some(self.rows.convert_columns(batch.columns())?),
            true => None,
        };
        self.old.clear();
        self.old_ends.clear();
        let mut old_of: Vec<usize> = Vec::new();
        let mut put = vec![true; batch.num_rows()];
        self.current.tick();
        self.current
            .load((0..batch.num_rows()).map(|i| keys.row(i).data()))?;
        for (i, put) in put.iter_mut().enumerate() {
            if i % WARM_BLOCK == 0 {
                let block = i..(i + WARM_BLOCK).min(batch.num_rows());
                self.current.warm(block.map(|j| keys.row(j).data()));
            }
            let key = keys.row(i);
            let key = key.data();
            let replaced = match (&rows, deleted.get(i).copied().unwrap_or(false)) {
                (Some(rows), false) => {
                    match self.current.upsert(key, rows.row(i).data(), &mut self.old) {
                        Upsert::Unchanged => {
                            *put = false;
                            false
                        }
                        Upsert::Replaced => true,
                        Upsert::Inserted => false,
                    }
                }
                _ => {
                    *put = false;
                    self.current.delete(key, &mut self.old)
                }
            };
            if replaced {
                self.old_ends.push(self.old.len());
                old_of.push(i);
            }
        }
        Ok((old_of, put))
    }

    fn signed_part(&self, mut columns: Vec<ArrayRef>, retract: bool) -> Result<RecordBatch> {
        let n = columns.first().map_or(0, |c| c.len());
        columns.push(Arc::new(BooleanArray::from(vec![retract; n])));
        Ok(RecordBatch::try_new(Arc::clone(&self.signed), columns)?)
    }

    /// Every current row (for a checkpoint that does not keep them in the
    /// store), in key order.
    pub fn snapshot(&mut self) -> Result<RecordBatch> {
        self.current.snapshot()
    }

    /// Writes the rows changed since the last checkpoint to the store.
    pub fn persist(&mut self) -> Result<u64> {
        self.current.persist()
    }

    /// Whether checkpoints keep the rows in the store.
    pub fn in_store(&self) -> bool {
        self.current.durable()
    }

    /// The store was restored: rows not in memory may be in it.
    pub fn store_restored(&mut self) -> Result<()> {
        self.current.store_restored()
    }

    /// Moves the least recently used rows to the store until about
    /// `target` bytes are held.
    pub fn evict(&mut self, target: usize) -> Result<Evicted> {
        self.current.evict(target)
    }

    /// Puts the rows of a [`Self::snapshot`] back.
    pub fn restore(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), batch.columns().to_vec())?;
        self.replace(&batch, &[])?;
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.current.size()
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

/// Splits a queued signed batch into the rows put in and the rows taken
/// out (both without [`RETRACT_COLUMN`]), with the times of the first.
pub fn split_signed(
    batch: &RecordBatch,
    times: &[i64],
) -> Result<(RecordBatch, Vec<i64>, RecordBatch)> {
    let k = batch.num_columns() - 1;
    let retract = arrow::array::AsArray::as_boolean(batch.column(k));
    let (mut put, mut taken) = (Vec::new(), Vec::new());
    for i in 0..batch.num_rows() {
        match retract.value(i) {
            false => put.push(i as u32),
            true => taken.push(i as u32),
        }
    }
    let rows = batch.project(&(0..k).collect::<Vec<_>>())?;
    let put_times = put.iter().map(|&i| times[i as usize]).collect();
    Ok((
        take_record_batch(&rows, &UInt32Array::from(put))?,
        put_times,
        take_record_batch(&rows, &UInt32Array::from(taken))?,
    ))
}
