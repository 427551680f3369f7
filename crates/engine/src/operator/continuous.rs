//! Continuous (non-windowed) GROUP BY: one [`KeyedState`] for the life of
//! the query; at every point of the emit grid the keys that changed are
//! emitted as upserts, and a key that stops satisfying HAVING is retracted.
//!
//! Rows are queued by the grid point after their stamp and folded in only
//! when the global watermark passes that point, all partitions' rows of one
//! point together in partition order. So each emission contains exactly the
//! rows stamped before its grid point, however partitions interleave.
//!
//! With a state store, the groups live in its table `groups`: cold groups
//! are evicted to it under the memory budget, and a checkpoint writes the
//! groups changed since the last one.
//!
//! State TTL ([`QueryOptions::state_ttl_us`]): at every point `s` of the
//! TTL grid the watermark passes (after the rows of the grid point `s`
//! were folded in), the groups whose newest event time is at most `s - ttl`
//! are dropped, with a tombstone for those visible downstream if asked.
//! Sweeps follow event time: none goes past the newest event time folded
//! in, so the end of a bounded input drops nothing.
//! Groups spilled to the store are dropped there by the same cutoff, so
//! what is dropped never depends on what was in memory.

use arrow::array::AsArray;
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Int64Type, SchemaRef};

use super::changelog::{TableRows, split_signed};
use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::eval::eval_predicate;
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::Result;
use crate::plan::{AggregatePlan, EventTime, PhysicalExprRef, QueryOptions};
use crate::state::keyed::Evicted;
use crate::state::{KeyedState, PendingRows, SharedStore, StateEntry};
use crate::time::MIN_TIME;

/// The grid continuous stages flush on: the emit interval of event time,
/// or every so many rows of a query without event time.
pub(crate) fn flush_grid(event_time: &EventTime, options: &QueryOptions) -> i64 {
    match event_time {
        EventTime::Column(_) => options.emit_interval_us,
        EventTime::Ordinal => options.emit_every_rows,
    }
    .max(1)
}

pub struct ContinuousOperator {
    grid: i64,
    has_event_time: bool,
    eval: AggEvaluator,
    emitter: Emitter,
    state: KeyedState,
    /// The store behind `state` outlives the process: checkpoints write
    /// the changed groups there, not into the snapshot.
    store_durable: bool,
    pending: PendingRows,
    ttl: Option<Ttl>,
    /// Over a changelog: the source's current rows, and `WHERE`, which is
    /// judged after them (an update may move a row out of the filter).
    changelog: Option<(TableRows, Option<PhysicalExprRef>)>,
    /// No GROUP BY: the one group stays when the table empties (SQL's
    /// aggregate over no rows is a row: a count of 0, NULL sums).
    global: bool,
}

/// State TTL of a continuous GROUP BY.
#[derive(Debug, Clone, Copy)]
struct Ttl {
    ttl: i64,
    /// Sweep points are the multiples of this.
    grid: i64,
    tombstones: bool,
    /// The last sweep point done (`MIN_TIME`: none yet).
    swept: i64,
    /// The newest event time folded in (`MIN_TIME`: none).
    newest: i64,
}

impl Ttl {
    /// The next sweep point the watermark has passed. Sweeps go no further
    /// than the newest event time folded in: the watermark jumps to the end
    /// of time when a bounded input ends, and that is no reason to drop
    /// anything (a backfill ends with the state as of its last event).
    fn next(&self, watermark: i64) -> Option<i64> {
        if self.newest == MIN_TIME {
            return None;
        }
        let s = self.swept.saturating_add(self.grid);
        (s <= watermark && s <= self.newest).then_some(s)
    }
}

impl ContinuousOperator {
    pub fn new(
        plan: &AggregatePlan,
        options: &QueryOptions,
        emitter: Emitter,
        source_schema: SchemaRef,
        store: Option<&SharedStore>,
    ) -> Result<Self> {
        let has_event_time = matches!(plan.event_time, EventTime::Column(_));
        let grid = flush_grid(&plan.event_time, options);
        let mut state =
            KeyedState::new(&plan.group_fields, &plan.aggregates, true, has_event_time)?;
        if let Some(store) = store {
            state = state.with_store(store.clone(), "groups")?;
        }
        let changelog = match &plan.changelog {
            Some(c) => {
                let mut table = TableRows::new(source_schema.clone(), c.key.clone())?;
                if let Some(store) = store {
                    table = table.with_store(store, "table")?;
                }
                Some((table, plan.filter.clone()))
            }
            None => None,
        };
        let queued = match &changelog {
            Some((t, _)) => t.signed_schema().clone(),
            None => source_schema,
        };
        let mut pending = PendingRows::new(queued, "__time");
        pending.log_to(store, "pending")?;
        Ok(Self {
            grid,
            has_event_time,
            eval: AggEvaluator::new(plan),
            emitter,
            state,
            store_durable: store.is_some_and(SharedStore::is_durable),
            pending,
            changelog,
            global: plan.group_fields.is_empty(),
            ttl: (options.state_ttl_us > 0 && has_event_time).then(|| Ttl {
                ttl: options.state_ttl_us,
                grid: options.ttl_grid(),
                tombstones: options.ttl_tombstones,
                swept: MIN_TIME,
                newest: MIN_TIME,
            }),
        })
    }

    /// Whether checkpoints keep the groups in the store.
    fn groups_in_store(&self) -> bool {
        self.state.has_store() && self.store_durable
    }

    fn flush(&mut self, tick: i64, out: &mut Output) -> Result<()> {
        let mut list = self.pending.take(tick);
        if list.is_empty() {
            return Ok(());
        }
        list.sort_by_key(|p| p.partition);
        for p in &list {
            let newest = match self.changelog.is_some() {
                true => {
                    // Rows in before rows out: a group's counts never dip below zero.
                    let (put, times, taken) = split_signed(&p.batch, &p.values)?;
                    self.fold(&put, &times)?;
                    let keys = self.eval.keys(&taken)?;
                    let inputs = self.eval.inputs(&taken)?;
                    self.state.retract(&keys, taken.num_rows(), &inputs)?;
                    times.iter().copied().max()
                }
                false => {
                    self.fold(&p.batch, &p.values)?;
                    p.values.iter().copied().max()
                }
            };
            if let Some(t) = self.ttl.as_mut() {
                let newest = newest.unwrap_or(MIN_TIME);
                if t.newest == MIN_TIME && newest != MIN_TIME {
                    // Sweeps start at the grid point before the first event
                    // time folded in (nothing expires before it). Not the
                    // tick's: rows stamped before any watermark sit at a
                    // tick near the start of time.
                    t.swept = newest.div_euclid(t.grid).saturating_mul(t.grid);
                }
                t.newest = t.newest.max(newest);
            }
        }
        let groups = self.state.take_dirty();
        if groups.is_empty() {
            return Ok(());
        }
        let mut values = self.state.evaluate(&groups)?;
        // Over a changelog the last aggregate counts each group's rows: a
        // group left without any is retracted, and forgotten (but for the
        // global one, which is the aggregate of an empty table then).
        let (emptied, gone): (Vec<bool>, Vec<usize>) = match self.changelog.is_some() {
            true if self.global => {
                values.pop().expect("the hidden row count");
                Default::default()
            }
            true => {
                let rows = values.pop().expect("the hidden row count");
                let rows = rows.as_primitive::<Int64Type>();
                let emptied: Vec<bool> = rows.values().iter().map(|&n| n <= 0).collect();
                let gone = groups
                    .iter()
                    .zip(&emptied)
                    .filter(|(_, e)| **e)
                    .map(|(&g, _)| g);
                let gone = gone.collect();
                (emptied, gone)
            }
            false => Default::default(),
        };
        let rows = StageRows {
            keys: self.state.keys(&groups)?,
            window: None,
            values,
            timestamps: self.state.max_time(&groups),
            visible: self.state.visible(&groups),
            retract: emptied,
        };
        let (batch, visible) = self.emitter.emit(rows)?;
        self.state.set_visible(&groups, &visible);
        out.changes.extend(batch);
        if !gone.is_empty() {
            self.state.delete_groups(&gone)?;
        }
        Ok(())
    }

    /// Folds rows into their groups.
    fn fold(&mut self, batch: &arrow::array::RecordBatch, times: &[i64]) -> Result<()> {
        let keys = self.eval.keys(batch)?;
        let inputs = self.eval.inputs(batch)?;
        let times = self.has_event_time.then_some(times);
        self.state.update(&keys, batch.num_rows(), &inputs, times)
    }

    /// Over a changelog: turns upserts and deletions (where `deleted` says)
    /// into the rows they put in and take out, keeps those `WHERE` passes,
    /// and queues them.
    fn apply_changes(&mut self, input: StampedBatch, deleted: &[bool]) -> Result<()> {
        let (table, filter) = self.changelog.as_mut().ok_or_else(|| {
            crate::error::EngineError::internal("changes for an append-only input")
        })?;
        let mut signed = table.apply(input, deleted)?;
        if let Some(f) = filter {
            let keep = eval_predicate(f.as_ref(), &signed.batch)?;
            if keep.true_count() < keep.len() {
                let kept = |v: &[i64]| -> Vec<i64> {
                    v.iter()
                        .enumerate()
                        .filter(|(i, _)| keep.value(*i))
                        .map(|(_, &x)| x)
                        .collect()
                };
                signed.times = kept(&signed.times);
                signed.stamps = kept(&signed.stamps);
                signed.batch = filter_record_batch(&signed.batch, &keep)?;
            }
        }
        self.pending.push_runs(
            signed.partition,
            &signed.batch,
            &signed.stamps,
            &signed.times,
            self.grid,
        );
        Ok(())
    }

    /// Drops the groups whose newest event time is at most `point - ttl`.
    fn sweep(&mut self, point: i64, out: &mut Output) -> Result<()> {
        let ttl = self.ttl.expect("sweeps need a TTL");
        let cutoff = point.saturating_sub(ttl.ttl);
        if ttl.tombstones {
            // Spilled groups must be in memory to be retracted.
            self.state.load_expired(cutoff)?;
        }
        let expired = self.state.expired(cutoff);
        if !expired.is_empty() {
            if ttl.tombstones {
                let n = expired.len();
                let rows = StageRows {
                    keys: self.state.keys(&expired)?,
                    window: None,
                    values: self.state.evaluate(&expired)?,
                    timestamps: vec![point; n],
                    visible: self.state.visible(&expired),
                    retract: vec![true; n],
                };
                let (batch, _) = self.emitter.emit(rows)?;
                out.changes.extend(batch);
            }
            self.state.drop_groups(&expired)?;
        }
        self.state.expire_stored(cutoff)?;
        if let Some(t) = self.ttl.as_mut() {
            t.swept = point;
        }
        Ok(())
    }
}

impl Operator for ContinuousOperator {
    fn process_batch(&mut self, input: StampedBatch, _out: &mut Output) -> Result<()> {
        if self.changelog.is_some() {
            return self.apply_changes(input, &[]);
        }
        self.pending.push_runs(
            input.partition,
            &input.batch,
            &input.stamps,
            &input.times,
            self.grid,
        );
        Ok(())
    }

    fn process_changes(
        &mut self,
        input: StampedBatch,
        deleted: &[bool],
        _out: &mut Output,
    ) -> Result<()> {
        self.apply_changes(input, deleted)
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        loop {
            let flush = self.pending.due(watermark);
            let sweep = self.ttl.and_then(|t| t.next(watermark));
            match (flush, sweep) {
                // A point's rows are folded in before its sweep.
                (Some(f), Some(s)) if s < f => self.sweep(s, out)?,
                (Some(f), _) => self.flush(f, out)?,
                (None, Some(s)) => self.sweep(s, out)?,
                (None, None) => return Ok(()),
            }
        }
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let mut batches = Vec::new();
        if self.groups_in_store() {
            self.state.persist()?;
        } else {
            batches.push((StateEntry::Groups, self.state.snapshot_all()?));
        }
        self.pending.snapshot(&mut batches)?;
        if let Some((table, _)) = self.changelog.as_mut() {
            match table.in_store() {
                true => _ = table.persist()?,
                false => batches.push((StateEntry::Table, table.snapshot()?)),
            }
        }
        let mut snapshot = OperatorSnapshot::new(batches);
        if let Some(t) = &self.ttl {
            snapshot.meta = serde_json::json!({ "ttl_swept": t.swept, "ttl_newest": t.newest });
        }
        Ok(snapshot)
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        if let Some(t) = self.ttl.as_mut() {
            let field = |k: &str| snapshot.meta.get(k).and_then(|v| v.as_i64());
            t.swept = field("ttl_swept").unwrap_or(MIN_TIME);
            t.newest = field("ttl_newest").unwrap_or(MIN_TIME);
        }
        for (entry, batch) in snapshot.batches {
            match entry {
                // Written whole (no store, or a checkpoint of format 1).
                StateEntry::Groups => self.state.restore(&batch)?,
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                StateEntry::Table => match self.changelog.as_mut() {
                    Some((table, _)) => table.restore(&batch)?,
                    None => return Err(StateEntry::Table.unexpected("continuous")),
                },
                other => return Err(other.unexpected("continuous")),
            }
        }
        self.state.store_restored()?;
        self.pending.store_restored()?;
        if let Some((table, _)) = self.changelog.as_mut() {
            table.store_restored()?;
        }
        match self.ttl {
            Some(t) if t.swept != MIN_TIME => {
                self.state.expire_stored(t.swept.saturating_sub(t.ttl))
            }
            _ => Ok(()),
        }
    }

    fn state_size(&self) -> usize {
        self.state.size()
            + self.pending.size()
            + self.changelog.as_ref().map_or(0, |(t, _)| t.size())
    }

    /// A changelog's current rows leave memory first, then the groups: a
    /// row is touched by its own key's changes only, a group by every
    /// change of any of its rows.
    fn spill(&mut self, target: usize) -> Result<Evicted> {
        let target = target.saturating_sub(self.pending.size());
        let Some((table, _)) = self.changelog.as_mut() else {
            return self.state.evict(target);
        };
        let mut done = table.evict(target.saturating_sub(self.state.size()))?;
        done += self.state.evict(target.saturating_sub(table.size()))?;
        Ok(done)
    }

    fn state_keys(&self) -> usize {
        self.state.len() + self.changelog.as_ref().map_or(0, |(t, _)| t.len())
    }
}
