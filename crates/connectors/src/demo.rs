//! `demo://orders`: a deterministic order stream, so the first command of
//! the README runs without a broker. Records look like the benchmark data:
//! `{"merchant":"m0042","ts":"2026-01-01T00:00:01.250Z","amount":123.45}`.
//!
//! URL options (all optional): `count` (records; 0 = unbounded, default
//! 100000), `rate` (records per second of event time, default 100),
//! `keys` (merchants, default 50), `disorder` (fraction of records up to
//! `jitter` seconds out of order, default 0.05), `jitter` (default 2),
//! `late` (fraction arriving 30–90 s late, default 0.001), `seed`
//! (default 42), `realtime` (1: pace records at `rate` per wall-clock second),
//! `skew` (0 to <1, default 0 = uniform: with s > 0 the merchant of a record
//! is `floor(keys * u^(1/(1-s)))` for uniform `u`, so low numbers are hot;
//! at 0.9, 1% of the merchants get 63% of the records).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde_json::json;
use ubik_connector::time::write_rfc3339_micros;
use ubik_connector::{Chunk, ConnectorError, Payload, Source, SourceEvent, SourcePosition};

/// 2026-01-01T00:00:00Z in milliseconds.
const START_MS: i64 = 1_767_225_600_000;

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub count: u64,
    pub rate: f64,
    pub keys: u64,
    pub disorder: f64,
    pub jitter_s: f64,
    pub late: f64,
    pub seed: u64,
    pub realtime: bool,
    pub skew: f64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            count: 100_000,
            rate: 100.0,
            keys: 50,
            disorder: 0.05,
            jitter_s: 2.0,
            late: 0.001,
            seed: 42,
            realtime: false,
            skew: 0.0,
        }
    }
}

impl DemoOptions {
    /// Parses `key=value&...` query options.
    pub fn parse(query: &str) -> Result<Self, ConnectorError> {
        let mut o = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = || ConnectorError::Config(format!("demo:// option {k}={v:?} is not valid"));
            match k {
                "count" => o.count = v.parse().map_err(|_| bad())?,
                "rate" => o.rate = v.parse().map_err(|_| bad())?,
                "keys" => o.keys = v.parse().map_err(|_| bad())?,
                "disorder" => o.disorder = v.parse().map_err(|_| bad())?,
                "jitter" => o.jitter_s = v.parse().map_err(|_| bad())?,
                "late" => o.late = v.parse().map_err(|_| bad())?,
                "seed" => o.seed = v.parse().map_err(|_| bad())?,
                "realtime" => o.realtime = matches!(v, "1" | "true" | "yes"),
                "skew" => o.skew = v.parse().map_err(|_| bad())?,
                _ => {
                    return Err(ConnectorError::Config(format!(
                        "unknown demo:// option '{k}' (known: count, rate, keys, disorder, jitter, late, seed, realtime, skew)"
                    )));
                }
            }
        }
        if !(0.0..1.0).contains(&o.skew) {
            return Err(ConnectorError::Config(format!(
                "demo:// skew={} is out of range: use 0 (uniform) up to below 1 (0.9: 1% of the keys get 63% of the records)",
                o.skew
            )));
        }
        if o.rate <= 0.0 || o.keys == 0 {
            return Err(ConnectorError::Config(
                "demo:// needs rate > 0 and keys > 0".into(),
            ));
        }
        Ok(o)
    }
}

pub struct DemoSource {
    table: String,
    options: DemoOptions,
    next: u64,
    /// Wall-clock start of pacing and the record it started at (`realtime`).
    started: Option<(Instant, u64)>,
    ended: bool,
}

impl DemoSource {
    pub fn new(table: &str, options: DemoOptions) -> Self {
        Self {
            table: table.to_string(),
            options,
            next: 0,
            started: None,
            ended: false,
        }
    }

    pub fn demo_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("amount", DataType::Float64, true),
        ]))
    }

    /// Writes record `i`; a pure function of (i, options).
    fn write_record(&self, i: u64, out: &mut Vec<u8>) {
        let o = &self.options;
        let mut r = SplitMix(o.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let merchant = if o.skew > 0.0 {
            let hot = r.unit().powf(1.0 / (1.0 - o.skew));
            ((o.keys as f64 * hot) as u64).min(o.keys - 1)
        } else {
            r.next() % o.keys
        };
        let amount = (r.next() % 50_000) as f64 / 100.0;
        let mut ts_ms = START_MS + (i as f64 * 1000.0 / o.rate) as i64;
        let u = r.unit();
        if u < o.late {
            ts_ms -= 30_000 + (r.unit() * 60_000.0) as i64;
        } else if u < o.late + o.disorder {
            ts_ms -= (r.unit() * o.jitter_s * 1000.0) as i64;
        }
        out.extend_from_slice(b"{\"merchant\":\"m");
        out.extend_from_slice(format!("{merchant:04}").as_bytes());
        out.extend_from_slice(b"\",\"ts\":\"");
        let mut ts = Vec::with_capacity(32);
        write_rfc3339_micros(&mut ts, ts_ms * 1000);
        // Milliseconds are enough for the demo: drop the last three digits.
        out.extend_from_slice(&ts[..23]);
        out.extend_from_slice(b"Z\",\"amount\":");
        out.extend_from_slice(format!("{amount}").as_bytes());
        out.push(b'}');
    }
}

/// SplitMix64: tiny, fast, and the same on every platform.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Source for DemoSource {
    fn table(&self) -> &str {
        &self.table
    }

    fn schema(&self) -> Option<SchemaRef> {
        Some(Self::demo_schema())
    }

    fn partitions(&self) -> Vec<u32> {
        vec![0]
    }

    fn poll(
        &mut self,
        max_records: usize,
        timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        let o = &self.options;
        if o.count > 0 && self.next >= o.count {
            if self.ended {
                return Ok(SourceEvent::End);
            }
            self.ended = true;
            return Ok(SourceEvent::PartitionEnd(0));
        }
        let mut upto = if o.count > 0 { o.count } else { u64::MAX };
        upto = upto.min(self.next + max_records.max(1) as u64);
        if o.realtime {
            let next = self.next;
            let (started, from) = *self.started.get_or_insert_with(|| (Instant::now(), next));
            let due = from + (started.elapsed().as_secs_f64() * o.rate) as u64 + 1;
            if due <= self.next {
                std::thread::sleep(timeout.min(Duration::from_secs_f64(1.0 / o.rate)));
                return Ok(SourceEvent::Idle);
            }
            upto = upto.min(due);
        }
        let n = (upto - self.next) as usize;
        let mut data = Vec::with_capacity(n * 72);
        let mut spans = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        for i in self.next..upto {
            let start = data.len();
            self.write_record(i, &mut data);
            spans.push(start..data.len());
            positions.push(i);
        }
        self.next = upto;
        Ok(SourceEvent::Chunk(Chunk {
            partition: 0,
            payload: Payload::Bytes { data, spans },
            positions,
            position_name: "record",
            meta: Default::default(),
        }))
    }

    fn position(&self) -> SourcePosition {
        json!({ "next": self.next, "ended": self.ended })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        self.next = position["next"].as_u64().unwrap_or(0);
        self.ended = position["ended"].as_bool().unwrap_or(false);
        Ok(())
    }

    fn sample(&mut self, n: usize) -> Result<Vec<Vec<u8>>, ConnectorError> {
        Ok((0..n as u64)
            .map(|i| {
                let mut b = Vec::new();
                self.write_record(i, &mut b);
                b
            })
            .collect())
    }

    fn describe(&self) -> String {
        format!("demo://{} ({} records)", self.table, self.options.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merchants(query: &str, n: u64) -> Vec<u64> {
        let source = DemoSource::new("orders", DemoOptions::parse(query).unwrap());
        (0..n)
            .map(|i| {
                let mut out = Vec::new();
                source.write_record(i, &mut out);
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                v["merchant"].as_str().unwrap()[1..].parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn skew_concentrates_records_on_low_keys() {
        let keys = 10_000;
        let hot = |m: &[u64]| m.iter().filter(|&&k| k < keys / 100).count() as f64 / m.len() as f64;
        let uniform = merchants(&format!("keys={keys}"), 20_000);
        let skewed = merchants(&format!("keys={keys}&skew=0.9"), 20_000);
        // 1% of the keys: about 1% of the records uniformly, 0.01^0.1 = 63% at skew 0.9.
        assert!(hot(&uniform) < 0.02, "{}", hot(&uniform));
        assert!((hot(&skewed) - 0.63).abs() < 0.03, "{}", hot(&skewed));
        assert!(skewed.iter().all(|&k| k < keys));
        assert!(DemoOptions::parse("skew=1").is_err());
        assert!(DemoOptions::parse("skew=-0.1").is_err());
    }
}
