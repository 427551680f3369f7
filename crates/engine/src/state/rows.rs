//! [`KeyedRows`]: one row per key, both in Arrow's row format (a changelog
//! source's current rows by primary key), with an optional table of the
//! query's state store behind it.
//!
//! Without a store every row stays in memory. With one:
//! - [`KeyedRows::evict`] moves the least recently used rows out of memory
//!   (writing those changed since they were last written), and
//!   [`KeyedRows::load`] looks keys not in memory up in the store before a
//!   batch touches them;
//! - a deleted key the store may hold stays in memory as a tombstone until
//!   it is written, so a lookup never finds its old row;
//! - [`KeyedRows::persist`] writes what changed since the last checkpoint.

use std::cell::Cell;
use std::sync::Arc;

use hashbrown::HashMap;

use arrow::array::{BinaryArray, RecordBatch, RecordBatchOptions, new_null_array};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::keyed::Evicted;
use super::store::SharedStore;
use super::table::StoreTable;
use crate::error::Result;
use crate::inline_bytes::InlineBytes;

/// Bytes a key costs besides its key and row (hash table slot, boxes).
const OVERHEAD: usize = 64;

/// A row, inline up to 46 bytes: an upsert compares the new row with the
/// old one, and an old row read from the slot the lookup brought into
/// cache is not a second cache miss (7.5% of a changelog aggregation's
/// time when rows were boxed). A table entry, key and slot, is 80 bytes.
type Row = InlineBytes<46>;

struct Slot {
    /// The key's row; `None`: deleted, and the store not told yet.
    row: Option<Row>,
    /// Changed since last written to the store (a cell: a checkpoint
    /// clears it through the references it wrote the rows from).
    changed: Cell<bool>,
    /// The batch that last touched it (eviction order).
    used: u32,
}

/// What [`KeyedRows::upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// The key held this row already.
    Unchanged,
    /// The key's old row was replaced (and appended to `old`).
    Replaced,
    /// The key had no row.
    Inserted,
}

struct Backing {
    /// Rows of the row schema, every column nullable (a tombstone's row is nulls).
    table: StoreTable,
    /// The store may hold keys not in memory.
    cold: bool,
}

impl Backing {
    /// Whether the store may hold a row of some key.
    fn may_hold(&self) -> bool {
        self.cold || self.table.has_rows()
    }
}

pub struct KeyedRows {
    schema: SchemaRef,
    rows: RowConverter,
    /// Keys are held inline up to 16 bytes (any one-column integer key in
    /// Arrow's row format): a lookup then reads no box besides the row's.
    current: HashMap<InlineBytes, Slot>,
    /// Keys with a row (not tombstones).
    live: usize,
    bytes: usize,
    clock: u32,
    backing: Option<Backing>,
}

impl KeyedRows {
    /// Rows of `schema`.
    pub fn new(schema: SchemaRef) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            rows: RowConverter::new(fields)?,
            schema,
            current: HashMap::new(),
            live: 0,
            bytes: 0,
            clock: 0,
            backing: None,
        })
    }

    /// Puts table `name` of `store` behind these (empty) rows.
    pub fn with_store(mut self, store: SharedStore, name: &str) -> Result<Self> {
        let fields: Vec<_> = self
            .schema
            .fields()
            .iter()
            .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
            .collect();
        self.backing = Some(Backing {
            table: StoreTable::new(store, name, Arc::new(Schema::new(fields)))?,
            cold: false,
        });
        Ok(self)
    }

    /// Whether a durable store keeps the rows (checkpoints persist into it).
    pub fn durable(&self) -> bool {
        self.backing
            .as_ref()
            .is_some_and(|b| b.table.store.is_durable())
    }

    /// Starts a batch of changes: what it touches is used now.
    pub fn tick(&mut self) {
        self.clock = self.clock.wrapping_add(1).max(1);
    }

    /// Brings the stored rows of `keys` not in memory into memory.
    pub fn load<'a>(&mut self, keys: impl Iterator<Item = &'a [u8]>) -> Result<()> {
        let Some(b) = self.backing.as_mut().filter(|b| b.cold) else {
            return Ok(());
        };
        let mut missing: Vec<&[u8]> = keys.filter(|k| !self.current.contains_key(*k)).collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let table = b.table.id()?;
        let found = b.table.store.with(|s| Ok(s.get(table, &missing)?))?;
        if found.found.is_empty() {
            return Ok(());
        }
        let rows = self.rows.convert_columns(found.values.columns())?;
        for (j, &i) in found.found.iter().enumerate() {
            let row = Row::new(rows.row(j).as_ref());
            self.bytes += missing[i].len() + row.len() + OVERHEAD;
            self.live += 1;
            let slot = Slot {
                row: Some(row),
                changed: Cell::new(false),
                used: self.clock,
            };
            self.current.insert(missing[i].into(), slot);
        }
        Ok(())
    }

    /// Reads the slots of `keys`, so that the changes to them that follow
    /// find them in cache. With many keys each lookup misses the cache:
    /// lookups in a loop that does nothing else wait on their misses
    /// together, where changes, one after another, would wait in turn.
    pub fn warm<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) {
        let mut used = 0u32;
        for key in keys {
            if let Some(slot) = self.current.get(key) {
                used ^= slot.used;
            }
        }
        std::hint::black_box(used);
    }

    /// Makes `new` the row of `key`; a row it replaces is appended to `old`.
    pub fn upsert(&mut self, key: &[u8], new: &[u8], old: &mut Vec<u8>) -> Upsert {
        let clock = self.clock;
        match self.current.get_mut(key) {
            Some(slot) => {
                slot.used = clock;
                match &mut slot.row {
                    Some(row) if row.as_slice() == new => Upsert::Unchanged,
                    Some(row) => {
                        old.extend_from_slice(row);
                        self.bytes = (self.bytes + new.len()).saturating_sub(row.len());
                        row.set(new);
                        slot.changed.set(true);
                        Upsert::Replaced
                    }
                    None => {
                        self.bytes += new.len();
                        slot.row = Some(Row::new(new));
                        slot.changed.set(true);
                        self.live += 1;
                        Upsert::Inserted
                    }
                }
            }
            None => {
                self.bytes += key.len() + new.len() + OVERHEAD;
                self.live += 1;
                let slot = Slot {
                    row: Some(Row::new(new)),
                    changed: Cell::new(true),
                    used: clock,
                };
                self.current.insert(key.into(), slot);
                Upsert::Inserted
            }
        }
    }

    /// Removes `key`'s row, appending it to `old`; whether it had one.
    pub fn delete(&mut self, key: &[u8], old: &mut Vec<u8>) -> bool {
        let tombstone = self.backing.as_ref().is_some_and(Backing::may_hold);
        let Some(slot) = self.current.get_mut(key) else {
            return false;
        };
        let Some(row) = slot.row.take() else {
            return false;
        };
        old.extend_from_slice(&row);
        self.live -= 1;
        self.bytes = self.bytes.saturating_sub(row.len());
        match tombstone {
            true => {
                slot.changed.set(true);
                slot.used = self.clock;
            }
            false => {
                self.bytes = self.bytes.saturating_sub(key.len() + OVERHEAD);
                self.current.remove(key);
            }
        }
        true
    }

    /// Writes the keys changed since they were last written to the store
    /// (a checkpoint's part of these rows); returns the bytes written.
    /// One pass over the table finds them, and their marks are cleared
    /// through the references found: with many keys a lookup per changed
    /// key would miss the cache each time. Only written tombstones, which
    /// leave memory, are looked up again.
    pub fn persist(&mut self) -> Result<u64> {
        let Some(backing) = self.backing.as_mut() else {
            return Ok(0);
        };
        let mut changed = Entries::default();
        for (key, slot) in self.current.iter().filter(|(_, s)| s.changed.get()) {
            changed.push(key, slot);
        }
        let bytes = changed.write(backing, &self.rows)?;
        changed
            .slots
            .iter()
            .for_each(|slot| slot.changed.set(false));
        let tombstones: Vec<InlineBytes> = changed.gone.iter().map(|&k| k.into()).collect();
        for key in &tombstones {
            self.current.remove(key.as_ref());
            self.bytes = self.bytes.saturating_sub(key.len() + OVERHEAD);
        }
        Ok(bytes)
    }

    /// Moves the least recently used keys to the store until about
    /// `target` bytes are held, writing those changed since last written.
    pub fn evict(&mut self, target: usize) -> Result<Evicted> {
        let n = self.current.len();
        let Some(backing) = self.backing.as_mut() else {
            return Ok(Evicted::default());
        };
        if n == 0 || self.bytes <= target {
            return Ok(Evicted::default());
        }
        let keep = ((n as f64) * (target as f64 / self.bytes as f64)) as usize;
        let mut uses: Vec<u32> = self.current.values().map(|s| s.used).collect();
        let cut = n - keep.min(n - 1) - 1;
        let threshold = *uses.select_nth_unstable(cut).1;
        let mut written = Entries::default();
        for (key, slot) in self.current.iter().filter(|(_, s)| s.used <= threshold) {
            if slot.changed.get() {
                written.push(key, slot);
            }
        }
        let (written, bytes_written) = (written.len(), written.write(backing, &self.rows)?);
        let (mut groups, mut freed, mut live) = (0, 0, 0);
        self.current.retain(|key, slot| {
            if slot.used > threshold {
                return true;
            }
            groups += 1;
            live += usize::from(slot.row.is_some());
            freed += key.len() + slot.row.as_ref().map_or(0, |r| r.len()) + OVERHEAD;
            false
        });
        self.live -= live;
        self.bytes = self.bytes.saturating_sub(freed);
        self.current.shrink_to_fit();
        backing.cold = true;
        Ok(Evicted {
            groups,
            written,
            bytes_written,
        })
    }

    /// Every row (for a checkpoint that cannot refer to the store's
    /// files), in key order so its bytes do not depend on the hash table's
    /// or on what was in memory.
    pub fn snapshot(&mut self) -> Result<RecordBatch> {
        if self.backing.as_ref().is_some_and(|b| b.cold) {
            self.persist()?;
            let b = self.backing.as_mut().expect("cold rows have a store");
            let mut parts = Vec::new();
            b.table.scan(|rows| {
                parts.push(rows);
                Ok(())
            })?;
            let all = arrow::compute::concat_batches(&b.table.schema, &parts)?;
            return Ok(RecordBatch::try_new(
                Arc::clone(&self.schema),
                all.columns().to_vec(),
            )?);
        }
        let mut entries: Vec<(&[u8], &[u8])> = self
            .current
            .iter()
            .filter_map(|(k, s)| Some((k.as_ref(), s.row.as_deref()?)))
            .collect();
        entries.sort_unstable();
        let parser = self.rows.parser();
        let columns = self
            .rows
            .convert_rows(entries.iter().map(|(_, r)| parser.parse(r)))?;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// The store behind these rows was restored: keys not in memory may be in it.
    pub fn store_restored(&mut self) -> Result<()> {
        if let Some(b) = self.backing.as_mut() {
            b.table.id()?;
            b.cold = b.table.has_rows();
        }
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.bytes
    }

    /// Keys with a row in memory.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

/// Keys to write to the store, with their rows (a tombstone: none).
#[derive(Default)]
struct Entries<'a> {
    /// The slots of the keys, live and gone.
    slots: Vec<&'a Slot>,
    live: Vec<&'a [u8]>,
    rows: Vec<&'a [u8]>,
    gone: Vec<&'a [u8]>,
}

impl<'a> Entries<'a> {
    fn push(&mut self, key: &'a InlineBytes, slot: &'a Slot) {
        self.slots.push(slot);
        match &slot.row {
            Some(row) => {
                self.live.push(key);
                self.rows.push(row);
            }
            None => self.gone.push(key),
        }
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Writes the rows and tombstones to `backing`'s table; returns the
    /// bytes written.
    fn write(&self, backing: &mut Backing, converter: &RowConverter) -> Result<u64> {
        let table = &mut backing.table;
        let mut bytes = 0;
        if !self.live.is_empty() {
            let parser = converter.parser();
            let columns = converter.convert_rows(self.rows.iter().map(|r| parser.parse(r)))?;
            let values = RecordBatch::try_new(Arc::clone(&table.schema), columns)?;
            let keys = BinaryArray::from_iter_values(&self.live);
            bytes += table.write(&keys, &values, None)?;
        }
        if !self.gone.is_empty() {
            let n = self.gone.len();
            let columns = table
                .schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), n))
                .collect();
            let values = RecordBatch::try_new_with_options(
                Arc::clone(&table.schema),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(n)),
            )?;
            let keys = BinaryArray::from_iter_values(&self.gone);
            bytes += table.write(&keys, &values, Some(&vec![true; n]))?;
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};
    use arrow::row::Rows;

    fn id_and_name() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    /// Rows of `schema` with a temporary store in `dir` behind them.
    fn stored(schema: &SchemaRef, dir: &tempfile::TempDir) -> KeyedRows {
        let store = SharedStore::temporary(Some(dir.path().to_path_buf()), Default::default());
        KeyedRows::new(Arc::clone(schema))
            .unwrap()
            .with_store(store, "t")
            .unwrap()
    }

    fn rows(schema: &SchemaRef, ids: &[i64], names: &[&str]) -> Rows {
        let batch = RecordBatch::try_new(
            Arc::clone(schema),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
            ],
        )
        .unwrap();
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        RowConverter::new(fields)
            .unwrap()
            .convert_columns(batch.columns())
            .unwrap()
    }

    /// Rows evicted to the store come back when touched, and a key deleted
    /// while its row is in the store is found deleted, before and after
    /// the tombstone is written; the snapshot is the same whatever left memory.
    #[test]
    fn evicted_rows_come_back_and_deletions_hide_stored_rows() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_and_name();
        let mut spilled = stored(&schema, &dir);
        let mut memory = KeyedRows::new(Arc::clone(&schema)).unwrap();
        let first = rows(&schema, &[1, 2, 3], &["a", "b", "c"]);
        for table in [&mut spilled, &mut memory] {
            table.tick();
            for i in 0..3 {
                let key = first.row(i);
                table.upsert(key.data(), key.data(), &mut Vec::new());
            }
        }
        let evicted = spilled.evict(0).unwrap();
        assert_eq!((evicted.groups, evicted.written), (3, 3));
        assert_eq!(spilled.size(), 0);

        // Key 2 is deleted while only the store has it; key 3 updated.
        let changes = rows(&schema, &[2, 3], &["b", "z"]);
        let keys: Vec<&[u8]> = (0..2).map(|i| first.row(i + 1).data()).collect();
        for table in [&mut spilled, &mut memory] {
            table.tick();
            table.load(keys.iter().copied()).unwrap();
            let mut old = Vec::new();
            assert!(table.delete(keys[0], &mut old));
            assert_eq!(old, first.row(1).data());
            old.clear();
            let update = table.upsert(keys[1], changes.row(1).data(), &mut old);
            assert_eq!(update, Upsert::Replaced);
            assert_eq!(old, first.row(2).data());
        }
        assert_eq!(spilled.len(), 1, "key 3 in memory, key 2 a tombstone");
        assert_eq!(spilled.snapshot().unwrap(), memory.snapshot().unwrap());
        // Written out, the tombstone still hides key 2's stored row.
        spilled.evict(0).unwrap();
        spilled.tick();
        spilled.load(keys.iter().copied()).unwrap();
        assert!(!spilled.delete(keys[0], &mut Vec::new()));
        assert_eq!(spilled.len(), 1);
        assert_eq!(spilled.snapshot().unwrap(), memory.snapshot().unwrap());
    }

    /// A checkpoint writes only the keys changed since the last one, and
    /// a deletion's tombstone leaves memory once written.
    #[test]
    fn persist_writes_what_changed_and_forgets_written_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let schema = id_and_name();
        let mut table = stored(&schema, &dir);
        let first = rows(&schema, &[1, 2, 3], &["a", "b", "c"]);
        table.tick();
        for i in 0..3 {
            let key = first.row(i);
            table.upsert(key.data(), key.data(), &mut Vec::new());
        }
        assert!(table.persist().unwrap() > 0);
        assert_eq!(table.persist().unwrap(), 0, "nothing changed since");

        let update = rows(&schema, &[2], &["z"]);
        table.tick();
        table.upsert(first.row(1).data(), update.row(0).data(), &mut Vec::new());
        assert!(table.delete(first.row(2).data(), &mut Vec::new()));
        assert_eq!(
            (table.len(), table.current.len()),
            (2, 3),
            "key 3 a tombstone"
        );
        assert!(table.persist().unwrap() > 0);
        assert_eq!(table.current.len(), 2, "the written tombstone is forgotten");
        assert_eq!(table.persist().unwrap(), 0);
        let mut memory = KeyedRows::new(Arc::clone(&schema)).unwrap();
        memory.tick();
        memory.upsert(first.row(0).data(), first.row(0).data(), &mut Vec::new());
        memory.upsert(first.row(1).data(), update.row(0).data(), &mut Vec::new());
        assert_eq!(table.snapshot().unwrap(), memory.snapshot().unwrap());
    }
}
