//! `json-decode TABLE EVENTS`: JSON decoding alone, the one-pass decoder
//! against arrow-json (the general decoder), side by side in one run.
//!
//! The Nexmark table's rows of a stream of EVENTS events are encoded as ubik
//! writes them to a topic (canonical JSON, one object per record), then
//! decoded in chunks of 4096 records (the Kafka source's batch) on one
//! thread, by both decoders in alternating rounds (five each); the figure
//! per decoder is its best round. Both must give the same rows.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use arrow::array::{Int64Array, RecordBatch};
use serde_json::json;
use ubik_connectors::nexmark::{NexmarkOptions, NexmarkSource, NexmarkTable};
use ubik_format::changelog::ChangelogEncoder;
use ubik_format::json::JsonDecoder;

use crate::nexmark::next_batch;

const CHUNK: usize = 4096;
const ROUNDS: usize = 5;

/// The table's records as JSON values, one `Vec` per record.
fn encoded(table: NexmarkTable, events: u64) -> Result<Vec<Vec<u8>>> {
    let mut source = NexmarkSource::new(
        table,
        NexmarkOptions {
            events,
            ..NexmarkOptions::default()
        },
    );
    let schema = table.schema();
    let mut encoder = ChangelogEncoder::new(&schema, Vec::new(), false);
    let mut records = Vec::new();
    while let Some(batch) = next_batch(&mut source)? {
        let times = Int64Array::from(vec![0; batch.num_rows()]);
        encoder
            .encode_parts(&batch, None, &times, &mut |r| {
                records.push(r.value.unwrap_or_default().to_vec());
                Ok::<_, ()>(())
            })?
            .ok();
    }
    Ok(records)
}

/// Seconds to decode every chunk, and the rows.
fn round(decoder: &mut JsonDecoder, chunks: &[Vec<&[u8]>]) -> Result<(f64, Vec<RecordBatch>)> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let decoded = decoder.decode(chunk)?;
        ensure!(decoded.bad.is_empty(), "bad records: {:?}", decoded.bad);
        out.push(decoded.batch);
    }
    Ok((start.elapsed().as_secs_f64(), out))
}

pub fn run(table: &str, events: u64) -> Result<()> {
    let table = NexmarkTable::parse(table)?;
    let records = encoded(table, events).context("generate")?;
    let bytes: usize = records.iter().map(Vec::len).sum();
    let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let chunks: Vec<Vec<&[u8]>> = slices.chunks(CHUNK).map(<[_]>::to_vec).collect();
    let mut one_pass = JsonDecoder::with_threads(table.schema(), 1)?;
    let mut general = JsonDecoder::with_threads(table.schema(), 1)?.without_one_pass()?;
    let (mut best_one, mut best_general) = (f64::MAX, f64::MAX);
    for _ in 0..ROUNDS {
        let (a, rows_a) = round(&mut one_pass, &chunks)?;
        let (b, rows_b) = round(&mut general, &chunks)?;
        ensure!(rows_a == rows_b, "the decoders' rows differ");
        best_one = best_one.min(a);
        best_general = best_general.min(b);
    }
    let n = records.len() as f64;
    println!(
        "{}",
        json!({"bench": "json-decode", "table": table.name(), "records": records.len(),
               "bytes_per_record": bytes as f64 / n,
               "one_pass_records_per_s": n / best_one, "arrow_json_records_per_s": n / best_general,
               "one_pass_ns_per_record": best_one * 1e9 / n, "arrow_json_ns_per_record": best_general * 1e9 / n,
               "speedup": best_general / best_one})
    );
    Ok(())
}
