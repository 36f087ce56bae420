//! Read-only access to stored messages through the views of [`crate::view`].

use super::ContextManager;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::level::Level;
use crate::message::MessageRef;
use crate::strategy::Strategy;
use crate::view::{History, LevelMessages};

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Live messages of `level`, oldest first.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hi"))?;
    /// assert_eq!(manager.messages(Level::Working).count(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn messages(&self, level: Level) -> LevelMessages<'_> {
        LevelMessages::new(self.ring(level), level)
    }

    /// The conversation history (working and volatile), oldest first.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hi"))?;
    /// assert_eq!(manager.history().count(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn history(&self) -> History<'_> {
        History::new(self.ring(Level::Working), self.ring(Level::Volatile))
    }

    /// Live session-level entries (summaries, key decisions), oldest first.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("Decision: ship on Friday").in_level(Level::Session))?;
    /// assert_eq!(manager.session().count(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn session(&self) -> LevelMessages<'_> {
        self.messages(Level::Session)
    }

    /// The live history messages with ids in `first..=last`, as a summarizer's input.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let first = manager.push(Message::user("one"))?;
    /// let last = manager.push(Message::user("two"))?;
    /// assert_eq!(manager.summary_source(first, last).count(), 2);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn summary_source(&self, first: u64, last: u64) -> crate::summarize::SummarySource<'_> {
        crate::summarize::SummarySource::new(self.history(), first, last)
    }

    /// The stored message with `id`, if it is still live. O(log capacity).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let id = manager.push(Message::user("find me"))?;
    /// assert_eq!(manager.get(id).map(|m| m.content()), Some("find me"));
    /// assert!(manager.get(id + 100).is_none());
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn get(&self, id: u64) -> Option<MessageRef<'_>> {
        Level::ALL.into_iter().find_map(|level| {
            let ring = self.ring(level);
            let (mut low, mut high) = (0usize, ring.len());
            while low < high {
                let mid = low + (high - low) / 2;
                let header = ring.get(mid)?;
                match ring.id(header).cmp(&id) {
                    core::cmp::Ordering::Less => low = mid + 1,
                    core::cmp::Ordering::Greater => high = mid,
                    core::cmp::Ordering::Equal => {
                        return header.is_live().then(|| {
                            MessageRef::new(header, ring.record(header), level, ring.id_epoch())
                        });
                    }
                }
            }
            None
        })
    }
}
