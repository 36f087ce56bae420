//! OpenAI chat-completions messages: reading from the input tree, writing wire structs.
//!
//! One of two OpenAI writers, on purpose. This one writes a whole owned [`Conversation`]
//! with serde: any conversation read from a file (fields the core never holds, such as a
//! message's `name`), checked message by message, as a JSON body or JSONL lines. The core's
//! [`Payload::write_openai`](ctxwin_core::Payload::write_openai) writes a payload composed by
//! a manager (its blocks: dynamic context, entities, memory summary) into an
//! `embedded_io::Write` without allocating, for `no_std` targets; the session's
//! [`compose_openai_body`](crate::Session::compose_openai_body) uses that one. Neither
//! input can become the other without a copy, and the core's JSON writer is internal to it.

use ctxwin_core::Role;
use serde::Serialize;
use serde_json::value::RawValue;

use std::borrow::Cow;

use super::check::{self, Layout};
use super::error::{FormatError, Problem};
use super::node::{Kind, Node, Object};
use crate::message::{ChatMessage, Conversation, ToolCall, ToolDefinition};

/// Separator between the text parts of one message.
pub(super) const PART_SEPARATOR: &str = "\n";

/// Reads the non-message fields a body or a JSONL header line may carry (`tools`).
pub(super) fn read_header(
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
pub(super) fn read_message(
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

/// A request body without the model: what the JSON writer emits.
#[derive(Serialize)]
pub(super) struct WireBody<'a> {
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

/// The JSONL header line: what a message line cannot carry.
#[derive(Serialize)]
pub(super) struct WireHeader<'a> {
    tools: Vec<WireTool<'a>>,
}

/// Key order matches the chat-completions docs and common logs (role first).
#[derive(Serialize)]
pub(super) struct WireMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
pub(super) struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: Cow<'a, RawValue>,
}

/// The conversation as wire messages, `system` first as a system message.
pub(super) fn wire_messages(conv: &Conversation) -> Result<Vec<WireMessage<'_>>, FormatError> {
    let system = conv.system.as_deref().map(|text| WireMessage {
        role: Role::System.as_str(),
        name: None,
        tool_call_id: None,
        content: text,
        tool_calls: Vec::new(),
    });
    let mut out: Vec<WireMessage<'_>> = system.into_iter().collect();
    for (index, message) in conv.messages.iter().enumerate() {
        check::message_shape(index, message)?;
        out.push(WireMessage {
            role: message.role.as_str(),
            name: message.name.as_deref(),
            tool_call_id: message.tool_call_id.as_deref(),
            content: &message.content,
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| WireToolCall {
                    id: &call.id,
                    kind: "function",
                    function: WireFunctionCall { name: &call.name, arguments: &call.arguments },
                })
                .collect(),
        });
    }
    Ok(out)
}

fn wire_tools(conv: &Conversation, layout: Layout) -> Result<Vec<WireTool<'_>>, FormatError> {
    conv.tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            Ok(WireTool {
                kind: "function",
                function: WireFunction {
                    name: &tool.name,
                    description: &tool.description,
                    parameters: check::tool_schema(index, tool, layout)?,
                },
            })
        })
        .collect()
}

pub(super) fn wire_body(conv: &Conversation) -> Result<WireBody<'_>, FormatError> {
    Ok(WireBody { messages: wire_messages(conv)?, tools: wire_tools(conv, Layout::Document)? })
}

/// The JSONL header, `None` when nothing needs one.
pub(super) fn wire_header(conv: &Conversation) -> Result<Option<WireHeader<'_>>, FormatError> {
    let tools = wire_tools(conv, Layout::Lines)?;
    Ok((!tools.is_empty()).then_some(WireHeader { tools }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::node::Source;

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
