//! A join's state stays bounded by the watermark even when every row
//! brings a new key (Nexmark q7 joins on prices): rows expire, and so do
//! the keys no row holds any more.

use arrow::array::RecordBatch;
use ubik_engine::progress::partition_id;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};

mod keyed_rows;

use keyed_rows::schema;

/// Rows `from..to` of [`keyed_rows::rows`], key i (mod `keys`, when given).
fn rows(from: i64, to: i64, keys: Option<i64>) -> RecordBatch {
    keyed_rows::rows(from, to, |i| keys.map_or(i, |n| i % n))
}

/// What a run of [`drive`] saw after each batch.
struct Run {
    joined: usize,
    /// State bytes after each batch.
    sizes: Vec<usize>,
    /// Rows (and groups) held after each batch.
    held: Vec<usize>,
}

impl Run {
    /// The state after 400 000 rows is at most twice that after 40 000.
    fn assert_flat(&self, what: &str) {
        let early = *self.sizes[20..40].iter().max().unwrap();
        let late = *self.sizes[self.sizes.len() - 20..].iter().max().unwrap();
        assert!(
            late <= early * 2,
            "{what}: the state grew from {early} bytes (after 40 000 rows) to {late} (at the end)"
        );
    }
}

/// Runs `sql` over rows `0..n` of [`rows`] fed to both its tables in
/// batches of 1000 (`tables[1]` first), without a watermark delay.
fn drive(sql: &str, tables: [&str; 2], join_retention_us: i64, n: i64, keys: Option<i64>) -> Run {
    let catalog = Catalog::new()
        .with_table(tables[0], schema())
        .with_table(tables[1], schema());
    let options = QueryOptions {
        lateness_us: 0,
        join_retention_us,
        // A versioned table's version time, among its two TIMESTAMP columns.
        event_time: Some("ts".into()),
        ..QueryOptions::default()
    };
    let plan = plan_query(sql, &catalog, options).unwrap();
    let [p0, p1] = tables.map(|t| partition_id(plan.source_index(t).unwrap(), 0));
    let mut query = Query::new(plan).unwrap();
    query.add_partition(p0);
    query.add_partition(p1);
    let mut out = Output::default();
    let mut run = Run {
        joined: 0,
        sizes: Vec::new(),
        held: Vec::new(),
    };
    for from in (0..n).step_by(STEP) {
        let batch = rows(from, from + STEP as i64, keys);
        query.process(p1, &batch, &mut out).unwrap();
        query.process(p0, &batch, &mut out).unwrap();
        run.joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
        out.clear();
        run.sizes.push(query.state_size());
        run.held.push(query.state_keys());
    }
    query.finish(&mut out).unwrap();
    run.joined += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
    run
}

const STEP: usize = 1000;

const INTERVAL: &str = "SELECT a.k FROM a JOIN b ON a.k = b.k \
                        AND a.ts BETWEEN b.ts AND b.ts + INTERVAL '1' SECOND";

#[test]
fn ever_new_keys_keep_an_interval_join_state_flat() {
    let run = drive(INTERVAL, ["a", "b"], 0, 400_000, None);
    assert_eq!(
        run.joined, 400_000,
        "each row of a meets the row of b with its key"
    );
    run.assert_flat("ever-new keys");
}

#[test]
fn a_versioned_table_keeps_only_the_versions_the_watermark_needs() {
    // 100 keys, each updated every 100 ms, for 400 seconds.
    let sql = "SELECT s.k FROM s JOIN t FOR SYSTEM_TIME AS OF s.ts AS v ON s.k = v.k";
    let run = drive(sql, ["s", "t"], 0, 400_000, Some(100));
    assert_eq!(
        run.joined, 400_000,
        "each stream row meets its key's version"
    );
    run.assert_flat("versions");
}

/// With a join retention `R` an interval join holds each row `R` longer
/// (late rows may still pair with it), and no longer: at one row per
/// millisecond per side, a's rows live `R` (their bound is their own time),
/// b's `1 s + R`, each give or take a batch. The state stays flat.
#[test]
fn a_join_retention_holds_rows_that_much_longer_and_no_longer() {
    for retention_ms in [0i64, 5_000] {
        let what = format!("retention {retention_ms} ms");
        let run = drive(INTERVAL, ["a", "b"], retention_ms * 1000, 200_000, None);
        assert_eq!(run.joined, 200_000, "{what}");
        let expected = (2 * retention_ms + 1_000) as usize;
        let steady = &run.held[20..];
        let (lo, hi) = (steady.iter().min().unwrap(), steady.iter().max().unwrap());
        assert!(
            *lo >= expected.saturating_sub(2 * STEP) && *hi <= expected + 2 * STEP,
            "{what}: {lo}..{hi} rows held, expected about {expected}"
        );
        run.assert_flat(&what);
    }
}

/// An interval join bounded by a column (`b.ts BETWEEN a.ts AND
/// a.expires`) holds each of a's rows until the watermark passes its own
/// `expires` (a second after its time: about 1000 rows at one per
/// millisecond) and b's until their time, however unbounded the constant
/// lower bound is.
#[test]
fn a_join_bounded_by_a_column_holds_rows_until_their_bound() {
    let sql = "SELECT b.k FROM a JOIN b ON a.k = b.k AND b.ts BETWEEN a.ts AND a.expires";
    let run = drive(sql, ["a", "b"], 0, 200_000, None);
    assert_eq!(run.joined, 200_000, "each b row meets the a row of its key");
    let steady = &run.held[20..];
    let (lo, hi) = (steady.iter().min().unwrap(), steady.iter().max().unwrap());
    assert!(
        *lo >= 500 && *hi <= 1_000 + 2 * STEP,
        "{lo}..{hi} rows held, expected about 1000"
    );
    run.assert_flat("bounded by a column");
}

#[test]
fn a_top_n_holds_n_rows_per_key() {
    // 400 000 rows over 100 keys: the state is the 3 best rows of each
    // key, however many rows came in.
    let catalog = Catalog::new().with_table("t", schema());
    let options = QueryOptions {
        lateness_us: 0,
        event_time: Some("ts".into()),
        ..QueryOptions::default()
    };
    let sql = "SELECT k, ts, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY ts DESC) \
               AS rn FROM t) WHERE rn <= 3";
    let mut query = Query::new(plan_query(sql, &catalog, options).unwrap()).unwrap();
    query.add_partition(0);
    let mut out = Output::default();
    let mut sizes = Vec::new();
    let mut emitted = 0;
    for b in 0..400 {
        query
            .process(0, &rows(b * 1000, (b + 1) * 1000, Some(100)), &mut out)
            .unwrap();
        emitted += out.changes.iter().map(|c| c.num_rows()).sum::<usize>();
        out.changes.clear();
        sizes.push(query.state_size());
    }
    assert_eq!(query.state_keys(), 100);
    // Each 1 s grid point upserts every rank of every key (each key's
    // latest rows are new), about 400 points of 100 keys by 3 ranks.
    assert!(emitted >= 390 * 300, "{emitted} ranks emitted");
    let (early, late) = (sizes[40], *sizes.last().unwrap());
    assert!(
        late <= early * 2,
        "the state grew from {early} bytes (after 40 000 rows) to {late}"
    );
}

/// A join of two windowed aggregations whose windows' groups go to the
/// state store after every batch (a one-byte budget): each side's windows
/// have tables of their own, and the joined rows are the same, in the same
/// order, as with everything in memory.
#[test]
fn the_windowed_sides_of_a_join_spill_and_join_the_same() {
    let sql = "SELECT x.k, x.n, y.m FROM \
               (SELECT k, TUMBLE(ts, INTERVAL '1' SECOND) AS w, count(*) AS n FROM a GROUP BY k, TUMBLE(ts, INTERVAL '1' SECOND)) x \
               JOIN (SELECT k, TUMBLE(ts, INTERVAL '1' SECOND) AS w, max(expires) AS m FROM b GROUP BY k, TUMBLE(ts, INTERVAL '1' SECOND)) y \
               ON x.k = y.k AND x.w = y.w";
    let catalog = Catalog::new()
        .with_table("a", schema())
        .with_table("b", schema());
    let options = QueryOptions {
        lateness_us: 0,
        ..QueryOptions::default()
    };
    let plan = plan_query(sql, &catalog, options).unwrap();
    let [p0, p1] = ["a", "b"].map(|t| partition_id(plan.source_index(t).unwrap(), 0));
    let dir = tempfile::tempdir().unwrap();
    let store =
        ubik_engine::SharedStore::temporary(Some(dir.path().to_path_buf()), Default::default());
    let spilling = Query::with_state(
        plan.clone(),
        ubik_engine::StateOptions {
            store: Some(store),
            memory: Some(1),
        },
    )
    .unwrap();
    let mut emitted = Vec::new();
    for mut query in [spilling, Query::new(plan).unwrap()] {
        query.add_partition(p0);
        query.add_partition(p1);
        let mut out = Output::default();
        for from in (0..20_000).step_by(STEP) {
            let batch = rows(from, from + STEP as i64, Some(700));
            query.process(p1, &batch, &mut out).unwrap();
            query.process(p0, &batch, &mut out).unwrap();
        }
        query.finish(&mut out).unwrap();
        let batches: Vec<RecordBatch> = out.changes.iter().map(|c| c.rows.clone()).collect();
        emitted.push((
            arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string(),
            query.spill_stats().groups,
        ));
    }
    assert!(emitted[0].1 > 1000, "{} groups spilled", emitted[0].1);
    assert_eq!(emitted[1].1, 0);
    assert!(emitted[0].0.lines().count() > 10_000);
    assert_eq!(emitted[0].0, emitted[1].0);
}
