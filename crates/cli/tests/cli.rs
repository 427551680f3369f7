//! The `ubik` command: validation, refusals, error policies, pipeline files.

mod common;

use common::*;
use ubik_testkit::{Orders, fold_lines};

const Q: &str = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
const SCHEMA: &str = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE";

#[test]
fn validate_prints_schema_and_key() {
    let o = run(&["validate", Q, "--schema", SCHEMA]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("w: Timestamp(µs, \"UTC\")  (key)"), "{out}");
    assert!(out.contains("key: [merchant, w]"), "{out}");
    let o = run(&["validate", Q, "--schema", SCHEMA, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["key"], serde_json::json!(["merchant", "w"]));
}

#[test]
fn bad_sql_exits_2_with_position() {
    let o = run(&[
        "validate",
        "SELECT merchant,, FROM orders",
        "--schema",
        SCHEMA,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 1, column"), "{}", stderr(&o));
    let o = run(&[
        "validate",
        "SELECT merchant, count(*) FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')",
        "--schema",
        SCHEMA,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("window column"), "{}", stderr(&o));
}

/// A query error in a pipeline file points at the file's line and column,
/// quoting the line with a caret under the mistake; exit code 2.
#[test]
fn query_errors_point_into_the_pipeline_file() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("p.toml");
    std::fs::write(
        &toml,
        format!(
            "# orders per merchant\nschema = \"{SCHEMA}\"\nquery = \"\"\"\nSELECT merchant,\n       sum(amout) AS total\nFROM orders GROUP BY merchant\n\"\"\"\n"
        ),
    )
    .unwrap();
    let o = run(&["validate", "-f", toml.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let want = format!(
        "error: unknown column `amout`\n --> {}:5:12\n  |\n5 |        sum(amout) AS total\n  |            ^^^^^\nhint: did you mean `amount`?\n",
        toml.display()
    );
    assert_eq!(stderr(&o), want);
    // On the query's first line, the column counts what precedes it.
    std::fs::write(
        &toml,
        format!("schema = \"{SCHEMA}\"\nquery = \"SELECT merchnt FROM orders\"\n"),
    )
    .unwrap();
    let e = stderr(&run(&["validate", "-f", toml.to_str().unwrap()]));
    assert!(
        e.contains("p.toml:2:17\n") && e.contains("\n  |                 ^^^^^^^\n"),
        "{e}"
    );
}

#[test]
fn refuses_file_sinks() {
    for to in ["file:///tmp/out.parquet", "s3://bucket/x", "/tmp/out.jsonl"] {
        let o = run(&["run", Q, "--from", "demo://orders", "--to", to]);
        assert_eq!(o.status.code(), Some(2), "{to}");
        let e = stderr(&o);
        assert!(
            e.contains("writes no files") && e.contains("Arrow leg"),
            "{e}"
        );
    }
}

#[test]
fn demo_runs_without_a_broker() {
    let o = run(&["run", Q, "--from", "demo://orders?count=20000&keys=5", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(String::from).collect();
    assert!(lines.len() > 10, "{}", lines.len());
    let total: i64 = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["value"]["n"].as_i64().unwrap())
        .sum();
    // Late updates re-emit a window with its new count: the folded counts add up.
    let folded: i64 = fold_lines(&lines)
        .values()
        .map(|v| {
            serde_json::from_str::<serde_json::Value>(v).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .sum();
    assert_eq!(
        folded, 20000,
        "every demo event is counted once in the folded state"
    );
    assert!(total >= folded);
}

#[test]
fn bad_records_by_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.jsonl");
    std::fs::write(
        &path,
        "{\"merchant\":\"a\",\"ts\":\"2024-01-01T00:00:00Z\",\"amount\":1}\n\n{\"merchant\":\"a\",\"ts\":\"yesterday\",\"amount\":1}\n{broken\n{\"merchant\":\"b\",\"ts\":\"2024-01-01T00:00:01Z\",\"amount\":2}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = run(&["run", Q, "--from", p, "--schema", SCHEMA, "-q"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("line 3") && e.contains("timestamp") && e.contains("--on-error"),
        "{e}"
    );

    let o = run(&[
        "run",
        Q,
        "--from",
        p,
        "--schema",
        SCHEMA,
        "--on-error",
        "skip",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 2);
    assert!(
        stderr(&o).contains("skipping bad record at line 4"),
        "{}",
        stderr(&o)
    );

    let o = run(&[
        "run",
        Q,
        "--from",
        p,
        "--schema",
        SCHEMA,
        "--on-error",
        "dlq",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let letters: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .filter(|l| l.starts_with("{\"dead_letter\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(letters.len(), 2, "{}", stderr(&o));
    assert_eq!(letters[1]["dead_letter"]["line"], 4);
    assert_eq!(letters[1]["dead_letter"]["record"], "{broken");
}

#[test]
fn late_rows_beyond_retention_are_dead_lettered_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.jsonl");
    std::fs::write(
        &path,
        "{\"merchant\":\"a\",\"ts\":\"2024-01-01T00:00:00Z\",\"amount\":1}\n{\"merchant\":\"a\",\"ts\":\"2024-01-01T01:00:00Z\",\"amount\":1}\n{\"merchant\":\"a\",\"ts\":\"2024-01-01T00:00:05Z\",\"amount\":1}\n",
    )
    .unwrap();
    let o = run(&[
        "run",
        Q,
        "--from",
        path.to_str().unwrap(),
        "--schema",
        SCHEMA,
        "--retention",
        "1m",
        "--lateness",
        "0s",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("\"reason\":\"late\"") && e.contains("\"line\":3"),
        "{e}"
    );
    assert!(e.contains("dead_letters=1"), "{e}");
}

#[test]
fn pipeline_file_with_flag_overrides_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = Orders::new(500, 3, 100, 0).write(dir.path(), "orders.jsonl", 1);
    let toml = dir.path().join("p.toml");
    std::fs::write(
        &toml,
        format!(
            "query = \"{Q}\"\nfrom = \"{}\"\nschema = \"{SCHEMA}\"\nlateness = \"0s\"\n",
            data.display()
        ),
    )
    .unwrap();
    let o = run(&["run", "-f", toml.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_file = stdout(&o);
    assert!(!from_file.is_empty());
    // A flag overrides the file: a different query.
    let o = run(&[
        "run",
        "-f",
        toml.to_str().unwrap(),
        "-q",
        "SELECT merchant, count(*) AS n FROM orders GROUP BY merchant",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(stdout(&o), from_file);

    std::fs::write(
        &toml,
        "query = \"SELECT 1\"\nfrom = \"demo://orders\"\nlatenes = \"5s\"\n",
    )
    .unwrap();
    let o = run(&["run", "-f", toml.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(e.contains("line 3") && e.contains("latenes"), "{e}");
    std::fs::write(&toml, "query = \"SELECT 1\"\nbatch_size = \"many\"\n").unwrap();
    let e = stderr(&run(&["run", "-f", toml.to_str().unwrap()]));
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn stdin_and_inferred_schema() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let data = Orders::new(300, 2, 200, 0).write(dir.path(), "orders.jsonl", 3);
    let mut child = ubik()
        .args(["run", Q, "--from", "-", "-q", "--lateness", "0s"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&data).unwrap())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let by_stdin = stdout(&o);
    let o = run(&[
        "run",
        Q,
        "--from",
        data.to_str().unwrap(),
        "-q",
        "--lateness",
        "0s",
    ]);
    assert_eq!(
        stdout(&o),
        by_stdin,
        "stdin and file give the same changelog"
    );
    assert!(by_stdin.lines().count() >= 2);
}
