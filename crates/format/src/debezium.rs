//! Debezium's change-event envelope in JSON (`format=debezium-json`), as
//! Kafka Connect's `JsonConverter` writes it with or without
//! `schemas.enable` (`{"schema":…,"payload":{…}}` or the payload alone).
//!
//! [`DebeziumJson`] turns a chunk of change events into a chunk of the
//! table's rows, without building a JSON tree: each event is skimmed for its
//! `op`, its `source.ts_ms`, and the byte spans of its `before` and `after`
//! objects and of its Connect `schema`, and the new chunk's records are
//! those spans of the same buffer. Creates, snapshot reads and updates (`c`, `r`, `u`) become their
//! `after` row; a delete (`d`) becomes a deletion whose key is read from
//! its `before` row (which holds at least the primary key under any
//! replica identity). Each row's timestamp is the change's source time,
//! so a version is valid from when the database made it.
//!
//! Debezium writes times as numbers whose unit depends on the column and
//! on `time.precision.mode` (a PostgreSQL `timestamp` is microseconds by
//! default, milliseconds with `connect`). An event with a `schema` names
//! each column's time type, so its rows' numbers are read in that unit
//! (the schema is parsed once while it repeats); without one, numbers
//! count the source's `timestamp_unit` (milliseconds by default).
//!
//! The tombstone Debezium writes after a delete (for log compaction) is
//! dropped: its delete came first. An event that cannot be applied (no
//! `after` for a `c`, no `before` for a `d`, a truncate, an unknown `op`,
//! not JSON) is a [`BadRecord`] of the original chunk.
//!
//! [`applies_as_deletion`] and [`Rejects`] are the rules and the bad-event
//! bookkeeping every encoding of the envelope shares ([`ChangeEvents`]).

use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::Schema;
use serde::Deserialize;
use serde_json::value::RawValue;
use ubik_connector::{Chunk, Payload, RecordMeta};

use crate::decoder::BadRecord;
use crate::timestamp::EpochUnit;

mod skim;

/// One change event's parts, borrowed from its bytes. With
/// `schemas.enable=true` the event is the `payload` of Connect's envelope,
/// read in the same pass.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    payload: Option<Box<Envelope<'a>>>,
    #[serde(borrow, default)]
    before: Option<&'a RawValue>,
    #[serde(borrow, default)]
    after: Option<&'a RawValue>,
    #[serde(borrow, default)]
    op: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    source: Option<SourceInfo>,
    #[serde(default)]
    ts_ms: Option<i64>,
}

#[derive(Deserialize)]
struct SourceInfo {
    #[serde(default)]
    ts_ms: Option<i64>,
}

/// What one event changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// The row's new image: bytes `span` of the record.
    Upsert(Range<usize>),
    /// The key (in the old image at `span`) stops existing.
    Delete(Range<usize>),
}

/// How an event of `op` applies, whatever its encoding: `Ok(true)` a
/// deletion of the key in its `before` row, `Ok(false)` an upsert of its
/// `after` row, or why it cannot be applied.
pub fn applies_as_deletion(op: &str, has_before: bool, has_after: bool) -> Result<bool, String> {
    match op {
        "c" | "r" | "u" if has_after => Ok(false),
        "c" | "r" | "u" => Err(format!(
            "a Debezium `{op}` event without an `after` row: there is no new row to apply"
        )),
        "d" if has_before => Ok(true),
        "d" => Err("a Debezium delete (`d`) without a `before` row: its key is unknown (Debezium always writes the key columns there; was the event rewritten?)".to_string()),
        "t" => Err("a Debezium truncate (`t`) names no rows, so ubik cannot take them back one by one; keep Debezium's default `skipped.operations=t`, or restart the query from a new snapshot after a truncate".into()),
        other => Err(format!("a Debezium event with op {other:?}: ubik applies c, r, u and d")),
    }
}

/// Turns chunks of one encoding's change events into a table's rows and
/// deletions. Implemented here for JSON ([`DebeziumJson`]) and by the
/// Avro format crate for Debezium's Avro envelope.
pub trait ChangeEvents: Send {
    /// Unwraps `chunk` (see [`Unwrapped`]); an error stops the run (a
    /// schema that no longer fits, a registry outage), while a bad event is
    /// one of [`Unwrapped::bad`].
    fn unwrap(&mut self, chunk: Chunk) -> crate::Result<Unwrapped>;
}

/// Debezium's JSON events ([`DebeziumJson::unwrap_events`]) for a table.
#[derive(Debug, Clone)]
pub struct DebeziumJson {
    /// The table's column names.
    columns: Vec<String>,
    /// What numbers count in timestamp columns when the event's schema does
    /// not say (no `schema`: `schemas.enable=false`).
    default_units: Arc<[EpochUnit]>,
    /// The last `schema` an event carried, and the units it gives.
    last_schema: Option<(Box<str>, Arc<[EpochUnit]>)>,
}

impl DebeziumJson {
    /// Events of `table`'s rows, whose numbers in timestamp columns count
    /// `default_unit` where the events carry no schema.
    pub fn new(table: &Schema, default_unit: EpochUnit) -> Self {
        Self {
            columns: table.fields().iter().map(|f| f.name().clone()).collect(),
            default_units: vec![default_unit; table.fields().len()].into(),
            last_schema: None,
        }
    }

    /// What numbers count in each column of the rows of an event with
    /// Connect's `schema` (`text`): Debezium names its time types there
    /// (`io.debezium.time.MicroTimestamp`, say), whatever
    /// `time.precision.mode` the connector runs with.
    fn units_of_schema(&mut self, text: &str) -> Result<Arc<[EpochUnit]>, String> {
        // A topic's events repeat one schema: read it once.
        if let Some((last, units)) = &self.last_schema
            && **last == *text
        {
            return Ok(Arc::clone(units));
        }
        // The skim bounds the schema by its brackets: what is not JSON is
        // refused here, as serde refuses the event. JSON of another shape
        // names no types, as an event without a schema.
        let schema: ConnectSchema = match serde_json::from_str(text) {
            Ok(schema) => schema,
            Err(e) if e.is_data() => ConnectSchema { fields: Vec::new() },
            Err(e) => return Err(format!("not a Debezium change event (JSON): {e}")),
        };
        let row = schema
            .fields
            .iter()
            .find(|f| f.field.as_deref() == Some("after"))
            .or_else(|| {
                schema
                    .fields
                    .iter()
                    .find(|f| f.field.as_deref() == Some("before"))
            });
        let units: Arc<[EpochUnit]> = self
            .columns
            .iter()
            .zip(self.default_units.iter())
            .map(|(column, default)| {
                row.and_then(|r| r.fields.iter().find(|f| f.field.as_ref() == Some(column)))
                    .and_then(|f| epoch_unit_named(f.name.as_deref()?))
                    .unwrap_or(*default)
            })
            .collect();
        self.last_schema = Some((text.into(), Arc::clone(&units)));
        Ok(units)
    }

    /// Unwraps a chunk of Debezium JSON events (see the module doc).
    /// Tombstones are dropped.
    pub fn unwrap_events(&mut self, chunk: Chunk) -> Unwrapped {
        let Payload::Bytes { data, spans } = &chunk.payload else {
            return Unwrapped::decoded(chunk);
        };
        let tombstone = chunk.meta.deletion_mask(spans.len());
        let mut runs: Vec<Run> = Vec::new();
        let mut rejects = Rejects::new(chunk.partition, chunk.position_name);
        for (i, record_span) in spans.iter().enumerate() {
            if tombstone[i] {
                continue;
            }
            let position = chunk.positions.get(i).copied().unwrap_or_default();
            // An event without a schema counts the default units (no
            // reference counting per event).
            let read = read_event(&data[record_span.clone()]).and_then(|(change, time, schema)| {
                let units = schema.map(|s| self.units_of_schema(s)).transpose()?;
                Ok((change, time, units))
            });
            match read {
                Ok((change, time, units)) => {
                    let units = units.as_ref().unwrap_or(&self.default_units);
                    let (range, deletion) = match change {
                        Change::Upsert(r) => (r, false),
                        Change::Delete(r) => (r, true),
                    };
                    // Rows whose timestamps count other units start a run of their own.
                    let run = match runs.last_mut() {
                        // (`Arc` compares pointers first.)
                        Some(run) if run.units == *units => run,
                        _ => {
                            runs.push(Run::new(Arc::clone(units)));
                            runs.last_mut().expect("pushed")
                        }
                    };
                    run.kept.push(
                        deletion,
                        time.or(chunk.meta.timestamps.get(i).copied()),
                        position,
                    );
                    run.spans
                        .push(record_span.start + range.start..record_span.start + range.end);
                }
                Err(reason) => rejects.push(&data[record_span.clone()], position, reason),
            }
        }
        let (partition, position_name) = (chunk.partition, chunk.position_name);
        let Payload::Bytes { mut data, .. } = chunk.payload else {
            unreachable!("matched above")
        };
        let mut rows = Vec::with_capacity(runs.len().max(1));
        let last = runs.len().saturating_sub(1);
        for (r, run) in runs.into_iter().enumerate() {
            // Runs share the chunk's bytes; all but the last (rare: a
            // schema change mid-chunk) take a copy.
            let data = match r == last {
                true => std::mem::take(&mut data),
                false => data.clone(),
            };
            rows.push(run.finish(partition, position_name, data));
        }
        if rows.is_empty() {
            rows.push(Rows {
                chunk: empty(partition, position_name),
                epochs: Some(Arc::clone(&self.default_units)),
            });
        }
        Unwrapped {
            rows,
            rejected: rejects.chunk,
            bad: rejects.bad,
        }
    }
}

/// Consecutive rows whose timestamps count the same units.
struct Run {
    units: Arc<[EpochUnit]>,
    kept: KeptRows,
    spans: Vec<Range<usize>>,
}

impl Run {
    fn new(units: Arc<[EpochUnit]>) -> Self {
        Self {
            units,
            kept: KeptRows::default(),
            spans: Vec::new(),
        }
    }

    /// The run's rows: `data` (the chunk's bytes) at its spans.
    fn finish(self, partition: u32, position_name: &'static str, data: Vec<u8>) -> Rows {
        let (meta, positions) = self.kept.finish();
        Rows {
            chunk: Chunk {
                partition,
                payload: Payload::Bytes {
                    data,
                    spans: self.spans,
                },
                positions,
                position_name,
                meta,
            },
            epochs: Some(self.units),
        }
    }
}

/// The unit a Connect schema's type name gives a number: Debezium's and
/// Connect's time types (`None`: a plain number, which counts the default).
fn epoch_unit_named(name: &str) -> Option<EpochUnit> {
    Some(match name {
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            EpochUnit::Millis
        }
        "io.debezium.time.MicroTimestamp" => EpochUnit::Micros,
        "io.debezium.time.NanoTimestamp" => EpochUnit::Nanos,
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => EpochUnit::Days,
        _ => return None,
    })
}

/// The parts of Connect's schema envelope read: the envelope's fields
/// (`before`, `after`), their fields' names and type names.
#[derive(Deserialize)]
struct ConnectSchema {
    #[serde(default)]
    fields: Vec<ConnectField>,
}

#[derive(Deserialize)]
struct ConnectField {
    #[serde(default)]
    field: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    fields: Vec<ConnectField>,
}

impl ChangeEvents for DebeziumJson {
    fn unwrap(&mut self, chunk: Chunk) -> crate::Result<Unwrapped> {
        Ok(self.unwrap_events(chunk))
    }
}

/// The events of a chunk that cannot be applied, copied out with their
/// positions, and why ([`Unwrapped::rejected`], [`Unwrapped::bad`]).
#[derive(Debug)]
pub struct Rejects {
    pub chunk: Chunk,
    pub bad: Vec<BadRecord>,
}

impl Rejects {
    /// None yet, for events of `partition`.
    pub fn new(partition: u32, position_name: &'static str) -> Self {
        Self {
            chunk: empty(partition, position_name),
            bad: Vec::new(),
        }
    }

    /// Rejects `record` (at `position`) for `reason`.
    pub fn push(&mut self, record: &[u8], position: u64, reason: String) {
        let Payload::Bytes { data, spans } = &mut self.chunk.payload else {
            unreachable!("built as bytes")
        };
        self.bad.push(BadRecord {
            index: spans.len(),
            field: None,
            reason,
        });
        let at = data.len();
        data.extend_from_slice(record);
        spans.push(at..data.len());
        self.chunk.positions.push(position);
    }
}

/// Reads one event: its change, its source time (ms) and its Connect
/// `schema`'s text, or why it cannot be applied. The common form is skimmed ([`skim`]); serde reads the rest
/// and says what is wrong.
fn read_event(record: &[u8]) -> Result<(Change, Option<i64>, Option<&str>), String> {
    let fields = match skim::skim(record) {
        Some(f) => f,
        None => parse_envelope(record)?,
    };
    let op = fields.op.as_deref().ok_or_else(|| {
        "not a Debezium change event: it has no `op` (is the topic plain JSON? then drop format=debezium-json)".to_string()
    })?;
    let time = fields.source_ts.or(fields.ts_ms);
    let span = |text: &str| {
        let start = text.as_ptr() as usize - record.as_ptr() as usize;
        start..start + text.len()
    };
    let is_object = |v: Option<&str>| v.is_some_and(|v| v.starts_with('{'));
    let change = if applies_as_deletion(op, is_object(fields.before), is_object(fields.after))? {
        Change::Delete(span(fields.before.expect("checked above")))
    } else {
        Change::Upsert(span(fields.after.expect("checked above")))
    };
    Ok((change, time, fields.schema))
}

/// Reads an envelope with serde: any JSON the skim gives up on, with
/// serde's words for what is wrong.
fn parse_envelope(record: &[u8]) -> Result<skim::Fields<'_>, String> {
    let mut env: Envelope<'_> = serde_json::from_slice(record)
        .map_err(|e| format!("not a Debezium change event (JSON): {e}"))?;
    let schema = env.schema.map(RawValue::get);
    if env.op.is_none()
        && let Some(payload) = env.payload.take()
    {
        env = *payload;
    }
    Ok(skim::Fields {
        schema,
        before: env.before.map(RawValue::get),
        after: env.after.map(RawValue::get),
        op: env.op,
        source_ts: env.source.and_then(|s| s.ts_ms),
        ts_ms: env.ts_ms,
    })
}

/// A chunk of change events, unwrapped.
#[derive(Debug)]
pub struct Unwrapped {
    /// The table's rows, in order, in runs (one, unless what numbers count
    /// in timestamp columns changes mid-chunk).
    pub rows: Vec<Rows>,
    /// The events that cannot be applied (copied out, with their
    /// positions), and why: [`BadRecord::index`] indexes this chunk.
    pub rejected: Chunk,
    pub bad: Vec<BadRecord>,
}

/// Rows of a table, with what numbers count in their timestamp columns.
#[derive(Debug)]
pub struct Rows {
    /// Encoded (JSON spans) or decoded already (Arrow, in the table's
    /// schema): deletions marked in [`RecordMeta::deletions`], source times
    /// in [`RecordMeta::timestamps`].
    pub chunk: Chunk,
    /// One per column, for the row decoder
    /// ([`crate::RecordDecoder::set_epoch_units`]); `None` for Arrow.
    pub epochs: Option<Arc<[EpochUnit]>>,
}

impl Unwrapped {
    /// Rows decoded already (Arrow, in the table's schema), and the events
    /// that cannot be applied.
    pub fn new(rows: Chunk, rejects: Rejects) -> Self {
        Unwrapped {
            rows: vec![Rows {
                chunk: rows,
                epochs: None,
            }],
            rejected: rejects.chunk,
            bad: rejects.bad,
        }
    }

    /// A chunk handed over as Arrow: its rows are the table's already.
    pub fn decoded(chunk: Chunk) -> Self {
        let rejects = Rejects::new(chunk.partition, chunk.position_name);
        Unwrapped::new(chunk, rejects)
    }

    /// The rows of every run.
    pub fn row_count(&self) -> usize {
        self.rows.iter().map(|r| r.chunk.payload.len()).sum()
    }
}

/// The rows a chunk of events becomes, in order, with each one's deletion
/// mark, time and position ([`Unwrapped::rows`]' meta and positions).
#[derive(Debug, Default)]
pub struct KeptRows {
    meta: RecordMeta,
    positions: Vec<u64>,
}

impl KeptRows {
    pub fn push(&mut self, deletion: bool, time: Option<i64>, position: u64) {
        if deletion {
            self.meta.deletions.push(self.positions.len() as u32);
        }
        if let Some(t) = time {
            self.meta.timestamps.push(t);
        }
        self.positions.push(position);
    }

    /// The rows' meta and positions. Times are all or nothing: a source
    /// without record times and events without source times give none.
    pub fn finish(mut self) -> (RecordMeta, Vec<u64>) {
        if self.meta.timestamps.len() != self.positions.len() {
            self.meta.timestamps.clear();
        }
        (self.meta, self.positions)
    }
}

/// A chunk of no records.
pub fn empty(partition: u32, position_name: &'static str) -> Chunk {
    Chunk {
        partition,
        payload: Payload::Bytes {
            data: Vec::new(),
            spans: Vec::new(),
        },
        positions: Vec::new(),
        position_name,
        meta: RecordMeta::default(),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Field, TimeUnit};

    use super::*;

    fn chunk(records: &[&str], tombstones: Vec<u32>) -> Chunk {
        Chunk {
            partition: 0,
            positions: (0..records.len() as u64).map(|i| 100 + i).collect(),
            payload: Payload::from_records(records),
            position_name: "offset",
            meta: RecordMeta {
                timestamps: vec![7; records.len()],
                deletions: tombstones,
            },
        }
    }

    /// Unwraps `input`'s events of a table (id, m, at TIMESTAMP) into one run of rows.
    fn unwrap(input: Chunk) -> Unwrapped {
        DebeziumJson::new(&table(), EpochUnit::Millis).unwrap_events(input)
    }

    fn table() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("m", DataType::Utf8, true),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ])
    }

    fn one_run(mut u: Unwrapped) -> (Chunk, Unwrapped) {
        assert_eq!(u.rows.len(), 1, "{:?}", u.rows);
        (u.rows.remove(0).chunk, u)
    }

    fn texts(c: &Chunk) -> Vec<String> {
        c.payload
            .records()
            .iter()
            .map(|r| String::from_utf8(r.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn events_become_rows_and_deletions_with_their_source_time() {
        let input = chunk(
            &[
                r#"{"before":null,"after":{"id":1,"m":"a"},"source":{"ts_ms":5},"op":"r","ts_ms":9}"#,
                r#"{"schema":{"type":"struct"},"payload":{"before":{"id":1,"m":"a"},"after":{"id":1,"m":"b"},"source":{"ts_ms":6,"name":"x"},"op":"u"}}"#,
                r#"{"before":{"id":1,"m":null},"after":null,"source":{"ts_ms":8},"op":"d"}"#,
                "1",
            ],
            vec![3],
        );
        let (rows, Unwrapped { bad, .. }) = one_run(unwrap(input));
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            texts(&rows),
            [
                r#"{"id":1,"m":"a"}"#,
                r#"{"id":1,"m":"b"}"#,
                r#"{"id":1,"m":null}"#
            ]
        );
        assert_eq!(rows.meta.deletions, [2]);
        assert_eq!(rows.meta.timestamps, [5, 6, 8]);
        assert_eq!(rows.positions, [100, 101, 102]);
    }

    #[test]
    fn events_that_cannot_be_applied_are_bad_records_of_the_original_chunk() {
        let input = chunk(
            &[
                r#"{"before":null,"after":null,"op":"c"}"#,
                r#"{"id":1}"#,
                r#"{"before":null,"after":null,"op":"d"}"#,
                r#"{"op":"t","source":{"ts_ms":1}}"#,
                r#"{"op":"c","after":{"id":2}}"#,
                "not json",
            ],
            vec![],
        );
        let (rows, Unwrapped { rejected, bad, .. }) = one_run(unwrap(input));
        assert_eq!(texts(&rejected)[4], "not json");
        assert_eq!(rejected.positions, [100, 101, 102, 103, 105]);
        let reasons: Vec<(usize, &str)> =
            bad.iter().map(|b| (b.index, b.reason.as_str())).collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert!(reasons[0].1.contains("without an `after`"), "{reasons:?}");
        assert!(reasons[1].1.contains("no `op`"), "{reasons:?}");
        assert!(reasons[2].1.contains("without a `before`"), "{reasons:?}");
        assert!(reasons[3].1.contains("truncate"), "{reasons:?}");
        assert_eq!(reasons[4].0, 4);
        assert_eq!(texts(&rows), [r#"{"id":2}"#]);
        // The kept event has no source time: the record's timestamp stands in.
        assert_eq!(rows.meta.timestamps, [7]);
        assert_eq!(rows.positions, [104]);
    }

    /// A Connect schema with each column's time type: `at` as `name`.
    fn with_schema(name: &str, payload: &str) -> String {
        format!(
            r#"{{"schema":{{"type":"struct","fields":[{{"type":"struct","fields":[{{"type":"int64","field":"id"}},{{"type":"int64","optional":true,"name":"{name}","version":1,"field":"at"}}],"optional":true,"field":"after"}},{{"type":"string","field":"op"}}]}},"payload":{payload}}}"#
        )
    }

    #[test]
    fn times_count_the_unit_the_event_schema_names_and_a_change_starts_a_run() {
        let at = 1_733_400_000_123_456i64; // µs
        let event = |at: i64| format!(r#"{{"after":{{"id":1,"at":{at}}},"op":"c"}}"#);
        let records = [
            event(at / 1000),
            with_schema("io.debezium.time.MicroTimestamp", &event(at)),
            with_schema("io.debezium.time.MicroTimestamp", &event(at)),
            with_schema("io.debezium.time.NanoTimestamp", &event(at * 1000)),
            with_schema("org.apache.kafka.connect.data.Timestamp", &event(at / 1000)),
            // Another shape names no types: the default.
            format!(r#"{{"schema":5,"payload":{}}}"#, event(at / 1000)),
            // Not JSON: refused, as serde refuses the event.
            format!(r#"{{"schema":{{"a":}},"payload":{}}}"#, event(at / 1000)),
        ];
        let refs: Vec<&str> = records.iter().map(String::as_str).collect();
        let Unwrapped { rows, bad, .. } = unwrap(chunk(&refs, vec![]));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].reason.contains("JSON"), "{bad:?}");
        let (ms, us, ns) = (EpochUnit::Millis, EpochUnit::Micros, EpochUnit::Nanos);
        let units: Vec<(usize, EpochUnit)> = rows
            .iter()
            .map(|r| (r.chunk.payload.len(), r.epochs.as_ref().unwrap()[2]))
            .collect();
        assert_eq!(units, [(1, ms), (2, us), (1, ns), (2, ms)]);
        let mut decoder = crate::json::JsonDecoder::with_threads(Arc::new(table()), 1).unwrap();
        for run in &rows {
            decoder
                .set_epoch_units(run.epochs.as_ref().unwrap())
                .unwrap();
            let decoded = decoder.decode(&run.chunk.payload.records()).unwrap();
            let times = decoded
                .batch
                .column(2)
                .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            for t in times.values() {
                let want = if run.epochs.as_ref().unwrap()[2] == ms {
                    at / 1000 * 1000
                } else {
                    at
                };
                assert_eq!(*t, want, "{run:?}");
            }
        }
    }
}
