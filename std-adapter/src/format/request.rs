//! The request envelope: a provider request body parsed without losing a byte of what the
//! reader does not manage, and written back with its conversation replaced.
//!
//! Every top-level field is kept as raw JSON in the client's order, so `model`, `tools`,
//! `temperature`, `thinking`, `metadata` and any field a provider adds later reach the upstream
//! byte for byte. The conversation is kept as raw JSON items too: Anthropic's top-level
//! `system` (when present) and then each message.

use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::Value;
use serde_json::value::RawValue;

use super::Provider;
use super::fingerprint::raw_hash;
use super::scan::{Earlier, Layout, Scanned, scan};

/// A request body that did not parse, saying where.
///
/// ```
/// use ctxwin_std::format::{Provider, Request};
/// let error = Request::parse(Provider::OpenAi, br#"{"messages": []}"#).unwrap_err();
/// assert_eq!(error.to_string(), "missing field `model`");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// A parsed request body (OpenAI chat completions or Anthropic messages).
///
/// ```
/// use ctxwin_std::format::{Provider, Request};
/// let body = br#"{"model":"claude","system":"Be brief.","messages":[{"role":"user","content":"hi"}],"max_tokens":64}"#;
/// let request = Request::parse(Provider::Anthropic, body)?;
/// assert_eq!(request.model, "claude");
/// assert!(request.has_system_item);
/// assert_eq!(request.items[1].get(), r#"{"role":"user","content":"hi"}"#);
/// // Written back unchanged, it is the same bytes.
/// let messages: Vec<&str> = request.items[1..].iter().map(|m| m.get()).collect();
/// assert_eq!(request.write_body(&messages, Some(request.items[0].get())), body);
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
#[derive(Debug)]
pub struct Request {
    /// Every top-level field in order, raw.
    pub fields: IndexMap<String, Box<RawValue>>,
    /// `model`.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The conversation as a session sees it: Anthropic's `system` first (when present),
    /// then every message. Raw JSON each, shared with the request it was taken from when the
    /// body repeated it ([`parse_after`](Self::parse_after)).
    pub items: Vec<Arc<RawValue>>,
    /// Whether `items[0]` is Anthropic's top-level `system`.
    pub has_system_item: bool,
    /// Each item's [`raw_hash`].
    hashes: Vec<u64>,
    /// Where the messages were in the body (`None` when it had none, or was read whole).
    layout: Option<Layout>,
    /// Messages taken from the earlier request.
    reused: usize,
}

impl Request {
    /// Parses `body` for `provider`.
    ///
    /// # Errors
    /// [`BadRequest`] naming the line and column of a syntax error, or the field that is
    /// missing or of the wrong type.
    ///
    /// ```
    /// use ctxwin_std::format::{Provider, Request};
    /// let error = Request::parse(Provider::OpenAi, b"{\"model\": \"m\",\n \"messages\": [}").unwrap_err();
    /// assert!(error.0.contains("line 2"), "{error}");
    /// ```
    pub fn parse(provider: Provider, body: &[u8]) -> Result<Self, BadRequest> {
        Self::parse_after(provider, body, |_| None)
    }

    /// Parses `body` for `provider`, continuing an earlier request of the same conversation:
    /// `previous` is called once with the body's opening (its bytes up to the end of the first
    /// message: [`opening`](Self::opening)) and returns the earlier request the caller holds
    /// for it, if any. Every later message that the body repeats byte for byte, at the same
    /// place, is taken from it without being read or copied again; the first byte that
    /// differs is where reading goes on. The result is the same as [`parse`](Self::parse)'s,
    /// always: an earlier request with another opening, provider or messages gives nothing.
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::format::{Provider, Request};
    /// let first = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."}]}"#;
    /// let earlier = Arc::new(Request::parse(Provider::OpenAi, first)?);
    /// let next = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye."}]}"#;
    /// let request = Request::parse_after(Provider::OpenAi, next, |opening| {
    ///     (earlier.opening() == Some(opening)).then(|| earlier.clone())
    /// })?;
    /// assert_eq!(request.reused(), 1); // the assistant's message
    /// assert!(Arc::ptr_eq(&request.items[1], &earlier.items[1]));
    /// assert_eq!(request.items[2].get(), r#"{"role":"user","content":"Bye."}"#);
    /// # Ok::<(), ctxwin_std::format::BadRequest>(())
    /// ```
    pub fn parse_after(
        provider: Provider,
        body: &[u8],
        previous: impl FnOnce(&[u8]) -> Option<Arc<Request>>,
    ) -> Result<Self, BadRequest> {
        match scan(provider, body, previous) {
            Some(scanned) => Self::from_parts(provider, scanned),
            None => Self::parse_whole(provider, body),
        }
    }

    /// The body's bytes up to the end of its first message (`None` without messages, or when
    /// it was read whole): what finds the earlier request for
    /// [`parse_after`](Self::parse_after).
    pub fn opening(&self) -> Option<&[u8]> {
        self.layout.as_ref().map(|layout| &*layout.opening)
    }

    /// Messages taken from the earlier request by [`parse_after`](Self::parse_after).
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// Each item's [`raw_hash`], in order.
    pub fn item_hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// The whole read: serde_json's, which names what is wrong.
    fn parse_whole(provider: Provider, body: &[u8]) -> Result<Self, BadRequest> {
        let Envelope { fields, messages } = serde_json::from_slice(body).map_err(|e| {
            BadRequest(format!(
                "request body is not a JSON object: {e} (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let messages = match messages {
            Some(Messages::Array(messages)) => messages,
            Some(Messages::Not(kind)) => {
                model_of(&fields)?;
                return Err(BadRequest(format!("`messages` must be an array, not {kind}")));
            }
            None => Vec::new(),
        };
        let hashes = messages.iter().map(|m| raw_hash(m.get().as_bytes())).collect();
        let messages = messages.into_iter().map(Arc::from).collect();
        let scanned = Scanned { fields, messages, hashes, layout: None, reused: 0 };
        Self::from_parts(provider, scanned)
    }

    fn from_parts(provider: Provider, scanned: Scanned) -> Result<Self, BadRequest> {
        let Scanned { fields, messages, hashes: message_hashes, layout, reused } = scanned;
        let model = model_of(&fields)?;
        if !fields.contains_key("messages") {
            return Err(BadRequest("missing field `messages`".into()));
        }
        let stream = fields
            .get("stream")
            .is_some_and(|raw| serde_json::from_str::<bool>(raw.get()).unwrap_or(false));
        let mut items = Vec::with_capacity(messages.len().saturating_add(1));
        let mut hashes = Vec::with_capacity(items.capacity());
        let mut has_system_item = false;
        if provider == Provider::Anthropic
            && let Some(system) = fields.get("system")
        {
            items.push(Arc::from(system.clone()));
            hashes.push(raw_hash(system.get().as_bytes()));
            has_system_item = true;
        }
        items.extend(messages);
        hashes.extend(message_hashes);
        Ok(Self { fields, model, stream, items, has_system_item, hashes, layout, reused })
    }

    /// The index in `messages` of item `item`.
    ///
    /// ```
    /// use ctxwin_std::format::{Provider, Request};
    /// let body = br#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}]}"#;
    /// assert_eq!(Request::parse(Provider::Anthropic, body)?.message_index(1), 0);
    /// # Ok::<(), ctxwin_std::format::BadRequest>(())
    /// ```
    pub fn message_index(&self, item: usize) -> usize {
        item.saturating_sub(usize::from(self.has_system_item))
    }

    /// The body with `messages` (each a message's JSON) as its message list and `system` as
    /// Anthropic's `system` (left out when `None`), every other field as the client sent it,
    /// in its order. A `system` the client did not send goes last.
    ///
    /// ```
    /// use ctxwin_std::format::{Provider, Request};
    /// let request = Request::parse(Provider::OpenAi, br#"{"model":"m","messages":[],"n":1}"#)?;
    /// let body = request.write_body(&[r#"{"role":"user","content":"hi"}"#], None);
    /// assert_eq!(body, br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1}"#);
    /// # Ok::<(), ctxwin_std::format::BadRequest>(())
    /// ```
    pub fn write_body<S: AsRef<str>>(&self, messages: &[S], system: Option<&str>) -> Vec<u8> {
        self.write_body_at(messages, system).0
    }

    /// [`write_body`](Self::write_body), with where the prompt is in the body written.
    pub fn write_body_at<S: AsRef<str>>(
        &self,
        messages: &[S],
        system: Option<&str>,
    ) -> (Vec<u8>, PromptRanges) {
        let size: usize = messages.iter().map(|m| m.as_ref().len() + 1).sum();
        let mut list = Vec::with_capacity(size + 2);
        list.push(b'[');
        for (i, message) in messages.iter().enumerate() {
            if i > 0 {
                list.push(b',');
            }
            list.extend_from_slice(message.as_ref().as_bytes());
        }
        list.push(b']');
        self.write_body_with_list(&list, system, None)
    }

    /// [`write_body`](Self::write_body) with the message list already written as a JSON
    /// array, and `tools` instead of the client's when given (added last when it sent none).
    pub(super) fn write_body_with_list(
        &self,
        list: &[u8],
        system: Option<&str>,
        tools: Option<&str>,
    ) -> (Vec<u8>, PromptRanges) {
        let mut out = Vec::with_capacity(list.len() + 1024);
        let mut ranges = PromptRanges::default();
        out.push(b'{');
        let field = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(Value::from(key).to_string().as_bytes());
            out.push(b':');
            let start = out.len();
            out.extend_from_slice(value);
            start..out.len()
        };
        let mut system_written = false;
        for (key, value) in &self.fields {
            match key.as_str() {
                "messages" => ranges.messages = Some(field(&mut out, key, list)),
                "system" => {
                    if let Some(system) = system {
                        ranges.system = Some(field(&mut out, key, system.as_bytes()));
                    }
                    system_written = true;
                }
                "tools" => {
                    let tools = tools.unwrap_or(value.get());
                    ranges.tools = Some(field(&mut out, key, tools.as_bytes()));
                }
                _ => drop(field(&mut out, key, value.get().as_bytes())),
            }
        }
        if !system_written && let Some(system) = system {
            ranges.system = Some(field(&mut out, "system", system.as_bytes()));
        }
        if !self.fields.contains_key("tools")
            && let Some(tools) = tools
        {
            ranges.tools = Some(field(&mut out, "tools", tools.as_bytes()));
        }
        out.push(b'}');
        (out, ranges)
    }
}

impl Earlier for Arc<Request> {
    fn layout(&self) -> Option<&Layout> {
        self.layout.as_ref()
    }

    fn messages(&self) -> (&[Arc<RawValue>], &[u64]) {
        let first = usize::from(self.has_system_item);
        (self.items.get(first..).unwrap_or_default(), self.hashes.get(first..).unwrap_or_default())
    }
}

/// The `model` of a request's `fields`.
fn model_of(fields: &IndexMap<String, Box<RawValue>>) -> Result<String, BadRequest> {
    match fields.get("model") {
        Some(raw) => serde_json::from_str::<String>(raw.get())
            .map_err(|_| BadRequest("`model` must be a string".into())),
        None => Err(BadRequest("missing field `model`".into())),
    }
}

/// Where a written body's prompt is: the byte ranges of the values of `tools`, `system` and
/// `messages` (each `None` when the body has no such field). In a provider's cache order
/// ([`in_cache_order`](Self::in_cache_order)) they are what its prompt cache keys on; the
/// other fields (`model`, `max_tokens`, `stream`, …) are not part of the prompt.
///
/// ```
/// use ctxwin_std::format::{Provider, Request};
/// let request = Request::parse(Provider::Anthropic, br#"{"model":"m","messages":[],"tools":[1]}"#)?;
/// let (body, ranges) = request.write_body_at::<&str>(&[], Some(r#""s""#));
/// let parts: Vec<&[u8]> = ranges.in_cache_order().map(|r| &body[r]).collect();
/// assert_eq!(parts, [&b"[1]"[..], b"\"s\"", b"[]"]);
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptRanges {
    /// The value of `tools`.
    pub tools: Option<std::ops::Range<usize>>,
    /// The value of `system` (Anthropic's top-level system prompt).
    pub system: Option<std::ops::Range<usize>>,
    /// The value of `messages`.
    pub messages: Option<std::ops::Range<usize>>,
}

impl PromptRanges {
    /// The ranges in the order providers cache a prompt: tools, system, messages (Anthropic's
    /// documented order; OpenAI caches the messages' prefix, its tools with them).
    pub fn in_cache_order(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        [&self.tools, &self.system, &self.messages].into_iter().flatten().cloned()
    }
}

/// A request body read in one pass: every top-level field raw, in order, and `messages` read
/// on the way as its raw items (its place in `fields` holds `[]`: the body written back puts
/// the managed list there). Reading the envelope raw and then `messages` again from its raw
/// copy scanned and copied a multi-megabyte history twice per request.
struct Envelope {
    fields: IndexMap<String, Box<RawValue>>,
    messages: Option<Messages>,
}

/// The value of `messages`: its items raw, or what else it was (refused by [`Request::parse`]).
enum Messages {
    Array(Vec<Box<RawValue>>),
    Not(&'static str),
}

impl<'de> serde::Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Envelope;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Envelope, A::Error> {
                let mut fields = IndexMap::new();
                let mut messages = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "messages" {
                        messages = Some(map.next_value::<Messages>()?);
                        let empty =
                            RawValue::from_string("[]".into()).map_err(serde::de::Error::custom)?;
                        fields.insert(key, empty);
                    } else {
                        fields.insert(key, map.next_value::<Box<RawValue>>()?);
                    }
                }
                Ok(Envelope { fields, messages })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl<'de> serde::Deserialize<'de> for Messages {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> serde::de::Visitor<'de> for Items {
            type Value = Messages;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Messages, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<Box<RawValue>>()? {
                    items.push(item);
                }
                Ok(Messages::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Messages, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Messages::Not("an object"))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Messages, E> {
                Ok(Messages::Not("a string"))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Messages, E> {
                Ok(Messages::Not("a boolean"))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Messages, E> {
                Ok(Messages::Not("a number"))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Messages, E> {
                Ok(Messages::Not("a number"))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Messages, E> {
                Ok(Messages::Not("a number"))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Messages, E> {
                Ok(Messages::Not("null"))
            }
        }
        deserializer.deserialize_any(Items)
    }
}

/// The hash of each item's raw bytes ([`raw_hash`]): equal bytes are the same message, without
/// reading it.
///
/// ```
/// use ctxwin_std::format::{raw_hashes, Provider, Request};
/// let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":"hi"}]}"#;
/// let hashes = raw_hashes(&Request::parse(Provider::OpenAi, body)?);
/// assert_eq!(hashes[0], hashes[1]);
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
pub fn raw_hashes(request: &Request) -> Vec<u64> {
    request.hashes.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `body` parsed after `earlier` (offered whatever its opening: the parse decides), checked
    /// against the whole read of `body`; returns it.
    fn after(provider: Provider, earlier: &[u8], body: &[u8]) -> Result<Request, BadRequest> {
        let earlier = Arc::new(Request::parse(provider, earlier).unwrap());
        let continued = Request::parse_after(provider, body, |_| Some(earlier.clone()));
        let whole = Request::parse(provider, body);
        match (&continued, &whole) {
            (Ok(a), Ok(b)) => {
                let fields = |r: &Request| -> Vec<(String, String)> {
                    r.fields.iter().map(|(k, v)| (k.clone(), v.get().to_string())).collect()
                };
                let items = |r: &Request| -> Vec<String> {
                    r.items.iter().map(|i| i.get().to_string()).collect()
                };
                assert_eq!(fields(a), fields(b));
                assert_eq!(items(a), items(b));
                assert_eq!(a.item_hashes(), b.item_hashes());
                assert_eq!(
                    (&a.model, a.stream, a.has_system_item),
                    (&b.model, b.stream, b.has_system_item)
                );
            }
            (Err(a), Err(b)) => assert_eq!(a.0, b.0),
            _ => panic!("parsed after: {continued:?}\nwhole: {whole:?}"),
        }
        continued
    }

    fn user(text: &str, mark: bool) -> String {
        let mark = if mark { r#","cache_control":{"type":"ephemeral"}"# } else { "" };
        format!(r#"{{"role":"user","content":[{{"type":"text","text":"{text}"{mark}}}]}}"#)
    }

    fn assistant(text: &str) -> String {
        format!(r#"{{"role":"assistant","content":[{{"type":"text","text":"{text}"}}]}}"#)
    }

    fn anthropic(tools: &str, messages: &[String], tools_after: bool) -> Vec<u8> {
        let list = messages.join(",");
        let tools = format!(r#""tools":[{{"name":"{tools}","input_schema":{{}}}}]"#);
        let system = r#""system":[{"type":"text","text":"Be brief."}]"#;
        if tools_after {
            format!(r#"{{"model":"m","max_tokens":64,{system},"messages":[{list}],{tools},"stream":true}}"#)
        } else {
            format!(r#"{{"model":"m","max_tokens":64,{system},{tools},"messages":[{list}],"stream":true}}"#)
        }
        .into_bytes()
    }

    fn turns(n: usize, marked_last: bool) -> Vec<String> {
        (0..n)
            .map(|i| match i % 2 {
                0 => user(&format!("question {i}"), marked_last && i + 1 == n),
                _ => assistant(&format!("answer {i}")),
            })
            .collect()
    }

    #[test]
    fn a_repeated_prefix_is_taken_not_read() {
        let earlier = anthropic("read", &turns(5, false), false);
        let next = anthropic("read", &turns(7, false), false);
        let request = after(Provider::Anthropic, &earlier, &next).unwrap();
        assert_eq!(request.reused(), 4);
        let parsed = Request::parse(Provider::Anthropic, &earlier).unwrap();
        let again =
            Request::parse_after(Provider::Anthropic, &next, |_| Some(Arc::new(parsed))).unwrap();
        assert_eq!(again.items.len(), 8);
        // The same bytes sent again are the same body.
        assert_eq!(after(Provider::Anthropic, &next, &next).unwrap().reused(), 6);
        // Without messages there is nothing to continue.
        let empty = br#"{"model":"m","messages":[]}"#;
        let request = after(Provider::OpenAi, empty, empty).unwrap();
        assert_eq!((request.reused(), request.opening()), (0, None));
    }

    #[test]
    fn the_moving_cache_mark_is_read_again_from_where_it_was() {
        let earlier = anthropic("read", &turns(5, true), false);
        let next = anthropic("read", &turns(7, true), false);
        let request = after(Provider::Anthropic, &earlier, &next).unwrap();
        // Messages 1–3 are the same bytes; message 4 lost its mark.
        assert_eq!(request.reused(), 3);
        assert!(!request.items[5].get().contains("cache_control"));
        assert!(request.items[7].get().contains("cache_control"));
    }

    #[test]
    fn a_changed_byte_is_read_from_its_message_on() {
        let earlier = anthropic("read", &turns(7, false), false);
        let mut next = earlier.clone();
        let at = String::from_utf8(next.clone()).unwrap().find("answer 3").unwrap();
        next[at + 7] = b'9';
        let request = after(Provider::Anthropic, &earlier, &next).unwrap();
        assert_eq!(request.reused(), 2);
        assert!(request.items[4].get().contains("answer 9"));
        // A changed byte in the first message: the opening differs, nothing is taken.
        let mut next = earlier.clone();
        let at = String::from_utf8(next.clone()).unwrap().find("question 0").unwrap();
        next[at] = b'Q';
        assert_eq!(after(Provider::Anthropic, &earlier, &next).unwrap().reused(), 0);
    }

    #[test]
    fn other_tools_or_system_take_nothing_before_the_messages_and_are_read_after_them() {
        let earlier = anthropic("read", &turns(5, false), false);
        let next = anthropic("write", &turns(7, false), false);
        assert_eq!(after(Provider::Anthropic, &earlier, &next).unwrap().reused(), 0);
        let system = String::from_utf8(earlier.clone()).unwrap().replace("Be brief.", "Be kind.");
        assert_eq!(after(Provider::Anthropic, &earlier, system.as_bytes()).unwrap().reused(), 0);
        let earlier = anthropic("read", &turns(5, false), true);
        let next = anthropic("write", &turns(7, false), true);
        let request = after(Provider::Anthropic, &earlier, &next).unwrap();
        assert_eq!(request.reused(), 4);
        assert!(request.fields["tools"].get().contains("write"));
        // Another provider's request with the same bytes is not taken from.
        assert_eq!(after(Provider::OpenAi, &earlier, &earlier).unwrap().reused(), 4);
        let earlier_parsed = Arc::new(Request::parse(Provider::Anthropic, &earlier).unwrap());
        let request =
            Request::parse_after(Provider::OpenAi, &earlier, |_| Some(earlier_parsed.clone()))
                .unwrap();
        assert_eq!(request.reused(), 0);
    }

    #[test]
    fn a_rewind_or_a_branch_takes_what_is_still_the_same() {
        let earlier = anthropic("read", &turns(7, false), false);
        let shorter = anthropic("read", &turns(3, false), false);
        assert_eq!(after(Provider::Anthropic, &earlier, &shorter).unwrap().reused(), 2);
        let mut branch = turns(7, false);
        branch[3] = assistant("another answer");
        let branch = anthropic("read", &branch, false);
        let request = after(Provider::Anthropic, &earlier, &branch).unwrap();
        assert_eq!(request.reused(), 2);
        assert!(request.items[4].get().contains("another answer"));
    }

    #[test]
    fn what_the_walk_does_not_follow_the_whole_read_decides() {
        let earlier = anthropic("read", &turns(5, false), false);
        let text = String::from_utf8(anthropic("read", &turns(7, false), false)).unwrap();
        let bad = [
            text.replacen("answer 5", "answer \u{1}", 1),
            text.replacen(r#"]}]}"#, r#"]}],}"#, 1),
            text.replacen(r#","stream":true}"#, r#","stream":true}x"#, 1),
            text.replacen(r#"],"stream""#, r#"],"messages":[],"stream""#, 1),
            text.replacen(r#""model":"m""#, r#""model":7"#, 1),
            text.replacen(r#""model":"m","#, "", 1),
            text.replacen(
                r#"{"role":"assistant","content":[{"type":"text","text":"answer 5"}]}"#,
                " 5 ",
                1,
            ),
            text.replacen(
                r#"{"role":"assistant","content":[{"type":"text","text":"answer 5"}]}"#,
                "\n 5\n",
                1,
            ),
            format!("{text}\n\n"),
            text[..text.len() - 9].to_string(),
        ];
        for body in bad {
            let _ = after(Provider::Anthropic, &earlier, body.as_bytes());
        }
    }

    proptest::proptest! {
        /// Whatever a body does to the one before it (bytes changed, cut, or whitespace put
        /// between values), reading it after that one gives what reading it whole gives.
        #[test]
        fn reading_after_is_reading_whole(
            n in 1usize..9,
            edits in proptest::collection::vec((0usize..10_000, 0u8..6), 0..3),
            tools_after in proptest::bool::ANY,
        ) {
            let earlier = anthropic("read", &turns(n, true), tools_after);
            let mut body = anthropic("read", &turns(n + 2, true), tools_after);
            for (at, kind) in edits {
                // A truncation to nothing leaves no byte to edit.
                let Some(at) = at.checked_rem(body.len()) else { break };
                match kind {
                    0 => body[at] = b'x',
                    1 => body.truncate(at),
                    2 => body.insert(at, b' '),
                    3 => body.insert(at, b'\n'),
                    4 => body.insert(at, b','),
                    _ => drop(body.remove(at)),
                }
            }
            let _ = after(Provider::Anthropic, &earlier, &body);
            let _ = after(Provider::OpenAi, &earlier, &body);
        }
    }

    #[test]
    fn parse_keeps_fields_and_reports_where() {
        let body = br#"{"model":"m","temperature":0.7,"messages":[{"role":"user","content":"hi"}],"tools":[]}"#;
        let request = Request::parse(Provider::OpenAi, body).unwrap();
        assert_eq!(
            request.fields.keys().collect::<Vec<_>>(),
            ["model", "temperature", "messages", "tools"]
        );
        assert_eq!(request.items.len(), 1);
        let error =
            Request::parse(Provider::OpenAi, b"{\"model\": \"m\",\n \"messages\": [}").unwrap_err();
        assert!(error.0.contains("line 2"), "{error}");
        let error = Request::parse(Provider::OpenAi, br#"{"messages":[]}"#).unwrap_err();
        assert!(error.0.contains("model"), "{error}");
        let error = Request::parse(Provider::OpenAi, br#"{"model":1,"messages":[]}"#).unwrap_err();
        assert_eq!(error.0, "`model` must be a string");
        let error = Request::parse(Provider::OpenAi, br#"{"model":"m","messages":{}}"#);
        assert!(error.unwrap_err().0.starts_with("`messages` must be an array"));
    }

    #[test]
    fn an_openai_system_field_is_not_an_item() {
        let body = br#"{"model":"m","system":"s","messages":[]}"#;
        let request = Request::parse(Provider::OpenAi, body).unwrap();
        assert!(!request.has_system_item && request.items.is_empty());
        assert_eq!(request.write_body::<&str>(&[], None), br#"{"model":"m","messages":[]}"#);
    }

    #[test]
    fn a_new_system_goes_last_and_a_dropped_one_is_left_out() {
        let body = br#"{"model":"m","messages":[],"stream":true}"#;
        let request = Request::parse(Provider::Anthropic, body).unwrap();
        assert!(request.stream);
        assert_eq!(
            request.write_body::<&str>(&[], Some(r#""s""#)),
            br#"{"model":"m","messages":[],"stream":true,"system":"s"}"#
        );
        let body = br#"{"system":"s","model":"m","messages":[]}"#;
        let request = Request::parse(Provider::Anthropic, body).unwrap();
        assert_eq!(request.write_body::<&str>(&[], None), br#"{"model":"m","messages":[]}"#);
    }
}
