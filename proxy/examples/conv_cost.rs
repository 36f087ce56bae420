//! What the proxy's session work costs per request, HTTP left out: the load bench's
//! conversations (`CONVS`, 200 by default, × 20 requests resending their whole history) run
//! one request at a time on one thread, each step timed.
//!
//! ```sh
//! cargo run --release -p ctxwin-proxy --example conv_cost
//! ```
//!
//! Prints the time to create a conversation (as the proxy does for one it has never seen),
//! per request the time to parse the body, take its new messages (`ingest`, rows queued to the
//! archive's writer), compose the payload and record the answer, the checkpoint per
//! conversation (the archive's writer waited for), and the resident memory growth per
//! conversation (this process also holds the 200 histories the "client" resends).
use std::time::{Duration, Instant};

use ctxwin_proxy::assemble::from_body;
use ctxwin_proxy::conv::{Conv, ConvSettings, prepare_state};
use ctxwin_proxy::wire::{Provider, Request, raw_hashes};
use serde_json::{Value, json};

fn main() {
    let convs: usize = std::env::var("CONVS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let turns = 20;
    let dir = tempfile::tempdir().unwrap();
    let stores = prepare_state(dir.path(), false).unwrap();
    let mut t = [Duration::ZERO; 6];
    let rss = || {
        std::fs::read_to_string("/proc/self/statm")
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 4
    };
    let rss0 = rss();
    let started = Instant::now();
    let mut open = Vec::new();
    let mut histories = Vec::new();
    for id in 0..convs {
        let s = Instant::now();
        open.push(
            Conv::create(
                dir.path(),
                &stores,
                &format!("bench-{id}"),
                Provider::OpenAi,
                &ConvSettings::new(128_000, 4_096),
            )
            .unwrap(),
        );
        t[0] += s.elapsed();
        histories.push(vec![json!({"role": "system", "content": format!("You are agent {id}. Keep the build green.")})]);
    }
    let rss_open = rss();
    println!(
        "resident memory after creating them: {} KiB per conversation",
        (rss_open - rss0) / convs as u64
    );
    for turn in 0..turns {
        for id in 0..convs {
            let messages = &mut histories[id];
            messages.push(json!({"role": "user", "content": format!("Turn {turn} of conversation {id}: check the build and report what changed since the last run, with the failing tests if any.")}));
            let body = json!({"model": "m", "messages": messages, "temperature": 0}).to_string();
            let s = Instant::now();
            let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
            let hashes = raw_hashes(&request);
            t[1] += s.elapsed();
            let s = Instant::now();
            open[id].ingest(&request, &hashes).unwrap();
            t[2] += s.elapsed();
            let s = Instant::now();
            let composed = open[id].compose(&request).unwrap();
            t[3] += s.elapsed();
            let answer = json!({"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("Answer {turn}: the build is green and the tests pass.")}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112}}).to_string();
            let s = Instant::now();
            let a = from_body(Provider::OpenAi, answer.as_bytes()).unwrap();
            open[id].record_answer(&a, composed.tokens).unwrap();
            open[id].exchange_done(u32::MAX);
            t[4] += s.elapsed();
            let v: Value = serde_json::from_str(&answer).unwrap();
            messages.push(v["choices"][0]["message"].clone());
        }
    }
    let rss1 = rss();
    println!(
        "resident memory after {turns} requests each: {rss0} -> {rss1} KiB: {} KiB per conversation",
        (rss1 - rss0) / convs as u64
    );
    let s = Instant::now();
    for conv in &mut open {
        conv.checkpoint().unwrap();
    }
    t[5] += s.elapsed();
    let n = (convs * turns) as f64;
    println!(
        "create {:.1} µs per conversation; per request: parse {:.1} µs, ingest {:.1} µs, compose {:.1} µs, answer {:.1} µs; checkpoint {:.1} µs per conversation; {:.2} s in all",
        t[0].as_secs_f64() * 1e6 / convs as f64,
        t[1].as_secs_f64() * 1e6 / n,
        t[2].as_secs_f64() * 1e6 / n,
        t[3].as_secs_f64() * 1e6 / n,
        t[4].as_secs_f64() * 1e6 / n,
        t[5].as_secs_f64() * 1e6 / convs as f64,
        started.elapsed().as_secs_f64()
    );
}
