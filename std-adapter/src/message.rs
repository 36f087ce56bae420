//! Owned chat messages: the std side's exchange type between formats, archive and core.

use ctxwin_core::Role;
use serde::{Deserialize, Serialize};

/// One tool invocation requested by an assistant message: the owned form of the core's
/// borrowed [`ctxwin_core::ToolCall`], same concept and same three fields.
///
/// Two types because the core is `no_std` without allocation: its `ToolCall<'a>` borrows
/// `&str`s from the caller or the manager's arena, while the std side needs calls that outlive
/// their source (read from a file, kept in the archive, serialized with serde). Convert with
/// [`ToolCall::as_core`] and `From<ctxwin_core::ToolCall<'_>>`.
///
/// ```
/// use ctxwin_std::ToolCall;
/// let call = ToolCall::new("call_1", "read_file", r#"{"path":"src/main.rs"}"#);
/// assert_eq!(call.name, "read_file");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id that the tool result answers (`tool_call_id`, `tool_use_id`).
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text, exactly as the model produced them.
    pub arguments: String,
}

impl ToolCall {
    /// Builds a call from its three parts.
    ///
    /// ```
    /// let call = ctxwin_std::ToolCall::new("c1", "ls", "{}");
    /// assert_eq!(call.id, "c1");
    /// ```
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self { id: id.into(), name: name.into(), arguments: arguments.into() }
    }

    /// The core's borrowed view of this call, to push into a manager.
    ///
    /// ```
    /// let call = ctxwin_std::ToolCall::new("c1", "ls", "{}");
    /// assert_eq!(call.as_core(), ctxwin_std::core::ToolCall::new("c1", "ls", "{}"));
    /// ```
    pub fn as_core(&self) -> ctxwin_core::ToolCall<'_> {
        ctxwin_core::ToolCall::new(&self.id, &self.name, &self.arguments)
    }
}

/// An owned copy of a core tool call.
///
/// ```
/// let core = ctxwin_std::core::ToolCall::new("c1", "ls", "{}");
/// assert_eq!(ctxwin_std::ToolCall::from(core), ctxwin_std::ToolCall::new("c1", "ls", "{}"));
/// ```
impl From<ctxwin_core::ToolCall<'_>> for ToolCall {
    fn from(call: ctxwin_core::ToolCall<'_>) -> Self {
        Self::new(call.id, call.name, call.arguments)
    }
}

/// A chat message as providers exchange it.
///
/// ```
/// use ctxwin_std::{ChatMessage, ToolCall};
/// use ctxwin_std::core::Role;
/// let ask = ChatMessage::text(Role::User, "list the files");
/// let call = ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", "{}")]);
/// let result = ChatMessage::tool_result("c1", "Cargo.toml\nsrc/");
/// assert_eq!(result.tool_call_id.as_deref(), Some("c1"));
/// assert_eq!(call.tool_calls.len(), 1);
/// assert_eq!(ask.role, Role::User);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Author.
    pub role: Role,
    /// Text content (tool output for `Role::Tool`).
    pub content: String,
    /// Tool calls an assistant message requests (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this result answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `Role::Tool`: the tool reported failure (Anthropic `tool_result.is_error`; OpenAI has
    /// no such flag and writes the text only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_error: bool,
    /// Optional participant name (OpenAI `name`; Anthropic has none and drops it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

// serde's `skip_serializing_if` takes a function path.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(flag: &bool) -> bool {
    !*flag
}

impl ChatMessage {
    /// A message stored in the core as an owned chat message, with its stored (possibly
    /// reduced) text.
    pub(crate) fn from_stored(message: &ctxwin_core::MessageRef<'_>) -> ChatMessage {
        let mut chat = ChatMessage::text(message.role(), message.content());
        chat.tool_calls = message.tool_calls().map(ToolCall::from).collect();
        chat.tool_call_id = message.tool_call_id().map(str::to_string);
        chat
    }

    /// A plain text message.
    ///
    /// ```
    /// let m = ctxwin_std::ChatMessage::text(ctxwin_std::core::Role::System, "be brief");
    /// assert_eq!(m.content, "be brief");
    /// ```
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
            name: None,
        }
    }

    /// An assistant message requesting tool calls.
    ///
    /// ```
    /// let m = ctxwin_std::ChatMessage::assistant_calls("", vec![]);
    /// assert!(m.tool_calls.is_empty());
    /// ```
    pub fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
            tool_calls,
            tool_call_id: None,
            is_error: false,
            name: None,
        }
    }

    /// A tool result answering `call_id`.
    ///
    /// ```
    /// let m = ctxwin_std::ChatMessage::tool_result("c9", "ok");
    /// assert_eq!(m.role, ctxwin_std::core::Role::Tool);
    /// ```
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            is_error: false,
            name: None,
        }
    }
}

/// A tool (function) the model may call, as declared in a request's `tools` list.
///
/// ```
/// let t = ctxwin_std::ToolDefinition {
///     name: "ls".into(),
///     description: "list files".into(),
///     parameters: r#"{"type":"object","properties":{}}"#.into(),
/// };
/// assert_eq!(t.name, "ls");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Function name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments, as JSON text.
    pub parameters: String,
}

/// A whole conversation: system text, tool definitions and the messages in order.
///
/// System messages may appear in `messages` too (OpenAI allows them anywhere); `system` holds the
/// top-level system prompt Anthropic keeps outside the message list.
///
/// ```
/// use ctxwin_std::{ChatMessage, Conversation};
/// use ctxwin_std::core::Role;
/// let mut c = Conversation::default();
/// c.messages.push(ChatMessage::text(Role::User, "hi"));
/// assert_eq!(c.messages.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    /// Top-level system prompt (Anthropic's `system`), if kept apart from `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Tool definitions offered to the model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// Messages, oldest first.
    pub messages: Vec<ChatMessage>,
}
