//! Load bench: concurrent conversations through the proxy against a fast fake upstream.
//!
//! ```sh
//! cargo bench -p ctxwin-proxy --bench load
//! # LOAD_CONVERSATIONS (200), LOAD_TURNS (20), LOAD_SESSIONS (10000), LOAD_CAP (256),
//! # LOAD_UPSTREAM_MS (50: the fake model's answer time; 0 saturates the machine)
//! ```
//!
//! Phase 1: `LOAD_CONVERSATIONS` conversations at once, `LOAD_TURNS` requests each, every
//! request resending the whole history. Reports the latency the proxy adds (its own time,
//! upstream excluded, as `/metrics` measures it) p50/p99/max, errors, and resident memory
//! per conversation (RSS growth over the phase / conversations, from `/proc/self/statm`), and
//! the CPU time per request: all of it, and the proxy's share (minus phase 0's).
//! Phase 0: the same conversations straight to the fake upstream, no proxy: the CPU the
//! client and the upstream (both in this process) cost.
//! Phase 2: `LOAD_SESSIONS` one-request conversations under a resident cap of `LOAD_CAP`:
//! reports the resident count and RSS at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use ctxwin_proxy::{App, ProxyConfig};
use serde_json::{Value, json};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Resident pages of this process, from `/proc/self/statm` (second field), in KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4
}

/// CPU time (user + system) this process has used, from `/proc/self/stat`, in ms.
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesized name: state is field 3; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // `rest` starts at field 3: utime is index 11, stime 12; clock ticks are 100 per second.
    (fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)) * 10
}

/// The load average over the last minute (other work on the machine included).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

async fn fake_upstream(delay: Duration) -> std::net::SocketAddr {
    let counter = Arc::new(AtomicU64::new(0));
    let router = Router::new().route(
        "/v1/chat/completions",
        post(move |body: axum::body::Bytes| {
            let counter = counter.clone();
            async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let prompt = body.len() / 4;
                let answer = json!({"id": format!("c{n}"), "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("Answer {n}: the build is green and the tests pass.")}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}});
                ([("content-type", "application/json")], answer.to_string()).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

async fn conversation(client: reqwest::Client, url: String, id: usize, turns: usize) -> usize {
    let mut errors = 0;
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are agent {id}. Keep the build green.")}),
    ];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Turn {turn} of conversation {id}: check the build and report what changed since the last run, with the failing tests if any.")}));
        let body = json!({"model": "m", "messages": messages, "temperature": 0}).to_string();
        let response = client
            .post(&url)
            .header("content-type", "application/json")
            .header("x-ctxwin-session", format!("bench-{id}"))
            .body(body)
            .send()
            .await;
        match response {
            Ok(response) if response.status().is_success() => {
                let value: Value = response.json().await.unwrap_or(Value::Null);
                messages.push(value["choices"][0]["message"].clone());
            }
            Ok(response) => {
                errors += 1;
                eprintln!(
                    "status {}: {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                );
            }
            Err(error) => {
                errors += 1;
                eprintln!("{error}");
            }
        }
    }
    errors
}

/// `count` conversations at once (ids from `first`); the errors.
async fn run_conversations(
    client: &reqwest::Client,
    url: &str,
    first: usize,
    count: usize,
    turns: usize,
) -> usize {
    let tasks: Vec<_> = (first..first + count)
        .map(|id| tokio::spawn(conversation(client.clone(), url.to_string(), id, turns)))
        .collect();
    let mut errors = 0;
    for task in tasks {
        errors += task.await.unwrap();
    }
    errors
}

fn main() {
    let conversations = env("LOAD_CONVERSATIONS", 200);
    let turns = env("LOAD_TURNS", 20);
    let sessions = env("LOAD_SESSIONS", 10_000);
    let cap = env("LOAD_CAP", 256);
    let delay = Duration::from_millis(env("LOAD_UPSTREAM_MS", 50) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let state = tempfile::tempdir().unwrap();
        let upstream = fake_upstream(delay).await;
        let config = ProxyConfig {
            upstream: format!("http://{upstream}"),
            listen: "127.0.0.1:0".parse().unwrap(),
            state_dir: state.path().to_path_buf(),
            max_resident: cap.max(conversations),
            ..ProxyConfig::default()
        };
        let app = App::new(config).unwrap();
        app.metrics.keep_samples();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(ctxwin_proxy::serve(app.clone(), listener, async move {
            let _ = stop_rx.await;
        }));
        let url = format!("http://{addr}/v1/chat/completions");
        let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build().unwrap();
        // Phase 0: the same conversations straight to the upstream: the CPU the client and the
        // fake upstream (both in this process) cost per request, to subtract.
        let direct = format!("http://{upstream}/v1/chat/completions");
        let cpu_before = cpu_ms();
        let started = Instant::now();
        let errors = run_conversations(&client, &direct, 2_000_000, conversations, turns).await;
        let baseline_cpu = (cpu_ms() - cpu_before) as f64 / (conversations * turns) as f64;
        println!(
            "phase 0 (no proxy): {conversations} conversations × {turns} requests in {:.2} s, errors {errors}: client + fake upstream CPU {baseline_cpu:.2} ms per request",
            started.elapsed().as_secs_f64()
        );
        // Warm up: one conversation, then measure from here.
        conversation(client.clone(), url.clone(), usize::MAX, 2).await;
        let _ = app.metrics.take_samples();
        let rss_before = rss_kib();
        let load_before = loadavg();
        let cpu_before = cpu_ms();
        let started = Instant::now();
        let errors = run_conversations(&client, &url, 0, conversations, turns).await;
        let elapsed = started.elapsed();
        let cpu = (cpu_ms() - cpu_before) as f64;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_after = rss_kib();
        let samples = app.metrics.take_samples();
        // Each conversation's first request creates its session (archive, checkpoint store).
        let mut later: Vec<u32> = samples.iter().copied().skip(conversations).collect();
        later.sort_unstable();
        let mut samples = samples;
        samples.sort_unstable();
        let requests = conversations * turns;
        println!("phase 1: {conversations} concurrent conversations × {turns} requests ({requests} requests) in {:.2} s ({:.0} req/s); load average {load_before} → {} ({} cores, shared)",
            elapsed.as_secs_f64(), requests as f64 / elapsed.as_secs_f64(), loadavg(),
            std::thread::available_parallelism().map_or(0, |n| n.get()));
        println!("  added latency (proxy time, upstream excluded): p50 {} µs, p99 {} µs, max {} µs ({} samples)",
            percentile(&samples, 0.5), percentile(&samples, 0.99), samples.last().copied().unwrap_or(0), samples.len());
        println!("  without the first {conversations} requests (session creation): p50 {} µs, p99 {} µs",
            percentile(&later, 0.5), percentile(&later, 0.99));
        println!("  upstream answer time {} ms; errors: {errors}", delay.as_millis());
        println!("  CPU: {:.2} ms per request in all, {:.2} ms of it the proxy's (minus phase 0's client + upstream); {:.0}% of one core over the phase",
            cpu / requests as f64, cpu / requests as f64 - baseline_cpu, cpu / elapsed.as_secs_f64() / 10.0);
        println!("  resident memory (statm): {} KiB → {} KiB: {} KiB per conversation",
            rss_before, rss_after, rss_after.saturating_sub(rss_before) / conversations.max(1) as u64);

        if sessions > 0 {
            let started = Instant::now();
            let app2 = {
                let config = ProxyConfig {
                    upstream: format!("http://{upstream}"),
                    listen: "127.0.0.1:0".parse().unwrap(),
                    state_dir: state.path().join("phase2"),
                    max_resident: cap,
                    ..ProxyConfig::default()
                };
                App::new(config).unwrap()
            };
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr2 = listener.local_addr().unwrap();
            let (stop2_tx, stop2_rx) = tokio::sync::oneshot::channel::<()>();
            let server2 = tokio::spawn(ctxwin_proxy::serve(app2.clone(), listener, async move {
                let _ = stop2_rx.await;
            }));
            let url2 = format!("http://{addr2}/v1/chat/completions");
            // The resident count, sampled every millisecond (a batch could pass the cap and
            // fall back before its end).
            let peak = Arc::new(AtomicU64::new(0));
            let sampler = {
                let (peak, app2) = (peak.clone(), app2.clone());
                tokio::spawn(async move {
                    loop {
                        peak.fetch_max(app2.metrics.resident.load(Ordering::Relaxed), Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            };
            let mut errors = 0;
            let batch = 64;
            let mut done = 0;
            while done < sessions {
                let n = batch.min(sessions - done);
                let tasks: Vec<_> = (done..done + n)
                    .map(|id| tokio::spawn(conversation(client.clone(), url2.clone(), 1_000_000 + id, 1)))
                    .collect();
                for task in tasks {
                    errors += task.await.unwrap();
                }
                done += n;
            }
            sampler.abort();
            let peak = peak.load(Ordering::Relaxed);
            println!("phase 2: {sessions} conversations under a resident cap of {cap} in {:.1} s: peak resident {peak}, at the end {}, known {}, unloads {}, errors {errors}, RSS (statm) {} KiB",
                started.elapsed().as_secs_f64(),
                app2.metrics.resident.load(Ordering::Relaxed),
                app2.known_sessions(),
                app2.metrics.unloads.load(Ordering::Relaxed),
                rss_kib());
            let _ = stop2_tx.send(());
            let _ = server2.await;
        }
        let _ = stop_tx.send(());
        let _ = server.await;
    });
}
