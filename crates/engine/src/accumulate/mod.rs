//! Per-group aggregate state, updated batch by batch.
//!
//! [`StreamAccumulator`] is DataFusion's `GroupsAccumulator` shape (dense
//! group indices, vectorised updates) with what a stream needs on top:
//! reading a subset of groups without consuming them (continuous queries
//! re-emit only the keys that changed), exporting and importing state exactly
//! (checkpoints), and resetting slots (session windows).
//!
//! The common aggregates (and `count(DISTINCT)` of integers) are native
//! here, with exact, order-independent state (see [`exact`]), so the
//! changelog bytes do not depend on batch boundaries, partition
//! interleaving or resume points. Every other
//! DataFusion aggregate runs through [`delegate::DataFusionAccumulator`].

pub mod delegate;
pub mod distinct;
pub mod exact;
pub mod extreme;
pub mod moments;
pub mod native;
pub mod retract;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::datatypes::{DataType, FieldRef};

use crate::error::Result;
use crate::plan::AggregateSpec;

/// Aggregate state for a dense range of groups `0..n`.
pub trait StreamAccumulator: Send {
    /// Folds rows into groups: row `i` of `args` belongs to `groups[i]`; rows
    /// where `filter` is not true are skipped. `total_groups` bounds the indices.
    fn update(
        &mut self,
        args: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total_groups: usize,
    ) -> Result<()>;

    /// Takes rows folded in earlier back out of their groups (the inverse
    /// of [`Self::update`]): an aggregation over a continuous aggregation
    /// retracts an inner row's old version before adding its new one.
    /// Only [`is_retractable`] aggregates implement it.
    fn retract(
        &mut self,
        _args: &[ArrayRef],
        _groups: &[usize],
        _filter: Option<&BooleanArray>,
        _total_groups: usize,
    ) -> Result<()> {
        Err(crate::error::EngineError::internal(
            "retract on an aggregate without retraction",
        ))
    }

    /// Final values of `groups`, leaving the state unchanged.
    fn evaluate(&mut self, groups: &[usize]) -> Result<ArrayRef>;

    /// Final values of every group, after which the state is empty.
    fn evaluate_all_and_clear(&mut self, total_groups: usize) -> Result<ArrayRef> {
        let all: Vec<usize> = (0..total_groups).collect();
        let out = self.evaluate(&all)?;
        self.reset(&all)?;
        Ok(out)
    }

    /// Intermediate state of `groups` (one array per state field), unchanged.
    fn state(&mut self, groups: &[usize]) -> Result<Vec<ArrayRef>>;

    /// Folds intermediate states (as returned by [`Self::state`]) into `groups`.
    fn merge(&mut self, states: &[ArrayRef], groups: &[usize], total_groups: usize) -> Result<()>;

    /// Returns `groups` to the empty state.
    fn reset(&mut self, groups: &[usize]) -> Result<()>;

    /// Approximate heap bytes held.
    fn size(&self) -> usize;
}

/// Creates the accumulator for one aggregate call: native when one exists
/// for the function and argument types, DataFusion's otherwise.
pub fn create_accumulator(spec: &AggregateSpec) -> Result<Box<dyn StreamAccumulator>> {
    if let Some(native) = native_accumulator(spec) {
        return Ok(native);
    }
    Ok(Box::new(delegate::DataFusionAccumulator::try_new(spec)?))
}

/// Whether the aggregate's result is independent of the order rows are
/// folded and partial states merged in (so a batch may be folded in parallel).
pub fn is_order_independent(spec: &AggregateSpec) -> bool {
    pick_native(spec).is_some()
}

/// Whether the aggregate can take rows back out exactly
/// ([`StreamAccumulator::retract`]): counts, and float sums and averages
/// (their exact state subtracts as it adds).
pub fn is_retractable(spec: &AggregateSpec) -> bool {
    matches!(
        pick_native(spec),
        Some(
            Native::Count
                | Native::SumFloat
                | Native::AvgFloat
                | Native::RetractSumInt
                | Native::RetractSumUInt
                | Native::CountedMin
                | Native::CountedMax
        )
    )
}

/// State fields of the accumulator [`create_accumulator`] picks, named for checkpoints.
pub fn state_fields(spec: &AggregateSpec) -> Result<Vec<FieldRef>> {
    if let Some(fields) = native_state_fields(spec) {
        return Ok(fields);
    }
    Ok(spec.function.state_fields()?)
}

/// Which native implementation, if any, serves this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Native {
    Count,
    SumInt,
    SumUInt,
    SumFloat,
    AvgFloat,
    Min,
    Max,
    CountDistinct,
    Moment(moments::Moment),
    // Retracting variants ([`AggregateSpec::retracting`]).
    RetractSumInt,
    RetractSumUInt,
    CountedMin,
    CountedMax,
}

fn pick_native(spec: &AggregateSpec) -> Option<Native> {
    let f = &spec.function;
    let args = &spec.arg_types;
    if !f.order_bys().is_empty() || f.ignore_nulls() {
        return None;
    }
    if f.is_distinct() {
        let native = match (spec.function_name(), args.as_slice()) {
            ("count", [t]) if distinct::supported(t) => Native::CountDistinct,
            _ => return None,
        };
        return (spec.field.data_type() == &DataType::Int64).then_some(native);
    }
    let out = spec.field.data_type();
    let native = match (spec.function_name(), args.as_slice()) {
        ("count", [_]) => Native::Count,
        ("sum", [DataType::Int64]) => Native::SumInt,
        ("sum", [DataType::UInt64]) => Native::SumUInt,
        ("sum", [DataType::Float64]) => Native::SumFloat,
        ("avg", [DataType::Float64]) => Native::AvgFloat,
        ("min", [t]) if native::minmax_supported(t) => Native::Min,
        ("max", [t]) if native::minmax_supported(t) => Native::Max,
        ("min", [t]) if spec.retracting && extreme::CountedExtreme::supports(t) => Native::Min,
        ("max", [t]) if spec.retracting && extreme::CountedExtreme::supports(t) => Native::Max,
        (name, [DataType::Float64]) => Native::Moment(moments::Moment::from_name(name)?),
        _ => return None,
    };
    let native = match (spec.retracting, native) {
        (false, n) => n,
        (true, Native::SumInt) => Native::RetractSumInt,
        (true, Native::SumUInt) => Native::RetractSumUInt,
        (true, Native::Min) => Native::CountedMin,
        (true, Native::Max) => Native::CountedMax,
        (true, n @ (Native::Count | Native::SumFloat | Native::AvgFloat)) => n,
        (true, _) => return None,
    };
    // The native result type must be exactly what DataFusion planned.
    let expected = match native {
        Native::Count | Native::CountDistinct => DataType::Int64,
        Native::SumInt | Native::RetractSumInt => DataType::Int64,
        Native::SumUInt | Native::RetractSumUInt => DataType::UInt64,
        Native::Min | Native::Max | Native::CountedMin | Native::CountedMax => args[0].clone(),
        Native::SumFloat | Native::AvgFloat | Native::Moment(_) => DataType::Float64,
    };
    (out == &expected).then_some(native)
}

fn native_accumulator(spec: &AggregateSpec) -> Option<Box<dyn StreamAccumulator>> {
    let out_type = spec.field.data_type().clone();
    Some(match pick_native(spec)? {
        Native::Count => Box::new(native::Count::default()),
        Native::SumInt => Box::new(native::SumInt::<arrow::datatypes::Int64Type>::default()),
        Native::SumUInt => Box::new(native::SumInt::<arrow::datatypes::UInt64Type>::default()),
        Native::SumFloat => Box::new(native::FloatSum::new(false)),
        Native::AvgFloat => Box::new(native::FloatSum::new(true)),
        Native::Min => native::min_max(&out_type, false)?,
        Native::Max => native::min_max(&out_type, true)?,
        Native::CountDistinct => Box::new(distinct::CountDistinct::default()),
        Native::Moment(m) => Box::new(moments::MomentAccumulator::new(m)),
        Native::RetractSumInt => {
            Box::new(retract::RetractSumInt::<arrow::datatypes::Int64Type>::default())
        }
        Native::RetractSumUInt => {
            Box::new(retract::RetractSumInt::<arrow::datatypes::UInt64Type>::default())
        }
        Native::CountedMin => Box::new(extreme::CountedExtreme::new(&out_type, false).ok()?),
        Native::CountedMax => Box::new(extreme::CountedExtreme::new(&out_type, true).ok()?),
    })
}

fn native_state_fields(spec: &AggregateSpec) -> Option<Vec<FieldRef>> {
    let out_type = spec.field.data_type().clone();
    Some(match pick_native(spec)? {
        Native::Count => native::Count::state_fields(),
        Native::SumInt | Native::SumUInt | Native::Min | Native::Max => {
            native::single_value_state(&out_type)
        }
        Native::SumFloat | Native::AvgFloat => native::FloatSum::state_fields(),
        Native::CountDistinct => distinct::CountDistinct::state_fields(),
        Native::Moment(_) => moments::MomentAccumulator::state_fields(),
        Native::RetractSumInt | Native::RetractSumUInt => {
            retract::RetractSumInt::<arrow::datatypes::Int64Type>::state_fields(&out_type)
        }
        Native::CountedMin | Native::CountedMax => extreme::CountedExtreme::state_fields(),
    })
}

/// Row `i` counts when the filter is true and every argument is non-null.
pub(crate) fn row_mask(args: &[ArrayRef], filter: Option<&BooleanArray>) -> Option<Vec<bool>> {
    let has_nulls = args.iter().any(|a| a.null_count() > 0);
    let filtered = filter.is_some_and(|f| f.null_count() > 0 || f.true_count() != f.len());
    if !has_nulls && !filtered {
        return None;
    }
    let n = args.first().map(|a| a.len()).or(filter.map(|f| f.len()))?;
    let mut mask = vec![true; n];
    for a in args {
        if let Some(nulls) = a.logical_nulls() {
            for (m, valid) in mask.iter_mut().zip(nulls.iter()) {
                *m &= valid;
            }
        }
    }
    if let Some(f) = filter {
        for (i, m) in mask.iter_mut().enumerate() {
            *m &= f.is_valid(i) && f.value(i);
        }
    }
    Some(mask)
}
