//! The composed payload: what the model sees this turn, borrowed from the manager.
//!
//! Order: system block → tool definitions → dynamic context → entities → memory summary →
//! recent history, oldest to newest; with
//! [`DynamicPlacement::BeforeNewestUser`] the dynamic context moves in front of the newest
//! user message instead, so a change of it leaves the cached prefix (everything before) whole.

use crate::config::DynamicPlacement;
use crate::entities::Entities;
use crate::error::Error;
use crate::json::JsonWriter;
use crate::message::MessageRef;
use crate::role::Role;
use crate::view::{History, LevelMessages};
use embedded_io::Write;

/// Text that opens the memory-summary system message.
pub const MEMORY_SUMMARY_PREFIX: &str = "[Memory Summary]";

/// Text that opens the entity system message (followed by a JSON object).
pub const ENTITIES_PREFIX: &str = "[Entities]";

/// One entry of a payload, in payload order.
///
/// ```
/// use ctxwin_core::{ContextManager, Message, PayloadItem, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::system("be brief"))?;
/// manager.push(Message::user("hi"))?;
/// let dynamic = ["Task: greet the user"];
/// let payload = manager.compose(&dynamic)?;
/// let kinds: Vec<&str> = payload.items().map(|item| match item {
///     PayloadItem::System(_) => "system",
///     PayloadItem::ToolDefinition(_) => "tool",
///     PayloadItem::Dynamic(_) => "dynamic",
///     PayloadItem::Entities(_) => "entities",
///     PayloadItem::MemorySummary(_) => "summary",
///     PayloadItem::Message(_) => "message",
/// }).collect();
/// assert_eq!(kinds, ["system", "dynamic", "message"]);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub enum PayloadItem<'a> {
    /// A permanent-level message (system prompt, rules).
    System(MessageRef<'a>),
    /// A tool definition: a JSON function object, written to the request's `tools`.
    ToolDefinition(MessageRef<'a>),
    /// Dynamic context passed to [`compose`](crate::manager::ContextManager::compose), sent as a system
    /// message.
    Dynamic(&'a str),
    /// The entity table, sent as one system message: `[Entities]` and a JSON object of every
    /// declared key (`null` while unknown).
    Entities(Entities<'a>),
    /// The session level, sent as one system message opening with `[Memory Summary]`.
    MemorySummary(MemorySummary<'a>),
    /// A history message (working or volatile level).
    Message(MessageRef<'a>),
}

/// The memory-summary block: the session level's entries under a `[Memory Summary]` line.
///
/// ```
/// use ctxwin_core::{ContextManager, PayloadItem, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.add_summary("Chose PostgreSQL.", &[(1, 4)], 0)?;
/// let payload = manager.compose(&[])?;
/// let summary = payload.memory_summary().unwrap();
/// assert_eq!(summary.parts().collect::<String>(), "[Memory Summary]\nChose PostgreSQL.");
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemorySummary<'a> {
    entries: LevelMessages<'a>,
}

impl<'a> MemorySummary<'a> {
    /// The session entries it is made of, oldest first.
    pub fn entries(&self) -> LevelMessages<'a> {
        self.entries
    }

    /// Its text in pieces (prefix, then a newline before each entry); concatenated, they are
    /// the system message's content.
    pub fn parts(&self) -> impl Iterator<Item = &'a str> + 'a {
        core::iter::once(MEMORY_SUMMARY_PREFIX)
            .chain(self.entries.flat_map(|entry| ["\n", entry.content()]))
    }
}

/// Options of the request body [`Payload::write_openai`] writes.
///
/// ```
/// let options = ctxwin_core::OpenAiRequest { model: Some("gpt-4o-mini"), max_tokens: Some(512) };
/// assert_eq!(options.model, Some("gpt-4o-mini"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenAiRequest<'a> {
    /// `model` field, omitted when `None`.
    pub model: Option<&'a str>,
    /// `max_tokens` field, omitted when `None`.
    pub max_tokens: Option<u32>,
}

/// What the model sees this turn, borrowed from the manager; its
/// [`tokens`](Payload::tokens) never exceed the budget.
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::user("hi"))?;
/// let payload = manager.compose(&[])?;
/// assert_eq!(payload.history().count(), 1);
/// assert!(payload.tokens() > 0);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Payload<'a> {
    permanent: LevelMessages<'a>,
    session: LevelMessages<'a>,
    history: History<'a>,
    dynamic: &'a [&'a str],
    entities: Entities<'a>,
    tokens: u32,
    /// The history message the dynamic context goes before (`None`: after the tools).
    dynamic_before: Option<u64>,
}

impl<'a> Payload<'a> {
    pub(crate) fn new(
        permanent: LevelMessages<'a>,
        session: LevelMessages<'a>,
        history: History<'a>,
        dynamic: &'a [&'a str],
        entities: Entities<'a>,
        tokens: u32,
    ) -> Self {
        Self { permanent, session, history, dynamic, entities, tokens, dynamic_before: None }
    }

    /// Places the dynamic context as `placement` says, `newest_user` being the id of the
    /// newest user message (without one it goes after the history).
    pub(crate) fn placed(mut self, placement: DynamicPlacement, newest_user: Option<u64>) -> Self {
        self.dynamic_before = match placement {
            DynamicPlacement::AfterTools => None,
            DynamicPlacement::BeforeNewestUser => Some(newest_user.unwrap_or(u64::MAX)),
        };
        self
    }

    /// The entity table, when a schema is declared.
    pub fn entities(&self) -> Option<Entities<'a>> {
        (cfg!(feature = "entities") && self.entities.is_declared()).then_some(self.entities)
    }

    /// Token cost of the whole payload (framing and request overhead included), as counted by
    /// the manager's counter.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Permanent-level messages (system prompt, rules), in order.
    pub fn system(&self) -> impl Iterator<Item = MessageRef<'a>> + 'a {
        self.permanent.filter(|m| !m.is_tool_definition())
    }

    /// Tool definitions, in order.
    pub fn tools(&self) -> impl Iterator<Item = MessageRef<'a>> + 'a {
        self.permanent.filter(|m| m.is_tool_definition())
    }

    /// Dynamic context, as passed to `compose`.
    pub fn dynamic(&self) -> &'a [&'a str] {
        self.dynamic
    }

    /// The memory-summary block, when the session level holds anything.
    pub fn memory_summary(&self) -> Option<MemorySummary<'a>> {
        let mut entries = self.session;
        entries.next().map(|_| MemorySummary { entries: self.session })
    }

    /// Recent history, oldest first.
    pub fn history(&self) -> History<'a> {
        self.history
    }

    /// Every item in payload order.
    pub fn items(&self) -> impl Iterator<Item = PayloadItem<'a>> + 'a {
        let dynamic = |at_head: bool| {
            let dynamic: &'a [&'a str] =
                if self.dynamic_before.is_none() == at_head { self.dynamic } else { &[] };
            dynamic.iter().map(|text| PayloadItem::Dynamic(text))
        };
        let split = self.dynamic_before.unwrap_or(0);
        self.system()
            .map(PayloadItem::System)
            .chain(self.tools().map(PayloadItem::ToolDefinition))
            .chain(dynamic(true))
            .chain(self.entities().map(PayloadItem::Entities))
            .chain(self.memory_summary().map(PayloadItem::MemorySummary))
            .chain(self.history().filter(move |m| m.id() < split).map(PayloadItem::Message))
            .chain(dynamic(false))
            .chain(self.history().filter(move |m| m.id() >= split).map(PayloadItem::Message))
    }

    /// Writes an OpenAI chat-completions request body (`model`, `messages`, `tools`) to `out`,
    /// without allocating. Returns the bytes written.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, OpenAiRequest, TinyCapacities, ToolCall};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("list files"))?;
    /// let calls = [ToolCall::new("c1", "ls", r#"{"dir":"."}"#)];
    /// manager.push(Message::assistant("").with_tool_calls(&calls))?;
    /// manager.push(Message::tool_result("c1", "a.txt"))?;
    /// let mut body = [0u8; 512];
    /// let payload = manager.compose(&[])?;
    /// let len = payload.write_openai(&mut body[..], OpenAiRequest { model: Some("m"), ..Default::default() })?;
    /// let json = core::str::from_utf8(&body[..len]).unwrap();
    /// assert!(json.starts_with(r#"{"model":"m","messages":[{"role":"user","content":"list files"}"#));
    /// assert!(json.contains(r#""arguments":"{\"dir\":\".\"}""#));
    /// assert!(json.ends_with(r#"{"role":"tool","tool_call_id":"c1","content":"a.txt"}]}"#));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn write_openai<W: Write>(
        &self,
        out: W,
        request: OpenAiRequest<'_>,
    ) -> Result<usize, Error> {
        let mut json = JsonWriter::new(out);
        json.raw(b"{");
        if let Some(model) = request.model {
            json.raw(br#""model":"#);
            json.string(model);
            json.raw(b",");
        }
        if let Some(max_tokens) = request.max_tokens {
            json.raw(br#""max_tokens":"#);
            write_number(&mut json, max_tokens);
            json.raw(b",");
        }
        json.raw(br#""messages":["#);
        let start = json.written();
        // The parts of `items()` (but the tools) in order, each walked by its own loop: the
        // frame holds one part's state at a time, not the whole chain's (about 1 KiB less
        // stack on firmware than `for item in items()`), and no item is dispatched twice.
        let (head, tail): (&[&str], &[&str]) = match self.dynamic_before {
            None => (self.dynamic, &[]),
            Some(_) => (&[], self.dynamic),
        };
        for message in self.system() {
            comma(&mut json, start);
            write_text_message(&mut json, message.role(), message.content());
        }
        write_system_texts(&mut json, start, head);
        if let Some(entities) = self.entities() {
            comma(&mut json, start);
            write_entities(&mut json, &entities);
        }
        if let Some(summary) = self.memory_summary() {
            comma(&mut json, start);
            json.raw(br#"{"role":"system","content":""#);
            json.escaped(MEMORY_SUMMARY_PREFIX);
            for entry in summary.entries() {
                json.escaped("\n");
                json.escaped(entry.content());
            }
            json.raw(br#""}"#);
        }
        // One walk of the history (oldest first, so ids ascend): the dynamic context placed
        // before the newest user message goes in front of the first message from it on.
        let split = self.dynamic_before.unwrap_or(0);
        let mut tail = tail;
        for message in self.history() {
            if message.id() >= split {
                write_system_texts(&mut json, start, core::mem::take(&mut tail));
            }
            comma(&mut json, start);
            write_history_message(&mut json, &message);
        }
        write_system_texts(&mut json, start, tail);
        json.raw(b"]");
        let mut any_tool = false;
        for tool in self.tools() {
            json.raw(if any_tool { b"," } else { br#","tools":["# });
            any_tool = true;
            json.raw(br#"{"type":"function","function":"#);
            json.raw(tool.content().as_bytes());
            json.raw(b"}");
        }
        if any_tool {
            json.raw(b"]");
        }
        json.raw(b"}");
        json.finish()
    }
}

fn write_number<W: Write>(json: &mut JsonWriter<W>, mut value: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    loop {
        at -= 1;
        if let Some(slot) = digits.get_mut(at) {
            *slot = b'0' + (value % 10) as u8;
        }
        value /= 10;
        if value == 0 || at == 0 {
            break;
        }
    }
    json.raw(digits.get(at..).unwrap_or_default())
}

/// `texts` as system messages, each after a comma but the list's first.
fn write_system_texts<W: Write>(json: &mut JsonWriter<W>, start: usize, texts: &[&str]) {
    for text in texts {
        comma(json, start);
        write_text_message(json, Role::System, text);
    }
}

fn write_text_message<W: Write>(json: &mut JsonWriter<W>, role: Role, content: &str) {
    // Whole fragments: role names and keys need no escaping.
    json.raw(br#"{"role":""#);
    json.raw(role.as_str().as_bytes());
    json.raw(br#"","content":"#);
    json.string(content);
    json.raw(b"}")
}

/// A comma before every message of the list but the first (the list's bytes start at
/// `start`).
fn comma<W: Write>(json: &mut JsonWriter<W>, start: usize) {
    if json.written() > start {
        json.raw(b",");
    }
}

/// The `[Entities]` system message.
fn write_entities<W: Write>(json: &mut JsonWriter<W>, entities: &Entities<'_>) {
    json.raw(br#"{"role":"system","content":""#);
    json.escaped(ENTITIES_PREFIX);
    json.escaped("\n{");
    for (index, (key, value)) in entities.iter().enumerate() {
        if index > 0 {
            json.escaped(",");
        }
        json.escaped("\"");
        json.escaped(key);
        json.escaped("\":");
        match value {
            Some(value) => {
                json.escaped("\"");
                json.escaped_twice(value);
                json.escaped("\"");
            }
            None => json.escaped("null"),
        }
    }
    json.escaped("}");
    json.raw(br#""}"#)
}

fn write_history_message<W: Write>(json: &mut JsonWriter<W>, message: &MessageRef<'_>) {
    match message.role() {
        Role::Tool => {
            json.raw(br#"{"role":"tool","tool_call_id":"#);
            json.string(message.tool_call_id().unwrap_or_default());
            json.raw(br#","content":"#);
            json.string(message.content());
            json.raw(b"}")
        }
        Role::Assistant if message.tool_call_count() > 0 => {
            json.raw(br#"{"role":"assistant","content":"#);
            if message.content().is_empty() {
                json.raw(b"null");
            } else {
                json.string(message.content());
            }
            json.raw(br#","tool_calls":["#);
            for (index, call) in message.tool_calls().enumerate() {
                if index > 0 {
                    json.raw(b",");
                }
                json.raw(br#"{"id":"#);
                json.string(call.id);
                json.raw(br#","type":"function","function":{"name":"#);
                json.string(call.name);
                json.raw(br#","arguments":"#);
                json.string(call.arguments);
                json.raw(b"}}");
            }
            json.raw(b"]}")
        }
        role => write_text_message(json, role, message.content()),
    }
}

// The module's test writes an `[Entities]` block.
#[cfg(all(test, feature = "entities"))]
mod tests {
    use super::*;
    use crate::capacity::TinyCapacities;
    use crate::config::{Config, DynamicPlacement};
    use crate::level::Level;
    use crate::manager::ContextManager;
    use crate::message::Message;
    use crate::record::ToolCall;
    extern crate std;
    use std::string::String;
    use std::vec::Vec;

    /// The `messages` entry an item becomes: its role and content.
    fn describe(item: &PayloadItem<'_>) -> Option<(String, String)> {
        let (role, content): (&str, String) = match item {
            PayloadItem::System(m) => ("system", m.content().into()),
            PayloadItem::ToolDefinition(_) => return None,
            PayloadItem::Dynamic(text) => ("system", (*text).into()),
            PayloadItem::Entities(e) => {
                let pairs: Vec<String> = e
                    .iter()
                    .map(|(k, v)| match v {
                        Some(v) => std::format!("\"{k}\":\"{v}\""),
                        None => std::format!("\"{k}\":null"),
                    })
                    .collect();
                ("system", std::format!("{ENTITIES_PREFIX}\n{{{}}}", pairs.join(",")))
            }
            PayloadItem::MemorySummary(s) => ("system", s.parts().collect()),
            PayloadItem::Message(m) => (m.role().as_str(), m.content().into()),
        };
        Some((role.into(), content))
    }

    /// The request's messages are exactly what `items` yields (tools apart), in its order,
    /// wherever the dynamic context sits.
    #[test]
    fn write_openai_writes_the_items_in_order() {
        for placement in [DynamicPlacement::AfterTools, DynamicPlacement::BeforeNewestUser] {
            let schema = crate::entities::EntitySchema::new(&["city"]).unwrap();
            let config =
                Config { dynamic_placement: placement, entity_schema: schema, ..Config::DEFAULT };
            let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
            manager.push(Message::system("rules")).unwrap();
            manager.add_tool_definition(r#"{"name":"ls"}"#).unwrap();
            manager.add_summary("earlier: chose Rust", &[(1, 2)], 0).unwrap();
            manager.push(Message::user("first")).unwrap();
            let calls = [ToolCall::new("c1", "ls", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            manager.push(Message::tool_result("c1", "a.txt")).unwrap();
            manager.push(Message::assistant("notes").in_level(Level::Volatile)).unwrap();
            manager.push(Message::user("second")).unwrap();
            manager.push(Message::assistant("answer")).unwrap();
            let payload = manager.compose(&["task", "hint"]).unwrap();
            let expected: Vec<(String, String)> =
                payload.items().filter_map(|i| describe(&i)).collect();
            let mut body = std::vec![0u8; 4096];
            let len = payload.write_openai(&mut body[..], OpenAiRequest::default()).unwrap();
            let json: serde_json::Value = serde_json::from_slice(&body[..len]).unwrap();
            let written: Vec<(String, String)> = json["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let content = m["content"].as_str().unwrap_or_default();
                    (m["role"].as_str().unwrap().into(), content.into())
                })
                .collect();
            assert_eq!(written, expected, "{placement:?}");
            assert!(expected.iter().any(|(_, c)| c.starts_with(ENTITIES_PREFIX)));
            assert!(expected.iter().any(|(_, c)| c.starts_with(MEMORY_SUMMARY_PREFIX)));
            assert_eq!(json["tools"].as_array().map(Vec::len), Some(1));
        }
    }
}
