//! OpenAI messages of a managed request body (see [`ManagedBody`](crate::format::ManagedBody)):
//! a kept message with its reduced content, a message the core wrote, a system text.

use ctxwin_core::Role;
use indexmap::IndexMap;
use serde_json::Value;
use serde_json::json;
use serde_json::value::RawValue;

use crate::format::managed::{KeptPart, raw_json, reduced_text_blocks};
use crate::message::ChatMessage;

/// The client's message `raw` with the core's reduced text as its `content`: a string
/// content becomes the text, an array of text parts one text part (its cache mark kept); any
/// other content stays (an image is sent whole). Every other field stays as sent. `None` when
/// `raw` is not a JSON object.
pub(in crate::format) fn kept_message(raw: &str, kept: &[KeptPart]) -> Option<String> {
    let mut map: IndexMap<String, Box<RawValue>> = serde_json::from_str(raw).ok()?;
    if let Some(KeptPart { reduced: Some(text), .. }) = kept.first()
        && let Some(content) = map.get("content")
    {
        if content.get().starts_with('"') {
            map.insert("content".into(), raw_json(&Value::from(text.as_str())));
        } else if let Ok(value) = serde_json::from_str::<Value>(content.get())
            && let Some(blocks) = reduced_text_blocks(&value, text)
        {
            map.insert("content".into(), raw_json(&blocks));
        }
    }
    serde_json::to_string(&map).ok()
}

/// A message the core wrote itself: a tool result answers its call, anything else is text.
pub(in crate::format) fn core_message(chat: &ChatMessage) -> String {
    match chat.role {
        Role::Tool => {
            json!({"role": "tool", "tool_call_id": chat.tool_call_id, "content": chat.content})
        }
        role => json!({"role": role.as_str(), "content": chat.content}),
    }
    .to_string()
}

/// A system message holding `text` (dynamic context, retrieved text, entities, the summary).
pub(in crate::format) fn system_message(text: &str) -> String {
    json!({"role": "system", "content": text}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduced(text: &str) -> [KeptPart; 1] {
        [KeptPart { part: 0, reduced: Some(text.into()) }]
    }

    #[test]
    fn only_the_content_is_rewritten() {
        let raw = r#"{"role":"tool", "tool_call_id":"c1","content":"a long log"}"#;
        assert_eq!(
            kept_message(raw, &reduced("short")).unwrap(),
            r#"{"role":"tool","tool_call_id":"c1","content":"short"}"#
        );
        let parts = r#"{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]}"#;
        assert_eq!(
            kept_message(parts, &reduced("short")).unwrap(),
            r#"{"role":"tool","tool_call_id":"c1","content":[{"cache_control":{"type":"ephemeral"},"text":"short","type":"text"}]}"#
        );
        let image = r#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}"#;
        assert_eq!(kept_message(image, &reduced("short")).unwrap(), image);
        assert_eq!(kept_message("[1]", &reduced("short")), None);
    }

    #[test]
    fn core_messages_and_system_texts() {
        assert_eq!(
            core_message(&ChatMessage::tool_result("c9", "[aborted]")),
            r#"{"content":"[aborted]","role":"tool","tool_call_id":"c9"}"#
        );
        assert_eq!(
            core_message(&ChatMessage::text(Role::System, "s")),
            r#"{"content":"s","role":"system"}"#
        );
        assert_eq!(system_message("recall"), r#"{"content":"recall","role":"system"}"#);
    }
}
