//! The engine's one error type, with categories a caller can branch on
//! (bad SQL, bad schema, unsupported query, bad input, checkpoint) and a
//! position where the SQL text has one.

use datafusion_common::DataFusionError;

/// A position in the SQL text, 1-based like editors show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlPosition {
    pub line: u64,
    pub column: u64,
}

impl std::fmt::Display for SqlPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The SQL text does not parse or does not plan (unknown column, type error).
    #[error("{message}{}{}", .position.map(|p| format!(" (at {p})")).unwrap_or_default(), .hint.as_ref().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    Sql {
        message: String,
        position: Option<SqlPosition>,
        hint: Option<String>,
    },
    /// The query plans but cannot run as a streaming query (the message says why).
    #[error("{message}{}", .hint.as_ref().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    Unsupported {
        message: String,
        hint: Option<String>,
    },
    /// A declared or inferred schema is malformed or does not fit the query.
    #[error("schema error: {0}")]
    Schema(String),
    /// Input data the engine cannot use (outside of per-row rejects, which are reported, not raised).
    #[error("input error: {0}")]
    Input(String),
    /// A checkpoint cannot be written or read back.
    #[error("checkpoint error: {0}")]
    Checkpoint(String),
    /// The state store failed (a disk error, a damaged state file).
    #[error(transparent)]
    State(#[from] ubik_state::StateError),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error(transparent)]
    DataFusion(#[from] Box<DataFusionError>),
    #[error("internal error: {0} (this is a bug in ubik; please report it)")]
    Internal(String),
}

impl From<DataFusionError> for EngineError {
    fn from(e: DataFusionError) -> Self {
        match e {
            DataFusionError::ArrowError(e, _) => EngineError::Arrow(*e),
            other => EngineError::DataFusion(Box::new(other)),
        }
    }
}

impl EngineError {
    pub fn unsupported(message: impl Into<String>, hint: impl Into<String>) -> Self {
        EngineError::Unsupported {
            message: message.into(),
            hint: Some(hint.into()).filter(|h: &String| !h.is_empty()),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        EngineError::Internal(message.into())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
