//! OpenAI chat completions: reading and writing conversations, analysing request messages,
//! writing the messages of a managed request body.
//!
//! * [`read`] and [`write`]: a [`Conversation`](crate::Conversation) from and to a file or body
//!   (the CLI's `import`, `trim` and `build`, a session's [`ComposedPayload`]).
//! * [`analyze`]: a request's message into parts, every content part it does not read kept
//!   in the raw JSON (a proxy's view: [`analyze_message`](crate::format::analyze_message)).
//! * [`managed`]: a kept message with the core's reduced content, a message the core wrote, a
//!   system text ([`ManagedBody`](crate::format::ManagedBody)).
//!
//! # Why OpenAI is written in two crates
//!
//! The core's [`Payload::write_openai`](ctxwin_core::Payload::write_openai) writes a payload
//! a manager composed (borrowing the manager's arena) into an `embedded_io::Write` without
//! allocating: what a `no_std` target without a heap needs; the session's
//! [`compose_openai_body`](crate::Session::compose_openai_body) uses it. The writer here
//! ([`write`]) writes an owned [`Conversation`](crate::Conversation), which is what the std
//! side holds after reading a file or composing a payload: fields the core never stores (a
//! message's `name`), pretty JSON or JSONL, each message checked so its reader takes it back.
//! Neither can delegate to the other: a `Conversation` is not in a manager's arena, and a
//! `Payload` is not owned. Both write the same message layout (role, `tool_call_id`,
//! `content`, `tool_calls` with `arguments` as the model's text; the core writes `null`
//! content beside tool calls, this writer `""`); `tests/formats.rs` reads the core's body back
//! with [`read`] into the conversation [`write`] writes for the same payload.
//!
//! The messages the core adds to a managed body ([`managed`]) are written in serde_json's
//! alphabetical key order, not [`write`]'s role-first order: those are the bytes the proxy has
//! always sent upstream, and a provider's prompt cache is keyed on them. Writing them with
//! [`write`] instead is a one-line change for the day that no longer matters.
//!
//! [`ComposedPayload`]: crate::session::ComposedPayload

mod analyze;
mod managed;
mod read;
mod recall;
mod write;

pub(in crate::format) use analyze::analyze_message;
pub(in crate::format) use managed::{core_message, kept_message, system_message};
pub(in crate::format) use read::{read_header, read_message};
pub(in crate::format) use recall::{recall_calls, recall_follow_up, recall_merge, recall_tool};
pub(in crate::format) use write::{wire_body, wire_header, wire_messages};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::error::{FormatError, Problem};
    use crate::format::node::{Node, Source};
    use crate::message::{ChatMessage, Conversation, ToolCall};
    use ctxwin_core::Role;

    fn read_document(root: &Node<'_, '_>, conv: &mut Conversation) -> Result<(), FormatError> {
        crate::format::document::read_document(root, conv, crate::format::Provider::OpenAi)
    }

    fn read_one(json: &str) -> Result<Vec<ChatMessage>, FormatError> {
        let src = Source::new(json, 1);
        let root = src.root()?;
        let mut conv = Conversation::default();
        read_document(&root, &mut conv)?;
        Ok(conv.messages)
    }

    #[test]
    fn null_content_with_calls_and_developer_role() {
        let msgs = read_one(
            r#"[{"role":"developer","content":"rules"},
                {"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]}]"#,
        )
        .unwrap();
        assert_eq!(msgs[0].role, Role::System);
        assert_eq!(msgs[1].content, "");
        assert_eq!(msgs[1].tool_calls, vec![ToolCall::new("a", "f", r#"{"x": 1}"#)]);
    }

    #[test]
    fn text_parts_are_joined_and_images_refused() {
        let msgs = read_one(
            r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]"#,
        )
        .unwrap();
        assert_eq!(msgs[0].content, "a\nb");
        let err = read_one(
            r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]"#,
        )
        .unwrap_err();
        assert_eq!(err.field, "messages[0].content[1].type");
        assert!(matches!(err.problem, Problem::Unsupported(ref w) if w.contains("image_url")));
    }

    #[test]
    fn role_specific_fields_are_checked() {
        let err = read_one(r#"[{"role":"tool","content":"x"}]"#).unwrap_err();
        assert_eq!(err.field, "messages[0].tool_call_id");
        assert!(matches!(err.problem, Problem::Missing));
        let err = read_one(r#"[{"role":"user","content":"x","tool_call_id":"c"}]"#).unwrap_err();
        assert!(matches!(err.problem, Problem::NotAllowed("user")));
        let err = read_one(r#"[{"role":"user"}]"#).unwrap_err();
        assert_eq!(err.field, "messages[0].content");
        let err = read_one(r#"[{"role":"user","content":null}]"#).unwrap_err();
        assert!(matches!(err.problem, Problem::WrongType { found: "null", .. }));
    }

    #[test]
    fn body_tools_are_read_and_anthropic_system_refused() {
        let src = Source::new(
            r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"ls","parameters":{"type":"object"}}}]}"#,
            1,
        );
        let mut conv = Conversation::default();
        read_document(&src.root().unwrap(), &mut conv).unwrap();
        assert_eq!(conv.tools[0].name, "ls");
        assert_eq!(conv.tools[0].parameters, r#"{"type":"object"}"#);
        assert_eq!(conv.tools[0].description, "");
        let err = read_one(r#"{"system":"s","messages":[]}"#).unwrap_err();
        assert_eq!(err.field, "system");
    }

    #[test]
    fn writer_puts_system_first_and_keeps_arguments_verbatim() {
        let mut conv = Conversation { system: Some("sys".into()), ..Conversation::default() };
        conv.messages
            .push(ChatMessage::assistant_calls("", vec![ToolCall::new("c", "f", "not json")]));
        let json = serde_json::to_string(&wire_messages(&conv).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"[{"role":"system","content":"sys"},{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"not json"}}]}]"#
        );
    }
}
