//! Errors of the Avro format.

use crate::registry::RegistryError;

#[derive(Debug, thiserror::Error)]
pub enum AvroError {
    /// A setting that cannot work (no registry URL, an unreadable CA file).
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A schema ubik cannot read or write, or one a subject refuses.
    #[error("{0}")]
    Schema(String),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
}

pub type Result<T, E = AvroError> = std::result::Result<T, E>;

impl From<AvroError> for ubik_format::FormatError {
    fn from(e: AvroError) -> Self {
        match e {
            AvroError::Arrow(a) => ubik_format::FormatError::Arrow(a),
            AvroError::Schema(m) | AvroError::Config(m) => ubik_format::FormatError::Schema(m),
            other => ubik_format::FormatError::Record(other.to_string()),
        }
    }
}
