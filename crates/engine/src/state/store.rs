//! The engine's handle on the state store ([`ubik_state`]): where the keyed
//! state that does not fit the memory budget, and every checkpoint's
//! changes, are written. One store per query, shared by its operators.
//!
//! A store in a checkpoint directory is opened up front (it holds the
//! checkpoints' state); a spill-only store is made in a temporary
//! directory the first time state is spilled, and deleted with the query.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use ubik_state::{StateStore, StoreOptions};

use crate::error::{EngineError, Result};

enum Slot {
    Open(Box<StateStore>),
    /// Not opened yet: a temporary store under this directory (the system's if `None`).
    Temporary(Option<PathBuf>, StoreOptions),
    Failed,
}

/// A query's state store, shared by its operators.
#[derive(Clone)]
pub struct SharedStore {
    slot: Arc<Mutex<Slot>>,
    durable: bool,
    held_rows_limit: usize,
}

/// Rows an operator holds for the watermark go to a durable store at a
/// checkpoint once those not in it yet reach this size (or an eighth of
/// the memory budget, if smaller); below it a checkpoint holds them whole.
pub const HELD_ROWS_LIMIT: usize = 64 << 10;

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("durable", &self.durable)
            .finish()
    }
}

impl SharedStore {
    /// A store whose runs outlive the process: checkpoints refer to them.
    pub fn durable(store: StateStore) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Slot::Open(Box::new(store)))),
            durable: true,
            held_rows_limit: HELD_ROWS_LIMIT,
        }
    }

    /// A store for spilled state only, made on first use.
    pub fn temporary(parent: Option<PathBuf>, options: StoreOptions) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Slot::Temporary(parent, options))),
            durable: false,
            held_rows_limit: HELD_ROWS_LIMIT,
        }
    }

    /// Whether checkpoints keep their keyed state in this store (rather
    /// than whole in the checkpoint).
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// This handle, with held rows logged from `bytes` on (see
    /// [`HELD_ROWS_LIMIT`]).
    pub fn with_held_rows_limit(mut self, bytes: usize) -> Self {
        self.held_rows_limit = bytes;
        self
    }

    /// From what size held rows go to a durable store at a checkpoint.
    pub fn held_rows_limit(&self) -> usize {
        self.held_rows_limit
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        // A panic while holding the lock leaves nothing half-done that
        // another user could see: every store call is all-or-nothing.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the store, opening a temporary one first if needed.
    pub fn with<R>(&self, f: impl FnOnce(&mut StateStore) -> Result<R>) -> Result<R> {
        let mut slot = self.lock();
        if let Slot::Temporary(..) = &*slot {
            let Slot::Temporary(parent, options) = std::mem::replace(&mut *slot, Slot::Failed)
            else {
                unreachable!("matched above")
            };
            *slot = Slot::Open(Box::new(StateStore::temporary(parent.as_deref(), options)?));
        }
        match &mut *slot {
            Slot::Open(store) => f(store),
            _ => Err(EngineError::internal(
                "the state store could not be opened before",
            )),
        }
    }

    /// Runs `f` on the store if it is open (a temporary store not yet
    /// needed is not made).
    pub fn if_open<R>(&self, f: impl FnOnce(&mut StateStore) -> R) -> Option<R> {
        match &mut *self.lock() {
            Slot::Open(store) => Some(f(store)),
            _ => None,
        }
    }
}
