//! Continuous top-N (`ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..)`
//! bounded by `rn <= N`): the first N rows of every partition key.
//!
//! Rows are encoded in Arrow's row format, the ORDER BY columns first and
//! then the input columns the result uses (the kept columns), so comparing
//! two encodings compares the order and breaks ties by those columns: the
//! top-N is a function of the set of rows seen, not of their arrival order,
//! and rows equal in all of them give the same result. The other columns
//! are never stored, and a row is encoded whole only if its ORDER BY values
//! can beat its key's worst kept row. As in a continuous aggregation, rows
//! are queued by the grid point after their stamp and folded in when the
//! watermark passes it; each fold emits the ranks whose row changed.
//!
//! With a state store ([`RankOperator::with_store`]), the tops live in its
//! table `ranks`, one row per partition key: under the memory budget the
//! least recently used keys' tops are written there and dropped, and read
//! back when a row of the key comes again; a checkpoint writes the tops
//! changed since the last one. A top read back is the same bytes as the one
//! written, so the output does not depend on what was in memory when.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, Int64Array, RecordBatch, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::continuous::flush_grid;
use super::emit::{project, upserts_by_key};
use super::eval::eval_all;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{EventTime, PhysicalExprRef, QueryOptions, RankPlan};
use crate::state::backing::{Backing, key_column_fields};
use crate::state::keyed::{Evicted, typed_batch};
use crate::state::{Interner, PendingRows, SharedStore, StateEntry};
use crate::time::MIN_TIME;

/// The name of a state batch's `i`-th ORDER BY value column: this prefix, then `i`.
const ORDER_COLUMN: &str = "__order_";

/// One kept row: its encoding and the rank it was last emitted at.
struct Entry {
    row: Vec<u8>,
    /// Bytes of `row` that encode the ORDER BY values (its first bytes:
    /// the row format concatenates its columns' encodings).
    order_len: u32,
    /// 1-based rank of the last emission of this row, 0 if never emitted
    /// (a rank fits: the bound on the row number is at most `u32::MAX`).
    shown: u32,
}

impl Entry {
    fn order(&self) -> &[u8] {
        &self.row[..self.order_len as usize]
    }
}

/// Bytes before each encoded row of a stored top: its length, its order
/// length and its shown rank, u32 little-endian each.
const ENTRY_HEADER: usize = 12;

/// A top's entries as stored: each entry's header, then its row.
fn encode_entries(entries: &[Entry], out: &mut Vec<u8>) {
    for e in entries {
        out.extend_from_slice(&(e.row.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.order_len.to_le_bytes());
        out.extend_from_slice(&e.shown.to_le_bytes());
        out.extend_from_slice(&e.row);
    }
}

fn decode_entries(mut bytes: &[u8]) -> Result<Vec<Entry>> {
    let corrupt = || EngineError::Checkpoint("top-N state: a stored top is damaged".into());
    let word = |b: &[u8], i: usize| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
    let mut entries = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < ENTRY_HEADER {
            return Err(corrupt());
        }
        let (len, order_len, shown) = (word(bytes, 0) as usize, word(bytes, 1), word(bytes, 2));
        let rest = &bytes[ENTRY_HEADER..];
        if rest.len() < len || order_len as usize > len {
            return Err(corrupt());
        }
        entries.push(Entry {
            row: rest[..len].to_vec(),
            order_len,
            shown,
        });
        bytes = &rest[len..];
    }
    Ok(entries)
}

/// The kept rows of one partition key, best first.
struct Top {
    entries: Vec<Entry>,
    /// Latest event time folded in (the record timestamp).
    max_time: i64,
    dirty: bool,
    /// Its latest time rose since the last fold tick (tracked for window
    /// functions over the top-N only).
    retimed: bool,
}

impl Top {
    /// Bytes its rows hold (what [`RankOperator::rows_held`] counts).
    fn bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|e| std::mem::size_of::<Entry>() + e.row.capacity())
            .sum()
    }
}

impl Default for Top {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            max_time: MIN_TIME,
            dirty: false,
            retimed: false,
        }
    }
}

pub struct RankOperator {
    grid: i64,
    has_event_time: bool,
    limit: usize,
    partition_exprs: Vec<PhysicalExprRef>,
    order_exprs: Vec<PhysicalExprRef>,
    /// Encodes ORDER BY values, then the kept input columns.
    converter: RowConverter,
    /// Encodes the ORDER BY values alone: most rows lose to a key's worst
    /// kept row on them, and are never encoded whole.
    order_converter: RowConverter,
    groups: Interner,
    tops: Vec<Top>,
    dirty: Vec<usize>,
    pending: PendingRows,
    input_schema: SchemaRef,
    /// The input columns a kept row holds ([`RankPlan::kept`]).
    kept: Vec<usize>,
    /// Their schema.
    kept_schema: SchemaRef,
    ranked_schema: SchemaRef,
    projection: Vec<PhysicalExprRef>,
    output_schema: SchemaRef,
    key_columns: Vec<usize>,
    /// Reused per fold: each row's group.
    group_of: Vec<usize>,
    /// Bytes the kept rows hold in memory, kept up to date as they change
    /// (the memory budget asks after every batch).
    rows_held: usize,
    /// The store table behind the tops, if any.
    backing: Option<Backing>,
    /// The store outlives the process: checkpoints write the changed tops
    /// there, not into the snapshot.
    store_durable: bool,
    /// Window functions read this top-N's changes as rows
    /// ([`Self::fold_tick_changes`]): rows pushed out of a top after they
    /// were emitted are kept until then, and keys whose time rose are listed.
    track_changes: bool,
    /// Rows pushed out of their key's top since the last tick.
    displaced: Vec<Entry>,
    /// Keys whose latest time rose since the last tick.
    retimed: Vec<usize>,
}

/// What one fold tick changed in a top-N, as result rows (the SELECT list).
pub(crate) struct RankChanges {
    /// The rows that left the rank they were emitted at, as emitted there.
    pub gone: RecordBatch,
    /// The rows at a rank they were not emitted at, and their key's time.
    pub placed: RecordBatch,
    pub placed_times: Vec<i64>,
    /// The other rows of keys whose latest time rose, and that time.
    pub retimed: RecordBatch,
    pub retimed_times: Vec<i64>,
}

impl RankOperator {
    pub fn new(
        plan: &RankPlan,
        options: &QueryOptions,
        input_schema: SchemaRef,
        output_schema: SchemaRef,
        key_columns: Vec<usize>,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.event_time, EventTime::Column(_));
        let grid = flush_grid(&plan.event_time, options);
        let order_types = plan
            .order
            .iter()
            .map(|(e, opts)| {
                Ok(SortField::new_with_options(
                    e.data_type(&input_schema)?,
                    *opts,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let order_converter = RowConverter::new(order_types.clone())?;
        let kept_schema = Arc::new(input_schema.project(&plan.kept)?);
        let fields: Vec<SortField> = order_types
            .into_iter()
            .chain(
                kept_schema
                    .fields()
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone())),
            )
            .collect();
        Ok(Self {
            grid,
            has_event_time,
            limit: plan.limit.max(1),
            partition_exprs: plan.partition_exprs.clone(),
            order_exprs: plan.order.iter().map(|(e, _)| Arc::clone(e)).collect(),
            converter: RowConverter::new(fields)?,
            order_converter,
            groups: Interner::new(&plan.partition_fields)?,
            tops: Vec::new(),
            dirty: Vec::new(),
            pending: PendingRows::new(Arc::clone(&input_schema), "__time"),
            input_schema,
            kept: plan.kept.clone(),
            kept_schema,
            ranked_schema: Arc::clone(&plan.ranked_schema),
            projection: plan.projection.clone(),
            output_schema,
            key_columns,
            group_of: Vec::new(),
            rows_held: 0,
            backing: None,
            store_durable: false,
            track_changes: false,
            displaced: Vec::new(),
            retimed: Vec::new(),
        })
    }

    /// Makes [`Self::fold_tick_changes`] available (window functions).
    pub(crate) fn tracking_changes(mut self) -> Self {
        self.track_changes = true;
        self
    }

    /// Puts table `ranks` of `store` behind the tops (none for a global
    /// top-N: its one key stays in memory).
    pub fn with_store(mut self, store: &SharedStore) -> Result<Self> {
        if self.partition_exprs.is_empty() {
            return Ok(self);
        }
        let schema = self.stored_schema();
        self.backing = Some(Backing::new(
            store.clone(),
            "ranks",
            schema,
            self.groups.fields(),
        )?);
        self.store_durable = store.is_durable();
        self.pending.log_to(Some(store), "pending")?;
        Ok(self)
    }

    /// A stored top: its partition key, its entries, its latest time.
    fn stored_schema(&self) -> SchemaRef {
        let mut fields = key_column_fields(self.groups.fields());
        fields.push(Arc::new(Field::new("entries", DataType::Binary, false)));
        fields.push(Arc::new(Field::new("max_time", DataType::Int64, false)));
        Arc::new(Schema::new(fields))
    }

    /// The group of each row of `keys`: new keys get new groups, whose
    /// tops are read from the store when it may hold them.
    fn intern(&mut self, keys: &[ArrayRef], n: usize, group_of: &mut Vec<usize>) -> Result<()> {
        let before = self.groups.len();
        self.groups.intern(keys, n, group_of)?;
        let total = self.groups.len();
        if total > before {
            self.tops.resize_with(total, Top::default);
            let Some(b) = self.backing.as_mut() else {
                return Ok(());
            };
            b.grow(total);
            if b.cold {
                self.load((before..total).collect())?;
            }
        }
        Ok(())
    }

    /// Reads the stored tops of `groups` (new, empty) where the store has one.
    fn load(&mut self, groups: Vec<usize>) -> Result<()> {
        let keys = self.groups.keys(&groups)?;
        let b = self.backing.as_mut().expect("loading needs a store");
        let found = b.lookup(&keys, groups.len())?;
        let k = keys.len();
        let entries = found.values.column(k).as_binary::<i32>();
        let times = found.values.column(k + 1).as_primitive::<Int64Type>();
        for (j, &i) in found.found.iter().enumerate() {
            let top = &mut self.tops[groups[i]];
            top.entries = decode_entries(entries.value(j))?;
            top.max_time = times.value(j);
            self.rows_held += top.bytes();
        }
        Ok(())
    }

    /// Writes the tops of `groups` to the store; returns the bytes written.
    fn write_tops(&mut self, groups: &[usize]) -> Result<u64> {
        if groups.is_empty() {
            return Ok(0);
        }
        let mut columns = self.groups.keys(groups)?;
        let k = columns.len();
        let mut entries = BinaryBuilder::new();
        let mut bytes = Vec::new();
        for &g in groups {
            bytes.clear();
            encode_entries(&self.tops[g].entries, &mut bytes);
            entries.append_value(&bytes);
        }
        columns.push(Arc::new(entries.finish()));
        columns.push(Arc::new(Int64Array::from_iter_values(
            groups.iter().map(|&g| self.tops[g].max_time),
        )));
        let b = self.backing.as_mut().expect("writing needs a store");
        let rows = RecordBatch::try_new(Arc::clone(&b.table.schema), columns)?;
        b.write(&rows, k)
    }

    /// Writes the tops changed since they were last written to the store.
    fn persist(&mut self) -> Result<u64> {
        let Some(b) = self.backing.as_mut() else {
            return Ok(0);
        };
        let mut groups = b.changed.take();
        groups.sort_unstable();
        self.write_tops(&groups)
    }

    /// Keeps only the tops of `survivors` (ascending) in memory, renumbered
    /// from 0 in that order.
    fn rebuild(&mut self, survivors: &[usize]) -> Result<()> {
        self.groups.retain(survivors)?;
        let mut tops = std::mem::take(&mut self.tops);
        self.tops = survivors
            .iter()
            .map(|&g| std::mem::take(&mut tops[g]))
            .collect();
        self.rows_held = self.tops.iter().map(Top::bytes).sum();
        if let Some(b) = self.backing.as_mut() {
            b.keep(survivors);
        }
        Ok(())
    }

    /// Folds `batch` in; `times` are the rows' event times (or ordinals).
    fn fold(&mut self, batch: &RecordBatch, times: &[i64]) -> Result<()> {
        let n = batch.num_rows();
        let keys = eval_all(&self.partition_exprs, batch)?;
        let mut group_of = std::mem::take(&mut self.group_of);
        self.intern(&keys, n, &mut group_of)?;
        if let Some(b) = self.backing.as_mut() {
            // Every row's key changed: its latest time, if not its rows.
            b.touch(&group_of);
        }
        // The rows that may enter their key's top, judged on their ORDER BY
        // values against the tops as they were: a top only gets better, so
        // a row worse than its worst row then is worse than it later.
        let order = eval_all(&self.order_exprs, batch)?;
        let orders = self.order_converter.convert_columns(&order)?;
        let mut candidates: Vec<u32> = Vec::new();
        for (i, &g) in group_of.iter().enumerate() {
            let top = &mut self.tops[g];
            if self.has_event_time && times[i] > top.max_time {
                top.max_time = times[i];
                if self.track_changes && !top.retimed {
                    top.retimed = true;
                    self.retimed.push(g);
                }
            }
            let loses = top.entries.len() >= self.limit
                && top
                    .entries
                    .last()
                    .is_some_and(|worst| worst.order() < orders.row(i).as_ref());
            if !loses {
                candidates.push(i as u32);
            }
        }
        if candidates.is_empty() {
            self.group_of = group_of;
            return Ok(());
        }
        let picked = UInt32Array::from(candidates);
        let mut columns = order;
        columns.extend(self.kept.iter().map(|&c| Arc::clone(batch.column(c))));
        // Most rows lose (a top-1 of the highest bid), or none do (the
        // latest row per key): copy only the candidates, if not all.
        if picked.len() < n {
            columns = arrow::compute::take_arrays(&columns, &picked, None)?;
        }
        let rows = self.converter.convert_columns(&columns)?;
        for (j, &i) in picked.values().iter().enumerate() {
            let g = group_of[i as usize];
            let top = &mut self.tops[g];
            let row = rows.row(j);
            let candidate: &[u8] = row.as_ref();
            let order_len = orders.row(i as usize).as_ref().len();
            debug_assert_eq!(
                &candidate[..order_len],
                orders.row(i as usize).as_ref(),
                "a row's encoding starts with its ORDER BY values' encoding"
            );
            let full = top.entries.len() >= self.limit;
            if full
                && top
                    .entries
                    .last()
                    .is_some_and(|e| e.row.as_slice() <= candidate)
            {
                continue;
            }
            let at = top
                .entries
                .partition_point(|e| e.row.as_slice() <= candidate);
            // The evicted row's buffer holds the new one: no allocation
            // once a key's top is full.
            let fresh = || Entry {
                row: Vec::with_capacity(candidate.len()),
                order_len: 0,
                shown: 0,
            };
            // (entry, bytes it held before it is reused)
            let (mut entry, replaced) = match full {
                true => {
                    let out = top.entries.pop().expect("a full top has rows");
                    let held = std::mem::size_of::<Entry>() + out.row.capacity();
                    if self.track_changes && out.shown != 0 {
                        // Window functions take its emitted place back out.
                        self.rows_held -= held;
                        self.displaced.push(out);
                        (fresh(), 0)
                    } else {
                        (out, held)
                    }
                }
                false => (fresh(), 0),
            };
            entry.row.clear();
            entry.row.extend_from_slice(candidate);
            self.rows_held += std::mem::size_of::<Entry>() + entry.row.capacity() - replaced;
            entry.order_len = order_len as u32;
            entry.shown = 0;
            top.entries.insert(at, entry);
            if !top.dirty {
                top.dirty = true;
                self.dirty.push(g);
            }
        }
        self.group_of = group_of;
        Ok(())
    }

    /// The next grid point the watermark has passed with rows queued for it.
    pub(crate) fn due(&mut self, watermark: i64) -> Option<i64> {
        self.pending.due(watermark)
    }

    fn flush(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let picked = self.fold_tick(tick)?;
        self.emit(&picked, out)
    }

    /// Folds in the rows queued for `tick`, and returns the ranks whose
    /// row changed, as (key, 0-based rank), marking them shown.
    fn fold_tick(&mut self, tick: i64) -> Result<Vec<(usize, usize)>> {
        self.fold_pending(tick)?;
        Ok(self.changed_ranks())
    }

    /// Folds in the rows queued for `tick`.
    fn fold_pending(&mut self, tick: i64) -> Result<()> {
        let mut list = self.pending.take(tick);
        list.sort_by_key(|p| p.partition);
        for p in &list {
            self.fold(&p.batch, &p.values)?;
        }
        Ok(())
    }

    /// Folds in the rows queued for `tick` and returns what changed, as
    /// result rows ([`Self::tracking_changes`] only), marking the changed
    /// ranks shown. A row that moved to another rank is gone from the old
    /// one and placed at the new one.
    pub(crate) fn fold_tick_changes(&mut self, tick: i64) -> Result<RankChanges> {
        debug_assert!(
            self.track_changes,
            "changes are tracked for window functions"
        );
        self.fold_pending(tick)?;
        let mut groups = std::mem::take(&mut self.dirty);
        groups.append(&mut self.retimed);
        groups.sort_unstable();
        groups.dedup();
        let displaced = std::mem::take(&mut self.displaced);
        let mut gone: Vec<(&[u8], u64)> = displaced
            .iter()
            .map(|e| (e.row.as_slice(), u64::from(e.shown)))
            .collect();
        let (mut placed, mut retimed) = (Vec::new(), Vec::new());
        for &g in &groups {
            for (r, e) in self.tops[g].entries.iter().enumerate() {
                let rank = r as u32 + 1;
                if e.shown == rank {
                    retimed.push((g, r));
                    continue;
                }
                if e.shown != 0 {
                    gone.push((e.row.as_slice(), u64::from(e.shown)));
                }
                placed.push((g, r));
            }
        }
        let gone = self.rows_of(gone.into_iter())?;
        drop(displaced);
        for &g in &groups {
            let top = &mut self.tops[g];
            top.dirty = false;
            top.retimed = false;
            for (r, e) in top.entries.iter_mut().enumerate() {
                e.shown = r as u32 + 1;
            }
        }
        let times = |picked: &[(usize, usize)]| {
            picked.iter().map(|&(g, _)| self.tops[g].max_time).collect()
        };
        Ok(RankChanges {
            gone,
            placed: self.rows(&placed)?,
            placed_times: times(&placed),
            retimed: self.rows(&retimed)?,
            retimed_times: times(&retimed),
        })
    }

    /// Every kept row as a result row, and its key's latest time: each was
    /// emitted at its rank (between grid points a top-N holds no row it
    /// has not emitted). The tops in memory only.
    pub(crate) fn kept_rows(&self) -> Result<(RecordBatch, Vec<i64>)> {
        let mut all = Vec::new();
        let mut times = Vec::new();
        for (g, top) in self.tops.iter().enumerate() {
            for (r, e) in top.entries.iter().enumerate() {
                if e.shown != r as u32 + 1 {
                    return Err(EngineError::Checkpoint(format!(
                        "top-N state: a kept row at rank {} was last emitted at rank {}",
                        r + 1,
                        e.shown
                    )));
                }
                all.push((g, r));
                times.push(top.max_time);
            }
        }
        Ok((self.rows(&all)?, times))
    }

    /// The ranks whose row changed since the last call, as (key, 0-based
    /// rank), marked shown.
    fn changed_ranks(&mut self) -> Vec<(usize, usize)> {
        let mut picked: Vec<(usize, usize)> = Vec::new();
        for g in std::mem::take(&mut self.dirty) {
            let top = &mut self.tops[g];
            top.dirty = false;
            for (r, e) in top.entries.iter_mut().enumerate() {
                let rank = r as u32 + 1;
                if e.shown != rank {
                    e.shown = rank;
                    picked.push((g, r));
                }
            }
        }
        picked
    }

    /// Emits the rows at `picked` ranks, ordered by key.
    fn emit(&mut self, picked: &[(usize, usize)], out: &mut Output) -> Result<()> {
        if picked.is_empty() {
            return Ok(());
        }
        let rows = self.rows(picked)?;
        let times = picked.iter().map(|&(g, _)| self.tops[g].max_time).collect();
        out.changes.push(upserts_by_key(
            rows,
            times,
            self.has_event_time,
            &self.key_columns,
        )?);
        Ok(())
    }

    /// The result rows (the SELECT list) of the rows at `picked` ranks, in that order.
    fn rows(&self, picked: &[(usize, usize)]) -> Result<RecordBatch> {
        self.rows_of(
            picked
                .iter()
                .map(|&(g, r)| (self.tops[g].entries[r].row.as_slice(), r as u64 + 1)),
        )
    }

    /// The result rows of encoded kept rows, each at its 1-based rank.
    fn rows_of<'a>(&self, rows: impl Iterator<Item = (&'a [u8], u64)>) -> Result<RecordBatch> {
        let parser = self.converter.parser();
        let (encoded, ranks): (Vec<_>, Vec<u64>) =
            rows.map(|(row, rank)| (parser.parse(row), rank)).unzip();
        let decoded = self.converter.convert_rows(encoded)?;
        let mut columns: Vec<ArrayRef> = decoded[self.order_exprs.len()..].to_vec();
        columns.push(Arc::new(UInt64Array::from(ranks)));
        let ranked = RecordBatch::try_new(Arc::clone(&self.ranked_schema), columns)?;
        project(&self.projection, &ranked, &self.output_schema)
    }

    /// [`Self::kept_rows`] of every top, also those only the store holds
    /// (after writing the changed ones there).
    pub(crate) fn all_kept_rows(&mut self) -> Result<(RecordBatch, Vec<i64>)> {
        if !self.backing.as_ref().is_some_and(|b| b.cold) {
            return self.kept_rows();
        }
        let k = self.partition_exprs.len();
        let (mut entries, mut times) = (Vec::new(), Vec::new());
        for rows in &self.stored_tops()? {
            let tops = rows.column(k).as_binary::<i32>();
            let max_times = rows.column(k + 1).as_primitive::<Int64Type>();
            for i in 0..rows.num_rows() {
                for e in decode_entries(tops.value(i))? {
                    entries.push(e);
                    times.push(max_times.value(i));
                }
            }
        }
        let rows = self.rows_of(
            entries
                .iter()
                .map(|e| (e.row.as_slice(), u64::from(e.shown))),
        )?;
        Ok((rows, times))
    }

    /// Every top in the store, as stored, after writing the changed ones there.
    fn stored_tops(&mut self) -> Result<Vec<RecordBatch>> {
        self.persist()?;
        let mut stored = Vec::new();
        let b = self.backing.as_mut().expect("cold tops have a store");
        b.table.scan(|rows| {
            stored.push(rows);
            Ok(())
        })?;
        Ok(stored)
    }

    /// Whether rows carry event times (their keys' times are timestamps).
    pub(crate) fn has_event_time(&self) -> bool {
        self.has_event_time
    }

    /// Every kept row as a batch: partition keys, ORDER BY values, the kept
    /// columns, the rank it was last emitted at (0: not yet) and its key's
    /// latest time.
    fn state_batch(&mut self) -> Result<RecordBatch> {
        let mut groups = Vec::new();
        let mut times = Vec::new();
        for (g, top) in self.tops.iter().enumerate() {
            for _ in &top.entries {
                groups.push(g);
                times.push(top.max_time);
            }
        }
        let keys = self.groups.keys(&groups)?;
        let entries = self.tops.iter().flat_map(|t| &t.entries);
        self.entries_batch(keys, entries, times)
    }

    /// [`Self::state_batch`] of every top, also those in the store (after
    /// writing the changed ones there): the whole state, for a checkpoint
    /// that cannot refer to the store's files.
    fn state_batch_all(&mut self) -> Result<RecordBatch> {
        if !self.backing.as_ref().is_some_and(|b| b.cold) {
            return self.state_batch();
        }
        let stored = self.stored_tops()?;
        let k = self.partition_exprs.len();
        let mut parts = Vec::with_capacity(stored.len());
        for rows in stored {
            let tops = rows.column(k).as_binary::<i32>();
            let max_times = rows.column(k + 1).as_primitive::<Int64Type>();
            let (mut at, mut entries, mut times) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..rows.num_rows() {
                for e in decode_entries(tops.value(i))? {
                    at.push(i as u32);
                    entries.push(e);
                    times.push(max_times.value(i));
                }
            }
            let keys =
                arrow::compute::take_arrays(&rows.columns()[..k], &UInt32Array::from(at), None)?;
            parts.push(self.entries_batch(keys, entries.iter(), times)?);
        }
        Ok(arrow::compute::concat_batches(
            &self.state_schema()?,
            &parts,
        )?)
    }

    /// The state batch of `entries`, whose keys are `keys` and whose keys'
    /// latest times are `times` (a row each).
    fn entries_batch<'a>(
        &self,
        keys: Vec<ArrayRef>,
        entries: impl Iterator<Item = &'a Entry>,
        times: Vec<i64>,
    ) -> Result<RecordBatch> {
        let parser = self.converter.parser();
        let mut shown = Vec::with_capacity(times.len());
        let mut encoded = Vec::with_capacity(times.len());
        for e in entries {
            shown.push(u64::from(e.shown));
            encoded.push(parser.parse(&e.row));
        }
        let decoded = self.converter.convert_rows(encoded)?;
        let mut columns = keys;
        columns.extend(decoded);
        let rows = shown.len();
        columns.push(Arc::new(UInt64Array::from(shown)));
        columns.push(Arc::new(Int64Array::from(times)));
        // Keys read back from the store are nullable; the state's may not be.
        typed_batch(self.state_schema()?, columns, rows)
    }

    fn state_schema(&self) -> Result<SchemaRef> {
        let named = |name: String, t: DataType| Arc::new(Field::new(name, t, true));
        let mut fields: Vec<FieldRef> = self
            .groups
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| named(format!("__partition_{i}"), f.data_type().clone()))
            .collect();
        for (i, e) in self.order_exprs.iter().enumerate() {
            fields.push(named(
                format!("{ORDER_COLUMN}{i}"),
                e.data_type(&self.input_schema)?,
            ));
        }
        fields.extend(
            self.kept_schema
                .fields()
                .iter()
                .map(|f| Arc::new(f.as_ref().clone().with_nullable(true))),
        );
        fields.push(Arc::new(Field::new("__shown", DataType::UInt64, false)));
        fields.push(Arc::new(Field::new("__max_time", DataType::Int64, false)));
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The ORDER BY values and kept columns of a state batch's rows, whose
    /// columns start at `from`: as [`Self::state_batch`] writes them, or as
    /// builds before the kept columns wrote them (every input column).
    fn restored_columns(
        &self,
        batch: &RecordBatch,
        from: usize,
    ) -> Result<(Vec<ArrayRef>, Vec<ArrayRef>)> {
        let o = self.order_exprs.len();
        let m = self.kept.len();
        let width = batch.num_columns();
        let first = batch.schema().field(from).name().clone();
        if first == format!("{ORDER_COLUMN}0") && width == from + o + m + 2 {
            let c = batch.columns();
            return Ok((
                c[from..from + o].to_vec(),
                c[from + o..from + o + m].to_vec(),
            ));
        }
        let all = self.input_schema.fields().len();
        if width != from + all + 2 {
            return Err(EngineError::Checkpoint(format!(
                "top-N state has {width} columns, expected {} (or {} as written before)",
                from + o + m + 2,
                from + all + 2
            )));
        }
        let input = RecordBatch::try_new(
            Arc::clone(&self.input_schema),
            batch.columns()[from..from + all].to_vec(),
        )?;
        let kept = self
            .kept
            .iter()
            .map(|&c| Arc::clone(input.column(c)))
            .collect();
        Ok((eval_all(&self.order_exprs, &input)?, kept))
    }

    fn restore_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let k = self.partition_exprs.len();
        let (mut columns, kept) = self.restored_columns(batch, k)?;
        let n = batch.num_rows();
        let keys = batch.columns()[..k].to_vec();
        let mut group_of = Vec::new();
        self.groups.intern(&keys, n, &mut group_of)?;
        self.tops.resize_with(self.groups.len(), Top::default);
        if let Some(b) = self.backing.as_mut() {
            // Written whole: the next checkpoint writes them to the store.
            b.grow(self.groups.len());
            b.changed.mark(&group_of);
        }
        let orders = self.order_converter.convert_columns(&columns)?;
        columns.extend(kept);
        let rows = self.converter.convert_columns(&columns)?;
        let width = batch.num_columns();
        let col = |i: usize| batch.column(i).as_any();
        let shown = col(width - 2)
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| EngineError::Checkpoint("top-N state: bad __shown column".into()))?;
        let times = col(width - 1)
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| EngineError::Checkpoint("top-N state: bad __max_time column".into()))?;
        // Entries were written best first per key.
        for (i, &g) in group_of.iter().enumerate() {
            let top = &mut self.tops[g];
            top.max_time = times.value(i);
            let row = rows.row(i).as_ref().to_vec();
            self.rows_held += std::mem::size_of::<Entry>() + row.capacity();
            top.entries.push(Entry {
                row,
                order_len: orders.row(i).as_ref().len() as u32,
                shown: u32::try_from(shown.value(i)).map_err(|_| {
                    EngineError::Checkpoint("top-N state: a rank beyond 2^32".into())
                })?,
            });
        }
        Ok(())
    }
}

impl Operator for RankOperator {
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
        if self.backing.is_some() && self.store_durable {
            self.persist()?;
        } else {
            batches.push((StateEntry::Ranks, self.state_batch_all()?));
        }
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Ranks => self.restore_rows(&batch)?,
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("top-N")),
            }
        }
        self.pending.store_restored()?;
        match self.backing.as_mut() {
            Some(b) => b.restored(),
            None => Ok(()),
        }
    }

    fn state_size(&self) -> usize {
        self.rows_held
            + self.tops.capacity() * std::mem::size_of::<Top>()
            + self.groups.size()
            + self.pending.size()
            + self.backing.as_ref().map_or(0, Backing::size)
    }

    /// Moves the least recently used keys' tops to the store until about
    /// `target` bytes are held, writing those changed since last written.
    fn spill(&mut self, target: usize) -> Result<Evicted> {
        let n = self.groups.len();
        let pending = self.pending.size();
        let held = self.state_size().saturating_sub(pending);
        let target = target.saturating_sub(pending);
        let Some(b) = self.backing.as_ref() else {
            return Ok(Evicted::default());
        };
        if n == 0 || held <= target {
            return Ok(Evicted::default());
        }
        if !self.dirty.is_empty() {
            return Err(EngineError::internal(
                "eviction while tops wait to be emitted",
            ));
        }
        let keep = ((n as f64) * (target as f64 / held as f64)) as usize;
        let e = b.eviction(keep);
        let bytes_written = self.write_tops(&e.written)?;
        self.rebuild(&e.survivors)?;
        Ok(Evicted {
            groups: e.victims,
            written: e.written.len(),
            bytes_written,
        })
    }

    fn state_keys(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::TimeUnit;

    use super::*;
    use crate::plan::QueryKind;
    use crate::sql::{Catalog, plan_query};

    fn operator() -> RankOperator {
        let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new("ts", time, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("tag", DataType::Utf8, true),
        ]));
        let catalog = Catalog::new().with_table("orders", schema);
        let q = "SELECT merchant, amount, rn FROM (SELECT *, ROW_NUMBER() OVER \
                 (PARTITION BY merchant ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 2";
        let plan = plan_query(q, &catalog, QueryOptions::default()).unwrap();
        let QueryKind::Rank(r) = &plan.kind else {
            panic!("a top-N")
        };
        assert_eq!(r.kept, [0, 2], "ts and tag are not in the result");
        RankOperator::new(
            r,
            &plan.options,
            Arc::clone(&plan.input_schema),
            Arc::clone(&plan.output_schema),
            plan.key_columns.clone(),
        )
        .unwrap()
    }

    /// Four rounds of rows over 40 merchants, folded into a top-2 whose
    /// every key goes to the store after each round, and into one in
    /// memory: each round re-emits the same rows, and the whole state
    /// (read back from the store) is the same.
    #[test]
    fn tops_spilled_after_every_round_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::state::SharedStore::durable(
            ubik_state::StateStore::open(dir.path(), Default::default()).unwrap(),
        );
        let mut spilling = operator().with_store(&store).unwrap();
        let mut memory = operator();
        let schema = Arc::clone(&memory.input_schema);
        let sorted = |batch: RecordBatch| -> Vec<String> {
            let text = arrow::util::pretty::pretty_format_batches(&[batch]).unwrap();
            let mut lines: Vec<String> = text.to_string().lines().map(String::from).collect();
            lines.sort();
            lines
        };
        for round in 0..4i64 {
            let n = 100;
            let merchant: Vec<String> = (0..n)
                .map(|i| format!("m{:02}", (i * 7 + round) % 40))
                .collect();
            let amount: Vec<f64> = (0..n).map(|i| ((i * 13 + round * 5) % 23) as f64).collect();
            let times: Vec<i64> = (0..n).map(|i| round * 1000 + i).collect();
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringArray::from(merchant)),
                    Arc::new(TimestampMicrosecondArray::from(times.clone()).with_timezone("UTC")),
                    Arc::new(Float64Array::from(amount)),
                    Arc::new(StringArray::from(vec![Some("t"); n as usize])),
                ],
            )
            .unwrap();
            let mut emitted = Vec::new();
            for op in [&mut spilling, &mut memory] {
                op.fold(&batch, &times).unwrap();
                let picked = op.changed_ranks();
                emitted.push(sorted(op.rows(&picked).unwrap()));
            }
            assert_eq!(emitted[0], emitted[1], "round {round}");
            let evicted = spilling.spill(0).unwrap();
            assert_eq!(evicted.groups, 40, "round {round}: every key leaves memory");
            assert_eq!(spilling.tops.len(), 0);
        }
        let all = spilling.state_batch_all().unwrap();
        assert_eq!(all.num_rows(), 80, "two rows for each of 40 keys");
        assert_eq!(sorted(all), sorted(memory.state_batch().unwrap()));
    }

    fn kept_rows(op: &RankOperator) -> Vec<String> {
        let rows = op.kept_rows().unwrap().0;
        let text = arrow::util::pretty::pretty_format_batches(&[rows]).unwrap();
        text.to_string().lines().map(String::from).collect()
    }

    /// State written before top-N rows kept only their result's columns
    /// (every input column, no ORDER BY values) restores to the same rows
    /// as today's state, which round-trips.
    #[test]
    fn state_of_every_input_column_restores() {
        let mut old = operator();
        let fields: Vec<Field> = [
            Field::new("__partition_0", DataType::Utf8, true),
            Field::new("merchant", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("amount", DataType::Float64, true),
            Field::new("tag", DataType::Utf8, true),
            Field::new("__shown", DataType::UInt64, false),
            Field::new("__max_time", DataType::Int64, false),
        ]
        .into();
        let merchants = || Arc::new(StringArray::from(vec!["a", "a", "b"])) as ArrayRef;
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            vec![
                merchants(),
                merchants(),
                Arc::new(TimestampMicrosecondArray::from(vec![3, 1, 2]).with_timezone("UTC")),
                Arc::new(Float64Array::from(vec![5.0, 3.0, 1.0])),
                Arc::new(StringArray::from(vec![Some("x"), Some("y"), None])),
                Arc::new(UInt64Array::from(vec![1, 2, 1])),
                Arc::new(Int64Array::from(vec![3, 3, 2])),
            ],
        )
        .unwrap();
        old.restore(OperatorSnapshot::new(vec![(StateEntry::Ranks, batch)]))
            .unwrap();
        let rows = kept_rows(&old);
        assert!(
            rows.iter()
                .any(|l| l.contains("| a        | 5.0    | 1  |")),
            "{rows:?}"
        );
        assert!(
            rows.iter()
                .any(|l| l.contains("| a        | 3.0    | 2  |")),
            "{rows:?}"
        );

        let snapshot = old.handle_checkpoint().unwrap();
        let mut new = operator();
        new.restore(snapshot).unwrap();
        assert_eq!(kept_rows(&new), rows);
        assert_eq!(new.tops[0].max_time, 3);
    }
}
