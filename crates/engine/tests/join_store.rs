//! A join's state on the state store. A temporal join's versioned table:
//! under a memory budget its keys' versions go to the store and come back
//! when probed, with the same joined rows as in memory, and a checkpoint
//! writes the versions that changed, not the table. The rows a join holds
//! for the watermark: a checkpoint writes those that arrived since the
//! previous one, and a restore reads back the rest.

use ubik_engine::progress::partition_id;
use ubik_engine::ubik_state::{StateStore, StoreOptions};
use ubik_engine::{
    Catalog, Output, Query, QueryOptions, QueryPlan, QuerySnapshot, SharedStore, StateOptions,
    plan_query,
};

const SQL: &str = "SELECT s.k, s.ts, v.ts AS version_ts, v.expires \
                   FROM s JOIN t FOR SYSTEM_TIME AS OF s.ts AS v ON s.k = v.k";

mod checkpointing;
mod keyed_rows;

use checkpointing::{printed, run_checkpointing, store_bytes};

use keyed_rows::{rows, schema};

fn plan() -> QueryPlan {
    let catalog = Catalog::new()
        .with_table("s", schema())
        .with_table("t", schema());
    let options = QueryOptions {
        lateness_us: 0,
        // The version time, among the two TIMESTAMP columns.
        event_time: Some("ts".into()),
        ..QueryOptions::default()
    };
    plan_query(SQL, &catalog, options).unwrap()
}

const KEYS: i64 = 20_000;
const STEP: i64 = 1000;

/// The table versions key i mod KEYS at i ms (every key every 20 s); the
/// stream probes keys spread over all of them, so most probes find a key
/// whose versions left memory long ago.
fn feed(query: &mut Query, plan: &QueryPlan, from: i64, out: &mut Output) {
    let [s, t] = ["s", "t"].map(|n| partition_id(plan.source_index(n).unwrap(), 0));
    query
        .process(t, &rows(from, from + STEP, |i| i % KEYS), out)
        .unwrap();
    query
        .process(s, &rows(from, from + STEP, |i| (i * 7919) % KEYS), out)
        .unwrap();
}

/// A query over `plan` reading one partition of each of its two tables.
fn new_query(plan: &QueryPlan, store: Option<SharedStore>) -> Query {
    let mut query = match store {
        Some(store) => Query::with_state(
            plan.clone(),
            StateOptions {
                store: Some(store),
                memory: Some(1),
            },
        )
        .unwrap(),
        None => Query::new(plan.clone()).unwrap(),
    };
    for source in 0..2 {
        query.add_partition(partition_id(source, 0));
    }
    query
}

const ROWS: i64 = 60_000;

#[test]
fn a_versioned_table_spilled_after_every_batch_joins_the_same() {
    let plan = plan();
    let mut expected = Output::default();
    let mut memory = new_query(&plan, None);
    for from in (0..ROWS).step_by(STEP as usize) {
        feed(&mut memory, &plan, from, &mut expected);
    }
    memory.finish(&mut expected).unwrap();
    assert_eq!(memory.spill_stats().groups, 0);
    let expected = printed(&expected);
    assert!(expected.lines().count() > 50_000, "most stream rows join");

    for durable in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let open = || match durable {
            true => {
                SharedStore::durable(StateStore::open(dir.path(), StoreOptions::default()).unwrap())
            }
            false => SharedStore::temporary(Some(dir.path().to_path_buf()), Default::default()),
        };
        // A checkpoint halfway, then a new query (a restarted process)
        // restored from it.
        let mut out = Output::default();
        let mut query = new_query(&plan, Some(open()));
        for from in (0..ROWS / 2).step_by(STEP as usize) {
            feed(&mut query, &plan, from, &mut out);
        }
        let spilled = query.spill_stats().groups;
        let snapshot = query.snapshot().unwrap().encode().unwrap();
        drop(query);
        let mut query = new_query(&plan, Some(open()));
        query
            .restore(QuerySnapshot::decode(&snapshot).unwrap())
            .unwrap();
        for from in (ROWS / 2..ROWS).step_by(STEP as usize) {
            feed(&mut query, &plan, from, &mut out);
        }
        query.finish(&mut out).unwrap();
        assert!(
            spilled > 10_000,
            "{spilled} keys spilled (durable: {durable})"
        );
        assert!(query.spill_stats().groups > 10_000);
        assert_eq!(printed(&out), expected, "durable store: {durable}");
    }
}

/// The bytes a checkpoint writes: its snapshot, and what it adds to the store.
fn checkpoint_bytes(query: &mut Query) -> usize {
    let before = store_bytes(query);
    let snapshot = query.snapshot().unwrap().encode().unwrap().len();
    snapshot + (store_bytes(query) - before) as usize
}

#[test]
fn a_checkpoint_writes_the_versions_that_changed() {
    let plan = plan();
    let dir = tempfile::tempdir().unwrap();
    let store =
        SharedStore::durable(StateStore::open(dir.path(), StoreOptions::default()).unwrap());
    let mut query = Query::with_state(
        plan.clone(),
        StateOptions {
            store: Some(store),
            memory: None,
        },
    )
    .unwrap();
    let [s, t] = ["s", "t"].map(|n| partition_id(plan.source_index(n).unwrap(), 0));
    query.add_partition(s);
    query.add_partition(t);
    let mut out = Output::default();
    // 100 000 keys' first versions, then 100 keys' second ones.
    for from in (0..100_000).step_by(STEP as usize) {
        query
            .process(t, &rows(from, from + STEP, |i| i), &mut out)
            .unwrap();
        query
            .process(s, &rows(from, from + STEP, |i| i), &mut out)
            .unwrap();
    }
    let whole = checkpoint_bytes(&mut query);
    query
        .process(t, &rows(100_000, 100_100, |i| i - 100_000), &mut out)
        .unwrap();
    query
        .process(s, &rows(100_000, 100_100, |i| i), &mut out)
        .unwrap();
    let change = checkpoint_bytes(&mut query);
    assert!(
        whole > 1_000_000,
        "the first checkpoint wrote {whole} bytes"
    );
    assert!(
        change * 50 < whole,
        "a checkpoint after 100 new versions wrote {change} bytes, the first {whole}"
    );
}

/// An interval LEFT join holding a minute of rows per side: left rows that
/// find no right row come out padded when they expire.
const INTERVAL: &str = "SELECT a.k, a.ts, b.ts AS b_ts FROM a LEFT JOIN b ON a.k = b.k \
                        AND a.ts BETWEEN b.ts AND b.ts + INTERVAL '60' SECOND";

/// `sql` over tables `a` and `b` of [`schema`], on time by `ts`.
fn plan_ab(sql: &str) -> QueryPlan {
    let catalog = Catalog::new()
        .with_table("a", schema())
        .with_table("b", schema());
    let options = QueryOptions {
        lateness_us: 0,
        event_time: Some("ts".into()),
        ..QueryOptions::default()
    };
    plan_query(sql, &catalog, options).unwrap()
}

fn interval_plan() -> QueryPlan {
    plan_ab(INTERVAL)
}

/// Batch `from` of both sides: about one right row in the left row's
/// minute has its key.
fn feed_interval(query: &mut Query, plan: &QueryPlan, from: i64, out: &mut Output) {
    let [a, b] = ["a", "b"].map(|n| partition_id(plan.source_index(n).unwrap(), 0));
    query
        .process(b, &rows(from, from + STEP, |i| (i * 7919) % 50_000), out)
        .unwrap();
    query
        .process(a, &rows(from, from + STEP, |i| i % 50_000), out)
        .unwrap();
}

#[test]
fn checkpoints_write_the_rows_that_arrived_and_restores_read_the_rest() {
    const N: i64 = 150_000;
    let plan = interval_plan();
    let mut expected = Output::default();
    let mut memory = new_query(&plan, None);
    let mut whole = Vec::new();
    for from in (0..N).step_by(STEP as usize) {
        feed_interval(&mut memory, &plan, from, &mut expected);
        whole.push(memory.snapshot().unwrap().encode().unwrap().len());
    }
    memory.finish(&mut expected).unwrap();
    let expected = printed(&expected);
    assert!(expected.lines().count() > 100_000);

    // A checkpoint after every batch, and every 20 batches a new query
    // (a restarted process) restored from it.
    let run = run_checkpointing(&plan, 2, (N / STEP) as usize, 20, |query, i, out| {
        feed_interval(query, &plan, i as i64 * STEP, out);
    });
    let (out, written) = (run.out, run.written);
    assert_eq!(printed(&out), expected);
    // Past the first minute each side holds about 60 000 rows, and a
    // batch brings 1 000; a restart writes nothing anew (the restored
    // rows are in the store already).
    let (whole, written) = (whole[100], written[100..].iter().max().copied().unwrap());
    assert!(
        written * 10 < whole,
        "a checkpoint wrote up to {written} bytes, the whole state is {whole}"
    );
}

/// An interval join whose left rows end at their own `expires`, like
/// auctions and their bids.
const UNTIL: &str = "SELECT a.k, a.ts, b.ts AS b_ts FROM a JOIN b ON a.k = b.k \
                     AND b.ts BETWEEN a.ts AND a.expires";

/// Rows of keys `keys`, each at `at` (ms) and expiring at `expires` (ms).
fn rows_at(keys: &[i64], at: i64, expires: i64) -> arrow::array::RecordBatch {
    use arrow::array::{Int64Array, TimestampMicrosecondArray};
    let micros = |ms: i64| {
        std::sync::Arc::new(
            TimestampMicrosecondArray::from_iter_values(keys.iter().map(|_| ms * 1000))
                .with_timezone("UTC"),
        )
    };
    arrow::array::RecordBatch::try_new(
        schema(),
        vec![
            std::sync::Arc::new(Int64Array::from(keys.to_vec())),
            micros(at),
            micros(expires),
        ],
    )
    .unwrap()
}

/// The rows a join logged last can be gone when a checkpoint is restored
/// (a row that came later may end sooner), and rows numbered after a
/// restore must still be logged at the next checkpoint: a second restore
/// then still has them. (Numbering restarted after the last row alive, so
/// such rows were never written and a second restart lost them: a group's
/// keyed task moved twice lost joined rows.)
#[test]
fn rows_after_a_restore_survive_the_next_one() {
    let plan = plan_ab(UNTIL);
    let [a0, b0] = ["a", "b"].map(|n| partition_id(plan.source_index(n).unwrap(), 0));
    let a1 = partition_id(plan.source_index("a").unwrap(), 1);
    let open_query = |store: Option<SharedStore>| {
        let mut query = match store {
            Some(store) => Query::with_state(
                plan.clone(),
                StateOptions {
                    store: Some(store),
                    memory: None,
                },
            )
            .unwrap(),
            None => Query::new(plan.clone()).unwrap(),
        };
        for p in [a0, a1, b0] {
            query.add_partition(p);
        }
        query
    };
    // Each step, then a checkpoint and a restart from it.
    type Step = Box<dyn Fn(&mut Query, &mut Output)>;
    let steps: Vec<Step> = vec![
        Box::new(move |q, out| {
            // Long-lived rows first, then (last in) rows that end soon.
            q.process(a0, &rows_at(&[1, 2, 3], 1_000, 100_000), out)
                .unwrap();
            q.process(a1, &rows_at(&[5, 6], 2_000, 3_000), out).unwrap();
        }),
        Box::new(move |q, out| {
            // The rows that end soon are gone, but stored.
            for p in [a0, a1, b0] {
                q.push_watermark(p, 10_000_000, out).unwrap();
            }
        }),
        Box::new(move |q, out| {
            q.process(a0, &rows_at(&[7, 8], 11_000, 100_000), out)
                .unwrap();
        }),
        Box::new(move |q, out| {
            q.process(b0, &rows_at(&[1, 2, 7, 8], 12_000, 12_000), out)
                .unwrap();
        }),
    ];
    let mut expected = Output::default();
    let mut memory = open_query(None);
    for step in &steps {
        step(&mut memory, &mut expected);
    }
    memory.finish(&mut expected).unwrap();
    let expected = printed(&expected);
    let joined = expected.lines().filter(|l| l.starts_with("| ")).count() - 1;
    assert_eq!(joined, 4, "{expected}");

    let dir = tempfile::tempdir().unwrap();
    let open =
        || SharedStore::durable(StateStore::open(dir.path(), StoreOptions::default()).unwrap());
    let mut out = Output::default();
    let mut query = open_query(Some(open()));
    for step in &steps {
        step(&mut query, &mut out);
        let snapshot = query.snapshot().unwrap().encode().unwrap();
        drop(query);
        query = open_query(Some(open()));
        query
            .restore(QuerySnapshot::decode(&snapshot).unwrap())
            .unwrap();
    }
    query.finish(&mut out).unwrap();
    assert_eq!(printed(&out), expected);
}
