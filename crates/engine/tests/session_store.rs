//! SESSION windows in a durable state store: a checkpoint writes the
//! sessions that changed since the previous one (and deletes those merged
//! away or dropped), not every session; a query restored from any of them
//! goes on to write what one uninterrupted query writes.

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_engine::{Catalog, Output, Query, QueryOptions, QueryPlan, plan_query};

mod checkpointing;

use checkpointing::{printed, run_checkpointing, run_in_memory};

const USERS: i64 = 5000;
const STEP: i64 = 1000;
const ROWS: i64 = 120_000;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("v", DataType::Float64, false),
    ]))
}

/// Rows `from..to`: row i of user i mod USERS at i × 10 ms (each user
/// every 50 s, past the 30 s gap), every seventh row 25 s earlier: it
/// bridges its user's last session and the next one, and they merge.
fn rows(from: i64, to: i64) -> RecordBatch {
    let time = |i: i64| i * 10_000 - if i % 7 == 0 { 25_000_000 } else { 0 };
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values((from..to).map(|i| i % USERS))),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values((from..to).map(time))
                    .with_timezone("UTC"),
            ),
            Arc::new(Float64Array::from_iter_values(
                (from..to).map(|i| (i % 13) as f64 * 0.5),
            )),
        ],
    )
    .unwrap()
}

fn plan() -> QueryPlan {
    let sql = "SELECT user_id, SESSION(ts, INTERVAL '30' SECOND) AS s, count(*) AS n, sum(v) AS total \
               FROM events GROUP BY user_id, SESSION(ts, INTERVAL '30' SECOND)";
    let options = QueryOptions {
        lateness_us: 30_000_000,
        // Closed sessions are kept 5 minutes for late rows.
        retention_us: 300_000_000,
        ..QueryOptions::default()
    };
    plan_query(sql, &Catalog::new().with_table("events", schema()), options).unwrap()
}

#[test]
fn checkpoints_write_the_sessions_that_changed_and_restores_go_on_the_same() {
    let plan = plan();
    let batches = (ROWS / STEP) as usize;
    let feed = |query: &mut Query, i: usize, out: &mut Output| {
        let from = i as i64 * STEP;
        query.process(0, &rows(from, from + STEP), out).unwrap();
    };
    let memory = run_in_memory(&plan, 1, batches, feed);
    let whole = memory.written;
    let expected = printed(&memory.out);
    assert!(expected.lines().count() > 30_000, "sessions come out");

    // A checkpoint after every batch; every 25 batches a new query (a
    // restarted process) restored from it.
    let run = run_checkpointing(&plan, 1, batches, 25, feed);
    let (out, written) = (run.out, run.written);
    assert_eq!(printed(&out), expected);
    // Each user has a session every 50 s, kept 5 minutes after it closes;
    // a batch spans 10 s and touches a fifth of the users: a checkpoint
    // writes the sessions they changed and the ones that closed, a restart
    // included (the restored sessions are in the store already).
    let steady = &written[30..];
    let (most, state) = (*steady.iter().max().unwrap(), whole[100]);
    assert!(
        most * 4 < state,
        "a checkpoint wrote up to {most} bytes, the whole state is {state}"
    );
}
