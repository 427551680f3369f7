//! The dead-letter output: records set aside (undecodable, too late,
//! without event time), each with its reason and where it came from.

use std::io::Write;

use crate::error::Result;

/// One record set aside.
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
    fn write(&mut self, letter: &DeadLetter<'_>) -> Result<()>;
    /// Makes written letters durable (called before each checkpoint).
    fn commit(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Dead letters as JSON lines on stderr (the default destination).
#[derive(Default)]
pub struct StderrDeadLetters;

impl DeadLetterSink for StderrDeadLetters {
    fn write(&mut self, l: &DeadLetter<'_>) -> Result<()> {
        let record = l
            .record
            .map(|r| serde_json::Value::String(String::from_utf8_lossy(r).into_owned()))
            .unwrap_or(serde_json::Value::Null);
        let mut v = serde_json::json!({
            "dead_letter": {
                "reason": l.reason,
                "message": l.message,
                "source": l.source,
                "partition": l.partition,
                "record": record,
            }
        });
        if let Some((pos, name)) = l.position {
            v["dead_letter"][name] = pos.into();
        }
        let mut line = serde_json::to_vec(&v).expect("json");
        line.push(b'\n');
        std::io::stderr().write_all(&line)?;
        Ok(())
    }
}
