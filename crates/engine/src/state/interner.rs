//! Group keys to dense group indices, with the key values kept readable.
//!
//! DataFusion's `GroupValues` does the hashing (specialised per key type);
//! it can only hand keys back by draining them, so first occurrences of new
//! keys are also appended to a column store that can be read at any time.

use std::sync::Arc;

use arrow::array::{ArrayRef, UInt32Array};
use arrow::compute::{concat, take};
use arrow::datatypes::{FieldRef, Schema};
use datafusion_physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion_physical_plan::aggregates::order::GroupOrdering;

use crate::error::Result;

pub struct Interner {
    fields: Vec<FieldRef>,
    /// `None` when there are no key columns: every row is group 0.
    values: Option<Box<dyn GroupValues>>,
    chunks: Vec<Vec<ArrayRef>>,
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
            self.chunks.push(chunk);
        }
        self.len = after;
        Ok(())
    }

    /// Key columns of `groups`, in that order.
    pub fn keys(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        self.consolidate()?;
        let idx = UInt32Array::from_iter_values(groups.iter().map(|&g| g as u32));
        match self.chunks.first() {
            Some(cols) => Ok(cols
                .iter()
                .map(|c| take(c.as_ref(), &idx, None))
                .collect::<std::result::Result<_, _>>()?),
            None => Ok(self
                .fields
                .iter()
                .map(|f| arrow::array::new_empty_array(f.data_type()))
                .collect()),
        }
    }

    /// All key columns, group `i` at row `i`.
    pub fn all_keys(&mut self) -> Result<Vec<ArrayRef>> {
        self.consolidate()?;
        Ok(match self.chunks.first() {
            Some(cols) => cols.clone(),
            None => self
                .fields
                .iter()
                .map(|f| arrow::array::new_empty_array(f.data_type()))
                .collect(),
        })
    }

    fn consolidate(&mut self) -> Result<()> {
        if self.chunks.len() > 1 {
            let n = self.fields.len();
            let merged = (0..n)
                .map(|c| {
                    let parts: Vec<&dyn arrow::array::Array> =
                        self.chunks.iter().map(|ch| ch[c].as_ref()).collect();
                    concat(&parts)
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            self.chunks = vec![merged];
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
