//! Queries over a changelog source (a Debezium topic, marked with
//! [`ubik_connector::CHANGELOG_METADATA`]): which plans may read one, and
//! what they need.
//!
//! A changelog's rows are upserts of their primary key's current row and
//! its deletions remove the key, so a plan must be able to take a row back:
//! - a continuous GROUP BY, with retractable aggregates (counts, sums,
//!   averages, and `min`/`max`, which then count their values);
//! - the versioned side of a temporal join (each row is the key's version
//!   from its time on; a deletion ends it);
//! - a pass-through, keyed by the primary key (an upsert changelog).
//!
//! Windows are refused: a window closes once, and a later update of a row
//! it counted could not be taken back out of it.

use datafusion_expr::Expr;
use ubik_connector::{is_changelog, primary_key};

use super::planner::StageInput;
use crate::accumulate::is_retractable;
use crate::error::{EngineError, Result};
use crate::plan::{AggregateSpec, ChangelogInput, QueryKind, QueryPlan, SourceTable, WindowSpec};

/// The changelog source a stage reads alone (no join), if it reads one.
pub(super) fn source(input: &StageInput) -> Option<&SourceTable> {
    match (&input.join, input.sources.as_slice()) {
        (None, [s]) if is_changelog(&s.schema) => Some(s),
        _ => None,
    }
}

/// A continuous aggregation over `source`: every aggregate retracting, a
/// hidden row count (`rows`) appended, the primary key found.
pub(super) fn retracting(
    source: &SourceTable,
    window: Option<WindowSpec>,
    aggregates: &mut Vec<AggregateSpec>,
    rows: AggregateSpec,
) -> Result<ChangelogInput> {
    if let Some(w) = window {
        return Err(EngineError::unsupported(
            format!(
                "a {} window over `{}`, a changelog (its rows are updated and deleted): a window is emitted once when it closes, and a later update of a row it counted could not be taken back out of it",
                w.name(),
                source.name
            ),
            "aggregate it continuously (GROUP BY without a window: each group's result stays current), or read an append-only topic",
        ));
    }
    for spec in aggregates.iter_mut() {
        spec.retracting = true;
        if !is_retractable(spec) {
            return Err(EngineError::unsupported(
                format!(
                    "`{}` over `{}`, a changelog: an update takes the old row back out of its group, and {} cannot take a row back",
                    spec.field.name(),
                    source.name,
                    spec.function_name()
                ),
                "use count, sum, avg, min or max (without DISTINCT) over a changelog",
            ));
        }
    }
    aggregates.push(rows);
    Ok(ChangelogInput {
        key: key_columns(source)?,
    })
}

/// The primary key's columns in `source`'s schema.
fn key_columns(source: &SourceTable) -> Result<Vec<usize>> {
    let names = primary_key(&source.schema);
    if names.is_empty() {
        return Err(EngineError::Schema(format!(
            "`{}` is a changelog but declares no PRIMARY KEY: its rows are upserts of a key, so the key must be known; add PRIMARY KEY to its schema",
            source.name
        )));
    }
    names
        .iter()
        .map(|n| {
            source.schema.index_of(n).map_err(|_| {
                EngineError::Schema(format!(
                    "primary key column `{n}` is not in `{}`",
                    source.name
                ))
            })
        })
        .collect()
}

/// The result columns keying a pass-through of a changelog: its primary
/// key's columns, which the SELECT list must hold as plain columns.
pub(super) fn passthrough_key(input: &StageInput, outputs: &[Expr]) -> Result<Vec<usize>> {
    let source = source(input).expect("a changelog source");
    key_columns(source)?
        .into_iter()
        .map(|c| {
            let name = source.schema.field(c).name();
            outputs
                .iter()
                .position(|e| matches!(e, Expr::Column(col) if col.name == *name))
                .ok_or_else(|| {
                    EngineError::unsupported(
                        format!(
                            "this query passes `{}`, a changelog, through: its result is an upsert changelog keyed by the primary key, and SELECT does not include the key column `{name}`",
                            source.name
                        ),
                        format!("add `{name}` to the SELECT list"),
                    )
                })
        })
        .collect()
}

/// Refuses a plan that reads a changelog source where it cannot apply
/// updates and deletions.
pub(super) fn check(plan: &QueryPlan) -> Result<()> {
    for (i, source) in plan.sources.iter().enumerate() {
        if !is_changelog(&source.schema) {
            continue;
        }
        let applied = match (&plan.join, &plan.kind) {
            (Some(j), _) => j.versions(i),
            (None, QueryKind::Aggregate(a)) => a.changelog.is_some(),
            (None, QueryKind::Passthrough(p)) => p.changelog,
            (None, _) => false,
        };
        if applied {
            continue;
        }
        let (what, hint) = match (&plan.join, &plan.kind) {
            (Some(_), _) => (
                "joins it as a stream",
                "join it as the versioned side of a temporal join (FOR SYSTEM_TIME AS OF)",
            ),
            (None, QueryKind::Passthrough(_)) => (
                "sets its own result key",
                "drop the key setting: the result is keyed by the primary key",
            ),
            _ => (
                "aggregates or ranks it in a way that cannot take rows back",
                "use a continuous GROUP BY, a temporal join or a pass-through",
            ),
        };
        return Err(EngineError::unsupported(
            format!(
                "`{}` is a changelog (its rows are updated and deleted), and this query {what}",
                source.name
            ),
            hint,
        ));
    }
    Ok(())
}
