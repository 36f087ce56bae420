//! The HTTP side: routes, conversation registry, forwarding, errors in the provider's format.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use ctxwin_std::core::Error as CoreError;
use futures_util::StreamExt;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, mpsc};

use crate::assemble::{self, StreamAssembler};
use crate::config::ProxyConfig;
use crate::conv::{Composed, Conv, ConvError, Ingest, Stores};
use crate::hash::{FNV_SEED, fnv1a, hash_str};
use crate::metrics::Metrics;
use crate::wire::{self, Provider, Request};

/// Session tasks run at once: twice the cores (at least 2).
pub(crate) fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).saturating_mul(2).max(2)
}

/// The header naming a conversation.
pub const SESSION_HEADER: &str = "x-ctxwin-session";
/// The header carrying the proxy's own key.
pub const KEY_HEADER: &str = "x-ctxwin-key";

type Guard = OwnedMutexGuard<Option<Conv>>;

/// A conversation's place in the registry: one lock each.
#[derive(Debug, Default)]
struct Slot {
    conv: Arc<AsyncMutex<Option<Conv>>>,
    last_used: AtomicU64,
    /// Loaded or created since the proxy started: it may have stored something since.
    loaded_once: std::sync::atomic::AtomicBool,
}

/// Shared state of a running proxy.
#[derive(Debug)]
pub struct App {
    /// The settings.
    pub config: ProxyConfig,
    /// The counters.
    pub metrics: Metrics,
    client: reqwest::Client,
    stores: Stores,
    /// Permits for session work on the blocking pool (see [`App::blocking`]).
    work: Arc<tokio::sync::Semaphore>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The slots whose conversation is in memory (or being loaded): what the cap chooses
    /// from, so making room costs the resident count, not every conversation ever seen.
    resident: Mutex<HashMap<String, Arc<Slot>>>,
    /// The conversations with something stored when the proxy started
    /// ([`crate::conv::persisted_keys`]); any other one not loaded since is new.
    persisted: HashSet<String>,
    clock: AtomicU64,
}

/// What a handler failed with, answered in the provider's error format.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

/// An error body in `provider`'s format (OpenAI's for other paths).
pub fn error_response(provider: Option<Provider>, status: StatusCode, message: &str) -> Response {
    let body = match provider {
        Some(Provider::Anthropic) => {
            let kind = match status.as_u16() {
                400 => "invalid_request_error",
                401 | 403 => "authentication_error",
                413 => "request_too_large",
                504 => "timeout_error",
                _ => "api_error",
            };
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        _ => {
            let (kind, code) = match status.as_u16() {
                400 => ("invalid_request_error", "invalid_request"),
                401 | 403 => ("authentication_error", "invalid_proxy_key"),
                413 => ("invalid_request_error", "request_too_large"),
                502 => ("upstream_error", "upstream_unreachable"),
                504 => ("upstream_error", "upstream_timeout"),
                _ => ("server_error", "proxy_error"),
            };
            serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    };
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

impl App {
    /// A proxy with `config`.
    ///
    /// # Errors
    /// When the state directory or the HTTP client cannot be set up.
    pub fn new(config: ProxyConfig) -> Result<Arc<Self>, String> {
        let stores = crate::conv::prepare_state(&config.state_dir)
            .map_err(|e| format!("state directory {}: {e}", config.state_dir.display()))?;
        let persisted = crate::conv::persisted_keys(&stores)
            .map_err(|e| format!("state directory {}: {e}", config.state_dir.display()))?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(config.upstream_timeout)
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            config,
            metrics: Metrics::default(),
            client,
            stores,
            work: Arc::new(tokio::sync::Semaphore::new(workers())),
            slots: Mutex::default(),
            resident: Mutex::default(),
            persisted,
            clock: AtomicU64::new(0),
        }))
    }

    /// Runs session work (SQLite, the core) on the blocking pool, at most [`workers`] tasks at
    /// once: the archive takes one writer at a time and the machine has few cores, so more
    /// threads would only wait, each with its stack, and switch. The permit goes with the
    /// task: it is held until the work ends even if the request is dropped meanwhile.
    async fn blocking<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, tokio::task::JoinError> {
        let permit = self.work.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
    }

    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = slots.entry(key.to_string()).or_default().clone();
        slot.last_used.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        slot
    }

    /// Conversations known (resident or not).
    pub fn known_sessions(&self) -> usize {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Checkpoints and unloads the least recently used idle conversations above the cap.
    pub async fn enforce_cap(self: &Arc<Self>) {
        let cap = self.config.max_resident as u64;
        if self.metrics.resident.load(Relaxed) <= cap {
            return;
        }
        let mut candidates: Vec<(u64, String, Arc<Slot>)> = {
            let resident = self.resident.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            resident
                .iter()
                .map(|(k, s)| (s.last_used.load(Relaxed), k.clone(), s.clone()))
                .collect()
        };
        candidates.sort_by_key(|(used, _, _)| *used);
        for (_, key, slot) in candidates {
            if self.metrics.resident.load(Relaxed) <= cap {
                break;
            }
            let Ok(mut guard) = slot.conv.clone().try_lock_owned() else { continue };
            let Some(mut conv) = guard.take() else { continue };
            self.resident.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&key);
            self.metrics.resident.fetch_sub(1, Relaxed);
            self.metrics.unloads.fetch_add(1, Relaxed);
            // The slot stays locked until the checkpoint is written: a request for it waits.
            let _ = self.blocking(move || {
                if let Err(error) = conv.checkpoint() {
                    tracing::error!(session = conv.key(), %error, "proxy: checkpoint before unload failed");
                }
                drop(conv);
                drop(guard);
            })
            .await;
        }
    }

    /// Checkpoints the conversations idle for `idle` that changed since their last checkpoint
    /// (skipping busy ones).
    pub async fn checkpoint_idle(self: &Arc<Self>, idle: Duration) {
        let slots: Vec<Arc<Slot>> = {
            let slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            slots.values().cloned().collect()
        };
        for slot in slots {
            let Ok(guard) = slot.conv.clone().try_lock_owned() else { continue };
            let due = guard.as_ref().is_some_and(|c| c.is_dirty() && c.idle() >= idle);
            if !due {
                continue;
            }
            self.checkpoint_locked(guard).await;
        }
    }

    /// Checkpoints the locked conversation (if loaded) off the async threads; a failure is
    /// logged and leaves the conversation dirty for the next try.
    async fn checkpoint_locked(&self, mut guard: Guard) {
        let _ = self
            .blocking(move || {
                if let Some(conv) = guard.as_mut()
                    && let Err(error) = conv.checkpoint()
                {
                    tracing::error!(session = conv.key(), %error, "proxy: checkpoint failed");
                }
            })
            .await;
    }

    /// Copies the archive's WAL into its database file on the blocking pool (outside the
    /// session-work permits), on a connection of its own: a commit of the connection the
    /// sessions share then has less to copy itself when the WAL passes 1,000 pages, and
    /// under light load none, so no request waits for the disk sync a copy ends with. A commit
    /// is durable against a crash of the process (the OS holds it), not of the machine until
    /// the next copy.
    pub async fn checkpoint_wal(&self) {
        let wal = self.stores.wal.clone();
        match tokio::task::spawn_blocking(move || wal.checkpoint_wal()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "proxy: archive WAL checkpoint failed"),
            Err(error) => tracing::warn!(%error, "proxy: archive WAL checkpoint task failed"),
        }
    }

    /// Checkpoints every resident conversation (on shutdown).
    pub async fn checkpoint_all(self: &Arc<Self>) {
        let slots: Vec<Arc<Slot>> = {
            let slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            slots.values().cloned().collect()
        };
        for slot in slots {
            let guard = slot.conv.clone().lock_owned().await;
            self.checkpoint_locked(guard).await;
        }
    }
}

/// The router of a proxy.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .route("/metrics", get(metrics))
        .fallback(passthrough)
        .with_state(app)
}

/// `GET /metrics`. With a proxy key set it needs the key too (as `x-ctxwin-key`, or as
/// `Authorization: Bearer KEY`, which Prometheus scrape configs send): the counts tell who
/// uses the proxy how much.
async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .zip(app.config.proxy_key.as_deref().filter(|k| !k.is_empty()))
        .is_some_and(|(given, key)| same_bytes(given.as_bytes(), key.as_bytes()));
    if !authorized(&app, &headers) && !bearer {
        app.metrics.request("metrics", 401);
        return error_response(
            None,
            StatusCode::UNAUTHORIZED,
            &format!("missing or wrong {KEY_HEADER} (or Authorization: Bearer with the proxy key)"),
        );
    }
    let mut response = app.metrics.render().into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

fn authorized(app: &App, headers: &HeaderMap) -> bool {
    match app.config.proxy_key.as_deref().filter(|k| !k.is_empty()) {
        None => true,
        Some(key) => {
            headers.get(KEY_HEADER).is_some_and(|v| same_bytes(v.as_bytes(), key.as_bytes()))
        }
    }
}

/// Compares in time independent of where the bytes differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

async fn read_body(app: &App, body: Body) -> Result<Bytes, Failure> {
    axum::body::to_bytes(body, app.config.body_limit).await.map_err(|_| {
        Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body over the proxy's limit of {} bytes (or cut short)",
                app.config.body_limit
            ),
        )
    })
}

/// Headers forwarded upstream: the client's own (its `Authorization` / `x-api-key` included),
/// without hop-by-hop ones and the proxy's.
fn upstream_headers(headers: &HeaderMap, managed: bool) -> reqwest::header::HeaderMap {
    let mut out = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        let n = name.as_str();
        let hop = matches!(
            n,
            "host"
                | "content-length"
                | "connection"
                | "keep-alive"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "proxy-authorization"
                | "proxy-connection"
        );
        if hop || n.starts_with("x-ctxwin-") || (managed && n == "accept-encoding") {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_ref()),
            reqwest::header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append(name, value);
        }
    }
    out
}

fn client_headers(upstream: &reqwest::header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in upstream {
        let n = name.as_str();
        if matches!(n, "content-length" | "connection" | "keep-alive" | "transfer-encoding") {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name.as_ref()), HeaderValue::from_bytes(value.as_bytes()))
        {
            out.append(name, value);
        }
    }
    out
}

/// An error with its causes, `a: b: c`.
fn reason(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn upstream_failure(app: &App, error: &reqwest::Error) -> Failure {
    let timeout = error.is_timeout();
    let error = reason(error);
    // The error names the URL, never a header.
    if timeout {
        Failure::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "upstream {} did not answer within {:?}: {error}",
                app.config.upstream, app.config.upstream_timeout
            ),
        )
    } else {
        Failure::new(
            StatusCode::BAD_GATEWAY,
            format!("upstream {} unreachable: {error}", app.config.upstream),
        )
    }
}

async fn passthrough(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let status = match passthrough_inner(&app, method, &uri, &headers, body).await {
        Ok(response) => return response,
        Err(failure) => failure,
    };
    app.metrics.request("passthrough", status.status.as_u16());
    error_response(None, status.status, &status.message)
}

async fn passthrough_inner(
    app: &Arc<App>,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    if !authorized(app, headers) {
        return Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {KEY_HEADER}"),
        ));
    }
    let body = read_body(app, body).await?;
    let url = app.config.upstream_url(uri.path_and_query().map_or("/", |p| p.as_str()));
    let method =
        reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
    let upstream = app
        .client
        .request(method, url)
        .headers(upstream_headers(headers, false))
        .body(body)
        .send()
        .await
        .map_err(|e| upstream_failure(app, &e))?;
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    app.metrics.request("passthrough", status.as_u16());
    let headers = client_headers(upstream.headers());
    let mut response = Response::new(Body::from_stream(upstream.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

async fn openai(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    managed(app, Provider::OpenAi, headers, body).await
}

async fn anthropic(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    managed(app, Provider::Anthropic, headers, body).await
}

/// The conversation key: the session header (sanitized, with a hash of the whole value), or
/// a hash of the system prompt and the first user message.
fn conversation_key(
    headers: &HeaderMap,
    request: &Request,
    provider: Provider,
) -> Result<String, wire::BadRequest> {
    if let Some(value) =
        headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty())
    {
        let clean: String = value
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(48)
            .collect();
        let clean = clean.trim_start_matches('.');
        return Ok(format!("s-{clean}-{:08x}", hash_str(value) as u32));
    }
    let mut hash = fnv1a(FNV_SEED, provider.as_str().as_bytes());
    for i in 0..request.items.len() {
        let message = wire::analyze_item(provider, request, i)?;
        hash = fnv1a(hash, &message.fp.to_le_bytes());
        if message.role == "user" {
            break;
        }
    }
    Ok(format!("h-{hash:016x}"))
}

/// A branch's key: the parent's and the index where the history left it. Every history that
/// leaves the parent at that index goes to this branch first; one that also differs from the
/// branch goes on to the branch's own branches, so a branch is found again by the next request
/// of the same conversation.
fn branch_key(parent: &str, at: usize) -> String {
    format!("{parent}~{at}")
}

async fn managed(app: Arc<App>, provider: Provider, headers: HeaderMap, body: Body) -> Response {
    let endpoint = provider.as_str();
    match managed_inner(&app, provider, &headers, body).await {
        Ok(response) => response,
        Err(failure) => {
            app.metrics.request(endpoint, failure.status.as_u16());
            if failure.status.is_server_error() {
                tracing::warn!(endpoint, status = failure.status.as_u16(), reason = %failure.message, "proxy: request failed");
            }
            error_response(Some(provider), failure.status, &failure.message)
        }
    }
}

fn conv_failure(error: &ConvError) -> Failure {
    if let ConvError::BadRequest(reason) = error {
        return Failure::new(StatusCode::BAD_REQUEST, reason.clone());
    }
    match error.core() {
        Some(CoreError::PinnedOverBudget { needed, budget, .. }) => Failure::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the pinned part of this request (system prompt, tool definitions and the newest messages) needs {needed} tokens, more than the budget of {budget}: it cannot fit; shorten it or raise the model's window in [proxy.windows]"
            ),
        ),
        Some(CoreError::MessageTooLarge { needed, limit }) => Failure::new(
            StatusCode::BAD_REQUEST,
            format!(
                "a message of this request needs {needed} tokens, more than the {limit} its part of the context window can hold (the pinned system prompt and tool definitions get a quarter of the window): it cannot fit; shorten it or raise the model's window in [proxy.windows]"
            ),
        ),
        Some(core) => Failure::new(
            StatusCode::BAD_REQUEST,
            format!("the conversation was refused: {core:?} ({error})"),
        ),
        None => Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("proxy state: {error}")),
    }
}

/// Locks conversation `key`, loading it if it is not resident.
async fn lock_conv(
    app: &Arc<App>,
    key: &str,
    provider: Provider,
    model: &str,
) -> Result<Guard, Failure> {
    let slot = app.slot(key);
    let mut guard = slot.conv.clone().lock_owned().await;
    if guard.is_none() {
        // Counted as resident from now: the cap makes room before the load, not after the
        // answer (only more conversations in flight at once than the cap can pass it).
        app.metrics.resident.fetch_add(1, Relaxed);
        app.enforce_cap().await;
        let dir = app.config.state_dir.clone();
        let (window, reserve) = (app.config.window_for(model), app.config.reserve);
        let new = !slot.loaded_once.load(Relaxed) && !app.persisted.contains(key);
        let opened = if new {
            // Nothing to read: building it is memory work, done here.
            Conv::create(&dir, &app.stores, key, provider, window, reserve)
                .map_err(|e| conv_failure(&e))
        } else {
            let name = key.to_string();
            let stores = app.stores.clone();
            app.blocking(move || Conv::open(&dir, &stores, &name, provider, window, reserve))
                .await
                .map_err(|e| {
                    Failure::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("loading the session: {e}"),
                    )
                })
                .and_then(|opened| opened.map_err(|e| conv_failure(&e)))
        };
        let conv = match opened {
            Ok(conv) => conv,
            Err(failure) => {
                app.metrics.resident.fetch_sub(1, Relaxed);
                return Err(failure);
            }
        };
        *guard = Some(conv);
        slot.loaded_once.store(true, Relaxed);
        app.resident
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_string(), slot.clone());
        app.metrics.loads.fetch_add(1, Relaxed);
    }
    Ok(guard)
}

enum Step {
    Diverged(usize),
    Composed(Composed, u64),
}

/// How far [`take_request`] went.
enum Progress {
    Done(Step),
    /// The request's messages were taken and its payload is still to compose (off the async
    /// threads): `tokens_in` and the units `evicted` so far.
    Taken {
        tokens_in: u64,
        evicted: usize,
    },
}

/// Takes the request's new messages and composes its payload. `inline` (on an async thread):
/// stops after taking them when that moved the conversation's work to the disk (its first
/// eviction turns retrieval on), with [`Progress::Taken`].
fn take_request(
    guard: &mut Guard,
    request: &Request,
    hashes: &[u64],
    inline: bool,
) -> Result<Progress, ConvError> {
    let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
    match conv.ingest(request, hashes)? {
        Ingest::Diverged(at) => Ok(Progress::Done(Step::Diverged(at))),
        Ingest::Extended { tokens_in, evicted, .. } if inline && !conv.request_in_memory() => {
            Ok(Progress::Taken { tokens_in, evicted })
        }
        Ingest::Extended { tokens_in, evicted, .. } => {
            compose(guard, request, tokens_in, evicted).map(Progress::Done)
        }
    }
}

/// Composes the payload of a request whose messages were taken.
fn compose(
    guard: &mut Guard,
    request: &Request,
    tokens_in: u64,
    evicted: usize,
) -> Result<Step, ConvError> {
    let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
    let mut composed = conv.compose(request)?;
    composed.evicted += evicted;
    Ok(Step::Composed(composed, tokens_in))
}

/// Runs `work` on the locked conversation on the blocking pool ([`App::blocking`]).
async fn on_pool<R: Send + 'static>(
    app: &App,
    mut guard: Guard,
    work: impl FnOnce(&mut Guard) -> Result<R, ConvError> + Send + 'static,
) -> Result<(Guard, Result<R, ConvError>), Failure> {
    app.blocking(move || {
        let result = work(&mut guard);
        (guard, result)
    })
    .await
    .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("session task: {e}")))
}

async fn managed_inner(
    app: &Arc<App>,
    provider: Provider,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let started = Instant::now();
    if !authorized(app, headers) {
        return Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {KEY_HEADER}"),
        ));
    }
    let bytes = read_body(app, body).await?;
    let parse_started = Instant::now();
    let request =
        Request::parse(provider, &bytes).map_err(|e| Failure::new(StatusCode::BAD_REQUEST, e.0))?;
    let hashes = Arc::new(wire::raw_hashes(&request));
    let mut key = conversation_key(headers, &request, provider)
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, e.0))?;
    let request = Arc::new(request);
    let mut hops = 0;
    let (mut guard, composed) = loop {
        let guard = lock_conv(app, &key, provider, &request.model).await?;
        // A request the session serves from memory takes tens of microseconds: run here, as a
        // hop to the blocking pool (a permit, a thread woken and switched to) would cost more
        // than it and queue behind other conversations' disk work.
        let (guard, progress) = if guard.as_ref().is_some_and(Conv::request_in_memory) {
            let mut guard = guard;
            let progress = take_request(&mut guard, &request, &hashes, true);
            (guard, progress)
        } else {
            let (req, hashes) = (request.clone(), hashes.clone());
            on_pool(app, guard, move |guard| take_request(guard, &req, &hashes, false)).await?
        };
        let (guard, step) = match progress {
            Ok(Progress::Done(step)) => (guard, Ok(step)),
            // Its messages evicted for the first time: retrieval now queries the archive.
            Ok(Progress::Taken { tokens_in, evicted }) => {
                let req = request.clone();
                on_pool(app, guard, move |guard| compose(guard, &req, tokens_in, evicted)).await?
            }
            Err(error) => (guard, Err(error)),
        };
        match step {
            Ok(Step::Composed(composed, tokens_in)) => {
                app.metrics.tokens_in.fetch_add(tokens_in, Relaxed);
                break (guard, composed);
            }
            Ok(Step::Diverged(at)) => {
                drop(guard);
                hops += 1;
                if hops > 64 {
                    return Err(Failure::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "too many branches",
                    ));
                }
                let branch = branch_key(&key, at);
                tracing::info!(session = %key, branch = %branch, at, "proxy: history diverges; using a branch");
                app.metrics.branches.fetch_add(1, Relaxed);
                key = branch;
            }
            Err(error) => {
                let failure = conv_failure(&error);
                spawn_checkpoint(app.clone(), guard);
                return Err(failure);
            }
        }
    };
    let _ = parse_started;
    app.metrics.managed.fetch_add(1, Relaxed);
    app.metrics.tokens_sent.fetch_add(u64::from(composed.tokens), Relaxed);
    app.metrics.compactions.fetch_add(composed.evicted as u64, Relaxed);
    if composed.cache_stable {
        app.metrics.cache_stable.fetch_add(1, Relaxed);
    }
    let url = app.config.upstream_url(match provider {
        Provider::OpenAi => "/v1/chat/completions",
        Provider::Anthropic => "/v1/messages",
    });
    let mut out_headers = upstream_headers(headers, true);
    out_headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    let sent_tokens = composed.tokens;
    let pre = started.elapsed();
    let body = Bytes::from(composed.body);
    let send = async {
        let first =
            app.client.post(&url).headers(out_headers.clone()).body(body.clone()).send().await;
        match first {
            // A pooled connection the upstream closed: one fresh attempt.
            Err(error) if error.is_request() && !error.is_timeout() => {
                tracing::debug!(%error, "proxy: retrying the upstream request once");
                app.client.post(&url).headers(out_headers).body(body).send().await
            }
            other => other,
        }
    };
    let upstream = match tokio::time::timeout(app.config.upstream_timeout, send).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            app.metrics.added_latency(pre);
            spawn_checkpoint(app.clone(), guard);
            return Err(upstream_failure(app, &error));
        }
        Err(_) => {
            app.metrics.added_latency(pre);
            spawn_checkpoint(app.clone(), guard);
            return Err(Failure::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "upstream {} did not answer within {:?}",
                    app.config.upstream, app.config.upstream_timeout
                ),
            ));
        }
    };
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let response_headers = client_headers(upstream.headers());
    let is_stream = upstream
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    app.metrics.request(provider.as_str(), status.as_u16());
    if is_stream && status.is_success() {
        app.metrics.added_latency(pre);
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        let task_app = app.clone();
        let timeout = app.config.upstream_timeout;
        tokio::spawn(async move {
            let mut assembler = StreamAssembler::new(provider);
            let mut stream = upstream.bytes_stream();
            let mut client_gone = false;
            let mut broken = None;
            loop {
                match tokio::time::timeout(timeout, stream.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        assembler.feed(&chunk);
                        if !client_gone && tx.send(Ok(chunk)).await.is_err() {
                            client_gone = true;
                        }
                    }
                    Ok(None) => break,
                    Ok(Some(Err(error))) => {
                        broken = Some(format!("upstream stream broke: {error}"));
                        break;
                    }
                    Err(_) => {
                        broken = Some(format!("upstream stream stalled for {timeout:?}"));
                        break;
                    }
                }
            }
            let answer = assembler.finish();
            if answer.is_none() && !client_gone {
                let reason =
                    broken.unwrap_or_else(|| "upstream stream ended before its final event".into());
                tracing::warn!(reason = %reason, "proxy: stream incomplete; the answer is not recorded");
                let _ = tx.send(Ok(Bytes::from(sse_error(provider, &reason)))).await;
            }
            drop(tx);
            finish_answer(task_app, guard, answer, sent_tokens).await;
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let mut response = Response::new(Body::from_stream(stream));
        *response.status_mut() = status;
        *response.headers_mut() = response_headers;
        return Ok(response);
    }
    let upstream_started = Instant::now();
    let body = match upstream.bytes().await {
        Ok(body) => body,
        Err(error) => {
            app.metrics.added_latency(pre);
            spawn_checkpoint(app.clone(), guard);
            return Err(upstream_failure(app, &error));
        }
    };
    let post_started = Instant::now();
    let _ = upstream_started;
    let answer = if status.is_success() { assemble::from_body(provider, &body) } else { None };
    if let Some(answer) = answer.clone() {
        let _ = &mut guard;
        tokio::spawn(finish_answer(app.clone(), guard, Some(answer), sent_tokens));
    } else {
        spawn_checkpoint(app.clone(), guard);
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = response_headers;
    app.metrics.added_latency(pre + post_started.elapsed());
    Ok(response)
}

fn sse_error(provider: Provider, reason: &str) -> String {
    match provider {
        Provider::OpenAi => format!(
            "data: {}\n\n",
            serde_json::json!({"error": {"message": reason, "type": "upstream_error", "code": "stream_truncated"}})
        ),
        Provider::Anthropic => format!(
            "event: error\ndata: {}\n\n",
            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": reason}})
        ),
    }
}

/// Records the answer (a checkpoint every `checkpoint_every` exchanges; idle conversations
/// are checkpointed by the sweeper), then releases the conversation.
async fn finish_answer(
    app: Arc<App>,
    mut guard: Guard,
    answer: Option<assemble::Answer>,
    sent_tokens: u32,
) {
    let inline =
        guard.as_ref().is_none_or(|conv| !conv.answer_needs_io(app.config.checkpoint_every));
    let every = app.config.checkpoint_every;
    let finish = move || {
        let mut evicted = 0;
        if let Some(conv) = guard.as_mut()
            && let Some(answer) = answer
        {
            match conv.record_answer(&answer, sent_tokens) {
                Ok(n) => evicted = n,
                Err(error) => {
                    tracing::warn!(session = conv.key(), %error, "proxy: answer not recorded")
                }
            }
            if conv.exchange_done(every)
                && let Err(error) = conv.checkpoint()
            {
                tracing::error!(session = conv.key(), %error, "proxy: checkpoint failed");
            }
        }
        drop(guard);
        evicted
    };
    // Keeping the answer for the next request is a few microseconds of memory work: done here,
    // a hop to the blocking pool (a thread woken and switched to) would cost more than it.
    let evicted = if inline { finish() } else { app.blocking(finish).await.unwrap_or(0) };
    app.metrics.compactions.fetch_add(evicted as u64, Relaxed);
    app.enforce_cap().await;
}

/// Releases a conversation after a request that got no answer (it stays dirty: the sweeper
/// checkpoints it when idle).
fn spawn_checkpoint(app: Arc<App>, guard: Guard) {
    drop(guard);
    tokio::spawn(async move { app.enforce_cap().await });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_request_that_first_evicts_composes_off_the_async_thread() {
        let dir = tempfile::tempdir().unwrap();
        let stores = crate::conv::prepare_state(dir.path()).unwrap();
        let conv = Conv::create(dir.path(), &stores, "t", Provider::OpenAi, 2_048, 256).unwrap();
        let mut guard = Arc::new(AsyncMutex::new(Some(conv))).try_lock_owned().unwrap();
        let mut messages = vec![json!({"role": "user", "content": "Staging runs Postgres 16."})];
        for n in 0..200 {
            assert!(guard.as_ref().unwrap().request_in_memory(), "turn {n}");
            let body = json!({"model": "m", "messages": messages}).to_string();
            let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
            let hashes = wire::raw_hashes(&request);
            match take_request(&mut guard, &request, &hashes, true).unwrap() {
                Progress::Done(Step::Composed(..)) => {}
                Progress::Done(Step::Diverged(at)) => panic!("diverged at {at}"),
                Progress::Taken { evicted, .. } => {
                    assert!(evicted > 0);
                    assert!(!guard.as_ref().unwrap().request_in_memory());
                    let Step::Composed(composed, _) = compose(&mut guard, &request, 0, 0).unwrap()
                    else {
                        panic!("not composed")
                    };
                    assert!(String::from_utf8(composed.body).unwrap().contains("Postgres 16"));
                    return;
                }
            }
            messages.push(json!({"role": "assistant", "content": format!("Reply {n}: three pull requests are open and one job fails.")}));
            messages.push(json!({"role": "user", "content": format!("Turn {n}: which Postgres version runs on staging, and who owns the failing job?")}));
        }
        panic!("nothing was evicted in 200 turns");
    }
}
