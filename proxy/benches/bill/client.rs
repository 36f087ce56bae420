//! The agent: sends each step's request (its whole history, as real agents do, or a naive
//! client-side trim of it) to a base URL, reads the answer and checks it.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::conversation::{Conversation, Provider};
use crate::session::MAX_TOKENS;
use crate::tokens::Counter;
use crate::upstream::Upstream;

/// The header that tells the proxy when a request was sent in the session's simulated time
/// (its `[proxy] clock_header`): the pauses the fake upstream's cache model sees, the proxy
/// sees too.
pub const CLOCK_HEADER: &str = "x-bill-at-ms";

/// The simulated session's start, ms since the Unix epoch (2026-01-01).
pub const CLOCK_EPOCH_MS: u64 = 1_767_225_600_000;

/// What the client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// The whole history.
    Full,
    /// The newest messages that fit this window (with `max_tokens` kept free), newest first:
    /// the longest suffix the provider accepts as it is (Anthropic: starting at a user turn
    /// without tool results; OpenAI: at any message but a tool result), never splitting a
    /// tool call from its result; system prompt and tools always kept.
    Naive(u32),
}

/// A conversation's requests, serialized once.
pub struct Wire {
    /// The conversation.
    pub conversation: Arc<Conversation>,
    head: String,
    messages: Vec<Value>,
    serialized: Vec<String>,
    /// Running token sums: `prefix[i]` is the tokens of messages `0..i`.
    prefix: Vec<u64>,
    head_tokens: u64,
    step_end: Vec<usize>,
    marked: Vec<String>,
}

fn mark_last_block(message: &Value) -> Value {
    let mut message = message.clone();
    if let Some(last) = message["content"].as_array_mut().and_then(|b| b.last_mut()) {
        last["cache_control"] = json!({"type": "ephemeral"});
    }
    message
}

impl Wire {
    /// Serializes `conversation`'s messages and counts their tokens as the upstream does.
    pub fn new(conversation: Arc<Conversation>) -> Wire {
        let mut counter = Counter::default();
        let mut messages = conversation.lead.clone();
        let mut step_end = Vec::with_capacity(conversation.steps.len());
        let mut marked = Vec::with_capacity(conversation.steps.len());
        for step in &conversation.steps {
            messages.extend(step.user.iter().cloned());
            step_end.push(messages.len());
            marked.push(match (conversation.provider, step.user.last()) {
                (Provider::Anthropic, Some(user)) => mark_last_block(user).to_string(),
                (_, Some(user)) => user.to_string(),
                (_, None) => String::new(),
            });
            messages.push(step.answer.clone());
        }
        let serialized = messages.iter().map(Value::to_string).collect();
        let mut prefix = vec![0u64];
        for message in &messages {
            let tokens = match conversation.provider {
                Provider::Anthropic => {
                    counter.anthropic_message(message).iter().map(|u| u64::from(u.tokens)).sum()
                }
                Provider::OpenAi => u64::from(counter.openai_message(message).tokens),
            };
            prefix.push(prefix.last().copied().unwrap_or(0) + tokens);
        }
        let head = conversation.head();
        let empty: Value =
            serde_json::from_str(&format!("{{{head},\"messages\":[]}}")).unwrap_or(Value::Null);
        let head_tokens = match conversation.provider {
            Provider::Anthropic => counter.anthropic(&empty).tokens(),
            Provider::OpenAi => counter.openai(&empty).tokens(),
        };
        Wire { conversation, head, messages, serialized, prefix, head_tokens, step_end, marked }
    }

    /// The tokens of request `k` with the whole history.
    pub fn full_tokens(&self, k: usize) -> u64 {
        self.head_tokens + self.prefix[self.step_end[k]]
    }

    fn lead(&self) -> usize {
        self.conversation.lead.len()
    }

    fn is_human(&self, i: usize) -> bool {
        let m = &self.messages[i];
        m["role"] == "user"
            && !m["content"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
    }

    /// A request may start at message `i` as it is: Anthropic, a user turn without tool
    /// results; OpenAI, any message but a tool result.
    fn valid_start(&self, i: usize) -> bool {
        match self.conversation.provider {
            Provider::Anthropic => self.is_human(i),
            Provider::OpenAi => self.messages[i]["role"] != "tool",
        }
    }

    /// Anthropic: a first message that is a tool-result turn loses its (orphaned) results.
    fn rewritten_first(&self, i: usize) -> Option<Value> {
        let m = &self.messages[i];
        if self.conversation.provider != Provider::Anthropic
            || self.is_human(i)
            || m["role"] != "user"
        {
            return None;
        }
        let mut rest: Vec<Value> = m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] != "tool_result")
            .cloned()
            .collect();
        if rest.is_empty() {
            rest.push(json!({"type": "text", "text": "[earlier turns of this conversation were trimmed]"}));
        }
        Some(json!({"role": "user", "content": rest}))
    }

    /// Where a naive trim of request `k` at `window` starts, and its first message rewritten
    /// when it had to be.
    fn naive_start(&self, k: usize, window: u32) -> (usize, Option<Value>) {
        let end = self.step_end[k];
        let lead = self.lead();
        let fixed = self.head_tokens + self.prefix[lead];
        let budget = u64::from(window).saturating_sub(u64::from(MAX_TOKENS)).saturating_sub(fixed);
        let fits = |s: usize, first: Option<&Value>| {
            let first_tokens = match first {
                Some(m) => Counter::default()
                    .anthropic_message(m)
                    .iter()
                    .map(|u| u64::from(u.tokens))
                    .sum(),
                None => self.prefix[s + 1] - self.prefix[s],
            };
            first_tokens + self.prefix[end] - self.prefix[s + 1] <= budget
        };
        if let Some(s) = (lead..end).find(|&s| self.valid_start(s) && fits(s, None)) {
            return (s, None);
        }
        // Nothing valid as it is fits (Anthropic, inside a long tool loop): start at a user
        // turn and drop its orphaned tool results.
        let first_from = (lead..end).filter(|&s| self.messages[s]["role"] == "user").find(|&s| {
            let first = self.rewritten_first(s);
            fits(s, first.as_ref())
        });
        // Nothing fits: the smallest pair-safe suffix (over the window).
        let s = first_from.unwrap_or_else(|| {
            let newest = end - 1;
            if self.is_human(newest) {
                newest
            } else {
                match self.conversation.provider {
                    Provider::Anthropic => newest.saturating_sub(2).max(lead),
                    Provider::OpenAi => (lead..end)
                        .rev()
                        .find(|&s| self.messages[s]["role"] == "assistant")
                        .unwrap_or(lead),
                }
            }
        });
        (s, self.rewritten_first(s))
    }

    /// The body of request `k` and its messages' count, whole or trimmed.
    pub fn body(&self, k: usize, trim: Trim) -> (String, usize) {
        let end = self.step_end[k];
        let lead = self.lead();
        let (start, first) = match trim {
            Trim::Full => (lead, None),
            Trim::Naive(window) => self.naive_start(k, window),
        };
        let stream = self.conversation.steps[k].stream;
        let mut body = String::with_capacity(
            self.head.len()
                + self.serialized[..end].iter().map(|s| s.len() + 1).sum::<usize>()
                + 64,
        );
        body.push('{');
        body.push_str(&self.head);
        body.push_str(if stream { ",\"stream\":true" } else { ",\"stream\":false" });
        if stream && self.conversation.provider == Provider::OpenAi {
            body.push_str(",\"stream_options\":{\"include_usage\":true}");
        }
        body.push_str(",\"messages\":[");
        let mut parts: Vec<&str> = self.serialized[..lead].iter().map(String::as_str).collect();
        let anthropic = self.conversation.provider == Provider::Anthropic;
        let first_text = first.map(|f| {
            if start + 1 == end && anthropic {
                mark_last_block(&f).to_string()
            } else {
                f.to_string()
            }
        });
        for i in start..end {
            if i == start
                && let Some(text) = &first_text
            {
                parts.push(text);
            } else if i + 1 == end {
                parts.push(&self.marked[k]);
            } else {
                parts.push(&self.serialized[i]);
            }
        }
        let count = parts.len();
        body.push_str(&parts.join(","));
        body.push_str("]}");
        (body, count)
    }
}

/// What the client saw for one request.
#[derive(Clone, Debug, Default)]
pub struct Sent {
    /// The step.
    pub step: usize,
    /// The status it got.
    pub status: u16,
    /// The error body, when not 200.
    pub error: Option<String>,
    /// From sending to the last byte of the answer, µs.
    pub client_us: u64,
    /// It asked for a stream.
    pub stream: bool,
    /// The stream it got is the upstream's, byte for byte.
    pub stream_identical: bool,
    /// The answer is the scripted one.
    pub answer_ok: bool,
    /// Tokens of the whole history at this step.
    pub full_tokens: u64,
    /// The body's size.
    pub body_bytes: usize,
}

/// Sends `steps` of conversation `conv` (as `x-bill-conv`) to `base`, one after the other.
pub async fn run(
    http: &reqwest::Client,
    base: &str,
    wire: &Wire,
    conv: usize,
    steps: &[usize],
    trim: Trim,
    upstream: &Upstream,
) -> Vec<Sent> {
    let provider = wire.conversation.provider;
    let url = format!("{base}{}", provider.path());
    let mut out = Vec::with_capacity(steps.len());
    for &k in steps {
        let (body, _) = wire.body(k, trim);
        let mut sent = Sent {
            step: k,
            stream: wire.conversation.steps[k].stream,
            full_tokens: wire.full_tokens(k),
            body_bytes: body.len(),
            ..Sent::default()
        };
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .header("x-bill-conv", conv.to_string())
            .header("x-bill-step", k.to_string())
            .header(CLOCK_HEADER, (CLOCK_EPOCH_MS + wire.conversation.steps[k].at_ms).to_string());
        request = match provider {
            Provider::Anthropic => request
                .header("x-api-key", "sk-ant-bench-not-a-key")
                .header("anthropic-version", "2023-06-01"),
            Provider::OpenAi => request.header("authorization", "Bearer sk-bench-not-a-key"),
        };
        let started = Instant::now();
        let response = request.body(body).send().await;
        let (status, bytes) = match response {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
            }
            Err(e) => (0, e.to_string().into_bytes()),
        };
        sent.client_us = started.elapsed().as_micros() as u64;
        sent.status = status;
        if status != 200 {
            sent.error = Some(String::from_utf8_lossy(&bytes[..bytes.len().min(400)]).into_owned());
        } else if sent.stream {
            sent.stream_identical = upstream.stream_bytes(conv, k).is_some_and(|b| b == bytes);
            sent.answer_ok = sent.stream_identical;
        } else {
            let answer = &wire.conversation.steps[k].answer;
            let got: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            sent.answer_ok = match provider {
                Provider::Anthropic => got["content"] == answer["content"],
                Provider::OpenAi => {
                    let message = &got["choices"][0]["message"];
                    message["content"] == answer["content"]
                        && message["tool_calls"] == answer["tool_calls"]
                }
            };
        }
        out.push(sent);
    }
    out
}
