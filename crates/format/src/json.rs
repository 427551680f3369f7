//! JSON records to Arrow columns.
//!
//! Each record (an NDJSON line, a Kafka message, a webhook event) must be one
//! JSON object. arrow-json's tape decoder builds the columns directly, with
//! no per-row JSON tree. Timestamp columns are decoded as text and parsed by
//! [`crate::timestamp`], which accepts RFC 3339 and epoch milliseconds.
//!
//! When a chunk contains a bad record, the chunk is decoded again record by
//! record so the good ones are kept and each bad one is reported with its
//! index and the reason.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, PrimitiveArray, RecordBatch};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{
    DataType, Field, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use arrow::json::reader::{Decoder, ReaderBuilder};

use crate::decoder::{BadRecord, Decoded, RecordDecoder};
use crate::error::Result;
use crate::timestamp::parse_timestamp_micros;

/// Records decoded per tape; arrow-json preallocates for this many.
const CHUNK: usize = 8192;

/// Decodes records into batches of one schema. Large inputs are split into
/// chunks decoded on several threads; the result is the same rows in the
/// same order whatever the thread count.
pub struct JsonDecoder {
    schema: SchemaRef,
    /// One per thread, created when first needed.
    workers: Vec<ChunkDecoder>,
    threads: usize,
}

impl JsonDecoder {
    /// A decoder using up to one thread per core.
    pub fn new(schema: SchemaRef) -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(schema, threads)
    }

    /// A decoder using up to `threads` threads (at least one).
    pub fn with_threads(schema: SchemaRef, threads: usize) -> Result<Self> {
        Ok(Self {
            workers: vec![ChunkDecoder::new(Arc::clone(&schema))?],
            schema,
            threads: threads.max(1),
        })
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
            self.workers
                .push(ChunkDecoder::new(Arc::clone(&self.schema))?);
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
                message: b.message,
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
}

/// One arrow-json decoder and the timestamp parsing after it.
struct ChunkDecoder {
    schema: SchemaRef,
    decode_schema: SchemaRef,
    timestamps: Vec<usize>,
    decoder: Decoder,
}

impl ChunkDecoder {
    fn new(schema: SchemaRef) -> Result<Self> {
        let timestamps: Vec<usize> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.data_type(), DataType::Timestamp(_, _)))
            .map(|(i, _)| i)
            .collect();
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let dt = if timestamps.contains(&i) {
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
            schema,
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
        match self.decode_fast(records) {
            Ok(Some(decoded)) => Ok(decoded),
            Ok(None) | Err(_) => {
                self.decoder = Self::build(&self.decode_schema)?;
                self.decode_slow(records)
            }
        }
    }

    /// All records at once; `None` if any record is not exactly one object.
    fn decode_fast(&mut self, records: &[&[u8]]) -> Result<Option<Decoded>> {
        for (i, r) in records.iter().enumerate() {
            let read = self.decoder.decode(r)?;
            if read != r.len() || self.decoder.has_partial_record() || self.decoder.len() != i + 1 {
                return Ok(None);
            }
        }
        let batch = match self.decoder.flush()? {
            Some(b) => b,
            None => RecordBatch::new_empty(Arc::clone(&self.decode_schema)),
        };
        let (batch, bad) = self.convert_timestamps(batch, None)?;
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
                    bad.push(BadRecord { index: i, message });
                }
            }
        }
        let batch = concat_batches(&self.decode_schema, &rows)?;
        let (batch, ts_bad) = self.convert_timestamps(batch, Some(&kept))?;
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

    /// Parses the text of timestamp columns; rows that do not parse are
    /// reported (by record index, through `index_of`) and removed.
    fn convert_timestamps(
        &self,
        batch: RecordBatch,
        index_of: Option<&[u32]>,
    ) -> Result<(RecordBatch, Vec<BadRecord>)> {
        let n = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        let mut ok = vec![true; n];
        let mut bad = Vec::new();
        for &c in &self.timestamps {
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
                match parse_timestamp_micros(s.as_bytes()).and_then(|us| scale(us, *unit)) {
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
                                message: format!(
                                    "field '{}': cannot read {:?} as a timestamp (expected RFC 3339 such as 2026-11-29T15:01:00Z, or epoch milliseconds)",
                                    field.name(),
                                    truncate(s, 64)
                                ),
                            });
                        }
                    }
                }
            }
            let nulls = Some(arrow::buffer::NullBuffer::from(valid));
            let array: ArrayRef = match unit {
                TimeUnit::Second => Arc::new(
                    PrimitiveArray::<TimestampSecondType>::new(values.into(), nulls)
                        .with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Millisecond => Arc::new(
                    PrimitiveArray::<TimestampMillisecondType>::new(values.into(), nulls)
                        .with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Microsecond => Arc::new(
                    PrimitiveArray::<TimestampMicrosecondType>::new(values.into(), nulls)
                        .with_timezone_opt(tz.clone()),
                ),
                TimeUnit::Nanosecond => Arc::new(
                    PrimitiveArray::<TimestampNanosecondType>::new(values.into(), nulls)
                        .with_timezone_opt(tz.clone()),
                ),
            };
            columns[c] = array;
        }
        let out = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?;
        if bad.is_empty() {
            return Ok((out, bad));
        }
        let out = filter_record_batch(&out, &BooleanArray::from(ok))?;
        Ok((out, bad))
    }
}

fn scale(us: i64, unit: TimeUnit) -> Option<i64> {
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
        assert!(out.bad[1].message.contains("timestamp"), "{:?}", out.bad);
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
    fn two_objects_on_a_line_is_an_error() {
        let mut d = JsonDecoder::new(schema()).unwrap();
        let out = d
            .decode(&[b"{\"m\":\"a\"} {\"m\":\"b\"}", b"{\"m\":\"c\"}"])
            .unwrap();
        assert_eq!(out.batch.num_rows(), 1);
        assert_eq!(out.bad.len(), 1);
        assert_eq!(out.bad[0].index, 0);
    }
}
