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

/// ubik's output of `sql` over `tables` (key and value JSON per line, in order).
fn ubik_records(
    sql_file: &std::path::Path,
    tables: &[&str],
    partitions: u32,
) -> Vec<(String, String)> {
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
    changelog_lines(&stdout(&o))
}

/// Key and value of each changelog line, the value's bytes as written (a
/// JSON re-encoding would reorder keys).
fn changelog_lines(out: &str) -> Vec<(String, String)> {
    out.lines()
        .map(|l| {
            let (key, value) = l
                .split_once(r#","value":"#)
                .unwrap_or_else(|| panic!("not a changelog line: {l}"));
            let key = key.strip_prefix(r#"{"key":"#).unwrap_or(key);
            let value = value.strip_suffix('}').unwrap_or(value);
            (key.to_string(), value.to_string())
        })
        .collect()
}

/// Every value emitted, in order (append-only results and windows that
/// close once), or with `fold` each key's latest value, tombstones
/// removing it (an upsert changelog's current state).
fn values(records: Vec<(String, String)>, fold: bool) -> Vec<String> {
    if !fold {
        return records.into_iter().map(|(_, v)| v).collect();
    }
    let mut latest = std::collections::BTreeMap::new();
    for (k, v) in records {
        latest.insert(k, v);
    }
    latest.into_values().filter(|v| v != "null").collect()
}

/// ubik's output of `sql` over the tables' events as JSON files (`dir/TABLE.jsonl`), decoded
/// with the declared schemas: only the columns the query reads are decoded.
fn ubik_records_from_files(
    sql_file: &std::path::Path,
    tables: &[&str],
    dir: &std::path::Path,
) -> Vec<(String, String)> {
    let mut cmd = ubik();
    cmd.arg("run").arg("-f").arg(sql_file).arg("-q");
    for t in tables {
        let path = dir.join(format!("{t}.jsonl"));
        cmd.args(["--from", &format!("{t}={}", path.display())]);
        cmd.args(["--schema", &format!("{t}={}", schema_of(t))]);
    }
    // The auctions have two TIMESTAMP columns; only nexmark:// declares which is the event time.
    if tables.contains(&"auction") {
        cmd.args(["--event-time", "date_time"]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    changelog_lines(&stdout(&o))
}

/// The JSON lines of `table`'s events, as ubik writes them.
fn event_lines(table: &str) -> String {
    let sql = format!("SELECT * FROM {table}");
    let o = run(&[
        "run",
        &sql,
        "--from",
        &format!("nexmark://{table}?{STREAM}"),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!("{}\n", v["value"])
        })
        .collect()
}

/// How a query's output is compared with the oracle's rows.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// Every emitted row: append-only, or windows emitted once.
    Rows,
    /// The changelog's latest value per key: a continuous aggregation
    /// (upserted as rows come in), sessions (retracted as they merge) or
    /// a top-N (ranks upserted as better rows come in).
    Folded,
}

/// The query's `-- oracle:` SQL; "the query, in one shot" stands for the
/// query's own text.
fn oracle_sql(name: &str, text: &str) -> String {
    let oracle: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("-- oracle:"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!oracle.is_empty(), "{name}: no -- oracle: lines");
    if oracle.trim() != "the query, in one shot" {
        return oracle;
    }
    text.lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(name: &str, tables: &[&str], min_rows: usize) {
    check_output(name, tables, min_rows, Output::Rows)
}

fn check_output(name: &str, tables: &[&str], min_rows: usize, output: Output) {
    let file = query_file(name);
    let text = std::fs::read_to_string(&file).unwrap();
    let oracle_sql = oracle_sql(name, &text);
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<(&str, Vec<arrow::array::RecordBatch>)> = tables
        .iter()
        .map(|t| {
            let lines = event_lines(t);
            std::fs::write(dir.path().join(format!("{t}.jsonl")), &lines).unwrap();
            (
                *t,
                read_jsonl(lines.as_bytes(), &orders_schema(schema_of(t))),
            )
        })
        .collect();
    let refs: Vec<(&str, &[arrow::array::RecordBatch])> =
        inputs.iter().map(|(t, b)| (*t, b.as_slice())).collect();
    let want = oracle_rows(&oracle_sql, &refs);
    assert!(
        want.len() >= min_rows,
        "{name}: the oracle returned {} rows, the test needs at least {min_rows} to mean something",
        want.len()
    );
    let fold = output == Output::Folded;
    let one = values(ubik_records(&file, tables, 1), fold);
    let four = values(ubik_records(&file, tables, 4), fold);
    let decoded = values(ubik_records_from_files(&file, tables, dir.path()), fold);
    for (label, got) in [
        ("1 partition", &one),
        ("4 partitions", &four),
        ("JSON files", &decoded),
    ] {
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
fn q4_average_price_for_a_category() {
    check_output("q4", &["auction", "bid"], 5, Output::Folded);
}

#[test]
fn q5_hot_items() {
    check("q5", &["bid"], 20);
}

#[test]
fn q6_average_selling_price_by_seller() {
    check_output("q6", &["auction", "bid"], 100, Output::Folded);
}

#[test]
fn q7_highest_bid() {
    check("q7", &["bid"], 5);
}

#[test]
fn q8_new_users() {
    check("q8", &["person", "auction"], 50);
}

#[test]
fn q9_winning_bids() {
    check_output("q9", &["auction", "bid"], 100, Output::Folded);
}

#[test]
fn q11_user_sessions() {
    check_output("q11", &["bid"], 500, Output::Folded);
}

#[test]
fn q14_calculation() {
    check("q14", &["bid"], 1_000);
}

#[test]
fn q15_bidding_statistics() {
    // 50 seconds of bids are one day: one row, of counts checked exactly.
    check_output("q15", &["bid"], 1, Output::Folded);
}

#[test]
fn q16_channel_statistics() {
    check_output("q16", &["bid"], 100, Output::Folded);
}

#[test]
fn q17_auction_statistics() {
    check_output("q17", &["bid"], 1_000, Output::Folded);
}

#[test]
fn q18_find_last_bid() {
    check_output("q18", &["bid"], 10_000, Output::Folded);
}

#[test]
fn q19_auction_top_10_price() {
    check_output("q19", &["bid"], 1_000, Output::Folded);
}

#[test]
fn q20_expand_bid_with_auction() {
    check("q20", &["bid", "auction"], 100);
}

#[test]
fn q21_add_channel_id() {
    check("q21", &["bid"], 1_000);
}

#[test]
fn q22_url_directories() {
    check("q22", &["bid"], 40_000);
}
