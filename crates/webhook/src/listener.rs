//! One HTTP listener per address, shared by the webhook sources that bind it.
//!
//! Several paths on one port are several tables of one pipeline
//! (`webhook://0.0.0.0:8080/orders` and `.../payments`): the first source to
//! open an address binds it, the others add their path to its routes, and
//! the listener stops when the last of them closes. Each path keeps its own
//! auth, schema, buffer and writer (its [`AppState`]); the listener only
//! routes a request to the state of its path. `GET /healthz` and
//! `GET /metrics` cover every path (metrics carry a `path` label).
//!
//! Port 0 asks for a fresh port, so a source opened with it never shares.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::sync::oneshot;
use tracing::{error, info};

use crate::error::Error;
use crate::metrics;
use crate::server::{AppState, ingest, json_response};

/// The paths a listener serves, each with its source's state.
type Routes = RwLock<BTreeMap<String, Arc<AppState>>>;

/// The listeners of this process by bind address, alive while a source uses one.
static OPEN: LazyLock<Mutex<BTreeMap<String, Weak<Listener>>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// A bound address, its runtime and serve task; stopped and joined on drop.
pub struct Listener {
    runtime: Option<tokio::runtime::Runtime>,
    serve: Option<tokio::task::JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    routes: Arc<Routes>,
    bind: String,
    pub local_addr: SocketAddr,
}

/// Serves `path` with `state` on `bind`, binding it unless a source of this
/// process already did. Refuses a path another source serves there.
pub fn attach(bind: &str, path: &str, state: Arc<AppState>) -> Result<Arc<Listener>, Error> {
    let shared = !bind.ends_with(":0");
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    let existing = shared
        .then(|| open.get(bind).and_then(Weak::upgrade))
        .flatten();
    let listener = match existing {
        Some(l) => l,
        None => {
            let l = Arc::new(Listener::bind(bind)?);
            if shared {
                open.insert(bind.to_string(), Arc::downgrade(&l));
            }
            l
        }
    };
    let mut routes = listener.routes.write().unwrap_or_else(|p| p.into_inner());
    if routes.contains_key(path) {
        return Err(Error::Config(format!(
            "webhook://{bind}{path} is opened twice: another source of this process already serves that path; give each source its own path (webhook://{bind}/a and webhook://{bind}/b)"
        )));
    }
    routes.insert(path.to_string(), state);
    drop(routes);
    info!(
        "webhook endpoint listening on http://{}{path}",
        listener.local_addr
    );
    Ok(listener)
}

impl Listener {
    fn bind(bind: &str) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ubik-webhook")
            .enable_all()
            .build()?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(bind))
            .map_err(|e| Error::Config(format!("cannot listen on {bind}: {e}")))?;
        let local_addr = listener.local_addr()?;
        // Replies are small: without TCP_NODELAY, Nagle and delayed ACKs
        // hold some of them back for tens of milliseconds.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
        });
        let routes: Arc<Routes> = Arc::default();
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/metrics", get(render_metrics))
            .fallback(dispatch)
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::clone(&routes));
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
        Ok(Self {
            runtime: Some(runtime),
            serve: Some(serve),
            stop: Some(stop_tx),
            routes,
            bind: bind.to_string(),
            local_addr,
        })
    }

    /// Stops serving `path` (its requests get 404 from now on).
    pub fn detach(&self, path: &str) {
        self.routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Ok(mut open) = OPEN.lock()
            && open.get(&self.bind).is_some_and(|w| w.strong_count() == 0)
        {
            open.remove(&self.bind);
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let (Some(rt), Some(serve)) = (self.runtime.as_ref(), self.serve.take()) {
            let _ = rt.block_on(serve);
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}

fn route(routes: &Routes, path: &str) -> Option<Arc<AppState>> {
    let path = path.trim_end_matches('/');
    let routes = routes.read().unwrap_or_else(|p| p.into_inner());
    routes.get(path).cloned()
}

/// Routes a request to its path's source; an unknown path gets 404 naming
/// the served ones, another method than POST 405.
async fn dispatch(State(routes): State<Arc<Routes>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let Some(state) = route(&routes, &path) else {
        let served: Vec<String> = routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        return json_response(
            404,
            serde_json::json!({
                "error": format!("no webhook at {path}: this endpoint serves {}", served.join(", ")),
                "reason": "not_found",
            }),
            None,
        );
    };
    if request.method() != Method::POST {
        return json_response(
            405,
            serde_json::json!({"error": format!("{path} takes POST"), "reason": "method"}),
            None,
        );
    }
    let (parts, body) = request.into_parts();
    ingest(state, parts.headers, body).await
}

/// 200 while every path accepts events, 503 once one is draining.
async fn healthz(State(routes): State<Arc<Routes>>) -> Response {
    let routes = routes.read().unwrap_or_else(|p| p.into_inner());
    if routes.values().all(|s| s.accepting.load(Ordering::Relaxed)) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    }
}

async fn render_metrics(State(routes): State<Arc<Routes>>) -> Response {
    let text = {
        let routes = routes.read().unwrap_or_else(|p| p.into_inner());
        let served: Vec<_> = routes
            .iter()
            .map(|(path, s)| {
                let depth = s
                    .shared
                    .index
                    .lock()
                    .map(|i| (i.unread_rows(), i.unread_bytes()))
                    .unwrap_or((0, 0));
                metrics::Served {
                    path,
                    metrics: &s.metrics,
                    depth,
                }
            })
            .collect();
        metrics::render(&served)
    };
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}
