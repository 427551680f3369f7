//! In-process Arrow as a source: any `RecordBatchReader` (from Python, a
//! pyarrow Table, a RecordBatchReader, an iterator of batches). Bounded,
//! one partition; the position is the number of rows read, so a resume
//! over the same data skips what a checkpoint covers.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatchReader;
use serde_json::json;
use ubik_connector::{Chunk, ConnectorError, Payload, Source, SourceEvent, SourcePosition};

pub struct ArrowSource {
    table: String,
    reader: Box<dyn RecordBatchReader + Send>,
    schema: SchemaRef,
    /// Position: rows handed out, or the target of the last seek.
    rows: u64,
    /// Rows taken from the reader (handed out or skipped).
    pulled: u64,
    /// Rows still to skip after a seek.
    skip: u64,
    /// The rest of a batch larger than one poll's worth.
    held: Option<RecordBatch>,
    ended: bool,
    end_reported: bool,
}

impl ArrowSource {
    pub fn new(table: &str, reader: Box<dyn RecordBatchReader + Send>) -> Self {
        let schema = reader.schema();
        Self {
            table: table.to_string(),
            reader,
            schema,
            rows: 0,
            pulled: 0,
            skip: 0,
            held: None,
            ended: false,
            end_reported: false,
        }
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, ConnectorError> {
        loop {
            let Some(b) = self.reader.next() else {
                return Ok(None);
            };
            let b = b.map_err(|e| {
                ConnectorError::Fatal(format!("reading the input Arrow stream: {e}"))
            })?;
            self.pulled += b.num_rows() as u64;
            if self.skip >= b.num_rows() as u64 {
                self.skip -= b.num_rows() as u64;
                continue;
            }
            let b = b.slice(self.skip as usize, b.num_rows() - self.skip as usize);
            self.skip = 0;
            if b.num_rows() > 0 {
                return Ok(Some(b));
            }
        }
    }
}

impl Source for ArrowSource {
    fn table(&self) -> &str {
        &self.table
    }

    fn schema(&self) -> Option<SchemaRef> {
        Some(self.schema.clone())
    }

    fn partitions(&self) -> Vec<u32> {
        vec![0]
    }

    fn poll(
        &mut self,
        max_records: usize,
        _timeout: Duration,
    ) -> Result<SourceEvent, ConnectorError> {
        if self.ended {
            if self.end_reported {
                return Ok(SourceEvent::End);
            }
            self.end_reported = true;
            return Ok(SourceEvent::PartitionEnd(0));
        }
        let next = match self.held.take() {
            Some(b) => Some(b),
            None => self.next_batch()?,
        };
        match next {
            Some(mut b) => {
                // Big batches (a whole pyarrow Table can be one) go in pieces
                // of at most `max_records` rows: bounded memory per step.
                let max = max_records.max(1);
                if b.num_rows() > max {
                    self.held = Some(b.slice(max, b.num_rows() - max));
                    b = b.slice(0, max);
                }
                let first = self.rows;
                self.rows += b.num_rows() as u64;
                Ok(SourceEvent::Chunk(Chunk {
                    partition: 0,
                    positions: (first..self.rows).collect(),
                    payload: Payload::Arrow(b),
                    position_name: "row",
                    meta: Default::default(),
                }))
            }
            None => {
                self.ended = true;
                self.poll(max_records, _timeout)
            }
        }
    }

    fn position(&self) -> SourcePosition {
        json!({ "rows": self.rows })
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), ConnectorError> {
        let target = position["rows"].as_u64().unwrap_or(0);
        // Seeks are absolute; several may come before the first read (the
        // latest checkpoint, then a host's older token).
        let held = self.held.as_ref().map_or(0, |b| b.num_rows() as u64);
        let available_from = self.pulled - held;
        if target < available_from {
            return Err(ConnectorError::Config(
                "an in-process Arrow input cannot go back; pass the data again to resume".into(),
            ));
        }
        let into_held = target - available_from;
        match self.held.take() {
            Some(b) if into_held < held => {
                self.held = Some(b.slice(into_held as usize, (held - into_held) as usize));
                self.skip = 0;
            }
            _ => self.skip = target - self.pulled,
        }
        self.rows = target;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("in-process Arrow ({})", self.table)
    }
}
