//! A query run with a checkpoint into a durable state store after every
//! batch, restarted from its latest checkpoint every few batches, as a
//! process killed right after a checkpoint would be.

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

/// What [`run_checkpointing`] saw.
pub struct Checkpointed {
    pub out: Output,
    /// Per batch, the bytes its checkpoint wrote: the snapshot and what it
    /// added to the store.
    pub written: Vec<usize>,
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
