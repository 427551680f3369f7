//! Oracle property tests: random inputs (random keys, event-time disorder,
//! nulls, random batch sizes, several partitions interleaved at random) run
//! through ubik; the latest-per-key fold of the changelog must equal
//! DataFusion running an equivalent query in one shot over the same rows,
//! and the changelog bytes must not depend on batching or interleaving.

use arrow::array::RecordBatch;
use ubik_engine::{Catalog, QueryOptions, plan_query};
use ubik_format::json::JsonDecoder;
use ubik_sqltest::harness::{Feed, Record, Spill, chunks, run, run_full, run_with_rejects};
use ubik_testkit::{Orders, Rng, State, assert_matches, oracle};

fn schema() -> arrow::datatypes::SchemaRef {
    Orders::new(0, 1, 1, 0).varied().schema()
}

/// Rows in arrival order: time advances ~`step_ms` per row, each row
/// displaced back by up to `disorder_ms`; null and negative amounts, tags.
fn gen_rows(rng: &mut Rng, n: usize, keys: u64, step_ms: u64, disorder_ms: u64) -> Vec<String> {
    Orders::new(n, keys, step_ms, disorder_ms)
        .varied()
        .lines(rng)
}

fn decode(rows: &[String]) -> RecordBatch {
    let mut d = JsonDecoder::new(schema()).unwrap();
    let recs: Vec<&[u8]> = rows.iter().map(|r| r.as_bytes()).collect();
    let out = d.decode(&recs).unwrap();
    assert!(out.bad.is_empty());
    out.batch
}

/// The latest value per key of a changelog.
fn fold(records: &[Record]) -> State {
    ubik_testkit::fold(
        records
            .iter()
            .map(|r| (r.key.as_deref().unwrap_or_default(), r.value.as_deref())),
    )
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
        name: "regroup",
        ubik: "SELECT n, count(*) AS merchants, sum(total) AS spent, avg(total) AS mean FROM (SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant) t GROUP BY n",
        oracle: "SELECT n, count(*) AS merchants, sum(total) AS spent, avg(total) AS mean FROM (SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant) t GROUP BY n",
    },
    Case {
        name: "top-n",
        ubik: "SELECT merchant, amount, tag, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 3",
        oracle: "SELECT merchant, amount, tag, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY amount DESC, merchant ASC NULLS FIRST, amount ASC NULLS FIRST, tag ASC NULLS FIRST) AS rn FROM orders) WHERE rn <= 3",
    },
    Case {
        name: "window-functions-over-top-n",
        ubik: "SELECT merchant, rn, sum(amount) OVER w AS s, avg(amount) OVER w AS a, count(amount) OVER w AS c, min(amount) OVER w AS lo, max(amount) OVER w AS hi, count(*) OVER (PARTITION BY tag ORDER BY amount ROWS BETWEEN CURRENT ROW AND 2 FOLLOWING) AS n FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts DESC) AS rn FROM orders) WHERE rn <= 2) WINDOW w AS (PARTITION BY tag ORDER BY amount ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING)",
        oracle: "SELECT merchant, rn, sum(amount) OVER w AS s, avg(amount) OVER w AS a, count(amount) OVER w AS c, min(amount) OVER w AS lo, max(amount) OVER w AS hi, count(*) OVER (PARTITION BY tag ORDER BY amount, merchant ASC NULLS FIRST, ts ASC NULLS FIRST, amount ASC NULLS FIRST, tag ASC NULLS FIRST, rn ASC NULLS FIRST ROWS BETWEEN CURRENT ROW AND 2 FOLLOWING) AS n FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts DESC, merchant ASC NULLS FIRST, ts ASC NULLS FIRST, amount ASC NULLS FIRST, tag ASC NULLS FIRST) AS rn FROM orders) WHERE rn <= 2) WINDOW w AS (PARTITION BY tag ORDER BY amount, merchant ASC NULLS FIRST, ts ASC NULLS FIRST, amount ASC NULLS FIRST, tag ASC NULLS FIRST, rn ASC NULLS FIRST ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING)",
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
            let want = oracle(case.oracle, std::slice::from_ref(&batch), &plan.key_columns);

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
    // When nothing is late, the changelog of a windowed query holds exactly
    // one record per (key, window) of the one-shot answer: none missing,
    // none extra, no duplicates from batching.
    let mut rng = Rng(99);
    let rows = gen_rows(&mut rng, 2000, 5, 100, 1000);
    let batch = decode(&rows);
    let catalog = Catalog::new().with_table("orders", schema());
    let plan = plan_query(CASES[0].ubik, &catalog, QueryOptions::default()).unwrap();
    assert!(
        plan.options.lateness_us > 1_000 * 1_000,
        "the rows must be within the watermark delay for this test"
    );
    let records: Vec<Record> = run(&plan, &random_feeds(&mut rng, &batch, 0), None).unwrap();
    assert!(!records.is_empty(), "the changelog is empty");
    let folded = fold(&records);
    assert_eq!(
        records.len(),
        folded.len(),
        "a window was emitted more than once without late data"
    );
    let want = oracle(
        CASES[0].oracle,
        std::slice::from_ref(&batch),
        &plan.key_columns,
    );
    assert_eq!(
        records.len(),
        want.len(),
        "one record per (key, window) of the one-shot answer"
    );
    assert_matches("no record lost or invented", &folded, &want);
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
        let want = oracle(
            case.oracle,
            std::slice::from_ref(&batch),
            &plan(1).key_columns,
        );
        assert_matches(case.name, &fold(&single), &want);
    }
}

/// Merges two feed sequences at random, keeping each one's order.
fn merge_feeds(rng: &mut Rng, a: Vec<Feed>, b: Vec<Feed>) -> Vec<Feed> {
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    let mut out = Vec::new();
    while a.peek().is_some() || b.peek().is_some() {
        let from_a = b.peek().is_none() || (a.peek().is_some() && rng.below(2) == 0);
        out.extend(if from_a { a.next() } else { b.next() });
    }
    out
}

/// `partitioned_feeds` of one source of a multi-source query.
fn source_feeds(rng: &mut Rng, batch: &RecordBatch, parts: u32, source: usize) -> Vec<Feed> {
    partitioned_feeds(rng, batch, parts)
        .into_iter()
        .map(|mut f| {
            f.partition = ubik_engine::progress::partition_id(source, f.partition);
            f
        })
        .collect()
}

const JOIN_CASES: &[Case] = &[
    Case {
        name: "windowed-max-joined-back",
        ubik: "SELECT o.merchant, TUMBLE(o.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n FROM orders o JOIN (SELECT max(amount) AS top, TUMBLE(ts, INTERVAL '30 SECONDS') AS w FROM orders GROUP BY TUMBLE(ts, INTERVAL '30 SECONDS')) m ON o.amount = m.top AND o.ts >= m.w AND o.ts < m.w + INTERVAL '30 SECONDS' GROUP BY o.merchant, TUMBLE(o.ts, INTERVAL '30 SECONDS')",
        oracle: "SELECT o.merchant, date_bin(INTERVAL '30 seconds', o.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n FROM orders o JOIN (SELECT max(amount) AS top, date_bin(INTERVAL '30 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w FROM orders GROUP BY 2) m ON o.amount = m.top AND o.ts >= m.w AND o.ts < m.w + INTERVAL '30 seconds' GROUP BY 1, 2",
    },
    Case {
        name: "temporal",
        ubik: "SELECT m.region, TUMBLE(o.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, sum(o.amount) AS total FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id GROUP BY m.region, TUMBLE(o.ts, INTERVAL '30 SECONDS')",
        oracle: "WITH c AS (SELECT o.ts, o.amount, m.region, rank() OVER (PARTITION BY o.merchant, o.ts, o.amount ORDER BY m.ts DESC) AS rn FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) SELECT region, date_bin(INTERVAL '30 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2",
    },
    Case {
        name: "interval",
        ubik: "SELECT o.merchant, TUMBLE(m.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, max(o.amount) AS top FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 SECONDS' AND o.ts + INTERVAL '5 SECONDS' GROUP BY o.merchant, TUMBLE(m.ts, INTERVAL '30 SECONDS')",
        oracle: "SELECT o.merchant, date_bin(INTERVAL '30 seconds', m.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, max(o.amount) AS top FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 seconds' AND o.ts + INTERVAL '5 seconds' GROUP BY 1, 2",
    },
    // LEFT: orders no merchant row is near come out padded with nulls.
    Case {
        name: "interval-left",
        ubik: "SELECT o.merchant, TUMBLE(o.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, count(m.region) AS near FROM orders o LEFT JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 SECONDS' AND o.ts + INTERVAL '5 SECONDS' GROUP BY o.merchant, TUMBLE(o.ts, INTERVAL '30 SECONDS')",
        oracle: "SELECT o.merchant, date_bin(INTERVAL '30 seconds', o.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, count(m.region) AS near FROM orders o LEFT JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 seconds' AND o.ts + INTERVAL '5 seconds' GROUP BY 1, 2",
    },
    // Three tables: an interval join over a temporal join.
    Case {
        name: "interval-over-temporal",
        ubik: "SELECT m.region, TUMBLE(o.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, sum(o2.amount) AS total FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id JOIN orders o2 ON o2.merchant = o.merchant AND o2.ts BETWEEN o.ts AND o.ts + INTERVAL '3 SECONDS' GROUP BY m.region, TUMBLE(o.ts, INTERVAL '30 SECONDS')",
        oracle: "WITH c AS (SELECT o.merchant, o.ts, m.region, rank() OVER (PARTITION BY o.merchant, o.ts, o.amount ORDER BY m.ts DESC) AS rn FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) SELECT region, date_bin(INTERVAL '30 seconds', c.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(o2.amount) AS total FROM c JOIN orders o2 ON o2.merchant = c.merchant AND o2.ts BETWEEN c.ts AND c.ts + INTERVAL '3 seconds' WHERE rn = 1 GROUP BY 1, 2",
    },
    // Three tables: a temporal join over an interval join whose time it
    // reads can lie 5 s before the inner pair completes (a lag of 5 s).
    Case {
        name: "temporal-over-interval",
        ubik: "SELECT v.region, TUMBLE(o.ts, INTERVAL '30 SECONDS') AS w, count(*) AS n, sum(o.amount) AS total FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 SECONDS' AND o.ts + INTERVAL '5 SECONDS' JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS v ON v.id = o.merchant GROUP BY v.region, TUMBLE(o.ts, INTERVAL '30 SECONDS')",
        oracle: "WITH p AS (SELECT row_number() OVER () AS rid, o.merchant, o.ts, o.amount FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts BETWEEN o.ts - INTERVAL '2 seconds' AND o.ts + INTERVAL '5 seconds'), c AS (SELECT p.ts, p.amount, v.region, rank() OVER (PARTITION BY p.rid ORDER BY v.ts DESC) AS rn FROM p JOIN merchants v ON p.merchant = v.id AND v.ts <= p.ts) SELECT region, date_bin(INTERVAL '30 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2",
    },
];

/// Joins: random orders and merchant updates, each source on 1 to 3
/// partitions interleaved at random, random batch sizes, a restore at a
/// random point. The fold equals DataFusion's one-shot join, and the bytes
/// equal those of another interleaving.
#[test]
fn joins_equal_one_shot_oracle_under_any_interleaving() {
    let merchants_schema =
        ubik_format::schema::parse_column_list("id VARCHAR, region VARCHAR, ts TIMESTAMP").unwrap();
    for seed in 0..8u64 {
        let mut rng = Rng(seed * 104_729 + 3);
        let n = 200 + rng.below(1200) as usize;
        let keys = 1 + rng.below(10);
        let orders = Orders::new(n, keys, 40, 2_000).lines(&mut rng);
        let base = ubik_testkit::events::BASE_MS;
        let ts = |ms: i64| {
            let mut b = Vec::new();
            ubik_engine::time::write_rfc3339_micros(&mut b, ms * 1000);
            String::from_utf8(b).unwrap()
        };
        // One early version per merchant, then updates in time order (a
        // little disorder, within the watermark delay).
        let mut versions: Vec<String> = (0..keys as i64)
            .map(|k| {
                format!(
                    r#"{{"id":"m{k:03}","region":"r{}","ts":"{}"}}"#,
                    rng.below(4),
                    ts(base - 10_000 + k)
                )
            })
            .collect();
        let updates = 5 + rng.below(n as u64 / 4);
        for i in 0..updates as i64 {
            let t = base + i * (n as i64 * 40) / updates as i64 - rng.below(1_500) as i64;
            versions.push(format!(
                r#"{{"id":"m{:03}","region":"r{}","ts":"{}"}}"#,
                rng.below(keys),
                rng.below(4),
                ts(t * 1000 / 1000 + (i % 997))
            ));
        }
        let order_rows = {
            let mut d = JsonDecoder::new(Orders::new(0, 1, 1, 0).schema()).unwrap();
            let recs: Vec<&[u8]> = orders.iter().map(|r| r.as_bytes()).collect();
            d.decode(&recs).unwrap().batch
        };
        let version_rows = {
            let mut d = JsonDecoder::new(merchants_schema.clone()).unwrap();
            let recs: Vec<&[u8]> = versions.iter().map(|r| r.as_bytes()).collect();
            d.decode(&recs).unwrap().batch
        };
        let catalog = Catalog::new()
            .with_table("orders", order_rows.schema())
            .with_table("merchants", merchants_schema.clone());
        for case in JOIN_CASES {
            let plan = plan_query(
                case.ubik,
                &catalog,
                QueryOptions {
                    lateness_us: 5_000_000,
                    ..QueryOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            // A self-join reads orders only.
            let (o, m) = (
                plan.source_index("orders").unwrap(),
                plan.source_index("merchants"),
            );
            let layout = |rng: &mut Rng| {
                let po = 1 + rng.below(3) as u32;
                let pm = 1 + rng.below(3) as u32;
                let a = source_feeds(rng, &order_rows, po, o);
                let b = match m {
                    Some(m) => source_feeds(rng, &version_rows, pm, m),
                    None => Vec::new(),
                };
                merge_feeds(rng, a, b)
            };
            let first = layout(&mut rng);
            let second = layout(&mut rng);
            let restore = rng.below(second.len() as u64) as usize;
            let a = run(&plan, &first, None).unwrap();
            // The second layout keeps its state in a store, spilled after
            // every batch (an interval join's fired rows, a versioned
            // table's keys), for two seeds in three.
            let spill = match seed % 3 {
                1 => Some(Spill::TINY),
                2 => Some(Spill::TINY_TEMPORARY),
                _ => None,
            };
            let b = run_full(&plan, &second, Some(restore), None, spill)
                .unwrap()
                .records;
            let what = format!("{} seed {seed}", case.name);
            let want = ubik_testkit::oracle_tables(
                case.oracle,
                &[
                    ("orders", std::slice::from_ref(&order_rows)),
                    ("merchants", std::slice::from_ref(&version_rows)),
                ],
                &[0, 1],
            );
            assert_matches(&what, &fold(&a), &want);
            assert_eq!(a, b, "{what}: the changelog depends on the interleaving");
        }
    }
}

/// Late join rows: orders (and, for the interval join, merchant rows) up to
/// 2 s out of order with no watermark delay, so many arrive behind their
/// partition's watermark, and a join retention longer than that, so every
/// late row still joins (versions of the temporal join's table come in
/// order: a late version is refused). The fold equals DataFusion's one-shot
/// join over every row, the bytes do not depend on batching, interleaving
/// or a restore (the rows' partitions are their own), and without the
/// retention the same input dead-letters its late rows.
#[test]
fn late_join_rows_within_the_join_retention_equal_one_shot_oracle() {
    let merchants_schema =
        ubik_format::schema::parse_column_list("id VARCHAR, region VARCHAR, ts TIMESTAMP").unwrap();
    let decode_with = |schema: arrow::datatypes::SchemaRef, lines: &[String]| {
        let mut d = JsonDecoder::new(schema).unwrap();
        let recs: Vec<&[u8]> = lines.iter().map(|r| r.as_bytes()).collect();
        d.decode(&recs).unwrap().batch
    };
    for seed in 0..6u64 {
        let mut rng = Rng(seed * 7_919 + 11);
        let n = 200 + rng.below(800) as usize;
        let keys = 1 + rng.below(8);
        let orders = Orders::new(n, keys, 40, 2_000).lines(&mut rng);
        let order_rows = decode_with(Orders::new(0, 1, 1, 0).schema(), &orders);
        let base = ubik_testkit::events::BASE_MS;
        let line = |k: u64, region: u64, ms: i64| {
            let mut b = Vec::new();
            ubik_engine::time::write_rfc3339_micros(&mut b, ms * 1000);
            let ts = String::from_utf8(b).unwrap();
            format!(r#"{{"id":"m{k:03}","region":"r{region}","ts":"{ts}"}}"#)
        };
        // (time, row): one early version per merchant, then updates, each
        // up to 1.5 s early against the arrival order.
        let mut versions: Vec<(i64, String)> = (0..keys)
            .map(|k| {
                let t = base - 10_000 + k as i64;
                (t, line(k, rng.below(4), t))
            })
            .collect();
        let updates = 5 + rng.below(n as u64 / 4) as i64;
        for i in 0..updates {
            let t = base + i * (n as i64 * 40) / updates - rng.below(1_500) as i64;
            versions.push((t, line(rng.below(keys), rng.below(4), t)));
        }
        let disordered: Vec<String> = versions.iter().map(|(_, l)| l.clone()).collect();
        versions.sort_by_key(|(t, _)| *t);
        let ordered: Vec<String> = versions.into_iter().map(|(_, l)| l).collect();
        for (case, merchants) in [(&JOIN_CASES[1], &ordered), (&JOIN_CASES[2], &disordered)] {
            let version_rows = decode_with(merchants_schema.clone(), merchants);
            let catalog = Catalog::new()
                .with_table("orders", order_rows.schema())
                .with_table("merchants", merchants_schema.clone());
            let plan_with = |join_retention_us: i64| {
                let options = QueryOptions {
                    lateness_us: 0,
                    join_retention_us,
                    ..QueryOptions::default()
                };
                plan_query(case.ubik, &catalog, options)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name))
            };
            let plan = plan_with(10_000_000);
            let (o, m) = (
                plan.source_index("orders").unwrap(),
                plan.source_index("merchants").unwrap(),
            );
            let (po, pm) = (1 + rng.below(3) as u32, 1 + rng.below(3) as u32);
            let layout = |rng: &mut Rng| {
                let a = source_feeds(rng, &order_rows, po, o);
                let b = source_feeds(rng, &version_rows, pm, m);
                merge_feeds(rng, a, b)
            };
            let first = layout(&mut rng);
            let second = layout(&mut rng);
            let restore = rng.below(second.len() as u64) as usize;
            let what = format!("{} (late rows) seed {seed}", case.name);
            let a = run_with_rejects(&plan, &first, None).unwrap();
            let b = run(&plan, &second, Some(restore)).unwrap();
            assert!(a.rejects.is_empty(), "{what}: {:?}", a.rejects.first());
            let want = ubik_testkit::oracle_tables(
                case.oracle,
                &[
                    ("orders", std::slice::from_ref(&order_rows)),
                    ("merchants", std::slice::from_ref(&version_rows)),
                ],
                &[0, 1],
            );
            assert_matches(&what, &fold(&a.records), &want);
            assert_eq!(
                a.records, b,
                "{what}: the changelog depends on the interleaving"
            );
            let strict = run_with_rejects(&plan_with(0), &first, None).unwrap();
            assert!(
                !strict.rejects.is_empty(),
                "{what}: no row was late, so the test shows nothing"
            );
        }
    }
}

#[test]
fn a_restore_anywhere_gives_the_same_changelog() {
    // The Kafka crash suite's shape: rows 25 ms apart, up to 9 s out of
    // order against a 5 s watermark delay (late updates re-emit windows),
    // four partitions; the snapshot is taken after a random feed and the
    // rest read in another interleaving, as a resumed run reads it.
    let catalog = Catalog::new().with_table("orders", schema());
    let options = QueryOptions {
        lateness_us: 5_000_000,
        ..QueryOptions::default()
    };
    for seed in 0..16u64 {
        let mut rng = Rng(seed * 104_729 + 5);
        let rows = gen_rows(&mut rng, 6_000, 25, 25, 9_000);
        let batch = decode(&rows);
        for case in CASES {
            let plan = plan_query(case.ubik, &catalog, options.clone()).unwrap();
            let reference = run(&plan, &partitioned_feeds(&mut rng, &batch, 4), None).unwrap();
            let feeds = partitioned_feeds(&mut rng, &batch, 4);
            let at = rng.below(feeds.len() as u64) as usize;
            // The rest of each partition's feeds, interleaved anew.
            let mut rest: Vec<Vec<Feed>> = (0..4)
                .map(|p| {
                    let mut f: Vec<Feed> = feeds[at + 1..]
                        .iter()
                        .filter(|f| f.partition == p)
                        .cloned()
                        .collect();
                    f.reverse();
                    f
                })
                .collect();
            let mut resumed: Vec<Feed> = feeds[..=at].to_vec();
            while rest.iter().any(|f| !f.is_empty()) {
                if let Some(f) = rest[rng.below(4) as usize].pop() {
                    resumed.push(f);
                }
            }
            let got = run(&plan, &resumed, Some(at)).unwrap();
            assert!(
                got == reference,
                "{} seed {seed}: restored after feed {at} of {}, the changelog differs",
                case.name,
                feeds.len()
            );
            // Checkpoints taken as the query runs on change nothing either,
            // nor does keeping the state in a store (spilled after every
            // batch, each checkpoint writing what changed).
            let every = 1 + rng.below(20) as usize;
            let spill = match seed % 4 {
                1 => Some(Spill::TINY),
                3 => Some(Spill::TINY_TEMPORARY),
                _ => None,
            };
            let checkpointed = run_full(&plan, &resumed, Some(at), Some(every), spill)
                .unwrap()
                .records;
            assert!(
                checkpointed == reference,
                "{} seed {seed}: with a snapshot every {every} feeds{}, the changelog differs",
                case.name,
                match spill {
                    Some(s) if s.durable => " and the state spilled to a store",
                    Some(_) => " and the state spilled to a temporary store",
                    None => "",
                }
            );
        }
    }
}
