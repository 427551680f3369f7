//! The sink side's seam: a [`ChangeEncoder`] turns a batch of changes into
//! key and value bytes, one [`SinkRecord`] per row, in the output format a
//! sink's URL names (canonical JSON, Kafka Connect's JSON, Avro).

use ubik_connector::{ChangeBatch, ConnectorError, SinkRecord};

use crate::changelog::ChangelogEncoder;
use crate::error::Result;

/// Encodes changes into records. The bytes must be a function of the rows
/// (and, for Avro, the registered schema ids): a replay after a crash writes
/// the same bytes.
pub trait ChangeEncoder: Send {
    /// Calls `emit` once per row of `batch`, in order. An `emit` error stops
    /// the batch and is handed back (inner result); an encoding error is the
    /// outer one.
    fn encode(
        &mut self,
        batch: &ChangeBatch,
        emit: &mut dyn FnMut(SinkRecord<'_>) -> std::result::Result<(), ConnectorError>,
    ) -> Result<std::result::Result<(), ConnectorError>>;
}

impl ChangeEncoder for ChangelogEncoder {
    fn encode(
        &mut self,
        batch: &ChangeBatch,
        emit: &mut dyn FnMut(SinkRecord<'_>) -> std::result::Result<(), ConnectorError>,
    ) -> Result<std::result::Result<(), ConnectorError>> {
        self.encode_parts(
            &batch.rows,
            batch.deletes.as_ref(),
            &batch.timestamps,
            &mut |r| emit(r),
        )
    }
}
