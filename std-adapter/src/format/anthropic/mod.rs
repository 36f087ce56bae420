//! Anthropic Messages: reading and writing conversations, analysing request messages and
//! the top-level `system`, writing the messages of a managed request body.
//!
//! * [`read`] and [`write`]: a [`Conversation`](crate::Conversation) from and to a file or body.
//! * [`analyze`]: a request's turn into parts (a user turn's tool results each a part of
//!   their own), every block it does not read kept in the raw JSON: thinking with its
//!   signature, redacted thinking, images, documents, server tools, citations, cache marks.
//! * [`managed`]: a turn with the blocks a payload keeps and the core's reduced tool results,
//!   a message the core wrote, the `system` with the core's texts
//!   ([`ManagedBody`](crate::format::ManagedBody)).

mod analyze;
mod managed;
mod read;
mod recall;
mod write;

pub(in crate::format) use analyze::{analyze_message, analyze_system};
pub use managed::MANAGED_OPENING_TEXT;
pub(in crate::format) use managed::{
    core_message, is_assistant_turn, joined_user_turns, kept_message, managed_opening_turn,
    managed_opening_turn_marked, marked_turn, system_with,
};
pub(in crate::format) use read::{drop_opening_placeholder, read_header, read_message};
pub(in crate::format) use recall::{recall_calls, recall_follow_up, recall_merge, recall_tool};
pub(in crate::format) use write::{wire_body, wire_lines};

/// Separator between the text blocks of a system prompt or a tool result.
pub(in crate::format) const BLOCK_SEPARATOR: &str = "\n";
/// Prefix of the user text a mid-conversation system message becomes.
pub(in crate::format) const SYSTEM_PREFIX: &str = "[system] ";
/// The user turn written before a conversation whose first turn is the assistant's: the
/// Messages API refuses a first message that is not `user`, and a trimmed window often starts
/// mid-turn. Reading drops it again, so the round trip stays lossless.
///
/// ```
/// use ctxwin_std::format::{read, write, Format, OPENING_USER_TEXT};
/// use ctxwin_std::{core::Role, ChatMessage, Conversation};
///
/// let mut conv = Conversation::default();
/// conv.messages.push(ChatMessage::text(Role::Assistant, "The build is green."));
/// conv.messages.push(ChatMessage::text(Role::User, "Ship it."));
/// let body = write(&conv, Format::AnthropicJson)?;
/// let json: serde_json::Value = serde_json::from_str(&body).unwrap();
/// assert_eq!(json["messages"][0]["role"], "user");
/// assert_eq!(json["messages"][0]["content"], OPENING_USER_TEXT);
/// assert_eq!(read(&body, Format::AnthropicJson)?, conv);
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
pub const OPENING_USER_TEXT: &str = "[Earlier turns omitted]";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::error::{FormatError, Problem};
    use crate::format::node::{Node, Source};
    use crate::message::{ChatMessage, Conversation, ToolCall};
    use ctxwin_core::Role;

    fn read_document(root: &Node<'_, '_>, conv: &mut Conversation) -> Result<(), FormatError> {
        crate::format::document::read_document(root, conv, crate::format::Provider::Anthropic)
    }

    fn read_doc(json: &str) -> Result<Conversation, FormatError> {
        let src = Source::new(json, 1);
        let mut conv = Conversation::default();
        read_document(&src.root()?, &mut conv)?;
        Ok(conv)
    }

    fn write_doc(conv: &Conversation) -> String {
        serde_json::to_string(&wire_body(conv).unwrap()).unwrap()
    }

    #[test]
    fn user_blocks_split_into_results_then_text() {
        let conv = read_doc(
            r#"[{"role":"user","content":[
                {"type":"tool_result","tool_use_id":"a","content":"ok"},
                {"type":"tool_result","tool_use_id":"b","content":[{"type":"text","text":"no"},{"type":"text","text":"such file"}],"is_error":true},
                {"type":"text","text":"go on"}]}]"#,
        )
        .unwrap();
        let roles: Vec<Role> = conv.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::Tool, Role::Tool, Role::User]);
        assert_eq!(conv.messages[1].content, "no\nsuch file");
        assert!(conv.messages[1].is_error && !conv.messages[0].is_error);
        assert_eq!(conv.messages[2].content, "go on");
    }

    #[test]
    fn assistant_text_starts_messages_and_tool_use_attaches() {
        let conv = read_doc(
            r#"[{"role":"assistant","content":[
                {"type":"tool_use","id":"x","name":"f","input":{"b":1, "a":2}},
                {"type":"text","text":"then"},
                {"type":"tool_use","id":"y","name":"g","input":{}}]}]"#,
        )
        .unwrap();
        assert_eq!(conv.messages.len(), 2);
        assert_eq!(conv.messages[0].content, "");
        assert_eq!(conv.messages[0].tool_calls[0].arguments, r#"{"b":1, "a":2}"#);
        assert_eq!(conv.messages[1].content, "then");
        assert_eq!(conv.messages[1].tool_calls[0].id, "y");
    }

    #[test]
    fn writer_merges_roles_hoists_leading_system_and_prefixes_later_system() {
        let mut conv = Conversation::default();
        conv.messages.push(ChatMessage::text(Role::System, "rules"));
        conv.messages.push(ChatMessage::text(Role::User, "hi"));
        conv.messages.push(ChatMessage::assistant_calls("", vec![ToolCall::new("c", "f", "{}")]));
        conv.messages.push(ChatMessage::tool_result("c", "out"));
        conv.messages.push(ChatMessage::text(Role::System, "late"));
        assert_eq!(
            write_doc(&conv),
            r#"{"system":"rules","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"c","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"out"},{"type":"text","text":"[system] late"}]}]}"#
        );
    }

    #[test]
    fn an_assistant_first_window_opens_with_a_user_turn_that_reading_drops() {
        let mut conv = Conversation { system: Some("rules".into()), ..Conversation::default() };
        conv.messages.push(ChatMessage::text(Role::System, "[Memory Summary] earlier work"));
        conv.messages.push(ChatMessage::assistant_calls("", vec![ToolCall::new("c", "f", "{}")]));
        conv.messages.push(ChatMessage::tool_result("c", "out"));
        let doc = write_doc(&conv);
        assert!(
            doc.contains(r#""messages":[{"role":"user","content":"[Earlier turns omitted]"},{"role":"assistant""#),
            "{doc}"
        );
        let back = read_doc(&doc).unwrap();
        assert_eq!(back.messages.len(), 2, "the placeholder is dropped, the system is hoisted");
        assert_eq!(back.messages[0].role, Role::Assistant);
        let (_, lines) = wire_lines(&conv).unwrap();
        assert_eq!(lines[0].role, "user");

        let mut user_first = Conversation::default();
        user_first.messages.push(ChatMessage::text(Role::User, OPENING_USER_TEXT));
        user_first.messages.push(ChatMessage::text(Role::User, "more"));
        let doc = write_doc(&user_first);
        assert_eq!(read_doc(&doc).unwrap(), user_first, "a real user turn with that text stays");
    }

    #[test]
    fn invalid_arguments_name_message_and_call() {
        let mut conv = Conversation::default();
        conv.messages.push(ChatMessage::text(Role::User, "hi"));
        conv.messages.push(ChatMessage::assistant_calls(
            "",
            vec![ToolCall::new("a", "f", "{}"), ToolCall::new("b", "f", "{oops")],
        ));
        let err = wire_body(&conv).err().unwrap();
        assert_eq!(err.message, Some(1));
        assert_eq!(err.field, "messages[1].tool_calls[1].arguments");
        assert!(matches!(err.problem, Problem::InvalidJsonText(_)));
    }

    #[test]
    fn system_blocks_join_and_unsupported_blocks_are_named() {
        let conv = read_doc(
            r#"{"system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"messages":[]}"#,
        )
        .unwrap();
        assert_eq!(conv.system.as_deref(), Some("a\nb"));
        let err = read_doc(
            r#"{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm"}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.field, "messages[0].content[0].type");
        assert!(matches!(err.problem, Problem::Unsupported(ref w) if w.contains("thinking")));
        let err = read_doc(r#"[{"role":"system","content":"x"}]"#).unwrap_err();
        assert!(matches!(err.problem, Problem::UnknownRole(ref r) if r == "system"));
    }
}
