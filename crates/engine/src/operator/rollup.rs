//! A join side's second aggregation over closed windows ([`Rollup`]). It
//! runs once per firing on the windows that firing closed, with a fresh
//! continuous aggregation that folds them all at one grid point: each group
//! (a window, with the rollup's other keys) is emitted once, complete.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use super::ChangeBatch;
use super::continuous::ContinuousOperator;
use super::emit::Emitter;
use super::{Operator, Output, StampedBatch};
use crate::error::Result;
use crate::plan::{QueryOptions, Rollup};
use crate::time::MAX_TIME;

/// The rollup of `closed` (result rows of the windows one firing closed),
/// as rows of `output` with their windows' end times.
pub fn roll_up(
    rollup: &Rollup,
    options: &QueryOptions,
    output: &SchemaRef,
    closed: Vec<ChangeBatch>,
) -> Result<Vec<ChangeBatch>> {
    if closed.iter().all(|c| c.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let emitter = Emitter::new(&rollup.plan, Arc::clone(output), rollup.key_columns.clone());
    let mut op = ContinuousOperator::new(
        &rollup.plan,
        options,
        emitter,
        Arc::clone(&rollup.input_schema),
        None,
    )?;
    let mut out = Output::default();
    for c in closed {
        let n = c.num_rows();
        op.process_batch(
            StampedBatch {
                partition: 0,
                batch: c.rows,
                times: c.timestamps.values().to_vec(),
                // One stamp: every row folds in at the same grid point.
                stamps: vec![0; n],
                origin: (0..n as u32).collect(),
            },
            &mut out,
        )?;
    }
    op.handle_watermark(MAX_TIME, &mut out)?;
    Ok(out.changes)
}
