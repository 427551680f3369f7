//! Crash/resume: `ubik run --checkpoint` killed with SIGKILL at random
//! points, restarted until it finishes. Every run's output must be a
//! byte-identical slice of an uninterrupted run's output (so every
//! duplicate equals its first copy), and the union folded latest-per-key
//! must equal DataFusion's one-shot answer over the same input.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use ubik_testkit::{
    ORDERS, Orders, Rng, State, assert_matches, fold_lines, orders_schema, read_jsonl,
};

const Q: &str = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
const ORACLE: &str = "SELECT merchant, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY 1, 2";
const SCHEMA: &str = ORDERS;

fn lines(bytes: &[u8]) -> Vec<String> {
    // A kill can cut the last line short: only complete lines count.
    let text = String::from_utf8_lossy(bytes);
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    complete.lines().map(String::from).collect()
}

/// DataFusion's one-shot answer over the input file, keyed (merchant, w).
fn oracle(path: &std::path::Path) -> State {
    let input = read_jsonl(&std::fs::read(path).unwrap(), &orders_schema(SCHEMA));
    ubik_testkit::oracle(ORACLE, &input, &[0, 1])
}

#[test]
fn kill_9_at_random_points_then_resume() {
    let dir = tempfile::tempdir().unwrap();
    // Some rows arrive later than the watermark delay: late updates re-emit windows.
    let data = Orders::new(300_000, 40, 8, 8_000).write(dir.path(), "orders.jsonl", 42);
    let args = run_args(Q, &data, &["--lateness", "5s", "--batch-size", "500"], 2500);
    crash_rounds(dir.path(), args, &oracle(&data), 20);
}

/// A continuous GROUP BY over more keys than its memory budget holds:
/// groups spill to the state store after every batch, checkpoints write
/// the changed groups as new runs and name the runs they rest on, and a
/// kill anywhere (mid-spill, mid-compaction, mid-checkpoint) resumes from
/// the last checkpoint's runs with a byte-identical replay.
#[test]
fn spilling_state_killed_and_resumed() {
    const Q: &str = "SELECT merchant, count(*) AS n, sum(amount) AS total, max(amount) AS mx FROM orders GROUP BY merchant";
    const ORACLE: &str = "SELECT merchant, count(*) AS n, sum(amount) AS total, max(amount) AS mx FROM orders GROUP BY merchant";
    let dir = tempfile::tempdir().unwrap();
    crash_spilling(dir.path(), Q, ORACLE, &[0], 11, &[]);
    // The last round's store holds runs, and only those its checkpoints name.
    let state = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("state"))
        .filter(|p| p.is_dir())
        .last()
        .expect("a checkpoint directory with a state store");
    let runs = std::fs::read_dir(&state)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "arrow"))
        })
        .count();
    assert!(runs > 0, "no state runs in {}", state.display());
}

/// A top-2 per merchant over more merchants than its budget holds: every
/// key's top goes to the store's table `ranks` after each batch and is read
/// back when the key comes again; kills anywhere resume with a
/// byte-identical replay, and the ranks equal DataFusion's ROW_NUMBER.
#[test]
fn spilling_top_n_killed_and_resumed() {
    const Q: &str = "SELECT merchant, amount, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 2";
    let dir = tempfile::tempdir().unwrap();
    crash_spilling(dir.path(), Q, Q, &[0, 2], 12, &[]);
}

/// A moving average over each merchant-prefix's top merchants (window
/// functions over a top-1 per merchant, Nexmark q6's shape) with more
/// state than its budget holds: the tops go to the table `ranks`, each
/// prefix's rows to the table `over`, after every batch, and are read back
/// when a change reaches them; kills anywhere resume with a byte-identical
/// replay, and the result equals DataFusion's window functions.
#[test]
fn spilling_window_functions_killed_and_resumed() {
    const Q: &str = "SELECT Q.merchant, avg(Q.amount) OVER (PARTITION BY substr(Q.merchant, 1, 4) ORDER BY Q.ts ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) AS recent FROM (SELECT * FROM (SELECT merchant, ts, amount, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1) Q";
    // Ties are broken by the rows' columns, ascending, as ubik does.
    const ORACLE: &str = "SELECT Q.merchant, avg(Q.amount) OVER (PARTITION BY substr(Q.merchant, 1, 4) ORDER BY Q.ts, Q.merchant, Q.amount, Q.rn ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) AS recent FROM (SELECT * FROM (SELECT merchant, ts, amount, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY amount DESC, merchant, ts, amount) AS rn FROM orders) WHERE rn <= 1) Q";
    let dir = tempfile::tempdir().unwrap();
    let log = store_log(crash_spilling(dir.path(), Q, ORACLE, &[0], 14, &[]));
    assert!(
        log.contains("table=over") && log.contains("table=ranks"),
        "the tops and the trees were not both written: {log}"
    );
}

/// 5-minute windows over more merchants than the budget holds, with late
/// rows (1 s watermark delay, 3 s disorder) kept for a minute: the open
/// windows' groups and the closed windows (updated by late rows) go to
/// their store tables after every batch, a closing window is read back
/// whole, and kills anywhere resume with a byte-identical replay.
#[test]
fn spilling_windows_killed_and_resumed() {
    const Q: &str = "SELECT merchant, TUMBLE(ts, INTERVAL '5 MINUTES') AS w, count(*) AS n, sum(amount) AS total, max(amount) AS mx FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '5 MINUTES')";
    const ORACLE: &str = "SELECT merchant, date_bin(INTERVAL '5 minutes', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, sum(amount) AS total, max(amount) AS mx FROM orders GROUP BY 1, 2";
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--lateness", "1s", "--retention", "1m"];
    // The windows did go to the store.
    let log = store_log(crash_spilling(dir.path(), Q, ORACLE, &[0, 1], 13, &flags));
    assert!(
        log.contains("table=window/"),
        "no window state was written: {log}"
    );
}

/// A self interval join, each order with every order of its merchant
/// within a minute, counted per 5-minute window, with more rows held than
/// the budget: fired rows go out by merchant after every batch (the
/// tables `join/spilled/<side>`) and come back when a row of the merchant
/// comes; kills anywhere resume with a byte-identical replay, and the
/// result equals DataFusion's join.
#[test]
fn spilling_interval_join_killed_and_resumed() {
    const Q: &str = "SELECT a.merchant, TUMBLE(a.ts, INTERVAL '5 MINUTES') AS w, count(*) AS n, max(b.amount) AS top FROM orders a JOIN orders b ON a.merchant = b.merchant AND b.ts BETWEEN a.ts - INTERVAL '1 MINUTE' AND a.ts + INTERVAL '1 MINUTE' GROUP BY a.merchant, TUMBLE(a.ts, INTERVAL '5 MINUTES')";
    const ORACLE: &str = "SELECT a.merchant, date_bin(INTERVAL '5 minutes', a.ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, max(b.amount) AS top FROM orders a JOIN orders b ON a.merchant = b.merchant AND b.ts BETWEEN a.ts - INTERVAL '1 minute' AND a.ts + INTERVAL '1 minute' GROUP BY 1, 2";
    let dir = tempfile::tempdir().unwrap();
    let log = store_log(crash_spilling(dir.path(), Q, ORACLE, &[0, 1], 15, &[]));
    assert!(
        log.contains("spilled/0") && log.contains("spilled/1"),
        "the join's rows were not written: {log}"
    );
}

/// The state store's debug log of `ubik run ARGS` (which tables it wrote).
fn store_log(args: Vec<String>) -> String {
    let run = ubik()
        .arg("run")
        .args(args)
        .env("UBIK_LOG", "ubik_state=debug")
        .output()
        .unwrap();
    stderr(&run)
}

/// Crash rounds of `q` over 30 000 merchants (several MiB of state, far
/// more than the 1 MiB budget), against `oracle` keyed by `key_columns`;
/// `extra` flags are added (`--lateness 5s` unless they set it). Returns
/// the arguments of the run without checkpoints.
fn crash_spilling(
    dir: &std::path::Path,
    q: &str,
    oracle: &str,
    key_columns: &[usize],
    seed: u64,
    extra: &[&str],
) -> Vec<String> {
    let data = Orders::new(120_000, 30_000, 10, 3_000).write(dir, "orders.jsonl", seed);
    let input = read_jsonl(&std::fs::read(&data).unwrap(), &orders_schema(SCHEMA));
    let want = ubik_testkit::oracle(oracle, &input, key_columns);
    let mut flags = vec!["--batch-size", "2000", "--state-memory", "1MiB"];
    if !extra.contains(&"--lateness") {
        flags.extend(["--lateness", "5s"]);
    }
    flags.extend(extra);
    let args = run_args(q, &data, &flags, 10_000);
    crash_rounds(dir, &args, &want, 6);
    args(None)
}

/// The arguments of `ubik run Q` over the file `data` with `extra` flags,
/// and with a checkpoint directory, checkpointing every `every` records.
fn run_args(
    q: &str,
    data: &std::path::Path,
    extra: &[&str],
    every: u64,
) -> impl Fn(Option<&str>) -> Vec<String> {
    let mut base: Vec<String> = [
        q,
        "--from",
        data.to_str().unwrap(),
        "--schema",
        SCHEMA,
        "-q",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    base.extend(extra.iter().map(|s| s.to_string()));
    move |ck| {
        let mut a = base.clone();
        if let Some(ck) = ck {
            a.extend([
                "--checkpoint".into(),
                ck.into(),
                "--checkpoint-every".into(),
                every.to_string(),
            ]);
        }
        a
    }
}

/// Runs `args(None)` once uninterrupted (the reference), then rounds of
/// runs with `args(Some(checkpoint dir))` killed with SIGKILL at random
/// moments until one finishes, `kills` kills in all. Every run's output must
/// be a byte-identical slice of the reference, and each round's union,
/// folded latest-per-key, must equal `want`.
fn crash_rounds(
    dir: &std::path::Path,
    args: impl Fn(Option<&str>) -> Vec<String>,
    want: &State,
    kills_wanted: usize,
) {
    let started = Instant::now();
    let reference = run(&[
        &["run"],
        args(None)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice(),
    ]
    .concat());
    let full = started.elapsed();
    assert!(reference.status.success(), "{}", stderr(&reference));
    let reference = lines(&reference.stdout);
    assert!(reference.len() > 20);

    let mut rng = Rng(7);
    assert!(
        full > Duration::from_millis(100),
        "the input is too small to crash in the middle"
    );
    let mut kills = 0;
    let mut round = 0;
    // Rounds: a fresh checkpoint directory, runs killed at random moments
    // (reading, aggregating, emitting, checkpointing) until one completes.
    while kills < kills_wanted {
        round += 1;
        let ck = dir.join(format!("ck{round}"));
        let ck_str = ck.to_str().unwrap().to_string();
        let mut outputs: Vec<Vec<String>> = Vec::new();
        loop {
            assert!(outputs.len() < 60, "round {round} never finished");
            let mut child = ubik()
                .arg("run")
                .args(args(Some(&ck_str)))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            // Drain stdout on a thread so the child never blocks on a full pipe.
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut stdout = stdout;
                let _ = stdout.read_to_end(&mut got);
                got
            });
            let at = full.mul_f64(0.02 + rng.below(1000) as f64 / 1000.0 * 0.6);
            let t0 = Instant::now();
            let mut finished = false;
            while t0.elapsed() < at {
                if child.try_wait().unwrap().is_some() {
                    finished = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if !finished {
                let _ = child.kill(); // SIGKILL
                kills += 1;
                let _ = child.wait();
                outputs.push(lines(&reader.join().unwrap()));
                continue;
            }
            assert!(
                child.wait().unwrap().success(),
                "round {round}: the final run failed"
            );
            outputs.push(lines(&reader.join().unwrap()));
            break;
        }
        // Every run's output is a contiguous, byte-identical slice of the reference.
        for (i, out) in outputs.iter().enumerate() {
            if out.is_empty() {
                continue;
            }
            let start = reference
                .iter()
                .position(|l| *l == out[0])
                .unwrap_or_else(|| {
                    panic!(
                        "round {round} run {i}: first record is not in the reference output: {}",
                        out[0]
                    )
                });
            assert_eq!(
                &reference[start..(start + out.len()).min(reference.len())],
                out.as_slice(),
                "round {round} run {i}: output is not a byte-identical replay"
            );
        }
        // The union, folded latest-per-key, equals the oracle.
        let folded = fold_lines(&outputs.concat());
        assert_eq!(folded, fold_lines(&reference), "round {round}");
        assert_matches(&format!("round {round}"), &folded, want);
    }
}

/// A temporal join of two files, killed and resumed: the checkpoint holds
/// both sources' positions and the join's state, and every resumed run
/// re-emits byte-identically.
#[test]
fn join_of_two_sources_killed_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let orders = Orders::new(120_000, 40, 8, 3_000).write(dir.path(), "orders.jsonl", 3);
    let mut rng = Rng(5);
    let mut versions = Vec::new();
    for i in 0..2_000i64 {
        let mut ts = Vec::new();
        ubik_engine::time::write_rfc3339_micros(
            &mut ts,
            (ubik_testkit::events::BASE_MS - 60_000 + i * 500) * 1000,
        );
        versions.push(format!(
            r#"{{"id":"m{:03}","region":"r{}","ts":"{}"}}"#,
            if i < 40 { i as u64 } else { rng.below(40) },
            rng.below(5),
            String::from_utf8(ts).unwrap()
        ));
    }
    let merchants = dir.path().join("merchants.jsonl");
    std::fs::write(&merchants, ubik_testkit::events::jsonl(&versions)).unwrap();
    let q = "SELECT m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(o.amount) AS total \
             FROM orders o JOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id \
             GROUP BY m.region, TUMBLE(o.ts, INTERVAL '1' MINUTE)";
    let args = |ck: Option<&str>| {
        let mut a: Vec<String> = vec![
            q.into(),
            "--from".into(),
            format!("orders={}", orders.display()),
            "--from".into(),
            format!("merchants={}", merchants.display()),
            "--schema".into(),
            format!("orders={SCHEMA}"),
            "--schema".into(),
            "merchants=id VARCHAR, region VARCHAR, ts TIMESTAMP".into(),
            "--lateness".into(),
            "5s".into(),
            "--batch-size".into(),
            "500".into(),
            "-q".into(),
        ];
        if let Some(ck) = ck {
            a.extend([
                "--checkpoint".into(),
                ck.into(),
                "--checkpoint-every".into(),
                "2500".into(),
            ]);
        }
        a
    };
    let want = ubik_testkit::oracle_tables(
        "WITH c AS (SELECT o.ts, o.amount, m.region, \
           rank() OVER (PARTITION BY o.merchant, o.ts, o.amount ORDER BY m.ts DESC) AS rn \
         FROM orders o JOIN merchants m ON o.merchant = m.id AND m.ts <= o.ts) \
         SELECT region, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, \
           count(*) AS n, sum(amount) AS total FROM c WHERE rn = 1 GROUP BY 1, 2",
        &[
            (
                "orders",
                &read_jsonl(&std::fs::read(&orders).unwrap(), &orders_schema(SCHEMA)),
            ),
            (
                "merchants",
                &read_jsonl(
                    &std::fs::read(&merchants).unwrap(),
                    &orders_schema("id VARCHAR, region VARCHAR, ts TIMESTAMP"),
                ),
            ),
        ],
        &[0, 1],
    );
    crash_rounds(dir.path(), args, &want, 8);
}

#[test]
fn sigterm_drains_commits_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let q = "SELECT merchant, TUMBLE(ts, INTERVAL '1 SECOND') AS w, count(*) AS n FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 SECOND')";
    let spawn = || {
        ubik()
            .args([
                "run",
                q,
                "--from",
                "demo://orders?count=0&rate=2000&realtime=1&keys=3",
                "--checkpoint",
            ])
            .arg(&ck)
            .args(["--lateness", "0s", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let child = spawn();
    std::thread::sleep(Duration::from_millis(2500));
    let started = Instant::now();
    send_signal(child.id(), 15);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(ck.join("CURRENT").exists(), "no checkpoint after SIGTERM");
    let first = lines(&out.stdout);
    assert!(
        !first.is_empty(),
        "closed windows were emitted before the drain"
    );

    // The restart resumes after the drained position: no window is emitted twice.
    let child = spawn();
    std::thread::sleep(Duration::from_millis(1500));
    send_signal(child.id(), 2);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let second = lines(&out.stdout);
    let seen: std::collections::HashSet<&String> = first.iter().collect();
    assert!(
        second.iter().all(|l| !seen.contains(l)),
        "a record was emitted again after a clean drain"
    );
}

fn send_signal(pid: u32, signal: i32) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}
