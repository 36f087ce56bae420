//! `ctxwin stats`: the metrics block — tokens used of the budget, per level, messages,
//! summaries, compression ratio, last compression, retrieved items.

use ctxwin_core::Level;
use serde_json::{Map, Value, json};

use crate::checkpoint::CheckpointStore;
use crate::cli::error::CliError;
use crate::cli::notes::{ago, now_ms};
use crate::cli::output::{Output, pairs, thousands};
use crate::cli::state::Workspace;
use crate::session::Session;

pub(crate) fn run(session: &mut Session, workspace: &mut Workspace) -> Result<Output, CliError> {
    let stats = session.stats()?;
    let core = &stats.core;
    let counters = &core.counters;
    let archived = stats.archive.map_or(0, |a| a.messages);
    let recorded = stats.archive.map_or(0, |a| a.summaries);
    let kept = CheckpointStore::open(workspace.dir.checkpoints())?.ids()?.len();
    let strategy = session.configured().strategy;
    let permille = core.compression_permille();
    let ratio = permille as f64 / 1000.0;
    let notes = &workspace.notes;
    let llm = workspace.llm.as_ref().map(|client| client.base_url().to_string());

    let last = match (counters.last_compression_turn, &notes.last_compression) {
        (None, _) => format!("never (turn {})", core.turn),
        (Some(turn), None) => format!("turn {turn} (now {})", core.turn),
        (Some(turn), Some(last)) => format!(
            "turn {turn} (now {}); last by `{}` {}: {} units, {} tokens evicted, {} summaries",
            core.turn,
            last.command,
            ago(last.at_ms, now_ms()),
            thousands(last.units_evicted),
            thousands(last.tokens_evicted),
            last.summaries
        ),
    };
    let mut level_json = Map::new();
    let usages: Vec<_> = Level::ALL.iter().map(|&level| (level, core.level(level))).collect();
    let width = |f: &dyn Fn(&ctxwin_core::stats::LevelStats) -> u32| {
        usages.iter().map(|(_, u)| thousands(f(u)).len()).max().unwrap_or(1)
    };
    let (tw, bw, mw) = (width(&|u| u.tokens), width(&|u| u.budget), width(&|u| u.messages));
    let mut rows: Vec<(String, String)> = vec![
        (
            "session".into(),
            format!("{} ({} counter, {strategy} strategy)", stats.session, stats.counter),
        ),
        (
            "tokens".into(),
            format!(
                "{} / {} ({}%), eviction above {}",
                thousands(core.used),
                thousands(core.budget),
                core.percent_used(),
                thousands(core.trigger)
            ),
        ),
    ];
    for (level, usage) in &usages {
        rows.push((
            format!("  {}", level.as_str()),
            format!(
                "{:>tw$} / {:<bw$}  {:>mw$} {}",
                thousands(usage.tokens),
                thousands(usage.budget),
                thousands(usage.messages),
                if usage.messages == 1 { "message" } else { "messages" }
            ),
        ));
        level_json.insert(
            level.as_str().into(),
            json!({"tokens": usage.tokens, "budget": usage.budget, "messages": usage.messages}),
        );
    }
    rows.extend(
        [
            (
                "messages",
                format!(
                    "{} in context, {} archived",
                    thousands(core.messages()),
                    thousands(archived)
                ),
            ),
            (
                "summaries",
                format!("{} in context, {} recorded", core.summaries(), thousands(recorded)),
            ),
            (
                "compression",
                format!("{ratio:.2}x ({} tokens ingested)", thousands(counters.tokens_ingested)),
            ),
            ("last compression", last),
            (
                "evicted",
                format!(
                    "{} messages in {} units ({} tokens)",
                    thousands(counters.messages_evicted),
                    thousands(counters.units_evicted),
                    thousands(counters.tokens_evicted)
                ),
            ),
            (
                "reduced",
                format!(
                    "{} tool outputs ({} tokens saved)",
                    thousands(counters.observations_reduced),
                    thousands(counters.tokens_saved_by_reduction)
                ),
            ),
            ("retrieved items", thousands(notes.retrieved_items)),
            (
                "checkpoints",
                format!("{kept} kept, last {}", stats.last_checkpoint.as_deref().unwrap_or("-")),
            ),
            ("llm", workspace.llm_description()),
        ]
        .map(|(key, value)| (key.to_string(), value)),
    );
    let borrowed: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let text = pairs(&borrowed);
    let json = json!({
        "session": stats.session,
        "counter": stats.counter,
        "strategy": strategy.as_str(),
        "tokens": {"used": core.used, "budget": core.budget, "trigger": core.trigger, "percent": core.percent_used()},
        "levels": Value::Object(level_json),
        "messages": {"in_context": core.messages(), "archived": archived, "pushed": stats.counters.messages_pushed},
        "summaries": {"in_context": core.summaries(), "recorded": recorded},
        "compression": {
            "ratio": ratio,
            "tokens_ingested": counters.tokens_ingested,
            "turn": core.turn,
            "last_turn": counters.last_compression_turn,
            "last": notes.last_compression,
        },
        "evicted": {"units": counters.units_evicted, "messages": counters.messages_evicted, "tokens": counters.tokens_evicted},
        "reduced": {"outputs": counters.observations_reduced, "tokens_saved": counters.tokens_saved_by_reduction},
        "retrieved_items": notes.retrieved_items,
        "checkpoints": {"kept": kept, "last": stats.last_checkpoint},
        "llm": llm,
        "detail": stats,
    });
    Ok(Output::report(text, json))
}
