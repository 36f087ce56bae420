//! Reading the upstream's answer: the assistant message (text, tool calls, thinking blocks)
//! and the billed `usage`, from a JSON body or assembled from a server-sent-event stream
//! chunk by chunk while the chunks pass through to the client untouched.

use serde_json::{Map, Value};

use crate::wire::Provider;

/// What a complete answer holds for the session.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The assistant message as a message of the request format (what the client will echo).
    pub message: Value,
    /// Prompt tokens the provider billed (cache reads and writes included), when reported.
    pub prompt_tokens: Option<u32>,
    /// The prompt's tokens by price, as the provider billed them (zero when not reported).
    pub billed: Billed,
}

/// A prompt's tokens by price, as the provider's `usage` reports them.
///
/// ```
/// let billed = ctxwin_proxy::assemble::Billed { uncached: 10, cache_write: 0, cache_read: 90 };
/// assert_eq!(billed.cache_read, 90);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    /// At the base input price (Anthropic `input_tokens`; OpenAI `prompt_tokens` less the
    /// cached ones).
    pub uncached: u64,
    /// Written to the prompt cache (Anthropic `cache_creation_input_tokens`).
    pub cache_write: u64,
    /// Read from the prompt cache (Anthropic `cache_read_input_tokens`; OpenAI
    /// `prompt_tokens_details.cached_tokens`).
    pub cache_read: u64,
}

fn as_u64(value: Option<&Value>) -> u64 {
    value.and_then(Value::as_u64).unwrap_or(0)
}

fn anthropic_billed(usage: &Value) -> Billed {
    Billed {
        uncached: as_u64(usage.get("input_tokens")),
        cache_write: as_u64(usage.get("cache_creation_input_tokens")),
        cache_read: as_u64(usage.get("cache_read_input_tokens")),
    }
}

fn openai_billed(usage: &Value) -> Billed {
    let prompt = as_u64(usage.get("prompt_tokens"));
    let cached = as_u64(usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens")));
    Billed {
        uncached: prompt.saturating_sub(cached),
        cache_write: 0,
        cache_read: cached.min(prompt),
    }
}

fn as_u32(value: Option<&Value>) -> Option<u32> {
    value.and_then(Value::as_u64).map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn anthropic_prompt_tokens(usage: &Value) -> Option<u32> {
    let input = as_u32(usage.get("input_tokens"))?;
    let cached = as_u32(usage.get("cache_creation_input_tokens")).unwrap_or(0)
        + as_u32(usage.get("cache_read_input_tokens")).unwrap_or(0);
    Some(input.saturating_add(cached))
}

/// The answer in a non-streaming response body, if it has one.
pub fn from_body(provider: Provider, body: &[u8]) -> Option<Answer> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match provider {
        Provider::OpenAi => {
            let message = value.get("choices")?.get(0)?.get("message")?.clone();
            let usage = value.get("usage");
            let prompt_tokens = as_u32(usage.and_then(|u| u.get("prompt_tokens")));
            let billed = usage.map(openai_billed).unwrap_or_default();
            Some(Answer { message: openai_clean(message), prompt_tokens, billed })
        }
        Provider::Anthropic => {
            let content = value.get("content")?.clone();
            let message = serde_json::json!({"role": "assistant", "content": content});
            let usage = value.get("usage");
            Some(Answer {
                message,
                prompt_tokens: usage.and_then(anthropic_prompt_tokens),
                billed: usage.map(anthropic_billed).unwrap_or_default(),
            })
        }
    }
}

/// The fields of an OpenAI response message that a request message has.
fn openai_clean(message: Value) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), Value::from("assistant"));
    out.insert("content".into(), message.get("content").cloned().unwrap_or(Value::Null));
    if let Some(calls) =
        message.get("tool_calls").filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
    {
        out.insert("tool_calls".into(), calls.clone());
    }
    if let Some(refusal) = message.get("refusal").filter(|r| !r.is_null()) {
        out.insert("refusal".into(), refusal.clone());
    }
    Value::Object(out)
}

/// Assembles an answer from an SSE stream fed in arbitrary chunks.
#[derive(Debug)]
pub struct StreamAssembler {
    provider: Provider,
    line: Vec<u8>,
    done: bool,
    failed: bool,
    prompt_tokens: Option<u32>,
    billed: Billed,
    // OpenAI
    text: String,
    calls: Vec<(String, String, String)>,
    // Anthropic
    blocks: Vec<Value>,
    partial_json: Vec<String>,
}

impl StreamAssembler {
    /// An empty assembler for `provider`'s event format.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
            line: Vec::new(),
            done: false,
            failed: false,
            prompt_tokens: None,
            billed: Billed::default(),
            text: String::new(),
            calls: Vec::new(),
            blocks: Vec::new(),
            partial_json: Vec::new(),
        }
    }

    /// Feeds the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.on_line(&line);
            } else {
                self.line.push(byte);
            }
        }
    }

    fn on_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            if self.provider == Provider::OpenAi {
                self.done = true;
            }
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(data) else { return };
        match self.provider {
            Provider::OpenAi => self.openai_event(&event),
            Provider::Anthropic => self.anthropic_event(&event),
        }
    }

    fn openai_event(&mut self, event: &Value) {
        if event.get("error").is_some() {
            self.failed = true;
            return;
        }
        if let Some(usage) = event.get("usage").filter(|u| u.get("prompt_tokens").is_some()) {
            self.prompt_tokens = as_u32(usage.get("prompt_tokens"));
            self.billed = openai_billed(usage);
        }
        let Some(delta) = event.get("choices").and_then(|c| c.get(0)).and_then(|c| c.get("delta"))
        else {
            return;
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            self.text.push_str(text);
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            while self.calls.len() <= index {
                self.calls.push(Default::default());
            }
            let slot = &mut self.calls[index];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                slot.0.push_str(id);
            }
            if let Some(function) = call.get("function") {
                if let Some(name) = function.get("name").and_then(Value::as_str) {
                    slot.1.push_str(name);
                }
                if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                    slot.2.push_str(arguments);
                }
            }
        }
    }

    fn anthropic_event(&mut self, event: &Value) {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "message_start" => {
                if let Some(usage) = event.get("message").and_then(|m| m.get("usage")) {
                    self.prompt_tokens = anthropic_prompt_tokens(usage);
                    self.billed = anthropic_billed(usage);
                }
            }
            "content_block_start" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                while self.blocks.len() <= index {
                    self.blocks.push(Value::Null);
                    self.partial_json.push(String::new());
                }
                self.blocks[index] = block;
            }
            "content_block_delta" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let (Some(block), Some(delta)) = (self.blocks.get_mut(index), event.get("delta"))
                else {
                    return;
                };
                let append = |block: &mut Value, key: &str, text: &str| {
                    if let Some(map) = block.as_object_mut() {
                        let entry = map.entry(key.to_string()).or_insert_with(|| Value::from(""));
                        if let Value::String(s) = entry {
                            s.push_str(text);
                        } else {
                            *entry = Value::from(text);
                        }
                    }
                };
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text_delta" => append(block, "text", text("text")),
                    "thinking_delta" => append(block, "thinking", text("thinking")),
                    "signature_delta" => append(block, "signature", text("signature")),
                    "input_json_delta" => self.partial_json[index].push_str(text("partial_json")),
                    "citations_delta" => {
                        if let (Some(map), Some(citation)) =
                            (block.as_object_mut(), delta.get("citation"))
                        {
                            let list =
                                map.entry("citations").or_insert_with(|| Value::Array(vec![]));
                            if let Value::Array(list) = list {
                                list.push(citation.clone());
                            } else {
                                *list = Value::Array(vec![citation.clone()]);
                            }
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                let json = self.partial_json.get(index).cloned().unwrap_or_default();
                if let Some(block) = self.blocks.get_mut(index)
                    && !json.is_empty()
                    && let Some(map) = block.as_object_mut()
                {
                    let input = serde_json::from_str(&json).unwrap_or(Value::String(json));
                    map.insert("input".into(), input);
                }
            }
            "message_stop" => self.done = true,
            "error" => self.failed = true,
            _ => {}
        }
    }

    /// The answer, when the stream ended properly (`[DONE]` / `message_stop`).
    pub fn finish(mut self) -> Option<Answer> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.on_line(&line);
        }
        if !self.done || self.failed {
            return None;
        }
        let message = match self.provider {
            Provider::OpenAi => {
                let mut out = Map::new();
                out.insert("role".into(), Value::from("assistant"));
                let content = if self.text.is_empty() && !self.calls.is_empty() {
                    Value::Null
                } else {
                    Value::from(self.text)
                };
                out.insert("content".into(), content);
                if !self.calls.is_empty() {
                    let calls = self
                        .calls
                        .into_iter()
                        .map(|(id, name, arguments)| {
                            serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                        })
                        .collect();
                    out.insert("tool_calls".into(), Value::Array(calls));
                }
                Value::Object(out)
            }
            Provider::Anthropic => {
                let blocks: Vec<Value> = self.blocks.into_iter().filter(|b| !b.is_null()).collect();
                serde_json::json!({"role": "assistant", "content": blocks})
            }
        };
        Some(Answer { message, prompt_tokens: self.prompt_tokens, billed: self.billed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_stream_assembles_text_and_calls() {
        let mut a = StreamAssembler::new(Provider::OpenAi);
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"ls\",\"arguments\":\"{\\\"p\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":40}}}\n\n",
            "data: [DONE]\n\n"
        );
        for chunk in stream.as_bytes().chunks(7) {
            a.feed(chunk);
        }
        let answer = a.finish().unwrap();
        assert_eq!(answer.prompt_tokens, Some(42));
        assert_eq!(answer.billed, Billed { uncached: 2, cache_write: 0, cache_read: 40 });
        assert_eq!(answer.message["content"], "Hello");
        assert_eq!(answer.message["tool_calls"][0]["function"]["arguments"], "{\"p\":1}");
    }

    #[test]
    fn truncated_stream_gives_nothing() {
        let mut a = StreamAssembler::new(Provider::OpenAi);
        a.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n");
        assert!(a.finish().is_none());
    }

    #[test]
    fn anthropic_stream_assembles_thinking_and_tool_use() {
        let mut a = StreamAssembler::new(Provider::Anthropic);
        let events = [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":3,"cache_read_input_tokens":5}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"ls","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"p\":"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_stop"}"#,
        ];
        for event in events {
            a.feed(format!("event: x\ndata: {event}\n\n").as_bytes());
        }
        let answer = a.finish().unwrap();
        assert_eq!(answer.prompt_tokens, Some(18));
        assert_eq!(answer.billed, Billed { uncached: 10, cache_write: 3, cache_read: 5 });
        assert_eq!(answer.message["content"][0]["signature"], "sig");
        assert_eq!(answer.message["content"][1]["input"]["p"], 1);
    }
}
