//! Analysis of Anthropic's top-level `system` and of one Anthropic message: an assistant turn
//! is one part; a user turn is one part per `tool_result` block plus one for the rest (see
//! [`analysis`](crate::format::analysis)).

use ctxwin_core::Role;
use serde_json::Value;

use crate::format::analysis::{Analyzed, Opaque, Part, image_label, push_text, str_field};
use crate::format::cost::{
    anthropic_image_tokens, base64_len, decode_prefix, document_tokens, image_size, json_tokens,
    text_tokens,
};
use crate::format::fingerprint::{Normalized, canonical};
use crate::message::{ChatMessage, ToolCall};

/// Anthropic's top-level `system`: a string or blocks (text read, any other block opaque).
/// Its part is pinned: a top-level system prompt leads the conversation.
pub(in crate::format) fn analyze_system(value: &Value) -> Result<Analyzed, String> {
    let mut text = String::new();
    let mut normalized = Normalized::default();
    let mut opaque = Vec::new();
    match value {
        Value::String(s) => {
            text.push_str(s);
            normalized.text(s);
        }
        Value::Array(blocks) => {
            for block in blocks {
                match str_field(block, "text") {
                    Some(t) if str_field(block, "type") == Some("text") => {
                        push_text(&mut text, t);
                        normalized.text(t);
                    }
                    _ => {
                        opaque.push(Opaque {
                            label: str_field(block, "type").unwrap_or("block").to_string(),
                            tokens: json_tokens(block),
                        });
                        normalized.opaque(block);
                    }
                }
            }
        }
        _ => return Err("must be a string or an array of blocks".into()),
    }
    let fp = normalized.fingerprint_and_form("system");
    let mut analyzed =
        Analyzed::single(fp, "system".into(), ChatMessage::text(Role::System, text), opaque);
    for part in &mut analyzed.parts {
        part.pinned = true;
    }
    Ok(analyzed)
}

/// The part of a turn that is not a tool result: its text (thinking included), tool calls and
/// opaque blocks, with their block indexes.
#[derive(Default)]
struct Rest {
    text: String,
    opaque: Vec<Opaque>,
    blocks: Vec<usize>,
    calls: Vec<ToolCall>,
}

/// One Anthropic message, as sent in a request or built from a response.
pub(in crate::format) fn analyze_message(value: &Value) -> Result<Analyzed, String> {
    if !value.is_object() {
        return Err("not a JSON object".into());
    }
    let role_name = str_field(value, "role").ok_or("missing `role`")?.to_string();
    let role = match role_name.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => return Err(format!("unknown role `{other}` (user or assistant)")),
    };
    let blocks = match value.get("content") {
        Some(Value::String(s)) => {
            let mut normalized = Normalized::default();
            if !s.is_empty() {
                normalized.text(s);
            }
            let fp = normalized.fingerprint_and_form(&role_name);
            return Ok(Analyzed::single(fp, role_name, ChatMessage::text(role, s.clone()), vec![]));
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return Err("`content` must be a string or an array of blocks".into()),
    };
    let mut normalized = Normalized::default();
    let mut parts = Vec::new();
    let mut rest = Rest::default();
    for (i, block) in blocks.iter().enumerate() {
        let kind = str_field(block, "type").ok_or_else(|| format!("content[{i}] has no `type`"))?;
        match kind {
            "tool_result" if role == Role::User => {
                parts.push(tool_result(i, block)?);
                normalized.result_block(block);
            }
            _ => rest_block(role, i, kind, block, &mut rest, &mut normalized)?,
        }
    }
    if !rest.blocks.is_empty() || parts.is_empty() {
        let mut chat = ChatMessage::text(role, rest.text);
        chat.tool_calls = rest.calls;
        parts.push(Part { chat, opaque: rest.opaque, blocks: rest.blocks, pinned: false });
    }
    let (fp, form) = normalized.fingerprint_and_form(&role_name);
    Ok(Analyzed { fp, form, parts, role: role_name })
}

/// Block `i` of a turn, other than a user's tool result, into the rest of the turn.
fn rest_block(
    role: Role,
    i: usize,
    kind: &str,
    block: &Value,
    rest: &mut Rest,
    normalized: &mut Normalized,
) -> Result<(), String> {
    match kind {
        "text" => {
            let t = str_field(block, "text").unwrap_or("");
            push_text(&mut rest.text, t);
            if !t.is_empty() {
                normalized.text(t);
            }
        }
        "thinking" => {
            push_text(&mut rest.text, str_field(block, "thinking").unwrap_or(""));
            normalized.opaque(block);
        }
        "tool_use" if role == Role::Assistant => {
            let id = str_field(block, "id")
                .ok_or_else(|| format!("content[{i}]: tool_use without `id`"))?;
            let name = str_field(block, "name").unwrap_or("");
            let input = block.get("input").map_or_else(|| "{}".to_string(), canonical);
            normalized.call(id, name, &input);
            rest.calls.push(ToolCall::new(id, name, input));
        }
        _ => {
            rest.opaque.push(opaque_block(block));
            normalized.opaque(block);
        }
    }
    rest.blocks.push(i);
    Ok(())
}

/// A user turn's `tool_result` block `i` as a tool message of its own.
fn tool_result(i: usize, block: &Value) -> Result<Part, String> {
    let id = str_field(block, "tool_use_id")
        .ok_or_else(|| format!("content[{i}]: tool_result without `tool_use_id`"))?;
    let mut text = String::new();
    let mut opaque = Vec::new();
    match block.get("content") {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(inner)) => {
            for item in inner {
                match str_field(item, "type") {
                    Some("text") => push_text(&mut text, str_field(item, "text").unwrap_or("")),
                    _ => opaque.push(opaque_block(item)),
                }
            }
        }
        _ => {}
    }
    let mut chat = ChatMessage::tool_result(id, text);
    chat.is_error = block.get("is_error").and_then(Value::as_bool).unwrap_or(false);
    Ok(Part { chat, opaque, blocks: vec![i], pinned: false })
}

/// A block other than text, tool use or tool result: an image, a document, redacted
/// thinking, a server tool's block, or a kind this reader does not know (costed by its JSON
/// length).
fn opaque_block(block: &Value) -> Opaque {
    let kind = str_field(block, "type").unwrap_or("unknown");
    let source = block.get("source");
    let base64_data = || {
        source.filter(|s| str_field(s, "type") == Some("base64")).and_then(|s| str_field(s, "data"))
    };
    match kind {
        "image" => {
            let dims = base64_data().and_then(|d| image_size(&decode_prefix(d)));
            let media = source.and_then(|s| str_field(s, "media_type")).unwrap_or("image");
            Opaque { label: image_label(media, dims), tokens: anthropic_image_tokens(dims) }
        }
        "document" => {
            let tokens = match source.and_then(|s| str_field(s, "type")) {
                Some("text") => {
                    text_tokens(source.and_then(|s| str_field(s, "data")).unwrap_or(""))
                }
                Some("base64") => document_tokens(base64_data().map_or(0, |d| base64_len(d.len()))),
                _ => json_tokens(block).max(document_tokens(0)),
            };
            Opaque { label: "document".into(), tokens }
        }
        "redacted_thinking" => Opaque {
            label: "redacted thinking".into(),
            tokens: text_tokens(str_field(block, "data").unwrap_or("")),
        },
        other => Opaque { label: other.to_string(), tokens: json_tokens(block) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyze(json: &str) -> Analyzed {
        analyze_message(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn a_user_turn_splits_its_tool_results() {
        let marked = analyze(
            r#"{"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":"ok"},
                {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"two"}],"is_error":true},
                {"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}"#,
        );
        assert_eq!(marked.parts.len(), 3);
        assert_eq!(marked.parts[0].chat.tool_call_id.as_deref(), Some("t1"));
        assert!(marked.parts[1].chat.is_error);
        assert_eq!(marked.parts[2].blocks, vec![2]);
        let unmarked = analyze(
            r#"{"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":"ok"},
                {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"two"}],"is_error":true},
                {"type":"text","text":"go on"}]}"#,
        );
        assert_eq!(unmarked.fp, marked.fp, "cache_control moves freely");
    }

    #[test]
    fn blocks_it_does_not_read_are_costed() {
        let turn = analyze(
            r#"{"role":"user","content":[
                {"type":"document","source":{"type":"text","media_type":"text/plain","data":"The sky is blue."}},
                {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK"}},
                {"type":"image","source":{"type":"url","url":"https://x/y.png"}},
                {"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix"},
                {"type":"web_search_tool_result","tool_use_id":"s1","content":[]}]}"#,
        );
        let costs: Vec<(&str, u32)> =
            turn.parts[0].opaque.iter().map(|o| (o.label.as_str(), o.tokens)).collect();
        assert_eq!(
            costs,
            [
                ("document", 4),
                ("document", 256),
                ("image", 1_600),
                ("redacted thinking", 4),
                ("web_search_tool_result", 16),
            ]
        );
        assert_eq!(turn.parts[0].blocks, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_system_of_blocks_is_pinned_and_keeps_its_other_blocks_opaque() {
        let value: Value = serde_json::from_str(
            r#"[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}},{"type":"image","source":{}}]"#,
        )
        .unwrap();
        let system = analyze_system(&value).unwrap();
        assert_eq!(system.parts[0].chat.content, "a\nb");
        assert!(system.parts[0].pinned);
        assert_eq!(system.parts[0].opaque[0].label, "image");
        assert!(analyze_system(&Value::from(3)).is_err());
    }

    #[test]
    fn malformed_turns_say_what_is_wrong() {
        for (json, reason) in [
            (r#"{"role":"system","content":"x"}"#, "unknown role `system` (user or assistant)"),
            (r#"{"role":"user"}"#, "`content` must be a string or an array of blocks"),
            (r#"{"role":"user","content":[{}]}"#, "content[0] has no `type`"),
            (
                r#"{"role":"user","content":[{"type":"tool_result"}]}"#,
                "content[0]: tool_result without `tool_use_id`",
            ),
            (
                r#"{"role":"assistant","content":[{"type":"tool_use"}]}"#,
                "content[0]: tool_use without `id`",
            ),
        ] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(analyze_message(&value).unwrap_err(), reason, "{json}");
        }
    }
}
