//! Just enough JSON for the core: validating tool definitions, and writing escaped strings to
//! an [`embedded_io::Write`] without allocating or panicking.

use crate::error::Error;
use embedded_io::{ErrorKind, Write};

/// Deepest nesting a validated document may have.
const MAX_DEPTH: u32 = 64;

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// End of the string starting at the quote at `at`.
fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    at += 1;
    loop {
        match *bytes.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => {
                let escaped = *bytes.get(at + 1)?;
                at += match escaped {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                    b'u' if bytes.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
                    _ => return None,
                };
            }
            0..=0x1f => return None,
            _ => at += 1,
        }
    }
}

fn digits_end(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

/// End of the one or more digits starting at `at`.
fn some_digits(bytes: &[u8], at: usize) -> Option<usize> {
    let end = digits_end(bytes, at);
    (end > at).then_some(end)
}

/// End of the number starting at `at`.
fn number_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    let start = at;
    at = some_digits(bytes, at)?;
    // A leading zero stands alone.
    if bytes.get(start) == Some(&b'0') && at > start + 1 {
        return None;
    }
    if bytes.get(at) == Some(&b'.') {
        at = some_digits(bytes, at + 1)?;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        at = some_digits(bytes, at)?;
    }
    Some(at)
}

/// Whether `text` is one valid JSON document (RFC 8259), nested at most 64 deep.
pub(crate) fn is_valid(text: &str) -> bool {
    validate(text.as_bytes()).is_some()
}

/// Whether `text` is a valid JSON object.
pub(crate) fn is_object(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.get(skip_space(bytes, 0)) == Some(&b'{') && is_valid(text)
}

/// Position of the value of the object member whose key starts at `at` (after `"key" :`).
fn member(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let at = skip_space(bytes, string_end(bytes, at)?);
    (bytes.get(at) == Some(&b':')).then(|| skip_space(bytes, at + 1))
}

fn validate(bytes: &[u8]) -> Option<()> {
    // Bit `d` of `objects` says whether the container at depth `d` is an object.
    let mut objects: u64 = 0;
    let mut depth: u32 = 0;
    let mut at = skip_space(bytes, 0);
    loop {
        // A value starts at `at`.
        let byte = *bytes.get(at)?;
        at = match byte {
            b'{' | b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let object = byte == b'{';
                objects = (objects & !(1 << depth)) | (u64::from(object) << depth);
                depth += 1;
                at = skip_space(bytes, at + 1);
                let close = if object { b'}' } else { b']' };
                if bytes.get(at) != Some(&close) {
                    if object {
                        at = member(bytes, at)?;
                    }
                    continue;
                }
                depth -= 1;
                at + 1
            }
            b'"' => string_end(bytes, at)?,
            b'-' | b'0'..=b'9' => number_end(bytes, at)?,
            _ => {
                let literal: &[u8] = match byte {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                if bytes.get(at..at + literal.len()) != Some(literal) {
                    return None;
                }
                at + literal.len()
            }
        };
        // After a value: close containers, or a comma before the next value.
        loop {
            at = skip_space(bytes, at);
            if depth == 0 {
                return (at == bytes.len()).then_some(());
            }
            let object = objects & (1 << (depth - 1)) != 0;
            match (*bytes.get(at)?, object) {
                (b',', _) => {
                    at = skip_space(bytes, at + 1);
                    if object {
                        at = member(bytes, at)?;
                    }
                    break;
                }
                (b'}', true) | (b']', false) => {
                    depth -= 1;
                    at += 1;
                }
                _ => return None,
            }
        }
    }
}

/// Writes to an [`embedded_io::Write`], counting bytes, turning `Ok(0)` into an error instead
/// of the panic of `embedded_io::Write::write_all`.
///
/// The first error sticks: later writes do nothing and [`finish`](Self::finish) reports it.
/// Callers write a whole document without a `?` per piece (each one copied the error out
/// of its callee: about a kilobyte of firmware flash on the request writer).
pub(crate) struct JsonWriter<W> {
    out: W,
    written: usize,
    failed: Option<ErrorKind>,
}

impl<W: Write> JsonWriter<W> {
    pub(crate) fn new(out: W) -> Self {
        Self { out, written: 0, failed: None }
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> usize {
        self.written
    }

    /// Bytes written so far, or the first error.
    pub(crate) fn finish(&self) -> Result<usize, Error> {
        match self.failed {
            None => Ok(self.written),
            Some(kind) => Err(Error::Io(kind)),
        }
    }

    /// Writes `bytes` as they are.
    pub(crate) fn raw(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.failed.is_none() {
            match self.out.write(bytes) {
                Ok(0) => self.failed = Some(ErrorKind::WriteZero),
                Ok(n) => {
                    self.written += n;
                    bytes = bytes.get(n..).unwrap_or_default();
                }
                Err(error) => self.failed = Some(embedded_io::Error::kind(&error)),
            }
        }
    }

    /// Writes the escaped body of a JSON string (no quotes).
    pub(crate) fn escaped(&mut self, text: &str) {
        let bytes = text.as_bytes();
        let mut run = 0usize;
        for (at, &byte) in bytes.iter().enumerate() {
            if byte >= 0x20 && byte != b'"' && byte != b'\\' {
                continue;
            }
            self.raw(bytes.get(run..at).unwrap_or_default());
            let short = match byte {
                b'\n' => b'n',
                b'\r' => b'r',
                b'\t' => b't',
                0..=0x1f => 0,
                other => other,
            };
            if short == 0 {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let hex = |nibble: u8| HEX.get(usize::from(nibble)).copied().unwrap_or(b'0');
                self.raw(&[b'\\', b'u', b'0', b'0', hex(byte >> 4), hex(byte & 0xf)]);
            } else {
                self.raw(&[b'\\', short]);
            }
            run = at + 1;
        }
        self.raw(bytes.get(run..).unwrap_or_default())
    }

    /// Writes `text` escaped as a JSON string inside a JSON string (a JSON document embedded
    /// in a message's content).
    pub(crate) fn escaped_twice(&mut self, text: &str) {
        let mut run = 0usize;
        for (at, byte) in text.bytes().enumerate() {
            let special = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                _ => continue,
            };
            self.escaped(text.get(run..at).unwrap_or_default());
            self.escaped(special);
            run = at + 1;
        }
        self.escaped(text.get(run..).unwrap_or_default())
    }

    /// Writes `text` as a quoted, escaped JSON string.
    pub(crate) fn string(&mut self, text: &str) {
        self.raw(b"\"");
        self.escaped(text);
        self.raw(b"\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_documents() {
        for text in [
            r#"{}"#,
            r#" {"a": [1, -2.5e+3, true, false, null, "x\"\u00e9\n"], "b": {"c": []}} "#,
            r#"{"name":"ls","parameters":{"type":"object","properties":{}}}"#,
            "[0, 1e5, -0.0]",
            r#""plain""#,
        ] {
            assert!(is_valid(text), "{text}");
        }
    }

    #[test]
    fn rejects_invalid_documents() {
        for text in [
            "",
            "{",
            "}",
            "{,}",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            "[1,]",
            "[01]",
            "1.",
            "-",
            "tru",
            r#""\x""#,
            "\"\u{1}\"",
            "{} {}",
            r#"{"a":1]"#,
            "[1}",
            r#"{1:2}"#,
            "nul",
        ] {
            assert!(!is_valid(text), "{text:?}");
        }
        assert!(!is_object("[1]"));
        let deep = "[".repeat(65) + &"]".repeat(65);
        assert!(!is_valid(&deep));
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(is_valid(&ok));
    }

    #[test]
    fn escapes_what_json_requires() {
        let mut out = [0u8; 64];
        let mut writer = JsonWriter::new(&mut out[..]);
        writer.string("a\"b\\c\nd\u{1}é");
        let len = writer.finish().unwrap();
        assert_eq!(core::str::from_utf8(&out[..len]).unwrap(), r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn a_full_sink_is_an_error_not_a_panic() {
        let mut out = [0u8; 4];
        let mut writer = JsonWriter::new(&mut out[..]);
        writer.string("too long");
        writer.raw(b"x");
        assert_eq!(writer.finish(), Err(Error::Io(ErrorKind::WriteZero)));
    }

    proptest::proptest! {
        #[test]
        fn escaped_strings_are_valid_json(text in "\\PC*|[\\x00-\\x7f]*") {
            let mut out = vec![0u8; text.len() * 6 + 2];
            let mut writer = JsonWriter::new(&mut out[..]);
            writer.string(&text);
            let len = writer.finish().unwrap();
            let written = core::str::from_utf8(&out[..len]).unwrap();
            proptest::prop_assert!(is_valid(written));
        }

        #[test]
        fn never_panics(text in "\\PC{0,64}") {
            let _ = is_valid(&text);
        }
    }
}
