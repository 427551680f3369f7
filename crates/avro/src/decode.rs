//! [`AvroDecoder`]: Confluent-framed Avro records (a magic byte 0, a
//! 4-byte big-endian schema id, the Avro body) into Arrow rows of the
//! table's schema, by arrow-avro's vectorised decoder.
//!
//! The table's columns are the *reader* schema (a subject's latest schema
//! when the pipeline opens). Each record is decoded with its *writer*
//! schema, fetched by id on first sight and cached, and resolved to the
//! reader schema by Avro's rules: fields added with defaults are filled,
//! removed fields are skipped, `int` widens to `long`, `float` and
//! `double`, and so on. A writer schema that cannot be resolved (a field
//! the query reads was removed and has no default) stops the run with
//! arrow-avro's reason.
//!
//! Records written with the reader schema itself, when it is a flat record
//! of primitive fields, are read by the one-pass decoder of `crate::flat`
//! instead, straight into the columns; what it gives up on comes here.
//!
//! A bad record (not Confluent-framed, an unknown schema id, a body that
//! does not match its writer schema) is reported with its index and the
//! good ones are kept: arrow-avro's decoder is rebuilt and the records
//! since its last flush are decoded again, so a bad record costs a
//! rebuild, never a good one's row.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, new_null_array};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit, TimestampMillisecondType};
use arrow_avro::codec::Tz;
use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use ubik_format::{BadRecord, Decoded, FormatError, RecordDecoder};

use crate::error::{AvroError, Result};
use crate::flat::FlatDecoder;
use crate::types::{convert, table_schema};

/// Rows arrow-avro's decoder holds before a flush.
const BATCH_ROWS: usize = 1 << 20;

/// Where writer schemas come from, by id: a registry, or a fixed set (tests).
pub trait WriterSchemas: Send {
    /// The schema registered under `id`; `None` when there is none.
    fn fetch(&mut self, id: u32) -> Result<Option<String>>;
}

impl WriterSchemas for BTreeMap<u32, String> {
    fn fetch(&mut self, id: u32) -> Result<Option<String>> {
        Ok(self.get(&id).cloned())
    }
}

/// The columns arrow-avro decodes for `reader` (an Avro record schema), as ubik's types.
pub fn columns_of(reader: &str) -> Result<SchemaRef> {
    let decoder = build(reader, &BTreeMap::from([(0, reader.to_string())]), None, 1)?;
    table_schema(&decoder.schema())
}

fn build(
    reader: &str,
    writers: &BTreeMap<u32, String>,
    projection: Option<&[usize]>,
    batch_rows: usize,
) -> Result<Decoder> {
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    for (&id, schema) in writers {
        store.set(Fingerprint::Id(id), AvroSchema::new(schema.clone()))?;
    }
    let mut builder = ReaderBuilder::new()
        .with_batch_size(batch_rows)
        .with_tz(Tz::Utc)
        .with_writer_schema_store(store);
    // Resolving writer to reader costs a projection step per record: when
    // every writer schema is the reader's (the common case) it is skipped.
    if !writers.values().all(|w| same_schema(w, reader)) {
        builder = builder.with_reader_schema(AvroSchema::new(reader.to_string()));
    }
    if let Some(p) = projection {
        builder = builder.with_projection(p.to_vec());
    }
    builder
        .build_decoder()
        .map_err(|e| AvroError::Schema(e.to_string()))
}

/// Whether two schema texts are the same schema (whitespace aside).
fn same_schema(a: &str, b: &str) -> bool {
    a == b
        || matches!(
            (serde_json::from_str::<serde_json::Value>(a), serde_json::from_str::<serde_json::Value>(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Decodes Confluent-framed Avro into the table of one reader schema.
pub struct AvroDecoder {
    /// The reader schema's JSON text.
    reader: String,
    table: SchemaRef,
    schemas: Box<dyn WriterSchemas>,
    /// Writer schemas met so far, by id.
    writers: BTreeMap<u32, String>,
    /// Ids the registry does not know (their records are bad).
    unknown: BTreeSet<u32>,
    /// Table columns decoded, in order; `None`: all.
    projection: Option<Vec<usize>>,
    /// Built when first needed, and again when a new writer schema appears.
    decoder: Option<Decoder>,
    /// Records whose rows the decoder holds, since its last flush.
    held: Vec<usize>,
    /// Flushed rows of the records being decoded.
    done: Vec<RecordBatch>,
    /// The records being decoded that are good so far, and the bad ones.
    good: Vec<u32>,
    bad: Vec<BadRecord>,
    scratch: Vec<u8>,
    /// The one-pass decoder, when the reader schema is one it reads.
    flat: Option<FlatDecoder>,
    /// Writer schema ids whose schema is the reader's: records the
    /// one-pass decoder may read.
    flat_ids: BTreeSet<u32>,
}

impl AvroDecoder {
    /// A decoder into the columns of `reader` (see [`columns_of`]), with
    /// writer schemas from `schemas`.
    pub fn new(reader: String, schemas: Box<dyn WriterSchemas>) -> Result<Self> {
        let table = columns_of(&reader)?;
        let flat = FlatDecoder::new(&reader, &table, None);
        Ok(Self {
            flat,
            flat_ids: BTreeSet::new(),
            reader,
            table,
            schemas,
            writers: BTreeMap::new(),
            unknown: BTreeSet::new(),
            projection: None,
            decoder: None,
            held: Vec::new(),
            done: Vec::new(),
            good: Vec::new(),
            bad: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// This decoder without the one-pass decoder: every chunk goes to
    /// arrow-avro (for benchmarks and tests that compare the two).
    pub fn without_one_pass(mut self) -> Self {
        self.flat = None;
        self
    }

    /// The reader schema's JSON text.
    pub fn reader_schema(&self) -> &str {
        &self.reader
    }

    fn decoder(&mut self) -> Result<&mut Decoder> {
        if self.decoder.is_none() {
            self.decoder = Some(build(
                &self.reader,
                &self.writers,
                self.projection.as_deref(),
                BATCH_ROWS,
            )?);
        }
        Ok(self.decoder.as_mut().expect("built above"))
    }

    /// Moves the decoder's rows into `done`. arrow-avro checks strings'
    /// UTF-8 only here, for the whole batch: when it refuses, the held
    /// records are decoded again one by one to find the ones at fault.
    /// Returns whether the decoder was rebuilt (a record under way is lost).
    fn flush(&mut self, records: &[&[u8]]) -> Result<bool> {
        let flushed = match &mut self.decoder {
            None => Ok(None),
            Some(d) => d.flush(),
        };
        match flushed {
            Ok(batch) => {
                self.done.extend(batch);
                self.held.clear();
                Ok(false)
            }
            Err(_) => {
                self.isolate(records)?;
                Ok(true)
            }
        }
    }

    /// Decodes each held record alone, keeping the rows of those whose
    /// flush succeeds and reporting the others; leaves a fresh decoder.
    fn isolate(&mut self, records: &[&[u8]]) -> Result<()> {
        for i in std::mem::take(&mut self.held) {
            self.decoder = None;
            self.decoder()?;
            let record = records[i];
            let id = frame(record).expect("a held record is framed");
            let decoded = self.decode_one(records, record, id)?;
            let flushed = self.decoder.as_mut().expect("built above").flush();
            let reason = match (decoded, flushed) {
                (Ok(()), Ok(batch)) => {
                    self.done.extend(batch);
                    continue;
                }
                (Err(reason), _) => reason,
                (Ok(()), Err(e)) => format!("the body does not fit schema id {id}: {e}"),
            };
            self.good.retain(|&g| g as usize != i);
            self.bad.push(BadRecord {
                index: i,
                field: None,
                reason,
            });
        }
        self.held.clear();
        self.decoder = None;
        self.decoder()?;
        Ok(())
    }

    /// Learns the writer schema `id`; false when the registry has none.
    fn learn(&mut self, records: &[&[u8]], id: u32) -> Result<bool> {
        if self.unknown.contains(&id) {
            return Ok(false);
        }
        let Some(schema) = self.schemas.fetch(id)? else {
            self.unknown.insert(id);
            return Ok(false);
        };
        self.flush(records)?;
        if same_schema(&schema, &self.reader) {
            self.flat_ids.insert(id);
        }
        self.writers.insert(id, schema);
        self.decoder = None;
        if let Err(e) = self.decoder() {
            return Err(AvroError::Schema(format!(
                "records written with schema id {id} cannot be read as this table's columns ({}): {e}",
                ubik_format::schema::describe(&self.table)
            )));
        }
        Ok(true)
    }

    /// Decodes one framed record into the decoder; `Err(reason)` when it is bad.
    fn decode_one(
        &mut self,
        records: &[&[u8]],
        record: &[u8],
        id: u32,
    ) -> Result<std::result::Result<(), String>> {
        // A body whose last five bytes read as another record's header
        // (0, then a known id) could be taken for "a body, then a header";
        // a byte that is no header after it tells the two apart.
        let ambiguous = record.len() >= 10 && {
            let tail = &record[record.len() - 5..];
            tail[0] == 0
                && self
                    .writers
                    .contains_key(&u32::from_be_bytes([tail[1], tail[2], tail[3], tail[4]]))
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let input: &[u8] = if ambiguous {
            scratch.clear();
            scratch.extend_from_slice(record);
            scratch.push(0xFF);
            &scratch
        } else {
            record
        };
        if self
            .decoder
            .as_ref()
            .expect("built before decoding")
            .capacity()
            < 2
        {
            self.flush(records)?;
        }
        let mut held_before = self.held.len();
        let mut at = 0;
        let mut switched = false;
        let outcome = loop {
            let decoder = self.decoder.as_mut().expect("built before decoding");
            match decoder.decode(&input[at..]) {
                Ok(n) => at += n,
                Err(e) => {
                    let message = e.to_string();
                    // The byte after an ambiguous record's body is no header: good.
                    if ambiguous && at < input.len() && message.contains("Missing magic bytes") {
                        break Ok(());
                    }
                    break Err(format!("the body does not match schema id {id}: {message}"));
                }
            }
            if at == input.len() {
                break if ambiguous {
                    Err("the record has bytes after its body".to_string())
                } else {
                    Ok(())
                };
            }
            // A new writer schema with rows held: arrow-avro stops for a flush.
            if decoder.batch_is_full() && !switched {
                switched = true;
                if self.flush(records)? {
                    // A fresh decoder: this record starts over, alone.
                    at = 0;
                    held_before = 0;
                    switched = false;
                }
                continue;
            }
            break Err(if at < 5 {
                "the record ends inside its header".to_string()
            } else {
                "the record ends before its body does, or has bytes after it".to_string()
            });
        };
        self.scratch = scratch;
        let decoder = self.decoder.as_ref().expect("built before decoding");
        let rows = decoder.batch_size() - decoder.capacity();
        let expected = if switched { 1 } else { held_before + 1 };
        match outcome {
            Ok(()) if rows == expected => Ok(Ok(())),
            Ok(()) => Ok(Err(format!(
                "the record holds {} rows of schema id {id}, not one",
                rows as i64 - expected as i64 + 1
            ))),
            Err(reason) => Ok(Err(reason)),
        }
    }

    /// After a bad record: a fresh decoder holding the good records' rows again.
    fn recover(&mut self, records: &[&[u8]]) -> Result<()> {
        let held = std::mem::take(&mut self.held);
        self.decoder = None;
        self.decoder()?;
        for i in held {
            let record = records[i];
            let id = frame(record).expect("a held record is framed");
            if let Err(reason) = self.decode_one(records, record, id)? {
                return Err(AvroError::Schema(format!(
                    "record {i} decoded once and failed the second time: {reason}"
                )));
            }
            self.held.push(i);
        }
        Ok(())
    }

    /// `records` by the one-pass decoder, if each is framed with a writer
    /// schema that is the reader's and reads exactly.
    pub(crate) fn decode_flat(&mut self, records: &[&[u8]]) -> Option<Decoded> {
        let flat = self.flat.as_mut()?;
        let mut bodies = Vec::with_capacity(records.len());
        // A topic's records mostly share one id: look up only a change of it.
        let mut last = None;
        for record in records {
            let id = frame(record)?;
            if last != Some(id) {
                if !self.flat_ids.contains(&id) {
                    return None;
                }
                last = Some(id);
            }
            bodies.push(&record[5..]);
        }
        Some(Decoded {
            batch: flat.decode(&bodies)?,
            records: Vec::new(),
            bad: Vec::new(),
        })
    }

    fn decode_all(&mut self, records: &[&[u8]]) -> Result<Decoded> {
        if let Some(decoded) = self.decode_flat(records) {
            return Ok(decoded);
        }
        self.held.clear();
        self.done.clear();
        self.bad.clear();
        self.good.clear();
        for (i, record) in records.iter().enumerate() {
            let Some(id) = frame(record) else {
                self.bad.push(BadRecord {
                    index: i,
                    field: None,
                    reason: match record.first() {
                        None => "an empty record; expected Confluent-framed Avro (magic byte 0, a 4-byte schema id, the body)".into(),
                        Some(0) => "the record ends inside its 5-byte header (magic byte 0, a 4-byte schema id)".into(),
                        Some(b) => format!(
                            "not Confluent-framed Avro: the first byte is {b}, not the magic byte 0 (is the topic JSON? then drop format=avro)"
                        ),
                    },
                });
                continue;
            };
            if !self.writers.contains_key(&id) && !self.learn(records, id)? {
                self.bad.push(BadRecord {
                    index: i,
                    field: None,
                    reason: format!(
                        "unknown schema id {id}: the registry has no schema with this id"
                    ),
                });
                continue;
            }
            self.decoder()?;
            match self.decode_one(records, record, id)? {
                Ok(()) => {
                    self.held.push(i);
                    self.good.push(i as u32);
                }
                Err(reason) => {
                    self.bad.push(BadRecord {
                        index: i,
                        field: None,
                        reason,
                    });
                    self.recover(records)?;
                }
            }
        }
        self.flush(records)?;
        let batches = std::mem::take(&mut self.done);
        let batches = self.drop_out_of_range(batches)?;
        let batch = self.to_table(&batches)?;
        let mut bad = std::mem::take(&mut self.bad);
        bad.sort_by_key(|b| b.index);
        let good = std::mem::take(&mut self.good);
        Ok(Decoded {
            batch,
            records: if bad.is_empty() { Vec::new() } else { good },
            bad,
        })
    }

    /// `batches` without the rows whose `timestamp-millis` value has no
    /// TIMESTAMP (microseconds in 64 bits: beyond 292 000 years from
    /// 1970), which become bad records instead of failing the chunk.
    fn drop_out_of_range(&mut self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        const LIMIT: u64 = i64::MAX as u64 / 1000;
        let mut first_row = 0;
        let mut dropped = Vec::new();
        let mut out = Vec::with_capacity(batches.len());
        for batch in batches {
            let rows = batch.num_rows();
            let mut keep = vec![true; rows];
            for (column, field) in batch.columns().iter().zip(batch.schema().fields()) {
                let DataType::Timestamp(TimeUnit::Millisecond, _) = field.data_type() else {
                    continue;
                };
                let millis = column.as_primitive::<TimestampMillisecondType>();
                if !millis.values().iter().any(|v| v.unsigned_abs() > LIMIT) {
                    continue;
                }
                for (r, v) in millis.iter().enumerate() {
                    if let Some(v) = v
                        && v.unsigned_abs() > LIMIT
                        && std::mem::replace(&mut keep[r], false)
                    {
                        dropped.push(first_row + r);
                        self.bad.push(BadRecord {
                            index: self.good[first_row + r] as usize,
                            field: Some(field.name().clone()),
                            reason: format!(
                                "timestamp-millis {v} is out of TIMESTAMP's range (microseconds since 1970 in 64 bits)"
                            ),
                        });
                    }
                }
            }
            first_row += rows;
            out.push(match keep.iter().all(|k| *k) {
                true => batch,
                false => filter_record_batch(&batch, &BooleanArray::from(keep))?,
            });
        }
        dropped.sort_unstable();
        for row in dropped.into_iter().rev() {
            self.good.remove(row);
        }
        Ok(out)
    }

    /// Decoded batches as one batch of the table's schema (columns the
    /// query does not read are null).
    fn to_table(&self, batches: &[RecordBatch]) -> Result<RecordBatch> {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let decoded = match batches {
            [] => None,
            [one] => Some(one.clone()),
            many => Some(concat_batches(&many[0].schema(), many)?),
        };
        let all: Vec<usize> = (0..self.table.fields().len()).collect();
        let read = self.projection.as_deref().unwrap_or(&all);
        let mut columns: Vec<Option<ArrayRef>> = vec![None; self.table.fields().len()];
        if let Some(decoded) = &decoded {
            for (j, &c) in read.iter().enumerate() {
                columns[c] = Some(convert(
                    decoded.column(j),
                    decoded.schema().field(j),
                    self.table.field(c).data_type(),
                )?);
            }
        }
        let columns = columns
            .into_iter()
            .zip(self.table.fields())
            .map(|(c, f)| c.unwrap_or_else(|| new_null_array(f.data_type(), rows)))
            .collect();
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.table),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }
}

/// The schema id of a Confluent-framed record.
fn frame(record: &[u8]) -> Option<u32> {
    match record {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

impl RecordDecoder for AvroDecoder {
    fn schema(&self) -> &SchemaRef {
        &self.table
    }

    fn decode(&mut self, records: &[&[u8]]) -> ubik_format::Result<Decoded> {
        self.decode_all(records).map_err(FormatError::from)
    }

    fn read_only(&mut self, reads: &[bool]) -> ubik_format::Result<()> {
        let mut projection: Vec<usize> = reads
            .iter()
            .enumerate()
            .filter_map(|(i, &r)| r.then_some(i))
            .collect();
        if projection.is_empty() {
            // arrow-avro needs a column to count rows by.
            projection.push(0);
        }
        self.projection = (projection.len() < self.table.fields().len()).then_some(projection);
        if self.flat.is_some() {
            self.flat = FlatDecoder::new(&self.reader, &self.table, self.projection.as_deref());
        }
        self.decoder = None;
        Ok(())
    }
}
