//! [`StoredVersions`]: the state store behind a temporal join's versioned
//! table, whose state grows with every key the table ever had (Nexmark
//! q20 keeps one version per auction forever).
//!
//! The versions stay in memory in the join's own layout while they are
//! used (a probe costs what it costs without a store). Under the memory
//! budget the least recently used keys' versions are written to the table
//! `<path>versions`, one row per join key, and dropped from memory; a key
//! is read back, before its next version is taken in or a stream row
//! probing it fires. A checkpoint writes the keys whose versions changed
//! since they were last written, so its cost follows the change, not the
//! table. A key read back holds the same versions, in the same order, as
//! the ones written, so the output does not depend on the budget.
//!
//! An interval join's sides use the same layout for the rows the budget
//! moves out ([`StoredVersions::bookkept`]): each row also carries its
//! expiry, sequence number and match, and each key's stored row its
//! latest expiry, by which the store drops it once the watermark passes.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, Int64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::join::NULL_KEY;
use super::join_rows::HeldRows;
use crate::error::{EngineError, Result};
use crate::state::SharedStore;
use crate::state::backing::{Backing, Dirty, key_column_fields};

/// Bytes before each encoded version: its time and effective time (i64),
/// its presence (u8) and its row's length (u32), little-endian.
const VERSION_HEADER: usize = 21;

/// Bytes a bookkept row adds after [`VERSION_HEADER`]: its expiry (i64),
/// sequence number (u64) and whether it matched (u8).
const BOOKKEEPING: usize = 17;

/// What an interval join keeps per row besides its columns, time and
/// presence (see [`super::join_rows::SideRows`]).
#[derive(Default)]
pub(super) struct Bookkeeping {
    pub expires: Vec<i64>,
    pub seq: Vec<u64>,
    pub matched: Vec<bool>,
}

/// Versions read back from the store, and per row the probe (key) it
/// belongs to.
pub(super) struct Loaded {
    pub held: HeldRows,
    pub probe: Vec<usize>,
    /// Per row, with [`StoredVersions::bookkept`] (else empty).
    pub kept: Bookkeeping,
}

pub(super) struct StoredVersions {
    backing: Backing,
    /// Encodes a version's columns (the table side's schema).
    converter: RowConverter,
    schema: SchemaRef,
    durable: bool,
    /// Rows carry [`Bookkeeping`], and the table a column of each key's
    /// latest expiry.
    bookkept: bool,
    /// Per join key id: memory holds all of the key's versions (it was read
    /// back, or the store held none when it was first seen).
    loaded: Vec<bool>,
    /// Per key id, the batch it was last used in (eviction order).
    last_used: Vec<u32>,
    clock: u32,
}

impl StoredVersions {
    /// Table `name` of `store` behind versions of `schema`, keyed by
    /// `key_fields`; `None` if a column cannot be encoded as a row (such a
    /// table stays in memory). With `bookkept`, an interval join side's
    /// rows, each with its [`Bookkeeping`].
    pub fn new(
        store: &SharedStore,
        name: &str,
        schema: SchemaRef,
        key_fields: &[FieldRef],
        bookkept: bool,
    ) -> Result<Option<Self>> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        let Ok(converter) = RowConverter::new(fields) else {
            return Ok(None);
        };
        let mut stored = key_column_fields(key_fields);
        stored.push(Arc::new(Field::new("versions", DataType::Binary, false)));
        if bookkept {
            stored.push(Arc::new(Field::new("expires", DataType::Int64, false)));
        }
        let backing = Backing::new(
            store.clone(),
            name,
            Arc::new(Schema::new(stored)),
            key_fields,
        )?;
        Ok(Some(Self {
            backing,
            converter,
            schema,
            durable: store.is_durable(),
            bookkept,
            loaded: Vec::new(),
            last_used: Vec::new(),
            clock: 0,
        }))
    }

    pub fn durable(&self) -> bool {
        self.durable
    }

    /// Whether the store may hold versions of keys not in memory.
    pub fn cold(&self) -> bool {
        self.backing.cold
    }

    /// Sizes the per-key vectors for `keys` interned keys: a new key is in
    /// memory whole unless the store may hold it.
    pub fn grow(&mut self, keys: usize) {
        if keys > self.loaded.len() {
            let cold = self.backing.cold;
            self.loaded.resize(keys, !cold);
            self.last_used.resize(keys, 0);
            self.backing.changed.flag.resize(keys, false);
        }
    }

    /// `keys` were used by this batch (most recently used now).
    pub fn touch(&mut self, keys: &[u32]) {
        self.clock = self.clock.wrapping_add(1).max(1);
        for &k in keys.iter().filter(|&&k| k != NULL_KEY) {
            self.last_used[k as usize] = self.clock;
        }
    }

    /// `keys`' versions changed: written at the next checkpoint.
    pub fn changed(&mut self, keys: impl IntoIterator<Item = u32>) {
        let keys: Vec<usize> = keys
            .into_iter()
            .filter(|&k| k != NULL_KEY)
            .map(|k| k as usize)
            .collect();
        self.backing.changed.mark(&keys);
    }

    /// The distinct keys of `keys` whose versions may be in the store only.
    pub fn unloaded(&self, keys: impl IntoIterator<Item = u32>) -> Vec<u32> {
        if !self.backing.cold {
            return Vec::new();
        }
        let mut out: Vec<u32> = keys
            .into_iter()
            .filter(|&k| k != NULL_KEY && !self.loaded[k as usize])
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Reads the stored versions of keys `ids`, whose key columns are
    /// `keys`; from now on memory holds them whole.
    pub fn load(&mut self, ids: &[u32], keys: &[ArrayRef]) -> Result<Loaded> {
        let found = self.backing.lookup(keys, ids.len())?;
        for &k in ids {
            self.loaded[k as usize] = true;
        }
        let loaded = self.decode(&found.found, &found.values, keys.len())?;
        if self.bookkept && found.values.num_rows() > 0 {
            // Memory holds the rows now, and moves them on: the table keeps
            // exactly the keys not in memory, so a scan of it needs no
            // second look at memory.
            self.backing.delete(&found.values, keys.len())?;
        }
        Ok(loaded)
    }

    /// The versions in stored rows `values` (after `k` key columns); row
    /// `j` belongs to probe `probes[j]`.
    fn decode(&self, probes: &[usize], values: &RecordBatch, k: usize) -> Result<Loaded> {
        let blobs = values.column(k).as_binary::<i32>();
        let mut loaded = Loaded {
            held: HeldRows::empty(Arc::clone(&self.schema)),
            probe: Vec::new(),
            kept: Bookkeeping::default(),
        };
        let header = VERSION_HEADER + if self.bookkept { BOOKKEEPING } else { 0 };
        let mut rows: Vec<&[u8]> = Vec::new();
        for (j, &probe) in probes.iter().enumerate() {
            let mut bytes = blobs.value(j);
            while !bytes.is_empty() {
                if bytes.len() < header {
                    return Err(damaged());
                }
                let int = |at: usize| i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                let len = u32::from_le_bytes(bytes[17..21].try_into().unwrap()) as usize;
                let rest = &bytes[header..];
                if rest.len() < len {
                    return Err(damaged());
                }
                loaded.held.times.push(int(0));
                loaded.held.effective.push(int(8));
                loaded.held.present.push(bytes[16] != 0);
                if self.bookkept {
                    let kept = &mut loaded.kept;
                    kept.expires.push(int(VERSION_HEADER));
                    kept.seq.push(int(VERSION_HEADER + 8) as u64);
                    kept.matched.push(bytes[VERSION_HEADER + 16] != 0);
                }
                loaded.probe.push(probe);
                rows.push(&rest[..len]);
                bytes = &rest[len..];
            }
        }
        if rows.is_empty() {
            return Ok(loaded);
        }
        let parser = self.converter.parser();
        let columns = self
            .converter
            .convert_rows(rows.iter().map(|r| parser.parse(r)))?;
        // A dictionary column comes back as its values: give it its type.
        let columns = columns
            .into_iter()
            .zip(self.schema.fields())
            .map(|(c, f)| match c.data_type() == f.data_type() {
                true => Ok(c),
                false => Ok(cast(&c, f.data_type())?),
            })
            .collect::<Result<Vec<_>>>()?;
        loaded.held.rows = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        Ok(loaded)
    }

    /// Writes the versions of keys with key columns `keys`: `held` holds
    /// them key after key, `counts[i]` rows for key `i`, in arrival order,
    /// with their `kept` bookkeeping if the table is bookkept. Returns the
    /// bytes written.
    pub fn write(
        &mut self,
        keys: Vec<ArrayRef>,
        counts: &[usize],
        held: &HeldRows,
        kept: &Bookkeeping,
    ) -> Result<u64> {
        if counts.is_empty() {
            return Ok(0);
        }
        let (times, effective, present) = (&held.times, &held.effective, &held.present);
        let encoded = self.converter.convert_columns(held.rows.columns())?;
        let mut blobs = BinaryBuilder::new();
        let mut latest = Vec::with_capacity(counts.len());
        let mut blob = Vec::new();
        let mut at = 0;
        for &count in counts {
            blob.clear();
            let mut expires = i64::MIN;
            for i in at..at + count {
                let row = encoded.row(i);
                blob.extend_from_slice(&times[i].to_le_bytes());
                blob.extend_from_slice(&effective[i].to_le_bytes());
                blob.push(present[i] as u8);
                blob.extend_from_slice(&(row.as_ref().len() as u32).to_le_bytes());
                if self.bookkept {
                    blob.extend_from_slice(&kept.expires[i].to_le_bytes());
                    blob.extend_from_slice(&kept.seq[i].to_le_bytes());
                    blob.push(kept.matched[i] as u8);
                    expires = expires.max(kept.expires[i]);
                }
                blob.extend_from_slice(row.as_ref());
            }
            blobs.append_value(&blob);
            latest.push(expires);
            at += count;
        }
        let k = keys.len();
        let mut columns = keys;
        columns.push(Arc::new(blobs.finish()));
        if self.bookkept {
            columns.push(Arc::new(Int64Array::from(latest)));
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.backing.table.schema), columns)?;
        self.backing.write(&batch, k)
    }

    /// The keys changed since they were last written (clears the set).
    pub fn take_changed(&mut self) -> Vec<u32> {
        let mut keys: Vec<u32> = self
            .backing
            .changed
            .take()
            .into_iter()
            .map(|k| k as u32)
            .collect();
        keys.sort_unstable();
        keys
    }

    pub fn is_changed(&self, k: u32) -> bool {
        self.backing
            .changed
            .flag
            .get(k as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Of the keys `candidates` (holding versions in memory), those to move
    /// out so that about `keep` stay: the least recently used.
    pub fn victims(&self, candidates: &[u32], keep: usize) -> Vec<u32> {
        let n = candidates.len();
        if n == 0 || keep >= n {
            return Vec::new();
        }
        let mut uses: Vec<u32> = candidates
            .iter()
            .map(|&k| self.last_used[k as usize])
            .collect();
        let threshold = *uses.select_nth_unstable(n - keep - 1).1;
        candidates
            .iter()
            .copied()
            .filter(|&k| self.last_used[k as usize] <= threshold)
            .collect()
    }

    /// `keys` left memory for the store: read back when used again.
    pub fn evicted(&mut self, keys: &[u32]) {
        for &k in keys {
            self.loaded[k as usize] = false;
            self.backing.changed.flag[k as usize] = false;
        }
        self.backing
            .changed
            .list
            .retain(|&k| self.backing.changed.flag[k]);
        self.backing.cold = true;
    }

    /// The join's keys were renumbered: `renumber[old]` is the new id (or
    /// [`NULL_KEY`] for a key forgotten), `kept` keys in all.
    pub fn renumber(&mut self, renumber: &[u32], kept: usize) {
        let mut loaded = vec![!self.backing.cold; kept];
        let mut last_used = vec![0; kept];
        let mut changed = Dirty::default();
        changed.flag.resize(kept, false);
        for (old, &new) in renumber.iter().enumerate() {
            if new == NULL_KEY || old >= self.loaded.len() {
                continue;
            }
            loaded[new as usize] = self.loaded[old];
            last_used[new as usize] = self.last_used[old];
        }
        let moved: Vec<usize> = self
            .backing
            .changed
            .list
            .iter()
            .filter_map(|&old| Some(renumber[old]).filter(|&n| n != NULL_KEY))
            .map(|n| n as usize)
            .collect();
        changed.mark(&moved);
        self.loaded = loaded;
        self.last_used = last_used;
        self.backing.changed = changed;
    }

    /// Every stored key's versions, batch by batch: the whole table, for a
    /// checkpoint that cannot refer to the store's files (write the changed
    /// keys first).
    pub fn scan(&mut self, mut each: impl FnMut(Loaded) -> Result<()>) -> Result<()> {
        let mut stored = Vec::new();
        self.backing.table.scan(|rows| {
            stored.push(rows);
            Ok(())
        })?;
        let k = self.backing.table.schema.fields().len() - 1 - self.bookkept as usize;
        for rows in stored {
            let probes: Vec<usize> = (0..rows.num_rows()).collect();
            each(self.decode(&probes, &rows, k)?)?;
        }
        Ok(())
    }

    /// Rows expiring before `watermark` are gone (a bookkept table's key
    /// goes once all of its rows have).
    pub fn expired(&mut self, watermark: i64) -> Result<()> {
        if !self.bookkept || !self.backing.cold {
            return Ok(());
        }
        let table = self.backing.table.id()?;
        let column = self.backing.table.schema.fields().len() - 1;
        self.backing
            .table
            .store
            .with(|s| Ok(s.set_expiry(table, column, watermark.saturating_sub(1))?))
    }

    /// Forgets every stored key (a restore reads an interval join's rows
    /// from its log instead): memory holds every key whole.
    pub fn clear(&mut self) -> Result<()> {
        self.backing.drop_table()?;
        self.loaded.iter_mut().for_each(|l| *l = true);
        Ok(())
    }

    /// The store was restored: keys not in memory may be in it.
    pub fn restored(&mut self) -> Result<()> {
        self.backing.restored()?;
        let cold = self.backing.cold;
        self.loaded.iter_mut().for_each(|l| *l = !cold);
        Ok(())
    }

    pub fn size(&self) -> usize {
        self.loaded.capacity() + self.last_used.capacity() * 4 + self.backing.size()
    }
}

fn damaged() -> EngineError {
    EngineError::Checkpoint("temporal join state: a stored version is damaged".into())
}
