//! Analysis of one OpenAI chat message: its text, tool calls, opaque content parts and
//! fingerprint (see [`analysis`](crate::format::analysis)).

use ctxwin_core::Role;
use serde_json::Value;

use crate::format::analysis::{Analyzed, Opaque, image_label, push_text, role_of, str_field};
use crate::format::cost::{
    audio_tokens, base64_len, data_url_bytes, document_tokens, image_size, json_tokens,
    openai_image_tokens,
};
use crate::format::fingerprint::Normalized;
use crate::message::{ChatMessage, ToolCall};

/// Text, opaque parts and their normalized blocks, as read from a message's `content`.
#[derive(Default)]
struct Content {
    text: String,
    opaque: Vec<Opaque>,
    normalized: Normalized,
}

/// One OpenAI chat message, as sent in a request or built from a response.
pub(in crate::format) fn analyze_message(value: &Value) -> Result<Analyzed, String> {
    if !value.is_object() {
        return Err("not a JSON object".into());
    }
    let role_name = str_field(value, "role").ok_or("missing `role`")?.to_string();
    let role = role_of(&role_name)?;
    let mut content = read_content(value.get("content"))?;
    if let Some(refusal) = str_field(value, "refusal").filter(|r| !r.is_empty()) {
        push_text(&mut content.text, refusal);
        content.normalized.text(refusal);
    }
    let calls = read_calls(value, &mut content.normalized)?;
    let tool_call_id = str_field(value, "tool_call_id").map(str::to_string);
    if let Some(id) = &tool_call_id {
        content.normalized.result_id(id);
    }
    if role == Role::Tool && tool_call_id.is_none() {
        return Err("a `tool` message needs `tool_call_id`".into());
    }
    let mut chat = ChatMessage::text(role, content.text);
    chat.tool_calls = calls;
    chat.tool_call_id = tool_call_id;
    chat.name = str_field(value, "name").map(str::to_string);
    let fp = content.normalized.fingerprint_and_form(&role_name);
    Ok(Analyzed::single(fp, role_name, chat, content.opaque))
}

/// `content`: absent, `null`, a string, or an array of parts (text, refusal and input text
/// read; any other part opaque).
fn read_content(content: Option<&Value>) -> Result<Content, String> {
    let mut out = Content::default();
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.text.push_str(s);
            if !s.is_empty() {
                out.normalized.text(s);
            }
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                let kind = str_field(part, "type").unwrap_or("");
                match kind {
                    "text" | "refusal" | "input_text" => {
                        let t =
                            str_field(part, kind).or_else(|| str_field(part, "text")).unwrap_or("");
                        push_text(&mut out.text, t);
                        if !t.is_empty() {
                            out.normalized.text(t);
                        }
                    }
                    _ => {
                        out.opaque.push(opaque_part(part));
                        out.normalized.opaque(part);
                    }
                }
            }
        }
        Some(_) => return Err("`content` must be a string, an array or null".into()),
    }
    Ok(out)
}

/// `tool_calls`, each with its arguments as the JSON text sent (a non-string value as its
/// JSON).
fn read_calls(value: &Value, normalized: &mut Normalized) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    let Some(list) = value.get("tool_calls").filter(|v| !v.is_null()) else { return Ok(calls) };
    let list = list.as_array().ok_or("`tool_calls` must be an array")?;
    for (i, call) in list.iter().enumerate() {
        let id = str_field(call, "id").ok_or_else(|| format!("tool_calls[{i}] has no `id`"))?;
        let function =
            call.get("function").ok_or_else(|| format!("tool_calls[{i}] has no `function`"))?;
        let name = str_field(function, "name").unwrap_or("");
        let arguments = match function.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        normalized.call(id, name, &arguments);
        calls.push(ToolCall::new(id, name, arguments));
    }
    Ok(calls)
}

/// A content part other than text: an image, audio, a file, or a kind this reader does not
/// know (costed by its JSON length).
fn opaque_part(part: &Value) -> Opaque {
    let kind = str_field(part, "type").unwrap_or("unknown");
    match kind {
        "image_url" => {
            let image = part.get("image_url");
            let url = image.and_then(|i| str_field(i, "url")).unwrap_or("");
            let detail = image.and_then(|i| str_field(i, "detail")).unwrap_or("auto");
            let dims = data_url_bytes(url).and_then(|(_, bytes)| image_size(&bytes));
            let tokens = if detail == "low" { 85 } else { openai_image_tokens(dims) };
            Opaque { label: image_label("image", dims), tokens }
        }
        "input_audio" => {
            let bytes = part
                .get("input_audio")
                .and_then(|a| str_field(a, "data"))
                .map_or(0, |d| base64_len(d.len()));
            Opaque { label: format!("audio {bytes} bytes"), tokens: audio_tokens(bytes) }
        }
        "file" => {
            let file = part.get("file");
            let bytes = file
                .and_then(|f| str_field(f, "file_data"))
                .map(|d| data_url_bytes(d).map_or(base64_len(d.len()), |(_, b)| b.len()))
                .unwrap_or(0);
            let name = file.and_then(|f| str_field(f, "filename")).unwrap_or("file");
            Opaque { label: format!("file {name} {bytes} bytes"), tokens: document_tokens(bytes) }
        }
        other => Opaque { label: other.to_string(), tokens: json_tokens(part) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyze(json: &str) -> Analyzed {
        analyze_message(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn echo_of_a_response_has_the_same_fingerprint() {
        let response = analyze(
            r#"{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"path\": \".\"}"}}]}"#,
        );
        let echo = analyze(
            r#"{"tool_calls":[{"function":{"arguments":"{\"path\":\".\"}","name":"ls"},"id":"c1","type":"function"}],"role":"assistant"}"#,
        );
        assert_eq!(response.fp, echo.fp);
        assert_ne!(analyze(r#"{"role":"assistant","content":"hi"}"#).fp, echo.fp);
    }

    #[test]
    fn parts_read_text_and_cost_the_rest() {
        let message = analyze(
            r#"{"role":"user","name":"ann","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}},{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZF","format":"wav"}},{"type":"file","file":{"filename":"a.pdf","file_data":"JVBERi0xLjQK"}},{"type":"refusal","refusal":"no"}]}"#,
        );
        let part = &message.parts[0];
        assert_eq!(part.chat.content, "look\nno");
        assert_eq!(part.chat.name.as_deref(), Some("ann"));
        let labels: Vec<(&str, u32)> =
            part.opaque.iter().map(|o| (o.label.as_str(), o.tokens)).collect();
        assert_eq!(labels, [("image", 85), ("audio 12 bytes", 32), ("file a.pdf 9 bytes", 256)]);
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        for (json, reason) in [
            ("[]", "not a JSON object"),
            (r#"{"content":"x"}"#, "missing `role`"),
            (r#"{"role":"user","content":1}"#, "`content` must be a string, an array or null"),
            (r#"{"role":"assistant","tool_calls":{}}"#, "`tool_calls` must be an array"),
            (r#"{"role":"assistant","tool_calls":[{}]}"#, "tool_calls[0] has no `id`"),
            (r#"{"role":"tool","content":"x"}"#, "a `tool` message needs `tool_call_id`"),
        ] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(analyze_message(&value).unwrap_err(), reason, "{json}");
        }
    }
}
