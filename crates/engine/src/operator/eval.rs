//! Evaluates group keys and aggregate inputs of an [`AggregatePlan`] on a batch.

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion_physical_expr::PhysicalExpr;

use crate::error::Result;
use crate::plan::{AggregatePlan, PhysicalExprRef};
use crate::state::AggInputs;

#[derive(Debug, Clone)]
pub struct AggEvaluator {
    group_exprs: Vec<PhysicalExprRef>,
    inputs: Vec<Vec<PhysicalExprRef>>,
    filters: Vec<Option<PhysicalExprRef>>,
}

pub(crate) fn eval_array(expr: &dyn PhysicalExpr, batch: &RecordBatch) -> Result<ArrayRef> {
    Ok(expr.evaluate(batch)?.into_array(batch.num_rows())?)
}

/// Every expression of `exprs` evaluated over `batch`.
pub(crate) fn eval_all(exprs: &[PhysicalExprRef], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| eval_array(e.as_ref(), batch))
        .collect()
}

/// A predicate's result with nulls read as false.
pub(crate) fn eval_predicate(expr: &dyn PhysicalExpr, batch: &RecordBatch) -> Result<BooleanArray> {
    let a = eval_array(expr, batch)?;
    let b = a.as_boolean_opt().ok_or_else(|| {
        crate::error::EngineError::internal(format!("predicate evaluated to {}", a.data_type()))
    })?;
    Ok(if b.null_count() > 0 {
        arrow::compute::prep_null_mask_filter(b)
    } else {
        b.clone()
    })
}

impl AggEvaluator {
    pub fn new(plan: &AggregatePlan) -> Self {
        Self {
            group_exprs: plan.group_exprs.clone(),
            inputs: plan
                .aggregates
                .iter()
                .map(|a| {
                    let all = a.function.all_expressions();
                    all.args.into_iter().chain(all.order_by_exprs).collect()
                })
                .collect(),
            filters: plan.aggregates.iter().map(|a| a.filter.clone()).collect(),
        }
    }

    pub fn keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        self.group_exprs
            .iter()
            .map(|e| eval_array(e.as_ref(), batch))
            .collect()
    }

    pub fn inputs(&self, batch: &RecordBatch) -> Result<AggInputs> {
        let args = self
            .inputs
            .iter()
            .map(|exprs| {
                exprs
                    .iter()
                    .map(|e| eval_array(e.as_ref(), batch))
                    .collect()
            })
            .collect::<Result<Vec<_>>>()?;
        let filters = self
            .filters
            .iter()
            .map(|f| {
                f.as_ref()
                    .map(|f| eval_predicate(f.as_ref(), batch))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AggInputs { args, filters })
    }
}
