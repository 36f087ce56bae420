//! The two wire formats: parsing a request body without losing a byte of what the proxy does
//! not manage, reading each message into what the session stores, and fingerprints.
//!
//! A request body is kept as an ordered map of raw JSON values, so every field other than the
//! messages (and Anthropic's `system`) reaches the upstream byte for byte. Each message is kept
//! as its raw JSON too; the proxy re-emits the raw text of the messages it keeps.

use base64::Engine;
use ctxwin_std::core::Role;
use ctxwin_std::{ChatMessage, ToolCall};
use indexmap::IndexMap;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::hash::{canonical, canonical_text, hash_str};

/// Which API a request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

impl Provider {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// A request body that did not parse, with where.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// A parsed request body.
#[derive(Debug)]
pub struct Request {
    /// Every top-level field in order, raw.
    pub fields: IndexMap<String, Box<RawValue>>,
    /// `model`.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The conversation as the session sees it: Anthropic's `system` first (when present),
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
    pub fn parse(provider: Provider, body: &[u8]) -> Result<Self, BadRequest> {
        let fields: IndexMap<String, Box<RawValue>> =
            serde_json::from_slice(body).map_err(|e| {
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
        let messages: Vec<Box<RawValue>> = match fields.get("messages") {
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| BadRequest(format!("`messages` must be an array: {e}")))?,
            None => return Err(BadRequest("missing field `messages`".into())),
        };
        let mut items = Vec::with_capacity(messages.len() + 1);
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
    pub fn message_index(&self, item: usize) -> usize {
        item - usize::from(self.has_system_item)
    }
}

/// One opaque part of a message: content the session does not read (an image, a document,
/// audio, a redacted thinking block, a server tool's block), with its estimated token cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opaque {
    /// What it is, for the archive's text (`image/png 800x600`).
    pub label: String,
    /// Estimated tokens.
    pub tokens: u32,
}

/// What the session stores for one message, or for one tool result of an Anthropic user
/// message (which carries its results as blocks).
#[derive(Clone, Debug)]
pub struct Part {
    /// The text rendering (roles, text, tool calls) pushed into the session.
    pub chat: ChatMessage,
    /// Opaque content in it; the session's copy gets a filler worth their tokens.
    pub opaque: Vec<Opaque>,
    /// Anthropic: the indexes of the content blocks this part stands for (empty: all).
    pub blocks: Vec<usize>,
    /// The part is a leading system prompt (kept permanently) rather than a mid-history one.
    pub pinned: bool,
}

/// One incoming message (or Anthropic's `system`), read.
#[derive(Clone, Debug)]
pub struct Analyzed {
    /// Semantic fingerprint: equal for the same message however it is serialized.
    pub fp: u64,
    /// The canonical form `fp` hashes (what a conversation's full-width content key hashes).
    pub form: String,
    /// What the session stores for it (one part, or several for Anthropic tool results).
    pub parts: Vec<Part>,
    /// The message's role as sent.
    pub role: String,
}

/// Reads item `i` of `request` (Anthropic's `system` or a message). `pinned` is left false:
/// whether a system message leads the conversation is the conversation's to say.
///
/// # Errors
/// [`BadRequest`] naming the message that is not an object, has no role, or has a content of
/// the wrong shape.
pub fn analyze_item(
    provider: Provider,
    request: &Request,
    i: usize,
) -> Result<Analyzed, BadRequest> {
    let raw = &request.items[i];
    let value: Value =
        serde_json::from_str(raw.get()).map_err(|e| BadRequest(format!("item {i}: {e}")))?;
    if request.has_system_item && i == 0 {
        return anthropic_system(&value).map_err(|e| BadRequest(format!("`system`: {e}")));
    }
    let where_ = format!("messages[{}]", request.message_index(i));
    match provider {
        Provider::OpenAi => openai_message(&value),
        Provider::Anthropic => anthropic_message(&value),
    }
    .map_err(|e| BadRequest(format!("{where_}: {e}")))
}

/// Reads every item of `request`.
///
/// # Errors
/// As [`analyze_item`].
pub fn analyze(provider: Provider, request: &Request) -> Result<Vec<Analyzed>, BadRequest> {
    (0..request.items.len()).map(|i| analyze_item(provider, request, i)).collect()
}

/// The hash of each item's raw bytes: equal bytes are the same message, without reading it.
pub fn raw_hashes(request: &Request) -> Vec<u64> {
    request.items.iter().map(|raw| hash_str(raw.get())).collect()
}

/// Builds the semantic fingerprint from a role and a normalized block list, with the
/// canonical form it hashes.
fn fingerprint(role: &str, normalized: &[Value]) -> (u64, String) {
    let role = if role == "developer" { "system" } else { role };
    let form = canonical(&Value::Array(vec![Value::from(role), Value::Array(normalized.to_vec())]));
    (hash_str(&form), form)
}

fn text_block(text: &str) -> Value {
    Value::Array(vec![Value::from("t"), Value::from(text)])
}

fn call_block(id: &str, name: &str, arguments: &str) -> Value {
    Value::Array(vec![
        Value::from("c"),
        Value::from(id),
        Value::from(name),
        Value::from(canonical_text(arguments)),
    ])
}

fn opaque_block(value: &Value) -> Value {
    Value::Array(vec![Value::from("o"), Value::from(canonical(value))])
}

fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn role_of(role: &str) -> Result<Role, String> {
    Ok(match role {
        "system" | "developer" => Role::System,
        "user" | "function" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => return Err(format!("unknown role `{other}`")),
    })
}

/// One OpenAI chat message.
fn openai_message(value: &Value) -> Result<Analyzed, String> {
    if !value.is_object() {
        return Err("not a JSON object".into());
    }
    let role_name = str_field(value, "role").ok_or("missing `role`")?.to_string();
    let role = role_of(&role_name)?;
    let mut text = String::new();
    let mut opaque = Vec::new();
    let mut normalized = Vec::new();
    match value.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            text.push_str(s);
            if !s.is_empty() {
                normalized.push(text_block(s));
            }
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                let kind = str_field(part, "type").unwrap_or("");
                match kind {
                    "text" | "refusal" | "input_text" => {
                        let t =
                            str_field(part, kind).or_else(|| str_field(part, "text")).unwrap_or("");
                        push_text(&mut text, t);
                        if !t.is_empty() {
                            normalized.push(text_block(t));
                        }
                    }
                    _ => {
                        opaque.push(openai_opaque(part));
                        normalized.push(opaque_block(part));
                    }
                }
            }
        }
        Some(_) => return Err("`content` must be a string, an array or null".into()),
    }
    if let Some(refusal) = str_field(value, "refusal").filter(|r| !r.is_empty()) {
        push_text(&mut text, refusal);
        normalized.push(text_block(refusal));
    }
    let mut calls = Vec::new();
    if let Some(list) = value.get("tool_calls").filter(|v| !v.is_null()) {
        let list = list.as_array().ok_or("`tool_calls` must be an array")?;
        for (i, call) in list.iter().enumerate() {
            let id = str_field(call, "id").ok_or_else(|| format!("tool_calls[{i}] has no `id`"))?;
            let function =
                call.get("function").ok_or_else(|| format!("tool_calls[{i}] has no `function`"))?;
            let name = str_field(function, "name").unwrap_or("");
            let arguments = match function.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            normalized.push(call_block(id, name, &arguments));
            calls.push(ToolCall::new(id, name, arguments));
        }
    }
    let tool_call_id = str_field(value, "tool_call_id").map(str::to_string);
    if let Some(id) = &tool_call_id {
        normalized.push(Value::Array(vec![Value::from("i"), Value::from(id.as_str())]));
    }
    if role == Role::Tool && tool_call_id.is_none() {
        return Err("a `tool` message needs `tool_call_id`".into());
    }
    let mut chat = ChatMessage::text(role, text);
    chat.tool_calls = calls;
    chat.tool_call_id = tool_call_id;
    chat.name = str_field(value, "name").map(str::to_string);
    let (fp, form) = fingerprint(&role_name, &normalized);
    Ok(Analyzed {
        fp,
        form,
        parts: vec![Part { chat, opaque, blocks: Vec::new(), pinned: false }],
        role: role_name,
    })
}

fn push_text(text: &mut String, part: &str) {
    if part.is_empty() {
        return;
    }
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(part);
}

/// An OpenAI content part other than text.
fn openai_opaque(part: &Value) -> Opaque {
    let kind = str_field(part, "type").unwrap_or("unknown");
    match kind {
        "image_url" => {
            let image = part.get("image_url");
            let url = image.and_then(|i| str_field(i, "url")).unwrap_or("");
            let detail = image.and_then(|i| str_field(i, "detail")).unwrap_or("auto");
            let dims = data_url_bytes(url).and_then(|(_, bytes)| image_size(&bytes));
            let tokens = if detail == "low" { 85 } else { openai_image_tokens(dims) };
            Opaque { label: image_label("image", dims), tokens }
        }
        "input_audio" => {
            let bytes = part
                .get("input_audio")
                .and_then(|a| str_field(a, "data"))
                .map_or(0, |d| d.len() * 3 / 4);
            Opaque { label: format!("audio {bytes} bytes"), tokens: audio_tokens(bytes) }
        }
        "file" => {
            let file = part.get("file");
            let bytes = file
                .and_then(|f| str_field(f, "file_data"))
                .and_then(|d| data_url_bytes(d).map(|(_, b)| b.len()).or(Some(d.len() * 3 / 4)))
                .unwrap_or(0);
            let name = file.and_then(|f| str_field(f, "filename")).unwrap_or("file");
            Opaque { label: format!("file {name} {bytes} bytes"), tokens: document_tokens(bytes) }
        }
        other => Opaque { label: other.to_string(), tokens: json_tokens(part) },
    }
}

fn image_label(kind: &str, dims: Option<(u32, u32)>) -> String {
    match dims {
        Some((w, h)) => format!("{kind} {w}x{h}"),
        None => kind.to_string(),
    }
}

/// OpenAI's published formula for `detail: high`: fit in 2048×2048, shortest side to 768,
/// 170 tokens per 512-pixel tile plus 85. Unknown size: a 1024×1024 image (765).
pub fn openai_image_tokens(dims: Option<(u32, u32)>) -> u32 {
    let Some((w, h)) = dims else { return 765 };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    let short = (768.0 / w.min(h)).min(1.0);
    w *= short;
    h *= short;
    let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
    85 + 170 * tiles as u32
}

/// Anthropic's published formula: `width × height / 750`, after scaling the long edge to at
/// most 1,568 pixels. Unknown size: the largest image it keeps unscaled (1,600).
pub fn anthropic_image_tokens(dims: Option<(u32, u32)>) -> u32 {
    let Some((w, h)) = dims else { return 1_600 };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let fit = (1568.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    ((w * h / 750.0).ceil() as u32).clamp(1, 1_600)
}

/// Documents (PDF and other files) by size: about 1,500 tokens per 100 KB page-equivalent,
/// at least 256.
pub fn document_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes / 64).unwrap_or(u32::MAX).max(256)
}

/// Audio by size: about 1 token per 160 bytes (16 kB/s speech at ~100 tokens/s), at least 32.
pub fn audio_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes / 160).unwrap_or(u32::MAX).max(32)
}

/// Any other block: a quarter of its JSON length.
fn json_tokens(value: &Value) -> u32 {
    u32::try_from(value.to_string().len() / 4).unwrap_or(u32::MAX).max(1)
}

/// The media type and bytes of a `data:` URL with base64 data.
fn data_url_bytes(url: &str) -> Option<(String, Vec<u8>)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.split(';').next().unwrap_or("").to_string();
    meta.ends_with(";base64").then_some(())?;
    Some((media, decode_prefix(data)))
}

/// Decodes enough of a base64 string to read an image header (JPEG may need more: the
/// whole string up to 4 MB).
fn decode_prefix(data: &str) -> Vec<u8> {
    let end = data.len().min(4 << 20) / 4 * 4;
    let engine = base64::engine::general_purpose::STANDARD;
    engine.decode(&data.as_bytes()[..end]).unwrap_or_default()
}

/// Width and height from a PNG, GIF, JPEG or WebP header.
pub fn image_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    if bytes.len() >= 24 && bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some((be32(&bytes[16..20]), be32(&bytes[20..24])));
    }
    if bytes.len() >= 10 && (bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a")) {
        let w = u32::from(u16::from_le_bytes([bytes[6], bytes[7]]));
        let h = u32::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        return Some((w, h));
    }
    if bytes.len() >= 30 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        return match &bytes[12..16] {
            b"VP8X" => {
                let w = 1 + u32::from_le_bytes([bytes[24], bytes[25], bytes[26], 0]);
                let h = 1 + u32::from_le_bytes([bytes[27], bytes[28], bytes[29], 0]);
                Some((w, h))
            }
            b"VP8 " => {
                let w = u32::from(u16::from_le_bytes([bytes[26], bytes[27]]) & 0x3fff);
                let h = u32::from(u16::from_le_bytes([bytes[28], bytes[29]]) & 0x3fff);
                Some((w, h))
            }
            b"VP8L" => {
                let b = &bytes[21..25];
                let w = 1 + (u32::from(b[0]) | (u32::from(b[1] & 0x3f) << 8));
                let h = 1
                    + ((u32::from(b[1]) >> 6)
                        | (u32::from(b[2]) << 2)
                        | (u32::from(b[3] & 0x0f) << 10));
                Some((w, h))
            }
            _ => None,
        };
    }
    if bytes.starts_with(&[0xff, 0xd8]) {
        let mut i = 2;
        while i + 9 < bytes.len() {
            if bytes[i] != 0xff {
                i += 1;
                continue;
            }
            let marker = bytes[i + 1];
            let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
            let sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
            if sof {
                let h = u32::from(u16::from_be_bytes([bytes[i + 5], bytes[i + 6]]));
                let w = u32::from(u16::from_be_bytes([bytes[i + 7], bytes[i + 8]]));
                return Some((w, h));
            }
            i += 2 + len;
        }
    }
    None
}

/// Anthropic's top-level `system`: a string or text blocks.
fn anthropic_system(value: &Value) -> Result<Analyzed, String> {
    let mut text = String::new();
    let mut normalized = Vec::new();
    let mut opaque = Vec::new();
    match value {
        Value::String(s) => {
            text.push_str(s);
            normalized.push(text_block(s));
        }
        Value::Array(blocks) => {
            for block in blocks {
                match str_field(block, "text") {
                    Some(t) if str_field(block, "type") == Some("text") => {
                        push_text(&mut text, t);
                        normalized.push(text_block(t));
                    }
                    _ => {
                        opaque.push(Opaque {
                            label: str_field(block, "type").unwrap_or("block").to_string(),
                            tokens: json_tokens(block),
                        });
                        normalized.push(opaque_block(block));
                    }
                }
            }
        }
        _ => return Err("must be a string or an array of blocks".into()),
    }
    let (fp, form) = fingerprint("system", &normalized);
    Ok(Analyzed {
        fp,
        form,
        parts: vec![Part {
            chat: ChatMessage::text(Role::System, text),
            opaque,
            blocks: Vec::new(),
            pinned: true,
        }],
        role: "system".into(),
    })
}

/// A block of an Anthropic message that is not text, tool use or tool result.
fn anthropic_opaque(block: &Value) -> Opaque {
    let kind = str_field(block, "type").unwrap_or("unknown");
    let source = block.get("source");
    let base64_bytes = || {
        source.filter(|s| str_field(s, "type") == Some("base64")).and_then(|s| str_field(s, "data"))
    };
    match kind {
        "image" => {
            let dims = base64_bytes().and_then(|d| image_size(&decode_prefix(d)));
            let media = source.and_then(|s| str_field(s, "media_type")).unwrap_or("image");
            Opaque { label: image_label(media, dims), tokens: anthropic_image_tokens(dims) }
        }
        "document" => {
            let tokens = match source.and_then(|s| str_field(s, "type")) {
                Some("text") => {
                    u32::try_from(source.and_then(|s| str_field(s, "data")).map_or(0, str::len) / 4)
                        .unwrap_or(u32::MAX)
                        .max(1)
                }
                Some("base64") => document_tokens(base64_bytes().map_or(0, |d| d.len() * 3 / 4)),
                _ => json_tokens(block).max(document_tokens(0)),
            };
            Opaque { label: "document".into(), tokens }
        }
        "redacted_thinking" => Opaque {
            label: "redacted thinking".into(),
            tokens: u32::try_from(str_field(block, "data").map_or(0, str::len) / 4)
                .unwrap_or(u32::MAX)
                .max(1),
        },
        other => Opaque { label: other.to_string(), tokens: json_tokens(block) },
    }
}

/// One Anthropic message: an assistant turn is one part; a user turn is one part per
/// `tool_result` block plus one for the rest.
fn anthropic_message(value: &Value) -> Result<Analyzed, String> {
    if !value.is_object() {
        return Err("not a JSON object".into());
    }
    let role_name = str_field(value, "role").ok_or("missing `role`")?.to_string();
    let role = match role_name.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => return Err(format!("unknown role `{other}` (user or assistant)")),
    };
    let blocks: Vec<Value> = match value.get("content") {
        Some(Value::String(s)) => {
            let chat = ChatMessage::text(role, s.clone());
            let normalized = if s.is_empty() { vec![] } else { vec![text_block(s)] };
            let (fp, form) = fingerprint(&role_name, &normalized);
            return Ok(Analyzed {
                fp,
                form,
                parts: vec![Part { chat, opaque: vec![], blocks: vec![], pinned: false }],
                role: role_name,
            });
        }
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => return Err("`content` must be a string or an array of blocks".into()),
    };
    let mut normalized = Vec::new();
    let mut results = Vec::new();
    let mut rest_text = String::new();
    let mut rest_opaque = Vec::new();
    let mut rest_blocks = Vec::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let kind = str_field(block, "type").ok_or_else(|| format!("content[{i}] has no `type`"))?;
        match kind {
            "text" => {
                let t = str_field(block, "text").unwrap_or("");
                push_text(&mut rest_text, t);
                if !t.is_empty() {
                    normalized.push(text_block(t));
                }
                rest_blocks.push(i);
            }
            "thinking" => {
                push_text(&mut rest_text, str_field(block, "thinking").unwrap_or(""));
                normalized.push(opaque_block(block));
                rest_blocks.push(i);
            }
            "tool_use" if role == Role::Assistant => {
                let id = str_field(block, "id")
                    .ok_or_else(|| format!("content[{i}]: tool_use without `id`"))?;
                let name = str_field(block, "name").unwrap_or("");
                let input = block.get("input").map_or_else(|| "{}".to_string(), canonical);
                normalized.push(call_block(id, name, &input));
                calls.push(ToolCall::new(id, name, input));
                rest_blocks.push(i);
            }
            "tool_result" if role == Role::User => {
                let id = str_field(block, "tool_use_id")
                    .ok_or_else(|| format!("content[{i}]: tool_result without `tool_use_id`"))?;
                let mut text = String::new();
                let mut opaque = Vec::new();
                match block.get("content") {
                    Some(Value::String(s)) => text.push_str(s),
                    Some(Value::Array(inner)) => {
                        for item in inner {
                            match str_field(item, "type") {
                                Some("text") => {
                                    push_text(&mut text, str_field(item, "text").unwrap_or(""))
                                }
                                _ => opaque.push(anthropic_opaque(item)),
                            }
                        }
                    }
                    _ => {}
                }
                let is_error = block.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                normalized
                    .push(Value::Array(vec![Value::from("r"), Value::from(canonical(block))]));
                let mut chat = ChatMessage::tool_result(id, text);
                chat.is_error = is_error;
                results.push(Part { chat, opaque, blocks: vec![i], pinned: false });
            }
            _ => {
                rest_opaque.push(anthropic_opaque(block));
                normalized.push(opaque_block(block));
                rest_blocks.push(i);
            }
        }
    }
    let mut parts = results;
    let has_rest = !rest_blocks.is_empty() || parts.is_empty();
    if has_rest {
        let mut chat = ChatMessage::text(role, rest_text);
        chat.tool_calls = calls;
        parts.push(Part { chat, opaque: rest_opaque, blocks: rest_blocks, pinned: false });
    }
    let (fp, form) = fingerprint(&role_name, &normalized);
    Ok(Analyzed { fp, form, parts, role: role_name })
}

/// The fingerprint an assistant message built from a response has (the same the client's
/// echo of it will have).
pub fn response_fingerprint(provider: Provider, message: &Value) -> Result<Analyzed, String> {
    match provider {
        Provider::OpenAi => openai_message(message),
        Provider::Anthropic => anthropic_message(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        bytes.extend_from_slice(&w.to_be_bytes());
        bytes.extend_from_slice(&h.to_be_bytes());
        bytes.extend_from_slice(&[8, 6, 0, 0, 0]);
        bytes
    }

    #[test]
    fn image_sizes_and_costs() {
        assert_eq!(image_size(&png(800, 600)), Some((800, 600)));
        assert_eq!(anthropic_image_tokens(Some((1000, 1000))), 1334);
        assert_eq!(anthropic_image_tokens(Some((200, 200))), 54);
        assert_eq!(openai_image_tokens(Some((1024, 1024))), 765);
        assert_eq!(openai_image_tokens(Some((2048, 4096))), 1105);
        let gif = b"GIF89a\x10\x00\x20\x00rest";
        assert_eq!(image_size(gif), Some((16, 32)));
    }

    #[test]
    fn echo_of_a_response_has_the_same_fingerprint() {
        let response: Value = serde_json::from_str(
            r#"{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"path\": \".\"}"}}]}"#,
        )
        .unwrap();
        let echo: Value = serde_json::from_str(
            r#"{"tool_calls":[{"function":{"arguments":"{\"path\":\".\"}","name":"ls"},"id":"c1","type":"function"}],"role":"assistant"}"#,
        )
        .unwrap();
        assert_eq!(openai_message(&response).unwrap().fp, openai_message(&echo).unwrap().fp);
        let other: Value = serde_json::from_str(r#"{"role":"assistant","content":"hi"}"#).unwrap();
        assert_ne!(openai_message(&other).unwrap().fp, openai_message(&echo).unwrap().fp);
    }

    #[test]
    fn anthropic_user_turn_splits_tool_results() {
        let message: Value = serde_json::from_str(
            r#"{"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":"ok"},
                {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"two"}],"is_error":true},
                {"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}"#,
        )
        .unwrap();
        let analyzed = anthropic_message(&message).unwrap();
        assert_eq!(analyzed.parts.len(), 3);
        assert_eq!(analyzed.parts[0].chat.tool_call_id.as_deref(), Some("t1"));
        assert!(analyzed.parts[1].chat.is_error);
        assert_eq!(analyzed.parts[2].blocks, vec![2]);
        let unmarked: Value = serde_json::from_str(
            r#"{"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":"ok"},
                {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"two"}],"is_error":true},
                {"type":"text","text":"go on"}]}"#,
        )
        .unwrap();
        assert_eq!(
            anthropic_message(&unmarked).unwrap().fp,
            analyzed.fp,
            "cache_control moves freely"
        );
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
    }
}
