use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
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
