//! JSONL: one message object per line, optionally after one header line.
//!
//! The header is a ctxwin extension for what a message line cannot carry: an object with no
//! `role` and with `tools` (both providers) or `system` (Anthropic), allowed only as the first
//! record. Blank lines are skipped.

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
