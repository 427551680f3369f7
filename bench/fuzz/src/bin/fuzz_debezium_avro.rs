//! Fuzzes Debezium's Avro envelope for a budget: `fuzz_debezium_avro SECONDS`.
//!
//! Each case is a chunk of Confluent-framed change events (c, r, u, d, t,
//! with or without `before`/`after`, tombstones among them), some damaged
//! (cut short, a byte changed, random bytes). The unwrapping must not
//! panic, must account for every record exactly once (a row, a deletion, a
//! bad record or a dropped tombstone), and an undamaged event must become
//! its own `after` (or, for a delete, `before`) row at its source time, or
//! be refused when it cannot be applied.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use ubik_avro::AvroDecoder;
use ubik_avro::debezium::{DebeziumAvro, table_of};
use ubik_avro::encode::write_long;
use ubik_connector::Payload;
use ubik_format::debezium::{ChangeEvents, Unwrapped};
use ubik_fuzz::{Damage, damage, events_chunk};

const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","fields":[
    {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
        {"name":"id","type":"long"},{"name":"name","type":["null","string"]}]}],"default":null},
    {"name":"after","type":["null","Value"],"default":null},
    {"name":"source","type":{"type":"record","name":"Source","fields":[{"name":"ts_ms","type":"long"}]}},
    {"name":"op","type":"string"},
    {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

/// (op, id, name, source time, has before, has after, tombstone instead)
type Event = (u8, i64, Option<String>, i64, bool, bool, bool);

fn event() -> impl Strategy<Value = Event> {
    (
        0u8..6,
        any::<i64>(),
        proptest::option::of("[a-z\u{e9}]{0,8}"),
        0i64..1 << 45,
        any::<bool>(),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.1),
    )
}

const OPS: [&str; 6] = ["c", "r", "u", "d", "t", "x"];

fn row(out: &mut Vec<u8>, present: bool, id: i64, name: &Option<String>) {
    if !present {
        return write_long(out, 0);
    }
    write_long(out, 1);
    write_long(out, id);
    match name {
        None => write_long(out, 0),
        Some(n) => {
            write_long(out, 1);
            write_long(out, n.len() as i64);
            out.extend_from_slice(n.as_bytes());
        }
    }
}

/// The framed event, and whether it must apply (as a deletion or not).
fn encode(e: &Event) -> (Vec<u8>, Option<bool>) {
    let (op, id, name, ts, before, after, _) = e;
    let op = OPS[*op as usize];
    let mut out = vec![0, 0, 0, 0, 3];
    row(&mut out, *before, *id, name);
    row(&mut out, *after, *id, name);
    write_long(&mut out, *ts);
    write_long(&mut out, op.len() as i64);
    out.extend_from_slice(op.as_bytes());
    write_long(&mut out, 0);
    let applies = match op {
        "c" | "r" | "u" if *after => Some(false),
        "d" if *before => Some(true),
        _ => None,
    };
    (out, applies)
}

fn check(cases: Vec<(Event, Damage)>) -> Result<(), TestCaseError> {
    let (mut records, mut tombstones, mut wants) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (e, damage)) in cases.iter().enumerate() {
        let (mut bytes, applies) = encode(e);
        let intact = damage.is_none();
        damage.apply(&mut bytes);
        if e.6 {
            tombstones.push(i as u32);
            bytes = vec![0, 0, 0, 0, 9, 2];
        }
        records.push(bytes);
        wants.push((intact && !e.6).then_some((applies, e.1, e.2.clone(), e.3)));
    }
    let n = records.len();
    let chunk = events_chunk(&records, tombstones.clone());
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(e.to_string());
    let envelope = AvroDecoder::new(
        ENVELOPE.into(),
        Box::new(BTreeMap::from([(3, ENVELOPE.to_string())])),
    )
    .map_err(|e| fail(&e))?;
    let table = table_of(&envelope, &["id".into()]).map_err(|e| fail(&e))?;
    let mut unwrapper = DebeziumAvro::new(envelope, table).map_err(|e| fail(&e))?;
    let Unwrapped {
        mut rows,
        rejected,
        bad,
    } = unwrapper.unwrap(chunk).map_err(|e| fail(&e))?;
    prop_assert_eq!(rows.len(), 1, "Arrow rows are one run");
    let rows = rows.remove(0).chunk;
    let accounted = rows.payload.len() + bad.len() + tombstones.len();
    prop_assert_eq!(accounted, n, "every record once");
    prop_assert_eq!(rejected.payload.len(), bad.len());
    prop_assert!(bad.iter().enumerate().all(|(i, b)| b.index == i));
    prop_assert!(rejected.positions.is_sorted(), "bad records in order");
    let Payload::Arrow(batch) = &rows.payload else {
        return Err(TestCaseError::fail("rows are decoded"));
    };
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let names = batch.column(1).as_string::<i32>();
    for (j, &pos) in rows.positions.iter().enumerate() {
        if let Some((applies, id, name, ts)) = &wants[pos as usize] {
            let deletion = applies
                .ok_or_else(|| TestCaseError::fail("an event that cannot apply was applied"))?;
            prop_assert_eq!(ids.value(j), *id);
            prop_assert_eq!(names.is_valid(j).then(|| names.value(j)), name.as_deref());
            prop_assert_eq!(rows.meta.timestamps[j], *ts);
            prop_assert_eq!(rows.meta.deletions.contains(&(j as u32)), deletion);
        }
    }
    // Every intact event that applies is among the rows.
    for (i, w) in wants.iter().enumerate() {
        if let Some((Some(_), ..)) = w {
            prop_assert!(rows.positions.contains(&(i as u64)), "event {} was lost", i);
        }
    }
    Ok(())
}

fn main() {
    let budget = ubik_fuzz::budget_from_args();
    let strategy = proptest::collection::vec((event(), damage()), 1..24);
    let (_, findings) = ubik_fuzz::run_for("debezium avro envelope", budget, strategy, check);
    std::process::exit(i32::from(findings > 0));
}
