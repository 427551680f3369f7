//! Progress on stderr: a one-line bar when stderr is a terminal, periodic
//! log lines (events/s, watermark, state) otherwise.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use tracing::info;
use ubik_engine::time::{MAX_TIME, MIN_TIME, write_rfc3339_micros};
use ubik_runtime::Stats;

pub struct Progress {
    terminal: bool,
    quiet: bool,
    last_records: u64,
    last_at: Instant,
    total_bytes: Option<u64>,
}

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

impl Progress {
    pub fn new(quiet: bool, total_bytes: Option<u64>) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            quiet,
            last_records: 0,
            last_at: Instant::now(),
            total_bytes,
        }
    }

    pub fn report(&mut self, s: &Stats) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let rate = (s.records_in - self.last_records) as f64 / dt;
        self.last_records = s.records_in;
        self.last_at = now;
        if self.terminal {
            let bar = match self.total_bytes.filter(|&t| t > 0) {
                Some(total) => {
                    let f = (s.bytes_in as f64 / total as f64).min(1.0);
                    let filled = (f * 30.0) as usize;
                    format!(
                        "[{}{}] {:>3.0}% ",
                        "=".repeat(filled),
                        " ".repeat(30 - filled),
                        f * 100.0
                    )
                }
                None => String::new(),
            };
            let mut err = std::io::stderr();
            let _ = write!(
                err,
                "\r{bar}{} records ({}/s)  {} changes  watermark {}  {} keys   ",
                human(s.records_in as f64),
                human(rate),
                human(s.changes_out as f64),
                ts(s.watermark),
                human(s.state_keys as f64),
            );
            let _ = err.flush();
        } else {
            info!(
                records = s.records_in,
                events_per_s = rate.round(),
                changes = s.changes_out,
                watermark = %ts(s.watermark),
                lag = s.lag.map_or_else(|| "unknown".to_string(), |l| l.to_string()),
                dead_letters = s.dead_letters,
                commit_latency_ms = format!("{:.1}", s.commit_latency_last_ms),
                "progress"
            );
        }
    }

    pub fn finish(&mut self, s: &Stats) {
        if self.quiet {
            return;
        }
        if self.terminal {
            eprintln!();
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
