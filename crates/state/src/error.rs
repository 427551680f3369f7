//! The state store's one error type.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file of the store cannot be created, written, synced or read. The
    /// message names the file; a full disk says so and what to do.
    #[error("state store: cannot {action} {}: {source}{}", .path.display(), hint(.source))]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A state file is not what this build wrote (truncated, damaged, or
    /// written for another table layout).
    #[error("state store: {} is corrupt or not a state file of this table: {reason}", .path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// The state directory is in use by another running pipeline.
    #[error("state store: {} is in use by another running pipeline; give each pipeline its own --checkpoint or --state-dir directory", .0.display())]
    Locked(PathBuf),
    /// A checkpoint names a table or file the store does not have.
    #[error("state store: {0}")]
    Missing(String),
    /// Writing a run on the store's writer thread failed; the message
    /// names the file. The store takes no more writes.
    #[error("{0}")]
    Background(String),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
}

fn hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
            "\nhint: the disk is full; the last checkpoint is intact and current. Free space (or point --state-dir at a larger disk) and run again: the pipeline resumes from it"
        }
        _ => "",
    }
}

impl StateError {
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| StateError::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        StateError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = StateError> = std::result::Result<T, E>;
