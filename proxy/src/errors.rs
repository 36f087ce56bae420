//! What a request fails with, answered in the provider's own error format.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ctxwin_std::core::Error as CoreError;

use crate::config::ProxyConfig;
use crate::conv::ConvError;
use crate::metrics::UpstreamWait;
use crate::wire::Provider;

/// What a request failed with: a status and a message for the client.
///
/// ```
/// use axum::http::StatusCode;
/// use ctxwin_proxy::errors::Failure;
/// let failure = Failure::new(StatusCode::BAD_REQUEST, "messages: expected an array");
/// assert_eq!(failure.respond(None).status(), StatusCode::BAD_REQUEST);
/// ```
#[derive(Debug)]
pub struct Failure {
    /// The status answered.
    pub status: StatusCode,
    /// What the client reads.
    pub message: String,
    /// How long the request waited for the upstream before it failed, when it got that far.
    waited: Option<Duration>,
}

impl Failure {
    /// A failure answered with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), waited: None }
    }

    /// The same failure, after `waited` spent waiting for the upstream (left out of the
    /// proxy's added latency).
    #[must_use]
    pub fn waited(self, waited: Duration) -> Self {
        Self { waited: Some(waited), ..self }
    }

    /// The error response in `provider`'s format (OpenAI's for other paths).
    pub fn respond(&self, provider: Option<Provider>) -> Response {
        let mut response = error_response(provider, self.status, &self.message);
        if let Some(waited) = self.waited {
            response.extensions_mut().insert(UpstreamWait(waited));
        }
        response
    }
}

/// An error body in `provider`'s format (OpenAI's for other paths).
///
/// ```
/// use axum::http::StatusCode;
/// use ctxwin_proxy::{errors::error_response, wire::Provider};
/// let response = error_response(Some(Provider::Anthropic), StatusCode::PAYLOAD_TOO_LARGE, "too big");
/// assert_eq!(response.headers()["content-type"], "application/json");
/// ```
pub fn error_response(provider: Option<Provider>, status: StatusCode, message: &str) -> Response {
    let mut response = (status, error_body(provider, status, message)).into_response();
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// The JSON text of an error in `provider`'s format (OpenAI's for other paths), with the
/// error type (and OpenAI's `code`) its status stands for.
///
/// ```
/// use axum::http::StatusCode;
/// use ctxwin_proxy::{errors::error_body, wire::Provider};
/// let body = error_body(Some(Provider::Anthropic), StatusCode::METHOD_NOT_ALLOWED, "use POST");
/// assert!(body.contains("invalid_request_error"));
/// assert!(error_body(None, StatusCode::UNSUPPORTED_MEDIA_TYPE, "JSON").contains("unsupported_media_type"));
/// ```
pub fn error_body(provider: Option<Provider>, status: StatusCode, message: &str) -> String {
    let body = match provider {
        Some(Provider::Anthropic) => {
            let kind = match status.as_u16() {
                401 | 403 => "authentication_error",
                413 => "request_too_large",
                503 => "overloaded_error",
                504 => "timeout_error",
                400..=499 => "invalid_request_error",
                _ => "api_error",
            };
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        _ => {
            let (kind, code) = match status.as_u16() {
                400 => ("invalid_request_error", "invalid_request"),
                401 | 403 => ("authentication_error", "invalid_proxy_key"),
                405 => ("invalid_request_error", "method_not_allowed"),
                408 => ("invalid_request_error", "request_timeout"),
                413 => ("invalid_request_error", "request_too_large"),
                415 => ("invalid_request_error", "unsupported_media_type"),
                502 => ("upstream_error", "upstream_unreachable"),
                503 => ("server_error", "proxy_overloaded"),
                504 => ("upstream_error", "upstream_timeout"),
                _ => ("server_error", "proxy_error"),
            };
            serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    };
    body.to_string()
}

/// The server-sent event that ends a stream the upstream broke off, in `provider`'s format.
///
/// ```
/// use ctxwin_proxy::{errors::stream_error_event, wire::Provider};
/// assert!(stream_error_event(Provider::Anthropic, "stalled").starts_with("event: error\n"));
/// ```
pub fn stream_error_event(provider: Provider, reason: &str) -> String {
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

impl From<&ConvError> for Failure {
    /// A conversation's error: the core's refusals and unreadable messages are the client's
    /// (400), the rest the proxy's (500).
    fn from(error: &ConvError) -> Self {
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
            None => {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("proxy state: {error}"))
            }
        }
    }
}

/// The upstream did not answer: 504 for a timeout, 502 otherwise. The message names the
/// upstream's URL, never a header.
pub fn upstream_failure(config: &ProxyConfig, error: &reqwest::Error) -> Failure {
    let timeout = error.is_timeout();
    let error = reason(error);
    if timeout {
        Failure::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "upstream {} did not answer within {:?}: {error}",
                config.upstream, config.upstream_timeout
            ),
        )
    } else {
        Failure::new(
            StatusCode::BAD_GATEWAY,
            format!("upstream {} unreachable: {error}", config.upstream),
        )
    }
}

/// The upstream did not answer within the configured timeout.
pub fn upstream_timeout(config: &ProxyConfig) -> Failure {
    Failure::new(
        StatusCode::GATEWAY_TIMEOUT,
        format!("upstream {} did not answer within {:?}", config.upstream, config.upstream_timeout),
    )
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
