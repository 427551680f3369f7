//! What the repartitioning tests share: a first stage's routed rows handed
//! to the second stages, and every record as comparable text.

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use ubik_engine::{Output, Query};

/// xorshift: the same rows for the same seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every record as text: its columns, whether it deletes, its timestamp.
pub fn records(out: &Output, into: &mut Vec<String>) {
    for c in &out.changes {
        let rows = &c.rows;
        for i in 0..rows.num_rows() {
            let cols: Vec<String> = rows
                .columns()
                .iter()
                .map(|a| arrow::util::display::array_value_to_string(a, i).unwrap())
                .collect();
            let deleted = c.deletes.as_ref().is_some_and(|d| d.value(i));
            into.push(format!(
                "{cols:?} del={deleted} ts={}",
                c.timestamps.value(i)
            ));
        }
    }
}

/// Hands the rows a first stage routed from `batch` to their second
/// stages, as the repartition topic would, and collects what they emit;
/// returns the targets that got rows.
pub fn deliver(
    routed: &mut Output,
    batch: &RecordBatch,
    second: &mut [Query],
    got: &mut Vec<String>,
) -> Vec<u32> {
    let mut used = Vec::new();
    let mut out = Output::default();
    for r in routed.shuffled.drain(..) {
        for t in 0..second.len() as u32 {
            let pick: Vec<usize> = (0..r.rows.len()).filter(|&j| r.targets[j] == t).collect();
            if pick.is_empty() {
                continue;
            }
            used.push(t);
            let idx = UInt32Array::from_iter_values(pick.iter().map(|&j| r.rows[j]));
            let rows = take_record_batch(batch, &idx).unwrap();
            out.clear();
            second[t as usize]
                .process_given(
                    r.partition,
                    (r.leaf, r.deletion),
                    &rows,
                    pick.iter().map(|&j| r.times[j]).collect(),
                    pick.iter().map(|&j| r.stamps[j]).collect(),
                    &mut out,
                )
                .unwrap();
            records(&out, got);
        }
    }
    used
}
