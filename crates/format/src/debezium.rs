//! Debezium's change-event envelope in JSON (`format=debezium-json`), as
//! Kafka Connect's `JsonConverter` writes it with or without
//! `schemas.enable` (`{"schema":…,"payload":{…}}` or the payload alone).
//!
//! [`unwrap`] turns a chunk of change events into a chunk of the table's
//! rows, without building a JSON tree: each event is skimmed for its `op`,
//! its `source.ts_ms` and the byte spans of its `before` and `after`
//! objects, and the new chunk's records are those spans of the same
//! buffer. Creates, snapshot reads and updates (`c`, `r`, `u`) become their
//! `after` row; a delete (`d`) becomes a deletion whose key is read from
//! its `before` row (which holds at least the primary key under any
//! replica identity). Each row's timestamp is the change's source time,
//! so a version is valid from when the database made it.
//!
//! The tombstone Debezium writes after a delete (for log compaction) is
//! dropped: its delete came first. An event that cannot be applied (no
//! `after` for a `c`, no `before` for a `d`, a truncate, an unknown `op`,
//! not JSON) is a [`BadRecord`] of the original chunk.
//!
//! [`applies_as_deletion`] and [`Rejects`] are the rules and the bad-event
//! bookkeeping every encoding of the envelope shares ([`ChangeEvents`]).

use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;
use ubik_connector::{Chunk, Payload, RecordMeta};

use crate::decoder::BadRecord;

mod skim;

/// One change event's parts, borrowed from its bytes. With
/// `schemas.enable=true` the event is the `payload` of Connect's envelope,
/// read in the same pass.
#[derive(Deserialize)]
struct Envelope<'a> {
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

/// Debezium's JSON events ([`unwrap`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct DebeziumJson;

impl ChangeEvents for DebeziumJson {
    fn unwrap(&mut self, chunk: Chunk) -> crate::Result<Unwrapped> {
        Ok(unwrap(chunk))
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

/// Reads one event: its change and its source time (ms), or why it cannot
/// be applied. The common form is skimmed ([`skim`]); serde reads the rest
/// and says what is wrong.
fn read_event(record: &[u8]) -> Result<(Change, Option<i64>), String> {
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
    Ok((change, time))
}

/// Reads an envelope with serde: any JSON the skim gives up on, with
/// serde's words for what is wrong.
fn parse_envelope(record: &[u8]) -> Result<skim::Fields<'_>, String> {
    let mut env: Envelope<'_> = serde_json::from_slice(record)
        .map_err(|e| format!("not a Debezium change event (JSON): {e}"))?;
    if env.op.is_none()
        && let Some(payload) = env.payload.take()
    {
        env = *payload;
    }
    Ok(skim::Fields {
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
    /// The table's rows, encoded (JSON spans) or decoded already (Arrow,
    /// in the table's schema): deletions marked in
    /// [`RecordMeta::deletions`], source times in [`RecordMeta::timestamps`].
    pub rows: Chunk,
    /// The events that cannot be applied (copied out, with their
    /// positions), and why: [`BadRecord::index`] indexes this chunk.
    pub rejected: Chunk,
    pub bad: Vec<BadRecord>,
}

impl Unwrapped {
    /// A chunk handed over as Arrow: its rows are the table's already.
    pub fn decoded(chunk: Chunk) -> Self {
        let rejected = empty(chunk.partition, chunk.position_name);
        Unwrapped {
            rows: chunk,
            rejected,
            bad: Vec::new(),
        }
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

/// Unwraps a chunk of Debezium JSON events (see the module doc).
/// Tombstones are dropped.
pub fn unwrap(chunk: Chunk) -> Unwrapped {
    let Payload::Bytes { data, spans } = &chunk.payload else {
        return Unwrapped::decoded(chunk);
    };
    let tombstone = chunk.meta.deletion_mask(spans.len());
    let mut kept = KeptRows::default();
    let mut rows = Vec::with_capacity(spans.len());
    let mut rejects = Rejects::new(chunk.partition, chunk.position_name);
    for (i, record_span) in spans.iter().enumerate() {
        if tombstone[i] {
            continue;
        }
        let position = chunk.positions.get(i).copied().unwrap_or_default();
        match read_event(&data[record_span.clone()]) {
            Ok((change, time)) => {
                let (range, deletion) = match change {
                    Change::Upsert(r) => (r, false),
                    Change::Delete(r) => (r, true),
                };
                kept.push(
                    deletion,
                    time.or(chunk.meta.timestamps.get(i).copied()),
                    position,
                );
                rows.push(record_span.start + range.start..record_span.start + range.end);
            }
            Err(reason) => rejects.push(&data[record_span.clone()], position, reason),
        }
    }
    let (meta, positions) = kept.finish();
    let Payload::Bytes { data, .. } = chunk.payload else {
        unreachable!("matched above")
    };
    Unwrapped {
        rows: Chunk {
            partition: chunk.partition,
            payload: Payload::Bytes { data, spans: rows },
            positions,
            position_name: chunk.position_name,
            meta,
        },
        rejected: rejects.chunk,
        bad: rejects.bad,
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
        let Unwrapped { rows, bad, .. } = unwrap(input);
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
        let Unwrapped {
            rows,
            rejected,
            bad,
        } = unwrap(input);
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
}
