//! Group keys to dense group indices, with the key values kept readable.
//!
//! DataFusion's `GroupValues` does the hashing (specialised per key type);
//! it can only hand keys back by draining them, so first occurrences of new
//! keys are also appended to a column store that can be read at any time.
//!
//! The column store is a list of chunks whose sizes fall geometrically
//! (each at least [`MERGE_RATIO`] times the next): a new chunk is merged
//! into its elder neighbours only while they are not much bigger, so each
//! key is copied O(log n) times over its life and there are O(log n)
//! chunks. Reading some groups' keys gathers them from the chunks, so its
//! cost follows the groups read, not every group held.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, UInt32Array};
use arrow::compute::{concat, interleave, take};
use arrow::datatypes::{FieldRef, Schema};
use datafusion_physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion_physical_plan::aggregates::order::GroupOrdering;

use crate::error::Result;

/// A chunk is merged into its elder neighbour while that one holds at
/// most this many times its rows.
const MERGE_RATIO: usize = 4;

pub struct Interner {
    fields: Vec<FieldRef>,
    /// `None` when there are no key columns: every row is group 0.
    values: Option<Box<dyn GroupValues>>,
    /// Key columns of groups `starts[i]..starts[i + 1]`, oldest first.
    chunks: Vec<Vec<ArrayRef>>,
    /// First group of each chunk.
    starts: Vec<usize>,
    len: usize,
}

impl Interner {
    pub fn new(fields: &[FieldRef]) -> Result<Self> {
        let values = if fields.is_empty() {
            None
        } else {
            let schema = Arc::new(Schema::new(fields.to_vec()));
            Some(new_group_values(schema, &GroupOrdering::None)?)
        };
        Ok(Self {
            fields: fields.to_vec(),
            values,
            chunks: Vec::new(),
            starts: Vec::new(),
            len: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// Assigns the group of every row of `keys` into `groups`.
    pub fn intern(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        groups: &mut Vec<usize>,
    ) -> Result<()> {
        let Some(values) = self.values.as_mut() else {
            groups.clear();
            groups.resize(rows, 0);
            if rows > 0 {
                self.len = 1;
            }
            return Ok(());
        };
        let before = values.len();
        values.intern(keys, groups)?;
        let after = values.len();
        if after > before {
            // New groups are numbered in order of first occurrence.
            let mut first = vec![u32::MAX; after - before];
            let mut missing = after - before;
            for (row, &g) in groups.iter().enumerate() {
                if g >= before && first[g - before] == u32::MAX {
                    first[g - before] = row as u32;
                    missing -= 1;
                    if missing == 0 {
                        break;
                    }
                }
            }
            let idx = UInt32Array::from(first);
            let chunk = keys
                .iter()
                .map(|k| take(k.as_ref(), &idx, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            self.push_chunk(chunk, before)?;
        }
        self.len = after;
        Ok(())
    }

    /// Appends the keys of groups `first..`, merging chunks that are
    /// not much bigger than it (see the module docs).
    fn push_chunk(&mut self, mut chunk: Vec<ArrayRef>, mut first: usize) -> Result<()> {
        let rows = |c: &[ArrayRef]| c.first().map_or(0, |a| a.len());
        while let Some(last) = self.chunks.last() {
            if rows(last) > MERGE_RATIO * rows(&chunk) {
                break;
            }
            let last = self.chunks.pop().expect("checked");
            first = self.starts.pop().expect("one start per chunk");
            chunk = last
                .iter()
                .zip(&chunk)
                .map(|(a, b)| concat(&[a.as_ref(), b.as_ref()]))
                .collect::<std::result::Result<Vec<_>, _>>()?;
        }
        self.chunks.push(chunk);
        self.starts.push(first);
        Ok(())
    }

    /// Key columns of `groups`, in that order.
    pub fn keys(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        match self.chunks.as_slice() {
            [] => Ok(self.empty_keys()),
            [one] => {
                let idx = UInt32Array::from_iter_values(groups.iter().map(|&g| g as u32));
                Ok(one
                    .iter()
                    .map(|c| take(c.as_ref(), &idx, None))
                    .collect::<std::result::Result<_, _>>()?)
            }
            chunks => {
                let at: Vec<(usize, usize)> = groups
                    .iter()
                    .map(|&g| {
                        let c = self.starts.partition_point(|&s| s <= g) - 1;
                        (c, g - self.starts[c])
                    })
                    .collect();
                (0..self.fields.len())
                    .map(|col| {
                        let parts: Vec<&dyn Array> =
                            chunks.iter().map(|ch| ch[col].as_ref()).collect();
                        Ok(interleave(&parts, &at)?)
                    })
                    .collect()
            }
        }
    }

    /// Keeps only the keys of `survivors` (ascending), renumbered from 0
    /// in that order (an eviction's survivors).
    pub fn retain(&mut self, survivors: &[usize]) -> Result<()> {
        let keys = self.keys(survivors)?;
        let mut kept = Interner::new(&self.fields)?;
        let mut numbered = Vec::with_capacity(survivors.len());
        kept.intern(&keys, survivors.len(), &mut numbered)?;
        *self = kept;
        Ok(())
    }

    /// All key columns, group `i` at row `i`.
    pub fn all_keys(&mut self) -> Result<Vec<ArrayRef>> {
        self.consolidate()?;
        Ok(match self.chunks.first() {
            Some(cols) => cols.clone(),
            None => self.empty_keys(),
        })
    }

    fn empty_keys(&self) -> Vec<ArrayRef> {
        self.fields
            .iter()
            .map(|f| arrow::array::new_empty_array(f.data_type()))
            .collect()
    }

    fn consolidate(&mut self) -> Result<()> {
        if self.chunks.len() > 1 {
            let n = self.fields.len();
            let merged = (0..n)
                .map(|c| {
                    let parts: Vec<&dyn Array> =
                        self.chunks.iter().map(|ch| ch[c].as_ref()).collect();
                    concat(&parts)
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            self.chunks = vec![merged];
            self.starts = vec![0];
        }
        Ok(())
    }

    pub fn size(&self) -> usize {
        let stored: usize = self
            .chunks
            .iter()
            .flat_map(|c| c.iter())
            .map(|a| a.get_array_memory_size())
            .sum();
        stored + self.values.as_ref().map_or(0, |v| v.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type};

    #[test]
    fn keys_read_back_across_chunks_and_chunks_stay_few() {
        let fields: Vec<FieldRef> = vec![
            Arc::new(Field::new("n", DataType::Int64, false)),
            Arc::new(Field::new("s", DataType::Utf8, true)),
        ];
        let mut interner = Interner::new(&fields).unwrap();
        let mut groups = Vec::new();
        let mut next = 0i64;
        for batch in 0..300 {
            // Each batch repeats some old keys and adds a few new ones.
            let mut ns: Vec<i64> = (0..(batch % 7) as i64)
                .map(|i| i * 3 % next.max(1))
                .collect();
            ns.extend(next..next + 5);
            next += 5;
            let strings: Vec<Option<String>> = ns.iter().map(|n| Some(format!("k{n}"))).collect();
            let keys: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(ns.clone())),
                Arc::new(StringArray::from(strings)),
            ];
            interner.intern(&keys, ns.len(), &mut groups).unwrap();
            // Keys are numbered in order of first occurrence: key n is group n.
            assert_eq!(groups, ns.iter().map(|&n| n as usize).collect::<Vec<_>>());
        }
        assert_eq!(interner.len(), next as usize);
        assert!(
            interner.chunks.len() <= 8,
            "{} chunks",
            interner.chunks.len()
        );
        let pick: Vec<usize> = vec![1499, 0, 7, 700, 3, 1200, 7];
        let got = interner.keys(&pick).unwrap();
        let ns = got[0].as_primitive::<Int64Type>();
        let ss = got[1].as_string::<i32>();
        for (i, &g) in pick.iter().enumerate() {
            assert_eq!(ns.value(i), g as i64);
            assert_eq!(ss.value(i), format!("k{g}"));
        }
        let all = interner.all_keys().unwrap();
        assert_eq!(all[0].len(), next as usize);
        assert_eq!(interner.chunks.len(), 1);
        assert_eq!(interner.keys(&pick).unwrap()[0].as_ref(), got[0].as_ref());
    }
}
