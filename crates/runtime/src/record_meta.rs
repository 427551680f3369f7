//! What a transport says about records besides their bytes, applied to
//! decoded rows: record timestamps fill the columns marked for them, and
//! deletions (Kafka tombstones, whose bytes are a key) become key rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Schema};
use ubik_connector::{Chunk, Payload, RECORD_TIMESTAMP_METADATA, RecordMeta};

use crate::error::Result;

/// Splits a chunk holding deletions into runs of values and runs of
/// deletions, in order (`true` marks a deletion run).
pub fn split_runs(chunk: Chunk) -> Vec<(Chunk, bool)> {
    let n = chunk.payload.len();
    let mut deleted = vec![false; n];
    for &d in &chunk.meta.deletions {
        if let Some(x) = deleted.get_mut(d as usize) {
            *x = true;
        }
    }
    let mut runs = Vec::new();
    let mut start = 0;
    while start < n {
        let kind = deleted[start];
        let end = (start..n).find(|&i| deleted[i] != kind).unwrap_or(n);
        let payload = match &chunk.payload {
            Payload::Bytes { data, spans } => {
                let mut bytes = Vec::new();
                let mut run_spans = Vec::with_capacity(end - start);
                for span in &spans[start..end] {
                    let at = bytes.len();
                    bytes.extend_from_slice(&data[span.clone()]);
                    run_spans.push(at..bytes.len());
                }
                Payload::Bytes {
                    data: bytes,
                    spans: run_spans,
                }
            }
            Payload::Arrow(batch) => Payload::Arrow(batch.slice(start, end - start)),
        };
        let timestamps = chunk
            .meta
            .timestamps
            .get(start..end)
            .map(<[i64]>::to_vec)
            .unwrap_or_default();
        runs.push((
            Chunk {
                partition: chunk.partition,
                payload,
                positions: chunk.positions.get(start..end).unwrap_or_default().to_vec(),
                position_name: chunk.position_name,
                meta: RecordMeta {
                    timestamps,
                    deletions: Vec::new(),
                },
            },
            kind,
        ));
        start = end;
    }
    runs
}

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
/// [`RECORD_TIMESTAMP_METADATA`], or, for deletion rows, every timestamp
/// column (a tombstone takes effect at its record's time). Rows keep their
/// decoded values when the transport gave no timestamps.
pub fn fill_record_times(
    batch: RecordBatch,
    record_of: &[u32],
    timestamps: &[i64],
    deletion: bool,
) -> Result<RecordBatch> {
    if timestamps.is_empty() {
        return Ok(batch);
    }
    let schema: Arc<Schema> = batch.schema();
    let filled = |i: usize| {
        let field = schema.field(i);
        matches!(field.data_type(), DataType::Timestamp(_, _))
            && (deletion
                || field
                    .metadata()
                    .get(RECORD_TIMESTAMP_METADATA)
                    .is_some_and(|v| v == "true"))
    };
    if !(0..schema.fields().len()).any(filled) {
        return Ok(batch);
    }
    let micros = TimestampMicrosecondArray::from_iter_values(record_of.iter().map(|&r| {
        timestamps
            .get(r as usize)
            .map_or(0, |ms| ms.saturating_mul(1000))
    }));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (i, column) in columns.iter_mut().enumerate() {
        if filled(i) {
            let ty = schema.field(i).data_type();
            *column = arrow::compute::cast(&micros, ty)?;
        }
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

    #[test]
    fn runs_keep_the_order_of_values_and_deletions() {
        let records: [&[u8]; 4] = [b"v0", b"k1", b"k2", b"v3"];
        let chunk = Chunk {
            partition: 3,
            payload: Payload::from_records(records),
            positions: vec![10, 11, 12, 13],
            position_name: "offset",
            meta: RecordMeta {
                timestamps: vec![100, 101, 102, 103],
                deletions: vec![1, 2],
            },
        };
        type Run = (Vec<Vec<u8>>, Vec<u64>, Vec<i64>, bool);
        let runs: Vec<Run> = split_runs(chunk)
            .into_iter()
            .map(|(c, d)| {
                let records = c.payload.records().iter().map(|r| r.to_vec()).collect();
                (records, c.positions, c.meta.timestamps, d)
            })
            .collect();
        assert_eq!(
            runs,
            vec![
                (vec![b"v0".to_vec()], vec![10], vec![100], false),
                (
                    vec![b"k1".to_vec(), b"k2".to_vec()],
                    vec![11, 12],
                    vec![101, 102],
                    true
                ),
                (vec![b"v3".to_vec()], vec![13], vec![103], false),
            ]
        );
    }
}
