//! A request the proxy refuses stores nothing (issue 26): unreadable bodies, messages that do
//! not read, tool results that answer no call, a message too large for the window, a body
//! over the limit — to new conversations and to one with history. After them the state
//! directory holds the same files with the same bytes, no file holds a byte of theirs, and
//! nothing reached the upstream.

mod common;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::time::Duration;

use common::{config, start_fake, start_proxy};
use serde_json::{Value, json};

/// Every file under `dir`: its size and a hash of its bytes (not for SQLite's shared-memory
/// index, which readers write their read marks into).
fn files(dir: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
            continue;
        }
        let bytes = std::fs::read(&path).unwrap_or_default();
        let mut hasher = DefaultHasher::new();
        if !path.to_string_lossy().ends_with("-shm") {
            bytes.hash(&mut hasher);
        }
        found.insert(path.display().to_string(), (bytes.len() as u64, hasher.finish()));
    }
    found
}

/// The directory once background work (the idle checkpoint, WAL copies) has settled.
async fn settled(dir: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut last = files(dir);
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let now = files(dir);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the state directory never settled");
}

/// Files under `dir` holding `marker`.
fn holding(dir: &Path, marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(holding(&path, marker));
        } else if std::fs::read(&path)
            .unwrap_or_default()
            .windows(marker.len())
            .any(|w| w == marker.as_bytes())
        {
            found.push(path.display().to_string());
        }
    }
    found
}

const MARK: &str = "REFUSED-7f3a";

fn user(text: &str) -> Value {
    json!({"role": "user", "content": format!("{MARK} {text}")})
}

fn call(id: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
}

fn result(id: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": format!("{MARK} output of {id}")})
}

fn openai(messages: &[Value]) -> String {
    json!({"model": "m", "messages": messages}).to_string()
}

/// Refused OpenAI bodies, each with the history `known` before its new messages.
fn refused_openai(known: &[Value]) -> Vec<(&'static str, String)> {
    let with = |new: &[Value]| openai(&[known, new].concat());
    let huge = "word ".repeat(40_000);
    vec![
        ("bad JSON", format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{MARK}"#)),
        (
            "content an object",
            with(&[user("first"), json!({"role": "user", "content": {"text": MARK}})]),
        ),
        ("role missing", with(&[user("first"), json!({"content": MARK})])),
        (
            "tool_calls a string",
            with(&[
                user("first"),
                json!({"role": "assistant", "content": MARK, "tool_calls": "run"}),
            ]),
        ),
        (
            "tool message without its call id",
            with(&[user("first"), call("c1"), json!({"role": "tool", "content": MARK})]),
        ),
        ("an orphan tool result", with(&[user("first"), result("nobody")])),
        ("a result before its call", with(&[user("first"), result("c2"), call("c2")])),
        (
            "a second result for one call",
            with(&[user("first"), call("c3"), result("c3"), result("c3")]),
        ),
        (
            "a result after the turn moved on",
            with(&[user("first"), call("c4"), user("next"), result("c4")]),
        ),
        ("an unknown role", with(&[user("first"), json!({"role": "wizard", "content": MARK})])),
        (
            "a message larger than the window",
            with(&[user("first"), json!({"role": "user", "content": format!("{MARK} {huge}")})]),
        ),
    ]
}

/// Refused Anthropic bodies (new conversations).
fn refused_anthropic() -> Vec<(&'static str, String)> {
    let body =
        |messages: Value| json!({"model": "c", "max_tokens": 10, "messages": messages}).to_string();
    let nested = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    vec![
        (
            "a system role inside messages",
            body(json!([{"role": "user", "content": MARK}, {"role": "system", "content": MARK}])),
        ),
        (
            "an orphan tool_result block",
            body(
                json!([{"role": "user", "content": [{"type": "text", "text": MARK}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": MARK}, {"type": "text", "text": MARK}]}]),
            ),
        ),
        (
            "content nested 10,000 deep",
            format!(
                r#"{{"model":"c","max_tokens":10,"messages":[{{"role":"user","content":"{MARK}"}},{{"role":"user","content":{nested}}}]}}"#
            ),
        ),
    ]
}

/// A refused request: its path, what is wrong with it, its body.
type Case = (&'static str, &'static str, String);

/// Sends the refused requests `cases` (bodies built on `known`, the history of a conversation:
/// none for new conversations) and checks they leave no byte on disk.
async fn leave_no_byte(cases: fn(&[Value]) -> Vec<Case>) {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.default_window = 8_192;
    cfg.reserve = 512;
    cfg.body_limit = 512 << 10;
    cfg.checkpoint_idle = Duration::from_millis(50);
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: String, session: &str| {
        client
            .post(proxy.url(path))
            .header("authorization", "Bearer sk-refused")
            .header("x-ctxwin-session", session.to_string())
            .body(body)
            .send()
    };
    // One conversation with history, answered and checkpointed.
    let mut known = vec![json!({"role": "user", "content": "Is the build green?"})];
    let answer: Value =
        post("/v1/chat/completions", openai(&known), "known").await.unwrap().json().await.unwrap();
    known.push(answer["choices"][0]["message"].clone());
    let before = settled(state.path()).await;
    let forwarded = fake.count();
    // Each to a new conversation, then to the one with history.
    let mut sent = Vec::new();
    for (n, (path, what, body)) in cases(&[]).into_iter().enumerate() {
        sent.push((path, what, body, format!("new-{n}")));
    }
    for (path, what, body) in cases(&known) {
        sent.push((path, what, body, "known".to_string()));
    }
    for (path, what, body, session) in sent {
        let response = post(path, body, &session).await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert!(matches!(status, 400 | 413), "{what} ({session}): {status} {text}");
    }

    assert_eq!(fake.count(), forwarded, "nothing refused reached the upstream");
    assert_eq!(settled(state.path()).await, before, "the state directory changed");
    assert!(holding(state.path(), MARK).is_empty(), "{:?}", holding(state.path(), MARK));
    // The conversation with history still works, and still stores nothing refused.
    known.push(json!({"role": "user", "content": "Deploy it."}));
    let response = post("/v1/chat/completions", openai(&known), "known").await.unwrap();
    assert_eq!(response.status(), 200);
    proxy.stop().await;
    assert!(holding(state.path(), MARK).is_empty(), "{:?}", holding(state.path(), MARK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_leave_no_byte_on_disk() {
    leave_no_byte(|known| {
        let mut cases: Vec<_> = refused_openai(known)
            .into_iter()
            .map(|(what, body)| ("/v1/chat/completions", what, body))
            .collect();
        if known.is_empty() {
            cases.extend(refused_anthropic().into_iter().map(|(w, b)| ("/v1/messages", w, b)));
        }
        let over = openai(&[user(&"x".repeat(600 << 10))]);
        cases.push(("/v1/chat/completions", "a body over the limit", over));
        cases
    })
    .await;
}

/// The newest messages, which stay in the window while they fit, over the budget: each is
/// checked against its level before any is pushed, and the levels together are the budget,
/// so what compose would refuse is refused first (and newest messages that each fit give
/// way oldest first in the core, issue 31): never stored and then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_pinned_part_cannot_fit_stores_nothing() {
    leave_no_byte(|known| {
        let words = |w: &str| user(&format!("{w} words ").repeat(1_100));
        let new = [words("many"), words("more"), words("last")];
        vec![(
            "/v1/chat/completions",
            "newest messages over the budget",
            openai(&[known, &new].concat()),
        )]
    })
    .await;
}
