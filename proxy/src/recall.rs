//! The recall tool, answered by the proxy: when the model's answer calls only
//! `ctxwin_recall` (to read a tool output the proxy cut), the proxy sends the archived text
//! back to the model itself, up to [`RECALL_ROUNDS`] follow-ups, and the client gets one
//! answer: every round's content without the recall calls, their usage summed. An answer
//! that calls the client's tools too loses only its recall calls. Nothing of the exchange is
//! stored (the client's next request does not carry it); the bill counts every call.
//!
//! Non-streamed answers only: a stream passes through as it came.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use crate::app::{App, Guard};
use crate::assemble;
use crate::config::RECALL_ROUNDS;
use crate::conv::ConvError;
use crate::errors::{Failure, upstream_failure};
use crate::respond;
use crate::upstream;
use crate::wire::{AnswerCalls, Provider, answer_calls, follow_up_body, merge_answers};

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
    if upstream::is_stream(&first) || !status.is_success() {
        return respond::answer(app, provider, guard, first, sent.tokens, sent.at).await;
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
