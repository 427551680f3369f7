//! The one-pass decoder for the common case: records written with the
//! reader schema itself, a flat record of primitive fields (`boolean`,
//! `int`, `long`, `float`, `double`, `string`, `timestamp-millis`/`-micros`,
//! `date`, each optionally in a union with `null`). It reads each body
//! straight into plain column vectors, with no per-record call into
//! arrow-avro and no conversion after it.
//!
//! It reads exactly what arrow-avro reads, or gives up: on anything else
//! (a byte that is no valid encoding, bytes after the body, an `int` out of
//! range, invalid UTF-8 in a column the query reads) the
//! whole chunk goes to the general decoder, which finds the bad records and
//! says what is wrong with each. A property test holds the two to the same
//! rows.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, ArrowPrimitiveType, BooleanArray, PrimitiveArray, RecordBatch, RecordBatchOptions,
    StringArray, new_null_array,
};
use arrow::buffer::{BooleanBuffer, NullBuffer, OffsetBuffer};
use arrow::datatypes::{
    ArrowNativeType, DataType, Date32Type, Float32Type, Float64Type, Int32Type, Int64Type,
    SchemaRef, TimestampMicrosecondType,
};
use serde_json::Value;

/// A field's Avro type, as this decoder reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Boolean,
    Int,
    Long,
    Float,
    Double,
    String,
    TimestampMillis,
    TimestampMicros,
    Date,
}

impl Kind {
    /// The type of a primitive (or a logical type over one), if read here.
    fn of(t: &Value) -> Option<Self> {
        match t {
            Value::String(name) => Self::named(name),
            Value::Object(o) => {
                let base = Self::named(o.get("type")?.as_str()?)?;
                match (o.get("logicalType").map(Value::as_str), base) {
                    (None, _) => Some(base),
                    (Some(Some("timestamp-millis" | "local-timestamp-millis")), Kind::Long) => {
                        Some(Kind::TimestampMillis)
                    }
                    (Some(Some("timestamp-micros" | "local-timestamp-micros")), Kind::Long) => {
                        Some(Kind::TimestampMicros)
                    }
                    (Some(Some("date")), Kind::Int) => Some(Kind::Date),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "boolean" => Kind::Boolean,
            "int" => Kind::Int,
            "long" => Kind::Long,
            "float" => Kind::Float,
            "double" => Kind::Double,
            "string" => Kind::String,
            _ => return None,
        })
    }

    /// The table column type ubik gives this Avro type (`crate::types`).
    fn column_type(self) -> DataType {
        match self {
            Kind::Boolean => DataType::Boolean,
            Kind::Int => DataType::Int32,
            Kind::Long => DataType::Int64,
            Kind::Float => DataType::Float32,
            Kind::Double => DataType::Float64,
            Kind::String => DataType::Utf8,
            Kind::TimestampMillis | Kind::TimestampMicros => ubik_format::schema::timestamp_type(),
            Kind::Date => DataType::Date32,
        }
    }
}

/// Where a field's union puts `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nulls {
    /// Not a union: never null.
    Never,
    /// `["null", T]`.
    First,
    /// `[T, "null"]`.
    Second,
}

/// A column being built: plain vectors, with a validity per row kept
/// only as bytes until the column is finished.
enum Column {
    Boolean(Values<bool>),
    Int(Values<i32>),
    Long(Values<i64>),
    Float(Values<f32>),
    Double(Values<f64>),
    /// Offsets and bytes, validated as UTF-8 once per chunk when finished.
    String(Strings),
    /// Microseconds; read from milliseconds when the flag is set.
    Timestamp(Values<i64>, bool),
    Date(Values<i32>),
}

impl Column {
    fn new(kind: Kind, rows: usize, text_bytes: usize) -> Self {
        match kind {
            Kind::Boolean => Column::Boolean(Values::with_capacity(rows)),
            Kind::Int => Column::Int(Values::with_capacity(rows)),
            Kind::Long => Column::Long(Values::with_capacity(rows)),
            Kind::Float => Column::Float(Values::with_capacity(rows)),
            Kind::Double => Column::Double(Values::with_capacity(rows)),
            Kind::String => Column::String(Strings::with_capacity(rows, text_bytes)),
            Kind::TimestampMillis => Column::Timestamp(Values::with_capacity(rows), true),
            Kind::TimestampMicros => Column::Timestamp(Values::with_capacity(rows), false),
            Kind::Date => Column::Date(Values::with_capacity(rows)),
        }
    }

    fn append_null(&mut self) {
        match self {
            Column::Boolean(v) => v.append_null(),
            Column::Int(v) | Column::Date(v) => v.append_null(),
            Column::Long(v) | Column::Timestamp(v, _) => v.append_null(),
            Column::Float(v) => v.append_null(),
            Column::Double(v) => v.append_null(),
            Column::String(v) => v.append_null(),
        }
    }

    /// Reads the value at `at` into the column.
    #[inline]
    fn read(&mut self, b: &[u8], at: &mut usize) -> Step<()> {
        match self {
            Column::Boolean(v) => v.push(boolean(b, at)?),
            Column::Int(v) | Column::Date(v) => v.push(int(b, at)?),
            Column::Long(v) | Column::Timestamp(v, false) => v.push(long(b, at)?),
            Column::Timestamp(v, true) => v.push(long(b, at)?.checked_mul(1000).ok_or(GiveUp)?),
            Column::Float(v) => v.push(f32::from_le_bytes(fixed(b, at)?)),
            Column::Double(v) => v.push(f64::from_le_bytes(fixed(b, at)?)),
            Column::String(v) => v.append(bytes(b, at)?)?,
        }
        Ok(())
    }

    /// The built column; `None` when a string is not UTF-8.
    fn finish(self, data_type: &DataType) -> Option<ArrayRef> {
        Some(match self {
            Column::Boolean(v) => {
                let nulls = v.nulls();
                Arc::new(BooleanArray::new(BooleanBuffer::from(v.values), nulls))
            }
            Column::Int(v) => Arc::new(v.finish::<Int32Type>()),
            Column::Date(v) => Arc::new(v.finish::<Date32Type>()),
            Column::Long(v) => Arc::new(v.finish::<Int64Type>()),
            Column::Float(v) => Arc::new(v.finish::<Float32Type>()),
            Column::Double(v) => Arc::new(v.finish::<Float64Type>()),
            Column::String(v) => Arc::new(v.finish()?),
            Column::Timestamp(v, _) => {
                let DataType::Timestamp(_, tz) = data_type else {
                    unreachable!("checked when built")
                };
                Arc::new(
                    v.finish::<TimestampMicrosecondType>()
                        .with_timezone_opt(tz.clone()),
                )
            }
        })
    }
}

/// A column's values, and the rows that are null (rare: kept as a list).
struct Values<T> {
    values: Vec<T>,
    nulls: Vec<usize>,
}

impl<T: Default> Values<T> {
    fn with_capacity(rows: usize) -> Self {
        Self {
            values: Vec::with_capacity(rows),
            nulls: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, v: T) {
        self.values.push(v);
    }

    fn append_null(&mut self) {
        self.nulls.push(self.values.len());
        self.values.push(T::default());
    }

    fn nulls(&self) -> Option<NullBuffer> {
        null_buffer(self.values.len(), &self.nulls)
    }

    fn finish<P: ArrowPrimitiveType<Native = T>>(self) -> PrimitiveArray<P>
    where
        T: ArrowNativeType,
    {
        let nulls = self.nulls();
        PrimitiveArray::new(self.values.into(), nulls)
    }
}

/// The validity of `rows` rows of which `nulls` are null (`None`: none are).
fn null_buffer(rows: usize, nulls: &[usize]) -> Option<NullBuffer> {
    if nulls.is_empty() {
        return None;
    }
    let mut valid = vec![true; rows];
    for &r in nulls {
        valid[r] = false;
    }
    Some(NullBuffer::from(valid))
}

/// A string column's offsets, bytes and null rows: its strings are checked
/// as UTF-8 all at once when it is finished, not one by one.
struct Strings {
    offsets: Vec<i32>,
    values: Vec<u8>,
    nulls: Vec<usize>,
}

impl Strings {
    fn with_capacity(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            offsets,
            values: Vec::with_capacity(bytes),
            nulls: Vec::new(),
        }
    }

    #[inline]
    fn append(&mut self, bytes: &[u8]) -> Step<()> {
        self.values.extend_from_slice(bytes);
        self.offsets
            .push(i32::try_from(self.values.len()).map_err(|_| GiveUp)?);
        Ok(())
    }

    fn append_null(&mut self) {
        self.nulls.push(self.offsets.len() - 1);
        self.offsets
            .push(*self.offsets.last().expect("starts at 0"));
    }

    fn finish(self) -> Option<StringArray> {
        let nulls = null_buffer(self.offsets.len() - 1, &self.nulls);
        StringArray::try_new(
            OffsetBuffer::new(self.offsets.into()),
            self.values.into(),
            nulls,
        )
        .ok()
    }
}

/// One field of the record, in writing order.
#[derive(Debug, Clone, Copy)]
struct FieldPlan {
    kind: Kind,
    nulls: Nulls,
    /// Whether the query reads it (else it is checked and skipped).
    read: bool,
}

/// Reads bodies of one flat reader schema into the table's columns.
pub(crate) struct FlatDecoder {
    fields: Vec<FieldPlan>,
    table: SchemaRef,
    /// Bytes of text per row of each column in the last chunk: the next
    /// chunk's builders are sized once, not grown.
    text_bytes_per_row: Vec<usize>,
}

/// The parse gave up: the general decoder takes the chunk.
struct GiveUp;

type Step<T> = Result<T, GiveUp>;

impl FlatDecoder {
    /// A decoder of `reader`'s records into `table` (the columns
    /// `crate::decode::columns_of` gives it), filling only the columns of
    /// `projection` (all when `None`); `None` when the schema is not a flat
    /// record of the types read here.
    pub(crate) fn new(
        reader: &str,
        table: &SchemaRef,
        projection: Option<&[usize]>,
    ) -> Option<Self> {
        let schema: Value = serde_json::from_str(reader).ok()?;
        if schema.get("type")?.as_str()? != "record" {
            return None;
        }
        let fields = schema.get("fields")?.as_array()?;
        if fields.len() != table.fields().len() {
            return None;
        }
        let plans = fields
            .iter()
            .enumerate()
            .map(|(c, f)| {
                let (kind, nulls) = match f.get("type")? {
                    Value::Array(union) => match union.as_slice() {
                        [Value::String(n), t] if n == "null" => (Kind::of(t)?, Nulls::First),
                        [t, Value::String(n)] if n == "null" => (Kind::of(t)?, Nulls::Second),
                        _ => return None,
                    },
                    t => (Kind::of(t)?, Nulls::Never),
                };
                (table.field(c).data_type() == &kind.column_type()).then_some(FieldPlan {
                    kind,
                    nulls,
                    read: projection.is_none_or(|p| p.contains(&c)),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            text_bytes_per_row: vec![0; plans.len()],
            fields: plans,
            table: Arc::clone(table),
        })
    }

    /// The rows of `bodies` (each a record's Avro body, written with the
    /// reader schema), or `None` when one is not exactly what arrow-avro
    /// would read.
    pub(crate) fn decode(&mut self, bodies: &[&[u8]]) -> Option<RecordBatch> {
        let rows = bodies.len();
        let mut columns: Vec<Option<Column>> = self
            .fields
            .iter()
            .zip(&self.text_bytes_per_row)
            .map(|(f, per_row)| {
                f.read
                    .then(|| Column::new(f.kind, rows, rows * per_row + rows * per_row / 8))
            })
            .collect();
        for body in bodies {
            self.record(body, &mut columns).ok()?;
        }
        let columns: Vec<ArrayRef> = columns
            .into_iter()
            .zip(self.table.fields())
            .enumerate()
            .map(|(c, (column, field))| match column {
                Some(column) => {
                    if let Column::String(b) = &column {
                        self.text_bytes_per_row[c] = b.values.len() / rows.max(1);
                    }
                    column.finish(field.data_type())
                }
                None => Some(new_null_array(field.data_type(), rows)),
            })
            .collect::<Option<_>>()?;
        RecordBatch::try_new_with_options(
            Arc::clone(&self.table),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .ok()
    }

    /// Reads one body into `columns`.
    fn record(&self, body: &[u8], columns: &mut [Option<Column>]) -> Step<()> {
        let mut at = 0;
        for (plan, column) in self.fields.iter().zip(columns.iter_mut()) {
            let present = match plan.nulls {
                Nulls::Never => true,
                Nulls::First => union_branch(body, &mut at)? == 1,
                Nulls::Second => union_branch(body, &mut at)? == 0,
            };
            match (present, column) {
                (true, Some(column)) => column.read(body, &mut at)?,
                (false, Some(column)) => column.append_null(),
                (true, None) => skip(plan.kind, body, &mut at)?,
                (false, None) => {}
            }
        }
        match at == body.len() {
            true => Ok(()),
            false => Err(GiveUp),
        }
    }
}

/// A union's branch index: 0 or 1.
#[inline]
fn union_branch(b: &[u8], at: &mut usize) -> Step<i64> {
    match long(b, at)? {
        branch @ (0 | 1) => Ok(branch),
        _ => Err(GiveUp),
    }
}

/// Skips the value of `kind` at `at` (a column the query does not read),
/// checking what arrow-avro checks.
fn skip(kind: Kind, b: &[u8], at: &mut usize) -> Step<()> {
    match kind {
        Kind::Boolean => {
            boolean(b, at)?;
        }
        Kind::Int | Kind::Date => {
            int(b, at)?;
        }
        Kind::Long | Kind::TimestampMicros => {
            long(b, at)?;
        }
        Kind::TimestampMillis => {
            long(b, at)?.checked_mul(1000).ok_or(GiveUp)?;
        }
        Kind::Float => {
            fixed::<4>(b, at)?;
        }
        Kind::Double => {
            fixed::<8>(b, at)?;
        }
        // As arrow-avro: a string the query does not read is skipped unchecked.
        Kind::String => {
            bytes(b, at)?;
        }
    }
    Ok(())
}

/// A `boolean`: one byte, 0 or 1.
#[inline]
fn boolean(b: &[u8], at: &mut usize) -> Step<bool> {
    let v = match *b.get(*at).ok_or(GiveUp)? {
        0 => false,
        1 => true,
        _ => return Err(GiveUp),
    };
    *at += 1;
    Ok(v)
}

/// A `string`'s (or `bytes`') length and bytes.
#[inline]
fn bytes<'a>(b: &'a [u8], at: &mut usize) -> Step<&'a [u8]> {
    let len = usize::try_from(long(b, at)?).map_err(|_| GiveUp)?;
    let end = at.checked_add(len).ok_or(GiveUp)?;
    let bytes = b.get(*at..end).ok_or(GiveUp)?;
    *at = end;
    Ok(bytes)
}

/// `N` bytes at `at`.
#[inline]
fn fixed<const N: usize>(b: &[u8], at: &mut usize) -> Step<[u8; N]> {
    let end = *at + N;
    let bytes = b.get(*at..end).ok_or(GiveUp)?;
    *at = end;
    Ok(bytes.try_into().expect("N bytes"))
}

/// A zig-zag varint `long` at `at`: at most ten bytes, the tenth at most 1.
///
/// Most are one byte (union branches, short strings' lengths); the others
/// (a timestamp's eight) are read from one 8-byte word at once when eight
/// bytes remain: the varint ends at the first byte whose top bit is clear,
/// and its 7-bit groups are packed together by three mask-and-shift steps,
/// with no branch per byte.
#[inline]
fn long(b: &[u8], at: &mut usize) -> Step<i64> {
    let i = *at;
    match b.get(i) {
        Some(&byte) if byte < 0x80 => {
            *at = i + 1;
            return Ok(zigzag(u64::from(byte)));
        }
        None => return Err(GiveUp),
        Some(_) => {}
    }
    if let Some(word) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        let ends = !w & 0x8080_8080_8080_8080;
        if ends != 0 {
            let len = ends.trailing_zeros() as usize / 8 + 1;
            let mut v = w & (u64::MAX >> (64 - 8 * len)) & 0x7f7f_7f7f_7f7f_7f7f;
            v = (v & 0x007f_007f_007f_007f) | ((v & 0x7f00_7f00_7f00_7f00) >> 1);
            v = (v & 0x0000_3fff_0000_3fff) | ((v & 0x3fff_0000_3fff_0000) >> 2);
            v = (v & 0x0000_0000_0fff_ffff) | ((v & 0x0fff_ffff_0000_0000) >> 4);
            *at = i + len;
            return Ok(zigzag(v));
        }
    }
    long_bytewise(b, at)
}

/// A zig-zag encoded value decoded.
#[inline]
fn zigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// [`long`] a byte at a time: near a body's end, or longer than 8 bytes.
fn long_bytewise(b: &[u8], at: &mut usize) -> Step<i64> {
    let mut v: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *b.get(*at).ok_or(GiveUp)?;
        *at += 1;
        if shift == 63 && byte > 1 {
            return Err(GiveUp);
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(zigzag(v));
        }
        shift += 7;
    }
}

/// A zig-zag varint `int` at `at`: at most five bytes, in `i32`'s range.
#[inline]
fn int(b: &[u8], at: &mut usize) -> Step<i32> {
    let start = *at;
    let v = long(b, at)?;
    if *at - start > 5 {
        return Err(GiveUp);
    }
    i32::try_from(v).map_err(|_| GiveUp)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::Array;
    use ubik_format::{Decoded, RecordDecoder};

    use crate::decode::AvroDecoder;

    /// Every kind, plain and in either union order.
    const SCHEMA: &str = r#"{"type":"record","name":"r","fields":[
        {"name":"b","type":"boolean"},
        {"name":"i","type":["null","int"]},
        {"name":"l","type":"long"},
        {"name":"f","type":["float","null"]},
        {"name":"d","type":["null","double"]},
        {"name":"s","type":["null","string"]},
        {"name":"t","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"tm","type":["null",{"type":"long","logicalType":"timestamp-millis"}]},
        {"name":"dt","type":{"type":"int","logicalType":"date"}},
        {"name":"s2","type":["string","null"]}
    ]}"#;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn long(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push(z as u8 | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        long(out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }

    /// A value that is small, large, or at an edge.
    fn number(rng: &mut Rng) -> i64 {
        match rng.below(4) {
            0 => rng.below(100) as i64 - 50,
            1 => rng.next() as i64,
            2 => [i64::MIN, i64::MAX, i32::MIN as i64, i32::MAX as i64][rng.below(4)],
            _ => rng.next() as i64 >> rng.below(64),
        }
    }

    /// One framed record of SCHEMA (schema id 7).
    fn record(rng: &mut Rng) -> Vec<u8> {
        let mut out = vec![0, 0, 0, 0, 7];
        out.push(rng.below(2) as u8);
        let null = |rng: &mut Rng| rng.below(4) == 0;
        match null(rng) {
            true => long(&mut out, 0),
            false => {
                long(&mut out, 1);
                long(&mut out, number(rng) as i32 as i64);
            }
        }
        long(&mut out, number(rng));
        match null(rng) {
            true => long(&mut out, 1),
            false => {
                long(&mut out, 0);
                out.extend_from_slice(&(number(rng) as f32 / 3.0).to_le_bytes());
            }
        }
        match null(rng) {
            true => long(&mut out, 0),
            false => {
                long(&mut out, 1);
                out.extend_from_slice(&f64::from_bits(rng.next()).to_le_bytes());
            }
        }
        let words = ["", "a", "héllo", "\u{1F600}", "x\"y\\z"];
        match null(rng) {
            true => long(&mut out, 0),
            false => {
                long(&mut out, 1);
                string(&mut out, words[rng.below(words.len())]);
            }
        }
        long(&mut out, number(rng) >> 12);
        match null(rng) {
            true => long(&mut out, 0),
            false => {
                long(&mut out, 1);
                long(&mut out, number(rng) >> 12);
            }
        }
        long(&mut out, (number(rng) as i32 >> 8) as i64);
        match null(rng) {
            true => long(&mut out, 1),
            false => {
                long(&mut out, 0);
                string(&mut out, words[rng.below(words.len())]);
            }
        }
        out
    }

    /// Damages `record`: a byte changed, inserted or removed, past the header.
    fn damage(rng: &mut Rng, record: &mut Vec<u8>) {
        const BYTES: &[u8] = &[0, 1, 2, 0x7f, 0x80, 0xff, 0xc3, 0x28, 0x0a];
        let at = 5 + rng.below(record.len() - 5);
        let byte = BYTES[rng.below(BYTES.len())];
        match rng.below(3) {
            0 => record[at] = byte,
            1 => record.insert(at, byte),
            _ => {
                record.remove(at);
            }
        }
    }

    fn decoder(one_pass: bool, reads: &[bool]) -> AvroDecoder {
        let writers = BTreeMap::from([(7, SCHEMA.to_string())]);
        let mut d = AvroDecoder::new(SCHEMA.to_string(), Box::new(writers)).unwrap();
        if !one_pass {
            d = d.without_one_pass();
        }
        d.read_only(reads).unwrap();
        d
    }

    /// The word-at-a-time varint reads every length (1 to 10 bytes) and
    /// value as the byte loop does, at any distance from the body's end,
    /// and gives up on a cut or overlong one as it does.
    #[test]
    fn varints_read_as_byte_by_byte() {
        let mut rng = Rng(0x7A11_0001);
        for round in 0..200_000 {
            let v = match round % 3 {
                0 => number(&mut rng),
                _ => rng.next() as i64 >> rng.below(64),
            };
            let mut body = Vec::new();
            long(&mut body, v);
            let end = body.len();
            // Bytes after it, or none: the word read must stop at the varint.
            body.extend((0..rng.below(12)).map(|_| rng.next() as u8));
            let (mut fast, mut slow) = (0, 0);
            assert_eq!(super::long(&body, &mut fast).ok(), Some(v));
            assert_eq!(super::long_bytewise(&body, &mut slow).ok(), Some(v));
            assert_eq!((fast, slow), (end, end));
            // Cut, or carried on past ten bytes.
            let cut = &body[..rng.below(end)];
            let (mut fast, mut slow) = (0, 0);
            assert_eq!(
                super::long(cut, &mut fast).ok(),
                super::long_bytewise(cut, &mut slow).ok()
            );
            let mut overlong = vec![0xff; 9 + rng.below(3)];
            overlong.push(rng.next() as u8);
            let (mut fast, mut slow) = (0, 0);
            assert_eq!(
                super::long(&overlong, &mut fast).ok(),
                super::long_bytewise(&overlong, &mut slow).ok()
            );
        }
    }

    /// The one-pass decoder gives arrow-avro's rows and bad records on
    /// intact and damaged chunks, reading all columns or some; it reads
    /// intact chunks itself.
    #[test]
    fn the_one_pass_decoder_agrees_with_arrow_avro() {
        let mut rng = Rng(0xA5A5_0001);
        let masks = [
            vec![true; 10],
            (0..10).map(|c| c % 3 == 0).collect::<Vec<_>>(),
        ];
        let (mut fast, mut slow) = (0, 0);
        for reads in &masks {
            let (mut one_pass, mut general) = (decoder(true, reads), decoder(false, reads));
            for round in 0..400 {
                let mut records: Vec<Vec<u8>> =
                    (0..1 + rng.below(40)).map(|_| record(&mut rng)).collect();
                let damaged = round % 2 == 1;
                if damaged {
                    let at = rng.below(records.len());
                    damage(&mut rng, &mut records[at]);
                }
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                let want = general.decode(&refs).unwrap();
                // The first chunk learns the schema id; from then on the one-pass decoder may read.
                let read_flat = one_pass.decode_flat(&refs).is_some();
                let got = one_pass.decode(&refs).unwrap();
                if round > 0 && !damaged {
                    assert!(read_flat, "an intact chunk was given up on");
                }
                if read_flat {
                    fast += 1
                } else {
                    slow += 1
                }
                assert_eq!(got.batch, want.batch, "round {round}");
                let reasons = |d: &Decoded| {
                    d.bad
                        .iter()
                        .map(|b| (b.index, b.reason.clone()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(reasons(&got), reasons(&want), "round {round}");
                assert_eq!(got.records, want.records, "round {round}");
                assert!(got.batch.column(0).len() == got.batch.num_rows());
            }
        }
        assert!(fast > 300 && slow > 100, "{fast} {slow}");
    }
}
