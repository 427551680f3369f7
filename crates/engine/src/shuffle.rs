//! The stateless first stage of a repartitioned query: rows stamped as
//! their own partition would stamp them, each routed to the partition of
//! its key (the GROUP BY or PARTITION BY columns), so that a second stage
//! reading one target partition holds every row of its keys.
//!
//! A row carries its event time and its stamp (its source partition's
//! watermark just before it) across the shuffle, and the second stage
//! takes both as given ([`crate::Query::process_given`]): which rows are
//! late is then decided exactly as one process reading the source
//! partitions would decide it, whatever the shuffle's interleaving.

use arrow::array::RecordBatch;
use arrow_row::{RowConverter, SortField};

use crate::error::{EngineError, Result};
use crate::operator::eval::eval_all;
use crate::plan::{PhysicalExprRef, QueryKind, QueryPlan};

/// Kept rows of one fed batch, routed.
#[derive(Debug, Default)]
pub struct Shuffled {
    /// The source partition id the rows came from.
    pub partition: u32,
    /// Each row's index in the batch given to `Query::process`.
    pub rows: Vec<u32>,
    pub times: Vec<i64>,
    pub stamps: Vec<i64>,
    /// Each row's target partition.
    pub targets: Vec<u32>,
}

/// Routes rows by a hash of their key columns.
pub struct Shuffler {
    exprs: Vec<PhysicalExprRef>,
    converter: Option<RowConverter>,
    partitions: u32,
}

impl Shuffler {
    /// The routing of `plan` over `partitions` target partitions; refuses
    /// queries a key routing cannot split (joins, pass-through, a nested
    /// aggregation, whose outer key is only known after the inner one).
    pub fn new(plan: &QueryPlan, partitions: u32) -> Result<Self> {
        let refuse = |what: &str| {
            Err(EngineError::unsupported(
                format!("{what} cannot be repartitioned by key yet"),
                "give the input partitioned by the result key (--partitioned-by)",
            ))
        };
        if plan.join.is_some() {
            return refuse("a join");
        }
        let (exprs, fields) = match &plan.kind {
            // Its rows must meet their key's earlier rows, which routing by
            // the GROUP BY key would scatter (an update moves a row between groups).
            QueryKind::Aggregate(a) if a.changelog.is_some() => {
                return refuse("a continuous GROUP BY over a changelog");
            }
            QueryKind::Aggregate(a) => (a.group_exprs.clone(), a.group_fields.clone()),
            QueryKind::Rank(r) => (r.partition_exprs.clone(), r.partition_fields.clone()),
            QueryKind::Regroup(_) => return refuse("an aggregation over an aggregation"),
            QueryKind::Over(_) => return refuse("window functions over a top-N"),
            QueryKind::Passthrough(_) => return refuse("a pass-through query (it needs no key)"),
        };
        let converter = if fields.is_empty() {
            None
        } else {
            Some(RowConverter::new(
                fields
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )?)
        };
        Ok(Self {
            exprs,
            converter,
            partitions: partitions.max(1),
        })
    }

    /// The target partition of each row of `batch` (source-schema rows).
    /// A pure function of the key's values: FNV-1a over Arrow's row format.
    pub fn targets(&self, batch: &RecordBatch) -> Result<Vec<u32>> {
        let Some(converter) = &self.converter else {
            // A global aggregate: one key, one partition.
            return Ok(vec![0; batch.num_rows()]);
        };
        let columns = eval_all(&self.exprs, batch)?;
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
}

impl std::fmt::Debug for Shuffler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shuffler({} partitions)", self.partitions)
    }
}
