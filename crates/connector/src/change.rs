//! What the engine emits and sinks and hosts receive: a batch of changes.

use arrow::array::{BooleanArray, Int64Array, RecordBatch};

/// A batch of result rows: upserts, or tombstones where `deletes` is true.
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    /// Rows in the query's output schema. For a tombstone only the key columns matter.
    pub rows: RecordBatch,
    /// `true` marks a retraction of the row's key. `None`: all upserts/appends.
    pub deletes: Option<BooleanArray>,
    /// Record timestamps (µs since epoch): the window end for windowed
    /// queries, the max event time folded in for continuous ones, the row's
    /// event time for pass-through queries. Null where there is none.
    pub timestamps: Int64Array,
}

impl ChangeBatch {
    pub fn num_rows(&self) -> usize {
        self.rows.num_rows()
    }
    pub fn is_delete(&self, i: usize) -> bool {
        self.deletes.as_ref().is_some_and(|d| d.value(i))
    }
}
