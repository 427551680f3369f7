//! The one-pass JSON decoder for the common case: a flat schema (integers,
//! floats, text, booleans, timestamps) and records that are plain JSON
//! objects of it.
//!
//! Each value is parsed once, straight into its column: no tape, no second
//! pass over the record, no hash lookup per field (each key is first matched
//! against the one that followed the previous key in the last record, since
//! producers write their fields in one order). Fields the schema does not
//! name, and columns the query does not read, are checked for JSON syntax
//! and skipped (a column not read is all null).
//!
//! It accepts a subset of what the general decoder ([`crate::json`], on
//! arrow-json) accepts and gives the same rows for it. On anything else (a
//! value of another JSON type than its column's, an integer out of range, a
//! float beyond the float range, text that is not a timestamp, an escaped or
//! repeated key, a lone surrogate escape, anything arrow-json reads more
//! leniently than the JSON grammar, invalid UTF-8, nesting deeper than
//! [`MAX_DEPTH`]) it gives up on the whole chunk, and the general decoder
//! decodes it and reports its bad records. Giving up costs a second decode,
//! never a different result.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Float32Builder, Float64Builder, Int64Builder,
    RecordBatch, RecordBatchOptions, StringBuilder, UInt64Builder,
};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};

use crate::json::{Infinite, MAX_DEPTH, scale, timestamp_array};
use crate::timestamp::{EpochUnit, parse_timestamp_micros_in};

/// One column being built, by the JSON values it takes.
enum Column {
    /// Signed integers, range-checked against the column's type.
    Int(Int64Builder, i64, i64),
    /// Unsigned integers, range-checked against the column's type.
    UInt(UInt64Builder, u64),
    Float64(Float64Builder),
    Float32(Float32Builder),
    Bool(BooleanBuilder),
    Text(StringBuilder),
    /// Values in the column's unit; numbers count the epoch unit.
    Timestamp(Int64Builder, TimeUnit, EpochUnit),
    /// A column the query does not read: its values are checked for JSON
    /// syntax only, and it is all null.
    Skip,
}

impl Column {
    /// The builder for `data_type`, or `None` for a type this decoder leaves
    /// to the general one.
    fn of(data_type: &DataType, epoch: EpochUnit) -> Option<Self> {
        Some(match data_type {
            DataType::Int8 => Column::Int(Int64Builder::new(), i8::MIN.into(), i8::MAX.into()),
            DataType::Int16 => Column::Int(Int64Builder::new(), i16::MIN.into(), i16::MAX.into()),
            DataType::Int32 => Column::Int(Int64Builder::new(), i32::MIN.into(), i32::MAX.into()),
            DataType::Int64 => Column::Int(Int64Builder::new(), i64::MIN, i64::MAX),
            DataType::UInt8 => Column::UInt(UInt64Builder::new(), u8::MAX.into()),
            DataType::UInt16 => Column::UInt(UInt64Builder::new(), u16::MAX.into()),
            DataType::UInt32 => Column::UInt(UInt64Builder::new(), u32::MAX.into()),
            DataType::UInt64 => Column::UInt(UInt64Builder::new(), u64::MAX),
            DataType::Float64 => Column::Float64(Float64Builder::new()),
            DataType::Float32 => Column::Float32(Float32Builder::new()),
            DataType::Boolean => Column::Bool(BooleanBuilder::new()),
            DataType::Utf8 => Column::Text(StringBuilder::new()),
            DataType::Timestamp(unit, _) => Column::Timestamp(Int64Builder::new(), *unit, epoch),
            _ => return None,
        })
    }

    /// An empty builder sized for `rows` values (and `text_bytes` of text):
    /// grown once per chunk, not by doubling and copying as values arrive.
    fn presize(&mut self, rows: usize, text_bytes: usize) {
        match self {
            Column::Int(b, ..) | Column::Timestamp(b, ..) => *b = Int64Builder::with_capacity(rows),
            Column::UInt(b, _) => *b = UInt64Builder::with_capacity(rows),
            Column::Float64(b) => *b = Float64Builder::with_capacity(rows),
            Column::Float32(b) => *b = Float32Builder::with_capacity(rows),
            Column::Bool(b) => *b = BooleanBuilder::with_capacity(rows),
            Column::Text(b) => *b = StringBuilder::with_capacity(rows, text_bytes),
            Column::Skip => {}
        }
    }

    fn append_null(&mut self) {
        match self {
            Column::Int(b, ..) | Column::Timestamp(b, ..) => b.append_null(),
            Column::UInt(b, _) => b.append_null(),
            Column::Float64(b) => b.append_null(),
            Column::Float32(b) => b.append_null(),
            Column::Bool(b) => b.append_null(),
            Column::Text(b) => b.append_null(),
            Column::Skip => {}
        }
    }

    /// The built column of `rows` values in `data_type`; the builder is left empty.
    fn finish(&mut self, data_type: &DataType, rows: usize) -> Option<ArrayRef> {
        Some(match (self, data_type) {
            (Column::Int(b, ..), DataType::Int64) => Arc::new(b.finish()),
            (Column::UInt(b, _), DataType::UInt64) => Arc::new(b.finish()),
            // Every value was checked to fit: the cast is exact.
            (Column::Int(b, ..), dt) => arrow::compute::cast(&b.finish(), dt).ok()?,
            (Column::UInt(b, _), dt) => arrow::compute::cast(&b.finish(), dt).ok()?,
            (Column::Float64(b), _) => Arc::new(b.finish()),
            (Column::Float32(b), _) => Arc::new(b.finish()),
            (Column::Bool(b), _) => Arc::new(b.finish()),
            (Column::Text(b), _) => Arc::new(b.finish()),
            (Column::Timestamp(b, unit, _), DataType::Timestamp(_, tz)) => {
                let values = b.finish();
                timestamp_array(
                    values.values().clone(),
                    values.nulls().cloned(),
                    *unit,
                    tz.clone(),
                )
            }
            (Column::Timestamp(..), _) => return None,
            (Column::Skip, dt) => arrow::array::new_null_array(dt, rows),
        })
    }
}

/// A quoted key of at most 16 bytes as one word and the mask of its bytes:
/// matched with two 64-bit compares instead of a call to `memcmp`.
struct KeyWord {
    word: u128,
    mask: u128,
}

impl KeyWord {
    fn of(quoted: &[u8]) -> Self {
        if quoted.len() > 16 {
            return Self { word: 0, mask: 0 };
        }
        let mut word = [0u8; 16];
        word[..quoted.len()].copy_from_slice(quoted);
        Self {
            word: u128::from_le_bytes(word),
            mask: u128::MAX >> (8 * (16 - quoted.len())),
        }
    }

    /// Whether `quoted` (this word's key) is at `b[i..]`.
    #[inline]
    fn is_at(&self, b: &[u8], i: usize, quoted: &[u8]) -> bool {
        match b.get(i..i + 16).map(<[u8; 16]>::try_from) {
            Some(Ok(bytes)) if self.mask != 0 => {
                (u128::from_le_bytes(bytes) ^ self.word) & self.mask == 0
            }
            _ => b.get(i..i + quoted.len()) == Some(quoted),
        }
    }
}

/// Decodes chunks of records of a flat schema in one pass, or gives up.
pub(crate) struct FlatDecoder {
    schema: SchemaRef,
    /// Each column's name followed by the quote that ends it as a JSON key.
    quoted_names: Vec<Box<[u8]>>,
    key_words: Vec<KeyWord>,
    columns: Vec<Column>,
    /// The column whose key came after each column's (last: after the
    /// record's opening brace) in the previous record: the guess for the next key.
    follows: Vec<usize>,
    /// The row that last set each column: a repeated key, and the columns a
    /// record leaves out (null), are found without clearing anything per row.
    set_in_row: Vec<u32>,
    /// Bytes of text per row of each column in the last chunk decoded.
    text_bytes_per_row: Vec<usize>,
    /// Unescaped text of the current string value.
    scratch: String,
}

/// The parse gave up: the general decoder takes the chunk.
pub(crate) struct GiveUp;

pub(crate) type Step<T = usize> = Result<T, GiveUp>;

impl FlatDecoder {
    /// A decoder for `schema` whose columns `reads` marks false are left null
    /// (their fields skipped), with numbers in timestamp columns counting
    /// `epochs` (one per column), or `None` when a column read has a type it
    /// does not decode, or a name needs escaping as a JSON key.
    pub(crate) fn new(schema: &SchemaRef, reads: &[bool], epochs: &[EpochUnit]) -> Option<Self> {
        if schema.fields().iter().any(|f| {
            f.name()
                .bytes()
                .any(|c| c == b'"' || c == b'\\' || c < 0x20)
        }) {
            return None;
        }
        let columns = schema
            .fields()
            .iter()
            .zip(reads)
            .zip(epochs)
            .map(|((f, read), epoch)| match read {
                true => Column::of(f.data_type(), *epoch),
                false => Some(Column::Skip),
            })
            .collect::<Option<Vec<_>>>()?;
        let quoted_names: Vec<Box<[u8]>> = schema
            .fields()
            .iter()
            .map(|f| [f.name().as_bytes(), b"\""].concat().into())
            .collect();
        let key_words = quoted_names.iter().map(|n| KeyWord::of(n)).collect();
        Some(Self {
            quoted_names,
            key_words,
            set_in_row: vec![0; columns.len()],
            text_bytes_per_row: vec![0; columns.len()],
            // Schema order until records show their own.
            follows: (1..=columns.len()).chain([0]).collect(),
            columns,
            schema: Arc::clone(schema),
            scratch: String::new(),
        })
    }

    /// The rows of `records` (one JSON object each) in the schema, or `None`
    /// when a record is not one this decoder reads exactly as arrow-json does.
    pub(crate) fn decode(&mut self, records: &[&[u8]]) -> Option<RecordBatch> {
        self.set_in_row.fill(0);
        let rows = records.len();
        for (c, column) in self.columns.iter_mut().enumerate() {
            // Text per row as in the last chunk, plus an eighth.
            let per_row = self.text_bytes_per_row[c];
            column.presize(rows, rows * per_row + rows * per_row / 8);
        }
        let mut done = true;
        for (row, record) in records.iter().enumerate() {
            // Row stamps start at 1: 0 means "not set in this chunk".
            if self.record(record, row as u32 + 1).is_err() {
                done = false;
                break;
            }
        }
        // Every builder is finished (emptied), also when the chunk was given up.
        let columns: Vec<Option<ArrayRef>> = self
            .columns
            .iter_mut()
            .zip(self.schema.fields())
            .map(|(c, f)| c.finish(f.data_type(), rows))
            .collect();
        if !done {
            return None;
        }
        for (c, column) in columns.iter().enumerate() {
            if let Some(text) = column.as_ref().and_then(|a| a.as_string_opt::<i32>()) {
                self.text_bytes_per_row[c] = text.values().len() / rows.max(1);
            }
        }
        RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns.into_iter().collect::<Option<Vec<_>>>()?,
            &RecordBatchOptions::new().with_row_count(Some(records.len())),
        )
        .ok()
    }

    /// Appends one record's row: one value or null to every column.
    fn record(&mut self, record: &[u8], row: u32) -> Step<()> {
        let text = utf8(record).ok_or(GiveUp)?;
        let b = text.as_bytes();
        let mut i = expect(b, skip_ws(b, 0), b'{')?;
        i = skip_ws(b, i);
        // The last column read (`columns.len()` before the first).
        let mut previous = self.columns.len();
        if b.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                i = expect(b, i, b'"')?;
                // The key that followed the previous one last time, with its closing
                // quote: a producer's fields in its usual order are found without a scan.
                let guess = self.follows[previous];
                let column = match self.quoted_names.get(guess) {
                    Some(n) if self.key_words[guess].is_at(b, i, n) => {
                        i += n.len();
                        Some(guess)
                    }
                    _ => {
                        let key_end = i + memchr::memchr2(b'"', b'\\', &b[i..]).ok_or(GiveUp)?;
                        if b[key_end] == b'\\' {
                            return Err(GiveUp);
                        }
                        let key = &b[i..key_end];
                        i = key_end + 1;
                        self.column_of(key)
                    }
                };
                i = skip_ws(b, expect(b, skip_ws(b, i), b':')?);
                match column {
                    Some(c) => {
                        if self.set_in_row[c] == row {
                            return Err(GiveUp); // a repeated key: arrow-json keeps the last
                        }
                        self.set_in_row[c] = row;
                        i = self.value(c, text, i)?;
                        self.follows[previous] = c;
                        previous = c;
                    }
                    None => i = skip_value(text, i, 2, &mut self.scratch)?,
                }
                i = skip_ws(b, i);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(GiveUp),
                }
            }
        }
        if skip_ws(b, i) != b.len() {
            return Err(GiveUp);
        }
        for (c, set) in self.set_in_row.iter().enumerate() {
            if *set != row {
                self.columns[c].append_null();
            }
        }
        Ok(())
    }

    /// The column named `key`.
    fn column_of(&self, key: &[u8]) -> Option<usize> {
        self.quoted_names
            .iter()
            .position(|n| n.len() == key.len() + 1 && n.starts_with(key))
    }

    /// Parses the value at `i` into column `c`; returns the index after it.
    fn value(&mut self, c: usize, text: &str, i: usize) -> Step {
        let b = text.as_bytes();
        if b.get(i) == Some(&b'n') {
            let end = literal(b, i, b"null")?;
            self.columns[c].append_null();
            return Ok(end);
        }
        match &mut self.columns[c] {
            Column::Skip => skip_value(text, i, 2, &mut self.scratch),
            Column::Int(builder, lo, hi) => {
                let (end, integer) = number(b, i)?;
                let v = integer
                    .then(|| parse_i64(&b[i..end]))
                    .flatten()
                    .filter(|v| (*lo..=*hi).contains(v))
                    .ok_or(GiveUp)?;
                builder.append_value(v);
                Ok(end)
            }
            Column::UInt(builder, hi) => {
                let (end, integer) = number(b, i)?;
                let v = (integer && b[i] != b'-')
                    .then(|| parse_u64(&b[i..end]))
                    .flatten()
                    .filter(|v| v <= hi)
                    .ok_or(GiveUp)?;
                builder.append_value(v);
                Ok(end)
            }
            Column::Float64(builder) => {
                let (end, v) = finite_float(text, i)?;
                builder.append_value(v);
                Ok(end)
            }
            Column::Float32(builder) => {
                let (end, v) = finite_float(text, i)?;
                builder.append_value(v);
                Ok(end)
            }
            Column::Bool(builder) => {
                let (end, v) = match b.get(i) {
                    Some(b't') => (literal(b, i, b"true")?, true),
                    Some(b'f') => (literal(b, i, b"false")?, false),
                    _ => return Err(GiveUp),
                };
                builder.append_value(v);
                Ok(end)
            }
            Column::Text(builder) => {
                if b.get(i) != Some(&b'"') {
                    return Err(GiveUp); // arrow-json turns numbers and booleans into text
                }
                let (end, plain) = string(text, i + 1, &mut self.scratch)?;
                match plain {
                    Some(s) => builder.append_value(s),
                    None => builder.append_value(&self.scratch),
                }
                Ok(end)
            }
            Column::Timestamp(builder, unit, epoch) => {
                // arrow-json hands the general decoder a number's text, so both parse the same bytes.
                let (end, micros) = match b.get(i) {
                    Some(b'"') => {
                        let (end, plain) = string(text, i + 1, &mut self.scratch)?;
                        let s = plain.unwrap_or(&self.scratch);
                        (end, parse_timestamp_micros_in(s.as_bytes(), *epoch))
                    }
                    _ => {
                        let (end, _) = number(b, i)?;
                        (end, parse_timestamp_micros_in(&b[i..end], *epoch))
                    }
                };
                builder.append_value(micros.and_then(|us| scale(us, *unit)).ok_or(GiveUp)?);
                Ok(end)
            }
        }
    }
}

/// Checks the value at `i` (at nesting level `depth`) and skips it.
pub(crate) fn skip_value(text: &str, i: usize, depth: usize, scratch: &mut String) -> Step {
    let b = text.as_bytes();
    match b.get(i) {
        Some(b'"') => Ok(string(text, i + 1, scratch)?.0),
        Some(b't') => literal(b, i, b"true"),
        Some(b'f') => literal(b, i, b"false"),
        Some(b'n') => literal(b, i, b"null"),
        Some(b'-' | b'0'..=b'9') => Ok(number(b, i)?.0),
        Some(&open @ (b'[' | b'{')) => {
            if depth > MAX_DEPTH {
                return Err(GiveUp);
            }
            let close = if open == b'[' { b']' } else { b'}' };
            let mut i = skip_ws(b, i + 1);
            if b.get(i) == Some(&close) {
                return Ok(i + 1);
            }
            loop {
                if open == b'{' {
                    i = expect(b, i, b'"')?;
                    i = string(text, i, scratch)?.0;
                    i = skip_ws(b, expect(b, skip_ws(b, i), b':')?);
                }
                i = skip_ws(b, skip_value(text, i, depth + 1, scratch)?);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(&c) if c == close => return Ok(i + 1),
                    _ => return Err(GiveUp),
                }
            }
        }
        _ => Err(GiveUp),
    }
}

/// `record` as text, if it is valid UTF-8. Records are almost always ASCII,
/// which [`ascii`] checks a word at a time, faster than the general
/// validation.
pub(crate) fn utf8(record: &[u8]) -> Option<&str> {
    if ascii(record) {
        // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(record) });
    }
    std::str::from_utf8(record).ok()
}

/// Whether every byte of `b` is below 0x80, sixteen at a time, the last
/// sixteen overlapping the ones before: the standard library's check goes
/// byte by byte over the up to 63 bytes after its last 64-byte block, which
/// was a fifth of this decoder's own time on 261-byte records.
fn ascii(b: &[u8]) -> bool {
    const HIGH: u128 = u128::from_ne_bytes([0x80; 16]);
    let word = |w: &[u8]| u128::from_ne_bytes(w.try_into().expect("16 bytes"));
    match b.len() {
        0..16 => b.is_ascii(),
        n => {
            let blocks = b.chunks_exact(16);
            let last = word(&b[n - 16..]);
            blocks.fold(last, |any, w| any | word(w)) & HIGH == 0
        }
    }
}

pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index after byte `want` at `i`.
pub(crate) fn expect(b: &[u8], i: usize, want: u8) -> Step {
    if b.get(i) == Some(&want) {
        Ok(i + 1)
    } else {
        Err(GiveUp)
    }
}

/// The index after the literal `word` at `i`.
pub(crate) fn literal(b: &[u8], i: usize, word: &[u8]) -> Step {
    if b.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err(GiveUp)
    }
}

/// A JSON number at `i` (strict grammar: `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`):
/// the index after it and whether it is an integer (no fraction, no exponent).
pub(crate) fn number(b: &[u8], mut i: usize) -> Step<(usize, bool)> {
    let digits = |b: &[u8], mut i: usize| -> Step {
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start { Err(GiveUp) } else { Ok(i) }
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match b.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(b, i)?,
        _ => return Err(GiveUp),
    };
    let mut integer = true;
    if b.get(i) == Some(&b'.') {
        integer = false;
        i = digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        integer = false;
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    // arrow-json reads these as part of the number (and refuses it); so does this decoder.
    if matches!(
        b.get(i),
        Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
    ) {
        return Err(GiveUp);
    }
    Ok((i, integer))
}

/// The finite float of the JSON number at `i`, and the index after it.
fn finite_float<T: std::str::FromStr + Infinite>(text: &str, i: usize) -> Step<(usize, T)> {
    let (end, _) = number(text.as_bytes(), i)?;
    let v: T = text[i..end].parse().map_err(|_| GiveUp)?;
    if v.is_inf() {
        Err(GiveUp)
    } else {
        Ok((end, v))
    }
}

/// A JSON integer's value, or `None` out of the `i64` range.
pub(crate) fn parse_i64(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    // Accumulated negative: i64::MIN has no positive counterpart.
    let mut v: i64 = 0;
    for d in digits {
        v = v.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative { Some(v) } else { v.checked_neg() }
}

/// A non-negative JSON integer's value, or `None` out of the `u64` range.
fn parse_u64(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for d in s {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(v)
}

/// The string whose text starts at `start` (after its opening quote): the
/// index after its closing quote, and its text when it has no escape (else
/// the unescaped text is in `scratch`).
pub(crate) fn string<'a>(
    text: &'a str,
    start: usize,
    scratch: &mut String,
) -> Step<(usize, Option<&'a str>)> {
    let b = text.as_bytes();
    let at = start + memchr::memchr2(b'"', b'\\', &b[start..]).ok_or(GiveUp)?;
    if b[at] == b'"' {
        // Both ends are next to an ASCII quote: char boundaries of valid UTF-8.
        return Ok((at + 1, Some(&text[start..at])));
    }
    scratch.clear();
    let mut run = start;
    let mut i = at;
    loop {
        scratch.push_str(&text[run..i]);
        if b[i] == b'"' {
            return Ok((i + 1, None));
        }
        // b[i] is a backslash.
        let escaped = *b.get(i + 1).ok_or(GiveUp)?;
        i += 2;
        match escaped {
            b'"' => scratch.push('"'),
            b'\\' => scratch.push('\\'),
            b'/' => scratch.push('/'),
            b'b' => scratch.push('\u{8}'),
            b'f' => scratch.push('\u{c}'),
            b'n' => scratch.push('\n'),
            b'r' => scratch.push('\r'),
            b't' => scratch.push('\t'),
            b'u' => {
                let high = hex4(b, i)?;
                i += 4;
                let c = match high {
                    0xD800..=0xDBFF => {
                        if b.get(i..i + 2) != Some(b"\\u") {
                            return Err(GiveUp);
                        }
                        let low = hex4(b, i + 2)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(GiveUp);
                        }
                        i += 6;
                        0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(GiveUp),
                    c => c,
                };
                scratch.push(char::from_u32(c).ok_or(GiveUp)?);
            }
            _ => return Err(GiveUp),
        }
        run = i;
        i += memchr::memchr2(b'"', b'\\', b.get(i..).ok_or(GiveUp)?).ok_or(GiveUp)?;
    }
}

/// The four hex digits at `i`.
fn hex4(b: &[u8], i: usize) -> Step<u32> {
    let digits = b.get(i..i + 4).ok_or(GiveUp)?;
    digits.iter().try_fold(0u32, |v, d| {
        let d = (*d as char).to_digit(16).ok_or(GiveUp)?;
        Ok(v * 16 + d)
    })
}

#[cfg(test)]
mod tests {
    //! The one-pass decoder against arrow-json (the general decoder) on
    //! random records, canonical and hostile: whatever it accepts must be
    //! exactly what the general decoder makes of the same chunk.

    use super::*;
    use crate::json::JsonDecoder;
    use crate::test_rng::Rng;
    use arrow::datatypes::{Field, Schema};

    fn schema() -> SchemaRef {
        let ts = |unit| DataType::Timestamp(unit, Some("UTC".into()));
        Arc::new(Schema::new(vec![
            Field::new("i8", DataType::Int8, true),
            Field::new("i32", DataType::Int32, true),
            Field::new("i64", DataType::Int64, true),
            Field::new("u8", DataType::UInt8, true),
            Field::new("u64", DataType::UInt64, true),
            Field::new("f32", DataType::Float32, true),
            Field::new("f64", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("s", DataType::Utf8, true),
            // Longer than a key word: matched byte by byte.
            Field::new("text_with_a_long_name", DataType::Utf8, true),
            Field::new("ts", ts(TimeUnit::Microsecond), true),
            Field::new("ts_ms", ts(TimeUnit::Millisecond), true),
            Field::new("ts_ns", ts(TimeUnit::Nanosecond), true),
            Field::new("ts_s", DataType::Timestamp(TimeUnit::Second, None), true),
        ]))
    }

    const ANY: &[&str] = &[
        "null", "nul", "true", "false", "\"x\"", "1", "-1", "0", "[]", "{}", "1.5", "\"\"",
    ];

    fn integer(rng: &mut Rng) -> String {
        match rng.below(6) {
            0 => rng
                .pick(&[
                    "-0",
                    "01",
                    "1.0",
                    "1e2",
                    "+1",
                    "-",
                    "\"12\"",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775808",
                    "18446744073709551615",
                    "18446744073709551616",
                    "127",
                    "128",
                    "-128",
                    "-129",
                    "255",
                    "256",
                    "2147483648",
                    "-2147483649",
                    "1-2",
                    "123456789012345678901234567890",
                ])
                .to_string(),
            1 => rng.pick(ANY).to_string(),
            _ => ((rng.next() as i64) >> rng.below(64)).to_string(),
        }
    }

    fn float(rng: &mut Rng) -> String {
        match rng.below(5) {
            0 => rng
                .pick(&[
                    "1.5",
                    "-0.0",
                    "-0",
                    "1e400",
                    "-1e400",
                    "1e-400",
                    "1.",
                    ".5",
                    "1E+2",
                    "5",
                    "3.4028236e38",
                    "1e39",
                    "\"1.5\"",
                    "\"NaN\"",
                    "0.1e-2",
                    "2.5E-3x",
                ])
                .to_string(),
            1 => rng.pick(ANY).to_string(),
            2 => format!("{:e}", f64::from_bits(rng.next())),
            _ => format!("{}", (rng.next() as i64 as f64) / 1e6),
        }
    }

    fn text(rng: &mut Rng) -> Vec<u8> {
        let parts: &[&[u8]] = &[
            b"abc",
            b" ",
            b"\\n",
            b"\\\"",
            b"\\\\",
            b"\\/",
            b"\\b\\f\\r\\t",
            b"\\u00e9",
            b"\\u0000",
            b"\\ud83d\\ude00",
            b"\\ud800",
            b"\\udc00x",
            b"\\ud800\\u0041",
            b"\\x",
            b"\\u12",
            b"\xc3\xa9",
            b"\xff",
            b"\x01",
            b"{",
            b"[",
            b",",
            b"\\uD834\\uDD1E",
        ];
        let mut s = b"\"".to_vec();
        for _ in 0..rng.below(4) {
            s.extend_from_slice(parts[rng.below(parts.len())]);
        }
        if rng.below(40) != 0 {
            s.push(b'"');
        }
        s
    }

    fn timestamp(rng: &mut Rng) -> String {
        match rng.below(4) {
            0 => rng
                .pick(&[
                    "\"2024-01-01T00:00:00Z\"",
                    "\"2024-01-01T00:00:00.123456+02:00\"",
                    "\"2024-01-01\"",
                    "\"2024-02-30\"",
                    "1704067200000",
                    "\"1704067200000\"",
                    "-5",
                    "1.5",
                    "1e3",
                    "\"bad\"",
                    "\"2024\\u002d01-01T00:00:00Z\"",
                    "99999999999999999",
                    "9223372036854775807",
                    "\" 2024-01-01T00:00:00Z \"",
                ])
                .to_string(),
            1 => rng.pick(ANY).to_string(),
            _ => format!(
                "\"2026-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z\"",
                1 + rng.below(12),
                1 + rng.below(28),
                rng.below(24),
                rng.below(60),
                rng.below(60),
                rng.below(1_000_000)
            ),
        }
    }

    /// A value nested up to `depth` levels (for fields the schema does not name).
    fn nested(rng: &mut Rng, depth: usize) -> String {
        if depth == 0 || rng.below(3) == 0 {
            return rng.pick(ANY).to_string();
        }
        let inner: Vec<String> = (0..rng.below(3)).map(|_| nested(rng, depth - 1)).collect();
        if rng.below(2) == 0 {
            format!("[{}]", inner.join(","))
        } else {
            let fields: Vec<String> = inner
                .iter()
                .enumerate()
                .map(|(i, v)| format!("\"k{i}\":{v}"))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
    }

    /// A value its column takes, mostly; one in ten is drawn from the edge cases.
    fn value(rng: &mut Rng, column: &str) -> Vec<u8> {
        if rng.below(10) != 0 {
            let bits = rng.next();
            return match column {
                "i8" => (bits as i8).to_string(),
                "i32" => (bits as i32).to_string(),
                "i64" => (bits as i64 >> rng.below(64)).to_string(),
                "u8" => (bits as u8).to_string(),
                "u64" => (bits >> rng.below(64)).to_string(),
                "f32" | "f64" => format!("{}", (bits as i32 as f64) / 64.0),
                "b" => bits.is_multiple_of(2).to_string(),
                "s" | "text_with_a_long_name" => format!("\"v{bits}\""),
                _ => timestamp(rng),
            }
            .into_bytes();
        }
        match column {
            "i8" | "i32" | "i64" | "u8" | "u64" => integer(rng).into_bytes(),
            "f32" | "f64" => float(rng).into_bytes(),
            "b" => rng
                .pick(&["true", "false", "\"true\"", "1", "null", "tru"])
                .into(),
            "s" | "text_with_a_long_name" => {
                if rng.below(8) == 0 {
                    rng.pick(ANY).into()
                } else {
                    text(rng)
                }
            }
            _ => timestamp(rng).into_bytes(),
        }
    }

    /// A record: mostly a plain object of some columns in some order, with
    /// unknown, repeated or escaped keys, odd spacing and broken syntax mixed in.
    fn record(rng: &mut Rng, names: &[&str]) -> Vec<u8> {
        match rng.below(60) {
            0 => {
                return rng
                    .pick(&["", "[1]", "null", "{}", "{} {}", "{", " {} "])
                    .into();
            }
            1 => return nested(rng, 80).into_bytes(),
            _ => {}
        }
        let ws = |rng: &mut Rng| -> &'static [u8] {
            [b"".as_slice(), b"", b"", b" ", b"\n\t", b"\r"][rng.below(6)]
        };
        let mut fields: Vec<Vec<u8>> = Vec::new();
        for name in names {
            if rng.below(5) != 0 {
                let mut f = format!("\"{name}\"").into_bytes();
                f.extend_from_slice(ws(rng));
                f.push(b':');
                f.extend_from_slice(ws(rng));
                f.extend(value(rng, name));
                fields.push(f);
            }
        }
        match rng.below(12) {
            0 => fields.push(format!("\"extra\":{}", nested(rng, 70)).into_bytes()),
            1 => fields.push(b"\"i64\":7".to_vec()),
            2 => fields.push(b"\"\\u0069\":1".to_vec()),
            3 => fields.push(b"\"i64\" 1".to_vec()),
            _ => {}
        }
        // Shuffle now and then: producers usually keep one order.
        if rng.below(4) == 0 {
            for i in (1..fields.len()).rev() {
                fields.swap(i, rng.below(i + 1));
            }
        }
        let mut out = ws(rng).to_vec();
        out.push(b'{');
        for (i, f) in fields.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(if rng.below(80) == 0 { b",," } else { b"," });
                out.extend_from_slice(ws(rng));
            }
            out.extend_from_slice(f);
        }
        if rng.below(80) == 0 {
            out.push(b',');
        }
        out.push(b'}');
        out.extend_from_slice(ws(rng));
        if rng.below(80) == 0 {
            out.push(b'x');
        }
        out
    }

    #[test]
    fn what_it_accepts_arrow_json_decodes_to_the_same_rows() {
        let schema = schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        // Every column read; and two halves, each skipping the other's columns.
        let masks: Vec<Vec<bool>> = vec![
            vec![true; names.len()],
            (0..names.len()).map(|c| c % 2 == 0).collect(),
            (0..names.len()).map(|c| c % 2 == 1).collect(),
        ];
        let mut pairs: Vec<(FlatDecoder, JsonDecoder)> = masks
            .iter()
            .map(|reads| {
                let mut general = JsonDecoder::with_threads(Arc::clone(&schema), 1)
                    .unwrap()
                    .without_one_pass()
                    .unwrap();
                general.read_only(reads).unwrap();
                (
                    FlatDecoder::new(&schema, reads, &vec![EpochUnit::Millis; reads.len()])
                        .unwrap(),
                    general,
                )
            })
            .collect();
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        let (mut accepted, mut given_up) = (0, 0);
        for round in 0..20_000 {
            let (flat, general) = &mut pairs[round % masks.len()];
            // Mostly one record per chunk, so each record's verdict is compared.
            let n = if round % 10 == 0 {
                1 + rng.below(40)
            } else {
                1
            };
            let records: Vec<Vec<u8>> = (0..n).map(|_| record(&mut rng, &names)).collect();
            let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            let Some(batch) = flat.decode(&slices) else {
                given_up += 1;
                continue;
            };
            accepted += 1;
            let expected = general.decode(&slices).unwrap();
            let shown: Vec<String> = records
                .iter()
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .collect();
            assert!(
                expected.bad.is_empty(),
                "accepted what arrow-json refuses: {shown:?}: {:?}",
                expected.bad
            );
            assert_eq!(batch, expected.batch, "{shown:?}");
        }
        // Both outcomes are exercised, so neither can pass by never happening.
        eprintln!("accepted {accepted}, gave up {given_up}");
        assert!(accepted > 2_000, "accepted {accepted}, gave up {given_up}");
        assert!(given_up > 2_000, "accepted {accepted}, gave up {given_up}");
    }

    #[test]
    fn canonical_records_take_the_one_pass_path() {
        // What ubik's own changelog writes (and Nexmark's topics hold): every field, in order.
        let schema = schema();
        let records: Vec<String> = (0..1000i64)
            .map(|i| {
                format!(
                    r#"{{"i8":{},"i32":{},"i64":{},"u8":{},"u64":{},"f32":{},"f64":{},"b":{},"s":"t\"{i}\u00e9","text_with_a_long_name":"x","ts":"2026-11-29T15:01:00.{:06}Z","ts_ms":{},"ts_ns":null,"ts_s":"2026-11-29T15:01:00Z"}}"#,
                    i % 100 - 50,
                    i * 1000,
                    i * 1_000_000_007,
                    i % 256,
                    i as u64 * 77,
                    i as f32 / 8.0,
                    i as f64 * 0.1,
                    i % 2 == 0,
                    i * 13,
                    1_764_428_460_000 + i,
                )
            })
            .collect();
        let slices: Vec<&[u8]> = records.iter().map(|r| r.as_bytes()).collect();
        let batch = FlatDecoder::new(&schema, &[true; 14], &[EpochUnit::Millis; 14])
            .unwrap()
            .decode(&slices);
        let expected = JsonDecoder::with_threads(Arc::clone(&schema), 1)
            .unwrap()
            .without_one_pass()
            .unwrap()
            .decode(&slices)
            .unwrap();
        assert!(expected.bad.is_empty(), "{:?}", expected.bad);
        assert_eq!(batch.as_ref(), Some(&expected.batch));
    }

    #[test]
    fn ascii_is_the_standard_check() {
        let mut rng = Rng(7);
        for len in 0..200 {
            let mut b: Vec<u8> = (0..len).map(|_| (rng.next() % 0x80) as u8).collect();
            assert!(ascii(&b), "{len}");
            for at in 0..len {
                b[at] |= 0x80;
                assert!(!ascii(&b), "{len} {at}");
                b[at] &= 0x7f;
            }
        }
    }

    #[test]
    fn other_types_leave_the_schema_to_arrow_json() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(10, 2), true),
        ]));
        assert!(FlatDecoder::new(&schema, &[true, true], &[EpochUnit::Millis; 2]).is_none());
        // Unless the query does not read the column.
        assert!(FlatDecoder::new(&schema, &[true, false], &[EpochUnit::Millis; 2]).is_some());
    }
}
