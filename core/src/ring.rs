//! Fixed-capacity message rings: a header ring plus a byte arena of contiguous spans.
//!
//! Every level is a [`Ring`]: `N` message headers and `B` bytes of text. A message's record
//! is one contiguous span of the arena, so its text is one `&str`. Spans are handed out in ring
//! order at the arena's end, wrapping to the start when the end is too short; releasing the
//! oldest message frees its span in O(1). Shrinking a record or removing one from the middle
//! leaves a hole that packing closes in O(`B` + `N`) when an allocation needs it.
//!
//! The generic [`Ring`] only owns the storage; all logic runs on the non-generic views
//! [`RingRef`] and [`RingMut`], so firmware pays for the code once, not once per capacity.

use crate::header::Header;

/// Where a ring's live data starts and how much of it there is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RingState {
    /// Physical index of the oldest header.
    pub head: u32,
    /// Headers in use.
    pub len: u32,
    /// Sum of the spans' lengths.
    pub bytes: u32,
}

/// Storage for one level: `N` message headers and `B` bytes of message text.
///
/// It is only ever used as a [`Capacities`](crate::capacity::Capacities) associated type, e.g.
/// `type Working = Ring<256, 65_536>;`. `size_of::<Ring<N, B>>()` is `32·N + B` plus
/// 16 bytes (a header is 32 bytes; `B` rounds up to a multiple of 8).
///
/// ```
/// use ctxwin_core::{ring::Ring, ring::RingStorage};
/// assert_eq!(<Ring<8, 1024> as RingStorage>::MESSAGES, 8);
/// assert_eq!(<Ring<8, 1024> as RingStorage>::BYTES, 1024);
/// ```
#[derive(Clone, Debug)]
pub struct Ring<const N: usize, const B: usize> {
    headers: [Header; N],
    bytes: [u8; B],
    state: RingState,
}

impl<const N: usize, const B: usize> Ring<N, B> {
    const CHECKED: () = {
        assert!(N > 0 && N <= u32::MAX as usize, "a ring needs 1..=u32::MAX headers");
        assert!(B > 0 && B <= u32::MAX as usize, "a ring needs 1..=u32::MAX bytes");
    };

    /// An empty ring.
    ///
    /// ```
    /// use ctxwin_core::ring::Ring;
    /// static LEVEL: Ring<4, 256> = Ring::new();
    /// # let _ = &LEVEL;
    /// ```
    #[allow(clippy::let_unit_value)]
    pub const fn new() -> Self {
        let () = Self::CHECKED;
        Self {
            headers: [Header::EMPTY; N],
            bytes: [0; B],
            state: RingState { head: 0, len: 0, bytes: 0 },
        }
    }
}

impl<const N: usize, const B: usize> Default for Ring<N, B> {
    fn default() -> Self {
        Self::new()
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A level's storage, implemented by [`Ring`] only (sealed).
///
/// ```
/// use ctxwin_core::{ring::Ring, ring::RingStorage};
/// const EMPTY: Ring<4, 64> = <Ring<4, 64> as RingStorage>::EMPTY;
/// # let _ = EMPTY;
/// ```
pub trait RingStorage: sealed::Sealed {
    /// An empty ring, usable in `const` context.
    const EMPTY: Self;
    /// Header capacity: how many messages the level holds at most.
    const MESSAGES: usize;
    /// Arena capacity: how many bytes of text the level holds at most.
    const BYTES: usize;
    #[doc(hidden)]
    fn view(&self) -> RingRef<'_>;
    #[doc(hidden)]
    fn view_mut(&mut self) -> RingMut<'_>;
}

impl<const N: usize, const B: usize> sealed::Sealed for Ring<N, B> {}

impl<const N: usize, const B: usize> RingStorage for Ring<N, B> {
    const EMPTY: Self = Self::new();
    const MESSAGES: usize = N;
    const BYTES: usize = B;

    fn view(&self) -> RingRef<'_> {
        RingRef { headers: &self.headers, arena: &self.bytes, state: self.state, id_epoch: 0 }
    }

    fn view_mut(&mut self) -> RingMut<'_> {
        RingMut { headers: &mut self.headers, arena: &mut self.bytes, state: &mut self.state }
    }
}

/// Read-only view of a ring.
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub struct RingRef<'a> {
    headers: &'a [Header],
    arena: &'a [u8],
    state: RingState,
    /// What [`Header::id`] offsets are counted from (the manager's `State::id_epoch`).
    id_epoch: u32,
}

/// Mutable view of a ring.
#[derive(Debug)]
#[doc(hidden)]
pub struct RingMut<'a> {
    headers: &'a mut [Header],
    arena: &'a mut [u8],
    state: &'a mut RingState,
}

fn physical(state: RingState, capacity: usize, index: usize) -> Option<usize> {
    if index >= state.len as usize || capacity == 0 {
        return None;
    }
    Some((state.head as usize + index) % capacity)
}

impl<'a> RingRef<'a> {
    /// The same view, with header ids counted from the base of `id_epoch`.
    pub(crate) fn with_id_epoch(self, id_epoch: u32) -> Self {
        Self { id_epoch, ..self }
    }

    /// The ids' epoch (for message views).
    pub(crate) fn id_epoch(&self) -> u32 {
        self.id_epoch
    }

    /// The manager-wide id of `header`.
    pub(crate) fn id(&self, header: &Header) -> u64 {
        crate::header::full_id(self.id_epoch, header.id)
    }

    /// Headers stored (live and evicted).
    pub(crate) fn len(&self) -> usize {
        self.state.len as usize
    }

    pub(crate) fn capacity(&self) -> usize {
        self.headers.len()
    }

    pub(crate) fn arena_capacity(&self) -> usize {
        self.arena.len()
    }

    /// Bytes held by records (holes excluded).
    pub(crate) fn bytes_used(&self) -> usize {
        self.state.bytes as usize
    }

    /// Header at logical `index` (0 = oldest).
    pub(crate) fn get(&self, index: usize) -> Option<&'a Header> {
        physical(self.state, self.headers.len(), index).and_then(|i| self.headers.get(i))
    }

    pub(crate) fn first(&self) -> Option<&'a Header> {
        self.get(0)
    }

    pub(crate) fn last(&self) -> Option<&'a Header> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Headers oldest to newest.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Header> + 'a {
        let this = *self;
        (0..self.len()).filter_map(move |i| this.get(i))
    }

    /// The record bytes of `header` (empty if the header does not describe a valid span).
    pub(crate) fn record(&self, header: &Header) -> &'a [u8] {
        self.arena.get(header.start as usize..header.end() as usize).unwrap_or(&[])
    }

    /// Whether a record of `len` bytes fits after packing, with a free header slot.
    pub(crate) fn can_fit(&self, len: usize) -> bool {
        self.len() < self.capacity()
            && self.bytes_used().saturating_add(len) <= self.arena_capacity()
    }

    /// Where a record of `len` bytes would go without packing.
    fn fast_slot(&self, len: usize) -> Option<usize> {
        let capacity = self.arena.len();
        let (Some(first), Some(last)) = (self.first(), self.last()) else {
            return (len <= capacity).then_some(0);
        };
        let (first, start_of_last, end) =
            (first.start as usize, last.start as usize, last.end() as usize);
        let wrapped = start_of_last < first;
        if wrapped {
            // `end < first`: a record starting at `first` (an empty one) would hide the wrap.
            return (end < first && end.saturating_add(len) <= first).then_some(end);
        }
        if end.saturating_add(len) <= capacity {
            Some(end)
        } else if len <= first {
            Some(0)
        } else {
            None
        }
    }
}

impl<'a> RingMut<'a> {
    /// A read-only view of the same ring.
    #[inline(never)]
    pub(crate) fn as_ref(&self) -> RingRef<'_> {
        RingRef { headers: self.headers, arena: self.arena, state: *self.state, id_epoch: 0 }
    }

    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut Header> {
        physical(*self.state, self.headers.len(), index).and_then(|i| self.headers.get_mut(i))
    }

    /// The record bytes of the header at `index`, mutable.
    pub(crate) fn record_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let header = *self.as_ref().get(index)?;
        self.arena.get_mut(header.start as usize..header.end() as usize)
    }

    /// Copies `len` bytes at offset `from.1` of record `from.0` to offset `to.1` of record
    /// `to.0`, two different records (so the ranges never overlap). `None` (nothing copied)
    /// when a range is outside its record.
    pub(crate) fn copy_between(
        &mut self,
        from: (usize, usize),
        to: (usize, usize),
        len: usize,
    ) -> Option<()> {
        let view = self.as_ref();
        let (source, target) = (view.get(from.0)?, view.get(to.0)?);
        let at = |header: &Header, offset: usize| {
            let start = (header.start as usize).checked_add(offset)?;
            (start.checked_add(len)? <= header.end() as usize).then_some(start)
        };
        let (source, target) = (at(source, from.1)?, at(target, to.1)?);
        if from.0 == to.0 {
            return None;
        }
        for i in 0..len {
            let byte = *self.arena.get(source + i)?;
            *self.arena.get_mut(target + i)? = byte;
        }
        Some(())
    }

    /// Appends a record of `len` bytes described by `header` (its `start` and `len` are set
    /// here) and lets `fill` write the bytes. Returns the new logical index, or `None` (and
    /// changes nothing) when the ring has no header slot or too few bytes even after packing.
    pub(crate) fn push_back(
        &mut self,
        mut header: Header,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<usize> {
        if !self.as_ref().can_fit(len) {
            return None;
        }
        let start = match self.as_ref().fast_slot(len) {
            Some(start) => start,
            None => {
                self.pack();
                self.as_ref().fast_slot(len)?
            }
        };
        let end = start.checked_add(len)?;
        let span = self.arena.get_mut(start..end)?;
        fill(span);
        header.start = u32::try_from(start).ok()?;
        header.len = u32::try_from(len).ok()?;
        let index = self.len();
        let slot = (self.state.head as usize + index).checked_rem(self.headers.len())?;
        *self.headers.get_mut(slot)? = header;
        self.state.len += 1;
        self.state.bytes = self.state.bytes.saturating_add(header.len);
        Some(index)
    }

    fn len(&self) -> usize {
        self.state.len as usize
    }

    /// Removes and returns the newest header; its span is free again.
    pub(crate) fn pop_back(&mut self) -> Option<Header> {
        let header = *self.as_ref().last()?;
        self.state.len -= 1;
        self.release(&header);
        Some(header)
    }

    /// Shortens the record at `index` to `new_len` bytes (its first `new_len` bytes stay).
    pub(crate) fn truncate_record(&mut self, index: usize, new_len: u32) -> Option<()> {
        let header = self.get_mut(index)?;
        let freed = header.len.checked_sub(new_len)?;
        header.len = new_len;
        self.state.bytes = self.state.bytes.saturating_sub(freed);
        Some(())
    }

    fn release(&mut self, header: &Header) {
        self.state.bytes = self.state.bytes.saturating_sub(header.len);
        if self.state.len == 0 {
            *self.state = RingState::default();
        }
    }

    /// Releases the oldest headers while `drop` accepts them; the others stay where they are.
    /// O(headers released).
    pub(crate) fn pop_front_while(&mut self, mut drop: impl FnMut(&Header) -> bool) {
        while let Some(header) = self.as_ref().first().copied() {
            if !drop(&header) {
                break;
            }
            let capacity = self.headers.len() as u32;
            self.state.head = if self.state.head + 1 >= capacity { 0 } else { self.state.head + 1 };
            self.state.len -= 1;
            self.release(&header);
        }
    }

    /// Releases the evicted headers at the front. Out of line: one copy for every caller.
    #[inline(never)]
    pub(crate) fn pop_front_evicted(&mut self) {
        self.pop_front_while(|h| !h.is_live());
    }

    /// Keeps the headers `keep` accepts, in order, releasing the others' spans. O(`N`).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Header) -> bool) {
        let mut kept = 0usize;
        for index in 0..self.len() {
            let Some(header) = self.as_ref().get(index).copied() else { break };
            if keep(&header) {
                if kept != index {
                    self.move_header(index, kept);
                }
                kept += 1;
            } else {
                self.state.bytes = self.state.bytes.saturating_sub(header.len);
            }
        }
        self.state.len = kept as u32;
        if kept == 0 {
            *self.state = RingState::default();
        }
    }

    /// Moves the header at logical `from` to logical `to` (two different slots; what `from`
    /// holds afterwards is unspecified: the caller no longer uses it). A swap of two disjoint
    /// borrows, which compiles to word copies, where a plain assignment between slots of one
    /// array becomes a call to `memmove` (1.5 KiB of flash).
    fn move_header(&mut self, from: usize, to: usize) {
        let capacity = self.headers.len();
        let (Some(from), Some(to)) =
            (physical(*self.state, capacity, from), physical(*self.state, capacity, to))
        else {
            return;
        };
        let (low, high) = if from < to { (from, to) } else { (to, from) };
        let Some((below, above)) = self.headers.split_at_mut_checked(high) else { return };
        let (Some(low), Some(high)) = (below.get_mut(low), above.first_mut()) else { return };
        core::mem::swap(low, high);
    }

    /// Replaces the record at `index` with one of `len` bytes written by `fill`, keeping its
    /// place in the ring. Returns `None` (changing nothing) when the arena cannot hold it.
    /// O(`B` + `N`): packs, then shifts the newer records.
    pub(crate) fn replace(
        &mut self,
        index: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<()> {
        let old = *self.as_ref().get(index)?;
        let used = self.state.bytes as usize;
        if used - old.len as usize + len > self.arena.len() {
            return None;
        }
        self.pack();
        let old = *self.as_ref().get(index)?;
        let (start, old_end) = (old.start as usize, old.end() as usize);
        let tail = used - old_end;
        let new_end = start + len;
        if new_end < old_end {
            move_left(self.arena, old_end, tail, new_end);
        } else if new_end > old_end {
            move_right(self.arena, old_end, tail, new_end);
        }
        for later in index + 1..self.len() {
            if let Some(header) = self.get_mut(later) {
                header.start = (header.start as usize + new_end - old_end) as u32;
            }
        }
        fill(self.arena.get_mut(start..new_end)?);
        let header = self.get_mut(index)?;
        header.len = len as u32;
        self.state.bytes = (used - old.len as usize + len) as u32;
        Some(())
    }

    /// Moves all records to the start of the arena, oldest first, with no holes. O(`B` + `N`).
    pub(crate) fn pack(&mut self) {
        let Some(first) = self.as_ref().first().map(|h| h.start as usize) else {
            return;
        };
        let capacity = self.arena.len();
        if capacity == 0 {
            return;
        }
        rotate_left(self.arena, first % capacity);
        let mut cursor = 0usize;
        for index in 0..self.len() {
            let Some(header) = self.get_mut(index) else { return };
            let len = header.len as usize;
            let rotated = (header.start as usize + capacity - first) % capacity;
            let from = if len == 0 { cursor } else { rotated };
            header.start = cursor as u32;
            if from != cursor {
                move_left(self.arena, from, len, cursor);
            }
            cursor += len;
        }
    }
}

/// `bytes.rotate_left(mid)` by three reversals: no `memmove` (which `rotate_left` calls and
/// which costs 1.5 KiB of flash), no panic path, O(`len`) swaps.
pub(crate) fn rotate_left(bytes: &mut [u8], mid: usize) {
    let Some((head, tail)) = bytes.split_at_mut_checked(mid) else { return };
    if head.is_empty() || tail.is_empty() {
        return;
    }
    reverse(head);
    reverse(tail);
    reverse(bytes);
}

/// `bytes.reverse()` without its panic path: out of line, the library's reversal keeps a
/// bounds check (and its formatting code) the optimiser cannot remove.
fn reverse(bytes: &mut [u8]) {
    let mut rest = bytes;
    while let Some((first, tail)) = rest.split_first_mut() {
        let Some((last, middle)) = tail.split_last_mut() else { break };
        core::mem::swap(first, last);
        rest = middle;
    }
}

/// `bytes.copy_within(from..from + len, to)` for a move towards the start (`to <= from`),
/// in chunks that never overlap, without `copy_within`'s panic paths (which the optimiser
/// keeps). A move out of range or to the right does nothing.
pub(crate) fn move_left(bytes: &mut [u8], from: usize, len: usize, to: usize) {
    let Some(step) = from.checked_sub(to).filter(|&step| step > 0) else { return };
    if from.checked_add(len).is_none_or(|end| end > bytes.len()) {
        return;
    }
    let mut done = 0;
    while done < len {
        let n = step.min(len - done);
        let Some((head, tail)) = bytes.split_at_mut_checked(from + done) else { return };
        let target = head.get_mut(to + done..).and_then(|t| t.get_mut(..n));
        let (Some(target), Some(source)) = (target, tail.get(..n)) else { return };
        target.copy_from_slice(source);
        done += n;
    }
}

/// `bytes.copy_within(from..from + len, to)` for a move towards the end (`to >= from`), in
/// chunks that never overlap, copying the last chunk first. A move out of range or to the
/// left does nothing.
pub(crate) fn move_right(bytes: &mut [u8], from: usize, len: usize, to: usize) {
    let Some(step) = to.checked_sub(from).filter(|&step| step > 0) else { return };
    if to.checked_add(len).is_none_or(|end| end > bytes.len()) {
        return;
    }
    let mut left = len;
    while left > 0 {
        let n = step.min(left);
        let start = from + left - n;
        let Some((head, tail)) = bytes.split_at_mut_checked(start + n) else { return };
        let source = head.get(start..);
        let target = tail.get_mut(to + left - n - (start + n)..).and_then(|t| t.get_mut(..n));
        let (Some(source), Some(target)) = (source, target) else { return };
        target.copy_from_slice(source);
        left -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn header(id: u32) -> Header {
        Header { id, ..Header::EMPTY }
    }

    fn push(ring: &mut RingMut<'_>, id: u32, len: usize) -> Option<usize> {
        ring.push_back(header(id), len, |span| span.fill(id as u8))
    }

    fn check(ring: &RingRef<'_>, model: &VecDeque<(u32, usize)>) {
        assert_eq!(ring.len(), model.len());
        let mut spans = Vec::new();
        for (header, &(id, len)) in ring.iter().zip(model) {
            assert_eq!((header.id, header.len as usize), (id, len));
            let record = ring.record(header);
            assert_eq!(record.len(), len, "span out of the arena");
            assert!(record.iter().all(|&b| b == id as u8), "record {id} overwritten");
            spans.push(header.start as usize..header.end() as usize);
        }
        spans.sort_by_key(|s| s.start);
        for pair in spans.windows(2) {
            assert!(pair[0].end <= pair[1].start || pair[0].is_empty() || pair[1].is_empty());
        }
        assert_eq!(ring.bytes_used(), model.iter().map(|m| m.1).sum::<usize>());
    }

    #[test]
    fn wraps_and_reuses_freed_space() {
        let mut ring = Ring::<4, 16>::new();
        let mut view = ring.view_mut();
        assert_eq!(push(&mut view, 1, 6), Some(0));
        assert_eq!(push(&mut view, 2, 6), Some(1));
        assert_eq!(push(&mut view, 3, 6), None, "only 4 bytes left");
        view.retain(|h| h.id != 1);
        assert_eq!(push(&mut view, 3, 6), Some(1), "wraps to the arena start");
        assert_eq!(view.as_ref().get(1).map(|h| h.start), Some(0));
        check(&view.as_ref(), &VecDeque::from([(2, 6), (3, 6)]));
    }

    #[test]
    fn packs_holes_when_the_fast_path_fails() {
        let mut ring = Ring::<8, 16>::new();
        let mut view = ring.view_mut();
        for id in 1..=4 {
            push(&mut view, id, 4);
        }
        view.retain(|h| h.id == 1 || h.id == 4);
        assert_eq!(push(&mut view, 9, 8), Some(2), "needs the two holes packed together");
        check(&view.as_ref(), &VecDeque::from([(1, 4), (4, 4), (9, 8)]));
    }

    /// Regression (proptest, "record 41 overwritten"): an empty record appended where the
    /// wrapped tail meets the oldest record started at the oldest record's start, so the ring
    /// no longer looked wrapped and the next record was written over the oldest one.
    #[test]
    fn an_empty_record_closing_the_wrapped_gap_keeps_the_wrap() {
        let mut ring = Ring::<8, 16>::new();
        let mut view = ring.view_mut();
        push(&mut view, 1, 6);
        push(&mut view, 2, 6);
        view.retain(|h| h.id != 1);
        assert_eq!(push(&mut view, 3, 6), Some(1));
        assert_eq!(view.as_ref().get(1).map(|h| h.start), Some(0), "wrapped");
        assert_eq!(push(&mut view, 4, 0), Some(2), "closes the gap before record 2");
        assert_eq!(push(&mut view, 5, 4), Some(3));
        check(&view.as_ref(), &VecDeque::from([(2, 6), (3, 6), (4, 0), (5, 4)]));
    }

    #[test]
    fn refuses_without_changing_anything() {
        let mut ring = Ring::<2, 8>::new();
        let mut view = ring.view_mut();
        push(&mut view, 1, 3);
        push(&mut view, 2, 3);
        let before = *view.state;
        assert_eq!(push(&mut view, 3, 1), None, "no header slot");
        assert_eq!(*view.state, before);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(usize),
        PopBack,
        Retain(u64),
        Truncate(usize, usize),
        Pack,
        RetainOdd,
        Replace(usize, usize),
        PopFrontBelow(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..40).prop_map(Op::Push),
            1 => Just(Op::PopBack),
            2 => any::<u64>().prop_map(Op::Retain),
            1 => (any::<usize>(), 0usize..40).prop_map(|(i, l)| Op::Truncate(i, l)),
            1 => Just(Op::Pack),
            1 => Just(Op::RetainOdd),
            2 => (any::<usize>(), 0usize..60).prop_map(|(i, l)| Op::Replace(i, l)),
            1 => (0u32..200).prop_map(Op::PopFrontBelow),
        ]
    }

    proptest! {
        #[test]
        fn rotate_left_matches_the_slice_method(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            mid in 0usize..70,
        ) {
            let mut rotated = bytes.clone();
            rotate_left(&mut rotated, mid);
            let mut expected = bytes.clone();
            if mid <= bytes.len() {
                expected.rotate_left(mid);
            }
            prop_assert_eq!(rotated, expected);
        }

        #[test]
        fn move_right_matches_copy_within(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            from in 0usize..64,
            len in 0usize..64,
            shift in 0usize..64,
        ) {
            let to = from + shift;
            if to + len <= bytes.len() {
                let mut expected = bytes.clone();
                expected.copy_within(from..from + len, to);
                let mut moved = bytes.clone();
                move_right(&mut moved, from, len, to);
                prop_assert_eq!(moved, expected);
            }
        }

        #[test]
        fn move_left_matches_copy_within(
            bytes in proptest::collection::vec(any::<u8>(), 1..64),
            from in 0usize..64,
            len in 0usize..64,
            to in 0usize..64,
        ) {
            let mut moved = bytes.clone();
            move_left(&mut moved, from, len, to);
            let mut expected = bytes.clone();
            if to < from && from + len <= bytes.len() {
                expected.copy_within(from..from + len, to);
            }
            prop_assert_eq!(moved, expected);
        }

        /// The ring behaves like a `VecDeque` of (id, len) and never corrupts a record.
        #[test]
        fn behaves_like_a_vecdeque(ops in proptest::collection::vec(op(), 1..200)) {
            let mut ring = Ring::<8, 96>::new();
            let mut view = ring.view_mut();
            let mut model: VecDeque<(u32, usize)> = VecDeque::new();
            let mut next_id = 1u32;
            for op in ops {
                match op {
                    Op::Push(len) => {
                        let fits = model.len() < 8 && model.iter().map(|m| m.1).sum::<usize>() + len <= 96;
                        let pushed = push(&mut view, next_id, len);
                        prop_assert_eq!(pushed.is_some(), fits);
                        if fits {
                            model.push_back((next_id, len));
                        }
                        next_id += 1;
                    }
                    Op::PopBack => prop_assert_eq!(view.pop_back().map(|h| h.id), model.pop_back().map(|m| m.0)),
                    Op::Retain(mask) => {
                        // Drops the records whose id bit is set in `mask`: front, middle or back.
                        let keep = |id: u32| mask & (1 << (id % 64)) == 0;
                        view.retain(|h| keep(h.id));
                        model.retain(|m| keep(m.0));
                    }
                    Op::Truncate(i, len) => {
                        if !model.is_empty() {
                            let i = i % model.len();
                            let shorter = len.min(model[i].1);
                            view.truncate_record(i, shorter as u32);
                            model[i].1 = shorter;
                        }
                    }
                    Op::Pack => view.pack(),
                    Op::PopFrontBelow(id) => {
                        view.pop_front_while(|h| h.id < id);
                        while model.front().is_some_and(|m| m.0 < id) {
                            model.pop_front();
                        }
                    }
                    Op::RetainOdd => {
                        view.retain(|h| h.id % 2 == 1);
                        model.retain(|m| m.0 % 2 == 1);
                    }
                    Op::Replace(i, len) => {
                        if !model.is_empty() {
                            let i = i % model.len();
                            let id = model[i].0;
                            let fits = model.iter().map(|m| m.1).sum::<usize>() - model[i].1 + len <= 96;
                            let done = view.replace(i, len, |span| span.fill(id as u8));
                            prop_assert_eq!(done.is_some(), fits);
                            if fits {
                                model[i].1 = len;
                            }
                        }
                    }
                }
                check(&view.as_ref(), &model);
            }
        }
    }

    /// The size formula in [`Ring`]'s docs.
    #[test]
    fn the_documented_size_formula_holds() {
        assert_eq!(core::mem::size_of::<Ring<4, 64>>(), 32 * 4 + 64 + 16);
        assert_eq!(core::mem::size_of::<Ring<256, 65_536>>(), 32 * 256 + 65_536 + 16);
        assert_eq!(core::mem::size_of::<Ring<1, 8>>(), 32 + 8 + 16);
    }
}
