//! Event-time progress: per-partition watermarks and their minimum.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::{MAX_TIME, MIN_TIME};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionProgress {
    /// Max event time seen (or the last ordinal), `MIN_TIME` before any row.
    pub max_time: i64,
    /// Watermark pushed by the source (idle close), `MIN_TIME` if none.
    pub pushed: i64,
    /// The partition has ended (bounded input): its watermark is `MAX_TIME`.
    pub ended: bool,
    /// Rows seen (the ordinal clock of queries without event time).
    pub rows: u64,
}

impl Default for PartitionProgress {
    fn default() -> Self {
        Self {
            max_time: MIN_TIME,
            pushed: MIN_TIME,
            ended: false,
            rows: 0,
        }
    }
}

impl PartitionProgress {
    pub fn watermark(&self, lateness: i64) -> i64 {
        if self.ended {
            return MAX_TIME;
        }
        let from_data = if self.max_time == MIN_TIME {
            MIN_TIME
        } else {
            self.max_time.saturating_sub(lateness)
        };
        from_data.max(self.pushed)
    }
}

/// Bits of a partition id that number the partition within its source; the
/// bits above number the source. Source 0's ids are its partition numbers,
/// so a one-source pipeline's ids (and checkpoints) are the partitions.
pub const PARTITION_BITS: u32 = 24;

/// The id of partition `partition` of source `source` (its index among the
/// plan's sources), as the engine and checkpoints know it.
pub fn partition_id(source: usize, partition: u32) -> u32 {
    ((source as u32) << PARTITION_BITS) | (partition & ((1 << PARTITION_BITS) - 1))
}

/// The source index of a partition id.
pub fn source_of(id: u32) -> usize {
    (id >> PARTITION_BITS) as usize
}

/// Watermark state of every source partition of a query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub lateness: i64,
    pub partitions: BTreeMap<u32, PartitionProgress>,
}

impl Progress {
    pub fn new(lateness: i64) -> Self {
        Self {
            lateness,
            partitions: BTreeMap::new(),
        }
    }

    pub fn partition(&mut self, p: u32) -> &mut PartitionProgress {
        self.partitions.entry(p).or_default()
    }

    /// The global watermark: the minimum over partitions (`MIN_TIME` if none).
    pub fn global(&self) -> i64 {
        self.partitions
            .values()
            .map(|p| p.watermark(self.lateness))
            .min()
            .unwrap_or(MIN_TIME)
    }
}
