//! Counters of the webhook endpoint, served as Prometheus text on `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the fsync latency histogram.
const FSYNC_BUCKETS: [f64; 10] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0];

#[derive(Default)]
pub struct Metrics {
    pub requests: Mutex<BTreeMap<u16, u64>>,
    pub rejects: Mutex<BTreeMap<&'static str, u64>>,
    pub events: AtomicU64,
    pub duplicates: AtomicU64,
    pub bytes: AtomicU64,
    fsync_buckets: [AtomicU64; 10],
    fsync_count: AtomicU64,
    fsync_micros: AtomicU64,
    pub group_commits: AtomicU64,
}

impl Metrics {
    pub fn request(&self, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    pub fn reject(&self, reason: &'static str) {
        if let Ok(mut m) = self.rejects.lock() {
            *m.entry(reason).or_default() += 1;
        }
    }

    pub fn fsync(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in FSYNC_BUCKETS.iter().enumerate() {
            if s <= *b {
                self.fsync_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.fsync_count.fetch_add(1, Ordering::Relaxed);
        self.fsync_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Prometheus text; `depth` is the unread (rows, bytes) of the buffer.
    pub fn render(&self, depth: (u64, u64)) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP ubik_webhook_requests_total HTTP requests by status.\n# TYPE ubik_webhook_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for (status, n) in m.iter() {
                let _ = writeln!(
                    out,
                    "ubik_webhook_requests_total{{status=\"{status}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ubik_webhook_rejects_total Refused requests by reason.\n# TYPE ubik_webhook_rejects_total counter"
        );
        if let Ok(m) = self.rejects.lock() {
            for (reason, n) in m.iter() {
                let _ = writeln!(out, "ubik_webhook_rejects_total{{reason=\"{reason}\"}} {n}");
            }
        }
        let counters = [
            (
                "events_total",
                "Events durably appended.",
                self.events.load(Ordering::Relaxed),
            ),
            (
                "duplicate_events_total",
                "Events acknowledged but not stored again (dedupe).",
                self.duplicates.load(Ordering::Relaxed),
            ),
            (
                "bytes_total",
                "Payload bytes durably appended.",
                self.bytes.load(Ordering::Relaxed),
            ),
            (
                "group_commits_total",
                "fsyncs, each shared by the requests waiting for it.",
                self.group_commits.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP ubik_webhook_{name} {help}\n# TYPE ubik_webhook_{name} counter\nubik_webhook_{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP ubik_webhook_fsync_seconds Latency of the buffer's fsync.\n# TYPE ubik_webhook_fsync_seconds histogram"
        );
        for (i, b) in FSYNC_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "ubik_webhook_fsync_seconds_bucket{{le=\"{b}\"}} {}",
                self.fsync_buckets[i].load(Ordering::Relaxed)
            );
        }
        let count = self.fsync_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "ubik_webhook_fsync_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "ubik_webhook_fsync_seconds_sum {}",
            self.fsync_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "ubik_webhook_fsync_seconds_count {count}");
        let _ = writeln!(
            out,
            "# HELP ubik_webhook_buffer_events Events buffered and not yet read by the pipeline.\n# TYPE ubik_webhook_buffer_events gauge\nubik_webhook_buffer_events {}",
            depth.0
        );
        let _ = writeln!(
            out,
            "# HELP ubik_webhook_buffer_bytes Payload bytes buffered and not yet read.\n# TYPE ubik_webhook_buffer_bytes gauge\nubik_webhook_buffer_bytes {}",
            depth.1
        );
        out
    }
}
