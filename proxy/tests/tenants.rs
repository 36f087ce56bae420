//! A conversation belongs to a tenant: two clients never see each other's conversation,
//! whatever session ids or opening messages they send. Each case runs the same scenario: client
//! A gets an answer holding a secret (an account balance and a code); client B, with the same
//! opening, then keeps asking for "the account balance and the transfer code" until its early
//! turns leave the window and retrieval searches the archive. Not one byte of A's secret may
//! reach the upstream in B's requests, nor may a store query of B's conversation return it.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use common::{Fake, config, start_fake, start_proxy};
use ctxwin_proxy::ProxyConfig;
use serde_json::{Value, json};

const SECRET_ANSWER: &str = "Your balance is 48213.77 EUR and your transfer code is KESTREL-7291.";
const SECRETS: [&str; 2] = ["48213.77", "KESTREL-7291"];
/// A word only B's messages hold.
const B_MARKER: &str = "orcapod";
const KEY_A: &str = "Bearer sk-tenant-a-0123456789";
const KEY_B: &str = "Bearer sk-tenant-b-9876543210";

type Headers<'a> = &'a [(&'a str, &'a str)];

fn opening() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are the bank's support assistant."}),
        json!({"role": "user", "content": "Hello, I need help with my account."}),
    ]
}

/// Sends `messages` with `headers`; the answer's message.
async fn chat(
    client: &reqwest::Client,
    url: &str,
    headers: Headers<'_>,
    messages: &[Value],
) -> Value {
    let mut request = client.post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = json!({"model": "m", "messages": messages}).to_string();
    let response = request.body(body).send().await.unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let answer: Value = response.json().await.unwrap();
    answer["choices"][0]["message"].clone()
}

/// The upstream requests that carry any of A's secret.
fn leaked(fake: &Fake) -> Vec<String> {
    fake.received
        .lock()
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .filter(|body| SECRETS.iter().any(|s| body.contains(s)))
        .collect()
}

/// Runs the scenario (A's secret answer, then B's 40 turns) and checks B never sees the secret,
/// upstream or in a store query of its conversations.
async fn a_secret_never_reaches_b(
    a: Headers<'_>,
    b: Headers<'_>,
    tune: impl FnOnce(&mut ProxyConfig),
) {
    let state = tempfile::tempdir().unwrap();
    let (up, fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.default_window = 1_024;
    cfg.reserve = 128;
    // Retrieval on (off by default): B's archive searches must find none of A's text.
    cfg.retrieval.auto = true;
    tune(&mut cfg);
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");

    fake.answer_next(SECRET_ANSWER);
    let answer = chat(&client, &url, a, &opening()).await;
    assert_eq!(answer["content"], SECRET_ANSWER);
    // A goes on: its copy of the answer, and the secret in it, is stored.
    let mut a_history = opening();
    a_history.push(answer);
    a_history.push(json!({"role": "user", "content": "Thanks, noted."}));
    chat(&client, &url, a, &a_history).await;
    // What reached the upstream for A is A's: B's requests are checked from here.
    fake.received.lock().unwrap().clear();

    let mut messages = opening();
    let filler = "The statement lists card payments, standing orders and fees for the quarter.";
    for turn in 0..40 {
        let answer = chat(&client, &url, b, &messages).await;
        let leaks = leaked(&fake);
        assert!(leaks.is_empty(), "turn {turn}: A's secret went upstream for B: {}", leaks[0]);
        messages.push(answer);
        messages.push(json!({"role": "user", "content": format!(
            "Turn {turn} ({B_MARKER}): what was the account balance and the transfer code again? {filler}"
        )}));
    }
    let sent = fake.last().json();
    assert!(
        sent["messages"].as_array().unwrap().len() < messages.len(),
        "B's early turns left the window"
    );
    let retrieved = fake
        .received
        .lock()
        .unwrap()
        .iter()
        .any(|r| String::from_utf8_lossy(&r.body).contains("[Retrieved from archive]"));
    assert!(retrieved, "retrieval searched B's archive");
    let metrics = client.get(proxy.url("/metrics")).send().await.unwrap().text().await.unwrap();
    proxy.stop().await;
    assert!(
        metrics.contains("ctxwin_proxy_branches_total 0"),
        "B never met A's history: {metrics}"
    );
    stores_keep_them_apart(state.path());
}

/// The archive after the scenario: A's secret is stored, only in
/// conversations that hold nothing of B's, and a search scoped to any of B's conversations
/// cannot return it.
fn stores_keep_them_apart(state: &Path) {
    use ctxwin_std::store::{ArchiveStore, Scope, SearchQuery};
    let archive = ctxwin_std::store::sqlite::SqliteArchive::open(state.join("archive.db")).unwrap();
    let names = archive.conversations("", "").unwrap();
    let holding = |word: &str| -> BTreeSet<String> {
        let query = SearchQuery::new(word, 1_000);
        let holds =
            |name: &String| !archive.search(&Scope::local(name), &query).unwrap().is_empty();
        names.iter().filter(|name| holds(name)).cloned().collect()
    };
    let secret = holding("KESTREL");
    let b = holding(B_MARKER);
    assert!(!secret.is_empty() && !b.is_empty(), "{secret:?} {b:?}");
    assert!(secret.is_disjoint(&b), "A's secret shares a conversation with B: {secret:?} {b:?}");
    for name in &b {
        let scope = Scope::local(name);
        let query = SearchQuery::new("account balance transfer code KESTREL", 100);
        for hits in [archive.search(&scope, &query).unwrap(), {
            archive.search(&scope, &query.with_snippets()).unwrap()
        }] {
            for hit in &hits {
                // The hit is this conversation's own row.
                let row = archive.get(&scope, hit.id).unwrap().expect("a hit of another session");
                assert_eq!(row.message.content, hit.content, "{hits:?}");
            }
            assert!(
                hits.iter().all(|h| !SECRETS.iter().any(|s| h.content.contains(s))),
                "{hits:?}"
            );
        }
    }
    // The raw JSON the rows keep (what the proxy writes back upstream): A's secret only in
    // conversations that hold nothing of B's either.
    let raw_holding = |word: &str| -> BTreeSet<String> {
        let holds = |name: &String| {
            let rows = archive.rows_after(&Scope::local(name), 0, usize::MAX).unwrap();
            rows.iter().any(|row| row.raw.as_deref().is_some_and(|raw| raw.contains(word)))
        };
        names.iter().filter(|name| holds(name)).cloned().collect()
    };
    let (secret, b) = (raw_holding("KESTREL"), raw_holding(B_MARKER));
    assert!(!secret.is_empty() && !b.is_empty(), "{secret:?} {b:?}");
    assert!(secret.is_disjoint(&b), "raw JSON: {secret:?} {b:?}");
    assert!(!state.join("proxy.db").exists(), "no side store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_api_keys_with_the_same_session_id_never_share_a_conversation() {
    a_secret_never_reaches_b(
        &[("authorization", KEY_A), ("x-ctxwin-session", "agent-7")],
        &[("authorization", KEY_B), ("x-ctxwin-session", "agent-7")],
        |_| {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_api_keys_with_the_same_opening_never_share_a_conversation() {
    a_secret_never_reaches_b(&[("authorization", KEY_A)], &[("authorization", KEY_B)], |_| {})
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_style_keys_are_tenants_too() {
    a_secret_never_reaches_b(
        &[("x-api-key", "sk-ant-tenant-a")],
        &[("x-api-key", "sk-ant-tenant-b")],
        |_| {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ids_differing_only_in_non_ascii_characters_never_share_a_conversation() {
    a_secret_never_reaches_b(
        &[("authorization", KEY_A), ("x-ctxwin-session", "会话-A")],
        &[("authorization", KEY_A), ("x-ctxwin-session", "会话-B")],
        |_| {},
    )
    .await;
}

/// Two session ids that keep the same characters through a sanitizer dropping all but
/// `[A-Za-z0-9._-]` and share the low 32 bits of their 64-bit FNV-1a hash: the shape of a key
/// built as `s-<sanitized>-<8 hex digits>`. Found by a birthday search (about 2^16 tries).
fn colliding_session_ids() -> (String, String) {
    const DROPPED: &[u8] = b"!#$%&*+,:;=?@^|~";
    let mut seen: HashMap<u32, String> = HashMap::new();
    for n in 0u64.. {
        let mut id = String::from("agent-7");
        let mut rest = n;
        loop {
            id.push(char::from(DROPPED[(rest % 16) as usize]));
            rest /= 16;
            if rest == 0 {
                break;
            }
        }
        let low = ctxwin_proxy::hash::hash_str(&id) as u32;
        if let Some(other) = seen.insert(low, id.clone()) {
            return (other, id);
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ids_colliding_on_a_32_bit_hash_never_share_a_conversation() {
    let (a, b) = colliding_session_ids();
    assert_ne!(a, b);
    assert_eq!(ctxwin_proxy::hash::hash_str(&a) as u32, ctxwin_proxy::hash::hash_str(&b) as u32);
    a_secret_never_reaches_b(
        &[("authorization", KEY_A), ("x-ctxwin-session", &a)],
        &[("authorization", KEY_A), ("x-ctxwin-session", &b)],
        |_| {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_header_separates_teams_that_share_an_api_key() {
    a_secret_never_reaches_b(
        &[("authorization", KEY_A), ("x-team-id", "red"), ("x-ctxwin-session", "agent-7")],
        &[("authorization", KEY_A), ("x-team-id", "blue"), ("x-ctxwin-session", "agent-7")],
        |cfg| cfg.tenant_header = Some("x-team-id".into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tenant_header_one_team_shares_its_conversations_across_keys() {
    let state = tempfile::tempdir().unwrap();
    let (up, _fake) = start_fake().await;
    let mut cfg = config(up, state.path());
    cfg.tenant_header = Some("x-team-id".into());
    let proxy = start_proxy(cfg).await;
    let client = reqwest::Client::new();
    let url = proxy.url("/v1/chat/completions");
    let mut messages = opening();
    for (turn, key) in [KEY_A, KEY_B, KEY_A].into_iter().enumerate() {
        let headers = [("authorization", key), ("x-team-id", "red"), ("x-ctxwin-session", "s")];
        let answer = chat(&client, &url, &headers, &messages).await;
        messages.push(answer);
        messages.push(json!({"role": "user", "content": format!("next {turn}")}));
    }
    let metrics = client.get(proxy.url("/metrics")).send().await.unwrap().text().await.unwrap();
    proxy.stop().await;
    assert!(metrics.contains("ctxwin_proxy_branches_total 0"), "{metrics}");
    let archive = ctxwin_std::store::open_archive(state.path().join("archive.db")).unwrap();
    assert_eq!(archive.conversations("", "").unwrap().len(), 1, "one conversation for the team");
}

/// Every directory name under the state directory, recursively.
fn dir_names(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.push(entry.file_name().to_string_lossy().into_owned());
            dir_names(&entry.path(), out);
        }
    }
}

/// Every file's bytes under `dir`, recursively.
fn all_bytes(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            all_bytes(&entry.path(), out);
        } else {
            out.push((entry.path().display().to_string(), std::fs::read(entry.path()).unwrap()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_holds_neither_credentials_nor_client_bytes_in_names() {
    let state = tempfile::tempdir().unwrap();
    let (up, _fake) = start_fake().await;
    let client = reqwest::Client::new();
    let sessions = ["../../escape", "会话-A", "a/b\\c", ".hidden", "x".repeat(300).leak() as &str];
    let mut histories: Vec<Vec<Value>> = Vec::new();
    for life in 0..2 {
        let proxy = start_proxy(config(up, state.path())).await;
        let url = proxy.url("/v1/chat/completions");
        for (i, session) in sessions.iter().enumerate() {
            if life == 0 {
                histories.push(vec![json!({"role": "user", "content": format!("hello {i}")})]);
            }
            let headers = [("authorization", KEY_A), ("x-ctxwin-session", *session)];
            let answer = chat(&client, &url, &headers, &histories[i]).await;
            histories[i].push(answer);
            histories[i].push(json!({"role": "user", "content": format!("go on {i} {life}")}));
        }
        let metrics = client.get(proxy.url("/metrics")).send().await.unwrap().text().await.unwrap();
        proxy.stop().await;
        // The second life finds each conversation again: the tenant secret persists.
        assert!(metrics.contains("ctxwin_proxy_branches_total 0"), "{metrics}");
    }
    let archive = ctxwin_std::store::open_archive(state.path().join("archive.db")).unwrap();
    let names = archive.conversations("", "").unwrap();
    assert_eq!(names.len(), sessions.len(), "one conversation per session id: {names:?}");
    for name in &names {
        // hello, answer, go on (the last answer waits for a request that carries it).
        let usage = archive.usage(&ctxwin_std::store::Scope::local(name)).unwrap();
        assert_eq!(usage.messages, 3, "{name}");
    }

    let mut dirs = Vec::new();
    dir_names(state.path(), &mut dirs);
    let hex = |name: &str| name.len() >= 32 && name.bytes().all(|b| b.is_ascii_hexdigit());
    for name in &dirs {
        assert!(hex(name) || name.starts_with("checkpoints"), "client bytes in a path: {name}");
    }
    assert!(dirs.iter().any(|d| hex(d)), "{dirs:?}");

    let mut files = Vec::new();
    all_bytes(state.path(), &mut files);
    for (path, bytes) in &files {
        assert!(
            !bytes.windows(14).any(|w| w == b"sk-tenant-a-01"),
            "the API key is stored in clear in {path}"
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let secret = std::fs::metadata(state.path().join("tenant.key")).unwrap();
        assert_eq!(secret.permissions().mode() & 0o777, 0o600);
        assert_eq!(secret.len(), 32);
    }
}
