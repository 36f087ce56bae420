//! What every API request goes through around its handler, as layers (outermost first):
//! counting it by endpoint and status, timing what the proxy adds to it, the proxy's key, a
//! managed request's content type (JSON), and reading the body within the limit and the body
//! timeout. Their refusals are in the endpoint's provider format.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, BodyDataStream};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use axum::routing::MethodRouter;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use crate::app::App;
use crate::errors::Failure;
use crate::metrics::UpstreamWait;
use crate::wire::Provider;

/// The header carrying the proxy's own key.
pub const KEY_HEADER: &str = "x-ctxwin-key";

/// Which endpoint a request is for: its error format and its name in the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A managed request of this provider.
    Managed(Provider),
    /// Any other path, passed through.
    Passthrough,
}

impl Endpoint {
    /// The provider whose error format the endpoint answers in (OpenAI's for other paths).
    pub fn provider(self) -> Option<Provider> {
        match self {
            Endpoint::Managed(provider) => Some(provider),
            Endpoint::Passthrough => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Endpoint::Managed(provider) => provider.as_str(),
            Endpoint::Passthrough => "passthrough",
        }
    }
}

/// The layers' state: the proxy and the endpoint they guard.
#[derive(Clone, Debug)]
struct Guarded {
    app: Arc<App>,
    endpoint: Endpoint,
}

/// `route` with the layers for `endpoint` around it. A managed route gets them around the
/// method it serves only (another method goes to the route's fallback, a 405 in the
/// provider's format, [`crate::routes`]); the passthrough route serves every method.
pub fn guarded(
    route: MethodRouter<Arc<App>>,
    app: &Arc<App>,
    endpoint: Endpoint,
) -> MethodRouter<Arc<App>> {
    let state = Guarded { app: app.clone(), endpoint };
    match endpoint {
        Endpoint::Managed(_) => route
            .route_layer(from_fn_with_state(state.clone(), limit_body))
            .route_layer(from_fn_with_state(state.clone(), require_json))
            .route_layer(from_fn_with_state(state.clone(), require_key))
            .route_layer(from_fn_with_state(state.clone(), time_added_latency))
            .route_layer(from_fn_with_state(state, count)),
        Endpoint::Passthrough => route
            .layer(from_fn_with_state(state.clone(), limit_body))
            .layer(from_fn_with_state(state.clone(), require_key))
            .layer(from_fn_with_state(state.clone(), time_added_latency))
            .layer(from_fn_with_state(state, count)),
    }
}

/// Counts every answer by endpoint and status.
async fn count(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    on.app.metrics.request(on.endpoint.name(), response.status().as_u16());
    response
}

/// Records the time the proxy added to a request that reached the upstream: the handler's
/// time without the wait its response reports ([`UpstreamWait`]).
async fn time_added_latency(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let response = next.run(request).await;
    if let Some(UpstreamWait(waited)) = response.extensions().get::<UpstreamWait>().copied() {
        on.app.metrics.added_latency(started.elapsed().saturating_sub(waited));
    }
    response
}

/// Refuses a request without the proxy's key (when one is set) with 401.
async fn require_key(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    if !authorized(&on.app, request.headers()) {
        let failure =
            Failure::new(StatusCode::UNAUTHORIZED, format!("missing or wrong {KEY_HEADER}"));
        drain_refused(&on.app, request.into_body()).await;
        return failure.respond(on.endpoint.provider());
    }
    next.run(request).await
}

/// Refuses a managed request whose body is declared as something other than JSON
/// (`text/plain`, form-encoded, multipart) with 415: the provider's API reads JSON only.
/// `application/json`, any `application/…+json` and no content type at all pass (the SDKs
/// send `application/json`).
async fn require_json(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    let declared = request.headers().get(CONTENT_TYPE);
    if declared.is_none_or(|v| v.to_str().is_ok_and(is_json)) {
        return next.run(request).await;
    }
    let shown = declared.and_then(|v| v.to_str().ok()).unwrap_or("(not text)");
    let message = format!(
        "content type `{shown}` is not supported: send the body as JSON with `content-type: application/json`"
    );
    drain_refused(&on.app, request.into_body()).await;
    Failure::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message).respond(on.endpoint.provider())
}

/// Whether a `content-type` value names JSON: `application/json` or `application/…+json`,
/// whatever its parameters (`; charset=utf-8`).
///
/// ```
/// use ctxwin_proxy::middleware::is_json;
/// assert!(is_json("application/json; charset=utf-8"));
/// assert!(is_json("application/vnd.api+json"));
/// assert!(!is_json("text/plain"));
/// assert!(!is_json("application/x-www-form-urlencoded"));
/// ```
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json"
        || essence.strip_prefix("application/").is_some_and(|sub| sub.ends_with("+json"))
}

/// Reads the body whole: one over the proxy's limit (declared or sent) is refused with 413,
/// one that ends before its `content-length` (or breaks off) with 400, one that has not
/// arrived within `body_timeout` with 408.
async fn limit_body(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    let (limit, timeout) = (on.app.config.body_limit, on.app.config.body_timeout);
    let (parts, body) = request.into_parts();
    let read = match tokio::time::timeout(timeout, read_body(body, &parts.headers, limit)).await {
        Ok(read) => read,
        Err(_) => Err(Failure::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {timeout:?} ([proxy] body_timeout_secs)"
            ),
        )),
    };
    match read {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(failure) => failure.respond(on.endpoint.provider()),
    }
}

/// The body's bytes, at most `limit` of them.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, Failure> {
    let over = || {
        Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over the proxy's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|length| length > limit as u64) {
        drain(stream, limit).await;
        return Err(over());
    }
    let mut bytes = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| {
            let expected = declared.map_or_else(String::new, |n| format!(" of the {n} declared"));
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("request body cut short after {} bytes{expected}: {error}", bytes.len()),
            )
        })?;
        if bytes.len() + chunk.len() > limit {
            drain(stream, limit).await;
            return Err(over());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}

/// Reads and discards the body of a request refused before it was read, within the body
/// limit and timeout (`drain`).
pub async fn drain_refused(app: &App, body: Body) {
    let (limit, timeout) = (app.config.body_limit, app.config.body_timeout);
    let _ = tokio::time::timeout(timeout, drain(body.into_data_stream(), limit)).await;
}

/// Reads and discards at most `most` more bytes of a refused request's body. A connection
/// closed with bytes unread is reset, and the reset can discard the answer before the client
/// reads it; past `most`, the connection is closed anyway.
async fn drain(mut stream: BodyDataStream, most: usize) {
    let mut left = most;
    while let Some(Ok(chunk)) = stream.next().await {
        match left.checked_sub(chunk.len()) {
            Some(rest) => left = rest,
            None => return,
        }
    }
}

/// Whether `headers` carry the proxy's key as `x-ctxwin-key` (always, without a key set).
pub fn authorized(app: &App, headers: &HeaderMap) -> bool {
    match app.config.proxy_key.as_deref().filter(|k| !k.is_empty()) {
        None => true,
        Some(key) => {
            headers.get(KEY_HEADER).is_some_and(|v| same_bytes(v.as_bytes(), key.as_bytes()))
        }
    }
}

/// Compares in time independent of where the bytes differ.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}
