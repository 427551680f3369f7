//! A compiled streaming query: the exact result schema and changelog key,
//! and the physical expressions each operator evaluates per batch.
//!
//! Every expression before the aggregation is rewritten to read the source
//! table's columns directly (projections and subqueries are folded in), so an
//! operator evaluates `WHERE`, group keys and aggregate arguments straight on
//! the decoded input batch, with no intermediate batches.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{FieldRef, SchemaRef};
use datafusion_physical_expr::PhysicalExpr;
use datafusion_physical_expr::aggregate::AggregateFunctionExpr;

use crate::time::MICROS_PER_SECOND;

pub type PhysicalExprRef = Arc<dyn PhysicalExpr>;

/// Semantics knobs of a query; they change output, so they are part of the plan
/// (and of the checkpoint's compatibility check).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueryOptions {
    /// Watermark delay: the watermark is the max event time seen (per source
    /// partition) minus this many microseconds. Rows that arrive up to this
    /// much out of order are not late.
    pub lateness_us: i64,
    /// How long after its end a closed window keeps its state for late rows.
    /// A late row within this bound updates the window and re-emits it; a row
    /// later than that goes to the dead-letter output.
    pub retention_us: i64,
    /// How long a join keeps rows past the watermark so that late rows
    /// still pair with them: a stream row up to this far behind its
    /// partition's watermark joins (its pairs come out late, and an
    /// aggregation over the join takes them as late rows); a row later than
    /// that goes to the dead-letter output. 0 (the default): a join's
    /// allowed lateness is the watermark delay alone. Join state holds each
    /// row this much longer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub join_retention_us: i64,
    /// Grid of event time on which late updates and continuous (non-windowed)
    /// aggregates are flushed. Flushing on an event-time grid, not on a timer,
    /// keeps output independent of batch boundaries and timing.
    pub emit_interval_us: i64,
    /// When a continuous query has no event time, flush every this many input rows (per partition).
    pub emit_every_rows: i64,
    /// Rows whose event time is further than this ahead of the wall clock are
    /// refused (dead-lettered), so one bad clock cannot close every window.
    pub max_future_us: i64,
    /// The event-time column for continuous and pass-through queries. Windowed
    /// queries use the column of their window function. `None`: the source's
    /// only timestamp column, if it has exactly one.
    pub event_time: Option<String>,
    /// The Kafka record key of an append-only result: output columns (an
    /// aggregation's key is always its GROUP BY columns). Empty: no key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    /// State TTL of a continuous GROUP BY (µs of event time, 0: none): a
    /// group whose newest event time is this far behind a sweep point of
    /// the TTL grid ([`QueryOptions::ttl_grid`]) is dropped from state; if
    /// its key comes back, its aggregate starts afresh.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_ttl_us: i64,
    /// With a state TTL: a dropped group whose key is visible downstream is
    /// retracted with a tombstone (finding dropped groups that were spilled
    /// reads the whole spilled state at each sweep point).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ttl_tombstones: bool,
    /// Threads a windowed aggregation may fold a large batch on (0: one per
    /// core). Output does not depend on it: every aggregate that runs in
    /// parallel has exact, order-independent state, and rows are emitted in
    /// key order. Not part of a checkpoint's identity for the same reason.
    #[serde(skip)]
    pub threads: usize,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl QueryOptions {
    /// The event-time grid state TTL sweeps on: a quarter of the TTL,
    /// rounded up to the emit interval, so a group lives between the TTL
    /// and 1.25 times it (plus one emit interval) after its newest event.
    pub fn ttl_grid(&self) -> i64 {
        let step = self.emit_interval_us.max(1);
        let quarter = (self.state_ttl_us / 4).max(1);
        (quarter.saturating_add(step - 1) / step).saturating_mul(step)
    }

    /// [`Self::threads`] with 0 resolved to the number of cores.
    pub fn resolved_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            lateness_us: 5 * MICROS_PER_SECOND,
            retention_us: 10 * 60 * MICROS_PER_SECOND,
            join_retention_us: 0,
            emit_interval_us: MICROS_PER_SECOND,
            emit_every_rows: 10_000,
            max_future_us: 86_400 * MICROS_PER_SECOND,
            event_time: None,
            key: Vec::new(),
            state_ttl_us: 0,
            ttl_tombstones: false,
            threads: 0,
        }
    }
}

/// A source table a query reads.
#[derive(Debug, Clone)]
pub struct SourceTable {
    pub name: String,
    pub schema: SchemaRef,
    /// Which of `schema`'s columns the query reads, one flag per column: a
    /// decoder may leave the others null (`RecordDecoder::read_only`).
    pub reads: Vec<bool>,
}

impl SourceTable {
    /// The names of the columns the query reads, in schema order.
    pub fn read_names(&self) -> Vec<&str> {
        self.schema
            .fields()
            .iter()
            .zip(&self.reads)
            .filter(|(_, read)| **read)
            .map(|(f, _)| f.name().as_str())
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowSpec {
    Tumble { size: i64 },
    Hop { slide: i64, size: i64 },
    Session { gap: i64 },
}

impl WindowSpec {
    pub fn name(&self) -> &'static str {
        match self {
            WindowSpec::Tumble { .. } => "TUMBLE",
            WindowSpec::Hop { .. } => "HOP",
            WindowSpec::Session { .. } => "SESSION",
        }
    }
}

/// One aggregate call of the query, lowered by DataFusion.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// DataFusion's physical aggregate: function, argument expressions (over
    /// the source schema), distinctness, ordering, return field.
    pub function: Arc<AggregateFunctionExpr>,
    /// `FILTER (WHERE ...)` over the source schema.
    pub filter: Option<PhysicalExprRef>,
    /// The output field (name and type) in the aggregate stage's schema.
    pub field: FieldRef,
    /// Types of the argument expressions.
    pub arg_types: Vec<arrow::datatypes::DataType>,
    /// Types of every input the accumulator takes: the arguments, then
    /// the ORDER BY expressions (as [`crate::state::AggInputs`] holds them).
    pub input_types: Vec<arrow::datatypes::DataType>,
    /// Rows are also taken back out (the input is a changelog): the
    /// accumulator must be retractable (`min`/`max` then count values).
    pub retracting: bool,
}

impl AggregateSpec {
    pub fn function_name(&self) -> &str {
        self.function.fun().name()
    }
}

/// How the event time of a row is known.
#[derive(Debug, Clone)]
pub enum EventTime {
    /// An expression over the source schema giving a timestamp.
    Column(PhysicalExprRef),
    /// No event time: progress is the row's position in its partition.
    Ordinal,
}

#[derive(Debug, Clone)]
pub struct AggregatePlan {
    /// `WHERE`, over the source schema.
    pub filter: Option<PhysicalExprRef>,
    pub event_time: EventTime,
    pub window: Option<WindowSpec>,
    /// Non-window group expressions, over the source schema, in GROUP BY order.
    pub group_exprs: Vec<PhysicalExprRef>,
    /// Fields of `group_exprs`.
    pub group_fields: Vec<FieldRef>,
    pub aggregates: Vec<AggregateSpec>,
    /// Schema of the aggregate stage's rows: GROUP BY columns (the window at
    /// `window_position`), then aggregates, then the hidden window end column.
    pub stage_schema: SchemaRef,
    pub window_position: Option<usize>,
    /// `HAVING`, over `stage_schema`.
    pub having: Option<PhysicalExprRef>,
    /// The SELECT list, over `stage_schema`.
    pub projection: Vec<PhysicalExprRef>,
    /// The input is a changelog (a continuous GROUP BY only): see [`ChangelogInput`].
    pub changelog: Option<ChangelogInput>,
}

/// A continuous aggregation over a changelog source (Debezium): the
/// operator keeps each key's current row, so an upsert takes the key's old
/// row back out of its group before folding the new one in, and a
/// deletion takes it out. The last of the plan's aggregates is then a
/// hidden `count(*)`: a group whose rows are all gone is retracted.
#[derive(Debug, Clone)]
pub struct ChangelogInput {
    /// The primary key's columns in the input schema.
    pub key: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct PassthroughPlan {
    pub filter: Option<PhysicalExprRef>,
    pub projection: Vec<PhysicalExprRef>,
    pub event_time: EventTime,
    /// The input is a changelog keyed by the result's key: a deletion, or
    /// a row `filter` drops, is a tombstone of its key (an upsert keyed by
    /// the primary key may leave the result).
    pub changelog: bool,
}

/// `ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn ... WHERE rn <= N`:
/// the first `limit` rows of every partition key, kept continuously. The
/// changelog is keyed by the partition columns and the row number (the
/// number may be left out of the result when `limit` is 1), so its latest
/// value per key is the current top-N.
///
/// Ties in `order` are broken by the columns the result uses, in input
/// order, ascending, nulls first: which row holds a rank never depends on
/// arrival order, and rows equal in all of them give the same result.
#[derive(Debug, Clone)]
pub struct RankPlan {
    /// `WHERE` below the ranking, over the input schema.
    pub filter: Option<PhysicalExprRef>,
    pub event_time: EventTime,
    /// `PARTITION BY`, over the input schema.
    pub partition_exprs: Vec<PhysicalExprRef>,
    /// Fields of `partition_exprs`.
    pub partition_fields: Vec<FieldRef>,
    /// `ORDER BY`, over the input schema.
    pub order: Vec<(PhysicalExprRef, arrow::compute::SortOptions)>,
    /// Rows kept per partition key (the bound on the row number).
    pub limit: usize,
    /// The input columns the result uses, in input order: a kept row holds
    /// those alone, and rows equal in the ORDER BY are ranked by them
    /// (rows equal in every one give equal results).
    pub kept: Vec<usize>,
    /// The `kept` columns followed by the row number (`UInt64`, from 1).
    pub ranked_schema: SchemaRef,
    /// The SELECT list, over `ranked_schema`.
    pub projection: Vec<PhysicalExprRef>,
}

/// Aggregate window functions over a top-N's current rows (Nexmark q6:
/// `AVG(price) OVER (PARTITION BY seller ORDER BY date_time ROWS BETWEEN
/// 10 PRECEDING AND CURRENT ROW)` over each auction's winning bid). The
/// top-N's result is a changelog of rows, one per top-N key; every current
/// row is kept in its partition's order (ORDER BY, then the row's columns
/// in order, ascending, nulls first), and a row's frame is its neighbours
/// in that order. When the top-N upserts a row, every row whose frame held
/// its old place or holds its new one is recomputed and upserted. The
/// changelog is keyed by the top-N's key.
#[derive(Debug, Clone)]
pub struct OverPlan {
    /// The top-N whose result rows the functions read; its projection
    /// gives `rank_schema`.
    pub rank: RankPlan,
    /// The top-N's result schema (the subquery's columns).
    pub rank_schema: SchemaRef,
    /// `PARTITION BY`, over `rank_schema`.
    pub partition_exprs: Vec<PhysicalExprRef>,
    /// Fields of `partition_exprs`.
    pub partition_fields: Vec<FieldRef>,
    /// `ORDER BY`, over `rank_schema`.
    pub order: Vec<(PhysicalExprRef, arrow::compute::SortOptions)>,
    pub functions: Vec<OverFunction>,
    /// `rank_schema`'s columns, then one per function.
    pub over_schema: SchemaRef,
    /// The SELECT list, over `over_schema`.
    pub projection: Vec<PhysicalExprRef>,
}

/// An aggregate over a `ROWS BETWEEN` frame of a partition's rows.
#[derive(Debug, Clone)]
pub struct OverFunction {
    pub aggregate: OverAggregate,
    /// The argument, over the top-N's result schema.
    pub arg: PhysicalExprRef,
    /// Rows before the current one in the frame (`n PRECEDING`; 0: `CURRENT ROW`).
    pub preceding: usize,
    /// Rows after the current one in the frame (`n FOLLOWING`; 0: `CURRENT ROW`).
    pub following: usize,
    /// The result field, as DataFusion types it.
    pub field: FieldRef,
}

/// The aggregates a `ROWS` frame computes; nulls are skipped, and an
/// aggregate of no value (but `count`) is null.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverAggregate {
    Count,
    /// Integers wrap on overflow as DataFusion's do; floats are summed exactly.
    Sum,
    /// Floats (and integers as floats) summed exactly, then divided.
    Avg,
    Min,
    Max,
}

/// An aggregation over a continuous aggregation (Nexmark q4: `avg(final)
/// ... GROUP BY category` over per-auction `max(price) AS final`). The
/// inner result is a changelog: whenever an inner group's row changes, its
/// previous version is taken back out of its outer group and the new one
/// folded in, so the outer groups always aggregate the inner result's
/// current rows. An outer group no inner row belongs to any more is
/// retracted (a tombstone).
#[derive(Debug, Clone)]
pub struct RegroupPlan {
    /// The continuous aggregation over the input (the subquery).
    pub inner: AggregatePlan,
    /// The inner aggregation's result schema (its SELECT list).
    pub inner_schema: SchemaRef,
    /// The query's own aggregation, over `inner_schema`; continuous, and
    /// every aggregate retractable.
    pub outer: AggregatePlan,
}

#[derive(Debug, Clone)]
pub enum QueryKind {
    /// Filter/projection only: append-only output, no state.
    Passthrough(PassthroughPlan),
    /// Windowed or continuous aggregation: an upsert changelog.
    Aggregate(AggregatePlan),
    /// Continuous top-N per key (`ROW_NUMBER`): an upsert changelog.
    Rank(RankPlan),
    /// An aggregation over a continuous aggregation: an upsert changelog.
    Regroup(RegroupPlan),
    /// Aggregate window functions over a top-N's rows: an upsert changelog.
    Over(OverPlan),
}

impl QueryKind {
    /// `WHERE` and event time of a stateful stage (aggregation or ranking).
    pub fn stage_input(&self) -> Option<(Option<&PhysicalExprRef>, &EventTime)> {
        match self {
            QueryKind::Aggregate(a) => Some((a.filter.as_ref(), &a.event_time)),
            QueryKind::Rank(r) | QueryKind::Over(OverPlan { rank: r, .. }) => {
                Some((r.filter.as_ref(), &r.event_time))
            }
            QueryKind::Regroup(g) => Some((g.inner.filter.as_ref(), &g.inner.event_time)),
            QueryKind::Passthrough(_) => None,
        }
    }
}

/// A query ready to run: what it reads, what it writes, and how.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    pub sql: String,
    /// The source tables, in the order the runtime numbers them (its
    /// source index is the position here).
    pub sources: Vec<SourceTable>,
    /// The join the stage reads from, when the query joins two sources.
    pub join: Option<JoinPlan>,
    /// The schema of the rows the stage (`kind`) reads: the source's, or
    /// the join's output (left columns, then right columns).
    pub input_schema: SchemaRef,
    /// The exact schema of every result batch.
    pub output_schema: SchemaRef,
    /// Indices into `output_schema` of the changelog key, in SELECT order.
    pub key_columns: Vec<usize>,
    pub kind: QueryKind,
    pub options: QueryOptions,
}

impl QueryPlan {
    /// The position of table `name` among [`Self::sources`].
    pub fn source_index(&self, name: &str) -> Option<usize> {
        self.sources.iter().position(|s| s.name == name)
    }

    /// Whether output depends on the watermark (an aggregation, or a join
    /// that emits as the watermark completes its pairs), so idle sources
    /// must have their watermark advanced for results to appear.
    pub fn uses_watermark(&self) -> bool {
        self.join.is_some() || self.is_keyed()
    }

    pub fn key_names(&self) -> Vec<&str> {
        self.key_columns
            .iter()
            .map(|&i| self.output_schema.field(i).name().as_str())
            .collect()
    }

    /// Whether the result is an upsert changelog keyed by [`Self::key_columns`]
    /// (an aggregation), as opposed to append-only rows (a pass-through, whose
    /// Kafka records carry no key).
    pub fn is_keyed(&self) -> bool {
        !matches!(self.kind, QueryKind::Passthrough(_))
    }

    /// Whether records carry a key: a changelog's, or the one chosen for an
    /// append-only result with the `key` setting.
    pub fn has_record_key(&self) -> bool {
        self.is_keyed() || !self.key_columns.is_empty()
    }

    pub fn window(&self) -> Option<WindowSpec> {
        match &self.kind {
            QueryKind::Aggregate(a) => a.window,
            QueryKind::Passthrough(_)
            | QueryKind::Rank(_)
            | QueryKind::Regroup(_)
            | QueryKind::Over(_) => None,
        }
    }

    /// Whether the changelog can retract a key (a tombstone): a HAVING
    /// that a later update can fail, or a session that merges away.
    pub fn may_retract(&self) -> bool {
        match &self.kind {
            QueryKind::Aggregate(a) => {
                a.having.is_some() || matches!(a.window, Some(WindowSpec::Session { .. }))
            }
            QueryKind::Regroup(_) => true,
            QueryKind::Passthrough(_) | QueryKind::Rank(_) | QueryKind::Over(_) => false,
        }
    }

    /// "windowed (TUMBLE)", "continuous", "pass-through".
    pub fn kind_name(&self) -> String {
        match &self.kind {
            QueryKind::Passthrough(_) => match &self.join {
                Some(j) => format!("{} (append-only)", j.describe()),
                None if matches!(&self.kind, QueryKind::Passthrough(p) if p.changelog) => {
                    "pass-through of a changelog (upserts and deletions by primary key)".into()
                }
                None => "pass-through (append-only)".into(),
            },
            QueryKind::Aggregate(a) => match a.window {
                Some(w) => format!("windowed ({}) aggregation", w.name()),
                None if a.changelog.is_some() => {
                    "continuous aggregation of a changelog (old rows taken back out)".into()
                }
                None => "continuous aggregation".into(),
            },
            QueryKind::Rank(r) => format!("continuous top-{} (ROW_NUMBER)", r.limit),
            QueryKind::Regroup(_) => "continuous aggregation of a continuous aggregation".into(),
            QueryKind::Over(o) => format!(
                "window functions (OVER ... ROWS) over a continuous top-{} (ROW_NUMBER)",
                o.rank.limit
            ),
        }
    }
}

impl fmt::Display for QueryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        writeln!(f, "source: {}", names.join(", "))?;
        writeln!(f, "kind: {}", self.kind_name())?;
        for s in &self.sources {
            let columns: Vec<String> = s
                .schema
                .fields()
                .iter()
                .map(|c| format!("{} {}", c.name(), c.data_type()))
                .collect();
            writeln!(f, "columns of {}: {}", s.name, columns.join(", "))?;
        }
        for s in self.sources.iter().filter(|s| s.reads.contains(&false)) {
            writeln!(f, "reads of {}: {}", s.name, s.read_names().join(", "))?;
        }
        if let (
            Some(j),
            QueryKind::Aggregate(_)
            | QueryKind::Rank(_)
            | QueryKind::Regroup(_)
            | QueryKind::Over(_),
        ) = (&self.join, &self.kind)
        {
            writeln!(f, "over: {}", j.describe())?;
        }
        writeln!(f, "schema:")?;
        for (i, field) in self.output_schema.fields().iter().enumerate() {
            let key = if self.key_columns.contains(&i) {
                "  (key)"
            } else {
                ""
            };
            writeln!(
                f,
                "  {}: {}{}{}",
                field.name(),
                field.data_type(),
                if field.is_nullable() { "" } else { " not null" },
                key
            )?;
        }
        write!(f, "key: [{}]", self.key_names().join(", "))
    }
}

/// How two inputs are matched.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JoinKind {
    /// Pairs whose event times satisfy `lo <= left.t - right.t <= hi` (µs).
    Interval { lo: i64, hi: i64 },
    /// Each stream row meets the version of the table row with its key that
    /// was valid at the stream row's event time. `table` is the side (0
    /// left, 1 right) of the versioned table.
    Temporal { table: usize },
}

impl JoinKind {
    pub fn name(&self) -> &'static str {
        match self {
            JoinKind::Interval { .. } => "interval join",
            JoinKind::Temporal { .. } => "temporal join",
        }
    }
}

/// What one side of a join reads: a source table, or another join.
#[derive(Debug, Clone)]
pub enum SideInput {
    /// The source's rows, filtered and projected.
    Rows {
        /// Index into [`QueryPlan::sources`].
        source: usize,
        /// `WHERE` of the side's subquery, over the source schema.
        filter: Option<PhysicalExprRef>,
        /// The side's columns, over the source schema.
        projection: Vec<PhysicalExprRef>,
        /// The side's event time, over the source schema.
        event_time: PhysicalExprRef,
    },
    /// The closed windows of a windowed aggregation over the source (a
    /// subquery with `GROUP BY ..., TUMBLE/HOP(...)`). Each result row joins
    /// once, when its window closes, with the window's last instant (end
    /// minus 1 µs) as its event time; late rows beyond the watermark are not
    /// folded into a window already joined (they are dead-lettered).
    Windows {
        /// Index into [`QueryPlan::sources`].
        source: usize,
        plan: Box<AggregatePlan>,
        /// The result's key columns (group columns and the window), in the
        /// side's schema, or in the rollup's input schema if there is one.
        key_columns: Vec<usize>,
        /// A second aggregation over the closed windows.
        rollup: Option<Box<Rollup>>,
    },
    /// The rows another join emits (a join of three or more tables is a
    /// tree of two-input joins). A row comes out of the inner join once
    /// complete, so this side's time trails the inner join's watermark by
    /// at most [`JoinPlan::lag`] of the outer join.
    Join {
        plan: Box<JoinPlan>,
        /// `WHERE` of the side's subquery, over the inner join's schema.
        filter: Option<PhysicalExprRef>,
        /// The side's columns, over the inner join's schema.
        projection: Vec<PhysicalExprRef>,
    },
}

impl SideInput {
    /// The source table the side reads, unless it reads a join.
    pub fn source(&self) -> Option<usize> {
        match self {
            SideInput::Rows { source, .. } | SideInput::Windows { source, .. } => Some(*source),
            SideInput::Join { .. } => None,
        }
    }
}

/// A second aggregation over the closed windows of a windowed aggregation,
/// grouped by their window column among others (Nexmark q5: `max(num) ...
/// GROUP BY starttime` over per-auction counts). Every row of a window
/// closes at once, so each window's groups are computed once, complete,
/// when it closes; nothing is kept between windows.
#[derive(Debug, Clone)]
pub struct Rollup {
    /// Over `input_schema`; grouped by the window column (not windowed itself).
    pub plan: AggregatePlan,
    /// The rollup's key columns in the side's schema.
    pub key_columns: Vec<usize>,
    /// The windowed aggregation's result schema: what the rollup reads.
    pub input_schema: SchemaRef,
}

/// One input of a join: a source table, as rows or as windowed aggregates,
/// with the columns the join's schema has from this side.
#[derive(Debug, Clone)]
pub struct JoinSide {
    pub input: SideInput,
    /// Schema of the side's rows (the join input's schema).
    pub schema: SchemaRef,
    /// Index of the event-time column in the side's schema (the window
    /// column, for windowed aggregates).
    pub time_column: usize,
    /// A row's event time is its time column plus this (a window's size
    /// minus 1 µs for windowed aggregates, whose column is the start).
    pub time_offset: i64,
    /// Equi-join keys, over the side's rows.
    pub keys: Vec<PhysicalExprRef>,
}

#[derive(Debug, Clone)]
pub struct JoinPlan {
    pub kind: JoinKind,
    /// Unmatched rows of the left side are kept with nulls (LEFT JOIN).
    pub left_outer: bool,
    pub sides: [JoinSide; 2],
    /// The rest of the ON condition, over the joined schema.
    pub condition: Option<PhysicalExprRef>,
    /// A temporal join's conditions on the versioned table alone, over its
    /// side's schema: a version failing them is absent (it matches nothing;
    /// a LEFT JOIN pads with nulls) rather than skipped for an older one.
    pub version_condition: Option<PhysicalExprRef>,
    /// What the stage uses as each row's event time, and how far it can
    /// trail the pair's completion.
    pub row_time: JoinRowTime,
    /// An interval join whose other side's time is bounded above by a
    /// column of one side (`b.ts BETWEEN a.ts AND a.expires`): that side's
    /// rows are held until the watermark passes the column, per row, rather
    /// than a constant bound (the constant one on that side may be absent).
    pub until: Option<RowBound>,
    /// How far (µs) this join's watermark trails the query's: 0 when both
    /// sides read sources; for a side reading an inner join, the inner
    /// join's own lag plus how far the side's time can lie before the
    /// inner pair's completion. Pairs are complete only once every row
    /// before this join's watermark has come out of its inner joins.
    pub lag: i64,
}

impl JoinPlan {
    /// "temporal join", or for a join of a join "temporal join of (interval
    /// join, orders)"-like text naming what each side reads.
    pub fn describe(&self) -> String {
        let name = match self.left_outer {
            true => format!("LEFT {}", self.kind.name()),
            false => self.kind.name().to_string(),
        };
        if !self
            .sides
            .iter()
            .any(|s| matches!(s.input, SideInput::Join { .. }))
        {
            return name;
        }
        let sides: Vec<String> = self
            .sides
            .iter()
            .map(|s| match &s.input {
                SideInput::Join { plan, .. } => format!("({})", plan.describe()),
                SideInput::Windows { .. } => "a windowed aggregation".into(),
                SideInput::Rows { .. } => "a table".into(),
            })
            .collect();
        format!("{name} of {} and {}", sides[0], sides[1])
    }

    /// Calls `f` with every source index the join's leaves read, so a
    /// plan lowered against its own source list can be renumbered.
    pub fn for_each_source_mut(&mut self, f: &mut dyn FnMut(&mut usize)) {
        for side in &mut self.sides {
            match &mut side.input {
                SideInput::Rows { source, .. } | SideInput::Windows { source, .. } => f(source),
                SideInput::Join { plan, .. } => plan.for_each_source_mut(f),
            }
        }
    }

    /// Whether `source` is read as the versioned table of a temporal join
    /// anywhere in the join tree.
    pub fn versions(&self, source: usize) -> bool {
        self.sides
            .iter()
            .enumerate()
            .any(|(s, side)| match &side.input {
                SideInput::Join { plan, .. } => plan.versions(source),
                input => {
                    matches!(self.kind, JoinKind::Temporal { table } if table == s)
                        && input.source() == Some(source)
                }
            })
    }
}

/// The other side's time is at most `column + offset` of each row of `side`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowBound {
    /// The side (0 left, 1 right) whose column bounds the other side's time.
    pub side: usize,
    /// The bounding TIMESTAMP column, in that side's schema.
    pub column: usize,
    /// µs added to the column.
    pub offset: i64,
}

/// The event time the stage gives a joined row. A pair is complete (known
/// for good) when the watermark passes the later of its two times; the
/// stage's watermark trails the join's by `delay`, so every row of a
/// window has been emitted before the window closes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JoinRowTime {
    /// Which side's event time a joined row carries (0 left, 1 right).
    pub side: usize,
    /// How far that time can lie before the completion time (µs).
    pub delay: i64,
}
