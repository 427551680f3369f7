//! [`SessionLog`]: SESSION windows' state in a durable state store, so
//! that a checkpoint writes the sessions that changed since the previous
//! one (and deletes those merged away or dropped) instead of every session.
//!
//! A session is a row of table `sessions`, keyed by its serial number (given
//! when it opens, kept while it grows and merges others in), holding what a
//! whole snapshot holds for it. Restoring reads the table back. Sessions
//! stay in memory all along (the watermark bounds them): this is about what
//! a checkpoint costs, not about memory.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, RecordBatch, UInt64Array, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ubik_state::TableId;

use crate::error::Result;
use crate::state::SharedStore;

/// The column after a session's snapshot columns: its serial number.
const SERIAL: &str = "__ubik_serial";

pub(super) struct SessionLog {
    store: SharedStore,
    table: TableId,
    /// The snapshot's columns, all nullable (a deletion's row is nulls),
    /// then [`SERIAL`].
    schema: SchemaRef,
}

fn keys(serials: impl Iterator<Item = u64>) -> BinaryArray {
    BinaryArray::from_iter_values(serials.map(u64::to_be_bytes))
}

impl SessionLog {
    /// Table `sessions` of a durable `store`, for sessions whose snapshot
    /// rows are `snapshot` (the columns of a whole snapshot).
    pub fn new(store: &SharedStore, snapshot: &SchemaRef) -> Result<Self> {
        let mut fields: Vec<Field> = snapshot
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        fields.push(Field::new(SERIAL, DataType::UInt64, true));
        let schema = Arc::new(Schema::new(fields));
        let table = store.with(|s| Ok(s.table("sessions", Arc::clone(&schema))?))?;
        Ok(Self {
            store: store.clone(),
            table,
            schema,
        })
    }

    /// Writes `changed` (snapshot rows of the sessions with serial numbers
    /// `serials`) and deletes the sessions `removed`; returns the bytes written.
    pub fn write(
        &mut self,
        changed: &RecordBatch,
        serials: &[u64],
        removed: &[u64],
    ) -> Result<u64> {
        let n = serials.len() + removed.len();
        if n == 0 {
            return Ok(0);
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (i, field) in self.schema.fields().iter().enumerate() {
            let mine: ArrayRef = match field.name() == SERIAL {
                true => Arc::new(UInt64Array::from(serials.to_vec())),
                false => Arc::clone(changed.column(i)),
            };
            let gone = new_null_array(field.data_type(), removed.len());
            columns.push(arrow::compute::concat(&[mine.as_ref(), gone.as_ref()])?);
        }
        let rows = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        let keys = keys(serials.iter().chain(removed).copied());
        let deleted: Vec<bool> = (0..n).map(|i| i >= serials.len()).collect();
        let table = self.table;
        self.store
            .with(|s| Ok(s.write(table, &keys, &rows, Some(&deleted))?))
    }

    /// Every stored session, in serial order: the snapshot's columns, and
    /// their serial numbers.
    pub fn read(&mut self) -> Result<Option<(RecordBatch, Vec<u64>)>> {
        let table = self.table;
        let parts = self.store.with(|s| {
            let mut parts = Vec::new();
            let mut scan = s.scan(table)?;
            while let Some((_, rows)) = scan.next_batch()? {
                parts.push(rows);
            }
            Ok(parts)
        })?;
        if parts.iter().all(|p| p.num_rows() == 0) {
            return Ok(None);
        }
        let all = arrow::compute::concat_batches(&self.schema, &parts)?;
        let last = all.num_columns() - 1;
        let serials = all
            .column(last)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .map(|a| a.values().to_vec())
            .unwrap_or_default();
        let mut rows = all;
        rows.remove_column(last);
        Ok(Some((rows, serials)))
    }
}
