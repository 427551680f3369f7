//! Lowering of a top-N: `SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER
//! (PARTITION BY p ORDER BY o) AS rn FROM t) WHERE rn <= N` over a table or
//! a join, into a [`RankPlan`]. Any other use of a SQL window function
//! (`OVER`) is refused: without a bound on the row number every row would
//! be kept and re-ranked forever.

use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_common::tree_node::{Transformed, TreeNode};
use datafusion_common::{Column, DFSchema, DataFusionError, ScalarValue};
use datafusion_expr::logical_plan::{LogicalPlan, Window};
use datafusion_expr::utils::split_conjunction;
use datafusion_expr::{BinaryExpr, Expr, ExprSchemable, Operator};

use super::planner::{Chain, Lowering};
use crate::error::{EngineError, Result};
use crate::plan::{QueryKind, QueryPlan, RankPlan};

/// The row number's column in a ranked batch (after the input columns).
pub const ROW_NUMBER_COLUMN: &str = "__ubik_row_number";

impl Lowering {
    /// A top-N: `top` leads from the result down to the `Window` node `w`.
    pub(super) fn lower_rank(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        w: &Window,
        output_schema: Arc<Schema>,
    ) -> Result<QueryPlan> {
        let call = match w.window_expr.as_slice() {
            [one] => one.clone().unalias_nested().data,
            _ => {
                return Err(EngineError::unsupported(
                    "one ROW_NUMBER() per query is supported",
                    "keep a single ROW_NUMBER() OVER (...) and bound it in the outer WHERE",
                ));
            }
        };
        let Expr::WindowFunction(f) = &call else {
            return Err(EngineError::internal(
                "a window node without a window function",
            ));
        };
        if f.fun.name() != "row_number" {
            return Err(EngineError::unsupported(
                format!(
                    "the window function {}() is not supported: ubik runs ROW_NUMBER() bounded by the outer WHERE (a top-N per key)",
                    f.fun.name()
                ),
                "use ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) AS rn and WHERE rn <= N; for aggregates over time use GROUP BY TUMBLE/HOP/SESSION",
            ));
        }
        let params = &f.params;
        if params.order_by.is_empty() {
            return Err(EngineError::unsupported(
                "ROW_NUMBER() without ORDER BY: a row's number would depend on arrival order",
                "add ORDER BY inside OVER (...), e.g. ORDER BY price DESC",
            ));
        }
        let input_width = w.input.schema().fields().len();
        let rn = Column::from(w.schema.qualified_field(input_width));
        let limit = row_number_bound(&top.filters()?, &rn)?;

        let inner = Chain::walk(&w.input, false)?;
        let stage_input = self.stage_input(inner.bottom)?;
        let input_schema = Arc::clone(&stage_input.schema);
        let event_time = self.default_event_time(&stage_input)?;
        let filter = self.conjunction(inner.filters()?, &input_schema)?;
        let mut partition_exprs = Vec::new();
        let mut partition_fields = Vec::new();
        for e in &params.partition_by {
            let (_, field) = e.to_field(w.input.schema())?;
            partition_fields.push(field);
            partition_exprs.push(self.physical(&inner.unproject(e.clone())?, &input_schema)?);
        }
        let order = params
            .order_by
            .iter()
            .map(|s| {
                let expr = self.physical(&inner.unproject(s.expr.clone())?, &input_schema)?;
                Ok((
                    expr,
                    SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;

        // The result's expressions over the input columns and the row number.
        let outputs = top.outputs(root.schema())?;
        let over_input = outputs
            .iter()
            .map(|e| {
                Ok(e.clone()
                    .transform_up(|x| match x {
                        Expr::Column(c) if c == rn => Ok(Transformed::yes(Expr::Column(
                            Column::new_unqualified(ROW_NUMBER_COLUMN),
                        ))),
                        Expr::Column(c) => inner
                            .unproject(Expr::Column(c))
                            .map(Transformed::yes)
                            .map_err(|e| DataFusionError::External(Box::new(e))),
                        other => Ok(Transformed::no(other)),
                    })?
                    .data)
            })
            .collect::<Result<Vec<_>>>()?;
        // The kept rows hold the input columns the result uses, plus the
        // row number: rows equal in those give equal results, so ties are
        // broken by them alone, and the other columns are never stored.
        let used: std::collections::HashSet<&Column> =
            over_input.iter().flat_map(|e| e.column_refs()).collect();
        let kept: Vec<usize> = (0..input_schema.fields().len())
            .filter(|&i| used.contains(&Column::from(input_schema.qualified_field(i))))
            .collect();
        let mut ranked_fields: Vec<Field> = kept
            .iter()
            .map(|&i| input_schema.field(i).as_ref().clone())
            .collect();
        ranked_fields.push(Field::new(ROW_NUMBER_COLUMN, DataType::UInt64, false));
        let mut qualifiers: Vec<_> = kept
            .iter()
            .map(|&i| input_schema.qualified_field(i).0.cloned())
            .collect();
        qualifiers.push(None);
        let ranked_schema = Arc::new(Schema::new(ranked_fields));
        let ranked = DFSchema::from_field_specific_qualified_schema(qualifiers, &ranked_schema)?;
        let projection = over_input
            .iter()
            .map(|e| self.physical(e, &ranked))
            .collect::<Result<Vec<_>>>()?;

        let key_columns = rank_key(&outputs, &params.partition_by, &rn, limit, w)?;
        self.check_key_setting(
            &key_columns,
            &output_schema,
            "a top-N's changelog key is its PARTITION BY columns and row number",
        )?;
        Ok(QueryPlan {
            sql: self.sql().to_string(),
            sources: stage_input.sources,
            join: stage_input.join,
            input_schema: Arc::new(input_schema.as_arrow().clone()),
            output_schema,
            key_columns,
            kind: QueryKind::Rank(RankPlan {
                filter,
                event_time,
                partition_exprs,
                partition_fields,
                order,
                limit,
                kept,
                ranked_schema,
                projection,
            }),
            options: self.options.clone(),
        })
    }
}

/// The changelog key of a top-N: the PARTITION BY columns and the row
/// number, where they stand in the result (in SELECT order).
fn rank_key(
    outputs: &[Expr],
    partition_by: &[Expr],
    rn: &Column,
    limit: usize,
    w: &Window,
) -> Result<Vec<usize>> {
    let mut key = Vec::new();
    for p in partition_by {
        match outputs.iter().position(|o| o == p) {
            Some(i) => key.push(i),
            None => {
                return Err(EngineError::unsupported(
                    format!(
                        "PARTITION BY {p} is not in the result: a top-N's changelog key is its PARTITION BY columns (and row number), and without it two keys' rows would share a key"
                    ),
                    format!("select {p} in the outer SELECT"),
                ));
            }
        }
    }
    match outputs
        .iter()
        .position(|o| matches!(o, Expr::Column(c) if c == rn))
    {
        Some(i) => key.push(i),
        None if limit == 1 => {}
        None => {
            return Err(EngineError::unsupported(
                format!(
                    "the row number is not in the result: with {limit} rows per key, the row number tells them apart in the changelog key"
                ),
                format!(
                    "select the ROW_NUMBER() column ({}) in the outer SELECT, or bound it to 1",
                    w.schema.field(w.input.schema().fields().len()).name()
                ),
            ));
        }
    }
    key.sort_unstable();
    key.dedup();
    Ok(key)
}

/// N of `rn <= N` (or `rn < N + 1`, `rn = 1`) among `filters`, the outer
/// WHERE over the window's schema. Conditions on other columns are refused:
/// they would apply after ranking, hiding ranks rather than filling them.
fn row_number_bound(filters: &[Expr], rn: &Column) -> Result<usize> {
    let mut bound: Option<i64> = None;
    for f in filters {
        for conjunct in split_conjunction(f) {
            let Some(n) = bound_of(conjunct, rn) else {
                return Err(EngineError::unsupported(
                    format!(
                        "the condition {conjunct} applies after ROW_NUMBER(): only a bound on the row number (rn <= N) may follow the ranking"
                    ),
                    "move conditions on other columns into the subquery's WHERE, before the ranking",
                ));
            };
            bound = Some(bound.map_or(n, |b| b.min(n)));
        }
    }
    match bound {
        Some(n) if n > u32::MAX as i64 => Err(EngineError::unsupported(
            format!(
                "the bound on the row number ({n}) is more than the {} supported",
                u32::MAX
            ),
            format!("bound it to at most {} rows per key", u32::MAX),
        )),
        Some(n) if n >= 1 => Ok(n as usize),
        Some(n) => Err(EngineError::unsupported(
            format!("the bound on the row number keeps no row (rn <= {n})"),
            "bound it to at least 1",
        )),
        None => Err(EngineError::unsupported(
            "ROW_NUMBER() without a bound keeps and re-ranks every row of an unbounded stream",
            "bound it in the outer query: SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (...) AS rn FROM t) WHERE rn <= 10",
        )),
    }
}

/// The largest row number `e` keeps, if `e` bounds `rn` from above.
fn bound_of(e: &Expr, rn: &Column) -> Option<i64> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return None;
    };
    let is_rn = |x: &Expr| matches!(strip_cast(x), Expr::Column(c) if c == rn);
    let (op, value) = match (is_rn(left), is_rn(right)) {
        (true, false) => (*op, literal(right)?),
        (false, true) => (op.swap()?, literal(left)?),
        _ => return None,
    };
    match op {
        Operator::LtEq => Some(value),
        Operator::Lt => Some(value - 1),
        Operator::Eq if value == 1 => Some(1),
        _ => None,
    }
}

fn strip_cast(e: &Expr) -> &Expr {
    match e {
        Expr::Cast(c) => strip_cast(&c.expr),
        Expr::TryCast(c) => strip_cast(&c.expr),
        other => other,
    }
}

fn literal(e: &Expr) -> Option<i64> {
    match strip_cast(e) {
        Expr::Literal(v, _) => match v.cast_to(&DataType::Int64).ok()? {
            ScalarValue::Int64(Some(n)) => Some(n),
            _ => None,
        },
        _ => None,
    }
}
