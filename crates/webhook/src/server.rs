//! The HTTP endpoint and the group-commit writer.
//!
//! Handlers validate and split a request, then hand its events to the
//! writer thread and wait. The writer takes every request queued at that
//! moment, appends them as one batch, fsyncs once, and answers them all:
//! concurrent requests share an fsync (group commit). A 2xx is sent only
//! after that fsync.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info};

use crate::auth::verify;
use crate::body::{Reject, check_content_type, decode, split_events};
use crate::buffer::{Event, Shared, Writer};
use crate::config::WebhookConfig;
use crate::dedupe::SeenIds;
use crate::error::Error;
use crate::metrics::Metrics;

struct Append {
    events: Vec<Event>,
    reply: oneshot::Sender<Result<(), String>>,
}

pub struct AppState {
    config: WebhookConfig,
    shared: Arc<Shared>,
    /// `None` once the server shuts down, which lets the writer finish.
    appends: Mutex<Option<mpsc::UnboundedSender<Append>>>,
    pub accepting: AtomicBool,
    /// Bytes handed to the writer and not yet appended.
    inflight: AtomicU64,
    pub metrics: Metrics,
    /// Event ids stored within `dedupe_window`, for `dedupe`.
    seen: Mutex<SeenIds>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn json_response(status: u16, body: serde_json::Value, retry_after: Option<u32>) -> Response {
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
    json_response(
        r.status,
        serde_json::json!({"error": r.message, "reason": r.reason}),
        retry,
    )
}

/// Extracts the dedupe id (a top-level string or number field) of an event.
fn event_id(payload: &[u8], field: &str) -> Option<String> {
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(payload).ok()?;
    match v.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

async fn ingest(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
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
    let ranges = match split_events(payload) {
        Ok(r) => r,
        Err(r) => return refuse(&state, r),
    };
    let received_ms = now_ms();
    let mut events = Vec::with_capacity(ranges.len());
    let mut duplicates = 0u64;
    {
        let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
        for r in ranges {
            let bytes = &payload[r];
            let id = state
                .config
                .dedupe
                .as_deref()
                .and_then(|f| event_id(bytes, f));
            if let Some(id) = &id
                && !seen.insert(id, received_ms)
            {
                duplicates += 1;
                continue;
            }
            events.push(Event {
                received_ms,
                payload: bytes.to_vec(),
                event_id: id,
            });
        }
    }
    let n = events.len() as u64;
    let bytes: u64 = events.iter().map(|e| e.payload.len() as u64).sum();
    let depth = state
        .shared
        .index
        .lock()
        .map(|i| i.unread_bytes())
        .unwrap_or(0);
    if depth + state.inflight.load(Ordering::Relaxed) + bytes > state.config.max_buffer_bytes {
        forget(&state, &events);
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
        let result = match sender.map(|s| s.send(Append { events, reply: tx })) {
            Some(Ok(())) => rx
                .await
                .unwrap_or_else(|_| Err("the buffer writer stopped".into())),
            Some(Err(mpsc::error::SendError(a))) => {
                forget(&state, &a.events);
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
fn forget(state: &AppState, events: &[Event]) {
    let mut seen = state.seen.lock().unwrap_or_else(|p| p.into_inner());
    for e in events {
        if let Some(id) = &e.event_id {
            seen.forget(id);
        }
    }
}

async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    if state.accepting.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let depth = state
        .shared
        .index
        .lock()
        .map(|i| (i.unread_rows(), i.unread_bytes()))
        .unwrap_or((0, 0));
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(depth),
    )
        .into_response()
}

/// The running server: its runtime, serve task and writer thread, all
/// stopped and joined on [`Server::shutdown`] (or drop).
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    serve: Option<tokio::task::JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    writer: Option<std::thread::JoinHandle<()>>,
    pub state: Arc<AppState>,
    pub local_addr: SocketAddr,
}

impl Server {
    pub fn start(
        config: WebhookConfig,
        shared: Arc<Shared>,
        mut writer: Writer,
    ) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ubik-webhook")
            .enable_all()
            .build()?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Append>();
        let known = shared
            .index
            .lock()
            .map(|i| i.event_ids())
            .unwrap_or_default();
        let seen = SeenIds::new(config.dedupe_window, known);
        let state = Arc::new(AppState {
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
                    let events: Vec<Event> = group
                        .iter_mut()
                        .flat_map(|a| std::mem::take(&mut a.events))
                        .collect();
                    let result = writer.append(&events);
                    if let Ok((_, fsync)) = &result {
                        writer_state.metrics.fsync(*fsync);
                        writer_state
                            .metrics
                            .group_commits
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    for a in group {
                        let _ = a
                            .reply
                            .send(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                    }
                    if let Err(e) = result {
                        error!("webhook buffer append failed: {e}");
                    }
                }
                if let Err(e) = writer.close() {
                    error!("closing the webhook buffer: {e}");
                }
            })?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&config.bind))
            .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", config.bind)))?;
        let local_addr = listener.local_addr()?;
        // Replies are small: without TCP_NODELAY, Nagle and delayed ACKs
        // hold some of them back for tens of milliseconds.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
        });
        let app = Router::new()
            .route(&config.path, post(ingest))
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&state));
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let serve = runtime.spawn(async move {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                error!("webhook server: {e}");
            }
        });
        info!(
            "webhook endpoint listening on http://{local_addr}{}",
            config.path
        );
        Ok(Self {
            runtime: Some(runtime),
            serve: Some(serve),
            stop: Some(stop_tx),
            writer: Some(writer),
            state,
            local_addr,
        })
    }

    /// Stops accepting (new requests get 503) but keeps serving.
    pub fn stop_accepting(&self) {
        self.state.accepting.store(false, Ordering::Relaxed);
    }

    /// Stops the server and the writer, waiting for both.
    pub fn shutdown(&mut self) {
        self.stop_accepting();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let (Some(rt), Some(serve)) = (self.runtime.as_ref(), self.serve.take()) {
            let _ = rt.block_on(serve);
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
        // With the sender gone the writer appends what is queued, seals the
        // segment and exits.
        if let Ok(mut s) = self.state.appends.lock() {
            s.take();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}
