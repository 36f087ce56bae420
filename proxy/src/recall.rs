//! The recall tool, answered by the proxy: when the model's answer calls only
//! `ctxwin_recall` (to read a tool output the proxy cut), the proxy sends the archived text
//! back to the model itself, up to [`RECALL_ROUNDS`] follow-ups, and the client gets one
//! answer: every round's content without the recall calls, their usage summed. An answer
//! that calls the client's tools too loses only its recall calls. Nothing of the exchange is
//! stored (the client's next request does not carry it); the bill counts every call.
//!
//! A streamed answer passes through as it came until a recall call starts; from there it is
//! held. At its end, when it called only the recall tool, the follow-up is sent streamed and
//! its events continue the client's stream (its opening dropped, its blocks numbered after
//! the client's); else the held rest goes on without the recall calls. A stream without a
//! recall call reaches the client byte for byte.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::app::{App, Guard};
use crate::assemble::{self, Answer, StreamAssembler};
use crate::config::RECALL_ROUNDS;
use crate::conv::ConvError;
use crate::errors::{Failure, stream_error_event, upstream_failure};
use crate::respond;
use crate::upstream;
use crate::wire::{
    AnswerCalls, Provider, RecallResult, RecallStream, answer_calls, follow_up_body, merge_answers,
    message_as_answer,
};

/// A forwarded request, as a follow-up repeats it.
pub struct Sent<'a> {
    /// Where it went.
    pub url: &'a str,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// The body forwarded.
    pub body: Bytes,
    /// Its estimated tokens.
    pub tokens: u32,
    /// Tokens the budget left after it: what recalled text may take.
    pub room: u32,
    /// When it was sent.
    pub at: Instant,
}

/// The client's response to a request whose body declared the recall tool: the upstream's
/// answer as it came when it calls no recall (a stream, an error), else the rounds' answers
/// merged. The conversation (`guard`) records the answer the client gets.
///
/// # Errors
/// As [`respond::answer`].
pub async fn answer(
    app: &Arc<App>,
    provider: Provider,
    guard: Guard,
    first: reqwest::Response,
    sent: Sent<'_>,
) -> Result<Response, Failure> {
    let status = upstream::status(&first);
    if !status.is_success() {
        return respond::answer(app, provider, guard, first, sent.tokens, sent.at).await;
    }
    if upstream::is_stream(&first) {
        let headers = upstream::client_headers(first.headers());
        let waited = sent.at.elapsed();
        let body = relay(app.clone(), provider, guard, first, &sent);
        return Ok(respond::response(status, headers, body, waited));
    }
    let headers = upstream::client_headers(first.headers());
    let body = match first.bytes().await {
        Ok(body) => body,
        Err(error) => {
            respond::release(app.clone(), guard);
            return Err(upstream_failure(&app.config, &error).waited(sent.at.elapsed()));
        }
    };
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    let calls = parsed.as_ref().map(|v| answer_calls(provider, v)).unwrap_or_default();
    let (Some(parsed), false) = (parsed, calls.recall.is_empty()) else {
        let answer = assemble::from_body(provider, &body);
        let waited = sent.at.elapsed();
        return Ok(respond::answered(
            app,
            guard,
            (status, headers),
            body,
            answer,
            sent.tokens,
            waited,
        ));
    };
    let first_prompt = assemble::from_body(provider, &body).and_then(|a| a.prompt_tokens);
    let (guard, answers) = rounds(app, provider, guard, parsed, calls, &sent).await?;
    let merged = merge_answers(provider, &answers).and_then(|m| serde_json::to_vec(&m).ok());
    let body = merged.map_or(body, Bytes::from);
    let mut answer = assemble::from_body(provider, &body);
    if let Some(answer) = answer.as_mut() {
        // The session's calibration compares the first call's prompt with its estimate.
        answer.prompt_tokens = first_prompt;
    }
    let waited = sent.at.elapsed();
    Ok(respond::answered(app, guard, (status, headers), body, answer, sent.tokens, waited))
}

/// Answers the recall calls of `first` (`calls`) round after round while an answer calls
/// only the recall tool: the archived texts read on the pool, the follow-up sent. Returns
/// every round's answer, the last one's included (a follow-up that fails ends the rounds with
/// what came before it).
async fn rounds(
    app: &Arc<App>,
    provider: Provider,
    mut guard: Guard,
    first: Value,
    mut calls: AnswerCalls,
    sent: &Sent<'_>,
) -> Result<(Guard, Vec<Value>), Failure> {
    let (mut answers, mut current, mut body, mut room) =
        (Vec::new(), first, sent.body.clone(), sent.room);
    for _ in 0..RECALL_ROUNDS {
        if calls.recall.is_empty() || calls.others > 0 {
            break;
        }
        let asked = std::mem::take(&mut calls.recall);
        let (back, read) = app
            .on_pool(guard, move |guard| {
                Ok(guard.as_ref().ok_or(ConvError::Unloaded)?.recall_results(&asked, room))
            })
            .await?;
        guard = back;
        let Ok((results, used)) = read else { break };
        room = room.saturating_sub(used);
        let Some(next) = follow_up_body(provider, &body, &current, &results) else { break };
        let next = Bytes::from(next);
        app.metrics.recall_rounds.fetch_add(1, Relaxed);
        let Some(answer) = follow_up(app, sent, next.clone()).await else { break };
        answers.push(std::mem::replace(&mut current, answer));
        body = next;
        calls = answer_calls(provider, &current);
    }
    answers.push(current);
    Ok((guard, answers))
}

/// The upstream's answer to follow-up `body`, when it is a whole successful body.
async fn follow_up(app: &App, sent: &Sent<'_>, body: Bytes) -> Option<Value> {
    let response = upstream::post_json(&app.client, &app.config, sent.url, sent.headers, body);
    let response = match response.await {
        Ok(response) if upstream::status(&response).is_success() => response,
        Ok(response) => {
            let status = response.status().as_u16();
            tracing::warn!(
                status,
                "proxy: the upstream refused a recall follow-up; answering with what came before"
            );
            return None;
        }
        Err(failure) => {
            tracing::warn!(reason = %failure.message, "proxy: a recall follow-up failed; answering with what came before");
            return None;
        }
    };
    let bytes = response.bytes().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What a stream's follow-ups repeat of the forwarded request (owned by the stream's task).
struct Follow {
    url: String,
    headers: HeaderMap,
    body: Bytes,
    room: u32,
}

/// Chunks on their way to the client.
type Chunks = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// The client's stream for a streamed answer to a body that declared the recall tool
/// ([`stream_rounds`]); the answer the client got is recorded at its end.
fn relay(
    app: Arc<App>,
    provider: Provider,
    guard: Guard,
    upstream: reqwest::Response,
    sent: &Sent<'_>,
) -> Body {
    let follow = Follow {
        url: sent.url.to_string(),
        headers: sent.headers.clone(),
        body: sent.body.clone(),
        room: sent.room,
    };
    let tokens = sent.tokens;
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let done = stream_rounds(&app, provider, guard, upstream, follow, &tx).await;
        drop(tx);
        if let Some((guard, answer)) = done {
            respond::finish_answer(app, guard, answer, tokens).await;
        }
    });
    let chunks =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    Body::from_stream(chunks)
}

/// Passes the rounds' streams on ([`RecallStream`]) and answers the recall calls between
/// them. Returns the conversation and the answer the client got (`None` when a stream broke:
/// the client got an error event), or nothing when the conversation was lost (a task that
/// panicked).
async fn stream_rounds(
    app: &Arc<App>,
    provider: Provider,
    mut guard: Guard,
    upstream: reqwest::Response,
    mut follow: Follow,
    tx: &Chunks,
) -> Option<(Guard, Option<Answer>)> {
    let (mut round, mut response) = (RecallStream::new(provider), upstream);
    let mut answers: Vec<Answer> = Vec::new();
    loop {
        let answer = match pump(app, provider, &mut round, response, tx).await {
            Ok(answer) => answer,
            Err(reason) => {
                tracing::warn!(reason = %reason, "proxy: stream incomplete; the answer is not recorded");
                send(tx, stream_error_event(provider, &reason).into_bytes()).await;
                return Some((guard, None));
            }
        };
        let shaped = message_as_answer(provider, &answer.message);
        let calls = answer_calls(provider, &shaped);
        let last_round = answers.len() >= RECALL_ROUNDS;
        if !round.holding() || calls.others > 0 || calls.recall.is_empty() || last_round {
            send(tx, round.release(true, calls.others > 0)).await;
            answers.push(answer);
            break;
        }
        let (back, results) = recall_results(app, guard, calls, follow.room).await?;
        guard = back;
        let next = results.as_ref().and_then(|(results, used)| {
            follow.room = follow.room.saturating_sub(*used);
            follow_up_body(provider, &follow.body, &shaped, results)
        });
        answers.push(answer);
        let Some(next) = next.map(Bytes::from) else {
            send(tx, round.release(true, false)).await;
            break;
        };
        send(tx, round.release(false, false)).await;
        app.metrics.recall_rounds.fetch_add(1, Relaxed);
        let sent = upstream::post_json(
            &app.client,
            &app.config,
            &follow.url,
            &follow.headers,
            next.clone(),
        );
        match sent.await {
            Ok(next_response)
                if upstream::status(&next_response).is_success()
                    && upstream::is_stream(&next_response) =>
            {
                (follow.body, response, round) = (next, next_response, round.next_round());
            }
            _ => {
                tracing::warn!(
                    "proxy: a streamed recall follow-up failed; the client's stream ends with what came before"
                );
                send(tx, round.take_ending()).await;
                break;
            }
        }
    }
    Some((guard, merged(provider, answers)))
}

/// The results of recall `calls` read on the pool, and the tokens they take (`None` when
/// the conversation is gone); `None` overall when the task panicked.
async fn recall_results(
    app: &App,
    guard: Guard,
    calls: AnswerCalls,
    room: u32,
) -> Option<(Guard, Option<(Vec<RecallResult>, u32)>)> {
    let asked = calls.recall;
    let read = app.on_pool(guard, move |guard| {
        Ok(guard.as_ref().ok_or(ConvError::Unloaded)?.recall_results(&asked, room))
    });
    match read.await {
        Ok((guard, read)) => Some((guard, read.ok())),
        Err(failure) => {
            tracing::warn!(reason = %failure.message, "proxy: reading recalled outputs failed");
            None
        }
    }
}

/// Passes one round's stream on, assembling its answer on the side.
///
/// # Errors
/// Why the stream broke off (an upstream error, a stall, no final event).
async fn pump(
    app: &App,
    provider: Provider,
    round: &mut RecallStream,
    upstream: reqwest::Response,
    tx: &Chunks,
) -> Result<Answer, String> {
    let timeout = app.config.upstream_timeout;
    let mut assembler = StreamAssembler::new(provider);
    let mut stream = upstream.bytes_stream();
    loop {
        match tokio::time::timeout(timeout, stream.next()).await {
            Ok(Some(Ok(chunk))) => {
                assembler.feed(&chunk);
                send(tx, round.feed(&chunk)).await;
            }
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(format!("upstream stream broke: {error}")),
            Err(_) => return Err(format!("upstream stream stalled for {timeout:?}")),
        }
    }
    if !round.holding() {
        // Bytes after the last whole event, as they came.
        send(tx, round.release(true, true)).await;
    }
    assembler.finish().ok_or_else(|| "upstream stream ended before its final event".into())
}

/// Sends `bytes` to the client, unless empty (a client gone is not an error: the answer is
/// still recorded).
async fn send(tx: &Chunks, bytes: Vec<u8>) {
    if !bytes.is_empty() {
        let _ = tx.send(Ok(Bytes::from(bytes))).await;
    }
}

/// The rounds' answers as the one the client got: their messages merged without the
/// recall calls, the prompt billed by all of them, the first one's prompt for calibration.
fn merged(provider: Provider, answers: Vec<Answer>) -> Option<Answer> {
    let shaped: Vec<Value> =
        answers.iter().map(|a| message_as_answer(provider, &a.message)).collect();
    let merged = serde_json::to_vec(&merge_answers(provider, &shaped)?).ok()?;
    let mut answer = assemble::from_body(provider, &merged)?;
    answer.prompt_tokens = answers.first().and_then(|a| a.prompt_tokens);
    for billed in answers.iter().map(|a| a.billed) {
        answer.billed.uncached += billed.uncached;
        answer.billed.cache_write += billed.cache_write;
        answer.billed.cache_read += billed.cache_read;
    }
    Some(answer)
}
