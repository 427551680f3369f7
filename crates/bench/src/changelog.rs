//! `changelog EVENTS KEYS [SQL]`: a continuous GROUP BY over a Debezium topic's
//! events against the same GROUP BY over the same rows as an append-only
//! topic, side by side in one run, from the records' bytes to the changelog
//! (decode, unwrap, normalise, aggregate, emit; no Kafka).
//!
//! EVENTS changes of KEYS rows (`id`), each row in one of 1000 merchants:
//! 10% deletes, the rest upserts (the first of a key a create, later ones
//! updates that may move it to another merchant). The append-only run reads
//! each change's row as a new row (what the same query over an event topic
//! does); the changelog run takes every old row back out, so it does about
//! twice the aggregation work. Both run in alternating rounds (three
//! each); the figure per run is its best round.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use arrow::datatypes::SchemaRef;
use serde_json::json;
use ubik_connector::{Chunk, Payload, RecordMeta};
use ubik_engine::operator::Output;
use ubik_engine::{Catalog, Query, QueryOptions, plan_query};
use ubik_format::json::JsonDecoder;

const CHUNK: usize = 4096;
const ROUNDS: usize = 3;
const SQL: &str = "SELECT merchant, count(*) AS n, sum(amount) AS total, min(amount) AS lo, max(amount) AS hi FROM orders GROUP BY merchant";

fn schema(changelog: bool) -> Result<SchemaRef> {
    let s = ubik_format::schema::parse_column_list(
        "id BIGINT PRIMARY KEY, merchant VARCHAR, amount DOUBLE, ts TIMESTAMP",
    )?;
    Ok(match changelog {
        true => ubik_connector::changelog_schema(&s, "debezium"),
        false => s,
    })
}

/// The events as Debezium writes them (schemas off) and their rows as an
/// append-only topic's records.
fn records(events: u64, keys: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut seen = vec![false; keys as usize];
    let (mut cdc, mut plain) = (Vec::new(), Vec::new());
    for i in 0..events {
        let id = next() % keys;
        let ts = 1_704_067_200_000 + i as i64;
        let row = format!(
            r#"{{"id":{id},"merchant":"m{:03}","amount":{}.{:02},"ts":{ts}}}"#,
            next() % 1000,
            next() % 500,
            next() % 100
        );
        let exists = &mut seen[id as usize];
        let event = if *exists && next() % 10 == 0 {
            *exists = false;
            format!(
                r#"{{"before":{{"id":{id}}},"after":null,"source":{{"ts_ms":{ts},"db":"shop","table":"orders"}},"op":"d","ts_ms":{ts}}}"#
            )
        } else {
            let op = if *exists { "u" } else { "c" };
            *exists = true;
            format!(
                r#"{{"before":null,"after":{row},"source":{{"ts_ms":{ts},"db":"shop","table":"orders"}},"op":"{op}","ts_ms":{ts}}}"#
            )
        };
        cdc.push(event.into_bytes());
        plain.push(row.into_bytes());
    }
    (cdc, plain)
}

/// One run over `records`: seconds and changelog records emitted.
fn run(sql: &str, records: &[Vec<u8>], changelog: bool) -> Result<(f64, usize)> {
    let schema = schema(changelog)?;
    let catalog = Catalog::new().with_table("orders", Arc::clone(&schema));
    let plan = plan_query(sql, &catalog, QueryOptions::default())?;
    let mut query = Query::new(plan)?;
    let mut decoder = JsonDecoder::new(Arc::clone(&schema))?;
    let mut key_decoder = JsonDecoder::with_threads(schema, 1)?;
    let mut out = Output::default();
    let mut emitted = 0;
    let mut events = ubik_format::debezium::DebeziumJson::new(decoder.schema(), Default::default());
    let start = Instant::now();
    for part in records.chunks(CHUNK) {
        let chunk = Chunk {
            partition: 0,
            payload: Payload::from_records(part),
            positions: Vec::new(),
            position_name: "offset",
            meta: RecordMeta::default(),
        };
        let rows = match changelog {
            // Events without a schema: one run of rows.
            true => events.unwrap_events(chunk).rows.remove(0).chunk,
            false => chunk,
        };
        // The chunk's upserts and deletions in one batch, in order, as the
        // pipeline feeds them (deletions' keys through their own decoder).
        let records = rows.payload.records();
        let deleted = rows.meta.deletion_mask(records.len());
        let decoded = match rows.meta.deletions.is_empty() {
            true => decoder.decode(&records)?,
            false => ubik_format::decoder::decode_mixed(
                &records,
                &deleted,
                &mut |r| decoder.decode(r),
                &mut |k| key_decoder.decode(k),
            )?,
        };
        anyhow::ensure!(decoded.bad.is_empty(), "bad rows: {:?}", decoded.bad);
        match rows.meta.deletions.is_empty() {
            true => query.process(0, &decoded.batch, &mut out)?,
            false => query.process_changes(0, &decoded.batch, &deleted, &mut out)?,
        }
        emitted += out.changes.iter().map(|c| c.rows.num_rows()).sum::<usize>();
        out = Output::default();
    }
    query.finish(&mut out)?;
    emitted += out.changes.iter().map(|c| c.rows.num_rows()).sum::<usize>();
    Ok((start.elapsed().as_secs_f64(), emitted))
}

pub fn run_bench(events: u64, keys: u64, sql: Option<&str>) -> Result<()> {
    let sql = sql.unwrap_or(SQL);
    let (cdc, plain) = records(events, keys);
    let (mut best_cdc, mut best_plain) = (f64::MAX, f64::MAX);
    let (mut out_cdc, mut out_plain) = (0, 0);
    for _ in 0..ROUNDS {
        let (s, n) = run(sql, &plain, false)?;
        best_plain = best_plain.min(s);
        out_plain = n;
        let (s, n) = run(sql, &cdc, true)?;
        best_cdc = best_cdc.min(s);
        out_cdc = n;
    }
    let rate = |s: f64| events as f64 / s;
    println!(
        "{}",
        json!({"bench": "changelog", "events": events, "keys": keys, "sql": sql,
               "append_only_events_per_s": rate(best_plain), "changelog_events_per_s": rate(best_cdc),
               "changelog_vs_append_only": best_plain / best_cdc,
               "append_only_emitted": out_plain, "changelog_emitted": out_cdc})
    );
    Ok(())
}
