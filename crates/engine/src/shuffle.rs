//! The stateless first stage of a repartitioned query: rows stamped as
//! their own partition would stamp them, each routed to the partition of
//! its key, so that a second stage reading one target partition holds
//! every row of its keys.
//!
//! The key is the GROUP BY or PARTITION BY columns of a query over one
//! source. A join routes both sides by its equality key (co-partitioned:
//! equal keys hash alike on both sides), when the operator after the join
//! is keyed by columns holding that key (a top-N per auction after a join
//! on the auction id). Anything else whose rows must meet (an aggregation
//! of an aggregation, window functions, a global aggregate, a join of
//! joins, a join whose later operator regroups) is routed whole to one
//! target: correct, and run by one task ([`Shuffler::single`]).
//!
//! A row carries its event time and its stamp (its source partition's
//! watermark just before it) across the shuffle, and the second stage
//! takes both as given ([`crate::Query::process_given`]): which rows are
//! late is then decided exactly as one process reading the source
//! partitions would decide it, whatever the shuffle's interleaving.

use std::collections::BTreeSet;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema};
use arrow_row::{RowConverter, SortField};
use datafusion_physical_expr::expressions::Column;

use crate::error::{EngineError, Result};
use crate::operator::eval::eval_all;
use crate::plan::{JoinPlan, PhysicalExprRef, QueryKind, QueryPlan, SideInput};

/// Kept rows of one fed batch, routed.
#[derive(Debug, Default)]
pub struct Shuffled {
    /// The source partition id the rows came from.
    pub partition: u32,
    /// The join leaf the rows feed, in the join tree's depth-first order
    /// (0 without a join): a self-join routes a row once per side.
    pub leaf: u8,
    /// The rows are deletions of a versioned table's keys.
    pub deletion: bool,
    /// Each row's index in the batch given to `Query::process`.
    pub rows: Vec<u32>,
    pub times: Vec<i64>,
    pub stamps: Vec<i64>,
    /// Each row's target partition.
    pub targets: Vec<u32>,
}

/// How one leaf's rows are routed.
enum Route {
    /// By a hash of these expressions' values (over the rows the leaf
    /// routes: source rows, or a join side's projected rows).
    Key {
        exprs: Vec<PhysicalExprRef>,
        converter: RowConverter,
    },
    /// Every row to target 0.
    One,
}

/// Routes rows by a hash of their key columns.
pub struct Shuffler {
    /// One per join leaf (one without a join).
    routes: Vec<Route>,
    partitions: u32,
}

impl Shuffler {
    /// The routing of `plan` over `partitions` target partitions; refuses
    /// what the first stage cannot route (a pass-through needs no key; a
    /// continuous GROUP BY over a changelog needs its rows' earlier
    /// versions, which a first stage does not have).
    pub fn new(plan: &QueryPlan, partitions: u32) -> Result<Self> {
        let refuse = |what: &str| {
            Err(EngineError::unsupported(
                format!("{what} cannot be repartitioned by key yet"),
                "give the input partitioned by the result key (--partitioned-by)",
            ))
        };
        let partitions = partitions.max(1);
        if let Some(join) = &plan.join {
            let routes = match join_routes(plan, join)? {
                Some(keyed) => keyed,
                None => (0..leaves(join)).map(|_| Route::One).collect(),
            };
            return Ok(Self { routes, partitions });
        }
        let (exprs, fields) = match &plan.kind {
            // Its rows must meet their key's earlier rows, which routing by
            // the GROUP BY key would scatter (an update moves a row between groups).
            QueryKind::Aggregate(a) if a.changelog.is_some() => {
                return refuse("a continuous GROUP BY over a changelog");
            }
            QueryKind::Aggregate(a) => (a.group_exprs.clone(), a.group_fields.clone()),
            QueryKind::Rank(r) => (r.partition_exprs.clone(), r.partition_fields.clone()),
            // The outer key is only known after the inner aggregation, and
            // window functions read a whole top-N: one task sees every row.
            QueryKind::Regroup(_) | QueryKind::Over(_) => (Vec::new(), Vec::new()),
            QueryKind::Passthrough(_) => return refuse("a pass-through query (it needs no key)"),
        };
        let route = match fields.is_empty() {
            // A global aggregate: one key, one partition.
            true => Route::One,
            false => Route::Key {
                exprs,
                converter: RowConverter::new(
                    fields
                        .iter()
                        .map(|f| SortField::new(f.data_type().clone()))
                        .collect(),
                )?,
            },
        };
        Ok(Self {
            routes: vec![route],
            partitions,
        })
    }

    /// Whether every row goes to one target, so one task runs the stage.
    pub fn single(&self) -> bool {
        self.routes.iter().all(|r| matches!(r, Route::One))
    }

    /// The target partition of each row of `batch`, the rows `leaf` routes
    /// (source rows, or a join side's rows). A pure function of the key's
    /// values: FNV-1a over Arrow's row format.
    pub fn targets(&self, leaf: u8, batch: &RecordBatch) -> Result<Vec<u32>> {
        let route = self
            .routes
            .get(leaf as usize)
            .ok_or_else(|| EngineError::internal("a join leaf the shuffle does not route"))?;
        let Route::Key { exprs, converter } = route else {
            return Ok(vec![0; batch.num_rows()]);
        };
        let columns = eval_all(exprs, batch)?;
        let rows = converter.convert_columns(&columns)?;
        Ok((0..rows.num_rows())
            .map(|i| {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for &b in rows.row(i).as_ref() {
                    h ^= b as u64;
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
                (h % self.partitions as u64) as u32
            })
            .collect())
    }

    /// Whether `leaf` routes projected side rows (a join side reading
    /// source rows, routed by its key) rather than source rows.
    pub fn routes_side_rows(&self, leaf: u8) -> bool {
        matches!(self.routes.get(leaf as usize), Some(Route::Key { .. }))
    }
}

/// The leaves of a join tree: the sides reading sources.
pub fn leaves(join: &JoinPlan) -> usize {
    leaf_sources(join).len()
}

/// The source each leaf of a join tree reads, in depth-first order.
pub fn leaf_sources(join: &JoinPlan) -> Vec<usize> {
    join.sides
        .iter()
        .flat_map(|s| match &s.input {
            SideInput::Join { plan, .. } => leaf_sources(plan),
            input => input.source().into_iter().collect(),
        })
        .collect()
}

/// Whether a source feeds several leaves (a self-join): a first stage
/// then routes each of its batches as one run per leaf, so a second stage
/// may not take a run's times or stamps as its partition's progress (the
/// next leaf's run holds rows from before them); only progress records
/// advance it.
pub fn shares_sources(join: &JoinPlan) -> bool {
    let sources = leaf_sources(join);
    let distinct: BTreeSet<usize> = sources.iter().copied().collect();
    distinct.len() < sources.len()
}

/// Routes by the join's equality key when both sides read source rows and
/// the operator after the join keeps rows of one key together (its key
/// holds every component of the join key, as a column of a side that
/// carries it in every joined row); `None` otherwise.
fn join_routes(plan: &QueryPlan, join: &JoinPlan) -> Result<Option<Vec<Route>>> {
    let [left, right] = &join.sides;
    let rows_sides = [left, right]
        .iter()
        .all(|s| matches!(s.input, SideInput::Rows { .. }));
    if !rows_sides || left.keys.is_empty() || left.keys.len() != right.keys.len() {
        return Ok(None);
    }
    // Equal keys must hash alike on both sides: the same types.
    let types = |side: &crate::plan::JoinSide| -> Result<Vec<DataType>> {
        side.keys
            .iter()
            .map(|k| Ok(k.data_type(&side.schema)?))
            .collect()
    };
    let key_types = types(left)?;
    if key_types != types(right)? {
        return Ok(None);
    }
    // Columns of the joined schema holding key component i: the left
    // side's always; the right side's too unless a LEFT JOIN pads it.
    let column = |k: &PhysicalExprRef| column_of(k).map(Column::index);
    let width = left.schema.fields().len();
    let holders: Vec<BTreeSet<usize>> = (0..left.keys.len())
        .map(|i| {
            let mut at = BTreeSet::new();
            at.extend(column(&left.keys[i]));
            if !join.left_outer {
                at.extend(column(&right.keys[i]).map(|c| c + width));
            }
            at
        })
        .collect();
    let later: Option<&[PhysicalExprRef]> = match &plan.kind {
        QueryKind::Passthrough(_) => Some(&[]),
        QueryKind::Aggregate(a) if a.changelog.is_none() => Some(&a.group_exprs),
        QueryKind::Rank(r) => Some(&r.partition_exprs),
        _ => None,
    };
    let Some(later) = later else {
        return Ok(None);
    };
    let passthrough = matches!(plan.kind, QueryKind::Passthrough(_));
    let keyed_by: BTreeSet<usize> = later.iter().filter_map(column).collect();
    if !passthrough && !holders.iter().all(|h| !h.is_disjoint(&keyed_by)) {
        return Ok(None);
    }
    let converter = || {
        RowConverter::new(
            key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )
    };
    Ok(Some(vec![
        Route::Key {
            exprs: left.keys.clone(),
            converter: converter()?,
        },
        Route::Key {
            exprs: right.keys.clone(),
            converter: converter()?,
        },
    ]))
}

/// The columns a plan's rows are routed by, for `validate` and status
/// pages: names over the input they are read from, or `None` when the
/// stage runs as one task.
pub fn describe(plan: &QueryPlan) -> Option<Vec<String>> {
    let names = |exprs: &[PhysicalExprRef], schema: &Schema| -> Vec<String> {
        exprs
            .iter()
            .map(|e| match column_of(e) {
                Some(c) => schema.field(c.index()).name().clone(),
                None => e.to_string(),
            })
            .collect()
    };
    let shuffler = Shuffler::new(plan, 2).ok()?;
    if shuffler.single() {
        return None;
    }
    match &plan.join {
        Some(j) => Some(
            j.sides
                .iter()
                .map(|s| names(&s.keys, &s.schema).join(", "))
                .collect::<Vec<_>>()
                .join(" = "),
        )
        .map(|k| vec![k]),
        None => match &plan.kind {
            QueryKind::Aggregate(a) => Some(names(&a.group_exprs, &plan.input_schema)),
            QueryKind::Rank(r) => Some(names(&r.partition_exprs, &plan.input_schema)),
            _ => None,
        },
    }
}

/// The column an expression is, if it is a plain one.
fn column_of(e: &PhysicalExprRef) -> Option<&Column> {
    let any: &dyn std::any::Any = e.as_ref();
    any.downcast_ref::<Column>()
}

impl std::fmt::Debug for Shuffler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shuffler({} partitions)", self.partitions)
    }
}
