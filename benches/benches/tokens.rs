//! Token-counting throughput on the same text: the core's `Estimator`, the `tokenizers`
//! counter of `ctxwin-std` (uncached and cached) and, for reference, `tiktoken-rs`
//! (`cl100k_base`). `cargo bench -p ctxwin-benches --bench tokens`.
//!
//! The text is the estimator corpus sample (504 messages, 12 content types, 467 KB), each
//! message counted on its own as the manager does. Per-type accuracy and speed: the
//! `estimator_accuracy` bench.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ctxwin_benches::corpus::estimator_sample;
use ctxwin_core::{counter::TokenCounter, estimator::Estimator, estimator::Margin};
use ctxwin_std::tokens::ExactCounter;

fn bench(c: &mut Criterion) {
    let samples = estimator_sample().expect("embedded corpus");
    let texts: Vec<&str> = samples.iter().map(|s| s.text.as_str()).collect();
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    let total = |count: &dyn Fn(&str) -> usize| texts.iter().map(|t| count(t)).sum::<usize>();

    let estimator = Estimator::new();
    let tight = estimator.with_margin(Margin::TIGHT);
    let exact = ExactCounter::cl100k().expect("embedded tokenizer");
    let tiktoken = tiktoken_rs::cl100k_base().expect("embedded cl100k_base");
    println!(
        "{} messages, {bytes} bytes: cl100k {} tokens (tokenizers), {} (tiktoken-rs); \
         estimator {} at x5/4, {} at x1",
        texts.len(),
        total(&|t| exact.count_uncached(t) as usize),
        total(&|t| tiktoken.count_with_special_tokens(t)),
        total(&|t| estimator.count(t) as usize),
        total(&|t| tight.count(t) as usize),
    );

    let mut group = c.benchmark_group("count");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("estimator", |b| {
        b.iter(|| texts.iter().map(|t| estimator.count(black_box(t))).sum::<u32>())
    });
    group.bench_function("tokenizers_uncached", |b| {
        b.iter(|| texts.iter().map(|t| exact.count_uncached(black_box(t))).sum::<u32>())
    });
    for text in &texts {
        exact.count(text);
    }
    group.bench_function("tokenizers_cached", |b| {
        b.iter(|| texts.iter().map(|t| exact.count(black_box(t))).sum::<u32>())
    });
    group.bench_function("tiktoken_rs", |b| {
        b.iter(|| {
            texts.iter().map(|t| tiktoken.count_with_special_tokens(black_box(t))).sum::<usize>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
