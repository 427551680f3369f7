//! Golden errors: real mistakes a person makes in a query, each with the
//! exact text ubik shows (`tests/sql_errors.txt`). The text says what is
//! wrong in words, quotes the query line with a caret under the offending
//! token or expression, and hints at the fix; it never shows Rust Debug
//! text or DataFusion's "file a bug report" advice.
//!
//! `UBIK_BLESS=1 cargo test -p ubik-engine --test sql_errors` rewrites the
//! file with today's texts, to be reviewed in the diff.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_engine::{Catalog, QueryOptions, plan_query};

fn catalog() -> Catalog {
    let time = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Catalog::new()
        .with_table(
            "orders",
            Arc::new(Schema::new(vec![
                Field::new("merchant", DataType::Utf8, true),
                Field::new("ts", time(), true),
                Field::new("amount", DataType::Float64, true),
            ])),
        )
        .with_table(
            "rates",
            Arc::new(Schema::new(vec![
                Field::new("merchant", DataType::Utf8, true),
                Field::new("ts", time(), true),
                Field::new("rate", DataType::Float64, true),
            ])),
        )
}

struct Case {
    title: String,
    query: String,
    expected: String,
}

fn parse(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    for block in text.split("\n# ").map(|b| b.trim_start_matches("# ")) {
        let Some((title, rest)) = block.split_once('\n') else {
            continue;
        };
        let (query, expected) = rest.split_once("\n----\n").expect("a ---- line");
        cases.push(Case {
            title: title.to_string(),
            query: query.to_string(),
            expected: expected.trim_end().to_string(),
        });
    }
    cases
}

fn render(cases: &[Case]) -> String {
    cases
        .iter()
        .map(|c| format!("# {}\n{}\n----\n{}\n", c.title, c.query, c.expected))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_mistake_reads_as_written() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sql_errors.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let mut cases = parse(&text);
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in &mut cases {
        let got = match plan_query(&case.query, &catalog(), QueryOptions::default()) {
            Ok(_) => "(plans without an error)".to_string(),
            Err(e) => e.to_string(),
        };
        for leak in [
            "Internal error",
            "DataFusion",
            "bug report",
            "Error(\"",
            "Some(",
        ] {
            if got.contains(leak) {
                failures.push(format!("{}: shows {leak:?}:\n{got}", case.title));
            }
        }
        if !got.contains('^') {
            failures.push(format!("{}: points at nothing:\n{got}", case.title));
        }
        if got != case.expected {
            failures.push(format!(
                "{}:\n--- expected\n{}\n--- got\n{got}",
                case.title, case.expected
            ));
            case.expected = got;
        }
    }
    if std::env::var_os("UBIK_BLESS").is_some() {
        std::fs::write(path, render(&cases)).unwrap();
        return;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
