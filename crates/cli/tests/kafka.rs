//! Kafka end to end, against the real Apache Kafka broker that
//! scripts/test.sh starts (address in UBIK_TEST_KAFKA): round trip, crash
//! suite in both emit modes, read_committed isolation, dead letters, a
//! broker restart mid-run, SIGTERM drain, fencing.
#![cfg(feature = "broker-tests")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ubik_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ubik_kafka::rdkafka::client::DefaultClientContext;
use ubik_kafka::rdkafka::config::ClientConfig;
use ubik_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ubik_kafka::rdkafka::message::{Headers, Message};
use ubik_kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use ubik_kafka::rdkafka::{Offset, TopicPartitionList};
use ubik_testkit::{
    ORDERS, Orders, Rng, State, assert_matches, fold, oracle as one_shot, orders_schema, read_jsonl,
};

const Q: &str = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total FROM \"{T}\" GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
const ORACLE: &str = "SELECT merchant, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY 1, 2";
const SCHEMA: &str = ORDERS;

fn broker() -> String {
    std::env::var("UBIK_TEST_KAFKA")
        .expect("UBIK_TEST_KAFKA is not set: run scripts/test.sh, or testing/kafka/broker.sh start and export UBIK_TEST_KAFKA=$(testing/kafka/broker.sh address)")
}

/// The Kafka tests share one broker (one of them restarts it), so they run
/// one at a time whatever the harness's thread count. They are skipped only
/// when a developer's `UBIK_TEST_SKIP` names `kafka` (never under `CI`, as
/// the Python suite); otherwise a missing broker fails them.
fn serial() -> Option<std::sync::MutexGuard<'static, ()>> {
    static BROKER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let skip = std::env::var("UBIK_TEST_SKIP")
        .is_ok_and(|s| s.split(',').any(|suite| suite.trim() == "kafka"));
    assert!(
        !(skip && std::env::var_os("CI").is_some()),
        "UBIK_TEST_SKIP names kafka, but CI is set: CI runs the Kafka tests"
    );
    if skip {
        eprintln!("skipped: UBIK_TEST_SKIP names kafka");
        return None;
    }
    broker();
    // A failed test poisons the lock; the next one still runs.
    Some(BROKER.lock().unwrap_or_else(|e| e.into_inner()))
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]);
}

/// Creates `name` as ubik would create a changelog topic (compacted), but
/// without time-based segment rolls, and returns it. A changelog's record
/// timestamps are window ends (2024 here) while transaction markers carry
/// the wall clock, so on a default topic the first marker rolls the segment
/// and the log cleaner may then remove superseded versions: right for a
/// latest-per-key consumer, but a test that compares every version of two
/// runs must read them before the broker compacts any.
fn changelog_topic(name: String, partitions: i32) -> String {
    create_topic_with(
        &name,
        partitions,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", &i64::MAX.to_string()),
        ],
    );
    name
}

/// Asserts that `got` holds exactly the records of `reference` (key, value
/// and timestamp, byte for byte), duplicates aside: every version a run
/// emitted once appears, and nothing else does.
fn assert_same_records(what: &str, got: &[Rec], reference: &BTreeSet<Rec>) {
    let got: BTreeSet<&Rec> = got.iter().collect();
    let extra = got.iter().find(|r| !reference.contains(**r));
    let missing = reference.iter().find(|r| !got.contains(r));
    let Some(first) = extra.copied().or(missing) else {
        return;
    };
    // Every version of the key, in both runs, to tell a value never
    // produced from a missing record.
    let versions = |recs: &mut dyn Iterator<Item = &Rec>| -> Vec<String> {
        let mut v: Vec<String> = recs
            .filter(|r| r.key == first.key)
            .map(|r| format!("{:?} @{:?}", r.value, r.timestamp))
            .collect();
        v.sort();
        v
    };
    panic!(
        "{what}: the records differ from the reference's ({} vs {} distinct; {} not in the reference, {} of it missing), e.g. {} {first:?}\n  the reference's versions of the key: {:?}\n  these: {:?}",
        got.len(),
        reference.len(),
        got.iter().filter(|r| !reference.contains(**r)).count(),
        reference.iter().filter(|r| !got.contains(r)).count(),
        if extra.is_some() { "extra" } else { "missing" },
        versions(&mut reference.iter()),
        versions(&mut got.iter().copied()),
    );
}

fn create_topic_with(name: &str, partitions: i32, config: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .create()
        .unwrap();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    let r = futures_executor_block_on(admin.create_topics(&[topic], &AdminOptions::new())).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
}

fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(f)
}

/// An idempotent producer to the test broker (records in order per
/// partition, none twice).
fn test_producer() -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

/// Produces `lines` keyed by merchant (so they spread over partitions),
/// in order per partition.
fn produce(topic: &str, lines: &[String]) {
    let p = test_producer();
    for l in lines {
        let key = serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v["merchant"].as_str().map(String::from))
            .unwrap_or_default();
        send_waiting(
            &p,
            BaseRecord::to(topic)
                .payload(l.as_bytes())
                .key(key.as_bytes()),
        );
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Sends `rec`, waiting while the producer's queue is full.
fn send_waiting(p: &BaseProducer, mut rec: BaseRecord<'_, [u8], [u8]>) {
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((_, r)) => {
                rec = r;
                p.poll(Duration::from_millis(10));
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Rec {
    key: String,
    value: Option<String>,
    timestamp: Option<i64>,
    /// (name, value) pairs in order (a dead letter's `ubik.*` facts).
    headers: Vec<(String, String)>,
}

impl Rec {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Produces `line` to every partition of `topic` (closing windows
/// everywhere, since the watermark is the minimum over partitions).
fn produce_everywhere(topic: &str, partitions: i32, line: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .create()
        .unwrap();
    for part in 0..partitions {
        p.send(
            BaseRecord::<[u8], [u8]>::to(topic)
                .payload(line.as_bytes())
                .partition(part),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Every record of `topic` a reader with `isolation` sees (all partitions,
/// offset order per partition), once the writers have finished (their last
/// transaction committed).
fn consume_all(topic: &str, isolation: &str) -> Vec<Rec> {
    consume(topic, isolation, true)
}

/// What a read_committed reader sees right after a writer was killed: its
/// open transaction holds the last stable offset back until the next run
/// fences it, so the log end is not waited for.
fn consume_committed_now(topic: &str) -> Vec<Rec> {
    consume(topic, "read_committed", false)
}

fn consume(topic: &str, isolation: &str, settle: bool) -> Vec<Rec> {
    let reader = |isolation: &str| -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", broker())
            .set("group.id", unique("reader"))
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation)
            .create()
            .unwrap()
    };
    let c = reader(isolation);
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
    if settle && isolation == "read_committed" {
        wait_for_markers(&c, &reader("read_uncommitted"), topic, &parts);
    }
    // Where the log ends now: a reader is done with a partition when its
    // position passes that offset. (An end-of-partition event is not
    // enough: a read_committed reader can report one at a transaction
    // boundary below the end, and a loop stopping there missed records.)
    let ends: BTreeMap<i32, i64> = parts
        .iter()
        .map(|&p| {
            // Right after a broker restart the leader may not be known yet.
            let started = Instant::now();
            loop {
                match c.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                    Ok((_, high)) => return (p, high),
                    Err(e) if started.elapsed() < Duration::from_secs(60) => {
                        eprintln!("end offset of {topic}/{p}: {e}; retrying");
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    Err(e) => panic!("end offset of {topic}/{p}: {e}"),
                }
            }
        })
        .collect();
    let mut tpl = TopicPartitionList::new();
    for &p in &parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = |c: &BaseConsumer| {
        let at = c.position().unwrap();
        parts.iter().all(|&p| {
            ends[&p] == 0
                || matches!(
                    at.find_partition(topic, p).map(|e| e.offset()),
                    Some(Offset::Offset(o)) if o >= ends[&p]
                )
        })
    };
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(Rec {
                key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value: m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
                timestamp: m.timestamp().to_millis(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| {
                                let v = x.value.unwrap_or_default();
                                (x.key.to_string(), String::from_utf8_lossy(v).into_owned())
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            _ if done(&c) => break,
            _ => {}
        }
    }
    out
}

/// A read_committed reader ends at the last stable offset, which trails a
/// just-committed transaction until the broker has written its markers:
/// waits (up to 30 s) until it is the log end a read_uncommitted reader
/// sees, so a finished writer's last transaction is read too.
fn wait_for_markers(committed: &BaseConsumer, all: &BaseConsumer, topic: &str, parts: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let end = |c: &BaseConsumer, p: i32| {
        c.fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_or(-1, |(_, high)| high)
    };
    while Instant::now() < deadline {
        if parts.iter().all(|&p| end(committed, p) >= end(all, p)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fold_recs(recs: &[Rec]) -> State {
    fold(recs.iter().map(|r| (&r.key, r.value.as_ref())))
}

/// DataFusion over the same rows, keyed like the changelog.
fn oracle(lines: &[String]) -> State {
    oracle_of(ORACLE, lines)
}

/// DataFusion running `sql` (over `orders`, keyed by its first two
/// columns) over `lines`.
fn oracle_of(sql: &str, lines: &[String]) -> State {
    let text = ubik_testkit::events::jsonl(lines);
    one_shot(
        sql,
        &read_jsonl(text.as_bytes(), &orders_schema(SCHEMA)),
        &[0, 1],
    )
}

fn events(n: usize, keys: u64, disorder_ms: u64, seed: u64) -> Vec<String> {
    Orders::new(n, keys, 25, disorder_ms).seeded(seed)
}

fn ubik_run(input: &str, output: &str, extra: &[&str]) -> std::process::Command {
    ubik_run_query(Q, input, output, extra)
}

/// `ubik run` of `query` (its table `{T}`) from `input` to `output`, with
/// the tests' schema, lateness and batch size, and `extra` flags.
fn ubik_run_query(query: &str, input: &str, output: &str, extra: &[&str]) -> std::process::Command {
    let mut c = ubik();
    c.arg("run")
        .arg(query.replace("{T}", input))
        .args([
            "--from",
            &format!("kafka://{}/{input}?end=latest", broker()),
        ])
        .args([
            "--to",
            &format!("kafka://{}/{output}?partitions=3", broker()),
        ])
        .args([
            "--schema",
            SCHEMA,
            "--lateness",
            "5s",
            "--batch-size",
            "400",
            "-q",
        ])
        .args(extra);
    c
}

#[test]
fn round_trip_equals_oracle() {
    let Some(_broker) = serial() else { return };
    let (input, output) = (unique("rt-in"), unique("rt-out"));
    create_topic(&input, 4);
    let lines = events(20_000, 30, 4_000, 1);
    produce(&input, &lines);
    for emit in ["transactional", "idempotent"] {
        let out = format!("{output}-{emit}");
        let o = ubik_run(&input, &out, &["--emit", emit]).output().unwrap();
        assert!(o.status.success(), "{emit}: {}", stderr(&o));
        let recs = consume_all(&out, "read_committed");
        assert_matches(emit, &fold_recs(&recs), &oracle(&lines));
        // Record timestamps are window ends; keys have one home partition each.
        for r in &recs {
            let k: serde_json::Value = serde_json::from_str(&r.key).unwrap();
            let start = ubik_engine::time::parse_rfc3339(k["w"].as_str().unwrap()).unwrap() / 1000;
            assert_eq!(
                r.timestamp,
                Some(start + 60_000),
                "{emit}: timestamp of {}",
                r.key
            );
        }
    }
}

/// Producers that write times as epoch microseconds say so with
/// `timestamp_unit=us`: the windows are those of the same instants written
/// as RFC 3339 text. Read as milliseconds (the default), they would be
/// dated some 50 000 years ahead.
#[test]
fn epoch_numbers_count_the_sources_timestamp_unit() {
    let Some(_broker) = serial() else { return };
    let (input, output) = (unique("unit-in"), unique("unit-out"));
    create_topic(&input, 2);
    let lines = events(5_000, 20, 2_000, 11);
    let micros: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let us = ubik_engine::time::parse_rfc3339(v["ts"].as_str().unwrap()).unwrap();
            v["ts"] = us.into();
            v.to_string()
        })
        .collect();
    produce(&input, &micros);
    // The query shows a TIMESTAMP column's values (`last`), not only the
    // windows that the rows' event times give.
    let q_last = Q
        .replace("{T}", "orders")
        .replace("sum(amount) AS total", "max(ts) AS last");
    let want = oracle_of(
        &ORACLE.replace("sum(amount) AS total", "max(ts) AS last"),
        &lines,
    );
    let source = format!("kafka://{}/{input}?end=latest&timestamp_unit=us", broker());
    // The query's changelog into `out`, with `extra` flags.
    let run = |out: &str, extra: &[&str]| {
        let o = ubik()
            .args(["run", &q_last, "--from"])
            .arg(format!("orders={source}"))
            .args(["--to", &format!("kafka://{}/{out}", broker())])
            .args(["--schema", SCHEMA, "--lateness", "5s", "-q"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        fold_recs(&consume_all(out, "read_committed"))
    };
    assert_matches("timestamp_unit=us", &run(&output, &[]), &want);
    // In a repartitioned group the keyed stage decodes the routed records
    // (the source's bytes) in the source's unit too.
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("ck");
    let group = unique("unit-group");
    let grouped = run(
        &unique("unit-group-out"),
        &[
            "--group",
            &group,
            "--checkpoint-every",
            "1500",
            "--checkpoint",
            checkpoint.to_str().unwrap(),
        ],
    );
    assert_matches("timestamp_unit=us in a group", &grouped, &want);
    // A unit the source cannot have is refused before anything runs.
    let o = ubik()
        .args(["validate", "SELECT * FROM orders", "--from"])
        .arg(format!("orders={source}s"))
        .args(["--schema", SCHEMA])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("timestamp_unit=\"uss\" is not s, ms, us or ns"),
        "{}",
        stderr(&o)
    );
}

/// A keyed changelog into a pre-created topic that deletes records by
/// their timestamp (7 days): a backfill of 2024's windows is refused before
/// anything is committed; `retention_check=warn` writes it anyway; a
/// compacted topic takes it without a word.
#[test]
fn retention_that_would_delete_a_backfill_is_refused() {
    let Some(_broker) = serial() else { return };
    let input = unique("ret-in");
    create_topic(&input, 2);
    let lines = events(3_000, 5, 2_000, 3);
    produce(&input, &lines);
    // ubik_run's command, with `options` appended to its --to URL.
    let run = |output: &str, options: &str| {
        let to = format!("/{output}?partitions=3");
        let mut c = ubik();
        for a in ubik_run(&input, output, &[]).get_args() {
            let a = a.to_string_lossy();
            c.arg(if a.ends_with(&to) {
                format!("{a}{options}")
            } else {
                a.into_owned()
            });
        }
        c.output().unwrap()
    };
    let seven_days = [("cleanup.policy", "delete"), ("retention.ms", "604800000")];
    let deleting = unique("ret-delete");
    create_topic_with(&deleting, 3, &seven_days);
    let o = run(&deleting, "");
    let err = stderr(&o);
    assert!(!o.status.success(), "refused: {err}");
    assert!(
        err.contains("retention.ms=604800000 (7 days)")
            && err.contains("cleanup.policy=compact")
            && err.contains("retention_check=warn"),
        "{err}"
    );
    assert!(
        consume_all(&deleting, "read_committed").is_empty(),
        "nothing was committed"
    );

    let warned = unique("ret-warn");
    create_topic_with(&warned, 3, &seven_days);
    let o = run(&warned, "&retention_check=warn");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_matches(
        "warn",
        &fold_recs(&consume_all(&warned, "read_committed")),
        &oracle(&lines),
    );

    let compacted = unique("ret-compact");
    create_topic_with(&compacted, 3, &[("cleanup.policy", "compact")]);
    let o = run(&compacted, "");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_matches(
        "compact",
        &fold_recs(&consume_all(&compacted, "read_committed")),
        &oracle(&lines),
    );
}

/// Orders on a 4-partition topic joined with merchant versions on a
/// compacted topic: the read_committed fold equals DataFusion's as-of join.
#[test]
fn temporal_join_of_two_topics_equals_oracle() {
    let Some(_broker) = serial() else { return };
    let (orders, merchants, output) = (unique("j-orders"), unique("j-merchants"), unique("j-out"));
    create_topic(&orders, 4);
    create_topic_with(&merchants, 1, &[("cleanup.policy", "compact")]);
    let order_lines = events(8_000, 12, 3_000, 5);
    let mut rng = Rng(11);
    let ts = |ms: i64| {
        let mut b = Vec::new();
        ubik_engine::time::write_rfc3339_micros(&mut b, ms * 1000);
        String::from_utf8(b).unwrap()
    };
    let base = ubik_testkit::events::BASE_MS;
    let mut merchant_lines: Vec<String> = (0..12)
        .map(|k| {
            format!(
                r#"{{"id":"m{k:03}","region":"r{}","ts":"{}"}}"#,
                rng.below(4),
                ts(base - 60_000 + k)
            )
        })
        .collect();
    for i in (0..8_000i64).step_by(250) {
        merchant_lines.push(format!(
            r#"{{"id":"m{:03}","region":"r{}","ts":"{}"}}"#,
            rng.below(12),
            rng.below(4),
            ts(base + i * 25 + 1)
        ));
    }
    produce(&orders, &order_lines);
    produce(&merchants, &merchant_lines);
    let sql = format!(
        "SELECT m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(o.amount) AS total \
         FROM \"{orders}\" o JOIN \"{merchants}\" FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id \
         GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE)"
    );
    let o = ubik()
        .args(["run", &sql])
        .args([
            "--from",
            &format!("kafka://{}/{orders}?end=latest", broker()),
        ])
        .args([
            "--from",
            &format!("kafka://{}/{merchants}?end=latest", broker()),
        ])
        .args(["--schema", &format!("{orders}={SCHEMA}")])
        .args([
            "--schema",
            &format!("{merchants}=id VARCHAR, region VARCHAR, ts TIMESTAMP"),
        ])
        .args([
            "--to",
            &format!("kafka://{}/{output}?partitions=2", broker()),
        ])
        .args(["--lateness", "5s", "--batch-size", "300", "-q"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = |lines: &[String]| ubik_testkit::events::jsonl(lines);
    let want = ubik_testkit::oracle_tables(
        "WITH c AS (SELECT o.ts, o.amount, m.region, \
           rank() OVER (PARTITION BY o.merchant, o.ts, o.amount ORDER BY m.ts DESC) AS rn \
         FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) \
         SELECT region, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
           count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2",
        &[
            (
                "orders",
                &read_jsonl(text(&order_lines).as_bytes(), &orders_schema(SCHEMA)),
            ),
            (
                "merchants",
                &read_jsonl(
                    text(&merchant_lines).as_bytes(),
                    &orders_schema("id VARCHAR, region VARCHAR, ts TIMESTAMP"),
                ),
            ),
        ],
        &[0, 1],
    );
    let recs = consume_all(&output, "read_committed");
    assert_matches("temporal join over Kafka", &fold_recs(&recs), &want);
}

/// Produces keyed versions with explicit record timestamps, in order, on
/// partition 0; a `None` value is a tombstone (the key is deleted).
fn produce_versions(topic: &str, versions: &[(String, Option<String>, i64)]) {
    let p = test_producer();
    for (key, value, ts) in versions {
        let mut rec = BaseRecord::<[u8], [u8]>::to(topic)
            .key(key.as_bytes())
            .partition(0)
            .timestamp(*ts);
        if let Some(v) = value {
            rec = rec.payload(v.as_bytes());
        }
        send_waiting(&p, rec);
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// A compacted topic without a time column, with tombstones: each version
/// is valid from its record timestamp, a tombstone deletes its key from
/// its own timestamp on (the LEFT JOIN pads with nulls until a next
/// version), and the fold equals DataFusion's as-of join over the same
/// versions with deletion flags.
struct VersionedJoin {
    sql: String,
    orders: String,
    merchants: String,
    /// The folded changelog DataFusion computes in one shot.
    want: State,
}

/// Orders on 2 partitions LEFT JOINed (per 10-second window) with a
/// compacted topic without a time column, with tombstones.
fn versioned_join_with_tombstones() -> VersionedJoin {
    let (orders, merchants) = (unique("t-orders"), unique("t-merchants"));
    create_topic(&orders, 2);
    create_topic_with(&merchants, 1, &[("cleanup.policy", "compact")]);
    let order_lines = events(4_000, 8, 2_000, 7);
    let base = ubik_testkit::events::BASE_MS;
    let mut rng = Rng(5);
    // (key, region or deletion, record timestamp): a first version of each
    // key, then updates and tombstones at distinct times.
    let mut versions: Vec<(String, Option<String>, i64)> = (0..8)
        .map(|k| {
            (
                format!("m{k:03}"),
                Some(format!("r{}", rng.below(3))),
                base - 10_000 + k,
            )
        })
        .collect();
    for i in (0..4_000i64).step_by(100) {
        let key = format!("m{:03}", rng.below(8));
        let region = (rng.below(3) > 0).then(|| format!("r{}", rng.below(3)));
        versions.push((key, region, base + i * 25 + 1));
    }
    let value = |key: &str, region: &str| format!(r#"{{"id":"{key}","region":"{region}"}}"#);
    let records: Vec<(String, Option<String>, i64)> = versions
        .iter()
        .map(|(k, r, t)| (k.clone(), r.as_ref().map(|r| value(k, r)), *t))
        .collect();
    produce(&orders, &order_lines);
    produce_versions(&merchants, &records);
    let sql = format!(
        "SELECT m.region, TUMBLE(o.ts, INTERVAL '10' SECOND) AS w, count(*) AS n, sum(o.amount) AS total \
         FROM \"{orders}\" o LEFT JOIN \"{merchants}\" FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id \
         GROUP BY m.region, TUMBLE(o.ts, INTERVAL '10' SECOND)"
    );
    let ts = |ms: i64| {
        let mut b = Vec::new();
        ubik_engine::time::write_rfc3339_micros(&mut b, ms * 1000);
        String::from_utf8(b).unwrap()
    };
    let version_lines: Vec<String> = versions
        .iter()
        .map(|(k, r, t)| {
            let region = r.as_ref().map_or("null".into(), |r| format!("\"{r}\""));
            format!(
                r#"{{"id":"{k}","region":{region},"ts":"{}","deleted":{}}}"#,
                ts(*t),
                r.is_none()
            )
        })
        .collect();
    let text = |lines: &[String]| ubik_testkit::events::jsonl(lines);
    let want = ubik_testkit::oracle_tables(
        "WITH c AS (SELECT o.ts, o.amount, m.region, m.deleted, \
           rank() OVER (PARTITION BY o.merchant, o.ts, o.amount ORDER BY m.ts DESC) AS rn \
         FROM orders o LEFT JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) \
         SELECT CASE WHEN deleted THEN NULL ELSE region END AS region, \
           date_bin(INTERVAL '10 seconds', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
           count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2",
        &[
            (
                "orders",
                &read_jsonl(text(&order_lines).as_bytes(), &orders_schema(SCHEMA)),
            ),
            (
                "merchants",
                &read_jsonl(
                    text(&version_lines).as_bytes(),
                    &orders_schema("id VARCHAR, region VARCHAR, ts TIMESTAMP, deleted BOOLEAN"),
                ),
            ),
        ],
        &[0, 1],
    );
    assert!(
        want.keys().any(|k| k.contains(r#""region":null"#)),
        "the data must exercise deletions: {want:?}"
    );
    VersionedJoin {
        sql,
        orders,
        merchants,
        want,
    }
}

/// `ubik run` of the versioned join into `output`.
fn run_versioned_join(j: &VersionedJoin, output: &str, extra: &[&str]) -> std::process::Command {
    let mut c = ubik();
    c.args(["run", &j.sql])
        .args([
            "--from",
            &format!("kafka://{}/{}?end=latest", broker(), j.orders),
        ])
        .args([
            "--from",
            &format!("kafka://{}/{}?end=latest", broker(), j.merchants),
        ])
        .args(["--schema", &format!("{}={SCHEMA}", j.orders)])
        .args([
            "--schema",
            &format!("{}=id VARCHAR PRIMARY KEY, region VARCHAR", j.merchants),
        ])
        .args(["--to", &format!("kafka://{}/{output}", broker())])
        .args(["--lateness", "5s", "--batch-size", "300", "-q"])
        .args(extra);
    c
}

/// A compacted topic without a time column, with tombstones: each version
/// is valid from its record timestamp, a tombstone deletes its key from
/// its own timestamp on (the LEFT JOIN pads with nulls until a next
/// version), and the fold equals DataFusion's as-of join over the same
/// versions with deletion flags.
#[test]
fn tombstones_delete_versions_at_their_record_timestamp() {
    let Some(_broker) = serial() else { return };
    let j = versioned_join_with_tombstones();
    let output = unique("t-out");
    let o = run_versioned_join(&j, &output, &[]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let recs = consume_all(&output, "read_committed");
    assert_matches("temporal join with tombstones", &fold_recs(&recs), &j.want);
}

/// A tombstone whose key fits no reading of the primary key (a JSON array
/// of two values for a one-column key) stops the run (`--on-error fail`,
/// the default) with a message that says what a tombstone's key must be.
#[test]
fn a_bad_tombstone_key_is_named_as_such() {
    let Some(_broker) = serial() else { return };
    let j = versioned_join_with_tombstones();
    produce_versions(
        &j.merchants,
        &[(
            r#"["m001","x"]"#.to_string(),
            None,
            ubik_testkit::events::BASE_MS + 99_999,
        )],
    );
    let o = run_versioned_join(&j, &unique("bad-key-out"), &[])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "a bad tombstone key must not pass: {err}"
    );
    assert!(
        err.contains("a tombstone's key fits no reading of the primary key (id)")
            && err.contains("a JSON array of 1 value(s)"),
        "{err}"
    );
}

/// The versioned join killed with -9 at random moments and resumed from its
/// checkpoint: the committed fold equals the oracle, and the committed
/// records are byte-identical to an uninterrupted run's, all of them.
#[test]
fn temporal_join_killed_and_resumed_over_kafka() {
    let Some(_broker) = serial() else { return };
    let j = versioned_join_with_tombstones();
    let reference_out = changelog_topic(unique("tj-ref"), 1);
    let o = run_versioned_join(&j, &reference_out, &[])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reference: BTreeSet<Rec> = consume_all(&reference_out, "read_committed")
        .into_iter()
        .collect();
    let mut rng = Rng(23);
    let mut kills = 0;
    while kills < 6 {
        let output = changelog_topic(unique("tj-out"), 1);
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        kills += kill_until_done(
            "temporal join",
            &mut rng,
            || {
                let mut c = run_versioned_join(&j, &output, &["--checkpoint-every", "700"]);
                c.arg("--checkpoint").arg(&ck);
                c
            },
            || {},
        );
        let committed = consume_all(&output, "read_committed");
        assert_matches(
            &format!("temporal join, {kills} kills so far"),
            &fold_recs(&committed),
            &j.want,
        );
        assert_same_records(
            &format!("temporal join, {kills} kills so far"),
            &committed,
            &reference,
        );
    }
}

/// A join whose table side (a topic) goes quiet: once idle it catches up
/// with the stream's watermark, and every window closes without new
/// versions; the output equals the oracle.
#[test]
fn idle_table_side_does_not_hold_the_join_back() {
    let Some(_broker) = serial() else { return };
    let merchants = unique("idle-merchants");
    create_topic_with(&merchants, 1, &[("cleanup.policy", "compact")]);
    let mut order_lines = events(3_000, 6, 1_000, 9);
    // A last order far ahead, of a merchant without versions (dropped by
    // the join): it moves the stream's watermark past every real window.
    order_lines.push(r#"{"merchant":"zz","ts":"2024-01-02T00:00:00Z","amount":1}"#.into());
    let base = ubik_testkit::events::BASE_MS;
    let merchant_lines: Vec<String> = (0..6)
        .map(|k| {
            let mut ts = Vec::new();
            ubik_engine::time::write_rfc3339_micros(&mut ts, (base - 1_000 + k) * 1000);
            format!(
                r#"{{"id":"m{k:03}","region":"r{}","ts":"{}"}}"#,
                k % 2,
                String::from_utf8(ts).unwrap()
            )
        })
        .collect();
    produce(&merchants, &merchant_lines);
    let dir = tempfile::tempdir().unwrap();
    let orders = dir.path().join("orders.jsonl");
    std::fs::write(&orders, ubik_testkit::events::jsonl(&order_lines)).unwrap();
    let sql = format!(
        "SELECT m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n \
         FROM orders o JOIN \"{merchants}\" FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id \
         GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE)"
    );
    let mut child = Running(
        ubik()
            .args(["run", &sql])
            .args(["--from", &format!("orders={}", orders.display())])
            .args(["--from", &format!("kafka://{}/{merchants}", broker())])
            .args(["--schema", &format!("orders={SCHEMA}")])
            .args([
                "--schema",
                &format!("{merchants}=id VARCHAR, region VARCHAR, ts TIMESTAMP"),
            ])
            .args(["--idle-timeout", "1s", "--lateness", "5s", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let want = ubik_testkit::oracle_tables(
        "SELECT m.region, date_bin(INTERVAL '1 minute', o.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
           count(*) AS n FROM orders o JOIN merchants m ON o.merchant = m.id GROUP BY 1, 2",
        &[
            (
                "orders",
                &read_jsonl(
                    ubik_testkit::events::jsonl(&order_lines).as_bytes(),
                    &orders_schema(SCHEMA),
                ),
            ),
            (
                "merchants",
                &read_jsonl(
                    ubik_testkit::events::jsonl(&merchant_lines).as_bytes(),
                    &orders_schema("id VARCHAR, region VARCHAR, ts TIMESTAMP"),
                ),
            ),
        ],
        &[0, 1],
    );
    // Read the changelog until it holds every window (the merchants topic
    // never ends: only idle close can close them).
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ubik_testkit::fold_lines(&lines).len() < want.len() && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    drop(child);
    assert_matches("idle table side", &ubik_testkit::fold_lines(&lines), &want);
}

/// A spawned `ubik`, killed when dropped: a failed assertion must not leave
/// it running, holding the transactional id the next run uses.
struct Running(Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_logged(mut c: std::process::Command) -> Running {
    Running(
        c.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// Runs `cmd()` again and again on the same checkpoint, killing it (-9) at
/// random moments (reading, joining, producing, committing, checkpointing)
/// until a run completes; `after_kill` checks the output after each kill.
/// Returns the number of kills.
fn kill_until_done(
    what: &str,
    rng: &mut Rng,
    cmd: impl Fn() -> std::process::Command,
    mut after_kill: impl FnMut(),
) -> usize {
    for run in 0.. {
        assert!(run < 100, "{what}: never finished");
        let mut child = spawn_logged(cmd());
        // Later runs live longer, so a slow machine (startup, fencing the
        // killed producer) still reaches a checkpoint and the round ends.
        let wait = Duration::from_millis(50 + rng.below(900) + 150 * run as u64);
        let started = Instant::now();
        while started.elapsed() < wait {
            if let Some(s) = child.try_wait().unwrap() {
                let err = child_stderr(&mut child);
                assert!(s.success(), "{what}: run failed: {err}");
                // Every run before this one was killed.
                return run;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        after_kill();
    }
    unreachable!()
}

#[test]
fn crash_suite_both_emit_modes() {
    let Some(_broker) = serial() else { return };
    let input = unique("crash-in");
    create_topic(&input, 4);
    // Some rows later than the watermark delay: late updates re-emit windows.
    let lines = events(40_000, 25, 9_000, 2);
    produce(&input, &lines);
    let want = oracle(&lines);
    let mut rng = Rng(11);
    for emit in ["transactional", "idempotent"] {
        let reference_out = changelog_topic(unique(&format!("crash-ref-{emit}")), 3);
        let o = ubik_run(&input, &reference_out, &["--emit", emit])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let reference: BTreeSet<Rec> = consume_all(&reference_out, "read_committed")
            .into_iter()
            .collect();
        let mut kills = 0;
        // Rounds: a fresh output and checkpoint, killed at random moments
        // (reading, aggregating, producing, committing, checkpointing) and
        // restarted until a run completes.
        while kills < 16 {
            let output = changelog_topic(unique(&format!("crash-out-{emit}")), 3);
            let dir = tempfile::tempdir().unwrap();
            let ck = dir.path().join("ck");
            kills += kill_until_done(
                emit,
                &mut rng,
                || {
                    let mut cmd = ubik_run(
                        &input,
                        &output,
                        &["--emit", emit, "--checkpoint-every", "3000"],
                    );
                    cmd.arg("--checkpoint").arg(&ck);
                    cmd
                },
                || {
                    if emit == "transactional" {
                        // read_committed never sees part of a window.
                        assert_windows_complete(&consume_committed_now(&output), &want);
                    }
                },
            );
            let committed = consume_all(&output, "read_committed");
            assert_matches(
                &format!("{emit}, {kills} kills so far"),
                &fold_recs(&committed),
                &want,
            );
            // Every visible record, duplicates included, is byte-identical
            // (key, value, timestamp) to a record of the uninterrupted run,
            // and every record of that run is visible.
            let visible = if emit == "transactional" {
                committed
            } else {
                consume_all(&output, "read_uncommitted")
            };
            assert_same_records(
                &format!("{emit}, {kills} kills so far"),
                &visible,
                &reference,
            );
        }
    }
}

/// For every window present, all its keys are present (a committed epoch
/// holds whole windows).
fn assert_windows_complete(recs: &[Rec], want: &State) {
    let mut expected: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for k in want.keys() {
        let v: serde_json::Value = serde_json::from_str(k).unwrap();
        expected
            .entry(v["w"].to_string())
            .or_default()
            .insert(v["merchant"].to_string());
    }
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in recs {
        let v: serde_json::Value = serde_json::from_str(&r.key).unwrap();
        seen.entry(v["w"].to_string())
            .or_default()
            .insert(v["merchant"].to_string());
    }
    for (w, keys) in &seen {
        assert_eq!(
            Some(keys),
            expected.get(w),
            "read_committed saw part of window {w}"
        );
    }
}

#[test]
fn dead_letters_carry_bytes_and_headers() {
    let Some(_broker) = serial() else { return };
    let (input, output, dlq) = (unique("dlq-in"), unique("dlq-out"), unique("dlq"));
    create_topic(&input, 1);
    let mut lines = events(100, 3, 0, 3);
    lines.insert(10, "{not json".into());
    lines.insert(50, r#"{"merchant":"x","ts":"later","amount":1}"#.into());
    produce(&input, &lines);
    let o = ubik_run(
        &input,
        &output,
        &[
            "--on-error",
            "dlq",
            "--dlq",
            &format!("kafka://{}/{dlq}", broker()),
        ],
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let letters = consume_all(&dlq, "read_committed");
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].value.as_deref(), Some("{not json"));
    assert_eq!(letters[0].header("ubik.reason"), Some("decode"));
    assert_eq!(letters[0].header("ubik.position"), Some("10"));
    assert_eq!(letters[0].header("ubik.position_kind"), Some("offset"));
    assert!(letters[0].header("ubik.source").unwrap().contains(&input));
    assert!(
        letters[1]
            .header("ubik.message")
            .unwrap()
            .contains("timestamp")
    );
    // fail: stops with the offset in the message.
    let o = ubik_run(&input, &unique("dlq-out2"), &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("offset 10"), "{}", stderr(&o));
}

fn broker_sh(cmd: &str) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testing/kafka/broker.sh");
    let s = std::process::Command::new("bash")
        .arg(script)
        .arg(cmd)
        .status()
        .unwrap();
    assert!(s.success(), "broker.sh {cmd}");
}

/// Kills `child` (if still running) and returns what it logged.
fn stop_and_log(child: &mut Child) -> String {
    let _ = child.kill();
    let _ = child.wait();
    child_stderr(child)
}

/// Waits until `topic` holds at least `n` committed records.
fn wait_for(topic: &str, n: usize, timeout: Duration) -> Vec<Rec> {
    let deadline = Instant::now() + timeout;
    loop {
        let recs = consume_all(topic, "read_committed");
        if recs.len() >= n || Instant::now() > deadline {
            return recs;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn broker_restart_sigterm_drain_and_fencing() {
    let Some(_broker) = serial() else { return };
    let (input, output) = (unique("bounce-in"), unique("bounce-out"));
    create_topic(&input, 2);
    let first = events(6_000, 10, 0, 4);
    produce(&input, &first);
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let unbounded = |ck: &std::path::Path| {
        let mut c = ubik();
        c.arg("run")
            .arg(Q.replace("{T}", &input))
            .args(["--from", &format!("kafka://{}/{input}", broker())])
            .args(["--to", &format!("kafka://{}/{output}", broker())])
            .args([
                "--schema",
                SCHEMA,
                "--lateness",
                "0s",
                "--checkpoint-interval",
                "500ms",
                "-q",
                "--idle-timeout",
                "0",
            ])
            .arg("--checkpoint")
            .arg(ck);
        c
    };
    let mut a = spawn_logged(unbounded(&ck));
    let got = wait_for(&output, 1, Duration::from_secs(30));
    assert!(
        !got.is_empty(),
        "no output before the broker restart: {}",
        stop_and_log(&mut a)
    );

    // The broker goes away for a while: ubik waits and retries, then goes on.
    broker_sh("stop");
    std::thread::sleep(Duration::from_secs(4));
    broker_sh("start");
    let second: Vec<String> = events(6_000, 10, 0, 5)
        .into_iter()
        .map(|l| l.replace("2024-01-01T", "2024-01-02T"))
        .collect();
    produce(&input, &second);
    // A far-future event on every partition closes every window of both days.
    produce_everywhere(
        &input,
        2,
        r#"{"merchant":"zz","ts":"2024-01-05T00:00:00Z","amount":0}"#,
    );
    let mut all = first.clone();
    all.extend(second.iter().cloned());
    let want: State = oracle(&all);
    let got = wait_for(&output, want.len(), Duration::from_secs(60));
    assert!(
        got.len() >= want.len(),
        "only {} records after the broker restart",
        got.len()
    );
    assert!(
        a.try_wait().unwrap().is_none(),
        "ubik died during the broker restart"
    );

    // A second instance of the same pipeline fences the first.
    let ck2 = dir.path().join("ck2");
    std::fs::create_dir_all(&ck2).unwrap();
    let mut b = spawn_logged(unbounded(&ck2));
    // New data makes the first instance write: once the second one has
    // started its producer, the first finds itself fenced. Which comes first
    // is a race, so a new far-future event every 2 s makes it write again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut day = 6;
    let mut next_event = Instant::now();
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the first instance was not fenced"
        );
        if Instant::now() >= next_event && day < 28 {
            let event =
                format!(r#"{{"merchant":"zz","ts":"2024-01-{day:02}T00:00:00Z","amount":0}}"#);
            produce_everywhere(&input, 2, &event);
            day += 1;
            next_event = Instant::now() + Duration::from_secs(2);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let err = child_stderr(&mut a);
    assert!(
        !status.success() && err.contains("took over"),
        "{status:?}: {err}"
    );
    // The outage was logged through ubik's log, not librdkafka's own stderr
    // printer ("%3|1733140000.123|FAIL|rdkafka#consumer-1| ..."), which a
    // batch-reading consumer would otherwise fall back to.
    assert!(
        err.contains("librdkafka: ") && !err.lines().any(|l| l.starts_with('%')),
        "librdkafka's log lines bypassed ubik's log:\n{err}"
    );

    // SIGTERM drains: exit 0 with output committed.
    std::thread::sleep(Duration::from_secs(2));
    let s = std::process::Command::new("kill")
        .arg("-15")
        .arg(b.id().to_string())
        .status()
        .unwrap();
    assert!(s.success());
    let status = b.wait().unwrap();
    assert!(
        status.success(),
        "SIGTERM did not drain cleanly: {status:?}"
    );
    let folded = fold_recs(&consume_all(&output, "read_committed"));
    let folded: State = folded
        .into_iter()
        .filter(|(k, _)| !k.contains("\"zz\""))
        .collect();
    assert_matches("after restart", &folded, &want);
    let _ = got;
}

/// A group member's checkpoints every 1,500 records, and a session timeout
/// short enough for a killed member's tasks to move within the test (the
/// test broker's `group.min.session.timeout.ms` allows it).
const MEMBER_FLAGS: &[&str] = &[
    "--checkpoint-every",
    "1500",
    "-X",
    "session.timeout.ms=2500",
    "-X",
    "heartbeat.interval.ms=250",
];

/// A member of consumer group `group` on `input`, its own checkpoint
/// directory `ck`, stderr to `log`, killed at `failpoint` if given.
fn group_member(
    input: &str,
    output: &str,
    group: &str,
    partitioned: bool,
    ck: &std::path::Path,
    log: &std::path::Path,
    failpoint: Option<&str>,
) -> Running {
    let partitioning: &[&str] = if partitioned {
        &["--partitioned-by", "merchant"]
    } else {
        &[]
    };
    let mut c = ubik_run(
        input,
        output,
        &[&["--group", group][..], partitioning, MEMBER_FLAGS].concat(),
    );
    c.arg("--checkpoint").arg(ck).env("RUST_LOG", "info");
    if let Some(f) = failpoint {
        c.env("UBIK_FAILPOINT", f);
    }
    let log = std::fs::File::create(log).unwrap();
    Running(c.stdout(Stdio::null()).stderr(log).spawn().unwrap())
}

/// Produces `lines` round-robin over `partitions`: a merchant's rows are in
/// every partition, so the input is not partitioned by the query's key.
fn produce_spread(topic: &str, partitions: i32, lines: &[String]) {
    let p = test_producer();
    for (i, l) in lines.iter().enumerate() {
        send_waiting(
            &p,
            BaseRecord::<[u8], [u8]>::to(topic)
                .payload(l.as_bytes())
                .partition(i as i32 % partitions),
        );
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_consumer_group_shares_the_work_survives_a_kill_and_takes_a_new_member() {
    // Keyed by merchant: all rows of a result key are in one partition.
    group_case("group", true);
}

#[test]
fn a_group_repartitions_an_input_not_partitioned_by_the_key() {
    // Spread: every task's rows go through the repartition topic.
    group_case("regroup", false);
}

/// A lone member of a repartitioned group on a bounded input runs both
/// stages and ends by itself once every keyed task has seen every first
/// stage end; its records are a single process's, every version.
#[test]
fn a_lone_member_of_a_repartitioned_group_ends_with_its_bounded_input() {
    let Some(_broker) = serial() else { return };
    let input = unique("lone-in");
    create_topic(&input, 3);
    let lines = events(20_000, 20, 9_000, 8);
    // Rows an hour behind every watermark at the end, past the windows'
    // retention: late, so rejected (and left out of the oracle's input).
    let late: Vec<String> = (0..6)
        .map(|i| format!(r#"{{"merchant":"m00{i}","ts":"2023-12-31T23:00:0{i}Z","amount":1.5}}"#))
        .collect();
    produce_spread(&input, 3, &[lines.clone(), late].concat());
    let reference_out = changelog_topic(unique("lone-ref"), 3);
    let dlq = |name: &str| -> [String; 4] {
        [
            "--on-error".into(),
            "dlq".into(),
            "--dlq".into(),
            format!("kafka://{}/{name}", broker()),
        ]
    };
    let (reference_dlq, lone_dlq) = (unique("lone-ref-dlq"), unique("lone-dlq"));
    let o = ubik_run(
        &input,
        &reference_out,
        &dlq(&reference_dlq).each_ref().map(String::as_str),
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reference: BTreeSet<Rec> = consume_all(&reference_out, "read_committed")
        .into_iter()
        .collect();
    let output = changelog_topic(unique("lone-out"), 3);
    let dir = tempfile::tempdir().unwrap();
    let group = unique("lone");
    let mut c = ubik_run(
        &input,
        &output,
        &[
            &["--group", &group, "--checkpoint-every", "1500"][..],
            &dlq(&lone_dlq).each_ref().map(String::as_str)[..],
        ]
        .concat(),
    );
    let port = free_port();
    c.arg("--checkpoint")
        .arg(dir.path().join("ck"))
        .args(["--metrics", &format!("127.0.0.1:{port}")]);
    let mut member = spawn_logged(c);
    let started = Instant::now();
    // The status page's stages, as the member saw them with all its tasks
    // open, and last.
    let mut stages = serde_json::Value::Null;
    let mut last = serde_json::Value::Null;
    let status = loop {
        if let Some(s) = member.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the lone member did not end with its input"
        );
        if let Some((200, _, body)) = http_get(port, "/status.json") {
            let s: serde_json::Value = serde_json::from_str(&body).unwrap();
            if s["stages"].as_array().is_some_and(|g| g.len() == 2) {
                last = s["stages"].clone();
            }
            if s["stages"].as_array().is_some_and(|g| {
                g.len() == 2
                    && g.iter()
                        .all(|g| g["here"].as_array().map(Vec::len) == Some(3))
            }) {
                stages = s["stages"].clone();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = child_stderr(&mut member);
    assert!(status.success(), "{err}");
    // Two stages: the first reads the input and routes rows by the result
    // key through the repartition topic, which the keyed stage reads.
    let repartition = format!("{group}-ubik-repartition");
    assert_eq!(stages[0]["reads"], input.as_str(), "{stages}");
    assert_eq!(stages[0]["writes"], repartition.as_str(), "{stages}");
    assert_eq!(stages[1]["reads"], repartition.as_str(), "{stages}");
    assert_eq!(stages[1]["writes"], output.as_str(), "{stages}");
    assert_eq!(
        stages[1]["key"],
        serde_json::json!(["merchant", "w"]),
        "{stages}"
    );
    assert_eq!(stages[1]["tasks"], 3, "{stages}");
    assert!(
        stages[1]["name"].as_str().unwrap().contains("TUMBLE"),
        "{stages}"
    );
    // Each stage's tasks count what they read and the CPU they used: the
    // cost of each side of the exchange.
    for g in last.as_array().unwrap() {
        assert!(g["records_in"].as_u64().unwrap() > 0, "{last}");
        assert!(g["cpu_s"].as_f64().unwrap() > 0.0, "{last}");
    }
    let committed = consume_all(&output, "read_committed");
    assert_matches("lone member", &fold_recs(&committed), &oracle(&lines));
    assert_same_records("lone member", &committed, &reference);
    // The rows the keyed tasks reject (late by their stamps) reach the dead
    // letters as the single process sends them: original bytes, input
    // partition and offset, reason.
    let letters = |topic: &str| -> BTreeSet<(Option<String>, String, String, String)> {
        consume_all(topic, "read_committed")
            .into_iter()
            .map(|r| {
                let h = |k: &str| r.header(k).unwrap_or_default().to_string();
                (
                    r.value.clone(),
                    h("ubik.reason"),
                    h("ubik.partition"),
                    h("ubik.position"),
                )
            })
            .collect()
    };
    let want_letters = letters(&reference_dlq);
    assert!(
        want_letters.iter().any(|l| l.1 == "late"),
        "the input has no rows late enough to be dead letters: {want_letters:?}"
    );
    assert_eq!(letters(&lone_dlq), want_letters, "the group's dead letters");
}

/// A group task's continuous GROUP BY spills (1 MiB budget) and replicates
/// its state to the state topic as deltas: a checkpoint uploads the runs
/// written since the previous one and keeps the others. Its owner dies in
/// the middle of a replication (new runs sent, not their manifest); a
/// second member restores the tasks from Kafka, base runs plus deltas, and
/// the group's committed records are exactly a single process's.
#[test]
fn a_group_task_restores_its_state_from_incremental_checkpoints_in_kafka() {
    const CONTINUOUS: &str =
        "SELECT merchant, count(*) AS n, sum(amount) AS total FROM \"{T}\" GROUP BY merchant";
    const CONTINUOUS_ORACLE: &str =
        "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant";
    let Some(_broker) = serial() else { return };
    let input = unique("delta-in");
    create_topic(&input, 2);
    // The first 40 000 events each bring a new key: several MiB of state,
    // far over the budget. The next 60 000 touch 200 keys: checkpoints then
    // change little of the state.
    let lines: Vec<String> = events(100_000, 1_000, 3_000, 17)
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(&l).unwrap();
            v["merchant"] = match i < 40_000 {
                true => format!("new{i:05}"),
                false => format!("hot{:03}", i % 200),
            }
            .into();
            v.to_string()
        })
        .collect();
    produce(&input, &lines);
    let run = |output: &str, extra: &[&str]| {
        ubik_run_query(
            CONTINUOUS,
            &input,
            output,
            &[&["--state-memory", "1MiB"], extra].concat(),
        )
    };
    let reference_out = changelog_topic(unique("delta-ref"), 3);
    let o = run(&reference_out, &[]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reference_recs = consume_all(&reference_out, "read_committed");
    let text = ubik_testkit::events::jsonl(&lines);
    let input_rows = read_jsonl(text.as_bytes(), &orders_schema(SCHEMA));
    let want = one_shot(CONTINUOUS_ORACLE, &input_rows, &[0]);
    assert_matches("single process", &fold_recs(&reference_recs), &want);
    let reference: BTreeSet<Rec> = reference_recs.into_iter().collect();

    let output = changelog_topic(unique("delta-out"), 3);
    let group = unique("delta");
    let dir = tempfile::tempdir().unwrap();
    let member = |i: usize, failpoint: Option<&str>| {
        let mut c = run(
            &output,
            &[
                "--group",
                &group,
                "--partitioned-by",
                "merchant",
                "--checkpoint-every",
                "4000",
                "-X",
                "session.timeout.ms=2500",
                "-X",
                "heartbeat.interval.ms=250",
            ],
        );
        c.arg("--checkpoint")
            .arg(dir.path().join(format!("ck{i}")))
            .env("UBIK_LOG", "info,ubik_kafka::state=debug");
        if let Some(f) = failpoint {
            c.env("UBIK_FAILPOINT", f);
        }
        c.output().unwrap()
    };
    // Two tasks: the 16th replication is about each task's 8th checkpoint,
    // past the new keys.
    let first = member(0, Some("checkpoint-replica:16"));
    let log0 = stderr(&first);
    assert!(
        log0.contains("failpoint"),
        "the first member did not die at its failpoint:\n{log0}"
    );
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    // Once the new keys are in, checkpoints keep the runs earlier ones
    // uploaded and send a small delta: the topic gets what changed.
    let saves: Vec<(u64, u64)> = log0
        .lines()
        .filter(|l| l.contains("checkpoint replicated"))
        .filter_map(|l| Some((field(l, "shared_kept")?, field(l, "shared_bytes")?)))
        .collect();
    let largest = saves.iter().map(|s| s.1).max().unwrap_or(0);
    assert!(
        saves
            .iter()
            .any(|&(kept, bytes)| kept > 0 && bytes * 10 < largest),
        "no checkpoint sent a small delta, (runs kept, bytes sent): {saves:?}\n{log0}"
    );
    let second = member(1, None);
    let log1 = stderr(&second);
    assert!(second.status.success(), "{log1}");
    let restored: Vec<u64> = log1
        .lines()
        .filter(|l| l.contains("restored the checkpoint from its replica"))
        .filter_map(|l| field(l, "runs"))
        .collect();
    assert!(
        restored.iter().any(|&runs| runs >= 2),
        "no task was restored from several runs (a base and deltas): {restored:?}\n{log1}"
    );
    let committed = consume_all(&output, "read_committed");
    assert_matches("group output", &fold_recs(&committed), &want);
    assert_same_records("group output", &committed, &reference);
}

/// 3 members of a group on a 6-partition topic, one killed with -9 mid-run
/// and a fourth started, another killed at a failpoint (mid-checkpoint or
/// right after a commit) and a fifth started: the read_committed fold of the output equals the
/// one-shot oracle and a single process's, the records (duplicates of
/// replays aside) are byte-identical to the single process's, all of them, and
/// `ubik status` shows the members and every task caught up. With
/// `partitioned`, the input is keyed by the query's key; without, it is
/// spread and the group repartitions it.
fn group_case(name: &str, partitioned: bool) {
    let Some(_broker) = serial() else { return };
    let input = unique(&format!("{name}-in"));
    create_topic(&input, 6);
    let lines = events(240_000, 60, 9_000, 5);
    if partitioned {
        produce(&input, &lines);
    } else {
        produce_spread(&input, 6, &lines);
    }
    let want = oracle(&lines);
    let reference_out = changelog_topic(unique(&format!("{name}-ref")), 3);
    let o = ubik_run(&input, &reference_out, &[]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reference_recs = consume_all(&reference_out, "read_committed");
    let reference_fold = fold_recs(&reference_recs);
    assert_matches("single process", &reference_fold, &want);
    let reference: BTreeSet<Rec> = reference_recs.into_iter().collect();

    let output = changelog_topic(unique(&format!("{name}-out")), 3);
    let group = unique(name);
    let dir = tempfile::tempdir().unwrap();
    // Member 1 dies at a kill point a random kill rarely hits: in the middle
    // of a checkpoint's replication (its chunks sent, not its manifest), or
    // between a transaction's commit and its checkpoint.
    let failpoint = match partitioned {
        true => "checkpoint-replica:12",
        false => "after-commit:12",
    };
    let member = |i: usize| {
        group_member(
            &input,
            &output,
            &group,
            partitioned,
            &dir.path().join(format!("ck{i}")),
            &dir.path().join(format!("log{i}")),
            (i == 1).then_some(failpoint),
        )
    };
    let mut members: Vec<Running> = (0..3).map(member).collect();
    let log = |i: usize| std::fs::read_to_string(dir.path().join(format!("log{i}"))).unwrap();
    // Killed mid-run: its tasks move to the others after the session
    // timeout and replay from their last replicated checkpoint. At 4 s at
    // the earliest, and once it runs a task (the group's first rebalances
    // can take longer on a loaded machine), plus a second of work.
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(4_000));
    while !log(0).contains("task started") && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if started.elapsed() > Duration::from_millis(4_100) {
        std::thread::sleep(Duration::from_millis(1_000));
    }
    assert!(
        members[0].try_wait().unwrap().is_none(),
        "a member exited before the kill"
    );
    members[0].kill().unwrap();
    members[0].wait().unwrap();
    assert!(
        log(0).contains("task started"),
        "the killed member had no task:\n{}",
        (0..3).map(log).collect::<Vec<_>>().join("\n----\n")
    );
    // A fourth member joins and takes tasks over from the living ones.
    members.push(member(3));
    let died = Instant::now();
    while members[1].try_wait().unwrap().is_none() {
        assert!(
            died.elapsed() < Duration::from_secs(60),
            "member 1 never reached its failpoint {failpoint}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        log(1).contains("failpoint"),
        "member 1 exited but not at its failpoint:\n{}",
        log(1)
    );
    // A fifth replaces it.
    members.push(member(4));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut committed;
    loop {
        committed = consume_all(&output, "read_committed");
        if fold_recs(&committed) == reference_fold || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The status command sees the three living members and every task
    // caught up (a finished task's last checkpoint is at the end offset).
    // The keyed tasks of a repartitioned group are listed too, caught up
    // once their last checkpoint has passed the repartition topic's end;
    // the status is read until then (up to 30 s: checkpoints are periodic).
    let tables = |text: &str| -> Vec<Vec<Vec<String>>> {
        text.split("\n\n")
            .filter(|t| t.lines().any(|l| l.starts_with("task ")))
            .map(|t| {
                t.lines()
                    .skip_while(|l| !l.starts_with("task "))
                    .skip(1)
                    .map(|l| l.split_whitespace().map(String::from).collect())
                    .collect()
            })
            .collect()
    };
    let caught_up = |text: &str| -> bool {
        let tables = tables(text);
        let first = tables.first().map_or(&[][..], |t| t.as_slice());
        let keyed_ok = partitioned
            || tables
                .get(1)
                .is_some_and(|t| t.len() == 6 && t.iter().all(|r| r[4] == "0"));
        first.len() == 6 && first.iter().all(|t| t[1] != "(unassigned)" && t[5] == "0") && keyed_ok
    };
    let asked = Instant::now();
    let text = loop {
        let status = run(&[
            "status",
            "--group",
            &group,
            "--from",
            &format!("kafka://{}/{input}", broker()),
        ]);
        assert!(status.status.success(), "{}", stderr(&status));
        let text = stdout(&status);
        if caught_up(&text) || asked.elapsed() > Duration::from_secs(30) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(text.contains(": Stable, 3 members, 6 tasks"), "{text}");
    assert!(caught_up(&text), "a task is not owned or behind:\n{text}");
    for m in &mut members[2..] {
        // SIGTERM: each commits, checkpoints and leaves the group.
        let _ = std::process::Command::new("kill")
            .arg(m.id().to_string())
            .status();
        let status = m.wait().unwrap();
        assert!(status.success(), "a member failed: {status}");
    }
    let logs: Vec<String> = (0..5).map(log).collect();
    assert_matches("group output", &fold_recs(&committed), &want);
    assert!(
        fold_recs(&committed) == reference_fold,
        "the group's latest values differ from the single process's"
    );
    assert!(
        logs.iter()
            .any(|l| l.contains("restored the checkpoint from its replica")),
        "no task was restored from the state topic:\n{}",
        logs.join("\n----\n")
    );
    if !partitioned {
        assert!(
            logs.iter()
                .any(|l| l.contains("repartitioning by the result key"))
                && logs.iter().any(|l| l.contains("task=keyed-")),
            "the group did not repartition:\n{}",
            logs.join("\n----\n")
        );
    }
    if !partitioned {
        // The keyed tasks delete what their durable checkpoints have passed.
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker())
            .create()
            .unwrap();
        let repartition = format!("{group}-ubik-repartition");
        let (low, high): (i64, i64) = (0..6)
            .map(|p| {
                c.fetch_watermarks(&repartition, p, Duration::from_secs(10))
                    .unwrap()
            })
            .fold((0, 0), |(l, h), (pl, ph)| (l + pl, h + ph));
        assert!(
            low > high / 2,
            "the repartition topic was not cleaned: {low} of {high} records deleted"
        );
    }
    assert!(
        logs[3].contains("task started"),
        "the new member got no task:\n{}",
        logs[3]
    );
    // Bytes: the group's records, duplicates of replays aside, are exactly
    // the single process's (key, value, timestamp).
    assert_same_records("group output", &committed, &reference);
}

/// Nexmark q9's shape over two topics spread at random: each auction with
/// its highest bid made while it was open.
const JOIN_Q: &str = "SELECT id, category, price, bid_ts FROM (SELECT A.id, A.category, B.price, B.ts AS bid_ts, \
     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.ts ASC) AS rn \
     FROM auction A JOIN bid B ON A.id = B.auction AND B.ts BETWEEN A.ts AND A.expires) WHERE rn <= 1";

/// Auctions (one per 10 ms, open 0.2 to 3 s) and bids (ten per auction, on
/// auctions opened lately), both out of order by up to a second.
fn auctions_and_bids(auctions: i64, seed: u64) -> (Vec<String>, Vec<String>) {
    let mut rng = Rng(seed);
    let ts = |ms: i64| {
        let mut b = Vec::new();
        ubik_engine::time::write_rfc3339_micros(&mut b, ms * 1000);
        String::from_utf8(b).unwrap()
    };
    let base = ubik_testkit::events::BASE_MS;
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..auctions {
        let at = base + i * 10 - rng.below(1000) as i64;
        a.push(format!(
            r#"{{"id":{i},"ts":"{}","expires":"{}","category":{}}}"#,
            ts(at),
            ts(at + 200 + rng.below(2800) as i64),
            rng.below(10)
        ));
        for j in 0..10 {
            b.push(format!(
                r#"{{"auction":{},"ts":"{}","price":{}}}"#,
                (i - rng.below(200) as i64).max(0),
                ts(base + i * 10 + j - rng.below(1000) as i64),
                rng.below(10_000)
            ));
        }
    }
    (a, b)
}

/// An input table of a join case: its SQL name, declared schema and records.
struct Table {
    name: &'static str,
    schema: &'static str,
    lines: Vec<String>,
}

/// `ubik run` of `sql` over `tables` (each its SQL name, topic and schema).
fn join_run(
    sql: &str,
    tables: &[(&str, String, &str)],
    output: &str,
    extra: &[&str],
) -> std::process::Command {
    let mut c = ubik();
    c.args(["run", sql]);
    for (name, topic, schema) in tables {
        c.args([
            "--from",
            &format!("{name}=kafka://{}/{topic}?end=latest", broker()),
            "--schema",
            &format!("{name}={schema}"),
        ]);
    }
    c.args([
        "--to",
        &format!("kafka://{}/{output}?partitions=3", broker()),
        "--batch-size",
        "300",
        "-q",
    ])
    .args(extra);
    c
}

/// A join of topics spread at random (4 partitions each) runs across a
/// group: first stages route each side (by the join key, or all to one
/// keyed task), keyed tasks join. One member is killed -9 mid-run and two
/// others are armed to die at `failpoint` (between a transaction's commit
/// and its checkpoint, or inside an exchange, between a first stage's
/// produce and its commit, which only a member owning a first stage task
/// reaches); at least one does. A fourth joins, armed only with a failing
/// replica read (it opens the task again). The group's committed records are one
/// process's, byte for byte, every version, and at least `min_records`.
/// (Before joins were routed, every member stopped with "a join cannot be
/// repartitioned by key yet".)
fn group_join_case(
    name: &str,
    sql: &str,
    tables: Vec<Table>,
    extra: &[&str],
    min_records: usize,
    failpoint: &str,
) {
    let Some(_broker) = serial() else { return };
    let inputs: Vec<(&str, String, &str)> = tables
        .iter()
        .map(|t| {
            let topic = unique(&format!("{name}-{}", t.name));
            create_topic(&topic, 4);
            produce_spread(&topic, 4, &t.lines);
            (t.name, topic, t.schema)
        })
        .collect();
    // Not compacted (a pass-through's records have no key), kept forever
    // (the rows' times are in the past).
    let topic = |what: &str| {
        let t = unique(&format!("{name}-{what}"));
        create_topic_with(&t, 3, &[("retention.ms", "-1")]);
        t
    };
    let reference_out = topic("ref");
    let o = join_run(sql, &inputs, &reference_out, extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let reference_recs = consume_all(&reference_out, "read_committed");
    assert!(
        reference_recs.len() >= min_records,
        "too few records to compare: {}",
        reference_recs.len()
    );
    let reference: BTreeSet<Rec> = reference_recs.into_iter().collect();

    let output = topic("out");
    let group = unique(name);
    let dir = tempfile::tempdir().unwrap();
    let member = |i: usize| {
        let mut c = join_run(
            sql,
            &inputs,
            &output,
            &[extra, &["--group", &group], MEMBER_FLAGS].concat(),
        );
        c.arg("--checkpoint")
            .arg(dir.path().join(format!("ck{i}")))
            .env("RUST_LOG", "info");
        // Two members are armed: a failpoint inside an exchange is reached
        // only by a member that owns a first stage (routing) task.
        if i == 1 || i == 2 {
            c.env("UBIK_FAILPOINT", failpoint);
        }
        // The fourth one's first read of a replica fails as a broker's
        // passing trouble would (a partition's leader moving): it opens
        // the task again (before, it exited with the error).
        if i == 3 {
            c.env("UBIK_FAILPOINT", "replica-load:1");
        }
        let log = std::fs::File::create(dir.path().join(format!("log{i}"))).unwrap();
        Running(c.stdout(Stdio::null()).stderr(log).spawn().unwrap())
    };
    let log = |i: usize| std::fs::read_to_string(dir.path().join(format!("log{i}"))).unwrap();
    let mut members: Vec<Running> = (0..3).map(member).collect();
    let started = Instant::now();
    while !log(0).contains("task started") && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        members[0].try_wait().unwrap().is_none(),
        "a member exited before the kill:\n{}",
        log(0)
    );
    members[0].kill().unwrap();
    members[0].wait().unwrap();
    // A fourth member takes the dead one's place.
    members.push(member(3));
    // The fourth member is not armed to die: it stays whatever the others do.
    let died = Instant::now();
    loop {
        let exited: Vec<usize> = (1..3)
            .filter(|&i| members[i].try_wait().unwrap().is_some())
            .collect();
        for &i in &exited {
            assert!(
                log(i).contains("failpoint"),
                "member {i} exited but not at its failpoint:\n{}",
                log(i)
            );
        }
        if !exited.is_empty() {
            break;
        }
        assert!(
            died.elapsed() < Duration::from_secs(60),
            "no armed member reached its failpoint:\n{}\n----\n{}",
            log(1),
            log(2)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every version of every key (a pass-through's every row), replays'
    // copies aside.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut committed;
    loop {
        committed = consume_all(&output, "read_committed");
        let got: BTreeSet<&Rec> = committed.iter().collect();
        if got.len() == reference.len() && reference.iter().all(|r| got.contains(r))
            || Instant::now() > deadline
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let logs: Vec<String> = (0..4).map(log).collect();
    for m in &mut members[1..] {
        // Done with: no need to wait for a graceful hand-over. A member that
        // died at its failpoint is gone already.
        let _ = m.kill();
        let _ = m.wait();
    }
    // The first table's routing tasks are `shuffle-P`, the others' `shuffle-T-P`.
    let routed = |i: usize| {
        let task = match i {
            0 => "task=shuffle-".to_string(),
            _ => format!("task=shuffle-{i}-"),
        };
        logs.iter().any(|l| l.contains(&task))
    };
    assert!(
        (0..inputs.len()).all(routed) && logs.iter().any(|l| l.contains("task=keyed-")),
        "the group did not route every topic to keyed tasks:\n{}",
        logs.join("\n----\n")
    );
    assert!(
        logs[3].contains("failpoint replica-load; retrying"),
        "the fourth member met no failing replica read:\n{}",
        logs[3]
    );
    assert_same_records(&format!("{name}: group output"), &committed, &reference);
}

#[test]
fn a_group_joins_two_topics_spread_at_random() {
    let (auctions, bids) = auctions_and_bids(6_000, 7);
    group_join_case(
        "gj",
        JOIN_Q,
        vec![
            Table {
                name: "auction",
                schema: "id BIGINT, ts TIMESTAMP, expires TIMESTAMP, category BIGINT",
                lines: auctions,
            },
            Table {
                name: "bid",
                schema: "auction BIGINT, ts TIMESTAMP, price BIGINT",
                lines: bids,
            },
        ],
        &["--event-time", "ts", "--lateness", "1s"],
        3_000,
        "after-commit:20",
    );
}

/// `events` Nexmark events' rows of `table` as JSON lines (the generator's
/// one stream, as `nexmark://` reads it), `rate` events per second of
/// event time.
fn nexmark_lines(table: &str, events: usize, rate: usize) -> Vec<String> {
    let o = ubik()
        .args(["run", &format!("SELECT * FROM {table}")])
        .args([
            "--from",
            &format!("nexmark://{table}?events={events}&rate={rate}"),
            "-q",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // Each stdout line is {"key":…,"value":ROW}.
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["value"].to_string())
        .collect()
}

/// The golden Nexmark query `q` (`bench/nexmark/q.sql`) over the
/// generator's first `events` events, each table it reads spread over a
/// topic of its own, run across a group by [`group_join_case`]: the member
/// that dies at a failpoint dies inside an exchange, at its first stage's
/// first commit, its routed rows produced into the exchange's transaction,
/// uncommitted. The group's records must be one process's, every version.
fn nexmark_group_case(q: &str, tables: &[&'static str], events: usize, min_records: usize) {
    let sql = std::fs::read_to_string(format!(
        "{}/../../bench/nexmark/{q}.sql",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    // An auction has two TIMESTAMP columns: say which is the event time.
    let event_time: &[&str] = match tables.contains(&"auction") {
        true => &["--event-time", "date_time"],
        false => &[],
    };
    let tables = tables
        .iter()
        .map(|&name| Table {
            name,
            schema: match name {
                "person" => "id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR",
                "auction" => "id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR",
                _ => "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR",
            },
            lines: nexmark_lines(name, events, 1_000),
        })
        .collect();
    group_join_case(
        &format!("g{q}"),
        &sql,
        tables,
        event_time,
        min_records,
        "exchange-before-commit:1",
    );
}

/// Each bid with its auction as of the bid's time (a temporal join): both
/// sides routed by the auction id.
#[test]
fn nexmark_q20_runs_across_a_group() {
    nexmark_group_case("q20", &["bid", "auction"], 50_000, 1_000);
}

/// Auctions joined with their sellers as of the auction (a temporal join
/// keyed by the person id).
#[test]
fn nexmark_q3_runs_across_a_group() {
    nexmark_group_case("q3", &["auction", "person"], 50_000, 5);
}

/// An average over each auction's winning bid: a join, and an aggregation
/// over its aggregation (one keyed task: the outer key is not the join's).
#[test]
fn nexmark_q4_runs_across_a_group() {
    nexmark_group_case("q4", &["auction", "bid"], 50_000, 5);
}

/// The hottest auctions per sliding window: a self-join of bid counts with
/// their window's maximum (a keyless stage: one keyed task).
#[test]
fn nexmark_q5_runs_across_a_group() {
    nexmark_group_case("q5", &["bid"], 50_000, 20);
}

/// The average winning price of a seller's last ten auctions: a join, a
/// top-1 and OVER.
#[test]
fn nexmark_q6_runs_across_a_group() {
    nexmark_group_case("q6", &["auction", "bid"], 50_000, 20);
}

/// The highest bids per tumbling window: a self-join with the window's
/// maximum (keyless: one keyed task).
#[test]
fn nexmark_q7_runs_across_a_group() {
    nexmark_group_case("q7", &["bid"], 50_000, 5);
}

/// People who opened auctions in the window they registered in: a join of
/// two windowed aggregations by person id.
#[test]
fn nexmark_q8_runs_across_a_group() {
    nexmark_group_case("q8", &["person", "auction"], 50_000, 5);
}

/// Each auction's winning bid (an interval join and a top-1 by auction).
#[test]
fn nexmark_q9_runs_across_a_group() {
    nexmark_group_case("q9", &["auction", "bid"], 50_000, 20);
}

/// The latest bid per bidder and auction (a top-1 routed by its PARTITION BY).
#[test]
fn nexmark_q18_runs_across_a_group() {
    nexmark_group_case("q18", &["bid"], 50_000, 1_000);
}

/// The ten highest bids per auction (a top-10 routed by its PARTITION BY).
#[test]
fn nexmark_q19_runs_across_a_group() {
    nexmark_group_case("q19", &["bid"], 50_000, 1_000);
}
