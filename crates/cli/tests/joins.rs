//! `ubik run` over two named sources: temporal and interval joins,
//! aggregated, checked against DataFusion running the join in one shot, and
//! byte-identical however the two sources' reads interleave.

mod common;

use std::path::Path;

use common::*;
use ubik_testkit::{Rng, State, assert_matches, fold_lines, oracle_tables, read_jsonl};

const T0: u64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z, in ms

fn ts(ms: u64) -> String {
    let secs = ms / 1000;
    format!(
        "2024-01-01T{:02}:{:02}:{:02}.{:03}Z",
        (secs - T0 / 1000) / 3600,
        (secs - T0 / 1000) / 60 % 60,
        secs % 60,
        ms % 1000
    )
}

/// Orders (by time, slightly out of order), merchant versions (a new
/// version of some merchant now and then) and payments for some orders.
fn write_inputs(dir: &Path, n: u64) {
    let mut rng = Rng(7);
    let (mut orders, mut merchants, mut payments) = (Vec::new(), Vec::new(), Vec::new());
    for m in 0..8 {
        merchants.push(format!(
            r#"{{"id":"m{m}","region":"r{}","ts":"{}"}}"#,
            rng.below(3),
            ts(T0 + m * 7)
        ));
    }
    for i in 0..n {
        let t = T0 + 1_000 + i * 250 + rng.below(2_000);
        let m = rng.below(9); // m8 never has a version: dropped by the inner join
        orders.push(format!(
            r#"{{"oid":{i},"merchant":"m{m}","ts":"{}","amount":{}.{:02}}}"#,
            ts(t),
            rng.below(100),
            rng.below(100)
        ));
        if i % 40 == 0 {
            // A new version of a merchant, valid from a time near this order.
            merchants.push(format!(
                r#"{{"id":"m{}","region":"r{}","ts":"{}"}}"#,
                rng.below(8),
                rng.below(3),
                ts(t + 1 + i)
            ));
        }
        if rng.below(3) > 0 {
            payments.push(format!(
                r#"{{"pid":{i},"order_id":{i},"ts":"{}","paid":{}.5}}"#,
                // Some are paid after the join's one-minute bound.
                ts(t + rng.below(3_000) + 60_000 * (rng.below(4) == 0) as u64),
                rng.below(50)
            ));
        }
    }
    for (name, lines) in [
        ("orders", orders),
        ("merchants", merchants),
        ("payments", payments),
    ] {
        std::fs::write(dir.join(format!("{name}.jsonl")), lines.join("\n") + "\n").unwrap();
    }
}

const ORDERS: &str = "oid BIGINT, merchant VARCHAR, ts TIMESTAMP, amount DOUBLE";
const MERCHANTS: &str = "id VARCHAR PRIMARY KEY, region VARCHAR, ts TIMESTAMP";
const PAYMENTS: &str = "pid BIGINT, order_id BIGINT, ts TIMESTAMP, paid DOUBLE";

fn table(dir: &Path, name: &str, columns: &str) -> Vec<arrow::array::RecordBatch> {
    let schema = ubik_format::schema::parse_column_list(columns).unwrap();
    read_jsonl(
        &std::fs::read(dir.join(format!("{name}.jsonl"))).unwrap(),
        &schema,
    )
}

/// How late rows are waited for: a watermark delay long enough for every row.
const WAIT: &[&str] = &["--lateness", "120s"];

/// No watermark delay, so many rows are late, and a join retention long
/// enough for every one of them to join all the same.
const LATE_JOINED: &[&str] = &["--lateness", "0s", "--join-retention", "120s"];

/// `ubik run` of `sql` over the named sources, read `batch` records at a time.
fn run_join_output(
    dir: &Path,
    sql: &str,
    sources: &[(&str, &str)],
    batch: &str,
    timing: &[&str],
) -> std::process::Output {
    let mut args: Vec<String> = vec!["run".into(), sql.into(), "-q".into()];
    for (name, columns) in sources {
        args.push("--from".into());
        args.push(format!(
            "{name}={}",
            dir.join(format!("{name}.jsonl")).display()
        ));
        args.push("--schema".into());
        args.push(format!("{name}={columns}"));
    }
    args.extend(timing.iter().map(|a| a.to_string()));
    args.extend(["--batch-size", batch].map(String::from));
    let o = ubik().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// The changelog of [`run_join_output`], which must dead-letter nothing.
fn run_join(
    dir: &Path,
    sql: &str,
    sources: &[(&str, &str)],
    batch: &str,
    timing: &[&str],
) -> Vec<String> {
    let o = run_join_output(dir, sql, sources, batch, timing);
    assert!(
        !stderr(&o).contains("\"reason\""),
        "dead letters: {}",
        stderr(&o)
    );
    stdout(&o).lines().map(String::from).collect()
}

fn check(dir: &Path, sql: &str, sources: &[(&str, &str)], want: &State) {
    check_with(dir, sql, sources, want, WAIT)
}

fn check_with(dir: &Path, sql: &str, sources: &[(&str, &str)], want: &State, timing: &[&str]) {
    let reference = run_join(dir, sql, sources, "1000", timing);
    assert!(!reference.is_empty());
    assert_matches(sql, &fold_lines(&reference), want);
    for batch in ["7", "64"] {
        assert_eq!(
            run_join(dir, sql, sources, batch, timing),
            reference,
            "the changelog depends on how the sources' reads interleave (batch size {batch})"
        );
    }
}

#[test]
fn temporal_join_aggregated_equals_as_of_oracle() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path(), 3_000);
    let sql = "SELECT m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(o.amount) AS total \
               FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id \
               GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE)";
    // As of: the merchant's latest version at or before the order.
    let oracle = "WITH c AS (SELECT o.ts, o.amount, m.region, \
                    row_number() OVER (PARTITION BY o.oid ORDER BY m.ts DESC) AS rn \
                  FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) \
                  SELECT region, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
                    count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2";
    let (o, m) = (
        table(dir.path(), "orders", ORDERS),
        table(dir.path(), "merchants", MERCHANTS),
    );
    let want = oracle_tables(oracle, &[("orders", &o), ("merchants", &m)], &[0, 1]);
    check(
        dir.path(),
        sql,
        &[("orders", ORDERS), ("merchants", MERCHANTS)],
        &want,
    );
    // The primary key alone makes a plain JOIN temporal.
    let plain = sql.replace(" FOR SYSTEM_TIME AS OF o.ts", "");
    check(
        dir.path(),
        &plain,
        &[("orders", ORDERS), ("merchants", MERCHANTS)],
        &want,
    );
}

#[test]
fn interval_join_aggregated_equals_oracle() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path(), 3_000);
    let sql = "SELECT o.merchant, TUMBLE(p.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(p.paid) AS paid \
               FROM payments p JOIN orders o ON p.order_id = o.id \
                 AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1' MINUTE \
               GROUP BY o.merchant, TUMBLE(p.ts, INTERVAL '1' MINUTE)";
    let oracle = "SELECT o.merchant, date_bin(INTERVAL '1 minute', p.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
                    count(*) AS n, sum(p.paid) AS paid \
                  FROM payments p JOIN orders o ON p.order_id = o.oid \
                    AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1 minute' GROUP BY 1, 2";
    let sql = sql.replace("o.id", "o.oid");
    let (o, p) = (
        table(dir.path(), "orders", ORDERS),
        table(dir.path(), "payments", PAYMENTS),
    );
    let want = oracle_tables(oracle, &[("orders", &o), ("payments", &p)], &[0, 1]);
    let sources = [("payments", PAYMENTS), ("orders", ORDERS)];
    check(dir.path(), &sql, &sources, &want);
    // Without a watermark delay rows come late: with a join retention they
    // join all the same (late pairs update their windows), without one
    // they are dead letters.
    check_with(dir.path(), &sql, &sources, &want, LATE_JOINED);
    let strict = run_join_output(dir.path(), &sql, &sources, "64", &["--lateness", "0s"]);
    assert!(
        stderr(&strict).contains("set --join-retention"),
        "no late row: {}",
        stderr(&strict)
    );
}

/// `ubik validate --json` of `sql` with the three tables' schemas.
fn validate_json(sql: &str) -> serde_json::Value {
    let schemas = [
        ("orders", ORDERS),
        ("merchants", MERCHANTS),
        ("payments", PAYMENTS),
    ]
    .map(|(name, columns)| format!("{name}={columns}"));
    let mut args = vec!["validate", sql, "--json"];
    for s in &schemas {
        args.extend(["--schema", s.as_str()]);
    }
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn validate_reports_a_join_and_refuses_unbounded_ones() {
    let sql = "SELECT o.oid, m.region FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id";
    let v = validate_json(sql);
    assert_eq!(v["sources"], serde_json::json!(["orders", "merchants"]));
    assert_eq!(v["kind"], "temporal join (append-only)");
    // Each source's columns decoded: those named, the timestamps, the primary key.
    assert_eq!(
        v["reads"],
        serde_json::json!({"orders": ["oid", "merchant", "ts"], "merchants": ["id", "region", "ts"]})
    );
    // Three tables: the outer join reads the inner one's rows.
    let v = validate_json(
        "SELECT o.oid, p.pid, m.region FROM orders o \
         JOIN payments p ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1' HOUR \
         JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id",
    );
    assert_eq!(
        v["sources"],
        serde_json::json!(["orders", "payments", "merchants"])
    );
    assert_eq!(
        v["kind"],
        "temporal join of (interval join) and a table (append-only)"
    );
    let v = validate_json(
        "SELECT o.oid, p.pid FROM orders o LEFT JOIN payments p \
         ON p.order_id = o.oid AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1' HOUR",
    );
    assert_eq!(v["kind"], "LEFT interval join (append-only)");
    let o = run(&[
        "validate",
        "SELECT o.oid FROM orders o JOIN payments p ON p.order_id = o.oid",
        "--schema",
        &format!("orders={ORDERS}"),
        "--schema",
        &format!("payments={PAYMENTS}"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("unbounded") && e.contains("interval join"),
        "{e}"
    );
    // An append-only result takes a record key on request.
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path(), 200);
    let mut args: Vec<String> = vec![
        "run".into(),
        sql.into(),
        "-q".into(),
        "--key".into(),
        "oid".into(),
    ];
    for (name, columns) in [("orders", ORDERS), ("merchants", MERCHANTS)] {
        args.push("--from".into());
        args.push(format!(
            "{name}={}",
            dir.path().join(format!("{name}.jsonl")).display()
        ));
        args.push("--schema".into());
        args.push(format!("{name}={columns}"));
    }
    let o = ubik().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let first: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(first["key"]["oid"], first["value"]["oid"], "{first}");
    args[4] = "nope".into();
    let o = ubik().args(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("key column `nope`"), "{}", stderr(&o));
    // The pipeline file names its sources in [sources.NAME] tables.
    let toml = dir.path().join("join.toml");
    std::fs::write(
        &toml,
        format!(
            "query = {sql:?}\nkey = \"oid\"\n\n[sources.orders]\nfrom = {:?}\nschema = {ORDERS:?}\n\n[sources.merchants]\nfrom = {:?}\nschema = {MERCHANTS:?}\n",
            dir.path().join("orders.jsonl").display().to_string(),
            dir.path().join("merchants.jsonl").display().to_string(),
        ),
    )
    .unwrap();
    let from_file = run(&["run", "-f", toml.to_str().unwrap(), "-q"]);
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    args[4] = "oid".into();
    let from_flags = ubik().args(&args).output().unwrap();
    assert_eq!(stdout(&from_file), stdout(&from_flags));
    // Several sources must each be named.
    let o = run(&["run", sql, "--from", "a.jsonl", "--from", "b.jsonl"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("NAME="), "{}", stderr(&o));
}
