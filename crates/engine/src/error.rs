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

/// The line of the query an error is about, shown under the message with
/// a caret under the offending text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excerpt {
    /// The whole line, as written.
    pub text: String,
    /// Characters underlined from the position's column (at least 1).
    pub width: u64,
    /// The file the query came from, if it came from one.
    pub file: Option<String>,
}

/// `message`, the query line with a caret under the span at `position`
/// (or just the position), and the hint.
fn render(
    message: &str,
    position: Option<SqlPosition>,
    excerpt: Option<&Excerpt>,
    hint: Option<&String>,
) -> String {
    let mut out = message.to_string();
    match (position, excerpt) {
        (Some(p), Some(x)) => {
            let number = p.line.to_string();
            let gutter = " ".repeat(number.len());
            // Tabs stay tabs under the line, so the caret lines up.
            let pad: String = x
                .text
                .chars()
                .take(p.column.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let place = match &x.file {
                Some(f) => format!("{f}:{}:{}", p.line, p.column),
                None => p.to_string(),
            };
            out.push_str(&format!(
                "\n{gutter}--> {place}\n{gutter} |\n{number} | {}\n{gutter} | {pad}{}",
                x.text,
                "^".repeat(x.width.max(1) as usize)
            ));
        }
        (Some(p), None) => out.push_str(&format!(" (at {p})")),
        _ => {}
    }
    if let Some(h) = hint {
        out.push_str(&format!("\nhint: {h}"));
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The SQL text does not parse or does not plan (unknown column, type error).
    #[error("{}", render(message, *position, excerpt.as_deref(), hint.as_ref()))]
    Sql {
        message: String,
        position: Option<SqlPosition>,
        excerpt: Option<Box<Excerpt>>,
        hint: Option<String>,
    },
    /// The query plans but cannot run as a streaming query (the message says why).
    #[error("{}", render(message, *position, excerpt.as_deref(), hint.as_ref()))]
    Unsupported {
        message: String,
        position: Option<SqlPosition>,
        excerpt: Option<Box<Excerpt>>,
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
            position: None,
            excerpt: None,
            hint: Some(hint.into()).filter(|h: &String| !h.is_empty()),
        }
    }

    /// A query error without a place in the query.
    pub fn sql(message: impl Into<String>, hint: Option<String>) -> Self {
        EngineError::Sql {
            message: message.into(),
            position: None,
            excerpt: None,
            hint,
        }
    }

    /// Points a query error at `position` (spanning `width` characters) in
    /// `sql`: the line is quoted under the message. Other errors, and errors
    /// that point somewhere already, are returned as they are.
    pub fn at(mut self, sql: &str, position: SqlPosition, width: u64) -> Self {
        if let EngineError::Sql {
            position: p,
            excerpt: x,
            ..
        }
        | EngineError::Unsupported {
            position: p,
            excerpt: x,
            ..
        } = &mut self
            && x.is_none()
        {
            let line = sql.lines().nth(position.line.saturating_sub(1) as usize);
            if let Some(text) = line {
                *p = Some(position);
                *x = Some(Box::new(Excerpt {
                    text: text.to_string(),
                    width: width.max(1),
                    file: None,
                }));
            }
        }
        self
    }

    /// Places the error in `file`, where the query starts after `lines`
    /// lines and, on its first line, after the text `prefix`: the position
    /// becomes the file's, as an editor shows it.
    pub fn in_file(mut self, file: &str, lines: u64, prefix: &str) -> Self {
        if let EngineError::Sql {
            position: Some(p),
            excerpt,
            ..
        }
        | EngineError::Unsupported {
            position: Some(p),
            excerpt,
            ..
        } = &mut self
        {
            if p.line == 1 {
                p.column += prefix.chars().count() as u64;
                if let Some(x) = excerpt.as_mut() {
                    x.text.insert_str(0, prefix);
                }
            }
            p.line += lines;
            if let Some(x) = excerpt.as_mut() {
                x.file = Some(file.to_string());
            }
        }
        self
    }
    pub fn internal(message: impl Into<String>) -> Self {
        EngineError::Internal(message.into())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
