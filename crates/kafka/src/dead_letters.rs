//! Dead letters to a Kafka topic: the original record bytes as the value,
//! and headers naming the reason and where it came from.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::BaseRecord;
use ubik_connector::{ConnectorError, DeadLetter, DeadLetterSink};

use crate::admin::ensure_topic;
use crate::config::{EmitMode, KafkaUrl};
use crate::error::Error;
use crate::sink::{DeliveryErrors, UbikProducer, flush, headers, producer, send};

/// Writes with an idempotent producer and flushes before every checkpoint:
/// after a crash a dead letter may be written twice, never lost.
pub struct KafkaDeadLetters {
    url: KafkaUrl,
    producer: UbikProducer,
    errors: DeliveryErrors,
}

impl KafkaDeadLetters {
    pub fn open(url: &str, properties: &BTreeMap<String, String>) -> Result<Self, Error> {
        let url = KafkaUrl::parse(url)?;
        ensure_topic(&url, &url.client_config(properties), "delete")?;
        let (producer, errors) = producer(&url, properties, EmitMode::Idempotent, None)?;
        Ok(Self {
            url,
            producer,
            errors,
        })
    }
}

impl DeadLetterSink for KafkaDeadLetters {
    fn write(&mut self, l: &DeadLetter<'_>) -> Result<(), ConnectorError> {
        let partition = l.partition.to_string();
        let position = l.position.map(|(p, _)| p.to_string()).unwrap_or_default();
        let kind = l.position.map(|(_, k)| k).unwrap_or("");
        let h = headers(&[
            ("ubik.reason", l.reason),
            ("ubik.message", l.message),
            ("ubik.source", l.source),
            ("ubik.partition", &partition),
            ("ubik.position", &position),
            ("ubik.position_kind", kind),
        ]);
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.url.topic).headers(h);
        if let Some(bytes) = l.record {
            r = r.payload(bytes);
        }
        send(&self.producer, r).map_err(ConnectorError::from)
    }

    fn commit(&mut self) -> Result<(), ConnectorError> {
        flush(&self.producer, Duration::from_secs(60))
            .map_err(|e| ConnectorError::Transient(format!("flushing dead letters: {e}")))?;
        match self.errors.take_error() {
            Some(e) => Err(ConnectorError::Transient(format!(
                "a dead letter could not be delivered: {e}"
            ))),
            None => Ok(()),
        }
    }
}
