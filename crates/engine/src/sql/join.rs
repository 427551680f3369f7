//! Lowering a join of two source tables to a [`JoinPlan`].
//!
//! A stream join must keep bounded state, so only joins whose state the
//! watermark can purge run:
//! - a temporal join: one side is a versioned table (read
//!   `FOR SYSTEM_TIME AS OF`, or declared with a PRIMARY KEY), matched on
//!   its key, keeping per key the versions the watermark has not passed;
//! - an interval join: the ON condition bounds the difference of the two
//!   sides' event times (`p.ts BETWEEN o.ts AND o.ts + INTERVAL '1' HOUR`).
//!
//! Anything else (a regular join, whose state would grow forever) is refused
//! with the bounded alternatives named.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion_common::{Column, DFSchema, DFSchemaRef, ScalarValue};
use datafusion_expr::logical_plan::{Join, JoinType, LogicalPlan};
use datafusion_expr::utils::split_conjunction_owned;
use datafusion_expr::{BinaryExpr, Expr, Operator};
use datafusion_physical_expr::expressions::Column as PhysicalColumn;

use super::planner::{Chain, Lowering, StageInput, unsupported_node};
use crate::error::{EngineError, Result};
use crate::plan::{
    AggregatePlan, EventTime, JoinKind, JoinPlan, JoinRowTime, JoinSide, PhysicalExprRef, Rollup,
    RowBound, SideInput, SourceTable, WindowSpec,
};

pub use ubik_connector::{EVENT_TIME_METADATA, PRIMARY_KEY_METADATA};

const BOUNDED_ALTERNATIVES: &str = "bound it: an interval join (AND b.ts BETWEEN a.ts - INTERVAL '1' HOUR AND a.ts + INTERVAL '1' HOUR), a temporal join on a versioned table (JOIN t FOR SYSTEM_TIME AS OF a.ts, or declare t's schema with PRIMARY KEY), or join the results of two windowed aggregations";

/// One side of the join, as the chain above its table scan or inner join.
struct Side<'a> {
    chain: Chain<'a>,
    bottom: Bottom<'a>,
    /// The join input's schema (the side's columns as the join sees them).
    schema: &'a DFSchemaRef,
    /// A windowed aggregation between the chain and the scan.
    windows: Option<Windowed>,
}

/// What a side's chain reads.
enum Bottom<'a> {
    Scan(&'a datafusion_expr::logical_plan::TableScan),
    /// An inner join, lowered (a join of three or more tables).
    Join {
        input: Box<StageInput>,
        /// The side's column that is the inner join's row time, if the
        /// chain keeps it: the side's time when the query names none.
        row_time: Option<usize>,
    },
}

impl Side<'_> {
    /// The side's name in messages.
    fn name(&self) -> String {
        match &self.bottom {
            Bottom::Scan(scan) => format!("`{}`", scan.table_name.table()),
            Bottom::Join { .. } => "the inner join".into(),
        }
    }

    /// The event-time column the side's source declares, if any.
    fn declared_time(&self) -> Option<String> {
        match &self.bottom {
            Bottom::Scan(scan) => scan
                .source
                .schema()
                .metadata()
                .get(EVENT_TIME_METADATA)
                .cloned(),
            Bottom::Join { .. } => None,
        }
    }
}

/// A side that is a windowed aggregation.
struct Windowed {
    plan: AggregatePlan,
    key_columns: Vec<usize>,
    /// The window column's index in the side's schema.
    column: usize,
    /// Window size minus 1 µs: a result row's event time (its window's last
    /// instant) is its window column plus this.
    offset: i64,
    /// A second aggregation over the closed windows (the side's result).
    rollup: Option<Rollup>,
}

impl Lowering {
    pub(super) fn lower_join(&self, join: &Join) -> Result<StageInput> {
        let left_outer = match join.join_type {
            JoinType::Inner => false,
            JoinType::Left => true,
            other => {
                return Err(EngineError::unsupported(
                    format!(
                        "{} JOIN is not supported on streams",
                        other.to_string().to_uppercase()
                    ),
                    "use JOIN or LEFT JOIN",
                ));
            }
        };
        let sides = [self.side(&join.left)?, self.side(&join.right)?];
        // Equality conjuncts between the two sides are the keys; the rest
        // stays a condition on candidate pairs.
        let mut keys: [Vec<Expr>; 2] = [Vec::new(), Vec::new()];
        for (l, r) in &join.on {
            keys[0].push(l.clone());
            keys[1].push(r.clone());
        }
        let mut rest = Vec::new();
        for c in join
            .filter
            .clone()
            .map(split_conjunction_owned)
            .unwrap_or_default()
        {
            match equi_key(&c, &sides) {
                Some((l, r)) => {
                    keys[0].push(l);
                    keys[1].push(r);
                }
                None => rest.push(c),
            }
        }
        let versioned = self.versioned_side(&sides)?;
        // Conditions on the versioned table alone judge the version valid at
        // the stream row's time (one that fails is absent), never an older one.
        let mut on_version = Vec::new();
        if let Some((table, _)) = &versioned {
            let schema = sides[*table].schema;
            rest.retain(|c| {
                let only_table = c.column_refs().iter().all(|col| schema.has_column(col));
                if only_table {
                    on_version.push(c.clone());
                }
                !only_table
            });
        }
        let version_condition = match &versioned {
            Some((table, _)) => self.conjunction(on_version, sides[*table].schema)?,
            None => None,
        };
        let windowed = sides.iter().any(|s| s.windows.is_some());
        let mut until = None;
        let (kind, times) = match versioned {
            Some(_) if windowed => {
                return Err(EngineError::unsupported(
                    "a temporal join of an aggregation is not supported",
                    "join the versioned table to the stream first, then aggregate",
                ));
            }
            Some((table, as_of)) => {
                if keys[table].is_empty() {
                    return Err(EngineError::unsupported(
                        "a temporal join needs an equality on the versioned table's key",
                        "e.g. JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id",
                    ));
                }
                if left_outer && table == 0 {
                    return Err(EngineError::unsupported(
                        "in a temporal LEFT JOIN the versioned table must be the right side",
                        "write FROM stream LEFT JOIN table FOR SYSTEM_TIME AS OF ...",
                    ));
                }
                if left_outer && !rest.is_empty() {
                    return Err(EngineError::unsupported(
                        "a temporal LEFT JOIN supports in ON only key equalities and conditions on the versioned table alone",
                        "move the conditions that involve the stream side to WHERE",
                    ));
                }
                let stream = 1 - table;
                // Among several TIMESTAMP columns: the event_time setting's,
                // else the one the source declares.
                let named = self
                    .options
                    .event_time
                    .clone()
                    .or_else(|| sides[table].declared_time());
                let table_time = single_timestamp(sides[table].schema, named.as_deref())
                    .ok_or_else(|| {
                    EngineError::Schema(format!(
                        "the versioned table {} needs exactly one TIMESTAMP column: a version is valid from that time until the key's next version",
                        sides[table].name()
                    ))
                })?;
                let declared = sides[stream].declared_time();
                let stream_time = single_timestamp(
                    sides[stream].schema,
                    as_of
                        .as_deref()
                        .or(self.options.event_time.as_deref())
                        .or(declared.as_deref()),
                )
                .or(match &sides[stream].bottom {
                    Bottom::Join { row_time, .. } => *row_time,
                    Bottom::Scan(_) => None,
                })
                .ok_or_else(|| {
                    EngineError::Schema(format!(
                        "the stream side {} of the temporal join needs its event-time column: name it with FOR SYSTEM_TIME AS OF <column> or the event_time setting",
                        sides[stream].name()
                    ))
                })?;
                let mut times = [0; 2];
                times[table] = table_time;
                times[stream] = stream_time;
                (JoinKind::Temporal { table }, times)
            }
            None => {
                let b = interval_bounds(&rest, &keys, &sides)?;
                if left_outer && let Some(u) = &b.until {
                    return Err(EngineError::unsupported(
                        format!(
                            "a LEFT interval join whose time bound is a column ({}) is not supported yet",
                            sides[u.side].schema.field(u.column).name()
                        ),
                        "bound the right side's time by the left side's time plus constant intervals (b.ts BETWEEN a.ts AND a.ts + INTERVAL '1' HOUR), or use an inner join",
                    ));
                }
                until = b.until;
                (JoinKind::Interval { lo: b.lo, hi: b.hi }, b.times)
            }
        };
        let mut lowered = Vec::with_capacity(2);
        let mut sources: Vec<SourceTable> = Vec::new();
        let mut add_source =
            |source: SourceTable| match sources.iter().position(|t| t.name == source.name) {
                Some(i) => i,
                None => {
                    sources.push(source);
                    sources.len() - 1
                }
            };
        let mut lag = 0;
        for (s, side) in sides.into_iter().enumerate() {
            let key_exprs = keys[s]
                .iter()
                .map(|e| self.physical(e, side.schema))
                .collect::<Result<Vec<_>>>()?;
            let (input, time_offset) = match (side.windows, side.bottom) {
                (Some(w), Bottom::Scan(scan)) => (
                    SideInput::Windows {
                        source: add_source(self.source_of(scan)),
                        plan: Box::new(w.plan),
                        key_columns: w.key_columns,
                        rollup: w.rollup.map(Box::new),
                    },
                    w.offset,
                ),
                (None, Bottom::Scan(scan)) => {
                    let scan_schema = &scan.projected_schema;
                    let projection = side
                        .chain
                        .outputs(side.schema)?
                        .iter()
                        .map(|e| self.physical(e, scan_schema))
                        .collect::<Result<Vec<_>>>()?;
                    let input = SideInput::Rows {
                        source: add_source(self.source_of(scan)),
                        filter: self.conjunction(side.chain.filters()?, scan_schema)?,
                        event_time: Arc::clone(&projection[times[s]]),
                        projection,
                    };
                    (input, 0)
                }
                (None, Bottom::Join { input, .. }) => {
                    let input = *input;
                    let mut inner = input.join.ok_or_else(unreachable_sides)?;
                    let renumber: Vec<usize> =
                        input.sources.into_iter().map(&mut add_source).collect();
                    inner.for_each_source_mut(&mut |i| *i = renumber[*i]);
                    let projection = side
                        .chain
                        .outputs(side.schema)?
                        .iter()
                        .map(|e| self.physical(e, &input.schema))
                        .collect::<Result<Vec<_>>>()?;
                    let (side_lag, offset) =
                        inner_time(&inner, &input.schema, &projection[times[s]])?;
                    lag = lag.max(side_lag);
                    let input = SideInput::Join {
                        filter: self.conjunction(side.chain.filters()?, &input.schema)?,
                        plan: Box::new(inner),
                        projection,
                    };
                    (input, offset)
                }
                (Some(_), Bottom::Join { .. }) => return Err(unreachable_sides()),
            };
            lowered.push(JoinSide {
                input,
                schema: Arc::new(side.schema.as_arrow().clone()),
                time_column: times[s],
                time_offset,
                keys: key_exprs,
            });
        }
        let condition = self.conjunction(rest, &join.schema)?;
        let mut row_time = default_row_time(kind, left_outer, until);
        row_time.delay = row_time
            .delay
            .saturating_add(lowered[row_time.side].time_offset);
        let [left, right]: [JoinSide; 2] = lowered.try_into().map_err(|_| unreachable_sides())?;
        Ok(StageInput {
            schema: Arc::clone(&join.schema),
            sources,
            join: Some(JoinPlan {
                kind,
                left_outer,
                sides: [left, right],
                condition,
                version_condition,
                row_time,
                until,
                lag,
            }),
        })
    }

    /// A join input: source rows under projections and filters, or a
    /// windowed aggregation of them.
    fn side<'a>(&self, plan: &'a LogicalPlan) -> Result<Side<'a>> {
        let chain = Chain::walk(plan, true)?;
        match chain.bottom {
            LogicalPlan::TableScan(scan) => Ok(Side {
                chain,
                bottom: Bottom::Scan(scan),
                schema: plan.schema(),
                windows: None,
            }),
            LogicalPlan::Join(inner) => {
                let input = self.lower_join(inner)?;
                let j = input.join.as_ref().ok_or_else(unreachable_sides)?;
                // The inner join's row time, as a column the chain keeps.
                let (q, f) = inner
                    .schema
                    .qualified_field(joined_index(j, j.row_time.side));
                let time = Expr::Column(Column::from((q, f)));
                let row_time = chain
                    .outputs(plan.schema())?
                    .iter()
                    .position(|e| e == &time);
                Ok(Side {
                    chain,
                    bottom: Bottom::Join {
                        input: Box::new(input),
                        row_time,
                    },
                    schema: plan.schema(),
                    windows: None,
                })
            }
            LogicalPlan::Aggregate(agg) => {
                let below = Chain::walk(&agg.input, true)?;
                if let LogicalPlan::Aggregate(_) = below.bottom {
                    return self.rollup_side(plan, chain, agg);
                }
                let LogicalPlan::TableScan(scan) = below.bottom else {
                    return Err(match below.bottom {
                        LogicalPlan::Join(_) => EngineError::unsupported(
                            "an aggregation of a join cannot be joined again yet",
                            "join all the tables first and aggregate the result, or publish the aggregation to a topic and join that in a second pipeline",
                        ),
                        other => unsupported_node(other),
                    });
                };
                let lowered = self.lower_aggregation(plan, &chain, agg)?;
                let offset = match lowered.plan.window {
                    Some(WindowSpec::Tumble { size } | WindowSpec::Hop { size, .. }) => size - 1,
                    _ => {
                        return Err(EngineError::unsupported(
                            "a join can read an aggregation only if it is windowed by TUMBLE or HOP (each window joins once, when it closes)",
                            "GROUP BY ..., TUMBLE(ts, INTERVAL '10' SECOND) in the subquery",
                        ));
                    }
                };
                if lowered.plan.having.is_some() {
                    return Err(EngineError::unsupported(
                        "HAVING in an aggregation a join reads is not supported",
                        "filter in the outer query's WHERE instead",
                    ));
                }
                let column = lowered.window_output.ok_or_else(unreachable_sides)?;
                Ok(Side {
                    chain,
                    bottom: Bottom::Scan(scan),
                    schema: plan.schema(),
                    windows: Some(Windowed {
                        plan: lowered.plan,
                        key_columns: lowered.key_columns,
                        column,
                        offset,
                        rollup: None,
                    }),
                })
            }
            other => Err(unsupported_node(other)),
        }
    }

    /// A join input that aggregates the result of a windowed aggregation
    /// again, grouped by its window column (Nexmark q5's `max(num) ... GROUP
    /// BY starttime` over per-auction counts): a [`Rollup`] of each window
    /// as it closes.
    fn rollup_side<'a>(
        &self,
        plan: &'a LogicalPlan,
        chain: Chain<'a>,
        agg: &'a datafusion_expr::logical_plan::Aggregate,
    ) -> Result<Side<'a>> {
        let refuse = |what: &str| {
            EngineError::unsupported(
                format!("{what} in an aggregation over a windowed aggregation"),
                "group the outer aggregation by the inner one's window column (and other columns), without a window function or HAVING",
            )
        };
        let inner = self.side(&agg.input)?;
        let Some(windows) = inner.windows else {
            return Err(unreachable_sides());
        };
        if windows.rollup.is_some() {
            return Err(refuse("a third level of aggregation"));
        }
        let input = Chain::over(&agg.input);
        let stage_input = StageInput {
            schema: Arc::clone(agg.input.schema()),
            sources: Vec::new(),
            join: None,
        };
        // Over the inner result's columns: a configured event-time column
        // names a source column, not one of these (the window column is
        // the rollup's time, set below).
        let mut outer_lowering = self.clone();
        outer_lowering.options.event_time = None;
        let mut lowered =
            outer_lowering.lower_aggregation_over(plan, &chain, agg, &input, stage_input)?;
        if lowered.plan.window.is_some() {
            return Err(refuse("a window function"));
        }
        if lowered.plan.having.is_some() {
            return Err(refuse("HAVING"));
        }
        // The GROUP BY column that is the inner window, and where the
        // rollup's result has it: that is the side's window column.
        let group = lowered
            .plan
            .group_exprs
            .iter()
            .position(|e| column_index(e) == Some(windows.column))
            .ok_or_else(|| refuse("a GROUP BY without the inner window column"))?;
        let column = lowered
            .plan
            .projection
            .iter()
            .position(|e| column_index(e) == Some(group))
            .ok_or_else(|| refuse("a SELECT list without the window column"))?;
        lowered.plan.event_time = EventTime::Column(Arc::clone(&lowered.plan.group_exprs[group]));
        Ok(Side {
            chain,
            bottom: inner.bottom,
            schema: plan.schema(),
            windows: Some(Windowed {
                rollup: Some(Rollup {
                    plan: lowered.plan,
                    key_columns: lowered.key_columns,
                    input_schema: Arc::new(inner.schema.as_arrow().clone()),
                }),
                plan: windows.plan,
                key_columns: windows.key_columns,
                column,
                offset: windows.offset,
            }),
        })
    }

    /// The versioned side, if any, and the time it is read as of.
    fn versioned_side(&self, sides: &[Side<'_>; 2]) -> Result<Option<(usize, Option<String>)>> {
        let mut found = Vec::new();
        for (s, side) in sides.iter().enumerate() {
            // An aggregation or a join is never a versioned table.
            let Bottom::Scan(scan) = &side.bottom else {
                continue;
            };
            if side.windows.is_some() {
                continue;
            }
            let table = scan.table_name.table().to_string();
            let names: Vec<String> = side.chain.aliases().into_iter().chain([table]).collect();
            let marked = self
                .versioned
                .iter()
                .find(|v| names.iter().any(|n| n == &v.name));
            let keyed = scan
                .source
                .schema()
                .metadata()
                .contains_key(PRIMARY_KEY_METADATA);
            if let Some(v) = marked {
                found.push((s, Some(v.as_of.clone())));
            } else if keyed {
                found.push((s, None));
            }
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => Err(EngineError::unsupported(
                "both sides of the join are versioned tables; a temporal join needs a stream on one side",
                "read one of them as a stream (drop its PRIMARY KEY or FOR SYSTEM_TIME AS OF)",
            )),
        }
    }
}

fn unreachable_sides() -> EngineError {
    EngineError::Internal("a join has two sides".into())
}

/// `a = b` with `a` over the left side only and `b` over the right only
/// (or the other way round), as (left, right).
fn equi_key(expr: &Expr, sides: &[Side<'_>; 2]) -> Option<(Expr, Expr)> {
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Eq,
        right,
    }) = expr
    else {
        return None;
    };
    let over = |e: &Expr, s: &Side<'_>| {
        let cols = e.column_refs();
        !cols.is_empty() && cols.iter().all(|c| s.schema.has_column(c))
    };
    if over(left, &sides[0]) && over(right, &sides[1]) {
        Some(((**left).clone(), (**right).clone()))
    } else if over(left, &sides[1]) && over(right, &sides[0]) {
        Some(((**right).clone(), (**left).clone()))
    } else {
        None
    }
}

/// The index of the event-time column in a side's schema: `name` if given
/// and present (qualified, as in `o.ts`, or by its bare name), else its
/// only TIMESTAMP column.
fn single_timestamp(schema: &DFSchema, name: Option<&str>) -> Option<usize> {
    let fields = schema.as_arrow().fields();
    if let Some(name) = name {
        if let Ok(i) = schema.index_of_column(&Column::from_qualified_name(name)) {
            return Some(i);
        }
        let bare = name.rsplit('.').next().unwrap_or(name);
        if let Some(i) = fields.iter().position(|f| f.name() == bare) {
            return Some(i);
        }
    }
    super::planner::only_timestamp(fields)
}

/// For a side reading an inner join, whose time is `time` (over the inner
/// join's schema): how far that time trails the query's watermark (the
/// outer join's lag) and its offset. It must be one of the inner join's
/// two event-time columns, whose lag behind the inner pairs' completion
/// is known.
fn inner_time(inner: &JoinPlan, schema: &DFSchema, time: &PhysicalExprRef) -> Result<(i64, i64)> {
    // A temporal join's table time is not one: versions arrive any time.
    let usable: Vec<usize> = (0..2).filter(|&s| delay_of(inner, s).is_ok()).collect();
    let side = column_index(time).and_then(|i| {
        usable
            .iter()
            .copied()
            .find(|&s| joined_index(inner, s) == i)
    });
    let Some(side) = side else {
        let names: Vec<String> = usable
            .iter()
            .map(|&s| {
                let (q, f) = schema.qualified_field(joined_index(inner, s));
                Column::from((q, f)).to_string()
            })
            .collect();
        return Err(EngineError::unsupported(
            "a join over a join must take its time from an event-time column of the inner join that the inner join bounds (an interval join's time columns, or the stream side's in a temporal join)",
            format!(
                "use {} in the outer join's time condition or FOR SYSTEM_TIME AS OF",
                names.join(" or ")
            ),
        ));
    };
    let lag = inner.lag.saturating_add(delay_of(inner, side)?);
    Ok((lag, inner.sides[side].time_offset))
}

/// `column + offset` (µs) for a column plus or minus constant intervals.
fn linear(expr: &Expr) -> Option<(Column, i64)> {
    match expr {
        Expr::Column(c) => Some((c.clone(), 0)),
        Expr::Cast(c) => linear(&c.expr),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (c, base) = linear(left)?;
            let offset = interval_literal(right)?;
            match op {
                Operator::Plus => Some((c, base.checked_add(offset)?)),
                Operator::Minus => Some((c, base.checked_sub(offset)?)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn interval_literal(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Cast(c) => interval_literal(&c.expr),
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) if v.months == 0 => (v.days
            as i64)
            .checked_mul(86_400_000_000)?
            .checked_add(v.nanoseconds / 1000),
        Expr::Literal(ScalarValue::IntervalDayTime(Some(v)), _) => {
            Some(v.days as i64 * 86_400_000_000 + v.milliseconds as i64 * 1000)
        }
        _ => None,
    }
}

/// `date_bin(INTERVAL size, column[, origin])`: the column, the size (µs)
/// and the origin expression.
fn bucket(expr: &Expr) -> Option<(Column, i64, Option<Expr>)> {
    let Expr::ScalarFunction(f) = expr else {
        return None;
    };
    if f.func.name() != "date_bin" {
        return None;
    }
    let size = interval_literal(f.args.first()?)?;
    let (column, 0) = linear(f.args.get(1)?)? else {
        return None;
    };
    (size > 0).then(|| (column, size, f.args.get(2).cloned()))
}

/// One condition's bound on `left.columns[0] - right.columns[1]` (µs;
/// `i64::MIN`/`i64::MAX` where it sets none).
struct Bound {
    columns: [Column; 2],
    lo: i64,
    hi: i64,
}

/// The time bounds of an interval join.
struct IntervalBounds {
    /// `lo <= left.t - right.t <= hi`; `lo` is `i64::MIN` when a left
    /// column bounds the right time instead (`hi` is `i64::MAX` for a
    /// right one), see `until`.
    lo: i64,
    hi: i64,
    /// The index of each side's time column.
    times: [usize; 2],
    until: Option<RowBound>,
}

/// The bounds `lo <= left.t - right.t <= hi` the condition puts on the two
/// sides' event times, and the index of each side's time column. One side
/// may bound the other's time by a second TIMESTAMP column of its own (`b.ts
/// BETWEEN a.ts AND a.expires`): a row bound, held per row.
fn interval_bounds(
    conditions: &[Expr],
    keys: &[Vec<Expr>; 2],
    sides: &[Side<'_>; 2],
) -> Result<IntervalBounds> {
    let mut bounds: Vec<Bound> = Vec::new();
    // A windowed aggregation's time is its window column plus `offset`.
    let window: [Option<(Column, i64)>; 2] = [0, 1].map(|s| {
        sides[s].windows.as_ref().map(|w| {
            let (q, f) = sides[s].schema.qualified_field(w.column);
            (Column::from((q, f)), w.offset)
        })
    });
    // Two aggregations joined on equal windows: their times differ by the
    // difference of their offsets.
    for (l, r) in keys[0].iter().zip(&keys[1]) {
        if let (Expr::Column(cl), Expr::Column(cr), Some((wl, ol)), Some((wr, or))) =
            (l, r, &window[0], &window[1])
            && cl == wl
            && cr == wr
        {
            let d = ol - or;
            bounds.push(Bound {
                columns: [cl.clone(), cr.clone()],
                lo: d,
                hi: d,
            });
        }
    }
    // A windowed join: equal windows of the two times (`date_bin(s, l.ts) =
    // date_bin(s, r.ts)`, a key) put them less than one window apart.
    for (l, r) in keys[0].iter().zip(&keys[1]) {
        if let (Some((cl, sl, ol)), Some((cr, sr, or))) = (bucket(l), bucket(r))
            && sl == sr
            && ol == or
        {
            bounds.push(Bound {
                columns: [cl, cr],
                lo: 1 - sl,
                hi: sl - 1,
            });
        }
    }
    let mut compare = |a: &Expr, op: Operator, b: &Expr| -> Result<()> {
        let (Some((ca, x)), Some((cb, y))) = (linear(a), linear(b)) else {
            return Ok(());
        };
        let side_of = |c: &Column| {
            if sides[0].schema.has_column(c) {
                Some(0)
            } else if sides[1].schema.has_column(c) {
                Some(1)
            } else {
                None
            }
        };
        let (Some(sa), Some(sb)) = (side_of(&ca), side_of(&cb)) else {
            return Ok(());
        };
        if sa == sb {
            return Ok(());
        }
        // A window column stands for its window's time minus the offset.
        let shift = |s: usize, c: &Column| match &window[s] {
            Some((w, offset)) if w == c => -*offset,
            _ => 0,
        };
        let (x, y) = (
            x.saturating_add(shift(sa, &ca)),
            y.saturating_add(shift(sb, &cb)),
        );
        for (s, c) in [(sa, &ca), (sb, &cb)] {
            let (_, field) = sides[s].schema.qualified_field_from_column(c)?;
            if !matches!(field.data_type(), DataType::Timestamp(_, _)) {
                return Ok(());
            }
        }
        // a + x op b + y, as a bound on left.t - right.t.
        let d = if sa == 0 {
            y.saturating_sub(x)
        } else {
            x.saturating_sub(y)
        };
        let a_below = matches!(op, Operator::Lt | Operator::LtEq);
        let a_above = matches!(op, Operator::Gt | Operator::GtEq);
        // With the left column first, `a <= b` bounds the difference above;
        // with the right column first, below.
        let (lo, hi) = match (sa == 0, a_below, a_above) {
            (true, true, _) | (false, _, true) => (i64::MIN, d),
            (true, _, true) | (false, true, _) => (d, i64::MAX),
            _ => return Ok(()),
        };
        let columns = if sa == 0 { [ca, cb] } else { [cb, ca] };
        bounds.push(Bound { columns, lo, hi });
        Ok(())
    };
    for c in conditions {
        match c {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => compare(left, *op, right)?,
            Expr::Between(b) if !b.negated => {
                compare(&b.expr, Operator::GtEq, &b.low)?;
                compare(&b.expr, Operator::LtEq, &b.high)?;
            }
            _ => {}
        }
    }
    let (columns, until) = time_columns(&bounds)?;
    let (mut lo, mut hi) = (i64::MIN, i64::MAX);
    let mut until_offset: Option<i64> = None;
    for b in &bounds {
        if b.columns == columns {
            lo = lo.max(b.lo);
            hi = hi.min(b.hi);
        } else if let Some((side, _)) = &until {
            // right.t <= left.u - lo, or left.t <= right.u + hi.
            let offset = if *side == 0 {
                b.lo.saturating_neg()
            } else {
                b.hi
            };
            until_offset = Some(until_offset.map_or(offset, |o| o.min(offset)));
        }
    }
    let bounded = match &until {
        None => lo != i64::MIN && hi != i64::MAX,
        Some((0, _)) => hi != i64::MAX,
        Some(_) => lo != i64::MIN,
    };
    if bounds.is_empty() || !bounded {
        return Err(EngineError::unsupported(
            "this join is unbounded: nothing in ON bounds how far apart in event time the two sides' rows may be, so its state would grow forever",
            BOUNDED_ALTERNATIVES,
        ));
    }
    if lo > hi {
        return Err(EngineError::unsupported(
            "the join's time bounds exclude every pair (the lower bound is above the upper)",
            "check the BETWEEN bounds",
        ));
    }
    let index = |s: usize, c: &Column| -> Result<usize> { Ok(sides[s].schema.index_of_column(c)?) };
    let until = match until {
        Some((side, column)) => Some(RowBound {
            side,
            column: index(side, &column)?,
            offset: until_offset.ok_or_else(unreachable_sides)?,
        }),
        None => None,
    };
    Ok(IntervalBounds {
        lo,
        hi,
        times: [index(0, &columns[0])?, index(1, &columns[1])?],
        until,
    })
}

/// Each side's time column, and a row bound's side and column.
type TimeColumns = ([Column; 2], Option<(usize, Column)>);

/// Each side's time column among the bounds' columns, and the column of a
/// side that bounds the other's time per row, if any: a side with two
/// columns has one that bounds the other side's time from below (its time)
/// and one that only bounds it from above (`a.expires` in `b.ts BETWEEN
/// a.ts AND a.expires`).
fn time_columns(bounds: &[Bound]) -> Result<TimeColumns> {
    let mut found: [Vec<&Column>; 2] = [Vec::new(), Vec::new()];
    for b in bounds {
        for (seen, c) in found.iter_mut().zip(&b.columns) {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
    }
    let two = |s: usize| {
        EngineError::unsupported(
            format!(
                "the join's time bounds use two time columns of one side ({} and {})",
                found[s][0], found[s][1]
            ),
            "bound one event-time column of each side (a second one of one side may only bound the other side's time from above, as in b.ts BETWEEN a.ts AND a.expires)",
        )
    };
    let [Some(&l), Some(&r)] = [found[0].first(), found[1].first()] else {
        // No bound at all: the caller refuses the join as unbounded.
        let none = Column::from_name("");
        return Ok(([none.clone(), none], None));
    };
    let wide: Vec<usize> = (0..2).filter(|&s| found[s].len() > 1).collect();
    let s = match wide.as_slice() {
        [] => return Ok(([l.clone(), r.clone()], None)),
        [s] if found[*s].len() == 2 => *s,
        [s, ..] => return Err(two(*s)),
    };
    // Does column `c` of side `s` only bound the other side's time above?
    let only_above = |c: &Column| {
        bounds
            .iter()
            .filter(|b| &b.columns[s] == c)
            .all(|b| match s {
                0 => b.hi == i64::MAX,
                _ => b.lo == i64::MIN,
            })
    };
    let (a, b) = (found[s][0], found[s][1]);
    let (time, until) = match (only_above(a), only_above(b)) {
        (false, true) => (a, b),
        (true, false) => (b, a),
        _ => return Err(two(s)),
    };
    let other = found[1 - s][0].clone();
    let columns = if s == 0 {
        [time.clone(), other]
    } else {
        [other, time.clone()]
    };
    Ok((columns, Some((s, until.clone()))))
}

/// The row time a join gives when the stage names none: the side whose
/// time is always the later one of a pair (so rows trail nothing), else
/// the left side.
fn default_row_time(kind: JoinKind, left_outer: bool, until: Option<RowBound>) -> JoinRowTime {
    match kind {
        // The other side's time is the later one, up to the constant bound.
        JoinKind::Interval { hi, .. } if until.is_some_and(|u| u.side == 0) => JoinRowTime {
            side: 1,
            delay: hi.max(0),
        },
        JoinKind::Interval { lo, .. } if until.is_some() => JoinRowTime {
            side: 0,
            delay: lo.saturating_neg().max(0),
        },
        // The padded rows of a LEFT JOIN have no right-side time.
        JoinKind::Interval { lo, .. } if left_outer => JoinRowTime {
            side: 0,
            delay: lo.saturating_neg().max(0),
        },
        JoinKind::Temporal { table } => JoinRowTime {
            side: 1 - table,
            delay: 0,
        },
        JoinKind::Interval { lo, .. } if lo >= 0 => JoinRowTime { side: 0, delay: 0 },
        JoinKind::Interval { hi, .. } if hi <= 0 => JoinRowTime { side: 1, delay: 0 },
        JoinKind::Interval { lo, .. } => JoinRowTime {
            side: 0,
            delay: lo.saturating_neg(),
        },
    }
}

/// How far `side`'s time can lie before a pair's completion (the later
/// time), or before an unmatched left row of a LEFT interval join comes out
/// (when it expires: its time minus the lower bound, the same limit).
fn delay_of(j: &JoinPlan, side: usize) -> Result<i64> {
    match j.kind {
        JoinKind::Interval { .. } if j.left_outer && side == 1 => Err(EngineError::unsupported(
            "the right side's time of a LEFT interval join is null in the rows padded with nulls",
            "use the left side's event time (in a window, or an outer join's time condition)",
        )),
        JoinKind::Temporal { table } if table == side => Err(EngineError::unsupported(
            "a window over a temporal join must use the stream side's event time, not the versioned table's",
            "window on the stream's time column",
        )),
        JoinKind::Temporal { .. } => Ok(0),
        JoinKind::Interval { .. } if j.until.is_some_and(|u| u.side == side) => {
            let u = j.until.expect("checked");
            let other = &j.sides[1 - side].schema;
            Err(EngineError::unsupported(
                format!(
                    "the {me} side's time cannot carry this join's rows: a pair is complete at the {them} side's time ({}), which only the {me} side's column {} bounds, so the {me} side's time can lie any time before it",
                    other.field(j.sides[1 - side].time_column).name(),
                    j.sides[side].schema.field(u.column).name(),
                    me = ["left", "right"][side],
                    them = ["left", "right"][1 - side],
                ),
                format!(
                    "use the {} side's event time (in a window, or an outer join's time condition)",
                    ["left", "right"][1 - side]
                ),
            ))
        }
        JoinKind::Interval { lo, .. } if side == 0 => Ok(lo.saturating_neg().max(0)),
        JoinKind::Interval { hi, .. } => Ok(hi.max(0)),
    }
}

/// The index in the joined schema of a side's time column.
fn joined_index(j: &JoinPlan, side: usize) -> usize {
    if side == 0 {
        j.sides[0].time_column
    } else {
        j.sides[0].schema.fields().len() + j.sides[1].time_column
    }
}

/// The stage's event time over a join: the row-time side's time column.
pub(super) fn time_column(input: &StageInput, j: &JoinPlan) -> Result<PhysicalExprRef> {
    let i = joined_index(j, j.row_time.side);
    let schema: &Schema = input.schema.as_arrow();
    Ok(Arc::new(PhysicalColumn::new(schema.field(i).name(), i)))
}

/// A window over a join: its time argument must be one side's time column;
/// the join's rows then carry that time.
pub(super) fn window_time(schema: &DFSchemaRef, j: &mut JoinPlan, arg: &Expr) -> Result<()> {
    let refuse = || {
        EngineError::unsupported(
            format!("a window over a join must use one side's event-time column, found {arg}"),
            "window on the time column the join bounds (or the stream side's, in a temporal join)",
        )
    };
    let mut e = arg;
    while let Expr::Cast(c) = e {
        e = &c.expr;
    }
    let Expr::Column(c) = e else {
        return Err(refuse());
    };
    let i = schema.index_of_column(c).map_err(|_| refuse())?;
    let side = (0..2)
        .find(|&s| joined_index(j, s) == i)
        .ok_or_else(refuse)?;
    j.row_time = JoinRowTime {
        side,
        delay: delay_of(j, side)?.saturating_add(j.sides[side].time_offset),
    };
    Ok(())
}

/// The input column an expression reads, if it is a bare column.
fn column_index(e: &PhysicalExprRef) -> Option<usize> {
    let any: &dyn std::any::Any = e.as_ref();
    any.downcast_ref::<PhysicalColumn>().map(|c| c.index())
}
