//! Variance and standard deviation (sample and population) from exact sums.
//!
//! Welford's update (DataFusion's) is order-dependent in floating point and
//! its merge is not bit-exact, so a resumed run could differ in the last
//! bits. Here the state is `n`, `Σx` and `Σx²` kept exactly (each `x²` split
//! into two floats with an FMA so no bit is lost), and the final formula runs
//! in double-double arithmetic: deterministic and at least as accurate.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, Float64Array, UInt64Array};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, UInt64Type};

use super::exact::ExactSum;
use super::native::{exact_sum_at, exact_sum_fields, exact_sums_to_arrays, for_each_row, grow};
use super::{StreamAccumulator, row_mask};
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    VarSamp,
    VarPop,
    StddevSamp,
    StddevPop,
}

impl Moment {
    /// DataFusion's canonical function names.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "var" | "var_samp" | "var_sample" => Moment::VarSamp,
            "var_pop" | "var_population" => Moment::VarPop,
            "stddev" | "stddev_samp" => Moment::StddevSamp,
            "stddev_pop" => Moment::StddevPop,
            _ => return None,
        })
    }
    fn sample(self) -> bool {
        matches!(self, Moment::VarSamp | Moment::StddevSamp)
    }
    fn sqrt(self) -> bool {
        matches!(self, Moment::StddevSamp | Moment::StddevPop)
    }
}

#[derive(Debug)]
pub struct MomentAccumulator {
    kind: Moment,
    n: Vec<u64>,
    s1: Vec<ExactSum>,
    s2: Vec<ExactSum>,
}

impl MomentAccumulator {
    pub fn new(kind: Moment) -> Self {
        Self {
            kind,
            n: Vec::new(),
            s1: Vec::new(),
            s2: Vec::new(),
        }
    }
    pub fn state_fields() -> Vec<FieldRef> {
        let mut f = vec![Arc::new(Field::new("count", DataType::UInt64, true))];
        f.extend(exact_sum_fields("s1"));
        f.extend(exact_sum_fields("s2"));
        f
    }
    fn grow(&mut self, total: usize) {
        grow(&mut self.n, total, 0);
        grow(&mut self.s1, total, ExactSum::default());
        grow(&mut self.s2, total, ExactSum::default());
    }
    fn value(&self, g: usize) -> Option<f64> {
        let n = self.n[g];
        if n == 0 || (n == 1 && self.kind.sample()) {
            return None;
        }
        if n == 1 {
            return Some(0.0);
        }
        let s1 = self.s1[g].value_dd();
        let s2 = self.s2[g].value_dd();
        if !(s1.0.is_finite() && s2.0.is_finite()) {
            return Some(f64::NAN);
        }
        // n * var = Σx² - (Σx)² / n
        let centered = dd_sub(s2, dd_div(dd_mul(s1, s1), n as f64));
        let denom = if self.kind.sample() {
            (n - 1) as f64
        } else {
            n as f64
        };
        let var = ((centered.0 + centered.1) / denom).max(0.0);
        Some(if self.kind.sqrt() { var.sqrt() } else { var })
    }
}

impl StreamAccumulator for MomentAccumulator {
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
        let (n, s1, s2) = (&mut self.n, &mut self.s1, &mut self.s2);
        for_each_row(groups, &mask, |i, g| {
            let x = v[i];
            let (hi, lo) = two_prod(x, x);
            n[g] += 1;
            s1[g].add(x);
            s2[g].add(hi);
            s2[g].add(lo);
        });
        Ok(())
    }
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        Ok(Arc::new(Float64Array::from_iter(
            groups.iter().map(|&g| self.value(g)),
        )))
    }
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let mut out: Vec<ArrayRef> = vec![Arc::new(UInt64Array::from_iter_values(
            groups.iter().map(|&g| self.n[g]),
        ))];
        out.extend(exact_sums_to_arrays(&self.s1, groups)?);
        out.extend(exact_sums_to_arrays(&self.s2, groups)?);
        Ok(out)
    }
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        self.grow(total_groups);
        let n = states[0].as_primitive::<UInt64Type>();
        for (i, &g) in groups.iter().enumerate() {
            self.n[g] += n.value(i);
            self.s1[g].merge(&exact_sum_at(&states[1..4], i)?);
            self.s2[g].merge(&exact_sum_at(&states[4..7], i)?);
        }
        Ok(())
    }
    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        for &g in groups {
            if g < self.n.len() {
                self.n[g] = 0;
                self.s1[g] = ExactSum::default();
                self.s2[g] = ExactSum::default();
            }
        }
        Ok(())
    }
    fn size(&self) -> usize {
        self.n.capacity() * 8
            + (self.s1.capacity() + self.s2.capacity()) * std::mem::size_of::<ExactSum>()
    }
}

// Double-double arithmetic (pairs hi + lo with |lo| <= ulp(hi)/2).

#[inline]
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    (p, a.mul_add(b, -p))
}

#[inline]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

#[inline]
fn quick_two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    (s, b - (s - a))
}

fn dd_mul(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    let (p, e) = two_prod(a.0, b.0);
    quick_two_sum(p, e + (a.0 * b.1 + a.1 * b.0))
}

fn dd_div(a: (f64, f64), b: f64) -> (f64, f64) {
    let q1 = a.0 / b;
    let (p1, p2) = two_prod(q1, b);
    let (s, e) = two_sum(a.0, -p1);
    let q2 = (s + (e - p2 + a.1)) / b;
    quick_two_sum(q1, q2)
}

fn dd_sub(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    let (s, e) = two_sum(a.0, -b.0);
    quick_two_sum(s, e + (a.1 - b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(kind: Moment, xs: &[f64]) -> Option<f64> {
        let mut acc = MomentAccumulator::new(kind);
        let arr: ArrayRef = Arc::new(Float64Array::from(xs.to_vec()));
        acc.update(&[arr], &vec![0; xs.len()], None, 1).unwrap();
        acc.value(0)
    }

    #[test]
    fn matches_textbook() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(var(Moment::VarPop, &xs), Some(4.0));
        assert_eq!(var(Moment::StddevPop, &xs), Some(2.0));
        assert_eq!(var(Moment::VarSamp, &xs), Some(32.0 / 7.0));
        assert_eq!(var(Moment::VarSamp, &[1.0]), None);
        assert_eq!(var(Moment::VarPop, &[1.0]), Some(0.0));
        assert_eq!(var(Moment::VarPop, &[]), None);
    }

    #[test]
    fn no_cancellation_with_large_mean() {
        let xs: Vec<f64> = (0..1000).map(|i| 1e9 + (i % 2) as f64).collect();
        let v = var(Moment::VarPop, &xs).unwrap();
        assert!((v - 0.25).abs() < 1e-12, "{v}");
    }
}
