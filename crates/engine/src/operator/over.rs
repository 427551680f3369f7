//! Aggregate window functions over a top-N's rows ([`OverPlan`], Nexmark
//! q6: the average winning price of a seller's last auctions).
//!
//! The top-N runs as it does alone; at each grid point it folds in, it
//! reports the rows that left a rank and the rows placed at one
//! ([`RankChanges`]) instead of emitting them. Every current row of the
//! top-N is kept in its partition's B-tree, keyed by its encoding in
//! Arrow's row format (ORDER BY, then every column of the top-N's row, its
//! rank included), so a row's frame is its neighbours in the tree, the
//! order never depends on arrival, and the key holds the whole row: a row
//! is emitted from its tree alone. The rows whose frame held a gone row's
//! place or holds a placed row's are recomputed from their frame and
//! upserted, keyed by the top-N's key, ordered by key. A row's record
//! timestamp is the latest event time folded into any top-N key of its
//! frame: each kept row carries its key's, updated when the key's time
//! rises.
//!
//! Which rows are recomputed is found in two passes, the old places in the
//! trees before any change and the new places after all of them, so it
//! depends on the set of changes of a grid point, not on their order.
//!
//! With a state store ([`OverOperator::with_store`]) the top-N's tops spill
//! as a top-N's do (table `ranks`), and the trees are rows of the table
//! `over`, one per partition key: under the memory budget the least
//! recently used partitions leave memory and are read back when a change
//! reaches them; a checkpoint writes the partitions changed since the last
//! one. Without a durable store a checkpoint holds only the top-N's state,
//! and a restore rebuilds the trees from it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, Float64Array, Int64Array, RecordBatch,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::emit::{project, upserts_by_key};
use super::eval::{eval_all, eval_array};
use super::rank::{RankChanges, RankOperator};
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::accumulate::exact::ExactSum;
use crate::error::{EngineError, Result};
use crate::plan::{OverAggregate, OverFunction, OverPlan, PhysicalExprRef, QueryOptions};
use crate::state::backing::{Backing, key_column_fields};
use crate::state::keyed::Evicted;
use crate::state::{Interner, SharedStore};
use crate::time::MIN_TIME;

/// One function argument of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
}

/// One kept row, keyed in its partition's tree by its place: its top-N
/// key's latest time and its function arguments.
struct Slot {
    time: i64,
    args: Box<[Value]>,
    /// Waits in [`OverOperator::dirty`] to be recomputed.
    marked: bool,
}

type Tree = BTreeMap<Box<[u8]>, Slot>;

/// Bytes a kept row costs besides its place's encoding and arguments: the
/// slot, the boxed key's pointer and the B-tree node's share.
const SLOT_BYTES: usize = std::mem::size_of::<Slot>() + 16 + 24;

/// Bytes a stored argument takes: a tag, then 8 bytes.
const STORED_ARG: usize = 9;

fn slot_bytes(place: usize, args: usize) -> usize {
    SLOT_BYTES + place + args * std::mem::size_of::<Value>()
}

/// A partition's tree as stored: per row, its place's length (u32 LE), the
/// place, its time (i64 LE) and its arguments ([`STORED_ARG`] bytes each).
fn encode_tree(tree: &Tree, out: &mut Vec<u8>) {
    for (place, slot) in tree {
        out.extend_from_slice(&(place.len() as u32).to_le_bytes());
        out.extend_from_slice(place);
        out.extend_from_slice(&slot.time.to_le_bytes());
        for v in &slot.args {
            let (tag, bits) = match *v {
                Value::Null => (0u8, 0u64),
                Value::Int(x) => (1, x as u64),
                Value::Float(x) => (2, x.to_bits()),
            };
            out.push(tag);
            out.extend_from_slice(&bits.to_le_bytes());
        }
    }
}

/// The tree [`encode_tree`] wrote, and the bytes it holds in memory.
fn decode_tree(mut bytes: &[u8], functions: usize) -> Result<(Tree, usize)> {
    let corrupt =
        || EngineError::Checkpoint("window function state: a stored tree is damaged".into());
    let mut tree = Tree::new();
    let mut held = 0;
    while !bytes.is_empty() {
        let len =
            u32::from_le_bytes(bytes.get(..4).ok_or_else(corrupt)?.try_into().unwrap()) as usize;
        let need = 4 + len + 8 + functions * STORED_ARG;
        let row = bytes.get(..need).ok_or_else(corrupt)?;
        let place: Box<[u8]> = row[4..4 + len].into();
        let time = i64::from_le_bytes(row[4 + len..12 + len].try_into().unwrap());
        let args = row[12 + len..]
            .chunks_exact(STORED_ARG)
            .map(|a| {
                let bits = u64::from_le_bytes(a[1..].try_into().unwrap());
                match a[0] {
                    0 => Ok(Value::Null),
                    1 => Ok(Value::Int(bits as i64)),
                    2 => Ok(Value::Float(f64::from_bits(bits))),
                    _ => Err(corrupt()),
                }
            })
            .collect::<Result<Box<[Value]>>>()?;
        held += slot_bytes(place.len(), args.len());
        let slot = Slot {
            time,
            args,
            marked: false,
        };
        if tree.insert(place, slot).is_some() {
            return Err(corrupt());
        }
        bytes = &bytes[need..];
    }
    Ok((tree, held))
}

/// Rows of the top-N described for the trees: each row's partition and
/// place (and, if asked, its function arguments).
struct Described {
    partitions: Vec<usize>,
    places: arrow::row::Rows,
    args: Vec<Value>,
}

pub struct OverOperator {
    rank: RankOperator,
    partition_exprs: Vec<PhysicalExprRef>,
    order_exprs: Vec<PhysicalExprRef>,
    functions: Vec<OverFunction>,
    /// Encodes ORDER BY values, then every column of the top-N's rows.
    converter: RowConverter,
    partitions: Interner,
    /// Per partition, its rows by place.
    trees: Vec<Tree>,
    /// Per partition, the bytes its tree holds; and their sum.
    tree_sizes: Vec<usize>,
    tree_bytes: usize,
    /// The most rows a frame reaches before / after its row.
    max_preceding: usize,
    max_following: usize,
    /// Rows to recompute: (partition, place), a place at most once marked.
    dirty: Vec<(usize, Box<[u8]>)>,
    rank_schema: SchemaRef,
    over_schema: SchemaRef,
    projection: Vec<PhysicalExprRef>,
    output_schema: SchemaRef,
    key_columns: Vec<usize>,
    /// The store table behind the trees, if any.
    backing: Option<Backing>,
    store_durable: bool,
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
        )?
        .tracking_changes();
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
            tree_sizes: Vec::new(),
            tree_bytes: 0,
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
            rank_schema: Arc::clone(&plan.rank_schema),
            over_schema: Arc::clone(&plan.over_schema),
            projection: plan.projection.clone(),
            output_schema,
            key_columns,
            backing: None,
            store_durable: false,
        })
    }

    /// Puts the top-N's tops and the trees (table `over`, one row per
    /// partition key) in `store`. Without PARTITION BY the one tree stays
    /// in memory.
    pub fn with_store(mut self, store: &SharedStore) -> Result<Self> {
        self.rank = self.rank.with_store(store)?;
        if self.partition_exprs.is_empty() {
            return Ok(self);
        }
        let mut fields = key_column_fields(self.partitions.fields());
        fields.push(Arc::new(Field::new("rows", DataType::Binary, false)));
        self.backing = Some(Backing::new(
            store.clone(),
            "over",
            Arc::new(Schema::new(fields)),
            self.partitions.fields(),
        )?);
        self.store_durable = store.is_durable();
        Ok(self)
    }

    /// The partition of each of `n` rows with partition keys `keys`: new
    /// partitions get a tree, read from the store when it may hold one.
    fn intern(&mut self, keys: &[ArrayRef], n: usize, out: &mut Vec<usize>) -> Result<()> {
        let before = self.partitions.len();
        self.partitions.intern(keys, n, out)?;
        let total = self.partitions.len();
        if total > before {
            self.trees.resize_with(total, Tree::new);
            self.tree_sizes.resize(total, 0);
            if let Some(b) = self.backing.as_mut() {
                b.grow(total);
                if b.cold {
                    self.load((before..total).collect())?;
                }
            }
        }
        Ok(())
    }

    /// Reads the stored trees of `partitions` (new, empty) where the store has one.
    fn load(&mut self, partitions: Vec<usize>) -> Result<()> {
        let keys = self.partitions.keys(&partitions)?;
        let b = self.backing.as_mut().expect("loading needs a store");
        let found = b.lookup(&keys, partitions.len())?;
        let blobs = found.values.column(keys.len()).as_binary::<i32>();
        for (j, &i) in found.found.iter().enumerate() {
            let p = partitions[i];
            let (tree, held) = decode_tree(blobs.value(j), self.functions.len())?;
            self.trees[p] = tree;
            self.tree_sizes[p] = held;
            self.tree_bytes += held;
        }
        Ok(())
    }

    /// Writes the trees of `partitions` to the store; returns the bytes written.
    fn write_trees(&mut self, partitions: &[usize]) -> Result<u64> {
        if partitions.is_empty() {
            return Ok(0);
        }
        let mut columns = self.partitions.keys(partitions)?;
        let k = columns.len();
        let mut rows = BinaryBuilder::new();
        let mut bytes = Vec::new();
        for &p in partitions {
            bytes.clear();
            encode_tree(&self.trees[p], &mut bytes);
            rows.append_value(&bytes);
        }
        columns.push(Arc::new(rows.finish()));
        let b = self.backing.as_mut().expect("writing needs a store");
        let batch = RecordBatch::try_new(Arc::clone(&b.table.schema), columns)?;
        b.write(&batch, k)
    }

    /// Writes the trees changed since they were last written to the store.
    fn persist(&mut self) -> Result<u64> {
        let Some(b) = self.backing.as_mut() else {
            return Ok(0);
        };
        let mut partitions = b.changed.take();
        partitions.sort_unstable();
        self.write_trees(&partitions)
    }

    /// Keeps only the trees of `survivors` (ascending) in memory, renumbered
    /// from 0 in that order.
    fn rebuild(&mut self, survivors: &[usize]) -> Result<()> {
        self.partitions.retain(survivors)?;
        let mut trees = std::mem::take(&mut self.trees);
        self.trees = survivors
            .iter()
            .map(|&p| std::mem::take(&mut trees[p]))
            .collect();
        self.tree_sizes = survivors.iter().map(|&p| self.tree_sizes[p]).collect();
        self.tree_bytes = self.tree_sizes.iter().sum();
        if let Some(b) = self.backing.as_mut() {
            b.keep(survivors);
        }
        Ok(())
    }

    /// Each row's partition and place, and with `args` its function arguments.
    fn describe(&mut self, rows: &RecordBatch, args: bool) -> Result<Described> {
        let n = rows.num_rows();
        let keys = eval_all(&self.partition_exprs, rows)?;
        let mut partitions = Vec::new();
        self.intern(&keys, n, &mut partitions)?;
        let mut columns = eval_all(&self.order_exprs, rows)?;
        columns.extend(rows.columns().iter().cloned());
        let places = self.converter.convert_columns(&columns)?;
        let k = self.functions.len();
        let mut values = Vec::new();
        if args {
            values = vec![Value::Null; n * k];
            for (j, f) in self.functions.iter().enumerate() {
                let a = eval_array(f.arg.as_ref(), rows)?;
                read_values(f, &a, |i, v| values[i * k + j] = v)?;
            }
        }
        Ok(Described {
            partitions,
            places,
            args: values,
        })
    }

    /// Applies a fold tick's changes to the trees and marks every row whose
    /// frame changed: old places first, in the trees as they were; then
    /// every change; then the new places, in the trees as they are.
    fn apply(&mut self, changes: RankChanges) -> Result<()> {
        let gone = self.describe(&changes.gone, false)?;
        let placed = self.describe(&changes.placed, true)?;
        let retimed = self.describe(&changes.retimed, false)?;
        if let Some(b) = self.backing.as_mut() {
            for d in [&gone, &placed, &retimed] {
                b.touch(&d.partitions);
            }
        }
        for (i, &p) in gone.partitions.iter().enumerate() {
            self.mark_around(p, gone.places.row(i).as_ref());
        }
        let k = self.functions.len();
        for (i, &p) in gone.partitions.iter().enumerate() {
            let Some(slot) = self.trees[p].remove(gone.places.row(i).as_ref()) else {
                return Err(EngineError::internal(
                    "a row left a top-N under window functions without being kept",
                ));
            };
            self.resize(p, gone.places.row(i).as_ref().len(), slot.args.len(), false);
        }
        for (i, &p) in placed.partitions.iter().enumerate() {
            let place: Box<[u8]> = placed.places.row(i).as_ref().into();
            let slot = Slot {
                time: changes.placed_times[i],
                args: placed.args[i * k..(i + 1) * k].into(),
                marked: false,
            };
            self.resize(p, place.len(), k, true);
            // Rows hold their top-N key and rank, so no two rows encode alike.
            if self.trees[p].insert(place, slot).is_some() {
                return Err(EngineError::internal(
                    "two rows under window functions encode alike",
                ));
            }
        }
        for (i, &p) in retimed.partitions.iter().enumerate() {
            let slot = self.trees[p]
                .get_mut(retimed.places.row(i).as_ref())
                .ok_or_else(|| {
                    EngineError::internal("a kept row under window functions is not in its tree")
                })?;
            slot.time = changes.retimed_times[i];
        }
        for (i, &p) in placed.partitions.iter().enumerate() {
            let place = placed.places.row(i);
            self.mark_around(p, place.as_ref());
            mark(&mut self.trees[p], &mut self.dirty, p, place.as_ref());
        }
        Ok(())
    }

    /// Counts a row of `place` bytes and `args` arguments into (or out of) partition `p`.
    fn resize(&mut self, p: usize, place: usize, args: usize, added: bool) {
        let bytes = slot_bytes(place, args);
        if added {
            self.tree_sizes[p] += bytes;
            self.tree_bytes += bytes;
        } else {
            self.tree_sizes[p] -= bytes;
            self.tree_bytes -= bytes;
        }
    }

    /// Marks the rows whose frame holds the place `place` of `partition`:
    /// those up to the widest FOLLOWING before it, and the widest PRECEDING
    /// after it.
    fn mark_around(&mut self, partition: usize, place: &[u8]) {
        let tree = &mut self.trees[partition];
        let dirty = &mut self.dirty;
        let before = tree
            .range_mut::<[u8], _>((Bound::Unbounded, Bound::Excluded(place)))
            .rev()
            .take(self.max_following);
        for (key, slot) in before {
            mark_slot(slot, dirty, partition, key);
        }
        let after = tree
            .range_mut::<[u8], _>((Bound::Excluded(place), Bound::Unbounded))
            .take(self.max_preceding);
        for (key, slot) in after {
            mark_slot(slot, dirty, partition, key);
        }
    }

    /// Emits every marked row with its functions computed over its frame.
    fn emit(&mut self, out: &mut Output) -> Result<()> {
        let mut marked = std::mem::take(&mut self.dirty);
        if marked.is_empty() {
            return Ok(());
        }
        marked.sort_unstable();
        // A place marked and then taken out (its row left) is gone; one
        // marked again after it was re-placed is listed twice.
        let trees = &mut self.trees;
        marked.retain(|(p, place)| match trees[*p].get_mut(&**place) {
            Some(slot) if slot.marked => {
                slot.marked = false;
                true
            }
            _ => false,
        });
        if marked.is_empty() {
            return Ok(());
        }
        let k = self.functions.len();
        let mut results: Vec<Vec<Value>> = vec![Vec::with_capacity(marked.len()); k];
        let mut times = Vec::with_capacity(marked.len());
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for (p, place) in &marked {
            let tree = &self.trees[*p];
            let at = &tree[&**place];
            before.clear();
            before.extend(
                tree.range::<[u8], _>((Bound::Unbounded, Bound::Excluded(&**place)))
                    .rev()
                    .take(self.max_preceding)
                    .map(|(_, s)| s),
            );
            after.clear();
            after.extend(
                tree.range::<[u8], _>((Bound::Excluded(&**place), Bound::Unbounded))
                    .take(self.max_following)
                    .map(|(_, s)| s),
            );
            for (j, f) in self.functions.iter().enumerate() {
                let values = before[..f.preceding.min(before.len())]
                    .iter()
                    .chain(std::iter::once(&at))
                    .chain(&after[..f.following.min(after.len())])
                    .map(|s| s.args[j]);
                results[j].push(aggregate(f.aggregate, values));
            }
            let time = before
                .iter()
                .chain(std::iter::once(&at))
                .chain(&after)
                .map(|s| s.time)
                .max()
                .unwrap_or(MIN_TIME);
            times.push(time);
        }
        let emitted: Vec<&[u8]> = marked.iter().map(|(_, place)| &**place).collect();
        let mut columns = self.decode(&emitted)?;
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

    /// The top-N's rows (its result columns) at `places`.
    fn decode(&self, places: &[&[u8]]) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        let decoded = self
            .converter
            .convert_rows(places.iter().map(|p| parser.parse(p)))?;
        decoded[self.order_exprs.len()..]
            .iter()
            .zip(self.rank_schema.fields())
            .map(|(c, f)| match c.data_type() == f.data_type() {
                true => Ok(Arc::clone(c)),
                false => Ok(cast(c, f.data_type())?),
            })
            .collect()
    }

    /// Rebuilds the trees from every row of the top-N (all read back from
    /// its store if need be): a restore without the trees stored.
    fn rebuild_from_top_n(&mut self) -> Result<()> {
        let (rows, times) = self.rank.all_kept_rows()?;
        let schema = rows.schema();
        let none = RecordBatch::new_empty(Arc::clone(&schema));
        self.apply(RankChanges {
            gone: none.clone(),
            placed: rows,
            placed_times: times,
            retimed: none,
            retimed_times: Vec::new(),
        })?;
        // Every row was emitted before the checkpoint.
        for (p, place) in std::mem::take(&mut self.dirty) {
            if let Some(slot) = self.trees[p].get_mut(&*place) {
                slot.marked = false;
            }
        }
        Ok(())
    }
}

/// Marks the row at `place` of tree `partition`, once.
fn mark(tree: &mut Tree, dirty: &mut Vec<(usize, Box<[u8]>)>, partition: usize, place: &[u8]) {
    if let Some(slot) = tree.get_mut(place) {
        mark_slot(slot, dirty, partition, place);
    }
}

fn mark_slot(slot: &mut Slot, dirty: &mut Vec<(usize, Box<[u8]>)>, partition: usize, place: &[u8]) {
    if !slot.marked {
        slot.marked = true;
        dirty.push((partition, place.into()));
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
            let changes = self.rank.fold_tick_changes(tick)?;
            self.apply(changes)?;
            self.emit(out)?;
        }
        Ok(())
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let snapshot = self.rank.handle_checkpoint()?;
        if self.store_durable {
            self.persist()?;
        }
        Ok(snapshot)
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        self.rank.restore(snapshot)?;
        let stored = match self.backing.as_mut() {
            Some(b) if self.store_durable => {
                b.restored()?;
                b.cold
            }
            _ => false,
        };
        // A checkpoint without the trees stored (no durable store, or
        // written before they were) holds the top-N's rows: rebuild.
        if !stored {
            self.rebuild_from_top_n()?;
        }
        Ok(())
    }

    fn state_size(&self) -> usize {
        self.rank.state_size()
            + self.tree_bytes
            + self.trees.capacity() * std::mem::size_of::<Tree>()
            + self.tree_sizes.capacity() * 8
            + self.partitions.size()
            + self.backing.as_ref().map_or(0, Backing::size)
    }

    /// Moves the least recently used tops and partitions to the store until
    /// about `target` bytes are held, each part its share.
    fn spill(&mut self, target: usize) -> Result<Evicted> {
        let rank = self.rank.state_size();
        let held = self.state_size();
        if held <= target {
            return Ok(Evicted::default());
        }
        let share = |part: usize| (target as f64 * part as f64 / held as f64) as usize;
        let mut evicted = self.rank.spill(share(rank))?;
        let trees = held - rank;
        let target = share(trees);
        let n = self.partitions.len();
        let Some(b) = self.backing.as_ref() else {
            return Ok(evicted);
        };
        if n == 0 || trees <= target {
            return Ok(evicted);
        }
        if !self.dirty.is_empty() {
            return Err(EngineError::internal(
                "eviction while rows under window functions wait to be emitted",
            ));
        }
        let keep = ((n as f64) * (target as f64 / trees as f64)) as usize;
        let e = b.eviction(keep);
        let bytes_written = self.write_trees(&e.written)?;
        self.rebuild(&e.survivors)?;
        evicted += Evicted {
            groups: e.victims,
            written: e.written.len(),
            bytes_written,
        };
        Ok(evicted)
    }

    fn state_keys(&self) -> usize {
        self.rank.state_keys() + self.partitions.len()
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::TimestampMicrosecondArray;
    use arrow::datatypes::TimeUnit;

    use super::*;
    use crate::plan::QueryKind;
    use crate::sql::{Catalog, plan_query};
    use crate::state::SharedStore;

    fn operator(store: Option<&SharedStore>) -> OverOperator {
        let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("seller", DataType::Int64, true),
            Field::new("price", DataType::Int64, true),
            Field::new("ts", time, true),
        ]));
        let catalog = Catalog::new().with_table("bids", schema);
        let q = "SELECT Q.id, Q.seller, avg(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.ts \
                 ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS a FROM (SELECT * FROM (SELECT \
                 id, seller, price, ts, ROW_NUMBER() OVER (PARTITION BY id, seller ORDER BY \
                 price DESC) AS rn FROM bids) WHERE rn <= 1) Q";
        let plan = plan_query(q, &catalog, QueryOptions::default()).unwrap();
        let QueryKind::Over(o) = &plan.kind else {
            panic!("window functions over a top-N")
        };
        let op = OverOperator::new(
            o,
            &plan.options,
            Arc::clone(&plan.input_schema),
            Arc::clone(&plan.output_schema),
            plan.key_columns.clone(),
        )
        .unwrap();
        match store {
            Some(store) => op.with_store(store).unwrap(),
            None => op,
        }
    }

    /// Each result row with its record timestamp, sorted.
    fn lines(out: &Output) -> Vec<String> {
        let mut lines = Vec::new();
        for c in &out.changes {
            let text =
                arrow::util::pretty::pretty_format_batches(std::slice::from_ref(&c.rows)).unwrap();
            let text = text.to_string();
            let rows: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("| "))
                .skip(1)
                .collect();
            for (i, row) in rows.iter().enumerate() {
                lines.push(format!("{row} @{}", c.timestamps.value(i)));
            }
        }
        lines.sort();
        lines
    }

    /// Each emitted row's record timestamp against its definition: the
    /// latest bid time of any auction in its frame (the seller's winning
    /// bids by time, the row's and the two before it). `bids` are every
    /// (auction, price, time) so far.
    fn check_times(out: &Output, bids: &[(i64, i64, i64)], round: i64) {
        use std::collections::HashMap;
        let mut best: HashMap<i64, (i64, i64)> = HashMap::new();
        let mut latest: HashMap<i64, i64> = HashMap::new();
        for &(a, price, t) in bids {
            let e = best.entry(a).or_insert((price, t));
            if price > e.0 || (price == e.0 && t < e.1) {
                *e = (price, t);
            }
            let l = latest.entry(a).or_insert(t);
            *l = (*l).max(t);
        }
        for c in &out.changes {
            let ids = c.rows.column(0).as_primitive::<Int64Type>();
            for (i, id) in ids.values().iter().enumerate() {
                let mut seller: Vec<(i64, i64)> = best
                    .iter()
                    .filter(|(a, _)| *a % 7 == id % 7)
                    .map(|(a, (_, t))| (*t, *a))
                    .collect();
                seller.sort_unstable();
                let at = seller.iter().position(|(_, a)| a == id).unwrap();
                let frame = &seller[at.saturating_sub(2)..=at];
                let want = frame.iter().map(|(_, a)| latest[a]).max().unwrap();
                assert_eq!(c.timestamps.value(i), want, "round {round}, auction {id}");
            }
        }
    }

    /// Six rounds of bids over 60 auctions of 7 sellers, into window
    /// functions in memory and into ones whose every top and tree goes to
    /// the store after each round, replaced after round 2 by ones restored
    /// from their checkpoint: every round emits the same rows with the same
    /// timestamps, each as defined.
    /// Round `round`'s 90 bids over 60 auctions of 7 sellers, and their times.
    fn bids_of(round: i64) -> (RecordBatch, Vec<(i64, i64, i64)>) {
        let n = 90;
        let id: Vec<i64> = (0..n).map(|i| (i * 7 + round * 3) % 60).collect();
        let seller: Vec<i64> = id.iter().map(|a| a % 7).collect();
        let price: Vec<i64> = (0..n).map(|i| (i * 13 + round * 5) % 41).collect();
        let times: Vec<i64> = (0..n).map(|i| round * 10_000_000 + i * 1000).collect();
        let bids = (0..n as usize)
            .map(|i| (id[i], price[i], times[i]))
            .collect();
        let time = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("seller", DataType::Int64, true),
            Field::new("price", DataType::Int64, true),
            Field::new("ts", time, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(id)),
            Arc::new(Int64Array::from(seller)),
            Arc::new(Int64Array::from(price)),
            Arc::new(TimestampMicrosecondArray::from(times).with_timezone("UTC")),
        ];
        let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
        (batch, bids)
    }

    /// Feeds round `round`'s bids to `op` and folds them in; checks the
    /// emitted rows' timestamps against every bid so far (`bids`) and
    /// returns the rows.
    fn feed(op: &mut OverOperator, round: i64, bids: &mut Vec<(i64, i64, i64)>) -> Vec<String> {
        let (batch, new) = bids_of(round);
        let n = batch.num_rows();
        bids.extend(new.iter().copied());
        let mut out = Output::default();
        let stamped = StampedBatch {
            partition: 0,
            batch,
            times: new.iter().map(|b| b.2).collect(),
            stamps: vec![round * 10_000_000; n],
            origin: (0..n as u32).collect(),
        };
        op.process_batch(stamped, &mut out).unwrap();
        op.handle_watermark((round + 1) * 10_000_000, &mut out)
            .unwrap();
        check_times(&out, bids, round);
        let rows = lines(&out);
        assert!(!rows.is_empty(), "round {round} emits");
        rows
    }

    fn durable_store(dir: &std::path::Path) -> SharedStore {
        SharedStore::durable(ubik_state::StateStore::open(dir, Default::default()).unwrap())
    }

    /// Six rounds of bids into window functions in memory and into ones
    /// whose every top and tree goes to the store after each round,
    /// replaced after round 2 by ones restored from their checkpoint: every
    /// round emits the same rows with the same timestamps, each as defined.
    #[test]
    fn trees_spilled_after_every_round_and_restored_emit_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let store = durable_store(dir.path());
        let mut memory = operator(None);
        let mut spilling = operator(Some(&store));
        let (mut bids, mut same_bids) = (Vec::new(), Vec::new());
        for round in 0..6i64 {
            let want = feed(&mut memory, round, &mut bids);
            assert_eq!(
                want,
                feed(&mut spilling, round, &mut same_bids),
                "round {round}"
            );
            let evicted = spilling.spill(0).unwrap();
            assert!(
                evicted.groups > 60,
                "round {round}: tops and trees leave memory"
            );
            assert_eq!((spilling.trees.len(), spilling.tree_bytes), (0, 0));
            if round == 2 {
                let snapshot = spilling.handle_checkpoint().unwrap();
                let mut fresh = operator(Some(&store));
                fresh.restore(snapshot).unwrap();
                assert_eq!(fresh.trees.len(), 0, "trees are read back when reached");
                spilling = fresh;
            }
        }
    }

    /// A checkpoint whose store holds the top-N's tops but no trees (as
    /// builds before the trees were stored wrote it) restores by rebuilding
    /// the trees from every top, those only the store holds included.
    #[test]
    fn a_checkpoint_without_stored_trees_rebuilds_them_from_the_top_n() {
        let dir = tempfile::tempdir().unwrap();
        let store = durable_store(dir.path());
        let mut memory = operator(None);
        let mut old = operator(Some(&store));
        let (mut bids, mut same_bids) = (Vec::new(), Vec::new());
        for round in 0..3i64 {
            feed(&mut memory, round, &mut bids);
            feed(&mut old, round, &mut same_bids);
        }
        // Only the top-N's state, its tops spilled: no tree is stored.
        old.rank.spill(0).unwrap();
        let snapshot = old.rank.handle_checkpoint().unwrap();
        let mut restored = operator(Some(&store));
        restored.restore(snapshot).unwrap();
        assert_eq!(restored.trees.len(), 7, "every seller's tree is rebuilt");
        for round in 3..6i64 {
            let want = feed(&mut memory, round, &mut bids);
            assert_eq!(
                want,
                feed(&mut restored, round, &mut same_bids),
                "round {round}"
            );
        }
    }

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
