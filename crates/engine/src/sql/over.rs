//! Lowering of aggregate window functions over a top-N (Nexmark q6):
//! `SELECT Q.id, Q.seller, AVG(Q.price) OVER (PARTITION BY Q.seller ORDER BY
//! Q.date_time ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) FROM (SELECT ...
//! ROW_NUMBER() ... WHERE rn <= N) Q`, into an [`OverPlan`].
//!
//! The frame must be a bounded `ROWS` frame (a row's result then depends on
//! a fixed number of neighbours, so an update recomputes a fixed number of
//! rows), and the functions `count`, `sum`, `avg`, `min` and `max` of
//! numbers. The changelog is keyed by the top-N's key, which the result
//! must select.

use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Schema};
use datafusion_common::{Column, ScalarValue};
use datafusion_expr::logical_plan::{LogicalPlan, Window};
use datafusion_expr::{
    Expr, ExprSchemable, WindowFrame, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
    lit,
};

use super::planner::{Chain, Lowering};
use super::rank::ROW_NUMBER_COLUMN;
use crate::error::{EngineError, Result};
use crate::plan::{OverAggregate, OverFunction, OverPlan, QueryKind, QueryPlan};

/// The widest frame side: every change recomputes up to this many rows on
/// each side of it, from frames of this many rows.
pub const MAX_FRAME_ROWS: usize = 1000;

/// Whether `w` computes aggregate functions (not ROW_NUMBER and the like).
pub(super) fn is_aggregate_window(w: &Window) -> bool {
    w.window_expr.iter().any(|e| {
        matches!(
            e.clone().unalias_nested().data,
            Expr::WindowFunction(f) if matches!(f.fun, WindowFunctionDefinition::AggregateUDF(_))
        )
    })
}

impl Lowering {
    /// Window functions over a top-N: `top` leads from the result down to
    /// the `Window` node `w` that computes them.
    pub(super) fn lower_over(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        w: &Window,
        output_schema: Arc<Schema>,
    ) -> Result<QueryPlan> {
        if !top.filters()?.is_empty() {
            return Err(EngineError::unsupported(
                "a condition on the result of a window function (OVER ...) is not supported yet",
                "filter the rows before the window functions, in the subquery",
            ));
        }
        let inner = Chain::walk(&w.input, true)?;
        let rank_window = match inner.bottom {
            LogicalPlan::Window(r) if !is_aggregate_window(r) => r,
            LogicalPlan::Window(_) => {
                return Err(EngineError::unsupported(
                    "window functions with different OVER (...) clauses, or over other window functions' results, are not supported",
                    "give every window function of the query the same PARTITION BY, ORDER BY and frame",
                ));
            }
            _ => {
                return Err(EngineError::unsupported(
                    "aggregate window functions (OVER ...) run over a top-N's result only: SELECT ..., avg(x) OVER (PARTITION BY ... ORDER BY ... ROWS BETWEEN n PRECEDING AND CURRENT ROW) FROM (SELECT ..., ROW_NUMBER() OVER (...) AS rn FROM t) WHERE rn <= N",
                    "for aggregates over time use GROUP BY TUMBLE/HOP/SESSION; for a running aggregate per key, a continuous GROUP BY",
                ));
            }
        };
        let rank_df = w.input.schema();
        let rank_schema = Arc::new(rank_df.as_arrow().clone());
        let ranked = self.lower_rank(&w.input, &inner, rank_window, Arc::clone(&rank_schema))?;
        let QueryKind::Rank(rank) = ranked.kind else {
            return Err(EngineError::internal("a top-N lowered to another kind"));
        };

        let width = rank_df.fields().len();
        let mut spec = None;
        let mut functions = Vec::new();
        for (j, e) in w.window_expr.iter().enumerate() {
            let call = e.clone().unalias_nested().data;
            let Expr::WindowFunction(f) = &call else {
                return Err(EngineError::internal(
                    "a window node without a window function",
                ));
            };
            let name = f.fun.name().to_string();
            let aggregate = match (&f.fun, name.as_str()) {
                (WindowFunctionDefinition::AggregateUDF(_), "count") => OverAggregate::Count,
                (WindowFunctionDefinition::AggregateUDF(_), "sum") => OverAggregate::Sum,
                (WindowFunctionDefinition::AggregateUDF(_), "avg") => OverAggregate::Avg,
                (WindowFunctionDefinition::AggregateUDF(_), "min") => OverAggregate::Min,
                (WindowFunctionDefinition::AggregateUDF(_), "max") => OverAggregate::Max,
                _ => {
                    return Err(EngineError::unsupported(
                        format!(
                            "the window function {name}() cannot be mixed with aggregate window functions, or is not supported over a ROWS frame"
                        ),
                        "use count, sum, avg, min or max OVER (... ROWS BETWEEN n PRECEDING AND CURRENT ROW)",
                    ));
                }
            };
            let p = &f.params;
            if p.distinct || p.filter.is_some() {
                return Err(EngineError::unsupported(
                    format!("{name}(DISTINCT ...) or FILTER over a window frame is not supported"),
                    "compute it without DISTINCT or FILTER, or filter the rows in the subquery",
                ));
            }
            match &spec {
                None => spec = Some((p.partition_by.clone(), p.order_by.clone())),
                Some((part, order)) if *part == p.partition_by && *order == p.order_by => {}
                Some(_) => {
                    return Err(EngineError::unsupported(
                        "window functions with different PARTITION BY or ORDER BY in one query are not supported",
                        "give every window function the same PARTITION BY and ORDER BY",
                    ));
                }
            }
            if p.order_by.is_empty() {
                return Err(EngineError::unsupported(
                    format!(
                        "{name}() OVER without ORDER BY: which rows share a frame would depend on arrival order"
                    ),
                    "add ORDER BY and a ROWS frame: OVER (PARTITION BY ... ORDER BY ts ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)",
                ));
            }
            let (preceding, following) = frame_rows(&p.window_frame, &name)?;
            let arg = match p.args.as_slice() {
                // `count(*)` over a window keeps its wildcard: count rows.
                #[expect(deprecated)]
                [Expr::Wildcard { .. }] if aggregate == OverAggregate::Count => lit(1i64),
                [arg] => arg.clone(),
                _ => {
                    return Err(EngineError::unsupported(
                        format!("{name}() over a window frame takes one argument"),
                        "",
                    ));
                }
            };
            let arg = &arg;
            let arg_type = arg.to_field(rank_df)?.1.data_type().clone();
            let numeric =
                (arg_type.is_integer() && arg_type != DataType::UInt64) || arg_type.is_floating();
            if aggregate != OverAggregate::Count && !numeric {
                return Err(EngineError::unsupported(
                    format!(
                        "{name}() over a window frame of {arg_type} values is not supported: integers (but UNSIGNED BIGINT) and floats are"
                    ),
                    "cast the argument to BIGINT or DOUBLE",
                ));
            }
            functions.push(OverFunction {
                aggregate,
                arg: self.physical(arg, rank_df)?,
                preceding,
                following,
                field: Arc::clone(w.schema.field(width + j)),
            });
        }
        let Some((partition_by, order_by)) = spec else {
            return Err(EngineError::internal("a window node without functions"));
        };
        let mut partition_exprs = Vec::new();
        let mut partition_fields = Vec::new();
        for e in &partition_by {
            let (_, field) = e.to_field(rank_df)?;
            partition_fields.push(field);
            partition_exprs.push(self.physical(e, rank_df)?);
        }
        let order = order_by
            .iter()
            .map(|s| {
                Ok((
                    self.physical(&s.expr, rank_df)?,
                    SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;

        let outputs = top.outputs(root.schema())?;
        let projection = outputs
            .iter()
            .map(|e| self.physical(e, &w.schema))
            .collect::<Result<Vec<_>>>()?;
        // With one row per key, the row number is always 1: not a key column.
        let is_row_number = |k: usize| {
            let any: &dyn std::any::Any = rank.projection[k].as_ref();
            any.downcast_ref::<datafusion_physical_expr::expressions::Column>()
                .is_some_and(|c| c.name() == ROW_NUMBER_COLUMN)
        };
        let rank_key: Vec<usize> = ranked
            .key_columns
            .iter()
            .copied()
            .filter(|&k| rank.limit > 1 || !is_row_number(k))
            .collect();
        let mut key_columns = Vec::new();
        for &k in &rank_key {
            let column = Column::from(rank_df.qualified_field(k));
            match outputs
                .iter()
                .position(|o| matches!(o, Expr::Column(c) if *c == column))
            {
                Some(i) => key_columns.push(i),
                None => {
                    return Err(EngineError::unsupported(
                        format!(
                            "{} is not in the result: window functions over a top-N give one row per top-N row, keyed by the top-N's key ({})",
                            column.name,
                            rank_key
                                .iter()
                                .map(|&i| rank_df.field(i).name().as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        format!("select {column} in the outer SELECT"),
                    ));
                }
            }
        }
        key_columns.sort_unstable();
        self.check_key_setting(
            &key_columns,
            &output_schema,
            "window functions over a top-N are keyed by the top-N's key",
        )?;
        Ok(QueryPlan {
            sql: self.sql().to_string(),
            sources: ranked.sources,
            join: ranked.join,
            input_schema: ranked.input_schema,
            output_schema,
            key_columns,
            kind: QueryKind::Over(OverPlan {
                rank,
                rank_schema,
                partition_exprs,
                partition_fields,
                order,
                functions,
                over_schema: Arc::new(w.schema.as_arrow().clone()),
                projection,
            }),
            options: self.options.clone(),
        })
    }
}

/// Rows before and after the current row in a `ROWS BETWEEN` frame.
fn frame_rows(frame: &WindowFrame, name: &str) -> Result<(usize, usize)> {
    let hint = "write the frame as ROWS BETWEEN n PRECEDING AND CURRENT ROW (or m FOLLOWING)";
    if frame.units != WindowFrameUnits::Rows {
        return Err(EngineError::unsupported(
            format!(
                "{name}() OVER a {} frame is not supported (with ORDER BY and no frame, the frame is RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW): a stream's frames must be a bounded number of rows",
                frame.units
            ),
            hint,
        ));
    }
    let rows = |bound: &ScalarValue| -> Result<usize> {
        let n = match bound.cast_to(&DataType::UInt64) {
            Ok(ScalarValue::UInt64(Some(n))) => n as usize,
            _ => {
                return Err(EngineError::unsupported(
                    format!(
                        "{name}() OVER an UNBOUNDED frame is not supported: every row would be kept and recomputed"
                    ),
                    hint,
                ));
            }
        };
        if n > MAX_FRAME_ROWS {
            return Err(EngineError::unsupported(
                format!(
                    "a frame of {n} rows on one side is more than the {MAX_FRAME_ROWS} supported (each change recomputes that many rows)"
                ),
                format!("use at most {MAX_FRAME_ROWS} PRECEDING and FOLLOWING"),
            ));
        }
        Ok(n)
    };
    let preceding = match &frame.start_bound {
        WindowFrameBound::Preceding(v) => rows(v)?,
        WindowFrameBound::CurrentRow => 0,
        WindowFrameBound::Following(_) => {
            return Err(EngineError::unsupported(
                format!("{name}() OVER a frame that starts after the current row is not supported"),
                hint,
            ));
        }
    };
    let following = match &frame.end_bound {
        WindowFrameBound::Following(v) => rows(v)?,
        WindowFrameBound::CurrentRow => 0,
        WindowFrameBound::Preceding(_) => {
            return Err(EngineError::unsupported(
                format!("{name}() OVER a frame that ends before the current row is not supported"),
                hint,
            ));
        }
    };
    Ok((preceding, following))
}
