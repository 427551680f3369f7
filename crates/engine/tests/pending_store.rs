//! Rows held for the watermark in a durable state store: emitting every
//! ten minutes, a continuous GROUP BY holds up to ten minutes of input; a
//! checkpoint writes the rows that came since the previous one (and
//! deletes those folded in since), not every row held, and a query
//! restored from any checkpoint goes on to write what one uninterrupted
//! query writes.

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_engine::{Catalog, Output, Query, QueryOptions, QueryPlan, plan_query};

mod checkpointing;

use checkpointing::{printed, run_checkpointing, run_in_memory};

const KEYS: i64 = 500;
const STEP: i64 = 2000;
const ROWS: i64 = 240_000;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("merchant", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("amount", DataType::Float64, false),
    ]))
}

/// Rows `from..to`: row i of merchant i mod KEYS at i × 10 ms (a batch is
/// 20 s of event time), every eleventh a minute late.
fn rows(from: i64, to: i64) -> RecordBatch {
    let time = |i: i64| i * 10_000 - if i % 11 == 0 { 60_000_000 } else { 0 };
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values((from..to).map(|i| i % KEYS))),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values((from..to).map(time))
                    .with_timezone("UTC"),
            ),
            Arc::new(Float64Array::from_iter_values(
                (from..to).map(|i| (i % 17) as f64 * 0.25),
            )),
        ],
    )
    .unwrap()
}

fn plan() -> QueryPlan {
    let sql = "SELECT merchant, count(*) AS n, sum(amount) AS total, max(ts) AS last \
               FROM orders GROUP BY merchant";
    let options = QueryOptions {
        lateness_us: 30_000_000,
        emit_interval_us: 600_000_000,
        ..QueryOptions::default()
    };
    plan_query(sql, &Catalog::new().with_table("orders", schema()), options).unwrap()
}

#[test]
fn checkpoints_write_the_rows_that_came_and_restores_go_on_the_same() {
    let plan = plan();
    let batches = (ROWS / STEP) as usize;
    let feed = |query: &mut Query, i: usize, out: &mut Output| {
        let from = i as i64 * STEP;
        query.process(0, &rows(from, from + STEP), out).unwrap();
    };
    let memory = run_in_memory(&plan, 1, batches, feed);
    let whole = memory.written;
    let expected = printed(&memory.out);
    assert!(expected.lines().count() > 1_500, "groups come out");

    // A checkpoint after every batch; every 13 batches a new query (a
    // restarted process) restored from it.
    let run = run_checkpointing(&plan, 1, batches, 13, feed);
    assert_eq!(printed(&run.out), expected);
    // Up to ten minutes held, 30 batches' rows (the whole state grows
    // from one batch's to thirty's between emits): a checkpoint writes one
    // or two batches' rows (none while they are under the store's limit),
    // the groups they changed, and the markers.
    let mean = |v: &[usize]| v.iter().sum::<usize>() / v.len();
    let (steady, whole) = (mean(&run.written[30..]), mean(&whole[30..]));
    assert!(
        steady * 4 < whole,
        "a checkpoint wrote {steady} bytes on average, the whole state is {whole}"
    );
}
