//! Turns per-group results into changelog rows: HAVING decides upsert,
//! tombstone or nothing; the SELECT list is evaluated; rows are ordered by
//! their key so an emission's bytes never depend on hash-table order.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array};
use arrow::compute::{SortColumn, concat, lexsort_to_indices, take, take_record_batch};
use arrow::datatypes::{Field, Int64Type, Schema, SchemaRef};

use super::ChangeBatch;
use super::eval::{eval_array, eval_predicate};
use crate::error::Result;
use crate::plan::{AggregatePlan, PhysicalExprRef};
use crate::time::{MIN_TIME, micros_array, window_type};

/// Results of some groups, before HAVING and projection.
#[derive(Debug, Default)]
pub struct StageRows {
    /// Non-window GROUP BY columns, in GROUP BY order.
    pub keys: Vec<ArrayRef>,
    /// Window start and end (µs) per row, for windowed queries.
    pub window: Option<(Vec<i64>, Vec<i64>)>,
    /// Aggregate results, in plan order.
    pub values: Vec<ArrayRef>,
    /// Record timestamp per row (`MIN_TIME`: none).
    pub timestamps: Vec<i64>,
    /// Whether each row's key is currently visible downstream.
    pub visible: Vec<bool>,
    /// Rows whose key must be retracted whatever HAVING says (a session
    /// whose start moved); empty means none.
    pub retract: Vec<bool>,
}

impl StageRows {
    pub fn len(&self) -> usize {
        self.timestamps.len()
    }
    pub fn is_empty(&self) -> bool {
        self.timestamps.is_empty()
    }

    /// Appends `other`'s rows (for emissions that span several windows).
    pub fn append(&mut self, other: StageRows) -> Result<()> {
        if self.is_empty() {
            *self = other;
            return Ok(());
        }
        let cat = |a: &mut Vec<ArrayRef>, b: Vec<ArrayRef>| -> Result<()> {
            for (x, y) in a.iter_mut().zip(b) {
                *x = concat(&[x.as_ref(), y.as_ref()])?;
            }
            Ok(())
        };
        cat(&mut self.keys, other.keys)?;
        cat(&mut self.values, other.values)?;
        if let (Some((s, e)), Some((s2, e2))) = (self.window.as_mut(), other.window) {
            s.extend(s2);
            e.extend(e2);
        }
        if !self.retract.is_empty() || !other.retract.is_empty() {
            let n = self.timestamps.len();
            self.retract.resize(n, false);
            let m = other.timestamps.len();
            let mut r = other.retract;
            r.resize(m, false);
            self.retract.extend(r);
        }
        self.timestamps.extend(other.timestamps);
        self.visible.extend(other.visible);
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Emitter {
    /// The stage schema with every field nullable (it is internal).
    stage_schema: SchemaRef,
    output_schema: SchemaRef,
    key_columns: Vec<usize>,
    having: Option<PhysicalExprRef>,
    projection: Vec<PhysicalExprRef>,
    window_position: Option<usize>,
    group_count: usize,
}

impl Emitter {
    pub fn new(plan: &AggregatePlan, output_schema: SchemaRef, key_columns: Vec<usize>) -> Self {
        let relaxed: Vec<Field> = plan
            .stage_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Self {
            stage_schema: Arc::new(Schema::new(relaxed)),
            output_schema,
            key_columns,
            having: plan.having.clone(),
            projection: plan.projection.clone(),
            window_position: plan.window_position,
            group_count: plan.group_exprs.len() + plan.window_position.map_or(0, |_| 1),
        }
    }

    /// The result rows of `rows` in their order (the SELECT list) and
    /// whether each passes HAVING (`None`: there is none).
    pub fn results(&self, rows: &StageRows) -> Result<(RecordBatch, Option<BooleanArray>)> {
        let n = rows.len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.stage_schema.fields().len());
        let mut keys = rows.keys.iter().cloned();
        let (starts, ends) = match &rows.window {
            Some((s, e)) => (Some(micros_array(s.clone())), Some(micros_array(e.clone()))),
            None => (None, None),
        };
        for i in 0..self.group_count {
            if Some(i) == self.window_position {
                columns.push(starts.clone().expect("window start"));
            } else {
                columns.push(keys.next().expect("group key"));
            }
        }
        columns.extend(rows.values.iter().cloned());
        columns.push(ends.unwrap_or_else(|| arrow::array::new_null_array(&window_type(), n)));
        let stage = RecordBatch::try_new(Arc::clone(&self.stage_schema), columns)?;

        let pass = match &self.having {
            Some(h) => Some(eval_predicate(h.as_ref(), &stage)?),
            None => None,
        };
        let out = project(&self.projection, &stage, &self.output_schema)?;
        Ok((out, pass))
    }

    /// Builds the changelog rows for `rows`; returns them (ordered by key, or
    /// `None` if nothing changed visibly) and each row's new visibility.
    pub fn emit(&self, rows: StageRows) -> Result<(Option<ChangeBatch>, Vec<bool>)> {
        let n = rows.len();
        let (out, pass) = self.results(&rows)?;

        // Rows to emit: passing rows (upserts) and visible failing rows (tombstones).
        let retract = |i: usize| rows.retract.get(i).copied().unwrap_or(false);
        let (selected, deletes, visible) = match &pass {
            None if rows.retract.is_empty() => {
                ((0..n as u32).collect::<Vec<_>>(), None, vec![true; n])
            }
            _ => {
                let mut sel = Vec::new();
                let mut del = Vec::new();
                let mut vis = Vec::with_capacity(n);
                for i in 0..n {
                    let ok = !retract(i) && pass.as_ref().is_none_or(|p| p.value(i));
                    if ok || rows.visible[i] {
                        sel.push(i as u32);
                        del.push(!ok);
                    }
                    vis.push(ok);
                }
                (sel, Some(del), vis)
            }
        };
        if selected.is_empty() {
            return Ok((None, visible));
        }
        let selected = UInt32Array::from(selected);
        let out = take_record_batch(&out, &selected)?;
        let order = key_order(&out, &self.key_columns)?;
        let rows_out = match &order {
            Some(o) => take_record_batch(&out, o)?,
            None => out,
        };
        let pick = |i: usize| -> usize {
            let j = order.as_ref().map_or(i, |o| o.value(i) as usize);
            selected.value(j) as usize
        };
        let m = rows_out.num_rows();
        let timestamps = Int64Array::from_iter((0..m).map(|i| {
            let t = rows.timestamps[pick(i)];
            (t != MIN_TIME).then_some(t)
        }));
        let deletes = deletes.map(|d| {
            BooleanArray::from_iter((0..m).map(|i| {
                let j = order.as_ref().map_or(i, |o| o.value(i) as usize);
                Some(d[j])
            }))
        });
        Ok((
            Some(ChangeBatch {
                rows: rows_out,
                deletes,
                timestamps,
            }),
            visible,
        ))
    }
}

/// `projection` evaluated over `input`: a batch of `schema`.
pub(crate) fn project(
    projection: &[PhysicalExprRef],
    input: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let columns = projection
        .iter()
        .map(|e| eval_array(e.as_ref(), input))
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// `rows` as upserts ordered by `key_columns`, each with its record
/// timestamp from `times` (none where `MIN_TIME`, or for a query without
/// event time, whose times are ordinals).
pub(crate) fn upserts_by_key(
    rows: RecordBatch,
    times: Vec<i64>,
    has_event_time: bool,
    key_columns: &[usize],
) -> Result<ChangeBatch> {
    let timestamps = Int64Array::from_iter(
        times
            .into_iter()
            .map(|t| (has_event_time && t != MIN_TIME).then_some(t)),
    );
    let (rows, timestamps) = match key_order(&rows, key_columns)? {
        Some(o) => (
            take_record_batch(&rows, &o)?,
            take(&timestamps, &o, None)?
                .as_primitive::<Int64Type>()
                .clone(),
        ),
        None => (rows, timestamps),
    };
    Ok(ChangeBatch {
        rows,
        deletes: None,
        timestamps,
    })
}

/// The order of `batch`'s rows by the columns `key_columns` (`None`: keep
/// the order, when there is no key or at most one row). Emissions are
/// ordered by key so their bytes never depend on hash-table order.
pub(crate) fn key_order(batch: &RecordBatch, key_columns: &[usize]) -> Result<Option<UInt32Array>> {
    if key_columns.is_empty() || batch.num_rows() < 2 {
        return Ok(None);
    }
    let cols: Vec<SortColumn> = key_columns
        .iter()
        .map(|&i| SortColumn {
            values: Arc::clone(batch.column(i)),
            options: None,
        })
        .collect();
    Ok(Some(lexsort_to_indices(&cols, None)?))
}

/// `take` for a list of arrays.
pub(crate) fn take_all(arrays: &[ArrayRef], idx: &UInt32Array) -> Result<Vec<ArrayRef>> {
    Ok(arrays
        .iter()
        .map(|a| take(a.as_ref(), idx, None))
        .collect::<std::result::Result<_, _>>()?)
}
