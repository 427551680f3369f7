//! Accumulators that take rows back out, for aggregations over a
//! changelog (a Debezium source): an update retracts the old row and folds
//! the new one in. Counts and exact float sums retract natively
//! ([`super::native`]); here are integer sums, which must know when their
//! last value left (the sum is then NULL again), and `min`/`max`, which
//! keep a count per distinct value so that the extreme can be taken back.
//! Their state grows with the distinct values of each group.

use std::marker::PhantomData;
use std::sync::Arc;

use arrow::array::ArrowNativeTypeOp;
use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array};
use arrow::array::{PrimitiveArray, UInt32Array};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, FieldRef, Int64Type};
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;

use super::native::{for_each_row, grow};
use super::{StreamAccumulator, row_mask};
use crate::error::{EngineError, Result};
use crate::inline_bytes::InlineBytes;

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
/// value (in Arrow's order-preserving row format, so comparing bytes
/// compares values) with how many rows hold it, and the extreme held.
///
/// As Flink's `MinWithRetractAggFunction`: the counts are a hash table, and
/// the extreme is kept as values come and go; only taking out the last row
/// of the extreme itself leaves it unknown, and the group's values are
/// scanned for the next one when it is evaluated (rare: one value of the
/// many a group holds). A tree of values would pay a search through
/// scattered nodes on every change instead.
pub struct CountedExtreme {
    is_max: bool,
    rows: RowConverter,
    groups: Vec<Counted>,
    bytes: usize,
}

/// One group's value counts and extreme.
#[derive(Default)]
struct Counted {
    counts: HashMap<InlineBytes, i64>,
    /// The extreme of the values held (count above zero); `None`: none
    /// held, or unknown where `stale`.
    extreme: Option<InlineBytes>,
    /// The extreme's last row was taken out: scan for the next one.
    stale: bool,
}

impl Counted {
    /// Whether `a` is a better extreme than `b`.
    fn beats(is_max: bool, a: &InlineBytes, b: &InlineBytes) -> bool {
        match is_max {
            true => a > b,
            false => a < b,
        }
    }

    /// The extreme, scanned for if unknown.
    fn extreme(&mut self, is_max: bool) -> Option<&[u8]> {
        if self.stale {
            self.stale = false;
            self.extreme = None;
            for (v, _) in self.counts.iter().filter(|(_, c)| **c > 0) {
                if self
                    .extreme
                    .as_ref()
                    .is_none_or(|e| Self::beats(is_max, v, e))
                {
                    self.extreme = Some(v.clone());
                }
            }
        }
        self.extreme.as_ref().map(InlineBytes::as_slice)
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
    /// `(u32 length, value bytes, i64 count)*` (little-endian), in the
    /// values' order.
    pub fn state_fields() -> Vec<FieldRef> {
        vec![field("values", DataType::Binary)]
    }

    fn add(&mut self, g: usize, value: &[u8], n: i64) {
        let is_max = self.is_max;
        let group = &mut self.groups[g];
        let (before, after) = match group.counts.get_mut(value) {
            Some(c) => {
                let before = *c;
                *c += n;
                let after = *c;
                if after == 0 {
                    group.counts.remove(value);
                    self.bytes = self.bytes.saturating_sub(value.len() + 48);
                }
                (before, after)
            }
            None => {
                group.counts.insert(InlineBytes::new(value), n);
                self.bytes += value.len() + 48;
                (0, n)
            }
        };
        match (before > 0, after > 0) {
            (false, true) if !group.stale => {
                let value = InlineBytes::new(value);
                if group
                    .extreme
                    .as_ref()
                    .is_none_or(|e| Counted::beats(is_max, &value, e))
                {
                    group.extreme = Some(value);
                }
            }
            (true, false) if group.extreme.as_ref().map(InlineBytes::as_slice) == Some(value) => {
                group.stale = true;
            }
            _ => {}
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
            self.groups.resize_with(total, Counted::default);
        }
        let mask = row_mask(args, filter);
        let rows = self.rows.convert_columns(&args[..1])?;
        for_each_row(groups, &mask, |i, g| {
            self.add(g, rows.row(i).as_ref(), sign)
        });
        Ok(())
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
        let is_max = self.is_max;
        for &g in groups {
            if let Some(group) = self.groups.get_mut(g) {
                group.extreme(is_max);
            }
        }
        let mut present = Vec::new();
        let indices: UInt32Array = groups
            .iter()
            .map(|&g| {
                let group = self.groups.get(g)?;
                group.extreme.as_ref().map(|v| {
                    present.push(v.as_slice());
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
                // In the values' order: the same counts, the same bytes.
                let mut counts: Vec<_> = self
                    .groups
                    .get(g)
                    .into_iter()
                    .flat_map(|group| group.counts.iter())
                    .collect();
                counts.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (v, c) in counts {
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
            self.groups.resize_with(total, Counted::default);
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
            if let Some(group) = self.groups.get_mut(g) {
                let freed: usize = group.counts.keys().map(|v| v.as_slice().len() + 48).sum();
                self.bytes = self.bytes.saturating_sub(freed);
                *group = Counted::default();
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.groups.capacity() * std::mem::size_of::<Counted>() + self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

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

    /// Values come and go at random, their extremes taken out often: every
    /// evaluation equals the extreme of the rows held, counted by brute force.
    #[test]
    fn extremes_follow_the_rows_held_through_random_changes() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut max = CountedExtreme::new(&DataType::Int64, true).unwrap();
        let mut min = CountedExtreme::new(&DataType::Int64, false).unwrap();
        let mut held: Vec<Vec<i64>> = vec![Vec::new(); 3];
        for _ in 0..3000 {
            let g = next(3) as usize;
            let retract = !held[g].is_empty() && next(2) == 0;
            let value = match retract {
                // Mostly the extremes themselves.
                true => {
                    let h = &held[g];
                    let pick = match next(3) {
                        0 => *h.iter().max().unwrap(),
                        1 => *h.iter().min().unwrap(),
                        _ => h[next(h.len() as u64) as usize],
                    };
                    let at = held[g].iter().position(|&v| v == pick).unwrap();
                    held[g].swap_remove(at);
                    pick
                }
                false => {
                    let v = next(20) as i64 - 10;
                    held[g].push(v);
                    v
                }
            };
            let args: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![value]))];
            for acc in [&mut max, &mut min] {
                match retract {
                    true => acc.retract(&args, &[g], None, 3).unwrap(),
                    false => acc.update(&args, &[g], None, 3).unwrap(),
                }
            }
            let got = |acc: &mut CountedExtreme| {
                let a = acc.evaluate(&[0, 1, 2]).unwrap();
                let a = a.as_primitive::<Int64Type>();
                (0..3)
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            };
            let want_max: Vec<_> = held.iter().map(|h| h.iter().max().copied()).collect();
            let want_min: Vec<_> = held.iter().map(|h| h.iter().min().copied()).collect();
            assert_eq!(got(&mut max), want_max);
            assert_eq!(got(&mut min), want_min);
        }
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
