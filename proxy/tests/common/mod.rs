//! An in-process fake upstream (OpenAI and Anthropic) that records what it receives and
//! injects faults, and helpers to run a proxy in front of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ctxwin_proxy::{App, ProxyConfig};
use serde_json::{Value, json};

/// What the fake upstream does with the next requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Waits this long before answering.
    Slow(u64),
    /// Answers 500 with an error body.
    Fail500,
    /// Streams half an answer and closes the connection.
    Truncate,
    /// Streams slowly: one chunk every this many ms.
    SlowStream(u64),
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    /// The query string, as the upstream got it.
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Debug)]
pub struct Fake {
    pub received: Mutex<Vec<Received>>,
    pub mode: Mutex<Mode>,
    /// Texts of the next OpenAI answers, in order (then `done N`).
    pub answers: Mutex<std::collections::VecDeque<String>>,
    counter: AtomicU64,
}

impl Fake {
    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    pub fn last(&self) -> Received {
        self.received.lock().unwrap().last().cloned().unwrap()
    }
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
    /// The next OpenAI answer says `text`.
    pub fn answer_next(&self, text: &str) {
        self.answers.lock().unwrap().push_back(text.to_string());
    }
}

pub async fn start_fake() -> (SocketAddr, Arc<Fake>) {
    let fake = Arc::new(Fake {
        received: Mutex::default(),
        mode: Mutex::new(Mode::Normal),
        answers: Mutex::default(),
        counter: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, fake)
}

fn record(fake: &Fake, path: &str, headers: HeaderMap, body: Bytes) -> (Mode, u64) {
    record_query(fake, path, None, headers, body)
}

fn record_query(
    fake: &Fake,
    path: &str,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (Mode, u64) {
    fake.received.lock().unwrap().push(Received { path: path.into(), query, headers, body });
    (*fake.mode.lock().unwrap(), fake.counter.fetch_add(1, Ordering::SeqCst) + 1)
}

async fn models(State(fake): State<Arc<Fake>>, headers: HeaderMap) -> Response {
    record(&fake, "/v1/models", headers, Bytes::new());
    let mut response = json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        .to_string()
        .into_response();
    response.headers_mut().insert("x-fake", "yes".parse().unwrap());
    response
}

async fn embeddings(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let echo = body.clone();
    record(&fake, "/v1/embeddings", headers, body);
    Response::new(Body::from(echo))
}

async fn before(mode: Mode) -> Option<Response> {
    match mode {
        Mode::Slow(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            None
        }
        Mode::Fail500 => Some(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"message": "fake upstream exploded", "type": "server_error"}})
                    .to_string(),
            )
                .into_response(),
        ),
        _ => None,
    }
}

fn sse(chunks: Vec<String>, mode: Mode) -> Response {
    let delay = match mode {
        Mode::SlowStream(ms) => ms,
        // Flushed chunk by chunk, so the client sees a response that stops midway.
        Mode::Truncate => 20,
        _ => 0,
    };
    let truncate = mode == Mode::Truncate;
    let n = chunks.len();
    let stream = futures_util::stream::iter(chunks.into_iter().enumerate()).then(
        move |(i, chunk)| async move {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if truncate && i >= n / 2 {
                return Err(std::io::Error::other("fake upstream cut the stream"));
            }
            Ok::<_, std::io::Error>(Bytes::from(chunk))
        },
    );
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    response
}

use futures_util::StreamExt;

async fn openai(
    State(fake): State<Arc<Fake>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let prompt = (body.len() / 4) as u64;
    let (mode, n) = record_query(&fake, "/v1/chat/completions", query, headers, body);
    if let Some(response) = before(mode).await {
        return response;
    }
    let last_role =
        request["messages"].as_array().and_then(|m| m.last()).map(|m| m["role"].clone());
    let tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let call = tools && last_role == Some(json!("user"));
    let tool_name = request["tools"][0]["function"]["name"].as_str().unwrap_or("tool").to_string();
    let args = format!("{{\"n\": {n}}}");
    let call_id = format!("call_{n}");
    let text = fake.answers.lock().unwrap().pop_front().unwrap_or_else(|| format!("done {n}"));
    if request["stream"] == json!(true) {
        let mut chunks = vec![format!(
            "data: {}\n\n",
            json!({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        )];
        if call {
            chunks.push(format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": tool_name, "arguments": ""}}]}}]})));
            for piece in [&args[..3], &args[3..]] {
                chunks.push(format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}}]})));
            }
        } else {
            for word in text.split_inclusive(' ') {
                chunks.push(format!(
                    "data: {}\n\n",
                    json!({"choices": [{"index": 0, "delta": {"content": word}}]})
                ));
            }
        }
        let finish = if call { "tool_calls" } else { "stop" };
        chunks.push(format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        ));
        chunks.push(format!("data: {}\n\n", json!({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}})));
        chunks.push("data: [DONE]\n\n".to_string());
        return sse(chunks, mode);
    }
    let message = if call {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": tool_name, "arguments": args}}], "refusal": null})
    } else {
        json!({"role": "assistant", "content": text, "refusal": null})
    };
    let finish = if call { "tool_calls" } else { "stop" };
    let body = json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 1, "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}});
    let mut response = body.to_string().into_response();
    response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    response
}

async fn anthropic(
    State(fake): State<Arc<Fake>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let prompt = (body.len() / 4) as u64;
    let (mode, n) = record_query(&fake, "/v1/messages", query, headers, body);
    if let Some(response) = before(mode).await {
        return response;
    }
    let last =
        request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
    let last_is_result =
        last["content"].as_array().is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"));
    let tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let call = tools && last["role"] == "user" && !last_is_result;
    let tool_name = request["tools"][0]["name"].as_str().unwrap_or("tool").to_string();
    let thinking = request.get("thinking").is_some();
    let mut blocks = Vec::new();
    if thinking {
        blocks.push(json!({"type": "thinking", "thinking": format!("let me think {n}"), "signature": format!("sig-{n}-AAAA")}));
    }
    if call {
        blocks.push(json!({"type": "text", "text": format!("calling {n}")}));
        blocks.push(json!({"type": "tool_use", "id": format!("toolu_{n}"), "name": tool_name, "input": {"n": n}}));
    } else {
        blocks.push(json!({"type": "text", "text": format!("done {n}")}));
    }
    let usage = json!({"input_tokens": prompt, "output_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
    if request["stream"] == json!(true) {
        let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
        let mut chunks = vec![event(
            "message_start",
            json!({"type": "message_start", "message": {"id": format!("msg_{n}"), "type": "message", "role": "assistant", "content": [], "model": request["model"], "usage": usage}}),
        )];
        for (i, block) in blocks.iter().enumerate() {
            let start = match block["type"].as_str().unwrap() {
                "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                "text" => json!({"type": "text", "text": ""}),
                _ => {
                    json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
                }
            };
            chunks.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": i, "content_block": start}),
            ));
            let delta = match block["type"].as_str().unwrap() {
                "thinking" => vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
                "text" => vec![json!({"type": "text_delta", "text": block["text"]})],
                _ => {
                    let input = block["input"].to_string();
                    let (a, b) = input.split_at(3);
                    vec![
                        json!({"type": "input_json_delta", "partial_json": a}),
                        json!({"type": "input_json_delta", "partial_json": b}),
                    ]
                }
            };
            for d in delta {
                chunks.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": d}),
                ));
            }
            chunks.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        chunks.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": if call {"tool_use"} else {"end_turn"}}, "usage": {"output_tokens": 5}})));
        chunks.push(event("message_stop", json!({"type": "message_stop"})));
        return sse(chunks, mode);
    }
    let body = json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": request["model"], "content": blocks,
        "stop_reason": if call {"tool_use"} else {"end_turn"}, "stop_sequence": null, "usage": usage});
    let mut response = body.to_string().into_response();
    response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    response
}

/// A running proxy.
pub struct Proxy {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

pub fn config(upstream: SocketAddr, state: &Path) -> ProxyConfig {
    ProxyConfig {
        upstream: format!("http://{upstream}"),
        listen: "127.0.0.1:0".parse().unwrap(),
        state_dir: state.to_path_buf(),
        upstream_timeout: Duration::from_secs(5),
        ..ProxyConfig::default()
    }
}

pub async fn start_proxy(config: ProxyConfig) -> Proxy {
    let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = App::new(config).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(ctxwin_proxy::serve(app.clone(), listener, async move {
        let _ = rx.await;
    }));
    let task = tokio::spawn(async move {
        let _ = task.await;
    });
    Proxy { addr, app, stop: Some(tx), task: Some(task) }
}

/// Tool pairs in an OpenAI message list: every tool result answers a call of the assistant
/// message right before its results, and every call is answered.
pub fn openai_pairs_intact(messages: &[Value]) -> Result<(), String> {
    let mut waiting: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or("").to_string();
                let pos = waiting
                    .iter()
                    .position(|w| *w == id)
                    .ok_or(format!("message {i}: orphan result {id}"))?;
                waiting.remove(pos);
            }
            Some(role) => {
                if !waiting.is_empty() {
                    return Err(format!("message {i} ({role}) while calls {waiting:?} wait"));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    waiting.push(call["id"].as_str().unwrap_or("").to_string());
                }
            }
            None => return Err(format!("message {i} has no role")),
        }
    }
    Ok(())
}

/// The same for Anthropic: every tool_result answers a tool_use of the previous assistant turn.
pub fn anthropic_pairs_intact(messages: &[Value]) -> Result<(), String> {
    let mut waiting: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let blocks = m["content"].as_array().cloned().unwrap_or_default();
        if m["role"] == "user" {
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                let id = b["tool_use_id"].as_str().unwrap_or("").to_string();
                let pos = waiting
                    .iter()
                    .position(|w| *w == id)
                    .ok_or(format!("message {i}: orphan result {id}"))?;
                waiting.remove(pos);
            }
            if !waiting.is_empty() {
                return Err(format!("message {i}: calls {waiting:?} unanswered"));
            }
        } else {
            if !waiting.is_empty() {
                return Err(format!("message {i}: calls {waiting:?} unanswered"));
            }
            for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                waiting.push(b["id"].as_str().unwrap_or("").to_string());
            }
        }
    }
    if let Some(first) = messages.first()
        && first["role"] != "user"
    {
        return Err("the first message is not a user turn".into());
    }
    Ok(())
}

/// Archive rows of every conversation under `state` (the shared archive), by session name.
/// A conversation is known by its directory (`<tenant>/<conversation>`), or by its rows alone
/// before its first checkpoint (which creates the directory); its generations (`key#N`) and
/// side sessions (`key@...`) count as that conversation.
pub fn archive_counts(state: &Path) -> Vec<(String, u64)> {
    let archive = ctxwin_std::store::sqlite::SqliteArchive::open(state.join("archive.db")).unwrap();
    let mut keys = std::collections::BTreeSet::new();
    let dirs = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|entry| entry.file_type().unwrap().is_dir())
            .map(|entry| entry.file_name().to_string_lossy().to_string())
            .collect()
    };
    for tenant in dirs(state) {
        for conversation in dirs(&state.join(&tenant)) {
            keys.insert(format!("{tenant}.{conversation}"));
        }
    }
    for name in ctxwin_std::store::ArchiveStore::conversations(&archive, "", "").unwrap() {
        keys.extend(name.split(['#', '@']).next().map(str::to_string));
    }
    keys.into_iter()
        .map(|key| {
            let count = ctxwin_std::store::ArchiveStore::usage(
                &archive,
                &ctxwin_std::store::Scope::local(key.as_str()),
            )
            .unwrap()
            .messages;
            (key, count)
        })
        .collect()
}

/// The key of the conversation a client sending `authorization` names `session`, as the proxy
/// on `state` builds it (under that state directory's secret).
pub fn session_key(state: &Path, authorization: &str, session: &str) -> String {
    use ctxwin_proxy::wire::{Provider, Request};
    let keys = ctxwin_proxy::hash::KeyedHash::for_state_dir(state).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("authorization", authorization.parse().unwrap());
    headers.insert("x-ctxwin-session", session.parse().unwrap());
    let request = Request::parse(Provider::OpenAi, br#"{"model":"m","messages":[]}"#).unwrap();
    ctxwin_proxy::keys::conversation_key(&keys, None, &headers, &request, Provider::OpenAi).unwrap()
}
