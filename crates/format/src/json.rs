//! JSON records to Arrow columns.
//!
//! Each record (an NDJSON line, a Kafka message, a webhook event) must be one
//! JSON object. A flat schema's chunks are first tried by the one-pass
//! decoder of `crate::flat_json`; whatever it gives up on (and every chunk of
//! another schema) goes to arrow-json's tape decoder, which builds the
//! columns directly too, with no per-row JSON tree. Both give the same rows.
//! Timestamp columns are parsed by [`crate::timestamp`], which accepts RFC
//! 3339 and epoch milliseconds (or the unit set for the column,
//! [`RecordDecoder::set_epoch_units`]).
//!
//! When a chunk contains a bad record, the chunk is decoded again record by
//! record so the good ones are kept and each bad one is reported with its
//! index, the field and the reason.
//!
//! Besides what arrow-json refuses (invalid UTF-8, a value of the wrong type,
//! an integer out of range, a record that is not one object), a record is
//! refused when it nests objects/arrays deeper than [`MAX_DEPTH`] or holds a
//! number too large for its float column (it would become infinity).
//! Duplicate keys in an object are accepted: the last one wins.
//! A decoder told which columns the query reads ([`RecordDecoder::read_only`])
//! decodes only those (both decoders treat the others' fields as unknown:
//! syntax checked, skipped) and leaves the others null.
//! This decoder is the one the webhook endpoint runs before it
//! acknowledges, so what it accepts there cannot fail here later.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, PrimitiveArray, RecordBatch};
use arrow::buffer::{NullBuffer, ScalarBuffer};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{
    DataType, Field, Float32Type, Float64Type, Schema, SchemaRef, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use arrow::json::reader::{Decoder, ReaderBuilder};

use crate::decoder::{BadRecord, Decoded, RecordDecoder};
use crate::error::Result;
use crate::flat_json::FlatDecoder;
use crate::timestamp::{EpochUnit, parse_timestamp_micros_in};

/// Records decoded per tape; arrow-json preallocates for this many.
const CHUNK: usize = 8192;

/// The deepest nesting of objects and arrays a record may have; the record's
/// own object is level 1. Deeper records are refused (no real event nests
/// this deep; a hostile one would cost every later reader).
pub const MAX_DEPTH: usize = 64;

/// Byte offset at which `record` nests deeper than [`MAX_DEPTH`], if it does.
fn too_deep(record: &[u8]) -> Option<usize> {
    // Fewer opening brackets than the limit cannot nest deeper: one
    // vectorised count instead of a byte loop for almost every record.
    if memchr::memchr2_iter(b'{', b'[', record)
        .take(MAX_DEPTH + 1)
        .count()
        <= MAX_DEPTH
    {
        return None;
    }
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for (i, &c) in record.iter().enumerate() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// The top-level key whose value contains byte `offset` of `record` (for
/// errors that arrow-json reports without a field). Error path only.
fn field_at(record: &[u8], offset: usize) -> Option<String> {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    let (mut start, mut last_string, mut key) = (0usize, None, None);
    for (i, &c) in record.iter().enumerate().take(offset) {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_str = false;
                if depth == 1 {
                    last_string = Some(start..i);
                }
            }
            continue;
        }
        match c {
            b'"' => {
                in_str = true;
                start = i + 1;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 1 => key = last_string.take(),
            b',' if depth == 1 => key = None,
            _ => {}
        }
    }
    key.map(|r| String::from_utf8_lossy(&record[r]).into_owned())
}

/// Field and reason of a record arrow-json (or the checks around it) refused.
fn refusal(record: &[u8], message: String) -> (Option<String>, String) {
    if let Some(at) = too_deep(record) {
        return (
            field_at(record, at),
            format!("nested deeper than {MAX_DEPTH} levels (byte {at} of the record)"),
        );
    }
    if let Err(e) = std::str::from_utf8(record) {
        let at = e.valid_up_to();
        return (
            field_at(record, at),
            format!("invalid UTF-8 at byte {at} of the record"),
        );
    }
    // arrow-json prefixes "whilst decoding field 'a': " per nesting level.
    let mut path: Vec<&str> = Vec::new();
    let mut rest = message.as_str();
    while let Some(r) = rest.strip_prefix("whilst decoding field '") {
        let Some(end) = r.find("': ") else { break };
        path.push(&r[..end]);
        rest = &r[end + 3..];
    }
    let field = (!path.is_empty()).then(|| path.join("."));
    (field, rest.to_string())
}

/// Decodes records into batches of one schema. Large inputs are split into
/// chunks decoded on several threads; the result is the same rows in the
/// same order whatever the thread count.
pub struct JsonDecoder {
    schema: SchemaRef,
    /// One per thread, created when first needed.
    workers: Vec<ChunkDecoder>,
    threads: usize,
    one_pass: bool,
    /// The columns decoded; the others are left null (see [`RecordDecoder::read_only`]).
    reads: Vec<bool>,
    /// What a number counts in each timestamp column ([`RecordDecoder::set_epoch_units`]).
    epochs: Vec<EpochUnit>,
}

impl JsonDecoder {
    /// A decoder using up to one thread per core.
    pub fn new(schema: SchemaRef) -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(schema, threads)
    }

    /// A decoder using up to `threads` threads (at least one).
    pub fn with_threads(schema: SchemaRef, threads: usize) -> Result<Self> {
        let reads = vec![true; schema.fields().len()];
        let epochs = vec![EpochUnit::Millis; reads.len()];
        Ok(Self {
            workers: vec![ChunkDecoder::new(
                Arc::clone(&schema),
                true,
                &reads,
                &epochs,
            )?],
            schema,
            threads: threads.max(1),
            one_pass: true,
            reads,
            epochs,
        })
    }

    /// This decoder without the one-pass decoder: every chunk goes to
    /// arrow-json (for benchmarks and tests that compare the two).
    pub fn without_one_pass(mut self) -> Result<Self> {
        self.one_pass = false;
        self.restart()?;
        Ok(self)
    }

    /// Decodes only the columns `reads` marks true; see [`RecordDecoder::read_only`].
    pub fn read_only(&mut self, reads: &[bool]) -> Result<()> {
        let fields = self.schema.fields();
        if reads.len() != fields.len() {
            return Err(crate::error::FormatError::Schema(format!(
                "the query reads {} columns of a {}-column source",
                reads.len(),
                fields.len()
            )));
        }
        // A column that cannot be null is decoded (and checked) all the same.
        self.reads = reads
            .iter()
            .zip(fields)
            .map(|(read, f)| *read || !f.is_nullable())
            .collect();
        self.restart()
    }

    /// Numbers in timestamp columns count `units` (one per column) from now
    /// on; see [`RecordDecoder::set_epoch_units`].
    pub fn set_epoch_units(&mut self, units: &[EpochUnit]) -> Result<()> {
        if units.len() != self.epochs.len() {
            return Err(crate::error::FormatError::Schema(format!(
                "{} timestamp units for a {}-column source",
                units.len(),
                self.epochs.len()
            )));
        }
        if units == self.epochs {
            return Ok(());
        }
        self.epochs = units.to_vec();
        self.restart()
    }

    /// One worker, for the current settings.
    fn restart(&mut self) -> Result<()> {
        self.workers = vec![self.worker()?];
        Ok(())
    }

    fn worker(&self) -> Result<ChunkDecoder> {
        ChunkDecoder::new(
            Arc::clone(&self.schema),
            self.one_pass,
            &self.reads,
            &self.epochs,
        )
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Decodes `records`, one JSON object each.
    pub fn decode(&mut self, records: &[&[u8]]) -> Result<Decoded> {
        if records.len() <= CHUNK {
            return self.workers[0].decode_chunk(records);
        }
        let chunks: Vec<&[&[u8]]> = records.chunks(CHUNK).collect();
        let threads = self.threads.min(chunks.len());
        while self.workers.len() < threads {
            self.workers.push(self.worker()?);
        }
        // Worker w decodes a contiguous run of chunks; runs are joined in order.
        let bounds: Vec<usize> = (0..=threads).map(|w| w * chunks.len() / threads).collect();
        let decode_run = |worker: &mut ChunkDecoder, w: usize| -> Result<Vec<Decoded>> {
            chunks[bounds[w]..bounds[w + 1]]
                .iter()
                .map(|c| worker.decode_chunk(c))
                .collect()
        };
        let (first, rest) = self.workers[..threads].split_at_mut(1);
        let decoded: Vec<Decoded> = std::thread::scope(|scope| {
            let handles: Vec<_> = rest
                .iter_mut()
                .enumerate()
                .map(|(i, worker)| scope.spawn(move || decode_run(worker, i + 1)))
                .collect();
            let mut runs = vec![decode_run(&mut first[0], 0)?];
            for h in handles {
                runs.push(h.join().map_err(|_| {
                    crate::error::FormatError::Record(
                        "internal error: a JSON decode thread panicked".into(),
                    )
                })??);
            }
            Ok::<_, crate::error::FormatError>(runs)
        })?
        .into_iter()
        .flatten()
        .collect();
        // Row -> record index only when some record was dropped (row i is record i otherwise).
        let any_bad = decoded.iter().any(|d| !d.bad.is_empty());
        let mut parts = Vec::with_capacity(decoded.len());
        let mut index = Vec::new();
        let mut bad = Vec::new();
        for (c, d) in decoded.into_iter().enumerate() {
            let base = c * CHUNK;
            if any_bad {
                index.extend((0..d.batch.num_rows()).map(|r| (base + d.record_of(r)) as u32));
            }
            bad.extend(d.bad.into_iter().map(|b| BadRecord {
                index: b.index + base,
                ..b
            }));
            parts.push(d.batch);
        }
        Ok(Decoded {
            batch: concat_batches(&self.schema, &parts)?,
            records: index,
            bad,
        })
    }
}

impl RecordDecoder for JsonDecoder {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn decode(&mut self, records: &[&[u8]]) -> Result<Decoded> {
        JsonDecoder::decode(self, records)
    }

    fn read_only(&mut self, reads: &[bool]) -> Result<()> {
        JsonDecoder::read_only(self, reads)
    }

    fn set_epoch_units(&mut self, units: &[EpochUnit]) -> Result<()> {
        JsonDecoder::set_epoch_units(self, units)
    }
}

/// The one-pass decoder, and one arrow-json decoder with the timestamp
/// parsing after it for what the one-pass decoder gives up on.
struct ChunkDecoder {
    /// The columns read (all of the source's, unless `widen` is set).
    schema: SchemaRef,
    /// Where each of the source's columns is in `schema` (`None`: not read,
    /// left null), when some are not read.
    widen: Option<(SchemaRef, Vec<Option<usize>>)>,
    decode_schema: SchemaRef,
    /// The timestamp columns of `schema`, and what a number counts in each.
    timestamps: Vec<(usize, EpochUnit)>,
    decoder: Decoder,
    /// `None` when the schema is not flat (or the one-pass decoder is off).
    one_pass: Option<FlatDecoder>,
    /// Chunks left before the one-pass decoder is tried again, and how many
    /// times in a row it gave up: input it keeps giving up on (numbers in a
    /// text column, say) then costs one failed attempt per 64 chunks.
    one_pass_pause: u32,
    one_pass_misses: u32,
}

/// The most chunks the one-pass decoder sits out after giving up.
const MAX_PAUSE: u32 = 64;

impl ChunkDecoder {
    fn new(
        source: SchemaRef,
        one_pass: bool,
        reads: &[bool],
        epochs: &[EpochUnit],
    ) -> Result<Self> {
        let flat = one_pass
            .then(|| FlatDecoder::new(&source, reads, epochs))
            .flatten();
        // The source's columns read, in the order of the schema decoded.
        let read: Vec<usize> = (0..reads.len()).filter(|&c| reads[c]).collect();
        let (schema, widen) = match reads.iter().all(|r| *r) {
            true => (source, None),
            false => {
                let schema = Arc::new(source.project(&read)?);
                let at = (0..reads.len())
                    .map(|c| read.iter().position(|&r| r == c))
                    .collect();
                (schema, Some((source, at)))
            }
        };
        let timestamps: Vec<(usize, EpochUnit)> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.data_type(), DataType::Timestamp(_, _)))
            .map(|(i, _)| (i, epochs[read[i]]))
            .collect();
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let dt = if timestamps.iter().any(|(c, _)| *c == i) {
                    DataType::Utf8
                } else {
                    f.data_type().clone()
                };
                Field::new(f.name(), dt, true)
            })
            .collect();
        let decode_schema = Arc::new(Schema::new(fields));
        let decoder = Self::build(&decode_schema)?;
        Ok(Self {
            one_pass: flat,
            one_pass_pause: 0,
            one_pass_misses: 0,
            schema,
            widen,
            decode_schema,
            timestamps,
            decoder,
        })
    }

    fn build(schema: &SchemaRef) -> Result<Decoder> {
        Ok(ReaderBuilder::new(Arc::clone(schema))
            .with_batch_size(CHUNK)
            // Numbers in text columns become text: epoch millis in a timestamp column.
            .with_coerce_primitive(true)
            .build_decoder()?)
    }

    fn decode_chunk(&mut self, records: &[&[u8]]) -> Result<Decoded> {
        if let Some(flat) = &mut self.one_pass {
            if self.one_pass_pause > 0 {
                self.one_pass_pause -= 1;
            } else if let Some(batch) = flat.decode(records) {
                self.one_pass_misses = 0;
                return Ok(Decoded {
                    batch,
                    records: Vec::new(),
                    bad: Vec::new(),
                });
            } else {
                self.one_pass_misses = (self.one_pass_misses + 1).min(6);
                self.one_pass_pause = (1 << self.one_pass_misses).min(MAX_PAUSE) - 1;
            }
        }
        let decoded = match self.decode_fast(records) {
            Ok(Some(decoded)) => decoded,
            Ok(None) | Err(_) => {
                self.decoder = Self::build(&self.decode_schema)?;
                self.decode_slow(records)?
            }
        };
        self.widen(decoded)
    }

    /// `decoded` in the source's schema: the columns not read are null.
    fn widen(&self, decoded: Decoded) -> Result<Decoded> {
        let Some((source, at)) = &self.widen else {
            return Ok(decoded);
        };
        let rows = decoded.batch.num_rows();
        let columns = at
            .iter()
            .zip(source.fields())
            .map(|(at, f)| match at {
                Some(c) => Arc::clone(decoded.batch.column(*c)),
                None => arrow::array::new_null_array(f.data_type(), rows),
            })
            .collect();
        Ok(Decoded {
            batch: RecordBatch::try_new_with_options(
                Arc::clone(source),
                columns,
                &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
            )?,
            ..decoded
        })
    }

    /// All records at once; `None` if any record is not exactly one object.
    fn decode_fast(&mut self, records: &[&[u8]]) -> Result<Option<Decoded>> {
        for (i, r) in records.iter().enumerate() {
            if too_deep(r).is_some() {
                return Ok(None);
            }
            let read = self.decoder.decode(r)?;
            if read != r.len() || self.decoder.has_partial_record() || self.decoder.len() != i + 1 {
                return Ok(None);
            }
        }
        let batch = match self.decoder.flush()? {
            Some(b) => b,
            None => RecordBatch::new_empty(Arc::clone(&self.decode_schema)),
        };
        let (batch, bad) = self.check_columns(batch, None)?;
        let records = if bad.is_empty() {
            Vec::new()
        } else {
            let bad_idx: std::collections::HashSet<usize> = bad.iter().map(|b| b.index).collect();
            (0..records.len() as u32)
                .filter(|i| !bad_idx.contains(&(*i as usize)))
                .collect()
        };
        Ok(Some(Decoded {
            batch,
            records,
            bad,
        }))
    }

    fn decode_slow(&mut self, records: &[&[u8]]) -> Result<Decoded> {
        let mut rows = Vec::new();
        let mut kept = Vec::new();
        let mut bad = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match self.decode_one(r) {
                Ok(b) => {
                    rows.push(b);
                    kept.push(i as u32);
                }
                Err(message) => {
                    self.decoder = Self::build(&self.decode_schema)?;
                    let (field, reason) = refusal(r, message);
                    bad.push(BadRecord {
                        index: i,
                        field,
                        reason,
                    });
                }
            }
        }
        let batch = concat_batches(&self.decode_schema, &rows)?;
        let (batch, ts_bad) = self.check_columns(batch, Some(&kept))?;
        if !ts_bad.is_empty() {
            let gone: std::collections::HashSet<usize> = ts_bad.iter().map(|b| b.index).collect();
            kept.retain(|i| !gone.contains(&(*i as usize)));
            bad.extend(ts_bad);
            bad.sort_by_key(|b| b.index);
        }
        Ok(Decoded {
            batch,
            records: kept,
            bad,
        })
    }

    fn decode_one(&mut self, record: &[u8]) -> std::result::Result<RecordBatch, String> {
        if too_deep(record).is_some() {
            return Err(String::new());
        }
        let text = |e: arrow::error::ArrowError| clean_message(&e.to_string());
        let read = self.decoder.decode(record).map_err(text)?;
        if self.decoder.has_partial_record() || read != record.len() {
            return Err("incomplete JSON value".into());
        }
        match self.decoder.len() {
            0 => return Err("empty record (expected a JSON object)".into()),
            1 => {}
            n => {
                return Err(format!(
                    "{n} JSON values in one record (expected one object per line/message)"
                ));
            }
        }
        self.decoder
            .flush()
            .map_err(text)?
            .ok_or_else(|| "empty record".to_string())
    }

    /// Parses the text of timestamp columns and refuses numbers too large
    /// for their float column; rows that fail are reported (by record index,
    /// through `index_of`) and removed.
    fn check_columns(
        &self,
        batch: RecordBatch,
        index_of: Option<&[u32]>,
    ) -> Result<(RecordBatch, Vec<BadRecord>)> {
        let n = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        let mut ok = vec![true; n];
        let mut bad = Vec::new();
        for (c, field) in self.schema.fields().iter().enumerate() {
            // A finite JSON number beyond the float range parses as infinity.
            let infinite: Vec<usize> = match field.data_type() {
                DataType::Float64 => infinite_rows(columns[c].as_primitive::<Float64Type>()),
                DataType::Float32 => infinite_rows(columns[c].as_primitive::<Float32Type>()),
                _ => continue,
            };
            for i in infinite {
                if ok[i] {
                    ok[i] = false;
                    bad.push(BadRecord {
                        index: index_of.map_or(i, |ix| ix[i] as usize),
                        field: Some(field.name().clone()),
                        reason: format!("number out of range for {}", field.data_type()),
                    });
                }
            }
        }
        for &(c, epoch) in &self.timestamps {
            let field = self.schema.field(c);
            let DataType::Timestamp(unit, tz) = field.data_type() else {
                continue;
            };
            let text = columns[c].as_string::<i32>();
            let mut values = Vec::with_capacity(n);
            let mut valid = Vec::with_capacity(n);
            for i in 0..n {
                if text.is_null(i) {
                    values.push(0);
                    valid.push(false);
                    continue;
                }
                let s = text.value(i);
                match parse_timestamp_micros_in(s.as_bytes(), epoch).and_then(|us| scale(us, *unit))
                {
                    Some(v) => {
                        values.push(v);
                        valid.push(true);
                    }
                    None => {
                        values.push(0);
                        valid.push(false);
                        if ok[i] {
                            ok[i] = false;
                            bad.push(BadRecord {
                                index: index_of.map_or(i, |ix| ix[i] as usize),
                                field: Some(field.name().clone()),
                                reason: format!(
                                    "cannot read {:?} as a timestamp (expected RFC 3339 such as 2026-11-29T15:01:00Z, or epoch {})",
                                    truncate(s, 64),
                                    epoch.plural()
                                ),
                            });
                        }
                    }
                }
            }
            let nulls = Some(arrow::buffer::NullBuffer::from(valid));
            columns[c] = timestamp_array(values.into(), nulls, *unit, tz.clone());
        }
        let out = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        if bad.is_empty() {
            return Ok((out, bad));
        }
        bad.sort_by_key(|b| b.index);
        let out = filter_record_batch(&out, &BooleanArray::from(ok))?;
        Ok((out, bad))
    }
}

/// A timestamp column of `unit` and `tz` from values already in that unit.
pub(crate) fn timestamp_array(
    values: ScalarBuffer<i64>,
    nulls: Option<NullBuffer>,
    unit: TimeUnit,
    tz: Option<Arc<str>>,
) -> ArrayRef {
    match unit {
        TimeUnit::Second => Arc::new(
            PrimitiveArray::<TimestampSecondType>::new(values, nulls).with_timezone_opt(tz),
        ),
        TimeUnit::Millisecond => Arc::new(
            PrimitiveArray::<TimestampMillisecondType>::new(values, nulls).with_timezone_opt(tz),
        ),
        TimeUnit::Microsecond => Arc::new(
            PrimitiveArray::<TimestampMicrosecondType>::new(values, nulls).with_timezone_opt(tz),
        ),
        TimeUnit::Nanosecond => Arc::new(
            PrimitiveArray::<TimestampNanosecondType>::new(values, nulls).with_timezone_opt(tz),
        ),
    }
}

/// Floats that can tell infinity (a finite JSON number beyond their range parses as one).
pub(crate) trait Infinite: Copy {
    fn is_inf(self) -> bool;
}
impl Infinite for f64 {
    fn is_inf(self) -> bool {
        self.is_infinite()
    }
}
impl Infinite for f32 {
    fn is_inf(self) -> bool {
        self.is_infinite()
    }
}

/// Rows of a float column holding infinity.
fn infinite_rows<T>(a: &PrimitiveArray<T>) -> Vec<usize>
where
    T: arrow::datatypes::ArrowPrimitiveType,
    T::Native: Infinite,
{
    if !a.values().iter().any(|v| v.is_inf()) {
        return Vec::new();
    }
    (0..a.len())
        .filter(|&i| a.is_valid(i) && a.value(i).is_inf())
        .collect()
}

/// Microseconds in `unit` (rounded down), or `None` beyond nanoseconds' range.
pub(crate) fn scale(us: i64, unit: TimeUnit) -> Option<i64> {
    match unit {
        TimeUnit::Second => Some(us.div_euclid(1_000_000)),
        TimeUnit::Millisecond => Some(us.div_euclid(1000)),
        TimeUnit::Microsecond => Some(us),
        TimeUnit::Nanosecond => us.checked_mul(1000),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// arrow-json's messages, minus the "Json error: " prefix.
fn clean_message(m: &str) -> String {
    m.trim_start_matches("Json error: ")
        .trim_start_matches("Parser error: ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Int64Type;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("m", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn thread_count_does_not_change_the_result() {
        // Several chunks, bad records in some of them, one record per line.
        let lines: Vec<String> = (0..30_000)
            .map(|i| match i % 4_099 {
                7 => "{broken".to_string(),
                11 => format!(r#"{{"m":"x{i}","ts":"not a time","n":{i}}}"#),
                _ => format!(
                    r#"{{"m":"k{}","ts":{},"n":{i}}}"#,
                    i % 13,
                    1_704_067_200_000i64 + i
                ),
            })
            .collect();
        let records: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        let one = JsonDecoder::with_threads(schema(), 1)
            .unwrap()
            .decode(&records)
            .unwrap();
        assert_eq!(one.bad.len(), 2 * 8);
        assert_eq!(one.batch.num_rows() + one.bad.len(), records.len());
        for threads in [2, 3, 5] {
            let mut d = JsonDecoder::with_threads(schema(), threads).unwrap();
            // Twice: the worker decoders must be reusable after bad records.
            for _ in 0..2 {
                let many = d.decode(&records).unwrap();
                assert_eq!(many.batch, one.batch, "{threads} threads");
                assert_eq!(many.records, one.records, "{threads} threads");
                assert_eq!(many.bad, one.bad, "{threads} threads");
            }
        }
    }

    #[test]
    fn decodes_and_reports_bad_records() {
        let mut d = JsonDecoder::new(schema()).unwrap();
        let records: Vec<&[u8]> = vec![
            br#"{"m":"a","ts":"2024-01-01T00:00:00Z","n":1}"#,
            br#"{"m":"b","ts":1704067200000,"n":2}"#,
            b"{oops",
            br#"{"m":"c","ts":"nope","n":3}"#,
            br#"{"m":"d","n":"x"}"#,
        ];
        let out = d.decode(&records).unwrap();
        assert_eq!(out.batch.num_rows(), 2);
        assert_eq!(out.records, vec![0, 1]);
        let bad: Vec<usize> = out.bad.iter().map(|b| b.index).collect();
        assert_eq!(bad, vec![2, 3, 4]);
        assert!(out.bad[1].reason.contains("timestamp"), "{:?}", out.bad);
        assert_eq!(out.bad[1].field.as_deref(), Some("ts"));
        assert_eq!(out.bad[2].field.as_deref(), Some("n"));
        let ts = out
            .batch
            .column(1)
            .as_primitive::<TimestampMicrosecondType>();
        assert_eq!(ts.value(0), ts.value(1));
        assert_eq!(out.batch.column(2).as_primitive::<Int64Type>().value(1), 2);
        // The decoder is reusable after errors.
        let out = d.decode(&[b"{\"m\":\"z\"}"]).unwrap();
        assert_eq!(out.batch.num_rows(), 1);
        assert!(out.bad.is_empty());
    }

    #[test]
    fn columns_not_read_are_null_and_not_checked() {
        let records: Vec<&[u8]> = vec![
            br#"{"m":"a","ts":"2024-01-01T00:00:00Z","n":1}"#,
            br#"{"m":["not","text"],"ts":"nope","n":2}"#,
            br#"{"m":"c","ts":1704067200000,"n":"x"}"#,
            b"{oops",
        ];
        for one_pass in [true, false] {
            let mut d = JsonDecoder::new(schema()).unwrap();
            if !one_pass {
                d = d.without_one_pass().unwrap();
            }
            let all = d.decode(&records).unwrap();
            assert_eq!(all.records, vec![0], "one pass: {one_pass}");
            d.read_only(&[false, false, true]).unwrap();
            let out = d.decode(&records).unwrap();
            // Bad only for `n`, the column read, or for broken syntax.
            let bad: Vec<usize> = out.bad.iter().map(|b| b.index).collect();
            assert_eq!(bad, vec![2, 3], "one pass: {one_pass}");
            assert_eq!(out.records, vec![0, 1]);
            assert_eq!(out.batch.schema(), schema());
            assert_eq!(out.batch.column(0).null_count(), 2);
            assert_eq!(out.batch.column(1).null_count(), 2);
            let n = out.batch.column(2).as_primitive::<Int64Type>();
            assert_eq!((n.value(0), n.value(1)), (1, 2));
        }
        let mut d = JsonDecoder::new(schema()).unwrap();
        assert!(d.read_only(&[true]).is_err());
    }

    #[test]
    fn two_objects_on_a_line_is_an_error() {
        let mut d = JsonDecoder::new(schema()).unwrap();
        let out = d
            .decode(&[b"{\"m\":\"a\"} {\"m\":\"b\"}", b"{\"m\":\"c\"}"])
            .unwrap();
        assert_eq!(out.batch.num_rows(), 1);
        assert_eq!(out.bad.len(), 1);
        assert_eq!(out.bad[0].index, 0);
    }

    #[test]
    fn hostile_records_are_refused_with_field_and_reason() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("m", DataType::Utf8, true),
            Field::new("x", DataType::Float64, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let mut d = JsonDecoder::new(schema).unwrap();
        let deep = format!(
            "{{\"m\":\"a\",\"z\":{}1{}}}",
            "[".repeat(80),
            "]".repeat(80)
        );
        let ok_deep = format!("{{\"z\":{}1{}}}", "[".repeat(63), "]".repeat(63));
        let records: Vec<&[u8]> = vec![
            b"{\"n\":1,\"m\":\"a\xffb\"}",
            br#"{"x":1e400}"#,
            br#"{"n":123456789012345678901234567890}"#,
            deep.as_bytes(),
            br#"{"n":1,"n":2}"#,
            br#"[{"n":1}]"#,
            ok_deep.as_bytes(),
        ];
        let out = d.decode(&records).unwrap();
        let got: Vec<(usize, Option<&str>)> = out
            .bad
            .iter()
            .map(|b| (b.index, b.field.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, Some("m")),
                (1, Some("x")),
                (2, Some("n")),
                (3, Some("z")),
                (5, None)
            ],
            "{:?}",
            out.bad
        );
        assert!(out.bad[0].reason.contains("UTF-8"), "{:?}", out.bad[0]);
        assert!(
            out.bad[1].reason.contains("out of range"),
            "{:?}",
            out.bad[1]
        );
        assert!(
            out.bad[3].reason.contains("deeper than 64"),
            "{:?}",
            out.bad[3]
        );
        // Duplicate keys: the last one wins.
        assert_eq!(out.records, vec![4, 6]);
        assert_eq!(out.batch.column(2).as_primitive::<Int64Type>().value(0), 2);
    }
}
