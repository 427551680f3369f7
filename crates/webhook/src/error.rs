//! Errors of the webhook source.

use ubik_connector::ConnectorError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A webhook:// URL or option the user must fix.
    #[error("{0}")]
    Config(String),
    /// The buffer directory cannot be written or read.
    #[error("webhook buffer: {0}")]
    Buffer(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
}

impl From<Error> for ConnectorError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(m) => ConnectorError::Config(m),
            Error::Io(e) => ConnectorError::Io(e),
            other => ConnectorError::Fatal(other.to_string()),
        }
    }
}
