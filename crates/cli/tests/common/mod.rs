//! Helpers of the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn ubik() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ubik"))
}

pub fn run(args: &[&str]) -> Output {
    ubik().args(args).output().expect("run ubik")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// SplitMix64, for reproducible test data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Writes `n` order events (time advancing `step_ms` per row, displaced back
/// by up to `disorder_ms`) as JSON lines; returns the path.
pub fn write_events(
    dir: &Path,
    name: &str,
    n: usize,
    keys: u64,
    step_ms: u64,
    disorder_ms: u64,
    seed: u64,
) -> PathBuf {
    let mut rng = Rng(seed);
    let mut text = String::with_capacity(n * 80);
    let base = 1_704_067_200_000i64;
    for i in 0..n {
        let t = base + (i as u64 * step_ms) as i64 - rng.below(disorder_ms + 1) as i64;
        let mut ts = Vec::new();
        ubik_engine::time::write_rfc3339_micros(&mut ts, t * 1000);
        let ts = String::from_utf8(ts).unwrap();
        let amount = (rng.below(100_000) as f64) / 100.0;
        text.push_str(&format!(
            "{{\"merchant\":\"m{:03}\",\"ts\":\"{ts}\",\"amount\":{amount}}}\n",
            rng.below(keys)
        ));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Latest value per key of `{"key":..,"value":..}` lines (null value deletes).
pub fn fold(lines: &[String]) -> std::collections::BTreeMap<String, String> {
    let mut state = std::collections::BTreeMap::new();
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l}: {e}"));
        let key = v["key"].to_string();
        if v["value"].is_null() {
            state.remove(&key);
        } else {
            state.insert(key, v["value"].to_string());
        }
    }
    state
}

/// DataFusion one-shot over an orders JSONL file (`merchant`, `ts`,
/// `amount`), as canonical changelog key -> value strings; the first two
/// result columns are the key.
pub fn oracle_changelog(path: &Path, sql: &str) -> std::collections::BTreeMap<String, String> {
    use datafusion::prelude::{JsonReadOptions, SessionContext};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = SessionContext::new();
        let schema =
            ubik_format::schema::parse_column_list("merchant VARCHAR, ts TIMESTAMP, amount DOUBLE")
                .unwrap();
        ctx.register_json(
            "orders",
            path.to_str().unwrap(),
            JsonReadOptions::default()
                .schema(&schema)
                .file_extension(".jsonl"),
        )
        .await
        .unwrap();
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let mut out = std::collections::BTreeMap::new();
        for b in batches {
            let mut enc =
                ubik_format::changelog::ChangelogEncoder::new(&b.schema(), vec![0, 1], true);
            let change = ubik_engine::ChangeBatch {
                timestamps: arrow::array::Int64Array::new_null(b.num_rows()),
                rows: b,
                deletes: None,
            };
            enc.encode(&change, |r| {
                out.insert(
                    String::from_utf8_lossy(r.key.unwrap()).into_owned(),
                    String::from_utf8_lossy(r.value.unwrap()).into_owned(),
                );
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        }
        out
    })
}
