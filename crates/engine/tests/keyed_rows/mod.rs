//! Rows for the join state tests: a key, a time and an expiry, one row
//! per millisecond.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

pub fn schema() -> Arc<Schema> {
    let time = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("ts", time(), false),
        Field::new("expires", time(), false),
    ]))
}

/// Rows `from..to`: row i has key `key(i)`, time i milliseconds, and
/// expires a second later.
pub fn rows(from: i64, to: i64, key: impl Fn(i64) -> i64) -> RecordBatch {
    let micros = |shift: i64| {
        Arc::new(
            TimestampMicrosecondArray::from_iter_values((from..to).map(|i| i * 1000 + shift))
                .with_timezone("UTC"),
        )
    };
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values((from..to).map(key))),
            micros(0),
            micros(1_000_000),
        ],
    )
    .unwrap()
}
