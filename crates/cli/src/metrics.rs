//! `--metrics ADDR`: the pipeline's counters in Prometheus text format.

use std::fmt::Write;
use std::sync::{Arc, Mutex};

use anyhow::{Result, anyhow};
use ubik_runtime::Stats;

/// The latest counters, shared with the server thread.
#[derive(Clone, Default)]
pub struct Metrics(Arc<Mutex<Option<Stats>>>);

impl Metrics {
    pub fn update(&self, stats: &Stats) {
        if let Ok(mut s) = self.0.lock() {
            *s = Some(stats.clone());
        }
    }

    fn render(&self) -> String {
        let Ok(guard) = self.0.lock() else {
            return String::new();
        };
        let Some(s) = guard.as_ref() else {
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
            "checkpoints_total",
            "counter",
            "Checkpoints written.",
            s.checkpoints as f64,
        );
        metric(
            "checkpoint_duration_ms",
            "gauge",
            "Duration of the last checkpoint.",
            s.last_checkpoint_ms,
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
        out
    }

    /// Serves `/metrics` on `addr` from a background thread for the life of the process.
    pub fn serve(&self, addr: &str) -> Result<()> {
        let server = tiny_http::Server::http(addr).map_err(|e| anyhow!("--metrics {addr}: {e}"))?;
        let metrics = self.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for request in server.incoming_requests() {
                    let body = metrics.render();
                    let header =
                        tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
                            .expect("static header");
                    let _ =
                        request.respond(tiny_http::Response::from_string(body).with_header(header));
                }
            })?;
        Ok(())
    }
}
