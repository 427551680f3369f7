//! Native accumulators for count, sum, avg, min and max. Their state is exact
//! (integers, exact float sums, extremes), so update order, merge order and a
//! checkpoint round trip never change a bit of the result.

use std::marker::PhantomData;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, Float64Array, Int64Array,
    PrimitiveArray, UInt8Array, UInt64Array,
};
use arrow::datatypes::*;
use arrow_buffer::ArrowNativeType;

use super::exact::{ExactSum, Fixed256};
use super::{StreamAccumulator, row_mask};
use crate::error::{EngineError, Result};

#[inline]
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, n: usize, init: T) {
    if v.len() < n {
        v.resize(n, init);
    }
}

/// Calls `f(row, group)` for every row that counts.
#[inline]
pub(crate) fn for_each_row(
    groups: &[usize],
    mask: &Option<Vec<bool>>,
    mut f: impl FnMut(usize, usize),
) {
    match mask {
        None => {
            for (i, &g) in groups.iter().enumerate() {
                f(i, g)
            }
        }
        Some(m) => {
            for (i, &g) in groups.iter().enumerate() {
                if m[i] {
                    f(i, g)
                }
            }
        }
    }
}

fn field(name: &str, dt: DataType) -> FieldRef {
    Arc::new(Field::new(name, dt, true))
}

// ---------------------------------------------------------------- count

#[derive(Debug, Default)]
pub struct Count {
    counts: Vec<i64>,
}

impl Count {
    pub fn state_fields() -> Vec<FieldRef> {
        vec![field("count", DataType::Int64)]
    }
}

impl StreamAccumulator for Count {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        grow(&mut self.counts, total_groups, 0);
        let mask = row_mask(args, filter);
        let counts = &mut self.counts;
        for_each_row(groups, &mask, |_, g| counts[g] += 1);
        Ok(())
    }
    fn retract(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        grow(&mut self.counts, total_groups, 0);
        let mask = row_mask(args, filter);
        let counts = &mut self.counts;
        for_each_row(groups, &mask, |_, g| counts[g] -= 1);
        Ok(())
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        Ok(Arc::new(Int64Array::from_iter_values(
            groups.iter().map(|&g| self.counts[g]),
        )))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(groups)?])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        grow(&mut self.counts, total_groups, 0);
        let s = states[0].as_primitive::<Int64Type>();
        for (i, &g) in groups.iter().enumerate() {
            self.counts[g] += s.value(i);
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if g < self.counts.len() {
                self.counts[g] = 0;
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.counts.capacity() * 8
    }
}

// ---------------------------------------------------------------- integer sum

/// `sum` over 64-bit integers, wrapping on overflow like DataFusion's.
#[derive(Debug)]
pub struct SumInt<T: ArrowPrimitiveType> {
    sums: Vec<T::Native>,
    seen: Vec<bool>,
    _t: PhantomData<fn() -> T>,
}

impl<T: ArrowPrimitiveType> Default for SumInt<T> {
    fn default() -> Self {
        Self {
            sums: Vec::new(),
            seen: Vec::new(),
            _t: PhantomData,
        }
    }
}

pub fn single_value_state(dt: &DataType) -> Vec<FieldRef> {
    vec![field("value", dt.clone())]
}

impl<T: ArrowPrimitiveType> SumInt<T> {
    fn fold(
        &mut self,
        values: &PrimitiveArray<T>,
        groups: &[usize],
        mask: &Option<Vec<bool>>,
        total: usize,
    ) {
        grow(&mut self.sums, total, T::Native::default());
        grow(&mut self.seen, total, false);
        let v = values.values();
        let (sums, seen) = (&mut self.sums, &mut self.seen);
        for_each_row(groups, mask, |i, g| {
            sums[g] = sums[g].add_wrapping(v[i]);
            seen[g] = true;
        });
    }
}

impl<T: ArrowPrimitiveType> StreamAccumulator for SumInt<T> {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        let mask = row_mask(args, filter);
        self.fold(args[0].as_primitive::<T>(), groups, &mask, total_groups);
        Ok(())
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        Ok(Arc::new(PrimitiveArray::<T>::from_iter(
            groups.iter().map(|&g| self.seen[g].then(|| self.sums[g])),
        )))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(groups)?])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        let s = states[0].as_primitive::<T>();
        let mask = s.nulls().map(|n| n.iter().collect());
        self.fold(s, groups, &mask, total_groups);
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if g < self.sums.len() {
                self.sums[g] = T::Native::default();
                self.seen[g] = false;
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<T::Native>() + self.seen.capacity()
    }
}

// ---------------------------------------------------------------- exact float sum / avg

/// `sum` and `avg` over floats with exact, order-independent state.
#[derive(Debug)]
pub struct FloatSum {
    avg: bool,
    sums: Vec<ExactSum>,
    counts: Vec<u64>,
}

impl FloatSum {
    pub fn new(avg: bool) -> Self {
        Self {
            avg,
            sums: Vec::new(),
            counts: Vec::new(),
        }
    }
    pub fn state_fields() -> Vec<FieldRef> {
        let mut f = exact_sum_fields("sum");
        f.push(field("count", DataType::UInt64));
        f
    }
    fn grow(&mut self, n: usize) {
        grow(&mut self.sums, n, ExactSum::default());
        grow(&mut self.counts, n, 0);
    }
}

/// Three state columns of an exact sum: fixed point, large values, specials.
pub(crate) fn exact_sum_fields(prefix: &str) -> Vec<FieldRef> {
    vec![
        field(&format!("{prefix}_fixed"), DataType::FixedSizeBinary(32)),
        field(&format!("{prefix}_big"), DataType::Float64),
        field(&format!("{prefix}_flags"), DataType::UInt8),
    ]
}

pub(crate) fn exact_sums_to_arrays(sums: &[ExactSum], groups: &[usize]) -> Result<Vec<ArrayRef>> {
    // One pass over the groups (a checkpoint gathers them from all over
    // the state), straight into the columns' buffers.
    let mut fixed = Vec::with_capacity(groups.len() * 32);
    let mut big = Vec::with_capacity(groups.len());
    let mut flags = Vec::with_capacity(groups.len());
    for &g in groups {
        let s = &sums[g];
        fixed.extend_from_slice(&s.fixed.to_le_bytes());
        big.push(s.big);
        flags.push(s.flags);
    }
    let fixed = FixedSizeBinaryArray::try_new(32, fixed.into(), None)?;
    Ok(vec![
        Arc::new(fixed),
        Arc::new(Float64Array::from(big)),
        Arc::new(UInt8Array::from(flags)),
    ])
}

pub(crate) fn exact_sum_at(states: &[ArrayRef], i: usize) -> Result<ExactSum> {
    let fixed = states[0].as_fixed_size_binary_opt().ok_or_else(|| {
        EngineError::Checkpoint("exact sum state is not FixedSizeBinary(32)".into())
    })?;
    Ok(ExactSum {
        fixed: Fixed256::from_le_bytes(fixed.value(i)),
        big: states[1].as_primitive::<Float64Type>().value(i),
        flags: states[2].as_primitive::<UInt8Type>().value(i),
    })
}

impl StreamAccumulator for FloatSum {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        self.grow(total_groups);
        let mask = row_mask(args, filter);
        let v = args[0].as_primitive::<Float64Type>().values();
        let (sums, counts) = (&mut self.sums, &mut self.counts);
        for_each_row(groups, &mask, |i, g| {
            sums[g].add(v[i]);
            counts[g] += 1;
        });
        Ok(())
    }
    fn retract(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        self.grow(total_groups);
        let mask = row_mask(args, filter);
        let v = args[0].as_primitive::<Float64Type>().values();
        let mut special = None;
        let (sums, counts) = (&mut self.sums, &mut self.counts);
        for_each_row(groups, &mask, |i, g| {
            // NaN and infinities are kept as flags, which cannot be taken back.
            if !v[i].is_finite() {
                special = Some(v[i]);
                return;
            }
            sums[g].add(-v[i]);
            counts[g] -= 1;
        });
        match special {
            None => Ok(()),
            Some(x) => Err(EngineError::Input(format!(
                "an aggregation over a continuous aggregation cannot take back the value {x} (NaN and infinities are not retractable); filter them out in the inner query"
            ))),
        }
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        Ok(Arc::new(Float64Array::from_iter(groups.iter().map(|&g| {
            let n = self.counts[g];
            (n > 0).then(|| {
                let s = self.sums[g].value();
                if self.avg { s / n as f64 } else { s }
            })
        }))))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let mut out = exact_sums_to_arrays(&self.sums, groups)?;
        out.push(Arc::new(UInt64Array::from_iter_values(
            groups.iter().map(|&g| self.counts[g]),
        )));
        Ok(out)
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        self.grow(total_groups);
        let counts = states[3].as_primitive::<UInt64Type>();
        for (i, &g) in groups.iter().enumerate() {
            let s = exact_sum_at(states, i)?;
            self.sums[g].merge(&s);
            self.counts[g] += counts.value(i);
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if g < self.sums.len() {
                self.sums[g] = ExactSum::default();
                self.counts[g] = 0;
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.sums.capacity() * std::mem::size_of::<ExactSum>() + self.counts.capacity() * 8
    }
}

// ---------------------------------------------------------------- min / max

/// `min`/`max` over primitive types, with Arrow's total order for floats
/// (NaN is the largest), as DataFusion's.
#[derive(Debug)]
pub struct MinMax<T: ArrowPrimitiveType> {
    is_max: bool,
    data_type: DataType,
    values: Vec<T::Native>,
    seen: Vec<bool>,
}

impl<T: ArrowPrimitiveType> MinMax<T> {
    fn new(is_max: bool, data_type: DataType) -> Self {
        Self {
            is_max,
            data_type,
            values: Vec::new(),
            seen: Vec::new(),
        }
    }
    fn fold(
        &mut self,
        a: &PrimitiveArray<T>,
        groups: &[usize],
        mask: &Option<Vec<bool>>,
        total: usize,
    ) {
        grow(&mut self.values, total, T::Native::default());
        grow(&mut self.seen, total, false);
        let v = a.values();
        let is_max = self.is_max;
        let (values, seen) = (&mut self.values, &mut self.seen);
        for_each_row(groups, mask, |i, g| {
            let x = v[i];
            let better = if is_max {
                x.is_gt(values[g])
            } else {
                x.is_lt(values[g])
            };
            if !seen[g] || better {
                values[g] = x;
                seen[g] = true;
            }
        });
    }
}

impl<T: ArrowPrimitiveType> StreamAccumulator for MinMax<T> {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        let mask = row_mask(args, filter);
        self.fold(args[0].as_primitive::<T>(), groups, &mask, total_groups);
        Ok(())
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        let a = PrimitiveArray::<T>::from_iter(
            groups.iter().map(|&g| self.seen[g].then(|| self.values[g])),
        )
        .with_data_type(self.data_type.clone());
        Ok(Arc::new(a))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(groups)?])
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        let s = states[0].as_primitive::<T>();
        let mask = s.nulls().map(|n| n.iter().collect());
        self.fold(s, groups, &mask, total_groups);
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if g < self.seen.len() {
                self.seen[g] = false;
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.values.capacity() * T::Native::get_byte_width() + self.seen.capacity()
    }
}

pub fn minmax_supported(t: &DataType) -> bool {
    min_max(t, true).is_some()
}

pub fn min_max(t: &DataType, is_max: bool) -> Option<Box<dyn StreamAccumulator>> {
    fn make<T: ArrowPrimitiveType>(
        is_max: bool,
        t: &DataType,
    ) -> Option<Box<dyn StreamAccumulator>> {
        Some(Box::new(MinMax::<T>::new(is_max, t.clone())))
    }
    match t {
        DataType::Int8 => make::<Int8Type>(is_max, t),
        DataType::Int16 => make::<Int16Type>(is_max, t),
        DataType::Int32 => make::<Int32Type>(is_max, t),
        DataType::Int64 => make::<Int64Type>(is_max, t),
        DataType::UInt8 => make::<UInt8Type>(is_max, t),
        DataType::UInt16 => make::<UInt16Type>(is_max, t),
        DataType::UInt32 => make::<UInt32Type>(is_max, t),
        DataType::UInt64 => make::<UInt64Type>(is_max, t),
        DataType::Float32 => make::<Float32Type>(is_max, t),
        DataType::Float64 => make::<Float64Type>(is_max, t),
        DataType::Date32 => make::<Date32Type>(is_max, t),
        DataType::Date64 => make::<Date64Type>(is_max, t),
        DataType::Timestamp(TimeUnit::Second, _) => make::<TimestampSecondType>(is_max, t),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            make::<TimestampMillisecondType>(is_max, t)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            make::<TimestampMicrosecondType>(is_max, t)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => make::<TimestampNanosecondType>(is_max, t),
        _ => None,
    }
}
