//! [`KeyedState`]: one accumulator state per group key, the unit every
//! aggregating operator is built from (one per window, one per continuous
//! query, one per session slot table).
//!
//! A keyed state may have a table of the query's state store behind it
//! ([`KeyedState::with_store`]). Then groups live in memory while they are
//! used, in the same layout as without a store (dense group indices,
//! vectorised accumulators: the hot path pays no serialisation), and:
//! - [`KeyedState::evict`] moves the least recently used groups out of
//!   memory (writing those changed since they were last written), and a
//!   key not in memory is looked up in the store when a batch brings it
//!   back, before its rows are folded in;
//! - [`KeyedState::persist`] writes the groups changed since the last
//!   checkpoint: a checkpoint's cost follows what changed, not the state.
//!
//! Loading a group merges its exported state into an empty one, which
//! gives back the same state exactly, so results do not depend on what was
//! in memory when.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, RecordBatchOptions,
    UInt32Array,
};
use arrow::compute::{take, take_record_batch};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};
use ubik_state::memory::release_after;

use super::backing::{Backing, Dirty, key_column_fields};
use super::interner::Interner;
use super::store::SharedStore;
use crate::accumulate::{StreamAccumulator, create_accumulator, state_fields};
use crate::error::{EngineError, Result};
use crate::plan::AggregateSpec;
use crate::time::MIN_TIME;

/// Evaluated inputs of every aggregate for a batch of rows.
#[derive(Debug, Clone, Default)]
pub struct AggInputs {
    /// Per aggregate: its arguments then its ORDER BY expressions.
    pub args: Vec<Vec<ArrayRef>>,
    /// Per aggregate: `FILTER (WHERE ...)`.
    pub filters: Vec<Option<BooleanArray>>,
}

impl AggInputs {
    /// The rows at `indices`.
    pub fn take(&self, indices: &UInt32Array) -> Result<AggInputs> {
        let args = self
            .args
            .iter()
            .map(|a| {
                a.iter()
                    .map(|c| take(c.as_ref(), indices, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let filters = self
            .filters
            .iter()
            .map(|f| {
                f.as_ref()
                    .map(|f| take(f, indices, None).map(|a| a.as_boolean().clone()))
                    .transpose()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(AggInputs { args, filters })
    }
}

/// What an eviction did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Evicted {
    pub groups: usize,
    /// Of those, the groups written (changed since last written).
    pub written: usize,
    pub bytes_written: u64,
}

/// Evictions of several states add up.
impl std::ops::AddAssign for Evicted {
    fn add_assign(&mut self, other: Evicted) {
        self.groups += other.groups;
        self.written += other.written;
        self.bytes_written += other.bytes_written;
    }
}

pub struct KeyedState {
    interner: Interner,
    accs: Vec<Box<dyn StreamAccumulator>>,
    specs: Vec<AggregateSpec>,
    /// Whether the group's last emission was an upsert (so a later failing
    /// HAVING must retract it).
    visible: Vec<bool>,
    /// Max event time folded into each group (the record timestamp of
    /// continuous queries); only kept when asked for.
    max_time: Option<Vec<i64>>,
    dirty: Option<Dirty>,
    backing: Option<Backing>,
    scratch: Vec<usize>,
}

impl KeyedState {
    pub fn new(
        key_fields: &[FieldRef],
        specs: &[AggregateSpec],
        track_dirty: bool,
        track_time: bool,
    ) -> Result<Self> {
        Ok(Self {
            interner: Interner::new(key_fields)?,
            accs: specs
                .iter()
                .map(create_accumulator)
                .collect::<Result<Vec<_>>>()?,
            specs: specs.to_vec(),
            visible: Vec::new(),
            max_time: track_time.then(Vec::new),
            dirty: track_dirty.then(Dirty::default),
            backing: None,
            scratch: Vec::new(),
        })
    }

    /// Puts table `table` of `store` behind this (empty) state.
    pub fn with_store(mut self, store: SharedStore, table: &str) -> Result<Self> {
        let schema = Self::snapshot_schema(self.interner.fields(), &self.specs)?;
        self.backing = Some(Backing::new(store, table, schema, self.interner.fields())?);
        Ok(self)
    }

    /// Whether a store is behind this state.
    pub fn has_store(&self) -> bool {
        self.backing.is_some()
    }

    /// Whether the store may hold groups that are not in memory.
    pub fn is_cold(&self) -> bool {
        self.backing.as_ref().is_some_and(|b| b.cold)
    }

    pub fn len(&self) -> usize {
        self.interner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.interner.is_empty()
    }

    /// Folds rows into their groups. `times` (when tracked) are the rows' event times.
    pub fn update(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        inputs: &AggInputs,
        times: Option<&[i64]>,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let mut groups = std::mem::take(&mut self.scratch);
        self.intern(keys, rows, &mut groups)?;
        let folded = self.fold_into(&groups, inputs, times);
        self.scratch = groups;
        folded
    }

    /// Folds rows into `groups` (row `i` into `groups[i]`), groups
    /// [`Self::groups_of`] gave since the last eviction.
    pub fn fold_into(
        &mut self,
        groups: &[usize],
        inputs: &AggInputs,
        times: Option<&[i64]>,
    ) -> Result<()> {
        let total = self.interner.len();
        for (j, acc) in self.accs.iter_mut().enumerate() {
            acc.update(&inputs.args[j], groups, inputs.filters[j].as_ref(), total)?;
        }
        self.touch(groups, times);
        Ok(())
    }

    /// Takes rows folded in earlier back out of their groups (retractable
    /// aggregates only) and marks the groups dirty; returns each row's group.
    pub fn retract(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        inputs: &AggInputs,
    ) -> Result<Vec<usize>> {
        let mut groups = Vec::new();
        if rows == 0 {
            return Ok(groups);
        }
        self.intern(keys, rows, &mut groups)?;
        let total = self.interner.len();
        for (j, acc) in self.accs.iter_mut().enumerate() {
            acc.retract(&inputs.args[j], &groups, inputs.filters[j].as_ref(), total)?;
        }
        self.touch(&groups, None);
        Ok(groups)
    }

    /// The group of each row of `keys` (interning new keys).
    pub fn groups_of(&mut self, keys: &[ArrayRef], rows: usize) -> Result<Vec<usize>> {
        let mut groups = Vec::new();
        self.intern(keys, rows, &mut groups)?;
        Ok(groups)
    }

    /// The group of each row of `keys`: new keys get new groups, which are
    /// loaded from the store when it may hold them.
    fn intern(&mut self, keys: &[ArrayRef], rows: usize, groups: &mut Vec<usize>) -> Result<()> {
        let before = self.interner.len();
        self.interner.intern(keys, rows, groups)?;
        let total = self.interner.len();
        if total > before {
            self.grow(total);
            if self.backing.as_ref().is_some_and(|b| b.cold) {
                self.load((before..total).collect())?;
            }
        }
        Ok(())
    }

    /// Sizes the per-group vectors for `total` groups.
    fn grow(&mut self, total: usize) {
        self.visible.resize(total, false);
        if let Some(t) = self.max_time.as_mut() {
            t.resize(total, MIN_TIME);
        }
        if let Some(d) = self.dirty.as_mut() {
            d.flag.resize(total, false);
        }
        if let Some(b) = self.backing.as_mut() {
            b.grow(total);
        }
    }

    /// Loads the stored state of `groups` (new, empty groups) where the store has one.
    fn load(&mut self, groups: Vec<usize>) -> Result<()> {
        let keys = self.interner.keys(&groups)?;
        let b = self.backing.as_mut().expect("loading needs a store");
        let found = b.lookup(&keys, groups.len())?;
        if found.found.is_empty() {
            return Ok(());
        }
        let loaded: Vec<usize> = found.found.iter().map(|&i| groups[i]).collect();
        self.merge_rows(&found.values, &loaded)
    }

    /// Merges rows of [`Self::snapshot_schema`] into `groups` (row `i`
    /// into `groups[i]`, which exist): accumulator states, visibility and
    /// max time.
    fn merge_rows(&mut self, batch: &RecordBatch, groups: &[usize]) -> Result<()> {
        let total = self.interner.len();
        let mut col = self.interner.fields().len();
        for (acc, spec) in self.accs.iter_mut().zip(&self.specs) {
            let width = state_fields(spec)?.len();
            acc.merge(&batch.columns()[col..col + width], groups, total)?;
            col += width;
        }
        let visible = batch.column(col).as_boolean();
        for (i, &g) in groups.iter().enumerate() {
            self.visible[g] = visible.is_valid(i) && visible.value(i);
        }
        if let Some(t) = self.max_time.as_mut() {
            let times = batch.column(col + 1).as_primitive::<Int64Type>();
            for (i, &g) in groups.iter().enumerate() {
                t[g] = times.value(i);
            }
        }
        Ok(())
    }

    /// Bookkeeping after `groups` were folded into: raise max times, mark
    /// the groups dirty (and changed, and used now, with a store).
    fn touch(&mut self, groups: &[usize], times: Option<&[i64]>) {
        if let (Some(max_time), Some(times)) = (self.max_time.as_mut(), times) {
            for (&g, &t) in groups.iter().zip(times) {
                if t > max_time[g] {
                    max_time[g] = t;
                }
            }
        }
        if let Some(dirty) = self.dirty.as_mut() {
            dirty.mark(groups);
        }
        if let Some(b) = self.backing.as_mut() {
            b.touch(groups);
        }
    }

    /// Folds every group of `other` (same keys and aggregates) into this
    /// state: the merge of a partial state folded on another thread.
    pub fn absorb(&mut self, mut other: KeyedState) -> Result<()> {
        let n = other.len();
        if n == 0 {
            return Ok(());
        }
        let all: Vec<usize> = (0..n).collect();
        let keys = other.interner.all_keys()?;
        let mut groups = Vec::with_capacity(n);
        self.intern(&keys, n, &mut groups)?;
        let total = self.interner.len();
        for (acc, theirs) in self.accs.iter_mut().zip(other.accs.iter_mut()) {
            acc.merge(&theirs.state(&all)?, &groups, total)?;
        }
        let times = other.max_time.take();
        self.touch(&groups, times.as_deref());
        Ok(())
    }

    /// Starts or stops tracking which groups change (late updates re-emit only those).
    pub fn set_track_dirty(&mut self, on: bool) {
        match (on, self.dirty.is_some()) {
            (true, false) => {
                self.dirty = Some(Dirty {
                    flag: vec![false; self.len()],
                    list: Vec::new(),
                })
            }
            (false, true) => self.dirty = None,
            _ => {}
        }
    }

    /// The groups changed since the last call, and clears the set.
    pub fn take_dirty(&mut self) -> Vec<usize> {
        self.dirty.as_mut().map_or_else(Vec::new, Dirty::take)
    }

    pub fn keys(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        self.interner.keys(groups)
    }

    /// Final values of every aggregate for `groups`, state unchanged.
    pub fn evaluate(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        self.accs.iter_mut().map(|a| a.evaluate(groups)).collect()
    }

    /// Keys and final values of every group (group `i` at row `i`), after
    /// which the accumulators are empty: the cheap path for a window that
    /// closes without keeping state.
    pub fn drain_all(&mut self) -> Result<(Vec<ArrayRef>, Vec<ArrayRef>)> {
        let n = self.len();
        let keys = self.interner.all_keys()?;
        let values = self
            .accs
            .iter_mut()
            .map(|a| a.evaluate_all_and_clear(n))
            .collect::<Result<Vec<_>>>()?;
        Ok((keys, values))
    }

    pub fn visible(&self, groups: &[usize]) -> Vec<bool> {
        groups.iter().map(|&g| self.visible[g]).collect()
    }

    /// Records what the last emission of `groups` showed; with a store,
    /// a group whose visibility changed is written again when it leaves.
    pub fn set_visible(&mut self, groups: &[usize], visible: &[bool]) {
        for (&g, &v) in groups.iter().zip(visible) {
            if self.visible[g] != v {
                self.visible[g] = v;
                if let Some(b) = self.backing.as_mut() {
                    b.changed.mark(&[g]);
                }
            }
        }
    }

    pub fn max_time(&self, groups: &[usize]) -> Vec<i64> {
        match &self.max_time {
            Some(t) => groups.iter().map(|&g| t[g]).collect(),
            None => vec![MIN_TIME; groups.len()],
        }
    }

    pub fn size(&self) -> usize {
        self.interner.size()
            + self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.visible.capacity()
            + self.max_time.as_ref().map_or(0, |t| t.capacity() * 8)
            + self.dirty.as_ref().map_or(0, Dirty::size)
            + self.backing.as_ref().map_or(0, Backing::size)
    }

    /// The schema of [`Self::snapshot`]: keys, accumulator states, bookkeeping.
    pub fn snapshot_schema(key_fields: &[FieldRef], specs: &[AggregateSpec]) -> Result<SchemaRef> {
        let mut fields = key_column_fields(key_fields);
        for (j, spec) in specs.iter().enumerate() {
            for f in state_fields(spec)? {
                fields.push(Arc::new(Field::new(
                    format!("a{j}_{}", f.name()),
                    f.data_type().clone(),
                    true,
                )));
            }
        }
        fields.push(Arc::new(Field::new("visible", DataType::Boolean, false)));
        fields.push(Arc::new(Field::new("max_time", DataType::Int64, false)));
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Every group's key and state as one batch (group `i` at row `i`).
    pub fn snapshot(&mut self) -> Result<RecordBatch> {
        let all: Vec<usize> = (0..self.len()).collect();
        let keys = self.interner.all_keys()?;
        self.rows_of(keys, &all)
    }

    /// Every group, also those spilled to the store, as one batch: the
    /// whole-state snapshot of a checkpoint that cannot refer to the
    /// store's files (a consumer group's task replicates whole snapshots).
    pub fn snapshot_all(&mut self) -> Result<RecordBatch> {
        if !self.is_cold() {
            return self.snapshot();
        }
        // Every group is then in the store: those in memory unchanged since
        // they were written, and the changed ones written now.
        self.persist()?;
        let b = self.backing.as_mut().expect("cold state has a store");
        let schema = Arc::clone(&b.table.schema);
        let mut parts = Vec::new();
        b.table.scan(|rows| {
            parts.push(rows);
            Ok(())
        })?;
        Ok(arrow::compute::concat_batches(&schema, &parts)?)
    }

    /// The keys and states of `groups`, a row each, in [`Self::snapshot_schema`].
    fn snapshot_of(&mut self, groups: &[usize]) -> Result<RecordBatch> {
        let keys = self.interner.keys(groups)?;
        self.rows_of(keys, groups)
    }

    fn rows_of(&mut self, mut columns: Vec<ArrayRef>, groups: &[usize]) -> Result<RecordBatch> {
        let n = groups.len();
        let schema = Self::snapshot_schema(self.interner.fields(), &self.specs)?;
        for acc in self.accs.iter_mut() {
            columns.extend(acc.state(groups)?);
        }
        columns.push(Arc::new(BooleanArray::from_iter(
            groups.iter().map(|&g| Some(self.visible[g])),
        )));
        columns.push(Arc::new(Int64Array::from(self.max_time(groups))));
        typed_batch(schema, columns, n)
    }

    /// Rebuilds the state of a [`Self::snapshot`] into this empty state.
    /// With a store behind it, every group restored counts as changed (the
    /// next checkpoint writes it to the store).
    pub fn restore(&mut self, batch: &RecordBatch) -> Result<()> {
        if !self.is_empty() {
            return Err(EngineError::internal("restore into a non-empty state"));
        }
        let n = batch.num_rows();
        let k = self.interner.fields().len();
        let keys: Vec<ArrayRef> = batch.columns()[..k].to_vec();
        let mut groups = Vec::new();
        if k == 0 && n > 1 {
            return Err(EngineError::Checkpoint(
                "global aggregate with several groups".into(),
            ));
        }
        self.interner.intern(&keys, n, &mut groups)?;
        if groups.iter().enumerate().any(|(i, &g)| g != i) {
            return Err(EngineError::Checkpoint(
                "checkpointed keys are not distinct; the checkpoint is corrupt".into(),
            ));
        }
        self.grow(n);
        self.merge_rows(batch, &groups)?;
        if let Some(b) = self.backing.as_mut() {
            b.changed.mark(&groups);
        }
        Ok(())
    }

    /// The store behind this state was restored: groups not in memory may
    /// be in it.
    pub fn store_restored(&mut self) -> Result<()> {
        if let Some(b) = self.backing.as_mut() {
            b.restored()?;
        }
        Ok(())
    }

    /// Writes the groups changed since they were last written to the store
    /// (a checkpoint's part of this state); returns the bytes written.
    pub fn persist(&mut self) -> Result<u64> {
        let Some(b) = self.backing.as_mut() else {
            return Ok(0);
        };
        let mut groups = b.changed.take();
        groups.sort_unstable();
        self.write_groups(&groups)
    }

    fn write_groups(&mut self, groups: &[usize]) -> Result<u64> {
        if groups.is_empty() {
            return Ok(0);
        }
        let rows = self.snapshot_of(groups)?;
        let k = self.interner.fields().len();
        let b = self.backing.as_mut().expect("writing needs a store");
        b.write(&rows, k)
    }

    /// Moves the least recently used groups to the store until about
    /// `target` bytes are held, writing those changed since they were last
    /// written. Only between emissions: no group may be waiting to be emitted.
    pub fn evict(&mut self, target: usize) -> Result<Evicted> {
        let n = self.len();
        let size = self.size();
        if self.backing.is_none() || n == 0 || size <= target || self.interner.fields().is_empty() {
            return Ok(Evicted::default());
        }
        if self.dirty.as_ref().is_some_and(|d| !d.list.is_empty()) {
            return Err(EngineError::internal(
                "eviction while groups wait to be emitted",
            ));
        }
        let keep = ((n as f64) * (target as f64 / size as f64)) as usize;
        let e = self.backing.as_ref().expect("checked").eviction(keep);
        let bytes_written = self.write_groups(&e.written)?;
        self.rebuild(&e.survivors)?;
        Ok(Evicted {
            groups: e.victims,
            written: e.written.len(),
            bytes_written,
        })
    }

    /// The groups (in memory) whose newest event time is at most `cutoff`.
    pub fn expired(&self, cutoff: i64) -> Vec<usize> {
        match &self.max_time {
            Some(t) => (0..self.len()).filter(|&g| t[g] <= cutoff).collect(),
            None => Vec::new(),
        }
    }

    /// Removes `groups` (ascending) from memory; the others are renumbered
    /// from 0 in their order. Their stored copies are not touched: callers
    /// drop those with [`Self::expire_stored`].
    pub fn drop_groups(&mut self, groups: &[usize]) -> Result<()> {
        let mut gone = vec![false; self.len()];
        for &g in groups {
            gone[g] = true;
        }
        let survivors: Vec<usize> = (0..self.len()).filter(|&g| !gone[g]).collect();
        let cold = self.is_cold();
        self.rebuild(&survivors)?;
        if let Some(b) = self.backing.as_mut() {
            b.cold = cold;
        }
        Ok(())
    }

    /// Removes `groups` (ascending) for good, from memory and from the
    /// store, so that a key coming back starts empty; the others are
    /// renumbered from 0 in their order.
    pub fn delete_groups(&mut self, groups: &[usize]) -> Result<()> {
        if self.backing.as_ref().is_some_and(|b| b.may_hold()) {
            let rows = self.snapshot_of(groups)?;
            let k = self.interner.fields().len();
            let b = self.backing.as_mut().expect("checked");
            b.delete(&rows, k)?;
        }
        self.drop_groups(groups)
    }

    /// Stored groups whose newest event time is at most `cutoff` count as
    /// gone (lookups miss them, compaction drops them).
    pub fn expire_stored(&mut self, cutoff: i64) -> Result<()> {
        let Some(b) = self.backing.as_mut() else {
            return Ok(());
        };
        if !b.cold && !b.table.store.is_durable() {
            return Ok(());
        }
        let table = b.table.id()?;
        let column = b.table.schema.fields().len() - 1;
        b.table
            .store
            .with(|s| Ok(s.set_expiry(table, column, cutoff)?))
    }

    /// Brings the stored groups whose newest event time is at most `cutoff`
    /// (and that have not expired before) into memory, so that they can be
    /// retracted: reads every stored group.
    pub fn load_expired(&mut self, cutoff: i64) -> Result<()> {
        let Some(b) = self.backing.as_mut().filter(|b| b.cold) else {
            return Ok(());
        };
        let k = self.interner.fields().len();
        let time_col = b.table.schema.fields().len() - 1;
        let mut expired: Vec<RecordBatch> = Vec::new();
        b.table.scan(|rows| {
            let times = rows.column(time_col).as_primitive::<Int64Type>();
            let keep =
                BooleanArray::from_iter(times.iter().map(|t| Some(t.is_some_and(|t| t <= cutoff))));
            if keep.true_count() > 0 {
                expired.push(arrow::compute::filter_record_batch(&rows, &keep)?);
            }
            Ok(())
        })?;
        for rows in expired {
            // Interning loads each group's stored state (a group in memory
            // keeps its newer state).
            self.groups_of(&rows.columns()[..k], rows.num_rows())?;
        }
        Ok(())
    }

    /// Brings every stored group into memory (a group in memory keeps its
    /// newer state): afterwards memory holds the whole state, as before
    /// anything was evicted, so every group can be read.
    pub fn load_all(&mut self) -> Result<()> {
        let Some(mut b) = self.backing.take().filter(|b| b.cold) else {
            return Ok(());
        };
        let k = self.interner.fields().len();
        let loaded = b.table.scan(|rows| {
            let before = self.interner.len();
            let mut groups = Vec::with_capacity(rows.num_rows());
            self.interner
                .intern(&rows.columns()[..k], rows.num_rows(), &mut groups)?;
            self.grow(self.interner.len());
            let (rows_of_new, new): (Vec<u32>, Vec<usize>) = groups
                .iter()
                .enumerate()
                .filter(|&(_, &g)| g >= before)
                .map(|(i, &g)| (i as u32, g))
                .unzip();
            if !new.is_empty() {
                let picked = take_record_batch(&rows, &UInt32Array::from(rows_of_new))?;
                self.merge_rows(&picked, &new)?;
            }
            Ok(())
        });
        // Loaded groups are unchanged (the store has them), and least
        // recently used.
        b.grow(self.interner.len());
        b.cold = false;
        self.backing = Some(b);
        loaded
    }

    /// Whether the store holds groups of this state (then a checkpoint
    /// keeps writing its changes there).
    pub fn in_store(&self) -> bool {
        self.backing.as_ref().is_some_and(|b| b.may_hold())
    }

    /// Drops this state's rows from the store: the state is gone for good.
    pub fn drop_store(&mut self) -> Result<()> {
        match self.backing.as_mut() {
            Some(b) => b.drop_table(),
            None => Ok(()),
        }
    }

    /// An empty batch of [`Self::snapshot_schema`]: a checkpoint's entry
    /// for a state whose groups are all in the store.
    pub fn empty_snapshot(&self) -> Result<RecordBatch> {
        Ok(RecordBatch::new_empty(Self::snapshot_schema(
            self.interner.fields(),
            &self.specs,
        )?))
    }

    /// Keeps only `survivors` (ascending), renumbered from 0 in that order.
    fn rebuild(&mut self, survivors: &[usize]) -> Result<()> {
        // One part at a time, each old part dropped before the next is
        // copied: an eviction's peak is the state plus the survivors of its
        // largest part, not plus every survivor twice (which overshot the
        // memory budget by the state's size). A failure leaves the state
        // unusable, which is fine: it stops the query.
        // The allocator is asked to return each freed part at once, else
        // it keeps it for a while and the next part is built beside it.
        let keys = self.interner.keys(survivors)?;
        let freed = self.interner.size();
        self.interner = Interner::new(self.interner.fields())?;
        release_after(freed);
        let mut groups = Vec::with_capacity(survivors.len());
        self.interner.intern(&keys, survivors.len(), &mut groups)?;
        drop(keys);
        for (acc, spec) in self.accs.iter_mut().zip(&self.specs) {
            let state = acc.state(survivors)?;
            let freed = acc.size();
            *acc = create_accumulator(spec)?;
            release_after(freed);
            acc.merge(&state, &groups, survivors.len())?;
        }
        self.visible = survivors.iter().map(|&g| self.visible[g]).collect();
        if let Some(t) = self.max_time.as_mut() {
            *t = survivors.iter().map(|&g| t[g]).collect();
        }
        if let Some(d) = self.dirty.as_mut() {
            d.keep(survivors);
        }
        if let Some(b) = self.backing.as_mut() {
            b.keep(survivors);
        }
        Ok(())
    }
}

/// A state batch of `rows` rows: `columns` cast to `schema`'s types (Arrow
/// would compare the field names and nullability of nested accumulator
/// states too strictly).
pub(crate) fn typed_batch(
    schema: SchemaRef,
    columns: Vec<ArrayRef>,
    rows: usize,
) -> Result<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(c),
            false => arrow::compute::cast(&c, f.data_type()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new_with_options(
        schema,
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}
