//! Reading Anthropic Messages conversations from the input tree into a [`Conversation`].
//!
//! Reading splits content blocks into messages so that writing (which merges adjacent
//! messages of one Anthropic role into one turn) reads back to the same messages.

use ctxwin_core::Role;

use super::{BLOCK_SEPARATOR, OPENING_USER_TEXT};
use crate::format::error::{FormatError, Problem};
use crate::format::node::{Kind, Node, Object};
use crate::message::{ChatMessage, Conversation, ToolCall, ToolDefinition};

/// Reads the non-message fields a body or a JSONL header line may carry (`system`, `tools`).
pub(in crate::format) fn read_header(
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
pub(in crate::format) fn read_message(
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

/// Removes the opening user turn the writer adds before an assistant-first conversation.
pub(in crate::format) fn drop_opening_placeholder(messages: &mut Vec<ChatMessage>) {
    let placeholder = messages
        .first()
        .is_some_and(|first| first.role == Role::User && first.content == OPENING_USER_TEXT);
    if placeholder && messages.get(1).is_some_and(|next| next.role == Role::Assistant) {
        messages.remove(0);
    }
}
