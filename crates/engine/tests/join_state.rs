//! A join's state stays bounded by the watermark even when every row
//! brings a new key (Nexmark q7 joins on prices): rows expire, and so do
//! the keys no row holds any more.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_engine::progress::partition_id;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ]))
}

/// Rows `from..to`: key i (mod `keys`, when given) at i milliseconds.
fn rows(from: i64, to: i64, keys: Option<i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (from..to).map(|i| keys.map_or(i, |n| i % n)),
            )),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values((from..to).map(|i| i * 1000))
                    .with_timezone("UTC"),
            ),
        ],
    )
    .unwrap()
}

#[test]
fn ever_new_keys_keep_an_interval_join_state_flat() {
    let catalog = Catalog::new()
        .with_table("a", schema())
        .with_table("b", schema());
    let sql = "SELECT a.k FROM a JOIN b ON a.k = b.k \
               AND a.ts BETWEEN b.ts AND b.ts + INTERVAL '1' SECOND";
    let options = QueryOptions {
        lateness_us: 0,
        ..QueryOptions::default()
    };
    let plan = plan_query(sql, &catalog, options).unwrap();
    let (pa, pb) = (
        partition_id(plan.source_index("a").unwrap(), 0),
        partition_id(plan.source_index("b").unwrap(), 0),
    );
    let mut query = Query::new(plan).unwrap();
    query.add_partition(pa);
    query.add_partition(pb);
    let mut out = Output::default();
    let mut joined = 0usize;
    let mut sizes = Vec::new();
    let step = 1000;
    for from in (0..400_000).step_by(step) {
        let batch = rows(from, from + step as i64, None);
        query.process(pb, &batch, &mut out).unwrap();
        query.process(pa, &batch, &mut out).unwrap();
        joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
        out.clear();
        sizes.push(query.state_size());
    }
    query.finish(&mut out).unwrap();
    joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
    assert_eq!(
        joined, 400_000,
        "each row of a meets the row of b with its key"
    );
    let early = *sizes[20..40].iter().max().unwrap();
    let late = *sizes[360..].iter().max().unwrap();
    assert!(
        late <= early * 2,
        "the state grew from {early} bytes (after 40 000 rows) to {late} (after 400 000)"
    );
}

#[test]
fn a_versioned_table_keeps_only_the_versions_the_watermark_needs() {
    let catalog = Catalog::new()
        .with_table("s", schema())
        .with_table("t", schema());
    let sql = "SELECT s.k FROM s JOIN t FOR SYSTEM_TIME AS OF s.ts AS v ON s.k = v.k";
    let options = QueryOptions {
        lateness_us: 0,
        ..QueryOptions::default()
    };
    let plan = plan_query(sql, &catalog, options).unwrap();
    let (ps, pt) = (
        partition_id(plan.source_index("s").unwrap(), 0),
        partition_id(plan.source_index("t").unwrap(), 0),
    );
    let mut query = Query::new(plan).unwrap();
    query.add_partition(ps);
    query.add_partition(pt);
    let mut out = Output::default();
    let mut joined = 0usize;
    let mut sizes = Vec::new();
    let step = 1000;
    // 100 keys, each updated every 100 ms, for 400 seconds.
    for from in (0..400_000).step_by(step) {
        let batch = rows(from, from + step as i64, Some(100));
        query.process(pt, &batch, &mut out).unwrap();
        query.process(ps, &batch, &mut out).unwrap();
        joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
        out.clear();
        sizes.push(query.state_size());
    }
    query.finish(&mut out).unwrap();
    joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
    assert_eq!(joined, 400_000, "each stream row meets its key's version");
    let early = *sizes[20..40].iter().max().unwrap();
    let late = *sizes[360..].iter().max().unwrap();
    assert!(
        late <= early * 2,
        "the versions grew from {early} bytes (after 40 000 rows) to {late} (after 400 000)"
    );
}

/// With a join retention `R` an interval join holds each row `R` longer
/// (late rows may still pair with it), and no longer: at one row per
/// millisecond per side, a's rows live `R` (their bound is their own time),
/// b's `1 s + R`, each give or take a batch. The state stays flat.
#[test]
fn a_join_retention_holds_rows_that_much_longer_and_no_longer() {
    let catalog = Catalog::new()
        .with_table("a", schema())
        .with_table("b", schema());
    let sql = "SELECT a.k FROM a JOIN b ON a.k = b.k \
               AND a.ts BETWEEN b.ts AND b.ts + INTERVAL '1' SECOND";
    for retention_ms in [0i64, 5_000] {
        let options = QueryOptions {
            lateness_us: 0,
            join_retention_us: retention_ms * 1000,
            ..QueryOptions::default()
        };
        let plan = plan_query(sql, &catalog, options).unwrap();
        let (pa, pb) = (
            partition_id(plan.source_index("a").unwrap(), 0),
            partition_id(plan.source_index("b").unwrap(), 0),
        );
        let mut query = Query::new(plan).unwrap();
        query.add_partition(pa);
        query.add_partition(pb);
        let mut out = Output::default();
        let (mut joined, mut held, mut sizes) = (0usize, Vec::new(), Vec::new());
        let step = 1000;
        for from in (0..200_000).step_by(step) {
            let batch = rows(from, from + step as i64, None);
            query.process(pb, &batch, &mut out).unwrap();
            query.process(pa, &batch, &mut out).unwrap();
            joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
            out.clear();
            held.push(query.state_keys());
            sizes.push(query.state_size());
        }
        query.finish(&mut out).unwrap();
        joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
        assert_eq!(joined, 200_000, "retention {retention_ms} ms");
        let expected = (2 * retention_ms + 1_000) as usize;
        let steady = &held[20..];
        let (lo, hi) = (steady.iter().min().unwrap(), steady.iter().max().unwrap());
        assert!(
            *lo >= expected.saturating_sub(2 * step) && *hi <= expected + 2 * step,
            "retention {retention_ms} ms: {lo}..{hi} rows held, expected about {expected}"
        );
        let early = *sizes[20..40].iter().max().unwrap();
        let late = *sizes[180..].iter().max().unwrap();
        assert!(
            late <= early * 2,
            "retention {retention_ms} ms: the state grew from {early} to {late} bytes"
        );
    }
}
