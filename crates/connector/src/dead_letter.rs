//! The dead-letter output: records set aside, with why and where from.

use crate::ConnectorError;

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
