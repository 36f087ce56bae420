//! Memory quality per strategy: a generated 300-turn agent session with 40 planted facts,
//! replayed at a tenth of its tokens. Prints how many facts the final payload still carries.
//!
//! `cargo bench -p ctxwin-tests --bench memory_quality`; `QUALITY_SEED`, `QUALITY_SEEDS`,
//! `QUALITY_TURNS`, `QUALITY_FACTS` and `QUALITY_RATIO` change the scenario.

use ctxwin_core::StrategyKind;
use ctxwin_tests::quality::{generate, run};

const STRATEGIES: [StrategyKind; 5] = [
    StrategyKind::SlidingWindow,
    StrategyKind::Summarization,
    StrategyKind::EntityExtraction,
    StrategyKind::Importance,
    StrategyKind::Hierarchical,
];

fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let first_seed = env("QUALITY_SEED", 1);
    let seeds: Vec<u64> = (first_seed..first_seed + env("QUALITY_SEEDS", 5)).collect();
    let (turns, facts, ratio) = (
        env("QUALITY_TURNS", 300) as usize,
        env("QUALITY_FACTS", 40) as usize,
        env("QUALITY_RATIO", 10),
    );
    println!(
        "memory quality: {turns} turns, {facts} facts, budget = session tokens / {ratio}, seeds {seeds:?}"
    );
    println!(
        "{:<18} {:>8} {:>9} {:>8} {:>7} {:>7} {:>9} {:>6} {:>5}",
        "strategy", "kept %", "compress", "paths", "numbers", "decide", "names", "key", ""
    );
    for strategy in STRATEGIES {
        let outcomes: Vec<_> =
            seeds.iter().map(|&seed| run(&generate(seed, turns, facts), strategy, ratio)).collect();
        let kept: usize = outcomes.iter().map(|o| o.kept).sum();
        let planted: usize = outcomes.iter().map(|o| o.facts).sum();
        let compression =
            outcomes.iter().map(|o| o.compression()).sum::<f64>() / outcomes.len() as f64;
        let kind = |index: usize| {
            let (k, p) = outcomes
                .iter()
                .fold((0, 0), |(k, p), o| (k + o.by_kind[index].1, p + o.by_kind[index].2));
            format!("{k}/{p}")
        };
        let keys = outcomes.iter().filter(|o| o.key_kept).count();
        println!(
            "{:<18} {:>7.1}% {:>8.1}x {:>8} {:>7} {:>7} {:>9} {:>4}/{}",
            format!("{strategy:?}"),
            100.0 * kept as f64 / planted as f64,
            compression,
            kind(0),
            kind(1),
            kind(2),
            kind(3),
            keys,
            outcomes.len(),
        );
    }
}
