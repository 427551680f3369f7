//! The sink side of the contract: epochs of records made durable on commit.

use crate::ConnectorError;

/// One changelog record: key and value bytes (canonical JSON), a tombstone
/// when `value` is `None`, and the record timestamp in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct SinkRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp_ms: Option<i64>,
    /// The partition to write to, when the writer routes records itself
    /// (a repartition step); `None`: by the key.
    pub partition: Option<u32>,
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
