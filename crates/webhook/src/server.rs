//! The HTTP endpoint and the group-commit writer.
//!
//! Handlers validate and split a request, then decode its events into the
//! pipeline's schema with the pipeline's own decoder (decode at the door):
//! if any event is refused the request gets 400 naming the event, the field
//! and the reason, and nothing of it is stored. Otherwise the typed rows go
//! to the writer thread and the handler waits. The writer takes every
//! request queued at that moment, appends them as one batch, fsyncs once,
//! and answers them all: concurrent requests share an fsync (group commit).
//! A 2xx is sent only after that fsync, so an acknowledged event can never
//! fail decoding later. The HTTP listener itself, which several sources
//! may share, is in [`crate::listener`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot};
use tracing::error;
use ubik_connector::time::now_ms;

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};

use crate::auth::verify;
use crate::body::{Reject, check_content_type, decode};
use crate::buffer::{Rows, Shared, Writer};
use crate::config::WebhookConfig;
use crate::dedupe::SeenIds;
use crate::door::{Admitted, Door};
use crate::error::Error;
use crate::listener::{self, Listener};
use crate::metrics::Metrics;

struct Append {
    rows: Rows,
    reply: oneshot::Sender<Result<(), String>>,
}

pub struct AppState {
    config: WebhookConfig,
    pub(crate) shared: Arc<Shared>,
    /// `None` once the server shuts down, which lets the writer finish.
    appends: Mutex<Option<mpsc::UnboundedSender<Append>>>,
    pub accepting: AtomicBool,
    /// Bytes handed to the writer and not yet appended.
    inflight: AtomicU64,
    pub metrics: Metrics,
    /// Event ids stored within `dedupe_window`, for `dedupe`.
    seen: Mutex<SeenIds>,
    /// Splits and decodes requests into the pipeline's schema.
    door: Door,
    /// The column holding the dedupe id, when it is one of the schema's.
    dedupe_column: Option<usize>,
}

pub(crate) fn json_response(
    status: u16,
    body: serde_json::Value,
    retry_after: Option<u32>,
) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(s) = retry_after {
        r.headers_mut().insert("retry-after", HeaderValue::from(s));
    }
    r
}

fn refuse(state: &AppState, r: Reject) -> Response {
    state.metrics.reject(r.reason);
    state.metrics.request(r.status);
    let retry = matches!(r.status, 429 | 503).then_some(1);
    let mut body = serde_json::json!({"error": r.message, "reason": r.reason});
    if let (Some(serde_json::Value::Object(extra)), Some(obj)) = (r.detail, body.as_object_mut()) {
        obj.extend(extra);
    }
    json_response(r.status, body, retry)
}

/// Extracts the dedupe id (a top-level string or number field) of an event
/// whose id field is not a column of the schema (a JSON parse; only then).
fn event_id(payload: &[u8], field: &str) -> Option<String> {
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(payload).ok()?;
    match v.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The dedupe ids of decoded rows: read from the id column when the
/// schema has it, else from each event's JSON.
fn event_ids(state: &AppState, batch: &RecordBatch, events: &[&[u8]]) -> Vec<Option<String>> {
    let Some(field) = state.config.dedupe.as_deref() else {
        return Vec::new();
    };
    let Some(c) = state.dedupe_column else {
        return events.iter().map(|e| event_id(e, field)).collect();
    };
    let col = batch.column(c);
    if let Some(s) = col.as_string_opt::<i32>() {
        return s.iter().map(|v| v.map(str::to_string)).collect();
    }
    // Integers: the text of the number, as a JSON parse would give it.
    match arrow::compute::cast(col, &DataType::Utf8) {
        Ok(text) => text
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect(),
        Err(_) => vec![None; batch.num_rows()],
    }
}

/// Handles a POST to a source's path: split, verify, decode at the door,
/// append durably, acknowledge.
pub(crate) async fn ingest(state: Arc<AppState>, headers: HeaderMap, body: Body) -> Response {
    if !state.accepting.load(Ordering::Relaxed) {
        return refuse(
            &state,
            Reject::new(
                503,
                "shutting_down",
                "the pipeline is shutting down; retry later",
            ),
        );
    }
    if let Err(r) = check_content_type(&headers) {
        return refuse(&state, r);
    }
    let limit = state.config.max_body;
    let raw = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                &state,
                Reject::new(
                    413,
                    "too_large",
                    format!("body is larger than the {limit}-byte limit (max_body)"),
                ),
            );
        }
    };
    let decoded = match decode(&headers, &raw, limit) {
        Ok(d) => d,
        Err(r) => return refuse(&state, r),
    };
    let payload: &[u8] = decoded.as_deref().unwrap_or(&raw);
    if let Err(why) = verify(&state.config.auth, &headers, payload, SystemTime::now()) {
        return refuse(&state, Reject::new(401, "signature", why));
    }
    let Admitted { events, mut batch } = match state.door.admit(payload) {
        Ok(a) => a,
        Err(r) => return refuse(&state, r),
    };
    let mut sizes: Vec<u32> = events
        .iter()
        .map(|e| e.len().min(u32::MAX as usize) as u32)
        .collect();
    let received_ms = now_ms();
    let mut ids = event_ids(&state, &batch, &events);
    let mut duplicates = 0u64;
    if state.config.dedupe.is_some() {
        let mut keep = vec![true; ids.len()];
        let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
        for (i, id) in ids.iter().enumerate() {
            if let Some(id) = id
                && !seen.insert(id, received_ms)
            {
                keep[i] = false;
                duplicates += 1;
            }
        }
        drop(seen);
        if duplicates > 0 {
            let mask = BooleanArray::from(keep.clone());
            batch = match arrow::compute::filter_record_batch(&batch, &mask) {
                Ok(b) => b,
                Err(e) => {
                    forget(&state, &ids);
                    return refuse(&state, Reject::new(500, "dedupe", e.to_string()));
                }
            };
            let mut k = keep.iter();
            ids.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            sizes.retain(|_| *k.next().unwrap_or(&true));
        }
    }
    let n = batch.num_rows() as u64;
    let bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let depth = state
        .shared
        .index
        .lock()
        .map(|i| i.unread_bytes())
        .unwrap_or(0);
    if depth + state.inflight.load(Ordering::Relaxed) + bytes > state.config.max_buffer_bytes {
        forget(&state, &ids);
        return refuse(
            &state,
            Reject::new(
                429,
                "buffer_full",
                "the buffer is full (max_buffer_bytes): the pipeline is behind; retry later",
            ),
        );
    }
    if n > 0 {
        state.inflight.fetch_add(bytes, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let sender = state.appends.lock().ok().and_then(|s| s.clone());
        let rows = Rows {
            batch,
            sizes,
            event_ids: state.config.dedupe.is_some().then_some(ids),
            received_ms,
        };
        let result = match sender.map(|s| s.send(Append { rows, reply: tx })) {
            Some(Ok(())) => rx
                .await
                .unwrap_or_else(|_| Err("the buffer writer stopped".into())),
            Some(Err(mpsc::error::SendError(a))) => {
                forget(&state, a.rows.event_ids.as_deref().unwrap_or_default());
                Err("the buffer writer stopped".into())
            }
            None => Err("the endpoint is shutting down".into()),
        };
        state.inflight.fetch_sub(bytes, Ordering::Relaxed);
        if let Err(e) = result {
            return refuse(
                &state,
                Reject::new(
                    503,
                    "write_failed",
                    format!("could not persist the events: {e}"),
                ),
            );
        }
        state.metrics.events.fetch_add(n, Ordering::Relaxed);
        state.metrics.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    state
        .metrics
        .duplicates
        .fetch_add(duplicates, Ordering::Relaxed);
    state.metrics.request(200);
    json_response(
        200,
        serde_json::json!({"accepted": n, "duplicates": duplicates}),
        None,
    )
}

/// Un-remembers the ids of events that were not stored.
fn forget(state: &AppState, ids: &[Option<String>]) {
    let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
    for id in ids.iter().flatten() {
        seen.forget(id);
    }
}

/// A source's part of the endpoint: its path on the shared [`Listener`] and
/// its writer thread, detached and joined on [`Server::shutdown`] (or drop).
pub struct Server {
    listener: Option<Arc<Listener>>,
    writer: Option<std::thread::JoinHandle<()>>,
    path: String,
    pub state: Arc<AppState>,
    pub local_addr: SocketAddr,
}

impl Server {
    pub fn start(
        config: WebhookConfig,
        schema: SchemaRef,
        shared: Arc<Shared>,
        mut writer: Writer,
    ) -> Result<Self, Error> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Append>();
        let known = shared
            .index
            .lock()
            .map(|i| i.event_ids())
            .unwrap_or_default();
        let seen = SeenIds::new(config.dedupe_window, known);
        let dedupe_column = config.dedupe.as_deref().and_then(|f| {
            let i = schema.index_of(f).ok()?;
            let t = schema.field(i).data_type();
            (t.is_integer() || matches!(t, DataType::Utf8)).then_some(i)
        });
        let state = Arc::new(AppState {
            door: Door::new(schema),
            dedupe_column,
            config: config.clone(),
            shared,
            appends: Mutex::new(Some(tx)),
            accepting: AtomicBool::new(true),
            inflight: AtomicU64::new(0),
            metrics: Metrics::default(),
            seen: Mutex::new(seen),
        });
        let writer_state = Arc::clone(&state);
        let writer = std::thread::Builder::new()
            .name("ubik-webhook-writer".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut group = vec![first];
                    while let Ok(more) = rx.try_recv() {
                        group.push(more);
                    }
                    let (rows, replies): (Vec<Rows>, Vec<_>) =
                        group.into_iter().map(|a| (a.rows, a.reply)).unzip();
                    let result = writer.append(&rows);
                    if let Ok((_, fsync)) = &result {
                        writer_state.metrics.fsync(*fsync);
                        writer_state
                            .metrics
                            .group_commits
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    for reply in replies {
                        let _ = reply.send(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                    }
                    if let Err(e) = result {
                        error!("webhook buffer append failed: {e}");
                    }
                }
                if let Err(e) = writer.close() {
                    error!("closing the webhook buffer: {e}");
                }
            })?;
        let mut server = Self {
            listener: None,
            writer: Some(writer),
            path: config.path.clone(),
            state: Arc::clone(&state),
            local_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        // On a refusal `server` drops here, which stops the writer.
        let listener = listener::attach(&config.bind, &config.path, state)?;
        server.local_addr = listener.local_addr;
        server.listener = Some(listener);
        Ok(server)
    }

    /// Stops accepting (new requests get 503) but keeps serving.
    pub fn stop_accepting(&self) {
        self.state.accepting.store(false, Ordering::Relaxed);
    }

    /// Stops serving this path and stops the writer, waiting for it (and so
    /// for the requests it is appending); the listener stops with its last path.
    pub fn shutdown(&mut self) {
        self.stop_accepting();
        if let Some(l) = &self.listener {
            l.detach(&self.path);
        }
        // With the sender gone the writer appends what is queued (requests
        // in flight hold their own sender), seals the segment and exits.
        if let Ok(mut s) = self.state.appends.lock() {
            s.take();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        self.listener.take();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}
