//! `ctxwin stats`: the session's stats overview ([`SessionStats::overview`], the one stats
//! model) with the CLI's notes added — the command of the last compression, the items `build`
//! retrieved, the configured server — as text, or as JSON built from the same struct.

use ctxwin_core::Level;
use ctxwin_std::SessionStats;
use serde_json::{Map, Value, json};

use crate::error::CliError;
use crate::llm;
use crate::notes::{ago, now_ms};
use crate::output::{Output, thousands};
use crate::state::Workspace;
use ctxwin_std::session::Session;

pub(crate) fn run(session: &mut Session, workspace: &mut Workspace) -> Result<Output, CliError> {
    let stats = session.stats()?;
    let text = SessionStats::render_rows(&rows(&stats, workspace));
    Ok(Output::report(text, report(&stats, workspace)))
}

/// The overview rows, with the CLI's notes.
fn rows(stats: &SessionStats, workspace: &Workspace) -> Vec<(String, String)> {
    let notes = &workspace.notes;
    let mut rows = stats.overview();
    for (key, value) in &mut rows {
        match key.as_str() {
            "last compression" => {
                if let (Some(_), Some(last)) =
                    (stats.core.counters.last_compression_turn, &notes.last_compression)
                {
                    value.push_str(&format!(
                        "; last by `{}` {}: {} units, {} tokens evicted, {} summaries",
                        last.command,
                        ago(last.at_ms, now_ms()),
                        thousands(last.units_evicted),
                        thousands(last.tokens_evicted),
                        last.summaries
                    ));
                }
            }
            "llm" => *value = workspace.llm_description(),
            _ => {}
        }
    }
    let at = rows.iter().position(|(key, _)| key == "checkpoints").unwrap_or(rows.len());
    rows.insert(at, ("retrieved items".into(), thousands(notes.retrieved_items)));
    rows
}

/// The JSON report: the overview's numbers by name, the CLI's notes, and the whole
/// [`SessionStats`] under `detail`.
fn report(stats: &SessionStats, workspace: &Workspace) -> Value {
    let core = &stats.core;
    let counters = &core.counters;
    let notes = &workspace.notes;
    let archived = stats.archive.map_or(0, |a| a.messages);
    let recorded = stats.archive.map_or(0, |a| a.summaries);
    let levels: Map<String, Value> = Level::ALL
        .iter()
        .map(|&level| {
            let usage = core.level(level);
            let json =
                json!({"tokens": usage.tokens, "budget": usage.budget, "messages": usage.messages});
            (level.as_str().to_string(), json)
        })
        .collect();
    json!({
        "session": stats.session,
        "counter": stats.counter,
        "strategy": stats.strategy.as_str(),
        "tokens": {"used": core.used, "budget": core.budget, "trigger": core.trigger, "percent": core.percent_used()},
        "levels": Value::Object(levels),
        "messages": {"in_context": core.messages(), "archived": archived, "pushed": stats.counters.messages_pushed},
        "summaries": {"in_context": core.summaries(), "recorded": recorded},
        "compression": {
            "ratio": core.compression_permille() as f64 / 1000.0,
            "tokens_ingested": counters.tokens_ingested,
            "turn": core.turn,
            "last_turn": counters.last_compression_turn,
            "last": notes.last_compression,
        },
        "cache": {
            "compactions": counters.compactions,
            "composes": counters.composes,
            "composes_extending": counters.composes_extending,
            "extending_share": counters.extending_permille() as f64 / 1000.0,
            "prompt_tokens_cached": counters.prompt_tokens_cached,
            "prompt_tokens_new": counters.prompt_tokens_new,
            "cached_share": counters.cached_permille() as f64 / 1000.0,
            "cost_ratio": counters.cost_permille(100, 1_250) as f64 / 1000.0,
        },
        "evicted": {"units": counters.units_evicted, "messages": counters.messages_evicted, "tokens": counters.tokens_evicted},
        "reduced": {"outputs": counters.observations_reduced, "tokens_saved": counters.tokens_saved_by_reduction},
        "retrieved_items": notes.retrieved_items,
        "checkpoints": {"kept": stats.checkpoints_kept.unwrap_or(0), "last": stats.last_checkpoint},
        "llm": workspace.llm.as_ref().map(llm::base_url),
        "tasks": stats.tasks,
        "detail": stats,
    })
}
