//! The runtime's error type.

use ubik_engine::EngineError;
use ubik_engine::connector::ConnectorError;
use ubik_format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Invalid pipeline configuration (flags, pipeline file, URLs).
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    /// A bad input record under `--on-error fail`.
    #[error("{0}")]
    BadRecord(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<arrow::error::ArrowError> for RuntimeError {
    fn from(e: arrow::error::ArrowError) -> Self {
        RuntimeError::Engine(EngineError::Arrow(e))
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
