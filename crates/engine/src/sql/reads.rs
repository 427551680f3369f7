//! Which columns of each source a query reads, so that decoders skip the
//! others (Nexmark q2 reads 3 of a bid's 7 columns, and not its two long
//! text ones).
//!
//! DataFusion's projection pruning finds the columns the SQL names (through
//! subqueries, aliases and joins); the engine reads a few more of its own
//! accord: every TIMESTAMP column (one may be the event time without being
//! named: the only one, or the one the source declares) and the primary key
//! of a keyed source. A ranking breaks ties by the columns its result uses,
//! which pruning finds.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion_common::tree_node::TreeNodeRecursion;
use datafusion_expr::logical_plan::LogicalPlan;
use datafusion_optimizer::optimize_projections::OptimizeProjections;
use datafusion_optimizer::optimizer::{Optimizer, OptimizerContext};

use crate::plan::QueryPlan;

/// Sets each source's `reads` from `logical`, the query's plan before
/// lowering. A source stays read in full when pruning fails or the source's
/// scan is not found.
pub(super) fn mark_reads(logical: &LogicalPlan, plan: &mut QueryPlan) {
    let Some(named) = named_columns(logical) else {
        return;
    };
    for source in &mut plan.sources {
        let Some(Some(columns)) = named.get(&source.name) else {
            continue;
        };
        let key = ubik_connector::primary_key(&source.schema);
        for (c, field) in source.schema.fields().iter().enumerate() {
            source.reads[c] = columns.contains(&c)
                || matches!(field.data_type(), DataType::Timestamp(_, _))
                || key.contains(&field.name().as_str());
        }
    }
}

/// Per table, the columns its scans read after projection pruning (`None`:
/// every column); `None` when pruning fails.
fn named_columns(logical: &LogicalPlan) -> Option<BTreeMap<String, Option<Vec<usize>>>> {
    let pruned = Optimizer::with_rules(vec![Arc::new(OptimizeProjections::new())])
        .optimize(logical.clone(), &OptimizerContext::new(), |_, _| {})
        .ok()?;
    let mut named: BTreeMap<String, Option<Vec<usize>>> = BTreeMap::new();
    pruned
        .apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                let entry = named
                    .entry(scan.table_name.table().to_string())
                    .or_insert_with(|| Some(Vec::new()));
                match (entry.as_mut(), &scan.projection) {
                    (Some(columns), Some(projection)) => columns.extend(projection),
                    _ => *entry = None,
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .ok()?;
    Some(named)
}
