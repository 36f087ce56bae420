//! What the proxy does with the room of a window (issue 27): tool outputs reach the model whole
//! while the window has room (a limit cuts them only when set, never for the tools named
//! in `never_cut`), the request's `max_tokens` is kept free, and the retrieved block stays the
//! same bytes between compactions (or is never sent with `[retrieval] auto = false`), so the
//! provider's prompt cache of the history holds.

mod common;

use std::collections::BTreeMap;

use common::{config, start_fake, start_proxy};
use ctxwin_std::core::counter::TokenCounter;
use serde_json::{Value, json};

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> reqwest::Response {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("x-ctxwin-session", "room")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// A `lines`-line tool output (about 6 tokens a line).
fn output(tool: &str, lines: usize) -> String {
    (1..=lines).map(|n| format!("{n:>6}\t{tool} line {n} of the file\n")).collect()
}

/// A user turn, a call of `tool` and its `lines`-line result.
fn exchange(n: usize, tool: &str, lines: usize) -> [Value; 3] {
    let id = format!("c{n}");
    [
        json!({"role": "user", "content": format!("Step {n}: look at it.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": output(tool, lines)}),
    ]
}

/// The tool outputs of the body the upstream last received.
fn outputs_sent(fake: &common::Fake) -> Vec<String> {
    let body = fake.last().json();
    let messages = body["messages"].as_array().unwrap().clone();
    messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_outputs_stay_whole_while_the_window_has_room() {
    let (upstream, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(upstream, state.path())).await;
    let client = reqwest::Client::new();
    // 600 lines (~5,000 tokens): five times the core's default limit, in a 32k window.
    let messages = exchange(1, "Read", 600);
    let body = json!({"model": "m", "max_tokens": 1000, "messages": messages});
    assert_eq!(post(&client, &proxy.url("/v1/chat/completions"), &body).await.status(), 200);
    assert_eq!(outputs_sent(&fake), [output("Read", 600)]);
    // What the upstream billed (its usage) reaches /metrics once the answer is recorded.
    let billed = (fake.last().body.len() / 4).to_string();
    let line = format!("ctxwin_proxy_upstream_prompt_tokens_total{{kind=\"uncached\"}} {billed}");
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = reqwest::get(proxy.url("/metrics")).await.unwrap().text().await.unwrap();
        if metrics.contains(&line) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(metrics.contains(&line), "{line} not in {metrics}");
    proxy.stop().await;

    // A limit cuts them, but not the outputs of the tools it never cuts.
    let state = tempfile::tempdir().unwrap();
    let limited = ctxwin_proxy::ProxyConfig {
        observation_limit: Some(1_000),
        never_cut: vec!["Read".into()],
        ..config(upstream, state.path())
    };
    let proxy = start_proxy(limited).await;
    let mut messages = exchange(1, "Read", 600).to_vec();
    messages.extend(exchange(2, "Bash", 600));
    let body = json!({"model": "m", "max_tokens": 1000, "messages": messages});
    assert_eq!(post(&client, &proxy.url("/v1/chat/completions"), &body).await.status(), 200);
    let sent = outputs_sent(&fake);
    assert_eq!(sent[0], output("Read", 600), "never_cut");
    assert!(sent[1].len() < output("Bash", 600).len() / 2, "cut: {} bytes", sent[1].len());
    proxy.stop().await;
}

/// What a provider bills for `messages`, by the estimator: each message's content, its tool
/// calls' ids, names and arguments, a result's call id, plus 4 tokens of framing per message and
/// 3 per call.
fn estimate(messages: &[Value]) -> u32 {
    let counter = ctxwin_std::session::Counter::default();
    let text = |v: &Value| match v {
        Value::String(s) => counter.count(s),
        Value::Null => 0,
        other => counter.count(&other.to_string()),
    };
    let call = |c: &Value| {
        text(&c["id"]) + text(&c["function"]["name"]) + text(&c["function"]["arguments"]) + 3
    };
    let calls = |m: &Value| m["tool_calls"].as_array().map_or(0, |c| c.iter().map(call).sum());
    messages.iter().map(|m| text(&m["content"]) + text(&m["tool_call_id"]) + calls(m) + 4).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_leaves_the_requests_max_tokens_free() {
    let (upstream, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let config = ctxwin_proxy::ProxyConfig {
        windows: BTreeMap::from([("m".to_string(), 8_192)]),
        ..config(upstream, state.path())
    };
    let proxy = start_proxy(config).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages = Vec::new();
    for n in 0..40 {
        messages.extend(exchange(n, "Bash", 20));
        let body = json!({"model": "m", "max_tokens": 6_000, "messages": messages});
        let response = post(&client, &url, &body).await;
        assert_eq!(response.status(), 200, "request {n}");
        let answer: Value = response.json().await.unwrap();
        // The fake upstream bills a quarter of the body's bytes: the proxy's calibrator plans
        // with that count once it has seen one.
        let billed = fake.last().body.len() / 4;
        let estimated = estimate(fake.last().json()["messages"].as_array().unwrap());
        let tokens = if n == 0 { estimated as usize } else { billed };
        assert!(tokens + 6_000 <= 8_192, "request {n}: {tokens} tokens + max_tokens 6000");
        messages.push(answer["choices"][0]["message"].clone());
    }
    // A max_tokens that leaves the prompt no room is refused, naming it.
    let body = json!({"model": "m", "max_tokens": 8_100, "messages": messages});
    let response = post(&client, &url, &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("max_tokens 8100"), "{error}");
    proxy.stop().await;
}

/// The retrieved block of the body the upstream last received (its first system message),
/// and the first history message after it.
fn recall_and_first(fake: &common::Fake) -> (Option<String>, Value) {
    let body = fake.last().json();
    let messages = body["messages"].as_array().unwrap();
    let recall = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .filter(|text| text.starts_with("[Retrieved from archive]"))
        .map(str::to_string);
    let first = messages.iter().find(|m| m["role"] != "system").cloned().unwrap();
    (recall, first)
}

/// Sends a growing conversation whose oldest turns leave a 2,048-token window; returns what
/// each request carried: its retrieved block and its first history message.
async fn long_conversation(config: ctxwin_proxy::ProxyConfig) -> Vec<(Option<String>, Value)> {
    let (upstream, fake) = start_fake().await;
    let config = ctxwin_proxy::ProxyConfig {
        upstream: format!("http://{upstream}"),
        windows: BTreeMap::from([("m".to_string(), 2_048)]),
        ..config
    };
    let proxy = start_proxy(config).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages = vec![json!({"role": "user", "content": "Staging runs Postgres 16."})];
    let mut seen = Vec::new();
    for n in 0..150 {
        let body = json!({"model": "m", "max_tokens": 256, "messages": messages});
        let response = post(&client, &url, &body).await;
        assert_eq!(response.status(), 200, "request {n}");
        let answer: Value = response.json().await.unwrap();
        seen.push(recall_and_first(&fake));
        eprintln!(
            "{n}: {:?} {}",
            seen.last().unwrap().0.as_ref().map(|r| r.len()),
            seen.last().unwrap().1
        );
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("Turn {n}: which Postgres version runs on staging, and which jobs fail?")}));
    }
    proxy.stop().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retrieved_block_is_frozen_between_compactions() {
    let state = tempfile::tempdir().unwrap();
    let mut config = config("127.0.0.1:1".parse().unwrap(), state.path());
    config.apply_toml("[retrieval]\nauto = true\n").unwrap();
    let seen = long_conversation(config).await;
    let mut unchanged = 0;
    let mut compactions = 0;
    for pair in seen.windows(2) {
        let ((recall_a, first_a), (recall_b, first_b)) = (&pair[0], &pair[1]);
        if first_a != first_b {
            compactions += 1;
        } else if recall_a.is_some() {
            // No compaction: the block is the same bytes, and the history only grew.
            assert_eq!(recall_a, recall_b);
            unchanged += 1;
        }
    }
    assert!(compactions >= 2, "{compactions} compactions");
    assert!(unchanged >= 5, "only {unchanged} requests sent a block unchanged");
    assert!(
        seen.iter().any(|(recall, _)| recall.as_deref().is_some_and(|r| r.contains("Postgres 16")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_off_sends_no_block() {
    let state = tempfile::tempdir().unwrap();
    // Off by default; also when the file says so.
    let seen = long_conversation(config("127.0.0.1:1".parse().unwrap(), state.path())).await;
    assert!(seen.iter().all(|(recall, _)| recall.is_none()));
    let state = tempfile::tempdir().unwrap();
    let mut config = config("127.0.0.1:1".parse().unwrap(), state.path());
    config.apply_toml("[retrieval]\nauto = false\n").unwrap();
    let seen = long_conversation(config).await;
    assert!(seen.windows(2).any(|pair| pair[0].1 != pair[1].1), "nothing left the window");
    assert!(seen.iter().all(|(recall, _)| recall.is_none()));
}

#[test]
fn settings_the_proxy_does_not_know_are_refused_by_name() {
    let mut config = ctxwin_proxy::ProxyConfig::default();
    let error = config.apply_toml("[proxy]\nobservation_limt = 4000\n").unwrap_err();
    assert!(error.to_string().contains("observation_limt"), "{error}");
    config.apply_toml("[proxy]\nobservation_limit = 4000\nnever_cut = [\"Read\"]\n").unwrap();
    assert_eq!(config.observation_limit, Some(4_000));
}
