//! The dead-letter output: records set aside (undecodable, too late,
//! without event time), each with its reason and where it came from. The
//! default destination is stderr; Kafka has its own (`ubik-kafka`).

use std::io::Write;

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
