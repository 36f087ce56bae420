//! What the fake upstream refuses with a 400, as the real APIs do: broken tool pairs, turns out
//! of order, thinking or server-tool blocks not byte-identical to what it emitted (signatures
//! included), bad images, more than four cache breakpoints, empty text.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::cache::MAX_BREAKPOINTS;
use crate::conversation::Conversation;
use crate::png;

/// What the upstream emitted over a conversation: the opaque blocks a client must send back
/// unchanged.
#[derive(Debug, Default)]
pub struct Emitted {
    thinking: HashMap<String, String>,
    redacted: HashSet<String>,
    server: HashMap<String, Value>,
    results: HashMap<String, Value>,
    citations: HashMap<String, Value>,
}

impl Emitted {
    /// The opaque blocks of every scripted answer of `conversation`.
    pub fn of(conversation: &Conversation) -> Self {
        let mut out = Emitted::default();
        for step in &conversation.steps {
            for block in step.answer["content"].as_array().into_iter().flatten() {
                match block["type"].as_str().unwrap_or("") {
                    "thinking" => {
                        out.thinking
                            .insert(str_of(&block["signature"]), str_of(&block["thinking"]));
                    }
                    "redacted_thinking" => {
                        out.redacted.insert(str_of(&block["data"]));
                    }
                    "server_tool_use" => {
                        out.server.insert(str_of(&block["id"]), block.clone());
                    }
                    "web_search_tool_result" => {
                        out.results.insert(str_of(&block["tool_use_id"]), block.clone());
                    }
                    "text" => {
                        for c in block["citations"].as_array().into_iter().flatten() {
                            out.citations.insert(str_of(&c["encrypted_index"]), c.clone());
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn without_cache_control(block: &Value) -> Value {
    let mut block = block.clone();
    if let Some(map) = block.as_object_mut() {
        map.remove("cache_control");
    }
    block
}

fn count_breakpoints(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            usize::from(map.get("cache_control").is_some_and(|c| !c.is_null()))
                + map
                    .iter()
                    .filter(|(k, _)| *k == "content")
                    .map(|(_, v)| count_breakpoints(v))
                    .sum::<usize>()
        }
        Value::Array(items) => items.iter().map(count_breakpoints).sum(),
        _ => 0,
    }
}

fn check_image(block: &Value, at: &str) -> Result<(), String> {
    let source = &block["source"];
    if source["type"] != "base64" || source["media_type"] != "image/png" {
        return Err(format!("{at}: image source must be base64 image/png"));
    }
    png::size(source["data"].as_str().unwrap_or(""))
        .map(|_| ())
        .ok_or(format!("{at}: the image data is not a valid PNG"))
}

fn check_text(block: &Value, at: &str, emitted: &Emitted) -> Result<(), String> {
    if block["text"].as_str().is_none_or(str::is_empty) {
        return Err(format!("{at}: text content blocks must be non-empty"));
    }
    for (c, citation) in block["citations"].as_array().into_iter().flatten().enumerate() {
        if emitted.citations.get(citation["encrypted_index"].as_str().unwrap_or(""))
            != Some(citation)
        {
            return Err(format!(
                "{at}.citations.{c}: invalid citation (encrypted_index does not match)"
            ));
        }
    }
    Ok(())
}

/// Checks an Anthropic request body.
///
/// # Errors
/// The message a real API's 400 would carry.
pub fn anthropic(body: &Value, emitted: &Emitted) -> Result<(), String> {
    if !body["model"].is_string() || !body["max_tokens"].is_u64() {
        return Err("model and max_tokens are required".into());
    }
    let thinking = body["thinking"]["type"] == "enabled";
    if thinking && body["thinking"]["budget_tokens"].as_u64() >= body["max_tokens"].as_u64() {
        return Err("max_tokens must be greater than thinking.budget_tokens".into());
    }
    let breakpoints = count_breakpoints(&body["tools"])
        + count_breakpoints(&body["system"])
        + count_breakpoints(&body["messages"]);
    if breakpoints > MAX_BREAKPOINTS {
        return Err(format!(
            "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}."
        ));
    }
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if !tool["name"].is_string()
            || (tool.get("type").is_none() && !tool["input_schema"].is_object())
        {
            return Err(format!("tools.{i}: a tool needs a name and an input_schema"));
        }
    }
    if let Some(system) = body["system"].as_array() {
        for (i, block) in system.iter().enumerate() {
            if block["type"] != "text" {
                return Err(format!("system.{i}: only text blocks are allowed"));
            }
            check_text(block, &format!("system.{i}"), emitted)?;
        }
    }
    let messages = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let mut seen_ids = HashSet::new();
    let mut previous_calls: Vec<String> = Vec::new();
    for (m, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        let expected = if m % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Err(format!(
                "messages.{m}: roles must alternate between \"user\" and \"assistant\", starting with \"user\" (found \"{role}\")"
            ));
        }
        let owned;
        let blocks: &[Value] = match &message["content"] {
            Value::String(s) if !s.is_empty() => {
                owned = [serde_json::json!({"type": "text", "text": s})];
                &owned
            }
            Value::Array(b) if !b.is_empty() => b,
            _ => {
                return Err(format!(
                    "messages.{m}: content must be a non-empty string or list of blocks"
                ));
            }
        };
        let mut calls = Vec::new();
        let mut answered = Vec::new();
        let mut past_results = false;
        for (b, block) in blocks.iter().enumerate() {
            let at = format!("messages.{m}.content.{b}");
            let kind = block["type"].as_str().unwrap_or("");
            if kind == "tool_result" {
                if role != "user" {
                    return Err(format!("{at}: tool_result blocks belong in user messages"));
                }
                if past_results {
                    return Err(format!(
                        "{at}: tool_result blocks must come first in the user message, before any other content"
                    ));
                }
                let id = str_of(&block["tool_use_id"]);
                if !previous_calls.contains(&id) {
                    return Err(format!(
                        "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
                if answered.contains(&id) {
                    return Err(format!("{at}: duplicate tool_result for {id}"));
                }
                answered.push(id);
                match &block["content"] {
                    Value::String(_) | Value::Null => {}
                    Value::Array(items) => {
                        for (i, item) in items.iter().enumerate() {
                            match item["type"].as_str().unwrap_or("") {
                                "text" => check_text(item, &format!("{at}.content.{i}"), emitted)?,
                                "image" => check_image(item, &format!("{at}.content.{i}"))?,
                                other => {
                                    return Err(format!(
                                        "{at}.content.{i}: type {other} is not allowed in a tool_result"
                                    ));
                                }
                            }
                        }
                    }
                    _ => {
                        return Err(format!(
                            "{at}: tool_result content must be a string or a list"
                        ));
                    }
                }
                continue;
            }
            past_results = true;
            match kind {
                "text" => check_text(block, &at, emitted)?,
                "image" => check_image(block, &at)?,
                "thinking" | "redacted_thinking" => {
                    if role != "assistant" {
                        return Err(format!("{at}: thinking blocks belong in assistant messages"));
                    }
                    if block.get("cache_control").is_some() {
                        return Err(format!(
                            "{at}: cache_control cannot be set on thinking blocks"
                        ));
                    }
                    let valid = if kind == "thinking" {
                        emitted.thinking.get(block["signature"].as_str().unwrap_or(""))
                            == Some(&str_of(&block["thinking"]))
                    } else {
                        emitted.redacted.contains(block["data"].as_str().unwrap_or(""))
                    };
                    if !valid {
                        return Err(format!("{at}: Invalid `signature` in `{kind}` block"));
                    }
                }
                "tool_use" => {
                    let id = str_of(&block["id"]);
                    if role != "assistant"
                        || !block["input"].is_object()
                        || block["name"].as_str().is_none()
                    {
                        return Err(format!("{at}: invalid tool_use"));
                    }
                    if !seen_ids.insert(id.clone()) {
                        return Err(format!("{at}: `tool_use` ids must be unique ({id})"));
                    }
                    calls.push(id);
                }
                "server_tool_use" => {
                    let id = str_of(&block["id"]);
                    if emitted.server.get(&id).map(without_cache_control)
                        != Some(without_cache_control(block))
                    {
                        return Err(format!("{at}: server_tool_use {id} was changed"));
                    }
                    let result = blocks.iter().find(|r| {
                        r["type"] == "web_search_tool_result" && r["tool_use_id"] == id.as_str()
                    });
                    if result.is_none() {
                        return Err(format!(
                            "{at}: server_tool_use {id} has no web_search_tool_result in its message"
                        ));
                    }
                }
                "web_search_tool_result" => {
                    let id = str_of(&block["tool_use_id"]);
                    if emitted.results.get(&id).map(without_cache_control)
                        != Some(without_cache_control(block))
                    {
                        return Err(format!(
                            "{at}: web_search_tool_result {id} was changed (encrypted_content must be sent back unchanged)"
                        ));
                    }
                }
                other => return Err(format!("{at}: unknown content block type {other}")),
            }
        }
        if role == "user" && answered.len() != previous_calls.len() {
            let missing: Vec<&String> =
                previous_calls.iter().filter(|c| !answered.contains(c)).collect();
            return Err(format!(
                "messages.{m}: `tool_use` ids were found without `tool_result` blocks immediately after: {missing:?}"
            ));
        }
        if role == "assistant" && thinking && m + 2 == messages.len() && !calls.is_empty() {
            let first = blocks.first().map(|b| str_of(&b["type"])).unwrap_or_default();
            if first != "thinking" && first != "redacted_thinking" {
                return Err(format!(
                    "messages.{m}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block."
                ));
            }
        }
        previous_calls = if role == "assistant" { calls } else { Vec::new() };
    }
    if !previous_calls.is_empty() {
        return Err("the last assistant message has tool_use blocks without results".into());
    }
    Ok(())
}

/// Checks an OpenAI chat-completions request body.
///
/// # Errors
/// The message a real API's 400 would carry.
pub fn openai(body: &Value) -> Result<(), String> {
    if !body["model"].is_string() {
        return Err("you must provide a model parameter".into());
    }
    let messages = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let mut waiting: Vec<String> = Vec::new();
    for (m, message) in messages.iter().enumerate() {
        let at = format!("messages[{m}]");
        let role = message["role"].as_str().unwrap_or("");
        if role != "tool" && !waiting.is_empty() {
            return Err(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                waiting.join(", ")
            ));
        }
        match role {
            "system" | "developer" | "user" => match &message["content"] {
                Value::String(_) => {}
                Value::Array(parts) if !parts.is_empty() => {
                    for (p, part) in parts.iter().enumerate() {
                        match part["type"].as_str().unwrap_or("") {
                            "text" if part["text"].is_string() => {}
                            "image_url" if role == "user" => {
                                let url = part["image_url"]["url"].as_str().unwrap_or("");
                                let data = url
                                    .strip_prefix("data:image/png;base64,")
                                    .ok_or(format!("{at}.content[{p}]: unsupported image URL"))?;
                                png::size(data).ok_or(format!(
                                    "{at}.content[{p}]: You uploaded an unsupported image."
                                ))?;
                            }
                            other => {
                                return Err(format!(
                                    "{at}.content[{p}]: invalid part type {other}"
                                ));
                            }
                        }
                    }
                }
                _ => return Err(format!("{at}: invalid content")),
            },
            "assistant" => {
                let calls = message["tool_calls"].as_array();
                if message["content"].is_null() && calls.is_none_or(Vec::is_empty) {
                    return Err(format!("{at}: an assistant message needs content or tool_calls"));
                }
                for (c, call) in calls.into_iter().flatten().enumerate() {
                    let arguments = call["function"]["arguments"].as_str().unwrap_or("");
                    if call["type"] != "function"
                        || !call["function"]["name"].is_string()
                        || serde_json::from_str::<Value>(arguments).is_err()
                    {
                        return Err(format!("{at}.tool_calls[{c}]: invalid tool call"));
                    }
                    waiting.push(str_of(&call["id"]));
                }
            }
            "tool" => {
                let id = str_of(&message["tool_call_id"]);
                let Some(pos) = waiting.iter().position(|w| *w == id) else {
                    return Err(format!(
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls' ({at}, {id})."
                    ));
                };
                waiting.remove(pos);
                if !(message["content"].is_string() || message["content"].is_array()) {
                    return Err(format!("{at}: tool content must be a string"));
                }
            }
            other => return Err(format!("{at}: invalid role {other}")),
        }
    }
    if !waiting.is_empty() {
        return Err(format!("tool_call_ids without response messages: {}", waiting.join(", ")));
    }
    Ok(())
}

/// The texts a model reads in a request body (every string in its system prompt and
/// messages, tool-call arguments parsed), with `cat -n` prefixes removed.
pub fn visible_texts(body: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            // Shorter strings cannot hold an `Edit` target (25 characters or more).
            Value::String(s) if s.len() > 20 => {
                if s.contains('\t') {
                    out.push(crate::text::strip_line_numbers(s));
                } else {
                    out.push(s.clone());
                }
                if s.starts_with('{')
                    && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(s)
                {
                    walk(&parsed, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            Value::Object(map) => map
                .iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "data" | "signature" | "encrypted_content" | "encrypted_index" | "url"
                    )
                })
                .for_each(|(_, v)| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&body["system"], &mut out);
    walk(&body["messages"], &mut out);
    out
}

/// The ids of the tool results a request body carries (`tool_use_id` or `tool_call_id`).
pub fn result_ids(body: &Value) -> HashSet<String> {
    let mut out = HashSet::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        if let Some(id) = message["tool_call_id"].as_str() {
            out.insert(id.to_string());
        }
        for block in message["content"].as_array().into_iter().flatten() {
            if let Some(id) = block["tool_use_id"].as_str() {
                out.insert(id.to_string());
            }
        }
    }
    out
}
