//! `ctxwin trim --budget N <file|->`: stateless. Prints the payload ctxwin would send for a
//! conversation under a budget of `N` tokens.
//!
//! With the sliding window (the default) and no LLM it runs the core's stateless
//! [`trim`](ctxwin_core::trim): the whole budget minus the system prompts and tool
//! definitions goes to the newest units that fit, walking from the end. A JSONL file is read
//! from its end: the leading system/header lines and as many lines from the end as the walk
//! needs are parsed (doubling the tail until the budget is full), the rest is never parsed.
//! Other input is parsed once.
//!
//! Otherwise (a summarizing strategy, an entity schema, `--llm-url`, or what the stateless
//! trim leaves to a manager: a system message after the history started), it runs the
//! conversation through a fresh in-memory session: the permanent level gets exactly what the
//! system prompts and tool definitions cost, a summarizing strategy a quarter of the rest for
//! its summaries (at most the configured `session_budget`), and the history the remainder;
//! eviction starts only at 100% of the budget, so the payload uses all of it.

use std::io::{IsTerminal, Write};
use std::path::Path;

use ctxwin_core::trim::{TrimError, TrimmedItem, trim};
use ctxwin_core::{Config, Error as CoreError, Level, Message, Role, StrategyKind};
use ctxwin_std::format::{self, Format, JsonlTail};
use ctxwin_std::session::tool_definition_json;
use ctxwin_std::{ChatMessage, ToolCall};

use crate::args::{PayloadFormat, TrimArgs};
use crate::config_file::FileConfig;
use crate::error::CliError;
use crate::output::{Output, thousands};
use crate::{input, llm, payload, state};
use ctxwin_std::Conversation;
use ctxwin_std::session::{Counter, SessionBuilder, SessionError};

use super::import::stopped;

pub(crate) fn run(globals: &state::Globals<'_>, args: &TrimArgs) -> Result<Output, CliError> {
    run_with(globals, args, true)
}

/// [`run`], through a session only when `stateless` is false (the tests compare the two).
fn run_with(
    globals: &state::Globals<'_>,
    args: &TrimArgs,
    stateless: bool,
) -> Result<Output, CliError> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let base = args.config.as_deref().and_then(Path::parent).unwrap_or(Path::new("."));
    let counter = state::counter(globals.tokenizer, file.tokenizer_path(base))?;
    let client = llm::client(globals.llm_url, &file.llm)?;
    let stateless = stateless
        && client.is_none()
        && file.context.strategy == StrategyKind::SlidingWindow
        && file.context.entity_schema.is_empty();
    // `--config`'s `[limits] max_input_bytes` bounds the input, as it does for `import`.
    let cap = file.limits.max_input_bytes;
    if stateless && let Some(output) = stateless_trim(args, file.context, &counter, cap)? {
        return Ok(output);
    }
    let (conversation, format) =
        input::read_conversation(&args.file, args.input_format.map(Into::into), cap)?;
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
        SessionError::Core(CoreError::ToolCallsPending { unanswered }) => pending(unanswered),
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

/// The stateless path: `None` when the conversation needs a manager (or trim refuses it:
/// the session path then reports the refusal exactly as before).
fn stateless_trim(
    args: &TrimArgs,
    context: Config,
    counter: &Counter,
    cap: u64,
) -> Result<Option<Output>, CliError> {
    let text = input::read_text(&args.file, cap)?;
    let format = match args.input_format.map(Into::into).or_else(|| format::detect(&text)) {
        Some(format) => format,
        None => return Ok(None),
    };
    let config = Config {
        context_window: args.budget,
        reserved_for_reply: 0,
        permanent_budget: 0,
        session_budget: 0,
        working_budget: args.budget,
        trigger_percent: 100,
        ..context
    };
    config.validate().map_err(|e| CliError::Config(format!("--budget {}: {e}", args.budget)))?;
    let body = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let lines = if format.is_jsonl() { JsonlTail::of(body) } else { None };
    let Some(lines) = lines else {
        let Ok(conversation) = format::read(body, format) else { return Ok(None) };
        let total = || conversation.messages.len() + usize::from(conversation.system.is_some());
        return finish(args, format, &conversation, &total, &config, counter, true);
    };
    // JSONL from its end: the leading lines and a tail that doubles until the walk stops
    // inside it (or it holds every line).
    let mut tail = 64;
    loop {
        let (sub, complete) = lines.sub_text(body, tail);
        if !complete && lines.skipped(body, tail).contains("\"system\"") {
            return Ok(None); // a system message in the middle: pinned for a manager
        }
        let Ok(conversation) = format::read(&sub, format) else { return Ok(None) };
        // Counted only for the terminal report: it reads every line.
        let total = || {
            if complete {
                conversation.messages.len() + usize::from(conversation.system.is_some())
            } else {
                lines.records(body)
            }
        };
        match finish(args, format, &conversation, &total, &config, counter, complete)? {
            Some(output) => return Ok(Some(output)),
            None if complete => return Ok(None),
            None => tail *= 4,
        }
    }
}

/// Trims `conversation` (all of it, or the leading lines and a tail when `complete` is
/// false) and renders the payload; `None` when the tail was too short or trim cannot answer.
fn finish(
    args: &TrimArgs,
    format: Format,
    conversation: &Conversation,
    total: &dyn Fn() -> usize,
    config: &Config,
    counter: &Counter,
    complete: bool,
) -> Result<Option<Output>, CliError> {
    let mut tools = Vec::with_capacity(conversation.tools.len());
    for tool in &conversation.tools {
        match tool_definition_json(tool) {
            Ok(json) => tools.push(json),
            Err(_) => return Ok(None),
        }
    }
    let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
    let calls: Vec<Vec<ctxwin_core::ToolCall<'_>>> = conversation
        .messages
        .iter()
        .map(|m| m.tool_calls.iter().map(ToolCall::as_core).collect())
        .collect();
    let mut messages: Vec<Message<'_>> = Vec::with_capacity(conversation.messages.len() + 1);
    if let Some(system) = &conversation.system {
        messages.push(Message::system(system));
    }
    for (message, calls) in conversation.messages.iter().zip(&calls) {
        messages.push(match &message.tool_call_id {
            Some(id) if message.role == Role::Tool => Message::tool_result(id, &message.content),
            _ => Message::new(message.role, &message.content).with_tool_calls(calls),
        });
    }
    let trimmed = match trim(&messages, &tools, config, counter) {
        Ok(trimmed) => trimmed,
        Err(TrimError::Refused { error: CoreError::PinnedOverBudget { .. }, index: None }) => {
            return Err(CliError::Budget(format!(
                "the system prompt and tool definitions alone need more than the budget of {} tokens; raise --budget",
                thousands(args.budget)
            )));
        }
        Err(TrimError::Refused { error: CoreError::ToolCallsPending { unanswered }, .. }) => {
            return Err(pending(unanswered));
        }
        Err(_) => return Ok(None),
    };
    let pinned = trimmed.pinned().end;
    let reached_start = trimmed.suffix().start <= pinned
        || config.lock_newest_user
            && trimmed.lone_user().is_none()
            && !messages.iter().skip(trimmed.suffix().start).any(|m| m.role == Role::User);
    if !complete && reached_start {
        return Ok(None);
    }
    let mut kept =
        Conversation { system: None, tools: conversation.tools.clone(), messages: Vec::new() };
    let source = |index: usize| -> &ChatMessage {
        let offset = usize::from(conversation.system.is_some());
        &conversation.messages[index - offset]
    };
    for item in trimmed.items() {
        kept.messages.push(match item {
            TrimmedItem::Message { index, content, calls } => {
                if index == 0 && conversation.system.is_some() {
                    ChatMessage::text(Role::System, content.to_string())
                } else {
                    let original = source(index);
                    let mut message = ChatMessage::text(original.role, content.to_string());
                    message.tool_calls = original
                        .tool_calls
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i >= 64 || calls & (1u64 << i) != 0)
                        .map(|(_, call)| call.clone())
                        .collect();
                    message.tool_call_id.clone_from(&original.tool_call_id);
                    message
                }
            }
            TrimmedItem::Aborted { call_id } => {
                let mut message =
                    ChatMessage::text(Role::Tool, ctxwin_core::manager::ABORTED_RESULT);
                message.tool_call_id = Some(call_id.to_owned());
                message
            }
        });
    }
    if std::io::stderr().is_terminal() {
        let _ = writeln!(
            std::io::stderr(),
            "ctxwin: kept {} of {} messages, {} / {} tokens ({} counter)",
            kept.messages.len(),
            total(),
            thousands(trimmed.tokens()),
            thousands(args.budget),
            counter.kind(),
        );
    }
    let format = args.format.unwrap_or_else(|| PayloadFormat::body_of(format));
    payload::render(&kept, format).map(Output::Raw).map(Some)
}

fn pending(unanswered: u8) -> CliError {
    CliError::BadInput(format!(
        "the conversation ends with {unanswered} tool call(s) without results, which a provider would refuse; add their results to the file or drop the calls"
    ))
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

    /// The stateless trim prints what the session path prints, byte for byte, for the
    /// README's main job and other budgets, formats and counters.
    #[test]
    fn the_stateless_trim_prints_what_a_session_prints() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agent-session.jsonl");
        let dir = std::env::temp_dir();
        let raw = |output: Output| match output {
            Output::Raw(text) => text,
            _ => panic!("not a payload"),
        };
        for (budget, format, tokenizer) in [
            (8_000, None, None),
            (300_000, None, None),
            (4_000, Some(PayloadFormat::Anthropic), None),
            (2_500, None, None),
            (8_000, None, Some("cl100k")),
        ] {
            let globals = state::Globals {
                dir: &dir,
                tokenizer,
                llm_url: None,
                embeddings: (None, None),
                command: "trim",
            };
            let args = TrimArgs {
                file: example.clone(),
                budget,
                format,
                input_format: None,
                config: None,
            };
            let counter = state::counter(tokenizer, None).unwrap();
            let direct =
                stateless_trim(&args, FileConfig::default().context, &counter, u64::MAX).unwrap();
            assert!(direct.is_some(), "the stateless path answers (budget {budget})");
            let stateless = raw(run_with(&globals, &args, true).unwrap());
            let session = raw(run_with(&globals, &args, false).unwrap());
            assert_eq!(stateless, session, "budget {budget}, {format:?}, {tokenizer:?}");
        }
    }

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
