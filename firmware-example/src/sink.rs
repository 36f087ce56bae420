//! `embedded_io::Write` sinks for request bodies.

use embedded_io::{ErrorKind, ErrorType, Write};

/// Compares what is written with `expected`, byte by byte, without storing it: a second
/// payload checked against the first needs no second buffer.
#[derive(Debug)]
pub struct CompareSink<'a> {
    expected: &'a [u8],
    at: usize,
    equal: bool,
}

impl<'a> CompareSink<'a> {
    /// A sink expecting exactly `expected`.
    pub fn new(expected: &'a [u8]) -> Self {
        Self { expected, at: 0, equal: true }
    }

    /// Whether everything written so far matched and nothing of `expected` is missing.
    pub fn matched(&self) -> bool {
        self.equal && self.at == self.expected.len()
    }
}

impl ErrorType for CompareSink<'_> {
    type Error = ErrorKind;
}

impl Write for CompareSink<'_> {
    fn write(&mut self, buf: &[u8]) -> Result<usize, ErrorKind> {
        let end = self.at.saturating_add(buf.len());
        if self.expected.get(self.at..end) != Some(buf) {
            self.equal = false;
        }
        self.at = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), ErrorKind> {
        Ok(())
    }
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}
