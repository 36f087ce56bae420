//! The eviction outbox: evicted units wait, in place, until the caller has seen them.

use super::ContextManager;
use super::evict::{UnitSpan, unit_end};
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::level::Level;
use crate::message::MessageRef;
use crate::ring::RingRef;
use crate::stats::bump;
use crate::strategy::Strategy;

/// A unit evicted from the context: one message, or an assistant message with all its tool
/// results.
///
/// ```
/// use ctxwin_core::{Config, ContextManager, Message, TinyCapacities};
/// let config = Config { locked_tail: 1, max_messages: 2, ..Config::DEFAULT };
/// let mut manager = ContextManager::<TinyCapacities>::with_config(config)?;
/// for text in ["one", "two", "three"] {
///     manager.push(Message::assistant(text))?;
/// }
/// let unit = manager.outbox().next().unwrap();
/// assert_eq!(unit.messages().next().unwrap().content(), "one");
/// assert_eq!(unit.len(), 1);
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct EvictedUnit<'a> {
    level: Level,
    ring: RingRef<'a>,
    span: UnitSpan,
}

impl<'a> EvictedUnit<'a> {
    /// Level it was evicted from.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Its messages, in order.
    pub fn messages(&self) -> impl Iterator<Item = MessageRef<'a>> + use<'a> {
        let (ring, level) = (self.ring, self.level);
        (self.span.start..self.span.end)
            .filter_map(move |i| ring.get(i))
            .map(move |h| MessageRef::new(h, ring.record(h), level, ring.id_epoch()))
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.span.end - self.span.start
    }

    /// Whether it has no messages (never true for a unit the manager hands out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Id of its first message.
    pub fn first_id(&self) -> u64 {
        self.ring.get(self.span.start).map_or(0, |h| self.ring.id(h))
    }

    /// Tokens it cost in the context.
    pub fn tokens(&self) -> u32 {
        self.messages().map(|m| m.tokens()).sum()
    }
}

/// One level's evicted units, with the next one peeked.
#[derive(Clone, Copy, Debug)]
struct Cursor<'a> {
    level: Level,
    ring: RingRef<'a>,
    at: usize,
    peeked: Option<UnitSpan>,
}

impl<'a> Cursor<'a> {
    fn peek(&mut self) -> Option<EvictedUnit<'a>> {
        while self.peeked.is_none() && self.at < self.ring.len() {
            let start = self.at;
            let end = unit_end(&self.ring, start);
            self.at = end;
            if self.ring.get(start).is_some_and(|h| !h.is_live()) {
                self.peeked = Some(UnitSpan { start, end });
            }
        }
        self.peeked.map(|span| EvictedUnit { level: self.level, ring: self.ring, span })
    }
}

/// Evicted units waiting to be drained, oldest first across levels.
///
/// ```
/// use ctxwin_core::{ContextManager, TinyCapacities};
/// let manager = ContextManager::<TinyCapacities>::new();
/// assert_eq!(manager.outbox().count(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct Outbox<'a> {
    cursors: [Cursor<'a>; 3],
}

impl<'a> Iterator for Outbox<'a> {
    type Item = EvictedUnit<'a>;

    fn next(&mut self) -> Option<EvictedUnit<'a>> {
        let mut best: Option<(usize, u64)> = None;
        for (index, cursor) in self.cursors.iter_mut().enumerate() {
            if let Some(unit) = cursor.peek() {
                if best.is_none_or(|(_, id)| unit.first_id() < id) {
                    best = Some((index, unit.first_id()));
                }
            }
        }
        let cursor = self.cursors.get_mut(best?.0)?;
        let unit = cursor.peek();
        cursor.peeked = None;
        unit
    }
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Evicted units waiting to be drained, oldest first.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// assert!(ContextManager::<TinyCapacities>::new().outbox().next().is_none());
    /// ```
    pub fn outbox(&self) -> Outbox<'_> {
        let cursor = |level| Cursor { level, ring: self.ring(level), at: 0, peeked: None };
        Outbox {
            cursors: [cursor(Level::Session), cursor(Level::Working), cursor(Level::Volatile)],
        }
    }

    /// Hands every evicted unit to `sink`, oldest first, then frees their space. Returns how
    /// many units were drained.
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, Message, TinyCapacities};
    /// let config = Config { locked_tail: 1, max_messages: 1, ..Config::DEFAULT };
    /// let mut manager = ContextManager::<TinyCapacities>::with_config(config)?;
    /// manager.push(Message::assistant("old"))?;
    /// manager.push(Message::assistant("new"))?;
    /// let mut archived = Vec::new();
    /// let drained = manager.drain_outbox(|unit| {
    ///     archived.extend(unit.messages().map(|m| m.content().to_string()));
    /// });
    /// assert_eq!((drained, archived), (1, vec!["old".to_string()]));
    /// assert_eq!(manager.outbox().count(), 0);
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn drain_outbox(&mut self, mut sink: impl FnMut(EvictedUnit<'_>)) -> usize {
        let mut drained = 0usize;
        for unit in self.outbox() {
            sink(unit);
            drained += 1;
        }
        for level in [Level::Session, Level::Working, Level::Volatile] {
            self.ring_mut(level).retain(|h| h.is_live());
        }
        let counters = &mut self.state.counters;
        bump(&mut counters.units_drained, drained as u64);
        drained
    }
}
