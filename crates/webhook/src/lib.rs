//! # ubik-webhook
//!
//! `webhook://HOST:PORT/PATH` as a ubik source. An HTTP server (axum)
//! accepts POSTed JSON events (an object, an array, or NDJSON; gzip too),
//! verifies signatures, decodes them into the pipeline's schema with the
//! pipeline's own decoder ([`door`]: a refused event fails its whole
//! request with 400), and appends the typed rows to a durable Arrow IPC
//! buffer — fsynced, with concurrent requests sharing one fsync (group
//! commit) — before answering 2xx. The pipeline reads the buffer as Arrow
//! in right-sized batches (max rows, max bytes, max interval, whichever
//! comes first), parsing no JSON; segments are truncated once a checkpoint
//! covers them, and replayed after a restart. Nothing acknowledged is lost,
//! and nothing acknowledged can fail decoding later.

pub mod auth;
pub mod body;
pub mod buffer;
pub mod config;
pub mod dedupe;
pub mod door;
pub mod error;
pub mod listener;
pub mod metrics;
pub mod server;
pub mod source;

pub use config::WebhookConfig;
pub use error::Error;
pub use source::{BufferOwner, WebhookSource};
