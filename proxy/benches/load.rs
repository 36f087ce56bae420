//! Load bench: concurrent conversations through the proxy against a fast fake upstream.
//!
//! ```sh
//! cargo bench -p ctxwin-proxy --bench load
//! # LOAD_CONVERSATIONS (200), LOAD_TURNS (20), LOAD_SESSIONS (10000), LOAD_CAP (256),
//! # LOAD_UPSTREAM_MS (50: the fake model's answer time; 0 saturates the machine),
//! # LOAD_WINDOW (the model's context window; the default 32,768 never fills in 20 turns:
//! #   1,024 makes every conversation pass its window within a few turns, so each later request
//! #   evicts and runs retrieval's full-text query on the archive)
//! ```
//!
//! The proxy runs in a process of its own (this binary again, started with
//! `LOAD_PROXY_CHILD=1`, serving on the runtime `ctxwin proxy` uses), so its CPU time and
//! resident memory are read from `/proc/PID/` apart from the client's and the fake
//! upstream's, which run here.
//!
//! Phase 1: `LOAD_CONVERSATIONS` conversations at once, `LOAD_TURNS` requests each, every
//! request resending the whole history. Reports the latency the proxy adds (its own time,
//! upstream excluded, as `/metrics` measures it) p50/p99/max, errors, the proxy's CPU time per
//! request and its resident memory per conversation (RSS growth over the phase divided by the
//! conversations, from `/proc/PID/statm`).
//! Phase 2: `LOAD_SESSIONS` one-request conversations under a resident cap of `LOAD_CAP` (a
//! second proxy process): the peak resident count and RSS at the end.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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

/// Resident pages of process `pid`, from `/proc/PID/statm` (second field), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4
}

/// CPU time (user + system) process `pid` has used, from `/proc/PID/stat`, in ms.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// One conversation of `turns` requests; its errors and each request's time as the client sees
/// it (send to whole answer read), in µs.
async fn conversation(
    client: reqwest::Client,
    url: String,
    id: usize,
    turns: usize,
) -> (usize, Vec<u32>) {
    let mut errors = 0;
    let mut times = Vec::with_capacity(turns);
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are agent {id}. Keep the build green.")}),
    ];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("Turn {turn} of conversation {id}: check the build and report what changed since the last run, with the failing tests if any.")}));
        let body = json!({"model": "m", "messages": messages, "temperature": 0}).to_string();
        let sent = Instant::now();
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
                times.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
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
    (errors, times)
}

/// The conversations `ids`, at most `at_once` in flight; the errors and the client's request
/// times (µs), sorted.
async fn run_conversations(
    client: &reqwest::Client,
    url: &str,
    ids: std::ops::Range<usize>,
    at_once: usize,
    turns: usize,
) -> (usize, Vec<u32>) {
    let mut errors = 0;
    let mut times = Vec::new();
    let ids: Vec<usize> = ids.collect();
    for chunk in ids.chunks(at_once.max(1)) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&id| tokio::spawn(conversation(client.clone(), url.to_string(), id, turns)))
            .collect();
        for task in tasks {
            let (e, t) = task.await.unwrap();
            errors += e;
            times.extend(t);
        }
    }
    times.sort_unstable();
    (errors, times)
}

/// The proxy process: serves on an ephemeral port (printed as `listening ADDR`), then answers
/// commands read from standard input, a line each:
/// `samples` (the added-latency samples since the last call, µs, and the peak resident count
/// since then) and `stop`.
fn child() {
    let config = ProxyConfig {
        upstream: std::env::var("LOAD_UPSTREAM").unwrap(),
        listen: "127.0.0.1:0".parse().unwrap(),
        state_dir: std::env::var("LOAD_STATE_DIR").unwrap().into(),
        max_resident: env("LOAD_CAP", 256),
        default_window: env("LOAD_WINDOW", ProxyConfig::default().default_window as usize) as u32,
        ..ProxyConfig::default()
    };
    // The runtime `ctxwin proxy` runs on (`run_blocking`).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let app = App::new(config).unwrap();
        app.metrics.keep_samples();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(ctxwin_proxy::serve(app.clone(), listener, async move {
            let _ = stop_rx.await;
        }));
        let peak = Arc::new(AtomicU64::new(0));
        // The resident count, sampled every millisecond (a batch could pass the cap and fall
        // back before its end).
        let sampler = {
            let (peak, app) = (peak.clone(), app.clone());
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(app.metrics.resident.load(Ordering::Relaxed), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        println!("listening {addr}");
        std::io::stdout().flush().unwrap();
        while let Some(command) = rx.recv().await {
            match command.as_str() {
                "samples" => {
                    let samples = app.metrics.take_samples();
                    let peak = peak.swap(0, Ordering::Relaxed);
                    let list: Vec<String> = samples.iter().map(u32::to_string).collect();
                    println!(
                        "{peak} {} {} {} {}",
                        app.metrics.resident.load(Ordering::Relaxed),
                        app.known_sessions(),
                        app.metrics.unloads.load(Ordering::Relaxed),
                        list.join(" ")
                    );
                    std::io::stdout().flush().unwrap();
                }
                _ => break,
            }
        }
        sampler.abort();
        let _ = stop_tx.send(());
        let _ = server.await;
    });
}

/// A proxy process started by [`child`].
struct ProxyProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    url: String,
}

/// What a proxy process reports on `samples`.
struct Report {
    peak: u64,
    resident: u64,
    known: u64,
    unloads: u64,
    samples: Vec<u32>,
}

impl ProxyProcess {
    fn start(upstream: std::net::SocketAddr, state_dir: &std::path::Path, cap: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("LOAD_PROXY_CHILD", "1")
            .env("LOAD_UPSTREAM", format!("http://{upstream}"))
            .env("LOAD_STATE_DIR", state_dir)
            .env("LOAD_CAP", cap.to_string())
            .env(
                "LOAD_WINDOW",
                env("LOAD_WINDOW", ProxyConfig::default().default_window as usize).to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line.trim().strip_prefix("listening ").unwrap().to_string();
        Self { child, stdin, stdout, url: format!("http://{addr}/v1/chat/completions") }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn report(&mut self) -> Report {
        writeln!(self.stdin, "samples").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut numbers = line.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        let mut next = || numbers.next().unwrap();
        let (peak, resident, known, unloads) = (next(), next(), next(), next());
        let samples = numbers.map(|n| n as u32).collect();
        Report { peak, resident, known, unloads, samples }
    }

    fn stop(mut self) {
        let _ = writeln!(self.stdin, "stop");
        let _ = self.child.wait();
    }
}

fn main() {
    if std::env::var_os("LOAD_PROXY_CHILD").is_some() {
        child();
        return;
    }
    let conversations = env("LOAD_CONVERSATIONS", 200);
    let turns = env("LOAD_TURNS", 20);
    let sessions = env("LOAD_SESSIONS", 10_000);
    let cap = env("LOAD_CAP", 256);
    let delay = Duration::from_millis(env("LOAD_UPSTREAM_MS", 50) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let state = tempfile::tempdir().unwrap();
        let upstream = fake_upstream(delay).await;
        let mut proxy = ProxyProcess::start(upstream, &state.path().join("phase1"), cap.max(conversations));
        let pid = proxy.pid();
        let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build().unwrap();
        // Phase 0: the same conversations straight to the upstream, for the client's view.
        let direct = format!("http://{upstream}/v1/chat/completions");
        let (_, direct_times) =
            run_conversations(&client, &direct, 2_000_000..2_000_000 + conversations, conversations, turns).await;
        // Warm up: one conversation, then measure from here.
        let _ = conversation(client.clone(), proxy.url.clone(), usize::MAX, 2).await;
        let _ = proxy.report();
        let rss_before = rss_kib(pid);
        let load_before = loadavg();
        let cpu_before = cpu_ms(pid);
        let started = Instant::now();
        let (errors, times) =
            run_conversations(&client, &proxy.url, 0..conversations, conversations, turns).await;
        let elapsed = started.elapsed();
        let cpu = (cpu_ms(pid) - cpu_before) as f64;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_after = rss_kib(pid);
        let report = proxy.report();
        let samples = report.samples;
        // Each conversation's first request creates its session.
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
        let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
        let (d50, d99) = (percentile(&direct_times, 0.5), percentile(&direct_times, 0.99));
        println!("  request time the client sees: through the proxy p50 {p50} µs, p99 {p99} µs; straight to the upstream p50 {d50} µs, p99 {d99} µs (difference {} / {} µs: the proxy's time, its hops and the machine's queueing)",
            i64::from(p50) - i64::from(d50), i64::from(p99) - i64::from(d99));
        println!("  proxy process CPU: {:.3} ms per request; {:.0}% of one core over the phase",
            cpu / requests as f64, cpu / elapsed.as_secs_f64() / 10.0);
        println!("  proxy process resident memory (statm): {} KiB → {} KiB: {} KiB per conversation",
            rss_before, rss_after, rss_after.saturating_sub(rss_before) / conversations.max(1) as u64);
        proxy.stop();

        if sessions > 0 {
            let started = Instant::now();
            let mut proxy = ProxyProcess::start(upstream, &state.path().join("phase2"), cap);
            let (errors, _) =
                run_conversations(&client, &proxy.url, 1_000_000..1_000_000 + sessions, 64, 1).await;
            let report = proxy.report();
            println!("phase 2: {sessions} conversations under a resident cap of {cap} in {:.1} s: peak resident {}, at the end {}, known {}, unloads {}, errors {errors}, proxy RSS (statm) {} KiB",
                started.elapsed().as_secs_f64(), report.peak, report.resident, report.known,
                report.unloads, rss_kib(proxy.pid()));
            proxy.stop();
        }
    });
}
