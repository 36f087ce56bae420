//! Repeats and long histories (issue 26, item 4): the same request sent again and again
//! (client retries, "regenerate") and a long conversation resent whole are served every
//! time, and what the proxy stores does not grow with the number of resends.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::{archive_counts, config, start_fake, start_proxy};
use ctxwin_proxy::ProxyConfig;
use serde_json::{Value, json};

/// What the state directory holds: conversations (sessions in the archive, generations and
/// side sessions counted with theirs), archive rows, and checkpoint directories.
fn stored(state: &Path) -> (usize, u64, usize) {
    let counts = archive_counts(state);
    let rows = counts.iter().map(|(_, rows)| rows).sum();
    (counts.len(), rows, checkpoint_dirs(state))
}

fn checkpoint_dirs(dir: &Path) -> usize {
    let mut found = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            let name = entry.file_name().to_string_lossy().to_string();
            found += usize::from(name.starts_with("checkpoints")) + checkpoint_dirs(&entry.path());
        }
    }
    found
}

/// A proxy that checkpoints often, so resends meet conversations that were checkpointed
/// (answers waiting included) between them.
fn busy_config(up: std::net::SocketAddr, state: &Path) -> ProxyConfig {
    ProxyConfig {
        checkpoint_every: 4,
        checkpoint_idle: Duration::from_millis(20),
        ..config(up, state)
    }
}

/// Sends `body` `times` times; every answer must be 200.
async fn resend(
    proxy: &common::Proxy,
    path: &str,
    body: &Value,
    times: usize,
    session: Option<&str>,
) {
    let client = reqwest::Client::new();
    for n in 0..times {
        let mut request = client.post(proxy.url(path)).json(body);
        if let Some(session) = session {
            request = request.header("x-ctxwin-session", session);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "send {n}: {text}");
        if n % 97 == 0 {
            // Now and then a pause, long enough for the idle checkpoint.
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_identical_requests_are_served_with_bounded_state() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "Say hi."}]}),
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Say hi."}]}),
            Some("retries"),
        ),
        (
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hi."}]}),
            None,
        ),
    ];
    // A few sends of each, then the state they leave.
    let proxy = start_proxy(busy_config(up, state.path())).await;
    for (path, body, session) in &cases {
        resend(&proxy, path, body, 3, *session).await;
    }
    proxy.stop().await;
    let early = stored(state.path());
    // A thousand more of each (over a restart), then the state again: the same.
    let proxy = start_proxy(busy_config(up, state.path())).await;
    for (path, body, session) in &cases {
        resend(&proxy, path, body, 1_000, *session).await;
    }
    let branches = proxy.app.metrics.branches.load(Relaxed);
    proxy.stop().await;
    let late = stored(state.path());
    println!("after 3 sends of each: {early:?}; after 1,003: {late:?}; branches {branches}");
    assert_eq!(late, early, "(conversations, rows, checkpoint directories) grew with resends");
    assert_eq!(early.0, cases.len(), "one conversation per request: {early:?}");
    assert_eq!(branches, 0);
    assert_eq!(fake.count(), 3 * 1_003);
}

/// `turns` alternating user and assistant messages, ending with a user message.
fn long_history(turns: usize) -> Vec<Value> {
    (0..turns)
        .map(|n| {
            let role = if n % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": format!("Message {n}: the nightly job {n} moved to runner {}.", n % 7)})
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1001_message_conversation_resent_50_times_is_served_with_bounded_state() {
    let (up, _fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let body = json!({"model": "m", "messages": long_history(1_001)});
    let proxy = start_proxy(busy_config(up, state.path())).await;
    resend(&proxy, "/v1/chat/completions", &body, 2, Some("long")).await;
    proxy.stop().await;
    let early = stored(state.path());
    let proxy = start_proxy(busy_config(up, state.path())).await;
    resend(&proxy, "/v1/chat/completions", &body, 48, Some("long")).await;
    let branches = proxy.app.metrics.branches.load(Relaxed);
    proxy.stop().await;
    let late = stored(state.path());
    println!("after 2 sends: {early:?}; after 50: {late:?}; branches {branches}");
    assert_eq!(late, early, "(conversations, rows, checkpoint directories) grew with resends");
    assert_eq!(early.0, 1);
    assert!(early.1 >= 1_001, "{early:?}");
    assert_eq!(branches, 0);
    // The conversation continues from its checkpoint after all that.
    let mut messages = long_history(1_001);
    messages.push(json!({"role": "assistant", "content": "Runner 3 holds it."}));
    messages.push(json!({"role": "user", "content": "And job 1,000?"}));
    let proxy = start_proxy(busy_config(up, state.path())).await;
    let continued = json!({"model": "m", "messages": messages});
    resend(&proxy, "/v1/chat/completions", &continued, 1, Some("long")).await;
    let loads = proxy.app.metrics.loads.load(Relaxed);
    proxy.stop().await;
    assert_eq!(loads, 1);
    assert_eq!(stored(state.path()), (1, early.1 + 2, early.2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewinds_and_edits_find_their_branch_by_content() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(busy_config(up, state.path())).await;
    let history = long_history(7);
    let body = |messages: &[Value]| json!({"model": "m", "messages": messages});
    resend(&proxy, "/v1/chat/completions", &body(&history), 1, Some("tree")).await;
    // A rewound history (the first three messages), sent 100 times: one branch.
    resend(&proxy, "/v1/chat/completions", &body(&history[..3]), 100, Some("tree")).await;
    assert_eq!(fake.last().json()["messages"], Value::Array(history[..3].to_vec()));
    let after_rewinds = stored(state.path()).0;
    // Seventy different edits of the same message, each sent twice: a branch each, one hop
    // from the conversation (no chain of branches to run out of).
    for n in 0..70 {
        let mut edited = history.clone();
        edited[4] =
            json!({"role": "user", "content": format!("Edit {n}: which runner holds job 4?")});
        resend(&proxy, "/v1/chat/completions", &body(&edited), 2, Some("tree")).await;
        assert_eq!(fake.last().json()["messages"], Value::Array(edited));
    }
    // The original goes on untouched.
    resend(&proxy, "/v1/chat/completions", &body(&history), 1, Some("tree")).await;
    assert_eq!(fake.last().json()["messages"], Value::Array(history.clone()));
    proxy.stop().await;
    let (conversations, _, _) = stored(state.path());
    println!("conversations: {after_rewinds} after the rewinds, {conversations} after the edits");
    assert_eq!(after_rewinds, 2);
    assert_eq!(conversations, 2 + 70);
}
