//! `min` and `max` over a changelog ([`CountedExtreme`]): they keep a
//! count per distinct value of each group, so that an extreme can be taken
//! back out. Their state grows with the distinct values of each group.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BooleanArray, UInt32Array};
use arrow::datatypes::{DataType, Field, FieldRef};
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;
use hashbrown::hash_map::{Entry, EntryRef};

use super::native::for_each_row;
use super::{StreamAccumulator, row_mask};
use crate::error::{EngineError, Result};
use crate::inline_bytes::InlineBytes;

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
///
/// A value of a fixed width up to 8 bytes (numbers, dates, times) is
/// counted under its bytes as one big-endian `u64`: 16-byte table slots
/// instead of 32, so twice the values fit a cache (a change's cost is
/// mostly its cache miss once the counts outgrow it).
pub struct CountedExtreme {
    is_max: bool,
    rows: RowConverter,
    values: Values,
    bytes: usize,
}

enum Values {
    /// Values of `width` bytes after the row format's validity byte.
    Fixed {
        width: usize,
        groups: Vec<Counted<u64>>,
    },
    Bytes(Vec<Counted<InlineBytes>>),
}

/// Bytes a counted value costs besides its own (slot, control byte, the
/// table's spare room).
const VALUE_OVERHEAD: usize = 48;
/// Bytes a fixed-width counted value costs in all (a 16-byte slot, its
/// control byte, the table's spare room).
const FIXED_VALUE_BYTES: usize = 24;

/// How a group's counts key a value given as its row-format bytes.
trait ValueKey: Sized {
    /// A value as looked up: a key, or the bytes a key is made of.
    type Probe<'a>: Copy;
    /// The values' counts.
    type Counts: Default;
    fn probe(&self) -> Self::Probe<'_>;
    fn order(a: Self::Probe<'_>, b: Self::Probe<'_>) -> Ordering;
    fn own(probe: Self::Probe<'_>) -> Self;
    /// Adds `n` to `probe`'s count (one table probe; a count reaching 0
    /// leaves the table): the count before and after.
    fn bump(counts: &mut Self::Counts, probe: Self::Probe<'_>, n: i64) -> (i64, i64);
    /// The values counted and their counts, in no particular order.
    fn held(counts: &Self::Counts) -> impl Iterator<Item = (Self::Probe<'_>, i64)>;
}

impl ValueKey for u64 {
    type Probe<'a> = u64;
    type Counts = HashMap<u64, i64>;
    fn probe(&self) -> u64 {
        *self
    }
    fn order(a: u64, b: u64) -> Ordering {
        a.cmp(&b)
    }
    fn own(probe: u64) -> Self {
        probe
    }
    fn bump(counts: &mut Self::Counts, probe: u64, n: i64) -> (i64, i64) {
        match counts.entry(probe) {
            Entry::Occupied(mut e) => {
                let (before, after) = count_in(e.get_mut(), n);
                if after == 0 {
                    e.remove();
                }
                (before, after)
            }
            Entry::Vacant(e) => {
                if n != 0 {
                    e.insert(n);
                }
                (0, n)
            }
        }
    }
    fn held(counts: &Self::Counts) -> impl Iterator<Item = (u64, i64)> {
        counts.iter().map(|(v, c)| (*v, *c))
    }
}

impl ValueKey for InlineBytes {
    type Probe<'a> = &'a [u8];
    type Counts = HashMap<InlineBytes, i64>;
    fn probe(&self) -> &[u8] {
        self.as_slice()
    }
    fn order(a: &[u8], b: &[u8]) -> Ordering {
        a.cmp(b)
    }
    fn own(probe: &[u8]) -> Self {
        InlineBytes::new(probe)
    }
    fn bump(counts: &mut Self::Counts, probe: &[u8], n: i64) -> (i64, i64) {
        match counts.entry_ref(probe) {
            EntryRef::Occupied(mut e) => {
                let (before, after) = count_in(e.get_mut(), n);
                if after == 0 {
                    e.remove();
                }
                (before, after)
            }
            EntryRef::Vacant(e) => {
                if n != 0 {
                    e.insert(n);
                }
                (0, n)
            }
        }
    }
    fn held(counts: &Self::Counts) -> impl Iterator<Item = (&[u8], i64)> {
        counts.iter().map(|(v, c)| (v.as_slice(), *c))
    }
}

/// Adds `n` to `count`: the count before and after.
fn count_in(count: &mut i64, n: i64) -> (i64, i64) {
    let before = *count;
    *count += n;
    (before, *count)
}

/// One group's value counts and extreme.
struct Counted<K: ValueKey> {
    counts: K::Counts,
    /// The extreme of the values held (count above zero); `None`: none
    /// held, or unknown where `stale`.
    extreme: Option<K>,
    /// The extreme's last row was taken out: scan for the next one.
    stale: bool,
}

impl<K: ValueKey> Default for Counted<K> {
    fn default() -> Self {
        Self {
            counts: K::Counts::default(),
            extreme: None,
            stale: false,
        }
    }
}

/// Whether a value of order `a_to_b` against another is the better extreme.
fn beats(is_max: bool, a_to_b: Ordering) -> bool {
    match is_max {
        true => a_to_b.is_gt(),
        false => a_to_b.is_lt(),
    }
}

impl<K: ValueKey> Counted<K> {
    /// Adds `n` rows of `value`: whether a value entered (1) or left (-1)
    /// the table.
    fn add(&mut self, is_max: bool, value: K::Probe<'_>, n: i64) -> isize {
        let (before, after) = K::bump(&mut self.counts, value, n);
        match (before > 0, after > 0) {
            // A new value held: the extreme if it beats the one known.
            (false, true)
                if !self.stale
                    && self
                        .extreme
                        .as_ref()
                        .is_none_or(|e| beats(is_max, K::order(value, e.probe()))) =>
            {
                self.extreme = Some(K::own(value));
            }
            (true, false)
                if self
                    .extreme
                    .as_ref()
                    .is_some_and(|e| K::order(e.probe(), value).is_eq()) =>
            {
                self.stale = true;
            }
            _ => {}
        }
        match (before != 0, after != 0) {
            (false, true) => 1,
            (true, false) => -1,
            _ => 0,
        }
    }

    /// The extreme, scanned for if unknown.
    fn extreme(&mut self, is_max: bool) -> Option<&K> {
        if self.stale {
            self.stale = false;
            let held = K::held(&self.counts).filter(|(_, c)| *c > 0);
            let best =
                held.map(|(v, _)| v)
                    .reduce(|best, v| match beats(is_max, K::order(v, best)) {
                        true => v,
                        false => best,
                    });
            self.extreme = best.map(K::own);
        }
        self.extreme.as_ref()
    }

    /// The values held and their counts, in the values' order.
    fn sorted(&self) -> Vec<(K::Probe<'_>, i64)> {
        let mut counts: Vec<_> = K::held(&self.counts).collect();
        counts.sort_unstable_by(|a, b| K::order(a.0, b.0));
        counts
    }
}

/// The `u64` a fixed-width value's row bytes (validity byte, then
/// `width` bytes) are counted under; `None` if they are not that long.
fn fixed_key(row: &[u8], width: usize) -> Option<u64> {
    let value = row.get(1..).filter(|v| v.len() == width && width <= 8)?;
    let mut bytes = [0; 8];
    bytes[8 - width..].copy_from_slice(value);
    Some(u64::from_be_bytes(bytes))
}

/// Appends the row bytes of a value counted under `key`.
fn fixed_row(key: u64, width: usize, out: &mut Vec<u8>) {
    out.push(1);
    out.extend_from_slice(&key.to_be_bytes()[8 - width..]);
}

/// The byte width of `t`'s values in Arrow's row format after the
/// validity byte, when it is fixed and at most 8.
fn fixed_width(t: &DataType) -> Option<usize> {
    use DataType::*;
    let fixed = matches!(
        t,
        Int8 | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float16
            | Float32
            | Float64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
    );
    t.primitive_width().filter(|w| fixed && *w <= 8)
}

impl CountedExtreme {
    pub fn new(data_type: &DataType, is_max: bool) -> Result<Self> {
        Self::keyed(data_type, is_max, fixed_width(data_type))
    }

    /// Values counted as `u64`s of `fixed` bytes, or as byte strings.
    fn keyed(data_type: &DataType, is_max: bool, fixed: Option<usize>) -> Result<Self> {
        Ok(Self {
            is_max,
            rows: RowConverter::new(vec![SortField::new(data_type.clone())])?,
            values: match fixed {
                Some(width) => Values::Fixed {
                    width,
                    groups: Vec::new(),
                },
                None => Values::Bytes(Vec::new()),
            },
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
        vec![Arc::new(Field::new("values", DataType::Binary, true))]
    }

    fn grow(&mut self, total: usize) {
        match &mut self.values {
            Values::Fixed { groups, .. } if groups.len() < total => {
                groups.resize_with(total, Counted::default)
            }
            Values::Bytes(groups) if groups.len() < total => {
                groups.resize_with(total, Counted::default)
            }
            _ => {}
        }
    }

    /// Adds `n` rows of the value whose row bytes are `row` to group `g`.
    fn add(&mut self, g: usize, row: &[u8], n: i64) -> Result<()> {
        match &mut self.values {
            Values::Fixed { width, groups } => {
                let key = fixed_key(row, *width).ok_or_else(|| {
                    EngineError::internal("a min/max value is not of its type's width")
                })?;
                let entered = groups[g].add(self.is_max, key, n);
                self.bytes = self
                    .bytes
                    .saturating_add_signed(entered * FIXED_VALUE_BYTES as isize);
            }
            Values::Bytes(groups) => {
                let entered = groups[g].add(self.is_max, row, n);
                let cost = (row.len() + VALUE_OVERHEAD) as isize;
                self.bytes = self.bytes.saturating_add_signed(entered * cost);
            }
        }
        Ok(())
    }

    fn fold(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        sign: i64,
        total: usize,
    ) -> Result<()> {
        self.grow(total);
        let mask = row_mask(args, filter);
        let rows = self.rows.convert_columns(&args[..1])?;
        let mut result = Ok(());
        for_each_row(groups, &mask, |i, g| {
            if result.is_ok() {
                result = self.add(g, rows.row(i).as_ref(), sign);
            }
        });
        result
    }

    /// Appends the row bytes of group `g`'s extreme (scanned for if
    /// unknown); whether it has one.
    fn extreme_row(&mut self, g: usize, out: &mut Vec<u8>) -> bool {
        let is_max = self.is_max;
        match &mut self.values {
            Values::Fixed { width, groups } => {
                match groups.get_mut(g).and_then(|c| c.extreme(is_max)) {
                    Some(&key) => fixed_row(key, *width, out),
                    None => return false,
                }
            }
            Values::Bytes(groups) => match groups.get_mut(g).and_then(|c| c.extreme(is_max)) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
        }
        true
    }

    /// Appends group `g`'s state (see [`Self::state_fields`]).
    fn write_state(&self, g: usize, out: &mut Vec<u8>) {
        let mut value = Vec::new();
        let mut write = |value: &[u8], count: i64| {
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
            out.extend_from_slice(&count.to_le_bytes());
        };
        match &self.values {
            Values::Fixed { width, groups } => {
                for (key, count) in groups.get(g).map(Counted::sorted).unwrap_or_default() {
                    value.clear();
                    fixed_row(key, *width, &mut value);
                    write(&value, count);
                }
            }
            Values::Bytes(groups) => {
                for (v, count) in groups.get(g).map(Counted::sorted).unwrap_or_default() {
                    write(v, count);
                }
            }
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
        let (mut present, mut ends) = (Vec::new(), Vec::new());
        let mut indices = Vec::with_capacity(groups.len());
        for &g in groups {
            indices.push(match self.extreme_row(g, &mut present) {
                true => {
                    ends.push(present.len());
                    Some(ends.len() as u32 - 1)
                }
                false => None,
            });
        }
        let parser = self.rows.parser();
        let mut start = 0;
        let values = self.rows.convert_rows(ends.iter().map(|&end| {
            let row = parser.parse(&present[start..end]);
            start = end;
            row
        }))?;
        let indices = UInt32Array::from(indices);
        Ok(arrow::compute::take(values[0].as_ref(), &indices, None)?)
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let mut buf = Vec::new();
        let states: BinaryArray = groups
            .iter()
            .map(|&g| {
                buf.clear();
                // In the values' order: the same counts, the same bytes.
                self.write_state(g, &mut buf);
                Some(buf.clone())
            })
            .collect();
        Ok(vec![Arc::new(states)])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total: usize) -> Result<()> {
        self.grow(total);
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
                self.add(g, value, i64::from_le_bytes(*count))
                    .map_err(|_| corrupt())?;
                rest = tail;
            }
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            let freed = match &mut self.values {
                Values::Fixed { groups, .. } => groups.get_mut(g).map(|group| {
                    let freed = group.counts.len() * FIXED_VALUE_BYTES;
                    *group = Counted::default();
                    freed
                }),
                Values::Bytes(groups) => groups.get_mut(g).map(|group| {
                    let freed = group.counts.keys().map(|v| v.len() + VALUE_OVERHEAD);
                    let freed = freed.sum();
                    *group = Counted::default();
                    freed
                }),
            };
            self.bytes = self.bytes.saturating_sub(freed.unwrap_or(0));
        }
        Ok(())
    }
    fn size(&self) -> usize {
        let groups = match &self.values {
            Values::Fixed { groups, .. } => groups.capacity() * size_of::<Counted<u64>>(),
            Values::Bytes(groups) => groups.capacity() * size_of::<Counted<InlineBytes>>(),
        };
        groups + self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::Int64Type;

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

    /// Fixed-width values counted as `u64`s answer, checkpoint and restore
    /// exactly as the same values counted as byte strings: the same
    /// extremes, the same state bytes (checkpoints of either read back).
    #[test]
    fn fixed_width_counts_match_byte_string_counts() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let types = [DataType::Float64, DataType::Int32, DataType::Int8];
        for t in types {
            let width = fixed_width(&t).expect("a fixed width");
            for is_max in [true, false] {
                let mut fixed = CountedExtreme::keyed(&t, is_max, Some(width)).unwrap();
                let mut bytes = CountedExtreme::keyed(&t, is_max, None).unwrap();
                let mut held: Vec<Vec<i64>> = vec![Vec::new(); 4];
                for step in 0..2000 {
                    let g = next(4) as usize;
                    let retract = !held[g].is_empty() && next(2) == 0;
                    let v = match retract {
                        true => {
                            let at = next(held[g].len() as u64) as usize;
                            held[g].swap_remove(at)
                        }
                        false => {
                            let v = next(40) as i64 - 20;
                            held[g].push(v);
                            v
                        }
                    };
                    let value = arrow::compute::cast(&Int64Array::from(vec![v]), &t).unwrap();
                    for acc in [&mut fixed, &mut bytes] {
                        match retract {
                            true => acc.retract(&[Arc::clone(&value)], &[g], None, 4),
                            false => acc.update(&[Arc::clone(&value)], &[g], None, 4),
                        }
                        .unwrap();
                    }
                    let all = [0, 1, 2, 3];
                    assert_eq!(
                        fixed.evaluate(&all).unwrap().to_data(),
                        bytes.evaluate(&all).unwrap().to_data()
                    );
                    if step % 100 == 0 {
                        let state = fixed.state(&all).unwrap();
                        assert_eq!(state[0].to_data(), bytes.state(&all).unwrap()[0].to_data());
                        let mut back = CountedExtreme::new(&t, is_max).unwrap();
                        back.merge(&bytes.state(&all).unwrap(), &all, 4).unwrap();
                        assert_eq!(
                            back.evaluate(&all).unwrap().to_data(),
                            fixed.evaluate(&all).unwrap().to_data()
                        );
                        assert_eq!(back.size(), fixed.size());
                    }
                }
            }
        }
    }

    /// Every type counted as `u64`s has that width in Arrow's row format
    /// (a validity byte, then `width` bytes), so its values round-trip
    /// through their keys, and its extremes come out right.
    #[test]
    fn every_fixed_width_type_has_its_width_in_the_row_format() {
        use arrow::datatypes::{IntervalUnit, TimeUnit};
        let types = [
            DataType::Int8,
            DataType::Int16,
            DataType::Int32,
            DataType::Int64,
            DataType::UInt8,
            DataType::UInt16,
            DataType::UInt32,
            DataType::UInt64,
            DataType::Float16,
            DataType::Float32,
            DataType::Float64,
            DataType::Date32,
            DataType::Date64,
            DataType::Time32(TimeUnit::Second),
            DataType::Time64(TimeUnit::Microsecond),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            DataType::Duration(TimeUnit::Millisecond),
        ];
        for t in &types {
            let width = fixed_width(t).unwrap_or_else(|| panic!("{t} has a fixed width"));
            // Small integers as values of `t` (from 32 or 64 bits, as arrow casts).
            let of = |v: Vec<i32>| {
                arrow::compute::cast(&arrow::array::Int32Array::from(v.clone()), t)
                    .or_else(|_| {
                        let wide: Vec<i64> = v.iter().map(|&x| x.into()).collect();
                        arrow::compute::cast(&Int64Array::from(wide), t)
                    })
                    .unwrap()
            };
            let values = of(vec![3, 1, 7, 2]);
            let converter = RowConverter::new(vec![SortField::new(t.clone())]).unwrap();
            let rows = converter.convert_columns(&[Arc::clone(&values)]).unwrap();
            for row in rows.iter() {
                let key = fixed_key(row.as_ref(), width).unwrap_or_else(|| panic!("{t}"));
                let mut back = Vec::new();
                fixed_row(key, width, &mut back);
                assert_eq!(back, row.as_ref(), "{t}");
            }
            let mut max = CountedExtreme::new(t, true).unwrap();
            max.update(&[Arc::clone(&values)], &[0, 0, 0, 0], None, 1)
                .unwrap();
            let want = of(vec![7]);
            assert_eq!(max.evaluate(&[0]).unwrap().to_data(), want.to_data(), "{t}");
        }
        // Wider or variable-width types keep byte-string keys.
        for t in [
            DataType::Utf8,
            DataType::Decimal128(10, 2),
            DataType::Boolean,
            DataType::Interval(IntervalUnit::MonthDayNano),
        ] {
            assert_eq!(fixed_width(&t), None, "{t}");
        }
    }

    /// A checkpoint whose value is not of the type's width is refused.
    #[test]
    fn a_fixed_width_value_of_another_width_is_corrupt() {
        let mut acc = CountedExtreme::new(&DataType::Int64, true).unwrap();
        let mut state = Vec::new();
        state.extend_from_slice(&3u32.to_le_bytes());
        state.extend_from_slice(&[1, 0, 7]);
        state.extend_from_slice(&1i64.to_le_bytes());
        let state: ArrayRef = Arc::new(BinaryArray::from_iter_values([state]));
        let err = acc.merge(&[state], &[0], 1).unwrap_err();
        assert!(err.to_string().contains("corrupt"), "{err}");
    }
}
