//! Accumulators that take rows back out, for aggregations over a
//! changelog (a Debezium source): an update retracts the old row and folds
//! the new one in. Counts and exact float sums retract natively
//! ([`super::native`]); here are integer sums, which must know when their
//! last value left (the sum is then NULL again). `min`/`max` are in
//! [`super::extreme`].

use std::marker::PhantomData;
use std::sync::Arc;

use arrow::array::ArrowNativeTypeOp;
use arrow::array::PrimitiveArray;
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Field, FieldRef, Int64Type};

use super::native::{for_each_row, grow};
use super::{StreamAccumulator, row_mask};
use crate::error::Result;

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

#[cfg(test)]
mod tests {
    use super::*;

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
