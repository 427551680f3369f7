//! The dead-letter output: records set aside (undecodable, too late,
//! without event time), each with its reason and where it came from. The
//! default destination is stderr; Kafka has its own (`ubik-kafka`); a host
//! process takes them from a [`CollectedDeadLetters`] queue.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

use ubik_connector::{ConnectorError, DeadLetter, DeadLetterSink};

/// Dead letters as JSON lines on stderr (the default destination).
#[derive(Default)]
pub struct StderrDeadLetters;

impl DeadLetterSink for StderrDeadLetters {
    fn write(&mut self, l: &DeadLetter<'_>) -> Result<(), ConnectorError> {
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

/// A dead letter that owns its parts, as a host receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedDeadLetter {
    pub reason: String,
    pub message: String,
    /// The source (SQL table) it came from.
    pub source: String,
    pub partition: u32,
    /// Position in the partition, and what the number counts (`offset`, `line`, ...).
    pub position: Option<(u64, String)>,
    /// The original bytes, when the record arrived as bytes.
    pub record: Option<Vec<u8>>,
}

/// Dead letters queued for a host to take ([`Self::take`]) between the
/// steps it drives; a clone shares the queue. Letters are written while the
/// pipeline steps, so the queue holds at most one step's worth when the
/// host takes them after each call.
#[derive(Default, Clone)]
pub struct CollectedDeadLetters {
    queue: Arc<Mutex<VecDeque<OwnedDeadLetter>>>,
}

impl CollectedDeadLetters {
    /// Every letter written since the last call, oldest first.
    pub fn take(&self) -> Vec<OwnedDeadLetter> {
        self.queue
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// Returns letters a host could not take, to be taken first next time.
    pub fn put_back(&self, letters: Vec<OwnedDeadLetter>) {
        if let Ok(mut q) = self.queue.lock() {
            for l in letters.into_iter().rev() {
                q.push_front(l);
            }
        }
    }
}

impl DeadLetterSink for CollectedDeadLetters {
    fn write(&mut self, l: &DeadLetter<'_>) -> Result<(), ConnectorError> {
        let letter = OwnedDeadLetter {
            reason: l.reason.to_string(),
            message: l.message.to_string(),
            source: l.source.to_string(),
            partition: l.partition,
            position: l.position.map(|(p, name)| (p, name.to_string())),
            record: l.record.map(<[u8]>::to_vec),
        };
        self.queue
            .lock()
            .map_err(|_| ConnectorError::Fatal("dead-letter queue lock poisoned".into()))?
            .push_back(letter);
        Ok(())
    }
}
