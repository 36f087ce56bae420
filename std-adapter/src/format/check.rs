//! Checks the writers share, so that whatever a writer emits its reader accepts again.

use std::borrow::Cow;

use ctxwin_core::Role;
use serde_json::value::RawValue;

use super::error::{FormatError, Problem};
use crate::message::{ChatMessage, ToolDefinition};

/// Refuses field combinations neither format can carry: tool calls off an assistant message, a
/// tool result without the id it answers, a result id or error flag on a non-tool message.
pub(super) fn message_shape(index: usize, message: &ChatMessage) -> Result<(), FormatError> {
    let role = message.role;
    let not_allowed = |field: &str| {
        FormatError::at_message(index, field_path(index, field), Problem::NotAllowed(role.as_str()))
    };
    if role != Role::Assistant && !message.tool_calls.is_empty() {
        return Err(not_allowed("tool_calls"));
    }
    if role == Role::Tool {
        if message.tool_call_id.is_none() {
            return Err(FormatError::at_message(
                index,
                field_path(index, "tool_call_id"),
                Problem::Missing,
            ));
        }
    } else {
        if message.tool_call_id.is_some() {
            return Err(not_allowed("tool_call_id"));
        }
        if message.is_error {
            return Err(not_allowed("is_error"));
        }
    }
    Ok(())
}

/// `messages[index].field`.
pub(super) fn field_path(index: usize, field: &str) -> String {
    format!("messages[{index}].{field}")
}

/// How a writer lays out its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// One JSON document; embedded JSON text stays verbatim.
    Document,
    /// JSONL: every record must stay on one line.
    Lines,
}

/// JSON text that must be one JSON object, for verbatim embedding.
///
/// For [`Layout::Lines`] its line breaks become spaces: in valid JSON they can only sit between
/// tokens (string contents escape them), so the value is unchanged.
pub(super) fn object_text(text: &str, layout: Layout) -> Result<Cow<'_, RawValue>, Problem> {
    let invalid = |err: serde_json::Error| {
        Problem::InvalidJsonText(match err.to_string().rsplit_once(" at line ") {
            Some((detail, _)) => detail.to_owned(),
            None => err.to_string(),
        })
    };
    let raw: &RawValue = serde_json::from_str(text).map_err(invalid)?;
    if !raw.get().starts_with('{') {
        return Err(Problem::InvalidJsonText("not a JSON object".to_owned()));
    }
    if layout == Layout::Lines && raw.get().contains(['\n', '\r']) {
        let flat = raw.get().replace(['\n', '\r'], " ");
        return RawValue::from_string(flat).map(Cow::Owned).map_err(invalid);
    }
    Ok(Cow::Borrowed(raw))
}

/// A tool's `parameters` schema as an embeddable object.
pub(super) fn tool_schema(
    index: usize,
    tool: &ToolDefinition,
    layout: Layout,
) -> Result<Cow<'_, RawValue>, FormatError> {
    object_text(&tool.parameters, layout)
        .map_err(|problem| FormatError::at_field(format!("tools[{index}].parameters"), problem))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolCall;

    #[test]
    fn object_text_accepts_objects_only() {
        let doc = Layout::Document;
        assert_eq!(object_text(r#" {"a": 1} "#, doc).unwrap().get(), r#"{"a": 1}"#);
        assert!(matches!(object_text("[1]", doc), Err(Problem::InvalidJsonText(_))));
        assert!(matches!(object_text("{\"a\":", doc), Err(Problem::InvalidJsonText(_))));
    }

    #[test]
    fn lines_layout_flattens_line_breaks_between_tokens_only() {
        let text = "{\n  \"a\": \"x\\ny\"\r\n}";
        assert_eq!(object_text(text, Layout::Document).unwrap().get(), text);
        let flat = object_text(text, Layout::Lines).unwrap();
        assert_eq!(flat.get(), "{   \"a\": \"x\\ny\"  }");
        let before: serde_json::Value = serde_json::from_str(text).unwrap();
        let after: serde_json::Value = serde_json::from_str(flat.get()).unwrap();
        assert_eq!(before, after);
    }

    #[test]
    fn shapes_the_readers_refuse_are_refused() {
        let mut user = ChatMessage::text(Role::User, "hi");
        user.tool_calls.push(ToolCall::new("c", "f", "{}"));
        let err = message_shape(4, &user).unwrap_err();
        assert_eq!(err.field, "messages[4].tool_calls");
        assert!(matches!(err.problem, Problem::NotAllowed("user")));

        let mut tool = ChatMessage::tool_result("c", "out");
        tool.tool_call_id = None;
        let err = message_shape(0, &tool).unwrap_err();
        assert_eq!((err.message, err.field.as_str()), (Some(0), "messages[0].tool_call_id"));
        assert!(matches!(err.problem, Problem::Missing));

        let mut flagged = ChatMessage::text(Role::Assistant, "x");
        flagged.is_error = true;
        assert!(message_shape(1, &flagged).is_err());
        assert!(message_shape(1, &ChatMessage::tool_result("c", "")).is_ok());
    }
}
