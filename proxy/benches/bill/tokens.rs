//! What a prompt costs, by the fake upstream's count: a prompt is a list of units (Anthropic:
//! each tool definition, system block and message content block; OpenAI: the tool list and each
//! message), each with a content hash (without `cache_control`, which clients move from turn to
//! turn and which is not part of the prompt) and its tokens.
//!
//! Tokens are the core's estimator with its safety margin off (`Margin::TIGHT`): deterministic
//! and the same whether a body came direct or through the proxy. Images cost what the providers
//! document: Anthropic `width × height / 750`; OpenAI high detail `85 + 170` per 512-px tile
//! after scaling into 2048 × 2048 and the short side to 768.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::{Estimator, Margin, Weights};
use serde_json::Value;

use crate::png;

/// The estimator every count uses.
pub const ESTIMATOR: Estimator = Estimator::with(Weights::CL100K, Margin::TIGHT);
/// Tokens of framing per content block (Anthropic) or tool call (OpenAI).
pub const BLOCK_OVERHEAD: u32 = 3;
/// Tokens of framing per message (role and separators).
pub const MESSAGE_OVERHEAD: u32 = 4;

/// Tokens of `text`.
pub fn count(text: &str) -> u32 {
    ESTIMATOR.count(text)
}

fn hash_value(value: &Value, h: &mut DefaultHasher) {
    match value {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            for item in items {
                hash_value(item, h);
            }
        }
        Value::Object(map) => {
            // serde_json's map is ordered by key here (no `preserve_order`): canonical.
            5u8.hash(h);
            for (key, item) in map {
                if key == "cache_control" {
                    continue;
                }
                key.hash(h);
                hash_value(item, h);
            }
        }
    }
}

/// A hash of `value`'s content, key order and `cache_control` (at any depth) left out.
pub fn content_hash(value: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    hash_value(value, &mut h);
    h.finish()
}

/// One unit of a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Its content hash (with its role and whether it opens a message).
    pub hash: u64,
    /// Its tokens.
    pub tokens: u32,
    /// It carries `cache_control` (Anthropic).
    pub breakpoint: bool,
}

/// A prompt as units, and where the messages begin.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Its units, in prompt order.
    pub units: Vec<Unit>,
    /// The index of the first unit of the conversation's messages (after tools and system).
    pub messages_start: usize,
}

impl Layout {
    /// Its tokens.
    pub fn tokens(&self) -> u64 {
        self.units.iter().map(|u| u64::from(u.tokens)).sum()
    }

    /// The tokens before the messages (tools and system).
    pub fn head_tokens(&self) -> u64 {
        self.units[..self.messages_start].iter().map(|u| u64::from(u.tokens)).sum()
    }
}

/// Anthropic's image tokens for a base64 PNG (0 when it is not one).
pub fn anthropic_image(data: &str) -> u32 {
    png::size(data).map_or(0, |(w, h)| ((u64::from(w) * u64::from(h)) / 750) as u32)
}

/// OpenAI's high-detail image tokens for a base64 PNG (0 when it is not one).
pub fn openai_image(data: &str) -> u32 {
    let Some((w, h)) = png::size(data) else { return 0 };
    let (mut w, mut h) = (f64::from(w), f64::from(h));
    let fit = (2048.0 / w.max(h)).min(1.0);
    (w, h) = (w * fit, h * fit);
    let short = (768.0 / w.min(h)).min(1.0);
    (w, h) = (w * short, h * short);
    85 + 170 * ((w / 512.0).ceil() * (h / 512.0).ceil()) as u32
}

fn json_tokens(value: &Value) -> u32 {
    count(&value.to_string())
}

/// Tokens of one Anthropic content block (without framing).
pub fn anthropic_block(block: &Value) -> u32 {
    let text = |v: &Value| v.as_str().map_or(0, count);
    match block["type"].as_str().unwrap_or("") {
        "text" => text(&block["text"]),
        "thinking" => text(&block["thinking"]),
        "redacted_thinking" => block["data"].as_str().map_or(0, |d| (d.len() / 4) as u32),
        "tool_use" | "server_tool_use" => text(&block["name"]) + json_tokens(&block["input"]),
        "image" => block["source"]["data"].as_str().map_or(0, anthropic_image),
        "tool_result" => match &block["content"] {
            Value::String(s) => count(s),
            Value::Array(items) => items.iter().map(anthropic_block).sum(),
            _ => 0,
        },
        "web_search_tool_result" => block["content"].as_array().map_or(0, |results| {
            results
                .iter()
                .map(|r| {
                    text(&r["title"])
                        + text(&r["url"])
                        + r["encrypted_content"].as_str().map_or(0, |c| (c.len() / 4) as u32)
                })
                .sum()
        }),
        _ => json_tokens(block),
    }
}

/// Counts units, remembering the tokens of every content hash seen.
#[derive(Debug, Default)]
pub struct Counter {
    memo: HashMap<u64, u32>,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut h = DefaultHasher::new();
    (a, b).hash(&mut h);
    h.finish()
}

impl Counter {
    fn unit(&mut self, value: &Value, tag: u64, count: impl FnOnce(&Value) -> u32) -> Unit {
        let hash = mix(content_hash(value), tag);
        let tokens = *self.memo.entry(hash).or_insert_with(|| count(value));
        let breakpoint = value.get("cache_control").is_some_and(|c| !c.is_null());
        Unit { hash, tokens, breakpoint }
    }

    /// The units of an Anthropic message (one per content block; the first carries the
    /// message's framing).
    pub fn anthropic_message(&mut self, message: &Value) -> Vec<Unit> {
        let role = if message["role"] == "assistant" { 20 } else { 10 };
        let owned;
        let blocks: &[Value] = match &message["content"] {
            Value::String(s) => {
                owned = [serde_json::json!({"type": "text", "text": s})];
                &owned
            }
            Value::Array(blocks) => blocks,
            _ => &[],
        };
        blocks
            .iter()
            .enumerate()
            .map(|(i, block)| {
                let frame = if i == 0 { MESSAGE_OVERHEAD } else { 0 } + BLOCK_OVERHEAD;
                let mut unit = self.unit(block, role + u64::from(i == 0), anthropic_block);
                unit.tokens += frame;
                unit
            })
            .collect()
    }

    /// The layout of an Anthropic request body: tools, system, messages.
    pub fn anthropic(&mut self, body: &Value) -> Layout {
        let mut units = Vec::new();
        for tool in body["tools"].as_array().into_iter().flatten() {
            let mut unit = self.unit(tool, 1, json_tokens);
            unit.tokens += BLOCK_OVERHEAD;
            units.push(unit);
        }
        match &body["system"] {
            Value::String(s) => {
                let block = serde_json::json!({"type": "text", "text": s});
                let mut unit = self.unit(&block, 2, anthropic_block);
                unit.tokens += BLOCK_OVERHEAD;
                units.push(unit);
            }
            Value::Array(blocks) => {
                for block in blocks {
                    let mut unit = self.unit(block, 2, anthropic_block);
                    unit.tokens += BLOCK_OVERHEAD;
                    units.push(unit);
                }
            }
            _ => {}
        }
        let messages_start = units.len();
        for message in body["messages"].as_array().into_iter().flatten() {
            units.extend(self.anthropic_message(message));
        }
        Layout { units, messages_start }
    }

    /// The unit of an OpenAI message.
    pub fn openai_message(&mut self, message: &Value) -> Unit {
        let role = match message["role"].as_str().unwrap_or("") {
            "system" | "developer" => 30,
            "user" => 31,
            "assistant" => 32,
            _ => 33,
        };
        self.unit(message, role, |m| {
            let content = match &m["content"] {
                Value::String(s) => count(s),
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| match p["type"].as_str().unwrap_or("") {
                        "text" => p["text"].as_str().map_or(0, count),
                        "image_url" => p["image_url"]["url"]
                            .as_str()
                            .and_then(|u| u.strip_prefix("data:image/png;base64,"))
                            .map_or(85, openai_image),
                        _ => json_tokens(p),
                    })
                    .sum(),
                _ => 0,
            };
            let calls: u32 = m["tool_calls"].as_array().map_or(0, |calls| {
                calls
                    .iter()
                    .map(|c| {
                        count(c["function"]["name"].as_str().unwrap_or(""))
                            + count(c["function"]["arguments"].as_str().unwrap_or(""))
                            + BLOCK_OVERHEAD
                    })
                    .sum()
            });
            content + calls + MESSAGE_OVERHEAD
        })
    }

    /// The layout of an OpenAI request body: the tool list as one unit, then each message; the
    /// messages begin after the leading system messages.
    pub fn openai(&mut self, body: &Value) -> Layout {
        let mut units = Vec::new();
        if let Some(tools) = body["tools"].as_array().filter(|t| !t.is_empty()) {
            units.push(self.unit(&body["tools"], 3, |_| tools.iter().map(json_tokens).sum()));
        }
        let mut messages_start = None;
        for message in body["messages"].as_array().into_iter().flatten() {
            if messages_start.is_none()
                && !matches!(message["role"].as_str(), Some("system" | "developer"))
            {
                messages_start = Some(units.len());
            }
            units.push(self.openai_message(message));
        }
        let messages_start = messages_start.unwrap_or(units.len());
        Layout { units, messages_start }
    }
}

/// The hash of each prefix of `units` (`prefix[i]` covers units `0..=i`).
pub fn prefix_hashes(units: &[Unit]) -> Vec<u64> {
    let mut out = Vec::with_capacity(units.len());
    let mut running = 0x5bd1_e995u64;
    for unit in units {
        running = mix(running, unit.hash);
        out.push(running);
    }
    out
}
