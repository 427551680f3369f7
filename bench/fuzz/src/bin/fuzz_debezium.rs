//! Fuzzes the Debezium envelope for a budget: `fuzz_debezium SECONDS`.
//!
//! Each case is a chunk of change events (c, r, u, d, t, with and without
//! Connect's schema envelope, tombstones among them), some damaged (cut
//! short, a byte changed, an object dropped) and some random bytes. The
//! unwrapping must not panic, must account for every record exactly once
//! (a row, a deletion, a bad record or a dropped tombstone), and an
//! undamaged event's row must be its own `after` (or `before`) object and
//! source time, then decode with the table's JSON decoder.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use ubik_format::debezium::{DebeziumJson, Unwrapped};
use ubik_format::json::JsonDecoder;
use ubik_format::timestamp::EpochUnit;
use ubik_fuzz::{Damage, damage, events_chunk};

/// (op, id, name, source time, with schema envelope, tombstone instead)
type Event = (u8, i64, String, i64, bool, bool);

fn event() -> impl Strategy<Value = Event> {
    (
        0u8..5,
        any::<i64>(),
        "[a-z\"\\\\\u{e9}]{0,8}",
        0i64..1 << 45,
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
}

/// The event's JSON, and the row it must become (`None`: it must be refused).
fn encode(e: &Event) -> (String, Option<String>) {
    let (op, id, name, ts, envelope, _) = e;
    let row = format!(
        r#"{{"id":{id},"name":{}}}"#,
        serde_json::to_string(name).unwrap()
    );
    let (op, before, after, want) = match op {
        0 => ("c", "null".to_string(), row.clone(), Some(row)),
        1 => ("r", "null".to_string(), row.clone(), Some(row)),
        2 => ("u", row.clone(), row.clone(), Some(row)),
        3 => ("d", row.clone(), "null".to_string(), Some(row)),
        _ => ("t", "null".to_string(), "null".to_string(), None),
    };
    let payload = format!(
        r#"{{"before":{before},"after":{after},"source":{{"ts_ms":{ts},"db":"x"}},"op":"{op}","ts_ms":1}}"#
    );
    let text = match envelope {
        true => format!(r#"{{"schema":{{"type":"struct","fields":[]}},"payload":{payload}}}"#),
        false => payload,
    };
    (text, want)
}

fn check(cases: Vec<(Event, Damage)>) -> Result<(), TestCaseError> {
    let (mut records, mut tombstones, mut wants) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (e, damage)) in cases.iter().enumerate() {
        let (text, want) = encode(e);
        let mut bytes = text.into_bytes();
        let intact = damage.is_none();
        damage.apply(&mut bytes);
        if e.5 {
            tombstones.push(i as u32);
            bytes = br#"{"id":1}"#.to_vec();
        }
        records.push(bytes);
        wants.push((intact && !e.5).then_some((want, e.3, e.0 == 3)));
    }
    let n = records.len();
    let chunk = events_chunk(&records, tombstones.clone());
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]));
    let Unwrapped {
        mut rows,
        rejected,
        bad,
    } = DebeziumJson::new(&schema, EpochUnit::Millis).unwrap_events(chunk);
    // The events' schemas name no time types: one run.
    prop_assert_eq!(rows.len(), 1);
    let rows = rows.remove(0).chunk;
    let accounted = rows.payload.len() + bad.len() + tombstones.len();
    prop_assert_eq!(accounted, n, "every record once");
    prop_assert_eq!(rejected.payload.len(), bad.len());
    prop_assert!(bad.iter().enumerate().all(|(i, b)| b.index == i));
    // Undamaged events, in order, by their position.
    let records = rows.payload.records();
    for (j, &pos) in rows.positions.iter().enumerate() {
        if let Some((want, ts, deletion)) = &wants[pos as usize] {
            let want = want.as_ref().expect("a truncate is refused");
            prop_assert_eq!(std::str::from_utf8(records[j]).unwrap(), want.as_str());
            prop_assert_eq!(rows.meta.timestamps[j], *ts);
            prop_assert_eq!(rows.meta.deletions.contains(&(j as u32)), *deletion);
        }
    }
    for (i, w) in wants.iter().enumerate() {
        if let Some((None, ..)) = w {
            prop_assert!(
                !rows.positions.contains(&(i as u64)),
                "a truncate was applied"
            );
        }
    }
    // The rows decode as the table's JSON (bad ones are the decoder's to report).
    let mut decoder = JsonDecoder::new(schema).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let decoded = decoder
        .decode(&records)
        .map_err(|e| TestCaseError::fail(format!("decode failed: {e}")))?;
    prop_assert_eq!(decoded.batch.num_rows() + decoded.bad.len(), records.len());
    Ok(())
}

fn main() {
    let budget = ubik_fuzz::budget_from_args();
    let strategy = proptest::collection::vec((event(), damage()), 1..24);
    let (_, findings) = ubik_fuzz::run_for("debezium envelope", budget, strategy, check);
    std::process::exit(i32::from(findings > 0));
}
