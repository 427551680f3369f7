//! Debezium's change events in Avro (`format=debezium-avro`), as Kafka
//! Connect's Avro converters write them through a Confluent-compatible
//! registry: the value is Debezium's envelope record (`before`, `after`,
//! `source`, `op`, `ts_ms`, …) and the key a record of the primary key's
//! columns.
//!
//! The events are decoded as envelope rows by [`AvroDecoder`] (vectorised,
//! each with its writer schema, resolved to the envelope's latest), and
//! each becomes one table row, taken from its `after` struct (`c`, `r`,
//! `u`) or, for a delete (`d`), from its `before` struct, which holds the
//! key. The rows are gathered column by column with one `interleave` of
//! the two structs' children: no value is built per row. The op rules and
//! the bad-event bookkeeping are the JSON envelope's
//! ([`ubik_format::debezium`]), so both encodings refuse the same events
//! with the same words.
//!
//! The table's columns are the `after` record's fields ([`table_of`]) and
//! its primary key the key subject's fields ([`key_columns`]); a declared
//! column list may name a subset instead. Debezium's own time types, which
//! its converters mark with `connect.name` (`io.debezium.time.MicroTimestamp`
//! and the like, its default `time.precision.mode`), are TIMESTAMP and
//! DATE columns, not the numbers or strings that carry them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, StructArray};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, Field, Fields, Int64Type, Schema, SchemaRef, TimeUnit};
use ubik_connector::{Chunk, PRIMARY_KEY_METADATA, Payload, RECORD_TIMESTAMP_METADATA};
use ubik_format::RecordDecoder;
use ubik_format::debezium::{ChangeEvents, KeptRows, Rejects, Unwrapped, applies_as_deletion};

use crate::decode::AvroDecoder;
use crate::error::{AvroError, Result};
use crate::types::convert;

/// The envelope parts ubik reads.
const PARTS: [&str; 5] = ["before", "after", "op", "source", "ts_ms"];

/// A Debezium time type, by the `connect.name` its converters give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DebeziumTime {
    /// `io.debezium.time.Timestamp`, `MicroTimestamp`, `NanoTimestamp`: a
    /// long counting this unit since the epoch.
    Epoch(TimeUnit),
    /// `io.debezium.time.ZonedTimestamp`: an ISO-8601 string with its offset.
    Zoned,
    /// `io.debezium.time.Date`: an int counting days since the epoch.
    Date,
}

impl DebeziumTime {
    fn named(connect_name: &str) -> Option<Self> {
        Some(match connect_name {
            "io.debezium.time.Timestamp" => Self::Epoch(TimeUnit::Millisecond),
            "io.debezium.time.MicroTimestamp" => Self::Epoch(TimeUnit::Microsecond),
            "io.debezium.time.NanoTimestamp" => Self::Epoch(TimeUnit::Nanosecond),
            "io.debezium.time.ZonedTimestamp" => Self::Zoned,
            "io.debezium.time.Date" => Self::Date,
            _ => return None,
        })
    }

    /// The column type it is read as.
    fn column_type(self) -> DataType {
        match self {
            Self::Date => DataType::Date32,
            _ => ubik_format::schema::timestamp_type(),
        }
    }

    /// `column` (its carrier: a number or a string) as `to`.
    fn convert(self, column: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
        let as_time = match self {
            // The number is the time in this unit: reinterpret, then rescale.
            Self::Epoch(unit) => arrow::compute::cast(column, &DataType::Timestamp(unit, None))?,
            Self::Date => arrow::compute::cast(column, &DataType::Date32)?,
            Self::Zoned => Arc::clone(column),
        };
        let options = arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        };
        Ok(arrow::compute::cast_with_options(&as_time, to, &options)?)
    }
}

/// The row record's fields that carry a Debezium time type, by name, read
/// from the envelope schema's JSON (`connect.name` on a field's type).
fn time_fields(envelope_json: &str) -> HashMap<String, DebeziumTime> {
    let Ok(schema) = serde_json::from_str::<serde_json::Value>(envelope_json) else {
        return HashMap::new();
    };
    // The row record is defined where it first appears: `before`'s type, or `after`'s.
    let record = schema["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| matches!(f["name"].as_str(), Some("before" | "after")))
        .flat_map(|f| variants(&f["type"]))
        .find(|t| t["type"] == "record");
    let mut out = HashMap::new();
    for field in record
        .and_then(|r| r["fields"].as_array())
        .into_iter()
        .flatten()
    {
        let time = variants(&field["type"])
            .filter_map(|t| t["connect.name"].as_str())
            .find_map(DebeziumTime::named);
        if let (Some(name), Some(time)) = (field["name"].as_str(), time) {
            out.insert(name.to_string(), time);
        }
    }
    out
}

/// A type's alternatives: a union's members, or the type itself.
fn variants(t: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    match t.as_array() {
        Some(members) => members.iter().collect::<Vec<_>>().into_iter(),
        None => vec![t].into_iter(),
    }
}

/// The fields of the envelope's row record (`after`'s, which `before`
/// shares), as decoded columns.
fn row_fields(envelope: &Schema) -> Result<Fields> {
    let field = |name: &str| envelope.field_with_name(name).ok().map(|f| f.data_type());
    match (field("after"), field("before"), field("op")) {
        (Some(DataType::Struct(after)), Some(DataType::Struct(_)), Some(DataType::Utf8)) => {
            Ok(after.clone())
        }
        _ => Err(AvroError::Schema(format!(
            "the topic's value schema is not Debezium's envelope (a record with `before` and `after` rows and an `op` string); its fields are {}: is the topic plain Avro? then use format=avro",
            envelope
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The table of the rows `envelope` decodes: the `after` record's fields
/// (Debezium's time types as TIMESTAMP and DATE), keyed by `primary_key`
/// (which must be among them).
pub fn table_of(envelope: &AvroDecoder, primary_key: &[String]) -> Result<SchemaRef> {
    let fields = row_fields(envelope.schema())?;
    if let Some(missing) = primary_key
        .iter()
        .find(|k| fields.find(k.as_str()).is_none())
    {
        return Err(AvroError::Schema(format!(
            "the key column `{missing}` is not a field of the change events' rows ({})",
            names(&fields)
        )));
    }
    let times = time_fields(envelope.reader_schema());
    let fields: Vec<Field> = fields
        .iter()
        .map(|f| match times.get(f.name()) {
            Some(t) => Field::new(f.name(), t.column_type(), true),
            None => f.as_ref().clone(),
        })
        .collect();
    let metadata = [(PRIMARY_KEY_METADATA.to_string(), primary_key.join(","))].into();
    Ok(Arc::new(Schema::new_with_metadata(fields, metadata)))
}

/// The columns of a key schema (Debezium's key record), in order: the
/// table's primary key.
pub fn key_columns(key_schema: &str) -> Result<Vec<String>> {
    let refuse = || {
        AvroError::Schema(format!(
            "the key schema is not a record of the primary key's columns (Debezium's key): {key_schema}"
        ))
    };
    let schema: serde_json::Value = serde_json::from_str(key_schema).map_err(|_| refuse())?;
    let fields = schema
        .get("fields")
        .and_then(|f| f.as_array())
        .filter(|f| schema.get("type").and_then(|t| t.as_str()) == Some("record") && !f.is_empty())
        .ok_or_else(refuse)?;
    fields
        .iter()
        .map(|f| {
            f.get("name")
                .and_then(|n| n.as_str())
                .map(str::to_string)
                .ok_or_else(refuse)
        })
        .collect()
}

fn names(fields: &Fields) -> String {
    fields
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Unwraps Debezium's Avro events into a table's rows (see the module doc).
pub struct DebeziumAvro {
    envelope: AvroDecoder,
    table: SchemaRef,
    /// Each table column's field in the row structs; `None` for the
    /// record-time column, which the pipeline fills from the change times.
    fields: Vec<Option<usize>>,
    /// Each table column's Debezium time type, if it carries one.
    times: Vec<Option<DebeziumTime>>,
    row: Fields,
    /// The envelope columns of [`PARTS`], in that order.
    parts: [usize; 5],
}

impl DebeziumAvro {
    /// Unwraps events `envelope` decodes into rows of `table` (the
    /// envelope's row fields or a subset, by name).
    pub fn new(mut envelope: AvroDecoder, table: SchemaRef) -> Result<Self> {
        let decoded = Arc::clone(envelope.schema());
        let row = row_fields(&decoded)?;
        let time_of = time_fields(envelope.reader_schema());
        let times = table
            .fields()
            .iter()
            .map(|f| time_of.get(f.name()).copied())
            .collect();
        let mut fields = Vec::with_capacity(table.fields().len());
        for f in table.fields() {
            if f.metadata().contains_key(RECORD_TIMESTAMP_METADATA) {
                fields.push(None);
                continue;
            }
            let Some((k, _)) = row.find(f.name()) else {
                return Err(AvroError::Schema(format!(
                    "the column `{}` is not a field of the change events' rows ({}): drop it from the declared columns, or check the topic",
                    f.name(),
                    names(&row)
                )));
            };
            fields.push(Some(k));
        }
        let mut parts = [0; 5];
        let mut reads = vec![false; decoded.fields().len()];
        for (slot, part) in parts.iter_mut().zip(PARTS) {
            match decoded.index_of(part) {
                Ok(i) => {
                    *slot = i;
                    reads[i] = true;
                }
                // `source` and `ts_ms` only give times; without them the
                // record's timestamp stands in (the `op` column is checked above).
                Err(_) => *slot = usize::MAX,
            }
        }
        envelope
            .read_only(&reads)
            .map_err(|e| AvroError::Schema(e.to_string()))?;
        Ok(Self {
            envelope,
            table,
            fields,
            times,
            row,
            parts,
        })
    }

    /// The table the rows are of.
    pub fn table(&self) -> &SchemaRef {
        &self.table
    }

    fn part<'b>(&self, batch: &'b RecordBatch, k: usize) -> Option<&'b ArrayRef> {
        (self.parts[k] != usize::MAX).then(|| batch.column(self.parts[k]))
    }

    /// Each decoded event's change time: `source.ts_ms`, else the
    /// envelope's `ts_ms`.
    fn times(&self, batch: &RecordBatch) -> Vec<Option<i64>> {
        let int = |a: &ArrayRef| a.as_primitive_opt::<Int64Type>().cloned();
        let source = self
            .part(batch, 3)
            .and_then(|s| s.as_struct_opt())
            .and_then(|s| s.column_by_name("ts_ms"))
            .and_then(int);
        let top = self.part(batch, 4).and_then(int);
        (0..batch.num_rows())
            .map(|r| {
                let at = |a: &Option<arrow::array::Int64Array>| {
                    a.as_ref().filter(|a| a.is_valid(r)).map(|a| a.value(r))
                };
                at(&source).or_else(|| at(&top))
            })
            .collect()
    }

    fn rows(
        &self,
        before: &StructArray,
        after: &StructArray,
        picks: &[(usize, usize)],
    ) -> Result<RecordBatch> {
        let mut columns = Vec::with_capacity(self.fields.len());
        let columns_of = self.table.fields().iter().zip(&self.fields);
        for ((field, k), time) in columns_of.zip(&self.times) {
            columns.push(match k {
                Some(k) => {
                    let gathered = interleave(
                        &[after.column(*k).as_ref(), before.column(*k).as_ref()],
                        picks,
                    )?;
                    match time {
                        Some(t) => t.convert(&gathered, field.data_type())?,
                        None => convert(&gathered, &self.row[*k], field.data_type())?,
                    }
                }
                None => arrow::array::new_null_array(field.data_type(), picks.len()),
            });
        }
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.table),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(picks.len())),
        )?)
    }
}

impl ChangeEvents for DebeziumAvro {
    fn unwrap(&mut self, chunk: Chunk) -> ubik_format::Result<Unwrapped> {
        let Payload::Bytes { data, spans } = &chunk.payload else {
            return Ok(Unwrapped::decoded(chunk));
        };
        let (positions, meta) = (&chunk.positions, &chunk.meta);
        let mut rejects = Rejects::new(chunk.partition, chunk.position_name);
        // Tombstones (after deletes, for compaction) are dropped: their delete came first.
        let tombstone = meta.deletion_mask(spans.len());
        let events: Vec<usize> = (0..spans.len()).filter(|&i| !tombstone[i]).collect();
        let records: Vec<&[u8]> = events.iter().map(|&i| &data[spans[i].clone()]).collect();
        let decoded = self.envelope.decode(&records)?;
        let mut refused: Vec<(usize, String)> = decoded
            .bad
            .iter()
            .map(|b| (events[b.index], b.message()))
            .collect();
        let batch = decoded.batch;
        let record_of = |r: usize| match decoded.records.as_slice() {
            [] => r,
            records => records[r] as usize,
        };
        let (Some(before), Some(after), Some(op)) = (
            self.part(&batch, 0).and_then(|c| c.as_struct_opt()),
            self.part(&batch, 1).and_then(|c| c.as_struct_opt()),
            self.part(&batch, 2).and_then(|c| c.as_string_opt::<i32>()),
        ) else {
            return Err(AvroError::Schema(
                "the decoded envelope lost its before, after or op column".into(),
            )
            .into());
        };
        let times = self.times(&batch);
        let mut picks = Vec::with_capacity(batch.num_rows());
        let mut kept = KeptRows::default();
        for r in 0..batch.num_rows() {
            let i = events[record_of(r)];
            let op = if op.is_valid(r) { op.value(r) } else { "" };
            match applies_as_deletion(op, before.is_valid(r), after.is_valid(r)) {
                Ok(deletion) => {
                    picks.push((usize::from(deletion), r));
                    let time = times[r].or_else(|| meta.timestamps.get(i).copied());
                    kept.push(
                        deletion,
                        time,
                        positions.get(i).copied().unwrap_or_default(),
                    );
                }
                Err(reason) => refused.push((i, reason)),
            }
        }
        let (out, kept_positions) = kept.finish();
        refused.sort_by_key(|(i, _)| *i);
        for (i, reason) in refused {
            rejects.push(
                &data[spans[i].clone()],
                positions.get(i).copied().unwrap_or_default(),
                reason,
            );
        }
        let rows = self.rows(before, after, &picks)?;
        Ok(Unwrapped::new(
            Chunk {
                partition: chunk.partition,
                payload: Payload::Arrow(rows),
                positions: kept_positions,
                position_name: chunk.position_name,
                meta: out,
            },
            rejects,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{Int32Array, StringArray};
    use ubik_connector::RecordMeta;

    use super::*;
    use crate::encode::write_long;

    const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"db.public.t","fields":[
        {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
            {"name":"id","type":"int"},{"name":"m","type":["null","string"]}]}],"default":null},
        {"name":"after","type":["null","Value"],"default":null},
        {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium",
            "fields":[{"name":"version","type":"string"},{"name":"ts_ms","type":"long"}]}},
        {"name":"op","type":"string"},
        {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

    fn string(out: &mut Vec<u8>, s: &str) {
        write_long(out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }

    fn row(out: &mut Vec<u8>, r: Option<(i32, Option<&str>)>) {
        match r {
            None => write_long(out, 0),
            Some((id, m)) => {
                write_long(out, 1);
                write_long(out, id as i64);
                match m {
                    None => write_long(out, 0),
                    Some(m) => {
                        write_long(out, 1);
                        string(out, m);
                    }
                }
            }
        }
    }

    /// A Confluent-framed envelope (schema id 7).
    fn event(
        op: &str,
        before: Option<(i32, Option<&str>)>,
        after: Option<(i32, Option<&str>)>,
        ts: i64,
    ) -> Vec<u8> {
        let mut out = vec![0, 0, 0, 0, 7];
        row(&mut out, before);
        row(&mut out, after);
        string(&mut out, "3.6.1");
        write_long(&mut out, ts);
        string(&mut out, op);
        write_long(&mut out, 0);
        out
    }

    fn chunk(records: &[Vec<u8>], tombstones: Vec<u32>) -> Chunk {
        Chunk {
            partition: 0,
            positions: (0..records.len() as u64).map(|i| 100 + i).collect(),
            payload: Payload::from_records(records),
            position_name: "offset",
            meta: RecordMeta {
                timestamps: vec![1; records.len()],
                deletions: tombstones,
            },
        }
    }

    fn decoder(envelope: &str) -> AvroDecoder {
        let schemas = BTreeMap::from([(7, envelope.to_string())]);
        AvroDecoder::new(envelope.into(), Box::new(schemas)).unwrap()
    }

    fn unwrapper(table: SchemaRef) -> DebeziumAvro {
        DebeziumAvro::new(decoder(ENVELOPE), table).unwrap()
    }

    #[test]
    fn the_table_is_the_after_rows_keyed_by_the_key_record() {
        let key =
            key_columns(r#"{"type":"record","name":"Key","fields":[{"name":"id","type":"int"}]}"#)
                .unwrap();
        assert_eq!(key, ["id"]);
        let envelope = decoder(ENVELOPE);
        let table = table_of(&envelope, &key).unwrap();
        assert_eq!(
            ubik_format::schema::describe(&table),
            "id Int32, m Utf8, PRIMARY KEY (id)"
        );
        assert_eq!(ubik_connector::primary_key(&table), ["id"]);
        let e = table_of(&envelope, &["nope".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`nope`") && e.contains("id, m"), "{e}");
        assert!(key_columns(r#""string""#).is_err());
        let plain =
            decoder(r#"{"type":"record","name":"R","fields":[{"name":"id","type":"int"}]}"#);
        let e = table_of(&plain, &key).unwrap_err().to_string();
        assert!(e.contains("format=avro"), "{e}");
    }

    #[test]
    fn events_become_rows_and_deletions_and_bad_events_are_rejected_in_order() {
        let mut d = unwrapper(table_of(&decoder(ENVELOPE), &["id".into()]).unwrap());
        let input = chunk(
            &[
                event("r", None, Some((1, Some("a"))), 5),
                event("c", None, None, 6),
                event("u", Some((1, Some("a"))), Some((1, Some("b"))), 6),
                b"{\"id\":1}".to_vec(),
                event("d", Some((1, None)), None, 8),
                br#"{"id":1}"#.to_vec(),
                event("t", None, None, 9),
                event("c", None, Some((2, None)), 10),
            ],
            vec![5],
        );
        let Unwrapped {
            mut rows,
            rejected,
            bad,
        } = d.unwrap(input).unwrap();
        let rows = rows.remove(0).chunk;
        let Payload::Arrow(batch) = &rows.payload else {
            panic!("rows are decoded")
        };
        let ids: &Int32Array = batch.column(0).as_primitive();
        let ms: &StringArray = batch.column(1).as_string();
        assert_eq!(ids.values(), &[1, 1, 1, 2]);
        assert_eq!(
            ms.iter().collect::<Vec<_>>(),
            [Some("a"), Some("b"), None, None]
        );
        assert_eq!(rows.meta.deletions, [2]);
        assert_eq!(rows.meta.timestamps, [5, 6, 8, 10]);
        assert_eq!(rows.positions, [100, 102, 104, 107]);
        assert_eq!(rejected.positions, [101, 103, 106]);
        let reasons: Vec<&str> = bad.iter().map(|b| b.reason.as_str()).collect();
        assert!(reasons[0].contains("without an `after`"), "{reasons:?}");
        assert!(reasons[1].contains("magic byte"), "{reasons:?}");
        assert!(reasons[2].contains("truncate"), "{reasons:?}");
        assert_eq!(rejected.payload.record(1), Some(&b"{\"id\":1}"[..]));
    }

    #[test]
    fn a_declared_column_the_rows_lack_is_named() {
        let declared = ubik_format::schema::parse_column_list("id INT PRIMARY KEY, x INT").unwrap();
        let schemas = BTreeMap::from([(7, ENVELOPE.to_string())]);
        let envelope = AvroDecoder::new(ENVELOPE.into(), Box::new(schemas)).unwrap();
        let e = DebeziumAvro::new(envelope, declared)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`x`") && e.contains("id, m"), "{e}");
    }

    #[test]
    fn debezium_time_types_are_timestamps_and_dates() {
        let envelope = r#"{"type":"record","name":"Envelope","fields":[
            {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
                {"name":"id","type":"int"},
                {"name":"us","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}]},
                {"name":"ms","type":{"type":"long","connect.name":"io.debezium.time.Timestamp"}},
                {"name":"ns","type":{"type":"long","connect.name":"io.debezium.time.NanoTimestamp"}},
                {"name":"z","type":{"type":"string","connect.name":"io.debezium.time.ZonedTimestamp"}},
                {"name":"d","type":{"type":"int","connect.name":"io.debezium.time.Date"}},
                {"name":"n","type":"long"}]}],"default":null},
            {"name":"after","type":["null","Value"],"default":null},
            {"name":"op","type":"string"}]}"#;
        let d = decoder(envelope);
        let table = table_of(&d, &["id".into()]).unwrap();
        assert_eq!(
            ubik_format::schema::describe(&table),
            "id Int32, us Timestamp(µs, \"UTC\"), ms Timestamp(µs, \"UTC\"), ns Timestamp(µs, \"UTC\"), z Timestamp(µs, \"UTC\"), d Date32, n Int64, PRIMARY KEY (id)"
        );
        let mut u = DebeziumAvro::new(d, table).unwrap();
        // 2024-01-02T03:04:05.678901Z in each carrier; the date 2024-01-02.
        let us = 1_704_164_645_678_901i64;
        let mut event = vec![0, 0, 0, 0, 7];
        write_long(&mut event, 0); // before: null
        write_long(&mut event, 1); // after: the row
        write_long(&mut event, 4); // id 4
        write_long(&mut event, 1);
        write_long(&mut event, us);
        write_long(&mut event, us / 1000);
        write_long(&mut event, us * 1000);
        string(&mut event, "2024-01-02T03:04:05.678901Z");
        write_long(&mut event, 19724);
        write_long(&mut event, us);
        string(&mut event, "c");
        let Unwrapped { mut rows, bad, .. } = u.unwrap(chunk(&[event], vec![])).unwrap();
        let rows = rows.remove(0).chunk;
        assert!(bad.is_empty(), "{bad:?}");
        let Payload::Arrow(batch) = &rows.payload else {
            panic!("rows are decoded")
        };
        let micros = |c: usize| {
            batch
                .column(c)
                .as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                .value(0)
        };
        assert_eq!(micros(1), us);
        assert_eq!(micros(2), us / 1000 * 1000);
        assert_eq!(micros(3), us);
        assert_eq!(micros(4), us);
        assert_eq!(
            batch
                .column(5)
                .as_primitive::<arrow::datatypes::Date32Type>()
                .value(0),
            19724
        );
        assert_eq!(batch.column(6).as_primitive::<Int64Type>().value(0), us);
    }
}
