//! The recall tool: a tool output the proxy cut names its archived original, the proxy
//! declares `ctxwin_recall` after the client's tools (the same bytes on every request) and
//! answers the model's calls itself; the client sees one answer without them. Against a fake
//! upstream whose model calls the tool when the last message shows the marker.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing;
use common::{config, start_proxy};
use serde_json::{Value, json};

const RECALL: &str = "ctxwin_recall";
const MARKER: &str = "call ctxwin_recall with {\"id\": ";

/// What the fake model does.
#[derive(Default)]
struct Script {
    /// Calls the client's tool beside the recall tool.
    mixed: bool,
    /// Recalls this id instead of the one the marker names.
    force_id: Option<u64>,
    /// Looks for a marker in every message, not only the last.
    anywhere: bool,
    /// Calls the recall tool again after each result (with `anywhere`).
    insist: bool,
    /// Answers a follow-up (a request ending with a recall result) with a 500.
    refuse_follow_up: bool,
}

#[derive(Default)]
struct Model {
    received: Mutex<Vec<Bytes>>,
    script: Mutex<Script>,
    /// The streams sent, in order.
    streamed: Mutex<Vec<String>>,
}

impl Model {
    fn bodies(&self) -> Vec<String> {
        let received = self.received.lock().unwrap();
        received.iter().map(|b| String::from_utf8(b.to_vec()).unwrap()).collect()
    }
}

/// The proxy's configuration in front of `up` with state in `state`, cutting tool outputs
/// over 256 tokens (so a log of the tests' size is cut and its recall declared).
fn cutting(up: SocketAddr, state: &std::path::Path) -> ctxwin_proxy::ProxyConfig {
    ctxwin_proxy::ProxyConfig { observation_limit: Some(256), ..config(up, state) }
}

async fn start_model() -> (SocketAddr, Arc<Model>) {
    let model = Arc::new(Model::default());
    let router = Router::new()
        .route("/v1/messages", routing::post(anthropic))
        .route("/v1/chat/completions", routing::post(openai))
        .with_state(model.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, model)
}

/// Every string inside `value`.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The id the marker in `message` names.
fn marked_id(message: &Value) -> Option<u64> {
    let mut texts = Vec::new();
    strings(message, &mut texts);
    texts.iter().find_map(|text| {
        let after = &text[text.find(MARKER)? + MARKER.len()..];
        after[..after.find('}')?].trim().parse().ok()
    })
}

fn declares(request: &Value, provider_anthropic: bool) -> bool {
    request["tools"].as_array().into_iter().flatten().any(|tool| match provider_anthropic {
        true => tool["name"] == RECALL,
        false => tool["function"]["name"] == RECALL,
    })
}

fn json_response(body: Value) -> Response {
    let mut response = body.to_string().into_response();
    response.headers_mut().insert("content-type", "application/json".parse().unwrap());
    response
}

/// `answer` as the stream the provider would send, split into chunks that cut events.
fn streamed(model: &Model, request: &Value, answer: Value, anthropic: bool) -> Response {
    let sse = match anthropic {
        true => anthropic_events(&answer),
        false => openai_chunks(&answer),
    };
    if request["stream"] != json!(true) {
        return json_response(answer);
    }
    model.streamed.lock().unwrap().push(sse.clone());
    let pieces: Vec<Result<Bytes, std::io::Error>> =
        sse.as_bytes().chunks(37).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let mut response =
        Response::new(axum::body::Body::from_stream(futures_util::stream::iter(pieces)));
    response.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    response
}

fn anthropic_events(answer: &Value) -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = answer.clone();
    start["content"] = json!([]);
    let mut out = event("message_start", json!({"type": "message_start", "message": start}));
    for (i, block) in answer["content"].as_array().unwrap().iter().enumerate() {
        let (opening, delta) = match block["type"].as_str().unwrap() {
            "text" => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            ),
            _ => {
                let mut opening = block.clone();
                opening["input"] = json!({});
                (
                    opening,
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                )
            }
        };
        out += &event(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": opening}),
        );
        out += &event("ping", json!({"type": "ping"}));
        out += &event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": delta}),
        );
        out += &event("content_block_stop", json!({"type": "content_block_stop", "index": i}));
    }
    out += &event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": answer["stop_reason"]}, "usage": {"output_tokens": 5}}),
    );
    out + &event("message_stop", json!({"type": "message_stop"}))
}

fn openai_chunks(answer: &Value) -> String {
    let chunk =
        |choice: Value| format!("data: {}\n\n", json!({"id": answer["id"], "choices": [choice]}));
    let message = &answer["choices"][0]["message"];
    let mut out = chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}}));
    if let Some(text) = message["content"].as_str() {
        out += &chunk(json!({"index": 0, "delta": {"content": text}}));
    }
    for (i, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let mut opening = call.clone();
        opening["index"] = json!(i);
        opening["function"]["arguments"] = json!("");
        out += &chunk(json!({"index": 0, "delta": {"tool_calls": [opening]}}));
        let arguments = call["function"]["arguments"].clone();
        out += &chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": arguments}}]}}),
        );
    }
    out += &chunk(
        json!({"index": 0, "delta": {}, "finish_reason": answer["choices"][0]["finish_reason"]}),
    );
    out += &format!(
        "data: {}\n\n",
        json!({"id": answer["id"], "choices": [], "usage": answer["usage"]})
    );
    out + "data: [DONE]\n\n"
}

async fn anthropic(State(model): State<Arc<Model>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut received = model.received.lock().unwrap();
        received.push(body.clone());
        received.len()
    };
    let last = request["messages"].as_array().unwrap().last().unwrap().clone();
    let recalled = last["content"].as_array().into_iter().flatten().find(|b| {
        b["type"] == "tool_result" && b["tool_use_id"].as_str().unwrap().starts_with("recall_")
    });
    let usage = json!({"input_tokens": body.len() / 4, "output_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
    let (insist, refuse) = {
        let script = model.script.lock().unwrap();
        (script.insist, script.refuse_follow_up)
    };
    if refuse && recalled.is_some() {
        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "overloaded").into_response();
    }
    let marked = match model.script.lock().unwrap().anywhere {
        true => request["messages"].as_array().unwrap().iter().find_map(marked_id),
        false => marked_id(&last),
    };
    let (blocks, stop) = match (recalled, marked) {
        (Some(result), _) if !insist => {
            let text = result["content"].as_str().unwrap_or_default();
            (
                vec![json!({"type": "text", "text": format!("recalled {} bytes", text.len())})],
                "end_turn",
            )
        }
        (_, Some(id)) if declares(&request, true) => {
            let script = model.script.lock().unwrap();
            let id = script.force_id.unwrap_or(id);
            let mut blocks = vec![
                json!({"type": "text", "text": "Reading the whole output."}),
                json!({"type": "tool_use", "id": format!("recall_{n}"), "name": RECALL, "input": {"id": id}}),
            ];
            if script.mixed {
                blocks.push(json!({"type": "tool_use", "id": format!("toolu_{n}"), "name": "Read", "input": {"path": "b.rs"}}));
            }
            (blocks, "tool_use")
        }
        _ => (vec![json!({"type": "text", "text": format!("done {n}")})], "end_turn"),
    };
    let answer = json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": request["model"],
        "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage});
    streamed(&model, &request, answer, true)
}

async fn openai(State(model): State<Arc<Model>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut received = model.received.lock().unwrap();
        received.push(body.clone());
        received.len()
    };
    let last = request["messages"].as_array().unwrap().last().unwrap().clone();
    let recalled =
        last["role"] == "tool" && last["tool_call_id"].as_str().unwrap().starts_with("recall_");
    let call = |id: String, name: &str, arguments: Value| json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}});
    let (message, finish) = match (recalled, marked_id(&last)) {
        (true, _) => {
            let text = last["content"].as_str().unwrap_or_default();
            (
                json!({"role": "assistant", "content": format!("recalled {} bytes", text.len())}),
                "stop",
            )
        }
        (false, Some(id)) if declares(&request, false) => {
            let script = model.script.lock().unwrap();
            let id = script.force_id.unwrap_or(id);
            let mut calls = vec![call(format!("recall_{n}"), RECALL, json!({"id": id}))];
            if script.mixed {
                calls.push(call(format!("call_{n}"), "run_command", json!({"cmd": "ls"})));
            }
            (
                json!({"role": "assistant", "content": "Reading the whole output.", "tool_calls": calls}),
                "tool_calls",
            )
        }
        _ => (json!({"role": "assistant", "content": format!("done {n}")}), "stop"),
    };
    let answer = json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": body.len() / 4, "completion_tokens": 5, "total_tokens": body.len() / 4 + 5,
            "prompt_tokens_details": {"cached_tokens": 0}}});
    streamed(&model, &request, answer, false)
}

const ANTHROPIC_TOOLS: &str = r#"[{"name":"Read","description":"Read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}},"cache_control":{"type":"ephemeral"}}]"#;
const OPENAI_TOOLS: &str = r#"[{"type":"function","function":{"name":"run_command","description":"Run a shell command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}]"#;

/// A log of `lines` lines, each naming `tag`.
fn log(tag: &str, lines: usize) -> String {
    let line = |i: usize| {
        format!("{tag} line {i}: checksum {:08x}", (i as u64 * 2_654_435_761) % (1 << 32))
    };
    (1..=lines).map(line).collect::<Vec<_>>().join("\n")
}

fn anthropic_body(tools: &str, messages: &[Value]) -> String {
    format!(
        r#"{{"model":"claude-test","max_tokens":256,"tools":{tools},"messages":{}}}"#,
        Value::Array(messages.to_vec())
    )
}

fn openai_body(tools: &str, messages: &[Value]) -> String {
    format!(
        r#"{{"model":"gpt-test","tools":{tools},"messages":{}}}"#,
        Value::Array(messages.to_vec())
    )
}

/// An Anthropic conversation whose tool call read `output`.
fn anthropic_read(output: &str) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Read the build log and tell me line 37's checksum."}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "build.log"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output}]}),
    ]
}

fn openai_read(output: &str) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Read the build log and tell me line 37's checksum."}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run_command", "arguments": "{\"cmd\":\"cat build.log\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": output}),
    ]
}

/// The raw `tools` of a body the proxy forwarded (fields in the client's order: `tools`
/// before `messages`).
fn raw_tools(body: &str) -> &str {
    let start = body.find("\"tools\":").unwrap() + "\"tools\":".len();
    &body[start..body.find(",\"messages\":").unwrap()]
}

async fn post(url: &str, body: String, key: &str) -> Value {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .header("x-ctxwin-session", "recall-test")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn metric(url: &str, name: &str) -> u64 {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_a_cut_output_is_recalled_whole_and_the_client_sees_one_answer() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let mut messages = anthropic_read(&output);
    let answer =
        post(&proxy.url("/v1/messages"), anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-a").await;

    let bodies = model.bodies();
    assert_eq!(bodies.len(), 2, "the answer and one follow-up");
    let first: Value = serde_json::from_str(&bodies[0]).unwrap();
    let sent = first["messages"][2]["content"][0]["content"].as_str().unwrap();
    assert!(
        sent.len() < output.len() / 2,
        "the output is cut: {} of {} bytes",
        sent.len(),
        output.len()
    );
    let id = marked_id(&first["messages"][2]).expect("the cut output names its original");
    assert!(sent.ends_with(&format!("{MARKER}{id}}} to read it whole]")), "{sent}");
    // Declared after the client's tools, whose bytes stay as sent.
    let tools = raw_tools(&bodies[0]);
    assert!(tools.starts_with(&ANTHROPIC_TOOLS[..ANTHROPIC_TOOLS.len() - 1]), "{tools}");
    assert_eq!(first["tools"][1]["name"], RECALL);
    // The follow-up repeats the forwarded body and carries the whole original.
    let follow: Value = serde_json::from_str(&bodies[1]).unwrap();
    let cut = bodies[0].rfind("]}").unwrap();
    assert!(bodies[1].starts_with(&bodies[0][..cut]), "the follow-up extends the forwarded body");
    let result = &follow["messages"][4]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["content"], output.as_str(), "the model gets the whole original");
    assert_eq!(follow["messages"][3]["content"][1]["name"], RECALL);

    // The client: one answer, the recall call gone, the rounds' text and usage together.
    let content = answer["content"].as_array().unwrap();
    assert!(content.iter().all(|b| b["type"] == "text"), "{answer}");
    assert_eq!(content[0]["text"], "Reading the whole output.");
    assert_eq!(content[1]["text"], format!("recalled {} bytes", output.len()));
    assert_eq!(answer["stop_reason"], "end_turn");
    let billed = (bodies[0].len() / 4 + bodies[1].len() / 4) as u64;
    assert_eq!(answer["usage"]["input_tokens"], billed);
    assert_eq!(answer["usage"]["output_tokens"], 10);
    assert_eq!(metric(&proxy.url("/metrics"), "ctxwin_proxy_recall_rounds_total").await, 1);

    // The next request: the same tools bytes; nothing of the recall exchange was stored.
    messages.push(json!({"role": "assistant", "content": answer["content"]}));
    messages.push(json!({"role": "user", "content": "Thanks."}));
    let next =
        post(&proxy.url("/v1/messages"), anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-a").await;
    assert_eq!(next["content"][0]["text"], "done 3");
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 3);
    assert_eq!(raw_tools(&bodies[2]), raw_tools(&bodies[0]), "the tools prefix never changes");
    let third: Value = serde_json::from_str(&bodies[2]).unwrap();
    assert_eq!(third["messages"].as_array().unwrap().len(), 5);
    assert!(!bodies[2].contains("recall_1"), "the recall exchange is not in the session");
    assert_eq!(marked_id(&third["messages"][2]), Some(id));
    let history = bodies[0].len() - "]}".len();
    assert!(bodies[2].starts_with(&bodies[0][..history]), "the prefix, marker included, stays");
    // Billed: both calls of the first request (the third's may be counted already: its
    // answer is recorded after it reached the client; the first's before the second began).
    let uncached = r#"ctxwin_proxy_upstream_prompt_tokens_total{kind="uncached"}"#;
    let billed = metric(&proxy.url("/metrics"), uncached).await;
    let (a, b, c) = (bodies[0].len() / 4, bodies[1].len() / 4, bodies[2].len() / 4);
    assert!([a + b, a + b + c].contains(&(billed as usize)), "{billed}: {a} + {b} (+ {c})");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_a_cut_output_is_recalled_whole_and_the_client_sees_one_answer() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        compaction_limit: Some(64),
        ..cutting(up, state.path())
    })
    .await;
    let output = log("build", 120);
    let messages = openai_read(&output);
    let answer =
        post(&proxy.url("/v1/chat/completions"), openai_body(OPENAI_TOOLS, &messages), "sk-o")
            .await;
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 2);
    let first: Value = serde_json::from_str(&bodies[0]).unwrap();
    assert!(marked_id(&first["messages"][2]).is_some(), "{}", first["messages"][2]);
    assert_eq!(first["tools"][1]["function"]["name"], RECALL);
    assert!(raw_tools(&bodies[0]).starts_with(&OPENAI_TOOLS[..OPENAI_TOOLS.len() - 1]));
    let follow: Value = serde_json::from_str(&bodies[1]).unwrap();
    assert_eq!(follow["messages"][4]["role"], "tool");
    assert_eq!(follow["messages"][4]["content"], output.as_str());
    let message = &answer["choices"][0]["message"];
    assert_eq!(
        message["content"],
        format!("Reading the whole output.\n\nrecalled {} bytes", output.len())
    );
    assert!(message.get("tool_calls").is_none(), "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let billed = (bodies[0].len() / 4 + bodies[1].len() / 4) as u64;
    assert_eq!(answer["usage"]["prompt_tokens"], billed);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_answer_reaches_the_client_without_its_recall_calls() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    model.script.lock().unwrap().mixed = true;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let answer = post(
        &proxy.url("/v1/messages"),
        anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output)),
        "sk-m",
    )
    .await;
    assert_eq!(model.bodies().len(), 1, "no follow-up: the client answers its own call");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{answer}");
    assert_eq!(content[1]["name"], "Read");
    assert_eq!(answer["stop_reason"], "tool_use");
    let answer = post(
        &proxy.url("/v1/chat/completions"),
        openai_body(OPENAI_TOOLS, &openai_read(&output)),
        "sk-m-openai",
    )
    .await;
    let calls = answer["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "run_command");
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_of_another_tenant_gets_an_error_result_and_none_of_its_text() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    // Tenant A: a longer conversation, so that its cut output's id is past any of B's.
    let secret = log("SECRET-A", 120);
    let mut messages = Vec::new();
    for i in 0..6 {
        messages.push(json!({"role": "user", "content": format!("question {i}")}));
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {i}")}]}));
    }
    messages.extend(anthropic_read(&secret));
    post(&proxy.url("/v1/messages"), anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-tenant-a")
        .await;
    let bodies = model.bodies();
    let a: Value = serde_json::from_str(&bodies[0]).unwrap();
    let secret_id = marked_id(a["messages"].as_array().unwrap().last().unwrap()).unwrap();
    assert!(bodies[1].contains("SECRET-A line 60"), "A's own recall reads A's output");

    // Tenant B, same session header: its model asks for A's id.
    model.script.lock().unwrap().force_id = Some(secret_id);
    let output = log("build", 120);
    let answer = post(
        &proxy.url("/v1/messages"),
        anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output)),
        "sk-tenant-b",
    )
    .await;
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 4);
    let b: Value = serde_json::from_str(&bodies[2]).unwrap();
    assert!(marked_id(&b["messages"][2]).unwrap() < secret_id, "B has no message {secret_id}");
    let follow: Value = serde_json::from_str(&bodies[3]).unwrap();
    let result = &follow["messages"][4]["content"][0];
    assert_eq!(result["is_error"], true, "{result}");
    assert_eq!(result["content"], format!("no archived output {secret_id} in this conversation"));
    assert!(!bodies[3].contains("SECRET-A"), "none of A's text reaches B");
    assert!(!answer.to_string().contains("SECRET-A"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_or_with_recall_tool_off_nothing_is_declared_or_marked() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let output = log("build", 120);
    // No limit: the body is the client's, byte for byte (as before the recall tool existed).
    let proxy = start_proxy(config(up, state.path())).await;
    let body = anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output));
    post(&proxy.url("/v1/messages"), body.clone(), "sk-n").await;
    let openai = openai_body(OPENAI_TOOLS, &openai_read(&output));
    post(&proxy.url("/v1/chat/completions"), openai.clone(), "sk-n-openai").await;
    assert_eq!(model.bodies(), [body, openai]);
    proxy.stop().await;

    // A limit with recall_tool = false: cut, but no marker and no tool.
    let state = tempfile::tempdir().unwrap();
    let mut cfg = config(up, state.path());
    cfg.apply_toml("[proxy]\nobservation_limit = 256\nrecall_tool = false\n").unwrap();
    let proxy = start_proxy(cfg).await;
    let body = anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output));
    post(&proxy.url("/v1/messages"), body, "sk-n").await;
    let sent = model.bodies().pop().unwrap();
    assert_eq!(raw_tools(&sent), ANTHROPIC_TOOLS);
    assert!(!sent.contains(RECALL), "{sent}");
    assert!(sent.len() < output.len(), "the output was cut");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_of_the_same_name_or_no_client_tools_mean_no_declaration() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let tools = r#"[{"name":"ctxwin_recall","description":"the client's own","input_schema":{"type":"object"}}]"#;
    let output = log("build", 120);
    let answer =
        post(&proxy.url("/v1/messages"), anthropic_body(tools, &anthropic_read(&output)), "sk-c")
            .await;
    let sent = model.bodies().pop().unwrap();
    assert_eq!(raw_tools(&sent), tools);
    assert!(!sent.contains(MARKER), "no marker: the proxy does not answer that tool");
    assert_eq!(answer["content"][0]["text"], "done 1");
    // A request without tools of its own (or an empty list) gets none.
    for (tools, key) in [(None, "sk-c2"), (Some("[ ]"), "sk-c3")] {
        let mut body: Value =
            serde_json::from_str(&anthropic_body("[]", &anthropic_read(&output))).unwrap();
        match tools {
            Some(raw) => body["tools"] = serde_json::from_str(raw).unwrap(),
            None => drop(body.as_object_mut().unwrap().remove("tools")),
        }
        post(&proxy.url("/v1/messages"), body.to_string(), key).await;
        let sent = model.bodies().pop().unwrap();
        assert!(!sent.contains(RECALL), "{sent}");
    }
    proxy.stop().await;
}

#[test]
fn a_malformed_recall_tool_setting_is_refused_by_name() {
    let mut cfg = ctxwin_proxy::ProxyConfig::default();
    let error = cfg.apply_toml("[proxy]\nrecall_tool = \"yes\"\n").unwrap_err().to_string();
    assert!(error.contains("recall_tool"), "{error}");
    cfg.apply_toml("[proxy]\ncompaction_limit = 500\n").unwrap();
    assert!(cfg.declares_recall());
    let notes = cfg.notes().join("\n");
    assert!(notes.contains("recall tool: a cut tool output ends with a line naming"), "{notes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streamed_recall_continues_the_clients_stream() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let mut messages = anthropic_read(&output);
    let url = proxy.url("/v1/messages");
    let stream = post_stream(&url, anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-sa").await;
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 2, "the answer and one follow-up");
    let follow: Value = serde_json::from_str(&bodies[1]).unwrap();
    assert_eq!(follow["stream"], true);
    assert_eq!(follow["messages"][4]["content"][0]["content"], output.as_str());
    assert!(!stream.contains(RECALL), "{stream}");
    let events = events(&stream);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "message_stop").count(), 1);
    assert_eq!(kinds.last(), Some(&"message_stop"));
    let starts: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| {
            (e["index"].as_u64().unwrap(), e["content_block"]["type"].as_str().unwrap().into())
        })
        .collect();
    assert_eq!(
        starts,
        [(0, "text".into()), (1, "text".into())],
        "the follow-up's blocks follow on"
    );
    // The usage the client reads last is both calls', as a non-streamed answer's.
    let usage = &events.iter().rfind(|e| e["type"] == "message_delta").unwrap()["usage"];
    assert_eq!(usage["input_tokens"], bodies[0].len() / 4 + bodies[1].len() / 4, "{usage}");
    assert_eq!(usage["output_tokens"], 10);
    let texts: Vec<&str> = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    assert_eq!(texts, ["Reading the whole output.", &format!("recalled {} bytes", output.len())]);
    // What the client got is what was recorded: its next request extends the conversation.
    let content = json!([{"type": "text", "text": texts[0]}, {"type": "text", "text": texts[1]}]);
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": "Thanks."}));
    post(&url, anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-sa").await;
    let bodies = model.bodies();
    let third: Value = serde_json::from_str(&bodies[2]).unwrap();
    assert_eq!(third["messages"].as_array().unwrap().len(), 5);
    assert_eq!(metric(&proxy.url("/metrics"), "ctxwin_proxy_branches_total").await, 0);
    let uncached = r#"ctxwin_proxy_upstream_prompt_tokens_total{kind="uncached"}"#;
    let billed = metric(&proxy.url("/metrics"), uncached).await as usize;
    let (a, b, c) = (bodies[0].len() / 4, bodies[1].len() / 4, bodies[2].len() / 4);
    assert!([a + b, a + b + c].contains(&billed), "{billed}: {a} + {b} (+ {c})");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streamed_recall_continues_the_clients_stream() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let url = proxy.url("/v1/chat/completions");
    let stream = post_stream(&url, openai_body(OPENAI_TOOLS, &openai_read(&output)), "sk-so").await;
    let bodies = model.bodies();
    assert_eq!(bodies.len(), 2);
    let follow: Value = serde_json::from_str(&bodies[1]).unwrap();
    assert_eq!(follow["messages"][4]["content"], output.as_str());
    assert!(!stream.contains(RECALL), "{stream}");
    let events = events(&stream);
    let roles = events.iter().filter(|e| e["choices"][0]["delta"]["role"].is_string()).count();
    assert_eq!(roles, 1, "one opening: {stream}");
    let text: String =
        events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, format!("Reading the whole output.\n\nrecalled {} bytes", output.len()));
    assert_eq!(events.iter().filter(|e| **e == json!("[DONE]")).count(), 1);
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let finishes: Vec<&Value> = events
        .iter()
        .map(|e| &e["choices"][0]["finish_reason"])
        .filter(|f| f.is_string())
        .collect();
    assert_eq!(finishes, [&json!("stop")]);
    let usage: Vec<&Value> = events.iter().map(|e| &e["usage"]).filter(|u| u.is_object()).collect();
    assert_eq!(usage.len(), 1, "{stream}");
    assert_eq!(usage[0]["prompt_tokens"], bodies[0].len() / 4 + bodies[1].len() / 4);
    assert_eq!(usage[0]["completion_tokens"], 10);
    let mut messages = openai_read(&output);
    messages.push(json!({"role": "assistant", "content": text}));
    messages.push(json!({"role": "user", "content": "Thanks."}));
    post(&url, openai_body(OPENAI_TOOLS, &messages), "sk-so").await;
    let third: Value = serde_json::from_str(&model.bodies()[2]).unwrap();
    assert_eq!(third["messages"].as_array().unwrap().len(), 5);
    assert_eq!(metric(&proxy.url("/metrics"), "ctxwin_proxy_branches_total").await, 0);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_without_a_recall_call_stay_byte_identical_and_mixed_ones_lose_only_it() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(cutting(up, state.path())).await;
    // Declared, not called: the upstream's bytes, as they came.
    let question = [json!({"role": "user", "content": "Is the build green?"})];
    let a = post_stream(
        &proxy.url("/v1/messages"),
        anthropic_body(ANTHROPIC_TOOLS, &question),
        "sk-b1",
    )
    .await;
    let o = post_stream(
        &proxy.url("/v1/chat/completions"),
        openai_body(OPENAI_TOOLS, &question),
        "sk-b2",
    )
    .await;
    assert!(model.bodies()[0].contains(RECALL), "the tool is declared");
    assert_eq!([a, o], model.streamed.lock().unwrap()[..]);
    // A recall call beside the client's: only the recall call leaves, the rest re-indexed.
    model.script.lock().unwrap().mixed = true;
    let output = log("build", 120);
    let a = post_stream(
        &proxy.url("/v1/messages"),
        anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output)),
        "sk-b3",
    )
    .await;
    assert!(!a.contains(RECALL), "{a}");
    let starts: Vec<(u64, String)> = events(&a)
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| {
            (e["index"].as_u64().unwrap(), e["content_block"]["type"].as_str().unwrap().into())
        })
        .collect();
    assert_eq!(starts, [(0, "text".into()), (1, "tool_use".into())]);
    assert!(a.contains(r#""stop_reason":"tool_use""#));
    let o = post_stream(
        &proxy.url("/v1/chat/completions"),
        openai_body(OPENAI_TOOLS, &openai_read(&output)),
        "sk-b4",
    )
    .await;
    assert!(!o.contains(RECALL), "{o}");
    let calls: Vec<Value> = events(&o)
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert!(calls.iter().all(|c| c["index"] == 0), "{calls:?}");
    assert_eq!(calls[0]["function"]["name"], "run_command");
    assert!(o.contains(r#""finish_reason":"tool_calls""#));
    assert_eq!(model.bodies().len(), 4, "no follow-up for a mixed answer");
    proxy.stop().await;
}

/// `body` asking for a stream.
fn streaming(body: String) -> String {
    body.replacen('{', r#"{"stream":true,"#, 1)
}

/// A streamed response's bytes, whole.
async fn post_stream(url: &str, body: String, key: &str) -> String {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .header("x-ctxwin-session", "recall-test")
        .body(streaming(body))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    response.text().await.unwrap()
}

/// The JSON data of each event of a stream (`[DONE]` as a string).
fn events(stream: &str) -> Vec<Value> {
    stream
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap_or(Value::from(data)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_cut_at_a_compaction_is_recalled_in_pages_of_at_most_8_times_the_limit() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let mut cfg = config(up, state.path());
    cfg.apply_toml("[proxy]\ndefault_window = 4096\nreserve = 512\ncompaction_limit = 64\n")
        .unwrap();
    let proxy = start_proxy(cfg).await;
    let url = proxy.url("/v1/messages");
    let output = log("build", 120);
    let mut messages = anthropic_read(&output);
    post(&url, anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-k").await;
    assert!(!model.bodies()[0].contains(MARKER), "the live request's output is not cut");
    // Turns until a compaction cuts the old output (before whole turns leave).
    model.script.lock().unwrap().anywhere = true;
    let mut turn = 0;
    let body = loop {
        turn += 1;
        assert!(turn < 40, "no compaction cut the output");
        let answer = json!([{"type": "text", "text": format!("Noted {turn}. The build log has a failing step.")}]);
        messages.push(json!({"role": "assistant", "content": answer}));
        let words =
            format!("Turn {turn}: what else does the log say about step {turn}? ").repeat(4);
        messages.push(json!({"role": "user", "content": words}));
        let before = model.bodies().len();
        let answer = post(&url, anthropic_body(ANTHROPIC_TOOLS, &messages), "sk-k").await;
        let bodies = model.bodies();
        if bodies.len() == before + 2 {
            messages.push(json!({"role": "assistant", "content": answer["content"]}));
            break bodies;
        }
        messages.push(json!({"role": "assistant", "content": answer["content"]}));
        messages.push(json!({"role": "user", "content": "Go on."}));
    };
    let follow: Value = serde_json::from_str(body.last().unwrap()).unwrap();
    let turns = follow["messages"].as_array().unwrap();
    let result = &turns.last().unwrap()["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_ne!(result["is_error"], true, "{result}");
    let text = result["content"].as_str().unwrap();
    // The window's room bounds it: whole lines from the first, then where to go on.
    let (shown, note) = text.rsplit_once('\n').unwrap();
    assert!(output.starts_with(shown) && shown.len() < output.len(), "{text}");
    let next_line = shown.lines().count() + 1;
    assert!(note.contains(&format!("\"from_line\": {next_line}}}")), "{note}");
    assert!(note.contains(&format!("lines 1-{} of 120 shown", next_line - 1)), "{note}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_4_follow_ups_then_the_client_gets_what_came() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    {
        let mut script = model.script.lock().unwrap();
        (script.anywhere, script.insist) = (true, true);
    }
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let body = anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output));
    let answer = post(&proxy.url("/v1/messages"), body.clone(), "sk-r").await;
    assert_eq!(model.bodies().len(), 5, "the answer and 4 follow-ups");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 5, "each round's text, no call: {answer}");
    assert!(content.iter().all(|b| b["type"] == "text"));
    assert_eq!(answer["stop_reason"], "end_turn");
    // Streamed: the same bound, one stream.
    let stream = post_stream(&proxy.url("/v1/messages"), body, "sk-r2").await;
    assert_eq!(model.bodies().len(), 10);
    assert!(!stream.contains(RECALL));
    assert!(stream.contains(r#""stop_reason":"end_turn""#), "{stream}");
    assert_eq!(stream.matches("message_stop").count(), 2, "one message_stop event (type and name)");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_follow_up_leaves_the_client_the_answer_before_it() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    model.script.lock().unwrap().refuse_follow_up = true;
    let proxy = start_proxy(cutting(up, state.path())).await;
    let output = log("build", 120);
    let body = anthropic_body(ANTHROPIC_TOOLS, &anthropic_read(&output));
    let answer = post(&proxy.url("/v1/messages"), body.clone(), "sk-f").await;
    assert_eq!(model.bodies().len(), 2);
    assert_eq!(answer["content"], json!([{"type": "text", "text": "Reading the whole output."}]));
    assert_eq!(answer["stop_reason"], "end_turn");
    let stream = post_stream(&proxy.url("/v1/messages"), body, "sk-f2").await;
    assert_eq!(model.bodies().len(), 4);
    assert!(!stream.contains(RECALL));
    let events = events(&stream);
    assert_eq!(events.last().unwrap()["type"], "message_stop", "{stream}");
    assert!(stream.contains(r#""stop_reason":"end_turn""#), "{stream}");
    proxy.stop().await;
}
