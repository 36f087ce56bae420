//! The fake provider: answers each request with the session's scripted next turn (as JSON or
//! as a byte-exact SSE stream), after validating it like the real API and billing it with the
//! provider's cache model on the session's simulated clock.
//!
//! A request names its conversation and step in the `x-bill-conv` and `x-bill-step` headers
//! (the proxy forwards a client's headers); the step also gives the simulated time. A request
//! without them (something the proxy sent on its own) is counted and refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::cache::{AnthropicCache, OpenAiCache, Usage};
use crate::conversation::{Conversation, Provider};
use crate::rng::Rng;
use crate::session::Session;
use crate::tokens::{self, Counter};
use crate::validate::{self, Emitted};

/// What the upstream saw and did for one request.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// The conversation (`x-bill-conv`).
    pub conv: usize,
    /// The step (`x-bill-step`).
    pub step: usize,
    /// The status it answered.
    pub status: u16,
    /// Why it refused.
    pub reason: Option<String>,
    /// The bill.
    pub usage: Usage,
    /// `Edit` calls in the answer.
    pub edits: usize,
    /// Of them, those whose `old_string` was not visible in the request.
    pub hidden: usize,
    /// Of the hidden, those whose source `Read` result was in the request (reduced), not gone.
    pub hidden_cut: usize,
    /// The hidden ones' source `Read` call ids, each with whether its result was in the
    /// request (reduced) rather than gone.
    pub hidden_reads: Vec<(String, bool)>,
    /// Why its cache read did not reach the messages ([`crate::cache::miss_cause`]), `-`
    /// when it did.
    pub miss: &'static str,
    /// Its own time, from the request read to the response ready, µs.
    pub upstream_us: u64,
    /// The request body's size.
    pub body_bytes: usize,
    /// It asked for a stream.
    pub stream: bool,
}

struct Script {
    conversation: Arc<Conversation>,
    emitted: Emitted,
    output_tokens: Vec<u64>,
}

#[derive(Default)]
struct Ledger {
    anthropic: AnthropicCache,
    openai: OpenAiCache,
    records: Vec<Record>,
    streams: HashMap<(usize, usize), Vec<u8>>,
    /// Each conversation's last billed prompt, as prefix hashes (for [`Record::miss`]).
    last_prefixes: HashMap<usize, Vec<u64>>,
    unscripted: usize,
}

/// A running fake upstream.
pub struct Upstream {
    scripts: Vec<Script>,
    /// How long the "model" takes to answer, ms (counted in the upstream's time).
    answer_ms: u64,
    counter: Mutex<Counter>,
    ledger: Mutex<Ledger>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Upstream {
    /// Serves `conversations` (conversation `i` answers `x-bill-conv: i`) on a loopback port.
    /// The "model" answers after `answer_ms`.
    pub async fn start(
        conversations: Vec<Arc<Conversation>>,
        answer_ms: u64,
    ) -> (SocketAddr, Arc<Upstream>) {
        let scripts = conversations
            .into_iter()
            .map(|conversation| {
                let emitted = Emitted::of(&conversation);
                let output_tokens = conversation
                    .steps
                    .iter()
                    .map(|s| u64::from(tokens::count(&s.answer["content"].to_string())))
                    .collect();
                Script { conversation, emitted, output_tokens }
            })
            .collect();
        let upstream = Arc::new(Upstream {
            scripts,
            answer_ms,
            counter: Mutex::default(),
            ledger: Mutex::default(),
        });
        let router = Router::new()
            .route("/v1/messages", post(handle))
            .route("/v1/chat/completions", post(handle))
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(upstream.clone());
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake upstream");
        let addr = listener.local_addr().expect("the fake upstream's address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        (addr, upstream)
    }

    /// Every request's record so far, in arrival order.
    pub fn records(&self) -> Vec<Record> {
        lock(&self.ledger).records.clone()
    }

    /// The stream bytes it sent for a step (the last time it answered that step).
    pub fn stream_bytes(&self, conv: usize, step: usize) -> Option<Vec<u8>> {
        lock(&self.ledger).streams.get(&(conv, step)).cloned()
    }

    /// Requests that named no scripted step (the proxy's own calls).
    pub fn unscripted(&self) -> usize {
        lock(&self.ledger).unscripted
    }

    fn process(&self, conv: usize, step: usize, bytes: &[u8]) -> (Record, Result<Reply, String>) {
        let mut record = Record { conv, step, body_bytes: bytes.len(), ..Record::default() };
        let Some(script) = self.scripts.get(conv).filter(|s| step < s.conversation.steps.len())
        else {
            return (record, Err(format!("no scripted step {step} of conversation {conv}")));
        };
        let conversation = &script.conversation;
        let body: Value = match serde_json::from_slice(bytes) {
            Ok(body) => body,
            Err(e) => return (record, Err(format!("the body is not JSON: {e}"))),
        };
        record.stream = body["stream"] == json!(true);
        let checked = match conversation.provider {
            Provider::Anthropic => validate::anthropic(&body, &script.emitted),
            Provider::OpenAi => validate::openai(&body),
        };
        if let Err(reason) = checked {
            return (record, Err(reason));
        }
        let scripted = &conversation.steps[step];
        if !scripted.edits.is_empty() {
            let texts = validate::visible_texts(&body);
            let results = validate::result_ids(&body);
            for edit in &scripted.edits {
                record.edits += 1;
                if !texts.iter().any(|t| t.contains(&edit.old_string)) {
                    record.hidden += 1;
                    let cut = results.contains(&edit.read_id);
                    record.hidden_cut += usize::from(cut);
                    record.hidden_reads.push((edit.read_id.clone(), cut));
                }
            }
        }
        let layout = {
            let mut counter = lock(&self.counter);
            match conversation.provider {
                Provider::Anthropic => counter.anthropic(&body),
                Provider::OpenAi => counter.openai(&body),
            }
        };
        let usage = {
            let mut ledger = lock(&self.ledger);
            let anthropic = conversation.provider == Provider::Anthropic;
            let miss = crate::cache::miss_cause(
                anthropic.then_some(&ledger.anthropic),
                (!anthropic).then_some(&ledger.openai),
                ledger.last_prefixes.get(&conv).map(Vec::as_slice),
                &layout,
                scripted.at_ms,
            );
            let usage = match conversation.provider {
                Provider::Anthropic => ledger.anthropic.bill(&layout, scripted.at_ms),
                Provider::OpenAi => ledger.openai.bill(&layout, scripted.at_ms),
            };
            ledger.last_prefixes.insert(conv, crate::tokens::prefix_hashes(&layout.units));
            record.miss = if usage.reads_messages { "-" } else { miss };
            usage
        };
        record.usage = usage;
        record.status = 200;
        let output = script.output_tokens[step];
        let id = format!("{conv}x{step}");
        let include_usage = body["stream_options"]["include_usage"] == json!(true);
        let reply = match (conversation.provider, record.stream) {
            (Provider::Anthropic, false) => {
                Reply::Json(anthropic_message(conversation, &scripted.answer, &id, &usage, output))
            }
            (Provider::Anthropic, true) => {
                Reply::Sse(anthropic_events(conversation, &scripted.answer, &id, &usage, output))
            }
            (Provider::OpenAi, false) => {
                Reply::Json(openai_completion(&scripted.answer, &id, &usage, output))
            }
            (Provider::OpenAi, true) => {
                Reply::Sse(openai_chunks(&scripted.answer, &id, &usage, output, include_usage))
            }
        };
        if let Reply::Sse(bytes) = &reply {
            lock(&self.ledger).streams.insert((conv, step), bytes.clone());
        }
        (record, Ok(reply))
    }
}

enum Reply {
    Json(String),
    Sse(Vec<u8>),
}

fn header(headers: &HeaderMap, name: &str) -> Option<usize> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

async fn handle(
    State(upstream): State<Arc<Upstream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let conv = header(&headers, "x-bill-conv").unwrap_or(0);
    let Some(step) = header(&headers, "x-bill-step") else {
        lock(&upstream.ledger).unscripted += 1;
        return error(
            StatusCode::BAD_REQUEST,
            "no x-bill-step header: not a request of the scripted session",
        );
    };
    let worker = upstream.clone();
    let Ok((mut record, reply)) =
        tokio::task::spawn_blocking(move || worker.process(conv, step, &body)).await
    else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "the fake upstream's worker failed");
    };
    if upstream.answer_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(upstream.answer_ms)).await;
    }
    let response = match reply {
        Ok(Reply::Json(text)) => {
            let mut response = text.into_response();
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().expect("a header value"));
            response
        }
        Ok(Reply::Sse(bytes)) => {
            // Cut where a network would: not at event boundaries.
            let mut rng = Rng::new((conv as u64) << 32 | step as u64);
            let mut chunks = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                let end = (at + rng.range(40, 3_000)).min(bytes.len());
                chunks.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(&bytes[at..end])));
                at = end;
            }
            let mut response = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
            response
                .headers_mut()
                .insert("content-type", "text/event-stream".parse().expect("a header value"));
            response
        }
        Err(reason) => {
            record.status = 400;
            record.reason = Some(reason.clone());
            error(StatusCode::BAD_REQUEST, &reason)
        }
    };
    record.upstream_us = started.elapsed().as_micros() as u64;
    lock(&upstream.ledger).records.push(record);
    response
}

fn error(status: StatusCode, message: &str) -> Response {
    let body =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    let mut response = (status, body.to_string()).into_response();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("a header value"));
    response
}

fn anthropic_usage(usage: &Usage, output: u64) -> Value {
    json!({"input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_write, "cache_read_input_tokens": usage.cache_read, "output_tokens": output})
}

fn anthropic_message(
    conversation: &Conversation,
    answer: &Value,
    id: &str,
    usage: &Usage,
    output: u64,
) -> String {
    json!({"id": format!("msg_01bench{id}"), "type": "message", "role": "assistant", "model": conversation.model,
        "content": answer["content"], "stop_reason": Session::stop_reason(answer), "stop_sequence": null,
        "usage": anthropic_usage(usage, output)})
    .to_string()
}

/// `text` in about `n` pieces, cut at character boundaries.
fn pieces(text: &str, n: usize) -> Vec<&str> {
    let size = text.len().div_ceil(n.max(1)).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn anthropic_events(
    conversation: &Conversation,
    answer: &Value,
    id: &str,
    usage: &Usage,
    output: u64,
) -> Vec<u8> {
    let mut out = String::new();
    let mut event =
        |name: &str, data: Value| out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    let mut start_usage = anthropic_usage(usage, 1);
    start_usage["output_tokens"] = json!(1);
    event(
        "message_start",
        json!({"type": "message_start", "message": {"id": format!("msg_01bench{id}"), "type": "message", "role": "assistant", "model": conversation.model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage}}),
    );
    event("ping", json!({"type": "ping"}));
    for (index, block) in answer["content"].as_array().into_iter().flatten().enumerate() {
        let delta = |d: Value| json!({"type": "content_block_delta", "index": index, "delta": d});
        match block["type"].as_str().unwrap_or("") {
            "thinking" => {
                event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                );
                for piece in pieces(block["thinking"].as_str().unwrap_or(""), 4) {
                    event(
                        "content_block_delta",
                        delta(json!({"type": "thinking_delta", "thinking": piece})),
                    );
                }
                event(
                    "content_block_delta",
                    delta(json!({"type": "signature_delta", "signature": block["signature"]})),
                );
            }
            "text" => {
                let mut start = json!({"type": "text", "text": ""});
                if block.get("citations").is_some() {
                    start["citations"] = json!([]);
                }
                event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": start}),
                );
                for citation in block["citations"].as_array().into_iter().flatten() {
                    event(
                        "content_block_delta",
                        delta(json!({"type": "citations_delta", "citation": citation})),
                    );
                }
                for piece in pieces(block["text"].as_str().unwrap_or(""), 3) {
                    event(
                        "content_block_delta",
                        delta(json!({"type": "text_delta", "text": piece})),
                    );
                }
            }
            "tool_use" | "server_tool_use" => {
                event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": {"type": block["type"], "id": block["id"], "name": block["name"], "input": {}}}),
                );
                let input = block["input"].to_string();
                for piece in pieces(&input, 3) {
                    event(
                        "content_block_delta",
                        delta(json!({"type": "input_json_delta", "partial_json": piece})),
                    );
                }
            }
            _ => {
                event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": block}),
                );
            }
        }
        event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
    }
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": Session::stop_reason(answer), "stop_sequence": null}, "usage": {"output_tokens": output}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    out.into_bytes()
}

fn openai_usage(usage: &Usage, output: u64) -> Value {
    json!({"prompt_tokens": usage.prompt(), "completion_tokens": output, "total_tokens": usage.prompt() + output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}})
}

fn finish_reason(answer: &Value) -> &'static str {
    if answer.get("tool_calls").is_some() { "tool_calls" } else { "stop" }
}

fn openai_completion(answer: &Value, id: &str, usage: &Usage, output: u64) -> String {
    let mut message = answer.clone();
    message["refusal"] = Value::Null;
    json!({"id": format!("chatcmpl-bench{id}"), "object": "chat.completion", "created": 1_773_480_000, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(answer)}],
        "usage": openai_usage(usage, output), "system_fingerprint": "fp_bench"})
    .to_string()
}

fn openai_chunks(
    answer: &Value,
    id: &str,
    usage: &Usage,
    output: u64,
    include_usage: bool,
) -> Vec<u8> {
    let mut out = String::new();
    let mut chunk = |choices: Value, usage: Option<Value>| {
        let mut data = json!({"id": format!("chatcmpl-bench{id}"), "object": "chat.completion.chunk", "created": 1_773_480_000, "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_bench", "choices": choices});
        if let Some(usage) = usage {
            data["usage"] = usage;
        }
        out.push_str(&format!("data: {data}\n\n"));
    };
    let choice = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    let content = answer["content"].as_str();
    chunk(
        choice(
            json!({"role": "assistant", "content": content.map(|_| ""), "refusal": null}),
            Value::Null,
        ),
        None,
    );
    for piece in pieces(content.unwrap_or(""), 4) {
        chunk(choice(json!({"content": piece}), Value::Null), None);
    }
    for (index, call) in answer["tool_calls"].as_array().into_iter().flatten().enumerate() {
        chunk(
            choice(
                json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}]}),
                Value::Null,
            ),
            None,
        );
        for piece in pieces(call["function"]["arguments"].as_str().unwrap_or(""), 3) {
            chunk(
                choice(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    Value::Null,
                ),
                None,
            );
        }
    }
    chunk(choice(json!({}), json!(finish_reason(answer))), None);
    if include_usage {
        chunk(json!([]), Some(openai_usage(usage, output)));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}
