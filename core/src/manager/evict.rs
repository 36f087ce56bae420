//! Eviction: which units may leave, in what order, and when.
//!
//! A unit is one non-tool message plus the tool results that follow it in its level. Units
//! leave whole, oldest first, volatile before working, never from the locked tail: the newest
//! [`Config::locked_tail`](crate::config::Config::locked_tail) messages, the newest user message, and a
//! unit whose calls still wait for results.

use super::ContextManager;
use crate::capacity::Capacities;
use crate::config::{OutboxMode, percent_of};
use crate::counter::TokenCounter;
use crate::error::Error;
use crate::header::flags;
use crate::level::Level;
use crate::ring::RingRef;
use crate::role::Role;
use crate::stats::bump;
use crate::strategy::Strategy;

/// Share of a ring's bytes or message slots above which it is compacted, whatever the
/// token trigger (today's default trigger, so a full ring never waits on the outbox).
const RING_TRIGGER_PERCENT: u8 = 80;

/// What the locked tail covers, computed once per operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lock {
    /// Units holding a message with an id at or above this are locked.
    pub from_id: u64,
    /// The newest user message, locked wherever it is.
    pub user_id: Option<u64>,
    /// Level of a unit still waiting for results (always its level's newest unit).
    pub pending: Option<Level>,
}

/// A unit's span in its ring: logical indices `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitSpan {
    pub start: usize,
    pub end: usize,
}

/// End (exclusive) of the unit starting at `start`: the next non-tool message.
pub(crate) fn unit_end(ring: &RingRef<'_>, start: usize) -> usize {
    let mut end = start + 1;
    while ring.get(end).is_some_and(|h| h.role == Role::Tool) {
        end += 1;
    }
    end.min(ring.len())
}

impl Lock {
    pub(crate) fn covers(&self, ring: &RingRef<'_>, level: Level, unit: UnitSpan) -> bool {
        if level == Level::Session {
            return false;
        }
        if self.pending == Some(level) && unit.end == ring.len() {
            return true;
        }
        (unit.start..unit.end)
            .filter_map(|i| ring.get(i))
            .any(|h| ring.id(h) >= self.from_id || Some(ring.id(h)) == self.user_id)
    }
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    pub(crate) fn lock(&self) -> Lock {
        let tail = usize::from(self.config.locked_tail);
        let from_id = match tail {
            0 => u64::MAX,
            _ => self.history().rev().nth(tail - 1).map_or(0, |m| m.id()),
        };
        Lock {
            from_id,
            user_id: self.state.last_user_id.filter(|_| self.config.lock_newest_user),
            pending: self.state.pending().map(|p| p.level),
        }
    }

    /// The oldest live unit of `level` the lock does not cover.
    pub(crate) fn oldest_evictable(&self, level: Level, lock: &Lock) -> Option<UnitSpan> {
        if level == Level::Permanent {
            return None;
        }
        let ring = self.ring(level);
        let mut start = 0;
        while start < ring.len() {
            let end = unit_end(&ring, start);
            let unit = UnitSpan { start, end };
            let live = ring.get(start).is_some_and(|h| h.is_live());
            if live && !lock.covers(&ring, level, unit) {
                return Some(unit);
            }
            start = end;
        }
        None
    }

    /// Evicts a unit: it leaves the context and waits in the outbox (or is discarded).
    pub(crate) fn evict(&mut self, level: Level, unit: UnitSpan) {
        let mut tokens = 0u32;
        let mut messages = 0u32;
        for index in unit.start..unit.end {
            let mut ring = self.ring_mut(level);
            let Some(header) = ring.get_mut(index) else { continue };
            if header.is_live() {
                header.flags |= flags::EVICTED;
                let header = *header;
                tokens = tokens.saturating_add(header.tokens);
                messages += 1;
                self.remove_live(level, &header);
            }
        }
        let counters = &mut self.state.counters;
        bump(&mut counters.units_evicted, 1);
        bump(&mut counters.messages_evicted, u64::from(messages));
        bump(&mut counters.tokens_evicted, u64::from(tokens));
        counters.last_compression_turn = Some(self.state.turn);
        if self.config.outbox == OutboxMode::Discard {
            bump(&mut counters.units_discarded, 1);
        }
        debug!("evicted {} messages ({} tokens) from {}", messages, tokens, level);
    }

    /// Frees the space of evicted units of `levels` in [`OutboxMode::Discard`]. Only at the end
    /// of an operation, or for the one level being made room in: it moves indices.
    ///
    /// A level without evicted headers costs nothing, and evicted headers at the front (the
    /// oldest units, what eviction takes first) are released without moving the others.
    fn release_discarded(&mut self, levels: &[Level]) {
        if self.config.outbox == OutboxMode::Discard {
            for &level in levels {
                let live = self.state.live.get(level.index()).copied().unwrap_or(0) as usize;
                let mut ring = self.ring_mut(level);
                if ring.as_ref().len() == live {
                    continue;
                }
                ring.pop_front_while(|h| !h.is_live());
                if ring.as_ref().len() != live {
                    ring.retain(|h| h.is_live());
                }
            }
        }
    }

    /// Frees the evicted headers at the front of `level` in [`OutboxMode::Discard`]: they
    /// come before every index a caller may hold next, so only this operation's indices move.
    fn release_discarded_front(&mut self, level: Level) {
        if self.config.outbox == OutboxMode::Discard {
            self.ring_mut(level).pop_front_while(|h| !h.is_live());
        }
    }

    /// Whether `level` is over its token budget or its byte/message trigger.
    pub(crate) fn level_over(&self, level: Level) -> bool {
        self.level_over_at(level, self.config.trigger_percent.min(RING_TRIGGER_PERCENT))
    }

    /// Whether `level` is over its token budget (the session level, the permanent one, and
    /// every level when eviction is per push; otherwise history levels share the budget), or
    /// over `percent` of its byte or message capacity.
    fn level_over_at(&self, level: Level, percent: u8) -> bool {
        let ring = self.ring(level);
        let live_messages = self.state.live.get(level.index()).copied().unwrap_or(0);
        let quota = !level.is_history() || !self.config.compacts();
        (quota && self.level_tokens(level) > self.config.level_budget(level))
            || self.level_bytes(level) > percent_of(ring.arena_capacity() as u32, percent)
            || live_messages > percent_of(ring.capacity() as u32, percent)
            || (level == Level::Working && self.over_max_messages())
    }

    fn over_max_messages(&self) -> bool {
        let max = self.config.max_messages;
        let history = self.state.live.get(Level::Working.index()).copied().unwrap_or(0)
            + self.state.live.get(Level::Volatile.index()).copied().unwrap_or(0);
        max != 0 && history > max
    }

    /// Whether usage, the history's levels or the message limit are over the high-water mark.
    /// A ring's bytes and message slots count from at most 80% of its capacity: a push must
    /// still find room without waiting for the caller to drain the outbox.
    fn over_high_water(&self) -> bool {
        let trigger = self.config.trigger_percent.min(RING_TRIGGER_PERCENT);
        self.used() > self.config.trigger_tokens()
            || self.over_max_messages()
            || self.level_over_at(Level::Volatile, trigger)
            || self.level_over_at(Level::Working, trigger)
    }

    /// Garbage collection after a push. Below the high-water mark it does nothing (the
    /// payload only grows at its end); above it, a compaction runs the strategy's deferred
    /// plan and evicts down to the low-water mark in one step (with
    /// [`Config::compacts`](crate::config::Config::compacts) off: just under the trigger).
    /// The session level is kept within its budget either way.
    pub(crate) fn collect(&mut self) {
        let compacting = self.over_high_water();
        let before = self.state.counters.units_evicted;
        let (target, percent) = if compacting && self.config.compacts() {
            self.run_deferred_plan();
            (self.config.low_water_tokens(), self.config.low_water())
        } else {
            (self.config.trigger_tokens(), self.config.trigger_percent.min(RING_TRIGGER_PERCENT))
        };
        // The lock is computed once, and only when something must leave (most pushes evict
        // nothing).
        let mut lock = None;
        // Each round evicts a unit or stops, so rounds are bounded by the stored units.
        loop {
            let total_over = self.used() > target || self.over_max_messages();
            let mut victim = None;
            for level in [Level::Volatile, Level::Working] {
                if self.level_over_at(level, percent) || total_over {
                    let lock = *lock.get_or_insert_with(|| self.lock());
                    if let Some(unit) = self.choose_victim(level, &lock) {
                        victim = Some((level, unit));
                        break;
                    }
                }
            }
            match victim {
                Some((level, unit)) => {
                    self.leave(level, unit);
                    // A discarded unit at the front goes now, so the next round does not walk
                    // past it again (indices are recomputed every round).
                    self.release_discarded_front(level);
                }
                None if self.level_over(Level::Session) => {
                    if !self.shrink_session() {
                        break;
                    }
                }
                None => break,
            }
        }
        self.count_compaction(compacting, before);
        self.release_discarded(&[Level::Session, Level::Working, Level::Volatile]);
    }

    /// Counts a compaction: an eviction pass that went over a mark and evicted something.
    fn count_compaction(&mut self, over: bool, units_before: u64) {
        let counters = &mut self.state.counters;
        if over && counters.units_evicted > units_before {
            bump(&mut counters.compactions, 1);
        }
    }

    /// Evicts history units until `tokens` more fit under the budget. When it must evict and
    /// [`Config::compacts`](crate::config::Config::compacts), it compacts: it evicts until
    /// usage is also under the low-water mark, so the next payloads can grow again.
    ///
    /// Checks first whether evicting every unit outside the locked tail would be enough; if
    /// not, returns [`Error::PinnedOverBudget`] and evicts nothing.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hello"))?;
    /// manager.make_space(100)?;
    /// assert!(matches!(manager.make_space(1_000_000), Err(Error::PinnedOverBudget { .. })));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn make_space(&mut self, tokens: u32) -> Result<(), Error> {
        let budget = self.budget();
        let needed = |used: u32| used.saturating_add(tokens);
        if needed(self.used()) <= budget {
            return Ok(());
        }
        let lock = self.lock();
        let evictable = self.evictable_tokens(&lock);
        let pinned = needed(self.used()).saturating_sub(evictable);
        if pinned > budget {
            return Err(Error::PinnedOverBudget { needed: pinned, budget });
        }
        let low = match self.config.compacts() {
            true => self.config.low_water_tokens(),
            false => u32::MAX,
        };
        let before = self.state.counters.units_evicted;
        while needed(self.used()) > budget || self.used() > low {
            let victim = [Level::Volatile, Level::Working]
                .into_iter()
                .find_map(|level| self.choose_victim(level, &lock).map(|unit| (level, unit)));
            let Some((level, unit)) = victim else { break };
            self.leave(level, unit);
            if self.level_over(Level::Session) {
                self.shrink_session();
            }
        }
        self.count_compaction(true, before);
        self.release_discarded(&[Level::Session, Level::Working, Level::Volatile]);
        let used = needed(self.used());
        if used > budget {
            return Err(Error::PinnedOverBudget { needed: used, budget });
        }
        Ok(())
    }

    /// Tokens of every live history unit the lock does not cover.
    fn evictable_tokens(&self, lock: &Lock) -> u32 {
        let mut sum = 0u32;
        for level in [Level::Working, Level::Volatile] {
            let ring = self.ring(level);
            let mut start = 0;
            while start < ring.len() {
                let end = unit_end(&ring, start);
                let unit = UnitSpan { start, end };
                if !lock.covers(&ring, level, unit) {
                    let live = (start..end).filter_map(|i| ring.get(i)).filter(|h| h.is_live());
                    sum = live.fold(sum, |s, h| s.saturating_add(h.tokens));
                }
                start = end;
            }
        }
        sum
    }

    /// Makes room in `level` for `slots` records totalling `len` bytes, evicting its oldest
    /// units if needed.
    ///
    /// Plans first: if evicting every unit the level may evict would not be enough, returns
    /// [`Error::LevelFull`] and evicts nothing. In [`OutboxMode::Hold`], space held by evicted
    /// units the caller has not drained yet gives [`Error::OutboxFull`].
    pub(crate) fn make_room(
        &mut self,
        level: Level,
        len: usize,
        slots: usize,
    ) -> Result<(), Error> {
        let fits = |bytes: usize, free: usize| {
            let ring = self.ring(level);
            ring.bytes_used().saturating_sub(bytes) + len <= ring.arena_capacity()
                && ring.len().saturating_sub(free) + slots <= ring.capacity()
        };
        if fits(0, 0) {
            return Ok(());
        }
        let lock = self.lock();
        let (mut free_bytes, mut free_slots) = self.reclaimable(level);
        let mut plan = 0usize;
        {
            let ring = self.ring(level);
            let mut start = 0;
            while !fits(free_bytes, free_slots) && start < ring.len() {
                let end = unit_end(&ring, start);
                let unit = UnitSpan { start, end };
                if ring.get(start).is_some_and(|h| h.is_live()) && !lock.covers(&ring, level, unit)
                {
                    for header in (start..end).filter_map(|i| ring.get(i)) {
                        free_bytes += header.len as usize;
                        free_slots += 1;
                    }
                    plan += 1;
                }
                start = end;
            }
        }
        if !fits(free_bytes, free_slots) {
            return Err(Error::LevelFull { level });
        }
        for _ in 0..plan {
            match self.oldest_evictable(level, &lock) {
                Some(unit) => self.leave(level, unit),
                None => break,
            }
        }
        match self.config.outbox {
            OutboxMode::Discard => {
                self.release_discarded(&[level]);
                Ok(())
            }
            OutboxMode::Hold => Err(Error::OutboxFull { level }),
        }
    }

    /// Bytes and header slots held by evicted units of `level`.
    fn reclaimable(&self, level: Level) -> (usize, usize) {
        self.ring(level)
            .iter()
            .filter(|h| !h.is_live())
            .fold((0, 0), |(bytes, slots), h| (bytes + h.len as usize, slots + 1))
    }
}
