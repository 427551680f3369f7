//! [`InlineBytes`]: a short byte string (a key or a value in Arrow's row
//! format) held inline, so a hash table that holds it reads it where its
//! slot is instead of chasing a pointer to a heap box: most keys and short
//! values are at most 16 bytes.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

/// Bytes, inline up to 16 of them. Compares and hashes as the `[u8]` it
/// holds, so a table keyed by it is looked up by `&[u8]`.
#[derive(Debug, Clone)]
pub enum InlineBytes {
    /// The bytes, zero-padded, and their length.
    Inline([u8; 16], u8),
    Heap(Box<[u8]>),
}

impl InlineBytes {
    pub fn new(value: &[u8]) -> Self {
        match value.len() {
            n @ 0..=16 => {
                let mut bytes = [0; 16];
                bytes[..n].copy_from_slice(value);
                InlineBytes::Inline(bytes, n as u8)
            }
            _ => InlineBytes::Heap(value.into()),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            InlineBytes::Inline(bytes, n) => &bytes[..*n as usize],
            InlineBytes::Heap(v) => v,
        }
    }
}

impl From<&[u8]> for InlineBytes {
    fn from(value: &[u8]) -> Self {
        Self::new(value)
    }
}

impl PartialEq for InlineBytes {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            // Padding is zeros: equal arrays and lengths are equal bytes.
            (InlineBytes::Inline(a, m), InlineBytes::Inline(b, n)) => a == b && m == n,
            _ => self.as_slice() == other.as_slice(),
        }
    }
}

impl Eq for InlineBytes {}

impl Hash for InlineBytes {
    /// As the `[u8]` it holds (which `Borrow` requires).
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl Borrow<[u8]> for InlineBytes {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for InlineBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::Deref for InlineBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn inline_bytes_compare_and_hash_as_their_bytes() {
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
        let hasher = hashbrown::DefaultHashBuilder::default();
        for a in &values {
            let x = InlineBytes::new(a);
            assert_eq!(hasher.hash_one(&x), hasher.hash_one(a.as_slice()));
            for b in values.iter().step_by(7) {
                let y = InlineBytes::new(b);
                assert_eq!(x == y, a == b);
            }
        }
    }
}
