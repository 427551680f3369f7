//! Failpoints: named places where a test can make the process die as if
//! killed with -9, to hit the narrow moments a random kill rarely does (in
//! the middle of a checkpoint's replication, between a transaction's commit
//! and its checkpoint).
//!
//! `UBIK_FAILPOINT=NAME:N` kills the process the `N`th time it reaches
//! [`hit`]`(NAME)`. Unset, a hit costs one load of a parsed-once setting.
//! The names in use:
//!
//! - `checkpoint-replica`: a replica's chunks are sent, its manifest is not;
//! - `after-commit`: the sink committed an epoch, its checkpoint is not written;
//! - `exchange-before-commit`: a first stage wrote an epoch's routed rows
//!   and progress into its exchange's transaction, which is not committed.
//!
//! A failpoint may also fail instead of killing ([`fails`]): the `N`th time
//! the place is reached it returns an error, as a broker's passing trouble
//! would. The names in use:
//!
//! - `replica-load`: reading a task's checkpoint from its replica meets a
//!   transient error.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("UBIK_FAILPOINT").ok()?;
            let (name, at) = spec.split_once(':').unwrap_or((&spec, "1"));
            Some(Armed {
                name: name.to_string(),
                at: at.parse().ok()?,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// True if the failpoint `name` is armed and this is its hit: the caller
/// then fails as it would on the error the failpoint stands for.
pub fn fails(name: &str) -> bool {
    armed().is_some_and(|a| a.name == name && a.hits.fetch_add(1, Ordering::Relaxed) + 1 == a.at)
}

/// Kills the process (-9) if the failpoint `name` is armed and this is its hit.
pub fn hit(name: &str) {
    if let Some(a) = armed()
        && a.name == name
        && a.hits.fetch_add(1, Ordering::Relaxed) + 1 == a.at
    {
        eprintln!("failpoint {name}: killing the process");
        // SIGKILL, as a test's kill would (abort could leave a core file).
        let _ = std::process::Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
}
