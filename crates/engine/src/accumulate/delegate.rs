//! Any DataFusion aggregate as a [`StreamAccumulator`].
//!
//! DataFusion's `GroupsAccumulator` can only read groups by draining them, so
//! reading a subset without consuming it is done by a round trip: export the
//! state of every group, rebuild the accumulator from it, and evaluate the
//! subset in a scratch accumulator. That is linear in the number of groups,
//! which is fine for windows (read once, at close) and for the less common
//! aggregates of continuous queries; the common ones are native.
//!
//! Groups are added with [`DataFusionAccumulator::grow`] before any call
//! that would add them: DataFusion's accumulators assume that every new
//! group below a call's `total_num_groups` appears in that call, and take
//! one that does not (a group loaded from the state store later, or one
//! with no rows yet) to have seen a value.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, UInt32Array, new_null_array};
use arrow::compute::take;
use arrow::datatypes::DataType;
use datafusion_expr::{EmitTo, GroupsAccumulator};
use datafusion_physical_expr::GroupsAccumulatorAdapter;
use datafusion_physical_expr::aggregate::AggregateFunctionExpr;

use super::StreamAccumulator;
use crate::error::Result;
use crate::plan::AggregateSpec;

pub struct DataFusionAccumulator {
    function: Arc<AggregateFunctionExpr>,
    acc: Box<dyn GroupsAccumulator>,
    groups: usize,
    /// Types of the inputs `update` takes (for [`Self::grow`]).
    input_types: Vec<DataType>,
}

impl DataFusionAccumulator {
    pub fn try_new(spec: &AggregateSpec) -> Result<Self> {
        let function = Arc::clone(&spec.function);
        let acc = Self::fresh(&function)?;
        Ok(Self {
            function,
            acc,
            groups: 0,
            input_types: spec.input_types.clone(),
        })
    }

    /// Adds empty groups up to `total`: one row filtered out (so no
    /// aggregate folds it, and every one sizes its state for `total`
    /// groups, the new ones unseen).
    fn grow(&mut self, total: usize) -> Result<()> {
        if total <= self.groups {
            return Ok(());
        }
        let args: Vec<ArrayRef> = self
            .input_types
            .iter()
            .map(|t| new_null_array(t, 1))
            .collect();
        let skip = BooleanArray::from(vec![false]);
        self.acc
            .update_batch(&args, &[total - 1], Some(&skip), total)?;
        self.groups = total;
        Ok(())
    }

    fn fresh(function: &Arc<AggregateFunctionExpr>) -> Result<Box<dyn GroupsAccumulator>> {
        if function.groups_accumulator_supported() {
            Ok(function.create_groups_accumulator()?)
        } else {
            let f = Arc::clone(function);
            Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
                f.create_accumulator()
            })))
        }
    }

    /// State of every group; the accumulator is rebuilt from it.
    fn export_all(&mut self) -> Result<Vec<ArrayRef>> {
        let state = self.acc.state(EmitTo::All)?;
        self.acc = Self::fresh(&self.function)?;
        if self.groups > 0 {
            let all: Vec<usize> = (0..self.groups).collect();
            self.acc.merge_batch(&state, &all, self.groups)?;
        }
        Ok(state)
    }
}

fn take_rows(arrays: &[ArrayRef], groups: &[usize]) -> Result<Vec<ArrayRef>> {
    let idx = UInt32Array::from_iter_values(groups.iter().map(|&g| g as u32));
    Ok(arrays
        .iter()
        .map(|a| take(a.as_ref(), &idx, None))
        .collect::<std::result::Result<_, _>>()?)
}

impl StreamAccumulator for DataFusionAccumulator {
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()> {
        self.grow(total_groups)?;
        self.acc.update_batch(args, groups, filter, self.groups)?;
        Ok(())
    }

    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef> {
        let state = self.export_all()?;
        let picked = take_rows(&state, groups)?;
        let mut scratch = Self::fresh(&self.function)?;
        let local: Vec<usize> = (0..groups.len()).collect();
        scratch.merge_batch(&picked, &local, groups.len())?;
        Ok(scratch.evaluate(EmitTo::All)?)
    }

    fn evaluate_all_and_clear(&mut self, total_groups: usize) -> Result<ArrayRef> {
        // Groups that never saw a row still need their empty value.
        self.grow(total_groups)?;
        let out = self.acc.evaluate(EmitTo::All)?;
        self.acc = Self::fresh(&self.function)?;
        self.groups = 0;
        Ok(out)
    }

    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>> {
        let state = self.export_all()?;
        take_rows(&state, groups)
    }

    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()> {
        self.grow(total_groups)?;
        self.acc.merge_batch(states, groups, self.groups)?;
        Ok(())
    }

    fn reset(&mut self, groups: &[usize]) -> Result<()> {
        if groups.is_empty() || self.groups == 0 {
            return Ok(());
        }
        let state = self.acc.state(EmitTo::All)?;
        self.acc = Self::fresh(&self.function)?;
        let mut cleared = vec![false; self.groups];
        for &g in groups {
            if g < cleared.len() {
                cleared[g] = true;
            }
        }
        let keep: Vec<usize> = (0..self.groups).filter(|&g| !cleared[g]).collect();
        let kept = take_rows(&state, &keep)?;
        self.acc.merge_batch(&kept, &keep, self.groups)?;
        Ok(())
    }

    fn size(&self) -> usize {
        self.acc.size()
    }
}
