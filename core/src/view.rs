//! Read-only views of stored messages: one level's messages, and the merged history.

use crate::header::Header;
use crate::level::Level;
use crate::message::MessageRef;
use crate::ring::RingRef;

/// Live messages of one level, oldest first (double-ended).
///
/// ```
/// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::system("rule one"))?;
/// manager.push(Message::system("rule two"))?;
/// let rules: Vec<&str> = manager.messages(Level::Permanent).map(|m| m.content()).collect();
/// assert_eq!(rules, ["rule one", "rule two"]);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LevelMessages<'a> {
    ring: RingRef<'a>,
    level: Level,
    front: usize,
    back: usize,
}

impl<'a> LevelMessages<'a> {
    pub(crate) fn new(ring: RingRef<'a>, level: Level) -> Self {
        Self { ring, level, front: 0, back: ring.len() }
    }

    /// Messages at logical indices `start..end` only (a unit).
    pub(crate) fn range(ring: RingRef<'a>, level: Level, start: usize, end: usize) -> Self {
        Self { ring, level, front: start, back: end.min(ring.len()) }
    }

    fn message(&self, header: &'a Header) -> MessageRef<'a> {
        MessageRef::new(header, self.ring.record(header), self.level, self.ring.id_epoch())
    }
}

impl<'a> Iterator for LevelMessages<'a> {
    type Item = MessageRef<'a>;

    fn next(&mut self) -> Option<MessageRef<'a>> {
        while self.front < self.back {
            let header = self.ring.get(self.front)?;
            self.front += 1;
            if header.is_live() {
                return Some(self.message(header));
            }
        }
        None
    }
}

impl DoubleEndedIterator for LevelMessages<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        while self.front < self.back {
            self.back -= 1;
            let header = self.ring.get(self.back)?;
            if header.is_live() {
                return Some(self.message(header));
            }
        }
        None
    }
}

/// One level's messages with a peeked element at each end, so two can be merged from both ends.
#[derive(Clone, Copy, Debug)]
struct Stream<'a> {
    rest: LevelMessages<'a>,
    front: Option<MessageRef<'a>>,
    back: Option<MessageRef<'a>>,
}

impl<'a> Stream<'a> {
    fn new(ring: RingRef<'a>, level: Level) -> Self {
        Self { rest: LevelMessages::new(ring, level), front: None, back: None }
    }

    fn peek_front(&mut self) -> Option<MessageRef<'a>> {
        if self.front.is_none() {
            self.front = self.rest.next().or_else(|| self.back.take());
        }
        self.front
    }

    fn peek_back(&mut self) -> Option<MessageRef<'a>> {
        if self.back.is_none() {
            self.back = self.rest.next_back().or_else(|| self.front.take());
        }
        self.back
    }
}

/// The conversation history: live working and volatile messages merged by id, oldest first
/// (double-ended).
///
/// ```
/// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::user("first"))?;
/// manager.push(Message::assistant("verbose notes").in_level(Level::Volatile))?;
/// manager.push(Message::user("third"))?;
/// let order: Vec<&str> = manager.history().map(|m| m.content()).collect();
/// assert_eq!(order, ["first", "verbose notes", "third"]);
/// assert_eq!(manager.history().next_back().map(|m| m.content()), Some("third"));
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct History<'a> {
    working: Stream<'a>,
    volatile: Stream<'a>,
}

impl<'a> History<'a> {
    pub(crate) fn new(working: RingRef<'a>, volatile: RingRef<'a>) -> Self {
        Self {
            working: Stream::new(working, Level::Working),
            volatile: Stream::new(volatile, Level::Volatile),
        }
    }
}

impl<'a> Iterator for History<'a> {
    type Item = MessageRef<'a>;

    fn next(&mut self) -> Option<MessageRef<'a>> {
        let take_working = match (self.working.peek_front(), self.volatile.peek_front()) {
            (Some(w), Some(v)) => w.id() < v.id(),
            (w, _) => w.is_some(),
        };
        if take_working { self.working.front.take() } else { self.volatile.front.take() }
    }
}

impl DoubleEndedIterator for History<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let take_working = match (self.working.peek_back(), self.volatile.peek_back()) {
            (Some(w), Some(v)) => w.id() > v.id(),
            (w, _) => w.is_some(),
        };
        if take_working { self.working.back.take() } else { self.volatile.back.take() }
    }
}
