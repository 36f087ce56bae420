//! The proxy against an in-process fake upstream that checks what it receives and injects
//! faults.

mod common;

use std::time::Duration;

use common::{
    Mode, anthropic_pairs_intact, archive_counts, config, openai_pairs_intact, session_key,
    start_fake, start_proxy,
};
use ctxwin_std::core::counter::TokenCounter;
use serde_json::{Value, json};

fn tools_openai() -> Value {
    json!([{"type": "function", "function": {"name": "run_command", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}])
}

/// The request body as a string with fields in a known order, so the bytes can be checked.
fn openai_body(model: &str, messages: &[Value], stream: bool) -> String {
    format!(
        r#"{{"model":{},"temperature":0.25,"tools":{},"tool_choice":"auto","messages":{},"stream":{},"metadata":{{"run":"x1"}},"max_tokens":300}}"#,
        json!(model),
        tools_openai(),
        Value::Array(messages.to_vec()),
        stream
    )
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: String,
    session: Option<&str>,
) -> reqwest::Response {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-secret");
    if let Some(session) = session {
        request = request.header("x-ctxwin-session", session);
    }
    request.body(body).send().await.unwrap()
}

/// What a provider bills for `messages`, by the estimator: each message's content, its tool
/// calls' ids, names and arguments, a result's call id, plus 4 tokens of framing per message and
/// 3 per call (the JSON punctuation around them is not billed as text).
fn estimate(messages: &[Value]) -> u32 {
    let counter = ctxwin_std::session::Counter::default();
    let text = |v: &Value| match v {
        Value::String(s) => counter.count(s),
        Value::Null => 0,
        other => counter.count(&other.to_string()),
    };
    messages
        .iter()
        .map(|m| {
            let calls: u32 = m["tool_calls"].as_array().map_or(0, |calls| {
                calls
                    .iter()
                    .map(|c| {
                        text(&c["id"])
                            + text(&c["function"]["name"])
                            + text(&c["function"]["arguments"])
                            + 3
                    })
                    .sum()
            });
            text(&m["content"]) + text(&m["tool_call_id"]) + calls + 4
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_200_turns_over_budget_keep_pairs_fields_and_archive_each_message_once() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.windows.insert("small-model".into(), 4_096);
    cfg.reserve = 512;
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages =
        vec![json!({"role": "system", "content": "You are a build agent. Use run_command."})];
    let padding =
        "The build log says the linker failed on target x86_64; retry with more memory. ".repeat(3);
    for turn in 0..200 {
        messages.push(json!({"role": "user", "content": format!("Turn {turn}: run the tests again. {padding}")}));
        for _ in 0..2 {
            let body = openai_body("small-model", &messages, false);
            let response = post(&client, &url, body, None).await;
            assert_eq!(response.status(), 200, "turn {turn}: {}", response.text().await.unwrap());
            let answer: Value = response.json().await.unwrap();
            let message = answer["choices"][0]["message"].clone();
            let received = fake.last();
            let sent = received.json();
            // Fields other than the messages arrive unchanged, in order, byte for byte.
            let text = String::from_utf8(received.body.to_vec()).unwrap();
            assert!(
                text.starts_with(r#"{"model":"small-model","temperature":0.25,"tools":[{"#),
                "{text}"
            );
            assert!(text.contains(&format!(r#""tools":{}"#, tools_openai())));
            assert!(
                text.ends_with(r#","stream":false,"metadata":{"run":"x1"},"max_tokens":300}"#),
                "{text}"
            );
            assert_eq!(received.headers["authorization"], "Bearer sk-test-secret");
            let sent_messages = sent["messages"].as_array().unwrap();
            openai_pairs_intact(sent_messages).unwrap_or_else(|e| panic!("turn {turn}: {e}"));
            assert_eq!(sent_messages[0], messages[0], "the system prompt stays");
            assert_eq!(sent_messages.last(), messages.last(), "the live request is sent");
            assert!(
                estimate(sent_messages) <= 4_096,
                "turn {turn}: {} tokens",
                estimate(sent_messages)
            );
            messages.push(message.clone());
            if message["tool_calls"].is_array() {
                let id = message["tool_calls"][0]["id"].as_str().unwrap().to_string();
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("ok: 42 tests passed in turn {turn}. {padding}")}));
            } else {
                break;
            }
        }
    }
    let last = fake.last().json();
    assert!(
        last["messages"].as_array().unwrap().len() < messages.len() / 4,
        "the window was managed"
    );
    assert!(estimate(&messages) > 40_000, "the history is far over the window");
    let metrics = reqwest::get(proxy.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("ctxwin_proxy_requests_total{endpoint=\"openai\",status=\"200\"} 400"),
        "{metrics}"
    );
    assert!(!metrics.contains("sk-test-secret"));
    proxy.stop().await;
    // 1 system + 200 × (user, call, result, answer) + the tool-definition placeholder, but
    // the last answer, which waits for a request that carries it (in the checkpoint).
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 1, "{counts:?}");
    assert_eq!(counts[0].1, 1 + 200 * 4 + 1 - 1, "{counts:?}");
    let archive_bytes = std::fs::read(state.path().join("archive.db")).unwrap();
    assert!(
        !archive_bytes.windows(14).any(|w| w == b"sk-test-secret"),
        "the key is never archived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_paths_pass_through_unchanged() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    let response = client
        .get(proxy.url("/v1/models"))
        .header("authorization", "Bearer k1")
        .header("x-ctxwin-session", "s")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-fake"], "yes");
    assert_eq!(response.json::<Value>().await.unwrap()["data"][0]["id"], "fake-model");
    let got = fake.last();
    assert_eq!(got.headers["authorization"], "Bearer k1");
    assert!(got.headers.get("x-ctxwin-session").is_none());
    let body = r#"{"input": ["a", "b"],  "model":"e"}"#;
    let echo = client
        .post(proxy.url("/v1/embeddings"))
        .body(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(echo, body);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_stream_passes_through_and_the_answer_is_recorded() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "list files"}),
    ];
    let response = post(&client, &url, openai_body("m", &messages, true), Some("st")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    assert!(text.contains(r#""id":"call_1""#) && text.ends_with("data: [DONE]\n\n"), "{text}");
    // The client's echo of the assembled answer is known: only the result is new.
    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run_command", "arguments": "{\"n\": 1}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}));
    let response = post(&client, &url, openai_body("m", &messages, true), Some("st")).await;
    let text = response.text().await.unwrap();
    let mut assembler =
        ctxwin_proxy::assemble::StreamAssembler::new(ctxwin_proxy::wire::Provider::OpenAi);
    assembler.feed(text.as_bytes());
    assert_eq!(assembler.finish().unwrap().message["content"], "done 2", "{text}");
    let sent = fake.last().json();
    assert_eq!(sent["messages"], Value::Array(messages.clone()));
    proxy.stop().await;
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 1, "no branch: {counts:?}");
    // system, user, call, result, tools placeholder (the answer waits in the checkpoint for a
    // request that carries it)
    assert_eq!(counts[0].1, 5, "{counts:?}");
}

fn png_base64(w: u32, h: u32) -> String {
    use base64::Engine;
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bytes.extend_from_slice(&w.to_be_bytes());
    bytes.extend_from_slice(&h.to_be_bytes());
    bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn anthropic_body(messages: &[String], stream: bool) -> String {
    format!(
        r#"{{"model":"claude-test","max_tokens":1024,"system":[{{"type":"text","text":"You are careful.","cache_control":{{"type":"ephemeral"}}}}],"thinking":{{"type":"enabled","budget_tokens":2000}},"tools":[{{"name":"read_file","description":"Read","input_schema":{{"type":"object","properties":{{"path":{{"type":"string"}}}}}}}}],"messages":[{}],"stream":{stream}}}"#,
        messages.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_tools_image_and_cache_marks_pass_byte_exact() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/messages");
    // Odd spacing and key order on purpose: the bytes must survive.
    let mut messages = vec![format!(
        r#"{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{}"}}}},{{"type": "text", "text":"What is in this screenshot?",  "cache_control":{{"type":"ephemeral"}}}}]}}"#,
        png_base64(1000, 1000)
    )];
    for turn in 0..6 {
        for stream in [false, true] {
            let body = anthropic_body(&messages, stream);
            let response = client
                .post(&url)
                .header("x-api-key", "ak-secret")
                .header("anthropic-version", "2023-06-01")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let received = fake.last();
            assert_eq!(received.headers["x-api-key"], "ak-secret");
            assert_eq!(received.headers["anthropic-version"], "2023-06-01");
            let text = String::from_utf8(received.body.to_vec()).unwrap();
            let expected = format!("\"messages\":[{}]", messages.join(","));
            assert!(text.contains(&expected), "turn {turn}: messages changed\n{text}\n{expected}");
            assert!(text.contains(r#""system":[{"type":"text","text":"You are careful.","cache_control":{"type":"ephemeral"}}]"#));
            anthropic_pairs_intact(received.json()["messages"].as_array().unwrap()).unwrap();
            // The client echoes the answer as it got it.
            let content = if stream {
                let sse = response.text().await.unwrap();
                assert!(sse.contains("signature_delta"), "{sse}");
                fake_answer_from_sse(&sse)
            } else {
                response.json::<Value>().await.unwrap()["content"].clone()
            };
            messages.push(json!({"role": "assistant", "content": content}).to_string());
            let tool_use =
                content.as_array().unwrap().iter().find(|b| b["type"] == "tool_use").cloned();
            match tool_use {
                Some(call) => messages.push(format!(
                    r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":{},"content":[{{"type":"text","text":"fn main() {{}}"}},{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{}"}}}}]}},{{"type":"text","text":"next step {turn}","cache_control":{{"type":"ephemeral"}}}}]}}"#,
                    call["id"],
                    png_base64(200, 200)
                )),
                None => messages.push(format!(r#"{{"role":"user","content":"continue {turn}-{stream}"}}"#)),
            }
        }
    }
    proxy.stop().await;
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 1, "no branch: {counts:?}");
}

/// The content blocks the fake streamed, as the client library assembles them.
fn fake_answer_from_sse(sse: &str) -> Value {
    let mut assembler =
        ctxwin_proxy::assemble::StreamAssembler::new(ctxwin_proxy::wire::Provider::Anthropic);
    assembler.feed(sse.as_bytes());
    assembler.finish().unwrap().message["content"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_small_window_keeps_thinking_with_its_tool_use() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.windows.insert("claude-test".into(), 3_000);
    cfg.reserve = 300;
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/messages");
    let mut messages = vec![r#"{"role":"user","content":"start"}"#.to_string()];
    let pad = "lorem ipsum dolor sit amet ".repeat(20);
    for turn in 0..40 {
        let response =
            client.post(&url).body(anthropic_body(&messages, false)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{turn}");
        let content = response.json::<Value>().await.unwrap()["content"].clone();
        let sent = fake.last().json();
        let sent_messages = sent["messages"].as_array().unwrap();
        anthropic_pairs_intact(sent_messages).unwrap_or_else(|e| panic!("turn {turn}: {e}"));
        for m in sent_messages.iter().filter(|m| m["role"] == "assistant") {
            let blocks = m["content"].as_array().unwrap();
            if blocks.iter().any(|b| b["type"] == "tool_use") {
                assert_eq!(
                    blocks[0]["type"], "thinking",
                    "a thinking block stays with its tool use"
                );
            }
        }
        messages.push(json!({"role": "assistant", "content": content}).to_string());
        match content.as_array().unwrap().iter().find(|b| b["type"] == "tool_use") {
            Some(call) => messages.push(
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": format!("{pad} {turn}")}]}).to_string(),
            ),
            None => messages.push(json!({"role": "user", "content": format!("go on {turn} {pad}")}).to_string()),
        }
    }
    let sent = fake.last().json();
    assert!(sent["messages"].as_array().unwrap().len() < messages.len() / 2);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_answer_in_the_provider_format_and_lose_nothing() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.upstream_timeout = Duration::from_millis(400);
    cfg.body_limit = 64 * 1024;
    cfg.windows.insert("tiny".into(), 1_024);
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "hello"}),
    ];

    // Upstream answers 500: passed through; the user message is kept.
    fake.set_mode(Mode::Fail500);
    let response = post(&client, &url, openai_body("m", &messages, false), Some("f")).await;
    assert_eq!(response.status(), 500);
    assert!(response.text().await.unwrap().contains("fake upstream exploded"));

    // Slow: 504 in OpenAI's format.
    fake.set_mode(Mode::Slow(1_000));
    let response = post(&client, &url, openai_body("m", &messages, false), Some("f")).await;
    assert_eq!(response.status(), 504);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "upstream_timeout", "{error}");

    // Truncated stream: the client gets the first half and an error event; nothing recorded.
    fake.set_mode(Mode::Truncate);
    let response = post(&client, &url, openai_body("m", &messages, true), Some("f")).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap_or_default();
    assert!(text.starts_with("data: {") && text.contains("stream_truncated"), "{text}");

    // Back to normal: the retry works and every message is archived once.
    fake.set_mode(Mode::Normal);
    let response = post(&client, &url, openai_body("m", &messages, false), Some("f")).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": answer["choices"][0]["message"]["tool_calls"][0]["id"], "content": "ok"}));
    assert_eq!(
        post(&client, &url, openai_body("m", &messages, false), Some("f")).await.status(),
        200
    );

    // Body that does not parse: 400 with where.
    let response =
        post(&client, &url, "{\"model\": \"m\",\n\"messages\": [}".into(), Some("f")).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("line 2"), "{error}");

    // Pinned part over budget: 400 saying so (Anthropic format on its endpoint).
    let huge = "word ".repeat(3_000);
    let body = format!(
        r#"{{"model":"tiny","max_tokens":10,"system":{},"messages":[{{"role":"user","content":"hi"}}]}}"#,
        json!(huge)
    );
    let response = client.post(proxy.url("/v1/messages")).body(body).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert!(error["error"]["message"].as_str().unwrap().contains("cannot fit"), "{error}");
    assert_eq!(error["error"]["type"], "invalid_request_error");

    // Too large.
    let response = post(&client, &url, "x".repeat(100 * 1024), Some("f")).await;
    assert_eq!(response.status(), 413);
    proxy.stop().await;

    // Upstream down: 502.
    let down = start_proxy(config("127.0.0.1:9".parse().unwrap(), state.path())).await;
    let response = post(
        &client,
        &down.url("/v1/chat/completions"),
        openai_body("m", &messages, false),
        Some("f"),
    )
    .await;
    assert_eq!(response.status(), 502);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "upstream_unreachable");
    down.stop().await;

    let counts = archive_counts(state.path());
    let f_key = session_key(state.path(), "Bearer sk-test-secret", "f");
    let f = counts.iter().find(|(name, _)| *name == f_key).unwrap();
    // system, user, call, result, placeholder: once each despite the faults (the last answer
    // waits in the checkpoint for a request that carries it).
    assert_eq!(f.1, 5, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resident_cap_unloads_and_reloads() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.max_resident = 3;
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let history = |i: usize| vec![json!({"role": "user", "content": format!("conversation {i}")})];
    for i in 0..12 {
        let response = post(&client, &url, openai_body("m", &history(i), false), None).await;
        assert_eq!(response.status(), 200);
        assert!(proxy.app.metrics.resident.load(std::sync::atomic::Ordering::Relaxed) <= 4);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(proxy.app.metrics.resident.load(std::sync::atomic::Ordering::Relaxed) <= 3);
    assert!(proxy.app.metrics.unloads.load(std::sync::atomic::Ordering::Relaxed) >= 9);
    // Conversation 0 again, continued: reloaded from its checkpoint, only the new messages pushed.
    let mut messages = history(0);
    let first = fake.received.lock().unwrap()[0].json();
    let _ = first;
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run_command", "arguments": "{\"n\": 1}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "done"}));
    let response = post(&client, &url, openai_body("m", &messages, false), None).await;
    assert_eq!(response.status(), 200);
    assert_eq!(fake.last().json()["messages"], Value::Array(messages));
    proxy.stop().await;
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 12, "no branch: {counts:?}");
    // Conversation 0: placeholder, user, call, result (its answer waits in the checkpoint).
    assert_eq!(counts.iter().map(|c| c.1).max(), Some(4), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_history_branches_and_the_original_stays() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let body = |messages: &[Value]| {
        format!(r#"{{"model":"m","messages":{}}}"#, Value::Array(messages.to_vec()))
    };
    let mut original =
        vec![json!({"role": "system", "content": "s"}), json!({"role": "user", "content": "one"})];
    for turn in 0..3 {
        let answer: Value =
            post(&client, &url, body(&original), Some("b")).await.json().await.unwrap();
        original.push(answer["choices"][0]["message"].clone());
        original.push(json!({"role": "user", "content": format!("next {turn}")}));
    }
    let mut edited = original[..4].to_vec();
    edited[3] = json!({"role": "user", "content": "an edited question"});
    for _ in 0..2 {
        let response = post(&client, &url, body(&edited), Some("b")).await;
        assert_eq!(response.status(), 200);
        assert_eq!(fake.last().json()["messages"], Value::Array(edited.clone()));
        let answer: Value = response.json().await.unwrap();
        edited.push(answer["choices"][0]["message"].clone());
        edited.push(json!({"role": "user", "content": "and then?"}));
    }
    // The original continues as if nothing happened.
    let response = post(&client, &url, body(&original), Some("b")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(fake.last().json()["messages"], Value::Array(original.clone()));
    proxy.stop().await;
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 2, "{counts:?}");
    let b = session_key(state.path(), "Bearer sk-test-secret", "b");
    // The branch is the one for the edited message at index 3.
    let request = ctxwin_proxy::wire::Request::parse(
        ctxwin_proxy::wire::Provider::OpenAi,
        body(&edited).as_bytes(),
    )
    .unwrap();
    let edit = ctxwin_proxy::wire::analyze_item(ctxwin_proxy::wire::Provider::OpenAi, &request, 3)
        .unwrap()
        .fp;
    let branch = ctxwin_proxy::keys::branch_key(&b, 3, Some(edit));
    // The last answer of each waits for a request that carries it (in the checkpoints).
    // original: system + user + 3 × (answer, user) = 8
    assert_eq!(counts.iter().find(|c| c.0 == b).unwrap().1, 8, "{counts:?}");
    // branch: its 4 messages (copied), answer, user = 6
    assert_eq!(counts.iter().find(|c| c.0 == branch).unwrap().1, 6, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_key_is_required_when_set() {
    let state = tempfile::tempdir().unwrap();
    let (up, _fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.proxy_key = Some("pk-1".into());
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let response = client.post(proxy.url("/v1/chat/completions")).body(body).send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client.get(proxy.url("/v1/models")).send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client.get(proxy.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client.get(proxy.url("/metrics")).bearer_auth("pk-2").send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client.get(proxy.url("/metrics")).bearer_auth("pk-1").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let response =
        client.get(proxy.url("/metrics")).header("x-ctxwin-key", "pk-1").send().await.unwrap();
    assert_eq!(response.status(), 200);
    // Each conversation's bill: the same key.
    let conversations = proxy.url("/metrics/conversations");
    assert_eq!(client.get(&conversations).send().await.unwrap().status(), 401);
    let response = client.get(&conversations).bearer_auth("pk-1").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let response = client
        .post(proxy.url("/v1/chat/completions"))
        .header("x-ctxwin-key", "pk-1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    proxy.stop().await;
    let mut open = config(up, state.path());
    open.listen = "0.0.0.0:0".parse().unwrap();
    assert!(open.validate().is_err(), "off loopback without a key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_content_kind_passes_byte_exact() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    // OpenAI: image (data URL with a declared size), audio, a file, a refusal, odd spacing.
    let openai_messages = format!(
        r#"[{{"role":"developer","content":"be brief"}},{{"role":"user","content":[{{"type":"text","text":"look"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{}","detail":"high"}}}},{{"type":"input_audio","input_audio":{{"data":"UklGRiQAAABXQVZF","format":"wav"}}}},{{"type":"file","file":{{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERi0xLjQK"}}}}]}},{{"role":"assistant","content":null,"refusal":"I cannot"}},{{"role":"user",  "content":"ok then"}}]"#,
        png_base64(640, 480)
    );
    let body = format!(r#"{{"model":"m","messages":{openai_messages},"n":1}}"#);
    let response = client.post(proxy.url("/v1/chat/completions")).body(body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let sent = String::from_utf8(fake.last().body.to_vec()).unwrap();
    assert_eq!(sent, format!(r#"{{"model":"m","messages":{openai_messages},"n":1}}"#));

    // Anthropic: a document, server-tool blocks, redacted thinking, citations.
    let anthropic_messages = r#"[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"The sky is blue."},"citations":{"enabled":true}},{"type":"text","text":"What colour is the sky?"}]},{"role":"assistant","content":[{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix"},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"sky colour"}},{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://example.com","title":"Sky","encrypted_content":"abc","page_age":null}]},{"type":"text","text":"Blue.","citations":[{"type":"char_location","cited_text":"The sky is blue.","document_index":0,"start_char_index":0,"end_char_index":16}]}]},{"role":"user","content":"thanks"}]"#;
    let body =
        format!(r#"{{"model":"claude-test","max_tokens":100,"messages":{anthropic_messages}}}"#);
    let response = client.post(proxy.url("/v1/messages")).body(body.clone()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(String::from_utf8(fake.last().body.to_vec()).unwrap(), body);
    proxy.stop().await;
}
