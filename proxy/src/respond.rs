//! The upstream's answer on its way back: passed to the client (a stream chunk by chunk, a
//! body whole) while the assistant message is assembled on the side, then recorded in the
//! conversation, which is released.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::app::{App, Guard};
use crate::assemble::{self, Answer, StreamAssembler};
use crate::errors::{Failure, stream_error_event, upstream_failure};
use crate::metrics::UpstreamWait;
use crate::upstream;
use crate::wire::Provider;

/// The client's response to a managed request the upstream answered (`sent_at`: when it was
/// sent; `sent_tokens`: the payload's estimated tokens, for calibration). The conversation
/// (`guard`) is released once the answer is recorded.
///
/// # Errors
/// 502/504 when the upstream's body breaks off.
pub async fn answer(
    app: &Arc<App>,
    provider: Provider,
    guard: Guard,
    upstream: reqwest::Response,
    sent_tokens: u32,
    sent_at: Instant,
) -> Result<Response, Failure> {
    let status = upstream::status(&upstream);
    let headers = upstream::client_headers(upstream.headers());
    if upstream::is_stream(&upstream) && status.is_success() {
        let waited = sent_at.elapsed();
        let body = relay(app.clone(), provider, guard, upstream, sent_tokens);
        return Ok(response(status, headers, body, waited));
    }
    let body = match upstream.bytes().await {
        Ok(body) => body,
        Err(error) => {
            release(app.clone(), guard);
            return Err(upstream_failure(&app.config, &error).waited(sent_at.elapsed()));
        }
    };
    let waited = sent_at.elapsed();
    let answer = if status.is_success() { assemble::from_body(provider, &body) } else { None };
    Ok(answered(app, guard, (status, headers), body, answer, sent_tokens, waited))
}

/// The client's response holding a whole upstream `body` (`status`, the upstream's
/// `headers`), its `answer` recorded in the conversation (`guard`, then released): with
/// none, nothing is recorded. `waited`: how long the upstream took.
pub fn answered(
    app: &Arc<App>,
    guard: Guard,
    (status, headers): (StatusCode, HeaderMap),
    body: Bytes,
    answer: Option<Answer>,
    sent_tokens: u32,
    waited: Duration,
) -> Response {
    match answer {
        Some(answer) => {
            tokio::spawn(finish_answer(app.clone(), guard, Some(answer), sent_tokens));
        }
        None => release(app.clone(), guard),
    }
    response(status, headers, Body::from(body), waited)
}

/// The client's response: the upstream's `status` and `headers`, `body`, and how long the
/// upstream took (`waited`, for the metrics).
pub fn response(status: StatusCode, headers: HeaderMap, body: Body, waited: Duration) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.extensions_mut().insert(UpstreamWait(waited));
    response
}

/// Passes the upstream's stream to the client chunk by chunk (a chunk stalled for the
/// upstream timeout ends it), assembling the answer on the side; a stream that ends before
/// its final event gets an error event and records nothing.
fn relay(
    app: Arc<App>,
    provider: Provider,
    guard: Guard,
    upstream: reqwest::Response,
    sent_tokens: u32,
) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let timeout = app.config.upstream_timeout;
        let mut assembler = StreamAssembler::new(provider);
        let mut stream = upstream.bytes_stream();
        let mut client_gone = false;
        let broken = loop {
            match tokio::time::timeout(timeout, stream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    assembler.feed(&chunk);
                    if !client_gone && tx.send(Ok(chunk)).await.is_err() {
                        client_gone = true;
                    }
                }
                Ok(None) => break None,
                Ok(Some(Err(error))) => break Some(format!("upstream stream broke: {error}")),
                Err(_) => break Some(format!("upstream stream stalled for {timeout:?}")),
            }
        };
        let answer = assembler.finish();
        if answer.is_none() && !client_gone {
            let reason =
                broken.unwrap_or_else(|| "upstream stream ended before its final event".into());
            tracing::warn!(reason = %reason, "proxy: stream incomplete; the answer is not recorded");
            let _ = tx.send(Ok(Bytes::from(stream_error_event(provider, &reason)))).await;
        }
        drop(tx);
        finish_answer(app, guard, answer, sent_tokens).await;
    });
    let chunks =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    Body::from_stream(chunks)
}

/// Records the answer (a checkpoint every `checkpoint_every` exchanges; idle conversations
/// are checkpointed by the sweeper), then releases the conversation.
pub async fn finish_answer(
    app: Arc<App>,
    mut guard: Guard,
    answer: Option<Answer>,
    sent_tokens: u32,
) {
    let inline =
        guard.as_ref().is_none_or(|conv| !conv.answer_needs_io(app.config.checkpoint_every));
    let every = app.config.checkpoint_every;
    if let Some(answer) = &answer {
        let billed = answer.billed;
        app.metrics.billed_uncached.fetch_add(billed.uncached, Relaxed);
        app.metrics.billed_cache_write.fetch_add(billed.cache_write, Relaxed);
        app.metrics.billed_cache_read.fetch_add(billed.cache_read, Relaxed);
    }
    let metrics_app = app.clone();
    let finish = move || {
        let mut evicted = 0;
        if let Some(conv) = guard.as_mut()
            && let Some(answer) = answer
        {
            let before = conv.bill().clone();
            match conv.record_answer(&answer, sent_tokens) {
                Ok(n) => evicted = n,
                Err(error) => {
                    tracing::warn!(session = conv.key(), %error, "proxy: answer not recorded")
                }
            }
            metrics_app.bills.record(&metrics_app.metrics, conv.key(), &before, conv.bill());
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
    let evicted = if inline { finish() } else { app.pool.run(finish).await.unwrap_or(0) };
    app.metrics.compactions.fetch_add(evicted as u64, Relaxed);
    app.enforce_cap().await;
}

/// Releases a conversation after a request that got no answer (it stays dirty: the sweeper
/// checkpoints it when idle).
pub fn release(app: Arc<App>, guard: Guard) {
    drop(guard);
    tokio::spawn(async move { app.enforce_cap().await });
}
