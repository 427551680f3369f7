//! The Nexmark queries of `bench/nexmark/` as golden tests: on a bounded
//! stream, ubik's output equals DataFusion running the query's `-- oracle:`
//! SQL in one shot over the same events, on 1 partition and on 4; a
//! join's output is byte-identical on both.

mod common;

use std::path::PathBuf;

use common::*;
use ubik_testkit::{oracle_rows, orders_schema, read_jsonl};

/// 50 seconds of event time: five 10-second windows.
const STREAM: &str = "events=50000&rate=1000";

fn query_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../bench/nexmark/{name}.sql"))
}

fn schema_of(table: &str) -> &'static str {
    match table {
        "person" => {
            "id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, \
             state VARCHAR, date_time TIMESTAMP, extra VARCHAR"
        }
        "auction" => {
            "id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, \
             date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR"
        }
        _ => {
            "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, \
             date_time TIMESTAMP, extra VARCHAR"
        }
    }
}

/// ubik's output of `sql` over `tables` (value JSON per line, in order).
fn ubik_values(sql_file: &std::path::Path, tables: &[&str], partitions: u32) -> Vec<String> {
    let mut cmd = ubik();
    cmd.arg("run").arg("-f").arg(sql_file).arg("-q");
    for t in tables {
        cmd.args([
            "--from",
            &format!("nexmark://{t}?{STREAM}&partitions={partitions}"),
        ]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // The value's bytes as written (a JSON re-encoding would reorder keys).
    stdout(&o)
        .lines()
        .map(|l| {
            let (_, value) = l
                .split_once(r#","value":"#)
                .unwrap_or_else(|| panic!("not a changelog line: {l}"));
            value.strip_suffix('}').unwrap_or(value).to_string()
        })
        .collect()
}

/// The events of `table`, read back through ubik as JSON (an input the
/// oracle decodes with Arrow's own JSON reader).
fn events(table: &str) -> Vec<arrow::array::RecordBatch> {
    let sql = format!("SELECT * FROM {table}");
    let o = run(&[
        "run",
        &sql,
        "--from",
        &format!("nexmark://{table}?{STREAM}"),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: String = stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{}\n", v["value"])
        })
        .collect();
    read_jsonl(lines.as_bytes(), &orders_schema(schema_of(table)))
}

fn check(name: &str, tables: &[&str], min_rows: usize) {
    let file = query_file(name);
    let text = std::fs::read_to_string(&file).unwrap();
    let oracle_sql: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("-- oracle:"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!oracle_sql.is_empty(), "{name}: no -- oracle: lines");
    let inputs: Vec<(&str, Vec<arrow::array::RecordBatch>)> =
        tables.iter().map(|t| (*t, events(t))).collect();
    let refs: Vec<(&str, &[arrow::array::RecordBatch])> =
        inputs.iter().map(|(t, b)| (*t, b.as_slice())).collect();
    let want = oracle_rows(&oracle_sql, &refs);
    assert!(
        want.len() >= min_rows,
        "{name}: the oracle returned {} rows, the test needs at least {min_rows} to mean something",
        want.len()
    );
    let one = ubik_values(&file, tables, 1);
    let four = ubik_values(&file, tables, 4);
    for (label, got) in [("1 partition", &one), ("4 partitions", &four)] {
        let mut sorted = got.clone();
        sorted.sort();
        assert!(
            sorted == want,
            "{name} on {label}: {} rows, the oracle {}; first differences: {:?}",
            sorted.len(),
            want.len(),
            sorted
                .iter()
                .zip(&want)
                .filter(|(a, b)| a != b)
                .take(3)
                .collect::<Vec<_>>()
        );
    }
    if tables.len() > 1 || text.contains("JOIN") {
        assert_eq!(one, four, "{name}: a join's output depends on partitioning");
    }
}

#[test]
fn q0_passthrough() {
    check("q0", &["bid"], 40_000);
}

#[test]
fn q1_currency_conversion() {
    check("q1", &["bid"], 40_000);
}

#[test]
fn q2_selection() {
    check("q2", &["bid"], 50);
}

#[test]
fn q3_local_item_suggestion() {
    check("q3", &["auction", "person"], 20);
}

#[test]
fn q5_hot_items() {
    check("q5", &["bid"], 20);
}

#[test]
fn q7_highest_bid() {
    check("q7", &["bid"], 5);
}

#[test]
fn q8_new_users() {
    check("q8", &["person", "auction"], 50);
}
