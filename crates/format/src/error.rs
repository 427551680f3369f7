//! Errors of the format layer.

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// A schema declaration that does not parse or names an unknown type.
    #[error("schema: {0}")]
    Schema(String),
    /// Input that is not valid for the schema, with where it was found.
    #[error("{0}")]
    Record(String),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
