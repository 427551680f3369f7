//! [`Query`]: a compiled plan plus its running state. Sources feed it
//! decoded batches per partition; it stamps rows against their partition's
//! watermark, hands them to the operator, and fires the operator whenever the
//! global watermark (the minimum over partitions) advances.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{filter_record_batch, take_record_batch};

use crate::checkpoint::QuerySnapshot;
use crate::error::{EngineError, Result};
use crate::operator::continuous::ContinuousOperator;
use crate::operator::emit::Emitter;
use crate::operator::eval::{eval_array, eval_predicate};
use crate::operator::join::Joined;
use crate::operator::join_node::{Arrival, JoinNode};
use crate::operator::over::OverOperator;
use crate::operator::rank::RankOperator;
use crate::operator::regroup::RegroupOperator;
use crate::operator::session::SessionOperator;
use crate::operator::window::{TABLE_FAMILY, WindowOperator};
use crate::operator::{ChangeBatch, Operator, Output, Reject, RejectReason, StampedBatch};
use crate::plan::{EventTime, PassthroughPlan, QueryKind, QueryPlan, WindowSpec};
use crate::progress::{PartitionProgress, Progress, source_of};
use crate::state::keyed::Evicted;
use crate::state::store::HELD_ROWS_LIMIT;
use crate::state::{SharedStore, StateEntry};
use crate::time::{MAX_TIME, MIN_TIME, to_micros};
use ubik_state::Durability;

/// Where a query keeps state that leaves memory, and how much it may hold.
#[derive(Debug, Clone, Default)]
pub struct StateOptions {
    /// The store behind the operators' keyed state. Durable (in a
    /// checkpoint directory): checkpoints write their changes there. `None`:
    /// state stays in memory and checkpoints hold it whole.
    pub store: Option<SharedStore>,
    /// Bytes of state (operators plus the store's indexes and cache) to
    /// hold in memory before cold state is spilled to the store.
    pub memory: Option<usize>,
}

/// State moved out of memory so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpillStats {
    pub spills: u64,
    pub groups: u64,
    pub bytes_written: u64,
}

/// The partition joined rows are fed to the stage as.
const JOINED_PARTITION: u32 = u32::MAX;

pub struct Query {
    plan: Arc<QueryPlan>,
    operator: Option<Box<dyn Operator>>,
    /// The join (tree) the stage reads from, if the query joins.
    join: Option<JoinNode>,
    progress: Progress,
    /// The global watermark the operator was last fired with.
    fired: i64,
    /// A first stage: rows are routed, not aggregated.
    shuffle: Option<crate::shuffle::Shuffler>,
    /// A second stage may take a routed run's times and stamps as its
    /// partition's progress: false for a self-join, whose batch comes as
    /// one run per leaf (see [`crate::shuffle::shares_sources`]).
    runs_are_progress: bool,
    state: StateOptions,
    spilled: SpillStats,
}

impl Query {
    /// A query whose state stays in memory.
    pub fn new(plan: QueryPlan) -> Result<Self> {
        Self::with_state(plan, StateOptions::default())
    }

    /// A query whose state may leave memory as `state` says.
    pub fn with_state(plan: QueryPlan, state: StateOptions) -> Result<Self> {
        let plan = Arc::new(plan);
        let limit = state
            .memory
            .map_or(HELD_ROWS_LIMIT, |m| (m / 8).min(HELD_ROWS_LIMIT));
        let store = state.store.clone().map(|s| s.with_held_rows_limit(limit));
        let store = store.as_ref();
        let operator: Option<Box<dyn Operator>> = match &plan.kind {
            QueryKind::Passthrough(_) => None,
            QueryKind::Aggregate(a) => {
                let emitter =
                    Emitter::new(a, Arc::clone(&plan.output_schema), plan.key_columns.clone());
                let schema = Arc::clone(&plan.input_schema);
                Some(match a.window {
                    Some(WindowSpec::Tumble { .. }) | Some(WindowSpec::Hop { .. }) => {
                        Box::new(WindowOperator::new(
                            a,
                            &plan.options,
                            emitter,
                            schema,
                            store.map(|s| (s, TABLE_FAMILY.to_string())),
                        )?)
                    }
                    Some(WindowSpec::Session { .. }) => Box::new(
                        SessionOperator::new(a, &plan.options, emitter, schema)?
                            .with_store(store)?,
                    ),
                    None => Box::new(ContinuousOperator::new(
                        a,
                        &plan.options,
                        emitter,
                        schema,
                        store,
                    )?),
                })
            }
            QueryKind::Regroup(g) => Some(Box::new(RegroupOperator::new(
                g,
                &plan.options,
                Emitter::new(
                    &g.outer,
                    Arc::clone(&plan.output_schema),
                    plan.key_columns.clone(),
                ),
                Arc::clone(&plan.input_schema),
                store,
            )?)),
            QueryKind::Over(o) => {
                let (input, output) = (&plan.input_schema, &plan.output_schema);
                let keys = plan.key_columns.clone();
                let op = OverOperator::new(o, &plan.options, input.clone(), output.clone(), keys)?;
                Some(Box::new(match store {
                    Some(store) => op.with_store(store)?,
                    None => op,
                }))
            }
            QueryKind::Rank(r) => {
                let (input, output) = (&plan.input_schema, &plan.output_schema);
                let keys = plan.key_columns.clone();
                let op = RankOperator::new(r, &plan.options, input.clone(), output.clone(), keys)?;
                Some(Box::new(match store {
                    Some(store) => op.with_store(store)?,
                    None => op,
                }))
            }
        };
        let lateness = match &plan.kind {
            _ if plan.join.is_some() => plan.options.lateness_us.max(0),
            kind if matches!(kind.stage_input(), Some((_, EventTime::Column(_)))) => {
                plan.options.lateness_us.max(0)
            }
            _ => 0,
        };
        let join = match &plan.join {
            Some(j) => Some(JoinNode::new(
                j,
                Arc::clone(&plan.input_schema),
                &plan.sources,
                &plan.options,
                store.map(|s| (s, "join/")),
            )?),
            None => None,
        };
        let runs_are_progress = !plan
            .join
            .as_ref()
            .is_some_and(crate::shuffle::shares_sources);
        Ok(Self {
            plan,
            operator,
            join,
            progress: Progress::new(lateness),
            fired: MIN_TIME,
            shuffle: None,
            runs_are_progress,
            state,
            spilled: SpillStats::default(),
        })
    }

    pub fn plan(&self) -> &QueryPlan {
        &self.plan
    }

    /// Declares a source partition up front: until it reports progress it
    /// holds the global watermark back (as an unread Kafka partition must).
    /// Partitions are numbered by [`crate::progress::partition_id`].
    pub fn add_partition(&mut self, partition: u32) {
        self.progress.partition(partition);
    }

    /// Makes this query the first stage of a repartitioned run: each fed
    /// row is stamped (and checked) as usual, then routed to one of
    /// `partitions` target partitions by its key ([`Output::shuffled`])
    /// instead of aggregated. The second stage feeds the rows of one target
    /// with [`Self::process_given`].
    pub fn set_shuffle(&mut self, partitions: u32) -> Result<()> {
        self.shuffle = Some(crate::shuffle::Shuffler::new(&self.plan, partitions)?);
        Ok(())
    }

    /// Feeds rows of `partition` a first stage stamped: each row's event
    /// time (or ordinal) and its stamp (its source partition's watermark
    /// just before it) are given, so lateness is judged as the source
    /// partition judged it. The rows passed the first stage's `WHERE`.
    ///
    /// `routed` names the join leaf the rows feed and whether they are
    /// deletions of a versioned table's keys ([`crate::shuffle::Shuffled`]);
    /// `(0, false)` without a join.
    pub fn process_given(
        &mut self,
        partition: u32,
        routed: (u8, bool),
        batch: &RecordBatch,
        times: Vec<i64>,
        stamps: Vec<i64>,
        out: &mut Output,
    ) -> Result<()> {
        let source = source_of(partition);
        self.check_schema(source, batch)?;
        let n = batch.num_rows();
        if times.len() != n || stamps.len() != n {
            return Err(EngineError::internal(
                "given times and stamps do not match the rows",
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let runs_are_progress = self.runs_are_progress;
        let p = self.progress.partition(partition);
        if let Some(&t) = times.iter().max().filter(|_| runs_are_progress) {
            p.max_time = p.max_time.max(t);
        }
        if let Some(&w) = stamps.iter().max().filter(|_| runs_are_progress) {
            p.pushed = p.pushed.max(w);
        }
        p.rows += n as u64;
        let rows = StampedBatch {
            partition,
            batch: batch.clone(),
            times,
            stamps,
            origin: (0..n as u32).collect(),
        };
        let (leaf, deletion) = routed;
        if let Some(join) = self.join.as_mut() {
            join.arrive_given(leaf, rows, deletion, out)?;
            return self.fire(out);
        }
        if leaf != 0 || deletion {
            return Err(EngineError::internal(
                "join rows routed to a query without a join",
            ));
        }
        let operator = self
            .operator
            .as_mut()
            .ok_or_else(|| EngineError::internal("a pass-through query has no second stage"))?;
        operator.process_batch(rows, out)?;
        self.fire(out)
    }

    /// The global watermark (µs, or rows for queries without event time).
    pub fn watermark(&self) -> i64 {
        self.progress.global()
    }

    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Feeds a batch of source rows read from `partition` (an id of
    /// [`crate::progress::partition_id`], naming the source too), in read order.
    pub fn process(&mut self, partition: u32, batch: &RecordBatch, out: &mut Output) -> Result<()> {
        let source = source_of(partition);
        self.check_schema(source, batch)?;
        let plan = Arc::clone(&self.plan);
        if plan.join.is_some() {
            return self.process_join(source, partition, batch, false, out);
        }
        match &plan.kind {
            QueryKind::Passthrough(p) => self.passthrough(p, batch, out),
            kind => {
                // Over a changelog the operator judges WHERE after the old rows.
                let stamped = self.stamp_stage(partition, batch, !reads_changelog(kind), out)?;
                if let Some(stamped) = stamped {
                    if let Some(shuffle) = &self.shuffle {
                        let targets = shuffle.targets(0, &stamped.batch)?;
                        out.shuffled.push(crate::shuffle::Shuffled {
                            partition,
                            leaf: 0,
                            deletion: false,
                            rows: stamped.origin,
                            times: stamped.times,
                            stamps: stamped.stamps,
                            targets,
                        });
                        return Ok(());
                    }
                    self.operator
                        .as_mut()
                        .expect("stateful operator")
                        .process_batch(stamped, out)?;
                }
                if self.shuffle.is_some() {
                    return Ok(());
                }
                self.fire(out)
            }
        }
    }

    /// Advances a partition's watermark without data (idle close). The
    /// runtime records where it did so, so a replay can do the same.
    pub fn push_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        out: &mut Output,
    ) -> Result<()> {
        let p = self.progress.partition(partition);
        p.pushed = p.pushed.max(watermark);
        self.fire(out)
    }

    /// A bounded partition has no more rows.
    pub fn end_partition(&mut self, partition: u32, out: &mut Output) -> Result<()> {
        self.progress.partition(partition).ended = true;
        self.fire(out)
    }

    /// Every partition has ended: close all windows, flush everything.
    pub fn finish(&mut self, out: &mut Output) -> Result<()> {
        if self.progress.partitions.is_empty() {
            self.progress.partition(0);
        }
        for p in self.progress.partitions.values_mut() {
            p.ended = true;
        }
        self.fire(out)
    }

    /// Takes in a changelog source's changes in order: each row of `batch`
    /// is an upsert, or where `deleted` says so a deletion of its key (see
    /// [`Self::process_deletions`]). One call takes a whole chunk however
    /// its deletions are scattered; a continuous GROUP BY applies it in one
    /// pass, other plans take it as runs of one kind.
    pub fn process_changes(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        deleted: &[bool],
        out: &mut Output,
    ) -> Result<()> {
        if !deleted.contains(&true) {
            return self.process(partition, batch, out);
        }
        if deleted.len() != batch.num_rows() {
            return Err(EngineError::internal("a deletion mask of another length"));
        }
        if self.plan.join.is_none() && reads_changelog(&self.plan.kind) {
            self.check_schema(source_of(partition), batch)?;
            return self.changelog_changes(partition, batch, deleted, out);
        }
        let mut start = 0;
        while start < deleted.len() {
            let kind = deleted[start];
            let end = (start..deleted.len())
                .find(|&i| deleted[i] != kind)
                .unwrap_or(deleted.len());
            let run = batch.slice(start, end - start);
            let (rejects, shuffled) = (out.rejects.len(), out.shuffled.len());
            match kind {
                true => self.process_deletions(partition, &run, out)?,
                false => self.process(partition, &run, out)?,
            }
            // Rows are reported by their index in `batch`.
            for r in &mut out.rejects[rejects..] {
                r.row += start;
            }
            for s in &mut out.shuffled[shuffled..] {
                s.rows.iter_mut().for_each(|r| *r += start as u32);
            }
            start = end;
        }
        Ok(())
    }

    /// Feeds source rows to every join side that reads `source`.
    /// Takes in deletions of a versioned table's keys: rows of the table's
    /// schema holding the key and, in the event-time column, when the
    /// deletion takes effect (other columns are ignored). From then on the
    /// key has no version: an inner temporal join drops the stream rows that
    /// meet it and a LEFT JOIN pads them with nulls, until a next version.
    /// A deletion for any other table is rejected
    /// ([`RejectReason::UnappliedDeletion`]), never silently dropped.
    pub fn process_deletions(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        let source = source_of(partition);
        self.check_schema(source, batch)?;
        let plan = Arc::clone(&self.plan);
        match &plan.kind {
            QueryKind::Passthrough(p) if p.changelog => {
                return self.passthrough_deletions(p, batch, out);
            }
            kind if plan.join.is_none() && reads_changelog(kind) => {
                let deleted = vec![true; batch.num_rows()];
                return self.changelog_changes(partition, batch, &deleted, out);
            }
            _ => {}
        }
        let versioned = self.plan.join.as_ref().is_some_and(|j| j.versions(source));
        if !versioned {
            out.rejects.extend((0..batch.num_rows()).map(|row| Reject {
                partition,
                row,
                reason: RejectReason::UnappliedDeletion,
            }));
            return Ok(());
        }
        self.process_join(source, partition, batch, true, out)
    }

    fn process_join(
        &mut self,
        source: usize,
        partition: u32,
        batch: &RecordBatch,
        deletion: bool,
        out: &mut Output,
    ) -> Result<()> {
        let Some(join) = self.join.as_mut() else {
            return Ok(());
        };
        let rows = Arrival {
            source,
            partition,
            batch,
            deletion,
            before: *self.progress.partition(partition),
            lateness: self.progress.lateness,
            max_future: self.plan.options.max_future_us,
            join_retention: self.plan.options.join_retention_us.max(0),
        };
        let rejects_before = out.rejects.len();
        let mut advanced = None;
        join.arrive(&rows, &mut advanced, self.shuffle.as_ref(), out)?;
        if let Some(p) = advanced {
            *self.progress.partition(partition) = p;
        }
        // A row both sides of a self-join refused is reported once.
        let mut seen = std::collections::HashSet::new();
        let mut i = rejects_before;
        while i < out.rejects.len() {
            if seen.insert(out.rejects[i].row) {
                i += 1;
            } else {
                out.rejects.remove(i);
            }
        }
        if self.shuffle.is_some() {
            return Ok(());
        }
        self.fire(out)
    }

    fn fire(&mut self, out: &mut Output) -> Result<()> {
        let wm = self.progress.global();
        if wm > self.fired {
            self.fired = wm;
            if let Some(join) = self.join.as_mut() {
                let joined = join.fire(wm, &self.plan.options, out)?;
                // The stage's watermark trails the query's by the join's
                // lag plus the longest a row's time can lie before its
                // pair's completion.
                let delay = self
                    .plan
                    .join
                    .as_ref()
                    .map_or(0, |j| j.lag.saturating_add(j.row_time.delay));
                if let Some(joined) = joined {
                    self.stage_joined(joined, delay, out)?;
                }
                let stage_wm = if wm == MAX_TIME {
                    MAX_TIME
                } else {
                    wm.saturating_sub(delay)
                };
                if let Some(op) = self.operator.as_mut() {
                    op.handle_watermark(stage_wm, out)?;
                }
            } else if let Some(op) = self.operator.as_mut() {
                op.handle_watermark(wm, out)?;
            }
        }
        self.enforce_memory()
    }

    /// Spills cold state when the state held in memory exceeds the budget.
    /// Between batches and after the watermark was handled, so no group
    /// waits to be emitted.
    fn enforce_memory(&mut self) -> Result<()> {
        let (Some(budget), Some(store)) = (self.state.memory, self.state.store.as_ref()) else {
            return Ok(());
        };
        let store_memory = store.if_open(|s| s.memory()).unwrap_or(0);
        let operator = self.operator.as_ref().map_or(0, |o| o.state_size());
        // A temporal join's stream rows stay in memory; its versioned
        // table, an interval join's fired rows and the sides' aggregations
        // spill.
        let sides = self.join.as_ref().map_or(0, JoinNode::spillable);
        let fixed = self
            .join
            .as_ref()
            .map_or(0, |j| j.state_size())
            .saturating_sub(sides);
        if operator + sides + fixed + store_memory <= budget {
            return Ok(());
        }
        // Down to 60% of the budget: an eviction rebuilds what stays in
        // memory, so it evicts in large steps. Each part keeps its share.
        let target = (budget / 10 * 6).saturating_sub(store_memory + fixed);
        let share =
            |part: usize| (target as f64 * part as f64 / (operator + sides) as f64) as usize;
        let mut evicted = Evicted::default();
        if let Some(op) = self.operator.as_mut() {
            evicted += op.spill(share(operator))?;
        }
        if let Some(j) = self.join.as_mut() {
            evicted += j.spill(share(sides))?;
        }
        if evicted.groups > 0 {
            let left = self.operator.as_ref().map_or(0, |o| o.state_size())
                + self.join.as_ref().map_or(0, JoinNode::spillable);
            ubik_state::memory::release_after((operator + sides).saturating_sub(left));
            self.spilled.spills += 1;
            self.spilled.groups += evicted.groups as u64;
            self.spilled.bytes_written += evicted.bytes_written;
        }
        Ok(())
    }

    /// State moved out of memory so far.
    pub fn spill_stats(&self) -> SpillStats {
        self.spilled
    }

    /// The query's store, if it has one.
    pub fn store(&self) -> Option<&SharedStore> {
        self.state.store.as_ref()
    }

    /// Hands joined rows to the stage: a pass-through emits them; an
    /// aggregation takes them stamped just before their completion, so an
    /// on-time pair is never late for it, and a pair with a late row is late
    /// by as much as that row was (within the aggregation's retention, which
    /// the planner makes at least the join's): it updates its window and
    /// re-emits it.
    fn stage_joined(&mut self, joined: Joined, delay: i64, out: &mut Output) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        match &plan.kind {
            QueryKind::Passthrough(p) => self.passthrough(p, &joined.rows, out),
            kind => {
                let (filter, event_time) = kind
                    .stage_input()
                    .ok_or_else(|| EngineError::internal("a stateful stage without input"))?;
                let n = joined.rows.num_rows();
                let keep = match filter {
                    Some(f) => Some(eval_predicate(f.as_ref(), &joined.rows)?),
                    None => None,
                };
                let EventTime::Column(expr) = event_time else {
                    return Err(EngineError::Internal(
                        "a join stage without event time".into(),
                    ));
                };
                let ts = to_micros(&eval_array(expr.as_ref(), &joined.rows)?)?;
                let mut times = Vec::with_capacity(n);
                let mut stamps = Vec::with_capacity(n);
                let mut origin = Vec::with_capacity(n);
                for i in 0..n {
                    if keep.as_ref().is_some_and(|k| !k.value(i)) || ts.is_null(i) {
                        continue;
                    }
                    times.push(ts.value(i));
                    stamps.push(joined.completion[i].saturating_sub(delay));
                    origin.push(i as u32);
                }
                if origin.is_empty() {
                    return Ok(());
                }
                let batch = if origin.len() == n {
                    joined.rows
                } else {
                    take_record_batch(&joined.rows, &UInt32Array::from(origin.clone()))?
                };
                let before = out.rejects.len();
                self.operator
                    .as_mut()
                    .ok_or_else(|| EngineError::Internal("aggregate operator missing".into()))?
                    .process_batch(
                        StampedBatch {
                            partition: JOINED_PARTITION,
                            batch,
                            times,
                            stamps,
                            origin,
                        },
                        out,
                    )?;
                if out.rejects.len() > before {
                    return Err(EngineError::Internal(
                        "the aggregation over a join refused a joined row".into(),
                    ));
                }
                Ok(())
            }
        }
    }

    fn check_schema(&self, source: usize, batch: &RecordBatch) -> Result<()> {
        let Some(table) = self.plan.sources.get(source) else {
            return Err(EngineError::Input(format!(
                "rows of source {source}, but the query reads {} source(s)",
                self.plan.sources.len()
            )));
        };
        let expected = &table.schema;
        let got = batch.schema();
        let same = expected.fields().len() == got.fields().len()
            && expected
                .fields()
                .iter()
                .zip(got.fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if same {
            Ok(())
        } else {
            Err(EngineError::Schema(format!(
                "input batch schema {got:?} does not match the declared source schema {expected:?}"
            )))
        }
    }

    /// A changelog's changes (upserts, and deletions where `deleted` says)
    /// for the continuous aggregation over it.
    fn changelog_changes(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        deleted: &[bool],
        out: &mut Output,
    ) -> Result<()> {
        if let Some(stamped) = self.stamp_stage(partition, batch, false, out)? {
            let deleted: Vec<bool> = stamped
                .origin
                .iter()
                .map(|&i| deleted[i as usize])
                .collect();
            self.operator
                .as_mut()
                .expect("stateful operator")
                .process_changes(stamped, &deleted, out)?;
        }
        self.fire(out)
    }

    /// Stamps rows of `partition` for the stateful stage (applying its
    /// `WHERE` when `filtered`).
    fn stamp_stage(
        &mut self,
        partition: u32,
        batch: &RecordBatch,
        filtered: bool,
        out: &mut Output,
    ) -> Result<Option<StampedBatch>> {
        let plan = Arc::clone(&self.plan);
        let (filter, event_time) = plan
            .kind
            .stage_input()
            .ok_or_else(|| EngineError::internal("a stateful stage without input"))?;
        let lateness = self.progress.lateness;
        stamp(
            self.progress.partition(partition),
            lateness,
            plan.options.max_future_us,
            partition,
            batch,
            filter.filter(|_| filtered).map(|f| f.as_ref()),
            event_time,
            None,
            out,
        )
    }

    /// Deletions of a changelog passed through: tombstones of their keys.
    fn passthrough_deletions(
        &mut self,
        p: &PassthroughPlan,
        batch: &RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        let n = batch.num_rows();
        self.emit_passthrough(p, batch, Some(BooleanArray::from(vec![true; n])), out)
    }

    fn passthrough(
        &mut self,
        p: &PassthroughPlan,
        batch: &RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        if p.changelog {
            // An upsert that fails WHERE leaves the result: a tombstone of its key.
            let deletes = match &p.filter {
                Some(f) => Some(arrow::compute::not(&eval_predicate(f.as_ref(), batch)?)?),
                None => None,
            };
            return self.emit_passthrough(p, batch, deletes, out);
        }
        let batch = match &p.filter {
            Some(f) => filter_record_batch(batch, &eval_predicate(f.as_ref(), batch)?)?,
            None => batch.clone(),
        };
        self.emit_passthrough(p, &batch, None, out)
    }

    /// Projects rows into the changelog; `deletes` marks tombstones.
    fn emit_passthrough(
        &mut self,
        p: &PassthroughPlan,
        batch: &RecordBatch,
        deletes: Option<BooleanArray>,
        out: &mut Output,
    ) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let columns = p
            .projection
            .iter()
            .map(|e| eval_array(e.as_ref(), batch))
            .collect::<Result<Vec<_>>>()?;
        let rows = RecordBatch::try_new(Arc::clone(&self.plan.output_schema), columns)?;
        let timestamps = match &p.event_time {
            EventTime::Column(e) => to_micros(&eval_array(e.as_ref(), batch)?)?,
            EventTime::Ordinal => Int64Array::new_null(batch.num_rows()),
        };
        out.changes.push(ChangeBatch {
            rows,
            deletes,
            timestamps,
        });
        Ok(())
    }

    /// The state for a checkpoint, taken between batches, its store runs
    /// on disk when it returns. See [`Self::snapshot_deferred`].
    pub fn snapshot(&mut self) -> Result<QuerySnapshot> {
        let (snapshot, durability) = self.snapshot_deferred()?;
        if let Some(d) = durability {
            d.wait()?;
        }
        Ok(snapshot)
    }

    /// The state for a checkpoint, taken between batches. With a durable
    /// store, the operators first write what changed to it, and the
    /// snapshot names the store's runs; those runs reach the disk in the
    /// background, and the checkpoint may be made current only after the
    /// [`Durability`] returned has been waited on (on any thread).
    pub fn snapshot_deferred(&mut self) -> Result<(QuerySnapshot, Option<Durability>)> {
        let durable = self.state.store.as_ref().filter(|s| s.is_durable());
        let since = match durable {
            Some(s) => s.with(|s| Ok(s.writes_queued()))?,
            None => 0,
        };
        let mut operator = match self.operator.as_mut() {
            Some(op) => op.handle_checkpoint()?,
            None => Default::default(),
        };
        if let Some(j) = self.join.as_mut() {
            operator.batches.extend(j.snapshot()?);
        }
        let (store, durability) = match durable {
            Some(s) => {
                let (manifest, durability) = s.with(|s| Ok(s.checkpoint(since)?))?;
                (Some(manifest), Some(durability))
            }
            None => (None, None),
        };
        Ok((
            QuerySnapshot {
                progress: self.progress.clone(),
                fired: self.fired,
                operator,
                store,
            },
            durability,
        ))
    }

    /// Restores a fresh query from a snapshot of the same plan.
    pub fn restore(&mut self, snapshot: QuerySnapshot) -> Result<()> {
        self.progress = snapshot.progress;
        self.fired = snapshot.fired;
        match (self.state.store.as_ref(), &snapshot.store) {
            (Some(s), manifest) if s.is_durable() => {
                let manifest = manifest.clone().unwrap_or_default();
                s.with(|s| Ok(s.restore(&manifest)?))?;
            }
            (_, Some(m)) if !m.is_empty() => {
                return Err(EngineError::Checkpoint(
                    "the checkpoint keeps state in a state store, but this query was opened without one".into(),
                ));
            }
            _ => {}
        }
        let mut operator = snapshot.operator;
        if let Some(j) = self.join.as_mut() {
            let (join, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut operator.batches)
                .into_iter()
                .partition(|(e, _)| matches!(e, StateEntry::JoinSide(_) | StateEntry::Side(..)));
            j.restore(join, self.fired, self.state.memory)?;
            operator.batches = rest;
        }
        if let Some(op) = self.operator.as_mut() {
            op.restore(operator)?;
        }
        Ok(())
    }

    /// Deletes the store's files that neither the current state nor
    /// `pinned` (the runs of kept checkpoints) refers to.
    pub fn retain_state(&self, pinned: &std::collections::BTreeSet<String>) -> Result<()> {
        match &self.state.store {
            Some(s) => s
                .if_open(|s| s.retain(pinned))
                .transpose()
                .map(|_| ())
                .map_err(Into::into),
            None => Ok(()),
        }
    }

    pub fn state_size(&self) -> usize {
        self.operator.as_ref().map_or(0, |o| o.state_size())
            + self.join.as_ref().map_or(0, |j| j.state_size())
    }

    /// Each stateful operator's state held in memory: (what it is, bytes,
    /// keys), for status pages.
    pub fn state_by_operator(&self) -> Vec<(String, usize, usize)> {
        let mut out = Vec::new();
        if let Some(op) = &self.operator {
            out.push((
                self.plan.kind_name().to_string(),
                op.state_size(),
                op.state_keys(),
            ));
        }
        if let Some(j) = &self.join {
            out.push(("join".to_string(), j.state_size(), j.state_keys()));
        }
        out
    }

    /// Bytes of the state store's files (0 without one, or before a
    /// temporary store was needed).
    pub fn store_disk_bytes(&self) -> u64 {
        self.state
            .store
            .as_ref()
            .and_then(|s| s.if_open(|s| s.disk_bytes()))
            .unwrap_or(0)
    }

    /// Keyed states (groups) held, plus the rows a join holds and the
    /// groups of the aggregations its sides read.
    pub fn state_keys(&self) -> usize {
        self.operator.as_ref().map_or(0, |o| o.state_keys())
            + self.join.as_ref().map_or(0, |j| j.state_keys())
    }
}

/// How a join side judges rows behind their partition's watermark.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JoinLateness {
    /// Rows up to this far behind still join.
    pub retention: i64,
    /// The side is a versioned table (its late rows are versions).
    pub version: bool,
}

/// Whether a stage reads a changelog: a continuous aggregation over one.
fn reads_changelog(kind: &QueryKind) -> bool {
    matches!(kind, QueryKind::Aggregate(a) if a.changelog.is_some())
}

/// Applies WHERE, checks event times, and stamps each kept row with its
/// partition's watermark before it. `join_lateness`: for a join side, how
/// far behind its partition's watermark a row may be before it is rejected
/// as late for the join (`None`: late rows are the operator's to judge).
#[allow(clippy::too_many_arguments)]
pub(crate) fn stamp(
    progress: &mut PartitionProgress,
    lateness: i64,
    max_future: i64,
    partition: u32,
    batch: &RecordBatch,
    filter: Option<&dyn datafusion_physical_expr::PhysicalExpr>,
    event_time: &EventTime,
    join_lateness: Option<JoinLateness>,
    out: &mut Output,
) -> Result<Option<StampedBatch>> {
    let n = batch.num_rows();
    let keep = match filter {
        Some(f) => Some(eval_predicate(f, batch)?),
        None => None,
    };
    let mut times = Vec::with_capacity(n);
    let mut stamps = Vec::with_capacity(n);
    let mut origin = Vec::with_capacity(n);
    match event_time {
        EventTime::Column(expr) => {
            let ts = to_micros(&eval_array(expr.as_ref(), batch)?)?;
            let limit = ubik_connector::time::now_micros().saturating_add(max_future);
            let values = ts.values();
            for i in 0..n {
                let kept = keep.as_ref().is_none_or(|k| k.value(i));
                if ts.is_null(i) {
                    if kept {
                        out.rejects.push(Reject {
                            partition,
                            row: i,
                            reason: RejectReason::NullEventTime,
                        });
                    }
                    continue;
                }
                let t = values[i];
                if t > limit {
                    if kept {
                        out.rejects.push(Reject {
                            partition,
                            row: i,
                            reason: RejectReason::FutureEventTime {
                                event_time: t,
                                limit,
                            },
                        });
                    }
                    continue;
                }
                let watermark = progress.watermark(lateness);
                let too_late = join_lateness
                    .filter(|j| t < watermark.saturating_sub(j.retention))
                    .map(|j| match j.version {
                        true => RejectReason::LateVersion {
                            event_time: t,
                            watermark,
                        },
                        false => RejectReason::LateForJoin {
                            event_time: t,
                            watermark,
                            retention: j.retention,
                        },
                    });
                if let Some(reason) = too_late.filter(|_| kept) {
                    out.rejects.push(Reject {
                        partition,
                        row: i,
                        reason,
                    });
                } else if kept {
                    times.push(t);
                    stamps.push(watermark);
                    origin.push(i as u32);
                }
                if t > progress.max_time {
                    progress.max_time = t;
                }
            }
        }
        EventTime::Ordinal => {
            for i in 0..n {
                let ordinal = progress.rows as i64 + i as i64;
                if keep.as_ref().is_none_or(|k| k.value(i)) {
                    times.push(ordinal);
                    stamps.push(progress.watermark(0));
                    origin.push(i as u32);
                }
                progress.max_time = ordinal;
            }
        }
    }
    progress.rows += n as u64;
    if origin.is_empty() {
        return Ok(None);
    }
    let rows = if origin.len() == n {
        batch.clone()
    } else if let Some(k) = keep.as_ref().filter(|k| k.true_count() == origin.len()) {
        filter_record_batch(batch, k)?
    } else {
        take_record_batch(batch, &UInt32Array::from(origin.clone()))?
    };
    Ok(Some(StampedBatch {
        partition,
        batch: rows,
        times,
        stamps,
        origin,
    }))
}
