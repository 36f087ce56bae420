//! What every API request goes through around its handler, as layers (outermost first):
//! counting it by endpoint and status, timing what the proxy adds to it, the proxy's key, and
//! the body limit. Their refusals are in the endpoint's provider format.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use axum::routing::MethodRouter;

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
    fn provider(self) -> Option<Provider> {
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
/// method it serves only (another method is answered 405 by the router, as before they
/// existed); the passthrough route serves every method.
pub fn guarded(
    route: MethodRouter<Arc<App>>,
    app: &Arc<App>,
    endpoint: Endpoint,
) -> MethodRouter<Arc<App>> {
    let state = Guarded { app: app.clone(), endpoint };
    match endpoint {
        Endpoint::Managed(_) => route
            .route_layer(from_fn_with_state(state.clone(), limit_body))
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
        return failure.respond(on.endpoint.provider());
    }
    next.run(request).await
}

/// Reads the body whole, refusing one over the proxy's limit (or cut short) with 413.
async fn limit_body(State(on): State<Guarded>, request: Request, next: Next) -> Response {
    let limit = on.app.config.body_limit;
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(_) => Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over the proxy's limit of {limit} bytes (or cut short)"),
        )
        .respond(on.endpoint.provider()),
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
