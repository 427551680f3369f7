//! [`KeyedState`]: one accumulator state per group key, the unit every
//! aggregating operator is built from (one per window, one per continuous
//! query, one per session slot table).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, RecordBatchOptions,
    UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema, SchemaRef};

use super::interner::Interner;
use crate::accumulate::{StreamAccumulator, create_accumulator, state_fields};
use crate::error::{EngineError, Result};
use crate::plan::AggregateSpec;
use crate::time::MIN_TIME;

/// Evaluated inputs of every aggregate for a batch of rows.
#[derive(Debug, Clone, Default)]
pub struct AggInputs {
    /// Per aggregate: its arguments then its ORDER BY expressions.
    pub args: Vec<Vec<ArrayRef>>,
    /// Per aggregate: `FILTER (WHERE ...)`.
    pub filters: Vec<Option<BooleanArray>>,
}

impl AggInputs {
    /// The rows at `indices`.
    pub fn take(&self, indices: &UInt32Array) -> Result<AggInputs> {
        let args = self
            .args
            .iter()
            .map(|a| {
                a.iter()
                    .map(|c| take(c.as_ref(), indices, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let filters = self
            .filters
            .iter()
            .map(|f| {
                f.as_ref()
                    .map(|f| take(f, indices, None).map(|a| a.as_boolean().clone()))
                    .transpose()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(AggInputs { args, filters })
    }
}

/// Groups whose value changed since they were last emitted.
#[derive(Default)]
struct Dirty {
    flag: Vec<bool>,
    list: Vec<usize>,
}

pub struct KeyedState {
    interner: Interner,
    accs: Vec<Box<dyn StreamAccumulator>>,
    specs: Vec<AggregateSpec>,
    /// Whether the group's last emission was an upsert (so a later failing
    /// HAVING must retract it).
    visible: Vec<bool>,
    /// Max event time folded into each group (the record timestamp of
    /// continuous queries); only kept when asked for.
    max_time: Option<Vec<i64>>,
    dirty: Option<Dirty>,
    scratch: Vec<usize>,
}

impl KeyedState {
    pub fn new(
        key_fields: &[FieldRef],
        specs: &[AggregateSpec],
        track_dirty: bool,
        track_time: bool,
    ) -> Result<Self> {
        Ok(Self {
            interner: Interner::new(key_fields)?,
            accs: specs
                .iter()
                .map(create_accumulator)
                .collect::<Result<Vec<_>>>()?,
            specs: specs.to_vec(),
            visible: Vec::new(),
            max_time: track_time.then(Vec::new),
            dirty: track_dirty.then(Dirty::default),
            scratch: Vec::new(),
        })
    }

    pub fn len(&self) -> usize {
        self.interner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.interner.is_empty()
    }

    /// Folds rows into their groups. `times` (when tracked) are the rows' event times.
    pub fn update(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        inputs: &AggInputs,
        times: Option<&[i64]>,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let mut groups = std::mem::take(&mut self.scratch);
        self.interner.intern(keys, rows, &mut groups)?;
        let total = self.interner.len();
        for (j, acc) in self.accs.iter_mut().enumerate() {
            acc.update(&inputs.args[j], &groups, inputs.filters[j].as_ref(), total)?;
        }
        self.touch(&groups, times, total);
        self.scratch = groups;
        Ok(())
    }

    /// Takes rows folded in earlier back out of their groups (retractable
    /// aggregates only) and marks the groups dirty; returns each row's group.
    pub fn retract(
        &mut self,
        keys: &[ArrayRef],
        rows: usize,
        inputs: &AggInputs,
    ) -> Result<Vec<usize>> {
        let mut groups = Vec::new();
        if rows == 0 {
            return Ok(groups);
        }
        self.interner.intern(keys, rows, &mut groups)?;
        let total = self.interner.len();
        for (j, acc) in self.accs.iter_mut().enumerate() {
            acc.retract(&inputs.args[j], &groups, inputs.filters[j].as_ref(), total)?;
        }
        self.touch(&groups, None, total);
        Ok(groups)
    }

    /// The group of each row of `keys` (interning new keys).
    pub fn groups_of(&mut self, keys: &[ArrayRef], rows: usize) -> Result<Vec<usize>> {
        let mut groups = Vec::new();
        self.interner.intern(keys, rows, &mut groups)?;
        Ok(groups)
    }

    /// Bookkeeping after `groups` were folded into: grow the per-group
    /// vectors to `total`, raise max times, mark the groups dirty.
    fn touch(&mut self, groups: &[usize], times: Option<&[i64]>, total: usize) {
        if self.visible.len() < total {
            self.visible.resize(total, false);
        }
        if let (Some(max_time), Some(times)) = (self.max_time.as_mut(), times) {
            if max_time.len() < total {
                max_time.resize(total, MIN_TIME);
            }
            for (&g, &t) in groups.iter().zip(times) {
                if t > max_time[g] {
                    max_time[g] = t;
                }
            }
        }
        if let Some(dirty) = self.dirty.as_mut() {
            if dirty.flag.len() < total {
                dirty.flag.resize(total, false);
            }
            for &g in groups {
                if !dirty.flag[g] {
                    dirty.flag[g] = true;
                    dirty.list.push(g);
                }
            }
        }
    }

    /// Folds every group of `other` (same keys and aggregates) into this
    /// state: the merge of a partial state folded on another thread.
    pub fn absorb(&mut self, mut other: KeyedState) -> Result<()> {
        let n = other.len();
        if n == 0 {
            return Ok(());
        }
        let all: Vec<usize> = (0..n).collect();
        let keys = other.interner.all_keys()?;
        let mut groups = Vec::with_capacity(n);
        self.interner.intern(&keys, n, &mut groups)?;
        let total = self.interner.len();
        for (acc, theirs) in self.accs.iter_mut().zip(other.accs.iter_mut()) {
            acc.merge(&theirs.state(&all)?, &groups, total)?;
        }
        let times = other.max_time.take();
        self.touch(&groups, times.as_deref(), total);
        Ok(())
    }

    /// Starts or stops tracking which groups change (late updates re-emit only those).
    pub fn set_track_dirty(&mut self, on: bool) {
        match (on, self.dirty.is_some()) {
            (true, false) => {
                self.dirty = Some(Dirty {
                    flag: vec![false; self.len()],
                    list: Vec::new(),
                })
            }
            (false, true) => self.dirty = None,
            _ => {}
        }
    }

    /// The groups changed since the last call, and clears the set.
    pub fn take_dirty(&mut self) -> Vec<usize> {
        match self.dirty.as_mut() {
            Some(d) => {
                for &g in &d.list {
                    d.flag[g] = false;
                }
                std::mem::take(&mut d.list)
            }
            None => Vec::new(),
        }
    }

    pub fn keys(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        self.interner.keys(groups)
    }

    /// Final values of every aggregate for `groups`, state unchanged.
    pub fn evaluate(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        self.accs.iter_mut().map(|a| a.evaluate(groups)).collect()
    }

    /// Keys and final values of every group (group `i` at row `i`), after
    /// which the accumulators are empty: the cheap path for a window that
    /// closes without keeping state.
    pub fn drain_all(&mut self) -> Result<(Vec<ArrayRef>, Vec<ArrayRef>)> {
        let n = self.len();
        let keys = self.interner.all_keys()?;
        let values = self
            .accs
            .iter_mut()
            .map(|a| a.evaluate_all_and_clear(n))
            .collect::<Result<Vec<_>>>()?;
        Ok((keys, values))
    }

    pub fn visible(&self, groups: &[usize]) -> Vec<bool> {
        groups.iter().map(|&g| self.visible[g]).collect()
    }

    pub fn set_visible(&mut self, groups: &[usize], visible: &[bool]) {
        for (&g, &v) in groups.iter().zip(visible) {
            self.visible[g] = v;
        }
    }

    pub fn max_time(&self, groups: &[usize]) -> Vec<i64> {
        match &self.max_time {
            Some(t) => groups.iter().map(|&g| t[g]).collect(),
            None => vec![MIN_TIME; groups.len()],
        }
    }

    pub fn size(&self) -> usize {
        self.interner.size()
            + self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.visible.capacity()
            + self.max_time.as_ref().map_or(0, |t| t.capacity() * 8)
    }

    /// The schema of [`Self::snapshot`]: keys, accumulator states, bookkeeping.
    pub fn snapshot_schema(key_fields: &[FieldRef], specs: &[AggregateSpec]) -> Result<SchemaRef> {
        let mut fields: Vec<FieldRef> = key_fields
            .iter()
            .enumerate()
            .map(|(i, f)| Arc::new(Field::new(format!("k{i}"), f.data_type().clone(), true)))
            .collect();
        for (j, spec) in specs.iter().enumerate() {
            for f in state_fields(spec)? {
                fields.push(Arc::new(Field::new(
                    format!("a{j}_{}", f.name()),
                    f.data_type().clone(),
                    true,
                )));
            }
        }
        fields.push(Arc::new(Field::new("visible", DataType::Boolean, false)));
        fields.push(Arc::new(Field::new("max_time", DataType::Int64, false)));
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Every group's key and state as one batch (group `i` at row `i`).
    pub fn snapshot(&mut self) -> Result<RecordBatch> {
        let n = self.len();
        let all: Vec<usize> = (0..n).collect();
        let schema = Self::snapshot_schema(self.interner.fields(), &self.specs)?;
        let mut columns = self.interner.all_keys()?;
        for acc in self.accs.iter_mut() {
            columns.extend(acc.state(&all)?);
        }
        columns.push(Arc::new(BooleanArray::from(self.visible[..n].to_vec())));
        columns.push(Arc::new(Int64Array::from(self.max_time(&all))));
        // Arrow would compare field names/nullability of nested state types
        // too strictly; cast each column to the declared type.
        let columns = columns
            .into_iter()
            .zip(schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    arrow::compute::cast(&c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new_with_options(
            schema,
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?)
    }

    /// Rebuilds the state of a [`Self::snapshot`] into this empty state.
    pub fn restore(&mut self, batch: &RecordBatch) -> Result<()> {
        if !self.is_empty() {
            return Err(EngineError::internal("restore into a non-empty state"));
        }
        let n = batch.num_rows();
        let k = self.interner.fields().len();
        let keys: Vec<ArrayRef> = batch.columns()[..k].to_vec();
        let mut groups = Vec::new();
        if k == 0 && n > 1 {
            return Err(EngineError::Checkpoint(
                "global aggregate with several groups".into(),
            ));
        }
        self.interner.intern(&keys, n, &mut groups)?;
        if groups.iter().enumerate().any(|(i, &g)| g != i) {
            return Err(EngineError::Checkpoint(
                "checkpointed keys are not distinct; the checkpoint is corrupt".into(),
            ));
        }
        let mut col = k;
        for (acc, spec) in self.accs.iter_mut().zip(&self.specs) {
            let width = state_fields(spec)?.len();
            acc.merge(&batch.columns()[col..col + width], &groups, n)?;
            col += width;
        }
        self.visible = batch
            .column(col)
            .as_boolean()
            .iter()
            .map(|v| v.unwrap_or(false))
            .collect();
        if let Some(t) = self.max_time.as_mut() {
            *t = batch
                .column(col + 1)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
        }
        if let Some(d) = self.dirty.as_mut() {
            d.flag = vec![false; n];
            d.list.clear();
        }
        Ok(())
    }
}
