//! Aggregate window functions over a top-N's rows ([`OverPlan`], Nexmark
//! q6: the average winning price of a seller's last auctions).
//!
//! The top-N runs as it does alone; at each grid point it folds in, the
//! ranks whose row changed are applied here instead of being emitted. Every
//! current row of the top-N is kept in its partition's B-tree, ordered by
//! its encoding in Arrow's row format (ORDER BY, then every column), so a
//! row's frame is its neighbours in the tree and the order never depends
//! on arrival. The rows whose frame held a changed row's old place or holds
//! its new one are recomputed from their frame and upserted, keyed by the
//! top-N's key, ordered by key. A row's record timestamp is the latest
//! event time folded into any top-N key of its frames.
//!
//! Which rows are recomputed is found in two passes, the old places in the
//! trees before any change and the new places after all of them, so it
//! depends on the set of changes of a grid point, not on their order. The
//! kept rows are the top-N's own rows: a checkpoint holds only the
//! top-N's state, and a restore rebuilds the trees from it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::emit::{project, upserts_by_key};
use super::eval::{eval_all, eval_array};
use super::rank::RankOperator;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::accumulate::exact::ExactSum;
use crate::error::{EngineError, Result};
use crate::plan::{OverAggregate, OverFunction, OverPlan, PhysicalExprRef, QueryOptions};
use crate::state::Interner;
use crate::time::MIN_TIME;

/// One function argument of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
}

/// Where a kept row stands: its partition and its place in the tree.
struct Place {
    partition: u32,
    sort: Arc<[u8]>,
}

pub struct OverOperator {
    rank: RankOperator,
    partition_exprs: Vec<PhysicalExprRef>,
    order_exprs: Vec<PhysicalExprRef>,
    functions: Vec<OverFunction>,
    /// Encodes ORDER BY values, then every column of the top-N's rows.
    converter: RowConverter,
    partitions: Interner,
    /// Per partition, its rows by place: the row's id.
    trees: Vec<BTreeMap<Arc<[u8]>, u32>>,
    /// Per row id (top-N key × limit + rank), where it stands.
    places: Vec<Option<Place>>,
    /// Per row id, its function arguments (`functions.len()` each).
    args: Vec<Value>,
    /// The most rows a frame reaches before / after its row.
    max_preceding: usize,
    max_following: usize,
    dirty: Vec<u32>,
    is_dirty: Vec<bool>,
    over_schema: SchemaRef,
    projection: Vec<PhysicalExprRef>,
    output_schema: SchemaRef,
    key_columns: Vec<usize>,
}

impl OverOperator {
    pub fn new(
        plan: &OverPlan,
        options: &QueryOptions,
        input_schema: SchemaRef,
        output_schema: SchemaRef,
        key_columns: Vec<usize>,
    ) -> Result<Self> {
        // The top-N's rows come here only, so they need no key order.
        let rank = RankOperator::new(
            &plan.rank,
            options,
            input_schema,
            Arc::clone(&plan.rank_schema),
            Vec::new(),
        )?;
        let fields: Vec<SortField> = plan
            .order
            .iter()
            .map(|(e, opts)| {
                Ok(SortField::new_with_options(
                    e.data_type(&plan.rank_schema)?,
                    *opts,
                ))
            })
            .chain(
                plan.rank_schema
                    .fields()
                    .iter()
                    .map(|f| Ok(SortField::new(f.data_type().clone()))),
            )
            .collect::<Result<_>>()?;
        Ok(Self {
            rank,
            partition_exprs: plan.partition_exprs.clone(),
            order_exprs: plan.order.iter().map(|(e, _)| Arc::clone(e)).collect(),
            functions: plan.functions.clone(),
            converter: RowConverter::new(fields)?,
            partitions: Interner::new(&plan.partition_fields)?,
            trees: Vec::new(),
            places: Vec::new(),
            args: Vec::new(),
            max_preceding: plan
                .functions
                .iter()
                .map(|f| f.preceding)
                .max()
                .unwrap_or(0),
            max_following: plan
                .functions
                .iter()
                .map(|f| f.following)
                .max()
                .unwrap_or(0),
            dirty: Vec::new(),
            is_dirty: Vec::new(),
            over_schema: Arc::clone(&plan.over_schema),
            projection: plan.projection.clone(),
            output_schema,
            key_columns,
        })
    }

    fn row_id(&self, (g, r): (usize, usize)) -> Result<u32> {
        u32::try_from(g * self.rank.limit() + r).map_err(|_| {
            EngineError::unsupported(
                "more than 4 294 967 295 rows under window functions",
                "bound the top-N's keys (its PARTITION BY) or split the input",
            )
        })
    }

    fn pick_of(&self, id: u32) -> (usize, usize) {
        let limit = self.rank.limit();
        (id as usize / limit, id as usize % limit)
    }

    /// Places the rows of the ranks `picked` (their rows changed) and marks
    /// every row whose frame changed.
    fn place(&mut self, picked: &[(usize, usize)]) -> Result<()> {
        if picked.is_empty() {
            return Ok(());
        }
        let rows = self.rank.rows(picked)?;
        let ids = picked
            .iter()
            .map(|&p| self.row_id(p))
            .collect::<Result<Vec<_>>>()?;
        let (partitions, sorts, args) = self.describe(&rows)?;
        let max_id = ids.iter().max().map_or(0, |&m| m as usize + 1);
        if self.places.len() < max_id {
            self.places.resize_with(max_id, || None);
            self.args.resize(max_id * self.functions.len(), Value::Null);
            self.is_dirty.resize(max_id, false);
        }
        if self.trees.len() < self.partitions.len() {
            self.trees.resize_with(self.partitions.len(), BTreeMap::new);
        }
        // Old places first, in the trees as they were; then every change;
        // then the new places, in the trees as they are.
        let mut moved = vec![true; ids.len()];
        for (i, &id) in ids.iter().enumerate() {
            if let Some(old) = &self.places[id as usize] {
                let same =
                    old.partition as usize == partitions[i] && *old.sort == *sorts.row(i).as_ref();
                moved[i] = !same;
                if !same {
                    let (p, s) = (old.partition as usize, Arc::clone(&old.sort));
                    self.mark_around(p, &s);
                }
            }
        }
        let mut placed = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            if !moved[i] {
                continue;
            }
            if let Some(old) = self.places[id as usize].take() {
                self.trees[old.partition as usize].remove(&old.sort);
            }
            let sort: Arc<[u8]> = sorts.row(i).as_ref().into();
            // Rows hold their top-N key, so no two rows encode alike.
            if let Some(other) = self.trees[partitions[i]].insert(Arc::clone(&sort), id)
                && other != id
            {
                return Err(EngineError::internal(
                    "two rows under window functions encode alike",
                ));
            }
            placed.push((partitions[i], Arc::clone(&sort), id));
            self.places[id as usize] = Some(Place {
                partition: partitions[i] as u32,
                sort,
            });
            let k = self.functions.len();
            self.args[id as usize * k..(id as usize + 1) * k]
                .copy_from_slice(&args[i * k..(i + 1) * k]);
        }
        for (partition, sort, id) in placed {
            self.mark_around(partition, &sort);
            mark(&mut self.is_dirty, &mut self.dirty, id);
        }
        Ok(())
    }

    /// Each row's partition, place encoding and function arguments.
    fn describe(
        &mut self,
        rows: &RecordBatch,
    ) -> Result<(Vec<usize>, arrow::row::Rows, Vec<Value>)> {
        let n = rows.num_rows();
        let keys = eval_all(&self.partition_exprs, rows)?;
        let mut partitions = Vec::new();
        self.partitions.intern(&keys, n, &mut partitions)?;
        let mut columns = eval_all(&self.order_exprs, rows)?;
        columns.extend(rows.columns().iter().cloned());
        let sorts = self.converter.convert_columns(&columns)?;
        let k = self.functions.len();
        let mut args = vec![Value::Null; n * k];
        for (j, f) in self.functions.iter().enumerate() {
            let a = eval_array(f.arg.as_ref(), rows)?;
            read_values(f, &a, |i, v| args[i * k + j] = v)?;
        }
        Ok((partitions, sorts, args))
    }

    /// Marks the rows whose frame holds the place `sort` of `partition`:
    /// those up to the widest FOLLOWING before it, and the widest PRECEDING
    /// after it. Fields are borrowed apart so the tree is walked in place
    /// (no list of ids per upsert).
    fn mark_around(&mut self, partition: usize, sort: &[u8]) {
        let tree = &self.trees[partition];
        let before = tree
            .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(sort)))
            .rev()
            .take(self.max_following);
        let after = tree
            .range::<[u8], _>((Bound::Excluded(sort), Bound::Unbounded))
            .take(self.max_preceding);
        for (_, &id) in before.chain(after) {
            mark(&mut self.is_dirty, &mut self.dirty, id);
        }
    }

    /// Emits every marked row with its functions computed over its frame.
    fn emit(&mut self, out: &mut Output) -> Result<()> {
        let mut ids = std::mem::take(&mut self.dirty);
        if ids.is_empty() {
            return Ok(());
        }
        ids.sort_unstable();
        for &id in &ids {
            self.is_dirty[id as usize] = false;
        }
        let k = self.functions.len();
        let mut results: Vec<Vec<Value>> = vec![Vec::with_capacity(ids.len()); k];
        let mut times = Vec::with_capacity(ids.len());
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for &id in &ids {
            let place = self.places[id as usize].as_ref().ok_or_else(|| {
                EngineError::internal("a marked row under window functions is not kept")
            })?;
            let tree = &self.trees[place.partition as usize];
            before.clear();
            before.extend(
                tree.range::<[u8], _>((Bound::Unbounded, Bound::Excluded(&*place.sort)))
                    .rev()
                    .take(self.max_preceding)
                    .map(|(_, &i)| i),
            );
            after.clear();
            after.extend(
                tree.range::<[u8], _>((Bound::Excluded(&*place.sort), Bound::Unbounded))
                    .take(self.max_following)
                    .map(|(_, &i)| i),
            );
            let frame_rows = |f: &OverFunction| {
                before[..f.preceding.min(before.len())]
                    .iter()
                    .chain(std::iter::once(&id))
                    .chain(&after[..f.following.min(after.len())])
                    .copied()
            };
            for (j, f) in self.functions.iter().enumerate() {
                let values = frame_rows(f).map(|r| self.args[r as usize * k + j]);
                results[j].push(aggregate(f.aggregate, values));
            }
            let frames = before.iter().chain(std::iter::once(&id)).chain(&after);
            let time = frames
                .map(|&r| self.rank.max_time(self.pick_of(r).0))
                .max()
                .unwrap_or(MIN_TIME);
            times.push(time);
        }
        let picks: Vec<(usize, usize)> = ids.iter().map(|&id| self.pick_of(id)).collect();
        let rows = self.rank.rows(&picks)?;
        let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
        for (f, values) in self.functions.iter().zip(results) {
            columns.push(to_array(f, values)?);
        }
        let over = RecordBatch::try_new(Arc::clone(&self.over_schema), columns)?;
        let rows = project(&self.projection, &over, &self.output_schema)?;
        out.changes.push(upserts_by_key(
            rows,
            times,
            self.rank.has_event_time(),
            &self.key_columns,
        )?);
        Ok(())
    }

    /// Rebuilds the trees from the top-N's restored rows.
    fn rebuild(&mut self) -> Result<()> {
        let kept = self.rank.kept()?;
        self.place(&kept)?;
        // Every row was emitted before the checkpoint.
        for id in std::mem::take(&mut self.dirty) {
            self.is_dirty[id as usize] = false;
        }
        Ok(())
    }
}

/// Calls `set(row, value)` for every row of `a`, an argument of `f`.
fn read_values(f: &OverFunction, a: &ArrayRef, mut set: impl FnMut(usize, Value)) -> Result<()> {
    if f.aggregate == OverAggregate::Count {
        for i in 0..a.len() {
            set(
                i,
                if a.is_null(i) {
                    Value::Null
                } else {
                    Value::Int(1)
                },
            );
        }
        return Ok(());
    }
    match a.data_type() {
        t if t.is_integer() && *t != DataType::UInt64 => {
            let a = cast(a, &DataType::Int64)?;
            for (i, v) in a.as_primitive::<Int64Type>().iter().enumerate() {
                set(i, v.map_or(Value::Null, Value::Int));
            }
        }
        t if t.is_floating() => {
            let a = cast(a, &DataType::Float64)?;
            for (i, v) in a.as_primitive::<Float64Type>().iter().enumerate() {
                set(i, v.map_or(Value::Null, Value::Float));
            }
        }
        other => {
            return Err(EngineError::internal(format!(
                "a window function's argument of type {other} passed planning"
            )));
        }
    }
    Ok(())
}

/// `aggregate` of `values`, nulls skipped.
fn aggregate(aggregate: OverAggregate, values: impl Iterator<Item = Value>) -> Value {
    let mut count = 0i64;
    let mut int_sum = 0i64;
    let mut exact = ExactSum::default();
    let mut best: Option<Value> = None;
    let mut floats = false;
    for v in values {
        let better = |b: &Value| match (aggregate, v, *b) {
            (OverAggregate::Min, Value::Int(x), Value::Int(y)) => x < y,
            (OverAggregate::Max, Value::Int(x), Value::Int(y)) => x > y,
            (OverAggregate::Min, Value::Float(x), Value::Float(y)) => x.total_cmp(&y).is_lt(),
            (OverAggregate::Max, Value::Float(x), Value::Float(y)) => x.total_cmp(&y).is_gt(),
            _ => false,
        };
        match v {
            Value::Null => continue,
            Value::Int(x) => {
                int_sum = int_sum.wrapping_add(x);
                exact.add(x as f64);
            }
            Value::Float(x) => {
                floats = true;
                exact.add(x);
            }
        }
        count += 1;
        if best.as_ref().is_none_or(better) {
            best = Some(v);
        }
    }
    match aggregate {
        OverAggregate::Count => Value::Int(count),
        _ if count == 0 => Value::Null,
        OverAggregate::Sum if floats => Value::Float(exact.value()),
        OverAggregate::Sum => Value::Int(int_sum),
        OverAggregate::Avg => Value::Float(exact.value() / count as f64),
        OverAggregate::Min | OverAggregate::Max => best.unwrap_or(Value::Null),
    }
}

/// The function's results as an array of its DataFusion type.
fn to_array(f: &OverFunction, values: Vec<Value>) -> Result<ArrayRef> {
    let ints: Option<Vec<Option<i64>>> = values
        .iter()
        .map(|v| match v {
            Value::Null => Some(None),
            Value::Int(x) => Some(Some(*x)),
            Value::Float(_) => None,
        })
        .collect();
    let array: ArrayRef = match ints {
        Some(ints) if !f.field.data_type().is_floating() => Arc::new(Int64Array::from(ints)),
        _ => Arc::new(Float64Array::from_iter(values.into_iter().map(
            |v| match v {
                Value::Null => None,
                Value::Int(x) => Some(x as f64),
                Value::Float(x) => Some(x),
            },
        ))),
    };
    if array.data_type() == f.field.data_type() {
        return Ok(array);
    }
    Ok(cast(&array, f.field.data_type())?)
}

impl Operator for OverOperator {
    fn process_batch(&mut self, input: StampedBatch, out: &mut Output) -> Result<()> {
        self.rank.process_batch(input, out)
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        while let Some(tick) = self.rank.due(watermark) {
            let picked = self.rank.fold_tick(tick)?;
            self.place(&picked)?;
            self.emit(out)?;
        }
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        self.rank.handle_checkpoint()
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        self.rank.restore(snapshot)?;
        self.rebuild()
    }

    fn state_size(&self) -> usize {
        let tree_rows: usize = self.trees.iter().map(|t| t.len()).sum();
        let sort_bytes: usize = self
            .places
            .iter()
            .flatten()
            .map(|p| p.sort.len() + 16)
            .sum();
        self.rank.state_size()
            + sort_bytes
            // A B-tree entry: the shared key pointer and the id, plus node overhead.
            + tree_rows * 32
            + self.places.capacity() * std::mem::size_of::<Option<Place>>()
            + self.args.capacity() * std::mem::size_of::<Value>()
            + self.partitions.size()
    }

    fn state_keys(&self) -> usize {
        self.rank.state_keys()
    }
}

/// Adds row `id` to the rows to recompute, once.
fn mark(is_dirty: &mut [bool], dirty: &mut Vec<u32>, id: u32) {
    if !is_dirty[id as usize] {
        is_dirty[id as usize] = true;
        dirty.push(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(a: OverAggregate, values: &[Value]) -> Value {
        aggregate(a, values.iter().copied())
    }

    #[test]
    fn nulls_are_skipped_and_no_value_is_null() {
        let v = [Value::Int(4), Value::Null, Value::Int(-1)];
        assert_eq!(of(OverAggregate::Count, &v), Value::Int(2));
        assert_eq!(of(OverAggregate::Sum, &v), Value::Int(3));
        assert_eq!(of(OverAggregate::Avg, &v), Value::Float(1.5));
        assert_eq!(of(OverAggregate::Min, &v), Value::Int(-1));
        assert_eq!(of(OverAggregate::Max, &v), Value::Int(4));
        for a in [
            OverAggregate::Sum,
            OverAggregate::Avg,
            OverAggregate::Min,
            OverAggregate::Max,
        ] {
            assert_eq!(of(a, &[Value::Null]), Value::Null);
        }
        assert_eq!(of(OverAggregate::Count, &[Value::Null]), Value::Int(0));
    }

    #[test]
    fn float_sums_are_exact_and_order_free() {
        let v = [Value::Float(1e16), Value::Float(1.0), Value::Float(-1e16)];
        let mut r = v;
        r.reverse();
        assert_eq!(of(OverAggregate::Sum, &v), Value::Float(1.0));
        assert_eq!(of(OverAggregate::Sum, &r), Value::Float(1.0));
        assert_eq!(of(OverAggregate::Avg, &v), Value::Float(1.0 / 3.0));
    }

    #[test]
    fn integer_sums_wrap_as_datafusions_do() {
        let v = [Value::Int(i64::MAX), Value::Int(1)];
        assert_eq!(of(OverAggregate::Sum, &v), Value::Int(i64::MIN));
    }

    #[test]
    fn nan_is_the_largest_float() {
        let v = [
            Value::Float(f64::NAN),
            Value::Float(2.0),
            Value::Float(-0.5),
        ];
        assert!(matches!(of(OverAggregate::Max, &v), Value::Float(x) if x.is_nan()));
        assert_eq!(of(OverAggregate::Min, &v), Value::Float(-0.5));
    }
}
