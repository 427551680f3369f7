//! [`RowLog`]: a join side's rows in a durable state store, so that a
//! checkpoint writes the rows that arrived since the previous one instead
//! of every row the side holds.
//!
//! A side holds its rows until the watermark lets them go (an interval
//! join's until no row of the other side can fall within bounds, a temporal
//! join's stream rows until they fire): each row is written once, keyed by
//! its sequence number, with its expiry; rows whose expiry the watermark
//! passed count as deleted from then on (the store's expiry, so compaction
//! drops them with no tombstones). A LEFT join's left rows that found a
//! match are listed in a second table, since a row is written before it
//! knows. Restoring reads back the rows alive at the checkpoint's
//! watermark, in arrival order, and their matches. Under the memory budget
//! an interval join moves fired rows out by key once they are logged
//! (`JoinOperator::spill`).

use std::sync::Arc;

use arrow::array::{
    AsArray, BinaryArray, BooleanArray, Int64Array, RecordBatch, RecordBatchOptions,
};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use ubik_state::TableId;

use super::join_rows::{HeldRows, SideRows, pick};
use crate::error::{EngineError, Result};
use crate::state::SharedStore;
use crate::time::MIN_TIME;

/// The bookkeeping columns after a logged row's own: its time, effective
/// time, presence and expiry.
const BOOKKEEPING: [(&str, DataType); 4] = [
    ("__ubik_time", DataType::Int64),
    ("__ubik_effective", DataType::Int64),
    ("__ubik_present", DataType::Boolean),
    ("__ubik_expires", DataType::Int64),
];

/// Rows read back from the log, in arrival order.
pub(super) struct Logged {
    pub held: HeldRows,
    pub seq: Vec<u64>,
    /// Whether each row found a match (a LEFT join's left side).
    pub matched: Vec<bool>,
}

pub(super) struct RowLog {
    store: SharedStore,
    /// The side's columns, then [`BOOKKEEPING`].
    schema: SchemaRef,
    side_schema: SchemaRef,
    rows: TableId,
    /// Sequence numbers of rows that found a match, with their expiry.
    matches: Option<TableId>,
    matches_schema: SchemaRef,
    /// Rows with a lower sequence number are in the store.
    logged: u64,
    /// Matches found since the last checkpoint: (sequence number, expiry).
    new_matches: Vec<(u64, i64)>,
    /// Rows expiring before this watermark are gone.
    expired_before: i64,
}

fn seq_keys(seq: impl Iterator<Item = u64>) -> BinaryArray {
    BinaryArray::from_iter_values(seq.map(u64::to_be_bytes))
}

impl RowLog {
    /// Tables `<name>` (and `<name>/matched` with `matches`) of a durable
    /// `store`, for rows of `side_schema`.
    pub fn new(
        store: &SharedStore,
        name: &str,
        side_schema: &SchemaRef,
        matches: bool,
    ) -> Result<Self> {
        let mut fields = side_schema.fields().to_vec();
        fields.extend(
            BOOKKEEPING
                .iter()
                .map(|(n, t)| Arc::new(Field::new(*n, t.clone(), false))),
        );
        let schema = Arc::new(Schema::new(fields));
        let matched_schema = Arc::new(Schema::new(vec![Field::new(
            "__ubik_expires",
            DataType::Int64,
            false,
        )]));
        let (rows, matches) = store.with(|s| {
            let rows = s.table(name, Arc::clone(&schema))?;
            let matches = match matches {
                true => Some(s.table(&format!("{name}/matched"), Arc::clone(&matched_schema))?),
                false => None,
            };
            Ok((rows, matches))
        })?;
        Ok(Self {
            store: store.clone(),
            schema,
            side_schema: Arc::clone(side_schema),
            rows,
            matches,
            matches_schema: matched_schema,
            logged: 0,
            new_matches: Vec::new(),
            expired_before: MIN_TIME,
        })
    }

    /// The number after every stored row's, alive or not: a restored side
    /// numbers its next rows from here, so that they are new to the log
    /// (the rows stored last may be gone at the restore's watermark).
    pub fn next_seq(&self) -> u64 {
        self.logged
    }

    /// The side's rows expiring before `watermark` were dropped.
    pub fn expired(&mut self, watermark: i64) {
        self.expired_before = self.expired_before.max(watermark);
    }

    /// Row `seq` (expiring at `expires`) found its first match.
    pub fn matched(&mut self, seq: u64, expires: i64) {
        self.new_matches.push((seq, expires));
    }

    /// Writes the rows of `side` that arrived since the last checkpoint,
    /// and the matches found since; returns the bytes written.
    pub fn checkpoint(&mut self, side: &SideRows) -> Result<u64> {
        // Rows read back from the store after a spill (logged before it)
        // follow newer ones: the sequence numbers are not in entry order.
        let fresh: Vec<u32> = (0..side.seq.len())
            .filter(|&e| side.alive[e] && side.seq[e] >= self.logged)
            .map(|e| e as u32)
            .collect();
        let mut written = 0;
        let (rows_table, matches_table) = (self.rows, self.matches);
        let through = self.expired_before.saturating_sub(1);
        if !fresh.is_empty() {
            let held = side.held(&fresh)?;
            let mut columns = held.rows.columns().to_vec();
            columns.push(Arc::new(Int64Array::from(held.times)));
            columns.push(Arc::new(Int64Array::from(held.effective)));
            columns.push(Arc::new(BooleanArray::from(held.present)));
            columns.push(Arc::new(Int64Array::from(pick(&side.expires, &fresh))));
            let batch = RecordBatch::try_new_with_options(
                Arc::clone(&self.schema),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(fresh.len())),
            )?;
            let keys = seq_keys(fresh.iter().map(|&e| side.seq[e as usize]));
            written += self
                .store
                .with(|s| Ok(s.write(rows_table, &keys, &batch, None)?))?;
        }
        let new_matches = std::mem::take(&mut self.new_matches);
        let expires_column = self.side_schema.fields().len() + 3;
        let matches_schema = Arc::clone(&self.matches_schema);
        written += self.store.with(|s| {
            let mut written = 0;
            if through > MIN_TIME {
                s.set_expiry(rows_table, expires_column, through)?;
            }
            if let Some(table) = matches_table {
                if !new_matches.is_empty() {
                    let keys = seq_keys(new_matches.iter().map(|m| m.0));
                    let expires = Int64Array::from_iter_values(new_matches.iter().map(|m| m.1));
                    let batch = RecordBatch::try_new(matches_schema, vec![Arc::new(expires)])?;
                    written += s.write(table, &keys, &batch, None)?;
                }
                if through > MIN_TIME {
                    s.set_expiry(table, 0, through)?;
                }
            }
            Ok(written)
        })?;
        self.logged = side.next_seq;
        Ok(written)
    }

    /// The rows alive at a checkpoint whose watermark was `watermark` (those
    /// expiring before it were gone), in arrival order, handed to `each`
    /// about `chunk` stored rows at a time: the store is read again from the
    /// next row after each, so `each` may spill (and write) between them.
    pub fn read(
        &mut self,
        watermark: i64,
        chunk: usize,
        mut each: impl FnMut(Logged) -> Result<()>,
    ) -> Result<()> {
        let (rows_table, matches_table) = (self.rows, self.matches);
        let mut matched = self.store.with(|s| {
            let mut matched = Vec::new();
            if let Some(table) = matches_table {
                let mut scan = s.scan(table)?;
                while let Some((keys, _)) = scan.next_batch()? {
                    for key in keys.iter().flatten() {
                        matched.push(seq_of(key)?);
                    }
                }
            }
            Ok(matched)
        })?;
        matched.sort_unstable();
        self.expired_before = watermark;
        let mut from = 0u64;
        loop {
            let parts = self.store.with(|s| {
                let mut parts = Vec::new();
                let mut read = 0;
                let mut scan = s.scan_from(rows_table, &from.to_be_bytes())?;
                while read < chunk {
                    let Some((keys, rows)) = scan.next_batch()? else {
                        break;
                    };
                    read += rows.num_rows();
                    parts.push((keys, rows));
                }
                Ok(parts)
            })?;
            let Some(last) = parts
                .last()
                .and_then(|(keys, _)| keys.iter().flatten().last())
            else {
                return Ok(());
            };
            from = seq_of(last)? + 1;
            let logged = self.alive_rows(parts, watermark, &matched)?;
            self.logged = self.logged.max(from);
            if !logged.seq.is_empty() {
                each(logged)?;
            }
        }
    }

    /// Of stored `parts`, the rows alive at `watermark` with their matches.
    fn alive_rows(
        &self,
        parts: Vec<(BinaryArray, RecordBatch)>,
        watermark: i64,
        matched: &[u64],
    ) -> Result<Logged> {
        let n = self.side_schema.fields().len();
        let own: Vec<usize> = (0..n).collect();
        let mut logged = Logged {
            held: HeldRows::empty(Arc::clone(&self.side_schema)),
            seq: Vec::new(),
            matched: Vec::new(),
        };
        let mut batches = Vec::new();
        for (keys, rows) in parts {
            let expires = rows.column(n + 3).as_primitive::<Int64Type>();
            let keep =
                BooleanArray::from_iter(expires.values().iter().map(|&x| Some(x >= watermark)));
            let rows = arrow::compute::filter_record_batch(&rows, &keep)?;
            let keys = arrow::compute::filter(&keys, &keep)?;
            let int64 = |c: usize| rows.column(c).as_primitive::<Int64Type>().values().to_vec();
            logged.held.times.extend(int64(n));
            logged.held.effective.extend(int64(n + 1));
            logged.held.present.extend(
                rows.column(n + 2)
                    .as_boolean()
                    .iter()
                    .map(|p| p.unwrap_or(true)),
            );
            for key in keys.as_binary::<i32>().iter().flatten() {
                logged.seq.push(seq_of(key)?);
            }
            batches.push(rows.project(&own)?);
        }
        logged.held.rows = arrow::compute::concat_batches(&self.side_schema, &batches)?;
        logged.matched = logged
            .seq
            .iter()
            .map(|s| matched.binary_search(s).is_ok())
            .collect();
        Ok(logged)
    }
}

fn seq_of(key: &[u8]) -> Result<u64> {
    key.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| EngineError::Checkpoint("join row log: a stored row's key is damaged".into()))
}
