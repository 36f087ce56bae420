//! `ctxwin add <role> <content>`: one message into the context.

use ctxwin_core::Role;
use serde_json::json;

use crate::args::AddArgs;
use crate::error::CliError;
use crate::input;
use crate::output::{Output, thousands};
use crate::state::Workspace;
use ctxwin_std::ChatMessage;
use ctxwin_std::session::{PushOptions, Session};

pub(crate) fn run(
    session: &mut Session,
    _: &mut Workspace,
    args: &AddArgs,
    message: &ChatMessage,
) -> Result<Output, CliError> {
    let options = PushOptions {
        level: args.level.map(Into::into),
        important: args.important,
        ..PushOptions::default()
    };
    let report = session.push_with(message, options)?;
    let manager = session.manager();
    let stored = manager.get(report.id);
    let tokens = stored.map(|m| m.tokens());
    let level = stored.map(|m| m.level().as_str());
    let (used, budget) = (manager.used(), manager.budget());

    let mut text = format!(
        "stored message {} ({}, {} tokens{}{})\n",
        report.id,
        message.role.as_str(),
        tokens.map_or_else(|| "?".into(), thousands),
        level.map_or_else(String::new, |level| format!(", {level} level")),
        if report.unit == report.id { String::new() } else { format!(", unit {}", report.unit) },
    );
    if let Some(reduced) = report.reduced {
        text.push_str(&format!(
            "reduced {} → {} tokens (the archive keeps the full text)\n",
            thousands(reduced.original_tokens),
            thousands(reduced.stored_tokens)
        ));
    }
    if !report.evicted_units.is_empty() {
        text.push_str(&format!(
            "evicted {} units ({} messages) to the archive\n",
            report.evicted_units.len(),
            report.evicted_messages
        ));
    }
    if !report.summaries.is_empty() {
        let ids: Vec<String> = report.summaries.iter().map(u64::to_string).collect();
        text.push_str(&format!("summaries updated: {}\n", ids.join(", ")));
    }
    text.push_str(&format!("context {} / {} tokens\n", thousands(used), thousands(budget)));
    let json = json!({
        "id": report.id,
        "unit": report.unit,
        "role": message.role.as_str(),
        "level": level,
        "tokens": tokens,
        "reduced": report.reduced,
        "evicted_units": report.evicted_units,
        "evicted_messages": report.evicted_messages,
        "summaries": report.summaries,
        "used": used,
        "budget": budget,
    });
    Ok(Output::report(text, json))
}

/// The message the arguments describe (`@FILE` and `-` read, at most `limit` bytes).
pub(crate) fn message(args: &AddArgs, limit: u64) -> Result<ChatMessage, CliError> {
    let role = Role::from(args.role);
    let mut message = ChatMessage::text(role, input::text_argument(&args.content, limit)?);
    if let Some(json) = &args.tool_calls {
        if role != Role::Assistant {
            return Err(CliError::BadInput(
                "--tool-calls goes on assistant messages: `ctxwin add assistant <text> --tool-calls <json>`".into(),
            ));
        }
        message.tool_calls = input::tool_calls(json)?;
    }
    if let Some(id) = &args.tool_call_id {
        if role != Role::Tool {
            return Err(CliError::BadInput(
                "--tool-call-id goes on tool results: `ctxwin add tool <output> --tool-call-id <id>`".into(),
            ));
        }
        message.tool_call_id = Some(id.clone());
    }
    Ok(message)
}
