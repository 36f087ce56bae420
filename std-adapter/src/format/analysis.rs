//! Reading a request's messages into what a session stores: [`ChatMessage`]-level parts with
//! the text the counter reads, a label and an estimated cost for each block it cannot read,
//! and a fingerprint.
//!
//! Unlike [`read`](super::read), which builds a [`Conversation`](crate::Conversation) and
//! refuses what a conversation cannot hold, analysis refuses nothing a provider accepts: a
//! block it does not interpret (an image, a document, audio, a thinking block with its
//! signature, redacted thinking, a server tool's call and result, citations, cache marks) is
//! left where it is in the message's raw JSON, byte for byte, and the part that stands for it
//! names its content-block indexes, so a writer can send it again untouched
//! ([`ManagedBody`](super::ManagedBody)).

use ctxwin_core::Role;
use serde_json::Value;

use super::request::{BadRequest, Request};
use super::{Provider, anthropic, openai};
use crate::message::ChatMessage;

/// One block the counter cannot read (an image, a document, audio, a redacted thinking block,
/// a server tool's block), with its estimated token cost.
///
/// ```
/// let image = ctxwin_std::format::Opaque { label: "image/png 800x600".into(), tokens: 640 };
/// assert_eq!(image.tokens, 640);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opaque {
    /// What it is, for the archive's text (`image/png 800x600`).
    pub label: String,
    /// Estimated tokens.
    pub tokens: u32,
}

/// What a session stores for one message, or for one tool result of an Anthropic user message
/// (which carries its results as blocks).
///
/// ```
/// use ctxwin_std::format::{analyze_message, Provider};
/// let message = serde_json::json!({"role": "user", "content": [
///     {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
///     {"type": "text", "text": "go on"}]});
/// let analyzed = analyze_message(Provider::Anthropic, &message).unwrap();
/// assert_eq!(analyzed.parts[0].chat.tool_call_id.as_deref(), Some("t1"));
/// assert_eq!(analyzed.parts[1].blocks, [1]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// The text rendering (role, text, tool calls) a session counts and stores.
    pub chat: ChatMessage,
    /// Opaque content in it; a session's copy stands in for their tokens.
    pub opaque: Vec<Opaque>,
    /// Anthropic: the indexes of the content blocks this part stands for (empty: all).
    pub blocks: Vec<usize>,
    /// The part is a leading system prompt (kept permanently) rather than a mid-history one.
    pub pinned: bool,
}

/// One incoming message (or Anthropic's `system`), read.
///
/// ```
/// use ctxwin_std::format::{analyze_message, Provider};
/// let sent = serde_json::json!({"role": "assistant", "content": "Done.", "refusal": null});
/// let echo = serde_json::json!({"content": "Done.", "role": "assistant"});
/// let a = analyze_message(Provider::OpenAi, &sent).unwrap();
/// assert_eq!(a.fp, analyze_message(Provider::OpenAi, &echo).unwrap().fp);
/// assert_eq!((a.role.as_str(), a.parts.len()), ("assistant", 1));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Analyzed {
    /// Semantic fingerprint: equal for the same message however it is serialized
    /// ([`fingerprint`](super::fingerprint)).
    pub fp: u64,
    /// The canonical form `fp` hashes (what a conversation's full-width content key hashes).
    pub form: String,
    /// What a session stores for it (one part, or several for Anthropic tool results).
    pub parts: Vec<Part>,
    /// The message's role as sent.
    pub role: String,
}

impl Analyzed {
    /// A message of one part.
    pub(super) fn single(
        (fp, form): (u64, String),
        role: String,
        chat: ChatMessage,
        opaque: Vec<Opaque>,
    ) -> Self {
        let part = Part { chat, opaque, blocks: Vec::new(), pinned: false };
        Self { fp, form, parts: vec![part], role }
    }
}

/// Reads item `i` of `request` (Anthropic's `system` or a message). `pinned` is left false for
/// messages: whether a system message leads the conversation is the conversation's to say.
///
/// # Errors
/// [`BadRequest`] naming the message that is not an object, has no role, or has a content of
/// the wrong shape.
///
/// ```
/// use ctxwin_std::format::{analyze_item, Provider, Request};
/// let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"robot"}]}"#;
/// let request = Request::parse(Provider::OpenAi, body)?;
/// assert_eq!(analyze_item(Provider::OpenAi, &request, 0)?.parts[0].chat.content, "hi");
/// let error = analyze_item(Provider::OpenAi, &request, 1).unwrap_err();
/// assert_eq!(error.to_string(), "messages[1]: unknown role `robot`");
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
pub fn analyze_item(
    provider: Provider,
    request: &Request,
    i: usize,
) -> Result<Analyzed, BadRequest> {
    let raw = request.items.get(i).ok_or_else(|| BadRequest(format!("no item {i}")))?;
    let value: Value =
        serde_json::from_str(raw.get()).map_err(|e| BadRequest(format!("item {i}: {e}")))?;
    if request.has_system_item && i == 0 {
        return anthropic::analyze_system(&value).map_err(|e| BadRequest(format!("`system`: {e}")));
    }
    analyze_message(provider, &value)
        .map_err(|e| BadRequest(format!("messages[{}]: {e}", request.message_index(i))))
}

/// Reads every item of `request`.
///
/// # Errors
/// As [`analyze_item`].
///
/// ```
/// use ctxwin_std::format::{analyze, Provider, Request};
/// let body = br#"{"model":"m","system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#;
/// let analyzed = analyze(Provider::Anthropic, &Request::parse(Provider::Anthropic, body)?)?;
/// assert_eq!(analyzed[0].role, "system");
/// assert!(analyzed[0].parts[0].pinned);
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
pub fn analyze(provider: Provider, request: &Request) -> Result<Vec<Analyzed>, BadRequest> {
    (0..request.items.len()).map(|i| analyze_item(provider, request, i)).collect()
}

/// Reads one message of `provider`'s layout: a request's message, or an answer built from a
/// response (which then has the fingerprint the client's echo of it will have).
///
/// # Errors
/// Why the message does not read (not an object, no role, content of the wrong shape).
///
/// ```
/// use ctxwin_std::format::{analyze_message, Provider};
/// let turn = serde_json::json!({"role": "assistant", "content": [
///     {"type": "thinking", "thinking": "Check the log.", "signature": "EqQB"},
///     {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "log"}}]});
/// let analyzed = analyze_message(Provider::Anthropic, &turn).unwrap();
/// let part = &analyzed.parts[0];
/// assert_eq!(part.chat.content, "Check the log.");
/// assert_eq!(part.chat.tool_calls[0].arguments, r#"{"path":"log"}"#);
/// assert_eq!(part.blocks, [0, 1]);
/// ```
pub fn analyze_message(provider: Provider, message: &Value) -> Result<Analyzed, String> {
    match provider {
        Provider::OpenAi => openai::analyze_message(message),
        Provider::Anthropic => anthropic::analyze_message(message),
    }
}

/// The string member `key` of `value`, if it is one.
pub(super) fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// Appends `part` to `text` on a line of its own; empty parts add nothing.
pub(super) fn push_text(text: &mut String, part: &str) {
    if part.is_empty() {
        return;
    }
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(part);
}

/// An image's label: its kind, with its size when the header gave one (`image/png 800x600`).
pub(super) fn image_label(kind: &str, dims: Option<(u32, u32)>) -> String {
    match dims {
        Some((w, h)) => format!("{kind} {w}x{h}"),
        None => kind.to_string(),
    }
}

/// The role of a message a provider sent: OpenAI's names, `developer` as system and the
/// legacy `function` as user.
pub(super) fn role_of(role: &str) -> Result<Role, String> {
    Ok(match role {
        "system" | "developer" => Role::System,
        "user" | "function" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => return Err(format!("unknown role `{other}`")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_out_of_range_and_unreadable_are_refused() {
        let request = Request::parse(Provider::OpenAi, br#"{"model":"m","messages":[1]}"#).unwrap();
        let error = analyze_item(Provider::OpenAi, &request, 0).unwrap_err();
        assert_eq!(error.0, "messages[0]: not a JSON object");
        assert_eq!(analyze_item(Provider::OpenAi, &request, 5).unwrap_err().0, "no item 5");
        let request =
            Request::parse(Provider::Anthropic, br#"{"model":"m","system":3,"messages":[]}"#)
                .unwrap();
        let error = analyze(Provider::Anthropic, &request).unwrap_err();
        assert_eq!(error.0, "`system`: must be a string or an array of blocks");
    }

    #[test]
    fn text_joins_on_lines_and_roles_read_as_openai_names() {
        let mut text = String::new();
        for part in ["a", "", "b"] {
            push_text(&mut text, part);
        }
        assert_eq!(text, "a\nb");
        assert_eq!(role_of("developer"), Ok(Role::System));
        assert_eq!(role_of("function"), Ok(Role::User));
        assert!(role_of("robot").is_err());
    }
}
