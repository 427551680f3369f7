//! Oracle property tests: random inputs (random keys, event-time disorder,
//! nulls, random batch sizes, several partitions interleaved at random) run
//! through ubik; the latest-per-key fold of the changelog must equal
//! DataFusion running an equivalent query in one shot over the same rows,
//! and the changelog bytes must not depend on batching or interleaving.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use ubik_engine::{Catalog, QueryOptions, plan_query};
use ubik_format::changelog::ChangelogEncoder;
use ubik_format::json::JsonDecoder;
use ubik_sqltest::harness::{Feed, Record, chunks, fold, run};

/// SplitMix64: deterministic, so a failure reproduces from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("merchant", DataType::Utf8, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("amount", DataType::Float64, true),
        Field::new("tag", DataType::Utf8, true),
    ]))
}

const BASE_MS: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z

/// Rows in arrival order: time advances ~`step_ms` per row, each row
/// displaced back by up to `disorder_ms`.
fn gen_rows(rng: &mut Rng, n: usize, keys: u64, step_ms: u64, disorder_ms: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let t = BASE_MS + (i as u64 * step_ms) as i64 - rng.below(disorder_ms + 1) as i64;
            let merchant = format!("m{}", rng.below(keys));
            let amount = if rng.below(20) == 0 {
                "null".to_string()
            } else {
                format!("{}", (rng.below(100_000) as f64) / 100.0 - 100.0)
            };
            let tag = if rng.below(10) == 0 {
                "null".into()
            } else {
                format!("\"t{}\"", rng.below(7))
            };
            format!(r#"{{"merchant":"{merchant}","ts":{t},"amount":{amount},"tag":{tag}}}"#)
        })
        .collect()
}

fn decode(rows: &[String]) -> RecordBatch {
    let mut d = JsonDecoder::new(schema()).unwrap();
    let recs: Vec<&[u8]> = rows.iter().map(|r| r.as_bytes()).collect();
    let out = d.decode(&recs).unwrap();
    assert!(out.bad.is_empty());
    out.batch
}

/// Runs the oracle SQL in DataFusion over the same rows, encoded exactly
/// as ubik encodes results, as key JSON -> value JSON.
fn oracle(sql: &str, batch: &RecordBatch, key_columns: &[usize]) -> BTreeMap<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = SessionContext::new();
        let table = MemTable::try_new(batch.schema(), vec![vec![batch.clone()]]).unwrap();
        ctx.register_table("orders", Arc::new(table)).unwrap();
        let df = ctx
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("oracle sql failed: {e}\n{sql}"));
        let batches = df.collect().await.unwrap();
        let mut out = BTreeMap::new();
        for b in batches {
            let mut enc = ChangelogEncoder::new(&b.schema(), key_columns.to_vec(), true);
            let change = ubik_engine::ChangeBatch {
                timestamps: arrow::array::Int64Array::new_null(b.num_rows()),
                rows: b,
                deletes: None,
            };
            enc.encode(&change, |r| {
                out.insert(
                    String::from_utf8_lossy(r.key.unwrap()).into_owned(),
                    String::from_utf8_lossy(r.value.unwrap()).into_owned(),
                );
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        }
        out
    })
}

fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        (Object(x), Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

fn assert_matches(case: &str, got: &[(String, String)], want: &BTreeMap<String, String>) {
    let got: BTreeMap<&String, &String> = got.iter().map(|(k, v)| (k, v)).collect();
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !got.contains_key(k))
        .take(3)
        .collect();
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(**k))
        .take(3)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{case}: keys differ; missing {missing:?}, extra {extra:?} ({} vs {})",
        got.len(),
        want.len()
    );
    for (k, v) in want {
        let a: serde_json::Value = serde_json::from_str(got[k]).unwrap();
        let b: serde_json::Value = serde_json::from_str(v).unwrap();
        assert!(
            close(&a, &b),
            "{case}: key {k}\n  ubik:   {a}\n  oracle: {b}"
        );
    }
}

/// Random batch sizes over one partition's rows.
fn random_feeds(rng: &mut Rng, batch: &RecordBatch, partition: u32) -> Vec<Feed> {
    let mut feeds = Vec::new();
    let mut start = 0;
    while start < batch.num_rows() {
        let len = (1 + rng.below(97) as usize).min(batch.num_rows() - start);
        feeds.extend(chunks(&batch.slice(start, len), partition, len));
        start += len;
    }
    feeds
}

/// Splits rows into `parts` partitions (by row index) and interleaves their
/// random-size batches at random, keeping each partition's order.
fn partitioned_feeds(rng: &mut Rng, batch: &RecordBatch, parts: u32) -> Vec<Feed> {
    let mut per: Vec<Vec<Feed>> = (0..parts)
        .map(|p| {
            let idx: Vec<u32> = (0..batch.num_rows() as u32)
                .filter(|i| i % parts == p)
                .collect();
            let b = arrow::compute::take_record_batch(batch, &arrow::array::UInt32Array::from(idx))
                .unwrap();
            let mut f = random_feeds(rng, &b, p);
            f.reverse();
            f
        })
        .collect();
    let mut out = Vec::new();
    while per.iter().any(|f| !f.is_empty()) {
        let p = rng.below(parts as u64) as usize;
        if let Some(f) = per[p].pop() {
            out.push(f);
        }
    }
    out
}

struct Case {
    name: &'static str,
    ubik: &'static str,
    oracle: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "tumble",
        ubik: "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, count(amount) AS na, sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi, stddev(amount) AS sd, count(DISTINCT tag) AS tags FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')",
        oracle: "SELECT merchant, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, count(amount) AS na, sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi, stddev(amount) AS sd, count(DISTINCT tag) AS tags FROM orders GROUP BY 1, 2",
    },
    Case {
        name: "tumble-having-where",
        ubik: "SELECT tag, TUMBLE(ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, var_pop(amount) AS v FROM orders WHERE amount > 0 GROUP BY tag, TUMBLE(ts, INTERVAL '30 SECONDS') HAVING count(*) > 1",
        oracle: "SELECT tag, date_bin(INTERVAL '30 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, var_pop(amount) AS v FROM orders WHERE amount > 0 GROUP BY 1, 2 HAVING count(*) > 1",
    },
    Case {
        name: "hop",
        ubik: "SELECT merchant, HOP(ts, INTERVAL '20 SECONDS', INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, HOP(ts, INTERVAL '20 SECONDS', INTERVAL '1 MINUTE')",
        oracle: "SELECT merchant, w, count(*) AS n, sum(amount) AS total FROM (SELECT merchant, amount, date_bin(INTERVAL '20 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w FROM orders UNION ALL SELECT merchant, amount, date_bin(INTERVAL '20 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') - INTERVAL '20 seconds' AS w FROM orders UNION ALL SELECT merchant, amount, date_bin(INTERVAL '20 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') - INTERVAL '40 seconds' AS w FROM orders) h GROUP BY merchant, w",
    },
    Case {
        name: "session",
        ubik: "SELECT merchant, SESSION(ts, INTERVAL '3 SECONDS') AS s, count(*) AS n, sum(amount) AS total, max(ts) AS last FROM orders GROUP BY merchant, SESSION(ts, INTERVAL '3 SECONDS')",
        oracle: "WITH o AS (SELECT merchant, ts, amount, CASE WHEN lag(ts) OVER (PARTITION BY merchant ORDER BY ts) IS NULL OR CAST(ts AS BIGINT) - CAST(lag(ts) OVER (PARTITION BY merchant ORDER BY ts) AS BIGINT) >= 3000000 THEN 1 ELSE 0 END AS new_session FROM orders), s AS (SELECT merchant, ts, amount, sum(new_session) OVER (PARTITION BY merchant ORDER BY ts ROWS UNBOUNDED PRECEDING) AS sid FROM o) SELECT merchant, min(ts) AS s, count(*) AS n, sum(amount) AS total, max(ts) AS last FROM s GROUP BY merchant, sid",
    },
    Case {
        name: "continuous-having",
        ubik: "SELECT merchant, count(*) AS n, sum(amount) AS total, max(ts) AS last FROM orders GROUP BY merchant HAVING sum(amount) > 0",
        oracle: "SELECT merchant, count(*) AS n, sum(amount) AS total, max(ts) AS last FROM orders GROUP BY merchant HAVING sum(amount) > 0",
    },
];

#[test]
fn fold_of_changelog_equals_one_shot_oracle() {
    for seed in 0..12u64 {
        let mut rng = Rng(seed * 7919 + 1);
        let n = 300 + rng.below(1500) as usize;
        let keys = 1 + rng.below(12);
        // Half the seeds stay within the watermark delay; the others have late
        // rows, which must still be folded in (retention is long).
        let disorder = if seed % 2 == 0 { 4_000 } else { 20_000 };
        let rows = gen_rows(&mut rng, n, keys, 150, disorder);
        let batch = decode(&rows);
        let catalog = Catalog::new().with_table("orders", schema());
        let options = QueryOptions {
            lateness_us: 5_000_000,
            retention_us: 3_600_000_000,
            emit_interval_us: 2_000_000,
            ..QueryOptions::default()
        };
        for case in CASES {
            let what = format!(
                "{} seed {seed} ({n} rows, {keys} keys, disorder {disorder}ms)",
                case.name
            );
            let plan = plan_query(case.ubik, &catalog, options.clone()).unwrap();
            let want = oracle(case.oracle, &batch, &plan.key_columns);

            let one = run(&plan, &random_feeds(&mut rng, &batch, 0), None).unwrap();
            let other = run(&plan, &random_feeds(&mut rng, &batch, 0), Some(3)).unwrap();
            assert_eq!(one, other, "{what}: changelog depends on batching");
            assert_matches(&what, &fold(&one), &want);

            let a = run(&plan, &partitioned_feeds(&mut rng, &batch, 3), None).unwrap();
            let b = run(&plan, &partitioned_feeds(&mut rng, &batch, 3), Some(5)).unwrap();
            assert_eq!(a, b, "{what}: changelog depends on partition interleaving");
            assert_matches(&format!("{what}, 3 partitions"), &fold(&a), &want);
        }
    }
}

#[test]
fn no_record_is_lost_or_invented() {
    // The changelog of a windowed query holds exactly one record per (key,
    // window) when nothing is late: no duplicates from batching.
    let mut rng = Rng(99);
    let rows = gen_rows(&mut rng, 2000, 5, 100, 1000);
    let batch = decode(&rows);
    let catalog = Catalog::new().with_table("orders", schema());
    let plan = plan_query(CASES[0].ubik, &catalog, QueryOptions::default()).unwrap();
    let records: Vec<Record> = run(&plan, &random_feeds(&mut rng, &batch, 0), None).unwrap();
    let folded = fold(&records);
    assert_eq!(
        records.len(),
        folded.len(),
        "a window was emitted more than once without late data"
    );
}

#[test]
fn changelog_does_not_depend_on_fold_threads() {
    // Batches big enough to be folded on several threads, with late rows and
    // a checkpoint in the middle: the bytes must equal a one-thread run's,
    // and the fold must equal the oracle.
    let mut rng = Rng(4242);
    let rows = gen_rows(&mut rng, 120_000, 700, 2, 20_000);
    let batch = decode(&rows);
    let catalog = Catalog::new().with_table("orders", schema());
    let feeds = chunks(&batch, 0, 40_000);
    for case in CASES
        .iter()
        .filter(|c| c.ubik.contains("TUMBLE") || c.ubik.contains("HOP"))
    {
        let options = |threads| QueryOptions {
            lateness_us: 5_000_000,
            retention_us: 3_600_000_000,
            emit_interval_us: 2_000_000,
            threads,
            ..QueryOptions::default()
        };
        let plan = |threads| plan_query(case.ubik, &catalog, options(threads)).unwrap();
        let single = run(&plan(1), &feeds, None).unwrap();
        for threads in [2, 3] {
            let what = format!("{} on {threads} threads", case.name);
            let multi = run(&plan(threads), &feeds, None).unwrap();
            assert_eq!(
                single, multi,
                "{what}: changelog depends on the thread count"
            );
            let restored = run(&plan(threads), &feeds, Some(1)).unwrap();
            assert_eq!(single, restored, "{what}, restored: changelog differs");
        }
        let want = oracle(case.oracle, &batch, &plan(1).key_columns);
        assert_matches(case.name, &fold(&single), &want);
    }
}
