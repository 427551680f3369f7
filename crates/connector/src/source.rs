//! The source side of the contract: what a poll returns, and the replay promise.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::ConnectorError;

/// A source position, serialised into checkpoints (offsets per partition,
/// a byte offset in a file, a segment and row in a webhook buffer).
pub type SourcePosition = serde_json::Value;

/// Records of one partition in read order: encoded bytes (the source's
/// format, e.g. JSON, decodes them) or rows already in Arrow.
#[derive(Debug)]
pub enum Payload {
    /// Encoded records: record `i` is `data[spans[i].clone()]`.
    Bytes {
        data: Vec<u8>,
        spans: Vec<std::ops::Range<usize>>,
    },
    /// Rows already in Arrow (in-process Arrow handed over by a host).
    Arrow(RecordBatch),
}

impl Payload {
    /// Encoded records laid end to end in one buffer.
    pub fn from_records<R: AsRef<[u8]>>(records: impl IntoIterator<Item = R>) -> Self {
        let (mut data, mut spans) = (Vec::new(), Vec::new());
        for r in records {
            let at = data.len();
            data.extend_from_slice(r.as_ref());
            spans.push(at..data.len());
        }
        Payload::Bytes { data, spans }
    }

    pub fn len(&self) -> usize {
        match self {
            Payload::Bytes { spans, .. } => spans.len(),
            Payload::Arrow(b) => b.num_rows(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// All encoded records as slices (empty for Arrow payloads).
    pub fn records(&self) -> Vec<&[u8]> {
        match self {
            Payload::Bytes { data, spans } => spans.iter().map(|s| &data[s.clone()]).collect(),
            Payload::Arrow(_) => Vec::new(),
        }
    }
    /// The bytes of encoded record `i`.
    pub fn record(&self, i: usize) -> Option<&[u8]> {
        match self {
            Payload::Bytes { data, spans } => Some(&data[spans.get(i)?.clone()]),
            Payload::Arrow(_) => None,
        }
    }
}

/// A chunk of records of one partition.
#[derive(Debug)]
pub struct Chunk {
    pub partition: u32,
    pub payload: Payload,
    /// Source position of each record, for error messages and dead letters
    /// (a Kafka offset, a line number).
    pub positions: Vec<u64>,
    /// What a position means, for messages: "offset", "line", "row".
    pub position_name: &'static str,
    /// What the transport says about each record besides its bytes.
    pub meta: RecordMeta,
}

/// Per-record facts a transport carries beside the encoded record.
#[derive(Debug, Default, Clone)]
pub struct RecordMeta {
    /// Each record's timestamp (ms since the epoch) as the transport stamps
    /// it (a Kafka record timestamp); empty when it has none. Columns marked
    /// with [`crate::RECORD_TIMESTAMP_METADATA`] are filled from it.
    pub timestamps: Vec<i64>,
    /// Indexes (ascending) of records that delete their key: a Kafka
    /// tombstone (a keyed record without a value). Such a record's bytes
    /// are its *key*, and its timestamp is when the deletion takes effect.
    pub deletions: Vec<u32>,
}

impl RecordMeta {
    /// Whether each of `records` records is a deletion (`deletions` as a mask).
    pub fn deletion_mask(&self, records: usize) -> Vec<bool> {
        let mut mask = vec![false; records];
        for &d in &self.deletions {
            if let Some(x) = mask.get_mut(d as usize) {
                *x = true;
            }
        }
        mask
    }
}

/// What a poll returned.
#[derive(Debug)]
pub enum SourceEvent {
    Chunk(Chunk),
    /// A bounded partition has no more records.
    PartitionEnd(u32),
    /// Nothing arrived before the timeout.
    Idle,
    /// A bounded source has ended: every partition ended.
    End,
}

/// A source of records.
///
/// Fault-tolerance contract:
/// - [`Source::position`] describes everything returned by `poll` so far;
///   after [`Source::seek`] to such a position, `poll` returns exactly the
///   records after it, per partition in the same order as the first time.
/// - [`Source::commit`] tells the source a checkpoint covering `position`
///   is durable: it may release what came before (truncate a buffer, commit
///   consumer-group offsets for monitoring). It must not be needed for
///   correctness: the checkpoint, not the source, is the source of truth.
/// - A source that cannot replay (stdin) says so in [`Source::replayable`].
pub trait Source: Send {
    /// The SQL table name this source feeds.
    fn table(&self) -> &str;
    /// The schema the source knows, if any (e.g. the demo generator's).
    fn schema(&self) -> Option<SchemaRef> {
        None
    }
    /// Partitions known up front; each holds the watermark until it progresses.
    fn partitions(&self) -> Vec<u32>;
    /// Up to `max_records` records, waiting at most `timeout`.
    fn poll(
        &mut self,
        max_records: usize,
        timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError>;
    fn position(&self) -> SourcePosition;
    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError>;
    fn commit(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let _ = position;
        Ok(())
    }
    fn replayable(&self) -> bool {
        true
    }
    /// Up to `n` records to infer a schema from, without consuming them.
    fn sample(&mut self, n: usize) -> Result<Vec<Vec<u8>>, ConnectorError> {
        let _ = n;
        Ok(Vec::new())
    }
    /// A human description for logs ("kafka://.../orders [4 partitions]").
    fn describe(&self) -> String;
    /// Records available but not yet read (consumer lag), if the source knows.
    fn lag(&mut self) -> Option<u64> {
        None
    }
    /// A clean shutdown begins: stop taking in new records (a webhook
    /// answers 503) and hand out what is already held, then report
    /// [`SourceEvent::Idle`]. Returns false if the source holds nothing of
    /// its own to drain (Kafka: the log keeps it).
    fn begin_drain(&mut self) -> bool {
        false
    }
}

/// Default wait for [`Source::poll`] when the runtime has nothing else to do.
pub const DEFAULT_POLL_TIMEOUT: Duration = Duration::from_millis(100);
