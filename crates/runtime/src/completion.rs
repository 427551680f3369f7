//! A checkpoint's completion, off the pipeline's thread.
//!
//! [`Pipeline::checkpoint`](crate::Pipeline::checkpoint) freezes the state
//! on the pipeline's thread: the operators hand what changed to the state
//! store, which serves it from memory at once, and the snapshot names the
//! store's runs. Everything that waits on a disk or a broker happens here,
//! on a thread of its own, while the pipeline reads on:
//!
//! 1. the store's runs are written and synced ([`Durability::wait`]);
//! 2. the checkpoint's files are written and made current, and saved to
//!    the replica (a group's state topic);
//! 3. files no kept checkpoint names are deleted.
//!
//! Only then is the checkpoint current: a crash before that resumes from
//! the previous one and re-emits the same bytes. The pipeline commits its
//! sources (purging consumed records, releasing a webhook's buffer) when it
//! collects the completion, never before. One checkpoint completes at a
//! time: the next one waits for this one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use ubik_engine::ubik_state::Durability;
use ubik_engine::{ChangeBatch, QuerySnapshot, SharedStore};

use crate::changes::encode_changes;
use crate::checkpoint::{CheckpointStore, Manifest};
use crate::error::{Result, RuntimeError};

/// What the pipeline's thread froze, to make durable.
pub(crate) struct Frozen {
    pub snapshot: QuerySnapshot,
    pub durability: Option<Durability>,
    /// The manifest, but for the byte counts only known once written.
    pub manifest: Manifest,
    /// Output handed out but not committed by the host, kept with it.
    pub pending: Vec<ChangeBatch>,
    pub output_schema: SchemaRef,
    /// The query's store, whose unreferenced files go at the end.
    pub state: Option<SharedStore>,
    /// Bytes of the store's files when frozen.
    pub state_disk: u64,
}

/// A completed checkpoint's figures.
pub(crate) struct Completed {
    pub manifest: Manifest,
    pub state_bytes: usize,
    /// When it became current (the pipeline may look later).
    pub at: Instant,
}

type Outcome = (CheckpointStore, Result<Completed>);

/// A checkpoint being completed.
pub(crate) struct InFlight {
    work: Work,
    pub started: Instant,
    /// How long the pipeline's thread was held: waiting for the previous
    /// checkpoint to complete, then the freeze.
    pub pause_ms: f64,
    /// The freeze's part of the pause.
    pub freeze_ms: f64,
    /// The source positions it records.
    pub position: serde_json::Value,
}

enum Work {
    Running(JoinHandle<Outcome>),
    /// No thread could be started: the store, and why.
    NotStarted(Box<Outcome>),
}

impl InFlight {
    /// Completes `frozen` (taken from `started` on, after `waited` for
    /// the previous checkpoint) into `store` on a thread of its own.
    pub fn start(
        store: CheckpointStore,
        frozen: Frozen,
        started: Instant,
        waited: std::time::Duration,
    ) -> Self {
        let position = frozen.manifest.source.clone();
        let freeze_ms = started.elapsed().as_secs_f64() * 1e3;
        let pause_ms = freeze_ms + waited.as_secs_f64() * 1e3;
        // The store comes back even if no thread starts (the closure that
        // owns it is then dropped unrun).
        let slot = Arc::new(Mutex::new(Some(store)));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("ubik-checkpoint".into())
            .spawn(move || {
                let mut store = take(&theirs);
                let result = complete(&mut store, frozen);
                (store, result)
            });
        let work = match spawned {
            Ok(handle) => Work::Running(handle),
            Err(e) => Work::NotStarted(Box::new((
                take(&slot),
                Err(RuntimeError::Checkpoint(format!(
                    "cannot start a checkpoint thread: {e}"
                ))),
            ))),
        };
        Self {
            work,
            started,
            pause_ms,
            freeze_ms,
            position,
        }
    }

    pub fn is_finished(&self) -> bool {
        match &self.work {
            Work::Running(h) => h.is_finished(),
            Work::NotStarted(_) => true,
        }
    }

    /// Waits for the completion; the store comes back either way.
    pub fn join(self) -> Outcome {
        match self.work {
            Work::Running(h) => h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Work::NotStarted(outcome) => *outcome,
        }
    }
}

fn take(slot: &Mutex<Option<CheckpointStore>>) -> CheckpointStore {
    slot.lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .expect("the store is taken once")
}

fn complete(store: &mut CheckpointStore, frozen: Frozen) -> Result<Completed> {
    let Frozen {
        snapshot,
        durability,
        mut manifest,
        pending,
        output_schema,
        state,
        state_disk,
    } = frozen;
    let runs_written = match durability {
        Some(d) => d.wait().map_err(ubik_engine::EngineError::from)?,
        None => 0,
    };
    let engine_state = snapshot.encode()?;
    let pending = match pending.is_empty() {
        true => None,
        false => Some(encode_changes(&output_schema, &pending)?),
    };
    manifest.state_bytes = engine_state.len() as u64 + state_disk;
    manifest.bytes_written =
        engine_state.len() as u64 + pending.as_ref().map_or(0, |p| p.len() as u64) + runs_written;
    store.write(&manifest, &engine_state, pending.as_deref())?;
    store.truncate_idle(manifest.epoch + 1)?;
    if let Some(state) = state.filter(|_| !manifest.state_runs.is_empty() || state_disk > 0) {
        let pinned: BTreeSet<String> = store.pinned_runs()?;
        state
            .if_open(|s| s.retain(&pinned))
            .transpose()
            .map_err(ubik_engine::EngineError::from)?;
    }
    Ok(Completed {
        manifest,
        state_bytes: engine_state.len(),
        at: Instant::now(),
    })
}
