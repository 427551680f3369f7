//! SESSION windows: per group, runs of rows no more than `gap` apart. A
//! session is keyed by (group, session start), spans `[start, last + gap)`,
//! and is emitted when the watermark passes its end. A late row can extend a
//! session or bridge two of them; then the merged session is re-emitted and
//! keys that no longer exist (an older start) are retracted with tombstones.
//!
//! Because sessions merge, the state at any moment depends on which rows
//! were folded in, so (as for continuous queries) rows are queued by the
//! emit-grid point after their stamp and folded in only when the global
//! watermark passes that point: every session's history is the same however
//! partitions interleave.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray, RecordBatch, UInt32Array,
};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};

use super::emit::{Emitter, StageRows};
use super::eval::AggEvaluator;
use super::session_log::SessionLog;
use super::{Operator, OperatorSnapshot, Output, Reject, RejectReason, StampedBatch};
use crate::accumulate::{StreamAccumulator, create_accumulator, state_fields};
use crate::error::{EngineError, Result};
use crate::plan::{AggregatePlan, AggregateSpec, QueryOptions, WindowSpec};
use crate::state::backing::key_column_fields;
use crate::state::interner::Interner;
use crate::state::keyed::typed_batch;
use crate::state::{PendingRows, SharedStore, StateEntry};
use crate::time::next_tick;

#[derive(Debug, Clone)]
struct Session {
    group: usize,
    start: i64,
    /// Exclusive end: last event time + gap.
    end: i64,
    closed: bool,
    /// The start under which this session's row is visible downstream.
    visible_as: Option<i64>,
    /// Older starts of merged sessions still visible downstream.
    retract: BTreeSet<i64>,
    live: bool,
    /// Given when it opens and kept while it grows: its key in the store.
    serial: u64,
}

pub struct SessionOperator {
    gap: i64,
    retention: i64,
    grid: i64,
    eval: AggEvaluator,
    emitter: Emitter,
    specs: Vec<AggregateSpec>,
    groups: Interner,
    /// Session ids per group, any order.
    by_group: Vec<Vec<usize>>,
    /// Sessions; the index is also the accumulator slot.
    sessions: Vec<Session>,
    free: Vec<usize>,
    accs: Vec<Box<dyn StreamAccumulator>>,
    /// Slots the accumulators have been sized for; newer slots have no state yet.
    acc_groups: usize,
    /// Open sessions by end.
    open_by_end: BTreeSet<(i64, usize)>,
    /// Closed (emitted, retained) sessions by end.
    closed_by_end: BTreeSet<(i64, usize)>,
    /// Sessions changed since their last emission.
    dirty: BTreeSet<usize>,
    pending: PendingRows,
    next_serial: u64,
    /// With a durable store: the sessions live there, and a checkpoint
    /// writes those changed since the previous one ...
    log: Option<SessionLog>,
    changed: BTreeSet<usize>,
    /// ... and deletes those merged away or dropped since (by serial).
    removed: Vec<u64>,
}

impl SessionOperator {
    pub fn new(
        plan: &AggregatePlan,
        options: &QueryOptions,
        emitter: Emitter,
        source_schema: SchemaRef,
    ) -> Result<Self> {
        let Some(WindowSpec::Session { gap }) = plan.window else {
            return Err(EngineError::internal("session operator without SESSION"));
        };
        Ok(Self {
            gap,
            retention: options.retention_us.max(0),
            grid: options.emit_interval_us.max(1),
            eval: AggEvaluator::new(plan),
            emitter,
            specs: plan.aggregates.clone(),
            groups: Interner::new(&plan.group_fields)?,
            by_group: Vec::new(),
            sessions: Vec::new(),
            free: Vec::new(),
            accs: plan
                .aggregates
                .iter()
                .map(create_accumulator)
                .collect::<Result<Vec<_>>>()?,
            acc_groups: 0,
            open_by_end: BTreeSet::new(),
            closed_by_end: BTreeSet::new(),
            dirty: BTreeSet::new(),
            pending: PendingRows::new(source_schema, "__time"),
            next_serial: 0,
            log: None,
            changed: BTreeSet::new(),
            removed: Vec::new(),
        })
    }

    /// Keeps the sessions in `store` when it is durable: checkpoints then
    /// write what changed (see [`SessionLog`]).
    pub fn with_store(mut self, store: Option<&SharedStore>) -> Result<Self> {
        if let Some(store) = store.filter(|s| s.is_durable()) {
            self.log = Some(SessionLog::new(store, &self.snapshot_schema()?)?);
        }
        self.pending.log_to(store, "pending")?;
        Ok(self)
    }

    /// Session `id` changed: emitted at the next emission, written at the
    /// next checkpoint.
    fn touch(&mut self, id: usize) {
        self.dirty.insert(id);
        if self.log.is_some() {
            self.changed.insert(id);
        }
    }

    /// Session `id` is gone (merged away or dropped).
    fn forget(&mut self, id: usize) {
        if self.log.is_some() {
            self.changed.remove(&id);
            self.removed.push(self.sessions[id].serial);
        }
    }

    fn unindex(&mut self, id: usize) {
        let s = &self.sessions[id];
        if s.closed {
            self.closed_by_end.remove(&(s.end, id));
        } else {
            self.open_by_end.remove(&(s.end, id));
        }
    }

    fn index(&mut self, id: usize) {
        let s = &self.sessions[id];
        if s.closed {
            self.closed_by_end.insert((s.end, id));
        } else {
            self.open_by_end.insert((s.end, id));
        }
    }

    fn new_session(&mut self, group: usize, start: i64, end: i64) -> usize {
        let s = Session {
            group,
            start,
            end,
            closed: false,
            visible_as: None,
            retract: BTreeSet::new(),
            live: true,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        let id = match self.free.pop() {
            Some(id) => {
                self.sessions[id] = s;
                id
            }
            None => {
                self.sessions.push(s);
                self.sessions.len() - 1
            }
        };
        if self.by_group.len() <= group {
            self.by_group.resize(group + 1, Vec::new());
        }
        self.by_group[group].push(id);
        self.open_by_end.insert((end, id));
        id
    }

    /// Extends session `id` to cover `[start, end)`, reopening it if its end
    /// moved past what was emitted.
    fn extend(&mut self, id: usize, start: i64, end: i64) {
        self.unindex(id);
        let s = &mut self.sessions[id];
        s.start = s.start.min(start);
        s.end = s.end.max(end);
        self.index(id);
    }

    /// Merges session `from` into `into` (both of one group): state, range,
    /// and the keys `from` left visible downstream.
    fn merge_into(&mut self, from: usize, into: usize, total: usize) -> Result<()> {
        // A slot created in the current batch has no accumulated state yet:
        // its rows are redirected to `into` when the batch is folded.
        if from < self.acc_groups {
            for acc in self.accs.iter_mut() {
                let st = acc.state(&[from])?;
                acc.merge(&st, &[into], total)?;
                acc.reset(&[from])?;
            }
        }
        let f = self.sessions[from].clone();
        self.unindex(from);
        self.unindex(into);
        let t = &mut self.sessions[into];
        t.start = t.start.min(f.start);
        t.end = t.end.max(f.end);
        if let Some(v) = f.visible_as {
            t.retract.insert(v);
        }
        t.retract.extend(f.retract);
        // Merged with an open session, the result is open until it ends.
        t.closed = t.closed && f.closed;
        self.index(into);
        self.sessions[from].live = false;
        self.forget(from);
        self.by_group[f.group].retain(|&x| x != from);
        self.dirty.remove(&from);
        self.touch(into);
        Ok(())
    }

    fn fold(&mut self, batch: &RecordBatch, times: &[i64]) -> Result<()> {
        let keys = self.eval.keys(batch)?;
        let inputs = self.eval.inputs(batch)?;
        let mut gids = Vec::new();
        self.groups.intern(&keys, batch.num_rows(), &mut gids)?;
        let mut slots = Vec::with_capacity(gids.len());
        let mut freed = Vec::new();
        for (i, &g) in gids.iter().enumerate() {
            let t = times[i];
            let (lo, hi) = (t, t.saturating_add(self.gap));
            let mut hits: Vec<usize> = self
                .by_group
                .get(g)
                .map(|ids| {
                    ids.iter()
                        .copied()
                        .filter(|&id| {
                            let s = &self.sessions[id];
                            lo < s.end && s.start < hi
                        })
                        .collect()
                })
                .unwrap_or_default();
            let id = match hits.len() {
                0 => self.new_session(g, lo, hi),
                _ => {
                    // Merge into the earliest session, so the choice does not
                    // depend on slot numbers.
                    hits.sort_by_key(|&id| (self.sessions[id].start, id));
                    let target = hits[0];
                    let total = self.sessions.len();
                    for &other in &hits[1..] {
                        self.merge_into(other, target, total)?;
                        freed.push(other);
                    }
                    self.extend(target, lo, hi);
                    target
                }
            };
            self.touch(id);
            slots.push(id);
        }
        // Rows assigned to a session that merged away later in this batch follow it.
        if !freed.is_empty() {
            for slot in slots.iter_mut() {
                while !self.sessions[*slot].live {
                    let s = &self.sessions[*slot];
                    let g = s.group;
                    let (start, end) = (s.start, s.end);
                    *slot = self.by_group[g]
                        .iter()
                        .copied()
                        .find(|&id| {
                            let o = &self.sessions[id];
                            o.start <= start && o.end >= end
                        })
                        .ok_or_else(|| EngineError::internal("merged session lost"))?;
                }
            }
        }
        let total = self.sessions.len();
        for (j, acc) in self.accs.iter_mut().enumerate() {
            acc.update(&inputs.args[j], &slots, inputs.filters[j].as_ref(), total)?;
        }
        self.acc_groups = total;
        for id in freed {
            if !self.free.contains(&id) {
                self.free.push(id);
            }
        }
        Ok(())
    }

    /// Emits closed sessions that changed, at grid point `x`.
    fn emit(&mut self, x: i64, out: &mut Output) -> Result<()> {
        // Sessions whose end the watermark passed close now.
        let closing: Vec<usize> = self
            .open_by_end
            .range(..=(x, usize::MAX))
            .map(|&(_, id)| id)
            .collect();
        for id in closing {
            self.unindex(id);
            self.sessions[id].closed = true;
            self.index(id);
            self.touch(id);
        }
        // A late row that pushed a closed session's end past the watermark
        // reopens it: it is emitted again when it ends.
        let reopen: Vec<usize> = self
            .dirty
            .iter()
            .copied()
            .filter(|&id| self.sessions[id].closed && self.sessions[id].end > x)
            .collect();
        for id in reopen {
            self.unindex(id);
            self.sessions[id].closed = false;
            self.index(id);
        }
        let ready: Vec<usize> = self
            .dirty
            .iter()
            .copied()
            .filter(|&id| self.sessions[id].closed)
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        for &id in &ready {
            self.dirty.remove(&id);
        }
        // Rows: the upsert of each session, then tombstones of stale keys.
        let mut row_session = Vec::new();
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        let mut visible = Vec::new();
        let mut retract = Vec::new();
        for &id in &ready {
            let s = &self.sessions[id];
            row_session.push(id);
            starts.push(s.start);
            ends.push(s.end);
            visible.push(s.visible_as == Some(s.start));
            retract.push(false);
            let mut stale: BTreeSet<i64> = s.retract.clone();
            if let Some(v) = s.visible_as.filter(|&v| v != s.start) {
                stale.insert(v);
            }
            for old in stale {
                row_session.push(id);
                starts.push(old);
                ends.push(s.end);
                visible.push(true);
                retract.push(true);
            }
        }
        let group_of: Vec<usize> = row_session
            .iter()
            .map(|&id| self.sessions[id].group)
            .collect();
        let keys = self.groups.keys(&group_of)?;
        let values = self
            .accs
            .iter_mut()
            .map(|a| a.evaluate(&row_session))
            .collect::<Result<Vec<_>>>()?;
        let rows = StageRows {
            keys,
            window: Some((starts.clone(), ends.clone())),
            values,
            timestamps: ends,
            visible,
            retract: retract.clone(),
        };
        let (batch, now_visible) = self.emitter.emit(rows)?;
        out.changes.extend(batch);
        for (i, &id) in row_session.iter().enumerate() {
            if !retract[i] {
                let s = &mut self.sessions[id];
                s.visible_as = now_visible[i].then_some(starts[i]);
                s.retract.clear();
            }
        }
        Ok(())
    }

    fn evict(&mut self, watermark: i64) -> Result<()> {
        let horizon = self.retention.saturating_add(self.grid);
        let limit = watermark.saturating_sub(horizon);
        let gone: Vec<usize> = self
            .closed_by_end
            .range(..=(limit, usize::MAX))
            .map(|&(_, id)| id)
            .filter(|id| !self.dirty.contains(id))
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        for acc in self.accs.iter_mut() {
            acc.reset(&gone)?;
        }
        for &id in &gone {
            self.unindex(id);
            self.forget(id);
            let g = self.sessions[id].group;
            self.sessions[id].live = false;
            self.by_group[g].retain(|&x| x != id);
            self.free.push(id);
        }
        Ok(())
    }

    /// The snapshot rows of sessions `ids`: group key, range, emission
    /// state and accumulator state.
    fn sessions_batch(&mut self, ids: &[usize]) -> Result<RecordBatch> {
        let group_of: Vec<usize> = ids.iter().map(|&id| self.sessions[id].group).collect();
        let mut cols = self.groups.keys(&group_of)?;
        let s = |f: &dyn Fn(&Session) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|&id| f(&self.sessions[id])),
            ))
        };
        cols.push(s(&|x| x.start));
        cols.push(s(&|x| x.end));
        cols.push(Arc::new(BooleanArray::from_iter(
            ids.iter().map(|&id| Some(self.sessions[id].closed)),
        )));
        cols.push(Arc::new(BooleanArray::from_iter(
            ids.iter().map(|&id| Some(self.dirty.contains(&id))),
        )));
        cols.push(Arc::new(Int64Array::from_iter(
            ids.iter().map(|&id| self.sessions[id].visible_as),
        )));
        cols.push(Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(
            ids.iter().map(|&id| {
                Some(
                    self.sessions[id]
                        .retract
                        .iter()
                        .map(|&v| Some(v))
                        .collect::<Vec<_>>(),
                )
            }),
        )));
        for acc in self.accs.iter_mut() {
            cols.extend(acc.state(ids)?);
        }
        typed_batch(self.snapshot_schema()?, cols, ids.len())
    }

    /// Restores the sessions of a [`Self::sessions_batch`] into a fresh
    /// operator, with their serial numbers (new ones if `None`: then the
    /// store, if any, has yet to hold them).
    fn restore_sessions(&mut self, batch: &RecordBatch, serials: Option<&[u64]>) -> Result<()> {
        let k = self.groups.fields().len();
        let n = batch.num_rows();
        let keys: Vec<ArrayRef> = batch.columns()[..k].to_vec();
        let mut gids = Vec::new();
        self.groups.intern(&keys, n, &mut gids)?;
        let col = |i: usize| batch.column(k + i);
        let start = col(0).as_primitive::<Int64Type>();
        let end = col(1).as_primitive::<Int64Type>();
        let closed = col(2).as_boolean();
        let dirty = col(3).as_boolean();
        let visible = col(4).as_primitive::<Int64Type>();
        let retract = col(5).as_list::<i32>();
        let first = self.sessions.len();
        if first != 0 || !self.free.is_empty() {
            return Err(EngineError::Checkpoint(
                "session state restored twice".into(),
            ));
        }
        for (i, &gid) in gids.iter().enumerate().take(n) {
            let id = self.new_session(gid, start.value(i), end.value(i));
            if closed.value(i) {
                self.unindex(id);
                self.sessions[id].closed = true;
                self.index(id);
            }
            let s = &mut self.sessions[id];
            s.visible_as = visible.is_valid(i).then(|| visible.value(i));
            s.retract = retract
                .value(i)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied()
                .collect();
            match serials {
                Some(serials) => s.serial = serials[i],
                None if self.log.is_some() => {
                    self.changed.insert(id);
                }
                None => {}
            }
            if dirty.value(i) {
                self.dirty.insert(id);
            }
        }
        if let Some(last) = serials.and_then(|s| s.iter().max()) {
            self.next_serial = self.next_serial.max(last + 1);
        }
        let slots: Vec<usize> = (0..n).collect();
        let mut c = k + 6;
        for (acc, spec) in self.accs.iter_mut().zip(&self.specs) {
            let w = state_fields(spec)?.len();
            acc.merge(&batch.columns()[c..c + w], &slots, n)?;
            c += w;
        }
        self.acc_groups = n;
        Ok(())
    }

    fn snapshot_schema(&self) -> Result<SchemaRef> {
        let mut fields = key_column_fields(self.groups.fields());
        for (name, dt) in [("start", DataType::Int64), ("end", DataType::Int64)] {
            fields.push(Arc::new(Field::new(name, dt, false)));
        }
        fields.push(Arc::new(Field::new("closed", DataType::Boolean, false)));
        fields.push(Arc::new(Field::new("dirty", DataType::Boolean, false)));
        fields.push(Arc::new(Field::new("visible_as", DataType::Int64, true)));
        fields.push(Arc::new(Field::new(
            "retract",
            DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
            true,
        )));
        for (j, spec) in self.specs.iter().enumerate() {
            for f in state_fields(spec)? {
                fields.push(Arc::new(Field::new(
                    format!("a{j}_{}", f.name()),
                    f.data_type().clone(),
                    true,
                )));
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }
}

impl Operator for SessionOperator {
    fn process_batch(&mut self, input: StampedBatch, out: &mut Output) -> Result<()> {
        let n = input.batch.num_rows();
        // A row whose own session would have ended more than the retention
        // ago cannot join anything still kept: dead-letter it.
        let mut keep = Vec::with_capacity(n);
        for i in 0..n {
            let end = input.times[i].saturating_add(self.gap);
            if end.saturating_add(self.retention) <= input.stamps[i] {
                out.rejects.push(Reject {
                    partition: input.partition,
                    row: input.origin[i] as usize,
                    reason: RejectReason::TooLate {
                        window_end: end,
                        watermark: input.stamps[i],
                    },
                });
            } else {
                keep.push(i as u32);
            }
        }
        let (batch, times, stamps) = if keep.len() == n {
            (input.batch, input.times, input.stamps)
        } else {
            let idx = UInt32Array::from(keep.clone());
            (
                arrow::compute::take_record_batch(&input.batch, &idx)?,
                keep.iter().map(|&i| input.times[i as usize]).collect(),
                keep.iter()
                    .map(|&i| input.stamps[i as usize])
                    .collect::<Vec<_>>(),
            )
        };
        self.pending
            .push_runs(input.partition, &batch, &stamps, &times, self.grid);
        Ok(())
    }

    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        // Grid points with rows, and the ends of open sessions, in order.
        loop {
            let next_rows = self.pending.first_tick();
            let next_close = self
                .open_by_end
                .iter()
                .next()
                .map(|&(end, _)| next_tick(end - 1, self.grid));
            let Some(next) = next_rows.into_iter().chain(next_close).min() else {
                break;
            };
            if next > watermark {
                break;
            }
            if next_rows == Some(next) {
                let mut list = self.pending.take(next);
                list.sort_by_key(|p| p.partition);
                for p in &list {
                    self.fold(&p.batch, &p.values)?;
                }
            }
            self.emit(next, out)?;
        }
        self.evict(watermark)
    }

    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot> {
        let mut batches = Vec::new();
        if self.log.is_some() {
            let ids: Vec<usize> = std::mem::take(&mut self.changed)
                .into_iter()
                .filter(|&id| self.sessions[id].live)
                .collect();
            let serials: Vec<u64> = ids.iter().map(|&id| self.sessions[id].serial).collect();
            let changed = self.sessions_batch(&ids)?;
            let removed = std::mem::take(&mut self.removed);
            let log = self.log.as_mut().expect("checked");
            log.write(&changed, &serials, &removed)?;
        } else {
            let live: Vec<usize> = (0..self.sessions.len())
                .filter(|&id| self.sessions[id].live)
                .collect();
            batches.push((StateEntry::Sessions, self.sessions_batch(&live)?));
        }
        self.pending.snapshot(&mut batches)?;
        Ok(OperatorSnapshot::new(batches))
    }

    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()> {
        if let Some(log) = self.log.as_mut()
            && let Some((rows, serials)) = log.read()?
        {
            self.restore_sessions(&rows, Some(&serials))?;
        }
        for (entry, batch) in snapshot.batches {
            match entry {
                StateEntry::Sessions => self.restore_sessions(&batch, None)?,
                StateEntry::Pending {
                    tick, partition, ..
                } => self.pending.restore(tick, partition, &batch)?,
                other => return Err(other.unexpected("session")),
            }
        }
        self.pending.store_restored()
    }

    fn state_size(&self) -> usize {
        self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.groups.size()
            + self.sessions.capacity() * std::mem::size_of::<Session>()
            + self.pending.size()
    }

    fn state_keys(&self) -> usize {
        self.sessions.iter().filter(|s| s.live).count()
    }
}
