//! # ubik-testkit
//!
//! What ubik's tests share, so each piece is written once: the order event
//! generator ([`events`]), the DataFusion one-shot oracle ([`oracle`]), the
//! fold of a changelog into latest-per-key state and its tolerant comparison
//! with the oracle ([`changelog`]), and an in-memory source and sink
//! ([`fakes`]). A dev-dependency only; never published.

pub mod changelog;
pub mod events;
pub mod fakes;
pub mod oracle;

pub use changelog::{State, assert_matches, close, fold, fold_lines};
pub use events::{ORDERS, Orders, Rng, TAGGED_ORDERS, orders_schema};
pub use oracle::{oracle, oracle_rows, oracle_tables, read_jsonl};

/// Runs `body` on a thread of its own and returns its result; fails the
/// test if it has not finished within `limit` (a hang becomes a failure
/// instead of a stuck suite). A panic in `body` is passed on.
#[track_caller]
pub fn within<T: Send + 'static>(
    limit: std::time::Duration,
    what: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = done.send(body());
    });
    match finished.recv_timeout(limit) {
        Ok(v) => {
            let _ = thread.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("{what}: the body ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {limit:?}")
        }
    }
}
