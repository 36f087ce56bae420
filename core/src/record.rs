//! Layout of a message record inside its arena span.
//!
//! ```text
//! every record      content (header.content_len bytes, UTF-8)
//! tool result       content | tool_call_id
//! assistant calls   content | items × (id_len u16, name_len u16, args_len u32) | id name args …
//! summary           content | items × (first_id u64, last_id u64)
//! with flags::TRAILER  … | [original_tokens u32] | [terms 4 × u16] | [key u32] | kind u8
//! ```
//! The trailer keeps what only some records need out of the fixed-size header: the token
//! count before reduction (`kind` bit 0, reduced records only), the term hashes (`kind`
//! bit 1, only under a strategy that uses terms), whether a result was pushed whole (bit 2)
//! and a result's supersede key (bit 3). Snapshots carry them as header fields, so the
//! wire format does not know the trailer.
//! All integers little-endian. Text is re-validated as UTF-8 on every read (the crate has no
//! `unsafe`); restore validates it once up front, so reads never fall back in practice.

use crate::header::{Header, flags};

/// Bit `index` of a call bitmask (0 past the 64 calls a unit may hold).
// Out of line: the checked 64-bit shift is ~20 B of Thumb code at each of its callers.
#[inline(never)]
pub(crate) fn bit(index: usize) -> u64 {
    u32::try_from(index).ok().and_then(|shift| 1u64.checked_shl(shift)).unwrap_or(0)
}

/// One tool invocation requested by an assistant message.
///
/// ```
/// use ctxwin_core::ToolCall;
/// let call = ToolCall::new("call_1", "read_file", r#"{"path":"src/main.rs"}"#);
/// assert_eq!(call.name, "read_file");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ToolCall<'a> {
    /// Id the result will answer (`tool_call_id`); non-empty, unique within the message.
    pub id: &'a str,
    /// Function name.
    pub name: &'a str,
    /// Arguments as JSON text, exactly as the model produced them.
    pub arguments: &'a str,
}

impl<'a> ToolCall<'a> {
    /// A call from its three parts.
    ///
    /// ```
    /// let call = ctxwin_core::ToolCall::new("c1", "ls", "{}");
    /// assert_eq!(call.id, "c1");
    /// ```
    pub const fn new(id: &'a str, name: &'a str, arguments: &'a str) -> Self {
        Self { id, name, arguments }
    }
}

/// Bytes of one call entry in an assistant record's call table.
pub(crate) const CALL_ENTRY: usize = 8;
/// Bytes of one source range in a summary record.
pub(crate) const RANGE_ENTRY: usize = 16;

fn text(bytes: &[u8]) -> &str {
    core::str::from_utf8(bytes).unwrap_or_default()
}

/// Bytes of the trailer's kind byte.
const KIND_LEN: usize = 1;
/// Trailer kind bit: an original token count.
const HAS_ORIGINAL: u8 = 1;
/// Trailer kind bit: term hashes.
const HAS_TERMS: u8 = 1 << 1;
/// Trailer kind bit, no bytes: a tool result pushed whole, never reduced.
const WHOLE: u8 = 1 << 2;
/// Trailer kind bit: a supersede key ([`Message::supersede_key`](crate::message::Message)).
const HAS_KEY: u8 = 1 << 3;

/// What a record keeps after its body: its original token count when it differs, its terms,
/// whether it was pushed whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Trailer {
    /// Token cost before reduction, when the record was reduced.
    pub original: Option<u32>,
    /// Hashes of up to four identifiers, paths or numbers (0 = none).
    pub terms: [u16; 4],
    /// A tool result pushed [`whole`](crate::message::Message::whole): a compaction never
    /// reduces it ([`Config::compaction_limit`](crate::config::Config::compaction_limit)).
    pub whole: bool,
    /// A tool result's [`supersede_key`](crate::message::Message::supersede_key) (0 = none).
    #[cfg(feature = "compaction-cut")]
    pub key: u32,
}

impl Trailer {
    pub(crate) const NONE: Trailer = Trailer {
        original: None,
        terms: [0; 4],
        whole: false,
        #[cfg(feature = "compaction-cut")]
        key: 0,
    };

    /// The supersede key (0 = none, and always without the `compaction-cut` feature).
    pub(crate) fn supersede_key(&self) -> u32 {
        #[cfg(feature = "compaction-cut")]
        return self.key;
        #[cfg(not(feature = "compaction-cut"))]
        0
    }

    fn kind(&self) -> u8 {
        (if self.original.is_some() { HAS_ORIGINAL } else { 0 })
            | (if self.terms == [0; 4] { 0 } else { HAS_TERMS })
            | (if self.whole { WHOLE } else { 0 })
            | (if self.supersede_key() == 0 { 0 } else { HAS_KEY })
    }

    /// Bytes it takes at the end of a record (0 for none).
    pub(crate) fn len(&self) -> usize {
        match self.kind() {
            0 => 0,
            kind => trailer_len(kind),
        }
    }

    /// [`flags::TRAILER`] when it takes any bytes.
    pub(crate) fn flag(&self) -> u8 {
        if self.kind() == 0 { 0 } else { flags::TRAILER }
    }

    /// Writes it (nothing for none).
    pub(crate) fn write(&self, out: &mut SpanWriter<'_>) {
        let kind = self.kind();
        if kind == 0 {
            return;
        }
        if let Some(original) = self.original {
            out.put(&original.to_le_bytes());
        }
        if kind & HAS_TERMS != 0 {
            for term in self.terms {
                out.put(&term.to_le_bytes());
            }
        }
        if kind & HAS_KEY != 0 {
            out.put(&self.supersede_key().to_le_bytes());
        }
        out.put(&[kind]);
    }

    /// The trailer of a stored record ([`NONE`](Self::NONE) without [`flags::TRAILER`]).
    pub(crate) fn of(header: &Header, record: &[u8]) -> Trailer {
        let mut trailer = Trailer::NONE;
        if !header.has(flags::TRAILER) {
            return trailer;
        }
        let Some(&kind) = record.last() else { return trailer };
        trailer.whole = kind & WHOLE != 0;
        let mut at = record.len().saturating_sub(trailer_len(kind));
        if kind & HAS_ORIGINAL != 0 {
            trailer.original = le_u32(record, at).map(|v| v as u32);
            at += 4;
        }
        if kind & HAS_TERMS != 0 {
            for term in trailer.terms.iter_mut() {
                *term = le_u16(record, at).unwrap_or(0) as u16;
                at += 2;
            }
        }
        #[cfg(feature = "compaction-cut")]
        if kind & HAS_KEY != 0 {
            trailer.key = le_u32(record, at).map_or(0, |v| v as u32);
        }
        trailer
    }
}

/// Bytes of a trailer of `kind`.
fn trailer_len(kind: u8) -> usize {
    KIND_LEN
        + if kind & HAS_ORIGINAL != 0 { 4 } else { 0 }
        + if kind & HAS_TERMS != 0 { 8 } else { 0 }
        + if cfg!(feature = "compaction-cut") && kind & HAS_KEY != 0 { 4 } else { 0 }
}

/// A record without its trailer.
pub(crate) fn body<'a>(header: &Header, record: &'a [u8]) -> &'a [u8] {
    let trailer = match record.last() {
        Some(&kind) if header.has(flags::TRAILER) => trailer_len(kind),
        _ => 0,
    };
    record.get(..record.len().saturating_sub(trailer)).unwrap_or(&[])
}

/// Token cost before reduction or compression (the header's count when not reduced).
pub(crate) fn original_tokens(header: &Header, record: &[u8]) -> u32 {
    Trailer::of(header, record).original.unwrap_or(header.tokens)
}

/// The content of a record.
pub(crate) fn content<'a>(header: &Header, record: &'a [u8]) -> &'a str {
    text(record.get(..header.content_len as usize).unwrap_or(&[]))
}

/// The bytes after the content (a tool result's call id).
pub(crate) fn tail_text<'a>(header: &Header, record: &'a [u8]) -> &'a str {
    text(body(header, record).get(header.content_len as usize..).unwrap_or(&[]))
}

/// Bytes a call table plus its strings take.
pub(crate) fn calls_len(calls: &[ToolCall<'_>]) -> usize {
    calls.iter().fold(calls.len() * CALL_ENTRY, |sum, call| {
        sum + call.id.len() + call.name.len() + call.arguments.len()
    })
}

/// Sequential writer into a span; writes past the end are dropped (callers size spans exactly).
pub(crate) struct SpanWriter<'a> {
    span: &'a mut [u8],
    at: usize,
}

impl<'a> SpanWriter<'a> {
    pub(crate) fn new(span: &'a mut [u8]) -> Self {
        Self { span, at: 0 }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        if let Some(target) = self.span.get_mut(self.at..end) {
            // Not `copy_from_slice`: the optimiser kept its length-mismatch panic here.
            target.iter_mut().zip(bytes).for_each(|(to, from)| *to = *from);
        }
        self.at = end;
    }

    /// Writes a tool-call table and its strings. Out of line: inlined into `store`, its six
    /// calls to `put` went through a register the firmware's static stack analysis could not
    /// follow, so every function pointer of the program counted under `store`.
    #[inline(never)]
    pub(crate) fn put_calls(&mut self, calls: &[ToolCall<'_>]) {
        for call in calls {
            self.put(&(call.id.len() as u16).to_le_bytes());
            self.put(&(call.name.len() as u16).to_le_bytes());
            self.put(&(call.arguments.len() as u32).to_le_bytes());
        }
        for call in calls {
            self.put(call.id.as_bytes());
            self.put(call.name.as_bytes());
            self.put(call.arguments.as_bytes());
        }
    }

    /// Writes `len` zero bytes.
    pub(crate) fn put_zeros(&mut self, len: usize) {
        let end = self.at + len;
        if let Some(target) = self.span.get_mut(self.at..end) {
            target.fill(0);
        }
        self.at = end;
    }

    /// Writes one summary source range.
    pub(crate) fn put_range(&mut self, first: u64, last: u64) {
        self.put(&first.to_le_bytes());
        self.put(&last.to_le_bytes());
    }
}

fn le_u16(bytes: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 2] = bytes.get(at..at + 2)?.try_into().ok()?;
    Some(u16::from_le_bytes(raw) as usize)
}

fn le_u32(bytes: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw) as usize)
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

/// Iterator over an assistant record's tool calls.
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities, ToolCall};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let calls = [ToolCall::new("a", "ls", "{}"), ToolCall::new("b", "pwd", "{}")];
/// manager.push(Message::assistant("").with_tool_calls(&calls))?;
/// let stored = manager.history().next_back().unwrap();
/// let names: Vec<&str> = stored.tool_calls().map(|c| c.name).collect();
/// assert_eq!(names, ["ls", "pwd"]);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ToolCalls<'a> {
    record: &'a [u8],
    table: usize,
    count: usize,
    next: usize,
    cursor: usize,
}

impl<'a> ToolCalls<'a> {
    pub(crate) fn new(header: &Header, record: &'a [u8]) -> Self {
        let count = if header.has(flags::SUMMARY) { 0 } else { header.items as usize };
        let table = header.content_len as usize;
        let record = body(header, record);
        Self { record, table, count, next: 0, cursor: table + count * CALL_ENTRY }
    }
}

impl ToolCalls<'_> {
    /// Where the id of call `index` lies in the record.
    pub(crate) fn id_span(self, index: usize) -> Option<core::ops::Range<usize>> {
        self.find_id(|at, _| at == index).map(|(_, span)| span)
    }

    /// Position of the call whose id is `id`, comparing bytes: no text is decoded, so the
    /// calls before it cost their table entries only.
    pub(crate) fn position_of(self, id: &str) -> Option<usize> {
        let record = self.record;
        self.find_id(|_, span| record.get(span) == Some(id.as_bytes())).map(|(at, _)| at)
    }

    /// The first call from here on (its position and where its id lies) that `wanted`
    /// accepts; `None` past the last call or at an entry that runs past the record.
    fn find_id(
        mut self,
        mut wanted: impl FnMut(usize, core::ops::Range<usize>) -> bool,
    ) -> Option<(usize, core::ops::Range<usize>)> {
        while self.next < self.count {
            let entry = self.table + self.next * CALL_ENTRY;
            let id_len = le_u16(self.record, entry)?;
            let name_len = le_u16(self.record, entry + 2)?;
            let args_len = le_u32(self.record, entry + 4)?;
            let end = self.cursor + id_len + name_len + args_len;
            if end > self.record.len() {
                return None;
            }
            let span = self.cursor..self.cursor + id_len;
            if wanted(self.next, span.clone()) {
                return Some((self.next, span));
            }
            self.cursor = end;
            self.next += 1;
        }
        None
    }
}

impl<'a> Iterator for ToolCalls<'a> {
    type Item = ToolCall<'a>;

    fn next(&mut self) -> Option<ToolCall<'a>> {
        if self.next >= self.count {
            return None;
        }
        let entry = self.table + self.next * CALL_ENTRY;
        let id_len = le_u16(self.record, entry)?;
        let name_len = le_u16(self.record, entry + 2)?;
        let args_len = le_u32(self.record, entry + 4)?;
        let mut take = |len: usize| {
            let piece = self.record.get(self.cursor..self.cursor + len).map(text);
            self.cursor += len;
            piece
        };
        let call = ToolCall::new(take(id_len)?, take(name_len)?, take(args_len)?);
        self.next += 1;
        Some(call)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for ToolCalls<'_> {}

/// Iterator over a summary's source id ranges, `(first, last)` inclusive.
///
/// ```
/// use ctxwin_core::{ContextManager, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.add_summary("the user prefers tabs", &[(3, 9)], 0)?;
/// let summary = manager.session().next().unwrap();
/// assert_eq!(summary.summary_sources().collect::<Vec<_>>(), [(3, 9)]);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SourceRanges<'a> {
    record: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> SourceRanges<'a> {
    pub(crate) fn new(header: &Header, record: &'a [u8]) -> Self {
        let left = if header.has(flags::SUMMARY) { header.items as usize } else { 0 };
        Self { record: body(header, record), at: header.content_len as usize, left }
    }
}

impl Iterator for SourceRanges<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        let range = (le_u64(self.record, self.at)?, le_u64(self.record, self.at + 8)?);
        self.at += RANGE_ENTRY;
        self.left -= 1;
        Some(range)
    }
}

/// Removes call `index` of the `count` calls of an assistant record in place (its table entry
/// and strings; everything after moves left). Returns the record's new length. No scratch
/// space: a device's stack is small.
fn remove_call(span: &mut [u8], content_len: usize, count: usize, index: usize) -> usize {
    let table_end = content_len + count * CALL_ENTRY;
    let lengths = |i: usize| {
        let entry = content_len + i * CALL_ENTRY;
        Some(le_u16(span, entry)? + le_u16(span, entry + 2)? + le_u32(span, entry + 4)?)
    };
    let strings_before: usize = (0..index).filter_map(lengths).sum();
    let total = span.len();
    let Some(len) = lengths(index) else { return total };
    let start = table_end + strings_before;
    let entry = content_len + index * CALL_ENTRY;
    crate::ring::move_left(span, entry + CALL_ENTRY, table_end - entry - CALL_ENTRY, entry);
    crate::ring::move_left(span, table_end, strings_before, table_end - CALL_ENTRY);
    let after = start + len;
    crate::ring::move_left(span, after, total.saturating_sub(after), start - CALL_ENTRY);
    total.saturating_sub(CALL_ENTRY + len)
}

/// Keeps call `i` of an assistant record's `count` calls when bit `i` of `keep` is set,
/// compacting in place. Returns the record's new length.
pub(crate) fn retain_calls(span: &mut [u8], content_len: usize, count: usize, keep: u64) -> usize {
    let mut len = span.len();
    let mut left = count;
    for index in (0..count).rev() {
        if keep & bit(index) == 0 {
            let record = span.get_mut(..len).unwrap_or_default();
            len = remove_call(record, content_len, left, index);
            left -= 1;
        }
    }
    len
}

/// What is wrong with a record's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Lengths in the header or call table point outside the record.
    Span,
    /// A text piece is not UTF-8.
    Text,
}

/// Checks that a record's bytes match what its header says (snapshot restore).
pub(crate) fn check(header: &Header, record: &[u8]) -> Result<(), Fault> {
    let text = |bytes: Option<&[u8]>| match bytes {
        None => Err(Fault::Span),
        Some(bytes) => core::str::from_utf8(bytes).map(|_| ()).map_err(|_| Fault::Text),
    };
    let content_len = header.content_len as usize;
    text(record.get(..content_len))?;
    let rest = record.len() - content_len;
    if header.has(flags::SUMMARY) {
        return if rest == header.items as usize * RANGE_ENTRY { Ok(()) } else { Err(Fault::Span) };
    }
    if header.role == crate::role::Role::Tool {
        if header.items != 0 || rest == 0 {
            return Err(Fault::Span);
        }
        return text(record.get(content_len..));
    }
    let count = header.items as usize;
    let mut cursor = content_len + count * CALL_ENTRY;
    for index in 0..count {
        let entry = content_len + index * CALL_ENTRY;
        let (Some(id), Some(name), Some(args)) =
            (le_u16(record, entry), le_u16(record, entry + 2), le_u32(record, entry + 4))
        else {
            return Err(Fault::Span);
        };
        if id == 0 {
            return Err(Fault::Span);
        }
        for len in [id, name, args] {
            text(record.get(cursor..cursor.saturating_add(len)))?;
            cursor += len;
        }
    }
    if cursor == record.len() { Ok(()) } else { Err(Fault::Span) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_of_matches_the_iterator() {
        let calls = [
            ToolCall::new("c1", "read", r#"{"path":"é"}"#),
            ToolCall::new("c22", "", "{}"),
            ToolCall::new("c3", "write", ""),
        ];
        let content = "calling";
        let mut record = vec![0u8; content.len() + calls_len(&calls)];
        let mut out = SpanWriter::new(&mut record);
        out.put(content.as_bytes());
        out.put_calls(&calls);
        let header =
            Header { content_len: content.len() as u32, items: calls.len() as u8, ..Header::EMPTY };
        for id in ["c1", "c22", "c3", "c2", "c", "", "c33"] {
            let expected = ToolCalls::new(&header, &record).position(|call| call.id == id);
            assert_eq!(ToolCalls::new(&header, &record).position_of(id), expected, "{id}");
        }
        let truncated = &record[..record.len() - 1];
        assert_eq!(ToolCalls::new(&header, truncated).position_of("c3"), None);
    }
}
