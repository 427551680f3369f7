//! A repartitioned run (first stages stamp and route rows by key, second
//! stages aggregate what they are given) emits exactly the records of one
//! query reading every partition: same first emissions, same late updates.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
mod routing;

use routing::{Rng, deliver, records};
use ubik_engine::progress::partition_id;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("v", DataType::Int64, false),
    ]))
}

/// `n` rows per partition, `keys` keys spread over every partition, times
/// rising `step_ms` a row with up to `disorder_ms` of disorder.
fn partitions(
    parts: usize,
    n: usize,
    (keys, step_ms, disorder_ms): (u64, i64, u64),
    seed: u64,
) -> Vec<Vec<RecordBatch>> {
    let mut rng = Rng(seed);
    (0..parts)
        .map(|_| {
            (0..n / 100)
                .map(|b| {
                    let mut k = Vec::new();
                    let mut ts = Vec::new();
                    let mut v = Vec::new();
                    for i in 0..100 {
                        let at = ((b * 100 + i) as i64) * step_ms * 1000
                            - rng.below(disorder_ms * 1000) as i64;
                        k.push(format!("k{}", rng.below(keys)));
                        ts.push(at);
                        v.push(rng.below(1000) as i64);
                    }
                    RecordBatch::try_new(
                        schema(),
                        vec![
                            Arc::new(StringArray::from(k)),
                            Arc::new(TimestampMicrosecondArray::from(ts).with_timezone("UTC")),
                            Arc::new(Int64Array::from(v)),
                        ],
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect()
}

fn query(sql: &str, lateness_us: i64) -> Query {
    let mut catalog = Catalog::new();
    catalog.add_table("t", schema());
    let options = QueryOptions {
        lateness_us,
        ..QueryOptions::default()
    };
    Query::new(plan_query(sql, &catalog, options).unwrap()).unwrap()
}

#[test]
fn a_repartitioned_run_emits_the_records_of_one_query() {
    // Short windows, disorder past the lateness: many late updates.
    check(
        "SELECT k, TUMBLE(ts, INTERVAL '1 SECOND') AS w, count(*) AS n, sum(v) AS total FROM t GROUP BY k, TUMBLE(ts, INTERVAL '1 SECOND')",
        (3, 4),
        (13, 10, 1500),
        500_000,
    );
    // The Kafka suite's shape: 6 partitions, minute windows, 9 s of
    // disorder against 5 s of lateness.
    check(
        "SELECT k, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(v) AS total FROM t GROUP BY k, TUMBLE(ts, INTERVAL '1 MINUTE')",
        (6, 6),
        (60, 150, 9_000),
        5_000_000,
    );
}

fn check(sql: &str, (parts, targets): (usize, u32), shape: (u64, i64, u64), lateness_us: i64) {
    for seed in 1..6 {
        let input = partitions(parts, 4000, shape, seed);
        // One query over every partition, batches interleaved round-robin.
        let mut one = query(sql, lateness_us);
        for p in 0..parts {
            one.add_partition(partition_id(0, p as u32));
        }
        let mut want = Vec::new();
        let mut out = Output::default();
        for b in 0..input[0].len() {
            for (p, batches) in input.iter().enumerate() {
                out.clear();
                one.process(partition_id(0, p as u32), &batches[b], &mut out)
                    .unwrap();
                records(&out, &mut want);
            }
        }
        out.clear();
        one.finish(&mut out).unwrap();
        records(&out, &mut want);

        // First stages per partition; second stages per target, fed in
        // another interleaving (every partition's batches in turn).
        let mut first: Vec<Query> = (0..parts)
            .map(|p| {
                let mut q = query(sql, lateness_us);
                q.add_partition(partition_id(0, p as u32));
                q.set_shuffle(targets).unwrap();
                q
            })
            .collect();
        let mut second: Vec<Query> = (0..targets)
            .map(|_| {
                let mut q = query(sql, lateness_us);
                for p in 0..parts {
                    q.add_partition(partition_id(0, p as u32));
                }
                q
            })
            .collect();
        let mut got = Vec::new();
        // First stages batch by batch, round-robin; a progress record to
        // every target only every `every` batches (at a "commit").
        let every = 1 + seed as usize % 4;
        for b in 0..input[0].len() {
            for (p, batches) in input.iter().enumerate() {
                let id = partition_id(0, p as u32);
                let batch = &batches[b];
                let mut routed = Output::default();
                first[p].process(id, batch, &mut routed).unwrap();
                deliver(&mut routed, batch, &mut second, &mut got);
                if b % every == every - 1 {
                    let lateness = first[p].progress().lateness;
                    let wm = first[p].progress().partitions[&id].watermark(lateness);
                    for q in second.iter_mut() {
                        out.clear();
                        q.push_watermark(id, wm, &mut out).unwrap();
                        records(&out, &mut got);
                    }
                }
            }
        }
        for q in second.iter_mut() {
            for p in 0..parts {
                out.clear();
                q.end_partition(partition_id(0, p as u32), &mut out)
                    .unwrap();
                records(&out, &mut got);
            }
        }
        let want: BTreeSet<String> = want.into_iter().collect();
        let got: BTreeSet<String> = got.into_iter().collect();
        let missing: Vec<_> = want.difference(&got).take(3).collect();
        let extra: Vec<_> = got.difference(&want).take(3).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "seed {seed}: {} vs {} records; missing {missing:?}; extra {extra:?}",
            want.len(),
            got.len()
        );
    }
}
