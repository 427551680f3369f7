//! The runtime without any real connector: a [`Pipeline`] over an in-memory
//! source, run into an in-memory sink by [`runner::run_to_sink`] or handed
//! to a host by [`HostPipeline`]. Checks the changelog against DataFusion,
//! the byte-identical replay after a resume or a lost epoch, and the host's
//! coalescing.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use arrow::array::RecordBatch;
use ubik_runtime::host::{HostOptions, HostPipeline};
use ubik_runtime::runner::{self, RunEnd, RunOptions};
use ubik_runtime::{Endpoint, Pipeline, PipelineSpec, Result, Settings, SourceSpec, Stats, Step};
use ubik_testkit::fakes::{FakeSink, FakeSource, Written, fold_written};
use ubik_testkit::{Orders, assert_matches, oracle, read_jsonl, within};

const TUMBLE: &str = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, count(amount) AS na, sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
const TUMBLE_ORACLE: &str = "SELECT merchant, date_bin(INTERVAL '1 minute', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS w, count(*) AS n, count(amount) AS na, sum(amount) AS total, avg(amount) AS mean, min(amount) AS lo, max(amount) AS hi FROM orders GROUP BY 1, 2";
/// Retracts keys (a merchant's count passes 750, about the mean): the
/// changelog carries tombstones, and some keys stay.
const HAVING: &str = "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant HAVING count(*) < 750";
const HAVING_ORACLE: &str = "SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant HAVING count(*) < 750";

/// A hang fails the test after this long instead of blocking the suite.
const LIMIT: Duration = Duration::from_secs(120);

/// Orders with nulls, negative amounts and rows up to 20 s out of order
/// (late rows update windows already emitted), over ~15 minutes of event time.
fn events(seed: u64) -> (Orders, Vec<String>) {
    let spec = Orders::new(6_000, 8, 150, 20_000).varied();
    let lines = spec.seeded(seed);
    (spec, lines)
}

/// Settings through the options layer, as every surface sets them.
fn settings() -> Settings {
    let mut s = Settings::default();
    for (name, value) in [
        ("lateness", "5s"),
        ("retention", "1h"),
        ("emit_interval", "2s"),
        ("batch_size", "97"),
    ] {
        s.set(name, value).unwrap();
    }
    s
}

/// The spec of a pipeline over `lines` dealt into 3 partitions, 97 records per poll.
fn config(sql: &str, spec: &Orders, lines: &[String], checkpoint: Option<&Path>) -> PipelineSpec {
    let source = FakeSource::dealt("orders", lines, 3);
    let mut source = SourceSpec::new(Endpoint::Provided(Box::new(source)));
    source.schema = Some(spec.schema());
    let mut config = PipelineSpec::new(sql, source);
    config.settings = settings();
    config.checkpoint = checkpoint.map(Path::to_path_buf);
    config
}

fn open(sql: &str, spec: &Orders, lines: &[String], checkpoint: Option<&Path>) -> Result<Pipeline> {
    ubik_runtime::open_pipeline(config(sql, spec, lines, checkpoint))
}

/// Runs to the end (or an error), committing every `commit_records` input records.
fn run(pipeline: &mut Pipeline, sink: &mut FakeSink, commit_records: u64) -> Result<RunEnd> {
    let stop = AtomicBool::new(false);
    let mut report = |_: &Stats| {};
    let encoder = ubik_runtime::codec::changelog_encoder(pipeline.plan());
    runner::run_to_sink(
        pipeline,
        sink,
        encoder,
        RunOptions {
            commit_interval: Duration::from_secs(3600),
            commit_records: Some(commit_records),
            stop: &stop,
            report: &mut report,
            report_every: Duration::from_secs(3600),
        },
    )
}

/// The committed records of an uninterrupted run without checkpoints.
fn reference(sql: &'static str, seed: u64) -> Vec<Written> {
    within(LIMIT, "the reference run", move || {
        let (spec, lines) = events(seed);
        let mut pipeline = open(sql, &spec, &lines, None).unwrap();
        let mut sink = FakeSink::new();
        assert_eq!(
            run(&mut pipeline, &mut sink, 1_000).unwrap(),
            RunEnd::Finished
        );
        let log = sink.log();
        assert!(
            log.pending.is_empty(),
            "records left uncommitted at the end"
        );
        assert_eq!(log.aborts, 0);
        log.committed.clone()
    })
}

#[test]
fn run_to_sink_changelog_folds_to_the_oracle() {
    for (sql, oracle_sql) in [(TUMBLE, TUMBLE_ORACLE), (HAVING, HAVING_ORACLE)] {
        let (spec, lines) = events(1);
        let (committed, key_columns, commits) = within(LIMIT, sql, {
            let (spec, lines) = (spec.clone(), lines.clone());
            move || {
                let mut pipeline = open(sql, &spec, &lines, None).unwrap();
                let key_columns = pipeline.plan().key_columns.clone();
                let mut sink = FakeSink::new();
                let end = run(&mut pipeline, &mut sink, 1_000).unwrap();
                assert_eq!(end, RunEnd::Finished);
                assert_eq!(pipeline.stats.records_in, lines.len() as u64);
                assert_eq!(pipeline.stats.decode_errors, 0);
                assert_eq!(pipeline.stats.dead_letters, 0, "no row may be dropped");
                let log = sink.log();
                assert!(
                    log.pending.is_empty(),
                    "records left uncommitted at the end"
                );
                assert_eq!(pipeline.stats.changes_out, log.committed.len() as u64);
                (log.committed.clone(), key_columns, log.commits)
            }
        });
        assert!(
            commits > 3,
            "{sql}: {commits} commits; expected one per 1000 records"
        );
        assert!(!committed.is_empty(), "{sql}: nothing was committed");
        let input = read_jsonl(
            ubik_testkit::events::jsonl(&lines).as_bytes(),
            &spec.schema(),
        );
        let want = oracle(oracle_sql, &input, &key_columns);
        assert_matches(sql, &fold_written(&committed), &want);
        if sql == HAVING {
            assert!(
                committed.iter().any(|r| r.value.is_none()),
                "the HAVING query retracted no key: the test does not cover tombstones"
            );
        }
    }
}

#[test]
fn resume_after_a_crash_re_emits_the_same_bytes() {
    let want = reference(TUMBLE, 2);
    let dir = tempfile::tempdir().unwrap();
    let ck: PathBuf = dir.path().join("ck");
    let (before_crash, lost, epoch) = within(LIMIT, "the crashed run", {
        let ck = ck.clone();
        move || {
            let (spec, lines) = events(2);
            let mut pipeline = open(TUMBLE, &spec, &lines, Some(&ck)).unwrap();
            // Commits 1 and 2 succeed (each followed by a checkpoint); the
            // process "dies" at commit 3, its epoch written but not durable.
            let mut sink = FakeSink::new().crash_at_commit(3);
            let err = run(&mut pipeline, &mut sink, 1_000).unwrap_err();
            assert!(err.to_string().contains("fake crash"), "{err}");
            let log = sink.log();
            (log.committed.clone(), log.pending.clone(), pipeline.epoch())
        }
    });
    assert_eq!(epoch, 2, "two checkpoints before the crash");
    assert!(
        !before_crash.is_empty(),
        "nothing committed before the crash"
    );
    assert!(!lost.is_empty(), "the crashed epoch emitted nothing");

    let after = within(LIMIT, "the resumed run", move || {
        let (spec, lines) = events(2);
        let mut pipeline = open(TUMBLE, &spec, &lines, Some(&ck)).unwrap();
        assert_eq!(
            pipeline.epoch(),
            2,
            "the reopened pipeline resumes from the checkpoint"
        );
        let mut sink = FakeSink::new();
        assert_eq!(
            run(&mut pipeline, &mut sink, 1_000).unwrap(),
            RunEnd::Finished
        );
        sink.committed()
    });
    // What the crashed run emitted after its checkpoint comes again, byte for byte ...
    assert!(after.len() >= lost.len());
    for (i, (a, b)) in lost.iter().zip(&after).enumerate() {
        assert_eq!(a, b, "record {i} after the checkpoint differs on replay");
    }
    // ... and the committed output of both runs is the uninterrupted run's.
    let mut all = before_crash;
    all.extend(after);
    assert_eq!(all.len(), want.len(), "records committed across the crash");
    assert!(
        all == want,
        "the committed output differs from an uninterrupted run"
    );
}

#[test]
fn a_transient_commit_failure_rewinds_and_replays_the_same_bytes() {
    let want = reference(TUMBLE, 3);
    // With checkpoints: back to the last one (after commit 2), the lost
    // epoch replayed; nothing is committed twice.
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let (committed, written, aborts) = within(LIMIT, "the run with a failed commit", move || {
        let (spec, lines) = events(3);
        let mut pipeline = open(TUMBLE, &spec, &lines, Some(&ck)).unwrap();
        let mut sink = FakeSink::new().fail_commit(3);
        assert_eq!(
            run(&mut pipeline, &mut sink, 1_000).unwrap(),
            RunEnd::Finished
        );
        let log = sink.log();
        assert!(log.pending.is_empty());
        (log.committed.clone(), log.written.len(), log.aborts)
    });
    assert_eq!(aborts, 1, "the lost epoch is aborted once");
    assert!(
        written > committed.len(),
        "nothing was written twice: no replay happened"
    );
    assert_eq!(committed.len(), want.len());
    assert!(
        committed == want,
        "the committed output differs from an uninterrupted run"
    );

    // Without checkpoints: back to the start; the first epoch, committed
    // before the failure, is committed again as byte-identical duplicates.
    let (committed, aborts) = within(LIMIT, "the run without checkpoints", move || {
        let (spec, lines) = events(3);
        let mut pipeline = open(TUMBLE, &spec, &lines, None).unwrap();
        let mut sink = FakeSink::new().fail_commit(2);
        assert_eq!(
            run(&mut pipeline, &mut sink, 1_000).unwrap(),
            RunEnd::Finished
        );
        let log = sink.log();
        (log.committed.clone(), log.aborts)
    });
    assert_eq!(aborts, 1);
    assert!(committed.len() > want.len(), "the first epoch was not kept");
    let first = committed.len() - want.len();
    assert!(
        committed[first..] == want[..],
        "the replay from the start differs from an uninterrupted run"
    );
    assert!(
        committed[..first] == want[..first],
        "the first epoch differs from the uninterrupted run's start"
    );
    assert_eq!(fold_written(&committed), fold_written(&want));
}

/// Every batch a host pipeline hands out for `host_options`, to the end.
fn host_batches(host_options: HostOptions) -> Vec<RecordBatch> {
    within(LIMIT, "the host pipeline", move || {
        let (spec, lines) = events(4);
        let config = config(TUMBLE, &spec, &lines, None);
        let mut host = HostPipeline::open(config, host_options).unwrap();
        let mut batches = Vec::new();
        while !host.is_finished() {
            if let Some(b) = host.next_batch(Duration::from_millis(100)).unwrap() {
                batches.push(b);
            }
        }
        batches
    })
}

/// The rows each step of the same pipeline emits (steps emitting none left
/// out): a host coalesces whole steps.
fn step_rows() -> Vec<usize> {
    within(LIMIT, "the stepped pipeline", move || {
        let (spec, lines) = events(4);
        let mut pipeline = open(TUMBLE, &spec, &lines, None).unwrap();
        let mut out = ubik_engine::Output::default();
        let mut rows = Vec::new();
        loop {
            out.clear();
            let step = pipeline.step(&mut out).unwrap();
            let n: usize = out.changes.iter().map(|c| c.num_rows()).sum();
            if n > 0 {
                rows.push(n);
            }
            if step == Step::Finished {
                return rows;
            }
        }
    })
}

#[test]
fn host_coalescing_honours_max_rows() {
    let max_rows = 40;
    let plain = host_batches(HostOptions::default());
    let coalesced = host_batches(HostOptions {
        max_rows: Some(max_rows),
        ..HostOptions::default()
    });
    let steps = step_rows();
    assert!(steps.len() > 10, "{} steps emitted rows", steps.len());
    assert!(
        steps.iter().any(|&n| n < max_rows),
        "every step emits max_rows already: the test would prove nothing"
    );
    let rows = |bs: &[RecordBatch]| bs.iter().map(RecordBatch::num_rows).collect::<Vec<_>>();
    let total: usize = steps.iter().sum();
    assert_eq!(rows(&plain).iter().sum::<usize>(), total);
    // The same rows in the same order ...
    let schema = plain[0].schema();
    assert_eq!(
        arrow::compute::concat_batches(&schema, &coalesced).unwrap(),
        arrow::compute::concat_batches(&schema, &plain).unwrap(),
        "coalescing changed the rows"
    );
    // ... in batches of at least max_rows (but the last) ...
    let (last, full) = coalesced.split_last().unwrap();
    assert!(
        !full.is_empty(),
        "nothing was coalesced: {:?}",
        rows(&coalesced)
    );
    assert!(coalesced.len() < steps.len(), "nothing was coalesced");
    for (i, b) in full.iter().enumerate() {
        assert!(
            b.num_rows() >= max_rows,
            "batch {i} of {} has {} rows, fewer than max_rows {max_rows}",
            coalesced.len(),
            b.num_rows()
        );
    }
    assert!(last.num_rows() > 0);
    // ... each handed out at the end of the step that reached max_rows: it is
    // the output of whole steps, and without its last step it was short.
    let mut next = 0;
    for (i, b) in coalesced.iter().enumerate() {
        let mut got = 0;
        let mut before_last = 0;
        while got < b.num_rows() {
            before_last = got;
            got += steps[next];
            next += 1;
        }
        assert_eq!(got, b.num_rows(), "batch {i} splits the output of a step");
        if i + 1 < coalesced.len() {
            assert!(
                before_last < max_rows,
                "batch {i} ({} rows) was held past max_rows {max_rows}",
                b.num_rows()
            );
        }
    }
    assert_eq!(next, steps.len());
}
