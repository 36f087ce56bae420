//! Tail latency of the per-turn workload: p50, p99, p99.9 and max, not only the mean.
//! `cargo bench -p ctxwin-benches --bench latency` prints a table.
//!
//! For each starting history (100, 1k, 10k, 100k messages, built once by replaying the shipped
//! session under the 8,000-token configuration), a copy of the manager runs the next
//! `TURNS` real turns of the replay, each timed on its own: push (every message of the turn),
//! drain (the outbox to a no-op archive), compose (payload and OpenAI request body). Heavy
//! turns (a 16–40 KB tool output reduced on push, every ~31st tool result) are part of the
//! distribution. Converting the turn's `ChatMessage`s happens before the clock starts.

use std::hint::black_box;
use std::time::Instant;

use ctxwin_benches::replay::{Session, core_messages, tool_calls};
use ctxwin_benches::workload::{
    BODY_CAPACITY, DYNAMIC, Driver, HISTORY_LENGTHS, managers_at, turn_config,
};
use ctxwin_core::{OpenAiRequest, StrategyKind};
use hdrhistogram::Histogram;

/// Turns timed per starting history.
const TURNS: usize = 2_000;

/// Untimed turns run first on each copy (caches, branch predictors).
const WARM_UP_TURNS: usize = 50;

struct Phases {
    turn: Histogram<u64>,
    push: Histogram<u64>,
    drain: Histogram<u64>,
    compose: Histogram<u64>,
}

impl Phases {
    fn new() -> Phases {
        // 1 ns to 1 s at 3 significant digits.
        let histogram = || Histogram::new_with_bounds(1, 1_000_000_000, 3).expect("valid bounds");
        Phases { turn: histogram(), push: histogram(), drain: histogram(), compose: histogram() }
    }
}

fn nanos(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.duration_since(from).as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Runs `turns` turns of the replay on `driver`, recording each phase when `phases` is given.
fn run(driver: &mut Driver<'_>, turns: usize, mut phases: Option<&mut Phases>) {
    let mut body = vec![0u8; BODY_CAPACITY];
    for _ in 0..turns {
        let (turn, clock) = driver.take_turn();
        let calls = tool_calls(&turn.messages);
        let messages = core_messages(&turn.messages, &calls, clock);
        let manager = driver.manager_mut();
        let start = Instant::now();
        for message in &messages {
            manager.push(*message).expect("push");
        }
        let pushed = Instant::now();
        manager.drain_outbox(|unit| {
            black_box(unit.len());
        });
        let drained = Instant::now();
        let payload = manager.compose(&DYNAMIC).expect("compose");
        let len = payload.write_openai(&mut body[..], OpenAiRequest::default()).expect("write");
        let composed = Instant::now();
        black_box(len);
        if let Some(phases) = phases.as_deref_mut() {
            let record = |h: &mut Histogram<u64>, v| h.record(v).expect("in range");
            record(&mut phases.turn, nanos(start, composed));
            record(&mut phases.push, nanos(start, pushed));
            record(&mut phases.drain, nanos(pushed, drained));
            record(&mut phases.compose, nanos(drained, composed));
        }
    }
}

fn micros(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1_000.0)
}

fn row(phase: &str, history: usize, h: &Histogram<u64>) {
    println!(
        "| {phase:<7} | {history:>7} | {:>6} | {:>7} | {:>7} | {:>7} | {:>7} | {:>7} |",
        h.len(),
        micros(h.mean() as u64),
        micros(h.value_at_quantile(0.50)),
        micros(h.value_at_quantile(0.99)),
        micros(h.value_at_quantile(0.999)),
        micros(h.max()),
    );
}

fn main() {
    if !ctxwin_benches::selected("latency", std::env::args()) {
        return;
    }
    let session = Session::load().expect("shipped session");
    let config = turn_config(StrategyKind::SlidingWindow);
    let drivers = managers_at(&session, config, &HISTORY_LENGTHS).expect("replay");
    let mut results = Vec::new();
    for (reached, driver) in &drivers {
        let mut warm = driver.clone();
        run(&mut warm, WARM_UP_TURNS, None);
        let mut probe = driver.clone();
        let mut phases = Phases::new();
        run(&mut probe, TURNS, Some(&mut phases));
        results.push((*reached, probe.messages(), phases));
    }
    println!();
    println!("per-turn latency, µs ({TURNS} consecutive turns of the replay from each history)");
    println!();
    println!("| phase   | history | turns  | mean    | p50     | p99     | p99.9   | max     |");
    println!("|---------|--------:|-------:|--------:|--------:|--------:|--------:|--------:|");
    for phase in ["turn", "push", "drain", "compose"] {
        for (reached, _, phases) in &results {
            let h = match phase {
                "turn" => &phases.turn,
                "push" => &phases.push,
                "drain" => &phases.drain,
                _ => &phases.compose,
            };
            row(phase, *reached, h);
        }
    }
    println!();
    for (reached, end, _) in &results {
        println!("history {reached} → {end} messages after the timed turns");
    }
}
