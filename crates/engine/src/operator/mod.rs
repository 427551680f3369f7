//! Streaming operators: each takes stamped input batches, reacts to the
//! global watermark, and snapshots its state for checkpoints.

pub mod changelog;
pub mod continuous;
pub mod emit;
pub mod eval;
pub mod join;
mod join_log;
pub mod join_node;
mod join_rows;
mod join_versions;
pub mod over;
pub mod rank;
pub mod regroup;
pub mod rollup;
pub mod session;
mod session_log;
pub mod time_queue;

pub mod window;

use arrow::array::RecordBatch;

use crate::error::Result;

pub use ubik_connector::ChangeBatch;

/// Why an input row was set aside instead of being aggregated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// The row's window closed longer ago than the retention bound.
    TooLate { window_end: i64, watermark: i64 },
    /// The event-time column is null.
    NullEventTime,
    /// The event time is further ahead of the wall clock than allowed.
    FutureEventTime { event_time: i64, limit: i64 },
    /// A join row further behind its partition's watermark than the join's
    /// retention: the join no longer holds the rows it would pair with.
    LateForJoin {
        event_time: i64,
        watermark: i64,
        retention: i64,
    },
    /// A version of a temporal join's table behind its partition's
    /// watermark: the pairs it would change are emitted (append-only), so
    /// it cannot revise them.
    LateVersion { event_time: i64, watermark: i64 },
    /// A deletion (a Kafka tombstone) of a key of a table that is not the
    /// versioned side of a temporal join, the only place deletions apply.
    UnappliedDeletion,
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ts = |t: i64| {
            let mut b = Vec::new();
            crate::time::write_rfc3339_micros(&mut b, t);
            String::from_utf8(b).unwrap_or_default()
        };
        match self {
            RejectReason::TooLate {
                window_end,
                watermark,
            } => write!(
                f,
                "late row: its window ended at {} and the watermark ({}) is past the end plus the retention bound",
                ts(*window_end),
                ts(*watermark)
            ),
            RejectReason::NullEventTime => write!(f, "the event-time column is null"),
            RejectReason::LateForJoin {
                event_time,
                watermark,
                retention: 0,
            } => write!(
                f,
                "late row: its event time {} is before its partition's watermark ({}), and the join has emitted its pairs up to there; raise --lateness to wait longer for out-of-order rows, or set --join-retention to pair late rows afterwards",
                ts(*event_time),
                ts(*watermark)
            ),
            RejectReason::LateForJoin {
                event_time,
                watermark,
                retention,
            } => write!(
                f,
                "late row: its event time {} is more than the join retention ({}s) before its partition's watermark ({}), and the join no longer holds the rows it would pair with; raise --join-retention to keep them longer",
                ts(*event_time),
                *retention as f64 / 1e6,
                ts(*watermark)
            ),
            RejectReason::LateVersion {
                event_time,
                watermark,
            } => write!(
                f,
                "late version: its event time {} is before its partition's watermark ({}), and the temporal join has emitted the rows it would pair with (its output is append-only, so they cannot be revised); raise --lateness to wait longer for out-of-order versions",
                ts(*event_time),
                ts(*watermark)
            ),
            RejectReason::UnappliedDeletion => write!(
                f,
                "a deletion (a tombstone) of a key, but this query does not read the table as the versioned side of a temporal join, the only place ubik applies deletions; declare the table's PRIMARY KEY and join it FOR SYSTEM_TIME AS OF, or filter tombstones out upstream"
            ),
            RejectReason::FutureEventTime { event_time, limit } => {
                write!(
                    f,
                    "event time {} is too far in the future (limit {}); raise --max-future if the clock is right",
                    ts(*event_time),
                    ts(*limit)
                )?;
                // Past year 10 000: a number of a finer unit read as milliseconds.
                if *event_time >= YEAR_10000_MICROS {
                    f.write_str(", or, if the records hold epoch microseconds or nanoseconds (Debezium's default for TIMESTAMP columns), add timestamp_unit=us (or ns) to the source URL")?;
                }
                Ok(())
            }
        }
    }
}

/// 10000-01-01T00:00:00Z in microseconds since the epoch.
const YEAR_10000_MICROS: i64 = 253_402_300_800_000_000;

impl RejectReason {
    /// A short machine-readable code (dead-letter headers, metrics labels).
    pub fn code(&self) -> &'static str {
        match self {
            RejectReason::TooLate { .. }
            | RejectReason::LateForJoin { .. }
            | RejectReason::LateVersion { .. } => "late",
            RejectReason::NullEventTime => "null_event_time",
            RejectReason::FutureEventTime { .. } => "future_event_time",
            RejectReason::UnappliedDeletion => "deletion",
        }
    }
}

/// A rejected input row: `row` indexes the batch given to `Query::process`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub partition: u32,
    pub row: usize,
    pub reason: RejectReason,
}

/// What processing produced: result changes in emission order, and rejects.
#[derive(Debug, Default)]
pub struct Output {
    pub changes: Vec<ChangeBatch>,
    pub rejects: Vec<Reject>,
    /// Rows routed by a first stage ([`crate::Query::set_shuffle`]).
    pub shuffled: Vec<crate::shuffle::Shuffled>,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.rejects.is_empty() && self.shuffled.is_empty()
    }
    pub fn clear(&mut self) {
        self.changes.clear();
        self.rejects.clear();
        self.shuffled.clear();
    }
    pub fn num_changes(&self) -> usize {
        self.changes.iter().map(|c| c.num_rows()).sum()
    }
}

/// Input rows of one source partition, after `WHERE` and event-time checks.
pub struct StampedBatch {
    pub partition: u32,
    /// Source-schema rows.
    pub batch: RecordBatch,
    /// Each row's event time (µs), or its ordinal when the query has none.
    pub times: Vec<i64>,
    /// Each row's stamp: its partition's watermark just before the row. A
    /// row is judged late against its own partition's progress, so whether
    /// it is late never depends on how partitions interleave.
    pub stamps: Vec<i64>,
    /// Index of each row in the batch given to `Query::process`.
    pub origin: Vec<u32>,
}

/// One operator's state, as Arrow batches plus a small JSON document.
#[derive(Debug, Default)]
pub struct OperatorSnapshot {
    /// State tables, by their typed name.
    pub batches: Vec<(crate::state::StateEntry, RecordBatch)>,
    pub meta: serde_json::Value,
}

impl OperatorSnapshot {
    /// State tables without operator metadata.
    pub fn new(batches: Vec<(crate::state::StateEntry, RecordBatch)>) -> Self {
        Self {
            batches,
            meta: serde_json::Value::Null,
        }
    }
}

/// The streaming operator interface.
///
/// Contract: the records an operator emits, and their order, are a pure
/// function of each partition's sequence of (stamped) rows; batch boundaries,
/// how partitions interleave, and snapshot/restore points never change them.
pub trait Operator: Send {
    /// Folds a batch in. Emits only rejects; results wait for the watermark.
    fn process_batch(&mut self, input: StampedBatch, out: &mut Output) -> Result<()>;
    /// Takes in a changelog source's changes, in order: each row is an
    /// upsert, or where `deleted` says so a deletion of its key (a row
    /// holding at least the key). Only operators planned over a changelog
    /// take them.
    fn process_changes(
        &mut self,
        _input: StampedBatch,
        _deleted: &[bool],
        _out: &mut Output,
    ) -> Result<()> {
        Err(crate::error::EngineError::internal(
            "deletions for an operator that does not read a changelog",
        ))
    }
    /// The global watermark advanced to `watermark`: emit what it closes, in order.
    fn handle_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()>;
    /// The operator's state for a checkpoint (taken between batches).
    /// State with a durable store behind it is written there (what
    /// changed since the last checkpoint) and not returned.
    fn handle_checkpoint(&mut self) -> Result<OperatorSnapshot>;
    /// Restores a fresh operator from [`Self::handle_checkpoint`]'s output,
    /// after the query's store was restored to the same checkpoint.
    fn restore(&mut self, snapshot: OperatorSnapshot) -> Result<()>;
    /// Approximate bytes of state held in memory.
    fn state_size(&self) -> usize;
    /// Moves cold state to the query's store until about `target` bytes
    /// are held in memory. Called only between batches, after the
    /// watermark was handled. Operators whose state has no store behind it
    /// move nothing.
    fn spill(&mut self, _target: usize) -> Result<crate::state::keyed::Evicted> {
        Ok(Default::default())
    }
    /// Number of keyed states (groups) held.
    fn state_keys(&self) -> usize;
}
