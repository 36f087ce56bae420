//! The router: the two managed endpoints, `/metrics` and `/metrics/conversations`, and every
//! other path passed through, each a short handler inside the layers of [`crate::middleware`].

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::header::ALLOW;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;

use crate::app::App;
use crate::errors::{Failure, upstream_failure};
use crate::middleware::{Endpoint, KEY_HEADER, authorized, drain_refused, guarded, same_bytes};
use crate::pipeline::managed;
use crate::upstream::{self, upstream_headers};
use crate::wire::Provider;

/// The router of a proxy.
pub fn router(app: Arc<App>) -> Router {
    let openai = Endpoint::Managed(Provider::OpenAi);
    let anthropic = Endpoint::Managed(Provider::Anthropic);
    let other = guarded(any(passthrough), &app, Endpoint::Passthrough).with_state(app.clone());
    Router::new()
        .route(
            "/v1/chat/completions",
            guarded(post(openai_chat), &app, openai).fallback(wrong_method(openai, "POST")),
        )
        .route(
            "/v1/messages",
            guarded(post(anthropic_messages), &app, anthropic)
                .fallback(wrong_method(anthropic, "POST")),
        )
        .route("/metrics", get(metrics).fallback(wrong_method(Endpoint::Passthrough, "GET, HEAD")))
        .route(
            "/metrics/conversations",
            get(conversations).fallback(wrong_method(Endpoint::Passthrough, "GET, HEAD")),
        )
        .fallback_service(other)
        // The body limit is the proxy's own ([`crate::middleware`]), in the provider's format.
        .layer(DefaultBodyLimit::disable())
        .with_state(app)
}

async fn openai_chat(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    managed(app, Provider::OpenAi, headers, query, body).await
}

async fn anthropic_messages(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    managed(app, Provider::Anthropic, headers, query, body).await
}

/// What [`wrong_method`] answers with.
type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;

/// The handler for a method a route does not serve: 405 with `allow` and an error body in
/// the endpoint's provider format (clients show the message, not the bare status), once the
/// body is read ([`drain_refused`]).
fn wrong_method(
    endpoint: Endpoint,
    allow: &'static str,
) -> impl Fn(State<Arc<App>>, Method, Body) -> Answer + Clone + Send + Sync + 'static {
    move |State(app): State<Arc<App>>, method: Method, body: Body| {
        Box::pin(async move {
            drain_refused(&app, body).await;
            let message = format!("method {method} is not allowed here; use {allow}");
            let mut response =
                Failure::new(StatusCode::METHOD_NOT_ALLOWED, message).respond(endpoint.provider());
            response.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
            response
        })
    }
}

/// `GET /metrics`. With a proxy key set it needs the key too (as `x-ctxwin-key`, or as
/// `Authorization: Bearer KEY`, which Prometheus scrape configs send): the counts tell who
/// uses the proxy how much.
async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(refused) = metrics_refused(&app, &headers) {
        return refused;
    }
    let mut text = app.metrics.render();
    if app.is_fleet() {
        crate::metrics::render_postgres(&mut text);
    }
    if let Some(writer) = app.archive_writer() {
        crate::metrics::render_archive_writer(&mut text, &writer.stats());
    }
    app.bills.render_top(&mut text);
    let mut response = text.into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// `GET /metrics/conversations`: each conversation's bill as JSON
/// ([`crate::bills::Bills::json`]), with the same key as `/metrics`.
async fn conversations(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(refused) = metrics_refused(&app, &headers) {
        return refused;
    }
    let mut response = app.bills.json(&app.metrics).to_string().into_response();
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// The 401 for a metrics request without the proxy key, when one is set.
fn metrics_refused(app: &App, headers: &HeaderMap) -> Option<Response> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .zip(app.config.proxy_key.as_deref().filter(|k| !k.is_empty()))
        .is_some_and(|(given, key)| same_bytes(given.as_bytes(), key.as_bytes()));
    if authorized(app, headers) || bearer {
        return None;
    }
    app.metrics.request("metrics", 401);
    let message =
        format!("missing or wrong {KEY_HEADER} (or Authorization: Bearer with the proxy key)");
    Some(Failure::new(StatusCode::UNAUTHORIZED, message).respond(None))
}

/// Any other path: forwarded as it is, the answer streamed back.
async fn passthrough(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let url = app.config.upstream_url(uri.path_and_query().map_or("/", |p| p.as_str()));
    let method =
        reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
    let sent = app
        .client
        .request(method, url)
        .headers(upstream_headers(&headers, false))
        .body(body)
        .send()
        .await;
    match sent {
        Ok(answer) => {
            let (status, headers) =
                (upstream::status(&answer), upstream::client_headers(answer.headers()));
            let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Err(error) => upstream_failure(&app.config, &error).respond(None),
    }
}
