//! Keyword arguments to runtime options.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Schema, SchemaRef};
use arrow_pyarrow::FromPyArrow;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use ubik_engine::QueryOptions;
use ubik_format::schema::parse_column_list;
use ubik_runtime::host::HostOptions;
use ubik_runtime::{CheckpointConfig, ErrorPolicy, PipelineConfig};

use crate::errors::SchemaError;

/// A duration: a number of seconds, a `timedelta`, or text like "5s", "250ms".
pub fn duration(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    if let Ok(s) = v.cast::<PyString>() {
        let text = s.to_cow()?;
        let text = text.as_ref();
        let us = ubik_engine::time::parse_duration(text).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}={text:?} is not a duration like '5s' or '250ms'"
            ))
        })?;
        return Ok(Duration::from_micros(us.max(0) as u64));
    }
    if let Ok(secs) = v
        .call_method0("total_seconds")
        .and_then(|s| s.extract::<f64>())
    {
        return Ok(Duration::from_secs_f64(secs.max(0.0)));
    }
    let secs: f64 = v.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be seconds, a timedelta, or text like '5s'"
        ))
    })?;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "{what} must be a non-negative duration"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A schema given as a `pyarrow.Schema` or a column list ("a VARCHAR, ...").
pub fn schema_of(v: &Bound<'_, PyAny>) -> PyResult<SchemaRef> {
    if let Ok(s) = v.cast::<PyString>() {
        return parse_column_list(&s.to_cow()?).map_err(|e| SchemaError::new_err(e.to_string()));
    }
    Ok(Arc::new(Schema::from_pyarrow_bound(v).map_err(|e| {
        SchemaError::new_err(format!(
            "schema must be a pyarrow.Schema, a dict of them, or a column list string: {e}"
        ))
    })?))
}

/// `schema=`: a schema, or a dict of table name to schema; picks `table`'s.
pub fn resolve_schema(
    v: Option<&Bound<'_, PyAny>>,
    table: Option<&str>,
) -> PyResult<Option<(Option<String>, SchemaRef)>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(d) = v.cast::<PyDict>() {
        if d.len() == 1 && table.is_none() {
            let (k, s) = d.iter().next().expect("one entry");
            return Ok(Some((Some(k.extract()?), schema_of(&s)?)));
        }
        let t = table.ok_or_else(|| {
            SchemaError::new_err("schema has several tables: the query must read one of them")
        })?;
        let s = d
            .get_item(t)?
            .ok_or_else(|| SchemaError::new_err(format!("schema has no table {t:?}")))?;
        return Ok(Some((Some(t.to_string()), schema_of(&s)?)));
    }
    Ok(Some((None, schema_of(v)?)))
}

fn get<'py>(d: Option<&Bound<'py, PyDict>>, k: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match d {
        Some(d) => Ok(d.get_item(k)?.filter(|v| !v.is_none())),
        None => Ok(None),
    }
}

/// Query semantics from keyword arguments.
pub fn query_options(d: Option<&Bound<'_, PyDict>>) -> PyResult<QueryOptions> {
    let mut o = QueryOptions::default();
    let us = |v: &Bound<'_, PyAny>, what: &str| -> PyResult<i64> {
        Ok(duration(v, what)?.as_micros() as i64)
    };
    if let Some(v) = get(d, "lateness")? {
        o.lateness_us = us(&v, "lateness")?;
    }
    if let Some(v) = get(d, "retention")? {
        o.retention_us = us(&v, "retention")?;
    }
    if let Some(v) = get(d, "emit_interval")? {
        o.emit_interval_us = us(&v, "emit_interval")?.max(1);
    }
    if let Some(v) = get(d, "max_future")? {
        o.max_future_us = us(&v, "max_future")?;
    }
    if let Some(v) = get(d, "event_time")? {
        o.event_time = Some(v.extract()?);
    }
    if let Some(v) = get(d, "threads")? {
        o.threads = v.extract::<usize>()?;
    }
    Ok(o)
}

/// Runtime settings (error policy, batch size, idle close, checkpoints).
pub fn apply_runtime(
    config: &mut PipelineConfig,
    d: Option<&Bound<'_, PyDict>>,
    checkpoint: Option<PathBuf>,
) -> PyResult<()> {
    if let Some(v) = get(d, "on_error")? {
        let p: String = v.extract()?;
        config.on_error =
            ErrorPolicy::parse(&p).map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    if let Some(v) = get(d, "batch_size")? {
        config.batch_size = v.extract::<usize>()?.max(1);
    }
    if let Some(v) = get(d, "idle_timeout")? {
        let t = duration(&v, "idle_timeout")?;
        config.idle_timeout = (!t.is_zero()).then_some(t);
    }
    if let Some(dir) = checkpoint {
        let mut ck = CheckpointConfig::new(dir);
        ck.keep = 5;
        if let Some(v) = get(d, "keep_checkpoints")? {
            ck.keep = v.extract::<usize>()?.max(1);
        }
        config.checkpoint = Some(ck);
    }
    Ok(())
}

/// Batching options of the Arrow leg.
pub fn host_options(d: Option<&Bound<'_, PyDict>>) -> PyResult<HostOptions> {
    let mut o = HostOptions::default();
    if let Some(v) = get(d, "max_rows")? {
        o.max_rows = Some(v.extract::<usize>()?.max(1));
    }
    if let Some(v) = get(d, "max_bytes")? {
        o.max_bytes = Some(v.extract::<usize>()?.max(1));
    }
    if let Some(v) = get(d, "max_interval")? {
        o.max_interval = Some(duration(&v, "max_interval")?);
    }
    if let Some(v) = get(d, "compact")? {
        o.compact = v.extract()?;
    }
    if let Some(v) = get(d, "spill_dir")? {
        o.spill_dir = Some(PathBuf::from(v.extract::<String>()?));
        o.spill_bytes = 256 << 20;
    }
    if let Some(v) = get(d, "spill_bytes")? {
        o.spill_bytes = v.extract()?;
    }
    if let Some(v) = get(d, "resume_from")? {
        o.resume_from = Some(v.extract()?);
    }
    Ok(o)
}
