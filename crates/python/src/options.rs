//! Keyword arguments to runtime options.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Schema, SchemaRef};
use arrow_pyarrow::FromPyArrow;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use ubik_format::schema::parse_column_list;
use ubik_runtime::Settings;
use ubik_runtime::host::HostOptions;
use ubik_runtime::settings::SettingKind;

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

/// A schema given as a `pyarrow.Schema`, a column list ("a VARCHAR, ..."),
/// or an Avro source's URL (its columns come from its registry).
pub fn schema_of(v: &Bound<'_, PyAny>) -> PyResult<SchemaRef> {
    if let Ok(s) = v.cast::<PyString>() {
        let text = s.to_cow()?;
        if text.starts_with("kafka://") {
            let url = text.into_owned();
            return v
                .py()
                .detach(|| ubik_runtime::codec::registry_columns(&url, &Default::default()))
                .map_err(|e| SchemaError::new_err(e.to_string()));
        }
        return parse_column_list(&text).map_err(|e| SchemaError::new_err(e.to_string()));
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

/// A keyword argument as the text the options layer parses: durations may
/// be seconds or a `timedelta` as well as text like "5s".
fn setting_text(name: &str, kind: SettingKind, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    if kind == SettingKind::Text
        && let Ok(b) = v.cast::<PyBool>()
    {
        // Switches such as `ttl_tombstones=True`.
        return Ok(b.is_true().to_string());
    }
    match kind {
        SettingKind::Duration => Ok(format!("{}us", duration(v, name)?.as_micros())),
        SettingKind::Count | SettingKind::Bytes => {
            let what = match kind {
                SettingKind::Bytes => "a number of bytes or a size like \"2GiB\"",
                _ => "a whole number",
            };
            if v.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err(format!("{name} must be {what}")));
            }
            let n: i64 = v
                .extract()
                .map_err(|_| PyTypeError::new_err(format!("{name} must be {what}")))?;
            Ok(n.to_string())
        }
        SettingKind::Text => Err(PyTypeError::new_err(format!("{name} must be a string"))),
    }
}

/// Settings from keyword arguments, through the runtime's one options layer.
pub fn settings(d: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
    let mut s = Settings::default();
    let Some(d) = d else { return Ok(s) };
    for (k, v) in d.iter() {
        if v.is_none() {
            continue;
        }
        let name: String = k.extract()?;
        let kind = Settings::kind(&name)
            .ok_or_else(|| PyTypeError::new_err(format!("unexpected keyword argument {name:?}")))?;
        let text = setting_text(&name, kind, &v)?;
        s.set(&name, &text)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    Ok(s)
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
    if let Some(v) = get(d, "progress")? {
        o.progress = Some(v.extract()?);
    }
    Ok(o)
}
