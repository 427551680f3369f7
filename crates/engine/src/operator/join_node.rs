//! [`JoinNode`]: one join of a join tree with what feeds its two sides.
//!
//! A join of three or more tables is a tree of two-input joins: a side
//! reads a source table's rows, the closed windows of an aggregation of
//! one, or the rows an inner join emits. Source rows enter at the leaves;
//! each firing runs the tree bottom up, so an inner join's new rows reach
//! the outer join before it fires. An outer join fires at the query's
//! watermark minus its [`JoinPlan::lag`]: an inner row comes out once
//! complete, up to that long after its own time, and a pair is complete
//! only once every row before the join's watermark has arrived.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::SchemaRef;

use super::emit::Emitter;
use super::eval::{eval_array, eval_predicate};
use super::join::{JoinOperator, Joined};
use super::rollup::roll_up;
use super::window::{TABLE_FAMILY, WindowOperator};
use super::{Operator, OperatorSnapshot, Output, StampedBatch};
use crate::error::{EngineError, Result};
use crate::plan::{EventTime, JoinKind, JoinPlan, QueryOptions, SideInput, SourceTable};
use crate::progress::PartitionProgress;
use crate::query::{JoinLateness, stamp};
use crate::shuffle::{Shuffled, Shuffler};
use crate::state::keyed::Evicted;
use crate::state::{SharedStore, StateEntry};
use crate::time::{MAX_TIME, MIN_TIME, to_micros};

/// What feeds one side of a join.
enum Feed {
    /// Source rows, inserted as they are read.
    Rows,
    /// A windowed aggregation of source rows, whose closed windows join.
    Windows(Box<dyn Operator>),
    /// An inner join, whose emitted rows join.
    Join(Box<JoinNode>),
}

impl Feed {
    fn spillable(&self) -> usize {
        match self {
            Feed::Rows => 0,
            Feed::Windows(op) => op.state_size(),
            Feed::Join(node) => node.spillable(),
        }
    }
}

pub struct JoinNode {
    plan: JoinPlan,
    operator: JoinOperator,
    feeds: [Feed; 2],
}

/// What a batch of source rows is judged by at the leaves.
pub struct Arrival<'a> {
    pub source: usize,
    pub partition: u32,
    pub batch: &'a RecordBatch,
    /// The rows are deletions of a versioned table's keys.
    pub deletion: bool,
    /// The partition's progress before the batch: every leaf reading the
    /// source judges the rows against the same progress (a self-join).
    pub before: PartitionProgress,
    pub lateness: i64,
    pub max_future: i64,
    /// How far behind its partition's watermark a stream row may still
    /// join ([`QueryOptions::join_retention_us`]).
    pub join_retention: i64,
}

impl JoinNode {
    /// `schema` is the joined schema: the left side's columns, then the right's.
    pub fn new(
        plan: &JoinPlan,
        schema: SchemaRef,
        sources: &[SourceTable],
        options: &QueryOptions,
        store: Option<(&SharedStore, &str)>,
    ) -> Result<Self> {
        let mut feeds = [Feed::Rows, Feed::Rows];
        for (s, (feed, side)) in feeds.iter_mut().zip(&plan.sides).enumerate() {
            // Each side's windows have tables of their own: `<path><side>/window/…`.
            let path = store.map(|(st, p)| (st, format!("{p}{s}/")));
            *feed = match &side.input {
                SideInput::Rows { .. } => Feed::Rows,
                SideInput::Windows {
                    source,
                    plan: a,
                    key_columns,
                    rollup,
                } => {
                    // A window joins once, when it closes: no late updates.
                    let options = QueryOptions {
                        retention_us: 0,
                        ..options.clone()
                    };
                    let schema = rollup.as_ref().map_or(&side.schema, |r| &r.input_schema);
                    let emitter = Emitter::new(a, Arc::clone(schema), key_columns.clone());
                    let input = sources.get(*source).ok_or_else(|| {
                        EngineError::Internal("a join side reads a missing source".into())
                    })?;
                    Feed::Windows(Box::new(WindowOperator::new(
                        a,
                        &options,
                        emitter,
                        Arc::clone(&input.schema),
                        path.as_ref()
                            .map(|(st, p)| (*st, format!("{p}{TABLE_FAMILY}"))),
                    )?))
                }
                SideInput::Join { plan: inner, .. } => {
                    let schema = Arc::new(arrow::datatypes::Schema::new(
                        inner
                            .sides
                            .iter()
                            .flat_map(|s| s.schema.fields().iter().cloned())
                            .collect::<Vec<_>>(),
                    ));
                    Feed::Join(Box::new(JoinNode::new(
                        inner,
                        schema,
                        sources,
                        options,
                        path.as_ref().map(|(st, p)| (*st, p.as_str())),
                    )?))
                }
            };
        }
        Ok(Self {
            operator: JoinOperator::new(plan, schema, options.join_retention_us, store)?,
            plan: plan.clone(),
            feeds,
        })
    }

    /// Feeds source rows to every leaf of the tree that reads the source.
    /// `advanced` receives the partition's progress after the batch. With
    /// `router` (a first stage), each leaf's stamped rows are routed
    /// ([`Output::shuffled`]) instead of taken in.
    pub fn arrive(
        &mut self,
        rows: &Arrival<'_>,
        advanced: &mut Option<PartitionProgress>,
        router: Option<&Shuffler>,
        out: &mut Output,
    ) -> Result<()> {
        self.arrive_at(0, rows, advanced, router, out).map(|_| ())
    }

    /// [`Self::arrive`] for a tree whose first leaf is number `first`;
    /// returns how many leaves it has.
    fn arrive_at(
        &mut self,
        first: u8,
        rows: &Arrival<'_>,
        advanced: &mut Option<PartitionProgress>,
        router: Option<&Shuffler>,
        out: &mut Output,
    ) -> Result<u8> {
        let mut leaf = first;
        for s in 0..2 {
            let side = &self.plan.sides[s];
            if let Feed::Join(inner) = &mut self.feeds[s] {
                leaf += inner.arrive_at(leaf, rows, advanced, router, out)?;
                continue;
            }
            let this_leaf = leaf;
            leaf += 1;
            // A versioned table keeps a version its filter refuses as an
            // absent one (like a deletion): it still ends the version before it.
            let versioned = matches!(self.plan.kind, JoinKind::Temporal { table } if table == s);
            if side.input.source() != Some(rows.source) || (rows.deletion && !versioned) {
                continue;
            }
            let mut progress = rows.before;
            let (mut filter, event_time, projection) = match &side.input {
                SideInput::Rows {
                    filter,
                    projection,
                    event_time,
                    ..
                } => (
                    filter.as_deref(),
                    EventTime::Column(Arc::clone(event_time)),
                    Some(projection),
                ),
                SideInput::Windows { plan: a, .. } => {
                    (a.filter.as_deref(), a.event_time.clone(), None)
                }
                SideInput::Join { .. } => continue,
            };
            let version_filter = if versioned { filter.take() } else { None };
            // A late version would change pairs already emitted: versions are
            // never late (0); stream rows may be, within the join's retention.
            let join_lateness = projection.is_some().then_some(JoinLateness {
                retention: if versioned { 0 } else { rows.join_retention },
                version: versioned,
            });
            let stamped = stamp(
                &mut progress,
                rows.lateness,
                rows.max_future,
                rows.partition,
                rows.batch,
                filter,
                &event_time,
                join_lateness,
                out,
            )?;
            advanced.get_or_insert(progress);
            let Some(stamped) = stamped else {
                continue;
            };
            if let Some(router) = router {
                // Keyed routes hash the side's key, over its projected rows.
                let targets = match (router.routes_side_rows(this_leaf), projection) {
                    (true, Some(projection)) => {
                        let side_rows = project(projection, &side.schema, &stamped.batch)?;
                        router.targets(this_leaf, &side_rows)?
                    }
                    _ => router.targets(this_leaf, &stamped.batch)?,
                };
                out.shuffled.push(Shuffled {
                    partition: rows.partition,
                    leaf: this_leaf,
                    deletion: rows.deletion,
                    rows: stamped.origin,
                    times: stamped.times,
                    stamps: stamped.stamps,
                    targets,
                });
                continue;
            }
            let Some(projection) = projection else {
                match &mut self.feeds[s] {
                    Feed::Windows(op) => op.process_batch(stamped, out)?,
                    _ => return Err(EngineError::Internal("side aggregation missing".into())),
                }
                continue;
            };
            let side_rows = project(projection, &side.schema, &stamped.batch)?;
            let present = if rows.deletion {
                Some(vec![false; side_rows.num_rows()])
            } else if versioned {
                version_presence(version_filter, &self.plan, &stamped.batch, &side_rows)?
            } else {
                None
            };
            self.operator.insert(
                s,
                side_rows,
                &stamped.times,
                Some(&stamped.stamps),
                present.as_deref(),
            )?;
        }
        Ok(leaf - first)
    }

    /// Takes in rows a first stage stamped and routed to leaf `leaf`
    /// ([`Self::arrive`] with a router): source rows that passed the leaf's
    /// checks, with their event times and stamps given.
    pub fn arrive_given(
        &mut self,
        leaf: u8,
        rows: StampedBatch,
        deletion: bool,
        out: &mut Output,
    ) -> Result<()> {
        match self.given_at(0, leaf, rows, deletion, out)? {
            Ok(_) => Err(EngineError::internal(format!(
                "rows routed to join leaf {leaf}, which the join does not have"
            ))),
            Err(()) => Ok(()),
        }
    }

    /// Walks to leaf `leaf` (this tree's first is `first`) and feeds it:
    /// `Err(())` once fed, else `Ok(the rows back, this tree's leaves)`.
    #[allow(clippy::type_complexity)]
    fn given_at(
        &mut self,
        first: u8,
        leaf: u8,
        rows: StampedBatch,
        deletion: bool,
        out: &mut Output,
    ) -> Result<std::result::Result<(StampedBatch, u8), ()>> {
        let mut at = first;
        let mut rows = rows;
        for s in 0..2 {
            if let Feed::Join(inner) = &mut self.feeds[s] {
                match inner.given_at(at, leaf, rows, deletion, out)? {
                    Ok((back, n)) => {
                        rows = back;
                        at += n;
                        continue;
                    }
                    Err(()) => return Ok(Err(())),
                }
            }
            if at != leaf {
                at += 1;
                continue;
            }
            let side = &self.plan.sides[s];
            let versioned = matches!(self.plan.kind, JoinKind::Temporal { table } if table == s);
            match (&side.input, &mut self.feeds[s]) {
                (
                    SideInput::Rows {
                        filter, projection, ..
                    },
                    _,
                ) => {
                    let side_rows = project(projection, &side.schema, &rows.batch)?;
                    // A versioned table's own filter was left to here, as
                    // in `arrive`: a version it refuses is an absent one.
                    let present = if deletion {
                        Some(vec![false; side_rows.num_rows()])
                    } else if versioned {
                        version_presence(filter.as_deref(), &self.plan, &rows.batch, &side_rows)?
                    } else {
                        None
                    };
                    self.operator.insert(
                        s,
                        side_rows,
                        &rows.times,
                        Some(&rows.stamps),
                        present.as_deref(),
                    )?;
                }
                (SideInput::Windows { .. }, Feed::Windows(op)) => op.process_batch(rows, out)?,
                _ => return Err(EngineError::Internal("side aggregation missing".into())),
            }
            return Ok(Err(()));
        }
        Ok(Ok((rows, at - first)))
    }

    /// The query's watermark advanced to `watermark`: feeds each side what
    /// it completes (closed windows, an inner join's rows), then the pairs
    /// this join completes.
    pub fn fire(
        &mut self,
        watermark: i64,
        options: &QueryOptions,
        out: &mut Output,
    ) -> Result<Option<Joined>> {
        for s in 0..2 {
            let side = &self.plan.sides[s];
            match &mut self.feeds[s] {
                Feed::Rows => {}
                Feed::Windows(op) => {
                    // Windows closed by this watermark join now, at their last instant.
                    let mut closed = Output::default();
                    op.handle_watermark(watermark, &mut closed)?;
                    out.rejects.append(&mut closed.rejects);
                    if let SideInput::Windows {
                        rollup: Some(r), ..
                    } = &side.input
                    {
                        let closing = std::mem::take(&mut closed.changes);
                        closed.changes = roll_up(r, options, &side.schema, closing)?;
                    }
                    for c in closed.changes {
                        if c.deletes.as_ref().is_some_and(|d| d.true_count() > 0) {
                            return Err(EngineError::Internal(
                                "an aggregation a join reads retracted a row".into(),
                            ));
                        }
                        let times: Vec<i64> = c.timestamps.values().iter().map(|t| t - 1).collect();
                        self.operator.insert(s, c.rows, &times, None, None)?;
                    }
                }
                Feed::Join(inner) => {
                    let Some(joined) = inner.fire(watermark, options, out)? else {
                        continue;
                    };
                    let SideInput::Join {
                        filter, projection, ..
                    } = &side.input
                    else {
                        return Err(EngineError::Internal("inner join plan missing".into()));
                    };
                    let mut rows = joined.rows;
                    if let Some(f) = filter {
                        rows = filter_record_batch(&rows, &eval_predicate(f.as_ref(), &rows)?)?;
                    }
                    let columns = projection
                        .iter()
                        .map(|e| eval_array(e.as_ref(), &rows))
                        .collect::<Result<Vec<_>>>()?;
                    let rows = RecordBatch::try_new_with_options(
                        Arc::clone(&side.schema),
                        columns,
                        &arrow::array::RecordBatchOptions::new()
                            .with_row_count(Some(rows.num_rows())),
                    )?;
                    let column = to_micros(rows.column(side.time_column))?;
                    if column.null_count() > 0 {
                        return Err(EngineError::Internal(
                            "an inner join emitted a row without event time".into(),
                        ));
                    }
                    let times: Vec<i64> = column
                        .values()
                        .iter()
                        .map(|t| t.saturating_add(side.time_offset))
                        .collect();
                    self.operator.insert(s, rows, &times, None, None)?;
                }
            }
        }
        self.operator.fire(self.own_watermark(watermark))
    }

    /// This join's watermark when the query's is `watermark`.
    fn own_watermark(&self, watermark: i64) -> i64 {
        if watermark == MAX_TIME || watermark == MIN_TIME {
            watermark
        } else {
            watermark.saturating_sub(self.plan.lag)
        }
    }

    /// After a restore: marks every row the tree emitted before the
    /// checkpoint (taken at query watermark `fired`) as fired.
    fn skip_fired(&mut self, fired: i64, memory: Option<usize>) -> Result<()> {
        self.operator.read_logs(self.own_watermark(fired), memory)?;
        self.operator.skip_fired(self.own_watermark(fired));
        for feed in &mut self.feeds {
            if let Feed::Join(inner) = feed {
                inner.skip_fired(fired, memory)?;
            }
        }
        Ok(())
    }

    /// The tree's state: this join's stored rows (`join/<side>`), and each
    /// side's aggregation or inner join under `side/<side>/`.
    pub fn snapshot(&mut self) -> Result<Vec<(StateEntry, RecordBatch)>> {
        let mut entries = self.operator.snapshot()?;
        for (s, feed) in self.feeds.iter_mut().enumerate() {
            let inner = match feed {
                Feed::Rows => continue,
                Feed::Windows(op) => op.handle_checkpoint()?.batches,
                Feed::Join(node) => node.snapshot()?,
            };
            entries.extend(
                inner
                    .into_iter()
                    .map(|(e, b)| (StateEntry::Side(s as u8, Box::new(e)), b)),
            );
        }
        Ok(entries)
    }

    /// Restores a fresh tree from [`Self::snapshot`], taken when the query's
    /// watermark had fired up to `fired`; an interval join's rows read back
    /// from the store spill as they come under a `memory` budget.
    pub fn restore(
        &mut self,
        entries: Vec<(StateEntry, RecordBatch)>,
        fired: i64,
        memory: Option<usize>,
    ) -> Result<()> {
        self.restore_entries(entries)?;
        self.skip_fired(fired, memory)
    }

    fn restore_entries(&mut self, entries: Vec<(StateEntry, RecordBatch)>) -> Result<()> {
        // The store is restored first: keys seen from now on may be in it.
        self.operator.restored()?;
        let mut per_side: [Vec<(StateEntry, RecordBatch)>; 2] = [Vec::new(), Vec::new()];
        for (entry, batch) in entries {
            match entry {
                StateEntry::JoinSide(side) => self.operator.restore(side as usize, batch)?,
                StateEntry::Side(s, e) => per_side
                    .get_mut(s as usize)
                    .ok_or_else(|| EngineError::Checkpoint("join side out of range".into()))?
                    .push((*e, batch)),
                other => {
                    return Err(EngineError::Checkpoint(format!(
                        "unexpected join state entry {}",
                        other.name()
                    )));
                }
            }
        }
        for (feed, states) in self.feeds.iter_mut().zip(per_side) {
            match feed {
                Feed::Rows => {}
                Feed::Windows(op) => op.restore(OperatorSnapshot::new(states))?,
                Feed::Join(node) => node.restore_entries(states)?,
            }
        }
        Ok(())
    }

    /// Moves cold state to the store until about `target` bytes of it are
    /// held, each part keeping its share: a versioned table's versions, an
    /// interval join's fired rows and the side aggregations' groups. A
    /// temporal join's stream rows stay in memory (they wait only until
    /// they fire).
    pub fn spill(&mut self, target: usize) -> Result<Evicted> {
        let own = self.operator.spillable();
        let sizes: Vec<usize> = self.feeds.iter().map(Feed::spillable).collect();
        let held: usize = own + sizes.iter().sum::<usize>();
        let mut done = Evicted::default();
        if held <= target {
            return Ok(done);
        }
        let share = |size: usize| (target as f64 * size as f64 / held as f64) as usize;
        done += self.operator.spill(share(own))?;
        for (feed, size) in self.feeds.iter_mut().zip(sizes) {
            done += match feed {
                Feed::Rows => Evicted::default(),
                Feed::Windows(op) => op.spill(share(size))?,
                Feed::Join(node) => node.spill(share(size))?,
            };
        }
        Ok(done)
    }

    /// Bytes of the state [`Self::spill`] can move.
    pub fn spillable(&self) -> usize {
        self.operator.spillable() + self.feeds.iter().map(Feed::spillable).sum::<usize>()
    }

    pub fn state_size(&self) -> usize {
        self.operator.state_size()
            + self
                .feeds
                .iter()
                .map(|f| match f {
                    Feed::Rows => 0,
                    Feed::Windows(op) => op.state_size(),
                    Feed::Join(node) => node.state_size(),
                })
                .sum::<usize>()
    }

    /// Open keys of the tree: rows its joins hold plus the groups of the
    /// aggregations its sides read.
    pub fn state_keys(&self) -> usize {
        self.operator.state_rows()
            + self
                .feeds
                .iter()
                .map(|f| match f {
                    Feed::Rows => 0,
                    Feed::Windows(op) => op.state_keys(),
                    Feed::Join(node) => node.state_keys(),
                })
                .sum::<usize>()
    }
}

/// A join side's rows: its projection of source rows.
fn project(
    projection: &[crate::plan::PhysicalExprRef],
    schema: &SchemaRef,
    source_rows: &RecordBatch,
) -> Result<RecordBatch> {
    let columns = projection
        .iter()
        .map(|e| eval_array(e.as_ref(), source_rows))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(source_rows.num_rows())),
    )?)
}

/// Which versions of a versioned table are present: those passing the
/// table's own filter (over its source rows) and the join's conditions on
/// the table alone (over its side rows); `None` when every one is.
fn version_presence(
    filter: Option<&dyn datafusion_physical_expr::PhysicalExpr>,
    join: &JoinPlan,
    source_rows: &RecordBatch,
    side_rows: &RecordBatch,
) -> Result<Option<Vec<bool>>> {
    let mut present: Option<Vec<bool>> = None;
    let checks = [
        filter.map(|f| (f, source_rows)),
        join.version_condition.as_deref().map(|c| (c, side_rows)),
    ];
    for (expr, rows) in checks.into_iter().flatten() {
        let keep = eval_predicate(expr, rows)?;
        let p = present.get_or_insert_with(|| vec![true; keep.len()]);
        for (i, v) in p.iter_mut().enumerate() {
            *v &= keep.value(i);
        }
    }
    Ok(present)
}
