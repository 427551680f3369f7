//! The format layer's seam: a source's records arrive as bytes, and the
//! [`Format`] named in its spec picks the [`RecordDecoder`] that turns them
//! into Arrow rows of the source's schema. Transports never decode; formats
//! never do I/O.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::error::{FormatError, Result};
use crate::json::JsonDecoder;

/// A record that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Index of the record in the slice given to [`RecordDecoder::decode`].
    pub index: usize,
    /// The field at fault (dotted for nested fields), when known.
    pub field: Option<String>,
    /// Why, without the field.
    pub reason: String,
}

impl BadRecord {
    /// `field 'x': reason`, or the reason alone.
    pub fn message(&self) -> String {
        match &self.field {
            Some(f) => format!("field '{f}': {}", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// The result of decoding a chunk of records.
#[derive(Debug)]
pub struct Decoded {
    /// One row per good record, in order, in the target schema.
    pub batch: RecordBatch,
    /// Record index of each row; empty when every record was good (row i is record i).
    pub records: Vec<u32>,
    pub bad: Vec<BadRecord>,
}

impl Decoded {
    /// The record index of row `row`.
    pub fn record_of(&self, row: usize) -> usize {
        if self.records.is_empty() {
            row
        } else {
            self.records[row] as usize
        }
    }
}

/// Decodes a chunk holding records of two kinds into one batch, rows in
/// record order: values (`deleted[i]` false) with `values`, and deletions'
/// keys with `keys`, both decoding into the same schema. Each decoder gets
/// its records in one call, so a chunk costs two calls however often its
/// kinds alternate (a change stream's deletes are scattered among its
/// upserts). [`Decoded::records`] and [`BadRecord::index`] index `records`.
pub fn decode_mixed(
    records: &[&[u8]],
    deleted: &[bool],
    values: &mut dyn FnMut(&[&[u8]]) -> Result<Decoded>,
    keys: &mut dyn FnMut(&[&[u8]]) -> Result<Decoded>,
) -> Result<Decoded> {
    let (mut of_values, mut of_keys) = (Vec::new(), Vec::new());
    for (i, &d) in deleted.iter().enumerate().take(records.len()) {
        match d {
            false => of_values.push(i as u32),
            true => of_keys.push(i as u32),
        }
    }
    of_values.extend(deleted.len() as u32..records.len() as u32);
    let pick = |ids: &[u32]| -> Vec<&[u8]> { ids.iter().map(|&i| records[i as usize]).collect() };
    let parts = [
        (values(&pick(&of_values))?, of_values),
        (keys(&pick(&of_keys))?, of_keys),
    ];
    // Each part's rows are in record order already: merge the two.
    let ids = |k: usize| {
        let (d, ids) = &parts[k];
        (0..d.batch.num_rows()).map(move |r| (ids[d.record_of(r)], k, r))
    };
    let (mut a, mut b) = (ids(0).peekable(), ids(1).peekable());
    let mut rows = Vec::with_capacity(parts[0].0.batch.num_rows() + parts[1].0.batch.num_rows());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 < y.0 => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => break,
        };
        rows.extend(next);
    }
    let indices: Vec<(usize, usize)> = rows.iter().map(|&(_, k, r)| (k, r)).collect();
    let batch =
        arrow::compute::interleave_record_batch(&[&parts[0].0.batch, &parts[1].0.batch], &indices)?;
    let mut bad: Vec<BadRecord> = parts
        .iter()
        .flat_map(|(d, ids)| {
            d.bad.iter().map(|b| BadRecord {
                index: ids[b.index] as usize,
                ..b.clone()
            })
        })
        .collect();
    bad.sort_by_key(|b| b.index);
    Ok(Decoded {
        batch,
        records: rows.iter().map(|r| r.0).collect(),
        bad,
    })
}

/// Decodes encoded records into rows of one schema. A bad record is
/// reported in [`Decoded::bad`] with its index; the good ones are kept.
pub trait RecordDecoder: Send {
    fn schema(&self) -> &SchemaRef;
    fn decode(&mut self, records: &[&[u8]]) -> Result<Decoded>;
    /// Decodes only the columns `reads` marks true (one flag per column of
    /// [`schema`](Self::schema)): the query reads no other. The others are
    /// null in the batches decoded from then on (a column that cannot be
    /// null is decoded all the same), and their values are checked for
    /// syntax only: a record is bad for what the query reads, not for a value
    /// of the wrong type in a column it never looks at.
    fn read_only(&mut self, reads: &[bool]) -> Result<()>;
    /// Numbers in timestamp columns count `units` (one per column of
    /// [`schema`](Self::schema)) from the next batch on; epoch milliseconds
    /// until set. Only a text format has numbers to read so: the others
    /// carry typed timestamps and ignore this.
    fn set_epoch_units(&mut self, units: &[crate::timestamp::EpochUnit]) -> Result<()> {
        let _ = units;
        Ok(())
    }
    /// Numbers in every timestamp column count `unit` (a source's
    /// `timestamp_unit=`); see [`set_epoch_units`](Self::set_epoch_units).
    fn set_epoch_unit(&mut self, unit: crate::timestamp::EpochUnit) -> Result<()> {
        let columns = self.schema().fields().len();
        self.set_epoch_units(&vec![unit; columns])
    }
}

/// The encoding of a source's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// One JSON object per record (an NDJSON line, a Kafka message, a webhook event).
    #[default]
    Json,
}

impl Format {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "json" => Ok(Format::Json),
            other => Err(FormatError::Schema(format!(
                "unknown format {other:?}; supported: json"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
        }
    }

    /// A decoder for `schema` using up to `threads` threads.
    pub fn decoder(self, schema: SchemaRef, threads: usize) -> Result<Box<dyn RecordDecoder>> {
        Ok(match self {
            Format::Json => Box::new(JsonDecoder::with_threads(schema, threads)?),
        })
    }

    /// A schema inferred from sample records.
    pub fn infer_schema(self, sample: &[&[u8]]) -> Result<SchemaRef> {
        match self {
            Format::Json => crate::schema::infer_schema(sample),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;

    use super::*;

    #[test]
    fn mixed_records_come_back_in_record_order_with_their_bad_ones() {
        let schema = crate::schema::parse_column_list("id BIGINT, v BIGINT").unwrap();
        let mut values = JsonDecoder::new(Arc::clone(&schema)).unwrap();
        let mut keys = JsonDecoder::new(schema).unwrap();
        let records: [&[u8]; 6] = [
            br#"{"id":1,"v":10}"#,
            br#"{"id":2}"#,
            br#"{"id":3,"v":"x"}"#,
            br#"{"id":"y"}"#,
            br#"{"id":5,"v":50}"#,
            br#"{"id":6}"#,
        ];
        let deleted = [false, true, false, true, false, true];
        let decoded = decode_mixed(&records, &deleted, &mut |r| values.decode(r), &mut |r| {
            keys.decode(r)
        })
        .unwrap();
        let ids: Vec<i64> = decoded
            .batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, [1, 2, 5, 6]);
        assert_eq!(decoded.records, [0, 1, 4, 5]);
        let bad: Vec<usize> = decoded.bad.iter().map(|b| b.index).collect();
        assert_eq!(bad, [2, 3]);
    }
}
