//! Changelog rows to Confluent-framed Avro: key and value schemas derived
//! from the query's exact result schema, registered under the topic's
//! subjects (`<topic>-key`, `<topic>-value`), and rows encoded cell by cell
//! into reused buffers.
//!
//! | column | Avro |
//! |---|---|
//! | BOOLEAN | `boolean` |
//! | TINYINT, SMALLINT, INT | `int` |
//! | BIGINT, INT UNSIGNED | `long` |
//! | REAL, DOUBLE | `float`, `double` |
//! | VARCHAR | `string` |
//! | VARBINARY | `bytes` |
//! | TIMESTAMP (a window's start and end too) | `long` + `timestamp-micros`, or `timestamp-millis` ([`TimestampPrecision::Millis`]) |
//! | DATE | `int` + `date` |
//! | DECIMAL(p, s) | `bytes` + `decimal(p, s)` |
//! | a nullable column | `["null", T]` with default null |
//!
//! The bytes are a function of the row and the schema id: a replay after a
//! crash registers the same schemas (the registry returns their ids) and
//! writes the same bytes.

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::*;
use serde_json::{Value, json};
use ubik_connector::{ChangeBatch, ConnectorError, SinkRecord};
use ubik_format::ChangeEncoder;

use crate::error::{AvroError, Result};
use crate::registry::{Registry, RegistryError};

/// What a TIMESTAMP column is written as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimestampPrecision {
    /// `timestamp-micros`: TIMESTAMP's own precision.
    #[default]
    Micros,
    /// `timestamp-millis`, the microseconds cut (rounded down, as ubik's
    /// `json-connect` output cuts them): Kafka Connect's Avro converters map
    /// only this one to Connect's `Timestamp`, so a Connect sink types the
    /// column as a time, not a number (`timestamp_unit=ms` on the output).
    Millis,
}

impl TimestampPrecision {
    fn logical_type(self) -> &'static str {
        match self {
            TimestampPrecision::Micros => "timestamp-micros",
            TimestampPrecision::Millis => "timestamp-millis",
        }
    }

    /// The ticks of a second it counts.
    fn per_second(self) -> i64 {
        match self {
            TimestampPrecision::Micros => 1_000_000,
            TimestampPrecision::Millis => 1000,
        }
    }
}

/// The Avro schema of a record holding `columns` of `schema`.
pub fn record_schema(
    schema: &Schema,
    columns: &[usize],
    name: &str,
    precision: TimestampPrecision,
) -> Result<Value> {
    let fields = columns
        .iter()
        .map(|&c| {
            let f = schema.field(c);
            if !valid_name(f.name()) {
                return Err(AvroError::Schema(format!(
                    "column {:?} is not a valid Avro field name (letters, digits and _, not starting with a digit); name it with AS",
                    f.name()
                )));
            }
            let t = avro_type(f, precision)?;
            Ok(if f.is_nullable() {
                json!({"name": f.name(), "type": ["null", t], "default": null})
            } else {
                json!({"name": f.name(), "type": t})
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({"type": "record", "name": name, "namespace": "ubik", "fields": fields}))
}

fn avro_type(f: &Field, precision: TimestampPrecision) -> Result<Value> {
    Ok(match f.data_type() {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 => {
            json!("int")
        }
        DataType::Int64 | DataType::UInt32 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => json!("string"),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => json!("bytes"),
        DataType::Timestamp(_, _) => {
            json!({"type": "long", "logicalType": precision.logical_type()})
        }
        DataType::Date32 => json!({"type": "int", "logicalType": "date"}),
        DataType::Decimal128(p, s) if *s >= 0 => {
            json!({"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s})
        }
        other => {
            return Err(AvroError::Schema(format!(
                "column {:?} is {other}, which ubik does not write as Avro; CAST it to BIGINT, DOUBLE, DECIMAL, VARCHAR or TIMESTAMP",
                f.name()
            )));
        }
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An Avro record name from a topic name.
fn record_name(topic: &str, part: &str) -> String {
    let mut name: String = topic
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        name.insert(0, '_');
    }
    format!("{name}_{part}")
}

/// Registers `schema` under `subject`, refusing a subject whose latest
/// schema it may not follow.
pub fn register(registry: &Registry, subject: &str, schema: &Value) -> Result<u32> {
    let text = schema.to_string();
    let patience = Some(std::time::Duration::from_secs(60));
    match registry.retrying(patience, |r| r.compatible(subject, &text)) {
        Ok((true, _)) | Err(RegistryError::NotFound(_)) => {}
        Ok((false, reasons)) => {
            let rule = registry
                .compatibility_rule(subject)
                .unwrap_or_else(|_| "its compatibility rule".into());
            let registered = registry
                .latest(subject)
                .map(|r| r.schema)
                .unwrap_or_else(|e| format!("(cannot read it: {e})"));
            return Err(AvroError::Schema(format!(
                "subject {subject} refuses this query's schema under {rule}{}\n  registered: {registered}\n  this query: {text}\n  write to another topic, or change the subject's compatibility rule",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reasons.join("; "))
                }
            )));
        }
        Err(e) => return Err(e.into()),
    }
    Ok(registry.retrying(patience, |r| r.register(subject, &text))?)
}

/// Encodes changelog rows as Confluent-framed Avro.
pub struct AvroChangelogEncoder {
    key_columns: Vec<usize>,
    keyed: bool,
    key_id: u32,
    value_id: u32,
    precision: TimestampPrecision,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl AvroChangelogEncoder {
    /// Derives the key and value schemas of `schema` for `topic`, checks
    /// and registers them, before the first record.
    pub fn register(
        registry: &Registry,
        topic: &str,
        schema: &Schema,
        key_columns: Vec<usize>,
        keyed: bool,
        precision: TimestampPrecision,
    ) -> Result<Self> {
        let all: Vec<usize> = (0..schema.fields().len()).collect();
        let value = record_schema(schema, &all, &record_name(topic, "value"), precision)?;
        let value_id = register(registry, &format!("{topic}-value"), &value)?;
        let key_id = if keyed {
            let key = record_schema(schema, &key_columns, &record_name(topic, "key"), precision)?;
            register(registry, &format!("{topic}-key"), &key)?
        } else {
            0
        };
        Ok(Self::with_ids(key_columns, keyed, key_id, value_id).with_precision(precision))
    }

    /// An encoder writing schema ids already registered (timestamps in
    /// microseconds).
    pub fn with_ids(key_columns: Vec<usize>, keyed: bool, key_id: u32, value_id: u32) -> Self {
        Self {
            key_columns,
            keyed,
            key_id,
            value_id,
            precision: TimestampPrecision::default(),
            key: Vec::with_capacity(64),
            value: Vec::with_capacity(256),
        }
    }

    /// Writes TIMESTAMP columns at `precision` (the schemas' logical type).
    pub fn with_precision(mut self, precision: TimestampPrecision) -> Self {
        self.precision = precision;
        self
    }

    /// Encodes every row of `rows`, calling `emit` once per record in order.
    pub fn encode_parts<E>(
        &mut self,
        rows: &RecordBatch,
        deletes: Option<&BooleanArray>,
        timestamps: &Int64Array,
        emit: &mut dyn FnMut(SinkRecord<'_>) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<(), E>> {
        let cells = rows
            .columns()
            .iter()
            .map(|c| Cell::of(c, self.precision))
            .collect::<Result<Vec<_>>>()?;
        let nullable: Vec<bool> = rows
            .schema()
            .fields()
            .iter()
            .map(|f| f.is_nullable())
            .collect();
        for row in 0..rows.num_rows() {
            if self.keyed {
                frame(&mut self.key, self.key_id);
                for &c in &self.key_columns {
                    cells[c].write(row, nullable[c], &mut self.key);
                }
            }
            let tombstone = deletes.is_some_and(|d| d.value(row));
            if !tombstone {
                frame(&mut self.value, self.value_id);
                for (c, cell) in cells.iter().enumerate() {
                    cell.write(row, nullable[c], &mut self.value);
                }
            }
            let record = SinkRecord {
                key: self.keyed.then_some(self.key.as_slice()),
                value: (!tombstone).then_some(self.value.as_slice()),
                timestamp_ms: timestamps
                    .is_valid(row)
                    .then(|| timestamps.value(row).div_euclid(1000)),
                partition: None,
            };
            if let Err(e) = emit(record) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }
}

impl ChangeEncoder for AvroChangelogEncoder {
    fn encode(
        &mut self,
        batch: &ChangeBatch,
        emit: &mut dyn FnMut(SinkRecord<'_>) -> std::result::Result<(), ConnectorError>,
    ) -> ubik_format::Result<std::result::Result<(), ConnectorError>> {
        self.encode_parts(&batch.rows, batch.deletes.as_ref(), &batch.timestamps, emit)
            .map_err(Into::into)
    }
}

fn frame(out: &mut Vec<u8>, id: u32) {
    out.clear();
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
}

/// Avro's `long` and `int`: zigzag, then a little-endian base-128 varint.
pub fn write_long(out: &mut Vec<u8>, v: i64) {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// One column's cells as Avro; the column's type is resolved once per
/// batch, never per row.
enum Cell<'a> {
    Boolean(&'a BooleanArray),
    /// Avro's `int` and `long` (and a date's days, a timestamp's µs), widened once.
    Long(Int64Array),
    Float32(&'a arrow::array::Float32Array),
    Float64(&'a arrow::array::Float64Array),
    Bytes(&'a dyn Array, fn(&dyn Array, usize) -> &[u8]),
    Decimal(&'a arrow::array::Decimal128Array),
}

impl<'a> Cell<'a> {
    fn of(a: &'a ArrayRef, precision: TimestampPrecision) -> Result<Self> {
        Ok(match a.data_type() {
            DataType::Boolean => Cell::Boolean(a.as_boolean()),
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32 => Cell::Long(
                arrow::compute::cast(a, &DataType::Int64)?
                    .as_primitive::<Int64Type>()
                    .clone(),
            ),
            DataType::Date32 => Cell::Long(arrow::compute::kernels::arity::unary(
                a.as_primitive::<Date32Type>(),
                i64::from,
            )),
            DataType::Float32 => Cell::Float32(a.as_primitive()),
            DataType::Float64 => Cell::Float64(a.as_primitive()),
            DataType::Utf8 => Cell::Bytes(a, |a, r| a.as_string::<i32>().value(r).as_bytes()),
            DataType::LargeUtf8 => Cell::Bytes(a, |a, r| a.as_string::<i64>().value(r).as_bytes()),
            DataType::Utf8View => Cell::Bytes(a, |a, r| a.as_string_view().value(r).as_bytes()),
            DataType::Binary => Cell::Bytes(a, |a, r| a.as_binary::<i32>().value(r)),
            DataType::LargeBinary => Cell::Bytes(a, |a, r| a.as_binary::<i64>().value(r)),
            DataType::BinaryView => Cell::Bytes(a, |a, r| a.as_binary_view().value(r)),
            DataType::Timestamp(unit, _) => {
                let raw = arrow::compute::cast(a, &DataType::Int64)?;
                let raw = raw.as_primitive::<Int64Type>();
                let from = match unit {
                    TimeUnit::Second => 1,
                    TimeUnit::Millisecond => 1000,
                    TimeUnit::Microsecond => 1_000_000,
                    TimeUnit::Nanosecond => 1_000_000_000,
                };
                let to = precision.per_second();
                Cell::Long(match from.cmp(&to) {
                    std::cmp::Ordering::Equal => raw.clone(),
                    std::cmp::Ordering::Less => {
                        arrow::compute::kernels::arity::unary(raw, |v| v.saturating_mul(to / from))
                    }
                    // Rounded down, also before 1970.
                    std::cmp::Ordering::Greater => {
                        arrow::compute::kernels::arity::unary(raw, |v| v.div_euclid(from / to))
                    }
                })
            }
            DataType::Decimal128(_, _) => Cell::Decimal(a.as_primitive()),
            other => {
                return Err(AvroError::Schema(format!(
                    "a column of type {other} has no Avro encoding in ubik"
                )));
            }
        })
    }

    fn array(&self) -> &dyn Array {
        match self {
            Cell::Boolean(a) => *a,
            Cell::Long(a) => a,
            Cell::Float32(a) => *a,
            Cell::Float64(a) => *a,
            Cell::Bytes(a, _) => *a,
            Cell::Decimal(a) => *a,
        }
    }

    fn write(&self, row: usize, nullable: bool, out: &mut Vec<u8>) {
        if nullable {
            // The union ["null", T]: branch 0 or 1.
            if self.array().is_null(row) {
                out.push(0);
                return;
            }
            out.push(2);
        }
        match self {
            Cell::Boolean(a) => out.push(a.value(row) as u8),
            Cell::Long(a) => write_long(out, a.value(row)),
            Cell::Float32(a) => out.extend_from_slice(&a.value(row).to_le_bytes()),
            Cell::Float64(a) => out.extend_from_slice(&a.value(row).to_le_bytes()),
            Cell::Bytes(a, value) => write_bytes(out, value(*a, row)),
            Cell::Decimal(a) => write_bytes(out, two_complement(a.value(row)).as_slice()),
        }
    }
}

/// The shortest big-endian two's complement bytes of `v` (Avro's decimal).
struct Unscaled {
    bytes: [u8; 16],
    start: usize,
}

impl Unscaled {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

fn two_complement(v: i128) -> Unscaled {
    let bytes = v.to_be_bytes();
    let sign = if v < 0 { 0xFF } else { 0 };
    let mut start = 0;
    // Drop a leading byte while the next one carries the same sign bit.
    while start < 15 && bytes[start] == sign && (bytes[start + 1] & 0x80) == (sign & 0x80) {
        start += 1;
    }
    Unscaled { bytes, start }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_are_zigzag_varints() {
        for (v, expected) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 1]),
            (i64::MIN, vec![0xff; 9].into_iter().chain([1]).collect()),
        ] {
            let mut out = Vec::new();
            write_long(&mut out, v);
            assert_eq!(out, expected, "{v}");
        }
    }

    #[test]
    fn decimals_are_minimal_twos_complement() {
        for (v, expected) in [
            (0i128, vec![0u8]),
            (1, vec![1]),
            (-1, vec![0xff]),
            (127, vec![0x7f]),
            (128, vec![0, 0x80]),
            (-128, vec![0x80]),
            (-129, vec![0xff, 0x7f]),
            (12345, vec![0x30, 0x39]),
        ] {
            assert_eq!(two_complement(v).as_slice(), expected.as_slice(), "{v}");
        }
    }

    #[test]
    fn names_that_avro_refuses_are_refused_with_the_fix() {
        let schema = Schema::new(vec![Field::new("count(*)", DataType::Int64, false)]);
        let e = record_schema(&schema, &[0], "t_value", TimestampPrecision::Micros)
            .unwrap_err()
            .to_string();
        assert!(e.contains("name it with AS"), "{e}");
        assert_eq!(record_name("9-orders.out", "key"), "_9_orders_out_key");
    }
}
