//! [`StateStore`]: named tables of keyed rows, each a stack of immutable
//! runs on local disk (newest first), with a shared block cache.
//!
//! The store does not hold hot state: operators keep it in memory in their
//! own layouts and hand the store what they evict and, at a checkpoint,
//! what changed since the last one. Every [`StateStore::write`] is a new
//! run; [`StateStore::checkpoint`] makes the runs written so far durable
//! and names the current runs of every table in a [`StoreManifest`]. A
//! checkpoint therefore writes what changed, and refers to the unchanged
//! runs of earlier checkpoints. [`StateStore::retain`] deletes the files no
//! kept checkpoint and no current table refers to.
//!
//! Tables are declared by name before a restore, or as a family
//! ([`StateStore::table_family`]: every table named `prefix…`, e.g. one per
//! window) for operators that create their tables as they go.
//! [`StateStore::drop_table`] forgets a table whose state is gone; its files
//! leave with the checkpoints that name them.
//!
//! A write sorts its rows and serves them from memory at once; the
//! store's writer thread ([`crate::writer`]) writes and syncs the run's
//! files, and the store swaps in the opened files when they are done.
//! [`StateStore::checkpoint`] therefore does not wait on the disk: it names
//! the runs and hands back a [`Durability`] to wait on before the
//! checkpoint that names them is made current.
//!
//! Crash safety: a run is only named in a current checkpoint after its
//! files and the directory are synced ([`Durability::wait`]), and nothing
//! is ever written into a file a manifest names; files written after the
//! last checkpoint (a spill, a compaction) are unreferenced after a crash
//! and deleted later.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, SchemaRef};
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use tracing::debug;

use crate::bloom::hash;
use crate::cache::BlockCache;
use crate::compact::{self, Job};
use crate::error::{Result, StateError};
use crate::merge::{Expiry, Merge, Merged};
use crate::run::{Block, Run, file_names};
use crate::sorting::{KeyEncoder, Keys, Sorted, Unsorted};
use crate::writer::{Durability, JobRows, WriteJob, Writer};

/// The current runs of every table, newest first: what a checkpoint refers to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreManifest {
    pub tables: std::collections::BTreeMap<String, Vec<String>>,
}

impl StoreManifest {
    /// Every run named.
    pub fn runs(&self) -> impl Iterator<Item = &str> {
        self.tables.values().flatten().map(String::as_str)
    }

    /// Every file name (both files of every run).
    pub fn files(&self) -> Vec<String> {
        self.runs().flat_map(file_names).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.values().all(Vec::is_empty)
    }
}

/// A table of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableId(usize);

/// Rows found by [`StateStore::get`].
#[derive(Debug)]
pub struct Lookup {
    /// Indices of the probed keys that were found, ascending.
    pub found: Vec<usize>,
    /// Their values, row `i` for `found[i]`.
    pub values: RecordBatch,
}

/// Counters of a store's work, cumulative.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    /// Runs written by writes (spills and checkpoints), and their bytes.
    pub runs_written: u64,
    pub bytes_written: u64,
    /// Runs written by compaction, and their bytes.
    pub compactions: u64,
    pub compaction_bytes: u64,
    /// Keys probed by `get`, and blocks read from disk for them.
    pub keys_probed: u64,
    pub blocks_read: u64,
    pub files_deleted: u64,
}

struct Table {
    name: String,
    values: SchemaRef,
    /// Newest first.
    runs: Vec<Arc<Run>>,
    expiry: Option<Expiry>,
}

pub struct StateStore {
    dir: PathBuf,
    /// Held for the store's life: one pipeline per directory.
    _lock: File,
    /// A store of spilled state only, deleted with the store.
    _temporary: Option<tempfile::TempDir>,
    tables: Vec<Table>,
    by_name: HashMap<String, usize>,
    /// Slots of dropped tables, reused by the next new table.
    free: Vec<usize>,
    /// Name prefixes of tables created as they are needed, and their columns.
    families: Vec<(String, SchemaRef)>,
    cache: BlockCache,
    next_run_id: u64,
    /// Run names are this prefix, then a counter: unique per opening.
    prefix: String,
    next_seq: u64,
    /// Writes runs' files in the background; started by the first write.
    writer: Option<Writer>,
    job: Option<Job>,
    compaction: bool,
    stats: StoreStats,
}

/// Options of a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Bytes of decoded blocks kept in memory.
    pub cache_bytes: usize,
    /// Merge runs in the background (off only in tests of the layout).
    pub compaction: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 64 << 20,
            compaction: true,
        }
    }
}

fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("r{:x}{:05x}", nanos, std::process::id() & 0xfffff)
}

/// The block a lookup is reading and the rows it found there.
#[derive(Default)]
struct BlockHits {
    /// (run id, block number) of `block`.
    at: Option<(u64, usize)>,
    block: Option<Arc<Block>>,
    /// (probe, row in the block).
    rows: Vec<(usize, u32)>,
}

impl BlockHits {
    /// Copies the rows found into a part of their own, noting where each
    /// probe's row is: (part, row in the part).
    fn copy_out(
        &mut self,
        parts: &mut Vec<RecordBatch>,
        hits: &mut Vec<(usize, (usize, usize))>,
    ) -> Result<()> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = arrow::array::UInt32Array::from_iter_values(self.rows.iter().map(|r| r.1));
        parts.push(arrow::compute::take_record_batch(&block.values, &rows)?);
        let part = parts.len() - 1;
        hits.extend(
            self.rows
                .drain(..)
                .enumerate()
                .map(|(i, (probe, _))| (probe, (part, i))),
        );
        Ok(())
    }
}

impl StateStore {
    /// Opens (creating) the store in `dir`, claiming it for this process.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(StateError::io("create", dir))?;
        let lock_path = dir.join("LOCK");
        let lock = File::create(&lock_path).map_err(StateError::io("create", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StateError::Locked(dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StateError::io("lock", &lock_path)(e));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            _temporary: None,
            tables: Vec::new(),
            by_name: HashMap::new(),
            free: Vec::new(),
            families: Vec::new(),
            cache: BlockCache::new(options.cache_bytes),
            next_run_id: 0,
            prefix: unique_prefix(),
            next_seq: 0,
            writer: None,
            job: None,
            compaction: options.compaction,
            stats: StoreStats::default(),
        })
    }

    /// A store for spilled state only, in a new directory under `parent`
    /// (the system's temporary directory if `None`), deleted with the store.
    pub fn temporary(parent: Option<&Path>, options: StoreOptions) -> Result<Self> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        std::fs::create_dir_all(&parent).map_err(StateError::io("create", &parent))?;
        let temp = tempfile::Builder::new()
            .prefix("ubik-state-")
            .tempdir_in(&parent)
            .map_err(StateError::io("create a directory in", &parent))?;
        let mut store = Self::open(temp.path(), options)?;
        store._temporary = Some(temp);
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The table `name` with value columns `values` (created empty if new).
    pub fn table(&mut self, name: &str, values: SchemaRef) -> Result<TableId> {
        if let Some(&i) = self.by_name.get(name) {
            if self.tables[i].values.fields() != values.fields() {
                return Err(StateError::Missing(format!(
                    "table {name:?} is declared twice with different columns"
                )));
            }
            return Ok(TableId(i));
        }
        if let Some(f) = values
            .fields()
            .iter()
            .find(|f| has_dictionary(f.data_type()))
        {
            return Err(StateError::Missing(format!(
                "table {name:?}: column {} is dictionary-encoded; state columns hold plain values",
                f.name()
            )));
        }
        let table = Table {
            name: name.to_string(),
            values,
            runs: Vec::new(),
            expiry: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.tables[i] = table;
                i
            }
            None => {
                self.tables.push(table);
                self.tables.len() - 1
            }
        };
        self.by_name.insert(name.to_string(), i);
        Ok(TableId(i))
    }

    /// Declares that every table named `prefix…` has value columns
    /// `values`: an operator that creates its tables as it goes (one per
    /// window) declares the family before a restore, so the checkpoint's
    /// tables of the family are restored, and claims each by name later.
    pub fn table_family(&mut self, prefix: &str, values: SchemaRef) -> Result<()> {
        match self.families.iter().find(|(p, _)| p == prefix) {
            Some((_, v)) if v.fields() != values.fields() => Err(StateError::Missing(format!(
                "table family {prefix:?} is declared twice with different columns"
            ))),
            Some(_) => Ok(()),
            None => {
                self.families.push((prefix.to_string(), values));
                Ok(())
            }
        }
    }

    /// Forgets `table` and its rows (a closed window's state). Its runs
    /// leave the current state: the next checkpoint no longer names them,
    /// and [`Self::retain`] deletes their files once no kept checkpoint
    /// does (a temporary store deletes them now). `table` is not used again.
    pub fn drop_table(&mut self, table: TableId) -> Result<()> {
        let t = &mut self.tables[table.0];
        self.by_name.remove(&t.name);
        t.name.clear();
        t.expiry = None;
        let runs = std::mem::take(&mut t.runs);
        for r in &runs {
            self.cache.forget_run(r.id);
        }
        if self._temporary.is_some() {
            // A run still being written goes when its write finishes.
            for r in runs.iter().filter(|r| r.is_written()) {
                self.delete_run_files(&r.name);
            }
        }
        self.free.push(table.0);
        Ok(())
    }

    fn delete_run_files(&mut self, run: &str) {
        for f in crate::run::file_names(run) {
            if std::fs::remove_file(self.dir.join(f)).is_ok() {
                self.stats.files_deleted += 1;
            }
        }
    }

    /// Makes the runs `manifest` names the tables' contents (every table it
    /// names must be declared). Tables it does not name become empty.
    pub fn restore(&mut self, manifest: &StoreManifest) -> Result<()> {
        self.job = None;
        // The runs being written belong to the state left behind.
        self.poll_writes(true)?;
        for t in &mut self.tables {
            for r in t.runs.drain(..) {
                self.cache.forget_run(r.id);
            }
        }
        for (name, runs) in &manifest.tables {
            let i = match self.by_name.get(name) {
                Some(&i) => i,
                None => {
                    let values = self
                        .families
                        .iter()
                        .find(|(prefix, _)| name.starts_with(prefix.as_str()))
                        .map(|(_, v)| Arc::clone(v))
                        .ok_or_else(|| {
                            StateError::Missing(format!(
                                "the checkpoint holds state table {name:?}, which this query does not have"
                            ))
                        })?;
                    self.table(name, values)?.0
                }
            };
            let mut opened = Vec::with_capacity(runs.len());
            for run in runs {
                let id = self.next_run_id;
                self.next_run_id += 1;
                opened.push(Arc::new(Run::open(
                    &self.dir,
                    run,
                    id,
                    &self.tables[i].values,
                )?));
            }
            self.tables[i].runs = opened;
        }
        Ok(())
    }

    /// Writes rows as a new run of `table`: `keys[i]` gets `values` row `i`,
    /// or is deleted where `deleted[i]`. Keys may come in any order; where a
    /// key repeats, its last row counts. Returns the bytes written.
    pub fn write(
        &mut self,
        table: TableId,
        keys: &BinaryArray,
        values: &RecordBatch,
        deleted: Option<&[bool]>,
    ) -> Result<u64> {
        let n = keys.len();
        if n == 0 {
            return Ok(0);
        }
        let values = self.as_table_rows(table, values)?;
        let rows = if (1..n).all(|i| keys.value(i - 1) < keys.value(i)) {
            // In key order already (rows numbered as they came): no sort, no copy.
            JobRows::Sorted(Box::new(Sorted {
                keys: keys.clone(),
                deleted: BooleanArray::from_iter(
                    (0..n).map(|i| Some(deleted.is_some_and(|d| d[i]))),
                ),
                values,
            }))
        } else {
            // Sorted on the writer's thread, or by the first lookup that
            // needs them: the pipeline does not wait for a checkpoint's sort.
            JobRows::Unsorted(Arc::new(Unsorted::new(
                Keys::Encoded(keys.clone()),
                deleted.map(<[bool]>::to_vec),
                values,
                Arc::clone(&self.tables[table.0].values),
            )))
        };
        self.queue_run(table, rows)
    }

    /// Writes rows as a new run of `table`, as [`Self::write`] does, keyed
    /// by `key_columns` as `encoder` encodes them: the encoding happens with
    /// the sort, off the caller's thread unless a lookup needs the rows first.
    pub fn write_columns(
        &mut self,
        table: TableId,
        key_columns: &[ArrayRef],
        encoder: &Arc<dyn KeyEncoder>,
        values: &RecordBatch,
        deleted: Option<Vec<bool>>,
    ) -> Result<u64> {
        let n = values.num_rows();
        if n == 0 {
            return Ok(0);
        }
        let values = self.as_table_rows(table, values)?;
        let rows = Unsorted::new(
            Keys::Columns(key_columns.to_vec(), Arc::clone(encoder)),
            deleted,
            values,
            Arc::clone(&self.tables[table.0].values),
        );
        self.queue_run(table, JobRows::Unsorted(Arc::new(rows)))
    }

    /// `values` with `table`'s columns (their names may differ).
    fn as_table_rows(&self, table: TableId, values: &RecordBatch) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.tables[table.0].values),
            values.columns().to_vec(),
            &RecordBatchOptions::new().with_row_count(Some(values.num_rows())),
        )?)
    }

    /// Serves `rows` as a new run of `table` at once, and queues the
    /// writing of its files.
    fn queue_run(&mut self, table: TableId, rows: JobRows) -> Result<u64> {
        let name = self.next_name();
        let id = self.next_run_id;
        self.next_run_id += 1;
        let run = match &rows {
            JobRows::Sorted(r) => Run::in_memory(&name, id, &r.keys, &r.deleted, &r.values),
            JobRows::Unsorted(r) => Run::unsorted_in_memory(&name, id, Arc::clone(r)),
        };
        let held = run.size();
        let (n, bytes) = (run.rows, run.bytes);
        self.tables[table.0].runs.insert(0, Arc::new(run));
        self.writer()?.submit(WriteJob { name, rows, held })?;
        debug!(table = %self.tables[table.0].name, rows = n, bytes = held, "state run queued");
        self.poll_compaction(false)?;
        Ok(bytes)
    }

    fn writer(&mut self) -> Result<&mut Writer> {
        if self.writer.is_none() {
            self.writer = Some(Writer::start(&self.dir, self._temporary.is_none())?);
        }
        Ok(self.writer.as_mut().expect("just started"))
    }

    /// Waits until every run queued is written, and serves it from its files.
    pub fn finish_writes(&mut self) -> Result<()> {
        self.poll_writes(true)
    }

    /// Swaps in the files of runs whose writes finished (waiting for every
    /// write queued when `all`).
    fn poll_writes(&mut self, all: bool) -> Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            return Ok(());
        };
        let mut freed = 0;
        for done in writer.finished(all)? {
            self.stats.runs_written += 1;
            self.stats.bytes_written += done.file.bytes;
            let owner = self
                .tables
                .iter()
                .position(|t| !t.name.is_empty() && t.runs.iter().any(|r| r.name == done.name));
            let Some(t) = owner else {
                // Its table was dropped or restored over while it was written.
                if self._temporary.is_some() {
                    self.delete_run_files(&done.name);
                }
                continue;
            };
            let id = self.next_run_id;
            self.next_run_id += 1;
            let run = Arc::new(Run::open(
                &self.dir,
                &done.name,
                id,
                &self.tables[t].values,
            )?);
            let at = self.tables[t]
                .runs
                .iter()
                .position(|r| r.name == done.name)
                .expect("found above");
            freed += self.tables[t].runs[at].size();
            self.tables[t].runs[at] = run;
        }
        crate::memory::release_after(freed);
        Ok(())
    }

    fn next_name(&mut self) -> String {
        let name = format!("{}-{:06}", self.prefix, self.next_seq);
        self.next_seq += 1;
        name
    }

    /// From now on, rows of `table` whose `Int64` value column `column` is
    /// at most `through` count as deleted: lookups and scans skip them and
    /// compaction drops them. `through` never goes back.
    pub fn set_expiry(&mut self, table: TableId, column: usize, through: i64) -> Result<()> {
        let t = &mut self.tables[table.0];
        if t.values.fields().get(column).map(|f| f.data_type()) != Some(&DataType::Int64) {
            return Err(StateError::Missing(format!(
                "table {:?} has no Int64 column {column} to expire rows by",
                t.name
            )));
        }
        let through = t.expiry.map_or(through, |e| e.through.max(through));
        t.expiry = Some(Expiry { column, through });
        Ok(())
    }

    /// Whether `table` has any rows on disk.
    pub fn has_rows(&self, table: TableId) -> bool {
        !self.tables[table.0].runs.is_empty()
    }

    /// The current values of `keys` in `table`; deleted and absent keys are
    /// not found.
    pub fn get(&mut self, table: TableId, keys: &[&[u8]]) -> Result<Lookup> {
        self.poll_writes(false)?;
        if !keys.is_empty() {
            self.sort_runs(table)?;
        }
        let values = Arc::clone(&self.tables[table.0].values);
        if keys.is_empty() || self.tables[table.0].runs.is_empty() {
            return Ok(Lookup {
                found: Vec::new(),
                values: RecordBatch::new_empty(values),
            });
        }
        self.stats.keys_probed += keys.len() as u64;
        let mut open: Vec<u32> = (0..keys.len() as u32).collect();
        // Sorted probes read each block once per run, in file order.
        open.sort_unstable_by(|&a, &b| keys[a as usize].cmp(keys[b as usize]));
        let hashes: Vec<u64> = keys.iter().map(|k| hash(k)).collect();
        // The rows found, copied out of their block before the next block
        // is read: a lookup holds the rows it found, not every block it read.
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut hits: Vec<(usize, (usize, usize))> = Vec::new();
        let runs = self.tables[table.0].runs.clone();
        let expiry = self.tables[table.0].expiry;
        let mut found = BlockHits::default();
        for run in &runs {
            if open.is_empty() {
                break;
            }
            let mut still = Vec::with_capacity(open.len());
            for &probe in &open {
                let key = keys[probe as usize];
                let Some(b) = run.block_for(key, hashes[probe as usize]) else {
                    still.push(probe);
                    continue;
                };
                if found.at != Some((run.id, b)) {
                    found.copy_out(&mut parts, &mut hits)?;
                    found.block = Some(self.block(run, b)?);
                    found.at = Some((run.id, b));
                }
                let block = found.block.as_ref().expect("just read");
                match block.find(key) {
                    Some(row) if block.deleted.value(row) => {}
                    Some(row) if expiry.is_some_and(|e| e.expired(&block.values, row)) => {}
                    Some(row) => found.rows.push((probe as usize, row as u32)),
                    None => still.push(probe),
                }
            }
            open = still;
        }
        found.copy_out(&mut parts, &mut hits)?;
        hits.sort_unstable_by_key(|h| h.0);
        let picks: Vec<(usize, usize)> = hits.iter().map(|h| h.1).collect();
        let columns = (0..values.fields().len())
            .map(|c| {
                let columns: Vec<&dyn Array> = parts.iter().map(|b| b.column(c).as_ref()).collect();
                if columns.is_empty() {
                    Ok(arrow::array::new_empty_array(values.field(c).data_type()))
                } else {
                    interleave(&columns, &picks)
                }
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let batch = RecordBatch::try_new_with_options(
            values,
            columns,
            &RecordBatchOptions::new().with_row_count(Some(picks.len())),
        )?;
        Ok(Lookup {
            found: hits.into_iter().map(|h| h.0).collect(),
            values: batch,
        })
    }

    /// Serves `table`'s runs written out of key order sorted (sorting them
    /// here unless the writer did already): lookups and scans read sorted runs.
    fn sort_runs(&mut self, table: TableId) -> Result<()> {
        for run in self.tables[table.0].runs.iter_mut() {
            let Some(rows) = run.unsorted() else {
                continue;
            };
            let sorted = rows.sorted()?;
            *run = Arc::new(Run::in_memory(
                &run.name,
                run.id,
                &sorted.keys,
                &sorted.deleted,
                &sorted.values,
            ));
        }
        Ok(())
    }

    fn block(&mut self, run: &Arc<Run>, b: usize) -> Result<Arc<Block>> {
        if !run.is_written() {
            return Ok(Arc::new(run.read_block(b)?));
        }
        let key = (run.id, b as u32);
        if let Some(block) = self.cache.get(key) {
            return Ok(block);
        }
        self.stats.blocks_read += 1;
        let block = Arc::new(run.read_block(b)?);
        self.cache.insert(key, Arc::clone(&block));
        Ok(block)
    }

    /// Every current row of `table`, in key order (the last compaction's
    /// and later writes merged).
    pub fn scan(&mut self, table: TableId) -> Result<Scan> {
        // No key comes before the empty one.
        self.scan_from(table, &[])
    }

    /// The current rows of `table` whose keys are at or after `start`, in
    /// key order: runs and blocks wholly before it are not read.
    pub fn scan_from(&mut self, table: TableId, start: &[u8]) -> Result<Scan> {
        self.sort_runs(table)?;
        let t = &self.tables[table.0];
        Ok(Scan(Merge::from_key(
            &t.runs,
            start,
            t.expiry,
            Arc::clone(&t.values),
        )?))
    }

    /// Writes queued so far: pass it to [`Self::checkpoint`] to learn what
    /// the checkpoint's own writes (those after it) cost.
    pub fn writes_queued(&self) -> u64 {
        self.writer.as_ref().map_or(0, Writer::submitted)
    }

    /// The current runs of every table, and what to wait on before a
    /// checkpoint naming them is made current: every run written so far on
    /// disk and synced. Installs a finished compaction first. `since`: the
    /// [`Self::writes_queued`] before the checkpoint's own writes.
    pub fn checkpoint(&mut self, since: u64) -> Result<(StoreManifest, Durability)> {
        self.poll_compaction(false)?;
        self.poll_writes(false)?;
        let durable = self._temporary.is_none();
        let durability = match &self.writer {
            Some(w) => w.durability(&self.dir, since),
            None => Durability::runs_done(durable.then_some(self.dir.as_path())),
        };
        Ok((self.manifest(), durability))
    }

    /// The current runs of every table (durable or not).
    pub fn manifest(&self) -> StoreManifest {
        StoreManifest {
            tables: self
                .tables
                .iter()
                .filter(|t| !t.runs.is_empty())
                .map(|t| {
                    (
                        t.name.clone(),
                        t.runs.iter().map(|r| r.name.clone()).collect(),
                    )
                })
                .collect(),
        }
    }

    /// Deletes the run files of this directory that neither a current
    /// table, a running compaction nor `pinned` (run names of kept
    /// checkpoints) refers to.
    pub fn retain(&mut self, pinned: &BTreeSet<String>) -> Result<()> {
        let mut live: BTreeSet<&str> = pinned.iter().map(String::as_str).collect();
        for t in &self.tables {
            live.extend(t.runs.iter().map(|r| r.name.as_str()));
        }
        if let Some(job) = &self.job {
            live.insert(job.output.as_str());
            live.extend(job.inputs.iter().map(String::as_str));
        }
        let entries = std::fs::read_dir(&self.dir).map_err(StateError::io("list", &self.dir))?;
        let mut deleted = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(run) = name
                .strip_suffix(".arrow")
                .or_else(|| name.strip_suffix(".idx"))
            else {
                continue;
            };
            if !live.contains(run) && std::fs::remove_file(e.path()).is_ok() {
                deleted += 1;
            }
        }
        self.stats.files_deleted += deleted;
        Ok(())
    }

    /// Installs finished writes and a finished compaction (waiting for
    /// both if `wait`), then starts the next compaction if a table needs it.
    pub fn poll_compaction(&mut self, wait: bool) -> Result<()> {
        self.poll_writes(wait)?;
        if self.job.as_ref().is_some_and(|j| wait || j.is_finished()) {
            let done = self.job.take().expect("checked").join()?;
            self.install(done)?;
        }
        self.maybe_compact()
    }

    fn install(&mut self, done: compact::Done) -> Result<()> {
        let table = &self.tables[done.table];
        let Some(at) = table.runs.iter().position(|r| r.name == done.inputs[0]) else {
            // The table was dropped while its runs were merged: the merged
            // run is not needed (no manifest names it; retain deletes it).
            if let (Some(file), true) = (done.output, self._temporary.is_some()) {
                self.delete_run_files(&file.name);
            }
            return Ok(());
        };
        let span = at..at + done.inputs.len();
        let names: Vec<&str> = table.runs[span.clone()]
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        if names != done.inputs.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(StateError::Missing(
                "the runs a compaction merged are no longer neighbours".into(),
            ));
        }
        let merged = match done.output {
            Some(file) => {
                self.stats.compactions += 1;
                self.stats.compaction_bytes += file.bytes;
                let id = self.next_run_id;
                self.next_run_id += 1;
                Some(Arc::new(Run::open(
                    &self.dir,
                    &file.name,
                    id,
                    &table.values,
                )?))
            }
            None => None,
        };
        let table = &mut self.tables[done.table];
        let old: Vec<Arc<Run>> = table.runs.splice(span, merged).collect();
        for r in old {
            self.cache.forget_run(r.id);
            if self._temporary.is_some() {
                // No checkpoint refers to a temporary store's runs: what a
                // compaction replaced goes now, not at the next retain.
                self.delete_run_files(&r.name);
            }
        }
        Ok(())
    }

    fn maybe_compact(&mut self) -> Result<()> {
        if !self.compaction || self.job.is_some() {
            return Ok(());
        }
        for (i, t) in self.tables.iter().enumerate() {
            // Runs still being written (the newest) wait for their files.
            let unwritten = t.runs.iter().take_while(|r| !r.is_written()).count();
            let sizes: Vec<u64> = t.runs[unwritten..].iter().map(|r| r.bytes).collect();
            if let Some(span) = compact::pick(&sizes) {
                let span = span.start + unwritten..span.end + unwritten;
                let bottom = span.end == t.runs.len();
                let runs = t.runs[span].to_vec();
                let expiry = t.expiry;
                let output = format!("{}-{:06}", self.prefix, self.next_seq);
                self.next_seq += 1;
                self.job = Some(Job::start(
                    self.dir.clone(),
                    i,
                    runs,
                    bottom,
                    expiry,
                    output,
                    self._temporary.is_none(),
                )?);
                return Ok(());
            }
        }
        Ok(())
    }

    /// Rows on disk of `table` (a key written several times counts once
    /// per run that holds it).
    pub fn rows(&self, table: TableId) -> u64 {
        self.tables[table.0].runs.iter().map(|r| r.rows).sum()
    }

    /// Bytes of the current runs' files.
    pub fn disk_bytes(&self) -> u64 {
        self.tables
            .iter()
            .flat_map(|t| &t.runs)
            .map(|r| r.bytes)
            .sum()
    }

    /// Memory held: run indexes, bloom filters and cached blocks.
    pub fn memory(&self) -> usize {
        self.cache.size()
            + self
                .tables
                .iter()
                .flat_map(|t| &t.runs)
                .map(|r| r.size())
                .sum::<usize>()
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

impl Drop for StateStore {
    /// Stops compaction and finishes the queued writes before the
    /// directory (a temporary one) goes.
    fn drop(&mut self) {
        self.job.take();
        self.writer.take();
    }
}

/// Rows of a table in key order ([`StateStore::scan`]).
pub struct Scan(Merge);

impl Scan {
    /// The next batch of (keys, values), `None` at the end.
    pub fn next_batch(&mut self) -> Result<Option<(BinaryArray, RecordBatch)>> {
        Ok(self
            .0
            .next_batch()?
            .map(|Merged { keys, values, .. }| (keys, values)))
    }
}

/// Whether a column of type `t` holds dictionary-encoded values anywhere
/// (a table refuses such columns: state columns hold plain values).
pub fn has_dictionary(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(..) => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            has_dictionary(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        DataType::Map(f, _) => has_dictionary(f.data_type()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    /// Checkpoints and waits for the runs to be durable.
    fn checkpoint(store: &mut StateStore) -> StoreManifest {
        let (manifest, durability) = store.checkpoint(0).unwrap();
        durability.wait().unwrap();
        manifest
    }

    /// xorshift64*: a deterministic stream of test values.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]))
    }

    fn key(k: u64) -> Vec<u8> {
        format!("key-{k:08}").into_bytes()
    }

    type Model = BTreeMap<Vec<u8>, i64>;

    /// Writes `n` random upserts and deletions of keys below `space`.
    fn write_random(
        store: &mut StateStore,
        t: TableId,
        model: &mut Model,
        rng: &mut Rng,
        n: usize,
        space: u64,
    ) {
        write_random_from(store, t, model, rng, (n, space), 0);
    }

    /// As [`write_random`], values from `base` up (a key's expiry time
    /// only grows when every write starts above the last one's values).
    fn write_random_from(
        store: &mut StateStore,
        t: TableId,
        model: &mut Model,
        rng: &mut Rng,
        (n, space): (usize, u64),
        base: i64,
    ) {
        let mut keys = Vec::new();
        let mut vals = Vec::new();
        let mut dels = Vec::new();
        for _ in 0..n {
            let k = key(rng.below(space));
            let v = base + rng.below(1_000_000) as i64;
            let del = rng.below(10) == 0;
            if del {
                model.remove(&k);
            } else {
                model.insert(k.clone(), v);
            }
            keys.push(k);
            vals.push(v);
            dels.push(del);
        }
        let keys = BinaryArray::from_iter_values(keys.iter());
        let strings: Vec<String> = vals.iter().map(|v| format!("s{v}")).collect();
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vals)),
                Arc::new(StringArray::from(strings)),
            ],
        )
        .unwrap();
        store.write(t, &keys, &batch, Some(&dels)).unwrap();
    }

    fn check_get(store: &mut StateStore, t: TableId, model: &Model, probes: &[u64]) {
        let keys: Vec<Vec<u8>> = probes.iter().map(|&k| key(k)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let got = store.get(t, &refs).unwrap();
        let expected: Vec<usize> = (0..keys.len())
            .filter(|&i| model.contains_key(&keys[i]))
            .collect();
        assert_eq!(got.found, expected);
        let v = got.values.column(0).as_primitive::<Int64Type>();
        let s = got.values.column(1).as_string::<i32>();
        for (row, &i) in got.found.iter().enumerate() {
            assert_eq!(v.value(row), model[&keys[i]]);
            assert_eq!(s.value(row), format!("s{}", model[&keys[i]]));
        }
    }

    /// A whole scan, and scans from keys before, inside and after the
    /// table's, give the model's rows from there on.
    fn check_scan(store: &mut StateStore, t: TableId, model: &Model) {
        let rows = |mut scan: Scan| {
            let mut seen = Vec::new();
            while let Some((keys, values)) = scan.next_batch().unwrap() {
                let v = values.column(0).as_primitive::<Int64Type>();
                for i in 0..keys.len() {
                    seen.push((keys.value(i).to_vec(), v.value(i)));
                }
            }
            seen
        };
        let expected: Vec<(Vec<u8>, i64)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(rows(store.scan(t).unwrap()), expected);
        for start in [0, 1, 777, 2500, 4321, 4999, 6000] {
            let start = key(start);
            let expected: Vec<(Vec<u8>, i64)> = model
                .range(start.clone()..)
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            assert_eq!(rows(store.scan_from(t, &start).unwrap()), expected);
        }
    }

    #[test]
    fn writes_lookups_scans_compaction_and_restore_agree_with_a_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut model = Model::new();
        let mut store = StateStore::open(
            dir.path(),
            StoreOptions {
                cache_bytes: 1 << 16,
                compaction: true,
            },
        )
        .unwrap();
        let t = store.table("t", schema()).unwrap();
        let mut manifests = Vec::new();
        for round in 0..40 {
            // Mostly small writes (checkpoint deltas), now and then a big one (a spill).
            let n = if round % 9 == 0 {
                3000
            } else {
                1 + rng.below(300) as usize
            };
            write_random(&mut store, t, &mut model, &mut rng, n, 5000);
            let probes: Vec<u64> = (0..200).map(|_| rng.below(6000)).collect();
            check_get(&mut store, t, &model, &probes);
            if round % 5 == 4 {
                let m = checkpoint(&mut store);
                manifests.push((m, model.clone()));
            }
        }
        store.poll_compaction(true).unwrap();
        assert!(store.stats().compactions > 0, "no compaction ran");
        assert!(
            store.manifest().tables["t"].len() < 20,
            "{:?}",
            store.manifest()
        );
        check_scan(&mut store, t, &model);
        let all: Vec<u64> = (0..5000).collect();
        check_get(&mut store, t, &model, &all);

        // Keep the last two checkpoints; every other file goes.
        let last = checkpoint(&mut store);
        manifests.push((last, model.clone()));
        let kept = &manifests[manifests.len() - 2..];
        let pinned: BTreeSet<String> = kept
            .iter()
            .flat_map(|(m, _)| m.runs().map(String::from))
            .collect();
        store.retain(&pinned).unwrap();
        drop(store);

        // Each kept checkpoint restores exactly its state.
        for (m, state) in kept {
            let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
            let t = store.table("t", schema()).unwrap();
            store.restore(m).unwrap();
            check_scan(&mut store, t, state);
            check_get(&mut store, t, state, &all);
        }
        let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(
            on_disk,
            1 + 2 * pinned.len(),
            "LOCK and both files of each pinned run"
        );
    }

    #[test]
    fn expired_rows_are_not_found_scanned_or_kept_by_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        let t = store.table("t", schema()).unwrap();
        let mut model = Model::new();
        let mut rng = Rng(11);
        // A key's time only grows, as an operator's latest event time does.
        for round in 0..8 {
            let base = round * 1_000_000;
            write_random_from(&mut store, t, &mut model, &mut rng, (2000, 3000), base);
        }
        // Column 0 ("v") is the time rows expire by.
        store.set_expiry(t, 0, 6_400_000).unwrap();
        model.retain(|_, v| *v > 6_400_000);
        let all: Vec<u64> = (0..3000).collect();
        check_get(&mut store, t, &model, &all);
        check_scan(&mut store, t, &model);
        // An earlier cutoff does not bring rows back.
        store.set_expiry(t, 0, 10).unwrap();
        check_get(&mut store, t, &model, &all);
        store.poll_compaction(true).unwrap();
        while store.manifest().tables["t"].len() >= compact::FAN_IN {
            store.poll_compaction(true).unwrap();
        }
        let on_disk = store.rows(t);
        assert!(on_disk < 8 * 2000, "compaction kept {on_disk} rows");
        check_get(&mut store, t, &model, &all);
        assert!(store.set_expiry(t, 1, 0).is_err(), "column 1 is not Int64");
    }

    #[test]
    fn runs_are_served_from_memory_until_written_and_a_failed_write_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        let t = store.table("t", schema()).unwrap();
        let mut model = Model::new();
        let mut rng = Rng(5);
        write_random(&mut store, t, &mut model, &mut rng, 500, 1000);
        // Found at once, whether or not the writer got to it yet.
        let all: Vec<u64> = (0..1000).collect();
        check_get(&mut store, t, &model, &all);
        let (manifest, durability) = store.checkpoint(0).unwrap();
        assert!(
            durability.wait().unwrap() > 0,
            "the checkpoint's run has bytes"
        );
        let run = manifest.tables["t"][0].clone();
        for f in file_names(&run) {
            assert!(dir.path().join(f).exists(), "{run} is on disk once durable");
        }
        check_get(&mut store, t, &model, &all);

        // The directory goes: the next write fails on the writer thread, and
        // the store says so (with the file) at its next call and to the
        // checkpoint waiting on it.
        let path = dir.path().to_path_buf();
        std::fs::remove_dir_all(&path).unwrap();
        let since = store.writes_queued();
        let keys = BinaryArray::from_iter_values((0..10u64).map(key));
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..10)),
                Arc::new(StringArray::from_iter_values(
                    (0..10).map(|v| format!("s{v}")),
                )),
            ],
        )
        .unwrap();
        // The write itself reports it if the writer thread failed already
        // (the write looks at finished writes), else the checkpoint does.
        let e = match store.write(t, &keys, &batch, None) {
            Err(e) => e.to_string(),
            Ok(_) => match store.checkpoint(since) {
                Err(e) => e.to_string(),
                Ok((_, durability)) => durability.wait().unwrap_err().to_string(),
            },
        };
        assert!(e.contains("cannot create"), "{e}");
        let e = store.get(t, &[b"x".as_slice()]).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn a_directory_serves_one_store_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        assert!(matches!(
            StateStore::open(dir.path(), StoreOptions::default()),
            Err(StateError::Locked(_))
        ));
        let t = store.table("t", schema()).unwrap();
        let mut model = Model::new();
        write_random(&mut store, t, &mut model, &mut Rng(7), 100, 50);
        let m = checkpoint(&mut store);
        drop(store);

        let run = m.runs().next().unwrap().to_string();
        let idx = dir.path().join(format!("{run}.idx"));
        let mut bytes = std::fs::read(&idx).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&idx, &bytes).unwrap();
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        store.table("t", schema()).unwrap();
        let e = store.restore(&m).unwrap_err().to_string();
        assert!(e.contains(&run) && e.contains("checksum"), "{e}");

        // A run written with other columns is refused, naming both layouts.
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        let t = store.table("t", schema()).unwrap();
        write_random(&mut store, t, &mut Model::new(), &mut Rng(9), 10, 50);
        let m = checkpoint(&mut store);
        drop(store);
        let mut store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        let other = Arc::new(Schema::new(vec![Field::new("v", DataType::Utf8, true)]));
        store.table("t", other).unwrap();
        let e = store.restore(&m).unwrap_err().to_string();
        assert!(e.contains("v Int64") && e.contains("v Utf8"), "{e}");
        // A table the query does not have is named.
        let mut store2 =
            StateStore::open(tempfile::tempdir().unwrap().path(), StoreOptions::default()).unwrap();
        let e = store2.restore(&m).unwrap_err().to_string();
        assert!(e.contains("\"t\""), "{e}");
    }

    fn run_files(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".arrow"))
            .count()
    }

    #[test]
    fn family_tables_restore_by_prefix_and_dropped_tables_leave_with_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            cache_bytes: 1 << 16,
            compaction: true,
        };
        let mut store = StateStore::open(dir.path(), options.clone()).unwrap();
        store.table_family("window/", schema()).unwrap();
        let (a, b) = (
            store.table("window/1", schema()).unwrap(),
            store.table("window/2", schema()).unwrap(),
        );
        let (mut model_a, mut model_b) = (Model::new(), Model::new());
        let mut rng = Rng(11);
        for _ in 0..6 {
            write_random(&mut store, a, &mut model_a, &mut rng, 200, 300);
            write_random(&mut store, b, &mut model_b, &mut rng, 200, 300);
        }
        let first = checkpoint(&mut store);
        store.drop_table(a).unwrap();
        // The slot is reused by the next table: ids of dropped tables are dead.
        let c = store.table("window/3", schema()).unwrap();
        assert_eq!(c, a);
        assert!(!store.has_rows(c));
        write_random(&mut store, c, &mut Model::new(), &mut rng, 50, 300);
        store.poll_compaction(true).unwrap();
        let second = checkpoint(&mut store);
        assert!(!second.tables.contains_key("window/1"), "{second:?}");
        assert!(second.tables.contains_key("window/2") && second.tables.contains_key("window/3"));
        // The first checkpoint is still kept: its runs stay until unpinned.
        let pinned: BTreeSet<String> = first
            .runs()
            .chain(second.runs())
            .map(String::from)
            .collect();
        store.retain(&pinned).unwrap();
        for run in first.runs() {
            assert!(
                dir.path().join(format!("{run}.arrow")).exists(),
                "{run} was deleted"
            );
        }
        store
            .retain(&second.runs().map(String::from).collect())
            .unwrap();
        assert_eq!(run_files(dir.path()), second.runs().count());
        drop(store);

        // Restore: the family's tables come back by name, claimed later.
        let mut store = StateStore::open(dir.path(), options.clone()).unwrap();
        store.table_family("window/", schema()).unwrap();
        store.restore(&second).unwrap();
        let b = store.table("window/2", schema()).unwrap();
        check_scan(&mut store, b, &model_b);
        // A table outside every family is still refused.
        let mut other =
            StateStore::open(tempfile::tempdir().unwrap().path(), options.clone()).unwrap();
        other.table_family("session/", schema()).unwrap();
        let e = other.restore(&second).unwrap_err().to_string();
        assert!(e.contains("window/"), "{e}");

        // A temporary store deletes a dropped table's files at once.
        let parent = tempfile::tempdir().unwrap();
        let mut temp = StateStore::temporary(Some(parent.path()), options).unwrap();
        let t = temp.table("window/9", schema()).unwrap();
        for _ in 0..5 {
            write_random(&mut temp, t, &mut Model::new(), &mut rng, 100, 300);
        }
        temp.poll_compaction(true).unwrap();
        assert!(run_files(temp.dir()) > 0);
        temp.drop_table(t).unwrap();
        temp.poll_compaction(true).unwrap();
        assert_eq!(run_files(temp.dir()), 0);
    }
}
