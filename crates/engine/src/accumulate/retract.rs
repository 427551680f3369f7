//! Accumulators that take rows back out, for aggregations over a
//! changelog (a Debezium source): an update retracts the old row and folds
//! the new one in. Counts and exact float sums retract natively
//! ([`super::native`]); here are integer sums, which must know when their
//! last value left (the sum is then NULL again), and `min`/`max`, which
//! keep a count per distinct value so that the extreme can be taken back.
//! Their state grows with the distinct values of each group.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::marker::PhantomData;
use std::sync::Arc;

use arrow::array::ArrowNativeTypeOp;
use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array};
use arrow::array::{PrimitiveArray, UInt32Array};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, FieldRef, Int64Type};
use arrow::row::{RowConverter, SortField};

use super::native::{for_each_row, grow};
use super::{StreamAccumulator, row_mask};
use crate::error::{EngineError, Result};

fn field(name: &str, dt: DataType) -> FieldRef {
    Arc::new(Field::new(name, dt, true))
}

// ---------------------------------------------------------------- integer sum

/// `sum` over 64-bit integers (wrapping, as DataFusion's), with the count
/// of values folded in: NULL when none is left.
#[derive(Debug)]
pub struct RetractSumInt<T: ArrowPrimitiveType> {
    sums: Vec<T::Native>,
    counts: Vec<i64>,
    _t: PhantomData<fn() -> T>,
}

impl<T: ArrowPrimitiveType> Default for RetractSumInt<T> {
    fn default() -> Self {
        Self {
            sums: Vec::new(),
            counts: Vec::new(),
            _t: PhantomData,
        }
    }
}

impl<T: ArrowPrimitiveType> RetractSumInt<T> {
    pub fn state_fields(dt: &DataType) -> Vec<FieldRef> {
        vec![field("sum", dt.clone()), field("count", DataType::Int64)]
    }

    fn fold(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        sign: i64,
        total: usize,
    ) {
        grow(&mut self.sums, total, T::Native::default());
        grow(&mut self.counts, total, 0);
        let mask = row_mask(args, filter);
        let v = args[0].as_primitive::<T>().values();
        let (sums, counts) = (&mut self.sums, &mut self.counts);
        for_each_row(groups, &mask, |i, g| {
            sums[g] = if sign > 0 {
                sums[g].add_wrapping(v[i])
            } else {
                sums[g].sub_wrapping(v[i])
            };
            counts[g] += sign;
        });
    }
}

impl<T: ArrowPrimitiveType> StreamAccumulator for RetractSumInt<T> {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.fold(args, groups, filter, 1, total);
        Ok(())
    }
    fn retract(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.fold(args, groups, filter, -1, total);
        Ok(())
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        Ok(Arc::new(PrimitiveArray::<T>::from_iter(
            groups
                .iter()
                .map(|&g| (self.counts[g] > 0).then(|| self.sums[g])),
        )))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let sums = PrimitiveArray::<T>::from_iter_values(groups.iter().map(|&g| self.sums[g]));
        let counts = Int64Array::from_iter_values(groups.iter().map(|&g| self.counts[g]));
        Ok(vec![Arc::new(sums), Arc::new(counts)])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        grow(&mut self.sums, total, T::Native::default());
        grow(&mut self.counts, total, 0);
        let sums = states[0].as_primitive::<T>();
        let counts = states[1].as_primitive::<Int64Type>();
        for (i, &g) in groups.iter().enumerate() {
            if sums.is_valid(i) {
                self.sums[g] = self.sums[g].add_wrapping(sums.value(i));
            }
            if counts.is_valid(i) {
                self.counts[g] += counts.value(i);
            }
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        let n = self.sums.len();
        for &g in groups.iter().filter(|&&g| g < n) {
            self.sums[g] = T::Native::default();
            self.counts[g] = 0;
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<T::Native>() + self.counts.capacity() * 8
    }
}

// ---------------------------------------------------------------- min / max

/// `min` or `max` that can take values back: per group, each distinct
/// value (in Arrow's order-preserving row format, so the map's order is
/// the values' order) with how many rows hold it.
pub struct CountedExtreme {
    is_max: bool,
    rows: RowConverter,
    groups: Vec<BTreeMap<RowKey, i64>>,
    bytes: usize,
}

/// A value in Arrow's row format, held inline when it is short (every
/// fixed-width type, short text): a B-tree search then compares bytes in
/// its nodes, two words at a time, instead of chasing a pointer per step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RowKey {
    /// The bytes, zero-padded, and their length.
    Inline([u8; 16], u8),
    Heap(Box<[u8]>),
}

impl RowKey {
    fn new(value: &[u8]) -> Self {
        match value.len() {
            n @ 0..=16 => {
                let mut bytes = [0; 16];
                bytes[..n].copy_from_slice(value);
                RowKey::Inline(bytes, n as u8)
            }
            _ => RowKey::Heap(value.into()),
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            RowKey::Inline(bytes, n) => &bytes[..*n as usize],
            RowKey::Heap(v) => v,
        }
    }
}

impl Ord for RowKey {
    /// The bytes' order. Zero padding keeps it: where two padded values
    /// first differ, either both hold real bytes there, or the shorter one
    /// has ended (so it is a prefix, and smaller); equal padded values
    /// order by length.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (RowKey::Inline(a, m), RowKey::Inline(b, n)) => u128::from_be_bytes(*a)
                .cmp(&u128::from_be_bytes(*b))
                .then(m.cmp(n)),
            _ => self.as_slice().cmp(other.as_slice()),
        }
    }
}

impl PartialOrd for RowKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl CountedExtreme {
    pub fn new(data_type: &DataType, is_max: bool) -> Result<Self> {
        Ok(Self {
            is_max,
            rows: RowConverter::new(vec![SortField::new(data_type.clone())])?,
            groups: Vec::new(),
            bytes: 0,
        })
    }

    /// Whether values of `t` can be counted (Arrow's row format takes them).
    pub fn supports(t: &DataType) -> bool {
        RowConverter::supports_fields(&[SortField::new(t.clone())])
    }

    /// One state column: each group's values and counts, serialised as
    /// `(u32 length, value bytes, i64 count)*` (little-endian).
    pub fn state_fields() -> Vec<FieldRef> {
        vec![field("values", DataType::Binary)]
    }

    fn add(&mut self, g: usize, value: &[u8], n: i64) {
        let map = &mut self.groups[g];
        match map.entry(RowKey::new(value)) {
            Entry::Occupied(mut c) => {
                *c.get_mut() += n;
                if *c.get() == 0 {
                    c.remove();
                    self.bytes = self.bytes.saturating_sub(value.len() + 48);
                }
            }
            Entry::Vacant(v) => {
                v.insert(n);
                self.bytes += value.len() + 48;
            }
        }
    }

    fn fold(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        sign: i64,
        total: usize,
    ) -> Result<()> {
        if self.groups.len() < total {
            self.groups.resize_with(total, BTreeMap::new);
        }
        let mask = row_mask(args, filter);
        let rows = self.rows.convert_columns(&args[..1])?;
        for_each_row(groups, &mask, |i, g| {
            self.add(g, rows.row(i).as_ref(), sign)
        });
        Ok(())
    }

    /// The extreme of group `g`: the first or last value held by a row.
    fn extreme(&self, g: usize) -> Option<&[u8]> {
        let map = self.groups.get(g)?;
        let mut held = map
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(v, _)| v.as_slice());
        if self.is_max {
            held.next_back()
        } else {
            held.next()
        }
    }
}

impl StreamAccumulator for CountedExtreme {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.fold(args, groups, filter, 1, total)
    }
    fn retract(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.fold(args, groups, filter, -1, total)
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        let mut present = Vec::new();
        let indices: UInt32Array = groups
            .iter()
            .map(|&g| {
                self.extreme(g).map(|v| {
                    present.push(v);
                    present.len() as u32 - 1
                })
            })
            .collect();
        let parser = self.rows.parser();
        let values = self
            .rows
            .convert_rows(present.iter().map(|v| parser.parse(v)))?;
        Ok(arrow::compute::take(values[0].as_ref(), &indices, None)?)
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let mut buf = Vec::new();
        let states: BinaryArray = groups
            .iter()
            .map(|&g| {
                buf.clear();
                for (v, c) in self.groups.get(g).into_iter().flatten() {
                    let v = v.as_slice();
                    buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    buf.extend_from_slice(v);
                    buf.extend_from_slice(&c.to_le_bytes());
                }
                Some(buf.clone())
            })
            .collect();
        Ok(vec![Arc::new(states)])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        if self.groups.len() < total {
            self.groups.resize_with(total, BTreeMap::new);
        }
        let states = states[0].as_binary::<i32>();
        let corrupt = || EngineError::Checkpoint("min/max value counts are corrupt".into());
        for (i, &g) in groups.iter().enumerate() {
            if states.is_null(i) {
                continue;
            }
            let mut rest = states.value(i);
            while !rest.is_empty() {
                let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
                let len = u32::from_le_bytes(*len) as usize;
                if tail.len() < len + 8 {
                    return Err(corrupt());
                }
                let (value, tail) = tail.split_at(len);
                let (count, tail) = tail.split_first_chunk::<8>().ok_or_else(corrupt)?;
                self.add(g, value, i64::from_le_bytes(*count));
                rest = tail;
            }
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if let Some(map) = self.groups.get_mut(g) {
                let freed: usize = map.keys().map(|v| v.as_slice().len() + 48).sum();
                self.bytes = self.bytes.saturating_sub(freed);
                map.clear();
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.groups.capacity() * std::mem::size_of::<BTreeMap<RowKey, i64>>() + self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn row_keys_order_as_their_bytes() {
        // Short and long values, with zero bytes where padding would be.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut values: Vec<Vec<u8>> = (0..2000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let len = (state % 24) as usize;
                (0..len)
                    .map(|i| [0, 1, 255][(state >> (i * 2)) as usize % 3])
                    .collect()
            })
            .collect();
        values.extend([vec![], vec![0], vec![0; 16], vec![0; 17], vec![1, 0]]);
        for a in &values {
            for b in values.iter().step_by(7) {
                let (x, y) = (RowKey::new(a), RowKey::new(b));
                assert_eq!(x.cmp(&y), a.cmp(b), "{a:?} {b:?}");
                assert_eq!(x == y, a == b);
            }
        }
    }

    #[test]
    fn min_and_max_come_back_when_their_extreme_is_taken_out() {
        let values: ArrayRef = Arc::new(StringArray::from(vec!["b", "a", "c", "a"]));
        let groups = [0, 0, 0, 1];
        let mut max = CountedExtreme::new(&DataType::Utf8, true).unwrap();
        let mut min = CountedExtreme::new(&DataType::Utf8, false).unwrap();
        for acc in [&mut max, &mut min] {
            acc.update(&[Arc::clone(&values)], &groups, None, 2)
                .unwrap();
        }
        let text = |a: ArrayRef| format!("{:?}", a.as_string::<i32>().iter().collect::<Vec<_>>());
        assert_eq!(
            text(max.evaluate(&[0, 1]).unwrap()),
            r#"[Some("c"), Some("a")]"#
        );
        // Take "c" and group 1's "a" back out; "a" of group 0 stays.
        let gone: ArrayRef = Arc::new(StringArray::from(vec!["c", "a"]));
        max.retract(&[Arc::clone(&gone)], &[0, 1], None, 2).unwrap();
        min.retract(&[gone], &[0, 1], None, 2).unwrap();
        assert_eq!(text(max.evaluate(&[0, 1]).unwrap()), r#"[Some("b"), None]"#);
        assert_eq!(text(min.evaluate(&[0, 1]).unwrap()), r#"[Some("a"), None]"#);
        // A checkpoint round trip keeps the counts.
        let state = max.state(&[0, 1]).unwrap();
        let mut back = CountedExtreme::new(&DataType::Utf8, true).unwrap();
        back.merge(&state, &[0, 1], 2).unwrap();
        let b: ArrayRef = Arc::new(StringArray::from(vec!["b"]));
        back.retract(&[b], &[0], None, 2).unwrap();
        assert_eq!(
            text(back.evaluate(&[0, 1]).unwrap()),
            r#"[Some("a"), None]"#
        );
    }

    #[test]
    fn an_integer_sum_is_null_again_when_its_last_value_leaves() {
        let mut sum = RetractSumInt::<Int64Type>::default();
        let v: ArrayRef = Arc::new(Int64Array::from(vec![5, 7]));
        sum.update(&[Arc::clone(&v)], &[0, 0], None, 1).unwrap();
        sum.retract(&[Arc::clone(&v)], &[0, 0], None, 1).unwrap();
        assert!(sum.evaluate(&[0]).unwrap().is_null(0));
        sum.update(&[v], &[0, 0], None, 1).unwrap();
        let out = sum.evaluate(&[0]).unwrap();
        assert_eq!(out.as_primitive::<Int64Type>().value(0), 12);
    }
}
