//! A text buffer over caller-owned bytes: where summaries are written without allocating.

/// UTF-8 text written into a fixed byte buffer; writes past the end are cut at a char boundary.
///
/// ```
/// use ctxwin_core::summarize::TextBuffer;
/// let mut bytes = [0u8; 8];
/// let mut text = TextBuffer::new(&mut bytes);
/// text.push_str("héllo wörld");
/// assert_eq!(text.as_str(), "héllo w");
/// assert!(text.is_truncated());
/// ```
#[derive(Debug)]
pub struct TextBuffer<'a> {
    bytes: &'a mut [u8],
    len: usize,
    truncated: bool,
}

impl<'a> TextBuffer<'a> {
    /// An empty buffer over `bytes`.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Self { bytes, len: 0, truncated: false }
    }

    /// Appends as much of `text` as fits, cut at a char boundary.
    pub fn push_str(&mut self, text: &str) {
        let room = self.bytes.len() - self.len;
        let mut take = text.len().min(room);
        while !text.is_char_boundary(take) {
            take -= 1;
        }
        if take < text.len() {
            self.truncated = true;
        }
        if let (Some(target), Some(source)) =
            (self.bytes.get_mut(self.len..self.len + take), text.as_bytes().get(..take))
        {
            target.copy_from_slice(source);
            self.len += take;
        }
    }

    /// Appends `line`, preceded by a newline unless the buffer is empty.
    pub fn push_line(&mut self, line: &str) {
        if self.len > 0 {
            self.push_str("\n");
        }
        self.push_str(line);
    }

    /// The text written so far.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }

    /// Bytes written.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that can still be written.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.len
    }

    /// Whether some text did not fit.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// Forgets everything written.
    pub fn clear(&mut self) {
        self.len = 0;
        self.truncated = false;
    }

    /// Cuts the text back to `len` bytes (a char boundary at or below it).
    pub fn truncate(&mut self, len: usize) {
        let text = self.as_str();
        let mut keep = len.min(text.len());
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        self.len = keep;
    }
}

impl core::fmt::Write for TextBuffer<'_> {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        self.push_str(text);
        if self.truncated { Err(core::fmt::Error) } else { Ok(()) }
    }
}
