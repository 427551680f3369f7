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

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::continuous::flush_grid;
use super::emit::{project, upserts_by_key};
use super::eval::eval_all;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{EventTime, PhysicalExprRef, QueryOptions, RankPlan};
use crate::state::{Interner, PendingRows, StateEntry};
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

/// The kept rows of one partition key, best first.
struct Top {
    entries: Vec<Entry>,
    /// Latest event time folded in (the record timestamp).
    max_time: i64,
    dirty: bool,
}

impl Default for Top {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            max_time: MIN_TIME,
            dirty: false,
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
        })
    }

    /// Folds `batch` in; `times` are the rows' event times (or ordinals).
    fn fold(&mut self, batch: &RecordBatch, times: &[i64]) -> Result<()> {
        let n = batch.num_rows();
        let keys = eval_all(&self.partition_exprs, batch)?;
        let mut group_of = std::mem::take(&mut self.group_of);
        self.groups.intern(&keys, n, &mut group_of)?;
        if self.tops.len() < self.groups.len() {
            self.tops.resize_with(self.groups.len(), Top::default);
        }
        // The rows that may enter their key's top, judged on their ORDER BY
        // values against the tops as they were: a top only gets better, so
        // a row worse than its worst row then is worse than it later.
        let order = eval_all(&self.order_exprs, batch)?;
        let orders = self.order_converter.convert_columns(&order)?;
        let mut candidates: Vec<u32> = Vec::new();
        for (i, &g) in group_of.iter().enumerate() {
            let top = &mut self.tops[g];
            if self.has_event_time {
                top.max_time = top.max_time.max(times[i]);
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
            let mut entry = match full {
                true => top.entries.pop().expect("a full top has rows"),
                false => Entry {
                    row: Vec::with_capacity(candidate.len()),
                    order_len: 0,
                    shown: 0,
                },
            };
            entry.row.clear();
            entry.row.extend_from_slice(candidate);
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
    pub(crate) fn fold_tick(&mut self, tick: i64) -> Result<Vec<(usize, usize)>> {
        let mut list = self.pending.take(tick);
        if list.is_empty() {
            return Ok(Vec::new());
        }
        list.sort_by_key(|p| p.partition);
        for p in &list {
            self.fold(&p.batch, &p.values)?;
        }
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
        Ok(picked)
    }

    /// Emits the rows at `picked` ranks, ordered by key.
    fn emit(&mut self, picked: &[(usize, usize)], out: &mut Output) -> Result<()> {
        if picked.is_empty() {
            return Ok(());
        }
        let rows = self.rows(picked)?;
        let times = picked.iter().map(|&(g, _)| self.max_time(g)).collect();
        out.changes.push(upserts_by_key(
            rows,
            times,
            self.has_event_time,
            &self.key_columns,
        )?);
        Ok(())
    }

    /// The result rows (the SELECT list) of the rows at `picked` ranks, in that order.
    pub(crate) fn rows(&self, picked: &[(usize, usize)]) -> Result<RecordBatch> {
        let parser = self.converter.parser();
        let encoded = picked
            .iter()
            .map(|&(g, r)| parser.parse(&self.tops[g].entries[r].row));
        let decoded = self.converter.convert_rows(encoded)?;
        let mut columns: Vec<ArrayRef> = decoded[self.order_exprs.len()..].to_vec();
        columns.push(Arc::new(UInt64Array::from_iter_values(
            picked.iter().map(|&(_, r)| r as u64 + 1),
        )));
        let ranked = RecordBatch::try_new(Arc::clone(&self.ranked_schema), columns)?;
        project(&self.projection, &ranked, &self.output_schema)
    }

    /// The latest event time folded into key `g` (`MIN_TIME`: none; the
    /// row's ordinal for a query without event time).
    pub(crate) fn max_time(&self, g: usize) -> i64 {
        self.tops[g].max_time
    }

    /// Whether rows carry event times (their keys' times are timestamps).
    pub(crate) fn has_event_time(&self) -> bool {
        self.has_event_time
    }

    /// Rows kept per key.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Every kept row, as (key, 0-based rank), each already emitted at its
    /// rank: between grid points a top-N holds no row it has not emitted.
    pub(crate) fn kept(&self) -> Result<Vec<(usize, usize)>> {
        let mut all = Vec::new();
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
            }
        }
        Ok(all)
    }

    /// Every kept row as a batch: partition keys, ORDER BY values, the kept
    /// columns, the rank it was last emitted at (0: not yet) and its key's
    /// latest time.
    fn state_batch(&mut self) -> Result<RecordBatch> {
        let mut groups = Vec::new();
        let mut shown = Vec::new();
        let mut times = Vec::new();
        let parser = self.converter.parser();
        let mut encoded = Vec::new();
        for (g, top) in self.tops.iter().enumerate() {
            for e in &top.entries {
                groups.push(g);
                shown.push(e.shown);
                times.push(top.max_time);
                encoded.push(parser.parse(&e.row));
            }
        }
        let decoded = self.converter.convert_rows(encoded)?;
        let mut columns = self.groups.keys(&groups)?;
        columns.extend(decoded);
        columns.push(Arc::new(UInt64Array::from_iter_values(
            shown.into_iter().map(u64::from),
        )));
        columns.push(Arc::new(Int64Array::from(times)));
        Ok(RecordBatch::try_new(self.state_schema()?, columns)?)
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
            top.entries.push(Entry {
                row: rows.row(i).as_ref().to_vec(),
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
        let mut batches = vec![(StateEntry::Ranks, self.state_batch()?)];
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
        Ok(())
    }

    fn state_size(&self) -> usize {
        let rows: usize = self
            .tops
            .iter()
            .map(|t| {
                t.entries.capacity() * std::mem::size_of::<Entry>()
                    + t.entries.iter().map(|e| e.row.capacity()).sum::<usize>()
            })
            .sum();
        rows + self.tops.capacity() * std::mem::size_of::<Top>()
            + self.groups.size()
            + self.pending.size()
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

    fn kept_rows(op: &RankOperator) -> Vec<String> {
        let rows = op.rows(&op.kept().unwrap()).unwrap();
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
        assert_eq!(new.max_time(0), 3);
    }
}
