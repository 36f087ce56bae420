//! Accuracy of the core's `Estimator` against exact counts, and counting speed per content
//! type: `cargo bench -p ctxwin-benches --bench estimator_accuracy` prints the tables.
//!
//! - Per message, per content type, on the corpus sample shipped in
//!   `core/testdata/estimator-sample.jsonl` (exact `cl100k` counts stored in the file; the
//!   report checks `tokenizers` and `tiktoken-rs` agree with them).
//! - Conversation totals at the safe margin (×5/4): sums over every run of consecutive
//!   messages, in the corpus and in the shipped agent session (exact counts from `tokenizers`).
//! - Other tokenizer families, from the counts stored in the corpus.

use std::hint::black_box;
use std::time::Instant;

use ctxwin_benches::accuracy::{Accuracy, window_totals};
use ctxwin_benches::corpus::{Sample, TOKENIZERS, estimator_sample, kinds};
use ctxwin_benches::replay::Session;
use ctxwin_core::{
    counter::TokenCounter, estimator::Estimator, estimator::Margin, estimator::Weights,
};
use ctxwin_std::tokens::ExactCounter;

/// Goal: mean absolute error per message at ×1.
const GOAL_MEAN_ERROR: f64 = 0.09;

/// Runs of consecutive messages whose totals are reported.
const WINDOWS: [usize; 4] = [5, 20, 100, 500];

/// Shortest run the "never under" goal applies to (the spec's 20-message totals).
const GOAL_WINDOW: usize = 20;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Best-of-3 throughput of `count` over `texts`, in MB/s (10^6 bytes).
fn mb_per_s(texts: &[&str], count: &dyn Fn(&str) -> usize) -> f64 {
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    let best = (0..3)
        .map(|_| {
            let start = Instant::now();
            black_box(texts.iter().map(|t| count(black_box(t))).sum::<usize>());
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    bytes as f64 / best / 1e6
}

fn pairs(samples: &[&Sample], counter: &Estimator, column: usize) -> Vec<(u64, u64)> {
    samples
        .iter()
        .map(|s| (u64::from(counter.count(&s.text)), u64::from(s.exact[column])))
        .collect()
}

fn per_type(samples: &[Sample]) -> (Accuracy, Accuracy) {
    let tight = Estimator::new().with_margin(Margin::TIGHT);
    let safe = Estimator::new();
    let exact = ExactCounter::cl100k().expect("embedded tokenizer");
    let tiktoken = tiktoken_rs::cl100k_base().expect("embedded cl100k_base");
    println!("## Estimator against cl100k_base, per message (corpus sample)");
    println!();
    println!(
        "| type | msgs | ×1 mean abs. error | ×1 bias | ×1 under | ×5/4 mean abs. error | \
         ×5/4 under | ×5/4 worst under | estimator MB/s | tokenizers MB/s | tiktoken-rs MB/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = kinds(samples);
    rows.push("all");
    let (mut all_tight, mut all_safe) = (None, None);
    for kind in rows {
        let chosen: Vec<&Sample> =
            samples.iter().filter(|s| kind == "all" || s.kind == kind).collect();
        let texts: Vec<&str> = chosen.iter().map(|s| s.text.as_str()).collect();
        let a = Accuracy::of(pairs(&chosen, &tight, 0));
        let b = Accuracy::of(pairs(&chosen, &safe, 0));
        println!(
            "| {kind} | {} | {} | {:+.1}% | {} | {} | {} | {} | {:.0} | {:.2} | {:.1} |",
            a.count,
            pct(a.mean_abs_error),
            100.0 * a.mean_error,
            pct(a.share_under),
            pct(b.mean_abs_error),
            pct(b.share_under),
            pct(b.worst_under),
            mb_per_s(&texts, &|t| safe.count(t) as usize),
            mb_per_s(&texts, &|t| exact.count_uncached(t) as usize),
            mb_per_s(&texts, &|t| tiktoken.count_with_special_tokens(t)),
        );
        if kind == "all" {
            (all_tight, all_safe) = (Some(a), Some(b));
        }
    }
    let disagree = |count: &dyn Fn(&str) -> usize| {
        samples.iter().filter(|s| count(&s.text) != s.cl100k() as usize).count()
    };
    println!();
    println!(
        "exact counters against the corpus's stored cl100k counts: tokenizers differs on {}, \
         tiktoken-rs on {} of {} messages",
        disagree(&|t| exact.count_uncached(t) as usize),
        disagree(&|t| tiktoken.count_with_special_tokens(t)),
        samples.len()
    );
    (all_tight.expect("all row"), all_safe.expect("all row"))
}

fn window_row(source: &str, pairs: &[(u64, u64)], window: usize) -> Option<Accuracy> {
    let totals = window_totals(pairs, window);
    if totals.is_empty() {
        return None;
    }
    let a = Accuracy::of(totals.iter().copied());
    let smallest = totals
        .iter()
        .map(|&(e, x)| (e as f64 - x as f64) / x.max(1) as f64)
        .fold(f64::INFINITY, f64::min);
    println!(
        "| {source} | {window} | {} | {} | {:+.1}% | {} |",
        a.count,
        pct(a.share_under),
        100.0 * smallest,
        pct(a.mean_abs_error),
    );
    Some(a)
}

/// Content and tool-call strings of each message, as the manager counts them (framing aside).
fn message_texts(session: &Session) -> Vec<Vec<&str>> {
    let messages = session.system.iter().chain(session.turns.iter().flat_map(|t| &t.messages));
    messages
        .map(|m| {
            let mut parts = vec![m.content.as_str()];
            for call in &m.tool_calls {
                parts.extend([call.id.as_str(), call.name.as_str(), call.arguments.as_str()]);
            }
            parts.extend(m.tool_call_id.as_deref());
            parts
        })
        .collect()
}

fn totals(samples: &[Sample]) -> bool {
    let safe = Estimator::new();
    let corpus: Vec<&Sample> = samples.iter().collect();
    let corpus_pairs = pairs(&corpus, &safe, 0);
    let session = Session::load().expect("shipped session");
    let exact = ExactCounter::cl100k().expect("embedded tokenizer");
    let texts = message_texts(&session);
    let count =
        |parts: &Vec<&str>, f: &dyn Fn(&str) -> u32| parts.iter().map(|p| u64::from(f(p))).sum();
    let session_pairs: Vec<(u64, u64)> = texts
        .iter()
        .map(|parts| (count(parts, &|t| safe.count(t)), count(parts, &|t| exact.count_uncached(t))))
        .collect();
    let tight = safe.with_margin(Margin::TIGHT);
    let session_tight: Vec<(u64, u64)> = texts
        .iter()
        .zip(&session_pairs)
        .map(|(parts, &(_, x))| (count(parts, &|t| tight.count(t)), x))
        .collect();
    println!();
    println!("## Conversation totals at ×5/4 (every run of consecutive messages)");
    println!();
    println!("| source | run | runs | under | smallest total vs exact | mean abs. error |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut never_under = true;
    for window in WINDOWS {
        for (source, pairs) in [("corpus", &corpus_pairs), ("session", &session_pairs)] {
            if let Some(a) = window_row(source, pairs, window) {
                never_under &= window < GOAL_WINDOW || a.share_under == 0.0;
            }
        }
    }
    let whole =
        |pairs: &[(u64, u64)]| pairs.iter().fold((0u64, 0u64), |(e, x), (a, b)| (e + a, x + b));
    let (estimate, exact_total) = whole(&session_pairs);
    let (tight_total, _) = whole(&session_tight);
    println!();
    println!(
        "whole session ({} messages): exact {exact_total} tokens, estimate {estimate} at ×5/4 \
         ({:+.1}%), {tight_total} at ×1 ({:+.1}%)",
        session_pairs.len(),
        100.0 * (estimate as f64 / exact_total as f64 - 1.0),
        100.0 * (tight_total as f64 / exact_total as f64 - 1.0),
    );
    let a = Accuracy::of(session_tight.iter().copied());
    let b = Accuracy::of(session_pairs.iter().copied());
    println!(
        "session per message: ×1 mean abs. error {}, under {}; ×5/4 under {} (worst {})",
        pct(a.mean_abs_error),
        pct(a.share_under),
        pct(b.share_under),
        pct(b.worst_under)
    );
    never_under
}

fn families(samples: &[Sample]) {
    println!();
    println!("## Other tokenizers (counts stored in the corpus)");
    println!();
    println!(
        "| tokenizer | weights | ×1 mean abs. error | ×1 under | ×5/4 under | ×5/4 worst under |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    let all: Vec<&Sample> = samples.iter().collect();
    for (column, name) in TOKENIZERS.iter().enumerate() {
        let mut tables = vec![("cl100k", Weights::CL100K)];
        if *name == "smollm2" {
            tables.push(("smollm2", Weights::SMOLLM2));
        }
        for (label, weights) in tables {
            let tight = Estimator::with(weights, Margin::TIGHT);
            let safe = Estimator::with(weights, Margin::SAFE);
            let a = Accuracy::of(pairs(&all, &tight, column));
            let b = Accuracy::of(pairs(&all, &safe, column));
            println!(
                "| {name} | {label} | {} | {} | {} | {} |",
                pct(a.mean_abs_error),
                pct(a.share_under),
                pct(b.share_under),
                pct(b.worst_under)
            );
        }
    }
}

fn main() {
    if !ctxwin_benches::selected("estimator_accuracy", std::env::args()) {
        return;
    }
    let samples = estimator_sample().expect("embedded corpus");
    let (tight, _) = per_type(&samples);
    let never_under = totals(&samples);
    families(&samples);
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "goal: mean abs. error per message at ×1 within {}: {} ({:.2}%)",
        pct(GOAL_MEAN_ERROR),
        verdict(tight.mean_abs_error <= GOAL_MEAN_ERROR),
        100.0 * tight.mean_abs_error
    );
    println!(
        "goal: no total of {GOAL_WINDOW} or more consecutive messages under at ×5/4: {}",
        verdict(never_under)
    );
}
