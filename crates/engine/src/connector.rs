//! The contract between the runtime and connectors (transports).
//!
//! Connectors move bytes; formats (`ubik-format`) turn bytes into Arrow;
//! the engine computes. Exactly-once comes from three promises, written on
//! the traits below and relied on by the checkpoint protocol:
//!
//! 1. a [`Source`] can resume from any position it reported, delivering
//!    exactly the records after it, in the same order per partition;
//! 2. the engine's output after a position is a pure function of those
//!    records (see `operator::Operator`), so a replay re-emits byte-identical
//!    records;
//! 3. a [`Sink`] makes records durable on [`Sink::commit`], and the runtime
//!    writes a checkpoint only after that commit succeeded.
//!
//! A crash between commit and checkpoint replays the uncommitted tail, whose
//! records are byte-identical duplicates that a latest-per-key consumer or a
//! lake MERGE folds away.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

/// A source position, serialised into checkpoints (offsets per partition,
/// a byte offset in a file, a segment and row in a webhook buffer).
pub type SourcePosition = serde_json::Value;

/// Errors of sources and sinks, by what the runtime should do about them.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// Bad configuration or input the user must fix (the message says how).
    #[error("{0}")]
    Config(String),
    /// A transient failure (broker down, disk full): retry with backoff.
    #[error("{0}")]
    Transient(String),
    /// Another instance took over this pipeline's output (Kafka fencing).
    #[error("{0}")]
    Fenced(String),
    /// Anything else; the pipeline stops.
    #[error("{0}")]
    Fatal(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Records of one partition in read order, as raw JSON bytes or as Arrow.
#[derive(Debug)]
pub enum Payload {
    /// JSON records: record `i` is `data[spans[i].clone()]`.
    Json {
        data: Vec<u8>,
        spans: Vec<std::ops::Range<usize>>,
    },
    /// Rows already in Arrow (webhook buffer, in-process Arrow).
    Arrow(RecordBatch),
}

impl Payload {
    pub fn len(&self) -> usize {
        match self {
            Payload::Json { spans, .. } => spans.len(),
            Payload::Arrow(b) => b.num_rows(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// All JSON records as slices (empty for Arrow payloads).
    pub fn records(&self) -> Vec<&[u8]> {
        match self {
            Payload::Json { data, spans } => spans.iter().map(|s| &data[s.clone()]).collect(),
            Payload::Arrow(_) => Vec::new(),
        }
    }
    /// The bytes of JSON record `i`.
    pub fn record(&self, i: usize) -> Option<&[u8]> {
        match self {
            Payload::Json { data, spans } => Some(&data[spans.get(i)?.clone()]),
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

/// One changelog record: key and value bytes (canonical JSON), a tombstone
/// when `value` is `None`, and the record timestamp in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct SinkRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp_ms: Option<i64>,
}

/// A destination for changelog records.
///
/// Fault-tolerance contract:
/// - records written between two [`Sink::commit`] calls form one epoch;
///   `commit` returns only when the epoch is durable (and, for a
///   transactional sink, visible to read_committed readers atomically);
/// - after a crash, records of an uncommitted epoch may be lost or (for a
///   non-transactional sink) visible; the runtime replays them from the last
///   checkpoint, byte-identical, so consumers that keep the latest value per
///   key converge to the same state;
/// - a sink fenced by a newer instance returns [`ConnectorError::Fenced`].
pub trait Sink: Send {
    fn write(&mut self, record: SinkRecord<'_>) -> Result<(), ConnectorError>;
    fn commit(&mut self) -> Result<(), ConnectorError>;
    /// Drops records written since the last commit, if the sink can (a
    /// transactional sink aborts); the runtime then replays them.
    fn abort(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
    /// Flushes and releases resources at a clean shutdown.
    fn close(&mut self) -> Result<(), ConnectorError> {
        self.commit()
    }
    fn describe(&self) -> String;
}

/// A record set aside (undecodable, too late, without event time), with
/// its reason and where it came from: the dead-letter output.
#[derive(Debug)]
pub struct DeadLetter<'a> {
    /// Machine-readable reason: `decode`, `late`, `null_event_time`, `future_event_time`.
    pub reason: &'a str,
    pub message: &'a str,
    pub source: &'a str,
    pub partition: u32,
    /// Position of the record in its partition, and what the number means.
    pub position: Option<(u64, &'a str)>,
    /// The original bytes, when the record arrived as bytes.
    pub record: Option<&'a [u8]>,
}

pub trait DeadLetterSink: Send {
    fn write(&mut self, letter: &DeadLetter<'_>) -> Result<(), ConnectorError>;
    /// Makes written letters durable (called before each checkpoint).
    fn commit(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// Default wait for [`Source::poll`] when the runtime has nothing else to do.
pub const DEFAULT_POLL_TIMEOUT: Duration = Duration::from_millis(100);
