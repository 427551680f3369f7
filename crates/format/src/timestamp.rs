//! Timestamps in input records: RFC 3339 strings (`2026-11-29T15:01:00.123Z`,
//! with an offset, a space for `T`, or a date alone) or epoch milliseconds
//! (a JSON number or a digit string), or another unit where the source says
//! ([`EpochUnit`]). The parser lives in
//! `ubik_connector::time` (the Kafka connector parses start/end bounds with it too).

pub use ubik_connector::time::{EpochUnit, parse_timestamp_micros, parse_timestamp_micros_in};
