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
}

/// One served path's counters, for [`render`].
pub struct Served<'a> {
    pub path: &'a str,
    pub metrics: &'a Metrics,
    /// The unread (rows, bytes) of the path's buffer.
    pub depth: (u64, u64),
}

/// Writes one metric family: its HELP and TYPE once, then a sample per path.
fn family(
    out: &mut String,
    served: &[Served<'_>],
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Fn(&Served<'_>, &mut Vec<(String, String)>),
) {
    let _ = writeln!(
        out,
        "# HELP ubik_webhook_{name} {help}\n# TYPE ubik_webhook_{name} {kind}"
    );
    let mut lines = Vec::new();
    for s in served {
        lines.clear();
        samples(s, &mut lines);
        for (suffix_labels, value) in &lines {
            // `suffix_labels` is `[_suffix]{label="v",` (open) or empty.
            let (suffix, labels) = suffix_labels
                .split_once('{')
                .unwrap_or((suffix_labels.as_str(), ""));
            let _ = writeln!(
                out,
                "ubik_webhook_{name}{suffix}{{{labels}path=\"{}\"}} {value}",
                s.path
            );
        }
    }
}

/// A plain counter: its name, help and value.
type Counter = (&'static str, &'static str, fn(&Metrics) -> u64);

/// Prometheus text for every path a listener serves, labelled by `path`.
pub fn render(served: &[Served<'_>]) -> String {
    let mut out = String::new();
    family(
        &mut out,
        served,
        "requests_total",
        "counter",
        "HTTP requests by status.",
        |s, l| {
            if let Ok(m) = s.metrics.requests.lock() {
                l.extend(
                    m.iter()
                        .map(|(st, n)| (format!("{{status=\"{st}\","), n.to_string())),
                );
            }
        },
    );
    family(
        &mut out,
        served,
        "rejects_total",
        "counter",
        "Refused requests by reason.",
        |s, l| {
            if let Ok(m) = s.metrics.rejects.lock() {
                l.extend(
                    m.iter()
                        .map(|(r, n)| (format!("{{reason=\"{r}\","), n.to_string())),
                );
            }
        },
    );
    let counters: [Counter; 4] = [
        ("events_total", "Events durably appended.", |m| {
            m.events.load(Ordering::Relaxed)
        }),
        (
            "duplicate_events_total",
            "Events acknowledged but not stored again (dedupe).",
            |m| m.duplicates.load(Ordering::Relaxed),
        ),
        ("bytes_total", "Payload bytes durably appended.", |m| {
            m.bytes.load(Ordering::Relaxed)
        }),
        (
            "group_commits_total",
            "fsyncs, each shared by the requests waiting for it.",
            |m| m.group_commits.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        family(&mut out, served, name, "counter", help, |s, l| {
            l.push((String::new(), value(s.metrics).to_string()));
        });
    }
    family(
        &mut out,
        served,
        "fsync_seconds",
        "histogram",
        "Latency of the buffer's fsync.",
        |s, l| {
            let m = s.metrics;
            for (i, b) in FSYNC_BUCKETS.iter().enumerate() {
                l.push((
                    format!("_bucket{{le=\"{b}\","),
                    m.fsync_buckets[i].load(Ordering::Relaxed).to_string(),
                ));
            }
            let count = m.fsync_count.load(Ordering::Relaxed);
            l.push(("_bucket{le=\"+Inf\",".into(), count.to_string()));
            let sum = m.fsync_micros.load(Ordering::Relaxed) as f64 / 1e6;
            l.push(("_sum".into(), sum.to_string()));
            l.push(("_count".into(), count.to_string()));
        },
    );
    family(
        &mut out,
        served,
        "buffer_events",
        "gauge",
        "Events buffered and not yet read by the pipeline.",
        |s, l| l.push((String::new(), s.depth.0.to_string())),
    );
    family(
        &mut out,
        served,
        "buffer_bytes",
        "gauge",
        "Payload bytes buffered and not yet read.",
        |s, l| l.push((String::new(), s.depth.1.to_string())),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_is_labelled_by_its_path_and_each_family_described_once() {
        let (a, b) = (Metrics::default(), Metrics::default());
        a.request(200);
        a.events.fetch_add(3, Ordering::Relaxed);
        b.reject("decode");
        b.fsync(Duration::from_micros(700));
        let text = render(&[
            Served {
                path: "/a",
                metrics: &a,
                depth: (1, 10),
            },
            Served {
                path: "/b",
                metrics: &b,
                depth: (0, 0),
            },
        ]);
        assert!(
            text.contains("ubik_webhook_requests_total{status=\"200\",path=\"/a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_rejects_total{reason=\"decode\",path=\"/b\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_events_total{path=\"/a\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_events_total{path=\"/b\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_fsync_seconds_bucket{le=\"0.001\",path=\"/b\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_fsync_seconds_count{path=\"/b\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ubik_webhook_buffer_bytes{path=\"/a\"} 10"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE ubik_webhook_events_total ").count(), 1);
    }
}
