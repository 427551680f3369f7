//! An in-memory [`Source`] and [`Sink`] for runtime tests. The connector
//! traits are imported here only, so if they move, this file is the one to
//! change.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use serde_json::json;
pub use ubik_connector::{
    Chunk, ConnectorError, Payload, Sink, SinkRecord, Source, SourceEvent, SourcePosition,
};

use crate::changelog::{State, fold};

/// A bounded, replayable source of JSON records in partitions. Each poll
/// returns up to `max_records` records of one partition, taking the
/// partitions in turn; an exhausted partition reports
/// [`SourceEvent::PartitionEnd`] once, and when all have, the source
/// reports [`SourceEvent::End`]. Its position is the next record of each
/// partition, so a seek replays exactly what came after.
#[derive(Debug, Clone)]
pub struct FakeSource {
    table: String,
    schema: Option<SchemaRef>,
    partitions: Vec<Vec<Vec<u8>>>,
    /// Records per poll at most, whatever the caller asks (0: no limit).
    chunk_limit: usize,
    next: Vec<usize>,
    ended: Vec<bool>,
    turn: usize,
    polls: usize,
}

impl FakeSource {
    /// One partition per element of `partitions`, records in order.
    pub fn new(table: &str, partitions: Vec<Vec<String>>) -> Self {
        let n = partitions.len();
        Self {
            table: table.to_string(),
            schema: None,
            partitions: partitions
                .into_iter()
                .map(|p| p.into_iter().map(String::into_bytes).collect())
                .collect(),
            chunk_limit: 0,
            next: vec![0; n],
            ended: vec![false; n],
            turn: 0,
            polls: 0,
        }
    }

    /// `lines` dealt round-robin into `partitions` partitions, each keeping
    /// the lines' order.
    pub fn dealt(table: &str, lines: &[String], partitions: usize) -> Self {
        let n = partitions.max(1);
        let mut parts = vec![Vec::new(); n];
        for (i, l) in lines.iter().enumerate() {
            parts[i % n].push(l.clone());
        }
        Self::new(table, parts)
    }

    /// Reports `schema` as the source's own (else the pipeline needs a declared one).
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Returns at most `n` records per poll.
    pub fn with_chunk_limit(mut self, n: usize) -> Self {
        self.chunk_limit = n;
        self
    }

    /// Polls so far (including ones that returned no records).
    pub fn polls(&self) -> usize {
        self.polls
    }
}

impl Source for FakeSource {
    fn table(&self) -> &str {
        &self.table
    }

    fn schema(&self) -> Option<SchemaRef> {
        self.schema.clone()
    }

    fn partitions(&self) -> Vec<u32> {
        (0..self.partitions.len() as u32).collect()
    }

    fn poll(
        &mut self,
        max_records: usize,
        _timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        self.polls += 1;
        let n = self.partitions.len();
        for step in 0..n {
            let p = (self.turn + step) % n;
            if self.ended[p] {
                continue;
            }
            self.turn = (p + 1) % n;
            let records = &self.partitions[p];
            let from = self.next[p];
            if from == records.len() {
                self.ended[p] = true;
                return Ok(SourceEvent::PartitionEnd(p as u32));
            }
            let mut take = max_records.max(1);
            if self.chunk_limit > 0 {
                take = take.min(self.chunk_limit);
            }
            let to = (from + take).min(records.len());
            self.next[p] = to;
            return Ok(SourceEvent::Chunk(Chunk {
                partition: p as u32,
                payload: Payload::from_records(&records[from..to]),
                positions: (from as u64..to as u64).collect(),
                position_name: "record",
                meta: Default::default(),
            }));
        }
        Ok(SourceEvent::End)
    }

    fn position(&self) -> SourcePosition {
        json!({ "next": self.next, "ended": self.ended, "turn": self.turn })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let bad = || ConnectorError::Fatal(format!("not a fake source position: {position}"));
        let next: Vec<usize> =
            serde_json::from_value(position["next"].clone()).map_err(|_| bad())?;
        let ended: Vec<bool> =
            serde_json::from_value(position["ended"].clone()).map_err(|_| bad())?;
        if next.len() != self.partitions.len() || ended.len() != next.len() {
            return Err(bad());
        }
        self.next = next;
        self.ended = ended;
        self.turn = position["turn"].as_u64().ok_or_else(bad)? as usize;
        Ok(())
    }

    fn sample(&mut self, n: usize) -> Result<Vec<Vec<u8>>, ConnectorError> {
        Ok(self.partitions.iter().flatten().take(n).cloned().collect())
    }

    fn describe(&self) -> String {
        format!(
            "fake://{} [{} partitions]",
            self.table,
            self.partitions.len()
        )
    }
}

/// One changelog record as a sink received it, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Written {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |b: &Option<Vec<u8>>| {
            b.as_deref().map_or("null".to_string(), |b| {
                String::from_utf8_lossy(b).into_owned()
            })
        };
        write!(
            f,
            "{} => {} @{:?}",
            text(&self.key),
            text(&self.value),
            self.timestamp_ms
        )
    }
}

/// What a [`FakeSink`] holds; shared with the test through [`FakeSink::log`].
#[derive(Debug, Default)]
pub struct SinkLog {
    /// Records of committed epochs, in order.
    pub committed: Vec<Written>,
    /// Records written since the last commit.
    pub pending: Vec<Written>,
    /// Every record ever written, in order (committed, aborted or pending).
    pub written: Vec<Written>,
    /// Commit calls, successful or not.
    pub commits: usize,
    /// Abort calls.
    pub aborts: usize,
    /// Commit calls (1-based) that fail with [`ConnectorError::Transient`].
    pub fail_commits: VecDeque<usize>,
    /// Commit calls (1-based) that fail with [`ConnectorError::Fatal`] (a crash).
    pub crash_commits: VecDeque<usize>,
}

/// A transactional in-memory sink: an epoch's records become visible
/// (`committed`) on commit; abort drops them. Commits can be told to fail.
#[derive(Debug, Clone, Default)]
pub struct FakeSink {
    log: Arc<Mutex<SinkLog>>,
}

impl FakeSink {
    pub fn new() -> Self {
        Self::default()
    }

    /// Commit call `n` (1-based) fails as transient: the epoch is lost and
    /// must be replayed (after an abort).
    pub fn fail_commit(self, n: usize) -> Self {
        self.log().fail_commits.push_back(n);
        self
    }

    /// Commit call `n` (1-based) fails as fatal, as if the process died
    /// before the epoch was durable: the run stops.
    pub fn crash_at_commit(self, n: usize) -> Self {
        self.log().crash_commits.push_back(n);
        self
    }

    /// The records and counters (a handle shared by clones of this sink).
    pub fn log(&self) -> MutexGuard<'_, SinkLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn committed(&self) -> Vec<Written> {
        self.log().committed.clone()
    }

    /// The latest-per-key fold of the committed records.
    pub fn fold_committed(&self) -> State {
        fold_written(&self.log().committed)
    }
}

/// The latest-per-key fold of written records (a record without a key
/// folds under the empty key).
pub fn fold_written(records: &[Written]) -> State {
    fold(
        records
            .iter()
            .map(|r| (r.key.as_deref().unwrap_or_default(), r.value.as_deref())),
    )
}

impl Sink for FakeSink {
    fn write(&mut self, record: SinkRecord<'_>) -> Result<(), ConnectorError> {
        let w = Written {
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
            timestamp_ms: record.timestamp_ms,
        };
        let mut log = self.log();
        log.written.push(w.clone());
        log.pending.push(w);
        Ok(())
    }

    fn commit(&mut self) -> Result<(), ConnectorError> {
        let mut log = self.log();
        log.commits += 1;
        let n = log.commits;
        if log.crash_commits.front() == Some(&n) {
            log.crash_commits.pop_front();
            return Err(ConnectorError::Fatal(format!("fake crash at commit {n}")));
        }
        if log.fail_commits.front() == Some(&n) {
            log.fail_commits.pop_front();
            return Err(ConnectorError::Transient(format!(
                "fake transient failure at commit {n}"
            )));
        }
        let pending = std::mem::take(&mut log.pending);
        log.committed.extend(pending);
        Ok(())
    }

    fn abort(&mut self) -> Result<(), ConnectorError> {
        let mut log = self.log();
        log.aborts += 1;
        log.pending.clear();
        Ok(())
    }

    fn describe(&self) -> String {
        "fake sink".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut FakeSource) -> Vec<(u32, Vec<u64>)> {
        let mut out = Vec::new();
        loop {
            match s.poll(3, Duration::ZERO).unwrap() {
                SourceEvent::Chunk(c) => out.push((c.partition, c.positions)),
                SourceEvent::PartitionEnd(p) => out.push((p, Vec::new())),
                SourceEvent::End => return out,
                SourceEvent::Idle => unreachable!(),
            }
        }
    }

    #[test]
    fn source_replays_exactly_after_a_position() {
        let lines: Vec<String> = (0..10).map(|i| format!("{{\"i\":{i}}}")).collect();
        let mut s = FakeSource::dealt("t", &lines, 2);
        let first = s.poll(3, Duration::ZERO).unwrap();
        assert!(matches!(first, SourceEvent::Chunk(ref c) if c.payload.len() == 3));
        let at = s.position();
        let rest = drain(&mut s);
        assert!(matches!(
            s.poll(3, Duration::ZERO).unwrap(),
            SourceEvent::End
        ));
        s.seek(&at).unwrap();
        assert_eq!(drain(&mut s), rest);
        let records: usize = rest.iter().map(|(_, p)| p.len()).sum();
        assert_eq!(records, 7);
    }

    #[test]
    fn sink_commits_aborts_and_fails_as_told() {
        let mut sink = FakeSink::new().fail_commit(2);
        let rec = |k: &'static [u8]| SinkRecord {
            key: Some(k),
            value: Some(b"1"),
            timestamp_ms: None,
            partition: None,
        };
        sink.write(rec(b"a")).unwrap();
        sink.commit().unwrap();
        sink.write(rec(b"b")).unwrap();
        assert!(matches!(sink.commit(), Err(ConnectorError::Transient(_))));
        sink.abort().unwrap();
        sink.write(rec(b"c")).unwrap();
        sink.commit().unwrap();
        let log = sink.log();
        let keys: Vec<&[u8]> = log
            .committed
            .iter()
            .map(|w| w.key.as_deref().unwrap())
            .collect();
        assert_eq!(keys, [&b"a"[..], &b"c"[..]]);
        assert_eq!((log.commits, log.aborts, log.written.len()), (3, 1, 3));
    }
}
