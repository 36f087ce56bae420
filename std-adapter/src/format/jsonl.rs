//! JSONL: one message object per line, optionally after one header line.
//!
//! The header is a ctxwin extension for what a message line cannot carry: an object with no
//! `role` and with `tools` (both providers) or `system` (Anthropic), allowed only as the first
//! record. Blank lines are skipped. [`JsonlTail`] reads a file from its end.

use std::io::BufRead;

use super::Provider;
use super::error::FormatError;
use super::node::{MESSAGES, Path, Seg, Source};
use crate::message::Conversation;

/// Reads JSONL records one line at a time into a conversation.
pub(super) struct LineReader {
    provider: Provider,
    conv: Conversation,
    records: usize,
    header_seen: bool,
}

impl LineReader {
    pub(super) fn new(provider: Provider) -> Self {
        Self { provider, conv: Conversation::default(), records: 0, header_seen: false }
    }

    /// Reads `text`, which is input line `line` (1-based).
    pub(super) fn line(&mut self, text: &str, line: usize) -> Result<(), FormatError> {
        let text = text.trim_start_matches('\u{feff}').trim_end();
        if text.trim_start().is_empty() {
            return Ok(());
        }
        let src = Source::new(text, line);
        let root = src.root()?;
        let first_record = self.records == 0 && !self.header_seen;
        if first_record && let Ok(obj) = root.object() {
            let header_key =
                obj.has("tools") || (self.provider == Provider::Anthropic && obj.has("system"));
            if header_key && !obj.has("role") {
                self.header_seen = true;
                return self.provider.read_header(&obj, &mut self.conv);
            }
        }
        let index = self.records;
        self.records = index.saturating_add(1);
        let record = root.labelled(Path::child(&MESSAGES, Seg::Index(index))).in_message(index);
        self.provider.read_message(&record, &mut self.conv.messages)
    }

    pub(super) fn finish(mut self) -> Conversation {
        self.provider.finish(&mut self.conv);
        self.conv
    }
}

/// Reads JSONL text.
pub(super) fn read_str(input: &str, provider: Provider) -> Result<Conversation, FormatError> {
    let mut reader = LineReader::new(provider);
    for (number, text) in (1..).zip(input.lines()) {
        reader.line(text, number)?;
    }
    Ok(reader.finish())
}

/// Reads JSONL from a buffered reader, holding one line at a time besides the result.
pub(super) fn read_buf(
    mut input: impl BufRead,
    provider: Provider,
) -> Result<Conversation, FormatError> {
    let mut reader = LineReader::new(provider);
    let mut buf = String::new();
    for number in 1.. {
        buf.clear();
        match input.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => reader.line(&buf, number)?,
            Err(err) => return Err(FormatError::io(err, number)),
        }
    }
    Ok(reader.finish())
}

/// A JSONL conversation read from its end: the leading lines every payload keeps (a header
/// line, system messages) and a tail of the last `n` records, so a long session file need not
/// be parsed whole when only its newest turns fit a budget (`ctxwin trim`).
///
/// ```
/// use ctxwin_std::format::{read, Format, JsonlTail};
///
/// let body = "{\"role\":\"system\",\"content\":\"Be brief.\"}\n\
///             {\"role\":\"user\",\"content\":\"one\"}\n\
///             {\"role\":\"assistant\",\"content\":\"two\"}\n\
///             {\"role\":\"user\",\"content\":\"three\"}\n";
/// let lines = JsonlTail::of(body).unwrap();
/// let (sub, complete) = lines.sub_text(body, 1);
/// assert!(!complete);
/// let tail = read(&sub, Format::OpenAiJsonl)?;
/// assert_eq!(tail.messages.len(), 2); // the system message and "three"
/// assert_eq!(lines.records(body), 4);
/// # Ok::<(), ctxwin_std::format::FormatError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonlTail {
    /// Bytes of the leading lines kept whole (header, system messages, blank lines).
    head: usize,
}

impl JsonlTail {
    /// The layout of `body`; `None` when its first lines are not JSON (the full reader
    /// reports where).
    pub fn of(body: &str) -> Option<JsonlTail> {
        let mut head = 0;
        for line in body.split_inclusive('\n') {
            let value: serde_json::Value = match serde_json::from_str(line.trim()) {
                Ok(value) => value,
                Err(_) if line.trim().is_empty() => {
                    head += line.len();
                    continue;
                }
                Err(_) => return None,
            };
            let role = value.get("role").and_then(|r| r.as_str());
            let header =
                role.is_none() && (value.get("tools").is_some() || value.get("system").is_some());
            if role != Some("system") && !header {
                break;
            }
            head += line.len();
        }
        Some(JsonlTail { head })
    }

    /// Start of the `n`-th line from the end (the end of the leading lines when the history
    /// has fewer lines).
    fn tail_start(&self, body: &str, n: usize) -> usize {
        let history = body.get(self.head..).unwrap_or_default();
        let trimmed = history.trim_end_matches(['\n', '\r', ' ', '\t']);
        let mut start = trimmed.len();
        for _ in 0..n {
            match trimmed.get(..start).and_then(|before| before.rfind('\n')) {
                Some(at) => start = at,
                None => return self.head,
            }
        }
        self.head + start + 1
    }

    /// The leading lines and the last `n` lines as one JSONL text, and whether that is all of
    /// `body`.
    pub fn sub_text(&self, body: &str, n: usize) -> (String, bool) {
        let start = self.tail_start(body, n);
        let head = body.get(..self.head).unwrap_or_default();
        let tail = body.get(start..).unwrap_or_default();
        let mut sub = String::with_capacity(head.len() + tail.len() + 1);
        sub.push_str(head);
        if !head.is_empty() && !head.ends_with('\n') {
            sub.push('\n');
        }
        sub.push_str(tail);
        (sub, start <= self.head)
    }

    /// The lines between the leading ones and the last `n`: what [`sub_text`](Self::sub_text)
    /// leaves out.
    pub fn skipped<'b>(&self, body: &'b str, n: usize) -> &'b str {
        body.get(self.head..self.tail_start(body, n)).unwrap_or_default()
    }

    /// Messages in the whole of `body` (non-blank lines after the header), counted without
    /// parsing them.
    pub fn records(&self, body: &str) -> usize {
        let head = body.get(..self.head).unwrap_or_default();
        let history = body.get(self.head..).unwrap_or_default();
        let pinned =
            head.lines().filter(|l| l.contains("\"role\"") || l.contains("\"system\"")).count();
        pinned + history.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Problem;

    #[test]
    fn header_only_first_and_blank_lines_skipped() {
        let text = "{\"system\":\"s\",\"tools\":[]}\n\n{\"role\":\"user\",\"content\":\"hi\"}\r\n";
        let conv = read_str(text, Provider::Anthropic).unwrap();
        assert_eq!(conv.system.as_deref(), Some("s"));
        assert_eq!(conv.messages.len(), 1);
        let late = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"tools\":[]}\n";
        let err = read_str(late, Provider::OpenAi).unwrap_err();
        assert_eq!(
            (err.line, err.message, err.field.as_str()),
            (Some(2), Some(1), "messages[1].role")
        );
        assert!(matches!(err.problem, Problem::Missing));
    }

    #[test]
    fn buffered_reading_matches_and_reports_bad_utf8_line() {
        let text =
            "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"assistant\",\"content\":\"b\"}";
        let from_buf = read_buf(text.as_bytes(), Provider::OpenAi).unwrap();
        assert_eq!(from_buf, read_str(text, Provider::OpenAi).unwrap());
        let bad: &[u8] = b"{\"role\":\"user\",\"content\":\"a\"}\n\xff\n";
        let err = read_buf(bad, Provider::OpenAi).unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(matches!(err.problem, Problem::Io(_)));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let text = "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":}\n";
        let err = read_str(text, Provider::OpenAi).unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(matches!(err.problem, Problem::Syntax { column: 26, .. }), "{err:?}");
    }
}
