//! Order-independent float summation.
//!
//! Floating-point addition is not associative, so a plain `f64` running sum
//! depends on the order rows arrive in: on batch boundaries, on how Kafka
//! partitions interleave, on where a run resumed. ubik's changelog must be a
//! pure function of the input records, so float sums are kept exactly, in
//! 256-bit two's complement fixed point with 100 fractional bits. Integer
//! addition is associative, so any order of the same values gives the same
//! bits, and the final rounding to `f64` is correct (round to nearest, ties to
//! even).
//!
//! Coverage: every finite value with magnitude below 2^120 (about 1.3e36) is
//! added exactly, except for bits below 2^-100 (about 7.9e-31), which are
//! rounded to nearest per value — itself order-independent. Larger magnitudes
//! fall into a separate `f64` sum (order-dependent; no realistic data gets
//! there); the 2^35 headroom above 2^120 keeps the fixed point from overflowing. NaN and infinities are tracked as flags so their outcome is
//! order-independent too.

/// Fractional bits of the fixed point.
const FRAC_BITS: i32 = 100;
/// Values whose magnitude reaches 2^MAX_EXP are summed as plain floats.
const MAX_EXP: i32 = 120;

pub const FLAG_NAN: u8 = 1;
pub const FLAG_POS_INF: u8 = 2;
pub const FLAG_NEG_INF: u8 = 4;

/// A 256-bit signed integer as two limbs (value = hi * 2^128 + lo).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fixed256 {
    pub lo: u128,
    pub hi: i128,
}

impl Fixed256 {
    pub const ZERO: Fixed256 = Fixed256 { lo: 0, hi: 0 };

    #[inline]
    pub fn add(&mut self, other: Fixed256) {
        let (lo, carry) = self.lo.overflowing_add(other.lo);
        self.lo = lo;
        self.hi = self.hi.wrapping_add(other.hi).wrapping_add(carry as i128);
    }

    #[inline]
    fn neg(self) -> Fixed256 {
        let lo = (!self.lo).wrapping_add(1);
        let hi = (!self.hi).wrapping_add((lo == 0) as i128);
        Fixed256 { lo, hi }
    }

    #[inline]
    fn is_negative(&self) -> bool {
        self.hi < 0
    }

    /// `m * 2^shift` for a non-negative 53-bit mantissa and 0 <= shift <= 200.
    #[inline]
    fn from_shifted(m: u64, shift: u32) -> Fixed256 {
        let m = m as u128;
        if shift == 0 {
            Fixed256 { lo: m, hi: 0 }
        } else if shift < 128 {
            Fixed256 {
                lo: m << shift,
                hi: (m >> (128 - shift)) as i128,
            }
        } else {
            Fixed256 {
                lo: 0,
                hi: (m << (shift - 128)) as i128,
            }
        }
    }

    pub fn to_le_bytes(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.lo.to_le_bytes());
        out[16..].copy_from_slice(&self.hi.to_le_bytes());
        out
    }

    pub fn from_le_bytes(b: &[u8]) -> Fixed256 {
        Fixed256 {
            lo: u128::from_le_bytes(b[..16].try_into().expect("16 bytes")),
            hi: i128::from_le_bytes(b[16..32].try_into().expect("16 bytes")),
        }
    }

    /// The value divided by 2^FRAC_BITS, correctly rounded to `f64`.
    pub fn to_f64(self) -> f64 {
        let negative = self.is_negative();
        let m = if negative { self.neg() } else { self };
        let hi = m.hi as u128;
        let magnitude = if hi == 0 {
            // u128 -> f64 rounds to nearest, ties to even.
            (m.lo as f64) * pow2(-FRAC_BITS)
        } else {
            // Keep the top 128 bits and fold the rest into a sticky bit so the
            // single rounding in the cast is still correct.
            let shift = 128 - hi.leading_zeros();
            let (top, lost) = if shift == 128 {
                (hi, m.lo)
            } else {
                (
                    (hi << (128 - shift)) | (m.lo >> shift),
                    m.lo & ((1u128 << shift) - 1),
                )
            };
            let top = top | (lost != 0) as u128;
            (top as f64) * pow2(shift as i32 - FRAC_BITS)
        };
        if negative { -magnitude } else { magnitude }
    }

    /// The exact fixed-point image of `x`, if it is within the exact range.
    pub fn from_f64(x: f64) -> Option<Fixed256> {
        let bits = x.to_bits();
        let exp_bits = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1u64 << 52) - 1);
        if exp_bits == 0x7ff {
            return None;
        }
        let (m, e) = if exp_bits == 0 {
            (frac, -1074)
        } else {
            (frac | (1u64 << 52), exp_bits - 1075)
        };
        if m == 0 {
            return Some(Fixed256::ZERO);
        }
        // value = m * 2^e; fixed = m * 2^(e + FRAC_BITS)
        if e + 53 > MAX_EXP {
            return None;
        }
        let shift = e + FRAC_BITS;
        let v = if shift >= 0 {
            Fixed256::from_shifted(m, shift as u32)
        } else {
            let s = (-shift) as u32;
            let q = if s >= 64 { 0 } else { m >> s };
            // Round half to even on the bits shifted out.
            let rem_bits = if s >= 64 { m } else { m & ((1u64 << s) - 1) };
            let half = if s > 64 { 0 } else { 1u64 << (s - 1) };
            let q = if s > 64 {
                q
            } else if rem_bits > half || (rem_bits == half && q & 1 == 1) {
                q + 1
            } else {
                q
            };
            Fixed256 {
                lo: q as u128,
                hi: 0,
            }
        };
        Some(if x.is_sign_negative() { v.neg() } else { v })
    }
}

#[inline]
fn pow2(e: i32) -> f64 {
    // Exact for the exponents used here (|e| < 1000).
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Exact running sum of floats for one group.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExactSum {
    pub fixed: Fixed256,
    /// Sum of values too large for the fixed point (practically always 0).
    pub big: f64,
    /// NaN / +inf / -inf seen.
    pub flags: u8,
}

impl ExactSum {
    #[inline]
    pub fn add(&mut self, x: f64) {
        match Fixed256::from_f64(x) {
            Some(v) => self.fixed.add(v),
            None if x.is_nan() => self.flags |= FLAG_NAN,
            None if x == f64::INFINITY => self.flags |= FLAG_POS_INF,
            None if x == f64::NEG_INFINITY => self.flags |= FLAG_NEG_INF,
            None => self.big += x,
        }
    }

    #[inline]
    pub fn merge(&mut self, other: &ExactSum) {
        self.fixed.add(other.fixed);
        self.big += other.big;
        self.flags |= other.flags;
    }

    pub fn value(&self) -> f64 {
        if self.flags & FLAG_NAN != 0
            || (self.flags & FLAG_POS_INF != 0 && self.flags & FLAG_NEG_INF != 0)
        {
            return f64::NAN;
        }
        if self.flags & FLAG_POS_INF != 0 {
            return f64::INFINITY;
        }
        if self.flags & FLAG_NEG_INF != 0 {
            return f64::NEG_INFINITY;
        }
        if self.big != 0.0 {
            return self.fixed.to_f64() + self.big;
        }
        self.fixed.to_f64()
    }

    /// The sum as an unevaluated pair `hi + lo` (double-double), for formulas
    /// that subtract nearly equal sums (variance).
    pub fn value_dd(&self) -> (f64, f64) {
        let hi = self.value();
        if !hi.is_finite() || self.big != 0.0 {
            return (hi, 0.0);
        }
        match Fixed256::from_f64(hi) {
            Some(h) => {
                let mut rest = self.fixed;
                rest.add(h.neg());
                (hi, rest.to_f64())
            }
            None => (hi, 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum_of(xs: &[f64]) -> f64 {
        let mut s = ExactSum::default();
        for &x in xs {
            s.add(x);
        }
        s.value()
    }

    #[test]
    fn exact_where_floats_are_not() {
        assert_eq!(sum_of(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!(sum_of(&[0.1, 0.2, 0.3]), 0.6);
        assert_eq!(sum_of(&[0.1; 10]), 1.0);
        assert_eq!(sum_of(&[-2.5, 1.25]), -1.25);
        assert_eq!(sum_of(&[]), 0.0);
        assert_eq!(sum_of(&[1e40, 1e40]), 2e40);
        assert_eq!(sum_of(&[5e-324]), 0.0); // below the grid: rounded to 0
    }

    #[test]
    fn order_independent() {
        let xs: Vec<f64> = (0..2000)
            .map(|i| ((i * 7919) % 1000) as f64 * 0.37 - 150.0 + 1e-9 * i as f64)
            .collect();
        let mut rev = xs.clone();
        rev.reverse();
        assert_eq!(sum_of(&xs).to_bits(), sum_of(&rev).to_bits());
        let mut a = ExactSum::default();
        let mut b = ExactSum::default();
        for (i, &x) in xs.iter().enumerate() {
            if i % 3 == 0 { a.add(x) } else { b.add(x) }
        }
        a.merge(&b);
        assert_eq!(a.value().to_bits(), sum_of(&xs).to_bits());
    }

    #[test]
    fn specials() {
        assert!(sum_of(&[1.0, f64::NAN]).is_nan());
        assert!(sum_of(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        assert_eq!(sum_of(&[f64::INFINITY, 1.0]), f64::INFINITY);
        assert_eq!(sum_of(&[1e300, 1e300]), 2e300);
    }

    #[test]
    fn rounding_is_correct_for_large_sums() {
        // 2^53 + 1 is not representable; the exact sum rounds to even.
        assert_eq!(sum_of(&[9007199254740992.0, 1.0]), 9007199254740992.0);
        assert_eq!(sum_of(&[9007199254740992.0, 1.0, 1.0]), 9007199254740994.0);
        assert_eq!(sum_of(&[1e38, 1.0, -1e38]), 1.0);
        let (hi, lo) = {
            let mut s = ExactSum::default();
            s.add(1.0);
            s.add(1e-20);
            s.value_dd()
        };
        assert_eq!(hi, 1.0);
        assert!((lo - 1e-20).abs() < 1e-30);
    }
}
