//! [`SideRows`]: the rows one side of a join holds, in arrival order,
//! indexed by join key, with the queues that say when each fires, expires
//! or (a versioned table's) may have been replaced.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch, new_null_array};
use arrow::compute::interleave;
use arrow::datatypes::SchemaRef;

use super::join::NULL_KEY;
use super::join_versions::Bookkeeping;
use super::time_queue::TimeQueue;
use crate::error::Result;

/// Rows of a side with what each needs besides its columns: its time,
/// effective time and presence (as a snapshot, the store or a restore
/// carries them).
pub(super) struct HeldRows {
    pub rows: RecordBatch,
    pub times: Vec<i64>,
    pub effective: Vec<i64>,
    pub present: Vec<bool>,
}

impl HeldRows {
    /// No rows of `schema`.
    pub(super) fn empty(schema: SchemaRef) -> Self {
        Self {
            rows: RecordBatch::new_empty(schema),
            times: Vec::new(),
            effective: Vec::new(),
            present: Vec::new(),
        }
    }

    /// `parts` one after the other.
    pub(super) fn concat(schema: &SchemaRef, parts: Vec<HeldRows>) -> Result<Self> {
        let batches: Vec<&RecordBatch> = parts.iter().map(|p| &p.rows).collect();
        let rows = arrow::compute::concat_batches(schema, batches)?;
        let mut all = HeldRows::empty(Arc::clone(schema));
        all.rows = rows;
        for p in parts {
            all.times.extend(p.times);
            all.effective.extend(p.effective);
            all.present.extend(p.present);
        }
        Ok(all)
    }
}

/// Per entry of `entries`, its value in `of` (a per-entry vector).
pub(super) fn pick<T: Copy>(of: &[T], entries: &[u32]) -> Vec<T> {
    entries.iter().map(|&e| of[e as usize]).collect()
}

/// The rows one side holds, in arrival order.
pub(super) struct SideRows {
    pub(super) schema: SchemaRef,
    pub(super) batches: Vec<RecordBatch>,
    pub(super) at: Vec<(u32, u32)>,
    pub(super) times: Vec<i64>,
    /// When each entry fires: its time, or its stamp if it came late.
    pub(super) effective: Vec<i64>,
    pub(super) keys: Vec<u32>,
    pub(super) alive: Vec<bool>,
    /// False for an absent version (a deletion, or refused by the filter).
    pub(super) present: Vec<bool>,
    /// Whether a right row has matched the entry (a LEFT interval join's left side).
    pub(super) matched: Vec<bool>,
    pub(super) live: usize,
    /// Entries by key id (ids are dense).
    pub(super) by_key: Vec<Vec<u32>>,
    /// A versioned table: per key, versions the watermark has replaced are dropped.
    pub(super) versioned: bool,
    /// For a versioned table: (a version's time, its key) for keys holding
    /// more than one version; once the watermark passes that time, the key
    /// may hold a replaced version. Only those keys are visited.
    pub(super) supersede: TimeQueue,
    /// Entries the watermark has not passed yet, by time.
    pub(super) unfired: TimeQueue,
    /// Entries by the watermark at which they can be dropped.
    pub(super) expiry: TimeQueue,
    /// Each entry's expiry (`i64::MAX`: none).
    pub(super) expires: Vec<i64>,
    /// Each entry's sequence number: its place in the order rows arrived,
    /// kept through compactions and restores (a row's key in the store).
    pub(super) seq: Vec<u64>,
    pub(super) next_seq: u64,
}

impl SideRows {
    pub(super) fn new(schema: SchemaRef, versioned: bool) -> Self {
        Self {
            schema,
            batches: Vec::new(),
            at: Vec::new(),
            times: Vec::new(),
            effective: Vec::new(),
            keys: Vec::new(),
            alive: Vec::new(),
            present: Vec::new(),
            matched: Vec::new(),
            live: 0,
            by_key: Vec::new(),
            versioned,
            supersede: TimeQueue::default(),
            unfired: TimeQueue::default(),
            expiry: TimeQueue::default(),
            expires: Vec::new(),
            seq: Vec::new(),
            next_seq: 0,
        }
    }

    /// Takes in `held`, whose join keys are `keys`, expiring at `expiry`
    /// (never, without one).
    pub(super) fn push(&mut self, held: HeldRows, keys: &[u32], expiry: Option<&[i64]>) {
        self.push_rows(held, keys, expiry, true);
    }

    /// Takes back rows that fired before they went to the state store,
    /// with their bookkeeping: they wait for their expiry only.
    pub(super) fn push_fired(&mut self, held: HeldRows, keys: &[u32], kept: Bookkeeping) {
        let (first, next_seq) = (self.at.len(), self.next_seq);
        self.push_rows(held, keys, Some(&kept.expires), false);
        self.next_seq = next_seq;
        self.seq[first..].copy_from_slice(&kept.seq);
        self.matched[first..].copy_from_slice(&kept.matched);
    }

    fn push_rows(&mut self, held: HeldRows, keys: &[u32], expiry: Option<&[i64]>, unfired: bool) {
        let HeldRows {
            rows,
            times,
            effective,
            present,
        } = held;
        let b = self.batches.len() as u32;
        for (i, (&t, &k)) in times.iter().zip(keys).enumerate() {
            let e = self.at.len() as u32;
            self.at.push((b, i as u32));
            self.times.push(t);
            self.effective.push(effective[i]);
            self.keys.push(k);
            self.alive.push(true);
            self.present.push(present[i]);
            self.matched.push(false);
            if k != NULL_KEY {
                if self.by_key.len() <= k as usize {
                    self.by_key.resize_with(k as usize + 1, Vec::new);
                }
                let list = &mut self.by_key[k as usize];
                list.push(e);
                if self.versioned && list.len() > 1 {
                    if list.len() == 2 {
                        let first = list[0] as usize;
                        self.supersede.push(self.times[first], k);
                    }
                    self.supersede.push(t, k);
                }
            }
            if unfired {
                self.unfired.push(effective[i], e);
            }
            if let Some(x) = expiry {
                self.expiry.push(x[i], e);
            }
            self.expires.push(expiry.map_or(i64::MAX, |x| x[i]));
            self.seq.push(self.next_seq);
            self.next_seq += 1;
        }
        self.live += times.len();
        self.batches.push(rows);
    }

    /// Entries whose effective time the watermark has now passed (is
    /// above), in that order.
    pub(super) fn take_fresh(&mut self, watermark: i64) -> Vec<u32> {
        let mut fresh = Vec::new();
        self.unfired.pop_before(watermark, |_, e| fresh.push(e));
        fresh
    }

    /// Drops the entries whose expiry the watermark has passed; with
    /// `unmatched`, collects those no row matched, with their expiry.
    pub(super) fn expire(&mut self, watermark: i64, mut unmatched: Option<&mut Vec<(u32, i64)>>) {
        let SideRows {
            expiry,
            alive,
            live,
            matched,
            ..
        } = self;
        expiry.pop_before(watermark, |x, e| {
            if std::mem::replace(&mut alive[e as usize], false) {
                *live -= 1;
                if let Some(u) = unmatched.as_deref_mut().filter(|_| !matched[e as usize]) {
                    u.push((e, x));
                }
            }
        });
    }

    /// The alive entries, in arrival order.
    pub(super) fn alive_entries(&self) -> Vec<u32> {
        (0..self.at.len() as u32)
            .filter(|&e| self.alive[e as usize])
            .collect()
    }

    /// The rows of `entries`, in that order, with their times and presence.
    pub(super) fn held(&self, entries: &[u32]) -> Result<HeldRows> {
        Ok(HeldRows {
            rows: self.gather(entries)?,
            times: pick(&self.times, entries),
            effective: pick(&self.effective, entries),
            present: pick(&self.present, entries),
        })
    }

    /// The rows of `entries`, in that order, as one batch.
    fn gather(&self, entries: &[u32]) -> Result<RecordBatch> {
        let idx: Vec<(usize, usize)> = entries
            .iter()
            .map(|&e| {
                let (b, r) = self.at[e as usize];
                (b as usize, r as usize)
            })
            .collect();
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for c in 0..self.schema.fields().len() {
            let arrays: Vec<&dyn Array> =
                self.batches.iter().map(|b| b.column(c).as_ref()).collect();
            columns.push(if arrays.is_empty() {
                new_null_array(self.schema.field(c).data_type(), 0)
            } else {
                interleave(&arrays, &idx)?
            });
        }
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(idx.len())),
        )?)
    }

    /// Drops key `k`'s entries (they went to the state store).
    pub(super) fn forget_key(&mut self, k: u32) {
        let Some(list) = self.by_key.get_mut(k as usize) else {
            return;
        };
        for e in list.drain(..) {
            if std::mem::replace(&mut self.alive[e as usize], false) {
                self.live -= 1;
            }
        }
    }

    /// Rewrites the store with its alive rows only, when most are dead.
    pub(super) fn compact(&mut self) -> Result<()> {
        let dead = self.at.len() - self.live;
        if dead < 4096 || dead < self.live {
            return Ok(());
        }
        self.compact_now()
    }

    /// Rewrites the store with its alive rows only.
    pub(super) fn compact_now(&mut self) -> Result<()> {
        if self.live == self.at.len() {
            return Ok(());
        }
        let picked = self.alive_entries();
        let held = self.held(&picked)?;
        let mut renumber = vec![u32::MAX; self.at.len()];
        for (new, &old) in picked.iter().enumerate() {
            renumber[old as usize] = new as u32;
        }
        let keys = pick(&self.keys, &picked);
        let matched = pick(&self.matched, &picked);
        let expires = pick(&self.expires, &picked);
        let seq = pick(&self.seq, &picked);
        let next_seq = self.next_seq;
        let mut unfired = std::mem::take(&mut self.unfired);
        let mut expiry = std::mem::take(&mut self.expiry);
        let kept = |e: u32| Some(renumber[e as usize]).filter(|&n| n != u32::MAX);
        unfired.renumber(kept);
        expiry.renumber(kept);
        let schema = Arc::clone(&self.schema);
        *self = SideRows::new(schema, self.versioned);
        self.push(held, &keys, None);
        self.matched = matched;
        self.unfired = unfired;
        self.expiry = expiry;
        self.expires = expires;
        self.seq = seq;
        self.next_seq = next_seq;
        Ok(())
    }

    pub(super) fn size(&self) -> usize {
        self.batches
            .iter()
            .map(|b| b.get_array_memory_size())
            .sum::<usize>()
            + self.at.len() * 58
            + self.by_key.len() * std::mem::size_of::<Vec<u32>>()
    }

    /// Gives the alive entries their keys' new ids (`renumber[old]`); dead
    /// entries, never read again, lose theirs.
    pub(super) fn rekey(&mut self, renumber: &[u32]) {
        let kept = renumber.iter().filter(|&&n| n != NULL_KEY).count();
        let mut by_key: Vec<Vec<u32>> = vec![Vec::new(); kept];
        for (e, k) in self.keys.iter_mut().enumerate() {
            *k = match (*k, self.alive[e]) {
                (old, true) if old != NULL_KEY => renumber[old as usize],
                _ => NULL_KEY,
            };
            if *k != NULL_KEY {
                by_key[*k as usize].push(e as u32);
            }
        }
        // Keys are renumbered: every key with several versions is visited
        // at the next firing.
        self.supersede = TimeQueue::default();
        if self.versioned {
            for (k, list) in by_key.iter().enumerate() {
                if list.len() > 1 {
                    self.supersede.push(i64::MIN, k as u32);
                }
            }
        }
        self.by_key = by_key;
    }
}
