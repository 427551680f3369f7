use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use ubik_engine::plan::QueryKind;
use ubik_engine::{Catalog, EngineError, QueryOptions, plan_query};

fn catalog() -> Catalog {
    Catalog::new().with_table(
        "orders",
        Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("amount", DataType::Float64, true),
        ])),
    )
}

#[test]
fn seed_query_plans_with_key() {
    let q = "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, avg(amount) AS a \
             FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
    let plan = plan_query(q, &catalog(), QueryOptions::default()).unwrap();
    println!("{plan}");
    assert_eq!(plan.key_names(), vec!["merchant", "w"]);
    assert_eq!(
        plan.output_schema.field(1).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
}

#[test]
fn window_not_projected_is_refused() {
    let q =
        "SELECT merchant, count(*) FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')";
    let err = plan_query(q, &catalog(), QueryOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, EngineError::Unsupported { .. }), "{msg}");
    assert!(msg.contains("window column"), "{msg}");
}

#[test]
fn bad_sql_has_position() {
    let err = plan_query(
        "SELECT merchant,, FROM orders",
        &catalog(),
        QueryOptions::default(),
    )
    .unwrap_err();
    match err {
        EngineError::Sql { position, .. } => assert!(position.is_some()),
        other => panic!("{other}"),
    }
    let err = plan_query(
        "SELECT nope FROM orders",
        &catalog(),
        QueryOptions::default(),
    )
    .unwrap_err();
    println!("{err}");
    match err {
        EngineError::Sql { position, .. } => assert_eq!(position.map(|p| p.column), Some(8)),
        other => panic!("{other}"),
    }
}

/// A table with two TIMESTAMP columns: `expires` and the one its schema
/// declares as its event time.
fn auctions(declared: bool) -> Catalog {
    let time = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("date_time", time(), false),
        Field::new("expires", time(), false),
    ]);
    let schema = match declared {
        true => schema.with_metadata(
            [(
                ubik_connector::EVENT_TIME_METADATA.to_string(),
                "date_time".to_string(),
            )]
            .into(),
        ),
        false => schema,
    };
    Catalog::new().with_table("auction", Arc::new(schema))
}

#[test]
fn a_declared_event_time_picks_among_timestamp_columns() {
    let q = "SELECT category, count(*) AS n FROM auction GROUP BY category";
    let undeclared = plan_query(q, &auctions(false), QueryOptions::default()).unwrap();
    let declared = plan_query(q, &auctions(true), QueryOptions::default()).unwrap();
    let time = |p: &ubik_engine::QueryPlan| match &p.kind {
        ubik_engine::plan::QueryKind::Aggregate(a) => format!("{:?}", a.event_time),
        other => panic!("not an aggregation: {other:?}"),
    };
    // Two TIMESTAMP columns and no declaration: no event time (rows count).
    assert!(
        time(&undeclared).contains("Ordinal"),
        "{}",
        time(&undeclared)
    );
    assert!(time(&declared).contains("date_time"), "{}", time(&declared));
}

#[test]
fn a_top_n_is_keyed_by_its_partition_and_row_number() {
    let q = "SELECT merchant, amount, rn FROM (SELECT *, ROW_NUMBER() OVER \
             (PARTITION BY merchant ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 3";
    let plan = plan_query(q, &catalog(), QueryOptions::default()).unwrap();
    assert_eq!(plan.key_names(), vec!["merchant", "rn"]);
    assert_eq!(plan.output_schema.field(2).data_type(), &DataType::UInt64);
    assert!(plan.is_keyed());
    assert_eq!(plan.kind_name(), "continuous top-3 (ROW_NUMBER)");
    // With one row per key, the row number may be left out of the key.
    let q = "SELECT amount, merchant FROM (SELECT *, ROW_NUMBER() OVER \
             (PARTITION BY merchant ORDER BY ts DESC) AS rn FROM orders) WHERE rn = 1";
    let plan = plan_query(q, &catalog(), QueryOptions::default()).unwrap();
    assert_eq!(plan.key_names(), vec!["merchant"]);
    // `rn < 1` keeps nothing.
    let q = "SELECT merchant, rn FROM (SELECT *, ROW_NUMBER() OVER \
             (PARTITION BY merchant ORDER BY ts) AS rn FROM orders) WHERE rn < 1";
    let msg = plan_query(q, &catalog(), QueryOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("keeps no row"), "{msg}");
}

#[test]
fn window_functions_over_a_top_n_are_keyed_by_its_key() {
    let q = "SELECT merchant, amount, avg(amount) OVER (PARTITION BY merchant ORDER BY ts \
             ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS a, count(*) OVER (PARTITION BY merchant \
             ORDER BY ts ROWS BETWEEN 10 PRECEDING AND 2 FOLLOWING) AS n FROM (SELECT * FROM \
             (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts DESC) AS rn \
             FROM orders) WHERE rn <= 1) q";
    let plan = plan_query(q, &catalog(), QueryOptions::default()).unwrap();
    // One row per key: the row number is not part of it.
    assert_eq!(plan.key_names(), vec!["merchant"]);
    assert_eq!(plan.output_schema.field(2).data_type(), &DataType::Float64);
    assert_eq!(plan.output_schema.field(3).data_type(), &DataType::Int64);
    assert!(plan.is_keyed());
    assert!(!plan.may_retract());
    assert_eq!(
        plan.kind_name(),
        "window functions (OVER ... ROWS) over a continuous top-1 (ROW_NUMBER)"
    );
    // Every column is read: the top-N breaks ties by all of them.
    assert!(plan.sources[0].reads.iter().all(|&r| r));
    // Several rows per key: the row number is.
    let q = "SELECT merchant, rn, sum(amount) OVER (ORDER BY amount ROWS BETWEEN 1 PRECEDING \
             AND CURRENT ROW) AS s FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER \
             (PARTITION BY merchant ORDER BY ts DESC) AS rn FROM orders) WHERE rn <= 3)";
    let plan = plan_query(q, &catalog(), QueryOptions::default()).unwrap();
    assert_eq!(plan.key_names(), vec!["merchant", "rn"]);
    for (q, refusal) in [
        (
            "SELECT merchant, max(merchant) OVER (ORDER BY ts ROWS 2 PRECEDING) AS m FROM (SELECT * FROM \
             (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts) AS rn FROM orders) \
             WHERE rn <= 1)",
            "Utf8 values is not supported",
        ),
        (
            "SELECT merchant, sum(amount) OVER (ORDER BY ts ROWS BETWEEN 2 FOLLOWING AND 3 FOLLOWING) \
             AS s FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts) \
             AS rn FROM orders) WHERE rn <= 1)",
            "starts after the current row",
        ),
        (
            "SELECT merchant, sum(amount) OVER (ORDER BY ts ROWS 2 PRECEDING) AS s, \
             sum(amount) OVER (ORDER BY amount ROWS 2 PRECEDING) AS t FROM (SELECT * FROM (SELECT *, \
             ROW_NUMBER() OVER (PARTITION BY merchant ORDER BY ts) AS rn FROM orders) WHERE rn <= 1)",
            "different OVER (...) clauses",
        ),
        (
            "SELECT merchant, ROW_NUMBER() OVER (ORDER BY ts) AS l, sum(amount) OVER (ORDER BY ts \
             ROWS 2 PRECEDING) AS s FROM (SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY \
             merchant ORDER BY ts) AS rn FROM orders) WHERE rn <= 1)",
            "row_number() cannot be mixed",
        ),
    ] {
        let msg = plan_query(q, &catalog(), QueryOptions::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains(refusal), "{q}: {msg}");
    }
}

/// Nexmark's bid and person tables, for which columns a query reads.
fn nexmark() -> Catalog {
    let time = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let bid = Schema::new(vec![
        Field::new("auction", DataType::Int64, true),
        Field::new("bidder", DataType::Int64, true),
        Field::new("price", DataType::Int64, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("date_time", time(), true),
        Field::new("extra", DataType::Utf8, true),
    ]);
    let person = Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("city", DataType::Utf8, true),
        Field::new("date_time", time(), true),
        Field::new("extra", DataType::Utf8, true),
    ]);
    Catalog::new()
        .with_table("bid", Arc::new(bid))
        .with_table("person", Arc::new(person))
}

/// The names of the columns `plan` reads of `table`.
fn reads<'a>(plan: &'a ubik_engine::QueryPlan, table: &str) -> Vec<&'a str> {
    plan.sources[plan.source_index(table).unwrap()].read_names()
}

#[test]
fn a_query_reads_the_columns_it_names_and_the_timestamps() {
    let plan = |q: &str| plan_query(q, &nexmark(), QueryOptions::default()).unwrap();
    // q2: the event time is read though the query does not name it.
    let q2 = plan("SELECT auction, price FROM bid WHERE auction % 123 = 0");
    assert_eq!(reads(&q2, "bid"), ["auction", "price", "date_time"]);
    let all = plan("SELECT * FROM bid");
    assert_eq!(all.sources[0].reads, [true; 6]);
    let count = plan(
        "SELECT TUMBLE(date_time, INTERVAL '10' SECOND) AS w, count(*) AS n FROM bid \
         GROUP BY TUMBLE(date_time, INTERVAL '10' SECOND)",
    );
    assert_eq!(reads(&count, "bid"), ["date_time"]);
    // Through a subquery and its aliases, on both sides of a join.
    let join = plan(
        "SELECT p.name, b.price FROM (SELECT id, name AS name, date_time FROM person) p \
         JOIN bid b ON p.id = b.bidder \
         AND b.date_time BETWEEN p.date_time AND p.date_time + INTERVAL '1' HOUR",
    );
    assert_eq!(reads(&join, "person"), ["id", "name", "date_time"]);
    assert_eq!(reads(&join, "bid"), ["bidder", "price", "date_time"]);
    // A ranking breaks ties by the columns its result uses: those are read,
    // with its PARTITION BY and ORDER BY columns.
    let top = plan(
        "SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction \
         ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 1",
    );
    assert_eq!(reads(&top, "bid"), ["auction", "price", "date_time"]);
    let QueryKind::Rank(r) = &top.kind else {
        panic!("a top-N: {}", top.kind_name());
    };
    assert_eq!(r.kept, [0, 2]);
    let by_other = plan(
        "SELECT auction, url FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction \
         ORDER BY bidder) AS rn FROM bid) WHERE rn <= 1",
    );
    assert_eq!(
        reads(&by_other, "bid"),
        ["auction", "bidder", "url", "date_time"]
    );
}
