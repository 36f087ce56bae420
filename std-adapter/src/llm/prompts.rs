//! Prompt texts, and conversations rendered compactly as prompt input.

use std::collections::HashMap;

use ctxwin_core::Role;

use crate::message::ChatMessage;

/// System prompt of [`LlmClient::summarize`](super::LlmClient::summarize).
pub const SUMMARY_SYSTEM_PROMPT: &str = "You compress conversation history for an AI agent. \
Preserve key decisions, action items, errors, file paths, commands, identifiers, numbers, \
and the current task state. Be concise. Output only the summary.";

/// System prompt of [`LlmClient::extract`](super::LlmClient::extract); `{keys}` is replaced
/// by the declared keys.
pub const EXTRACT_SYSTEM_PROMPT: &str = "You extract facts from text into a JSON object. \
Use only these keys: {keys}. Each value is a string, or null when the text does not tell \
(unknown or unchanged). Reply with the JSON object only, no other text.";

/// Longest tool-call argument text kept in a rendered call.
const MAX_ARGUMENT_CHARS: usize = 300;

/// The user prompt of a summary request.
pub(super) fn summary_request(
    previous: Option<&str>,
    transcript: &[String],
    max_words: u32,
) -> String {
    let mut prompt = String::new();
    if let Some(previous) = previous.map(str::trim).filter(|p| !p.is_empty()) {
        prompt.push_str("Summary so far:\n");
        prompt.push_str(previous);
        prompt.push_str("\n\nNew messages:\n");
    } else {
        prompt.push_str("Conversation:\n");
    }
    for line in transcript {
        prompt.push_str(line);
        prompt.push('\n');
    }
    prompt.push_str(&format!(
        "\nWrite the {}summary in at most {max_words} words.",
        if previous.is_some() { "updated " } else { "" }
    ));
    prompt
}

/// The system and user prompts of an extraction request.
pub(super) fn extract_request(schema: &[&str], current_json: &str, text: &str) -> (String, String) {
    let keys = schema.join(", ");
    let system = EXTRACT_SYSTEM_PROMPT.replace("{keys}", &keys);
    let user = format!("Current values: {current_json}\n\nText:\n{text}\n\nJSON:");
    (system, user)
}

/// Renders each message on its own line(s): `User: …`, `Assistant: …`,
/// `Assistant called read_file {"path":"a.rs"}`, `Tool read_file result: …`,
/// `Tool cargo error: …`.
pub(super) fn render_transcript(messages: &[ChatMessage]) -> Vec<String> {
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    let mut lines = Vec::with_capacity(messages.len());
    for message in messages {
        for call in &message.tool_calls {
            call_names.insert(call.id.as_str(), call.name.as_str());
        }
        lines.push(render_message(message, &call_names));
    }
    lines
}

fn render_message(message: &ChatMessage, call_names: &HashMap<&str, &str>) -> String {
    let content = message.content.trim();
    match message.role {
        Role::System => format!("System: {content}"),
        Role::User => format!("User: {content}"),
        Role::Assistant => {
            let mut parts: Vec<String> = Vec::new();
            if !content.is_empty() {
                parts.push(format!("Assistant: {content}"));
            }
            for call in &message.tool_calls {
                parts.push(format!(
                    "Assistant called {} {}",
                    call.name,
                    compact_json(&call.arguments)
                ));
            }
            if parts.is_empty() {
                parts.push("Assistant: (no text)".to_owned());
            }
            parts.join("\n")
        }
        Role::Tool => {
            let name = message
                .name
                .as_deref()
                .or_else(|| {
                    message.tool_call_id.as_deref().and_then(|id| call_names.get(id).copied())
                })
                .unwrap_or("tool");
            let outcome = if message.is_error { "error" } else { "result" };
            format!("Tool {name} {outcome}: {content}")
        }
    }
}

/// Arguments re-encoded without whitespace when they are JSON, and capped in length.
fn compact_json(arguments: &str) -> String {
    let compact = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|value| serde_json::to_string(&value).ok())
        .unwrap_or_else(|| arguments.trim().to_owned());
    if compact.chars().count() > MAX_ARGUMENT_CHARS {
        let mut cut: String = compact.chars().take(MAX_ARGUMENT_CHARS).collect();
        cut.push('…');
        cut
    } else {
        compact
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolCall;

    #[test]
    fn tool_calls_and_results_render_compactly() {
        let messages = vec![
            ChatMessage::text(Role::User, "  fix the build "),
            ChatMessage::assistant_calls(
                "Running tests.",
                vec![ToolCall::new("c1", "run", "{\n  \"cmd\": \"cargo test\"\n}")],
            ),
            ChatMessage { is_error: true, ..ChatMessage::tool_result("c1", "error[E0308]") },
            ChatMessage::assistant_calls("", vec![ToolCall::new("c2", "ls", "not json")]),
            ChatMessage::tool_result("c9", "orphan"),
        ];
        let lines = render_transcript(&messages);
        assert_eq!(
            lines,
            vec![
                "User: fix the build",
                "Assistant: Running tests.\nAssistant called run {\"cmd\":\"cargo test\"}",
                "Tool run error: error[E0308]",
                "Assistant called ls not json",
                "Tool tool result: orphan",
            ]
        );
    }

    #[test]
    fn long_arguments_are_capped() {
        let args = format!("{{\"text\":\"{}\"}}", "a".repeat(1000));
        let rendered = compact_json(&args);
        assert_eq!(rendered.chars().count(), MAX_ARGUMENT_CHARS + 1);
        assert!(rendered.ends_with('…'));
    }

    #[test]
    fn summary_request_mentions_the_previous_summary_and_the_word_limit() {
        let lines = vec!["User: hi".to_owned()];
        let first = summary_request(None, &lines, 50);
        assert!(first.starts_with("Conversation:\nUser: hi\n"));
        assert!(first.ends_with("Write the summary in at most 50 words."));
        let update = summary_request(Some("Earlier: chose SQLite."), &lines, 50);
        assert!(update.starts_with("Summary so far:\nEarlier: chose SQLite.\n\nNew messages:\n"));
        assert!(update.contains("updated summary"));
    }

    #[test]
    fn extract_prompt_lists_the_keys() {
        let (system, user) = extract_request(&["task", "branch"], "{}", "on main");
        assert!(system.contains("Use only these keys: task, branch."));
        assert!(user.contains("on main"));
    }
}
