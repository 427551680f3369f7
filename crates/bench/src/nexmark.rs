//! `nexmark QUERY.sql EVENTS`: the engine-only Nexmark measurement.
//!
//! The tables the query reads are generated from a stream of EVENTS events
//! (all kinds, as the spec counts them), batch by batch; the timed part is
//! the engine alone: planning excluded, every batch through the query on
//! one thread, windows closed at the end, result rows counted (not encoded).
//! The state's size is sampled 20 times along the run (`state_curve`: input
//! rows, state bytes, open keys: groups plus rows a join holds), to show it
//! stays bounded; `bytes_per_key` is the state's bytes per open key at the
//! sample with the most keys.
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

/// The next batch of one table, or `None` at its end.
pub(crate) fn next_batch(source: &mut NexmarkSource) -> Result<Option<RecordBatch>> {
    loop {
        match source.poll(8192, Duration::ZERO)? {
            SourceEvent::Chunk(c) => match c.payload {
                Payload::Arrow(b) => return Ok(Some(b)),
                Payload::Bytes { .. } => anyhow::bail!("nexmark rows are Arrow"),
            },
            SourceEvent::End => return Ok(None),
            SourceEvent::PartitionEnd(_) | SourceEvent::Idle => {}
        }
    }
}

/// `join_retention_ms`: the query's join retention (state kept that much
/// longer for late rows; the generated stream has none).
pub fn run(sql_file: &str, events: u64, join_retention_ms: i64) -> Result<()> {
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
        join_retention_us: join_retention_ms.saturating_mul(1000),
        ..QueryOptions::default()
    };
    let plan = plan_query(&sql, &catalog, options)?;
    let mut inputs = Vec::new();
    for source in &plan.sources {
        let table = NexmarkTable::parse(&source.name)?;
        let index = plan.source_index(&source.name).unwrap_or(0);
        let options = NexmarkOptions {
            events,
            ..NexmarkOptions::default()
        };
        inputs.push((
            partition_id(index, 0),
            NexmarkSource::new(table, options),
            false,
        ));
    }
    let mut query = Query::new(plan)?;
    for (p, _, _) in &inputs {
        query.add_partition(*p);
    }
    let mut out = Output::default();
    let (mut rows_in, mut rows_out) = (0usize, 0usize);
    let (mut engine, mut generation) = (Duration::ZERO, Duration::ZERO);
    // Generated and processed batch by batch (memory stays bounded on long
    // runs); only the engine's calls are timed. State sampled 20 times.
    let mut curve: Vec<(usize, usize, usize)> = Vec::new();
    let sample_every = (events as usize / 20).max(1);
    let mut next_sample = sample_every;
    while inputs.iter().any(|(_, _, ended)| !ended) {
        for (p, source, ended) in inputs.iter_mut().filter(|i| !i.2) {
            let t = Instant::now();
            let batch = next_batch(source)?;
            generation += t.elapsed();
            let Some(b) = batch else {
                *ended = true;
                continue;
            };
            rows_in += b.num_rows();
            let t = Instant::now();
            query.process(*p, &b, &mut out)?;
            engine += t.elapsed();
            rows_out += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
            out.clear();
        }
        if rows_in >= next_sample {
            curve.push((rows_in, query.state_size(), query.state_keys()));
            next_sample += sample_every;
        }
    }
    let t = Instant::now();
    query.finish(&mut out)?;
    engine += t.elapsed();
    rows_out += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
    let (secs, generate_secs) = (engine.as_secs_f64(), generation.as_secs_f64());
    let peak_state = curve.iter().map(|c| c.1).max().unwrap_or(0);
    let bytes_per_key = curve
        .iter()
        .max_by_key(|c| c.2)
        .filter(|c| c.2 > 0)
        .map(|c| c.1 as f64 / c.2 as f64);
    println!(
        "{}",
        json!({"bench": "nexmark", "query": sql_file, "events": events,
               "join_retention_ms": join_retention_ms, "rows_in": rows_in,
               "rows_out": rows_out, "seconds": secs, "events_per_s": events as f64 / secs,
               "generate_seconds": generate_secs,
               "events_per_s_with_generation": events as f64 / (secs + generate_secs),
               "peak_state_bytes": peak_state, "bytes_per_key": bytes_per_key,
               "state_curve": curve})
    );
    Ok(())
}
