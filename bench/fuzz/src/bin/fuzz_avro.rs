//! Fuzzes the Avro decoder for a budget: `fuzz_avro SECONDS`.
//!
//! Each case is a chunk of Confluent-framed records of one schema, some
//! damaged (truncated, a byte changed, bytes appended, another schema id or
//! magic byte), some random bytes. The decoder must not panic, must account
//! for every record exactly once (a row or a bad record), and must decode
//! every undamaged record to its own values; decoding the chunk again (by
//! the one-pass decoder, once the schema id is known) gives the same.

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int64Type};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use ubik_avro::AvroDecoder;
use ubik_avro::encode::write_long;
use ubik_format::RecordDecoder;

const SCHEMA: &str = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"long"},{"name":"s","type":["null","string"]},{"name":"d","type":"double"},{"name":"b","type":"boolean"}]}"#;

#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate(usize),
    Set(usize, u8),
    Append(Vec<u8>),
    Id(u32),
    Random(Vec<u8>),
}

type Row = (i64, Option<String>, f64, bool);

fn encode(row: &Row) -> Vec<u8> {
    let mut out = vec![0, 0, 0, 0, 1];
    write_long(&mut out, row.0);
    match &row.1 {
        None => out.push(0),
        Some(s) => {
            out.push(2);
            write_long(&mut out, s.len() as i64);
            out.extend_from_slice(s.as_bytes());
        }
    }
    out.extend_from_slice(&row.2.to_le_bytes());
    out.push(row.3 as u8);
    out
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => (0usize..40).prop_map(Damage::Truncate),
        2 => (0usize..40, any::<u8>()).prop_map(|(i, b)| Damage::Set(i, b)),
        1 => proptest::collection::vec(any::<u8>(), 1..8).prop_map(Damage::Append),
        1 => (0u32..4).prop_map(Damage::Id),
        1 => proptest::collection::vec(any::<u8>(), 0..24).prop_map(Damage::Random),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    (
        any::<i64>(),
        proptest::option::of("[a-z\u{e9}]{0,12}"),
        any::<f64>().prop_filter("NaN compares unequal", |d| !d.is_nan()),
        any::<bool>(),
    )
}

fn check(cases: Vec<(Row, Damage)>) -> Result<(), TestCaseError> {
    let records: Vec<Vec<u8>> = cases
        .iter()
        .map(|(row, damage)| {
            let mut r = encode(row);
            match damage {
                Damage::None => {}
                Damage::Truncate(n) => r.truncate(*n % r.len()),
                Damage::Set(i, b) => {
                    let i = *i % r.len();
                    r[i] = *b;
                }
                Damage::Append(bytes) => r.extend_from_slice(bytes),
                Damage::Id(id) => r[4] = *id as u8,
                Damage::Random(bytes) => r = bytes.clone(),
            }
            r
        })
        .collect();
    let writers = BTreeMap::from([(1u32, SCHEMA.to_string())]);
    let mut decoder = AvroDecoder::new(SCHEMA.to_string(), Box::new(writers))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let decoded = decoder
        .decode(&refs)
        .map_err(|e| TestCaseError::fail(format!("decode failed: {e}")))?;
    // The first chunk learns the schema id through arrow-avro; the same
    // chunk again may go to the one-pass decoder, which must agree.
    let again = decoder
        .decode(&refs)
        .map_err(|e| TestCaseError::fail(format!("decode failed: {e}")))?;
    prop_assert_eq!(
        &again.batch,
        &decoded.batch,
        "the one-pass decoder disagrees"
    );
    let reasons = |d: &ubik_format::Decoded| {
        d.bad
            .iter()
            .map(|b| (b.index, b.reason.clone()))
            .collect::<Vec<_>>()
    };
    prop_assert_eq!(reasons(&again), reasons(&decoded));
    let rows = decoded.batch.num_rows();
    let mut seen = vec![0u8; records.len()];
    for r in 0..rows {
        seen[decoded.record_of(r)] += 1;
    }
    for b in &decoded.bad {
        seen[b.index] += 1;
    }
    prop_assert!(
        seen.iter().all(|&n| n == 1),
        "records not accounted once: {seen:?}"
    );
    let a = decoded.batch.column(0).as_primitive::<Int64Type>();
    let s = decoded.batch.column(1).as_string::<i32>();
    let d = decoded.batch.column(2).as_primitive::<Float64Type>();
    let b = decoded.batch.column(3).as_boolean();
    for r in 0..rows {
        let i = decoded.record_of(r);
        let (row, damage) = &cases[i];
        if matches!(damage, Damage::None) {
            let got = (
                a.value(r),
                s.is_valid(r).then(|| s.value(r).to_string()),
                d.value(r),
                b.value(r),
            );
            prop_assert_eq!(&got, row, "record {} decoded to other values", i);
        }
    }
    for (i, (_, damage)) in cases.iter().enumerate() {
        if matches!(damage, Damage::None) {
            prop_assert!(
                !decoded.bad.iter().any(|b| b.index == i),
                "an undamaged record {i} was called bad"
            );
        }
    }
    Ok(())
}

fn main() {
    let budget = ubik_fuzz::budget_from_args();
    let strategy = proptest::collection::vec((row(), damage()), 1..24);
    let (_, findings) = ubik_fuzz::run_for("avro decoder", budget, strategy, check);
    std::process::exit(i32::from(findings > 0));
}
