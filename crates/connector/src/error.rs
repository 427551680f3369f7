//! Errors of sources and sinks, classified by what the runtime does about them.

/// Errors of sources and sinks, by what the runtime should do about them.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// Bad configuration or input the user must fix (the message says how).
    #[error("{0}")]
    Config(String),
    /// A transient failure (broker down, disk full): retry with backoff.
    #[error("{0}")]
    Transient(String),
    /// Another instance took over this pipeline's output (Kafka fencing).
    #[error("{0}")]
    Fenced(String),
    /// Anything else; the pipeline stops.
    #[error("{0}")]
    Fatal(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
