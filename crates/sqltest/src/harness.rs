//! Runs a streaming query over in-memory input with a chosen batching,
//! partitioning and an optional snapshot/restore, and returns the changelog.
//! A run may keep its state in a state store with a tiny memory budget
//! ([`Spill`]), so every batch spills its groups and reads them back, and a
//! restore reopens the store as a restarted process would.

use std::collections::BTreeSet;

use arrow::array::RecordBatch;
use ubik_engine::ubik_state::{StateStore, StoreOptions};
use ubik_engine::{Output, Query, QueryPlan, QuerySnapshot, Reject, SharedStore, StateOptions};
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
    /// Which rows are deletions of a changelog's keys (tombstones); empty
    /// when none is.
    pub deleted: Vec<bool>,
}

/// Splits `batch` into feeds of `size` rows for partition `partition`.
pub fn chunks(batch: &RecordBatch, partition: u32, size: usize) -> Vec<Feed> {
    let size = size.max(1);
    (0..batch.num_rows())
        .step_by(size)
        .map(|start| Feed {
            partition,
            batch: batch.slice(start, size.min(batch.num_rows() - start)),
            deleted: Vec::new(),
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
    run_full(plan, feeds, restore_after, snapshot_every, None)
}

/// Where a run keeps its state: a state store in a temporary directory,
/// with this many bytes of memory (1: every group is spilled after every
/// batch and read back when touched again). A durable store is part of
/// the checkpoints (they refer to its files); a temporary one holds spills
/// only, and checkpoints carry the whole state (as a consumer group's do).
#[derive(Debug, Clone, Copy)]
pub struct Spill {
    pub memory: usize,
    pub durable: bool,
}

impl Spill {
    /// Every operator spills all it can after every batch.
    pub const TINY: Spill = Spill {
        memory: 1,
        durable: true,
    };
    /// [`Spill::TINY`] to a store that checkpoints do not refer to.
    pub const TINY_TEMPORARY: Spill = Spill {
        memory: 1,
        durable: false,
    };
}

/// A query over `plan` whose state lives in `dir` (opened anew, as a
/// restarted process opens it).
fn spilling_query(plan: &QueryPlan, dir: &std::path::Path, spill: Spill) -> Result<Query, Error> {
    let options = StoreOptions {
        cache_bytes: 64 * 1024,
        ..Default::default()
    };
    let store = if spill.durable {
        SharedStore::durable(
            StateStore::open(dir, options).map_err(ubik_engine::EngineError::from)?,
        )
    } else {
        SharedStore::temporary(Some(dir.to_path_buf()), options)
    };
    Ok(Query::with_state(
        plan.clone(),
        StateOptions {
            store: Some(store),
            memory: Some(spill.memory),
        },
    )?)
}

/// [`run_checkpointing`], with the state in a store when `spill` is given.
pub fn run_full(
    plan: &QueryPlan,
    feeds: &[Feed],
    restore_after: Option<usize>,
    snapshot_every: Option<usize>,
    spill: Option<Spill>,
) -> Result<RunOutput, Error> {
    let dir = match spill {
        Some(_) => Some(tempfile::tempdir().map_err(|e| Error::Other(e.to_string()))?),
        None => None,
    };
    let new_query = || match (spill, &dir) {
        (Some(spill), Some(dir)) => spilling_query(plan, dir.path(), spill),
        _ => Ok(Query::new(plan.clone())?),
    };
    let mut query = new_query()?;
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
        if feed.deleted.is_empty() {
            query.process(feed.partition, &feed.batch, &mut out)?;
        } else {
            query.process_changes(feed.partition, &feed.batch, &feed.deleted, &mut out)?;
        }
        rejects.extend(out.rejects.drain(..).map(|r| (i, r)));
        drain(&mut out, &mut records)?;
        if snapshot_every.is_some_and(|n| (i + 1) % n.max(1) == 0) {
            query.snapshot()?.encode()?;
        }
        if restore_after == Some(i) {
            let bytes = query.snapshot()?.encode()?;
            // The process ends (its store closes), another one resumes.
            drop(query);
            let mut resumed = new_query()?;
            let snapshot = QuerySnapshot::decode(&bytes)?;
            let pinned: BTreeSet<String> = snapshot
                .store
                .iter()
                .flat_map(|m| m.runs().map(String::from))
                .collect();
            resumed.restore(snapshot)?;
            resumed.retain_state(&pinned)?;
            query = resumed;
        }
    }
    query.finish(&mut out)?;
    drain(&mut out, &mut records)?;
    Ok(RunOutput { records, rejects })
}
