//! Prompt-cache cost of the context a manager composes (issue 14).
//!
//! Replays `data/conv_10000.jsonl.gz` message by message and composes a payload at every turn
//! end (after an assistant reply, or after the last result of an assistant message's calls:
//! 4,554 turns), first under the benches' 8,000-token configuration
//! (`workload::turn_config`: level split 1,000 / 1,000 / 5,500 / 500, default estimator,
//! dynamic context `workload::DYNAMIC`), then with a 128,000-token budget and every other
//! setting at `Config::DEFAULT`. Rows: the five built-in strategies (today's code) and two
//! baselines computed in the same run (`ctxwin_benches::cache`): a bench-side model of
//! today's per-push eviction, and a newest-first trim recomputed every turn (system
//! message(s) pinned, then the newest whole tool units that fit by the same estimator,
//! stopping at the first that does not, opening on a user message: LangChain's
//! `trim_messages(strategy="last", start_on="human")`).
//!
//! Columns (see `ctxwin_benches::cache` for the exact rules):
//! - `stable`: turns (after the first) whose previous payload is a message-by-message prefix
//!   of theirs (role, content, tool calls, tool-call id byte-equal); `sum brk`: breaks where
//!   the first differing message is the `[Memory Summary]`;
//! - `cacheable`: share of input tokens in the prefix reused whole from the previous turn;
//! - `fill`: payload size in exact cl100k_base tokens (`ExactCounter`, framing 4 per message,
//!   3 per tool call, 3 per request), mean and min as a share of the budget, max in tokens
//!   (`FAIL` when over the budget);
//! - `cost`: cache model: cached prefix at 0.1×, the rest written at 1.25×; ratio against
//!   the same payloads sent uncached (1.0×), and per 1,000 turns in input-token equivalents;
//! - 128k only, `history`: exact tokens of history messages as a share of the budget, mean
//!   and min over turns after the session has pushed more than the budget.
//!
//! `cargo bench -p ctxwin-benches --bench cache_cost` (a few minutes; `-- budget8k` or
//! `-- budget128k` for one half).

use ctxwin_benches::api::{config_8k, config_128k};
use ctxwin_benches::cache::{
    CacheStats, ExactTokens, Policy, estimator_by_class, replay, replay_with, turn_ends,
};
use ctxwin_benches::conv10k;
use ctxwin_core::StrategyKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let wants = |name: &str| ctxwin_benches::selected(name, args.iter().cloned());
    if !wants("cache_cost_budget8k") && !wants("cache_cost_budget128k") {
        return Ok(());
    }
    let messages = conv10k::load()?;
    let mut exact = ExactTokens::cl100k()?;
    if let Ok(pairs) = std::env::var("CACHE_COST_SWEEP") {
        return sweep(&messages, &pairs, &mut exact);
    }
    println!(
        "cache_cost: conv_10000 ({} messages, {} turns), exact cl100k_base tokens",
        messages.len(),
        turn_ends(&messages).len()
    );
    estimator_table(&messages, &mut exact);
    if wants("cache_cost_budget8k") {
        println!("\nbudget 8,000 (benches' level split, default estimator)");
        header(false);
        let mut rows = Vec::new();
        for policy in Policy::all() {
            let stats =
                replay(&messages, policy, config_8k(StrategyKind::SlidingWindow), &mut exact)?;
            row(&policy.label(), &stats, false);
            rows.push((policy, stats));
        }
        calibrated_notes(&rows);
        targets_8k(&rows);
    }
    if wants("cache_cost_budget128k") {
        println!(
            "\nbudget 128,000 (Config::DEFAULT otherwise; manager rows with a std Session's capacities)"
        );
        header(true);
        let mut rows = Vec::new();
        for policy in Policy::all() {
            let config = config_128k(StrategyKind::SlidingWindow);
            let stats = replay_with(&messages, policy, config, &mut exact, true)?;
            row(&policy.label(), &stats, true);
            rows.push((policy, stats));
        }
        calibrated_notes(&rows);
        let kind = StrategyKind::default();
        for policy in [Policy::Manager(kind), Policy::Calibrated(kind)] {
            let stats = rows.iter().find(|(p, _)| *p == policy).map(|(_, s)| s);
            if let Some((mean, min)) = stats.and_then(CacheStats::history_share) {
                println!(
                    "target (128k, default configuration{}): history ≥ 70% of the budget once full: {:.1}% (min {:.1}%) {} · max {} {}",
                    if policy == Policy::Manager(kind) {
                        ", estimator alone"
                    } else {
                        ", estimator + calibrator"
                    },
                    mean * 100.0,
                    min * 100.0,
                    mark(mean >= 0.70),
                    stats.map_or(0, |s| s.max_fill),
                    mark(stats.is_some_and(|s| s.max_fill <= s.budget)),
                );
            }
        }
    }
    Ok(())
}

fn header(history: bool) {
    print!(
        "{:<30} {:>6} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10} {:>7} {:>14}",
        "row",
        "turns",
        "stable",
        "sum brk",
        "cacheable",
        "fill avg",
        "fill min",
        "fill max",
        "cost",
        "per 1k turns"
    );
    if history {
        print!(" {:>13} {:>12}", "history avg", "history min");
    }
    println!();
}

fn row(label: &str, s: &CacheStats, history: bool) {
    let over = if s.max_fill > s.budget { " FAIL" } else { "" };
    print!(
        "{:<30} {:>6} {:>7.1}% {:>8} {:>9.1}% {:>8.1}% {:>8.1}% {:>10} {:>7.3} {:>14.0}",
        label,
        s.turns,
        s.stable_share() * 100.0,
        s.summary_breaks,
        s.cacheable_share() * 100.0,
        s.mean_fill() * 100.0,
        s.min_fill_share() * 100.0,
        format!("{}{over}", s.max_fill),
        s.cost_ratio(),
        s.cost_per_1000(),
    );
    if history {
        match s.history_share() {
            Some((mean, min)) => print!(" {:>12.1}% {:>11.1}%", mean * 100.0, min * 100.0),
            None => print!(" {:>13} {:>12}", "-", "-"),
        }
    }
    println!();
}

fn mark(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn targets_8k(rows: &[(Policy, CacheStats)]) {
    println!(
        "\ntargets (8,000 budget, conv_10000): stable ≥ 90%, cacheable ≥ 80%, mean fill ≥ 70%, max ≤ budget, cost ratio ≤ 0.30"
    );
    let policies = [StrategyKind::SlidingWindow, StrategyKind::Hierarchical]
        .into_iter()
        .flat_map(|kind| [Policy::Manager(kind), Policy::Calibrated(kind)]);
    for policy in policies {
        let Some((_, s)) = rows.iter().find(|(p, _)| *p == policy) else {
            continue;
        };
        println!(
            "  {:<29} stable {:.1}% {} · cacheable {:.1}% {} · mean fill {:.1}% {} · max {} {} · cost {:.3} {}",
            policy.label(),
            s.stable_share() * 100.0,
            mark(s.stable_share() >= 0.90),
            s.cacheable_share() * 100.0,
            mark(s.cacheable_share() >= 0.80),
            s.mean_fill() * 100.0,
            mark(s.mean_fill() >= 0.70),
            s.max_fill,
            mark(s.max_fill <= s.budget),
            s.cost_ratio(),
            mark(s.cost_ratio() <= 0.30),
        );
    }
}

/// `CACHE_COST_SWEEP="95:60,90:50"`: the 8,000-token rows of the sliding window and the
/// hierarchical strategy for each (high, low) water-mark pair, in percent of the budget.
fn sweep(
    messages: &[ctxwin_std::ChatMessage],
    pairs: &str,
    exact: &mut ExactTokens,
) -> Result<(), Box<dyn std::error::Error>> {
    // CACHE_COST_SWEEP_BUDGET=128k sweeps the 128k configuration; CACHE_COST_SWEEP_ROWS=calibrated
    // leaves out the rows without a calibrator.
    let big = std::env::var("CACHE_COST_SWEEP_BUDGET").is_ok_and(|b| b == "128k");
    let only_calibrated = std::env::var("CACHE_COST_SWEEP_ROWS").is_ok_and(|r| r == "calibrated");
    if big {
        println!(
            "\nwater-mark sweep, budget 128,000 (Config::DEFAULT otherwise, a Session's capacities)"
        );
    } else {
        println!("\nwater-mark sweep, budget 8,000 (benches' level split, default estimator)");
    }
    header(big);
    for pair in pairs.split(',') {
        let (high, low) = pair.split_once(':').ok_or("CACHE_COST_SWEEP: high:low,…")?;
        let (high, low): (u8, u8) = (high.trim().parse()?, low.trim().parse()?);
        for kind in [StrategyKind::SlidingWindow, StrategyKind::Hierarchical] {
            for policy in [Policy::Manager(kind), Policy::Calibrated(kind)] {
                if only_calibrated && policy == Policy::Manager(kind) {
                    continue;
                }
                let config = ctxwin_core::Config {
                    trigger_percent: high,
                    low_water_percent: low,
                    ..config_8k(kind)
                };
                let stats = if big {
                    let config = ctxwin_core::Config {
                        trigger_percent: high,
                        low_water_percent: low,
                        ..config_128k(kind)
                    };
                    replay_with(messages, policy, config, exact, true)?
                } else {
                    replay(messages, policy, config, exact)?
                };
                row(&format!("{high}/{low} {}", policy.label()), &stats, big);
            }
        }
    }
    Ok(())
}

/// The default estimator against exact cl100k on conv_10000, by content class.
fn estimator_table(messages: &[ctxwin_std::ChatMessage], exact: &mut ExactTokens) {
    println!(
        "\ndefault estimator on conv_10000 by content class (estimate / exact cl100k; margin ×{}/{})",
        ctxwin_core::estimator::Margin::DEFAULT.num(),
        ctxwin_core::estimator::Margin::DEFAULT.den()
    );
    println!(
        "{:<32} {:>7} {:>11} {:>8} {:>8} {:>14}",
        "class", "texts", "exact", "×1", "default", "under (dflt)"
    );
    let rows = estimator_by_class(messages, exact);
    let (mut x, mut t, mut e) = (0u64, 0u64, 0u64);
    for (label, texts, exact, tight, safe, under) in &rows {
        println!(
            "{:<32} {:>7} {:>11} {:>8.3} {:>8.3} {:>13.1}%",
            label,
            texts,
            exact,
            *tight as f64 / (*exact).max(1) as f64,
            *safe as f64 / (*exact).max(1) as f64,
            under * 100.0
        );
        (x, t, e) = (x + exact, t + tight, e + safe);
    }
    println!(
        "{:<32} {:>7} {:>11} {:>8.3} {:>8.3}",
        "all texts",
        rows.iter().map(|r| r.1).sum::<usize>(),
        x,
        t as f64 / x.max(1) as f64,
        e as f64 / x.max(1) as f64
    );
}

/// The calibrated rows' final budget and ratio.
fn calibrated_notes(rows: &[(Policy, CacheStats)]) {
    for (policy, stats) in rows {
        if let Some((budget, ratio)) = stats.calibrated {
            println!(
                "  {}: billed/estimated {:.3} (mean), the manager plans with {} estimated tokens for the {} budget",
                policy.label(),
                ratio,
                budget,
                stats.budget
            );
        }
    }
}
