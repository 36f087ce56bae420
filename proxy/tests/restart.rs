//! Kill the proxy process mid-stream and restart it: the conversation resumes from its
//! checkpoint and the archive holds every message once.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{Mode, archive_counts, start_fake};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

async fn spawn_proxy(
    upstream: std::net::SocketAddr,
    state: &std::path::Path,
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctxwin-proxy"))
        .args([
            "--upstream",
            &format!("http://{upstream}"),
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(state)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line.rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    (child, url)
}

fn body(messages: &[Value], stream: bool) -> String {
    json!({"model": "m", "messages": messages, "stream": stream,
        "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_stream_resumes_from_the_checkpoint() {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let client = reqwest::Client::new();
    let (mut proxy, url) = spawn_proxy(up, state.path()).await;
    let endpoint = format!("{url}/v1/chat/completions");
    let mut messages = vec![
        json!({"role": "system", "content": "sys"}),
        json!({"role": "user", "content": "build it"}),
    ];
    let answer: Value = client
        .post(&endpoint)
        .body(body(&messages, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "built"}));

    // Idle for a moment: the sweeper checkpoints the conversation (waited for, not assumed:
    // on a loaded machine the sweep can come late).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for _ in 0..80 {
        if has_checkpoint(state.path()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(has_checkpoint(state.path()), "no checkpoint after 21 s idle");

    // A slow stream; the proxy dies after the first chunk.
    fake.set_mode(Mode::SlowStream(300));
    let mut response = client.post(&endpoint).body(body(&messages, true)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    proxy.start_kill().unwrap();
    proxy.wait().await.unwrap();
    assert!(response.chunk().await.is_err() || response.chunk().await.unwrap_or(None).is_none());

    // Restarted on the same state: the client retries, then goes on.
    fake.set_mode(Mode::Normal);
    let (mut proxy, url) = spawn_proxy(up, state.path()).await;
    let endpoint = format!("{url}/v1/chat/completions");
    let response = client.post(&endpoint).body(body(&messages, false)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fake.last().json()["messages"], Value::Array(messages.clone()));
    let answer: Value = response.json().await.unwrap();
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "and deploy"}));
    let response = client.post(&endpoint).body(body(&messages, false)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fake.last().json()["messages"], Value::Array(messages.clone()));
    let metrics = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ctxwin_proxy_branches_total 0"), "{metrics}");
    // The writer commits a request's rows within milliseconds of queueing them: waited for
    // (on a loaded machine it can take longer), then the proxy is killed.
    for _ in 0..100 {
        if archive_counts(state.path()).first().is_some_and(|(_, rows)| *rows >= 7) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.start_kill().unwrap();
    proxy.wait().await.unwrap();
    let counts = archive_counts(state.path());
    assert_eq!(counts.len(), 1, "{counts:?}");
    // system, user, call, result, answer, user + the tool-definition placeholder, under the
    // conversation's own name: it resumed from its checkpoint (no new generation). The last
    // answer (a call) waits for the next request or the idle checkpoint, whichever comes
    // first: killed before either, the proxy takes it from the client's resend.
    assert_eq!(counts[0].1, 7, "{counts:?}");
    let archive =
        ctxwin_std::store::sqlite::SqliteArchive::open(state.path().join("archive.db")).unwrap();
    assert_eq!(
        ctxwin_std::store::ArchiveStore::usage(
            &archive,
            &ctxwin_std::store::Scope::local(format!("{}#1", counts[0].0))
        )
        .unwrap()
        .messages,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_the_first_checkpoint_continues_as_a_new_generation() {
    let state = tempfile::tempdir().unwrap();
    let (up, _fake) = start_fake().await;
    let client = reqwest::Client::new();
    let (mut proxy, url) = spawn_proxy(up, state.path()).await;
    let endpoint = format!("{url}/v1/chat/completions");
    let mut messages = vec![json!({"role": "user", "content": "first words"})];
    let answer: Value = client
        .post(&endpoint)
        .body(body(&messages, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The request's rows reach the archive through its deferred writer, a moment after the
    // answer: the kill comes once they are there (before the first checkpoint), so that the
    // second life finds rows without a checkpoint.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while archive_counts(state.path()).first().is_none_or(|(_, rows)| *rows < 2) {
        assert!(std::time::Instant::now() < deadline, "the first rows never reached the archive");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.start_kill().unwrap();
    proxy.wait().await.unwrap();
    messages.push(answer["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"}));
    let (mut proxy, url) = spawn_proxy(up, state.path()).await;
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .body(body(&messages, false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.start_kill().unwrap();
    proxy.wait().await.unwrap();
    let counts = archive_counts(state.path());
    let archive =
        ctxwin_std::store::sqlite::SqliteArchive::open(state.path().join("archive.db")).unwrap();
    let first = ctxwin_std::store::ArchiveStore::usage(
        &archive,
        &ctxwin_std::store::Scope::local(counts[0].0.as_str()),
    )
    .unwrap()
    .messages;
    let second = ctxwin_std::store::ArchiveStore::usage(
        &archive,
        &ctxwin_std::store::Scope::local(format!("{}#1", counts[0].0)),
    )
    .unwrap()
    .messages;
    // The first life's rows stay (placeholder, user, and the answer if it was recorded before
    // the kill); the new generation holds them all again plus the result (and the answer).
    assert!((2..=3).contains(&first) && (4..=5).contains(&second), "{first} {second}");
}

/// Whether any checkpoint file exists below `dir`.
fn has_checkpoint(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).into_iter().flatten().flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            has_checkpoint(&path)
        } else {
            path.extension().is_some_and(|ext| ext == "ckpt")
        }
    })
}
