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

impl<'a> LevelMessages<'a> {
    /// The next live message from the front, not taken (evicted headers before it are
    /// skipped for good).
    fn peek_front(&mut self) -> Option<MessageRef<'a>> {
        while self.front < self.back {
            let header = self.ring.get(self.front)?;
            if header.is_live() {
                return Some(self.message(header));
            }
            self.front += 1;
        }
        None
    }

    /// The next live message from the back, not taken.
    fn peek_back(&mut self) -> Option<MessageRef<'a>> {
        while self.front < self.back {
            let header = self.ring.get(self.back - 1)?;
            if header.is_live() {
                return Some(self.message(header));
            }
            self.back -= 1;
        }
        None
    }
}

impl<'a> Iterator for LevelMessages<'a> {
    type Item = MessageRef<'a>;

    fn next(&mut self) -> Option<MessageRef<'a>> {
        let message = self.peek_front()?;
        self.front += 1;
        Some(message)
    }
}

impl DoubleEndedIterator for LevelMessages<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let message = self.peek_back()?;
        self.back -= 1;
        Some(message)
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
    // Merged by peeking at each level's next live message: no element cached in between.
    working: LevelMessages<'a>,
    volatile: LevelMessages<'a>,
}

impl<'a> History<'a> {
    pub(crate) fn new(working: RingRef<'a>, volatile: RingRef<'a>) -> Self {
        Self {
            working: LevelMessages::new(working, Level::Working),
            volatile: LevelMessages::new(volatile, Level::Volatile),
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
        if take_working { self.working.next() } else { self.volatile.next() }
    }
}

impl DoubleEndedIterator for History<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let take_working = match (self.working.peek_back(), self.volatile.peek_back()) {
            (Some(w), Some(v)) => w.id() > v.id(),
            (w, _) => w.is_some(),
        };
        if take_working { self.working.next_back() } else { self.volatile.next_back() }
    }
}

#[cfg(test)]
mod tests {
    use crate::capacity::TinyCapacities;
    use crate::level::Level;
    use crate::manager::ContextManager;
    use crate::message::Message;

    /// Walked from the front, the back or both ends at once, the history is the two levels'
    /// live messages merged by id, each once.
    #[test]
    fn history_merges_the_levels_from_both_ends() {
        let mut manager = ContextManager::<TinyCapacities>::new();
        for i in 0..60u32 {
            let level = if i % 3 == 0 { Level::Volatile } else { Level::Working };
            if manager.push(Message::user("a turn of some length").in_level(level)).is_err() {
                let _ = manager.drain_outbox(|_| {});
            }
            let mut expected: Vec<u64> = manager.messages(Level::Working).map(|m| m.id()).collect();
            expected.extend(manager.messages(Level::Volatile).map(|m| m.id()));
            expected.sort_unstable();
            let forward: Vec<u64> = manager.history().map(|m| m.id()).collect();
            assert_eq!(forward, expected, "push {i}");
            let mut backward: Vec<u64> = manager.history().rev().map(|m| m.id()).collect();
            backward.reverse();
            assert_eq!(backward, expected, "push {i}");
            let mut history = manager.history();
            let (mut front, mut back) = (Vec::new(), Vec::new());
            for step in 0.. {
                let next = if step % 2 == 0 { history.next() } else { history.next_back() };
                match (next, step % 2) {
                    (Some(m), 0) => front.push(m.id()),
                    (Some(m), _) => back.push(m.id()),
                    (None, _) => break,
                }
            }
            back.reverse();
            front.extend(back);
            assert_eq!(front, expected, "push {i}");
        }
        assert!(manager.stats().counters.units_evicted > 0);
    }
}
