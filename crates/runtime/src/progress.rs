//! Progress on stderr: a one-line bar when stderr is a terminal, periodic
//! log lines (events/s, watermark, state) otherwise. The CLI's `run` and
//! Python's bounded `stream()` share it.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use tracing::info;
use ubik_engine::time::{MAX_TIME, MIN_TIME, write_rfc3339_micros};

use crate::pipeline::Stats;
use crate::spec::{Endpoint, PipelineSpec};

pub struct Progress {
    terminal: bool,
    quiet: bool,
    last_records: u64,
    last_bytes: u64,
    last_at: Instant,
    /// When the last log line (non-terminals) was written.
    last_log: Option<Instant>,
    total: Option<Total>,
    /// The rate of the last report, for the final line.
    last_rate: (f64, f64),
}

/// Log lines (non-terminals) come at most this often.
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

fn ts(t: i64) -> String {
    match t {
        MIN_TIME => "-".into(),
        MAX_TIME => "end".into(),
        t => {
            let mut b = Vec::new();
            write_rfc3339_micros(&mut b, t);
            String::from_utf8_lossy(&b[..19]).into_owned()
        }
    }
}

fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// How much a bounded run reads, when known up front.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Total {
    /// A file's size: progress is the bytes read of it.
    Bytes(u64),
    /// A demo source's count: progress is the records read of it.
    Records(u64),
    /// A Kafka source with `end=`: what is read plus the lag behind the end.
    Lag,
    /// A bounded input read to its end.
    Ended,
}

impl Total {
    /// What a run of `spec` reads, when it is known before it starts: a
    /// file's size, a demo's count, or a Kafka source's lag behind its end
    /// (`end=`, or `bounded`: a one-shot run that ends where the topic stood).
    pub fn of(spec: &PipelineSpec, bounded: bool) -> Option<Total> {
        match spec.sources.as_slice() {
            [one] => match &one.endpoint {
                Endpoint::File(p) => std::fs::metadata(p).ok().map(|m| Total::Bytes(m.len())),
                Endpoint::Demo { options, .. } if options.count > 0 => {
                    Some(Total::Records(options.count))
                }
                Endpoint::Kafka(url) if bounded || url.contains("end=") => Some(Total::Lag),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Progress toward a known total: the fraction done, and the seconds left
/// at `rate` (of the same unit), when they can be told.
fn done_and_eta(
    s: &Stats,
    total: Option<Total>,
    rate: f64,
    byte_rate: f64,
) -> Option<(f64, Option<f64>)> {
    let (done, all, per_s) = match total? {
        Total::Bytes(t) => (s.bytes_in as f64, t as f64, byte_rate),
        Total::Records(t) => (s.records_in as f64, t as f64, rate),
        Total::Lag => {
            let lag = s.lag? as f64;
            (s.records_in as f64, s.records_in as f64 + lag, rate)
        }
        Total::Ended => return Some((1.0, Some(0.0))),
    };
    if all <= 0.0 {
        return None;
    }
    let fraction = (done / all).clamp(0.0, 1.0);
    let eta = (per_s > 0.0).then(|| (all - done).max(0.0) / per_s);
    Some((fraction, eta))
}

fn duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The terminal line: a bar, percentage and ETA when the total is known,
/// then the same figures as the log lines.
fn line(s: &Stats, total: Option<Total>, rate: f64, byte_rate: f64) -> String {
    let bar = match done_and_eta(s, total, rate, byte_rate) {
        Some((f, eta)) => {
            let filled = (f * 30.0) as usize;
            format!(
                "[{}{}] {:>3.0}% {} ",
                "=".repeat(filled),
                " ".repeat(30 - filled),
                f * 100.0,
                eta.map_or_else(|| "ETA -".to_string(), |e| format!("ETA {}", duration(e)))
            )
        }
        None => String::new(),
    };
    let lag = match (s.lag, total) {
        (Some(l), None) => format!("  lag {}", human(l as f64)),
        _ => String::new(),
    };
    format!(
        "{bar}{} records ({}/s)  {} changes  watermark {}  {} keys{lag}",
        human(s.records_in as f64),
        human(rate),
        human(s.changes_out as f64),
        ts(s.watermark),
        human(s.state_keys as f64),
    )
}

impl Progress {
    /// The bar alone, when stderr is a terminal (`None` otherwise): for a
    /// library's caller, whose logs are not ours to write.
    pub fn bar_on_terminal(total: Option<Total>) -> Option<Self> {
        std::io::stderr()
            .is_terminal()
            .then(|| Self::new(false, total))
    }

    pub fn new(quiet: bool, total: Option<Total>) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            quiet,
            last_records: 0,
            last_bytes: 0,
            last_at: Instant::now(),
            last_log: None,
            total,
            last_rate: (0.0, 0.0),
        }
    }

    pub fn report(&mut self, s: &Stats) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let rate = (s.records_in - self.last_records) as f64 / dt;
        let byte_rate = (s.bytes_in - self.last_bytes) as f64 / dt;
        self.last_records = s.records_in;
        self.last_bytes = s.bytes_in;
        self.last_at = now;
        self.last_rate = (rate, byte_rate);
        if self.terminal {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r{}   ", line(s, self.total, rate, byte_rate));
            let _ = err.flush();
        } else if self
            .last_log
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            self.last_log = Some(now);
            let eta = done_and_eta(s, self.total, rate, byte_rate);
            info!(
                records = s.records_in,
                events_per_s = rate.round(),
                changes = s.changes_out,
                watermark = %ts(s.watermark),
                lag = s.lag.map_or_else(|| "unknown".to_string(), |l| l.to_string()),
                done = eta.map_or_else(|| "unknown".to_string(), |(f, _)| format!("{:.1}%", f * 100.0)),
                eta = eta.and_then(|(_, e)| e).map_or_else(|| "unknown".to_string(), duration),
                dead_letters = s.dead_letters,
                commit_latency_ms = format!("{:.1}", s.commit_latency_last_ms),
                "progress"
            );
        }
    }

    /// Ends the bar's line (at 100% when the input was `read_all`) and logs the totals.
    pub fn finish(&mut self, s: &Stats, read_all: bool) {
        if self.quiet {
            return;
        }
        if self.terminal {
            // The input ended: all of the total is read, whatever the
            // transport counted (a file's last bytes may be a newline).
            let (rate, byte_rate) = self.last_rate;
            let total = self.total.map(|t| if read_all { Total::Ended } else { t });
            eprintln!("\r{}   ", line(s, total, rate, byte_rate));
        }
        let secs = s.started.elapsed().as_secs_f64();
        info!(
            records = s.records_in,
            changes = s.changes_out,
            dead_letters = s.dead_letters,
            decode_errors = s.decode_errors,
            seconds = format!("{secs:.2}"),
            events_per_s = (s.records_in as f64 / secs.max(1e-9)).round(),
            commit_latency_max_ms = format!("{:.1}", s.commit_latency_max_ms),
            "done"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_percentage_and_eta_follow_the_total() {
        let s = Stats {
            records_in: 2_500,
            bytes_in: 250_000,
            lag: Some(7_500),
            ..Stats::default()
        };
        // A quarter of the file read, 50 000 bytes/s: 15 s to go.
        let l = line(&s, Some(Total::Bytes(1_000_000)), 500.0, 50_000.0);
        assert!(
            l.starts_with("[=======                       ]  25% ETA 15s 2.5k records (500/s)"),
            "{l}"
        );
        // The lag behind a Kafka end: 7 500 of 10 000 left at 500/s.
        let l = line(&s, Some(Total::Lag), 500.0, 0.0);
        assert!(l.contains(" 25% ETA 15s "), "{l}");
        let l = line(&s, Some(Total::Records(10_000)), 0.0, 0.0);
        assert!(l.contains(" 25% ETA - "), "{l}");
        // Unbounded: no bar, the lag instead.
        let l = line(&s, None, 100.0, 0.0);
        assert!(!l.contains('%') && l.ends_with("lag 7.5k"), "{l}");
        assert_eq!(duration(3725.0), "1h02m");
        assert_eq!(duration(75.0), "1m15s");
    }
}
