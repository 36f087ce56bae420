//! The upstream side: the HTTP client, which headers cross in each direction, and sending a
//! managed body (one retry, within the timeout).

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use bytes::Bytes;

use crate::config::ProxyConfig;
use crate::errors::{Failure, upstream_failure, upstream_timeout};

/// The HTTP client for the upstream: connection pool, connect and read timeouts.
///
/// # Errors
/// When the TLS backend cannot start.
pub fn client(config: &ProxyConfig) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(config.upstream_timeout)
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())
}

/// Headers forwarded upstream: the client's own (its `Authorization` / `x-api-key` included),
/// without hop-by-hop ones and the proxy's (`x-ctxwin-*`). A `managed` body is rewritten, so
/// its `accept-encoding` is dropped too (the answer is read to record it).
///
/// ```
/// use axum::http::HeaderMap;
/// let mut headers = HeaderMap::new();
/// headers.insert("authorization", "Bearer sk".parse().unwrap());
/// headers.insert("x-ctxwin-session", "s".parse().unwrap());
/// headers.insert("connection", "keep-alive".parse().unwrap());
/// let out = ctxwin_proxy::upstream::upstream_headers(&headers, true);
/// assert_eq!(out.len(), 1);
/// assert_eq!(out["authorization"], "Bearer sk");
/// ```
pub fn upstream_headers(headers: &HeaderMap, managed: bool) -> reqwest::header::HeaderMap {
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

/// Headers of the upstream's answer passed to the client, without hop-by-hop ones.
pub fn client_headers(upstream: &reqwest::header::HeaderMap) -> HeaderMap {
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

/// The upstream's status as the client gets it (502 for one HTTP cannot carry).
pub fn status(response: &reqwest::Response) -> StatusCode {
    StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// Whether the upstream answers with a server-sent-event stream.
pub fn is_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"))
}

/// Posts a managed JSON `body` to `url` with the client's `headers`, within the upstream
/// timeout. A pooled connection the upstream had closed gets one fresh attempt.
///
/// # Errors
/// 502 when the upstream is unreachable, 504 when it does not answer in time.
pub async fn post_json(
    client: &reqwest::Client,
    config: &ProxyConfig,
    url: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<reqwest::Response, Failure> {
    let mut out_headers = upstream_headers(headers, true);
    out_headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    let send = async {
        let first = client.post(url).headers(out_headers.clone()).body(body.clone()).send().await;
        match first {
            Err(error) if error.is_request() && !error.is_timeout() => {
                tracing::debug!(%error, "proxy: retrying the upstream request once");
                client.post(url).headers(out_headers).body(body).send().await
            }
            other => other,
        }
    };
    match tokio::time::timeout(config.upstream_timeout, send).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(upstream_failure(config, &error)),
        Err(_) => Err(upstream_timeout(config)),
    }
}
