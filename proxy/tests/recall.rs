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
}

#[derive(Default)]
struct Model {
    received: Mutex<Vec<Bytes>>,
    script: Mutex<Script>,
}

impl Model {
    fn bodies(&self) -> Vec<String> {
        let received = self.received.lock().unwrap();
        received.iter().map(|b| String::from_utf8(b.to_vec()).unwrap()).collect()
    }
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
    let (blocks, stop) = match (recalled, marked_id(&last)) {
        (Some(result), _) => {
            let text = result["content"].as_str().unwrap_or_default();
            (
                vec![json!({"type": "text", "text": format!("recalled {} bytes", text.len())})],
                "end_turn",
            )
        }
        (None, Some(id)) if declares(&request, true) => {
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
    json_response(
        json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": request["model"],
        "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage}),
    )
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
    json_response(
        json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": body.len() / 4, "completion_tokens": 5, "total_tokens": body.len() / 4 + 5,
            "prompt_tokens_details": {"cached_tokens": 0}}}),
    )
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
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        observation_limit: Some(256),
        ..config(up, state.path())
    })
    .await;
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
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_a_cut_output_is_recalled_whole_and_the_client_sees_one_answer() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        compaction_limit: Some(64),
        observation_limit: Some(256),
        ..config(up, state.path())
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
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        observation_limit: Some(256),
        ..config(up, state.path())
    })
    .await;
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
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        observation_limit: Some(256),
        ..config(up, state.path())
    })
    .await;
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
async fn a_client_tool_of_the_same_name_is_neither_declared_nor_answered() {
    let state = tempfile::tempdir().unwrap();
    let (up, model) = start_model().await;
    let proxy = start_proxy(ctxwin_proxy::ProxyConfig {
        observation_limit: Some(256),
        ..config(up, state.path())
    })
    .await;
    let tools = r#"[{"name":"ctxwin_recall","description":"the client's own","input_schema":{"type":"object"}}]"#;
    let output = log("build", 120);
    let answer =
        post(&proxy.url("/v1/messages"), anthropic_body(tools, &anthropic_read(&output)), "sk-c")
            .await;
    let sent = model.bodies().pop().unwrap();
    assert_eq!(raw_tools(&sent), tools);
    assert!(!sent.contains(MARKER), "no marker: the proxy does not answer that tool");
    assert_eq!(answer["content"][0]["text"], "done 1");
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
