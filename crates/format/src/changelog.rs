//! Result rows to canonical JSON: the bytes of the changelog.
//!
//! Key: a JSON object of the key columns (GROUP BY columns and the window,
//! in SELECT order). Value: a JSON object of every column in SELECT order,
//! or no value (a tombstone) for a retraction. Canonical means one byte
//! sequence per value: no whitespace; integers as integers; floats in
//! shortest round-trip form (ryu), NaN and infinities as the strings "NaN",
//! "Infinity", "-Infinity"; timestamps as RFC 3339 UTC with six fractional
//! digits; decimals with exactly their scale's digits; strings with `"`,
//! `\` and control characters escaped (short forms `\b \f \n \r \t`, else
//! `\u00xx`) and everything else as raw UTF-8; binary as base64.
//!
//! Rows are written into reused buffers, cell by cell, with no JSON tree.
//!
//! [`ChangelogEncoder::connect`] writes Kafka Connect's `JsonConverter`
//! envelope instead (`schemas.enable=true`): `{"schema":…,"payload":…}`
//! for the key and the value, so a Connect sink gets typed rows without a
//! registry. The schema is derived once from the result schema; payloads
//! are the canonical cells, except that a TIMESTAMP is Connect's
//! `Timestamp` (epoch milliseconds: the microseconds are cut) and a DATE its
//! `Date` (days since the epoch). A DECIMAL is Connect's `Decimal` written
//! as a JSON number, which `JsonConverter` reads whatever its
//! `decimal.format`.

use arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::*;
use ubik_connector::ChangeBatch;
use ubik_connector::time::{civil_from_days, write_rfc3339_micros};

use crate::error::Result;

/// One encoded changelog record, borrowed from the encoder's buffers.
pub use ubik_connector::SinkRecord as Record;

pub struct ChangelogEncoder {
    /// `"name":` per column, escaped once.
    names: Vec<Vec<u8>>,
    key_columns: Vec<usize>,
    keyed: bool,
    key: Vec<u8>,
    value: Vec<u8>,
    /// Kafka Connect's envelope heads, `{"schema":…,"payload":` for the key
    /// and the value; `None`: plain canonical JSON.
    connect: Option<(Vec<u8>, Vec<u8>)>,
}

impl ChangelogEncoder {
    /// `keyed` is false for append-only queries (no key column at all).
    pub fn new(schema: &Schema, key_columns: Vec<usize>, keyed: bool) -> Self {
        let names = schema
            .fields()
            .iter()
            .map(|f| {
                let mut b = Vec::new();
                write_str(&mut b, f.name());
                b.push(b':');
                b
            })
            .collect();
        Self {
            names,
            key_columns,
            keyed,
            key: Vec::with_capacity(256),
            value: Vec::with_capacity(1024),
            connect: None,
        }
    }

    /// An encoder writing Kafka Connect's JSON envelope (see the module docs).
    pub fn connect(schema: &Schema, key_columns: Vec<usize>, keyed: bool) -> Self {
        let head = |columns: &[usize]| {
            let fields: Vec<serde_json::Value> = columns
                .iter()
                .map(|&c| connect_field(schema.field(c)))
                .collect();
            let schema = serde_json::json!({"type": "struct", "fields": fields, "optional": false});
            format!("{{\"schema\":{schema},\"payload\":").into_bytes()
        };
        let all: Vec<usize> = (0..schema.fields().len()).collect();
        let heads = (head(&key_columns), head(&all));
        Self {
            connect: Some(heads),
            ..Self::new(schema, key_columns, keyed)
        }
    }

    /// Encodes every row of `batch`, calling `emit` once per record in order.
    pub fn encode<E>(
        &mut self,
        batch: &ChangeBatch,
        mut emit: impl FnMut(Record<'_>) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<(), E>> {
        self.encode_parts(
            &batch.rows,
            batch.deletes.as_ref(),
            &batch.timestamps,
            &mut emit,
        )
    }

    pub fn encode_parts<E>(
        &mut self,
        rows: &RecordBatch,
        deletes: Option<&BooleanArray>,
        timestamps: &Int64Array,
        emit: &mut impl FnMut(Record<'_>) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<(), E>> {
        let connect = self.connect.is_some();
        let writers = rows
            .columns()
            .iter()
            .map(|c| CellWriter::of(c.as_ref(), connect))
            .collect::<Result<Vec<_>>>()?;
        for row in 0..rows.num_rows() {
            self.key.clear();
            if self.keyed {
                if let Some((key_head, _)) = &self.connect {
                    self.key.extend_from_slice(key_head);
                }
                self.key.push(b'{');
                for (n, &c) in self.key_columns.iter().enumerate() {
                    if n > 0 {
                        self.key.push(b',');
                    }
                    self.key.extend_from_slice(&self.names[c]);
                    writers[c].write(row, &mut self.key);
                }
                self.key.push(b'}');
                if connect {
                    self.key.push(b'}');
                }
            }
            let tombstone = deletes.is_some_and(|d| d.value(row));
            self.value.clear();
            if !tombstone {
                if let Some((_, value_head)) = &self.connect {
                    self.value.extend_from_slice(value_head);
                }
                self.value.push(b'{');
                for (c, w) in writers.iter().enumerate() {
                    if c > 0 {
                        self.value.push(b',');
                    }
                    self.value.extend_from_slice(&self.names[c]);
                    w.write(row, &mut self.value);
                }
                self.value.push(b'}');
                if connect {
                    self.value.push(b'}');
                }
            }
            let timestamp_ms = timestamps
                .is_valid(row)
                .then(|| timestamps.value(row).div_euclid(1000));
            let record = Record {
                key: self.keyed.then_some(self.key.as_slice()),
                value: (!tombstone).then_some(self.value.as_slice()),
                timestamp_ms,
                partition: None,
            };
            if let Err(e) = emit(record) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }
}

/// Writes one array cell as canonical JSON.
enum CellWriter<'a> {
    Null,
    Boolean(&'a BooleanArray),
    Int(&'a dyn Array, fn(&dyn Array, usize, &mut Vec<u8>)),
    Float64(&'a Float64Array),
    Float32(&'a Float32Array),
    Str(&'a dyn Array, fn(&dyn Array, usize) -> &str),
    Binary(&'a dyn Array, fn(&dyn Array, usize) -> &[u8]),
    /// Microseconds per unit (multiply) or units per microsecond (divide).
    Timestamp(&'a dyn Array, fn(&dyn Array, usize) -> i64, TimeUnit),
    /// A timestamp as Kafka Connect's: epoch milliseconds.
    EpochMillis(&'a dyn Array, fn(&dyn Array, usize) -> i64, TimeUnit),
    Date32(&'a Date32Array),
    Date64(&'a Date64Array),
    Time(&'a dyn Array, DataType),
    Decimal128(&'a Decimal128Array, i8),
    Decimal256(&'a Decimal256Array, i8),
    List(&'a dyn Array, Vec<CellWriter<'a>>),
    Struct(&'a StructArrayRef, Vec<Vec<u8>>, Vec<CellWriter<'a>>),
    Dictionary(&'a dyn Array, Box<CellWriter<'a>>),
    Display(&'a dyn Array),
}

type StructArrayRef = arrow::array::StructArray;
use arrow::array::{
    Date32Array, Date64Array, Decimal128Array, Decimal256Array, Float32Array, Float64Array,
};

fn int_writer<T: ArrowPrimitiveType>(a: &dyn Array, row: usize, out: &mut Vec<u8>)
where
    T::Native: itoa::Integer,
{
    let v = a.as_primitive::<T>().value(row);
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

impl<'a> CellWriter<'a> {
    /// A writer of `a`'s cells; `connect`: timestamps and dates as Kafka Connect's.
    fn of(a: &'a dyn Array, connect: bool) -> Result<Self> {
        use DataType::*;
        Ok(match a.data_type() {
            Date32 if connect => CellWriter::Int(a, int_writer::<Date32Type>),
            Timestamp(unit, _) if connect => match Self::of(a, false)? {
                CellWriter::Timestamp(a, value, _) => CellWriter::EpochMillis(a, value, *unit),
                other => other,
            },
            Null => CellWriter::Null,
            Boolean => CellWriter::Boolean(a.as_boolean()),
            Int8 => CellWriter::Int(a, int_writer::<Int8Type>),
            Int16 => CellWriter::Int(a, int_writer::<Int16Type>),
            Int32 => CellWriter::Int(a, int_writer::<Int32Type>),
            Int64 => CellWriter::Int(a, int_writer::<Int64Type>),
            UInt8 => CellWriter::Int(a, int_writer::<UInt8Type>),
            UInt16 => CellWriter::Int(a, int_writer::<UInt16Type>),
            UInt32 => CellWriter::Int(a, int_writer::<UInt32Type>),
            UInt64 => CellWriter::Int(a, int_writer::<UInt64Type>),
            Duration(_) => CellWriter::Int(a, |a, r, o| {
                let v = arrow::compute::cast(&a.slice(r, 1), &DataType::Int64)
                    .map(|x| x.as_primitive::<Int64Type>().value(0))
                    .unwrap_or(0);
                o.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
            }),
            Float64 => CellWriter::Float64(a.as_primitive()),
            Float32 => CellWriter::Float32(a.as_primitive()),
            Utf8 => CellWriter::Str(a, |a, r| a.as_string::<i32>().value(r)),
            LargeUtf8 => CellWriter::Str(a, |a, r| a.as_string::<i64>().value(r)),
            Utf8View => CellWriter::Str(a, |a, r| a.as_string_view().value(r)),
            Binary => CellWriter::Binary(a, |a, r| a.as_binary::<i32>().value(r)),
            LargeBinary => CellWriter::Binary(a, |a, r| a.as_binary::<i64>().value(r)),
            BinaryView => CellWriter::Binary(a, |a, r| a.as_binary_view().value(r)),
            FixedSizeBinary(_) => CellWriter::Binary(a, |a, r| a.as_fixed_size_binary().value(r)),
            Timestamp(unit, _) => CellWriter::Timestamp(
                a,
                match unit {
                    TimeUnit::Second => |a, r| a.as_primitive::<TimestampSecondType>().value(r),
                    TimeUnit::Millisecond => {
                        |a, r| a.as_primitive::<TimestampMillisecondType>().value(r)
                    }
                    TimeUnit::Microsecond => {
                        |a, r| a.as_primitive::<TimestampMicrosecondType>().value(r)
                    }
                    TimeUnit::Nanosecond => {
                        |a, r| a.as_primitive::<TimestampNanosecondType>().value(r)
                    }
                },
                *unit,
            ),
            Date32 => CellWriter::Date32(a.as_primitive()),
            Date64 => CellWriter::Date64(a.as_primitive()),
            Time32(_) | Time64(_) => CellWriter::Time(a, a.data_type().clone()),
            Decimal128(_, s) => CellWriter::Decimal128(a.as_primitive(), *s),
            Decimal256(_, s) => CellWriter::Decimal256(a.as_primitive(), *s),
            List(_) => {
                let l = a.as_list::<i32>();
                CellWriter::List(a, vec![CellWriter::of(l.values().as_ref(), connect)?])
            }
            LargeList(_) => {
                let l = a.as_list::<i64>();
                CellWriter::List(a, vec![CellWriter::of(l.values().as_ref(), connect)?])
            }
            FixedSizeList(_, _) => {
                let l = a.as_fixed_size_list();
                CellWriter::List(a, vec![CellWriter::of(l.values().as_ref(), connect)?])
            }
            Struct(fields) => {
                let s = a.as_struct();
                let names = fields
                    .iter()
                    .map(|f| {
                        let mut b = Vec::new();
                        write_str(&mut b, f.name());
                        b.push(b':');
                        b
                    })
                    .collect();
                let children = s
                    .columns()
                    .iter()
                    .map(|c| CellWriter::of(c.as_ref(), connect))
                    .collect::<Result<Vec<_>>>()?;
                CellWriter::Struct(s, names, children)
            }
            Dictionary(_, _) => {
                let d = a.as_any_dictionary();
                CellWriter::Dictionary(a, Box::new(CellWriter::of(d.values().as_ref(), connect)?))
            }
            _ => CellWriter::Display(a),
        })
    }

    fn array(&self) -> Option<&dyn Array> {
        Some(match self {
            CellWriter::Null => return None,
            CellWriter::Boolean(a) => *a,
            CellWriter::Int(a, _) => *a,
            CellWriter::Float64(a) => *a,
            CellWriter::Float32(a) => *a,
            CellWriter::Str(a, _) => *a,
            CellWriter::Binary(a, _) => *a,
            CellWriter::Timestamp(a, _, _) | CellWriter::EpochMillis(a, _, _) => *a,
            CellWriter::Date32(a) => *a,
            CellWriter::Date64(a) => *a,
            CellWriter::Time(a, _) => *a,
            CellWriter::Decimal128(a, _) => *a,
            CellWriter::Decimal256(a, _) => *a,
            CellWriter::List(a, _) => *a,
            CellWriter::Struct(a, _, _) => *a,
            CellWriter::Dictionary(a, _) => *a,
            CellWriter::Display(a) => *a,
        })
    }

    fn write(&self, row: usize, out: &mut Vec<u8>) {
        match self.array() {
            None => {
                out.extend_from_slice(b"null");
                return;
            }
            Some(a) if a.is_null(row) => {
                out.extend_from_slice(b"null");
                return;
            }
            _ => {}
        }
        match self {
            CellWriter::Null => {}
            CellWriter::Boolean(a) => {
                out.extend_from_slice(if a.value(row) { b"true" } else { b"false" })
            }
            CellWriter::Int(a, f) => f(*a, row, out),
            CellWriter::Float64(a) => write_f64(out, a.value(row)),
            CellWriter::Float32(a) => write_f32(out, a.value(row)),
            CellWriter::Str(a, f) => write_str(out, f(*a, row)),
            CellWriter::Binary(a, f) => {
                out.push(b'"');
                base64(out, f(*a, row));
                out.push(b'"');
            }
            CellWriter::Timestamp(a, value, unit) => {
                let v = value(*a, row);
                let micros = match unit {
                    TimeUnit::Second => v.saturating_mul(1_000_000),
                    TimeUnit::Millisecond => v.saturating_mul(1000),
                    TimeUnit::Microsecond => v,
                    TimeUnit::Nanosecond => v.div_euclid(1000),
                };
                out.push(b'"');
                write_rfc3339_micros(out, micros);
                out.push(b'"');
            }
            CellWriter::EpochMillis(a, value, unit) => {
                let v = value(*a, row);
                let millis = match unit {
                    TimeUnit::Second => v.saturating_mul(1000),
                    TimeUnit::Millisecond => v,
                    TimeUnit::Microsecond => v.div_euclid(1000),
                    TimeUnit::Nanosecond => v.div_euclid(1_000_000),
                };
                out.extend_from_slice(itoa::Buffer::new().format(millis).as_bytes());
            }
            CellWriter::Date32(a) => write_date(out, a.value(row) as i64),
            CellWriter::Date64(a) => write_date(out, a.value(row).div_euclid(86_400_000)),
            CellWriter::Time(a, dt) => {
                let micros = match dt {
                    DataType::Time32(TimeUnit::Second) => {
                        a.as_primitive::<Time32SecondType>().value(row) as i64 * 1_000_000
                    }
                    DataType::Time32(_) => {
                        a.as_primitive::<Time32MillisecondType>().value(row) as i64 * 1000
                    }
                    DataType::Time64(TimeUnit::Microsecond) => {
                        a.as_primitive::<Time64MicrosecondType>().value(row)
                    }
                    _ => a.as_primitive::<Time64NanosecondType>().value(row) / 1000,
                };
                let mut b = Vec::new();
                write_rfc3339_micros(&mut b, micros);
                out.push(b'"');
                out.extend_from_slice(&b[11..26]);
                out.push(b'"');
            }
            CellWriter::Decimal128(a, s) => write_decimal(out, &a.value(row).to_string(), *s),
            CellWriter::Decimal256(a, s) => write_decimal(out, &a.value(row).to_string(), *s),
            CellWriter::List(a, child) => {
                let (start, end) = list_range(*a, row);
                out.push(b'[');
                for (n, i) in (start..end).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    child[0].write(i, out);
                }
                out.push(b']');
            }
            CellWriter::Struct(_, names, children) => {
                out.push(b'{');
                for (n, (name, child)) in names.iter().zip(children).enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(name);
                    child.write(row, out);
                }
                out.push(b'}');
            }
            CellWriter::Dictionary(a, values) => {
                let d = a.as_any_dictionary();
                let k = d.normalized_keys()[row];
                values.write(k, out);
            }
            CellWriter::Display(a) => {
                let options = arrow::util::display::FormatOptions::default();
                let text = arrow::util::display::ArrayFormatter::try_new(*a, &options)
                    .map(|f| f.value(row).to_string())
                    .unwrap_or_default();
                write_str(out, &text);
            }
        }
    }
}

/// A column's Kafka Connect schema (`JsonConverter`'s JSON form).
fn connect_field(f: &Field) -> serde_json::Value {
    let mut schema = connect_type(f.data_type());
    schema["optional"] = f.is_nullable().into();
    schema["field"] = f.name().as_str().into();
    schema
}

fn connect_type(t: &DataType) -> serde_json::Value {
    use serde_json::json;
    let logical = |ty: &str, name: &str| json!({"type": ty, "name": name, "version": 1});
    match t {
        DataType::Boolean => json!({"type": "boolean"}),
        DataType::Int8 => json!({"type": "int8"}),
        DataType::Int16 | DataType::UInt8 => json!({"type": "int16"}),
        DataType::Int32 | DataType::UInt16 => json!({"type": "int32"}),
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 | DataType::Duration(_) => {
            json!({"type": "int64"})
        }
        DataType::Float32 => json!({"type": "float"}),
        DataType::Float64 => json!({"type": "double"}),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => json!({"type": "bytes"}),
        DataType::Timestamp(_, _) => logical("int64", "org.apache.kafka.connect.data.Timestamp"),
        DataType::Date32 => logical("int32", "org.apache.kafka.connect.data.Date"),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
            let mut d = logical("bytes", "org.apache.kafka.connect.data.Decimal");
            d["parameters"] =
                json!({"scale": s.to_string(), "connect.decimal.precision": p.to_string()});
            d
        }
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            let mut items = connect_type(item.data_type());
            items["optional"] = item.is_nullable().into();
            json!({"type": "array", "items": items})
        }
        DataType::Struct(fields) => {
            let fields: Vec<_> = fields.iter().map(|f| connect_field(f)).collect();
            json!({"type": "struct", "fields": fields})
        }
        DataType::Dictionary(_, value) => connect_type(value),
        _ => json!({"type": "string"}),
    }
}

fn list_range(a: &dyn Array, row: usize) -> (usize, usize) {
    match a.data_type() {
        DataType::List(_) => {
            let o = a.as_list::<i32>().value_offsets();
            (o[row] as usize, o[row + 1] as usize)
        }
        DataType::LargeList(_) => {
            let o = a.as_list::<i64>().value_offsets();
            (o[row] as usize, o[row + 1] as usize)
        }
        DataType::FixedSizeList(_, n) => {
            let n = *n as usize;
            (row * n, row * n + n)
        }
        _ => (0, 0),
    }
}

pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else if v.is_nan() {
        out.extend_from_slice(b"\"NaN\"");
    } else if v > 0.0 {
        out.extend_from_slice(b"\"Infinity\"");
    } else {
        out.extend_from_slice(b"\"-Infinity\"");
    }
}

fn write_f32(out: &mut Vec<u8>, v: f32) {
    if v.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else {
        write_f64(out, v as f64);
    }
}

fn write_date(out: &mut Vec<u8>, days: i64) {
    let (y, m, d) = civil_from_days(days);
    out.extend_from_slice(format!("\"{y:04}-{m:02}-{d:02}\"").as_bytes());
}

/// `digits` is the unscaled integer in decimal; `scale` digits go after the point.
fn write_decimal(out: &mut Vec<u8>, digits: &str, scale: i8) {
    let (neg, digits) = match digits.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, digits),
    };
    if neg {
        out.push(b'-');
    }
    if scale <= 0 {
        out.extend_from_slice(digits.as_bytes());
        if digits != "0" {
            out.extend(std::iter::repeat_n(b'0', (-scale) as usize));
        }
        return;
    }
    let s = scale as usize;
    if digits.len() <= s {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', s - digits.len()));
        out.extend_from_slice(digits.as_bytes());
    } else {
        let (int, frac) = digits.split_at(digits.len() - s);
        out.extend_from_slice(int.as_bytes());
        out.push(b'.');
        out.extend_from_slice(frac.as_bytes());
    }
}

/// A JSON string, escaped canonically.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &c) in bytes.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends `data` as standard base64 with padding (RFC 4648).
pub fn base64(out: &mut Vec<u8>, data: &[u8]) {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        out.push(T[(n >> 18) as usize & 63]);
        out.push(T[(n >> 12) as usize & 63]);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63]
        } else {
            b'='
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::TimestampMicrosecondArray;
    use std::sync::Arc;

    #[test]
    fn canonical_cells() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"a\\\"b\\\\c\\nd\\u0001é\""
        );
        let mut out = Vec::new();
        for v in [1.0, 0.1, 1e21, -0.0, f64::NAN, f64::NEG_INFINITY] {
            write_f64(&mut out, v);
            out.push(b' ');
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1.0 0.1 1e21 -0.0 \"NaN\" \"-Infinity\" "
        );
        let mut out = Vec::new();
        write_decimal(&mut out, "-5", 2);
        out.push(b' ');
        write_decimal(&mut out, "12345", 2);
        assert_eq!(String::from_utf8(out).unwrap(), "-0.05 123.45");
        let mut out = Vec::new();
        base64(&mut out, b"hello");
        assert_eq!(out, b"aGVsbG8=");
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            base64(&mut out, plain.as_bytes());
            assert_eq!(out, encoded.as_bytes(), "{plain}");
        }
    }

    #[test]
    fn encodes_key_value_and_tombstones() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("m", DataType::Utf8, true),
            Field::new(
                "w",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("n", DataType::Int64, false),
        ]));
        let rows = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(arrow::array::StringArray::from(vec!["a", "b"])),
                Arc::new(TimestampMicrosecondArray::from(vec![60_000_000, 0]).with_timezone("UTC")),
                Arc::new(Int64Array::from(vec![3, 4])),
            ],
        )
        .unwrap();
        let batch = ChangeBatch {
            rows,
            deletes: Some(BooleanArray::from(vec![false, true])),
            timestamps: Int64Array::from(vec![Some(120_000_000), None]),
        };
        let mut enc = ChangelogEncoder::new(&schema, vec![0, 1], true);
        let mut lines = Vec::new();
        enc.encode(&batch, |r| {
            let l = format!(
                "{{\"key\":{},\"value\":{}}}",
                String::from_utf8_lossy(r.key.unwrap()),
                r.value
                    .map_or("null".into(), |v| String::from_utf8_lossy(v).to_string())
            );
            lines.push((l, r.timestamp_ms));
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            lines[0].0,
            r#"{"key":{"m":"a","w":"1970-01-01T00:01:00.000000Z"},"value":{"m":"a","w":"1970-01-01T00:01:00.000000Z","n":3}}"#
        );
        assert_eq!(lines[0].1, Some(120_000));
        assert_eq!(
            lines[1].0,
            r#"{"key":{"m":"b","w":"1970-01-01T00:00:00.000000Z"},"value":null}"#
        );
    }
}
