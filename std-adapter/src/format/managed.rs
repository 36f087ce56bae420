//! Writing a managed request body: the client's request with its conversation replaced by
//! what a composed payload keeps, in payload order.
//!
//! A kept message the core did not change is written as the client's raw JSON, byte for byte.
//! A message the core reduced, or of which it keeps some parts only (an Anthropic user turn's
//! tool results), is the client's JSON with only its `content` rewritten: every other field,
//! and every content block that is not rewritten (thinking with its signature, images,
//! documents, server tools, citations, cache marks), stays as sent. Messages the core wrote
//! itself (a synthetic result for a call never answered) and the system texts it adds (dynamic
//! context, retrieved text, entities, the memory summary) are written in the provider's shape:
//! OpenAI system messages at the start of the history, Anthropic `system` text blocks.
//!
//! Key order of what this module writes itself is serde_json's `Map` order (alphabetical):
//! the bytes a proxy has always sent upstream, so provider prompt caches built on them keep
//! hitting across versions.

use serde_json::Value;
use serde_json::value::RawValue;

use ctxwin_core::Role;

use super::request::{PromptRanges, Request};
use super::{Provider, anthropic, openai};
use crate::message::ChatMessage;

/// One part of an analyzed message that a payload keeps.
///
/// ```
/// let kept = ctxwin_std::format::KeptPart { part: 0, reduced: Some("[12 lines elided]".into()) };
/// assert_eq!(kept.part, 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptPart {
    /// The part's index in the message's analysis ([`Analyzed::parts`](super::Analyzed)).
    pub part: usize,
    /// The core's reduced text of the part, when the core reduced it.
    pub reduced: Option<String>,
}

/// A managed request body being written, message by message in payload order.
///
/// ```
/// use ctxwin_std::core::Role;
/// use ctxwin_std::format::{analyze, KeptPart, ManagedBody, Provider, Request};
/// let body = br#"{"model":"m","messages":[{"role":"user","content":"Build it."},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"build","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"3,000 lines of log"}],"stream":true}"#;
/// let request = Request::parse(Provider::OpenAi, body)?;
/// let analyzed = analyze(Provider::OpenAi, &request)?;
/// let mut managed = ManagedBody::new(Provider::OpenAi, &request, vec!["Goal: a green build.".into()]);
/// managed.history_starts();
/// for (item, message) in analyzed.iter().enumerate() {
///     let blocks: Vec<Vec<usize>> = message.parts.iter().map(|p| p.blocks.clone()).collect();
///     let reduced = (item == 2).then(|| "exit 1 after 3,000 lines".to_string());
///     let role = [Role::User, Role::Assistant, Role::Tool][item];
///     managed.message(request.items[item].get(), role, &blocks, &[KeptPart { part: 0, reduced }]);
/// }
/// let sent = String::from_utf8(managed.finish()).unwrap();
/// assert!(sent.starts_with(r#"{"model":"m","messages":[{"content":"Goal: a green build.","role":"system"},{"role":"user","content":"Build it."}"#));
/// assert!(sent.ends_with(r#"{"role":"tool","tool_call_id":"c1","content":"exit 1 after 3,000 lines"}],"stream":true}"#));
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
#[derive(Debug)]
pub struct ManagedBody<'r> {
    provider: Provider,
    request: &'r Request,
    /// System texts the core adds (dynamic context, retrieved text, entities, summary).
    extra: Vec<String>,
    extra_placed: bool,
    /// `[` and the messages written so far, comma-separated.
    list: Vec<u8>,
    /// Where the first message sits in `list`.
    first: Option<(usize, usize)>,
    /// Anthropic: the client's top-level `system`, raw.
    system: Option<String>,
    /// Anthropic: mark the first message for the prompt cache ([`ManagedBody::cache_head`]).
    cache_head: bool,
    /// Anthropic: where the last message written starts when it is a user turn (the next
    /// user turn joins it: the API wants the roles to alternate).
    last_user_turn: Option<usize>,
    /// The `tools` written instead of the client's ([`ManagedBody::declare_recall`]).
    tools: Option<String>,
}

impl<'r> ManagedBody<'r> {
    /// Starts the body of `request` for `provider`, with the system texts the core adds
    /// (`extra`, in payload order).
    pub fn new(provider: Provider, request: &'r Request, extra: Vec<String>) -> Self {
        let mut list = Vec::with_capacity(request.items.iter().map(|m| m.get().len() + 1).sum());
        list.push(b'[');
        Self {
            provider,
            request,
            extra,
            extra_placed: false,
            list,
            first: None,
            system: None,
            cache_head: false,
            last_user_turn: None,
            tools: None,
        }
    }

    /// Declares the recall tool ([`tools_with_recall`](super::tools_with_recall)): the
    /// client's `tools` with it appended, or `tools` holding it alone. False (nothing
    /// declared) when the client's `tools` is not an array.
    pub fn declare_recall(&mut self) -> bool {
        let tools = self.request.fields.get("tools").map(|t| t.get());
        self.tools = super::recall::tools_with_recall(self.provider, tools);
        self.tools.is_some()
    }

    /// Asks for a prompt-cache mark on the history's first message (Anthropic; OpenAI caches
    /// every prefix on its own). A compaction evicts from the oldest turn after the history's
    /// head when the head stays (the newest user request is locked, the opening turn a
    /// managed body starts with is constant): with the mark, the provider reads the prefix up
    /// to the head from its cache at the compaction, where without it only the client's marks
    /// (the system prompt, the newest message: too far for the provider's 20-block lookback)
    /// are looked up. Added only when the client marks something itself (it asks for
    /// caching) and the body has fewer than Anthropic's 4 marks, on a content block that can
    /// carry one (not a thinking block), when the head has none.
    pub fn cache_head(&mut self) {
        self.cache_head = true;
    }

    /// Marks where the history starts: OpenAI gets the core's system texts here, as system
    /// messages. Without a call, they go after the last message.
    pub fn history_starts(&mut self) {
        if self.extra_placed {
            return;
        }
        self.extra_placed = true;
        if self.provider == Provider::OpenAi {
            for text in std::mem::take(&mut self.extra) {
                self.push(&openai::system_message(&text));
            }
        }
    }

    /// Anthropic's top-level `system` as the client sent it (raw JSON): the body's `system`,
    /// with the core's system texts appended as text blocks when there are any.
    pub fn system(&mut self, raw: String) {
        self.system = Some(raw);
    }

    /// A client message the payload keeps: its raw JSON, the `role` of its parts (an
    /// Anthropic user turn holding tool results is the tool's), the
    /// [`Part::blocks`](super::Part::blocks) of each of its parts in order, and the parts kept
    /// (with the core's reduced text where it reduced one). Written as sent when every part is
    /// kept unreduced; left out when nothing of it remains. An Anthropic user turn right after
    /// another (turns between them left the window) joins it: its blocks follow the other's.
    pub fn message(&mut self, raw: &str, role: Role, blocks: &[Vec<usize>], kept: &[KeptPart]) {
        let whole = kept.len() == blocks.len() && kept.iter().all(|k| k.reduced.is_none());
        if whole {
            self.push_turn(raw, role != Role::Assistant);
            return;
        }
        let rewritten = match self.provider {
            Provider::OpenAi => openai::kept_message(raw, kept),
            Provider::Anthropic => anthropic::kept_message(raw, blocks, kept),
        };
        if let Some(message) = rewritten {
            self.push_turn(&message, role != Role::Assistant);
        }
    }

    /// A message the core wrote itself (a synthetic tool result, a system message), in the
    /// provider's shape.
    pub fn core_message(&mut self, chat: &ChatMessage) {
        let message = match self.provider {
            Provider::OpenAi => openai::core_message(chat),
            Provider::Anthropic => anthropic::core_message(chat),
        };
        self.push_turn(&message, chat.role != Role::Assistant);
    }

    /// Writes `message`, a user turn when `user`; an Anthropic user turn right after another
    /// joins it.
    fn push_turn(&mut self, message: &str, user: bool) {
        if self.provider != Provider::Anthropic {
            self.push(message);
            return;
        }
        let previous = self.last_user_turn.filter(|_| user);
        let joined = previous.and_then(|start| {
            let before = std::str::from_utf8(self.list.get(start..)?).ok()?;
            anthropic::joined_user_turns(before, message).map(|joined| (start, joined))
        });
        match joined {
            Some((start, joined)) => {
                self.list.truncate(start);
                self.list.extend_from_slice(joined.as_bytes());
                if let Some((first, _)) = self.first.filter(|(first, _)| *first == start) {
                    self.first = Some((first, self.list.len()));
                }
            }
            None => {
                self.push(message);
                let start = self.first.map(|_| self.list.len() - message.len());
                self.last_user_turn = start.filter(|_| user);
            }
        }
    }

    fn push(&mut self, message: &str) {
        if self.first.is_some() {
            self.list.push(b',');
        }
        let start = self.list.len();
        self.list.extend_from_slice(message.as_bytes());
        self.first.get_or_insert((start, self.list.len()));
    }

    /// The body: every field of the client's request in its order, `messages` (and Anthropic's
    /// `system`) replaced. An Anthropic conversation whose first kept turn is the assistant's
    /// opens with a user turn saying that earlier turns were moved out
    /// ([`MANAGED_OPENING_TEXT`](super::MANAGED_OPENING_TEXT)): the API refuses any other
    /// first turn.
    pub fn finish(self) -> Vec<u8> {
        self.finish_at().0
    }

    /// [`finish`](Self::finish), with where the prompt is in the body: what a byte-wise
    /// measure of the prompt cache's prefix compares from one request to the next.
    pub fn finish_at(mut self) -> (Vec<u8>, PromptRanges) {
        self.history_starts();
        let first = self.first.and_then(|(start, end)| self.list.get(start..end));
        if self.provider == Provider::Anthropic {
            let opening = first.is_some_and(anthropic::is_assistant_turn);
            let marked = match (self.cache_head && self.mark_room(), opening, first) {
                (true, true, _) => Some(anthropic::managed_opening_turn_marked()),
                (true, false, Some(head)) => anthropic::marked_turn(head),
                _ => None,
            };
            let head = match (marked, opening) {
                (Some(head), true) => Some((head, 0)),
                (None, true) => Some((anthropic::managed_opening_turn(), 0)),
                (Some(head), false) => self.first.map(|(_, end)| (head, end)),
                (None, false) => None,
            };
            if let Some((head, replaced_to)) = head {
                // `replaced_to`: the end of the client's first message when it is replaced,
                // 0 when the opening turn comes before it.
                let rest = match replaced_to {
                    0 => self.list.get(1..),
                    end => self.list.get(end..),
                };
                let mut list = Vec::with_capacity(self.list.len() + head.len() + 2);
                list.push(b'[');
                list.extend_from_slice(head.as_bytes());
                if replaced_to == 0 && self.first.is_some() {
                    list.push(b',');
                }
                list.extend_from_slice(rest.unwrap_or_default());
                self.list = list;
            }
        }
        self.list.push(b']');
        let system = match self.provider {
            Provider::Anthropic if !self.extra.is_empty() => {
                Some(anthropic::system_with(self.system.as_deref(), &self.extra))
            }
            Provider::Anthropic => self.system,
            Provider::OpenAi => None,
        };
        self.request.write_body_with_list(&self.list, system.as_deref(), self.tools.as_deref())
    }
}

impl ManagedBody<'_> {
    /// Whether the client asks for prompt caching (a mark in its tools, `system` or messages:
    /// Anthropic's cache is opt-in, and its writes cost more than plain input) and the body
    /// has room for one more mark: fewer than [`MAX_CACHE_MARKS`]. Counted on the bytes: the key
    /// can only appear unescaped as a key (inside a JSON string its quotes are escaped), so
    /// the count is never under the marks there are.
    fn mark_room(&self) -> bool {
        let finder = memchr::memmem::Finder::new(CACHE_MARK);
        let tools = self.request.fields.get("tools").map_or(&[][..], |t| t.get().as_bytes());
        let system = self.system.as_deref().map_or(&[][..], str::as_bytes);
        let marks: usize =
            [tools, system, &self.list].iter().map(|part| finder.find_iter(part).count()).sum();
        (1..MAX_CACHE_MARKS).contains(&marks)
    }
}

/// The most prompt-cache marks (`cache_control` blocks) Anthropic accepts in one request.
pub const MAX_CACHE_MARKS: usize = 4;

/// The key of a prompt-cache mark, as it appears in a body.
const CACHE_MARK: &[u8] = b"\"cache_control\"";

/// A tool output's `content` array reduced to one text block holding `text` (the core's
/// reduced copy), when the array holds text blocks only; a `cache_control` mark on its last
/// block moves to the new one. `None` when other blocks (images, documents) are there: the
/// output is sent whole then.
pub(super) fn reduced_text_blocks(content: &Value, text: &str) -> Option<Value> {
    let blocks = content.as_array()?;
    let text_only = !blocks.is_empty()
        && blocks.iter().all(|b| b.get("type").and_then(Value::as_str) == Some("text"));
    if !text_only {
        return None;
    }
    let mut block = serde_json::Map::new();
    block.insert("type".into(), Value::from("text"));
    block.insert("text".into(), Value::from(text));
    if let Some(mark) = blocks.last().and_then(|b| b.get("cache_control")) {
        block.insert("cache_control".into(), mark.clone());
    }
    Some(Value::Array(vec![Value::Object(block)]))
}

/// `value` as raw JSON (`null` if it does not serialize, which a `Value` always does).
pub(super) fn raw_json<T: serde::Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value)
        .unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_blocks_reduce_to_one_that_keeps_the_last_mark() {
        let content = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]);
        assert_eq!(
            reduced_text_blocks(&content, "r").unwrap().to_string(),
            r#"[{"cache_control":{"type":"ephemeral"},"text":"r","type":"text"}]"#
        );
        let with_image = json!([{"type": "text", "text": "a"}, {"type": "image", "source": {}}]);
        assert_eq!(reduced_text_blocks(&with_image, "r"), None);
        assert_eq!(reduced_text_blocks(&json!([]), "r"), None);
        assert_eq!(reduced_text_blocks(&json!("text"), "r"), None);
    }

    /// The body `managed` writes for Anthropic request `body` with every message kept whole,
    /// from message `from` on, the head marked when `mark`.
    fn anthropic_body(body: &str, from: usize, mark: bool) -> Value {
        let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
        let mut managed = ManagedBody::new(Provider::Anthropic, &request, Vec::new());
        if mark {
            managed.cache_head();
        }
        let system = usize::from(request.has_system_item);
        if let (1, Some(raw)) = (system, request.items.first()) {
            managed.system(raw.get().to_string());
        }
        for raw in request.items.iter().skip(system + from) {
            managed.push(raw.get());
        }
        serde_json::from_slice(&managed.finish()).unwrap()
    }

    #[test]
    fn the_history_head_is_marked_for_the_cache_when_the_client_caches_and_a_mark_is_free() {
        let mark = json!({"type": "ephemeral"});
        let user =
            |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}]});
        let thinking = json!({"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "ok"}]});
        let newest = json!({"role": "user", "content": [{"type": "text", "text": "go on", "cache_control": mark}]});
        let body = |messages: Vec<Value>, system_marks: usize| {
            let system: Vec<Value> = (0..system_marks.max(1))
                .map(|i| match i < system_marks {
                    true => {
                        json!({"type": "text", "text": format!("rules {i}"), "cache_control": mark})
                    }
                    false => json!({"type": "text", "text": "rules"}),
                })
                .collect();
            json!({"model": "m", "max_tokens": 10, "system": system, "messages": messages})
                .to_string()
        };
        // The client marks its system prompt and its newest message: the head gets the third.
        let sent = body(vec![user("fix the rounding"), thinking.clone(), newest.clone()], 1);
        let out = anthropic_body(&sent, 0, true);
        assert_eq!(out["messages"][0]["content"][0]["cache_control"], mark);
        assert_eq!(out["messages"][0]["content"][0]["text"], "fix the rounding");
        assert_eq!(out["messages"][1], thinking, "the other messages as sent");
        assert_eq!(out["messages"][2], newest);
        // Not asked: the body as sent.
        let unmarked = anthropic_body(&sent, 0, false);
        assert_eq!(unmarked["messages"][0], user("fix the rounding"));
        // The client caches nothing: no mark.
        let plain = json!({"role": "user", "content": [{"type": "text", "text": "go on"}]});
        let uncached = body(vec![user("a"), thinking.clone(), plain], 0);
        let uncached = json!({"model": "m", "max_tokens": 10, "messages": serde_json::from_str::<Value>(&uncached).unwrap()["messages"]}).to_string();
        assert_eq!(anthropic_body(&uncached, 0, true)["messages"][0], user("a"));
        // Four marks already: none more.
        let full = body(vec![user("a"), thinking.clone(), newest.clone()], 3);
        assert_eq!(anthropic_body(&full, 0, true)["messages"][0], user("a"));
        // The first kept turn is the assistant's: the opening turn carries the mark.
        let out = anthropic_body(&sent, 1, true);
        assert_eq!(out["messages"][0]["content"][0]["text"], super::super::MANAGED_OPENING_TEXT);
        assert_eq!(out["messages"][0]["content"][0]["cache_control"], mark);
        assert_eq!(out["messages"][1], thinking);
        assert_eq!(
            anthropic_body(&sent, 1, false)["messages"][0]["content"],
            super::super::MANAGED_OPENING_TEXT
        );
        // A head whose last block is a thinking block (never the case for a user turn, but
        // the writer does not rely on it) or that has a mark stays as it is.
        let only_thinking = json!({"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]});
        assert_eq!(anthropic::marked_turn(only_thinking.to_string().as_bytes()), None);
        assert_eq!(anthropic::marked_turn(newest.to_string().as_bytes()), None);
    }
}
