//! The records of a repartition topic, between a group's first stage
//! (stateless: decode, `WHERE`, event time, stamp, route by key) and its
//! second (the stateful query over one target partition).
//!
//! ```text
//! rows:      b'R' | upstream u32 | offset u64 | event time i64 | stamp i64 | the source record's bytes
//! join rows: b'J' | upstream u32 | offset u64 | event time i64 | stamp i64 | leaf u8 | deletion u8 | the source record's bytes
//! progress:  b'W' | upstream u32 | watermark i64  | ended u8
//! ```
//!
//! Big-endian integers. `upstream` is the source partition (its id among
//! the query's sources: the source's index in the high bits, 0 for a
//! query over one source), `offset` the row's position there; `stamp` the
//! source partition's watermark just before the row. A join's rows name
//! the join leaf they feed (a self-join routes a row once per side) and
//! whether they delete a versioned table's key (the record is then the
//! Kafka key). A first stage that crashed after committing rows but
//! before its checkpoint was saved writes them again when it resumes; the
//! second stage drops a row whose offset it has already passed (per
//! upstream and leaf), so every source row is taken in once. A first stage
//! writes a progress record to every target partition at each commit, in
//! the same transaction as its rows, so a target learns how far every
//! source partition got even when none of its rows come its way.

use std::ops::Range;

use crate::error::{Result, RuntimeError};

/// Records to write, each with its target partition, in one flat buffer.
#[derive(Debug, Default)]
pub struct ShuffleBuffer {
    data: Vec<u8>,
    records: Vec<(u32, Range<usize>)>,
}

impl ShuffleBuffer {
    /// A row for `target`: from `upstream` at `at` (offset, event time,
    /// stamp), feeding join leaf `routed.0` (0 without a join), a deletion
    /// if `routed.1`.
    pub fn push_row(
        &mut self,
        target: u32,
        upstream: u32,
        at: (u64, i64, i64),
        routed: (u8, bool),
        record: &[u8],
    ) {
        let (offset, time, stamp) = at;
        let start = self.data.len();
        let plain = routed == (0, false);
        self.data.push(if plain { b'R' } else { b'J' });
        self.data.extend_from_slice(&upstream.to_be_bytes());
        self.data.extend_from_slice(&offset.to_be_bytes());
        self.data.extend_from_slice(&time.to_be_bytes());
        self.data.extend_from_slice(&stamp.to_be_bytes());
        if !plain {
            self.data.push(routed.0);
            self.data.push(routed.1 as u8);
        }
        self.data.extend_from_slice(record);
        self.records.push((target, start..self.data.len()));
    }

    pub fn push_progress(&mut self, target: u32, upstream: u32, watermark: i64, ended: bool) {
        let start = self.data.len();
        self.data.push(b'W');
        self.data.extend_from_slice(&upstream.to_be_bytes());
        self.data.extend_from_slice(&watermark.to_be_bytes());
        self.data.push(ended as u8);
        self.records.push((target, start..self.data.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Each record with its target, in order.
    pub fn records(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.records
            .iter()
            .map(|(t, r)| (*t, &self.data[r.clone()]))
    }

    pub fn clear(&mut self) {
        self.data.clear();
        self.records.clear();
    }
}

/// A repartition record read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShuffleRecord<'a> {
    Row {
        upstream: u32,
        offset: u64,
        time: i64,
        stamp: i64,
        /// The join leaf it feeds (0 without a join).
        leaf: u8,
        /// It deletes a versioned table's key (its record is the key).
        deletion: bool,
        record: &'a [u8],
    },
    Progress {
        upstream: u32,
        watermark: i64,
        ended: bool,
    },
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> i64 {
    i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Parses one record; `at` names it in the error.
pub fn parse<'a>(bytes: &'a [u8], at: &dyn Fn() -> String) -> Result<ShuffleRecord<'a>> {
    let bad = || {
        RuntimeError::BadRecord(format!(
            "{} is not a ubik repartition record; the repartition topic is internal to its group (was it written by something else?)",
            at()
        ))
    };
    match bytes.first() {
        Some(b'R') if bytes.len() >= 29 => Ok(ShuffleRecord::Row {
            upstream: be32(&bytes[1..5]),
            offset: be64(&bytes[5..13]) as u64,
            time: be64(&bytes[13..21]),
            stamp: be64(&bytes[21..29]),
            leaf: 0,
            deletion: false,
            record: &bytes[29..],
        }),
        Some(b'J') if bytes.len() >= 31 && bytes[30] <= 1 => Ok(ShuffleRecord::Row {
            upstream: be32(&bytes[1..5]),
            offset: be64(&bytes[5..13]) as u64,
            time: be64(&bytes[13..21]),
            stamp: be64(&bytes[21..29]),
            leaf: bytes[29],
            deletion: bytes[30] == 1,
            record: &bytes[31..],
        }),
        Some(b'W') if bytes.len() == 14 => Ok(ShuffleRecord::Progress {
            upstream: be32(&bytes[1..5]),
            watermark: be64(&bytes[5..13]),
            ended: bytes[13] != 0,
        }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let mut b = ShuffleBuffer::default();
        b.push_row(3, 7, (11, -5, i64::MIN), (0, false), b"{\"a\":1}");
        b.push_row(1, 1 << 24, (12, 6, 5), (1, true), b"\"k\"");
        b.push_progress(0, 7, 42, true);
        let got: Vec<(u32, ShuffleRecord)> = b
            .records()
            .map(|(t, r)| (t, parse(r, &|| "test".into()).unwrap()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    3,
                    ShuffleRecord::Row {
                        upstream: 7,
                        offset: 11,
                        time: -5,
                        stamp: i64::MIN,
                        leaf: 0,
                        deletion: false,
                        record: b"{\"a\":1}"
                    }
                ),
                (
                    1,
                    ShuffleRecord::Row {
                        upstream: 1 << 24,
                        offset: 12,
                        time: 6,
                        stamp: 5,
                        leaf: 1,
                        deletion: true,
                        record: b"\"k\""
                    }
                ),
                (
                    0,
                    ShuffleRecord::Progress {
                        upstream: 7,
                        watermark: 42,
                        ended: true
                    }
                ),
            ]
        );
        assert!(parse(b"{\"a\":1}", &|| "offset 3".into()).is_err());
    }
}
