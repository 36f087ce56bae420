//! Writing a [`Conversation`] as Anthropic Messages wire structs: the leading system
//! messages hoisted to `system`, adjacent messages of one role merged into one turn.

use std::borrow::Cow;

use ctxwin_core::Role;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{OPENING_USER_TEXT, SYSTEM_PREFIX};
use crate::format::check::{self, Layout};
use crate::format::error::FormatError;
use crate::message::{ChatMessage, Conversation};

/// A request body without the model: what the JSON writer emits.
#[derive(Serialize)]
pub(in crate::format) struct WireBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<WireContent<'a>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

/// The JSONL header line: what a message line cannot carry.
#[derive(Serialize)]
pub(in crate::format) struct WireHeader<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

#[derive(Serialize)]
pub(in crate::format) struct WireMessage<'a> {
    pub(in crate::format) role: &'static str,
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
pub(in crate::format) struct WireTool<'a> {
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

pub(in crate::format) fn wire_body(conv: &Conversation) -> Result<WireBody<'_>, FormatError> {
    let (system, messages) = wire_messages(conv, Layout::Document)?;
    Ok(WireBody { system, messages, tools: wire_tools(conv, Layout::Document)? })
}

/// The JSONL header (`None` when there is no system and no tool) and the message lines.
pub(in crate::format) fn wire_lines(
    conv: &Conversation,
) -> Result<(Option<WireHeader<'_>>, Vec<WireMessage<'_>>), FormatError> {
    let (system, messages) = wire_messages(conv, Layout::Lines)?;
    let tools = wire_tools(conv, Layout::Lines)?;
    let header = (system.is_some() || !tools.is_empty()).then_some(WireHeader { system, tools });
    Ok((header, messages))
}
