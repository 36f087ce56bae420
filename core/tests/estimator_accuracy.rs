//! Accuracy against exact token counts on the shipped corpus sample
//! (`core/testdata/estimator-sample.jsonl`: 504 messages, 42 of each of 12 content types,
//! messages of at most 4 KiB, shuffled; made by `scripts/fit-estimator.py --sample`).
//!
//! `cargo test -p ctxwin-core --test estimator_accuracy -- --nocapture` prints the per-type
//! tables.

use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::{Estimator, Margin, Weights};
use std::collections::BTreeMap;

const SAMPLE: &str = include_str!("../testdata/estimator-sample.jsonl");

/// The spec's cl100k targets, with a little slack over what the sample measures
/// (9.0% mean error at ×1; 2.8% of messages under at ×5/4; smallest 20-message total +10%).
const MAX_TIGHT_MEAN_ERROR: f64 = 0.10;
const MAX_SAFE_SHARE_UNDER: f64 = 0.05;
const WINDOW: usize = 20;

struct Message {
    kind: String,
    text: String,
    exact: BTreeMap<String, u32>,
}

fn sample() -> Vec<Message> {
    SAMPLE
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let exact = ["cl100k", "o200k", "llama3", "qwen3", "smollm2"]
                .iter()
                .map(|&k| (k.to_owned(), u32::try_from(v[k].as_u64().unwrap()).unwrap()))
                .collect();
            Message {
                kind: v["type"].as_str().unwrap().to_owned(),
                text: v["text"].as_str().unwrap().to_owned(),
                exact,
            }
        })
        .collect()
}

#[derive(Debug)]
struct Stats {
    mean_error: f64,
    share_under: f64,
    worst: f64,
    windows_under: usize,
    worst_window: f64,
}

/// `pairs` are (estimate, exact) in corpus order; windows are the sums of every run of
/// `WINDOW` consecutive messages.
fn stats(pairs: &[(u32, u32)]) -> Stats {
    let rel = |est: u64, exact: u64| (est as f64 - exact as f64) / exact as f64;
    let errors: Vec<f64> = pairs.iter().map(|&(e, x)| rel(e.into(), x.into())).collect();
    let windows: Vec<f64> = pairs
        .windows(WINDOW.min(pairs.len()))
        .map(|w| {
            let est: u64 = w.iter().map(|&(e, _)| u64::from(e)).sum();
            let exact: u64 = w.iter().map(|&(_, x)| u64::from(x)).sum();
            rel(est, exact)
        })
        .collect();
    let n = errors.len() as f64;
    Stats {
        mean_error: errors.iter().map(|e| e.abs()).sum::<f64>() / n,
        share_under: errors.iter().filter(|&&e| e < 0.0).count() as f64 / n,
        worst: errors.iter().copied().fold(f64::INFINITY, f64::min),
        windows_under: windows.iter().filter(|&&e| e < 0.0).count(),
        worst_window: windows.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

/// The targets the tests hold an estimator to, as an error message when missed.
fn check_targets(tight: &Stats, safe: &Stats) -> Result<(), String> {
    if tight.mean_error >= MAX_TIGHT_MEAN_ERROR {
        return Err(format!("mean error at x1 {:.1}%", 100.0 * tight.mean_error));
    }
    if safe.share_under >= MAX_SAFE_SHARE_UNDER {
        return Err(format!("{:.1}% of messages under at x5/4", 100.0 * safe.share_under));
    }
    if safe.windows_under > 0 {
        return Err(format!(
            "{} sums of {WINDOW} messages under at x5/4 (worst {:+.1}%)",
            safe.windows_under,
            100.0 * safe.worst_window
        ));
    }
    Ok(())
}

/// Prints a per-type table and returns the overall (×1, ×5/4) stats.
fn report(
    title: &str,
    messages: &[Message],
    tokenizer: &str,
    count: impl Fn(&str, Margin) -> u32,
) -> (Stats, Stats) {
    let pairs = |m: Margin, kind: Option<&str>| -> Vec<(u32, u32)> {
        messages
            .iter()
            .filter(|msg| kind.is_none_or(|k| msg.kind == k))
            .map(|msg| (count(&msg.text, m), msg.exact[tokenizer]))
            .collect()
    };
    println!("\n{title}: {} messages, exact = {tokenizer}", messages.len());
    println!(
        "| type | n | MAE x1 | under x1 | MAE x5/4 | under x5/4 | worst x5/4 |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    let mut kinds: Vec<&str> = messages.iter().map(|m| m.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds.into_iter().map(Some).chain([None]) {
        let tight = stats(&pairs(Margin::TIGHT, kind));
        let safe = stats(&pairs(Margin::SAFE, kind));
        println!(
            "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:+.0}% |",
            kind.unwrap_or("ALL"),
            pairs(Margin::TIGHT, kind).len(),
            100.0 * tight.mean_error,
            100.0 * tight.share_under,
            100.0 * safe.mean_error,
            100.0 * safe.share_under,
            100.0 * safe.worst,
        );
    }
    let tight = stats(&pairs(Margin::TIGHT, None));
    let safe = stats(&pairs(Margin::SAFE, None));
    println!(
        "{WINDOW}-message sums under: x1 {} (worst {:+.1}%), x5/4 {} (worst {:+.1}%)",
        tight.windows_under,
        100.0 * tight.worst_window,
        safe.windows_under,
        100.0 * safe.worst_window
    );
    (tight, safe)
}

fn estimator(weights: Weights) -> impl Fn(&str, Margin) -> u32 {
    move |text, margin| Estimator::with(weights, margin).count(text)
}

#[test]
fn sample_covers_every_content_type() {
    let messages = sample();
    assert_eq!(messages.len(), 504);
    let mut per_kind = BTreeMap::new();
    for m in &messages {
        *per_kind.entry(m.kind.as_str()).or_insert(0) += 1;
    }
    assert_eq!(per_kind.len(), 12);
    assert!(per_kind.values().all(|&n| n == 42), "{per_kind:?}");
}

#[test]
fn cl100k_sample_meets_the_spec_targets() {
    let messages = sample();
    let (tight, safe) =
        report("estimator, cl100k weights", &messages, "cl100k", estimator(Weights::CL100K));
    assert_eq!(check_targets(&tight, &safe), Ok(()));
    // The sample's worst single message is -33% at x5/4 (spec, held-out: -31%).
    assert!(safe.worst > -0.40, "{safe:?}");
}

#[test]
fn crude_rules_miss_the_targets() {
    let messages = sample();
    let quarter = |n: usize, m: Margin| Margin::apply(m, u32::try_from(n.div_ceil(4)).unwrap());
    let (tight, safe) = report("bytes/4", &messages, "cl100k", |text, m| quarter(text.len(), m));
    assert!(check_targets(&tight, &safe).is_err());
    let (tight, safe) =
        report("chars/4", &messages, "cl100k", |text, m| quarter(text.chars().count(), m));
    assert!(check_targets(&tight, &safe).is_err());
}

#[test]
fn smollm2_needs_its_own_table() {
    let messages = sample();
    let (tight, safe) =
        report("estimator, smollm2 weights", &messages, "smollm2", estimator(Weights::SMOLLM2));
    assert_eq!(check_targets(&tight, &safe), Ok(()));
    let (tight, safe) =
        report("estimator, cl100k weights", &messages, "smollm2", estimator(Weights::CL100K));
    assert!(check_targets(&tight, &safe).is_err());
}

#[test]
fn cl100k_weights_on_other_tokenizers() {
    let messages = sample();
    for tokenizer in ["o200k", "llama3", "qwen3"] {
        let (tight, safe) =
            report("estimator, cl100k weights", &messages, tokenizer, estimator(Weights::CL100K));
        // Looser than for cl100k itself (spec: 15-18% at x1); at x5/4 the sample's smallest
        // 20-message total is +2.7% (qwen3), +15% (llama3), +17% (o200k).
        assert!(tight.mean_error < 0.20, "{tokenizer}: {tight:?}");
        assert!(safe.worst_window > -0.05, "{tokenizer}: {safe:?}");
    }
}

#[test]
fn sample_totals_match_the_fit_script() {
    // `scripts/fit-estimator.py` computes the same features in Python; these are the totals
    // it gives on the sample (exact cl100k total: 151,970; smollm2: 197,952).
    let messages = sample();
    let total = |weights: Weights, margin: Margin| -> u64 {
        let e = Estimator::with(weights, margin);
        messages.iter().map(|m| u64::from(e.count(&m.text))).sum()
    };
    assert_eq!(total(Weights::CL100K, Margin::TIGHT), 148_692);
    assert_eq!(total(Weights::CL100K, Margin::SAFE), 185_788);
    assert_eq!(total(Weights::SMOLLM2, Margin::TIGHT), 194_738);
}

/// Accuracy and throughput on a full corpus in the sample's format (the whole corpus ships
/// gzipped: `gunzip -k benches/data/estimator-corpus.jsonl.gz`):
/// `CTXWIN_ESTIMATOR_CORPUS=$PWD/benches/data/estimator-corpus.jsonl cargo test --release \
///  -p ctxwin-core full_corpus -- --ignored --nocapture`.
#[test]
#[ignore = "needs CTXWIN_ESTIMATOR_CORPUS; prints, asserts nothing"]
fn full_corpus_report() {
    let Ok(path) = std::env::var("CTXWIN_ESTIMATOR_CORPUS") else {
        println!("set CTXWIN_ESTIMATOR_CORPUS to a JSONL corpus");
        return;
    };
    let corpus = std::fs::read_to_string(path).unwrap();
    let messages: Vec<Message> = {
        let v: Vec<serde_json::Value> =
            corpus.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        v.iter()
            .map(|v| Message {
                kind: v["type"].as_str().unwrap().to_owned(),
                text: v["text"].as_str().unwrap().to_owned(),
                exact: ["cl100k", "o200k", "llama3", "qwen3", "smollm2"]
                    .iter()
                    .map(|&k| (k.to_owned(), u32::try_from(v[k].as_u64().unwrap()).unwrap()))
                    .collect(),
            })
            .collect()
    };
    report("full corpus, cl100k weights", &messages, "cl100k", estimator(Weights::CL100K));
    report("full corpus, smollm2 weights", &messages, "smollm2", estimator(Weights::SMOLLM2));

    // Best of several rounds: the machine may be shared, the fastest round is the least noisy.
    let bytes: usize = messages.iter().map(|m| m.text.len()).sum();
    let e = Estimator::new();
    let mut best = f64::INFINITY;
    let mut checksum = 0u64;
    for _ in 0..30 {
        let start = std::time::Instant::now();
        for m in &messages {
            checksum += u64::from(e.count(std::hint::black_box(&m.text)));
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!(
        "throughput: {:.0} MB/s (best of 30 rounds over {bytes} bytes; checksum {checksum})",
        bytes as f64 / best / 1e6
    );
}

/// Whether some run of `WINDOW` or more consecutive messages of `pairs` (estimate, exact) sums
/// under its exact count: with prefix sums `d` of estimate − exact, a run `i..j` is under when
/// `d[j] < d[i]`, so each `j` is checked against the largest `d[i]` with `i ≤ j − WINDOW`.
fn any_run_under(pairs: &[(u32, u32)]) -> bool {
    let mut d = vec![0i64];
    for &(est, exact) in pairs {
        d.push(d[d.len() - 1] + i64::from(est) - i64::from(exact));
    }
    let mut best = i64::MIN;
    (WINDOW..d.len()).any(|j| {
        best = best.max(d[j - WINDOW]);
        d[j] < best
    })
}

/// The smallest margin `num/100` (from 1.00 up) with no run of `WINDOW` or more consecutive
/// messages under, for the cl100k weights.
fn smallest_margin(messages: &[&Message]) -> u16 {
    (100u16..=200)
        .find(|&num| {
            let e = Estimator::with(Weights::CL100K, Margin::new(num, 100).unwrap());
            let pairs: Vec<(u32, u32)> =
                messages.iter().map(|m| (e.count(&m.text), m.exact["cl100k"])).collect();
            !any_run_under(&pairs)
        })
        .unwrap_or(u16::MAX)
}

#[test]
fn the_default_margin_keeps_the_promise_on_the_sample() {
    let messages = sample();
    let all: Vec<&Message> = messages.iter().collect();
    let e = Estimator::new();
    let pairs: Vec<(u32, u32)> =
        all.iter().map(|m| (e.count(&m.text), m.exact["cl100k"])).collect();
    assert!(!any_run_under(&pairs), "a run of {WINDOW}+ messages under at the default margin");
    println!("sample: smallest margin {}/100", smallest_margin(&all));
}

/// The margin search on the full corpus and a held-out split (messages whose source name has
/// an odd byte sum, against the rest):
/// `gunzip -k benches/data/estimator-corpus.jsonl.gz`, then
/// `CTXWIN_ESTIMATOR_CORPUS=$PWD/benches/data/estimator-corpus.jsonl cargo test --release \
///  -p ctxwin-core --test estimator_accuracy margin -- --ignored --nocapture`.
#[test]
#[ignore = "needs CTXWIN_ESTIMATOR_CORPUS"]
fn margin_search_on_the_full_corpus() {
    let Ok(path) = std::env::var("CTXWIN_ESTIMATOR_CORPUS") else {
        println!("set CTXWIN_ESTIMATOR_CORPUS to a JSONL corpus");
        return;
    };
    let corpus = std::fs::read_to_string(path).unwrap();
    let rows: Vec<(String, Message)> = corpus
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let exact =
                [("cl100k".to_owned(), u32::try_from(v["cl100k"].as_u64().unwrap()).unwrap())]
                    .into_iter()
                    .collect();
            let message = Message {
                kind: v["type"].as_str().unwrap().to_owned(),
                text: v["text"].as_str().unwrap().to_owned(),
                exact,
            };
            (v["source"].as_str().unwrap_or("").to_owned(), message)
        })
        .collect();
    let odd = |s: &str| s.bytes().map(u32::from).sum::<u32>() % 2 == 1;
    let all: Vec<&Message> = rows.iter().map(|(_, m)| m).collect();
    let held_out: Vec<&Message> = rows.iter().filter(|(s, _)| odd(s)).map(|(_, m)| m).collect();
    let rest: Vec<&Message> = rows.iter().filter(|(s, _)| !odd(s)).map(|(_, m)| m).collect();
    // The worst order: every type on its own, as an agent reading one kind of text would.
    let mut by_type: Vec<&Message> = all.clone();
    by_type.sort_by(|a, b| a.kind.cmp(&b.kind));
    for (name, set) in
        [("corpus", &all), ("held-out", &held_out), ("rest", &rest), ("by type", &by_type)]
    {
        println!("{name}: {} messages, smallest margin {}/100", set.len(), smallest_margin(set));
    }
    // Which content drives the margin: each type's own runs, in corpus order.
    let mut kinds: Vec<&str> = all.iter().map(|m| m.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds {
        let set: Vec<&Message> = all.iter().copied().filter(|m| m.kind == kind).collect();
        println!(
            "  type {kind}: {} messages, smallest margin {}/100",
            set.len(),
            smallest_margin(&set)
        );
    }
}
