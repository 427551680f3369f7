//! A continuous GROUP BY over a changelog source (Debezium's upserts and
//! deletes by primary key): random changes, some delivered twice, spread
//! over partitions by key and interleaved at random. The latest-per-key
//! fold of ubik's changelog must equal DataFusion's one-shot answer over
//! the table's final rows, and the bytes must not depend on batching,
//! interleaving or a checkpoint/restore in the middle.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use ubik_engine::progress::partition_id;
use ubik_engine::{Catalog, QueryOptions, plan_query};
use ubik_format::json::JsonDecoder;
use ubik_sqltest::harness::{Feed, Record, run};
use ubik_testkit::{Rng, State, assert_matches, oracle};

/// A Debezium table of `columns`.
fn changelog(columns: &str) -> SchemaRef {
    let s = ubik_format::schema::parse_column_list(columns).unwrap();
    ubik_connector::changelog_schema(&s, "debezium")
}

/// Emits every second of event time, with `lateness_us` of lateness.
fn options(lateness_us: i64) -> QueryOptions {
    QueryOptions {
        lateness_us,
        emit_interval_us: 1_000_000,
        ..QueryOptions::default()
    }
}

fn schema() -> SchemaRef {
    changelog("id BIGINT PRIMARY KEY, merchant VARCHAR, amount DOUBLE, qty BIGINT, ts TIMESTAMP")
}

/// One change: an upsert of a whole row, or a deletion of `id`.
#[derive(Clone)]
struct Change {
    id: u64,
    row: Option<String>,
    json: String,
}

/// `n` random changes of up to `ids` rows, a few delivered twice (as
/// Debezium may after a restart).
fn changes(rng: &mut Rng, n: usize, ids: u64) -> Vec<Change> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = rng.below(ids);
        let ts = format!(
            "2024-01-01T00:{:02}:{:02}.{:03}Z",
            i / 6000,
            (i / 100) % 60,
            (i * 10) % 1000
        );
        let change = if rng.below(5) == 0 {
            Change {
                id,
                row: None,
                json: format!(r#"{{"id":{id},"ts":"{ts}"}}"#),
            }
        } else {
            let amount = match rng.below(10) {
                0 => "null".to_string(),
                _ => format!("{}.{}", rng.below(100) as i64 - 20, rng.below(4) * 25),
            };
            let row = format!(
                r#"{{"id":{id},"merchant":"m{}","amount":{amount},"qty":{},"ts":"{ts}"}}"#,
                rng.below(4),
                rng.below(6)
            );
            Change {
                id,
                row: Some(row.clone()),
                json: row,
            }
        };
        if rng.below(20) == 0 {
            out.push(change.clone());
        }
        out.push(change);
    }
    out
}

fn decode(lines: &[&str]) -> RecordBatch {
    let mut d = JsonDecoder::new(schema()).unwrap();
    let records: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    let out = d.decode(&records).unwrap();
    assert!(out.bad.is_empty(), "{:?}", out.bad);
    out.batch
}

/// The table's rows after every change, applied in order.
fn final_rows(changes: &[Change]) -> RecordBatch {
    let mut table: BTreeMap<u64, &str> = BTreeMap::new();
    for c in changes {
        match &c.row {
            Some(r) => table.insert(c.id, r),
            None => table.remove(&c.id),
        };
    }
    decode(&table.values().copied().collect::<Vec<_>>())
}

/// The changes as feeds: partition `id % parts`, random sizes, upserts and
/// deletions in separate feeds or mixed, partitions interleaved at random.
fn feeds(rng: &mut Rng, changes: &[Change], parts: u32) -> Vec<Feed> {
    let mut per: Vec<Vec<Feed>> = (0..parts)
        .map(|p| {
            let mine: Vec<&Change> = changes
                .iter()
                .filter(|c| c.id % parts as u64 == p as u64)
                .collect();
            let mut feeds = Vec::new();
            let mut at = 0;
            while at < mine.len() {
                let deletion = mine[at].row.is_none();
                // Half the feeds hold one kind, half mix them (a chunk of
                // a change stream).
                let mixed = rng.below(2) == 0;
                let mut end = at;
                let cap = at + 1 + rng.below(40) as usize;
                while end < mine.len()
                    && end < cap
                    && (mixed || mine[end].row.is_none() == deletion)
                {
                    end += 1;
                }
                let lines: Vec<&str> = mine[at..end].iter().map(|c| c.json.as_str()).collect();
                let deleted: Vec<bool> = mine[at..end].iter().map(|c| c.row.is_none()).collect();
                feeds.push(Feed {
                    partition: partition_id(0, p),
                    batch: decode(&lines),
                    deleted: match deleted.contains(&true) {
                        true => deleted,
                        false => Vec::new(),
                    },
                });
                at = end;
            }
            feeds.reverse();
            feeds
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

fn fold(records: &[Record]) -> State {
    ubik_testkit::fold(
        records
            .iter()
            .map(|r| (r.key.as_deref().unwrap_or_default(), r.value.as_deref())),
    )
}

const QUERIES: &[&str] = &[
    "SELECT merchant, count(*) AS n, count(amount) AS na, sum(amount) AS total, sum(qty) AS q, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi, max(ts) AS last FROM orders GROUP BY merchant",
    "SELECT qty, count(*) AS n, min(merchant) AS first, max(merchant) AS last FROM orders WHERE amount > 0 GROUP BY qty HAVING count(*) > 1",
    "SELECT count(*) AS n, sum(qty) AS q FROM orders",
];

#[test]
fn a_group_by_over_a_changelog_equals_the_final_tables_one_shot_answer() {
    let catalog = Catalog::new().with_table("orders", schema());
    let options = options(0);
    for seed in 0..8u64 {
        let mut rng = Rng(seed * 31 + 5);
        let n = 200 + rng.below(800) as usize;
        let ids = 3 + rng.below(60);
        let changes = changes(&mut rng, n, ids);
        let table = final_rows(&changes);
        for sql in QUERIES {
            let what = format!("{sql} (seed {seed}, {n} changes of {ids} ids)");
            let plan = plan_query(sql, &catalog, options.clone()).unwrap();
            let want = oracle(sql, std::slice::from_ref(&table), &plan.key_columns);
            let one = run(&plan, &feeds(&mut rng, &changes, 1), None).unwrap();
            let other = run(&plan, &feeds(&mut rng, &changes, 1), Some(4)).unwrap();
            assert_eq!(
                one, other,
                "{what}: the changelog depends on batching or a restore"
            );
            if want.is_empty() {
                assert!(fold(&one).is_empty(), "{what}: groups left over");
                continue;
            }
            assert_matches(&what, &fold(&one), &want);
            let a = run(&plan, &feeds(&mut rng, &changes, 3), None).unwrap();
            let b = run(&plan, &feeds(&mut rng, &changes, 3), Some(7)).unwrap();
            assert_eq!(a, b, "{what}: the changelog depends on interleaving");
            assert_matches(&format!("{what}, 3 partitions"), &fold(&a), &want);
        }
    }
}

/// A table whose rows are all deleted at the end: a GROUP BY's groups all
/// end as tombstones, and the global aggregate ends as SQL's aggregate of
/// no rows (a count of 0, a NULL sum), which DataFusion answers over the
/// empty table.
#[test]
fn an_emptied_table_leaves_no_groups_and_the_global_aggregate_of_no_rows() {
    let catalog = Catalog::new().with_table("orders", schema());
    let options = options(0);
    let mut rng = Rng(11);
    let mut changes = changes(&mut rng, 400, 20);
    changes.extend((0..20).map(|id| Change {
        id,
        row: None,
        json: format!(r#"{{"id":{id},"ts":"2024-01-01T00:59:00Z"}}"#),
    }));
    let table = final_rows(&changes);
    assert_eq!(table.num_rows(), 0);
    for sql in [QUERIES[0], QUERIES[2]] {
        let plan = plan_query(sql, &catalog, options.clone()).unwrap();
        let want = oracle(sql, std::slice::from_ref(&table), &plan.key_columns);
        let got = fold(&run(&plan, &feeds(&mut rng, &changes, 3), Some(5)).unwrap());
        match plan.key_columns.is_empty() {
            // The global aggregate: one row, of no rows.
            true => {
                assert_eq!(want.len(), 1, "{sql}");
                assert_matches(sql, &got, &want);
            }
            false => assert!(got.is_empty() && want.is_empty(), "{sql}: {got:?}"),
        }
    }
}

#[test]
fn an_upsert_of_the_row_a_key_holds_moves_nothing() {
    let catalog = Catalog::new().with_table("orders", schema());
    let options = options(10_000_000);
    let sql = "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant";
    let plan = plan_query(sql, &catalog, options).unwrap();
    let row = |id: u64, merchant: &str, s: u32| {
        format!(
            r#"{{"id":{id},"merchant":"{merchant}","amount":2.5,"qty":1,"ts":"2024-01-01T00:00:{s:02}Z"}}"#
        )
    };
    let feed = |line: String| Feed {
        partition: partition_id(0, 0),
        batch: decode(&[line.as_str()]),
        deleted: Vec::new(),
    };
    // m1's row, then (once m1 was emitted) the same event delivered again,
    // then a real change of it.
    let feeds = vec![
        feed(row(1, "m1", 0)),
        feed(row(2, "m2", 20)),
        feed(row(1, "m1", 0)),
        feed(row(3, "m3", 40)),
        feed(row(1, "m4", 41)),
    ];
    let records = run(&plan, &feeds, None).unwrap();
    let keys: Vec<&str> = records.iter().filter_map(|r| r.key.as_deref()).collect();
    let m1 = keys.iter().filter(|k| k.contains("m1")).count();
    // m1 once when it appears, once (a tombstone) when its row moves to m4:
    // the repeated event changed nothing and emitted nothing.
    assert_eq!(m1, 2, "{records:?}");
    assert!(
        records
            .iter()
            .any(|r| r.key.as_deref().is_some_and(|k| k.contains("m1")) && r.value.is_none())
    );
}

#[test]
fn plans_that_cannot_take_a_row_back_are_refused() {
    let catalog = Catalog::new().with_table("orders", schema());
    let refused = [
        (
            "SELECT merchant, TUMBLE(ts, INTERVAL '1' MINUTE) AS w, count(*) AS n FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1' MINUTE)",
            "a TUMBLE window over `orders`, a changelog",
        ),
        (
            "SELECT merchant, count(DISTINCT qty) AS n FROM orders GROUP BY merchant",
            "count cannot take a row back",
        ),
        (
            "SELECT n, count(*) AS c FROM (SELECT merchant, count(*) AS n FROM orders GROUP BY merchant) t GROUP BY n",
            "is a changelog",
        ),
    ];
    for (sql, want) in refused {
        let err = plan_query(sql, &catalog, QueryOptions::default())
            .expect_err(sql)
            .to_string();
        assert!(err.contains(want), "{sql}: {err}");
    }
    // A consumer group cannot route its rows by the GROUP BY key: a key's
    // rows must meet its earlier ones.
    let plan = plan_query(QUERIES[0], &catalog, QueryOptions::default()).unwrap();
    let err = ubik_engine::shuffle::Shuffler::new(&plan, 4)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("over a changelog cannot be repartitioned"),
        "{err}"
    );
    // A pass-through is keyed by the primary key, which it must keep.
    let err = plan_query(
        "SELECT merchant FROM orders",
        &catalog,
        QueryOptions::default(),
    )
    .expect_err("no key")
    .to_string();
    assert!(err.contains("`id`"), "{err}");
    let plan = plan_query(
        "SELECT id, amount FROM orders",
        &catalog,
        QueryOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.key_columns, [0]);
}

#[test]
fn a_changelog_is_the_versioned_side_of_a_temporal_join() {
    let merchants = changelog("id VARCHAR PRIMARY KEY, region VARCHAR, ts TIMESTAMP");
    let orders =
        ubik_format::schema::parse_column_list("oid BIGINT, merchant VARCHAR, ts TIMESTAMP")
            .unwrap();
    let catalog = Catalog::new()
        .with_table("orders", Arc::clone(&orders))
        .with_table("merchants", Arc::clone(&merchants));
    let sql = "SELECT o.oid, m.region FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id";
    let plan = plan_query(
        sql,
        &catalog,
        QueryOptions {
            lateness_us: 0,
            ..QueryOptions::default()
        },
    )
    .unwrap();
    let batch = |schema: &SchemaRef, lines: &[&str]| {
        let mut d = JsonDecoder::new(Arc::clone(schema)).unwrap();
        let records: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        d.decode(&records).unwrap().batch
    };
    let (m, o) = (
        plan.source_index("merchants").unwrap(),
        plan.source_index("orders").unwrap(),
    );
    let feed = |source, deletion: bool, b: RecordBatch| Feed {
        partition: partition_id(source, 0),
        deleted: vec![deletion; if deletion { b.num_rows() } else { 0 }],
        batch: b,
    };
    let feeds = vec![
        feed(
            m,
            false,
            batch(
                &merchants,
                &[r#"{"id":"m1","region":"eu","ts":"2024-01-01T00:00:00Z"}"#],
            ),
        ),
        feed(
            m,
            false,
            batch(
                &merchants,
                &[r#"{"id":"m1","region":"us","ts":"2024-01-01T00:00:10Z"}"#],
            ),
        ),
        // Debezium's delete: the key, at its source time.
        feed(
            m,
            true,
            batch(&merchants, &[r#"{"id":"m1","ts":"2024-01-01T00:00:20Z"}"#]),
        ),
        feed(
            o,
            false,
            batch(
                &orders,
                &[
                    r#"{"oid":1,"merchant":"m1","ts":"2024-01-01T00:00:05Z"}"#,
                    r#"{"oid":2,"merchant":"m1","ts":"2024-01-01T00:00:15Z"}"#,
                    r#"{"oid":3,"merchant":"m1","ts":"2024-01-01T00:00:25Z"}"#,
                ],
            ),
        ),
    ];
    let records = run(&plan, &feeds, None).unwrap();
    let values: Vec<&str> = records.iter().filter_map(|r| r.value.as_deref()).collect();
    assert_eq!(
        values,
        [r#"{"oid":1,"region":"eu"}"#, r#"{"oid":2,"region":"us"}"#]
    );
}
