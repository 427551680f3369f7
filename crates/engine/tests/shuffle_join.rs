//! A repartitioned join (first stages per source partition stamp rows and
//! route each join side by its equality key, or everything to one target
//! when the operator after the join needs rows of other keys; second
//! stages take them in as given) emits exactly the records of one query
//! reading every partition of both sources.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
mod routing;

use routing::{Rng, deliver, records};
use ubik_engine::progress::partition_id;
use ubik_engine::shuffle::Shuffler;
use ubik_engine::{Catalog, Output, Query, QueryOptions, plan_query};

fn time() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Auctions: an id, when it opens and closes, a category.
fn auctions() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("ts", time(), false),
        Field::new("expires", time(), false),
        Field::new("category", DataType::Int64, false),
    ]))
}

/// Bids on auctions.
fn bids() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("ts", time(), false),
        Field::new("price", DataType::Int64, false),
    ]))
}

const BATCH: usize = 50;
const BATCHES: usize = 40;

/// Each source's partitions, each a list of batches: auction i opens at
/// about i·20 ms; bids name an auction opened lately (sometimes one not
/// open yet) at about the same pace, out of order by up to 300 ms.
fn input(parts: usize, seed: u64) -> [Vec<Vec<RecordBatch>>; 2] {
    let mut rng = Rng(seed);
    let ts = |at: Vec<i64>| Arc::new(TimestampMicrosecondArray::from(at).with_timezone("UTC"));
    let mut auction_parts = vec![Vec::new(); parts];
    let mut bid_parts = vec![Vec::new(); parts];
    for b in 0..BATCHES {
        for p in 0..parts {
            let base = ((b * parts + p) * BATCH) as i64;
            let (mut id, mut at, mut until, mut cat) = (vec![], vec![], vec![], vec![]);
            let (mut auction, mut bid_at, mut price) = (vec![], vec![], vec![]);
            for i in 0..BATCH as i64 {
                let n = base + i;
                let jitter = rng.below(300_000) as i64;
                id.push(n);
                at.push(n * 20_000 - jitter);
                until.push(n * 20_000 + 200_000 + rng.below(2_000_000) as i64);
                cat.push(rng.below(5) as i64);
                auction.push((n - rng.below(60) as i64 + 3).max(0));
                bid_at.push(n * 20_000 - rng.below(300_000) as i64);
                price.push(rng.below(1000) as i64);
            }
            auction_parts[p].push(
                RecordBatch::try_new(
                    auctions(),
                    vec![
                        Arc::new(Int64Array::from(id)),
                        ts(at),
                        ts(until),
                        Arc::new(Int64Array::from(cat)),
                    ],
                )
                .unwrap(),
            );
            bid_parts[p].push(
                RecordBatch::try_new(
                    bids(),
                    vec![
                        Arc::new(Int64Array::from(auction)),
                        ts(bid_at),
                        Arc::new(Int64Array::from(price)),
                    ],
                )
                .unwrap(),
            );
        }
    }
    [auction_parts, bid_parts]
}

fn query(sql: &str, lateness_us: i64) -> Query {
    let mut catalog = Catalog::new();
    catalog.add_table("auction", auctions());
    catalog.add_table("bid", bids());
    let options = QueryOptions {
        lateness_us,
        event_time: Some("ts".into()),
        ..QueryOptions::default()
    };
    Query::new(plan_query(sql, &catalog, options).unwrap()).unwrap()
}

/// The partition ids of both sources' partitions, and each source's index
/// in the plan.
fn ids(q: &Query, parts: usize) -> Vec<(usize, u32)> {
    ["auction", "bid"]
        .iter()
        .enumerate()
        .filter_map(|(s, table)| Some((s, q.plan().source_index(table)?)))
        .flat_map(|(s, index)| (0..parts).map(move |p| (s, partition_id(index, p as u32))))
        .collect()
}

/// Runs `sql` whole and repartitioned over `targets` and compares their
/// records; `keyed` says whether the shuffle routes by key (else all to one).
/// The lateness is under the input's disorder: rows come late.
// Batches are read by number across every source partition.
#[allow(clippy::needless_range_loop)]
fn check(sql: &str, keyed: bool) {
    let lateness_us = 200_000;
    let (parts, targets) = (3usize, 4u32);
    let plan = query(sql, lateness_us).plan().clone();
    assert_eq!(
        !Shuffler::new(&plan, targets).unwrap().single(),
        keyed,
        "routing of {sql}"
    );
    for seed in 1..4 {
        let input = input(parts, seed);
        let mut one = query(sql, lateness_us);
        let ids = ids(&one, parts);
        for &(_, id) in &ids {
            one.add_partition(id);
        }
        let mut want = Vec::new();
        let mut out = Output::default();
        for b in 0..BATCHES {
            for (k, &(s, id)) in ids.iter().enumerate() {
                out.clear();
                one.process(id, &input[s][k % parts][b], &mut out).unwrap();
                records(&out, &mut want);
            }
        }
        out.clear();
        one.finish(&mut out).unwrap();
        records(&out, &mut want);

        let mut first: Vec<Query> = ids
            .iter()
            .map(|&(_, id)| {
                let mut q = query(sql, lateness_us);
                q.add_partition(id);
                q.set_shuffle(targets).unwrap();
                q
            })
            .collect();
        let mut second: Vec<Query> = (0..targets)
            .map(|_| {
                let mut q = query(sql, lateness_us);
                for &(_, id) in &ids {
                    q.add_partition(id);
                }
                q
            })
            .collect();
        let mut got = Vec::new();
        let mut routed_to = BTreeSet::new();
        let every = 1 + seed as usize % 3;
        for b in 0..BATCHES {
            // Sources in the other order than the one query read them.
            for (k, &(s, id)) in ids.iter().enumerate().rev() {
                let batch = &input[s][k % parts][b];
                let mut routed = Output::default();
                first[k].process(id, batch, &mut routed).unwrap();
                assert!(routed.changes.is_empty(), "a first stage emitted");
                routed_to.extend(deliver(&mut routed, batch, &mut second, &mut got));
                if b % every == every - 1 {
                    let lateness = first[k].progress().lateness;
                    let wm = first[k].progress().partitions[&id].watermark(lateness);
                    for q in second.iter_mut() {
                        out.clear();
                        q.push_watermark(id, wm, &mut out).unwrap();
                        records(&out, &mut got);
                    }
                }
            }
        }
        for q in second.iter_mut() {
            for &(_, id) in &ids {
                out.clear();
                q.end_partition(id, &mut out).unwrap();
                records(&out, &mut got);
            }
        }
        assert_eq!(routed_to.len() > 1, keyed, "targets used: {routed_to:?}");
        let want: BTreeSet<String> = want.into_iter().collect();
        let got: BTreeSet<String> = got.into_iter().collect();
        assert!(
            want.len() > 20,
            "too few records to compare: {}",
            want.len()
        );
        let missing: Vec<_> = want.difference(&got).take(3).collect();
        let extra: Vec<_> = got.difference(&want).take(3).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{sql}\nseed {seed}: {} vs {} records; missing {missing:?}; extra {extra:?}",
            want.len(),
            got.len()
        );
    }
}

#[test]
fn an_interval_join_and_its_top_1_per_auction_route_by_the_auction() {
    // Nexmark q9's shape: the top-N's partition is the join key.
    check(
        "SELECT id, category, price, bid_ts FROM (SELECT A.id, A.category, B.price, B.ts AS bid_ts, \
           ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.ts ASC) AS rn \
         FROM auction A JOIN bid B ON A.id = B.auction AND B.ts BETWEEN A.ts AND A.expires) WHERE rn <= 1",
        true,
    );
}

#[test]
fn a_temporal_join_routes_the_table_and_the_stream_by_the_key() {
    // Nexmark q20's shape: each bid with its auction as of the bid's time.
    check(
        "SELECT B.auction, B.price, B.ts, A.category FROM bid AS B \
         JOIN auction FOR SYSTEM_TIME AS OF B.ts AS A ON B.auction = A.id WHERE A.category <> 3",
        true,
    );
}

#[test]
fn a_join_whose_aggregation_regroups_runs_in_one_task() {
    // Grouped by category, not by the auction: every pair meets in one task.
    check(
        "SELECT A.category, TUMBLE(B.ts, INTERVAL '1' SECOND) AS w, count(*) AS n, max(B.price) AS top \
         FROM auction A JOIN bid B ON A.id = B.auction AND B.ts BETWEEN A.ts AND A.expires \
         GROUP BY A.category, TUMBLE(B.ts, INTERVAL '1' SECOND)",
        false,
    );
    // Grouped by the auction (the join key): routed by it.
    check(
        "SELECT A.id, TUMBLE(B.ts, INTERVAL '1' SECOND) AS w, count(*) AS n, max(B.price) AS top \
         FROM auction A JOIN bid B ON A.id = B.auction AND B.ts BETWEEN A.ts AND A.expires \
         GROUP BY A.id, TUMBLE(B.ts, INTERVAL '1' SECOND)",
        true,
    );
}

#[test]
fn a_self_join_of_a_windowed_maximum_runs_in_one_task() {
    // Nexmark q7's shape: both sides read bids; a row is routed once per side.
    check(
        "SELECT B.auction, B.price, B.ts FROM bid B \
         JOIN (SELECT max(price) AS maxprice, TUMBLE(ts, INTERVAL '1' SECOND) AS w \
               FROM bid GROUP BY TUMBLE(ts, INTERVAL '1' SECOND)) B1 \
         ON B.price = B1.maxprice AND B.ts >= B1.w AND B.ts < B1.w + INTERVAL '1' SECOND",
        false,
    );
}
