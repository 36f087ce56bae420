//! Guessing the format of an input from its shape and the fields only one provider uses.

use serde_json::{Map, Value};

use super::{Format, Provider};

/// How many records (JSONL lines or array elements) detection looks at.
const SCAN_LIMIT: usize = 200;

pub(super) fn detect(input: &str) -> Option<Format> {
    let text = input.trim_start_matches('\u{feff}').trim_start();
    match text.as_bytes().first()? {
        b'[' => {
            let messages: Vec<Value> = serde_json::from_str(text).ok()?;
            let provider = messages_provider(messages.iter().take(SCAN_LIMIT));
            Some(Format::json(provider.unwrap_or(Provider::OpenAi)))
        }
        b'{' => detect_object_or_lines(text),
        _ => None,
    }
}

fn detect_object_or_lines(text: &str) -> Option<Format> {
    let (first_line, rest) = text.split_once('\n').unwrap_or((text, ""));
    let first = serde_json::from_str::<Map<String, Value>>(first_line).ok();
    let more_lines = !rest.trim().is_empty();
    match first {
        Some(first) if more_lines || !first.contains_key("messages") => {
            let record_like =
                ["role", "tools", "system"].iter().any(|key| first.contains_key(*key));
            if !more_lines && !record_like {
                return None;
            }
            let header = header_provider(&first);
            let records = rest.lines().filter(|line| !line.trim().is_empty()).take(SCAN_LIMIT);
            let parsed: Vec<Value> =
                records.filter_map(|line| serde_json::from_str(line).ok()).collect();
            let provider = header.or_else(|| {
                messages_provider(std::iter::once(&Value::Object(first)).chain(&parsed))
            });
            Some(Format::jsonl(provider.unwrap_or(Provider::OpenAi)))
        }
        _ => {
            let body: Map<String, Value> = serde_json::from_str(text).ok()?;
            let messages = body.get("messages")?.as_array()?;
            let provider = header_provider(&body)
                .or_else(|| messages_provider(messages.iter().take(SCAN_LIMIT)));
            Some(Format::json(provider.unwrap_or(Provider::OpenAi)))
        }
    }
}

/// The provider a body or JSONL header's `system` and `tools` reveal.
fn header_provider(body: &Map<String, Value>) -> Option<Provider> {
    if body.contains_key("system") && !body.contains_key("role") {
        return Some(Provider::Anthropic);
    }
    let tools = body.get("tools")?.as_array()?;
    tools.iter().find_map(|tool| {
        let tool = tool.as_object()?;
        if tool.contains_key("input_schema") {
            Some(Provider::Anthropic)
        } else if tool.contains_key("function") {
            Some(Provider::OpenAi)
        } else {
            None
        }
    })
}

fn messages_provider<'v>(messages: impl IntoIterator<Item = &'v Value>) -> Option<Provider> {
    messages.into_iter().find_map(|message| message.as_object().and_then(message_provider))
}

/// The provider one message reveals, if any: OpenAI's roles and tool fields, or Anthropic's
/// content block types.
fn message_provider(message: &Map<String, Value>) -> Option<Provider> {
    if ["tool_calls", "tool_call_id", "name"].iter().any(|key| message.contains_key(*key)) {
        return Some(Provider::OpenAi);
    }
    if let Some(role) = message.get("role").and_then(Value::as_str)
        && matches!(role, "system" | "developer" | "tool")
    {
        return Some(Provider::OpenAi);
    }
    let blocks = message.get("content")?.as_array()?;
    blocks.iter().find_map(|block| match block.get("type")?.as_str()? {
        "tool_use" | "tool_result" | "image" | "document" | "thinking" | "redacted_thinking" => {
            Some(Provider::Anthropic)
        }
        "image_url" | "input_audio" | "file" | "refusal" => Some(Provider::OpenAi),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let user = r#"{"role":"user","content":"hi"}"#;
        assert_eq!(detect(&format!("[{user}]")), Some(Format::OpenAiJson));
        assert_eq!(detect(&format!("{{\"messages\":[{user}]}}")), Some(Format::OpenAiJson));
        assert_eq!(
            detect(&format!("{{\n  \"messages\": [\n{user}\n]\n}}")),
            Some(Format::OpenAiJson)
        );
        assert_eq!(detect(&format!("{user}\n{user}\n")), Some(Format::OpenAiJsonl));
        assert_eq!(detect(user), Some(Format::OpenAiJsonl));
        assert_eq!(detect("hello"), None);
        assert_eq!(detect("[1,"), None);
        assert_eq!(detect("{\"model\":\"x\"}"), None);
    }

    #[test]
    fn providers() {
        let anthropic_user =
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}"#;
        assert_eq!(detect(&format!("[{anthropic_user}]")), Some(Format::AnthropicJson));
        assert_eq!(
            detect(&format!("{{\"role\":\"user\",\"content\":\"q\"}}\n{anthropic_user}")),
            Some(Format::AnthropicJsonl)
        );
        assert_eq!(
            detect(r#"{"system":"s","messages":[{"role":"user","content":"q"}]}"#),
            Some(Format::AnthropicJson)
        );
        assert_eq!(
            detect("{\"system\":\"s\"}\n{\"role\":\"user\",\"content\":\"q\"}"),
            Some(Format::AnthropicJsonl)
        );
        assert_eq!(
            detect(r#"{"role":"tool","tool_call_id":"a","content":"x"}"#),
            Some(Format::OpenAiJsonl)
        );
        assert_eq!(
            detect(r#"{"messages":[],"tools":[{"name":"f","input_schema":{}}]}"#),
            Some(Format::AnthropicJson)
        );
    }
}
