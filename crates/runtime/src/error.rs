//! The runtime's error type.

use ubik_connector::ConnectorError;
use ubik_engine::EngineError;
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

/// What an error means to whoever must act on it: the CLI's exit code and
/// the Python exception type both come from this one classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The SQL does not parse or plan.
    Sql,
    /// Valid SQL that cannot run as a stream.
    Unsupported,
    /// A schema is malformed or does not fit the input.
    Schema,
    /// A setting, URL or file the user must fix.
    Config,
    /// The source or sink failed while running (broker, disk, network).
    Connector,
    /// Another instance took over the pipeline's output.
    Fenced,
    /// An input record does not decode (under `on_error = fail`).
    Decode,
    /// A checkpoint cannot be written or read, or belongs to another pipeline.
    Checkpoint,
    /// A bug or an unexpected state.
    Internal,
}

impl ErrorClass {
    pub fn of_engine(e: &EngineError) -> Self {
        match e {
            EngineError::Sql { .. } => ErrorClass::Sql,
            EngineError::Unsupported { .. } => ErrorClass::Unsupported,
            EngineError::Schema(_) => ErrorClass::Schema,
            EngineError::Checkpoint(_) => ErrorClass::Checkpoint,
            _ => ErrorClass::Internal,
        }
    }

    /// Whether the user must change the query or the configuration.
    pub fn is_usage(self) -> bool {
        matches!(
            self,
            ErrorClass::Sql | ErrorClass::Unsupported | ErrorClass::Schema | ErrorClass::Config
        )
    }
}

impl RuntimeError {
    pub fn class(&self) -> ErrorClass {
        match self {
            RuntimeError::Config(_) => ErrorClass::Config,
            RuntimeError::Engine(e) => ErrorClass::of_engine(e),
            RuntimeError::Format(_) => ErrorClass::Schema,
            RuntimeError::Connector(c) => match c {
                ConnectorError::Config(_) => ErrorClass::Config,
                ConnectorError::Fenced(_) => ErrorClass::Fenced,
                _ => ErrorClass::Connector,
            },
            RuntimeError::BadRecord(_) => ErrorClass::Decode,
            RuntimeError::Checkpoint(_) => ErrorClass::Checkpoint,
            RuntimeError::Io(_) => ErrorClass::Connector,
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
