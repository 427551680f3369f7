//! Lowering of an aggregation over a continuous aggregation (Nexmark q4:
//! `SELECT category, avg(final) FROM (SELECT max(price) AS final, category
//! ... GROUP BY id, category) GROUP BY category`) into a [`RegroupPlan`].

use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion_expr::logical_plan::{Aggregate, LogicalPlan};

use super::planner::{Chain, Lowering, StageInput};
use crate::accumulate::is_retractable;
use crate::error::{EngineError, Result};
use crate::plan::{QueryKind, QueryPlan, RegroupPlan};

impl Lowering {
    /// `outer` aggregates the result of another aggregation, `outer.input`.
    pub(super) fn lower_regroup(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        outer: &Aggregate,
        output_schema: Arc<Schema>,
    ) -> Result<QueryPlan> {
        let refuse = |what: String, hint: &str| {
            EngineError::unsupported(
                format!("{what} in an aggregation over a continuous aggregation"),
                hint.to_string(),
            )
        };
        // The inner aggregation, lowered as a query whose result is
        // `outer.input`; its groups are the operator's, so it needs no key.
        let inner_root: &LogicalPlan = &outer.input;
        let inner_top = Chain::walk(inner_root, true)?;
        let LogicalPlan::Aggregate(inner_agg) = inner_top.bottom else {
            return Err(EngineError::internal(
                "a regroup without an inner aggregation",
            ));
        };
        let mut inner_lowering = self.clone();
        inner_lowering.unkeyed = true;
        let inner = inner_lowering.lower_aggregation(inner_root, &inner_top, inner_agg)?;
        if let Some(w) = inner.plan.window {
            return Err(refuse(
                format!("a {} window in the inner aggregation", w.name()),
                "aggregate a continuous (unwindowed) GROUP BY, or group the outer query by the window column of a TUMBLE/HOP aggregation inside a join",
            ));
        }
        // The outer, over the inner result's columns (which have no event
        // time of their own: the inner's grid drives both).
        let mut outer_lowering = self.clone();
        outer_lowering.options.event_time = None;
        let stage_input = StageInput {
            schema: Arc::clone(inner_root.schema()),
            sources: Vec::new(),
            join: None,
        };
        let mut lowered = outer_lowering.lower_aggregation_over(
            root,
            top,
            outer,
            &Chain::over(inner_root),
            stage_input,
        )?;
        if let Some(w) = lowered.plan.window {
            return Err(refuse(
                format!("a {} window", w.name()),
                "group the outer query by columns of the inner result only",
            ));
        }
        if let Some(spec) = lowered.plan.aggregates.iter().find(|s| !is_retractable(s)) {
            return Err(refuse(
                format!(
                    "{}({}) (its state cannot take an inner row's old value back out)",
                    spec.function_name(),
                    spec.arg_types
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "the outer aggregation may use count, and sum or avg of DOUBLE (avg of any number); cast an integer sum's argument to DOUBLE",
            ));
        }
        // The last outer aggregate counts each group's inner rows: a group
        // left without any is retracted.
        lowered
            .plan
            .aggregates
            .push(self.rows_count(inner_root.schema())?);
        self.check_key_setting(
            &lowered.key_columns,
            &output_schema,
            "an aggregation's changelog key is its GROUP BY columns",
        )?;
        Ok(QueryPlan {
            sql: self.sql().to_string(),
            sources: inner.input.sources,
            join: inner.input.join,
            input_schema: Arc::new(inner.input.schema.as_arrow().clone()),
            output_schema,
            key_columns: lowered.key_columns,
            kind: QueryKind::Regroup(RegroupPlan {
                inner: inner.plan,
                inner_schema: Arc::new(inner_root.schema().as_arrow().clone()),
                outer: lowered.plan,
            }),
            options: self.options.clone(),
        })
    }
}
