//! [`JoinOperator`]: interval and temporal joins of two inputs, emitting
//! each joined row once, when the watermark completes it.
//!
//! A pair is complete when the global watermark passes the later of its
//! two event times: a watermark `w` means every on-time row before `w` has
//! arrived (a row before its own partition's watermark is late and never
//! reaches the join). Each firing emits the pairs completed
//! since the last one, sorted by completion time and then by the bytes of
//! the joined row, so the output is a pure function of the input rows:
//! it depends neither on arrival order, batch boundaries nor how often the
//! watermark fires.
//!
//! State is bounded by the watermark: an interval join drops a row once no
//! future row of the other side can fall inside its bounds; a temporal
//! join keeps, per key, the versions after the watermark plus the one
//! valid at it, and drops stream rows once they fired.
//!
//! Late rows (with a join retention `R`): a stream row up to `R` behind its
//! partition's watermark (its stamp) still joins. Its *effective time* is
//! its stamp, where an on-time row's is its event time; a row fires when
//! the watermark passes its effective time, and a pair is found, and
//! emitted, by the row with the later effective time. Every row whose
//! effective time is before the watermark has been read (a partition's
//! later rows have later stamps), so a late pair comes out at a firing that
//! depends only on the rows' stamps, never on interleaving. Future rows are
//! at most `R` behind the watermark, so state is kept `R` longer: rows
//! until no such row can fall within bounds, versions until the watermark
//! minus `R` has replaced them. Versions themselves are never late: a late
//! version would change pairs already emitted.
//!
//! A LEFT interval join emits a left row that no right row matched (with
//! the residual ON conditions) padded with nulls when it expires: then no
//! right row can match it any more, and its completion is that time.
//!
//! Versions of one key with the same time are ordered by arrival; keep one
//! key's versions in one partition (as a compacted topic keyed by it does).
//! A version may be *absent*: a deletion (a tombstone), or a version the
//! query's filter on the table refuses. It ends the version before it and
//! matches nothing (a LEFT JOIN pads with nulls), so filtering versions
//! before picking one cannot resurrect an older version.
//!
//! A side's rows are a [`SideRows`]. With a state store, a versioned
//! table's keys may leave memory under the budget, and checkpoints write
//! the keys whose versions changed ([`StoredVersions`]); an interval join's
//! fired rows leave memory by key ([`spill`]); a temporal join's stream
//! rows, which wait only until they fire, stay in memory.

mod spill;

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array, new_null_array,
};
use arrow::compute::{
    SortColumn, SortOptions, cast, filter_record_batch, interleave, lexsort_to_indices,
    take_record_batch,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use crate::error::{EngineError, Result};
use crate::operator::eval::{eval_array, eval_predicate};
use crate::operator::join_log::{Logged, RowLog};
use crate::operator::join_rows::{HeldRows, SideRows, pick};
use crate::operator::join_versions::{Bookkeeping, StoredVersions};
use crate::plan::{JoinKind, JoinPlan};
use crate::state::interner::Interner;
use crate::state::keyed::Evicted;
use crate::state::{SharedStore, StateEntry};
use crate::time::{MIN_TIME, to_micros};

/// Stored rows a restore reads from a side's log at a time.
const RESTORE_CHUNK_ROWS: usize = 64 * 1024;

/// Key id of a row with a null key column: it never matches.
pub(super) const NULL_KEY: u32 = u32::MAX;

/// Column holding each stored row's event time in a snapshot.
const TIME_COLUMN: &str = "__ubik_time";

/// Column holding each stored row's effective time (its stamp if it came
/// late) in a snapshot; snapshots written before late rows joined lack it.
const EFFECTIVE_COLUMN: &str = "__ubik_effective";

/// Column holding whether each left row of a LEFT interval join has
/// matched a right row yet, in a snapshot.
const MATCHED_COLUMN: &str = "__ubik_matched";

/// Column holding whether each stored version is present (not a deletion)
/// in a snapshot; snapshots written before deletions existed lack it.
const PRESENT_COLUMN: &str = "__ubik_present";

/// Joined rows of one firing, in emission order, with each row's
/// completion time: the later effective time of its two rows (the later
/// event time, unless one of them came late).
pub struct Joined {
    pub rows: RecordBatch,
    pub completion: Vec<i64>,
}

pub struct JoinOperator {
    plan: JoinPlan,
    /// How far behind its partition's watermark a stream row may still
    /// join: state is kept this much longer.
    retention: i64,
    schema: SchemaRef,
    stores: [SideRows; 2],
    interner: Interner,
    key_types: Vec<DataType>,
    /// The state store behind a temporal join's versioned table, if any.
    versions: Option<StoredVersions>,
    /// Per side, its rows in a durable store (not a versioned table's).
    logs: [Option<RowLog>; 2],
    /// An interval join's sides' rows moved out under the budget ([`spill`]).
    spilled: Option<[StoredVersions; 2]>,
    /// The watermark the join has fired up to: rows with an earlier
    /// effective time fired, rows expiring before it are gone.
    fired_through: i64,
}

impl JoinOperator {
    /// `schema` is the joined schema: the left side's columns, then the
    /// right's; `retention` the join retention (see the module docs). With
    /// `store` (a store and a table name prefix), a versioned table's
    /// versions spill to it and checkpoint their changes there.
    pub fn new(
        plan: &JoinPlan,
        schema: SchemaRef,
        retention: i64,
        store: Option<(&SharedStore, &str)>,
    ) -> Result<Self> {
        let left = &plan.sides[0];
        let key_fields: Vec<Arc<Field>> = left
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                Ok(Arc::new(Field::new(
                    format!("k{i}"),
                    k.data_type(&left.schema)?,
                    true,
                )))
            })
            .collect::<Result<_>>()?;
        let table = table_side(plan.kind);
        let versions = match (table, store) {
            (Some(table), Some((store, path))) => StoredVersions::new(
                store,
                &format!("{path}versions"),
                Arc::clone(&plan.sides[table].schema),
                &key_fields,
                false,
            )?,
            _ => None,
        };
        let pads = plan.left_outer && table.is_none();
        let spilled = match (table, store) {
            (None, Some((store, path))) => {
                let side = |s: usize| {
                    StoredVersions::new(
                        store,
                        &format!("{path}spilled/{s}"),
                        Arc::clone(&plan.sides[s].schema),
                        &key_fields,
                        true,
                    )
                };
                match (side(0)?, side(1)?) {
                    (Some(left), Some(right)) => Some([left, right]),
                    _ => None,
                }
            }
            _ => None,
        };
        let mut logs = [None, None];
        if let Some((store, path)) = store.filter(|(s, _)| s.is_durable()) {
            for (s, log) in logs.iter_mut().enumerate() {
                if Some(s) != table {
                    let name = format!("{path}rows/{s}");
                    *log = Some(RowLog::new(
                        store,
                        &name,
                        &plan.sides[s].schema,
                        pads && s == 0,
                    )?);
                }
            }
        }
        Ok(Self {
            versions,
            logs,
            spilled,
            fired_through: MIN_TIME,
            key_types: key_fields.iter().map(|f| f.data_type().clone()).collect(),
            interner: Interner::new(&key_fields)?,
            stores: [0, 1]
                .map(|s| SideRows::new(Arc::clone(&plan.sides[s].schema), Some(s) == table)),
            plan: plan.clone(),
            retention: retention.max(0),
            schema,
        })
    }

    /// Takes in rows of one side (its schema), with their event times and
    /// stamps (their partition's watermark before them; `None`: on time);
    /// `present` marks absent versions (false) of a versioned table.
    pub fn insert(
        &mut self,
        side: usize,
        rows: RecordBatch,
        times: &[i64],
        stamps: Option<&[i64]>,
        present: Option<&[bool]>,
    ) -> Result<()> {
        let n = rows.num_rows();
        if n == 0 {
            return Ok(());
        }
        let mut key_arrays = Vec::with_capacity(self.key_types.len());
        for (k, ty) in self.plan.sides[side].keys.iter().zip(&self.key_types) {
            let a = eval_array(k.as_ref(), &rows)?;
            key_arrays.push(if a.data_type() == ty {
                a
            } else {
                cast(&a, ty)?
            });
        }
        let mut groups = Vec::with_capacity(n);
        self.interner.intern(&key_arrays, n, &mut groups)?;
        let keys: Vec<u32> = (0..n)
            .map(|i| {
                if key_arrays.iter().any(|a| a.is_null(i)) {
                    NULL_KEY
                } else {
                    groups[i] as u32
                }
            })
            .collect();
        let table = self.table_side();
        self.take_back(&keys)?;
        if let Some(v) = self.versions.as_mut() {
            v.grow(self.interner.len());
            v.touch(&keys);
            if Some(side) == table {
                // A key's stored versions come back before its next one:
                // versions of one time keep their arrival order.
                let unloaded = v.unloaded(keys.iter().copied());
                self.load_versions(&unloaded)?;
                if let Some(v) = self.versions.as_mut() {
                    v.changed(keys.iter().copied());
                }
            }
        }
        let effective: Vec<i64> = match stamps {
            Some(stamps) => times.iter().zip(stamps).map(|(&t, &s)| t.max(s)).collect(),
            None => times.to_vec(),
        };
        let retention = self.retention;
        let until = match self.plan.until {
            Some(b) if b.side == side => Some((to_micros(rows.column(b.column))?, b.offset)),
            _ => None,
        };
        let expiry: Option<Vec<i64>> = match self.plan.kind {
            // A row is needed until it fired and no future row of the
            // other side (none is more than the retention behind the
            // watermark) can be within the bounds.
            JoinKind::Interval { lo, hi } => Some(
                times
                    .iter()
                    .zip(&effective)
                    .enumerate()
                    .map(|(i, (&t, &e))| {
                        let mut bound = if side == 0 {
                            t.saturating_sub(lo)
                        } else {
                            t.saturating_add(hi)
                        };
                        if let Some((column, offset)) = &until {
                            // A null bound matches nothing: done at its time.
                            let limit = column.is_valid(i).then(|| column.value(i));
                            bound = bound.min(limit.map_or(t, |c| c.saturating_add(*offset)));
                        }
                        e.max(bound.saturating_add(retention))
                    })
                    .collect(),
            ),
            JoinKind::Temporal { table } if table != side => Some(effective.clone()),
            JoinKind::Temporal { .. } => None,
        };
        let held = HeldRows {
            rows,
            times: times.to_vec(),
            effective,
            present: present.map_or_else(|| vec![true; n], <[bool]>::to_vec),
        };
        self.stores[side].push(held, &keys, expiry.as_deref());
        Ok(())
    }

    /// The versioned table's side of a temporal join.
    fn table_side(&self) -> Option<usize> {
        table_side(self.plan.kind)
    }

    /// Reads the stored versions of keys `ids` (not in memory) back in.
    fn load_versions(&mut self, ids: &[u32]) -> Result<()> {
        let (Some(table), Some(v)) = (self.table_side(), self.versions.as_mut()) else {
            return Ok(());
        };
        if ids.is_empty() {
            return Ok(());
        }
        let groups: Vec<usize> = ids.iter().map(|&k| k as usize).collect();
        let key_columns = self.interner.keys(&groups)?;
        let loaded = v.load(ids, &key_columns)?;
        let keys: Vec<u32> = loaded.probe.iter().map(|&p| ids[p]).collect();
        self.stores[table].push(loaded.held, &keys, None);
        Ok(())
    }

    /// Writes the versions of keys `ids` to the store; returns the bytes written.
    fn write_versions(&mut self, ids: &[u32]) -> Result<u64> {
        let (Some(table), Some(v)) = (self.table_side(), self.versions.as_mut()) else {
            return Ok(0);
        };
        if ids.is_empty() {
            return Ok(0);
        }
        let store = &self.stores[table];
        let mut entries = Vec::new();
        let mut counts = Vec::with_capacity(ids.len());
        for &k in ids {
            let list = store.by_key.get(k as usize).map_or(&[][..], Vec::as_slice);
            let before = entries.len();
            entries.extend(list.iter().copied().filter(|&e| store.alive[e as usize]));
            counts.push(entries.len() - before);
        }
        let held = store.held(&entries)?;
        let groups: Vec<usize> = ids.iter().map(|&k| k as usize).collect();
        let keys = self.interner.keys(&groups)?;
        v.write(keys, &counts, &held, &Bookkeeping::default())
    }

    /// Writes the versions changed since they were last written.
    fn persist_versions(&mut self) -> Result<u64> {
        let Some(v) = self.versions.as_mut() else {
            return Ok(0);
        };
        let changed = v.take_changed();
        self.write_versions(&changed)
    }

    /// After the state store was restored: keys not in memory may be in
    /// it. An interval join's rows come from its log instead.
    pub fn restored(&mut self) -> Result<()> {
        for s in self.spilled.iter_mut().flatten() {
            s.clear()?;
        }
        match self.versions.as_mut() {
            Some(v) => v.restored(),
            None => Ok(()),
        }
    }

    /// Bytes of the state [`Self::spill`] can move: a versioned table's,
    /// or an interval join's rows.
    pub fn spillable(&self) -> usize {
        if let Some(spilled) = &self.spilled {
            let sides: usize = self.stores.iter().map(SideRows::size).sum();
            return sides + spilled.iter().map(StoredVersions::size).sum::<usize>();
        }
        match (self.table_side(), &self.versions) {
            (Some(table), Some(v)) => self.stores[table].size() + v.size(),
            _ => 0,
        }
    }

    /// Moves the least recently used keys' versions to the store until
    /// about `target` bytes of the versioned table are held, writing those
    /// changed since they were last written.
    pub fn spill(&mut self, target: usize) -> Result<Evicted> {
        if self.spilled.is_some() {
            return self.spill_rows(target);
        }
        let held = self.spillable();
        let (Some(table), Some(v)) = (self.table_side(), self.versions.as_ref()) else {
            return Ok(Evicted::default());
        };
        if held <= target {
            return Ok(Evicted::default());
        }
        let store = &self.stores[table];
        let candidates: Vec<u32> = (0..store.by_key.len() as u32)
            .filter(|&k| !store.by_key[k as usize].is_empty())
            .collect();
        let keep = (candidates.len() as f64 * (target as f64 / held as f64)) as usize;
        let victims = v.victims(&candidates, keep);
        let written: Vec<u32> = victims
            .iter()
            .copied()
            .filter(|&k| v.is_changed(k))
            .collect();
        let bytes_written = self.write_versions(&written)?;
        for &k in &victims {
            self.stores[table].forget_key(k);
        }
        if let Some(v) = self.versions.as_mut() {
            v.evicted(&victims);
        }
        self.stores[table].compact_now()?;
        Ok(Evicted {
            groups: victims.len(),
            written: written.len(),
            bytes_written,
        })
    }

    /// After a restore from a durable store: reads back the rows the sides
    /// held at the checkpoint, whose watermark was `watermark`, and marks
    /// those before it fired. With a `memory` budget, an interval join
    /// spills as it reads, so it never holds much more than the budget.
    pub fn read_logs(&mut self, watermark: i64, memory: Option<usize>) -> Result<()> {
        for side in 0..2 {
            let Some(mut log) = self.logs[side].take() else {
                continue;
            };
            let read = log.read(watermark, RESTORE_CHUNK_ROWS, |logged| {
                self.restore_logged(side, logged, watermark, memory)
            });
            // Numbers below the log's next are taken by stored rows: a row
            // numbered among them would never be written.
            let rows = &mut self.stores[side];
            rows.next_seq = rows.next_seq.max(log.next_seq());
            self.logs[side] = Some(log);
            read?;
        }
        Ok(())
    }

    /// Takes in rows of `side` read back from its log.
    fn restore_logged(
        &mut self,
        side: usize,
        logged: Logged,
        watermark: i64,
        memory: Option<usize>,
    ) -> Result<()> {
        let HeldRows {
            rows,
            times,
            effective,
            present,
        } = logged.held;
        // Effective times stand in for stamps: the later of a row's time
        // and its stamp is its effective time.
        self.insert(side, rows, &times, Some(&effective), Some(&present))?;
        let rows = &mut self.stores[side];
        // The rows are the last ones in: a key an earlier chunk spilled came
        // back before them.
        let first = rows.seq.len() - logged.seq.len();
        rows.seq[first..].copy_from_slice(&logged.seq);
        rows.matched[first..].copy_from_slice(&logged.matched);
        rows.next_seq = rows.next_seq.max(logged.seq.last().map_or(0, |s| s + 1));
        // Emitted before the checkpoint.
        rows.take_fresh(watermark);
        self.fired_through = self.fired_through.max(watermark);
        if let Some(budget) = memory.filter(|&b| self.spillable() > b) {
            self.spill_rows(budget / 10 * 6)?;
        }
        Ok(())
    }

    /// Marks every row before `watermark` as fired without emitting
    /// (after a restore: those rows were emitted before the checkpoint).
    pub fn skip_fired(&mut self, watermark: i64) {
        for s in &mut self.stores {
            s.take_fresh(watermark);
        }
        self.fired_through = self.fired_through.max(watermark);
    }

    /// The watermark advanced to `watermark`: the pairs it completes.
    pub fn fire(&mut self, watermark: i64) -> Result<Option<Joined>> {
        let mut pairs: Vec<(u32, Option<u32>, i64)> = Vec::new();
        match self.plan.kind {
            JoinKind::Interval { lo, hi } => self.interval_pairs(watermark, lo, hi, &mut pairs),
            JoinKind::Temporal { table } => {
                let fresh = self.stores[1 - table].take_fresh(watermark);
                if let Some(v) = &self.versions {
                    // A probed key's versions come back before it is probed.
                    let keys = &self.stores[1 - table].keys;
                    let unloaded = v.unloaded(fresh.iter().map(|&e| keys[e as usize]));
                    self.load_versions(&unloaded)?;
                }
                self.temporal_pairs(&fresh, watermark, table, &mut pairs)
            }
        }
        let mut parts = Vec::with_capacity(2);
        if let Some(part) = self.matching(&pairs)? {
            parts.push(part);
        }
        if self.pads() {
            // Left rows that can match nothing any more, unmatched: padded.
            let mut unmatched = Vec::new();
            self.stores[0].expire(watermark, Some(&mut unmatched));
            let padded: Vec<(u32, Option<u32>, i64)> =
                unmatched.into_iter().map(|(e, x)| (e, None, x)).collect();
            if !padded.is_empty() {
                let completion = padded.iter().map(|p| p.2).collect();
                parts.push((self.joined_rows(&padded)?, completion));
            }
        }
        let out = self.emit(parts)?;
        self.fired_through = self.fired_through.max(watermark);
        self.expire_spilled(watermark)?;
        for s in 0..2 {
            self.stores[s].expire(watermark, None);
            if let Some(log) = self.logs[s].as_mut() {
                log.expired(watermark);
            }
        }
        if let JoinKind::Temporal { table } = self.plan.kind {
            // A future stream row is at most the retention behind.
            self.drop_old_versions(table, watermark.saturating_sub(self.retention));
        }
        for s in &mut self.stores {
            s.compact()?;
        }
        self.compact_keys()?;
        Ok(out)
    }

    /// Forgets the join keys no stored row holds any more, when they are
    /// most of the interned ones: a stream's keys come and go (Nexmark q7
    /// joins on prices), and the interner would otherwise grow forever.
    fn compact_keys(&mut self) -> Result<()> {
        let live: usize = self.stores.iter().map(|s| s.live).sum();
        let interned = self.interner.len();
        if interned < 4096 || interned < 2 * live {
            return Ok(());
        }
        // Keys still held, numbered anew in order of first holder.
        let mut renumber = vec![NULL_KEY; interned];
        let mut kept: Vec<usize> = Vec::new();
        for store in &self.stores {
            for (e, &k) in store.keys.iter().enumerate() {
                if store.alive[e] && k != NULL_KEY && renumber[k as usize] == NULL_KEY {
                    renumber[k as usize] = kept.len() as u32;
                    kept.push(k as usize);
                }
            }
        }
        if let Some(v) = &self.versions {
            // A key whose versions were all dropped still owes its write.
            for k in 0..interned as u32 {
                if v.is_changed(k) && renumber[k as usize] == NULL_KEY {
                    renumber[k as usize] = kept.len() as u32;
                    kept.push(k as usize);
                }
            }
        }
        let values = self.interner.keys(&kept)?;
        let mut fresh = Interner::new(self.interner.fields())?;
        let mut groups = Vec::with_capacity(kept.len());
        fresh.intern(&values, kept.len(), &mut groups)?;
        debug_assert!(groups.iter().enumerate().all(|(i, &g)| i == g));
        self.interner = fresh;
        for store in &mut self.stores {
            store.rekey(&renumber);
        }
        if let Some(v) = self.versions.as_mut() {
            v.renumber(&renumber, kept.len());
        }
        for s in self.spilled.iter_mut().flatten() {
            s.renumber(&renumber, kept.len());
        }
        Ok(())
    }

    /// Pairs as (left entry, right entry, completion).
    fn interval_pairs(
        &mut self,
        wm: i64,
        lo: i64,
        hi: i64,
        pairs: &mut Vec<(u32, Option<u32>, i64)>,
    ) {
        let fresh = [self.stores[0].take_fresh(wm), self.stores[1].take_fresh(wm)];
        // Without a retention no row is late: effective times are event
        // times, and the later one is the sign of their difference.
        let late = self.retention > 0;
        let [l, r] = &self.stores;
        // Each pair once: by its left row when that has the later (or
        // equal) effective time, else by its right row. The other row has
        // been read by then, and is alive (see the module docs).
        for &a in &fresh[0] {
            let (ta, ea, k) = (
                l.times[a as usize],
                l.effective[a as usize],
                l.keys[a as usize],
            );
            for &b in r.by_key.get(k as usize).map_or(&[][..], Vec::as_slice) {
                let d = ta.saturating_sub(r.times[b as usize]);
                let earlier = if late {
                    r.effective[b as usize] <= ea
                } else {
                    d >= 0
                };
                if r.alive[b as usize] && earlier && d >= lo && d <= hi {
                    pairs.push((a, Some(b), ea));
                }
            }
        }
        for &b in &fresh[1] {
            let (tb, eb, k) = (
                r.times[b as usize],
                r.effective[b as usize],
                r.keys[b as usize],
            );
            for &a in l.by_key.get(k as usize).map_or(&[][..], Vec::as_slice) {
                let d = l.times[a as usize].saturating_sub(tb);
                let earlier = if late {
                    l.effective[a as usize] < eb
                } else {
                    d < 0
                };
                if l.alive[a as usize] && earlier && d >= lo && d <= hi {
                    pairs.push((a, Some(b), eb));
                }
            }
        }
    }

    /// Pairs of the stream rows `fresh` (their effective time just passed)
    /// with the version valid at each one's time.
    fn temporal_pairs(
        &mut self,
        fresh: &[u32],
        wm: i64,
        table: usize,
        pairs: &mut Vec<(u32, Option<u32>, i64)>,
    ) {
        let stream = 1 - table;
        self.stores[table].take_fresh(wm);
        let (s, t) = (&self.stores[stream], &self.stores[table]);
        for &a in fresh {
            let (ta, k) = (s.times[a as usize], s.keys[a as usize]);
            // A late stream row comes out at its stamp.
            let ea = s.effective[a as usize];
            let mut best: Option<u32> = None;
            for &v in t.by_key.get(k as usize).map_or(&[][..], Vec::as_slice) {
                let tv = t.times[v as usize];
                if t.alive[v as usize] && tv <= ta && best.is_none_or(|b| tv >= t.times[b as usize])
                {
                    best = Some(v);
                }
            }
            let best = best.filter(|&v| t.present[v as usize]);
            match (best, stream) {
                (Some(v), 0) => pairs.push((a, Some(v), ea)),
                (Some(v), _) => pairs.push((v, Some(a), ea)),
                (None, 0) if self.plan.left_outer => pairs.push((a, None, ea)),
                (None, _) => {}
            }
        }
    }

    /// Per key, drops the table's versions that the watermark has replaced:
    /// all but the latest before it (and every later one).
    fn drop_old_versions(&mut self, table: usize, wm: i64) {
        let SideRows {
            by_key,
            versioned,
            supersede,
            alive,
            times,
            live,
            ..
        } = &mut self.stores[table];
        if !*versioned {
            return;
        }
        let mut due = Vec::new();
        supersede.pop_before(wm, |_, k| due.push(k));
        due.sort_unstable();
        due.dedup();
        let mut changed = Vec::new();
        for k in due {
            let Some(list) = by_key.get_mut(k as usize) else {
                continue;
            };
            let mut latest: Option<u32> = None;
            let mut dropped = false;
            for &v in list.iter() {
                let i = v as usize;
                if !alive[i] || times[i] >= wm {
                    continue;
                }
                let old = match latest {
                    Some(b) if times[i] >= times[b as usize] => {
                        latest = Some(v);
                        b
                    }
                    Some(_) => v,
                    None => {
                        latest = Some(v);
                        continue;
                    }
                };
                alive[old as usize] = false;
                *live -= 1;
                dropped = true;
            }
            if dropped {
                list.retain(|&v| alive[v as usize]);
                changed.push(k);
            }
        }
        if let Some(v) = self.versions.as_mut() {
            v.changed(changed);
        }
    }

    /// A LEFT interval join pads unmatched left rows with nulls.
    fn pads(&self) -> bool {
        self.plan.left_outer && matches!(self.plan.kind, JoinKind::Interval { .. })
    }

    /// The joined rows of `pairs` that pass the residual condition, with
    /// their completion times; marks their left rows matched.
    fn matching(
        &mut self,
        pairs: &[(u32, Option<u32>, i64)],
    ) -> Result<Option<(RecordBatch, Vec<i64>)>> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let mut rows = self.joined_rows(pairs)?;
        let mut completion: Vec<i64> = pairs.iter().map(|p| p.2).collect();
        let keep = match &self.plan.condition {
            Some(cond) => Some(eval_predicate(cond.as_ref(), &rows)?),
            None => None,
        };
        if self.pads() {
            let store = &mut self.stores[0];
            for (i, p) in pairs.iter().enumerate() {
                let e = p.0 as usize;
                if keep.as_ref().is_none_or(|k| k.value(i)) && p.1.is_some() && !store.matched[e] {
                    store.matched[e] = true;
                    if let Some(log) = self.logs[0].as_mut() {
                        log.matched(store.seq[e], store.expires[e]);
                    }
                }
            }
        }
        if let Some(keep) = keep {
            rows = filter_record_batch(&rows, &keep)?;
            completion = completion
                .iter()
                .enumerate()
                .filter(|(i, _)| keep.value(*i))
                .map(|(_, &c)| c)
                .collect();
        }
        Ok((rows.num_rows() > 0).then_some((rows, completion)))
    }

    /// The rows of one firing, sorted by (completion, row bytes).
    fn emit(&self, parts: Vec<(RecordBatch, Vec<i64>)>) -> Result<Option<Joined>> {
        let (rows, completion) = match parts.len() {
            0 => return Ok(None),
            1 => parts.into_iter().next().expect("one part"),
            _ => {
                let batches: Vec<&RecordBatch> = parts.iter().map(|p| &p.0).collect();
                let rows = arrow::compute::concat_batches(&self.schema, batches)?;
                (
                    rows,
                    parts.iter().flat_map(|p| p.1.iter().copied()).collect(),
                )
            }
        };
        let order = emission_order(&rows, &completion)?;
        let rows = take_record_batch(&rows, &UInt32Array::from(order.clone()))?;
        let completion = order.iter().map(|&i| completion[i as usize]).collect();
        Ok(Some(Joined { rows, completion }))
    }

    /// The joined rows of `pairs` (a missing right entry: nulls).
    fn joined_rows(&self, pairs: &[(u32, Option<u32>, i64)]) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (side, store) in self.stores.iter().enumerate() {
            // The right side's null row (LEFT JOIN) is one extra batch.
            let nulls: Vec<ArrayRef> = store
                .schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), 1))
                .collect();
            let null_batch = store.batches.len();
            let idx: Vec<(usize, usize)> = pairs
                .iter()
                .map(|&(a, b, _)| {
                    let e = if side == 0 { Some(a) } else { b };
                    match e {
                        Some(e) => {
                            let (b, r) = store.at[e as usize];
                            (b as usize, r as usize)
                        }
                        None => (null_batch, 0),
                    }
                })
                .collect();
            for (c, null) in nulls.iter().enumerate() {
                let mut arrays: Vec<&dyn Array> =
                    store.batches.iter().map(|b| b.column(c).as_ref()).collect();
                arrays.push(null.as_ref());
                columns.push(interleave(&arrays, &idx)?);
            }
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Both sides' stored rows, each with its event time. With a durable
    /// store, a versioned table's changed versions are written there
    /// instead: the checkpoint refers to the store's files.
    pub fn snapshot(&mut self) -> Result<Vec<(StateEntry, RecordBatch)>> {
        let table = self.table_side();
        let mut out = Vec::with_capacity(2);
        for side in 0..2 {
            let entry = StateEntry::JoinSide(side as u8);
            if let Some(log) = self.logs[side].as_mut() {
                log.checkpoint(&self.stores[side])?;
                continue;
            }
            if let (true, Some(v)) = (Some(side) == table, &self.versions) {
                if v.durable() {
                    self.persist_versions()?;
                    continue;
                }
                if v.cold() {
                    out.push((entry, self.all_versions(side)?));
                    continue;
                }
            }
            let spilled = self.spilled_rows(side)?;
            let store = &self.stores[side];
            let picked = store.alive_entries();
            let mut held = vec![store.held(&picked)?];
            let mut matched = pick(&store.matched, &picked);
            for (rows, m) in spilled {
                held.push(rows);
                matched.extend(m);
            }
            let held = match held.len() {
                1 => held.pop().expect("one part"),
                _ => HeldRows::concat(&store.schema, held)?,
            };
            let matched = (self.pads() && side == 0).then_some(matched);
            out.push((entry, side_batch(held, matched)?));
        }
        Ok(out)
    }

    /// Every version of the table on `side`, those in the store too (after
    /// writing the changed ones there), as a snapshot batch.
    fn all_versions(&mut self, side: usize) -> Result<RecordBatch> {
        self.persist_versions()?;
        let store = &self.stores[side];
        // Versions with a null key are never stored (they match nothing).
        let unkeyed: Vec<u32> = (0..store.keys.len() as u32)
            .filter(|&e| store.alive[e as usize] && store.keys[e as usize] == NULL_KEY)
            .collect();
        let mut parts = vec![store.held(&unkeyed)?];
        let v = self.versions.as_mut().expect("cold versions have a store");
        v.scan(|loaded| {
            parts.push(loaded.held);
            Ok(())
        })?;
        side_batch(HeldRows::concat(&self.stores[side].schema, parts)?, None)
    }

    /// Restores the stored rows of one side from [`Self::snapshot`].
    pub fn restore(&mut self, side: usize, batch: RecordBatch) -> Result<()> {
        // Bookkeeping columns trail the rows' own: [.., matched?, effective?,
        // present?, time]; older snapshots lack the optional ones.
        let mut end = batch.num_columns();
        let mut trailing = |name: &str| {
            let found = end > 0 && batch.schema().field(end - 1).name() == name;
            found.then(|| {
                end -= 1;
                batch.column(end).clone()
            })
        };
        let bad =
            |what: &str| EngineError::Checkpoint(format!("join state with a bad {what} column"));
        let times = trailing(TIME_COLUMN).ok_or_else(|| bad("time"))?;
        let present = trailing(PRESENT_COLUMN);
        let effective = trailing(EFFECTIVE_COLUMN);
        let matched = trailing(MATCHED_COLUMN);
        let int64 = |a: &ArrayRef, what: &str| -> Result<Vec<i64>> {
            let a = a
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| bad(what))?;
            Ok(a.values().to_vec())
        };
        let flags = |a: &ArrayRef, what: &str, null: bool| -> Result<Vec<bool>> {
            let a = a.as_boolean_opt().ok_or_else(|| bad(what))?;
            Ok(a.iter().map(|f| f.unwrap_or(null)).collect())
        };
        let times = int64(&times, "time")?;
        let present = present.map(|a| flags(&a, "presence", true)).transpose()?;
        let effective = effective.map(|a| int64(&a, "effective-time")).transpose()?;
        let matched = matched.map(|a| flags(&a, "matched", false)).transpose()?;
        let rows = RecordBatch::try_new_with_options(
            Arc::clone(&self.stores[side].schema),
            batch.columns()[..end].to_vec(),
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        self.insert(side, rows, &times, effective.as_deref(), present.as_deref())?;
        if let Some(matched) = matched {
            // The rows are the last ones in (after any a spill gave back).
            let all = &mut self.stores[side].matched;
            let first = all.len() - matched.len();
            all[first..].copy_from_slice(&matched);
        }
        Ok(())
    }

    pub fn state_size(&self) -> usize {
        self.stores.iter().map(SideRows::size).sum::<usize>()
            + self.interner.size()
            + self.versions.as_ref().map_or(0, StoredVersions::size)
    }

    pub fn state_rows(&self) -> usize {
        self.stores.iter().map(|s| s.live).sum()
    }
}

/// The versioned table's side of a temporal join of `kind`.
fn table_side(kind: JoinKind) -> Option<usize> {
    match kind {
        JoinKind::Temporal { table } => Some(table),
        JoinKind::Interval { .. } => None,
    }
}

/// A snapshot batch of one side's rows: their columns, then the
/// bookkeeping columns [matched?, effective?, present, time].
fn side_batch(held: HeldRows, matched: Option<Vec<bool>>) -> Result<RecordBatch> {
    let n = held.rows.num_rows();
    let mut fields = held.rows.schema().fields().to_vec();
    let mut columns = held.rows.columns().to_vec();
    let mut add = |name: &str, column: ArrayRef| {
        fields.push(Arc::new(Field::new(
            name,
            column.data_type().clone(),
            false,
        )));
        columns.push(column);
    };
    if let Some(matched) = matched {
        add(MATCHED_COLUMN, Arc::new(BooleanArray::from(matched)));
    }
    // Written only when a row came late: on-time rows need none.
    if held.effective != held.times {
        add(EFFECTIVE_COLUMN, Arc::new(Int64Array::from(held.effective)));
    }
    add(PRESENT_COLUMN, Arc::new(BooleanArray::from(held.present)));
    add(TIME_COLUMN, Arc::new(Int64Array::from(held.times)));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
    )?)
}

/// The order rows are emitted in: by completion time, rows completing
/// at the same time by their columns in order (ascending, nulls first:
/// the order of their bytes in Arrow's row format). Columns after the
/// first that tells two rows apart are not read, so the long text of
/// rows told apart by an id or a time is never compared.
fn emission_order(rows: &RecordBatch, completion: &[i64]) -> Result<Vec<u32>> {
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_by_key(|&i| completion[i as usize]);
    if !order
        .windows(2)
        .any(|w| completion[w[0] as usize] == completion[w[1] as usize])
    {
        return Ok(order);
    }
    let mut columns = vec![SortColumn {
        values: Arc::new(Int64Array::from(completion.to_vec())) as ArrayRef,
        options: None,
    }];
    columns.extend(rows.columns().iter().map(|c| SortColumn {
        values: Arc::clone(c),
        options: Some(SortOptions {
            descending: false,
            nulls_first: true,
        }),
    }));
    match lexsort_to_indices(&columns, None) {
        Ok(sorted) => Ok(sorted.values().to_vec()),
        // A column type without a comparator: its rows' bytes.
        Err(_) => emission_order_by_bytes(rows, order, completion),
    }
}

/// [`emission_order`] by encoding the tied rows whole.
fn emission_order_by_bytes(
    rows: &RecordBatch,
    mut order: Vec<u32>,
    completion: &[i64],
) -> Result<Vec<u32>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let t = completion[order[start] as usize];
        let end = start
            + order[start..]
                .iter()
                .take_while(|&&i| completion[i as usize] == t)
                .count();
        if end - start > 1 {
            runs.push(start..end);
        }
        start = end;
    }
    let tied: Vec<u32> = runs
        .iter()
        .flat_map(|r| order[r.clone()].to_vec())
        .collect();
    let tied_rows = take_record_batch(rows, &UInt32Array::from(tied.clone()))?;
    let converter = RowConverter::new(
        rows.schema()
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect(),
    )?;
    let bytes = converter.convert_columns(tied_rows.columns())?;
    let mut first = 0;
    for run in runs {
        let mut slots: Vec<usize> = (first..first + run.len()).collect();
        slots.sort_unstable_by(|&a, &b| bytes.row(a).cmp(&bytes.row(b)));
        for (k, slot) in slots.into_iter().enumerate() {
            order[run.start + k] = tied[slot];
        }
        first += run.len();
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, StringArray};

    /// The column-by-column order is the order of the rows' bytes, on ties
    /// of every kind: equal times, nulls, -0.0 and NaN, prefixes of text.
    #[test]
    fn emission_order_is_the_order_of_row_bytes() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..200 {
            let n = 1 + next(60) as usize;
            let completion: Vec<i64> = (0..n).map(|_| next(4) as i64).collect();
            let ids = Int64Array::from_iter((0..n).map(|_| (next(5) > 0).then(|| next(3) as i64)));
            let floats = Float64Array::from_iter((0..n).map(|_| match next(6) {
                0 => None,
                1 => Some(-0.0),
                2 => Some(f64::NAN),
                3 => Some(0.0),
                _ => Some(next(3) as f64 - 1.0),
            }));
            let words = ["", "a", "ab", "b", "abc"];
            let text = StringArray::from_iter(
                (0..n).map(|_| (next(6) > 0).then(|| words[next(5) as usize])),
            );
            let schema = Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("x", DataType::Float64, true),
                Field::new("t", DataType::Utf8, true),
            ]));
            let rows = RecordBatch::try_new(
                schema,
                vec![Arc::new(ids), Arc::new(floats), Arc::new(text)],
            )
            .unwrap();
            let mut by_key: Vec<u32> = (0..n as u32).collect();
            by_key.sort_by_key(|&i| completion[i as usize]);
            let bytes = emission_order_by_bytes(&rows, by_key, &completion).unwrap();
            let columns = emission_order(&rows, &completion).unwrap();
            // Rows equal in every column may stand in either order.
            let key = |i: u32| {
                let converter = RowConverter::new(
                    rows.schema()
                        .fields()
                        .iter()
                        .map(|f| SortField::new(f.data_type().clone()))
                        .collect(),
                )
                .unwrap();
                let r = converter
                    .convert_columns(rows.slice(i as usize, 1).columns())
                    .unwrap();
                (completion[i as usize], r.row(0).as_ref().to_vec())
            };
            let a: Vec<_> = bytes.iter().map(|&i| key(i)).collect();
            let b: Vec<_> = columns.iter().map(|&i| key(i)).collect();
            assert_eq!(a, b);
        }
    }
}
