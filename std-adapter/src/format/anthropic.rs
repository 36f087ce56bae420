//! Anthropic Messages: reading from the input tree, writing wire structs.
//!
//! Reading splits content blocks into messages so that writing (which merges adjacent
//! messages of one Anthropic role into one turn) reads back to the same messages.

use std::borrow::Cow;

use ctxwin_core::Role;
use serde::Serialize;
use serde_json::value::RawValue;

use super::check::{self, Layout};
use super::error::{FormatError, Problem};
use super::node::{Kind, Node, Object};
use crate::message::{ChatMessage, Conversation, ToolCall, ToolDefinition};

/// Separator between the text blocks of a system prompt or a tool result.
pub(super) const BLOCK_SEPARATOR: &str = "\n";
/// Prefix of the user text a mid-conversation system message becomes.
pub(super) const SYSTEM_PREFIX: &str = "[system] ";
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

/// Reads the non-message fields a body or a JSONL header line may carry (`system`, `tools`).
pub(super) fn read_header(
    obj: &Object<'_, '_>,
    conv: &mut Conversation,
) -> Result<(), FormatError> {
    if let Some(system) = obj.field("system") {
        conv.system = Some(match system.kind() {
            Kind::String => system.string()?,
            _ => texts_of(&system, "an array of text blocks", "system block")?,
        });
    }
    if let Some(tools) = obj.field("tools") {
        for tool in tools.array("an array of tools")? {
            conv.tools.push(read_tool(&tool)?);
        }
    }
    Ok(())
}

fn read_tool(node: &Node<'_, '_>) -> Result<ToolDefinition, FormatError> {
    let tool = node.object()?;
    if let Some(kind) = tool.field("type") {
        let name = kind.string()?;
        if name != "custom" {
            return Err(kind.error(Problem::Unsupported(format!("tool type `{name}`"))));
        }
    }
    let schema = tool.required("input_schema")?;
    if schema.kind() != Kind::Object {
        return Err(schema.wrong_type("an object"));
    }
    Ok(ToolDefinition {
        name: tool.string("name")?,
        description: tool.opt_string("description")?.unwrap_or_default(),
        parameters: schema.raw().to_owned(),
    })
}

/// Text blocks (`{"type":"text","text":...}`) joined by [`BLOCK_SEPARATOR`].
fn texts_of(
    node: &Node<'_, '_>,
    expected: &'static str,
    what: &str,
) -> Result<String, FormatError> {
    let mut texts = Vec::new();
    for block in node.array(expected)? {
        let block = block.object()?;
        let (kind, kind_name) = block_type(&block)?;
        if kind_name != "text" {
            return Err(kind.error(Problem::Unsupported(format!("{what} type `{kind_name}`"))));
        }
        texts.push(block.string("text")?);
    }
    Ok(texts.join(BLOCK_SEPARATOR))
}

fn block_type<'a, 's>(block: &Object<'a, 's>) -> Result<(Node<'a, 's>, String), FormatError> {
    let kind = block.required("type")?;
    let name = kind.string()?;
    Ok((kind, name))
}

/// Reads one Anthropic message into one or more messages of `out`.
///
/// User: each text block is a user message, each `tool_result` a tool message, in order.
/// Assistant: each text block starts an assistant message; `tool_use` blocks attach to the
/// message before them (or to an empty one when the turn starts with a call).
pub(super) fn read_message(
    node: &Node<'_, '_>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), FormatError> {
    let obj = node.object()?;
    let role_node = obj.required("role")?;
    let role_name = role_node.string()?;
    let role = match role_name.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => return Err(role_node.error(Problem::UnknownRole(role_name))),
    };
    let content = obj.required("content")?;
    if content.kind() == Kind::String {
        out.push(ChatMessage::text(role, content.string()?));
        return Ok(());
    }
    let blocks = content.array("a string or an array of content blocks")?;
    if blocks.is_empty() {
        out.push(ChatMessage::text(role, ""));
    }
    let first_of_turn = out.len();
    for block in blocks {
        let block = block.object()?;
        let (kind, kind_name) = block_type(&block)?;
        match (role, kind_name.as_str()) {
            (_, "text") => out.push(ChatMessage::text(role, block.string("text")?)),
            (Role::User, "tool_result") => out.push(read_tool_result(&block)?),
            (Role::Assistant, "tool_use") => {
                let call = read_tool_use(&block)?;
                match out.get_mut(first_of_turn..).and_then(<[ChatMessage]>::last_mut) {
                    Some(current) => current.tool_calls.push(call),
                    None => out.push(ChatMessage::assistant_calls("", vec![call])),
                }
            }
            _ => {
                let what = format!("{role_name} content block type `{kind_name}`");
                return Err(kind.error(Problem::Unsupported(what)));
            }
        }
    }
    Ok(())
}

fn read_tool_result(block: &Object<'_, '_>) -> Result<ChatMessage, FormatError> {
    let id = block.string("tool_use_id")?;
    let content = match block.field("content") {
        None => String::new(),
        Some(content) if content.kind() == Kind::String => content.string()?,
        Some(content) => {
            texts_of(&content, "a string or an array of text blocks", "tool_result block")?
        }
    };
    let mut message = ChatMessage::tool_result(id, content);
    message.is_error = block.opt_bool("is_error")?.unwrap_or(false);
    Ok(message)
}

fn read_tool_use(block: &Object<'_, '_>) -> Result<ToolCall, FormatError> {
    let input = block.required("input")?;
    if input.kind() != Kind::Object {
        return Err(input.wrong_type("an object"));
    }
    Ok(ToolCall {
        id: block.string("id")?,
        name: block.string("name")?,
        arguments: input.raw().to_owned(),
    })
}

/// A request body without the model: what the JSON writer emits.
#[derive(Serialize)]
pub(super) struct WireBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<WireContent<'a>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

/// The JSONL header line: what a message line cannot carry.
#[derive(Serialize)]
pub(super) struct WireHeader<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

#[derive(Serialize)]
pub(super) struct WireMessage<'a> {
    role: &'static str,
    content: WireContent<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<WireBlock<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: Cow<'a, str>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Cow<'a, RawValue>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
pub(super) struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: Cow<'a, RawValue>,
}

/// One turn being assembled: an Anthropic role and its blocks.
struct Turn<'a> {
    role: Role,
    blocks: Vec<WireBlock<'a>>,
}

impl<'a> Turn<'a> {
    /// A single text block becomes the plain string form; empty text blocks next to other
    /// blocks are dropped because the API refuses them.
    fn into_wire(self) -> WireMessage<'a> {
        let role = self.role.as_str();
        let mut blocks = self.blocks;
        if blocks.len() > 1 {
            blocks.retain(|block| !matches!(block, WireBlock::Text { text } if text.is_empty()));
        }
        let content = match <[WireBlock<'a>; 1]>::try_from(blocks) {
            Ok([WireBlock::Text { text }]) => WireContent::Text(text),
            Ok([block]) => WireContent::Blocks(vec![block]),
            Err(blocks) if blocks.is_empty() => WireContent::Text(Cow::Borrowed("")),
            Err(blocks) => WireContent::Blocks(blocks),
        };
        WireMessage { role, content }
    }
}

/// The top-level system (`conv.system` then the leading system messages) and the merged turns.
fn wire_messages(
    conv: &Conversation,
    layout: Layout,
) -> Result<(Option<WireContent<'_>>, Vec<WireMessage<'_>>), FormatError> {
    let mut system: Vec<&str> = conv.system.as_deref().into_iter().collect();
    let mut turns: Vec<Turn<'_>> = Vec::new();
    let mut leading = true;
    for (index, message) in conv.messages.iter().enumerate() {
        check::message_shape(index, message)?;
        leading &= message.role == Role::System;
        if leading {
            system.push(&message.content);
            continue;
        }
        let (role, blocks) = blocks_of(index, message, layout)?;
        match turns.last_mut() {
            Some(turn) if turn.role == role => turn.blocks.extend(blocks),
            _ => turns.push(Turn { role, blocks }),
        }
    }
    if turns.first().is_some_and(|turn| turn.role == Role::Assistant) {
        turns.insert(0, Turn { role: Role::User, blocks: vec![text_block(OPENING_USER_TEXT)] });
    }
    let system = match <[&str; 1]>::try_from(system) {
        Ok([text]) => Some(WireContent::Text(Cow::Borrowed(text))),
        Err(parts) if parts.is_empty() => None,
        Err(parts) => Some(WireContent::Blocks(
            parts.into_iter().map(|text| WireBlock::Text { text: Cow::Borrowed(text) }).collect(),
        )),
    };
    Ok((system, turns.into_iter().map(Turn::into_wire).collect()))
}

fn text_block(text: &str) -> WireBlock<'_> {
    WireBlock::Text { text: Cow::Borrowed(text) }
}

/// Removes the opening user turn the writer adds before an assistant-first conversation.
pub(super) fn drop_opening_placeholder(messages: &mut Vec<ChatMessage>) {
    let placeholder = messages
        .first()
        .is_some_and(|first| first.role == Role::User && first.content == OPENING_USER_TEXT);
    if placeholder && messages.get(1).is_some_and(|next| next.role == Role::Assistant) {
        messages.remove(0);
    }
}

/// The Anthropic role and blocks of one message.
fn blocks_of(
    index: usize,
    message: &ChatMessage,
    layout: Layout,
) -> Result<(Role, Vec<WireBlock<'_>>), FormatError> {
    fn text(text: Cow<'_, str>) -> WireBlock<'_> {
        WireBlock::Text { text }
    }
    Ok(match message.role {
        Role::System => {
            tracing::debug!(index, "mid-conversation system message written as user text");
            (Role::User, vec![text(Cow::Owned(format!("{SYSTEM_PREFIX}{}", message.content)))])
        }
        Role::User => (Role::User, vec![text(Cow::Borrowed(&message.content))]),
        Role::Tool => (
            Role::User,
            vec![WireBlock::ToolResult {
                tool_use_id: message.tool_call_id.as_deref().unwrap_or_default(),
                content: &message.content,
                is_error: message.is_error,
            }],
        ),
        Role::Assistant => {
            let mut blocks = Vec::with_capacity(message.tool_calls.len().saturating_add(1));
            if !message.content.is_empty() || message.tool_calls.is_empty() {
                blocks.push(text(Cow::Borrowed(&message.content)));
            }
            for (call_index, call) in message.tool_calls.iter().enumerate() {
                let input = check::object_text(&call.arguments, layout).map_err(|problem| {
                    let field = format!("tool_calls[{call_index}].arguments");
                    FormatError::at_message(index, check::field_path(index, &field), problem)
                })?;
                blocks.push(WireBlock::ToolUse { id: &call.id, name: &call.name, input });
            }
            (Role::Assistant, blocks)
        }
    })
}

fn wire_tools(conv: &Conversation, layout: Layout) -> Result<Vec<WireTool<'_>>, FormatError> {
    conv.tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            Ok(WireTool {
                name: &tool.name,
                description: &tool.description,
                input_schema: check::tool_schema(index, tool, layout)?,
            })
        })
        .collect()
}

pub(super) fn wire_body(conv: &Conversation) -> Result<WireBody<'_>, FormatError> {
    let (system, messages) = wire_messages(conv, Layout::Document)?;
    Ok(WireBody { system, messages, tools: wire_tools(conv, Layout::Document)? })
}

/// The JSONL header (`None` when there is no system and no tool) and the message lines.
pub(super) fn wire_lines(
    conv: &Conversation,
) -> Result<(Option<WireHeader<'_>>, Vec<WireMessage<'_>>), FormatError> {
    let (system, messages) = wire_messages(conv, Layout::Lines)?;
    let tools = wire_tools(conv, Layout::Lines)?;
    let header = (system.is_some() || !tools.is_empty()).then_some(WireHeader { system, tools });
    Ok((header, messages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::Source;

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
