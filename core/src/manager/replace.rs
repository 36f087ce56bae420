//! Writes from outside the manager's own strategies: a summary's text replaced by a better
//! one computed elsewhere (an LLM off the critical path), and entity values set directly.
//!
//! Both keep every invariant a push keeps: the budget is never exceeded (a replacement that
//! would push the session level over its budget is refused), and the counters stay consistent
//! (a replaced summary counts as a stored message and a superseded one, so
//! `messages_pushed == live + evicted + removed + summaries_replaced` still holds).

use super::ContextManager;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::entities::{EntitiesMut, EntityError, EntityStorage};
use crate::header::{Header, flags};
use crate::level::Level;
use crate::manager::MAX_SUMMARY_RANGES;
use crate::record::{self, RANGE_ENTRY, SpanWriter};
use crate::ring::RingStorage;
use crate::stats::bump;
use crate::strategy::Strategy;

/// Why [`ContextManager::replace_summary`] refused; the summary is unchanged.
///
/// ```
/// use ctxwin_core::{ContextManager, manager::ReplaceError, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// assert_eq!(manager.replace_summary(7, "text"), Err(ReplaceError::NotASummary { id: 7 }));
/// assert_eq!(ReplaceError::EmptyText.to_string(), "the replacement summary is empty");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ReplaceError {
    /// No live summary in the session level has this id (it was merged, superseded, evicted,
    /// or never was a summary).
    NotASummary {
        /// The id asked for.
        id: u64,
    },
    /// The replacement has no text besides whitespace.
    EmptyText,
    /// The replacement costs more tokens than the summary may: its level's budget (as
    /// `Config::fit_budgets` caps it) less the other session entries, the per-summary cap
    /// (`Config::summary_tokens`, or the old summary's cost if that was larger), or what the
    /// budget leaves the payload besides the old summary.
    TooLarge {
        /// Tokens the replacement costs, framing included.
        needed: u32,
        /// Tokens it may cost.
        limit: u32,
    },
    /// The session level's byte arena cannot hold the replacement.
    NoRoom {
        /// Bytes the record would take.
        needed: u32,
    },
}

impl core::fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReplaceError::NotASummary { id } => write!(f, "no live summary has id {id}"),
            ReplaceError::EmptyText => f.write_str("the replacement summary is empty"),
            ReplaceError::TooLarge { needed, limit } => {
                write!(f, "the replacement costs {needed} tokens, over its limit of {limit}")
            }
            ReplaceError::NoRoom { needed } => {
                write!(f, "the session level has no room for a {needed}-byte summary")
            }
        }
    }
}

impl core::error::Error for ReplaceError {}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Replaces the text of the live summary `id` with `text`, keeping its id, its place in the
    /// session level, its source ranges, detail and timestamp. Returns the summary's id.
    ///
    /// This is how a summary computed off the critical path (by an LLM, while the manager kept
    /// working with its extractive summary) is swapped in. The replacement may cost at most
    /// what the session level's budget leaves besides the other entries (and what the total
    /// budget leaves besides the rest of the payload), and at most
    /// `Config::summary_tokens` (or the old summary's cost, if that was larger). O(session
    /// capacity + its arena).
    ///
    /// # Errors
    ///
    /// [`ReplaceError::NotASummary`] when `id` is not a live summary, [`ReplaceError::EmptyText`],
    /// [`ReplaceError::TooLarge`], [`ReplaceError::NoRoom`]; nothing changes then.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, manager::ReplaceError, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let id = manager.add_summary("user: plan. assistant: ok. user: ship Friday", &[(1, 3)], 9)?;
    /// assert_eq!(manager.replace_summary(id, "Decided to ship on Friday."), Ok(id));
    /// let summary = manager.get(id).unwrap();
    /// assert_eq!(summary.content(), "Decided to ship on Friday.");
    /// assert_eq!(summary.summary_sources().collect::<Vec<_>>(), [(1, 3)]);
    /// assert!(matches!(manager.replace_summary(id, &"word ".repeat(5_000)), Err(ReplaceError::TooLarge { .. })));
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn replace_summary(&mut self, id: u64, text: &str) -> Result<u64, ReplaceError> {
        let session = self.ring(Level::Session);
        let found = (0..session.len()).find_map(|index| {
            let header = session.get(index)?;
            (session.id(header) == id && header.is_live() && header.has(flags::SUMMARY))
                .then_some((index, *header))
        });
        let Some((index, old)) = found else { return Err(ReplaceError::NotASummary { id }) };
        if text.trim().is_empty() {
            return Err(ReplaceError::EmptyText);
        }
        let mut ranges = [(0u64, 0u64); MAX_SUMMARY_RANGES];
        let mut count = 0usize;
        for (slot, range) in
            ranges.iter_mut().zip(record::SourceRanges::new(&old, session.record(&old)))
        {
            *slot = range;
            count += 1;
        }
        let ranges = ranges.get(..count).unwrap_or_default();
        let tokens = self.framed_tokens(self.counter.count(text), [], None);
        let others = self.level_tokens(Level::Session).saturating_sub(old.tokens);
        let level = self.config.level_budget(Level::Session);
        let room = level.saturating_sub(others);
        let cap = self.config.summary_tokens.min(level).max(old.tokens);
        // Nor may it take the payload over the budget.
        let free = self.budget().saturating_sub(self.used()).saturating_add(old.tokens);
        let limit = room.min(cap).min(free);
        if tokens > limit {
            return Err(ReplaceError::TooLarge { needed: tokens, limit });
        }
        let len = text.len().saturating_add(count.saturating_mul(RANGE_ENTRY));
        let needed = u32::try_from(len).unwrap_or(u32::MAX);
        let written = self.session.view_mut().replace(index, len, |span| {
            let mut out = SpanWriter::new(span);
            out.put(text.as_bytes());
            ranges.iter().for_each(|&(first, last)| out.put_range(first, last));
        });
        if written.is_none() {
            return Err(ReplaceError::NoRoom { needed });
        }
        let mut ring = self.session.view_mut();
        let Some(stored) = ring.get_mut(index) else { return Err(ReplaceError::NoRoom { needed }) };
        *stored = Header {
            content_len: text.len() as u32,
            tokens,
            // The new text has no trailer: no original count, no terms (summaries have none).
            flags: stored.flags & !(flags::REDUCED | flags::TRAILER),
            ..*stored
        };
        let stored = *stored;
        self.remove_live(Level::Session, &old);
        self.add_live(Level::Session, &stored);
        let counters = &mut self.state.counters;
        bump(&mut counters.messages_pushed, 1);
        bump(&mut counters.summaries_replaced, 1);
        debug!("summary {} replaced: {} -> {} tokens", id, old.tokens, tokens);
        Ok(id)
    }

    /// Sets entity `key` to `value` (trimmed), or forgets its value with `None`, as an
    /// [`Extractor`](crate::entities::Extractor) would during a push: for values found off the critical
    /// path (an LLM extraction). The entity block's cost is recounted; the next
    /// [`compose`](Self::compose) evicts history if it needs the room.
    ///
    /// # Errors
    ///
    /// [`EntityError::Undeclared`] for a key the schema does not declare,
    /// [`EntityError::ValueTooLong`] for a value longer than the table holds; nothing changes.
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, entities::EntityError, EntitySchema, TinyCapacities};
    /// # if !cfg!(feature = "entities") { return Ok(()); }
    /// let schema = EntitySchema::new(&["branch"]).unwrap();
    /// let mut manager = ContextManager::<TinyCapacities>::with_config(Config { entity_schema: schema, ..Config::DEFAULT })?;
    /// manager.set_entity("branch", Some(" fix-io "))?;
    /// assert_eq!(manager.entities().get("branch"), Some("fix-io"));
    /// manager.set_entity("branch", None)?;
    /// assert_eq!(manager.entities().get("branch"), None);
    /// assert_eq!(manager.set_entity("owner", Some("Dana")), Err(EntityError::Undeclared));
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn set_entity(&mut self, key: &str, value: Option<&str>) -> Result<(), EntityError> {
        let changed = {
            let mut entities =
                EntitiesMut::new(&self.config.entity_schema, self.entities.parts_mut());
            match value {
                Some(value) => entities.set(key, value)?,
                None => entities.clear(key)?,
            }
            entities.changed()
        };
        if changed {
            self.recount_entities();
            // The entity block comes before the history: a payload no longer extends the
            // previous one (the cache accounting of the next compose).
            self.mark_changed(Level::Session);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "entities")]
    use crate::EntitySchema;
    use crate::ring::Ring;
    use crate::{Config, Message, StrategyKind, TinyCapacities};

    /// A session level of 1,024 bytes (the property model's capacities).
    struct Tight;
    impl Capacities for Tight {
        type Permanent = Ring<4, 1024>;
        type Session = Ring<4, 1024>;
        type Working = Ring<24, 4096>;
        type Volatile = Ring<8, 2048>;
        type Scratch = crate::capacity::Scratch<512>;
        type Entities = crate::entities::EntityTable<4, 32>;
    }

    fn folded() -> (ContextManager<TinyCapacities>, u64) {
        let config = Config {
            strategy: StrategyKind::Summarization,
            summarize_threshold: 2,
            summarize_batch: 1,
            locked_tail: 2,
            // Plans on every push, as before water marks.
            low_water_percent: 100,
            ..Config::DEFAULT
        };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        for turn in 0..6 {
            manager.push(Message::user(&format!("Turn {turn}: build src/lib{turn}.rs"))).unwrap();
            manager.push(Message::assistant(&format!("Built lib{turn} with 3 warnings"))).unwrap();
        }
        let id = manager.session().find(|m| m.is_summary()).unwrap().id();
        (manager, id)
    }

    #[test]
    fn a_rolling_summary_keeps_its_place_sources_and_flags() {
        let (mut manager, id) = folded();
        let before = manager.get(id).unwrap();
        let (sources, detail, timestamp) =
            (before.summary_sources().collect::<Vec<_>>(), before.detail(), before.timestamp());
        let counters = manager.stats().counters;
        assert_eq!(manager.replace_summary(id, "Built lib0 to lib3; warnings remain."), Ok(id));
        let after = manager.get(id).unwrap();
        assert_eq!(after.content(), "Built lib0 to lib3; warnings remain.");
        assert_eq!(after.summary_sources().collect::<Vec<_>>(), sources);
        assert_eq!((after.detail(), after.timestamp()), (detail, timestamp));
        let now = manager.stats().counters;
        assert_eq!(now.messages_pushed, counters.messages_pushed + 1);
        assert_eq!(now.summaries_replaced, counters.summaries_replaced + 1);
        // The next fold extends the replaced text, still in place.
        manager.push(Message::user("Turn 7: release")).unwrap();
        let rolling: Vec<u64> =
            manager.session().filter(|m| m.is_summary()).map(|m| m.id()).collect();
        assert_eq!(rolling, [id]);
        assert!(manager.compose(&[]).is_ok());
    }

    #[test]
    fn refusals_change_nothing() {
        let (mut manager, id) = folded();
        let stats = manager.stats();
        let user = manager.history().next().unwrap().id();
        assert_eq!(manager.replace_summary(user, "x"), Err(ReplaceError::NotASummary { id: user }));
        assert_eq!(manager.replace_summary(id, " \n "), Err(ReplaceError::EmptyText));
        let huge = "word ".repeat(3_000);
        assert!(matches!(
            manager.replace_summary(id, &huge),
            Err(ReplaceError::TooLarge { needed, limit }) if needed > limit
        ));
        assert_eq!(manager.stats(), stats);
    }

    #[test]
    fn the_session_budget_bounds_a_replacement() {
        let config = Config { session_budget: 120, summary_tokens: 100, ..Config::DEFAULT };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        let first = manager.add_summary(&"alpha ".repeat(30), &[(1, 2)], 1).unwrap();
        let second = manager.add_summary("beta", &[(3, 4)], 2).unwrap();
        let others = manager.get(first).unwrap().tokens();
        let limit = 120 - others;
        let fits = "gamma ".repeat(usize::try_from(limit).unwrap() / 3);
        match manager.replace_summary(second, &fits) {
            Ok(_) => assert!(manager.level_tokens(Level::Session) <= 120),
            Err(ReplaceError::TooLarge { limit: l, .. }) => assert_eq!(l, limit),
            Err(other) => panic!("{other}"),
        }
        assert!(manager.level_tokens(Level::Session) <= 120);
        assert!(matches!(
            manager.replace_summary(second, &"gamma ".repeat(200)),
            Err(ReplaceError::TooLarge { limit: l, .. }) if l == limit
        ));
    }

    #[test]
    fn no_room_in_the_arena_is_refused() {
        let config = Config { summary_tokens: 4_000, ..Config::DEFAULT };
        let mut manager = ContextManager::<Tight>::with_config(config).unwrap();
        let id = manager.add_summary("short", &[(1, 1)], 1).unwrap();
        let long = "x".repeat(2_000);
        assert_eq!(manager.replace_summary(id, &long), Err(ReplaceError::NoRoom { needed: 2_016 }));
        assert_eq!(manager.get(id).unwrap().content(), "short");
    }

    #[cfg(feature = "entities")]
    #[test]
    fn entities_are_set_cleared_and_recounted() {
        let schema = EntitySchema::new(&["branch", "owner"]).unwrap();
        let config = Config { entity_schema: schema, ..Config::DEFAULT };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        let empty = manager.used();
        manager.set_entity("owner", Some("Dana Scully")).unwrap();
        assert!(manager.used() > empty);
        assert_eq!(
            manager.set_entity("owner", Some(&"x".repeat(500))),
            Err(EntityError::ValueTooLong)
        );
        assert_eq!(manager.entities().get("owner"), Some("Dana Scully"));
        manager.set_entity("owner", None).unwrap();
        assert_eq!(manager.used(), empty);
    }

    #[cfg(feature = "entities")]
    #[test]
    fn a_changed_entity_breaks_the_cached_prefix() {
        let schema = EntitySchema::new(&["branch"]).unwrap();
        let config = Config { entity_schema: schema, ..Config::DEFAULT };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        manager.push(Message::system("You are terse.")).unwrap();
        manager.push(Message::user("Build it.")).unwrap();
        manager.compose(&[]).unwrap();
        manager.push(Message::assistant("Built.")).unwrap();
        manager.compose(&[]).unwrap();
        let extending = manager.stats().counters.composes_extending;
        assert_eq!(extending, 1, "an append extends the previous payload");
        // A new value: the entity block, before the history, changed.
        manager.set_entity("branch", Some("main")).unwrap();
        manager.compose(&[]).unwrap();
        assert_eq!(manager.stats().counters.composes_extending, extending);
        manager.compose(&[]).unwrap();
        assert_eq!(manager.stats().counters.composes_extending, extending + 1);
        // The same value again changes nothing: the next payload still extends.
        manager.set_entity("branch", Some("main")).unwrap();
        manager.compose(&[]).unwrap();
        assert_eq!(manager.stats().counters.composes_extending, extending + 2);
        // A changed value comes before the history: the cache holds the system prompt only.
        let counters = manager.stats().counters;
        manager.set_entity("branch", Some("fix-io")).unwrap();
        manager.compose(&[]).unwrap();
        let after = manager.stats().counters;
        assert_eq!(after.composes_extending, counters.composes_extending);
        assert!(
            after.prompt_tokens_cached - counters.prompt_tokens_cached < u64::from(manager.used())
        );
    }
}
