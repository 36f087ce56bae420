//! Faithful routing and errors (issue 26, item 5): a managed request's query string reaches
//! the upstream; a wrong method, a body that is not JSON and a body cut short are answered
//! with the right status and an error body in the endpoint's provider format, and none of
//! them reaches the upstream.

mod common;

use std::time::Duration;

use common::{config, start_fake, start_proxy};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn openai_body() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "What is the staging database?"}]})
        .to_string()
}

fn anthropic_body() -> String {
    json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "What is the staging database?"}]})
        .to_string()
}

/// Asserts `body` is an error in the endpoint's provider format and returns its message.
fn error_message(path: &str, body: &Value) -> String {
    if path == "/v1/messages" {
        assert_eq!(body["type"], "error", "{body}");
        assert!(body["error"]["type"].is_string(), "{body}");
        body["error"]["message"].as_str().unwrap().to_string()
    } else {
        assert!(body["error"]["type"].is_string(), "{body}");
        assert!(body["error"]["code"].is_string(), "{body}");
        body["error"]["message"].as_str().unwrap().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_strings_reach_the_upstream() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    for (path, body, query) in [
        ("/v1/chat/completions", openai_body(), "api-version=2024-10-21"),
        ("/v1/messages", anthropic_body(), "beta=true&x=a%20b"),
    ] {
        let response = client
            .post(proxy.url(&format!("{path}?{query}")))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}: {}", response.text().await.unwrap());
        let received = fake.last();
        assert_eq!(received.path, path);
        assert_eq!(received.query.as_deref(), Some(query), "{path}");
    }
    // Without one, none is added.
    let response =
        client.post(proxy.url("/v1/chat/completions")).body(openai_body()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fake.last().query, None);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_get_405_with_the_providers_error() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    for path in ["/v1/chat/completions", "/v1/messages"] {
        for method in [reqwest::Method::GET, reqwest::Method::PUT, reqwest::Method::DELETE] {
            let response =
                client.request(method.clone(), proxy.url(path)).body("{}").send().await.unwrap();
            assert_eq!(response.status(), 405, "{method} {path}");
            assert_eq!(response.headers()["allow"], "POST");
            assert_eq!(response.headers()["content-type"], "application/json");
            let body: Value = response.json().await.unwrap();
            let message = error_message(path, &body);
            assert!(message.contains(method.as_str()) && message.contains("POST"), "{message}");
        }
    }
    let response = client.post(proxy.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET, HEAD");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    // The routes still serve their own methods.
    assert_eq!(client.get(proxy.url("/metrics")).send().await.unwrap().status(), 200);
    assert_eq!(fake.count(), 0, "a refused method reached the upstream");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_not_declared_json_get_415() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let client = reqwest::Client::new();
    for (path, body) in
        [("/v1/chat/completions", openai_body()), ("/v1/messages", anthropic_body())]
    {
        for declared in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
        ] {
            let response = client
                .post(proxy.url(path))
                .header("content-type", declared)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 415, "{path} as {declared}");
            let error: Value = response.json().await.unwrap();
            let message = error_message(path, &error);
            assert!(message.contains("application/json"), "{message}");
        }
        assert_eq!(fake.count(), 0, "a body not declared JSON reached the upstream");
        for declared in
            ["application/json", "Application/JSON; charset=utf-8", "application/x+json"]
        {
            let response = client
                .post(proxy.url(path))
                .header("content-type", declared)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{path} as {declared}");
        }
        let undeclared = client.post(proxy.url(path)).body(body.clone()).send().await.unwrap();
        assert_eq!(undeclared.status(), 200, "{path} without a content type");
        fake.received.lock().unwrap().clear();
    }
    proxy.stop().await;
}

/// Sends `head` and `sent` bytes of a body on a raw connection, closes its writing side and
/// reads the answer.
async fn truncated(addr: std::net::SocketAddr, head: &str, sent: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(sent).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("no answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_than_its_length_gets_400() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    for (path, body) in
        [("/v1/chat/completions", openai_body()), ("/v1/messages", anthropic_body())]
    {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len() + 100
        );
        let answer = truncated(proxy.addr, &head, body.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        let json: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let message = error_message(path, &json);
        assert!(message.contains("cut short"), "{message}");
    }
    // A declared length over the limit is refused before a byte of the body is read.
    let mut small = config(up, state.path());
    small.body_limit = 1_000;
    proxy.stop().await;
    let proxy = start_proxy(small).await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-length: 5000\r\n\r\n";
    let answer = truncated(proxy.addr, head, b"").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("limit of 1000 bytes"), "{answer}");
    assert_eq!(fake.count(), 0, "a cut body reached the upstream");
    proxy.stop().await;
}

/// A refusal sent while the client is still sending its body reaches the client: the proxy
/// reads (and discards) the rest before answering, where closing with bytes unread would
/// reset the connection under the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_reach_a_client_still_sending() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    settings.body_limit = 256 << 10;
    settings.proxy_key = Some("k".into());
    let proxy = start_proxy(settings).await;
    let client = reqwest::Client::new();
    let big =
        format!("{{\"model\": \"m\", \"messages\": [], \"pad\": \"{}\"}}", "x".repeat(400 << 10));
    for round in 0..10 {
        let cases: [(reqwest::Method, &str, &str, Option<&str>, u16); 4] = [
            (reqwest::Method::POST, "/v1/chat/completions", "application/json", Some("k"), 413),
            (reqwest::Method::POST, "/v1/messages", "text/plain", Some("k"), 415),
            (reqwest::Method::PUT, "/v1/messages", "application/json", Some("k"), 405),
            (reqwest::Method::POST, "/v1/chat/completions", "application/json", None, 401),
        ];
        for (method, path, declared, key, status) in cases {
            let mut request = client
                .request(method.clone(), proxy.url(path))
                .header("content-type", declared)
                .body(big.clone());
            if let Some(key) = key {
                request = request.header("x-ctxwin-key", key);
            }
            let response = request.send().await.unwrap_or_else(|e| {
                panic!("round {round}, {method} {path} as {declared}: no answer: {e:?}")
            });
            assert_eq!(response.status(), status, "{method} {path}");
            let body: Value = response.json().await.unwrap();
            error_message(path, &body);
        }
    }
    assert_eq!(fake.count(), 0);
    proxy.stop().await;
}
