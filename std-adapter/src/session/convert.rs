//! Conversions between the std side's owned messages and the core's borrowed ones, and the
//! rendering of a core payload as an owned [`Conversation`].

use ctxwin_core::{
    MessageRef, Payload, PayloadItem, Role, entities::Entities, payload::ENTITIES_PREFIX,
};
use serde_json::value::RawValue;

use super::SessionError;
use crate::message::{ChatMessage, Conversation, ToolDefinition};
use crate::store::ArchivedMessage;

/// The core's view of `message`'s tool calls, borrowed.
pub(crate) fn core_calls(message: &ChatMessage) -> Vec<ctxwin_core::ToolCall<'_>> {
    message.tool_calls.iter().map(crate::message::ToolCall::as_core).collect()
}

/// A stored core message as an archive row of unit `unit`.
pub(crate) fn row_from_ref(message: &MessageRef<'_>, unit: u64) -> ArchivedMessage {
    ArchivedMessage::new(message.id(), unit, ChatMessage::from_stored(message))
        .with_level(message.level())
        .with_timestamp(message.timestamp())
        .with_tokens(message.tokens())
}

/// The JSON function object the core stores for a tool (and counts): `{"name","description","parameters"}`
/// with the parameters embedded verbatim.
pub fn tool_definition_json(tool: &ToolDefinition) -> Result<String, SessionError> {
    let invalid = |reason: String| SessionError::ToolDefinition { name: tool.name.clone(), reason };
    let parameters: &RawValue =
        serde_json::from_str(&tool.parameters).map_err(|e| invalid(e.to_string()))?;
    if !parameters.get().trim_start().starts_with('{') {
        return Err(invalid("parameters are not a JSON object".into()));
    }
    #[derive(serde::Serialize)]
    struct Function<'a> {
        name: &'a str,
        description: &'a str,
        parameters: &'a RawValue,
    }
    let function = Function { name: &tool.name, description: &tool.description, parameters };
    serde_json::to_string(&function).map_err(|e| invalid(e.to_string()))
}

/// Reads back a function object stored by [`tool_definition_json`] (or any with a `name`).
pub(crate) fn tool_definition_from_json(json: &str) -> Result<ToolDefinition, SessionError> {
    #[derive(serde::Deserialize)]
    struct Function {
        name: String,
        #[serde(default)]
        description: String,
        parameters: Option<Box<RawValue>>,
    }
    let function: Function = serde_json::from_str(json)
        .map_err(|e| SessionError::ToolDefinition { name: String::new(), reason: e.to_string() })?;
    Ok(ToolDefinition {
        name: function.name,
        description: function.description,
        parameters: function.parameters.map_or_else(|| "{}".to_string(), |p| p.get().to_string()),
    })
}

/// The entity block's text, as the core's `write_openai` writes it: `[Entities]` and a JSON
/// object of every declared key, `null` while unknown.
pub(crate) fn entities_text(entities: &Entities<'_>) -> String {
    let pairs: Vec<String> = entities
        .iter()
        .map(|(key, value)| {
            let value = value.map_or_else(|| "null".to_string(), json_string);
            format!("{}:{value}", json_string(key))
        })
        .collect();
    format!("{ENTITIES_PREFIX}\n{{{}}}", pairs.join(","))
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// The payload as an owned conversation: system messages (permanent, dynamic context, entity
/// block, memory summary) in payload order, the tool definitions, then the history.
pub(crate) fn render(payload: &Payload<'_>) -> Result<Conversation, SessionError> {
    let mut conversation = Conversation::default();
    let system = |text: String| ChatMessage::text(Role::System, text);
    for item in payload.items() {
        match item {
            PayloadItem::System(message) => {
                conversation.messages.push(ChatMessage::from_stored(&message))
            }
            PayloadItem::ToolDefinition(message) => {
                conversation.tools.push(tool_definition_from_json(message.content())?);
            }
            PayloadItem::Dynamic(text) => conversation.messages.push(system(text.to_string())),
            PayloadItem::Entities(entities) => {
                conversation.messages.push(system(entities_text(&entities)));
            }
            PayloadItem::MemorySummary(summary) => {
                conversation.messages.push(system(summary.parts().collect()));
            }
            PayloadItem::Message(message) => {
                conversation.messages.push(ChatMessage::from_stored(&message))
            }
        }
    }
    Ok(conversation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_definitions_round_trip() {
        let tool = ToolDefinition {
            name: "grep".into(),
            description: "search \"files\"".into(),
            parameters: r#"{"type": "object", "properties": {"pattern": {"type": "string"}}}"#
                .into(),
        };
        let json = tool_definition_json(&tool).unwrap();
        assert!(json.contains(r#""parameters":{"type": "object""#), "{json}");
        assert_eq!(tool_definition_from_json(&json).unwrap(), tool);
        let broken = ToolDefinition { parameters: "[1,2]".into(), ..tool };
        assert!(matches!(tool_definition_json(&broken), Err(SessionError::ToolDefinition { .. })));
    }
}
