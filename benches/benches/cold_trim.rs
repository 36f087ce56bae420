//! Cold trim of conv_10000 (issue 15): the messages already parsed in memory, how long
//! ctxwin takes to produce the payload of an 8,000-token budget, and which messages it keeps.
//!
//! Counter: `api::QuarterLen`, `len / 4` per text, with a message overhead of 4 and no
//! request overhead, so a plain message costs `len // 4 + 4` as on the LangChain side
//! (`benches/langchain_trim.py`). What differs, because the core's framing is fixed: an
//! assistant message's tool calls also cost `len/4` of each call's id, name and arguments
//! plus 3 per call, and a tool result `len/4` of its call id; LangChain's rule counts content
//! only. The configuration is what `ctxwin trim` builds (`api::cold_trim_config`: the whole
//! budget is the payload, the permanent level gets exactly the system prompt's cost,
//! eviction from 100%), evicted units discarded.
//!
//! Timed (median of `RUNS` runs):
//! - `cold push+compose`: a fresh manager, 10,000 pushes, one compose (today's cold path);
//! - `push per message`: the same pushes alone, per message;
//! - `estimator per message`: the default estimator counting every text the manager counts
//!   (contents, call ids, names, arguments, result ids), per message: its own share;
//! - `core trim`: issue 15's stateless trim (`ctxwin_core::trim::trim`, `api::core_trim`)
//!   with the content-only counter `api::ContentQuarterLen` and no per-call overhead, i.e.
//!   exactly LangChain's `len(content) // 4 + 4`: the walk plus one pass over the kept items.
//!
//! Kept indices are compared with the pair-safe newest-first suffix under the content-only
//! rule, `{0} ∪ 9938..=9999`, and with LangChain's kept set when `LANGCHAIN_KEPT` holds it
//! (space-separated indices, as `langchain_trim.py` prints them).
//!
//! `cargo bench -p ctxwin-benches --bench cold_trim`; `benches/trim-vs-langchain.sh` runs it
//! beside LangChain and the CLI.

use std::time::Instant;

use ctxwin_benches::api::{
    cold_manager, compose_count, core_messages, core_trim, core_trim_tokens, estimate_all,
    kept_indices,
};
use ctxwin_benches::conv10k;
use ctxwin_benches::replay::tool_calls;

const BUDGET: u32 = 8_000;
const RUNS: usize = 15;

fn median_us(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn time_us(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    median_us(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect(),
    )
}

/// `0 9938..=9999` style.
fn ranges(indices: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let mut j = i;
        while j + 1 < indices.len() && indices[j + 1] == indices[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            indices[i].to_string()
        } else {
            format!("{}..={}", indices[i], indices[j])
        });
        i = j + 1;
    }
    out.join(" ")
}

fn compare(name: &str, kept: &[usize], other: &[usize]) {
    let verdict = if kept == other {
        "equal".to_owned()
    } else {
        let missing: Vec<usize> = other.iter().filter(|i| !kept.contains(i)).copied().collect();
        let extra: Vec<usize> = kept.iter().filter(|i| !other.contains(i)).copied().collect();
        format!("DIFFERS: missing [{}], extra [{}]", ranges(&missing), ranges(&extra))
    };
    println!("  vs {name}: {verdict}");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !ctxwin_benches::selected("cold_trim", std::env::args()) {
        return Ok(());
    }
    let messages = conv10k::load()?;
    let calls = tool_calls(&messages);
    let core = core_messages(&messages, &calls);
    let n = messages.len() as f64;

    let cold = time_us(RUNS, || {
        let mut manager = cold_manager(&messages, &core, BUDGET).expect("replay");
        std::hint::black_box(compose_count(&mut manager).expect("compose"));
    });
    let push = time_us(RUNS, || {
        std::hint::black_box(cold_manager(&messages, &core, BUDGET).expect("replay"));
    });
    let estimator = time_us(RUNS, || {
        std::hint::black_box(estimate_all(std::hint::black_box(&messages)));
    });
    let trim = core_trim(&messages, &core, BUDGET).map(|_| {
        time_us(RUNS, || {
            std::hint::black_box(core_trim_tokens(std::hint::black_box(&core), BUDGET));
        })
    });

    println!(
        "cold_trim: conv_10000 ({} messages, parsed), budget {BUDGET}, len/4 (+4 per message) counter, median of {RUNS}",
        messages.len()
    );
    println!("{:<44} {:>12}", "cold push + compose (sliding window)", format!("{:.0} µs", cold));
    println!("{:<44} {:>12}", "push, per message", format!("{:.3} µs", push / n));
    println!(
        "{:<44} {:>12}",
        "default estimator alone, per message",
        format!("{:.3} µs", estimator / n)
    );
    match trim {
        Some(us) => println!("{:<44} {:>12}", "core trim", format!("{us:.0} µs")),
        None => println!("{:<44} {:>12}", "core trim (issue 15)", "not yet available"),
    }
    println!("ctxwin_cold_us {cold:.1}");
    println!("ctxwin_push_us_per_msg {:.4}", push / n);
    println!("ctxwin_estimator_us_per_msg {:.4}", estimator / n);
    println!("ctxwin_trim_us {}", trim.map_or("n/a".to_owned(), |us| format!("{us:.1}")));

    let expected: Vec<usize> = std::iter::once(0).chain(9_938..=9_999).collect();
    let langchain: Option<Vec<usize>> = std::env::var("LANGCHAIN_KEPT")
        .ok()
        .map(|s| s.split_whitespace().filter_map(|t| t.parse().ok()).collect());
    let mut manager = cold_manager(&messages, &core, BUDGET)?;
    let mut sets = vec![("cold push+compose", kept_indices(&mut manager, &messages)?)];
    if let Some(kept) = core_trim(&messages, &core, BUDGET) {
        sets.push(("core trim", kept));
    }
    for (name, kept) in &sets {
        println!("kept by {name}: {} messages: {}", kept.len(), ranges(kept));
        compare("expected {0} ∪ 9938..=9999", kept, &expected);
        if let Some(langchain) = &langchain {
            compare("LangChain", kept, langchain);
        }
    }
    println!("ctxwin_kept {}", ranges(&sets[0].1));
    if let Some((_, kept)) = sets.get(1) {
        println!("ctxwin_trim_kept {}", ranges(kept));
    }
    Ok(())
}
