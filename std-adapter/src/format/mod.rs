//! Provider formats, the one home of everything that reads or writes OpenAI chat completions
//! and Anthropic Messages: conversation files and bodies, request envelopes, message analysis,
//! managed request bodies, token costs of what a counter cannot read, and fingerprints.
//!
//! Two views of the same formats, for two kinds of callers:
//!
//! * **Conversations** ([`read`], [`write()`], [`detect`]): JSON documents and JSONL read into
//!   and written from a [`Conversation`], for the CLI's `import`, `trim` and `build` and a
//!   session's composed payload. Text, tool calls and tool results only: content a
//!   conversation cannot hold is refused by name, never dropped.
//! * **Requests** ([`Request`], [`analyze`], [`ManagedBody`]): a request body parsed with
//!   every field and message kept as raw JSON; each message analysed into [`Part`]s (the
//!   text a counter reads, each block it cannot read labelled and costed by [`cost`], a
//!   [`fingerprint`]); and the body written back from the messages a payload keeps, byte for
//!   byte where the core changed nothing. Nothing a provider accepts is refused or lost:
//!   thinking with its signature, redacted thinking, server tools, citations, images,
//!   documents, audio and cache marks pass through untouched. For a proxy.
//!
//! Each provider has one module (`openai`, `anthropic`) with its conversation reader and
//! writer, its message analysis and its managed-body writer side by side.
//!
//! # Reading conversations
//!
//! * JSON: a bare message array, or a request body object (`{"model":…, "messages":[…],
//!   "tools":[…]}`, plus `system` for Anthropic); keys that do not carry conversation content
//!   (`model`, `max_tokens`, `cache_control`, …) are ignored.
//! * JSONL: one message object per line; blank lines are skipped. The first line may be a
//!   header object without `role` carrying `tools` (and, for Anthropic, `system`): a ctxwin
//!   extension so that JSONL loses nothing the JSON body holds.
//! * OpenAI: `content` is a string, `null` (assistant only) or an array of `text` parts joined
//!   with `"\n"`; `developer` reads as system; `tool_calls[].function.arguments` is kept as
//!   the exact JSON text.
//! * Anthropic: top-level `system` (string, or text blocks joined with `"\n"`) goes to
//!   [`Conversation::system`]. In a user message each `tool_result` block becomes a tool message
//!   and each `text` block a user message, in order. In an assistant message each `text` block
//!   starts an assistant message and `tool_use` blocks become the tool calls of the message
//!   before them; `input` is kept as its exact JSON text.
//! * Content a [`Conversation`] cannot hold (images, audio, files, thinking blocks, server
//!   tools) is refused with [`Problem::Unsupported`] naming the field, never silently dropped.
//! * Errors name the 1-based line where the offending value starts, the message index, and the
//!   field path ([`FormatError`]). A tool result whose id no earlier call has is *not* refused
//!   here: matching calls to results is the core's job.
//!
//! # Writing conversations
//!
//! * JSON writers emit a pretty-printed request body without `model`: `{"messages":[…]}` with
//!   `tools` (and Anthropic `system`) when present. JSONL writers emit compact lines, with the
//!   header line first only when there are tools (or, for Anthropic, a system prompt). JSON
//!   embedded as values (Anthropic `input`, tool schemas) is copied verbatim, except that JSONL
//!   turns its line breaks into spaces so each record stays on one line (they can only sit
//!   between tokens, so the JSON value is unchanged).
//! * OpenAI: [`Conversation::system`] becomes a leading system message; `content` is always a
//!   string (`""` beside tool calls).
//! * Anthropic: [`Conversation::system`] and the system messages before the first other message
//!   become the top-level `system` (a string, or text blocks when there are several). Adjacent
//!   messages of the same Anthropic role are merged into one turn, because the API wants user
//!   and assistant to alternate: consecutive tool results and the user text after them form one
//!   user turn. Tool-call `arguments` must be a JSON object ([`Problem::InvalidJsonText`]
//!   otherwise) and are embedded verbatim as `input`.
//!
//! # What survives a conversion
//!
//! OpenAI → Anthropic → OpenAI and Anthropic → OpenAI → Anthropic reproduce the same
//! [`Conversation`] for everything both express: user/assistant text, parallel tool calls with
//! their exact argument text, tool results, a leading system prompt, tool definitions. The
//! limits, each by design:
//!
//! * A system message after the first non-system message has no Anthropic equivalent; it is
//!   written as a user text block prefixed with `"[system] "`, and reads back as a user
//!   message. The prefix is never turned back into a system message on reading, so user text
//!   cannot promote itself to system.
//! * Several leading system messages become one system prompt joined with `"\n"`.
//! * Anthropic cannot place an empty text block beside others, so an empty message merged into
//!   a turn with other content disappears; an assistant text followed by a tool-call-only
//!   assistant message reads back as one message with both.
//! * OpenAI has no `is_error` on tool results; Anthropic has no message `name`. Each is dropped
//!   when written to the format without it.
//! * Multi-part OpenAI content is joined into one string; `developer` reads as `system`.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::format::{read, write, Format};
//!
//! let openai = r#"[
//!   {"role": "system", "content": "You are terse."},
//!   {"role": "user", "content": "List the files."},
//!   {"role": "assistant", "content": null, "tool_calls": [
//!     {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"dir\": \".\"}"}}]},
//!   {"role": "tool", "tool_call_id": "c1", "content": "Cargo.toml"}
//! ]"#;
//! let conv = read(openai, Format::OpenAiJson)?;
//! let anthropic = write(&conv, Format::AnthropicJson)?;
//! assert!(anthropic.contains(r#""system": "You are terse.""#));
//! assert!(anthropic.contains(r#""input": {"dir": "."}"#));
//!
//! let back = read(&write(&read(&anthropic, Format::AnthropicJson)?, Format::OpenAiJson)?, Format::OpenAiJson)?;
//! assert_eq!(back, conv);
//! # Ok::<(), ctxwin_std::format::FormatError>(())
//! ```

mod analysis;
mod anthropic;
mod cache_life;
mod check;
pub mod cost;
mod detect;
mod document;
mod error;
pub mod fingerprint;
mod jsonl;
mod managed;
mod node;
mod openai;
mod recall;
mod recall_stream;
mod request;
mod scan;
mod timestamps;

use std::fmt;
use std::io::{BufRead, Write};
use std::str::FromStr;

pub use analysis::{Analyzed, Opaque, Part, analyze, analyze_item, analyze_message};
pub use anthropic::{MANAGED_OPENING_TEXT, OPENING_USER_TEXT};
pub use cache_life::{
    ANTHROPIC_HOUR_MS, CACHE_LIFETIME_MS, OPENAI_CACHE_LIFETIME_MS, cache_lifetime_ms,
};
pub use error::{FormatError, Problem, UnknownFormat};
pub use jsonl::JsonlTail;
pub use managed::{KeptPart, ManagedBody};
pub use recall::{
    AnswerCalls, RECALL_TOOL, RecallCall, RecallResult, answer_calls, follow_up_body,
    merge_answers, message_as_answer, names_recall_tool, recall_marker, tools_with_recall,
    without_recall_tool,
};
pub use recall_stream::RecallStream;
pub use request::{BadRequest, PromptRanges, Request, raw_hashes};
pub use timestamps::message_timestamps;

use crate::message::Conversation;
use node::Source;

/// A conversation file format.
///
/// Parses from and displays as `openai`, `openai-jsonl`, `anthropic`, `anthropic-jsonl`
/// (`openai-json` and `anthropic-json` are accepted too).
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::Format;
/// let format: Format = "anthropic-jsonl".parse()?;
/// assert_eq!(format, Format::AnthropicJsonl);
/// assert!(format.is_jsonl());
/// assert_eq!(Format::OpenAiJson.to_string(), "openai");
/// # Ok::<(), ctxwin_std::format::UnknownFormat>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI chat completions: a message array or a request body.
    OpenAiJson,
    /// OpenAI chat-completions messages, one per line.
    OpenAiJsonl,
    /// Anthropic Messages: a message array or a request body with top-level `system`.
    AnthropicJson,
    /// Anthropic messages, one per line, after an optional `system`/`tools` header line.
    AnthropicJsonl,
}

/// Which provider's API a body speaks: the half of [`Format`] that readers and writers
/// dispatch on.
///
/// ```
/// use ctxwin_std::format::{Format, Provider};
/// assert_eq!(Format::AnthropicJsonl.provider(), Provider::Anthropic);
/// assert_eq!(Provider::OpenAi.as_str(), "openai");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    OpenAi,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
}

impl Provider {
    /// A short name for logs and metrics: `openai` or `anthropic`.
    ///
    /// ```
    /// assert_eq!(ctxwin_std::format::Provider::Anthropic.as_str(), "anthropic");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

impl Format {
    /// Every format, in the order of their names in [`UnknownFormat`]'s message.
    ///
    /// ```
    /// use ctxwin_std::format::Format;
    /// assert!(Format::ALL.iter().all(|f| f.name().parse::<Format>() == Ok(*f)));
    /// ```
    pub const ALL: [Format; 4] =
        [Format::OpenAiJson, Format::OpenAiJsonl, Format::AnthropicJson, Format::AnthropicJsonl];

    /// The name [`FromStr`] accepts and [`Display`](fmt::Display) prints.
    ///
    /// ```
    /// assert_eq!(ctxwin_std::format::Format::OpenAiJsonl.name(), "openai-jsonl");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Format::OpenAiJson => "openai",
            Format::OpenAiJsonl => "openai-jsonl",
            Format::AnthropicJson => "anthropic",
            Format::AnthropicJsonl => "anthropic-jsonl",
        }
    }

    /// Whether the format is one message per line.
    ///
    /// ```
    /// assert!(!ctxwin_std::format::Format::AnthropicJson.is_jsonl());
    /// ```
    pub const fn is_jsonl(self) -> bool {
        matches!(self, Format::OpenAiJsonl | Format::AnthropicJsonl)
    }

    /// The provider whose layout the format carries.
    ///
    /// ```
    /// use ctxwin_std::format::{Format, Provider};
    /// assert_eq!(Format::OpenAiJsonl.provider(), Provider::OpenAi);
    /// ```
    pub const fn provider(self) -> Provider {
        match self {
            Format::OpenAiJson | Format::OpenAiJsonl => Provider::OpenAi,
            Format::AnthropicJson | Format::AnthropicJsonl => Provider::Anthropic,
        }
    }

    const fn json(provider: Provider) -> Self {
        match provider {
            Provider::OpenAi => Format::OpenAiJson,
            Provider::Anthropic => Format::AnthropicJson,
        }
    }

    const fn jsonl(provider: Provider) -> Self {
        match provider {
            Provider::OpenAi => Format::OpenAiJsonl,
            Provider::Anthropic => Format::AnthropicJsonl,
        }
    }
}

impl FromStr for Format {
    type Err = UnknownFormat;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "openai" | "openai-json" => Ok(Format::OpenAiJson),
            "openai-jsonl" => Ok(Format::OpenAiJsonl),
            "anthropic" | "anthropic-json" => Ok(Format::AnthropicJson),
            "anthropic-jsonl" => Ok(Format::AnthropicJsonl),
            _ => Err(UnknownFormat { name: name.to_owned() }),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads a conversation from text in `format`.
///
/// # Errors
///
/// A [`FormatError`] naming the line, message and field of the first malformed value.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::{read, Format, Problem};
///
/// let jsonl = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"assistant\",\"content\":\"hello\"}\n";
/// let conv = read(jsonl, Format::OpenAiJsonl)?;
/// assert_eq!(conv.messages[1].content, "hello");
///
/// let bad = r#"{"messages": [{"role": "user", "content": 42}]}"#;
/// let err = read(bad, Format::AnthropicJson).unwrap_err();
/// assert_eq!(err.field, "messages[0].content");
/// assert!(matches!(err.problem, Problem::WrongType { found: "a number", .. }));
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
pub fn read(input: &str, format: Format) -> Result<Conversation, FormatError> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    let conv = if format.is_jsonl() {
        jsonl::read_str(input, format.provider())?
    } else {
        read_json(input, format.provider())?
    };
    tracing::debug!(%format, messages = conv.messages.len(), tools = conv.tools.len(), "read conversation");
    Ok(conv)
}

fn read_json(input: &str, provider: Provider) -> Result<Conversation, FormatError> {
    let src = Source::new(input, 1);
    let root = src.root()?;
    let mut conv = Conversation::default();
    document::read_document(&root, &mut conv, provider)?;
    Ok(conv)
}

/// Reads a conversation from a buffered reader; JSONL is read one line at a time, so a large
/// session file is never held as text all at once.
///
/// # Errors
///
/// As [`read`], plus [`Problem::Io`] when the reader fails or the text is not UTF-8 (with the
/// line being read, for JSONL).
///
/// # Examples
///
/// ```
/// use std::io::Cursor;
/// use ctxwin_std::format::{read_from, Format};
///
/// let file = Cursor::new("{\"role\":\"user\",\"content\":\"hi\"}\n");
/// let conv = read_from(file, Format::OpenAiJsonl)?;
/// assert_eq!(conv.messages.len(), 1);
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
pub fn read_from(mut reader: impl BufRead, format: Format) -> Result<Conversation, FormatError> {
    if format.is_jsonl() {
        let conv = jsonl::read_buf(reader, format.provider())?;
        tracing::debug!(%format, messages = conv.messages.len(), "read conversation");
        return Ok(conv);
    }
    let mut text = String::new();
    reader.read_to_string(&mut text).map_err(|err| FormatError {
        line: None,
        message: None,
        field: String::new(),
        problem: Problem::Io(err),
    })?;
    read(&text, format)
}

/// Writes a conversation as text in `format` (JSONL ends with a newline).
///
/// # Errors
///
/// A [`FormatError`] (with `line: None`) when the conversation holds something the format
/// cannot carry: tool-call arguments or tool parameters that are not a JSON object (Anthropic;
/// parameters for OpenAI too), tool calls on a non-assistant message, a tool message without
/// `tool_call_id`.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::{write, Format};
/// use ctxwin_std::{core::Role, ChatMessage, Conversation};
///
/// let mut conv = Conversation { system: Some("Be brief.".into()), ..Conversation::default() };
/// conv.messages.push(ChatMessage::text(Role::User, "hi"));
/// assert_eq!(
///     write(&conv, Format::OpenAiJsonl)?,
///     "{\"role\":\"system\",\"content\":\"Be brief.\"}\n{\"role\":\"user\",\"content\":\"hi\"}\n"
/// );
/// assert_eq!(
///     write(&conv, Format::AnthropicJsonl)?,
///     "{\"system\":\"Be brief.\"}\n{\"role\":\"user\",\"content\":\"hi\"}\n"
/// );
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
pub fn write(conv: &Conversation, format: Format) -> Result<String, FormatError> {
    let mut out = Vec::new();
    write_to(conv, format, &mut out)?;
    String::from_utf8(out).map_err(|err| {
        let err = std::io::Error::new(std::io::ErrorKind::InvalidData, err);
        FormatError { line: None, message: None, field: String::new(), problem: Problem::Io(err) }
    })
}

/// Writes a conversation in `format` to `out`, line by line for JSONL.
///
/// # Errors
///
/// As [`write()`], plus [`Problem::Io`] when `out` fails.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::{write_to, Format};
/// use ctxwin_std::{core::Role, ChatMessage, Conversation};
///
/// let mut conv = Conversation::default();
/// conv.messages.push(ChatMessage::text(Role::User, "hi"));
/// let mut file = Vec::new();
/// write_to(&conv, Format::AnthropicJson, &mut file)?;
/// assert!(String::from_utf8(file).unwrap().starts_with("{\n  \"messages\": ["));
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
pub fn write_to(
    conv: &Conversation,
    format: Format,
    mut out: impl Write,
) -> Result<(), FormatError> {
    let io = |err: std::io::Error| FormatError {
        line: None,
        message: None,
        field: String::new(),
        problem: Problem::Io(err),
    };
    let json = |err: serde_json::Error| io(err.into());
    match format {
        Format::OpenAiJson => {
            serde_json::to_writer_pretty(&mut out, &openai::wire_body(conv)?).map_err(json)?;
            out.write_all(b"\n").map_err(io)?;
        }
        Format::AnthropicJson => {
            serde_json::to_writer_pretty(&mut out, &anthropic::wire_body(conv)?).map_err(json)?;
            out.write_all(b"\n").map_err(io)?;
        }
        Format::OpenAiJsonl => {
            let header = openai::wire_header(conv)?;
            let lines = openai::wire_messages(conv)?;
            write_lines(&mut out, header.as_ref(), &lines).map_err(io)?;
        }
        Format::AnthropicJsonl => {
            let (header, lines) = anthropic::wire_lines(conv)?;
            write_lines(&mut out, header.as_ref(), &lines).map_err(io)?;
        }
    }
    tracing::debug!(%format, messages = conv.messages.len(), "wrote conversation");
    Ok(())
}

fn write_lines<H: serde::Serialize, M: serde::Serialize>(
    out: &mut impl Write,
    header: Option<&H>,
    lines: &[M],
) -> std::io::Result<()> {
    if let Some(header) = header {
        serde_json::to_writer(&mut *out, header)?;
        out.write_all(b"\n")?;
    }
    for line in lines {
        serde_json::to_writer(&mut *out, line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Guesses the format of `input`: JSON document or JSONL from its shape, OpenAI or Anthropic
/// from fields only one of them uses (OpenAI's `system`/`tool` roles and `tool_calls`,
/// Anthropic's `tool_use`/`tool_result` blocks, top-level `system`, `input_schema`). Looks at
/// the first 200 records. Input both providers read alike (plain user/assistant text) is
/// reported as OpenAI. `None` when the input is not JSON or not a conversation.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::{detect, Format};
///
/// let anthropic = r#"{"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]}"#;
/// assert_eq!(detect(anthropic), Some(Format::AnthropicJson));
/// let openai = "{\"role\":\"system\",\"content\":\"x\"}\n{\"role\":\"user\",\"content\":\"hi\"}\n";
/// assert_eq!(detect(openai), Some(Format::OpenAiJsonl));
/// assert_eq!(detect("not json"), None);
/// ```
pub fn detect(input: &str) -> Option<Format> {
    detect::detect(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_parse() {
        for format in Format::ALL {
            assert_eq!(format.to_string().parse::<Format>(), Ok(format));
        }
        assert_eq!("openai-json".parse::<Format>(), Ok(Format::OpenAiJson));
        assert_eq!("anthropic-json".parse::<Format>(), Ok(Format::AnthropicJson));
        assert_eq!("OpenAI".parse::<Format>(), Err(UnknownFormat { name: "OpenAI".into() }));
    }

    #[test]
    fn bom_is_ignored() {
        let conv =
            read("\u{feff}[{\"role\":\"user\",\"content\":\"x\"}]", Format::OpenAiJson).unwrap();
        assert_eq!(conv.messages.len(), 1);
    }

    #[test]
    fn failing_writer_reports_io() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk full"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut conv = Conversation::default();
        conv.messages.push(crate::ChatMessage::text(ctxwin_core::Role::User, "x"));
        for format in Format::ALL {
            let err = write_to(&conv, format, Broken).unwrap_err();
            assert!(
                matches!(err.problem, Problem::Io(ref e) if e.to_string() == "disk full"),
                "{err}"
            );
        }
    }
}
