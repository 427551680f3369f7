//! `--metrics ADDR`: the pipeline's counters in Prometheus text format at
//! `/metrics`, and a live status page at `/` (one static HTML file that
//! polls `/status.json`: the plan, events/s in and out over the last ten
//! minutes, watermark and rows per source partition, state per operator,
//! checkpoints, dead letters by reason and the last error).

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use anyhow::{Result, anyhow};
use serde_json::{Value, json};
use ubik_engine::time::{MAX_TIME, MIN_TIME};
use ubik_runtime::Stats;

/// The page served at `/`.
const STATUS_PAGE: &str = include_str!("status.html");

/// Samples of the counters kept for the page's chart (one per report).
const HISTORY: usize = 600;

/// The latest counters and their recent history, shared with the server thread.
#[derive(Clone, Default)]
pub struct Metrics(Arc<Mutex<Shared>>);

#[derive(Default)]
struct Shared {
    stats: Option<Stats>,
    /// (seconds since start, records in, changes out).
    history: VecDeque<(f64, u64, u64)>,
    /// What runs: sources, operator, key, sink.
    plan: Value,
}

fn ms(t: i64) -> Value {
    match t {
        MIN_TIME => Value::Null,
        MAX_TIME => json!("end"),
        t => json!(t / 1000),
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Metrics {
    /// Describes the pipeline for the status page.
    pub fn set_plan(&self, plan: Value) {
        if let Ok(mut s) = self.0.lock() {
            s.plan = plan;
        }
    }

    pub fn update(&self, stats: &Stats) {
        if let Ok(mut s) = self.0.lock() {
            let t = stats.started.elapsed().as_secs_f64();
            s.history
                .push_back((t, stats.records_in, stats.changes_out));
            if s.history.len() > HISTORY {
                s.history.pop_front();
            }
            s.stats = Some(stats.clone());
        }
    }

    /// The status page's data.
    fn status(&self) -> Value {
        let Ok(guard) = self.0.lock() else {
            return Value::Null;
        };
        let Some(s) = guard.stats.as_ref() else {
            return json!({ "plan": guard.plan, "started": false });
        };
        let now = SystemTime::now();
        json!({
            "plan": guard.plan,
            "started": true,
            "uptime_s": s.started.elapsed().as_secs_f64(),
            "totals": {
                "records_in": s.records_in,
                "bytes_in": s.bytes_in,
                "changes_out": s.changes_out,
                "dead_letters": s.dead_letters,
                "late_rows": s.late_rows,
                "decode_errors": s.decode_errors,
            },
            "watermark_ms": ms(s.watermark),
            "lag": s.lag,
            "partitions": s.partitions.iter().map(|p| json!({
                "source": p.source,
                "partition": p.partition,
                "watermark_ms": ms(p.watermark),
                "rows": p.rows,
            })).collect::<Vec<_>>(),
            "operators": s.operators.iter().map(|o| json!({
                "name": o.name, "bytes": o.bytes, "keys": o.keys,
            })).collect::<Vec<_>>(),
            "store_disk_bytes": s.store_disk_bytes,
            "stages": s.stages.iter().map(|g| json!({
                "name": g.name, "reads": g.reads, "writes": g.writes, "key": g.key,
                "tasks": g.tasks, "here": g.here,
                "records_in": g.records_in, "cpu_s": g.cpu_seconds,
            })).collect::<Vec<_>>(),
            "cpu_s": s.cpu_seconds,
            "checkpoint": {
                "count": s.checkpoints,
                "last_ms": s.last_checkpoint_ms,
                "last_pause_ms": s.last_checkpoint_pause_ms,
                "last_bytes": s.last_checkpoint_bytes,
                "age_s": s.last_checkpoint_at
                    .and_then(|t| now.duration_since(t).ok())
                    .map(|d| d.as_secs_f64()),
                "state_bytes": s.state_bytes,
                "state_keys": s.state_keys,
                "commit_latency_ms": s.commit_latency_last_ms,
            },
            "dead_letters": {
                "by_reason": s.dead_letter_reasons,
                "last": s.last_dead_letter,
            },
            "last_error": s.last_error.as_ref().map(|(at, e)| json!({
                "at_ms": unix_ms(*at), "message": e,
            })),
            "history": guard.history.iter().map(|h| json!([h.0, h.1, h.2])).collect::<Vec<_>>(),
        })
    }

    fn render(&self) -> String {
        let Ok(guard) = self.0.lock() else {
            return String::new();
        };
        let Some(s) = guard.stats.as_ref() else {
            return String::new();
        };
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP ubik_{name} {help}\n# TYPE ubik_{name} {kind}\nubik_{name} {value}"
            );
        };
        metric(
            "records_in_total",
            "counter",
            "Input records read.",
            s.records_in as f64,
        );
        metric(
            "bytes_in_total",
            "counter",
            "Input bytes read.",
            s.bytes_in as f64,
        );
        metric(
            "changes_out_total",
            "counter",
            "Changelog records emitted.",
            s.changes_out as f64,
        );
        metric(
            "decode_errors_total",
            "counter",
            "Input records that did not decode.",
            s.decode_errors as f64,
        );
        metric(
            "dead_letters_total",
            "counter",
            "Records written to the dead-letter output.",
            s.dead_letters as f64,
        );
        metric(
            "late_rows_total",
            "counter",
            "Rows later than the retention bound.",
            s.late_rows as f64,
        );
        metric(
            "cpu_seconds_total",
            "counter",
            "CPU seconds of the pipeline's own threads in their turns and commits.",
            s.cpu_seconds,
        );
        metric(
            "checkpoints_total",
            "counter",
            "Checkpoints written.",
            s.checkpoints as f64,
        );
        metric(
            "checkpoint_duration_ms",
            "gauge",
            "Duration of the last checkpoint, from the freeze until it is current.",
            s.last_checkpoint_ms,
        );
        metric(
            "checkpoint_pause_ms",
            "gauge",
            "How long the last checkpoint held the pipeline (freezing the state).",
            s.last_checkpoint_pause_ms,
        );
        metric(
            "state_bytes",
            "gauge",
            "Bytes of the last checkpointed state.",
            s.state_bytes as f64,
        );
        metric(
            "state_keys",
            "gauge",
            "(group, window) keys held in state.",
            s.state_keys as f64,
        );
        metric(
            "commit_latency_ms",
            "gauge",
            "Emit-to-commit latency of the last committed epoch (its oldest record).",
            s.commit_latency_last_ms,
        );
        metric(
            "commit_latency_max_ms",
            "gauge",
            "Largest emit-to-commit latency so far.",
            s.commit_latency_max_ms,
        );
        if s.watermark > i64::MIN && s.watermark < i64::MAX {
            metric(
                "watermark_seconds",
                "gauge",
                "Global event-time watermark.",
                s.watermark as f64 / 1e6,
            );
        }
        if let Some(lag) = s.lag {
            metric(
                "consumer_lag",
                "gauge",
                "Records in the source not read yet.",
                lag as f64,
            );
        }
        let mut labelled = |name: &str, help: &str, rows: Vec<(String, f64)>| {
            if rows.is_empty() {
                return;
            }
            let _ = writeln!(out, "# HELP ubik_{name} {help}\n# TYPE ubik_{name} gauge");
            for (labels, value) in rows {
                let _ = writeln!(out, "ubik_{name}{{{labels}}} {value}");
            }
        };
        labelled(
            "partition_watermark_seconds",
            "Event-time watermark of each source partition.",
            s.partitions
                .iter()
                .filter(|p| p.watermark > MIN_TIME && p.watermark < MAX_TIME)
                .map(|p| {
                    (
                        format!("source=\"{}\",partition=\"{}\"", p.source, p.partition),
                        p.watermark as f64 / 1e6,
                    )
                })
                .collect(),
        );
        labelled(
            "operator_state_bytes",
            "State each operator holds in memory.",
            s.operators
                .iter()
                .map(|o| (format!("operator=\"{}\"", o.name), o.bytes as f64))
                .collect(),
        );
        labelled(
            "stage_cpu_seconds",
            "CPU seconds this member's tasks of each stage used in their turns and commits.",
            s.stages
                .iter()
                .enumerate()
                .map(|(i, g)| (format!("stage=\"{i}\""), g.cpu_seconds))
                .collect(),
        );
        labelled(
            "dead_letters_by_reason",
            "Dead letters by reason.",
            s.dead_letter_reasons
                .iter()
                .map(|(r, n)| (format!("reason=\"{r}\""), *n as f64))
                .collect(),
        );
        out
    }

    /// Serves `/`, `/status.json` and `/metrics` on `addr` from a background
    /// thread for the life of the process.
    pub fn serve(&self, addr: &str) -> Result<()> {
        let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("--metrics {addr}: {e}"))?;
        let metrics = self.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let started = Instant::now();
                for request in server.incoming_requests() {
                    let path = request.url().split('?').next().unwrap_or("").to_string();
                    let (status, kind, body) = match path.as_str() {
                        "/metrics" => (200, "text/plain; version=0.0.4", metrics.render()),
                        "/status.json" => {
                            let mut v = metrics.status();
                            v["served_after_s"] = json!(started.elapsed().as_secs_f64());
                            (200, "application/json", v.to_string())
                        }
                        "/" | "/index.html" => {
                            (200, "text/html; charset=utf-8", STATUS_PAGE.to_string())
                        }
                        _ => (
                            404,
                            "text/plain",
                            "not found: try /, /status.json or /metrics\n".into(),
                        ),
                    };
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", kind).expect("static header");
                    let _ = request.respond(
                        tiny_http::Response::from_string(body)
                            .with_status_code(status)
                            .with_header(header),
                    );
                }
            })?;
        Ok(())
    }
}
