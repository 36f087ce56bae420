//! Reading a request body that continues an earlier one: the envelope is walked value by
//! value (each value read by serde_json, so what is valid is exactly what serde_json says),
//! and once the first message is read, the earlier body of the same conversation — found by
//! the caller from the bytes so far — gives every following message whose bytes are the same
//! at the same place: those are neither scanned nor copied again. The first byte that differs
//! (the moving `cache_control` on the newest user block, an edited or dropped message) is
//! where reading goes on, value by value.
//!
//! A body this walk does not follow (a syntax error, `messages` not an array or given twice,
//! an empty object) is left to the whole read of [`Request::parse`](super::Request::parse),
//! which says what is wrong.

use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Provider;
use super::fingerprint::raw_hash;

/// Where a body's messages were: what the next body of the conversation is compared with,
/// byte for byte ([`Request::parse_after`](super::Request::parse_after)).
#[derive(Debug)]
pub(super) struct Layout {
    pub(super) provider: Provider,
    /// The body up to the end of the first message.
    pub(super) opening: Box<[u8]>,
    /// The bytes between one message and the next (a comma, and whitespace if any), one run
    /// per message after the first, end to end; `gap_ends[k - 1]` is where message `k`'s ends.
    pub(super) gaps: Vec<u8>,
    pub(super) gap_ends: Vec<usize>,
}

impl Layout {
    /// The bytes before message `k` (from 1).
    pub(super) fn gap(&self, k: usize) -> Option<&[u8]> {
        let end = *self.gap_ends.get(k.checked_sub(1)?)?;
        let start = match k {
            1 => 0,
            _ => *self.gap_ends.get(k - 2)?,
        };
        self.gaps.get(start..end)
    }

    pub(super) fn push_gap(&mut self, gap: &[u8]) {
        self.gaps.extend_from_slice(gap);
        self.gap_ends.push(self.gaps.len());
    }
}

/// What an earlier request lends to the next read: where its messages were, and its messages
/// (after Anthropic's `system`) with their raw hashes.
pub(super) trait Earlier {
    fn layout(&self) -> Option<&Layout>;
    fn messages(&self) -> (&[Arc<RawValue>], &[u64]);
}

/// An envelope read by [`scan`]: what [`Request`](super::Request) is built from.
pub(super) struct Scanned {
    pub(super) fields: IndexMap<String, Box<RawValue>>,
    pub(super) messages: Vec<Arc<RawValue>>,
    pub(super) hashes: Vec<u64>,
    pub(super) layout: Option<Layout>,
    pub(super) reused: usize,
}

/// A position in the body.
struct Cursor<'b> {
    body: &'b [u8],
    pos: usize,
}

impl<'b> Cursor<'b> {
    /// Skips JSON whitespace (what serde_json skips).
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.body.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The byte after whitespace.
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.body.get(self.pos).copied()
    }

    /// Steps over `byte` after whitespace.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// The JSON value after whitespace, raw, borrowed from the body (serde_json reads it).
    fn value(&mut self) -> Option<&'b RawValue> {
        self.skip_ws();
        let rest = self.body.get(self.pos..)?;
        let mut reader = serde_json::Deserializer::from_slice(rest);
        let raw = <&'b RawValue>::deserialize(&mut reader).ok()?;
        let start = (raw.get().as_ptr() as usize).checked_sub(self.body.as_ptr() as usize)?;
        self.pos = start.checked_add(raw.get().len())?;
        Some(raw)
    }

    /// An object key after whitespace.
    fn key(&mut self) -> Option<String> {
        if self.peek()? != b'"' {
            return None;
        }
        serde_json::from_str(self.value()?.get()).ok()
    }
}

/// Reads `body` as a request envelope, taking from `previous(opening)` — the request the
/// caller holds for the bytes up to the end of the first message, if any — every following
/// message sent again with the same bytes. `None` when the walk does not follow the body
/// (then the whole read decides).
pub(super) fn scan<E: Earlier>(
    provider: Provider,
    body: &[u8],
    previous: impl FnOnce(&[u8]) -> Option<E>,
) -> Option<Scanned> {
    let mut cursor = Cursor { body, pos: 0 };
    cursor.eat(b'{')?;
    let mut fields = IndexMap::new();
    let mut list = None;
    let mut previous = Some(previous);
    loop {
        let key = cursor.key()?;
        cursor.eat(b':')?;
        if key == "messages" {
            // Given twice, the whole read keeps the second: not followed here.
            if list.is_some() || cursor.peek()? != b'[' {
                return None;
            }
            cursor.pos += 1;
            let earlier = previous.take()?;
            list = Some(messages(provider, &mut cursor, earlier)?);
            let empty = RawValue::from_string("[]".into()).ok()?;
            fields.insert(key, empty);
        } else {
            let value = cursor.value()?;
            fields.insert(key, value.to_owned());
        }
        match cursor.peek()? {
            b',' => cursor.pos += 1,
            b'}' => {
                cursor.pos += 1;
                break;
            }
            _ => return None,
        }
    }
    cursor.skip_ws();
    if cursor.pos != body.len() {
        return None;
    }
    let (messages, hashes, layout, reused) = list?;
    Some(Scanned { fields, messages, hashes, layout, reused })
}

type List = (Vec<Arc<RawValue>>, Vec<u64>, Option<Layout>, usize);

/// The items of `messages`, the cursor just after its `[`.
fn messages<E: Earlier>(
    provider: Provider,
    cursor: &mut Cursor<'_>,
    previous: impl FnOnce(&[u8]) -> Option<E>,
) -> Option<List> {
    if cursor.peek()? == b']' {
        cursor.pos += 1;
        return Some((Vec::new(), Vec::new(), None, 0));
    }
    let first = cursor.value()?;
    let opening = cursor.body.get(..cursor.pos)?;
    let mut items = vec![Arc::<RawValue>::from(first.to_owned())];
    let mut hashes = vec![raw_hash(first.get().as_bytes())];
    let mut layout =
        Layout { provider, opening: opening.into(), gaps: Vec::new(), gap_ends: Vec::new() };
    let mut reused = 0;
    if let Some(earlier) = previous(opening) {
        reused = take_same(cursor, &earlier, &mut layout, &mut items, &mut hashes);
    }
    loop {
        let gap_start = cursor.pos;
        match cursor.peek()? {
            b',' => {
                cursor.pos += 1;
                cursor.skip_ws();
                let gap = cursor.body.get(gap_start..cursor.pos)?;
                let item = cursor.value()?;
                layout.push_gap(gap);
                hashes.push(raw_hash(item.get().as_bytes()));
                items.push(Arc::from(item.to_owned()));
            }
            b']' => {
                cursor.pos += 1;
                return Some((items, hashes, Some(layout), reused));
            }
            _ => return None,
        }
    }
}

/// Takes from `earlier` the messages after the first that the body repeats byte for byte,
/// with the bytes between them, from the cursor on (the end of the first message, whose
/// opening `layout` holds); the cursor ends after the last one taken. Returns how many.
fn take_same(
    cursor: &mut Cursor<'_>,
    earlier: &impl Earlier,
    layout: &mut Layout,
    items: &mut Vec<Arc<RawValue>>,
    hashes: &mut Vec<u64>,
) -> usize {
    let Some(before) = earlier.layout() else { return 0 };
    if before.provider != layout.provider || before.opening != layout.opening {
        return 0;
    }
    let (messages, message_hashes) = earlier.messages();
    let mut taken = 0;
    for (k, (item, &hash)) in messages.iter().zip(message_hashes).enumerate().skip(1) {
        let Some(gap) = before.gap(k) else { break };
        let text = item.get().as_bytes();
        let item_start = cursor.pos + gap.len();
        let end = item_start + text.len();
        let same = cursor.body.get(cursor.pos..item_start) == Some(gap)
            && cursor.body.get(item_start..end) == Some(text);
        if !same {
            break;
        }
        layout.push_gap(gap);
        items.push(item.clone());
        hashes.push(hash);
        cursor.pos = end;
        taken += 1;
    }
    taken
}
