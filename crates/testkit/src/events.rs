//! The order events tests feed ubik: `{"merchant":"m007","ts":"2024-01-01T00:00:01.250000Z","amount":12.5}`
//! lines, reproducible from a seed. (`demo://orders` has a generator of its
//! own: it is production code, with its own documented shape.)

use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;

/// The orders table: merchant, event time, amount.
pub const ORDERS: &str = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE";
/// The orders table with a `tag` column ([`Orders::varied`] events).
pub const TAGGED_ORDERS: &str = "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE, tag VARCHAR";

/// 2024-01-01T00:00:00Z in milliseconds: the time of the first event.
pub const BASE_MS: i64 = 1_704_067_200_000;

/// The Arrow schema of a column list ([`ORDERS`], [`TAGGED_ORDERS`]), as
/// `--schema` declares it.
pub fn orders_schema(columns: &str) -> SchemaRef {
    ubik_format::schema::parse_column_list(columns).expect("a valid column list")
}

/// SplitMix64: deterministic, so a failure reproduces from its seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A stream of order events in arrival order: event time advances `step_ms`
/// per row, each row displaced back by up to `disorder_ms`, merchants drawn
/// from `keys`.
#[derive(Debug, Clone)]
pub struct Orders {
    pub rows: usize,
    pub keys: u64,
    pub step_ms: u64,
    pub disorder_ms: u64,
    /// Null amounts (one in 20), negative amounts (in -100..900 instead of
    /// 0..1000) and a `tag` column (one of 7, null one in 10): the schema is
    /// [`TAGGED_ORDERS`] instead of [`ORDERS`].
    pub varied: bool,
}

impl Orders {
    /// Plain orders ([`ORDERS`]): no nulls, amounts in 0..1000.
    pub fn new(rows: usize, keys: u64, step_ms: u64, disorder_ms: u64) -> Self {
        Self {
            rows,
            keys,
            step_ms,
            disorder_ms,
            varied: false,
        }
    }

    /// With nulls, negative amounts and tags ([`TAGGED_ORDERS`]).
    pub fn varied(mut self) -> Self {
        self.varied = true;
        self
    }

    /// The column list of the events.
    pub fn columns(&self) -> &'static str {
        if self.varied { TAGGED_ORDERS } else { ORDERS }
    }

    pub fn schema(&self) -> SchemaRef {
        orders_schema(self.columns())
    }

    /// The events as JSON lines (no newline), drawing from `rng`.
    pub fn lines(&self, rng: &mut Rng) -> Vec<String> {
        (0..self.rows)
            .map(|i| {
                let t = BASE_MS + (i as u64 * self.step_ms) as i64
                    - rng.below(self.disorder_ms + 1) as i64;
                let mut ts = Vec::with_capacity(32);
                ubik_engine::time::write_rfc3339_micros(&mut ts, t * 1000);
                let ts = String::from_utf8(ts).expect("RFC 3339 is ASCII");
                let merchant = format!("m{:03}", rng.below(self.keys));
                if !self.varied {
                    let amount = rng.below(100_000) as f64 / 100.0;
                    return format!(r#"{{"merchant":"{merchant}","ts":"{ts}","amount":{amount}}}"#);
                }
                let amount = if rng.below(20) == 0 {
                    "null".to_string()
                } else {
                    format!("{}", rng.below(100_000) as f64 / 100.0 - 100.0)
                };
                let tag = if rng.below(10) == 0 {
                    "null".to_string()
                } else {
                    format!("\"t{}\"", rng.below(7))
                };
                format!(r#"{{"merchant":"{merchant}","ts":"{ts}","amount":{amount},"tag":{tag}}}"#)
            })
            .collect()
    }

    /// The events of `Rng(seed)` as JSON lines.
    pub fn seeded(&self, seed: u64) -> Vec<String> {
        self.lines(&mut Rng(seed))
    }

    /// Writes the events of `Rng(seed)` to `dir/name` as JSON lines; returns the path.
    pub fn write(&self, dir: &Path, name: &str, seed: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, jsonl(&self.seeded(seed))).expect("write the events");
        path
    }
}

/// Lines joined into a JSON-lines text (each line ends with a newline).
pub fn jsonl(lines: &[String]) -> String {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_shaped_as_declared() {
        let spec = Orders::new(200, 5, 100, 1_000);
        assert_eq!(spec.seeded(3), spec.seeded(3));
        assert_ne!(spec.seeded(3), spec.seeded(4));
        for l in spec.seeded(3) {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            assert_eq!(v.as_object().unwrap().len(), 3, "{l}");
            assert!(v["amount"].as_f64().unwrap() >= 0.0, "{l}");
        }
        let varied = spec.clone().varied().seeded(3);
        assert!(varied.iter().any(|l| l.contains("\"amount\":null")));
        assert!(varied.iter().any(|l| l.contains("\"tag\":null")));
        assert!(varied.iter().any(|l| l.contains("\"amount\":-")));
        assert_eq!(spec.varied().schema().fields().len(), 4);
    }
}
