//! The proxy's security suite (issue 26): what an operator who puts it in front of a team's
//! conversations relies on. Each case of the issue, and its relatives, has a test:
//!
//! | what | where |
//! |---|---|
//! | tenants: different API keys (OpenAI and Anthropic style) or team headers with the same session id or the same opening never share a conversation; session ids differing only in non-ASCII bytes or colliding on a 32-bit hash stay apart; no credential or client byte in the state directory | `tenants.rs` |
//! | tenants under load: 100 tenants at once, same session id, every upstream request holds its own tenant's words only | here |
//! | ids: path-like, huge and non-UTF-8 session ids and model names never reach a path; nothing is written outside the state directory | here |
//! | hostile bodies: nested 10,000 deep, not UTF-8, not an object, wrong types, huge counts: 4xx in the provider's format, never 5xx, and the proxy serves on | here |
//! | refused requests store nothing: no byte of them on disk | `refused.rs` |
//! | slow clients: 1,000 stalled connections, the connection limit, idle and stalled-body timeouts | `hostile.rs` |
//! | routing and errors: query strings forwarded; 405, 415, 400 for a truncated body, in the provider's format | `routing.rs` |
//! | repeats: 1,000 identical requests, a long conversation resent, edits and rewinds: bounded state | `repeats.rs` |
//! | faults: upstream 500 passed through, unreachable 502, slow 504, truncated stream: nothing lost | `fake_upstream.rs` |
//! | faults: a client that leaves mid-stream; errors that never echo a credential | here |
//! | the proxy key: required on every route when set | `fake_upstream.rs` |
//!
//! All of them are integration tests: `cargo test --workspace` (the CI's test command) runs
//! them.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{Mode, config, start_fake, start_proxy};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Every directory name under `dir`, recursively.
fn dir_names(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.push(entry.file_name().to_string_lossy().into_owned());
            dir_names(&entry.path(), out);
        }
    }
}

fn is_hex(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_never_reach_a_path_and_nothing_is_written_outside_the_state_directory() {
    let (up, _fake) = start_fake().await;
    let outer = tempfile::tempdir().unwrap();
    let state = outer.path().join("state");
    let proxy = start_proxy(config(up, &state)).await;
    let client = reqwest::Client::new();
    let long = "s".repeat(8_000);
    let ids: Vec<Vec<u8>> = [
        "../escape",
        "../../escape",
        "/etc/passwd",
        "..",
        ".",
        "a/b/c",
        "%2e%2e%2fescape",
        "CON",
        "name\twith\ttabs",
        long.as_str(),
    ]
    .iter()
    .map(|id| id.as_bytes().to_vec())
    .chain([vec![0xff, 0xfe, b'x'], "会话/../x".as_bytes().to_vec()])
    .collect();
    for (n, id) in ids.iter().enumerate() {
        let model = if n % 2 == 0 { "../../model" } else { "m/../../x" };
        let body = json!({"model": model, "messages": [{"role": "user", "content": format!("hello {n}")}]});
        let response = client
            .post(proxy.url("/v1/chat/completions"))
            .header("x-ctxwin-session", reqwest::header::HeaderValue::from_bytes(id).unwrap())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "session id {n}");
    }
    proxy.stop().await;
    let outside: Vec<String> = std::fs::read_dir(outer.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(outside, ["state"], "written outside the state directory");
    let mut dirs = Vec::new();
    dir_names(&state, &mut dirs);
    for name in &dirs {
        assert!(is_hex(name) || name.starts_with("checkpoints"), "client bytes in a path: {name}");
    }
    let conversations = common::archive_counts(&state);
    assert_eq!(conversations.len(), ids.len(), "one conversation per id: {conversations:?}");
}

/// Bodies no client library sends, for `provider`'s endpoint.
fn hostile_bodies(anthropic: bool) -> Vec<(&'static str, Vec<u8>)> {
    let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    let message = |content: &str| {
        let extra = if anthropic { r#""max_tokens":16,"# } else { "" };
        format!(r#"{{"model":"m",{extra}"messages":[{{"role":"user","content":{content}}}]}}"#)
    };
    let many_empty = format!(r#"{{"model":"m","messages":[{}]}}"#, vec!["{}"; 10_000].join(","));
    vec![
        ("content nested 10,000 deep", message(&deep(10_000)).into_bytes()),
        ("content nested 100,000 deep", message(&deep(100_000)).into_bytes()),
        ("a body nested 50,000 deep", deep(50_000).into_bytes()),
        (
            "not UTF-8",
            [
                b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"".as_slice(),
                &[0xff, 0xfe],
                b"\"}]}",
            ]
            .concat(),
        ),
        ("an array", b"[]".to_vec()),
        ("null", b"null".to_vec()),
        ("a string", b"\"messages\"".to_vec()),
        ("empty", Vec::new()),
        ("messages an object", br#"{"model":"m","messages":{"role":"user"}}"#.to_vec()),
        ("messages a number", br#"{"model":"m","messages":1e400}"#.to_vec()),
        (
            "a model that is an object",
            br#"{"model":{"a":1},"messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
        ),
        ("content a number", message("12345678901234567890123456789").into_bytes()),
        ("10,000 empty messages", many_empty.into_bytes()),
        (
            "a role of 1 MB",
            format!(
                r#"{{"model":"m","messages":[{{"role":"{}","content":"hi"}}]}}"#,
                "r".repeat(1 << 20)
            )
            .into_bytes(),
        ),
        ("truncated JSON", br#"{"model":"m","messages":[{"role":"user","content":"hi"#.to_vec()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_4xx_in_the_providers_format_and_the_proxy_serves_on() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        for (what, body) in hostile_bodies(anthropic) {
            let response = client
                .post(proxy.url(path))
                .header("content-type", "application/json")
                .header("x-ctxwin-session", what)
                .body(body)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{path}, {what}: no answer: {e}"));
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            assert!((400..500).contains(&status), "{path}, {what}: {status} {text}");
            let error: Value = serde_json::from_str(&text)
                .unwrap_or_else(|_| panic!("{path}, {what}: not JSON: {text}"));
            if anthropic {
                assert_eq!(error["type"], "error", "{what}: {error}");
            }
            assert!(error["error"]["message"].is_string(), "{path}, {what}: {error}");
        }
    }
    assert_eq!(fake.count(), 0, "a hostile body reached the upstream");
    // Nothing broke: a valid request on the same proxy is served.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "Still there?"}]});
    let response = client.post(proxy.url("/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tenants_at_once_with_one_session_id_stay_apart() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    // A small window: early turns leave it, so retrieval searches the archive too.
    settings.default_window = 1_024;
    settings.reserve = 128;
    let proxy = start_proxy(settings).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let tenants: Vec<_> = (0..100)
        .map(|t| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let key = format!("Bearer sk-tenant-{t:03}");
                let mut messages = Vec::new();
                let filler = "The vault log lists every door, badge and shift of the week. ".repeat(6);
                for turn in 0..8 {
                    messages.push(json!({"role": "user", "content": format!(
                        "Turn {turn}: the vault code of tenant{t:03}x is {t:03}-{turn}. What was it again? {filler}"
                    )}));
                    let response = client
                        .post(&url)
                        .header("authorization", &key)
                        .header("x-ctxwin-session", "shared")
                        .json(&json!({"model": "m", "messages": messages}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200, "tenant {t}, turn {turn}");
                    let answer: Value = response.json().await.unwrap();
                    messages.push(answer["choices"][0]["message"].clone());
                }
            })
        })
        .collect();
    for tenant in tenants {
        tenant.await.unwrap();
    }
    let evicted = proxy.app.metrics.compactions.load(std::sync::atomic::Ordering::Relaxed);
    assert!(evicted > 0, "the histories outgrew the window");
    // Each upstream request names only the tenant whose key it carried.
    let received = fake.received.lock().unwrap().clone();
    assert_eq!(received.len(), 800);
    for request in &received {
        let key = request.headers["authorization"].to_str().unwrap();
        let own = format!("tenant{}x", key.trim_start_matches("Bearer sk-tenant-"));
        let body = String::from_utf8_lossy(&request.body);
        let named: BTreeSet<&str> = body
            .match_indices("tenant")
            .filter_map(|(at, _)| body.get(at..at + 10))
            .filter(|name| name.ends_with('x'))
            .collect();
        assert_eq!(named, BTreeSet::from([own.as_str()]), "{body}");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_leaves_its_conversation_usable() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut messages = vec![json!({"role": "user", "content": "Write a long story."})];
    let send = |messages: &[Value], stream: bool| {
        client
            .post(proxy.url("/v1/chat/completions"))
            .header("x-ctxwin-session", "leaver")
            .json(&json!({"model": "m", "stream": stream, "messages": messages}))
            .send()
    };
    fake.answer_next("once upon a time there was a proxy that kept every conversation apart");
    fake.set_mode(Mode::SlowStream(100));
    let response = send(&messages, true).await.unwrap();
    let mut chunks = response.bytes_stream();
    let first = chunks.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(chunks);
    fake.set_mode(Mode::Normal);
    // The same conversation answers the next requests (its lock was released).
    for turn in 0..3 {
        let response = send(&messages, false).await.expect("the conversation answers again");
        assert_eq!(response.status(), 200, "turn {turn}");
        let answer: Value = response.json().await.unwrap();
        messages.push(answer["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": format!("And then ({turn})?")}));
    }
    // The last request went through whole: what the client left mid-stream did not stick.
    let sent = &messages[..messages.len() - 2];
    assert_eq!(fake.last().json()["messages"], Value::Array(sent.to_vec()));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_never_echo_a_credential() {
    let (up, _fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    settings.proxy_key = Some("pk-right".into());
    let proxy = start_proxy(settings).await;
    let client = reqwest::Client::new();
    let secret = "sk-never-echo-0123456789";
    for (path, key, body) in [
        ("/v1/chat/completions", "pk-wrong-secret", "{}"),
        ("/v1/chat/completions", "pk-right", "{not json"),
        (
            "/v1/messages",
            "pk-right",
            r#"{"model":"m","messages":[{"role":"system","content":"x"}]}"#,
        ),
        ("/metrics", "pk-wrong-secret", ""),
    ] {
        let response = client
            .post(proxy.url(path))
            .header("x-ctxwin-key", key)
            .header("authorization", format!("Bearer {secret}"))
            .header("x-api-key", secret)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert!((400..500).contains(&status), "{path}: {status} {text}");
        assert!(!text.contains(secret) && !text.contains("pk-wrong-secret"), "{path}: {text}");
    }
    proxy.stop().await;
}
