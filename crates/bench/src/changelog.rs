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
//!
//! A third run reads the changelog under a memory budget of
//! [`BUDGET`] bytes, so the table's current rows and the groups spill to a
//! state store; its changelog must equal the in-memory run's, row by row.
//! `SPILL=0` leaves it out.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use serde_json::json;
use ubik_connector::{Chunk, Payload, RecordMeta};
use ubik_engine::operator::Output;
use ubik_engine::{Catalog, Query, QueryOptions, SharedStore, StateOptions, plan_query};
use ubik_format::json::JsonDecoder;

const CHUNK: usize = 4096;
const ROUNDS: usize = 3;
/// The spilling run's memory budget: well below the rows the table holds.
const BUDGET: usize = 32 << 20;
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

/// What a run did.
struct Run {
    seconds: f64,
    emitted: usize,
    /// A digest of every changelog row emitted, in order.
    digest: u64,
    spilled_bytes: u64,
}

/// One run over `records`, its state spilled to a temporary store beyond
/// `budget` bytes if given.
fn run(sql: &str, records: &[Vec<u8>], changelog: bool, budget: Option<usize>) -> Result<Run> {
    let schema = schema(changelog)?;
    let catalog = Catalog::new().with_table("orders", Arc::clone(&schema));
    let plan = plan_query(sql, &catalog, QueryOptions::default())?;
    let state = StateOptions {
        store: budget.map(|_| SharedStore::temporary(None, Default::default())),
        memory: budget,
    };
    let mut query = Query::with_state(plan, state)?;
    let mut digest = Digest::default();
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
        emitted += digest.add(&out)?;
        out = Output::default();
    }
    query.finish(&mut out)?;
    emitted += digest.add(&out)?;
    Ok(Run {
        seconds: start.elapsed().as_secs_f64(),
        emitted,
        digest: digest.0.finish(),
        spilled_bytes: query.spill_stats().bytes_written,
    })
}

/// Hashes the changelog rows of outputs, in order.
#[derive(Default)]
struct Digest(std::collections::hash_map::DefaultHasher);

impl Digest {
    /// Adds `out`'s rows; returns how many.
    fn add(&mut self, out: &Output) -> Result<usize> {
        let mut n = 0;
        for c in &out.changes {
            let rows = RowConverter::new(
                c.rows
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )?
            .convert_columns(c.rows.columns())?;
            for row in rows.iter() {
                row.as_ref().hash(&mut self.0);
            }
            // Which rows are deletions (not a Debug string: that was a
            // tenth of the run's time).
            match &c.deletes {
                None => 0u8.hash(&mut self.0),
                Some(d) => d.iter().for_each(|v| v.hash(&mut self.0)),
            }
            n += c.rows.num_rows();
        }
        Ok(n)
    }
}

pub fn run_bench(events: u64, keys: u64, sql: Option<&str>) -> Result<()> {
    let sql = sql.unwrap_or(SQL);
    let (cdc, plain) = records(events, keys);
    let (mut best_cdc, mut best_plain, mut best_spill) = (f64::MAX, f64::MAX, f64::MAX);
    let (mut out_cdc, mut out_plain) = (0, 0);
    let mut spilled = 0;
    // SPILL=0: the two in-memory runs alone (the spilling one takes most of the time).
    let spill = std::env::var("SPILL").as_deref() != Ok("0");
    for _ in 0..ROUNDS {
        let plain = run(sql, &plain, false, None)?;
        best_plain = best_plain.min(plain.seconds);
        out_plain = plain.emitted;
        let memory = run(sql, &cdc, true, None)?;
        best_cdc = best_cdc.min(memory.seconds);
        out_cdc = memory.emitted;
        if !spill {
            continue;
        }
        let spilling = run(sql, &cdc, true, Some(BUDGET))?;
        best_spill = best_spill.min(spilling.seconds);
        spilled = spilling.spilled_bytes;
        anyhow::ensure!(
            (spilling.emitted, spilling.digest) == (memory.emitted, memory.digest),
            "the changelog under a {BUDGET}-byte budget differs from the one in memory"
        );
    }
    let rate = |s: f64| events as f64 / s;
    let spilled_rate = spill.then_some(rate(best_spill));
    println!(
        "{}",
        json!({"bench": "changelog", "events": events, "keys": keys, "sql": sql,
               "append_only_events_per_s": rate(best_plain), "changelog_events_per_s": rate(best_cdc),
               "changelog_vs_append_only": best_plain / best_cdc,
               "changelog_spilling_events_per_s": spilled_rate, "spilling_budget_bytes": BUDGET,
               "spilling_vs_memory": spill.then_some(best_cdc / best_spill), "spilled_bytes": spilled,
               "append_only_emitted": out_plain, "changelog_emitted": out_cdc})
    );
    Ok(())
}
