//! `json-decode TABLE EVENTS [COLUMNS]`: JSON decoding alone, the one-pass
//! decoder against arrow-json (the general decoder), side by side in one run;
//! with COLUMNS (comma-separated names), also the one-pass decoder reading
//! only those (as for a query that reads only them: Nexmark q2 reads
//! `auction,price,date_time` of a bid).
//!
//! The Nexmark table's rows of a stream of EVENTS events are encoded as ubik
//! writes them to a topic (canonical JSON, one object per record), then
//! decoded in chunks of 4096 records (the Kafka source's batch) on one
//! thread, by both decoders in alternating rounds (five each); the figure
//! per decoder is its best round. All must give the same rows (in the columns
//! read).
//!
//! The same rows encoded as Confluent-framed Avro (as `format=avro` writes
//! them) are decoded by the Avro decoder in the same rounds, whole and
//! reading COLUMNS: `avro_records_per_s` and `avro_vs_one_pass`; and by
//! the Avro decoder without its one-pass decoder (arrow-avro alone):
//! `arrow_avro_ns_per_record` and `avro_one_pass_speedup`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{Schema, SchemaRef};
use serde_json::json;
use ubik_connector::ChangeBatch;
use ubik_connectors::nexmark::{NexmarkOptions, NexmarkSource, NexmarkTable};
use ubik_format::changelog::ChangelogEncoder;
use ubik_format::json::JsonDecoder;
use ubik_format::{ChangeEncoder, RecordDecoder};

use crate::nexmark::next_batch;

const CHUNK: usize = 4096;
const ROUNDS: usize = 5;

/// The table's records as `encoder` writes them (the rows typed by
/// `schema`), one `Vec` per record.
fn encoded(
    table: NexmarkTable,
    events: u64,
    schema: &SchemaRef,
    encoder: &mut dyn ChangeEncoder,
) -> Result<Vec<Vec<u8>>> {
    let mut source = NexmarkSource::new(
        table,
        NexmarkOptions {
            events,
            ..NexmarkOptions::default()
        },
    );
    let mut records = Vec::new();
    while let Some(batch) = next_batch(&mut source)? {
        let change = ChangeBatch {
            timestamps: Int64Array::from(vec![0; batch.num_rows()]),
            rows: RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())?,
            deletes: None,
        };
        encoder.encode(&change, &mut |r| {
            records.push(r.value.unwrap_or_default().to_vec());
            Ok(())
        })??;
    }
    Ok(records)
}

/// Seconds to decode every chunk, and the rows.
/// Decodes every chunk: the seconds taken, and the batches when `keep`
/// (else each is dropped when decoded, as a pipeline does once it has
/// folded it, so that the next one reuses its memory).
fn round(
    decoder: &mut dyn RecordDecoder,
    chunks: &[Vec<&[u8]>],
    keep: bool,
) -> Result<(f64, Vec<RecordBatch>)> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let decoded = decoder.decode(chunk)?;
        ensure!(decoded.bad.is_empty(), "bad records: {:?}", decoded.bad);
        ensure!(decoded.batch.num_rows() == chunk.len(), "rows lost");
        if keep {
            out.push(decoded.batch);
        }
    }
    Ok((start.elapsed().as_secs_f64(), out))
}

pub fn run(table: &str, events: u64, columns: Option<&str>) -> Result<()> {
    let table = NexmarkTable::parse(table)?;
    // As a topic's declared schema (`--schema`) gives it: every column nullable, so one the
    // query does not read can be left null.
    let schema = Arc::new(Schema::new(
        table
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let mut json = ChangelogEncoder::new(&schema, Vec::new(), false);
    let records = encoded(table, events, &schema, &mut json).context("generate")?;
    let bytes: usize = records.iter().map(Vec::len).sum();
    let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let chunks: Vec<Vec<&[u8]>> = slices.chunks(CHUNK).map(<[_]>::to_vec).collect();
    let mut one_pass = JsonDecoder::with_threads(Arc::clone(&schema), 1)?;
    let mut general = JsonDecoder::with_threads(Arc::clone(&schema), 1)?.without_one_pass()?;
    let mut reading = match columns {
        None => None,
        Some(names) => {
            let names: Vec<&str> = names.split(',').map(str::trim).collect();
            for n in &names {
                ensure!(
                    schema.index_of(n).is_ok(),
                    "{} has no column {n}",
                    table.name()
                );
            }
            let reads: Vec<bool> = schema
                .fields()
                .iter()
                .map(|f| names.contains(&f.name().as_str()))
                .collect();
            let mut d = JsonDecoder::with_threads(Arc::clone(&schema), 1)?;
            d.read_only(&reads)?;
            Some((d, reads))
        }
    };
    let all: Vec<usize> = (0..schema.fields().len()).collect();
    let avro_schema =
        ubik_avro::encode::record_schema(&schema, &all, "bench_value", Default::default())?
            .to_string();
    let mut avro_encoder = ubik_avro::AvroChangelogEncoder::with_ids(Vec::new(), false, 0, 1);
    let avro_records = encoded(table, events, &schema, &mut avro_encoder)?;
    let avro_bytes: usize = avro_records.iter().map(Vec::len).sum();
    let avro_slices: Vec<&[u8]> = avro_records.iter().map(Vec::as_slice).collect();
    let avro_chunks: Vec<Vec<&[u8]>> = avro_slices.chunks(CHUNK).map(<[_]>::to_vec).collect();
    let writers = std::collections::BTreeMap::from([(1u32, avro_schema.clone())]);
    let mut avro = ubik_avro::AvroDecoder::new(avro_schema.clone(), Box::new(writers.clone()))?;
    let mut arrow_avro =
        ubik_avro::AvroDecoder::new(avro_schema.clone(), Box::new(writers.clone()))?
            .without_one_pass();
    let mut avro_reading = match &reading {
        None => None,
        Some((_, reads)) => {
            let mut d = ubik_avro::AvroDecoder::new(avro_schema, Box::new(writers))?;
            d.read_only(reads)?;
            Some(d)
        }
    };
    let (mut best_one, mut best_general, mut best_reading) = (f64::MAX, f64::MAX, f64::MAX);
    let (mut best_avro, mut best_avro_reading, mut best_arrow_avro) =
        (f64::MAX, f64::MAX, f64::MAX);
    let same = |a: &[RecordBatch], b: &[RecordBatch], columns: &[usize]| {
        a.iter().zip(b).all(|(x, y)| {
            columns
                .iter()
                .all(|&c| x.column(c).to_data() == y.column(c).to_data())
        })
    };
    // Round 0 keeps every decoder's rows and compares them; the others are timed.
    for r in 0..=ROUNDS {
        let keep = r == 0;
        let timed = |best: &mut f64, t: f64| {
            if !keep {
                *best = best.min(t);
            }
        };
        let (a, rows_a) = round(&mut one_pass, &chunks, keep)?;
        let (b, rows_b) = round(&mut general, &chunks, keep)?;
        ensure!(rows_a == rows_b, "the decoders' rows differ");
        let (v, rows_v) = round(&mut avro, &avro_chunks, keep)?;
        ensure!(
            same(&rows_a, &rows_v, &all),
            "Avro gives other rows than JSON"
        );
        timed(&mut best_avro, v);
        let (g, rows_g) = round(&mut arrow_avro, &avro_chunks, keep)?;
        ensure!(
            rows_g == rows_v,
            "arrow-avro gives other rows than the one-pass Avro decoder"
        );
        timed(&mut best_arrow_avro, g);
        if let (Some(d), Some((_, reads))) = (&mut avro_reading, &reading) {
            let (w, rows_w) = round(d, &avro_chunks, keep)?;
            let read: Vec<usize> = (0..reads.len()).filter(|&i| reads[i]).collect();
            ensure!(
                same(&rows_a, &rows_w, &read),
                "Avro reading some columns gives other values"
            );
            timed(&mut best_avro_reading, w);
        }
        timed(&mut best_one, a);
        timed(&mut best_general, b);
        if let Some((d, reads)) = &mut reading {
            let (c, rows_c) = round(d, &chunks, keep)?;
            let read: Vec<usize> = (0..reads.len()).filter(|&i| reads[i]).collect();
            for (full, some) in rows_a.iter().zip(&rows_c) {
                ensure!(
                    full.project(&read)? == some.project(&read)?,
                    "reading some columns gives other values"
                );
            }
            timed(&mut best_reading, c);
        }
    }
    let n = records.len() as f64;
    let mut report = json!({"bench": "json-decode", "table": table.name(), "records": records.len(),
           "bytes_per_record": bytes as f64 / n,
           "one_pass_records_per_s": n / best_one, "arrow_json_records_per_s": n / best_general,
           "one_pass_ns_per_record": best_one * 1e9 / n, "arrow_json_ns_per_record": best_general * 1e9 / n,
           "speedup": best_general / best_one,
           "avro_bytes_per_record": avro_bytes as f64 / n,
           "avro_records_per_s": n / best_avro, "avro_ns_per_record": best_avro * 1e9 / n,
           "avro_vs_one_pass": best_one / best_avro,
           "arrow_avro_ns_per_record": best_arrow_avro * 1e9 / n,
           "avro_one_pass_speedup": best_arrow_avro / best_avro});
    if let Some(columns) = columns {
        report["columns_read"] = json!(columns);
        report["one_pass_reading_ns_per_record"] = json!(best_reading * 1e9 / n);
        report["reading_speedup"] = json!(best_one / best_reading);
        report["avro_reading_ns_per_record"] = json!(best_avro_reading * 1e9 / n);
        report["avro_reading_vs_one_pass_reading"] = json!(best_reading / best_avro_reading);
    }
    println!("{report}");
    Ok(())
}
