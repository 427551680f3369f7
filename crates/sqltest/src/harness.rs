//! Runs a streaming query over in-memory input with a chosen batching,
//! partitioning and an optional snapshot/restore, and returns the changelog.

use arrow::array::RecordBatch;
use ubik_engine::{Output, Query, QueryPlan, QuerySnapshot, Reject};
use ubik_format::changelog::ChangelogEncoder;

use crate::Error;

/// One changelog record, as bytes on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    pub key: Option<String>,
    pub value: Option<String>,
    pub timestamp_ms: Option<i64>,
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} => {} @{:?}",
            self.key.as_deref().unwrap_or("null"),
            self.value.as_deref().unwrap_or("null"),
            self.timestamp_ms
        )
    }
}

/// A batch of source rows read from one partition.
#[derive(Debug, Clone)]
pub struct Feed {
    pub partition: u32,
    pub batch: RecordBatch,
    /// The rows are deletions of a versioned table's keys (tombstones).
    pub deletion: bool,
}

/// Splits `batch` into feeds of `size` rows for partition `partition`.
pub fn chunks(batch: &RecordBatch, partition: u32, size: usize) -> Vec<Feed> {
    let size = size.max(1);
    (0..batch.num_rows())
        .step_by(size)
        .map(|start| Feed {
            partition,
            batch: batch.slice(start, size.min(batch.num_rows() - start)),
            deletion: false,
        })
        .collect()
}

/// Runs `plan` over `feeds` in order; after feed `restore_after` (if any)
/// the query is snapshotted, encoded, decoded and restored into a new one,
/// as a crash-and-resume would.
pub fn run(
    plan: &QueryPlan,
    feeds: &[Feed],
    restore_after: Option<usize>,
) -> Result<Vec<Record>, Error> {
    Ok(run_with_rejects(plan, feeds, restore_after)?.records)
}

/// What a run produced.
#[derive(Debug, Default)]
pub struct RunOutput {
    /// The changelog.
    pub records: Vec<Record>,
    /// Rejected (dead-lettered) rows, each with the index of its feed.
    pub rejects: Vec<(usize, Reject)>,
}

/// [`run`], also returning the rejected (dead-lettered) rows.
pub fn run_with_rejects(
    plan: &QueryPlan,
    feeds: &[Feed],
    restore_after: Option<usize>,
) -> Result<RunOutput, Error> {
    run_checkpointing(plan, feeds, restore_after, None)
}

/// [`run_with_rejects`], also taking a snapshot (encoded, then dropped)
/// after every `snapshot_every` feeds while the query runs on, as a
/// pipeline's checkpoints do: taking one must not change the output.
pub fn run_checkpointing(
    plan: &QueryPlan,
    feeds: &[Feed],
    restore_after: Option<usize>,
    snapshot_every: Option<usize>,
) -> Result<RunOutput, Error> {
    let mut query = Query::new(plan.clone())?;
    let mut partitions: Vec<u32> = feeds.iter().map(|f| f.partition).collect();
    partitions.sort_unstable();
    partitions.dedup();
    if partitions.is_empty() {
        partitions.push(0);
    }
    for &p in &partitions {
        query.add_partition(p);
    }
    let mut encoder = ChangelogEncoder::new(
        &plan.output_schema,
        plan.key_columns.clone(),
        plan.has_record_key(),
    );
    let mut records = Vec::new();
    let mut rejects = Vec::new();
    let mut out = Output::default();
    let mut drain = |out: &mut Output, records: &mut Vec<Record>| -> Result<(), Error> {
        for c in &out.changes {
            encoder
                .encode(c, |r| {
                    records.push(Record {
                        key: r.key.map(|k| String::from_utf8_lossy(k).into_owned()),
                        value: r.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                        timestamp_ms: r.timestamp_ms,
                    });
                    Ok::<_, Error>(())
                })
                .map_err(|e| Error::Other(e.to_string()))??;
        }
        out.clear();
        Ok(())
    };
    for (i, feed) in feeds.iter().enumerate() {
        if feed.deletion {
            query.process_deletions(feed.partition, &feed.batch, &mut out)?;
        } else {
            query.process(feed.partition, &feed.batch, &mut out)?;
        }
        rejects.extend(out.rejects.drain(..).map(|r| (i, r)));
        drain(&mut out, &mut records)?;
        if snapshot_every.is_some_and(|n| (i + 1) % n.max(1) == 0) {
            query.snapshot()?.encode()?;
        }
        if restore_after == Some(i) {
            let bytes = query.snapshot()?.encode()?;
            let mut resumed = Query::new(plan.clone())?;
            resumed.restore(QuerySnapshot::decode(&bytes)?)?;
            query = resumed;
        }
    }
    query.finish(&mut out)?;
    drain(&mut out, &mut records)?;
    Ok(RunOutput { records, rejects })
}
