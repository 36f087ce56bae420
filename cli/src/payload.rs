//! Printing a composed payload: a provider request body, JSONL, or a readable transcript.

use super::args::PayloadFormat;
use super::error::CliError;
use ctxwin_std::format;
use ctxwin_std::{ChatMessage, Conversation};

/// `conversation` as `format` prints it.
pub(crate) fn render(
    conversation: &Conversation,
    format: PayloadFormat,
) -> Result<String, CliError> {
    match format.provider() {
        Some(provider) => format::write(conversation, provider).map_err(|e| {
            CliError::BadInput(format!(
                "the payload cannot be written as {provider}: {e}; try another --format"
            ))
        }),
        None => Ok(transcript(conversation)),
    }
}

/// A transcript for people: the tools offered, then each message under a `[role]` line, tool
/// calls as `→ name(id) arguments`.
pub(crate) fn transcript(conversation: &Conversation) -> String {
    let mut out = String::new();
    if !conversation.tools.is_empty() {
        let names: Vec<&str> = conversation.tools.iter().map(|t| t.name.as_str()).collect();
        out.push_str(&format!("[tools] {}\n\n", names.join(", ")));
    }
    if let Some(system) = &conversation.system {
        out.push_str(&format!("[system]\n{}\n\n", system.trim_end()));
    }
    for message in &conversation.messages {
        out.push_str(&heading(message));
        out.push('\n');
        if !message.content.is_empty() {
            out.push_str(message.content.trim_end());
            out.push('\n');
        }
        for call in &message.tool_calls {
            out.push_str(&format!("→ {}({}) {}\n", call.name, call.id, call.arguments));
        }
        out.push('\n');
    }
    out
}

fn heading(message: &ChatMessage) -> String {
    match &message.tool_call_id {
        Some(id) => format!("[{} {id}]", message.role.as_str()),
        None => format!("[{}]", message.role.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxwin_std::{ToolCall, ToolDefinition, core::Role};

    fn conversation() -> Conversation {
        Conversation {
            system: None,
            tools: vec![ToolDefinition {
                name: "ls".into(),
                description: String::new(),
                parameters: "{\"type\":\"object\"}".into(),
            }],
            messages: vec![
                ChatMessage::text(Role::System, "Be terse."),
                ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", "{}")]),
                ChatMessage::tool_result("c1", "Cargo.toml"),
            ],
        }
    }

    #[test]
    fn transcripts_show_roles_calls_and_results() {
        assert_eq!(
            transcript(&conversation()),
            "[tools] ls\n\n[system]\nBe terse.\n\n[assistant]\n→ ls(c1) {}\n\n[tool c1]\nCargo.toml\n\n"
        );
    }

    #[test]
    fn provider_formats_are_bodies() {
        let body = render(&conversation(), PayloadFormat::Openai).unwrap();
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["messages"][2]["tool_call_id"], "c1");
        let anthropic = render(&conversation(), PayloadFormat::Anthropic).unwrap();
        assert!(anthropic.contains("\"tool_use_id\": \"c1\""));
    }
}
