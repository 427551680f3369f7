//! `validate()` and `Session`: conversions around `ubik_runtime::host`.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::ffi_stream::ArrowArrayStreamReader;
use arrow_pyarrow::{FromPyArrow, ToPyArrow};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use ubik_runtime::connect::{plan, table_name};
use ubik_runtime::dead_letter::CollectedDeadLetters;
use ubik_runtime::host::{HostPipeline, host_schema};
use ubik_runtime::{DeadLetterSpec, Endpoint, PipelineSpec, SourceSpec};

use crate::errors::{SchemaError, SourceError, to_py};
use crate::options::{host_options, resolve_schema, schema_of, settings};

/// Plans `sql` and returns (result schema, key columns, kind) without
/// reading any row.
#[pyfunction]
#[pyo3(signature = (sql, schema, table=None, options=None))]
pub fn validate<'py>(
    py: Python<'py>,
    sql: &str,
    schema: &Bound<'py, PyAny>,
    table: Option<String>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Bound<'py, PyAny>, Vec<String>, String)> {
    let settings = settings(options)?;
    let tables = match schemas_by_table(schema)? {
        // Several tables (a join): the query picks the ones it reads.
        Some(tables) => tables,
        None => {
            let wanted = table.or_else(|| single_table(sql));
            let (named, schema) = resolve_schema(Some(schema), wanted.as_deref())?
                .ok_or_else(|| SchemaError::new_err("validate needs the input schema"))?;
            vec![(
                table_name(wanted.or(named).as_deref(), None, sql, "input"),
                schema,
            )]
        }
    };
    let plan = py
        .detach(|| plan(sql, &tables, settings.query))
        .map_err(|e| to_py(py, e))?;
    let keys = plan.key_names().iter().map(|s| s.to_string()).collect();
    Ok((host_schema(&plan).to_pyarrow(py)?, keys, plan.kind_name()))
}

/// `schema=` as a dict of two or more tables: each (name, schema).
fn schemas_by_table(schema: &Bound<'_, PyAny>) -> PyResult<Option<Vec<(String, SchemaRef)>>> {
    match schema.cast::<PyDict>() {
        Ok(d) if d.len() > 1 => d
            .iter()
            .map(|(k, v)| Ok((k.extract()?, schema_of(&v)?)))
            .collect::<PyResult<Vec<_>>>()
            .map(Some),
        _ => Ok(None),
    }
}

/// One source of `from_`: a URL, or an object exporting an Arrow stream.
fn source_spec(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<SourceSpec> {
    if let Ok(url) = source.cast::<PyString>() {
        return SourceSpec::parse(&url.to_cow()?).map_err(|e| to_py(py, e));
    }
    let reader = ArrowArrayStreamReader::from_pyarrow_bound(source).map_err(|e| {
        SourceError::new_err(format!(
            "from_ must be a source URL or Arrow data (Table, RecordBatch, RecordBatchReader), or a dict of them by table name: {e}"
        ))
    })?;
    Ok(SourceSpec::new(Endpoint::Arrow(Box::new(reader))))
}

/// The one table a query reads, if it names exactly one.
fn single_table(sql: &str) -> Option<String> {
    match ubik_engine::sql::referenced_tables(sql).as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// A running pipeline feeding this Python process.
#[pyclass(module = "ubik._ubik")]
pub struct Session {
    host: Mutex<Option<HostPipeline>>,
    /// Dead letters go to this callable (else to stderr as JSON lines).
    dead_letters: Option<(CollectedDeadLetters, Py<PyAny>)>,
}

/// The open pipeline of a session.
fn open<'a>(guard: &'a mut MutexGuard<'_, Option<HostPipeline>>) -> PyResult<&'a mut HostPipeline> {
    guard
        .as_mut()
        .ok_or_else(|| SourceError::new_err("the pipeline is closed"))
}

impl Session {
    /// Hands the dead letters written since the last call to the callback,
    /// with no lock held (the callback may call back into the session).
    fn deliver_dead_letters(&self, py: Python<'_>) -> PyResult<()> {
        let Some((queue, callback)) = &self.dead_letters else {
            return Ok(());
        };
        let mut letters = queue.take().into_iter();
        while let Some(l) = letters.next() {
            let (position, counts) = l.position.clone().unzip();
            let record = l
                .record
                .as_deref()
                .map(|r| pyo3::types::PyBytes::new(py, r));
            let args = (
                &l.reason,
                &l.message,
                &l.source,
                l.partition,
                position,
                counts,
                record,
            );
            if let Err(e) = callback.call1(py, args) {
                // Not taken: this one and the rest come first next time.
                queue.put_back(std::iter::once(l).chain(letters).collect());
                return Err(e);
            }
        }
        Ok(())
    }

    fn lock(&self) -> PyResult<MutexGuard<'_, Option<HostPipeline>>> {
        self.host.lock().map_err(|_| {
            SourceError::new_err("a previous call failed inside the pipeline; open a new one")
        })
    }
}

#[pymethods]
impl Session {
    /// `source` is a URL (kafka://, webhook://, file://, -, demo://) or an
    /// object exporting an Arrow stream (`__arrow_c_stream__`, e.g. a
    /// `pyarrow.RecordBatchReader`). `one_shot`: Kafka topics and webhook
    /// buffers without `end=` end where they stand at open (`stream()`).
    /// `on_dead_letter` is called with (reason, message, source, partition,
    /// position, what the position counts, original bytes) for each record
    /// set aside.
    #[new]
    #[pyo3(signature = (sql, source, schema=None, table=None, checkpoint=None, options=None, host=None, kafka=None, one_shot=false, on_dead_letter=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sql: String,
        source: &Bound<'_, PyAny>,
        schema: Option<&Bound<'_, PyAny>>,
        table: Option<String>,
        checkpoint: Option<PathBuf>,
        options: Option<&Bound<'_, PyDict>>,
        host: Option<&Bound<'_, PyDict>>,
        kafka: Option<&Bound<'_, PyDict>>,
        one_shot: bool,
        on_dead_letter: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let mut sources = match source.cast::<PyDict>() {
            // Several named sources: from_={"orders": ..., "merchants": ...}.
            Ok(named) => {
                if table.is_some() {
                    return Err(SchemaError::new_err(
                        "table= names the one source; with a dict from_, its keys name the tables",
                    ));
                }
                let schemas = match schema.filter(|s| !s.is_none()) {
                    None => None,
                    Some(s) => Some(s.cast::<PyDict>().map_err(|_| {
                        SchemaError::new_err(
                            "with several sources, schema= is a dict by table name",
                        )
                    })?),
                };
                let mut sources = Vec::with_capacity(named.len());
                for (name, value) in named.iter() {
                    let name: String = name.extract()?;
                    let mut spec = source_spec(py, &value)?;
                    if let Some(s) = schemas.and_then(|d| d.get_item(&name).ok().flatten()) {
                        spec.schema = Some(schema_of(&s)?);
                    }
                    spec.table = Some(name);
                    sources.push(spec);
                }
                sources
            }
            Err(_) => {
                let table = table.or_else(|| single_table(&sql));
                let declared = resolve_schema(schema, table.as_deref())?;
                let mut spec = source_spec(py, source)?;
                spec.table = table;
                spec.schema = declared.map(|(_, s)| s);
                vec![spec]
            }
        };
        if one_shot {
            for source in &mut sources {
                source.endpoint.bound_at_open().map_err(|e| to_py(py, e))?;
            }
        }
        let mut spec = PipelineSpec::new(sql, SourceSpec::new(Endpoint::Stdin));
        spec.sources = sources;
        spec.settings = settings(options)?;
        spec.checkpoint = checkpoint;
        let dead_letters =
            on_dead_letter.map(|callback| (CollectedDeadLetters::default(), callback));
        if let Some((queue, _)) = &dead_letters {
            spec.dead_letters = DeadLetterSpec::Provided(Box::new(queue.clone()));
        }
        if let Some(k) = kafka {
            for (key, value) in k.iter() {
                spec.kafka.insert(key.extract()?, value.str()?.to_string());
            }
        }
        let mut host_opts = host_options(host)?;
        // A one-shot run draws its bar on a terminal unless told not to.
        host_opts.progress.get_or_insert(one_shot);
        let host = py
            .detach(|| HostPipeline::open(spec, host_opts))
            .map_err(|e| to_py(py, e))?;
        Ok(Self {
            host: Mutex::new(Some(host)),
            dead_letters,
        })
    }

    /// The schema of every batch.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        open(&mut self.lock()?)?.schema().to_pyarrow(py)
    }

    /// The changelog key columns.
    #[getter]
    fn key(&self) -> PyResult<Vec<String>> {
        Ok(open(&mut self.lock()?)?
            .pipeline()
            .plan()
            .key_names()
            .iter()
            .map(|s| s.to_string())
            .collect())
    }

    /// The next batch, or None if nothing arrived within `timeout` seconds.
    fn next<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<Bound<'py, PyAny>>> {
        let t = Duration::from_secs_f64(timeout.max(0.0));
        let batch = {
            let mut guard = self.lock()?;
            let host = open(&mut guard)?;
            py.detach(|| host.next_batch(t)).map_err(|e| to_py(py, e))?
        };
        if let Err(e) = self.deliver_dead_letters(py) {
            // The batch stays the next one to hand out.
            if let (Some(b), Ok(mut guard)) = (batch, self.lock()) {
                open(&mut guard)?.hand_back(b);
            }
            return Err(e);
        }
        batch.map(|b| b.to_pyarrow(py)).transpose()
    }

    /// True once a bounded input was read to the end and handed out.
    #[getter]
    fn finished(&self) -> PyResult<bool> {
        Ok(open(&mut self.lock()?)?.is_finished())
    }

    /// Runs a bounded input to the end; returns the final result (latest
    /// row per key) as a list of one RecordBatch.
    fn final_batches<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut all = Vec::new();
        loop {
            let (batch, finished) = {
                let mut guard = self.lock()?;
                let host = open(&mut guard)?;
                let b = py
                    .detach(|| host.next_batch(Duration::from_millis(200)))
                    .map_err(|e| to_py(py, e))?;
                (b, host.is_finished())
            };
            self.deliver_dead_letters(py)?;
            match batch {
                Some(b) => all.push(b),
                None if finished => break,
                None => {}
            }
            py.check_signals()?;
        }
        let mut guard = self.lock()?;
        let host = open(&mut guard)?;
        let folded = py
            .detach(move || {
                let host: &mut HostPipeline = host;
                host.fold(&all)
            })
            .map_err(|e| to_py(py, e))?;
        PyList::new(py, [folded.to_pyarrow(py)?])
    }

    /// Checkpoints the state as of the last batch handed out.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.lock()?;
        let host = open(&mut guard)?;
        py.detach(|| host.checkpoint()).map_err(|e| to_py(py, e))
    }

    /// The token of the checkpoint the next `checkpoint()` writes.
    #[getter]
    fn token(&self) -> PyResult<String> {
        Ok(open(&mut self.lock()?)?.next_token())
    }

    /// Counters: records in, changes out, dead letters, ...
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = open(&mut self.lock()?)?.pipeline().stats.clone();
        let d = PyDict::new(py);
        d.set_item("records_in", s.records_in)?;
        d.set_item("changes_out", s.changes_out)?;
        d.set_item("decode_errors", s.decode_errors)?;
        d.set_item("dead_letters", s.dead_letters)?;
        d.set_item("late_rows", s.late_rows)?;
        d.set_item("checkpoints", s.checkpoints)?;
        d.set_item("state_bytes", s.state_bytes)?;
        Ok(d)
    }

    /// Releases the source (a webhook endpoint stops listening).
    fn close(&self, py: Python<'_>) {
        let taken = self.host.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = taken {
            py.detach(move || drop(h));
        }
    }
}
