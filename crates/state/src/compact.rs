//! Background compaction: merges a table's runs so that lookups probe few
//! of them, on a thread of its own, off the hot path.
//!
//! Policy (size-tiered, fan-in [`FAN_IN`]): a run's tier is the log base
//! [`FAN_IN`] of its size. Runs are kept newest first, and only a
//! contiguous stretch of them is ever merged (so "the newest run wins"
//! keeps meaning the same). When [`FAN_IN`] neighbouring runs share a
//! tier they are merged into one run of the next tier. Each row is
//! rewritten about log_F(state / checkpoint delta) times over its life,
//! and a table holds at most about F-1 runs per tier.
//!
//! The merged run replaces its inputs in the table when the job is done;
//! the input files stay on disk while a kept checkpoint names them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use arrow::datatypes::SchemaRef;

use crate::error::{Result, StateError};
use crate::merge::{Expiry, Merge};
use crate::run::{Run, RunFile, RunWriter};

/// How many runs of one tier are merged at once.
pub const FAN_IN: usize = 4;
/// Runs below this size are all tier 0.
const TIER_BASE: u64 = 256 * 1024;

fn tier(bytes: u64) -> u32 {
    let mut t = 0;
    let mut size = TIER_BASE;
    while bytes >= size * FAN_IN as u64 {
        size *= FAN_IN as u64;
        t += 1;
    }
    t
}

/// The stretch of `runs` (newest first, by their bytes) to merge next:
/// the newest [`FAN_IN`] neighbours of one tier, if any.
pub fn pick(runs: &[u64]) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    while start < runs.len() {
        let t = tier(runs[start]);
        let mut end = start + 1;
        while end < runs.len() && tier(runs[end]) == t {
            end += 1;
        }
        if end - start >= FAN_IN {
            return Some(start..start + FAN_IN);
        }
        start = end;
    }
    None
}

/// A merge running on its own thread.
pub struct Job {
    pub table: usize,
    /// Names of the merged runs, newest first.
    pub inputs: Vec<String>,
    /// The run it writes (protected from deletion while it runs).
    pub output: String,
    dir: PathBuf,
    cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<Option<RunFile>>>>,
}

/// What a finished job hands back.
pub struct Done {
    pub table: usize,
    pub inputs: Vec<String>,
    pub output: Option<RunFile>,
}

impl Job {
    /// Starts merging `runs` (newest first) of table `table` into run `output` in `dir`.
    pub fn start(
        dir: PathBuf,
        table: usize,
        runs: Vec<Arc<Run>>,
        bottom: bool,
        expiry: Option<Expiry>,
        output: String,
        sync: bool,
    ) -> Result<Job> {
        let values = Arc::clone(runs[0].values());
        let cancel = Arc::new(AtomicBool::new(false));
        let inputs = runs.iter().map(|r| r.name.clone()).collect();
        let flag = Arc::clone(&cancel);
        let name = output.clone();
        let job_dir = dir.clone();
        let handle = std::thread::Builder::new()
            .name("ubik-compact".into())
            .spawn(move || {
                let file = merge_into(&dir, &name, &runs, bottom, expiry, values, &flag)?;
                // A durable store's checkpoints name it without syncing it again.
                if sync && let Some(f) = &file {
                    f.sync(&dir)?;
                }
                Ok(file)
            })
            .map_err(|e| StateError::Io {
                action: "start a compaction thread for",
                path: PathBuf::from(&output),
                source: e,
            })?;
        Ok(Job {
            table,
            inputs,
            output,
            dir: job_dir,
            cancel,
            handle: Some(handle),
        })
    }

    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Waits for the job and returns its result.
    pub fn join(mut self) -> Result<Done> {
        let handle = self.handle.take().expect("joined once");
        let output = handle
            .join()
            .map_err(|_| StateError::Missing("the compaction thread panicked".into()))??;
        Ok(Done {
            table: self.table,
            inputs: std::mem::take(&mut self.inputs),
            output,
        })
    }
}

impl Drop for Job {
    /// Stops and waits for the thread: a job never outlives its store.
    /// A merged run never installed is deleted.
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.cancel.store(true, Ordering::Relaxed);
            if let Ok(Ok(Some(file))) = h.join() {
                for f in crate::run::file_names(&file.name) {
                    let _ = std::fs::remove_file(self.dir.join(f));
                }
            }
        }
    }
}

/// Merges `runs` into run `name`; tombstones go when `bottom` (no older
/// run can hold their keys), expired rows always. `None` when cancelled
/// or nothing is left.
fn merge_into(
    dir: &std::path::Path,
    name: &str,
    runs: &[Arc<Run>],
    bottom: bool,
    expiry: Option<Expiry>,
    values: SchemaRef,
    cancel: &AtomicBool,
) -> Result<Option<RunFile>> {
    let expected: u64 = runs.iter().map(|r| r.rows).sum();
    let mut writer = RunWriter::create(dir, name, &values, expected as usize)?;
    let mut merge = Merge::new(runs, !bottom, expiry, values)?;
    while let Some(batch) = merge.next_batch()? {
        if cancel.load(Ordering::Relaxed) {
            drop(writer);
            for f in crate::run::file_names(name) {
                let _ = std::fs::remove_file(dir.join(f));
            }
            return Ok(None);
        }
        writer.push(&batch.keys, &batch.deleted, &batch.values)?;
    }
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_full_tier() {
        let kb = 1024;
        assert_eq!(pick(&[10 * kb, 10 * kb, 10 * kb]), None);
        assert_eq!(pick(&[10 * kb; 5]), Some(0..4));
        // A big old run does not join the small ones.
        assert_eq!(pick(&[kb, kb, kb, kb, 100_000 * kb]), Some(0..4));
        assert_eq!(
            pick(&[
                kb,
                2 * 1024 * kb,
                2 * 1024 * kb,
                2 * 1024 * kb,
                2 * 1024 * kb
            ]),
            Some(1..5)
        );
    }
}
