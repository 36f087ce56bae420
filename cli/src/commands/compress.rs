//! `ctxwin compress` and `ctxwin summarize`: compression on demand.
//!
//! Both open the session under a configuration changed for this one process, then compose:
//! composing runs the core's collection pass, which evicts under the configured strategy
//! (summarizing what leaves when the strategy says so) until usage and every level are within
//! the configuration's limits; the session archives the evicted units and records the
//! summaries. The next command opens the session with the file's configuration again.
//!
//! - `compress --target P` lowers `trigger_percent` (and the low-water mark) to `P`: the strategy evicts the oldest (or
//!   least valuable) units until usage is at most `P`% of the budget.
//! - `summarize --keep N` sets `max_messages` to `N` under the summarization strategy: every
//!   unit but the newest `N` messages (and what the locked tail protects) is folded into the
//!   rolling summary.

use ctxwin_core::{Config, StrategyKind, stats::Counters};
use serde_json::json;

use crate::args::{CompressArgs, SummarizeArgs};
use std::time::Duration;

use crate::error::CliError;
use crate::llm;
use crate::output::{Output, pairs, thousands};
use crate::state::Workspace;
use ctxwin_std::session::Session;

/// The configuration `compress` runs under.
pub(crate) fn compress_config(config: Config, args: &CompressArgs) -> Config {
    let target = args.target.clamp(1, 100);
    Config { trigger_percent: target, low_water_percent: target, ..config }
}

/// The configuration `summarize` runs under.
pub(crate) fn summarize_config(config: Config, args: &SummarizeArgs) -> Config {
    let keep = args.keep.unwrap_or(u32::from(config.locked_tail)).max(1);
    Config { strategy: StrategyKind::Summarization, max_messages: keep, ..config }
}

/// The session's state before a pass.
#[derive(Clone, Copy, Debug)]
struct Before {
    used: u32,
    history: usize,
    counters: Counters,
}

impl Before {
    fn of(session: &Session) -> Before {
        let manager = session.manager();
        Before {
            used: manager.used(),
            history: manager.history().count(),
            counters: manager.stats().counters,
        }
    }
}

/// What a pass did.
#[derive(Clone, Debug, serde::Serialize)]
struct Pass {
    tokens_before: u32,
    tokens_after: u32,
    units_evicted: u64,
    messages_evicted: u64,
    summaries: u64,
    summary_id: Option<u64>,
    /// What the model did, when one is configured.
    llm: Option<llm::LlmStats>,
}

fn pass(session: &mut Session, before: Before, wait: Duration) -> Result<Pass, CliError> {
    session.compose(&[])?;
    let llm = llm::settle(session, wait);
    let manager = session.manager();
    let counters = manager.stats().counters;
    let summary_id = manager.session().rfind(|m| m.is_summary()).map(|m| m.id());
    Ok(Pass {
        tokens_before: before.used,
        tokens_after: manager.used(),
        units_evicted: counters.units_evicted.saturating_sub(before.counters.units_evicted),
        messages_evicted: counters
            .messages_evicted
            .saturating_sub(before.counters.messages_evicted),
        summaries: counters.summaries_added.saturating_sub(before.counters.summaries_added),
        summary_id,
        llm,
    })
}

pub(crate) fn compress(
    session: &mut Session,
    workspace: &mut Workspace,
    args: &CompressArgs,
) -> Result<Output, CliError> {
    let before = Before::of(session);
    let config = *session.configured();
    let target = config.trigger_tokens();
    let done = pass(session, before, workspace.llm_wait())?;
    let headline = if done.units_evicted == 0 && done.summaries == 0 {
        format!(
            "nothing to compress: {} tokens used, target {} ({}% of {})",
            thousands(done.tokens_after),
            thousands(target),
            args.target,
            thousands(config.budget())
        )
    } else {
        format!(
            "compressed {} → {} tokens (target {}, {}% of the budget) with the {} strategy",
            thousands(done.tokens_before),
            thousands(done.tokens_after),
            thousands(target),
            args.target,
            config.strategy
        )
    };
    let text = format!("{headline}\n{}", details(&done));
    let json = json!({"target_tokens": target, "target_percent": args.target, "strategy": config.strategy.as_str(), "pass": done});
    Ok(Output::report(text, json))
}

pub(crate) fn summarize(
    session: &mut Session,
    workspace: &mut Workspace,
    _: &SummarizeArgs,
) -> Result<Output, CliError> {
    let before = Before::of(session);
    let keep = session.configured().max_messages;
    let done = pass(session, before, workspace.llm_wait())?;
    let headline = if done.units_evicted == 0 {
        format!(
            "nothing to summarize: {} messages in the history, the newest {keep} are kept (and the locked tail)",
            before.history
        )
    } else {
        let into = match (done.summaries, done.summary_id) {
            (0, _) | (_, None) => {
                "nothing worth keeping was found, so no summary changed".to_string()
            }
            (_, Some(id)) => format!(
                "into summary {id} (`ctxwin search --summary {id}` shows what it stands for)"
            ),
        };
        format!(
            "summarized {} messages in {} units {into}: {} → {} tokens",
            done.messages_evicted,
            done.units_evicted,
            thousands(done.tokens_before),
            thousands(done.tokens_after)
        )
    };
    let text = format!("{headline}\n{}", details(&done));
    let json = json!({"keep": keep, "pass": done});
    Ok(Output::report(text, json))
}

fn details(done: &Pass) -> String {
    let mut rows = vec![
        ("tokens", format!("{} → {}", thousands(done.tokens_before), thousands(done.tokens_after))),
        (
            "evicted",
            format!(
                "{} messages in {} units, to the archive",
                done.messages_evicted, done.units_evicted
            ),
        ),
        ("summary updates", done.summaries.to_string()),
    ];
    if let Some(stats) = &done.llm {
        rows.push(("model", llm::outcome(stats)));
    }
    pairs(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_lowers_the_trigger_only() {
        let config = compress_config(Config::DEFAULT, &CompressArgs { target: 30 });
        assert_eq!(config.trigger_percent, 30);
        assert_eq!(config.low_water_percent, 30);
        let d = Config::DEFAULT;
        let back = Config {
            trigger_percent: d.trigger_percent,
            low_water_percent: d.low_water_percent,
            ..config
        };
        assert_eq!(back, Config::DEFAULT);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn summarize_folds_all_but_the_kept_messages() {
        let config = summarize_config(Config::DEFAULT, &SummarizeArgs { keep: None });
        assert_eq!((config.strategy, config.max_messages), (StrategyKind::Summarization, 6));
        let config = summarize_config(Config::DEFAULT, &SummarizeArgs { keep: Some(2) });
        assert_eq!(config.max_messages, 2);
        assert!(config.validate().is_ok());
    }
}
