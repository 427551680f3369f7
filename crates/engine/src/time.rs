//! Event time arithmetic. Inside the engine every instant is `i64`
//! microseconds since the Unix epoch (UTC), the unit of the window column.

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::{DataType, IntervalMonthDayNano, TimeUnit, TimestampMicrosecondType};
use std::sync::Arc;

use crate::error::{EngineError, Result};

/// The smallest instant: "no event seen yet".
pub const MIN_TIME: i64 = i64::MIN;
/// The largest instant: "the input has ended".
pub const MAX_TIME: i64 = i64::MAX;

pub use ubik_connector::time::{
    MICROS_PER_SECOND, civil_from_days, days_from_civil, parse_duration, parse_rfc3339,
    parse_timestamp_micros, write_rfc3339_micros,
};

/// The data type of every window column and of event time inside the engine.
pub fn window_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Converts a duration literal of SQL (`INTERVAL '1 MINUTE'`) to microseconds.
/// Months have no fixed length, so they are refused.
pub fn interval_micros(v: &IntervalMonthDayNano, what: &str) -> Result<i64> {
    if v.months != 0 {
        return Err(EngineError::unsupported(
            format!("{what} is given in months or years, which have no fixed length"),
            "use days, hours, minutes or seconds, e.g. INTERVAL '30 DAYS'",
        ));
    }
    let micros = (v.days as i64) * 86_400 * MICROS_PER_SECOND + v.nanoseconds / 1000;
    if micros <= 0 {
        return Err(EngineError::unsupported(
            format!("{what} must be a positive duration"),
            "",
        ));
    }
    Ok(micros)
}

/// Casts a timestamp array of any unit to microseconds since the epoch.
/// Other types are refused: event time must be a timestamp column.
pub fn to_micros(array: &ArrayRef) -> Result<Int64Array> {
    let scale = |a: &ArrayRef, mul: i64, div: i64| -> Int64Array {
        let p = a.as_primitive::<arrow::datatypes::Int64Type>();
        arrow::compute::kernels::arity::unary(p, |v| {
            if div > 1 {
                v.div_euclid(div)
            } else {
                v.saturating_mul(mul)
            }
        })
    };
    match array.data_type() {
        DataType::Timestamp(unit, _) => {
            let raw = arrow::compute::cast(array, &DataType::Int64)?;
            Ok(match unit {
                TimeUnit::Second => scale(&raw, MICROS_PER_SECOND, 1),
                TimeUnit::Millisecond => scale(&raw, 1000, 1),
                TimeUnit::Microsecond => raw.as_primitive::<arrow::datatypes::Int64Type>().clone(),
                TimeUnit::Nanosecond => scale(&raw, 1, 1000),
            })
        }
        other => Err(EngineError::Schema(format!(
            "event time must be a TIMESTAMP, found {other}"
        ))),
    }
}

/// Wraps microsecond values as the window column type.
pub fn micros_array(values: Vec<i64>) -> ArrayRef {
    Arc::new(
        arrow::array::PrimitiveArray::<TimestampMicrosecondType>::from(values).with_timezone("UTC"),
    )
}

/// `floor(t / step) * step`, correct for negative instants too.
#[inline]
pub fn floor_to(t: i64, step: i64) -> i64 {
    t - t.rem_euclid(step)
}

/// The first multiple of `step` strictly greater than `t`, saturating at [`MAX_TIME`].
#[inline]
pub fn next_tick(t: i64, step: i64) -> i64 {
    if t == MAX_TIME {
        return MAX_TIME;
    }
    let next = ((t as i128).div_euclid(step as i128) + 1) * step as i128;
    next.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Reads a non-null value out of an `Int64Array` built by [`to_micros`].
#[inline]
pub fn value_or_none(a: &Int64Array, i: usize) -> Option<i64> {
    a.is_valid(i).then(|| a.value(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks() {
        assert_eq!(floor_to(-1, 10), -10);
        assert_eq!(next_tick(10, 10), 20);
        assert_eq!(next_tick(9, 10), 10);
        assert_eq!(next_tick(MAX_TIME, 10), MAX_TIME);
        assert!(next_tick(MIN_TIME, 1_000_000) > MIN_TIME);
        assert_eq!(parse_duration("250ms"), Some(250_000));
        assert_eq!(parse_duration("2h"), Some(7_200_000_000));
        assert_eq!(parse_duration("x"), None);
    }
}
