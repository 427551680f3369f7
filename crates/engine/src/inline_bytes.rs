//! [`InlineBytes`]: a short byte string (a key, a value or a whole row in
//! Arrow's row format) held inline, so a hash table that holds it reads it
//! where its slot is instead of chasing a pointer to a heap box: most keys
//! and short values are at most 16 bytes, and a changelog's rows of the
//! few columns an aggregation reads often fit in 46.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Bytes, inline up to `N` of them (`N` below 256). Compares and hashes as
/// the `[u8]` it holds, so a table keyed by it is looked up by `&[u8]`.
#[derive(Debug, Clone)]
pub enum InlineBytes<const N: usize = 16> {
    /// The bytes, zero-padded, and their length.
    Inline([u8; N], u8),
    Heap(Box<[u8]>),
}

impl<const N: usize> InlineBytes<N> {
    pub fn new(value: &[u8]) -> Self {
        const { assert!(N < 256, "the length is a u8") };
        match value.len() {
            n if n <= N => {
                let mut bytes = [0; N];
                bytes[..n].copy_from_slice(value);
                InlineBytes::Inline(bytes, n as u8)
            }
            _ => InlineBytes::Heap(value.into()),
        }
    }

    /// Makes these bytes `value`: in place when inline or when the box
    /// held is as long (a row rewritten with values of the same widths
    /// allocates nothing); a boxed value of another length gets a new box.
    pub fn set(&mut self, value: &[u8]) {
        match self {
            InlineBytes::Heap(b) if b.len() == value.len() => b.copy_from_slice(value),
            _ => *self = Self::new(value),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            InlineBytes::Inline(bytes, n) => &bytes[..*n as usize],
            InlineBytes::Heap(v) => v,
        }
    }
}

impl<const N: usize> From<&[u8]> for InlineBytes<N> {
    fn from(value: &[u8]) -> Self {
        Self::new(value)
    }
}

impl<const N: usize> PartialEq for InlineBytes<N> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // Padding is zeros: equal arrays and lengths are equal bytes.
            (InlineBytes::Inline(a, m), InlineBytes::Inline(b, n)) => a == b && m == n,
            _ => self.as_slice() == other.as_slice(),
        }
    }
}

impl<const N: usize> Eq for InlineBytes<N> {}

impl<const N: usize> Hash for InlineBytes<N> {
    /// As the `[u8]` it holds (which `Borrow` requires).
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl<const N: usize> Borrow<[u8]> for InlineBytes<N> {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl<const N: usize> AsRef<[u8]> for InlineBytes<N> {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl<const N: usize> std::ops::Deref for InlineBytes<N> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Short and long values, with zero bytes where padding would be.
    fn values() -> Vec<Vec<u8>> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut values: Vec<Vec<u8>> = (0..2000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let len = (state % 60) as usize;
                (0..len)
                    .map(|i| [0, 1, 255][(state >> (i % 32 * 2)) as usize % 3])
                    .collect()
            })
            .collect();
        values.extend([vec![], vec![0], vec![0; 16], vec![0; 17], vec![1, 0]]);
        values.extend([vec![0; 46], vec![0; 47], vec![7; 46], vec![7; 47]]);
        values
    }

    fn compare_and_hash_as_their_bytes<const N: usize>() {
        let values = values();
        let hasher = hashbrown::DefaultHashBuilder::default();
        for a in &values {
            let x = InlineBytes::<N>::new(a);
            assert_eq!(x.as_slice(), a.as_slice());
            assert_eq!(hasher.hash_one(&x), hasher.hash_one(a.as_slice()));
            for b in values.iter().step_by(7) {
                let y = InlineBytes::<N>::new(b);
                assert_eq!(x == y, a == b);
            }
        }
    }

    #[test]
    fn inline_bytes_compare_and_hash_as_their_bytes() {
        compare_and_hash_as_their_bytes::<16>();
        compare_and_hash_as_their_bytes::<ROW>();
    }

    const ROW: usize = 46;

    /// `set` gives the bytes set whatever was held before (inline or boxed,
    /// as long or not), and equals a new value of those bytes.
    #[test]
    fn set_bytes_are_the_bytes_set() {
        let values = values();
        let mut held = InlineBytes::<ROW>::new(&[]);
        for v in &values {
            held.set(v);
            assert_eq!(held.as_slice(), v.as_slice());
            assert_eq!(held, InlineBytes::new(v));
            assert_eq!(matches!(held, InlineBytes::Inline(..)), v.len() <= ROW);
        }
        // A row of a box's length is written into that box.
        let mut held = InlineBytes::<ROW>::new(&[1; 50]);
        let InlineBytes::Heap(b) = &held else {
            panic!("boxed")
        };
        let at = b.as_ptr();
        held.set(&[2; 50]);
        let InlineBytes::Heap(b) = &held else {
            panic!("boxed")
        };
        assert_eq!((b.as_ptr(), &b[..]), (at, &[2; 50][..]));
    }

    /// The sizes the tables that hold them are laid out for.
    #[test]
    fn sizes() {
        assert_eq!(size_of::<InlineBytes>(), 24);
        assert_eq!(size_of::<Option<InlineBytes<ROW>>>(), 48);
    }
}
