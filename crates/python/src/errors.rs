//! The exception hierarchy, and the mapping of Rust errors onto it.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use ubik_connector::ConnectorError;
use ubik_engine::EngineError;
use ubik_runtime::{ErrorClass, RuntimeError};

create_exception!(
    _ubik,
    UbikError,
    PyException,
    "Base class of ubik's errors."
);
create_exception!(
    _ubik,
    SqlError,
    UbikError,
    "The SQL does not parse or plan; `line`, `column` and `hint` say where and what to do."
);
create_exception!(
    _ubik,
    UnsupportedQueryError,
    SqlError,
    "The query is valid SQL but cannot run as a stream (the message says why)."
);
create_exception!(
    _ubik,
    SchemaError,
    UbikError,
    "A schema is malformed or does not fit the input."
);
create_exception!(
    _ubik,
    SourceError,
    UbikError,
    "The source cannot be opened or read."
);
create_exception!(
    _ubik,
    DecodeError,
    UbikError,
    "An input record does not decode (under on_error='fail')."
);
create_exception!(
    _ubik,
    CheckpointError,
    UbikError,
    "A checkpoint cannot be written, read, or does not belong to this pipeline."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("UbikError", py.get_type::<UbikError>())?;
    m.add("SqlError", py.get_type::<SqlError>())?;
    m.add(
        "UnsupportedQueryError",
        py.get_type::<UnsupportedQueryError>(),
    )?;
    m.add("SchemaError", py.get_type::<SchemaError>())?;
    m.add("SourceError", py.get_type::<SourceError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}

fn with_attrs(py: Python<'_>, err: PyErr, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    for (k, v) in attrs {
        let _ = err.value(py).setattr(*k, v);
    }
    err
}

fn engine(py: Python<'_>, e: &EngineError) -> PyErr {
    let object = |v: Option<u64>| {
        v.into_pyobject(py)
            .map(|o| o.into_any().unbind())
            .unwrap_or_else(|_| py.None())
    };
    match e {
        EngineError::Sql { position, hint, .. }
        | EngineError::Unsupported { position, hint, .. } => {
            let err = match e {
                EngineError::Sql { .. } => SqlError::new_err(e.to_string()),
                _ => UnsupportedQueryError::new_err(e.to_string()),
            };
            let hint = hint
                .clone()
                .into_pyobject(py)
                .map(|o| o.into_any().unbind())
                .unwrap_or_else(|_| py.None());
            with_attrs(
                py,
                err,
                &[
                    ("line", object(position.map(|p| p.line))),
                    ("column", object(position.map(|p| p.column))),
                    ("hint", hint),
                ],
            )
        }
        _ => match ErrorClass::of_engine(e) {
            ErrorClass::Schema => SchemaError::new_err(e.to_string()),
            ErrorClass::Checkpoint => CheckpointError::new_err(e.to_string()),
            _ => UbikError::new_err(e.to_string()),
        },
    }
}

/// Maps a runtime error to the matching Python exception, by the runtime's
/// one classification (the CLI's exit codes come from the same).
pub fn to_py(py: Python<'_>, e: RuntimeError) -> PyErr {
    if let RuntimeError::Engine(inner) = &e {
        return engine(py, inner);
    }
    let message = match &e {
        RuntimeError::Config(m)
        | RuntimeError::BadRecord(m)
        | RuntimeError::Connector(ConnectorError::Config(m)) => m.clone(),
        other => other.to_string(),
    };
    match e.class() {
        ErrorClass::Sql => SqlError::new_err(message),
        ErrorClass::Unsupported => UnsupportedQueryError::new_err(message),
        ErrorClass::Schema => SchemaError::new_err(message),
        ErrorClass::Config | ErrorClass::Connector | ErrorClass::Fenced => {
            SourceError::new_err(message)
        }
        ErrorClass::Decode => DecodeError::new_err(message),
        ErrorClass::Checkpoint => CheckpointError::new_err(message),
        ErrorClass::Internal => UbikError::new_err(message),
    }
}
