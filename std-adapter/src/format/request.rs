//! The request envelope: a provider request body parsed without losing a byte of what the
//! reader does not manage, and written back with its conversation replaced.
//!
//! Every top-level field is kept as raw JSON in the client's order, so `model`, `tools`,
//! `temperature`, `thinking`, `metadata` and any field a provider adds later reach the upstream
//! byte for byte. The conversation is kept as raw JSON items too: Anthropic's top-level
//! `system` (when present) and then each message.

use indexmap::IndexMap;
use serde_json::Value;
use serde_json::value::RawValue;

use super::Provider;
use super::fingerprint::raw_hash;

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
    /// then every message. Raw JSON each.
    pub items: Vec<Box<RawValue>>,
    /// Whether `items[0]` is Anthropic's top-level `system`.
    pub has_system_item: bool,
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
        let Envelope { fields, messages } = serde_json::from_slice(body).map_err(|e| {
            BadRequest(format!(
                "request body is not a JSON object: {e} (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let model = match fields.get("model") {
            Some(raw) => serde_json::from_str::<String>(raw.get())
                .map_err(|_| BadRequest("`model` must be a string".into()))?,
            None => return Err(BadRequest("missing field `model`".into())),
        };
        let stream = fields
            .get("stream")
            .is_some_and(|raw| serde_json::from_str::<bool>(raw.get()).unwrap_or(false));
        let messages = match messages {
            Some(Messages::Array(messages)) => messages,
            Some(Messages::Not(kind)) => {
                return Err(BadRequest(format!("`messages` must be an array, not {kind}")));
            }
            None => return Err(BadRequest("missing field `messages`".into())),
        };
        let mut items = Vec::with_capacity(messages.len().saturating_add(1));
        let mut has_system_item = false;
        if provider == Provider::Anthropic
            && let Some(system) = fields.get("system")
        {
            items.push(system.clone());
            has_system_item = true;
        }
        items.extend(messages);
        Ok(Self { fields, model, stream, items, has_system_item })
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
        self.write_body_with_list(&list, system)
    }

    /// [`write_body`](Self::write_body) with the message list already written as a JSON
    /// array.
    pub(super) fn write_body_with_list(
        &self,
        list: &[u8],
        system: Option<&str>,
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
                "tools" => ranges.tools = Some(field(&mut out, key, value.get().as_bytes())),
                _ => drop(field(&mut out, key, value.get().as_bytes())),
            }
        }
        if !system_written && let Some(system) = system {
            ranges.system = Some(field(&mut out, "system", system.as_bytes()));
        }
        out.push(b'}');
        (out, ranges)
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
    request.items.iter().map(|raw| raw_hash(raw.get().as_bytes())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
