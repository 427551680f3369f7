//! [`Backing`]: the store table behind an operator's keyed state, and the
//! bookkeeping every spilling operator needs per group: which groups
//! changed since they were last written, when each was last used (the
//! eviction order), and whether the store may hold groups not in memory.
//!
//! The operator keeps its groups in memory in its own layout, numbered
//! densely (an [`Interner`](super::Interner)); the backing speaks in those
//! numbers and in the groups' key columns, and the store keys a group by
//! its key columns' byte-comparable row.

use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use arrow::datatypes::{Field, FieldRef, SchemaRef};
use arrow::row::{RowConverter, SortField};
use ubik_state::{KeyEncoder, Lookup};

use super::store::SharedStore;
use super::table::StoreTable;
use crate::error::Result;

/// The key columns of a state table: `k0`, `k1`, ... of the keys' types,
/// nullable (a key may hold nulls).
pub(crate) fn key_column_fields(key_fields: &[FieldRef]) -> Vec<FieldRef> {
    key_fields
        .iter()
        .enumerate()
        .map(|(i, f)| Arc::new(Field::new(format!("k{i}"), f.data_type().clone(), true)))
        .collect()
}

/// Group keys as the store's keys: their columns' byte-comparable rows (an
/// empty key for a global aggregate's one group).
struct RowKeys(RowConverter);

impl KeyEncoder for RowKeys {
    fn encode(&self, columns: &[ArrayRef], rows: usize) -> ubik_state::Result<BinaryArray> {
        if columns.is_empty() {
            return Ok(BinaryArray::from_iter_values(std::iter::repeat_n(
                b"", rows,
            )));
        }
        Ok(self.0.convert_columns(columns)?.try_into_binary()?)
    }
}

/// Which groups an eviction moves out of memory.
pub(crate) struct Eviction {
    /// The groups that stay (ascending).
    pub survivors: Vec<usize>,
    /// How many leave.
    pub victims: usize,
    /// The leaving groups changed since they were last written (ascending):
    /// the others are in the store as they are.
    pub written: Vec<usize>,
}

/// A set of groups (changed since they were last emitted, or written).
#[derive(Default)]
pub(crate) struct Dirty {
    pub flag: Vec<bool>,
    pub list: Vec<usize>,
}

impl Dirty {
    pub fn mark(&mut self, groups: &[usize]) {
        for &g in groups {
            if !self.flag[g] {
                self.flag[g] = true;
                self.list.push(g);
            }
        }
    }

    /// The groups in the set, and clears it.
    pub fn take(&mut self) -> Vec<usize> {
        for &g in &self.list {
            self.flag[g] = false;
        }
        std::mem::take(&mut self.list)
    }

    /// Keeps only `survivors` (ascending), renumbered from 0 in that order.
    pub fn keep(&mut self, survivors: &[usize]) {
        let flag: Vec<bool> = survivors.iter().map(|&g| self.flag[g]).collect();
        self.list = (0..survivors.len()).filter(|&i| flag[i]).collect();
        self.flag = flag;
    }

    pub fn size(&self) -> usize {
        self.flag.capacity() + self.list.capacity() * 8
    }
}

/// The store table behind a keyed state, and what it needs per group.
pub(crate) struct Backing {
    pub table: StoreTable,
    /// Group keys to the store's keys (byte-comparable rows).
    keys: Arc<dyn KeyEncoder>,
    /// The store may hold groups that are not in memory (some were
    /// evicted, or the state was restored from the store).
    pub cold: bool,
    /// Groups changed since they were last written to the store.
    pub changed: Dirty,
    /// Per group, the update it was last folded into (eviction order).
    last_used: Vec<u32>,
    clock: u32,
}

impl Backing {
    /// Table `name` of `store`, rows `schema`, for groups keyed by `key_fields`.
    pub fn new(
        store: SharedStore,
        name: &str,
        schema: SchemaRef,
        key_fields: &[FieldRef],
    ) -> Result<Self> {
        let converter = RowConverter::new(
            key_fields
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        Ok(Self {
            table: StoreTable::new(store, name, schema)?,
            keys: Arc::new(RowKeys(converter)),
            cold: false,
            changed: Dirty::default(),
            last_used: Vec::new(),
            clock: 0,
        })
    }

    /// The store's keys of `n` groups with key columns `keys`: their
    /// byte-comparable rows (an empty key for a global aggregate's group).
    pub fn store_keys(&self, keys: &[ArrayRef], n: usize) -> Result<BinaryArray> {
        Ok(self.keys.encode(keys, n)?)
    }

    /// The stored rows of the groups with key columns `keys` (`n` groups).
    pub fn lookup(&mut self, keys: &[ArrayRef], n: usize) -> Result<Lookup> {
        let table = self.table.id()?;
        let probes = self.store_keys(keys, n)?;
        let probes: Vec<&[u8]> = probes.iter().map(|k| k.unwrap_or_default()).collect();
        self.table.store.with(|s| Ok(s.get(table, &probes)?))
    }

    /// Writes `rows` (of [`Self::schema`], keys first: `k` key columns) to
    /// the store; returns the bytes written. The store encodes and sorts
    /// the keys off this thread.
    pub fn write(&mut self, rows: &RecordBatch, k: usize) -> Result<u64> {
        self.table
            .write_columns(&rows.columns()[..k], &self.keys, rows, None)
    }

    /// Deletes the groups of `rows` (as [`Self::write`] takes them) from the store.
    pub fn delete(&mut self, rows: &RecordBatch, k: usize) -> Result<u64> {
        let deleted = vec![true; rows.num_rows()];
        self.table
            .write_columns(&rows.columns()[..k], &self.keys, rows, Some(deleted))
    }

    /// Sizes the per-group vectors for `total` groups.
    pub fn grow(&mut self, total: usize) {
        self.changed.flag.resize(total, false);
        self.last_used.resize(total, 0);
    }

    /// `groups` were folded into now: changed, and most recently used.
    pub fn touch(&mut self, groups: &[usize]) {
        self.changed.mark(groups);
        self.clock = self.clock.wrapping_add(1).max(1);
        for &g in groups {
            self.last_used[g] = self.clock;
        }
    }

    /// Keeps the `keep` most recently used groups in memory, moves the others.
    pub fn eviction(&self, keep: usize) -> Eviction {
        let n = self.last_used.len();
        let mut uses = self.last_used.clone();
        let cut = n - keep.min(n - 1) - 1;
        let threshold = *uses.select_nth_unstable(cut).1;
        let mut e = Eviction {
            survivors: Vec::with_capacity(keep),
            victims: 0,
            written: Vec::new(),
        };
        for (g, &used) in self.last_used.iter().enumerate() {
            if used > threshold {
                e.survivors.push(g);
            } else {
                e.victims += 1;
                if self.changed.flag[g] {
                    e.written.push(g);
                }
            }
        }
        e
    }

    /// Keeps only `survivors` (ascending), renumbered from 0 in that order;
    /// the others are in the store now.
    pub fn keep(&mut self, survivors: &[usize]) {
        self.changed.keep(survivors);
        self.last_used = survivors.iter().map(|&g| self.last_used[g]).collect();
        self.cold = true;
    }

    /// The store was restored: groups not in memory may be in it.
    pub fn restored(&mut self) -> Result<()> {
        self.table.id()?;
        self.cold = self.table.has_rows();
        Ok(())
    }

    /// Whether the store may hold a group that is not in memory.
    pub fn may_hold(&self) -> bool {
        self.cold || self.table.has_rows()
    }

    /// Drops the table and its rows from the store (the state is gone).
    pub fn drop_table(&mut self) -> Result<()> {
        self.table.drop()?;
        self.cold = false;
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.changed.size() + self.last_used.capacity() * 4
    }
}
