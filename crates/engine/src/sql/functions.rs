//! The window functions of ubik's SQL: `TUMBLE(ts, size)`, `HOP(ts, slide, size)`,
//! `SESSION(ts, gap)` and `WINDOW_END(<window>)`; and the ranking functions
//! of `OVER (...)` ([`ranking_udwfs`]), planned only (a top-N runs them).
//!
//! They are scalar UDFs only so that DataFusion can plan them (types, names,
//! GROUP BY resolution); the streaming planner recognises them in `GROUP BY`
//! and the window operators assign rows to windows. Evaluated anywhere else
//! they fail with a message that says where they belong.

use std::sync::Arc;

use arrow::datatypes::{DataType, IntervalUnit};
use datafusion_common::{Result, plan_err};
use datafusion_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::time::window_type;

/// Which window a grouping function defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowFunction {
    Tumble,
    Hop,
    Session,
}

impl WindowFunction {
    pub fn name(self) -> &'static str {
        match self {
            WindowFunction::Tumble => "tumble",
            WindowFunction::Hop => "hop",
            WindowFunction::Session => "session",
        }
    }
    fn arity(self) -> usize {
        match self {
            WindowFunction::Hop => 3,
            _ => 2,
        }
    }
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "tumble" => Some(WindowFunction::Tumble),
            "hop" => Some(WindowFunction::Hop),
            "session" => Some(WindowFunction::Session),
            _ => None,
        }
    }
    fn usage(self) -> &'static str {
        match self {
            WindowFunction::Tumble => "TUMBLE(event_time, INTERVAL '1 MINUTE')",
            WindowFunction::Hop => {
                "HOP(event_time, INTERVAL '1 MINUTE' /* slide */, INTERVAL '5 MINUTES' /* size */)"
            }
            WindowFunction::Session => "SESSION(event_time, INTERVAL '30 MINUTES' /* gap */)",
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowUdf {
    kind: WindowFunction,
    signature: Signature,
}

impl ScalarUDFImpl for WindowUdf {
    fn name(&self) -> &str {
        self.kind.name()
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(window_type())
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != self.kind.arity() {
            return plan_err!(
                "{} takes {} arguments, found {}; usage: {}",
                self.kind.name().to_uppercase(),
                self.kind.arity(),
                arg_types.len(),
                self.kind.usage()
            );
        }
        let mut out = Vec::with_capacity(arg_types.len());
        match &arg_types[0] {
            t @ DataType::Timestamp(_, _) => out.push(t.clone()),
            other => {
                return plan_err!(
                    "the first argument of {} must be a TIMESTAMP column (the event time), found {other}; usage: {}",
                    self.kind.name().to_uppercase(),
                    self.kind.usage()
                );
            }
        }
        for t in &arg_types[1..] {
            match t {
                DataType::Interval(_) | DataType::Duration(_) => {
                    out.push(DataType::Interval(IntervalUnit::MonthDayNano))
                }
                other => {
                    return plan_err!(
                        "the duration arguments of {} must be INTERVAL literals, found {other}; usage: {}",
                        self.kind.name().to_uppercase(),
                        self.kind.usage()
                    );
                }
            }
        }
        Ok(out)
    }
    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        plan_err!(
            "{} defines a window and can only be used in GROUP BY (and projected in SELECT); usage: {}",
            self.kind.name().to_uppercase(),
            self.kind.usage()
        )
    }
}

/// `WINDOW_END(TUMBLE(ts, ...))`: the exclusive end of the window of the row.
#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowEndUdf {
    signature: Signature,
}

pub const WINDOW_END: &str = "window_end";

impl ScalarUDFImpl for WindowEndUdf {
    fn name(&self) -> &str {
        WINDOW_END
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(window_type())
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [t @ DataType::Timestamp(_, _)] => Ok(vec![t.clone()]),
            _ => plan_err!(
                "WINDOW_END takes the window expression of the GROUP BY, e.g. WINDOW_END(TUMBLE(ts, INTERVAL '1 MINUTE'))"
            ),
        }
    }
    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        plan_err!(
            "WINDOW_END can only be applied to the window of the GROUP BY, e.g. WINDOW_END(TUMBLE(ts, INTERVAL '1 MINUTE'))"
        )
    }
}

/// All of ubik's own scalar functions, to register beside DataFusion's.
pub fn window_udfs() -> Vec<Arc<ScalarUDF>> {
    let mut out: Vec<Arc<ScalarUDF>> = [
        WindowFunction::Tumble,
        WindowFunction::Hop,
        WindowFunction::Session,
    ]
    .into_iter()
    .map(|kind| {
        Arc::new(ScalarUDF::new_from_impl(WindowUdf {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }))
    })
    .collect();
    out.push(Arc::new(ScalarUDF::new_from_impl(WindowEndUdf {
        signature: Signature::user_defined(Volatility::Immutable),
    })));
    out
}

/// `ROW_NUMBER()`, `RANK()` and `DENSE_RANK()`, known to the planner so a
/// top-N plans (`ROW_NUMBER`, run by the rank operator) and the other two
/// are refused by name rather than as unknown functions.
pub fn ranking_udwfs() -> Vec<Arc<datafusion_expr::WindowUDF>> {
    ["row_number", "rank", "dense_rank"]
        .into_iter()
        .map(|name| {
            Arc::new(datafusion_expr::WindowUDF::new_from_impl(RankingFunction {
                name,
                signature: Signature::nullary(Volatility::Immutable),
            }))
        })
        .collect()
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct RankingFunction {
    name: &'static str,
    signature: Signature,
}

impl datafusion_expr::WindowUDFImpl for RankingFunction {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn partition_evaluator(
        &self,
        _args: datafusion_expr::function::PartitionEvaluatorArgs,
    ) -> Result<Box<dyn datafusion_expr::PartitionEvaluator>> {
        plan_err!(
            "{}() runs only as a streaming top-N (the rank operator)",
            self.name
        )
    }
    fn field(
        &self,
        args: datafusion_expr::function::WindowUDFFieldArgs,
    ) -> Result<arrow::datatypes::FieldRef> {
        Ok(Arc::new(arrow::datatypes::Field::new(
            args.name(),
            DataType::UInt64,
            false,
        )))
    }
}
