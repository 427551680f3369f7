//! `nexmark QUERY.sql EVENTS`: the engine-only Nexmark measurement.
//!
//! The tables the query reads are generated from a stream of EVENTS events
//! (all kinds, as the spec counts them) into memory first, so the timed part
//! is the engine alone: planning excluded, every batch through the query on
//! one thread, windows closed at the end, result rows counted (not encoded).
//! Events per second are the stream's events over that time, the convention
//! of the published Nexmark figures; `events_per_s_with_generation` adds the
//! generator's time, as the peers' in-process figures include theirs.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow::array::RecordBatch;
use serde_json::json;
use ubik_connector::{Payload, Source, SourceEvent};
use ubik_connectors::nexmark::{NexmarkOptions, NexmarkSource, NexmarkTable};
use ubik_engine::progress::partition_id;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};

/// Every row of one table of the stream, as the source hands them out.
fn generate(table: NexmarkTable, events: u64) -> Result<Vec<RecordBatch>> {
    let options = NexmarkOptions {
        events,
        ..NexmarkOptions::default()
    };
    let mut source = NexmarkSource::new(table, options);
    let mut out = Vec::new();
    loop {
        match source.poll(8192, Duration::ZERO)? {
            SourceEvent::Chunk(c) => match c.payload {
                Payload::Arrow(b) => out.push(b),
                Payload::Bytes { .. } => anyhow::bail!("nexmark rows are Arrow"),
            },
            SourceEvent::End => return Ok(out),
            SourceEvent::PartitionEnd(_) | SourceEvent::Idle => {}
        }
    }
}

pub fn run(sql_file: &str, events: u64) -> Result<()> {
    let sql = std::fs::read_to_string(sql_file).with_context(|| format!("read {sql_file}"))?;
    let mut catalog = Catalog::new();
    for t in [
        NexmarkTable::Person,
        NexmarkTable::Auction,
        NexmarkTable::Bid,
    ] {
        catalog.add_table(t.name(), t.schema());
    }
    let options = QueryOptions {
        lateness_us: 0,
        ..QueryOptions::default()
    };
    let plan = plan_query(&sql, &catalog, options)?;
    let t = Instant::now();
    let mut inputs = Vec::new();
    for source in &plan.sources {
        let table = NexmarkTable::parse(&source.name)?;
        let index = plan.source_index(&source.name).unwrap_or(0);
        inputs.push((partition_id(index, 0), generate(table, events)?));
    }
    let generate_secs = t.elapsed().as_secs_f64();
    let rows_in: usize = inputs
        .iter()
        .flat_map(|(_, b)| b.iter().map(RecordBatch::num_rows))
        .sum();
    let mut query = Query::new(plan)?;
    for (p, _) in &inputs {
        query.add_partition(*p);
    }
    let mut out = Output::default();
    let mut rows_out = 0usize;
    let mut peak_state = 0usize;
    let start = Instant::now();
    // The tables' batches interleaved, as a source reader polls them.
    let longest = inputs.iter().map(|(_, b)| b.len()).max().unwrap_or(0);
    for i in 0..longest {
        for (p, batches) in &inputs {
            if let Some(b) = batches.get(i) {
                query.process(*p, b, &mut out)?;
                rows_out += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
                out.clear();
            }
        }
        if i % 64 == 0 {
            peak_state = peak_state.max(query.state_size());
        }
    }
    query.finish(&mut out)?;
    rows_out += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "nexmark", "query": sql_file, "events": events, "rows_in": rows_in,
               "rows_out": rows_out, "seconds": secs, "events_per_s": events as f64 / secs,
               "generate_seconds": generate_secs,
               "events_per_s_with_generation": events as f64 / (secs + generate_secs),
               "peak_state_bytes": peak_state})
    );
    Ok(())
}
