//! What a transport says about records besides their bytes, applied to
//! decoded rows: record timestamps fill the columns marked for them, and
//! deletions (Kafka tombstones, whose bytes are a key) become key rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Schema};
use ubik_connector::RECORD_TIMESTAMP_METADATA;

use crate::error::Result;

/// A deletion's key as a JSON object of the primary key's columns: a JSON
/// object as is, a JSON array by position, a JSON scalar or raw bytes (a
/// plain string key) as the only key column. `None` when it fits none.
pub fn key_object(key: &[u8], primary_key: &[&str]) -> Option<Vec<u8>> {
    let value: serde_json::Value = match serde_json::from_slice(key) {
        Ok(v) => v,
        Err(_) => serde_json::Value::String(std::str::from_utf8(key).ok()?.to_string()),
    };
    let object: serde_json::Map<String, serde_json::Value> = match value {
        serde_json::Value::Object(o) => o,
        serde_json::Value::Array(items) if items.len() == primary_key.len() => primary_key
            .iter()
            .map(|c| c.to_string())
            .zip(items)
            .collect(),
        serde_json::Value::Array(_) | serde_json::Value::Null => return None,
        scalar => match primary_key {
            [only] => [(only.to_string(), scalar)].into_iter().collect(),
            _ => return None,
        },
    };
    serde_json::to_vec(&object).ok()
}

/// Fills, from each row's record timestamp (ms), the columns marked with
/// [`RECORD_TIMESTAMP_METADATA`], and for the rows `deleted` marks (none
/// when empty) every timestamp column: a deletion takes effect at its
/// record's time. Rows keep their decoded values when the transport gave
/// no timestamps.
pub fn fill_record_times(
    batch: RecordBatch,
    record_of: &[u32],
    timestamps: &[i64],
    deleted: &[bool],
) -> Result<RecordBatch> {
    if timestamps.is_empty() {
        return Ok(batch);
    }
    let schema: Arc<Schema> = batch.schema();
    let any_deleted = deleted.contains(&true);
    let marked = |i: usize| {
        schema
            .field(i)
            .metadata()
            .get(RECORD_TIMESTAMP_METADATA)
            .is_some_and(|v| v == "true")
    };
    let is_time = |i: usize| matches!(schema.field(i).data_type(), DataType::Timestamp(_, _));
    let filled = |i: usize| is_time(i) && (any_deleted || marked(i));
    if !(0..schema.fields().len()).any(filled) {
        return Ok(batch);
    }
    let micros = TimestampMicrosecondArray::from_iter_values(record_of.iter().map(|&r| {
        timestamps
            .get(r as usize)
            .map_or(0, |ms| ms.saturating_mul(1000))
    }));
    let only_deleted = BooleanArray::from(deleted.to_vec());
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (i, column) in columns.iter_mut().enumerate() {
        if !filled(i) {
            continue;
        }
        let times = arrow::compute::cast(&micros, schema.field(i).data_type())?;
        *column = match marked(i) || deleted.iter().all(|&d| d) {
            true => times,
            false => arrow::compute::kernels::zip::zip(&only_deleted, &times, column)?,
        };
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_read_as_an_object_a_tuple_a_scalar_or_a_plain_string() {
        let one = ["id"];
        let text = |k: &[u8], pk: &[&str]| key_object(k, pk).map(|o| String::from_utf8(o).unwrap());
        assert_eq!(text(b"m1", &one).as_deref(), Some(r#"{"id":"m1"}"#));
        assert_eq!(text(br#""m1""#, &one).as_deref(), Some(r#"{"id":"m1"}"#));
        assert_eq!(text(b"42", &one).as_deref(), Some(r#"{"id":42}"#));
        assert_eq!(
            text(br#"{"id":"m1"}"#, &one).as_deref(),
            Some(r#"{"id":"m1"}"#)
        );
        assert_eq!(
            text(br#"["a",1]"#, &["k", "n"]).as_deref(),
            Some(r#"{"k":"a","n":1}"#)
        );
        assert_eq!(text(br#"["a"]"#, &["k", "n"]), None);
        assert_eq!(text(b"m1", &["k", "n"]), None);
        assert_eq!(text(&[0xff, 0xfe], &one), None);
    }
}
