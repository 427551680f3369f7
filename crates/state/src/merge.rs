//! Merging runs in key order: the newest run's row wins when several hold
//! a key. Compaction writes the merge as one run; a scan reads it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::compute::interleave;
use arrow::datatypes::SchemaRef;

use crate::error::Result;
use crate::run::{Block, Run};

/// Rows per merged batch.
const MERGED_ROWS: usize = 8192;

struct Cursor {
    run: Arc<Run>,
    next_block: usize,
    block: Option<Arc<Block>>,
    row: usize,
}

impl Cursor {
    /// Moves to the next row, loading the next block when one is used up.
    fn advance(&mut self) -> Result<()> {
        self.row += 1;
        self.skip_used_blocks()
    }

    fn load_first(&mut self) -> Result<()> {
        self.row = 0;
        self.skip_used_blocks()
    }

    /// Moves to the first row whose key is at or after `start`, reading
    /// no block before the one that may hold it.
    fn seek(&mut self, start: &[u8]) -> Result<()> {
        let Some(first) = self.run.first_block_from(start) else {
            self.next_block = self.run.blocks();
            self.block = None;
            return Ok(());
        };
        self.next_block = first;
        self.block = None;
        self.load_first()?;
        while self.key().is_some_and(|k| k < start) {
            self.advance()?;
        }
        Ok(())
    }

    fn skip_used_blocks(&mut self) -> Result<()> {
        while self.block.as_ref().is_none_or(|b| self.row >= b.len()) {
            if self.next_block >= self.run.blocks() {
                self.block = None;
                return Ok(());
            }
            self.block = Some(Arc::new(self.run.read_block(self.next_block)?));
            self.next_block += 1;
            self.row = 0;
        }
        Ok(())
    }

    fn key(&self) -> Option<&[u8]> {
        self.block.as_ref().map(|b| b.keys.value(self.row))
    }
}

/// One batch of merged rows.
pub struct Merged {
    pub keys: BinaryArray,
    pub deleted: BooleanArray,
    pub values: RecordBatch,
}

/// Rows whose `Int64` value column `column` is at most `through` count as
/// deleted (state that outlived its time to live).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    pub column: usize,
    pub through: i64,
}

impl Expiry {
    /// Whether row `row` of `values` has expired.
    pub fn expired(&self, values: &RecordBatch, row: usize) -> bool {
        let c = values.column(self.column);
        c.as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .is_some_and(|t| t.is_valid(row) && t.value(row) <= self.through)
    }
}

/// The merge of some runs of one table, in key order.
pub struct Merge {
    /// Newest run first: on equal keys the lowest index wins.
    cursors: Vec<Cursor>,
    keep_tombstones: bool,
    expiry: Option<Expiry>,
    values: SchemaRef,
}

impl Merge {
    /// Merges `runs` (newest first). Tombstones are kept when
    /// `keep_tombstones` (older runs not merged may hold their keys).
    /// Expired rows are left out: every older copy of their key has
    /// expired too (a key's time only grows until it expires).
    pub fn new(
        runs: &[Arc<Run>],
        keep_tombstones: bool,
        expiry: Option<Expiry>,
        values: SchemaRef,
    ) -> Result<Self> {
        Self::open(runs, None, keep_tombstones, expiry, values)
    }

    /// [`Self::new`] over the keys at or after `start` only: a run whose
    /// keys all come before it is never read, nor are the blocks before it.
    pub fn from_key(
        runs: &[Arc<Run>],
        start: &[u8],
        expiry: Option<Expiry>,
        values: SchemaRef,
    ) -> Result<Self> {
        Self::open(runs, Some(start), false, expiry, values)
    }

    fn open(
        runs: &[Arc<Run>],
        start: Option<&[u8]>,
        keep_tombstones: bool,
        expiry: Option<Expiry>,
        values: SchemaRef,
    ) -> Result<Self> {
        let mut cursors = Vec::with_capacity(runs.len());
        for run in runs {
            let mut c = Cursor {
                run: Arc::clone(run),
                next_block: 0,
                block: None,
                row: 0,
            };
            match start {
                Some(start) => c.seek(start)?,
                None => c.load_first()?,
            }
            cursors.push(c);
        }
        Ok(Self {
            cursors,
            keep_tombstones,
            expiry,
            values,
        })
    }

    /// The next batch of merged rows, `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<Merged>> {
        // Blocks the picks point into, and (block, row) per picked row.
        let mut blocks: Vec<Arc<Block>> = Vec::new();
        let mut block_of_cursor: Vec<Option<usize>> = vec![None; self.cursors.len()];
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(MERGED_ROWS);
        while picks.len() < MERGED_ROWS {
            let mut best: Option<usize> = None;
            for (i, c) in self.cursors.iter().enumerate() {
                let Some(k) = c.key() else { continue };
                if best.is_none_or(|b| k < self.cursors[b].key().expect("has a key")) {
                    best = Some(i);
                }
            }
            let Some(best) = best else { break };
            let key = self.cursors[best].key().expect("has a key").to_vec();
            let c = &self.cursors[best];
            let block = c.block.as_ref().expect("has a block");
            let tombstone = block.deleted.value(c.row);
            let expired =
                !tombstone && self.expiry.is_some_and(|e| e.expired(&block.values, c.row));
            if !expired && (!tombstone || self.keep_tombstones) {
                let slot = match block_of_cursor[best] {
                    Some(s) if Arc::ptr_eq(&blocks[s], block) => s,
                    _ => {
                        blocks.push(Arc::clone(block));
                        block_of_cursor[best] = Some(blocks.len() - 1);
                        blocks.len() - 1
                    }
                };
                picks.push((slot, c.row));
            }
            // Older copies of the key lose to this one.
            for c in self.cursors.iter_mut() {
                if c.key() == Some(key.as_slice()) {
                    c.advance()?;
                }
            }
        }
        if picks.is_empty() {
            return Ok(None);
        }
        let keys: Vec<&dyn Array> = blocks.iter().map(|b| &b.keys as &dyn Array).collect();
        let deleted: Vec<&dyn Array> = blocks.iter().map(|b| &b.deleted as &dyn Array).collect();
        let keys = interleave(&keys, &picks)?;
        let deleted = interleave(&deleted, &picks)?;
        let columns = (0..self.values.fields().len())
            .map(|c| {
                let parts: Vec<&dyn Array> =
                    blocks.iter().map(|b| b.values.column(c).as_ref()).collect();
                interleave(&parts, &picks)
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let values = RecordBatch::try_new_with_options(
            Arc::clone(&self.values),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(picks.len())),
        )?;
        Ok(Some(Merged {
            keys: keys
                .as_any()
                .downcast_ref::<BinaryArray>()
                .expect("binary")
                .clone(),
            deleted: deleted
                .as_any()
                .downcast_ref::<BooleanArray>()
                .expect("boolean")
                .clone(),
            values,
        }))
    }
}
