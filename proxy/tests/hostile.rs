//! Slow and idle clients cannot starve the others (issue 26, item 2): a valid request is
//! served while 1,000 connections sit on half-sent headers; those connections, idle
//! keep-alive ones and stalled bodies are closed after their timeouts; connections over the
//! limit are refused with a clear 503. Times are printed, never asserted: each wait has a
//! generous bound whose only role is to fail a test that would otherwise hang.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::{Proxy, config, start_fake, start_proxy};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any single wait of these tests may take before the test fails.
const BOUND: Duration = Duration::from_secs(30);

/// A connection that sends part of a request's headers and stalls.
async fn slow_connection(proxy: &Proxy) -> TcpStream {
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-le")
        .await
        .unwrap();
    stream
}

/// Waits until the proxy counts `wanted(open connections)`.
async fn connections_reach(proxy: &Proxy, wanted: impl Fn(u64) -> bool) -> u64 {
    let started = Instant::now();
    loop {
        let open = proxy.app.metrics.connections.load(Relaxed);
        if wanted(open) {
            return open;
        }
        assert!(started.elapsed() < BOUND, "the proxy still counts {open} connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads until the proxy closes `stream`; returns what it sent.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(BOUND, stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the proxy did not close the connection within {BOUND:?}");
    String::from_utf8_lossy(&answer).into_owned()
}

fn valid_body(text: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_request_is_served_while_1000_slow_connections_are_open() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let proxy = start_proxy(config(up, state.path())).await;
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..1_000 {
        slow.push(slow_connection(&proxy).await);
    }
    connections_reach(&proxy, |open| open >= 1_000).await;
    println!("1,000 slow connections open in {:?}", started.elapsed());

    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let sent = Instant::now();
    let response = client
        .post(proxy.url("/v1/chat/completions"))
        .json(&valid_body("Which port does staging use?"))
        .send()
        .await
        .expect("the valid request was not served within 10 s");
    let served = sent.elapsed();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let open = proxy.app.metrics.connections.load(Relaxed);
    println!("valid request served in {served:?} with {open} connections open");
    assert!(open >= 1_000, "the slow connections were closed before the request: {open}");
    assert_eq!(fake.count(), 1);

    // Each slow connection is closed after the header timeout, without an answer.
    for stream in &mut slow {
        let answer = until_closed(stream).await;
        assert!(answer.is_empty(), "{answer}");
    }
    println!("slow connections closed {:?} after they opened", started.elapsed());
    connections_reach(&proxy, |open| open <= 1).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_get_a_clear_503() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    settings.max_connections = 16;
    settings.header_timeout = Duration::from_secs(2);
    let proxy = start_proxy(settings).await;
    let mut slow = Vec::new();
    for _ in 0..16 {
        slow.push(slow_connection(&proxy).await);
    }
    connections_reach(&proxy, |open| open == 16).await;
    let mut over = slow_connection(&proxy).await;
    let answer = until_closed(&mut over).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("max_connections"), "{body}");
    assert_eq!(proxy.app.metrics.connections_refused.load(Relaxed), 1);

    // Once the header timeout closed the slow ones, requests are served again.
    for stream in &mut slow {
        until_closed(stream).await;
    }
    connections_reach(&proxy, |open| open == 0).await;
    let response = reqwest::Client::new()
        .post(proxy.url("/v1/chat/completions"))
        .json(&valid_body("Which port does staging use?"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(fake.count(), 1);
    let metrics = reqwest::get(proxy.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ctxwin_proxy_connections_refused_total 1"), "{metrics}");
    proxy.stop().await;
}

/// Sends a complete request on `stream` and reads its answer (framed by content-length).
async fn exchange(stream: &mut TcpStream, body: &str) -> String {
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4_096];
    loop {
        let n = tokio::time::timeout(BOUND, stream.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "closed mid-answer: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_string)
                })
                .map_or(0, |n| n.trim().parse::<usize>().unwrap());
            if rest.len() >= length {
                return text;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_reaped() {
    let (up, _fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    settings.header_timeout = Duration::from_secs(1);
    let proxy = start_proxy(settings).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let body = valid_body("Which port does staging use?").to_string();
    // Two exchanges on one connection: it is kept alive between them.
    for _ in 0..2 {
        let answer = exchange(&mut stream, &body).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let idle = Instant::now();
    let rest = until_closed(&mut stream).await;
    assert!(rest.is_empty(), "{rest}");
    println!("idle connection closed after {:?}", idle.elapsed());
    connections_reach(&proxy, |open| open == 0).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_stores_nothing() {
    let (up, fake) = start_fake().await;
    let state = tempfile::tempdir().unwrap();
    let mut settings = config(up, state.path());
    settings.body_timeout = Duration::from_secs(1);
    let proxy = start_proxy(settings).await;
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{{\"model\": \"m\", \"messages\": [STALLED-BODY"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let answer = until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let message = if path == "/v1/messages" {
            assert_eq!(body["type"], "error");
            body["error"]["message"].as_str().unwrap().to_string()
        } else {
            body["error"]["message"].as_str().unwrap().to_string()
        };
        assert!(message.contains("body_timeout_secs"), "{message}");
    }
    assert_eq!(fake.count(), 0);
    proxy.stop().await;
    assert!(common::archive_counts(state.path()).is_empty());
}
