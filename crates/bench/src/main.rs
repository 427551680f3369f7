//! Benchmark drivers, timed inside the process so only the measured work counts:
//!
//! - `arrow-agg FILE.arrow SQL`: Arrow batches in memory through the engine
//!   to changelog rows (Arrow), the per-merchant per-minute query.
//! - `encode FILE.arrow SQL`: the same plus canonical JSON encoding.
//! - `checkpoint KEYS`: snapshot + encode of KEYS open (group, window) keys.
//! - `nexmark QUERY.sql EVENTS [JOIN_RETENTION_MS]`: a Nexmark query over a
//!   stream of EVENTS events (all kinds), the engine alone timed (one
//!   thread) into a sink that counts rows, with the state's size along the
//!   run (see [`nexmark`]).
//!
//! - `json-decode TABLE EVENTS [COLUMNS]`: JSON decoding of a Nexmark table's
//!   records, the one-pass decoder against arrow-json, and reading only
//!   COLUMNS (see [`json_decode`]).
//! - `changelog EVENTS KEYS [SQL]`: a continuous GROUP BY over Debezium events
//!   against the same over append-only rows (see [`changelog`]).
//! - `kafka-load`, `kafka-copy`: the broker's own rate (see [`kafka`]).
//!
//! Prints one JSON line of measurements.

mod changelog;
mod json_decode;
mod kafka;

/// mimalloc keeps freed batch buffers for the next batch instead of returning them to
/// the kernel and paying for fresh zeroed pages.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod nexmark;

use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arrow::array::{Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::ipc::reader::FileReader;
use serde_json::json;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};
use ubik_format::changelog::ChangelogEncoder;

fn load(path: &str) -> Result<Vec<RecordBatch>> {
    let f = File::open(path).with_context(|| format!("open {path}"))?;
    let reader = FileReader::try_new(f, None)?;
    Ok(reader.collect::<std::result::Result<Vec<_>, _>>()?)
}

fn run_agg(path: &str, sql: &str, encode: bool) -> Result<()> {
    let batches = load(path)?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let schema = batches[0].schema();
    let catalog = Catalog::new().with_table("events", Arc::clone(&schema));
    let options = QueryOptions {
        lateness_us: 0,
        ..QueryOptions::default()
    };
    let plan = plan_query(sql, &catalog, options)?;
    let mut encoder = ChangelogEncoder::new(&plan.output_schema, plan.key_columns.clone(), true);
    let mut query = Query::new(plan)?;
    query.add_partition(0);
    let mut out = Output::default();
    let mut changes = 0usize;
    let mut bytes = 0usize;
    let start = Instant::now();
    let mut drain = |out: &mut Output, changes: &mut usize, bytes: &mut usize| -> Result<()> {
        for c in &out.changes {
            *changes += c.num_rows();
            if encode {
                encoder
                    .encode(c, |r| {
                        *bytes += r.key.map_or(0, |k| k.len()) + r.value.map_or(0, |v| v.len());
                        Ok::<_, ()>(())
                    })?
                    .ok();
            }
        }
        out.clear();
        Ok(())
    };
    for b in &batches {
        query.process(0, b, &mut out)?;
        drain(&mut out, &mut changes, &mut bytes)?;
    }
    query.finish(&mut out)?;
    drain(&mut out, &mut changes, &mut bytes)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": if encode {"encode"} else {"arrow-agg"}, "rows": rows, "changes": changes,
               "json_bytes": bytes, "seconds": secs, "rows_per_s": rows as f64 / secs})
    );
    Ok(())
}

/// KEYS distinct merchants in one open one-minute window, then a checkpoint.
fn checkpoint(keys: usize) -> Result<()> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("merchant", DataType::Utf8, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("amount", DataType::Float64, true),
    ]));
    let sql = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
    let plan = plan_query(
        sql,
        &Catalog::new().with_table("orders", Arc::clone(&schema)),
        QueryOptions::default(),
    )?;
    let mut query = Query::new(plan.clone())?;
    query.add_partition(0);
    let mut out = Output::default();
    let base = 1_704_067_200_000_000i64;
    for start in (0..keys).step_by(65_536) {
        let n = 65_536.min(keys - start);
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter_values(
                    (start..start + n).map(|i| format!("merchant-{i:08}")),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values((0..n).map(|i| base + i as i64))
                        .with_timezone("UTC"),
                ),
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| i as f64 * 0.25),
                )),
            ],
        )?;
        query.process(0, &batch, &mut out)?;
    }
    if query.state_keys() != keys {
        bail!("expected {keys} open keys, found {}", query.state_keys());
    }
    let t = Instant::now();
    let snapshot = query.snapshot()?;
    let bytes = snapshot.encode()?;
    let snap_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut restored = Query::new(plan)?;
    restored.restore(ubik_engine::QuerySnapshot::decode(&bytes)?)?;
    let restore_secs = t.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "checkpoint", "keys": keys, "snapshot_seconds": snap_secs, "restore_seconds": restore_secs,
               "state_bytes": bytes.len(), "bytes_per_key": bytes.len() as f64 / keys as f64,
               "memory_bytes_per_key": query.state_size() as f64 / keys as f64})
    );
    Ok(())
}

fn main() -> Result<()> {
    // Large frees go back to the kernel at once: mimalloc would keep them
    // for a second, past the memory budget (see `ubik_state::memory`).
    ubik_state::memory::release_with_mimalloc();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["arrow-agg", path, sql] => run_agg(path, sql, false),
        ["encode", path, sql] => run_agg(path, sql, true),
        ["checkpoint", keys] => checkpoint(keys.parse()?),
        ["nexmark", sql, events] => nexmark::run(sql, events.parse()?, 0),
        ["nexmark", sql, events, join_retention_ms] => {
            nexmark::run(sql, events.parse()?, join_retention_ms.parse()?)
        }
        ["changelog", events, keys] => changelog::run_bench(events.parse()?, keys.parse()?, None),
        ["changelog", events, keys, sql] => {
            changelog::run_bench(events.parse()?, keys.parse()?, Some(sql))
        }
        ["json-decode", table, events] => json_decode::run(table, events.parse()?, None),
        ["json-decode", table, events, columns] => {
            json_decode::run(table, events.parse()?, Some(columns))
        }
        ["kafka-load", broker, topic, path, partitions] => {
            kafka::load(broker, topic, path, partitions.parse()?, None)
        }
        ["kafka-load", broker, topic, path, partitions, key_field] => {
            kafka::load(broker, topic, path, partitions.parse()?, Some(key_field))
        }
        ["kafka-copy", broker, input, output] => kafka::copy(broker, input, output),
        _ => bail!(
            "usage: ubik-bench arrow-agg FILE.arrow SQL | encode FILE.arrow SQL | checkpoint KEYS \
             | nexmark QUERY.sql EVENTS [JOIN_RETENTION_MS] | json-decode TABLE EVENTS [COLUMNS] | changelog EVENTS KEYS [SQL] | kafka-load BROKER TOPIC FILE.jsonl PARTITIONS [KEY_FIELD] | kafka-copy BROKER IN OUT"
        ),
    }
}
