//! A query run with a checkpoint into a durable state store after every
//! batch, restarted from its latest checkpoint every few batches, as a
//! process killed right after a checkpoint would be.

use arrow::array::RecordBatch;
use ubik_engine::progress::partition_id;
use ubik_engine::ubik_state::{StateStore, StoreOptions};
use ubik_engine::{Output, Query, QueryPlan, QuerySnapshot, SharedStore, StateOptions};

/// Bytes the query's store has written so far (its queued runs written first).
pub fn store_bytes(query: &Query) -> u64 {
    query
        .store()
        .and_then(|s| {
            s.if_open(|s| {
                s.finish_writes().expect("the store writes its runs");
                s.stats().bytes_written
            })
        })
        .unwrap_or(0)
}

/// The changelog `out` holds, printed as a table (to compare runs).
pub fn printed(out: &Output) -> String {
    let batches: Vec<RecordBatch> = out.changes.iter().map(|c| c.rows.clone()).collect();
    arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

/// What [`run_checkpointing`] (or [`run_in_memory`]) saw.
pub struct Checkpointed {
    pub out: Output,
    /// Per batch, the bytes its checkpoint wrote: the snapshot and what it
    /// added to the store (in memory: the whole state's snapshot).
    pub written: Vec<usize>,
}

/// [`run_checkpointing`]'s reference: one uninterrupted query with its
/// state in memory, its whole state snapshotted after each batch.
#[allow(dead_code)] // Not every test binary compares against it.
pub fn run_in_memory(
    plan: &QueryPlan,
    sources: usize,
    batches: usize,
    mut feed: impl FnMut(&mut Query, usize, &mut Output),
) -> Checkpointed {
    let mut query = Query::new(plan.clone()).unwrap();
    for source in 0..sources {
        query.add_partition(partition_id(source, 0));
    }
    let mut out = Output::default();
    let mut written = Vec::new();
    for i in 0..batches {
        feed(&mut query, i, &mut out);
        written.push(query.snapshot().unwrap().encode().unwrap().len());
    }
    query.finish(&mut out).unwrap();
    Checkpointed { out, written }
}

/// Runs `plan` (reading partition 0 of each of its `sources`) over
/// `batches` batches, `feed(query, i, out)` feeding batch `i`; after each,
/// a checkpoint, and every `restart_every` batches a new query restored
/// from it.
pub fn run_checkpointing(
    plan: &QueryPlan,
    sources: usize,
    batches: usize,
    restart_every: usize,
    mut feed: impl FnMut(&mut Query, usize, &mut Output),
) -> Checkpointed {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let store = StateStore::open(dir.path(), StoreOptions::default()).unwrap();
        let mut query = Query::with_state(
            plan.clone(),
            StateOptions {
                store: Some(SharedStore::durable(store)),
                memory: None,
            },
        )
        .unwrap();
        for source in 0..sources {
            query.add_partition(partition_id(source, 0));
        }
        query
    };
    let mut query = open();
    let mut out = Output::default();
    let mut written = Vec::new();
    for i in 0..batches {
        feed(&mut query, i, &mut out);
        let before = store_bytes(&query);
        let snapshot = query.snapshot().unwrap().encode().unwrap();
        written.push(snapshot.len() + (store_bytes(&query) - before) as usize);
        if i % restart_every == restart_every - 1 {
            drop(query);
            query = open();
            query
                .restore(QuerySnapshot::decode(&snapshot).unwrap())
                .unwrap();
        }
    }
    query.finish(&mut out).unwrap();
    Checkpointed { out, written }
}
