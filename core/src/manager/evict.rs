//! Eviction: which units may leave, in what order, and when.
//!
//! A unit is one non-tool message plus the tool results that follow it in its level. Units
//! leave whole, oldest first, volatile before working, never from the locked tail: the newest
//! [`Config::locked_tail`](crate::config::Config::locked_tail) messages, the newest user message, and a
//! unit whose calls still wait for results.
//!
//! When usage is still over the budget once every other unit has left, the summaries shrink
//! to the room left (merged into a digest, else dropped oldest first), and then the locked
//! tail gives way, its oldest unit first, down to the live request: the newest user message,
//! the newest unit (what the model answers next) and a unit still waiting for results. Only
//! those, the permanent level and dynamic context are pinned ([`Error::PinnedOverBudget`]).

use super::ContextManager;
use crate::capacity::Capacities;
use crate::config::{OutboxMode, percent_of};
use crate::counter::TokenCounter;
use crate::error::{Error, Pinned};
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
    /// The locked tail: the newest `locked_tail` messages' units, the newest user message's
    /// and a unit waiting for results.
    #[inline(always)]
    pub(crate) fn lock(&self) -> Lock {
        self.lock_keeping(self.config.locked_tail)
    }

    /// The live request, what stays whatever the budget: the newest user message's unit, the
    /// newest unit (with a locked tail at all) and a unit waiting for results.
    #[inline(always)]
    fn live_lock(&self) -> Lock {
        self.lock_keeping(self.config.locked_tail.min(1))
    }

    fn lock_keeping(&self, tail: u16) -> Lock {
        let tail = usize::from(tail);
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
        self.evictable_from(level, lock, 0)
    }

    /// The first live unit of `level` the lock does not cover, at record `start` or after
    /// (a unit's head).
    pub(crate) fn evictable_from(
        &self,
        level: Level,
        lock: &Lock,
        start: usize,
    ) -> Option<UnitSpan> {
        if level == Level::Permanent {
            return None;
        }
        let ring = self.ring(level);
        let mut start = start;
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
                ring.pop_front_evicted();
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
            self.ring_mut(level).pop_front_evicted();
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
        let before = self.changes();
        // Under the high-water mark no unit must leave (it is what the loop would check), so
        // most pushes skip the loop; the summaries may still be over their level.
        if compacting || self.level_over(Level::Session) {
            let (target, percent) = if compacting && self.config.compacts() {
                self.run_deferred_plan();
                #[cfg(feature = "compaction-cut")]
                {
                    self.cut_superseded();
                    self.cut_old_results(self.config.low_water_tokens());
                }
                (self.config.low_water_tokens(), self.config.low_water())
            } else {
                let trigger = self.config.trigger_percent.min(RING_TRIGGER_PERCENT);
                (self.config.trigger_tokens(), trigger)
            };
            self.evict_to(0, target, target, Some(percent));
        }
        self.end_eviction(compacting, before);
    }

    /// Ends an eviction pass: counts a compaction if it went over a mark and evicted or cut
    /// something (`before`: [`Self::changes`] when it began), and frees what it discarded.
    pub(super) fn end_eviction(&mut self, over: bool, before: (u64, u64)) {
        if over && self.changes() != before {
            bump(&mut self.state.counters.compactions, 1);
        }
        self.release_discarded(&[Level::Session, Level::Working, Level::Volatile]);
    }

    /// Units evicted and results reduced so far: what an eviction pass compares to tell
    /// whether it changed the payload.
    pub(super) fn changes(&self) -> (u64, u64) {
        let counters = &self.state.counters;
        (counters.units_evicted, counters.observations_reduced)
    }

    /// Evicts history units, then shrinks or drops summaries, then lets the locked tail's older
    /// units go, until `tokens` more fit under the budget. When it must evict and
    /// [`Config::compacts`](crate::config::Config::compacts), it compacts: it evicts unlocked
    /// history until usage is also under the low-water mark, so the next payloads can grow
    /// again.
    ///
    /// Checks first whether that would be enough, with only the permanent level, the live
    /// request (the newest user message, the newest unit, a unit waiting for results) and
    /// `tokens` left; if not, returns [`Error::PinnedOverBudget`] (saying what is pinned) and
    /// evicts nothing.
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
        if self.needed(tokens) <= budget {
            return Ok(());
        }
        let live = self.live_lock();
        let evictable = self.evictable_tokens(&live);
        let session =
            self.level_tokens(Level::Session).saturating_add(self.summary_framing_tokens());
        let mut needed = self.needed(tokens).saturating_sub(evictable).saturating_sub(session);
        if needed <= budget {
            let low = match self.config.compacts() {
                true => self.config.low_water_tokens(),
                false => u32::MAX,
            };
            let before = self.changes();
            #[cfg(feature = "compaction-cut")]
            if self.config.compacts() {
                self.cut_superseded();
                self.cut_old_results(low);
            }
            self.evict_to(tokens, budget, low, None);
            self.end_eviction(true, before);
            needed = self.needed(tokens);
            if needed <= budget {
                return Ok(());
            }
            // Unreachable while the check above holds: everything it counted as evictable
            // has left.
        }
        Err(self.pinned_over_budget(evictable, tokens, needed))
    }

    /// What a payload with `extra` more tokens costs: an empty manager's payload pays the
    /// request overhead with the first of them.
    pub(super) fn needed(&self, extra: u32) -> u32 {
        let used = self.used();
        let framing = match used == 0 && extra > 0 {
            true => u32::from(self.config.request_overhead),
            false => 0,
        };
        used.saturating_add(extra).saturating_add(framing)
    }

    /// Whether a payload with `extra` more tokens is over `budget`, usage over `low`, or (with
    /// `messages`) the history over the message limit.
    #[inline(never)]
    fn over(&self, extra: u32, budget: u32, low: u32, messages: bool) -> bool {
        // (`low` at or above `budget` adds nothing: usage is never above what it needs.)
        self.needed(extra) > budget
            || (low < budget && self.used() > low)
            || (messages && self.over_max_messages())
    }

    /// The next unit to leave under `lock` (computed on first use): volatile before working,
    /// as the strategy chooses within each, from every level with `all`, else from those
    /// over `percent` of their ring (and over their budget when it is a quota).
    fn next_victim(
        &mut self,
        lock: &mut Option<Lock>,
        all: bool,
        percent: Option<u8>,
    ) -> Option<(Level, UnitSpan)> {
        for level in [Level::Volatile, Level::Working] {
            if all || percent.is_some_and(|percent| self.level_over_at(level, percent)) {
                let lock = lock.get_or_insert_with(|| self.lock());
                if let Some(unit) = self.choose_victim(level, lock) {
                    return Some((level, unit));
                }
            }
        }
        None
    }

    /// The one eviction loop: evicts unlocked history units while a payload with `extra` more
    /// tokens is over `budget` or usage over `low` (and, with `percent`, the message limit
    /// is passed, or from a level over `percent` of its ring). Once no unlocked unit is left,
    /// the summaries shrink to what the budget leaves them, and while that is still over the
    /// budget the locked tail's units leave, volatile before working, oldest first (the
    /// summaries shrinking again), down to the live request. Each round evicts a unit or
    /// ends: bounded by the units of the history and the session level's entries.
    #[inline(never)]
    fn evict_to(&mut self, extra: u32, budget: u32, low: u32, percent: Option<u8>) {
        // The lock is computed once, and only when something must leave (most pushes evict
        // nothing).
        let mut lock = None;
        loop {
            let total_over = self.over(extra, budget, low, percent.is_some());
            let mut victim = self.next_victim(&mut lock, total_over, percent);
            if victim.is_none() {
                // Nothing unlocked is left: the summaries give way, to their level's budget
                // and to what the budget leaves them, then the locked tail. (Not over the
                // target, usage is within the budget: only the level can be over.)
                if !(total_over || self.level_over(Level::Session)) {
                    return;
                }
                let total = self.budget();
                let room = total.saturating_add(self.level_tokens(Level::Session));
                self.fit_session(room.saturating_sub(self.needed(extra)));
                if self.needed(extra) <= total {
                    return;
                }
                // Evicting older units does not move the live request: recomputed, not kept.
                victim = self.next_victim(&mut Some(self.live_lock()), true, None);
            }
            let Some((level, unit)) = victim else { return };
            self.leave(level, unit);
            // A discarded unit at the front goes now, so the next round does not walk past
            // it again (indices are recomputed every round).
            self.release_discarded_front(level);
        }
    }

    /// [`Error::PinnedOverBudget`] for `needed` tokens, saying what they are: `evictable` of
    /// the history may leave, the rest of it is the live request.
    fn pinned_over_budget(&self, evictable: u32, dynamic: u32, needed: u32) -> Error {
        let history =
            self.level_tokens(Level::Working).saturating_add(self.level_tokens(Level::Volatile));
        let pinned = Pinned {
            permanent: self.level_tokens(Level::Permanent),
            live: history.saturating_sub(evictable),
            dynamic,
        };
        Error::PinnedOverBudget { needed, budget: self.budget(), pinned }
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
