//! Anthropic messages of a managed request body (see
//! [`ManagedBody`](crate::format::ManagedBody)): a turn with the blocks the payload keeps,
//! a message the core wrote, the `system` with the core's texts.

use ctxwin_core::Role;
use indexmap::IndexMap;
use serde_json::Value;
use serde_json::json;
use serde_json::value::RawValue;

use crate::format::managed::{KeptPart, raw_json, reduced_text_blocks};
use crate::message::ChatMessage;

/// The user turn a managed body opens with when its first kept turn is the assistant's: the
/// Messages API refuses any other first turn, and eviction often starts the window mid-turn.
///
/// Not [`OPENING_USER_TEXT`](crate::format::OPENING_USER_TEXT), which a conversation file's
/// reader recognizes and drops: this one is for the model, which should know that turns are
/// missing, and no reader sees it again.
///
/// ```
/// assert!(ctxwin_std::format::MANAGED_OPENING_TEXT.starts_with("[ctxwin: "));
/// ```
pub const MANAGED_OPENING_TEXT: &str =
    "[ctxwin: earlier turns of this conversation were moved out of the context window]";

/// The client's turn `raw` with the content blocks of the `kept` parts only (`blocks`: each
/// part's block indexes), a reduced tool result's `content` replaced by the core's text (a
/// string, or one text block when it held text blocks only; with anything else it is sent
/// whole). Blocks stay in the client's order and bytes. `None` when no block remains or `raw`
/// has no content array.
pub(in crate::format) fn kept_message(
    raw: &str,
    blocks: &[Vec<usize>],
    kept: &[KeptPart],
) -> Option<String> {
    let mut map: IndexMap<String, Box<RawValue>> = serde_json::from_str(raw).ok()?;
    let content: Vec<Box<RawValue>> = serde_json::from_str(map.get("content")?.get()).ok()?;
    let mut keep: Vec<Box<RawValue>> = Vec::with_capacity(content.len());
    for (index, block) in content.into_iter().enumerate() {
        let owner = kept.iter().find(|k| blocks.get(k.part).is_some_and(|b| b.contains(&index)));
        match owner {
            None => {}
            Some(KeptPart { reduced: Some(text), .. }) => keep.push(reduced_result(block, text)?),
            Some(KeptPart { reduced: None, .. }) => keep.push(block),
        }
    }
    if keep.is_empty() {
        return None;
    }
    map.insert("content".into(), raw_json(&keep));
    serde_json::to_string(&map).ok()
}

/// A tool-result block with the core's reduced `text` as its content, or the block as sent
/// when its content is neither a string nor text blocks. `None` when it is not JSON.
fn reduced_result(block: Box<RawValue>, text: &str) -> Option<Box<RawValue>> {
    let mut value: Value = serde_json::from_str(block.get()).ok()?;
    let reduced = match value.get("content") {
        Some(Value::String(_)) => Some(Value::from(text)),
        Some(content) => reduced_text_blocks(content, text),
        None => None,
    };
    match (reduced, value.as_object_mut()) {
        (Some(content), Some(object)) => {
            object.insert("content".into(), content);
            Some(raw_json(&value))
        }
        _ => Some(block),
    }
}

/// A message the core wrote itself: a tool result is a user turn with one `tool_result`
/// block; an assistant message stays the assistant's; anything else is user text.
pub(in crate::format) fn core_message(chat: &ChatMessage) -> String {
    match chat.role {
        Role::Tool => json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": chat.tool_call_id, "content": chat.content}]}),
        Role::Assistant => json!({"role": "assistant", "content": chat.content}),
        _ => json!({"role": "user", "content": chat.content}),
    }
    .to_string()
}

/// The client's `system` (raw JSON: a string, blocks, or absent) as blocks, with a text block
/// for each of `extra` (the core's texts) after them.
pub(in crate::format) fn system_with(system: Option<&str>, extra: &[String]) -> String {
    let text_block = |text: &str| raw_json(&json!({"type": "text", "text": text}));
    let mut blocks: Vec<Box<RawValue>> = match system {
        Some(raw) if raw.trim_start().starts_with('[') => {
            serde_json::from_str(raw).unwrap_or_default()
        }
        Some(raw) => match serde_json::from_str::<String>(raw) {
            Ok(text) => vec![text_block(&text)],
            Err(_) => Vec::new(),
        },
        None => Vec::new(),
    };
    blocks.extend(extra.iter().map(|text| text_block(text)));
    serde_json::to_string(&blocks).unwrap_or_else(|_| "[]".into())
}

/// The user turns `first` and `second` (raw JSON) as one, when `first` holds tool results
/// and `second` none (what a turn kept ahead of a gap in the history and the next user
/// request are): `first`'s fields, its content blocks and then `second`'s (a string content
/// is one text block). `None` otherwise, or when either is not a JSON object.
pub(in crate::format) fn joined_user_turns(first: &str, second: &str) -> Option<String> {
    let blocks = |map: &IndexMap<String, Box<RawValue>>| -> Option<Vec<Box<RawValue>>> {
        let content = map.get("content")?.get();
        match serde_json::from_str::<String>(content) {
            Ok(text) => Some(vec![raw_json(&json!({"type": "text", "text": text}))]),
            Err(_) => serde_json::from_str(content).ok(),
        }
    };
    let mut map: IndexMap<String, Box<RawValue>> = serde_json::from_str(first).ok()?;
    let other: IndexMap<String, Box<RawValue>> = serde_json::from_str(second).ok()?;
    let mut content = blocks(&map)?;
    let more = blocks(&other)?;
    if !content.iter().any(|b| is_tool_result(b)) || more.iter().any(|b| is_tool_result(b)) {
        return None;
    }
    content.extend(more);
    map.insert("content".into(), raw_json(&content));
    serde_json::to_string(&map).ok()
}

/// Whether content block `block` is a tool result.
fn is_tool_result(block: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
    }
    serde_json::from_str::<Kind<'_>>(block.get()).is_ok_and(|block| block.kind == "tool_result")
}

/// Whether the raw turn `message` is the assistant's.
pub(in crate::format) fn is_assistant_turn(message: &[u8]) -> bool {
    // Most turns never mention the word: only those are parsed.
    let mentions = message.windows(11).any(|w| w == b"\"assistant\"");
    mentions
        && serde_json::from_slice::<Value>(message).ok().and_then(|v| v.get("role").cloned())
            == Some(Value::from("assistant"))
}

/// The user turn holding [`MANAGED_OPENING_TEXT`].
pub(in crate::format) fn managed_opening_turn() -> String {
    format!(r#"{{"role":"user","content":{}}}"#, Value::from(MANAGED_OPENING_TEXT))
}

/// [`managed_opening_turn`] with a prompt-cache mark on its text.
pub(in crate::format) fn managed_opening_turn_marked() -> String {
    json!({"role": "user", "content": [
        {"type": "text", "text": MANAGED_OPENING_TEXT, "cache_control": {"type": "ephemeral"}}]})
    .to_string()
}

/// The raw turn `message` with a prompt-cache mark on its last content block: `None` when its
/// content is not an array of blocks, the last block is a thinking block (which cannot carry
/// one) or already has one.
pub(in crate::format) fn marked_turn(message: &[u8]) -> Option<String> {
    let mut map: IndexMap<String, Box<RawValue>> = serde_json::from_slice(message).ok()?;
    let mut content: Vec<Box<RawValue>> = serde_json::from_str(map.get("content")?.get()).ok()?;
    let last = content.last_mut()?;
    let mut block: serde_json::Map<String, Value> = serde_json::from_str(last.get()).ok()?;
    let kind = block.get("type").and_then(Value::as_str);
    if matches!(kind, Some("thinking" | "redacted_thinking") | None)
        || block.contains_key("cache_control")
    {
        return None;
    }
    block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    *last = raw_json(&block);
    map.insert("content".into(), raw_json(&content));
    serde_json::to_string(&map).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TURN: &str = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"long a"},{"type":"tool_result", "tool_use_id":"b","content":[{"type":"text","text":"long b"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]},{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}"#;

    fn parts() -> Vec<Vec<usize>> {
        vec![vec![0], vec![1], vec![2]]
    }

    #[test]
    fn kept_blocks_stay_byte_for_byte_and_reduced_results_are_rewritten() {
        let kept = [
            KeptPart { part: 0, reduced: Some("short a".into()) },
            KeptPart { part: 1, reduced: Some("short b".into()) },
            KeptPart { part: 2, reduced: None },
        ];
        assert_eq!(
            kept_message(TURN, &parts(), &kept).unwrap(),
            r#"{"role":"user","content":[{"content":"short a","tool_use_id":"a","type":"tool_result"},{"type":"tool_result", "tool_use_id":"b","content":[{"type":"text","text":"long b"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]},{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}"#
        );
    }

    #[test]
    fn evicted_parts_leave_and_an_empty_turn_is_left_out() {
        let kept = [KeptPart { part: 2, reduced: None }];
        assert_eq!(
            kept_message(TURN, &parts(), &kept).unwrap(),
            r#"{"role":"user","content":[{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}"#
        );
        assert_eq!(kept_message(TURN, &[], &kept), None);
        assert_eq!(kept_message(r#"{"role":"user","content":"x"}"#, &parts(), &kept), None);
    }

    #[test]
    fn a_user_turn_joins_the_one_before_it() {
        let results =
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}"#;
        assert_eq!(
            joined_user_turns(results, r#"{"role":"user","content":"go on"}"#).unwrap(),
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"},{"text":"go on","type":"text"}]}"#
        );
        // Results after text, or two text turns (the API's own concern), stay apart.
        assert_eq!(joined_user_turns(r#"{"role":"user","content":"a"}"#, TURN), None);
        let text = r#"{"role":"user","content":"b"}"#;
        assert_eq!(joined_user_turns(r#"{"role":"user","content":"a"}"#, text), None);
        assert_eq!(joined_user_turns(results, TURN), None);
        assert_eq!(joined_user_turns("[]", text), None);
    }

    #[test]
    fn core_messages_system_and_opening() {
        assert_eq!(
            core_message(&ChatMessage::tool_result("t9", "[aborted]")),
            r#"{"content":[{"content":"[aborted]","tool_use_id":"t9","type":"tool_result"}],"role":"user"}"#
        );
        assert_eq!(
            core_message(&ChatMessage::text(Role::System, "s")),
            r#"{"content":"s","role":"user"}"#
        );
        let cached = r#"[{"type":"text","text":"rules", "cache_control":{"type":"ephemeral"}}]"#;
        assert_eq!(
            system_with(Some(cached), &["recall".into()]),
            r#"[{"type":"text","text":"rules", "cache_control":{"type":"ephemeral"}},{"text":"recall","type":"text"}]"#
        );
        assert_eq!(system_with(Some(r#""rules""#), &[]), r#"[{"text":"rules","type":"text"}]"#);
        assert_eq!(system_with(None, &["x".into()]), r#"[{"text":"x","type":"text"}]"#);
        assert!(is_assistant_turn(br#"{"role": "assistant","content":"x"}"#));
        assert!(!is_assistant_turn(br#"{"role":"user","content":"\"assistant\""}"#));
        assert_eq!(
            managed_opening_turn(),
            r#"{"role":"user","content":"[ctxwin: earlier turns of this conversation were moved out of the context window]"}"#
        );
    }
}
