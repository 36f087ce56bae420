//! Reading OpenAI chat-completions conversations from the input tree into a
//! [`Conversation`]: text only, anything else refused by name.

use ctxwin_core::Role;

use crate::format::error::{FormatError, Problem};
use crate::format::node::{Kind, Node, Object};
use crate::message::{ChatMessage, Conversation, ToolCall, ToolDefinition};

/// Separator between the text parts of one message.
const PART_SEPARATOR: &str = "\n";

/// Reads the non-message fields a body or a JSONL header line may carry (`tools`).
pub(in crate::format) fn read_header(
    obj: &Object<'_, '_>,
    conv: &mut Conversation,
) -> Result<(), FormatError> {
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
        if name != "function" {
            return Err(kind.error(Problem::Unsupported(format!("tool type `{name}`"))));
        }
    }
    let function = tool.required("function")?;
    let function = function.object()?;
    let parameters = match function.field("parameters") {
        Some(schema) if schema.kind() == Kind::Object => schema.raw().to_owned(),
        Some(schema) => return Err(schema.wrong_type("an object")),
        None => "{}".to_owned(),
    };
    Ok(ToolDefinition {
        name: function.string("name")?,
        description: function.opt_string("description")?.unwrap_or_default(),
        parameters,
    })
}

/// Reads one message object into `out`.
pub(in crate::format) fn read_message(
    node: &Node<'_, '_>,
    out: &mut Vec<ChatMessage>,
) -> Result<(), FormatError> {
    let obj = node.object()?;
    let role_node = obj.required("role")?;
    let role_name = role_node.string()?;
    let role =
        Role::parse(&role_name).ok_or_else(|| role_node.error(Problem::UnknownRole(role_name)))?;
    let content = match obj.field("content") {
        Some(content) => content_text(&content)?,
        None if role == Role::Assistant => String::new(),
        None => {
            let content = obj.required("content")?;
            return Err(content.wrong_type("a string or an array of content parts"));
        }
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = obj.field("tool_calls") {
        if role != Role::Assistant {
            return Err(calls.error(Problem::NotAllowed(role.as_str())));
        }
        for call in calls.array("an array of tool calls")? {
            tool_calls.push(read_tool_call(&call)?);
        }
    }
    let tool_call_id = match obj.field("tool_call_id") {
        Some(id) if role == Role::Tool => Some(id.string()?),
        Some(id) => return Err(id.error(Problem::NotAllowed(role.as_str()))),
        None if role == Role::Tool => Some(obj.required("tool_call_id")?.string()?),
        None => None,
    };
    let name = obj.opt_string("name")?;
    out.push(ChatMessage { role, content, tool_calls, tool_call_id, is_error: false, name });
    Ok(())
}

/// A string, or an array of `{"type":"text","text":...}` parts joined by [`PART_SEPARATOR`].
fn content_text(node: &Node<'_, '_>) -> Result<String, FormatError> {
    match node.kind() {
        Kind::String => node.string(),
        Kind::Array => {
            let mut texts = Vec::new();
            for part in node.array("an array of content parts")? {
                let part = part.object()?;
                let kind = part.required("type")?;
                let kind_name = kind.string()?;
                if kind_name != "text" {
                    let what = format!("content part type `{kind_name}`");
                    return Err(kind.error(Problem::Unsupported(what)));
                }
                texts.push(part.string("text")?);
            }
            Ok(texts.join(PART_SEPARATOR))
        }
        _ => Err(node.wrong_type("a string or an array of content parts")),
    }
}

fn read_tool_call(node: &Node<'_, '_>) -> Result<ToolCall, FormatError> {
    let call = node.object()?;
    if let Some(kind) = call.field("type") {
        let name = kind.string()?;
        if name != "function" {
            return Err(kind.error(Problem::Unsupported(format!("tool call type `{name}`"))));
        }
    }
    let function = call.required("function")?;
    let function = function.object()?;
    Ok(ToolCall {
        id: call.string("id")?,
        name: function.string("name")?,
        arguments: function.string("arguments")?,
    })
}
