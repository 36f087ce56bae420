//! Honest numbers (issue 27 item 5): each conversation's bill — the upstream's billed usage,
//! against an estimate of sending the client's body direct, and the stable share of the
//! forwarded prompts' bytes — on `/metrics`, on `/metrics/conversations`, kept in the
//! conversation's checkpoints (so `ctxwin_proxy::stored_bills` reads it with no proxy running)
//! and continued after a restart: on the state directory (SQLite archive, checkpoint files)
//! and on PostgreSQL (`CTXWIN_PG_URL`; skipped without it).

mod common;

use std::time::Duration;

use common::{config, start_fake, start_proxy};
use ctxwin_proxy::ProxyConfig;
use ctxwin_std::store::postgres::testing::TestSchema;
use serde_json::{Value, json};

/// Sends `turns` requests of conversation `session`, each resending the whole history; the
/// history after them.
async fn converse(base: &str, session: &str, mut messages: Vec<Value>, turns: usize) -> Vec<Value> {
    let client = reqwest::Client::new();
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Turn {turn}: run the tests again and say which ones fail, with the error lines.")}));
        let body = json!({"model": "m", "messages": messages});
        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .header("x-ctxwin-session", session)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let answer: Value = response.json().await.unwrap();
        messages.push(answer["choices"][0]["message"].clone());
    }
    messages
}

/// The bill of the conversation `/metrics/conversations` lists with `requests` requests
/// (answers are recorded after the client has them: waited for, not assumed).
async fn bill_with(base: &str, requests: u64) -> Value {
    let client = reqwest::Client::new();
    for _ in 0..200 {
        let json: Value = client
            .get(format!("{base}/metrics/conversations"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let found = json["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["requests"].as_u64() == Some(requests))
            .cloned();
        if let Some(bill) = found {
            return bill;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no conversation with {requests} requests");
}

/// `turns` requests, a stop (every conversation checkpointed), the stored bill, a restart and
/// one more request: the bill goes on from the stored one. A fleet checkpoints a conversation
/// once 32 messages were archived after its last checkpoint (`FLEET_CHECKPOINT_ROWS`): its
/// stored bill is the newest checkpoint's (`exact` false).
async fn bill_survives_a_restart(config: ProxyConfig, turns: usize, exact: bool) {
    let proxy = start_proxy(config.clone()).await;
    let base = proxy.url("");
    let session = format!("bills-{}", std::process::id());
    let opening =
        vec![json!({"role": "system", "content": "You are a careful build engineer. ".repeat(40)})];
    let history = converse(&base, &session, opening, turns).await;
    let bill = bill_with(&base, turns as u64).await;
    let key = bill["conversation"].as_str().unwrap().to_string();
    let billed = &bill["billed_tokens"];
    assert!(billed["uncached"].as_u64().unwrap() > 0, "{bill}");
    assert_eq!((billed["cache_write"].as_u64(), billed["cache_read"].as_u64()), (Some(0), Some(0)));
    assert!(bill["direct_estimate_cost"].as_f64().unwrap() > 0.0, "{bill}");
    assert!(bill["bill_vs_direct"].as_f64().is_some(), "{bill}");
    // The requests after the first were compared with the one before: the history only grew
    // at its end.
    let share = bill["stable_prefix_share"].as_f64().unwrap();
    assert!(share > 0.5 && share <= 1.0, "{bill}");
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    let series =
        format!("ctxwin_proxy_conversation_cost_tokens{{conversation=\"{key}\",kind=\"billed\"}}");
    assert!(metrics.contains(&series), "{metrics}");
    assert!(!metrics.contains("ctxwin_proxy_cache_stable_share 0\n"), "{metrics}");
    stop(proxy).await;

    let config_now = config.clone();
    let stored = tokio::task::spawn_blocking(move || ctxwin_proxy::stored_bills(&config_now))
        .await
        .unwrap()
        .unwrap();
    let (_, stored) = stored.iter().find(|(k, _)| *k == key).expect("the bill is stored");
    if exact {
        assert_eq!(stored.requests, turns as u64);
        assert_eq!(Some(stored.uncached), billed["uncached"].as_u64());
    } else {
        assert!(stored.requests > 0 && stored.requests <= turns as u64, "{stored:?}");
    }
    assert!(stored.stable_share().is_some());

    let proxy = start_proxy(config).await;
    let base = proxy.url("");
    converse(&base, &session, history, 1).await;
    let bill = bill_with(&base, stored.requests + 1).await;
    assert_eq!(bill["conversation"].as_str(), Some(key.as_str()));
    assert!(bill["billed_tokens"]["uncached"].as_u64() > Some(stored.uncached), "{bill}");
    stop(proxy).await;
}

/// Stops `proxy`; its state (a PostgreSQL client among it, which must not be dropped on an
/// async thread) goes last, on a blocking one.
async fn stop(proxy: common::Proxy) {
    let app = proxy.app.clone();
    proxy.stop().await;
    tokio::task::spawn_blocking(move || drop(app)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_state_directory() {
    let state = tempfile::tempdir().unwrap();
    let (upstream, _fake) = start_fake().await;
    bill_survives_a_restart(config(upstream, state.path()), 3, true).await;
}

#[test]
fn on_postgresql() {
    let Some(schema) = TestSchema::new("proxy_bills") else { return };
    let schema = schema.unwrap_or_else(|e| panic!("test schema: {e}"));
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let state = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let (upstream, _fake) = start_fake().await;
        let config = ProxyConfig {
            store_url: Some(schema.url().to_string()),
            ..config(upstream, state.path())
        };
        bill_survives_a_restart(config, 20, false).await;
    });
}
