//! Errors of the Kafka connector.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use ubik_connector::ConnectorError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kafka:// URL or property the user must fix.
    #[error("{0}")]
    Config(String),
    /// The topic does not exist (and could not be created).
    #[error("{0}")]
    Topic(String),
    /// Another producer with the same transactional.id took over.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The broker is unreachable or an operation timed out: retry.
    #[error("{0}")]
    Transient(String),
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A local file to replicate could not be read.
    #[error("{0}")]
    Io(String),
}

/// Whether a librdkafka error means this producer was fenced.
pub fn is_fenced(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::Transaction(t) => Some(t.code()),
        KafkaError::MessageProduction(c) | KafkaError::Flush(c) | KafkaError::Global(c) => Some(*c),
        _ => None,
    };
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

impl From<Error> for ConnectorError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(m) | Error::Topic(m) => ConnectorError::Config(m),
            Error::Fenced(m) => ConnectorError::Fenced(m),
            Error::Transient(m) => ConnectorError::Transient(m),
            Error::Kafka(k) if is_fenced(&k) => ConnectorError::Fenced(k.to_string()),
            Error::Kafka(k) => ConnectorError::Fatal(format!("kafka: {k}")),
            Error::Io(m) => ConnectorError::Fatal(m),
        }
    }
}
