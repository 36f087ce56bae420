//! The session as either provider's client sends it: the Anthropic messages API as generated,
//! or converted to OpenAI chat completions (tool calls, tool messages, `image_url` parts;
//! thinking stays with the provider, web search results become the answer's text).

use serde_json::{Value, json};

use crate::session::{EditRef, Session};

/// The OpenAI model the converted session asks for.
pub const OPENAI_MODEL: &str = "gpt-4o";

/// Which API a conversation speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /v1/chat/completions`.
    OpenAi,
}

impl Provider {
    /// `anthropic` or `openai`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        }
    }

    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Provider::Anthropic => "/v1/messages",
            Provider::OpenAi => "/v1/chat/completions",
        }
    }
}

/// One request: the messages it adds after the previous answer, and its scripted answer.
#[derive(Clone, Debug)]
pub struct Step {
    /// The messages the client adds (Anthropic: one user message; OpenAI: tool messages and/or
    /// a user message).
    pub user: Vec<Value>,
    /// The assistant message the upstream answers with.
    pub answer: Value,
    /// Whether the request asks for a stream.
    pub stream: bool,
    /// When it is sent, ms of simulated time.
    pub at_ms: u64,
    /// The answer's `Edit` calls (`read_id` in this provider's id form).
    pub edits: Vec<EditRef>,
}

/// A whole conversation in one provider's shape.
#[derive(Clone, Debug)]
pub struct Conversation {
    /// Its API.
    pub provider: Provider,
    /// The model it asks for.
    pub model: &'static str,
    /// Anthropic's `system` blocks (empty for OpenAI).
    pub system: Vec<Value>,
    /// The tool definitions.
    pub tools: Vec<Value>,
    /// Messages before the first step (OpenAI: the system message).
    pub lead: Vec<Value>,
    /// The requests.
    pub steps: Vec<Step>,
}

/// The OpenAI tool-call id for an Anthropic `toolu_01…` id.
pub fn openai_id(id: &str) -> String {
    format!("call_{}", id.strip_prefix("toolu_01").unwrap_or(id))
}

fn openai_answer(answer: &Value) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in answer["content"].as_array().into_iter().flatten() {
        match block["type"].as_str().unwrap_or("") {
            "text" => text.push_str(block["text"].as_str().unwrap_or("")),
            "server_tool_use" => text.push_str(&format!(
                "I searched the web for \"{}\".\n",
                block["input"]["query"].as_str().unwrap_or("")
            )),
            "web_search_tool_result" => {
                for r in block["content"].as_array().into_iter().flatten() {
                    text.push_str(&format!(
                        "- {} ({})\n",
                        r["title"].as_str().unwrap_or(""),
                        r["url"].as_str().unwrap_or("")
                    ));
                }
            }
            "tool_use" => calls.push(
                json!({"id": openai_id(block["id"].as_str().unwrap_or("")), "type": "function",
                "function": {"name": block["name"], "arguments": block["input"].to_string()}}),
            ),
            _ => {}
        }
    }
    let content = if text.is_empty() { Value::Null } else { Value::String(text) };
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

fn image_part(block: &Value) -> Value {
    let data = block["source"]["data"].as_str().unwrap_or("");
    json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}})
}

fn openai_user(user: &Value) -> Vec<Value> {
    let blocks = user["content"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut parts = Vec::new();
    for block in &blocks {
        match block["type"].as_str().unwrap_or("") {
            "tool_result" => {
                let id = openai_id(block["tool_use_id"].as_str().unwrap_or(""));
                let content = match &block["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(items) => {
                        let mut text = String::new();
                        for item in items {
                            if item["type"] == "image" {
                                text.push_str("[the image is attached in the next user message]");
                                parts.push(image_part(item));
                            } else if let Some(t) = item["text"].as_str() {
                                text.push_str(t);
                            }
                        }
                        text
                    }
                    _ => String::new(),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            "image" => parts.push(image_part(block)),
            "text" => parts.push(json!({"type": "text", "text": block["text"]})),
            _ => {}
        }
    }
    if parts.len() == 1 && parts[0]["type"] == "text" {
        out.push(json!({"role": "user", "content": parts[0]["text"]}));
    } else if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    out
}

impl Conversation {
    /// The session as generated.
    pub fn anthropic(session: &Session) -> Conversation {
        Conversation {
            provider: Provider::Anthropic,
            model: crate::session::ANTHROPIC_MODEL,
            system: session.system.clone(),
            tools: session.tools.clone(),
            lead: Vec::new(),
            steps: session
                .turns
                .iter()
                .map(|t| Step {
                    user: vec![t.user.clone()],
                    answer: t.answer.clone(),
                    stream: t.stream,
                    at_ms: t.at_ms,
                    edits: t.edits.clone(),
                })
                .collect(),
        }
    }

    /// The session as an OpenAI chat-completions client sends it.
    pub fn openai(session: &Session) -> Conversation {
        let system: Vec<&str> = session.system.iter().filter_map(|b| b["text"].as_str()).collect();
        let tools = session
            .tools
            .iter()
            .filter(|t| t.get("input_schema").is_some())
            .map(|t| json!({"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}))
            .collect();
        Conversation {
            provider: Provider::OpenAi,
            model: OPENAI_MODEL,
            system: Vec::new(),
            tools,
            lead: vec![json!({"role": "system", "content": system.join("\n\n")})],
            steps: session
                .turns
                .iter()
                .map(|t| Step {
                    user: openai_user(&t.user),
                    answer: openai_answer(&t.answer),
                    stream: t.stream,
                    at_ms: t.at_ms,
                    edits: t
                        .edits
                        .iter()
                        .map(|e| EditRef {
                            old_string: e.old_string.clone(),
                            read_id: openai_id(&e.read_id),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The request body's fields other than `messages` and `stream`, as JSON object members
    /// (`"model":…,"max_tokens":…`), in the order a client sends them.
    pub fn head(&self) -> String {
        let max = crate::session::MAX_TOKENS;
        match self.provider {
            Provider::Anthropic => format!(
                r#""model":{},"max_tokens":{max},"thinking":{{"type":"enabled","budget_tokens":{}}},"system":{},"tools":{},"metadata":{{"user_id":"user_bench_session"}}"#,
                json!(self.model),
                crate::session::THINKING_BUDGET,
                Value::Array(self.system.clone()),
                Value::Array(self.tools.clone())
            ),
            Provider::OpenAi => format!(
                r#""model":{},"max_tokens":{max},"tools":{},"parallel_tool_calls":true"#,
                json!(self.model),
                Value::Array(self.tools.clone())
            ),
        }
    }
}
