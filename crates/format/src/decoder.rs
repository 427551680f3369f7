//! The format layer's seam: a source's records arrive as bytes, and the
//! [`Format`] named in its spec picks the [`RecordDecoder`] that turns them
//! into Arrow rows of the source's schema. Transports never decode; formats
//! never do I/O.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::error::{FormatError, Result};
use crate::json::JsonDecoder;

/// A record that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Index of the record in the slice given to [`RecordDecoder::decode`].
    pub index: usize,
    /// The field at fault (dotted for nested fields), when known.
    pub field: Option<String>,
    /// Why, without the field.
    pub reason: String,
}

impl BadRecord {
    /// `field 'x': reason`, or the reason alone.
    pub fn message(&self) -> String {
        match &self.field {
            Some(f) => format!("field '{f}': {}", self.reason),
            None => self.reason.clone(),
        }
    }
}

/// The result of decoding a chunk of records.
#[derive(Debug)]
pub struct Decoded {
    /// One row per good record, in order, in the target schema.
    pub batch: RecordBatch,
    /// Record index of each row; empty when every record was good (row i is record i).
    pub records: Vec<u32>,
    pub bad: Vec<BadRecord>,
}

impl Decoded {
    /// The record index of row `row`.
    pub fn record_of(&self, row: usize) -> usize {
        if self.records.is_empty() {
            row
        } else {
            self.records[row] as usize
        }
    }
}

/// Decodes encoded records into rows of one schema. A bad record is
/// reported in [`Decoded::bad`] with its index; the good ones are kept.
pub trait RecordDecoder: Send {
    fn schema(&self) -> &SchemaRef;
    fn decode(&mut self, records: &[&[u8]]) -> Result<Decoded>;
    /// Decodes only the columns `reads` marks true (one flag per column of
    /// [`schema`](Self::schema)): the query reads no other. The others are
    /// null in the batches decoded from then on (a column that cannot be
    /// null is decoded all the same), and their values are checked for
    /// syntax only: a record is bad for what the query reads, not for a value
    /// of the wrong type in a column it never looks at.
    fn read_only(&mut self, reads: &[bool]) -> Result<()>;
}

/// The encoding of a source's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// One JSON object per record (an NDJSON line, a Kafka message, a webhook event).
    #[default]
    Json,
}

impl Format {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "json" => Ok(Format::Json),
            other => Err(FormatError::Schema(format!(
                "unknown format {other:?}; supported: json"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
        }
    }

    /// A decoder for `schema` using up to `threads` threads.
    pub fn decoder(self, schema: SchemaRef, threads: usize) -> Result<Box<dyn RecordDecoder>> {
        Ok(match self {
            Format::Json => Box::new(JsonDecoder::with_threads(schema, threads)?),
        })
    }

    /// A schema inferred from sample records.
    pub fn infer_schema(self, sample: &[&[u8]]) -> Result<SchemaRef> {
        match self {
            Format::Json => crate::schema::infer_schema(sample),
        }
    }
}
