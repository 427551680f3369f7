//! One options layer: every named setting of a pipeline, its one default,
//! and one parser. The CLI flags and pipeline file, Python keyword arguments
//! and the SQL tests' `SET name = value` all go through [`Settings::set`],
//! so they cannot disagree on a default or on what a value means.

use std::time::Duration;

use ubik_engine::QueryOptions;
use ubik_engine::time::parse_duration;
use ubik_kafka::EmitMode;

use crate::error::{Result, RuntimeError};

/// What to do with an input record that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// Stop, naming the record's position and the reason.
    #[default]
    Fail,
    /// Count it, log it, go on.
    Skip,
    /// Write it to the dead-letter output with the reason, go on.
    DeadLetter,
}

/// How a setting's value is written, so a caller with typed values (Python)
/// knows how to turn one into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingKind {
    /// `500ms`, `5s`, `10m`, `1h`, `1d`, or `250us`.
    Duration,
    /// A whole number.
    Count,
    /// Bytes: `512MiB`, `2GiB`, `1.5GB`, or a number of bytes.
    Bytes,
    /// One of a few words, or a name.
    Text,
}

/// Every setting: name, kind, and what it means (shown in errors).
pub const SETTINGS: &[(&str, SettingKind, &str)] = &[
    (
        "lateness",
        SettingKind::Duration,
        "watermark delay: rows this far out of order are not late",
    ),
    (
        "retention",
        SettingKind::Duration,
        "how long closed windows accept late rows",
    ),
    (
        "join_retention",
        SettingKind::Duration,
        "how long a join keeps rows past the watermark for late rows to pair with",
    ),
    (
        "emit_interval",
        SettingKind::Duration,
        "event-time grid of late updates and continuous flushes",
    ),
    (
        "emit_every_rows",
        SettingKind::Count,
        "flush a continuous query without event time every this many rows",
    ),
    (
        "max_future",
        SettingKind::Duration,
        "refuse events further than this ahead of the wall clock",
    ),
    (
        "event_time",
        SettingKind::Text,
        "event-time column of continuous and pass-through queries",
    ),
    (
        "threads",
        SettingKind::Count,
        "threads for decoding and folding large batches (0: one per core)",
    ),
    (
        "on_error",
        SettingKind::Text,
        "undecodable input: fail, skip or dlq",
    ),
    ("batch_size", SettingKind::Count, "records per engine batch"),
    (
        "idle_timeout",
        SettingKind::Duration,
        "advance a silent input's watermark after this long (0: never)",
    ),
    (
        "checkpoint_interval",
        SettingKind::Duration,
        "checkpoint at least this often",
    ),
    (
        "checkpoint_every",
        SettingKind::Count,
        "also checkpoint after this many input records",
    ),
    (
        "keep_checkpoints",
        SettingKind::Count,
        "checkpoints kept on disk",
    ),
    (
        "emit",
        SettingKind::Text,
        "Kafka emit mode: transactional or idempotent",
    ),
    (
        "state_ttl",
        SettingKind::Duration,
        "drop a continuous GROUP BY's group whose newest event is this far behind the watermark (0: never)",
    ),
    (
        "ttl_tombstones",
        SettingKind::Text,
        "with state_ttl: retract a dropped group with a tombstone (true or false)",
    ),
    (
        "state_memory",
        SettingKind::Bytes,
        "state held in memory before cold state spills to disk (default: half the machine's memory)",
    ),
    (
        "state_dir",
        SettingKind::Text,
        "directory of spilled and checkpointed state (default: CHECKPOINT/state, or a temporary directory)",
    ),
    (
        "key",
        SettingKind::Text,
        "record key of an append-only result: output columns, comma-separated",
    ),
];

/// The validated settings of a pipeline, with their defaults.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Query semantics (part of a checkpoint's identity, except `threads`).
    pub query: QueryOptions,
    pub on_error: ErrorPolicy,
    /// Records per poll (the engine's batch size).
    pub batch_size: usize,
    /// Advance an idle partition's watermark with the wall clock after this long.
    pub idle_timeout: Option<Duration>,
    /// Records sampled to infer a schema.
    pub infer_sample: usize,
    /// Checkpoint (and commit the sink) at least this often ...
    pub checkpoint_interval: Duration,
    /// ... or after this many input records, whichever comes first.
    pub checkpoint_every: Option<u64>,
    /// Checkpoints kept on disk (older `resume_from` tokens need them).
    pub keep_checkpoints: usize,
    /// Kafka emit mode of a `kafka://` sink.
    pub emit: EmitMode,
    /// Bytes of state held in memory before cold state spills (`None`:
    /// [`default_state_memory`]).
    pub state_memory: Option<u64>,
    /// Where state runs live (`None`: the checkpoint's `state/`, or a
    /// temporary directory without checkpoints).
    pub state_dir: Option<std::path::PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            query: QueryOptions::default(),
            on_error: ErrorPolicy::Fail,
            batch_size: 65_536,
            idle_timeout: Some(Duration::from_secs(30)),
            infer_sample: 1000,
            checkpoint_interval: Duration::from_secs(10),
            checkpoint_every: None,
            keep_checkpoints: 5,
            emit: EmitMode::Transactional,
            state_memory: None,
            state_dir: None,
        }
    }
}

/// The default memory budget for state: half the memory of the machine,
/// or of the container's cgroup limit when that is lower.
pub fn default_state_memory() -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(8 << 30, |kib| kib * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    machine.min(cgroup.unwrap_or(u64::MAX)) / 2
}

/// Parses a size: a number of bytes, or a number with a unit (`KB`, `MB`,
/// `GB`, `TB`: powers of 1000; `KiB`, `MiB`, `GiB`, `TiB`: powers of 1024).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = number * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

fn bad(name: &str, value: &str, expected: &str) -> RuntimeError {
    RuntimeError::Config(format!("{name} = {value:?}: {expected}"))
}

fn duration(name: &str, value: &str) -> Result<Duration> {
    let us = parse_duration(value).filter(|us| *us >= 0).ok_or_else(|| {
        bad(
            name,
            value,
            "not a duration; use e.g. 500ms, 5s, 10m, 1h, 1d",
        )
    })?;
    Ok(Duration::from_micros(us as u64))
}

fn micros(name: &str, value: &str) -> Result<i64> {
    Ok(duration(name, value)?.as_micros() as i64)
}

fn count(name: &str, value: &str, min: u64) -> Result<u64> {
    match value.trim().parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(bad(
            name,
            value,
            &format!("expected a whole number of at least {min}"),
        )),
    }
}

impl Settings {
    /// The kind of setting `name`, or `None` if there is no such setting.
    pub fn kind(name: &str) -> Option<SettingKind> {
        SETTINGS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, k, _)| *k)
    }

    /// Sets `name` (as listed in [`SETTINGS`]; `-` may stand for `_`) from its text.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let name = name.replace('-', "_");
        let name = name.as_str();
        match name {
            "lateness" => self.query.lateness_us = micros(name, value)?,
            "retention" => self.query.retention_us = micros(name, value)?,
            "join_retention" => self.query.join_retention_us = micros(name, value)?,
            "emit_interval" => self.query.emit_interval_us = micros(name, value)?.max(1),
            "emit_every_rows" => self.query.emit_every_rows = count(name, value, 1)? as i64,
            "max_future" => self.query.max_future_us = micros(name, value)?,
            "event_time" => self.query.event_time = Some(value.to_string()),
            "key" => {
                self.query.key = value
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(String::from)
                    .collect()
            }
            "threads" => self.query.threads = count(name, value, 0)? as usize,
            "on_error" => {
                self.on_error = match value {
                    "fail" => ErrorPolicy::Fail,
                    "skip" => ErrorPolicy::Skip,
                    "dlq" | "dead-letter" => ErrorPolicy::DeadLetter,
                    _ => return Err(bad(name, value, "not one of fail, skip, dlq")),
                }
            }
            "batch_size" => self.batch_size = count(name, value, 1)? as usize,
            "idle_timeout" => {
                let d = duration(name, value)?;
                self.idle_timeout = (!d.is_zero()).then_some(d);
            }
            "checkpoint_interval" => self.checkpoint_interval = duration(name, value)?,
            "checkpoint_every" => self.checkpoint_every = Some(count(name, value, 1)?),
            "keep_checkpoints" => self.keep_checkpoints = count(name, value, 1)? as usize,
            "state_ttl" => self.query.state_ttl_us = micros(name, value)?,
            "ttl_tombstones" => {
                self.query.ttl_tombstones = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return Err(bad(name, value, "not one of true, false")),
                }
            }
            "state_memory" => {
                let bytes = parse_bytes(value)
                    .filter(|&b| b >= 1 << 20)
                    .ok_or_else(|| {
                        bad(
                            name,
                            value,
                            "not a size of at least 1MiB; use e.g. 512MiB, 2GiB, 1.5GB",
                        )
                    })?;
                self.state_memory = Some(bytes);
            }
            "state_dir" => self.state_dir = Some(value.into()),
            "emit" => {
                self.emit = match value {
                    "transactional" => EmitMode::Transactional,
                    "idempotent" => EmitMode::Idempotent,
                    _ => return Err(bad(name, value, "not one of transactional, idempotent")),
                }
            }
            _ => {
                let names: Vec<&str> = SETTINGS.iter().map(|(n, _, _)| *n).collect();
                return Err(RuntimeError::Config(format!(
                    "unknown setting {name:?}; settings are: {}",
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_setting_parses_and_bad_values_name_the_setting() {
        for (name, kind, _) in SETTINGS {
            let good = match (name, kind) {
                (&"on_error", _) => "dlq",
                (&"emit", _) => "idempotent",
                (&"ttl_tombstones", _) => "true",
                (_, SettingKind::Duration) => "250ms",
                (_, SettingKind::Count) => "7",
                (_, SettingKind::Bytes) => "64MiB",
                (_, SettingKind::Text) => "ts",
            };
            Settings::default().set(name, good).unwrap();
            if *kind != SettingKind::Text || matches!(*name, "on_error" | "emit" | "ttl_tombstones")
            {
                let e = Settings::default().set(name, "nope").unwrap_err();
                assert!(e.to_string().contains(name), "{e}");
            }
        }
        assert!(Settings::default().set("latenes", "1s").is_err());
    }

    #[test]
    fn values_mean_the_same_everywhere() {
        let mut s = Settings::default();
        s.set("lateness", "5s").unwrap();
        s.set("idle-timeout", "0").unwrap();
        s.set("threads", "0").unwrap();
        assert_eq!(s.query.lateness_us, 5_000_000);
        assert_eq!(s.idle_timeout, None);
        assert_eq!(
            s.query.resolved_threads(),
            s.query.resolved_threads().max(1)
        );
        assert!(s.set("batch_size", "0").is_err());
        s.set("state_memory", "1.5GiB").unwrap();
        assert_eq!(s.state_memory, Some(1_610_612_736));
        assert_eq!(parse_bytes("2GB"), Some(2_000_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert!(s.set("state_memory", "lots").is_err());
        assert!(s.set("state_memory", "1KB").is_err());
        assert!(default_state_memory() > 1 << 20);
        assert!(s.set("lateness", "-1s").is_err());
    }
}
