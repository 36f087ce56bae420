//! Writing a [`Conversation`] as OpenAI chat-completions wire structs (serialized by the
//! caller as a pretty JSON body or compact JSONL lines).

use std::borrow::Cow;

use ctxwin_core::Role;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::format::check::{self, Layout};
use crate::format::error::FormatError;
use crate::message::Conversation;

/// A request body without the model: what the JSON writer emits.
#[derive(Serialize)]
pub(in crate::format) struct WireBody<'a> {
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

/// The JSONL header line: what a message line cannot carry.
#[derive(Serialize)]
pub(in crate::format) struct WireHeader<'a> {
    tools: Vec<WireTool<'a>>,
}

/// Key order matches the chat-completions docs and common logs (role first).
#[derive(Serialize)]
pub(in crate::format) struct WireMessage<'a> {
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
pub(in crate::format) struct WireTool<'a> {
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
pub(in crate::format) fn wire_messages(
    conv: &Conversation,
) -> Result<Vec<WireMessage<'_>>, FormatError> {
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

pub(in crate::format) fn wire_body(conv: &Conversation) -> Result<WireBody<'_>, FormatError> {
    Ok(WireBody { messages: wire_messages(conv)?, tools: wire_tools(conv, Layout::Document)? })
}

/// The JSONL header, `None` when nothing needs one.
pub(in crate::format) fn wire_header(
    conv: &Conversation,
) -> Result<Option<WireHeader<'_>>, FormatError> {
    let tools = wire_tools(conv, Layout::Lines)?;
    Ok((!tools.is_empty()).then_some(WireHeader { tools }))
}
