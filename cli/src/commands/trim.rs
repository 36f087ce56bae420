//! `ctxwin trim --budget N <file|->`: stateless. Reads a conversation, runs it through a
//! fresh in-memory session whose whole budget is `N` tokens, and prints the payload ctxwin
//! would send.
//!
//! The permanent level gets exactly what the system prompts and tool definitions cost (they
//! always stay), a summarizing strategy gets a quarter of the rest for its summaries (at most
//! the configured `session_budget`), and the history the remainder; eviction starts only at
//! 100% of the budget, so the payload uses all of it.

use std::io::{IsTerminal, Write};
use std::path::Path;

use ctxwin_core::{Config, Error as CoreError, Level, Role, StrategyKind};

use crate::args::{PayloadFormat, TrimArgs};
use crate::config_file::FileConfig;
use crate::error::CliError;
use crate::output::{Output, thousands};
use crate::{input, llm, payload, state};
use ctxwin_std::Conversation;
use ctxwin_std::session::{Counter, SessionBuilder, SessionError};

use super::import::stopped;

pub(crate) fn run(globals: &state::Globals<'_>, args: &TrimArgs) -> Result<Output, CliError> {
    let (conversation, format) =
        input::read_conversation(&args.file, args.input_format.map(Into::into))?;
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let base = args.config.as_deref().and_then(Path::parent).unwrap_or(Path::new("."));
    let counter = state::counter(globals.tokenizer, file.tokenizer_path(base))?;
    let client = llm::client(globals.llm_url, &file.llm)?;
    let permanent = permanent_tokens(&conversation, file.context, &counter, args.budget)?;
    let config = trim_config(file.context, args.budget, permanent)?;
    let mut builder = SessionBuilder::new("trim").config(config).counter(counter.clone());
    if client.is_some() {
        // The model's summaries are recorded with their sources; nothing outlives the process.
        builder = builder.archive_in_memory();
    }
    let mut session = llm::attach_llm(builder, client.as_ref()).build()?;
    session.import(&conversation).map_err(|e| stopped(e, 0, conversation.messages.len()))?;
    llm::settle(&mut session, llm::wait(&file.llm));
    let composed = session.compose(&[]).map_err(|error| match error {
        SessionError::Core(CoreError::ToolCallsPending { unanswered }) => CliError::BadInput(format!(
            "the conversation ends with {unanswered} tool call(s) without results, which a provider would refuse; add their results to the file or drop the calls"
        )),
        other => CliError::from(other),
    })?;
    if std::io::stderr().is_terminal() {
        let _ = writeln!(
            std::io::stderr(),
            "ctxwin: kept {} of {} messages, {} / {} tokens ({} counter)",
            composed.conversation.messages.len(),
            conversation.messages.len() + usize::from(conversation.system.is_some()),
            thousands(composed.tokens),
            thousands(args.budget),
            counter.kind(),
        );
    }
    let format = args.format.unwrap_or_else(|| PayloadFormat::body_of(format));
    payload::render(&composed.conversation, format).map(Output::Raw)
}

/// What the system prompts and tool definitions cost: they always stay, so the history gets
/// the rest.
fn permanent_tokens(
    conversation: &Conversation,
    config: Config,
    counter: &Counter,
    budget: u32,
) -> Result<u32, CliError> {
    let probe = Config {
        context_window: budget,
        reserved_for_reply: 0,
        permanent_budget: budget,
        session_budget: 0,
        working_budget: 0,
        ..config
    };
    let mut session =
        SessionBuilder::new("trim-probe").config(probe).counter(counter.clone()).build()?;
    let pinned = Conversation {
        system: conversation.system.clone(),
        tools: conversation.tools.clone(),
        messages: conversation
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .cloned()
            .collect(),
    };
    match session.import(&pinned) {
        Ok(_) => Ok(session.manager().level_tokens(Level::Permanent)),
        Err(SessionError::Import { source, .. })
            if matches!(*source, SessionError::Core(CoreError::LevelOverBudget { .. })) =>
        {
            Err(CliError::Budget(format!(
                "the system prompt and tool definitions alone need more than the budget of {} tokens; raise --budget",
                thousands(budget)
            )))
        }
        Err(error) => Err(stopped(error, 0, pinned.messages.len())),
    }
}

/// `config` with its budgets split for a payload of `budget` tokens, `permanent` of them
/// pinned.
fn trim_config(config: Config, budget: u32, permanent: u32) -> Result<Config, CliError> {
    let rest = budget.saturating_sub(permanent);
    let summarizes =
        !matches!(config.strategy, StrategyKind::SlidingWindow | StrategyKind::EntityExtraction);
    let session = if summarizes { config.session_budget.min(rest / 4) } else { 0 };
    let trimmed = Config {
        context_window: budget,
        reserved_for_reply: 0,
        permanent_budget: permanent,
        session_budget: session,
        working_budget: rest - session,
        trigger_percent: 100,
        // Stateless: no cache to keep, so evict just enough and fill the whole budget, with
        // the budgets exactly as split here.
        low_water_percent: 100,
        fit_budgets: false,
        ..config
    };
    trimmed.validate().map_err(|e| CliError::Config(format!("--budget {budget}: {e}")))?;
    Ok(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_split_between_pinned_summaries_and_history() {
        let sliding = trim_config(Config::DEFAULT, 8_000, 500).unwrap();
        assert_eq!(
            (sliding.permanent_budget, sliding.session_budget, sliding.working_budget),
            (500, 0, 7_500)
        );
        assert_eq!(sliding.budget(), 8_000);
        let summarizing = Config { strategy: StrategyKind::Summarization, ..Config::DEFAULT };
        let split = trim_config(summarizing, 8_000, 500).unwrap();
        assert_eq!((split.session_budget, split.working_budget), (1_875, 5_625));
        assert_eq!(split.volatile_budget(), 0);
    }
}
