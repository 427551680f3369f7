//! Property fuzzing of the webhook door and the JSON decoder, run for a
//! wall-clock budget by `bench/fuzz-webhook.sh` (not in the quick tests).
//!
//! Inputs are generated JSON-ish texts (objects with the schema's fields
//! and others, every JSON value kind, huge numbers, escapes, lone
//! surrogates, deep nesting) then mutated at the byte level (flips to
//! invalid UTF-8, inserts, deletes, truncation). The checks:
//!
//! - decoder: no panic; every record is either a row or a bad record; a
//!   record decodes alone exactly as it did in the chunk (so what the door
//!   accepted in one request is what any later decode would give); a
//!   decoder reused after errors gives the same result; arrow-json alone
//!   (without the one-pass decoder) gives the same rows and bad records.
//! - body: no panic; a refusal is a 4xx with a reason; an admitted request
//!   has one row per event, each event decodes alone, and the rows survive
//!   an Arrow IPC round trip (the buffer) unchanged.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use ubik_format::json::JsonDecoder;

/// The schema events are decoded into.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
        Field::new("x", DataType::Float64, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("b", DataType::Boolean, true),
        Field::new("small", DataType::Int32, true),
        Field::new("f", DataType::Float32, true),
    ]))
}

fn string_literal() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z0-9 ]{0,8}",
        Just("\\\"".to_string()),
        Just("\\\\".to_string()),
        Just("\\n".to_string()),
        Just("\\u00e9".to_string()),
        Just("\\ud83d\\ude00".to_string()),
        Just("\\ud800".to_string()),
        Just("\\udc00x".to_string()),
        Just("é€😀".to_string()),
        Just("\\x".to_string()),
        Just("2026-11-29T15:01:00.123Z".to_string()),
        Just("1704067200000".to_string()),
        Just("1e400".to_string()),
        Just("NaN".to_string()),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|p| format!("\"{}\"", p.concat()))
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        any::<i32>().prop_map(|i| i.to_string()),
        (-400i32..400).prop_map(|e| format!("1e{e}")),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        (1usize..60).prop_map(|k| "9".repeat(k)),
        (1usize..60).prop_map(|k| format!("-{}", "1".repeat(k))),
        Just("-0".to_string()),
        Just("0.5".to_string()),
        Just("1704067200000".to_string()),
    ]
}

fn leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => number(),
        3 => string_literal(),
        1 => Just("true".to_string()),
        1 => Just("false".to_string()),
        1 => Just("null".to_string()),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["id", "n", "x", "ts", "b", "small", "f"])
            .prop_map(|k| format!("\"{k}\"")),
        1 => string_literal(),
    ]
}

fn value() -> impl Strategy<Value = String> {
    leaf().prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key(), inner), 0..5).prop_map(|kv| {
                let kv: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", kv.join(","))
            }),
        ]
    })
}

/// An event: mostly an object of schema fields, sometimes anything.
fn event_text() -> impl Strategy<Value = String> {
    let object = prop::collection::vec((key(), value()), 0..8).prop_map(|kv| {
        let kv: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
        format!("{{{}}}", kv.join(","))
    });
    let deep = (55usize..75, leaf())
        .prop_map(|(d, l)| format!("{{\"id\":{}{l}{}}}", "[".repeat(d), "]".repeat(d)));
    prop_oneof![10 => typed(), 6 => object, 1 => value(), 1 => deep]
}

/// An event whose schema fields mostly have their own type (so requests
/// are admitted often enough to check what is stored), plus other fields.
fn typed() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        string_literal().prop_map(|v| format!("\"id\":{v}")),
        any::<i64>().prop_map(|v| format!("\"n\":{v}")),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|v| format!("\"x\":{v}")),
        (0i64..4_000_000_000_000, 0u8..3).prop_map(|(ms, form)| match form {
            0 => format!("\"ts\":{ms}"),
            1 => format!("\"ts\":\"{ms}\""),
            _ => format!(
                "\"ts\":\"2026-11-29T15:{:02}:00.{:03}Z\"",
                ms % 60,
                ms % 1000
            ),
        }),
        any::<bool>().prop_map(|v| format!("\"b\":{v}")),
        any::<i32>().prop_map(|v| format!("\"small\":{v}")),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|v| format!("\"f\":{v}")),
        (key(), value()).prop_map(|(k, v)| format!("{k}:{v}")),
        Just("\"n\":null".to_string()),
    ];
    prop::collection::vec(field, 0..9).prop_map(|f| format!("{{{}}}", f.join(",")))
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(vec![
            0xff, 0x80, 0xc3, b'"', b'\\', b'{', b'}', b'[', b',', b'\n'
        ]),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(p, b)| Mutation::Set(p, b)),
        (any::<usize>(), byte).prop_map(|(p, b)| Mutation::Insert(p, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = bytes.len();
        match *m {
            Mutation::Set(p, b) if n > 0 => bytes[p % n] = b,
            Mutation::Insert(p, b) => bytes.insert(p % (n + 1), b),
            Mutation::Delete(p) if n > 0 => {
                bytes.remove(p % n);
            }
            Mutation::Truncate(p) if n > 0 => bytes.truncate(p % n),
            _ => {}
        }
    }
    bytes
}

/// A record: an event, mutated half of the time.
pub fn record() -> impl Strategy<Value = Vec<u8>> {
    (
        event_text(),
        prop_oneof![
            4 => Just(Vec::new()),
            1 => prop::collection::vec(mutation(), 1..4)
        ],
    )
        .prop_map(|(t, ms)| mutate(t.into_bytes(), &ms))
}

/// Checks the decoder on `records`.
pub fn check_decoder(records: &[Vec<u8>]) -> Result<(), TestCaseError> {
    let refs: Vec<&[u8]> = records.iter().map(|r| r.as_slice()).collect();
    let mut d = JsonDecoder::with_threads(schema(), 1).map_err(fail)?;
    let all = d.decode(&refs).map_err(fail)?;
    prop_assert_eq!(all.batch.num_rows() + all.bad.len(), records.len());
    let bad: Vec<usize> = all.bad.iter().map(|b| b.index).collect();
    prop_assert!(bad.windows(2).all(|w| w[0] < w[1]), "bad indexes {:?}", bad);
    let mut alone = JsonDecoder::with_threads(schema(), 1).map_err(fail)?;
    for (row, rec) in (0..all.batch.num_rows()).map(|r| (r, all.record_of(r))) {
        let one = alone.decode(&[refs[rec]]).map_err(fail)?;
        prop_assert!(
            one.bad.is_empty(),
            "record {} decoded in the chunk but not alone: {:?}",
            rec,
            one.bad
        );
        prop_assert_eq!(&one.batch, &all.batch.slice(row, 1), "record {}", rec);
    }
    for b in &all.bad {
        let one = alone.decode(&[refs[b.index]]).map_err(fail)?;
        prop_assert_eq!(
            one.bad.len(),
            1,
            "record {} refused in the chunk only",
            b.index
        );
        prop_assert!(!b.reason.is_empty());
    }
    // Reuse after errors gives the same result.
    let again = d.decode(&refs).map_err(fail)?;
    prop_assert_eq!(&again.batch, &all.batch);
    prop_assert_eq!(&again.bad, &all.bad);
    // The one-pass decoder changes nothing: arrow-json alone gives the same.
    let general = JsonDecoder::with_threads(schema(), 1)
        .and_then(JsonDecoder::without_one_pass)
        .map_err(fail)?
        .decode(&refs)
        .map_err(fail)?;
    prop_assert_eq!(&general.batch, &all.batch);
    prop_assert_eq!(&general.records, &all.records);
    prop_assert_eq!(&general.bad, &all.bad);
    // Reading some columns: both decoders agree, and a record bad then is bad in full too.
    let columns = schema().fields().len();
    for half in [0, 1] {
        let reads: Vec<bool> = (0..columns).map(|c| c % 2 == half).collect();
        let mut some = JsonDecoder::with_threads(schema(), 1).map_err(fail)?;
        some.read_only(&reads).map_err(fail)?;
        let mut some_general = JsonDecoder::with_threads(schema(), 1)
            .and_then(JsonDecoder::without_one_pass)
            .map_err(fail)?;
        some_general.read_only(&reads).map_err(fail)?;
        let a = some.decode(&refs).map_err(fail)?;
        let b = some_general.decode(&refs).map_err(fail)?;
        prop_assert_eq!(&a.batch, &b.batch);
        prop_assert_eq!(&a.records, &b.records);
        prop_assert_eq!(&a.bad, &b.bad);
        prop_assert!(a.bad.iter().all(|x| bad.contains(&x.index)));
    }
    Ok(())
}

/// How a generated request is framed.
#[derive(Debug, Clone)]
pub struct Request {
    pub records: Vec<Vec<u8>>,
    pub framing: u8,
    pub gzip: u8,
    pub content_type: Vec<u8>,
    pub encoding: Option<Vec<u8>>,
}

impl Request {
    /// The body bytes and headers as sent.
    pub fn build(&self) -> (axum::http::HeaderMap, Vec<u8>) {
        let mut body = match self.framing % 4 {
            0 => self.records.join(&b"\n"[..]),
            1 => {
                let mut b = b"[".to_vec();
                b.extend(self.records.join(&b" ,\n"[..]));
                b.push(b']');
                b
            }
            2 => self.records.join(&b"  "[..]),
            _ => self.records.first().cloned().unwrap_or_default(),
        };
        if self.framing & 4 != 0 {
            body.extend_from_slice(b"\r\n\n");
        }
        let mut headers = axum::http::HeaderMap::new();
        if let Ok(v) = axum::http::HeaderValue::from_bytes(&self.content_type) {
            headers.insert("content-type", v);
        }
        let mut encoding = self.encoding.clone();
        if !self.gzip.is_multiple_of(3) {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = gz.write_all(&body);
            body = gz.finish().unwrap_or_default();
            if self.gzip % 3 == 2 {
                // A corrupt stream: truncated, or a flipped byte.
                let n = body.len();
                if n > 12 {
                    body[n / 2] ^= 0x5a;
                }
            }
            encoding = Some(b"gzip".to_vec());
        }
        if let Some(e) = encoding
            && let Ok(v) = axum::http::HeaderValue::from_bytes(&e)
        {
            headers.insert("content-encoding", v);
        }
        (headers, body)
    }
}

pub fn request() -> impl Strategy<Value = Request> {
    let ct = prop_oneof![
        4 => Just(b"application/json".to_vec()),
        2 => Just(b"application/x-ndjson".to_vec()),
        1 => Just(b"application/json; charset=utf-8".to_vec()),
        1 => Just(b"text/csv".to_vec()),
        1 => Just(b"Application/Vnd.Thing+JSON".to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..24),
    ];
    let enc = prop_oneof![
        6 => Just(None),
        1 => Just(Some(b"identity".to_vec())),
        1 => Just(Some(b"br".to_vec())),
        1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(Some),
    ];
    (
        prop::collection::vec(record(), 0..8),
        any::<u8>(),
        any::<u8>(),
        ct,
        enc,
    )
        .prop_map(|(records, framing, gzip, content_type, encoding)| Request {
            records,
            framing,
            gzip,
            content_type,
            encoding,
        })
}

fn ipc_round_trip(batch: &RecordBatch) -> Result<RecordBatch, TestCaseError> {
    let mut buf = Vec::new();
    {
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new(&mut buf, &batch.schema()).map_err(fail)?;
        w.write(batch).map_err(fail)?;
        w.finish().map_err(fail)?;
    }
    let mut r =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(buf), None).map_err(fail)?;
    r.next()
        .ok_or_else(|| TestCaseError::fail("no batch read back"))?
        .map_err(fail)
}

/// Requests admitted and refused so far (a run reports them, to show the
/// generator reaches both sides).
pub static ADMITTED: AtomicU64 = AtomicU64::new(0);
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Checks the request-body path on `req`.
pub fn check_body(door: &ubik_webhook::door::Door, req: &Request) -> Result<(), TestCaseError> {
    let (headers, body) = req.build();
    let max_body = 1 << 16;
    match door.admit_request(&headers, &body, max_body) {
        Ok(batch) => {
            ADMITTED.fetch_add(1, Ordering::Relaxed);
            let unpacked = ubik_webhook::body::decode(&headers, &body, max_body)
                .map_err(|r| TestCaseError::fail(r.message))?;
            let payload = unpacked.as_deref().unwrap_or(&body);
            let ranges = ubik_webhook::body::split_events(payload)
                .map_err(|r| TestCaseError::fail(r.message))?;
            prop_assert_eq!(batch.num_rows(), ranges.len());
            let mut alone = JsonDecoder::with_threads(schema(), 1).map_err(fail)?;
            for (i, r) in ranges.into_iter().enumerate() {
                let one = alone.decode(&[&payload[r]]).map_err(fail)?;
                prop_assert!(
                    one.bad.is_empty(),
                    "admitted event {} fails alone: {:?}",
                    i,
                    one.bad
                );
                prop_assert_eq!(&one.batch, &batch.slice(i, 1));
            }
            prop_assert_eq!(&ipc_round_trip(&batch)?, &batch);
        }
        Err(r) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            prop_assert!(
                matches!(r.status, 400 | 413 | 415),
                "status {} ({})",
                r.status,
                r.message
            );
            prop_assert!(!r.message.is_empty());
        }
    }
    Ok(())
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Runs `test` on inputs of `strategy` for `budget`, a round of cases at a
/// time with a fresh seed each; prints each (shrunk) finding. Returns
/// (executions, findings).
pub fn run_for<S, F>(name: &str, budget: Duration, strategy: S, test: F) -> (u64, u64)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
    F: Fn(S::Value) -> Result<(), TestCaseError>,
{
    let start = Instant::now();
    let executions = AtomicU64::new(0);
    let mut findings = 0u64;
    let mut round = 0u64;
    let mut last_report = Instant::now();
    while start.elapsed() < budget {
        round += 1;
        let mut seed = [0u8; 32];
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        seed[..8].copy_from_slice(&nanos.to_le_bytes());
        seed[8..16].copy_from_slice(&round.to_le_bytes());
        let config = Config {
            cases: 500,
            failure_persistence: None,
            max_shrink_iters: 4096,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
        let result = runner.run(&strategy, |v| {
            executions.fetch_add(1, Ordering::Relaxed);
            test(v)
        });
        if let Err(e) = result {
            findings += 1;
            match e {
                TestError::Fail(why, input) => {
                    println!("FINDING {name} #{findings}: {why}\n  minimal input: {input:?}")
                }
                TestError::Abort(why) => println!("ABORT {name}: {why}"),
            }
        }
        if last_report.elapsed() > Duration::from_secs(60) {
            last_report = Instant::now();
            println!(
                "{name}: {:.0}s, {} executions, {findings} findings",
                start.elapsed().as_secs_f64(),
                executions.load(Ordering::Relaxed)
            );
        }
    }
    let n = executions.load(Ordering::Relaxed);
    println!(
        "{name}: done after {:.0}s: {n} executions, {findings} findings",
        start.elapsed().as_secs_f64()
    );
    (n, findings)
}

/// The budget from the first argument (seconds), default 60.
pub fn budget_from_args() -> Duration {
    let secs = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60u64);
    Duration::from_secs(secs)
}

/// How a generated record is damaged before it is fed (the envelope
/// targets): not at all, cut short, one byte changed, or replaced by
/// random bytes.
#[derive(Debug, Clone)]
pub enum Damage {
    None,
    Truncate(usize),
    Set(usize, u8),
    Random(Vec<u8>),
}

impl Damage {
    pub fn is_none(&self) -> bool {
        matches!(self, Damage::None)
    }

    /// Damages `bytes` (positions taken modulo their length).
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Damage::None => {}
            Damage::Truncate(n) => bytes.truncate(*n % bytes.len().max(1)),
            Damage::Set(at, b) => {
                if !bytes.is_empty() {
                    let at = *at % bytes.len();
                    bytes[at] = *b;
                }
            }
            Damage::Random(r) => r.clone_into(bytes),
        }
    }
}

/// Mostly undamaged records, the rest damaged one way or another.
pub fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => any::<usize>().prop_map(Damage::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Set(i, b)),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Damage::Random),
    ]
}

/// A chunk of Kafka records at offsets 0.., with `tombstones` among them
/// and no record times (`-1`): what a Debezium fuzz target unwraps.
pub fn events_chunk(records: &[Vec<u8>], tombstones: Vec<u32>) -> ubik_connector::Chunk {
    let n = records.len();
    ubik_connector::Chunk {
        partition: 0,
        payload: ubik_connector::Payload::from_records(records),
        positions: (0..n as u64).collect(),
        position_name: "offset",
        meta: ubik_connector::RecordMeta {
            timestamps: vec![-1; n],
            deletions: tombstones,
        },
    }
}
