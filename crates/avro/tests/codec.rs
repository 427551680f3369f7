//! Avro decoding and encoding against each other and against hand-written
//! bytes: ubik's encoder and arrow-avro's decoder are separate
//! implementations of the spec, so a round trip checks both. (The Python
//! tests check both against fastavro, Confluent's serializer, through a
//! real registry and broker.)

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_avro::encode::{TimestampPrecision, record_schema, write_long};
use ubik_avro::{AvroChangelogEncoder, AvroDecoder};
use ubik_format::RecordDecoder;

fn result_rows() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("merchant", DataType::Utf8, true),
        Field::new(
            "w",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("n", DataType::Int64, false),
        Field::new("total", DataType::Float64, true),
        Field::new("price", DataType::Decimal128(10, 2), true),
        Field::new("day", DataType::Date32, true),
        Field::new("big", DataType::Boolean, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec![Some("m1"), None, Some("é\"x")])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![0, 1_700_000_000_123_456, -1])
                    .with_timezone("UTC"),
            ),
            Arc::new(Int64Array::from(vec![1, -64, i64::MAX])),
            Arc::new(Float64Array::from(vec![Some(0.1), Some(-0.0), None])),
            Arc::new(
                Decimal128Array::from(vec![Some(12345), Some(-1), None])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
            Arc::new(Date32Array::from(vec![Some(0), None, Some(-365)])),
            Arc::new(BooleanArray::from(vec![true, false, true])),
        ],
    )
    .unwrap()
}

/// Encodes `rows` as value records with schema id `id`.
fn encode(rows: &RecordBatch, id: u32) -> Vec<Vec<u8>> {
    encode_at(rows, id, TimestampPrecision::Micros)
}

fn encode_at(rows: &RecordBatch, id: u32, precision: TimestampPrecision) -> Vec<Vec<u8>> {
    let mut encoder =
        AvroChangelogEncoder::with_ids(vec![0], false, 0, id).with_precision(precision);
    let mut out = Vec::new();
    let timestamps = Int64Array::from(vec![None::<i64>; rows.num_rows()]);
    encoder
        .encode_parts(rows, None, &timestamps, &mut |r| {
            out.push(r.value.unwrap().to_vec());
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    out
}

fn value_schema(rows: &RecordBatch) -> String {
    value_schema_at(rows, TimestampPrecision::Micros)
}

fn value_schema_at(rows: &RecordBatch, precision: TimestampPrecision) -> String {
    let all: Vec<usize> = (0..rows.num_columns()).collect();
    record_schema(&rows.schema(), &all, "t_value", precision)
        .unwrap()
        .to_string()
}

fn decoder(reader: &str, writers: &[(u32, &str)]) -> AvroDecoder {
    let writers: BTreeMap<u32, String> =
        writers.iter().map(|(id, s)| (*id, s.to_string())).collect();
    AvroDecoder::new(reader.to_string(), Box::new(writers)).unwrap()
}

fn refs(records: &[Vec<u8>]) -> Vec<&[u8]> {
    records.iter().map(Vec::as_slice).collect()
}

#[test]
fn encoded_rows_decode_to_the_same_columns() {
    let rows = result_rows();
    let schema = value_schema(&rows);
    let records = encode(&rows, 7);
    // Hand-checked bytes of the first record's start: magic, id, then the
    // union branch 1 of ["null","string"] and the string "m1".
    assert_eq!(&records[0][..9], &[0, 0, 0, 0, 7, 2, 4, b'm', b'1']);
    let mut d = decoder(&schema, &[(7, &schema)]);
    let decoded = d.decode(&refs(&records)).unwrap();
    assert!(decoded.bad.is_empty(), "{:?}", decoded.bad);
    assert_eq!(decoded.batch.num_rows(), 3);
    for (c, field) in rows.schema().fields().iter().enumerate() {
        let got = decoded.batch.column(c);
        assert_eq!(got.data_type(), field.data_type(), "{}", field.name());
        assert_eq!(
            &got.to_data(),
            &rows.column(c).to_data(),
            "{}",
            field.name()
        );
    }
}

/// `timestamp_unit=ms` on an Avro output: TIMESTAMP columns are
/// `timestamp-millis`, their microseconds cut (rounded down, before 1970
/// too); the decoder reads them back as TIMESTAMP.
#[test]
fn millisecond_timestamps_decode_to_the_microseconds_cut() {
    let rows = result_rows();
    let schema = value_schema_at(&rows, TimestampPrecision::Millis);
    assert!(
        schema.contains(r#"{"logicalType":"timestamp-millis","type":"long"}"#),
        "{schema}"
    );
    assert!(!schema.contains("timestamp-micros"), "{schema}");
    let records = encode_at(&rows, 3, TimestampPrecision::Millis);
    let mut d = decoder(&schema, &[(3, &schema)]);
    let decoded = d.decode(&refs(&records)).unwrap();
    assert!(decoded.bad.is_empty(), "{:?}", decoded.bad);
    let w = rows.schema().index_of("w").unwrap();
    let cut: Vec<i64> = rows
        .column(w)
        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
        .values()
        .iter()
        .map(|v| v.div_euclid(1000) * 1000)
        .collect();
    assert_eq!(cut, vec![0, 1_700_000_000_123_000, -1000]);
    let got = decoded
        .batch
        .column(w)
        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
    assert_eq!(got.values().to_vec(), cut);
    // Every other column is as at microseconds.
    for (c, field) in rows
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(c, _)| *c != w)
    {
        assert_eq!(
            &decoded.batch.column(c).to_data(),
            &rows.column(c).to_data(),
            "{}",
            field.name()
        );
    }
}

#[test]
fn bad_records_are_reported_and_the_good_ones_kept_in_order() {
    let rows = result_rows();
    let schema = value_schema(&rows);
    let good = encode(&rows, 1);
    let mut truncated = good[1].clone();
    truncated.truncate(truncated.len() - 3);
    let mut trailing = good[0].clone();
    trailing.extend_from_slice(&[9, 9]);
    let mut trailing_header = good[2].clone();
    trailing_header.extend_from_slice(&[0, 0, 0, 0, 1]);
    let mut wrong_magic = good[0].clone();
    wrong_magic[0] = b'{';
    let records = vec![
        good[0].clone(),
        wrong_magic,
        vec![0, 0, 0, 0, 99, 1, 2],
        good[1].clone(),
        truncated,
        trailing,
        vec![],
        good[2].clone(),
        trailing_header,
        vec![0, 0, 0],
    ];
    let mut d = decoder(&schema, &[(1, &schema)]);
    let decoded = d.decode(&refs(&records)).unwrap();
    let bad: Vec<usize> = decoded.bad.iter().map(|b| b.index).collect();
    assert_eq!(bad, vec![1, 2, 4, 5, 6, 8, 9], "{:#?}", decoded.bad);
    assert_eq!(decoded.records, vec![0, 3, 7]);
    assert_eq!(decoded.batch.num_rows(), 3);
    let n = decoded
        .batch
        .column(2)
        .as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(n.values().to_vec(), vec![1, -64, i64::MAX]);
    let reasons: Vec<&str> = decoded.bad.iter().map(|b| b.reason.as_str()).collect();
    assert!(reasons[0].contains("magic byte 0"), "{}", reasons[0]);
    assert!(
        reasons[1].contains("unknown schema id 99"),
        "{}",
        reasons[1]
    );
}

#[test]
fn a_body_ending_like_a_header_is_one_good_record() {
    // Four zero longs and a -1 end in the bytes 0 0 0 0 1: a header of schema id 1.
    let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"},{"name":"c","type":"long"},{"name":"d","type":"long"},{"name":"e","type":"long"}]}"#;
    let mut record = vec![0, 0, 0, 0, 1];
    for v in [0, 0, 0, 0, -1] {
        write_long(&mut record, v);
    }
    assert_eq!(&record[5..], &[0, 0, 0, 0, 1]);
    let mut d = decoder(schema, &[(1, schema)]);
    let decoded = d.decode(&[&record, &record]).unwrap();
    assert!(decoded.bad.is_empty(), "{:?}", decoded.bad);
    let e = decoded
        .batch
        .column(4)
        .as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(e.values().to_vec(), vec![-1, -1]);
}

#[test]
fn older_writer_schemas_resolve_to_the_latest_by_avro_rules() {
    let v1 = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"int"},{"name":"gone","type":"string"},{"name":"amount","type":"float"}]}"#;
    let v2 = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"amount","type":"double"},{"name":"note","type":["null","string"],"default":null},{"name":"qty","type":"long","default":5}]}"#;
    let mut old = vec![0, 0, 0, 0, 1];
    write_long(&mut old, 42); // id (int)
    write_long(&mut old, 3);
    old.extend_from_slice(b"abc"); // gone
    old.extend_from_slice(&1.5f32.to_le_bytes()); // amount (float)
    let mut new = vec![0, 0, 0, 0, 2];
    write_long(&mut new, 7);
    new.extend_from_slice(&2.25f64.to_le_bytes());
    new.push(2);
    write_long(&mut new, 2);
    new.extend_from_slice(b"hi");
    write_long(&mut new, 9);
    let mut d = decoder(v2, &[(1, v1), (2, v2)]);
    let decoded = d.decode(&[&old, &new, &old]).unwrap();
    assert!(decoded.bad.is_empty(), "{:?}", decoded.bad);
    let b = &decoded.batch;
    let schema = b.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "amount", "note", "qty"]);
    let id = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(id.values().to_vec(), vec![42, 7, 42]);
    let amount = b.column(1).as_primitive::<arrow::datatypes::Float64Type>();
    assert_eq!(amount.values().to_vec(), vec![1.5, 2.25, 1.5]);
    let note = b.column(2).as_string::<i32>();
    assert_eq!(
        note.iter().collect::<Vec<_>>(),
        vec![None, Some("hi"), None]
    );
    let qty = b.column(3).as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(qty.values().to_vec(), vec![5, 9, 5]);
}

#[test]
fn a_writer_schema_missing_a_read_field_stops_the_run_naming_it() {
    let v1 = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"}]}"#;
    let v2 = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"amount","type":"double"}]}"#;
    let mut old = vec![0, 0, 0, 0, 1];
    write_long(&mut old, 1);
    let mut d = decoder(v2, &[(1, v1)]);
    let e = d.decode(&[&old]).unwrap_err().to_string();
    assert!(e.contains("schema id 1") && e.contains("amount"), "{e}");
    // A query that does not read `amount` reads the old records.
    let mut d = decoder(v2, &[(1, v1)]);
    d.read_only(&[true, false]).unwrap();
    let decoded = d.decode(&[&old]).unwrap();
    assert_eq!(decoded.batch.num_rows(), 1);
    assert_eq!(decoded.batch.column(1).null_count(), 1);
}

#[test]
fn only_the_columns_read_are_materialised() {
    let rows = result_rows();
    let schema = value_schema(&rows);
    let records = encode(&rows, 1);
    let mut d = decoder(&schema, &[(1, &schema)]);
    d.read_only(&[false, false, true, false, false, false, true])
        .unwrap();
    let decoded = d.decode(&refs(&records)).unwrap();
    let b = &decoded.batch;
    assert_eq!(b.num_columns(), 7);
    assert_eq!(b.column(0).null_count(), 3);
    assert_eq!(&b.column(2).to_data(), &rows.column(2).to_data());
    assert_eq!(&b.column(6).to_data(), &rows.column(6).to_data());
}

/// Found by `fuzz_avro`: arrow-avro checks strings' UTF-8 only when it
/// flushes a batch, so one such record failed the whole chunk.
#[test]
fn a_string_that_is_not_utf8_is_one_bad_record() {
    let rows = result_rows();
    let schema = value_schema(&rows);
    let good = encode(&rows, 1);
    let mut broken = good[0].clone();
    assert_eq!(&broken[7..9], b"m1");
    broken[7] = 0xC3; // a UTF-8 lead byte with no continuation
    let records = vec![good[0].clone(), broken, good[1].clone(), good[2].clone()];
    let mut d = decoder(&schema, &[(1, &schema)]);
    let decoded = d.decode(&refs(&records)).unwrap();
    assert_eq!(decoded.bad.len(), 1, "{:?}", decoded.bad);
    assert_eq!(decoded.bad[0].index, 1);
    assert_eq!(decoded.records, vec![0, 2, 3]);
    let n = decoded
        .batch
        .column(2)
        .as_primitive::<arrow::datatypes::Int64Type>();
    assert_eq!(n.values().to_vec(), vec![1, -64, i64::MAX]);
}
