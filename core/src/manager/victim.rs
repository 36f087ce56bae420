//! Victim choice: which unit of a level leaves next (the oldest the lock allows, or the
//! lowest-valued when the strategy scores units), and what the strategy makes of it as it leaves.

use super::ContextManager;
use super::evict::{Lock, UnitSpan, unit_end};
#[cfg(feature = "compaction-cut")]
use super::shrink::NewestByKey;
use super::summary::VALUE_WINDOW;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::level::Level;
#[cfg(feature = "compaction-cut")]
use crate::record::Trailer;
#[cfg(feature = "compaction-cut")]
use crate::role::Role;
use crate::strategy::{Leave, Strategy};

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// The unit of `level` to evict next: the oldest the lock allows, or the lowest-valued of
    /// the oldest [`VALUE_WINDOW`] when the strategy scores units.
    pub(crate) fn choose_victim(&mut self, level: Level, lock: &Lock) -> Option<UnitSpan> {
        let oldest = self.oldest_evictable(level, lock)?;
        if level == Level::Session {
            return Some(oldest);
        }
        // While tasks run, a finished task's units and the open task's dead ends go first.
        #[cfg(feature = "tasks")]
        if !self.tasks.is_empty() {
            if let Some(unit) = self.task_victim(level, lock) {
                return Some(unit);
            }
        }
        let needs = self.strategy.needs(&self.config);
        let parts = self.parts();
        let env = parts.env();
        if !needs.importance || parts.strategy.oldest_first(&env) {
            #[cfg(feature = "compaction-cut")]
            return Some(self.past_current_results(level, lock, oldest));
            #[cfg(not(feature = "compaction-cut"))]
            return Some(oldest);
        }
        let ring = parts.ring(level);
        let mut best: Option<(u32, UnitSpan)> = None;
        let mut start = oldest.start;
        let mut seen = 0usize;
        while start < ring.len() && seen < VALUE_WINDOW {
            let span = UnitSpan { start, end: unit_end(&ring, start) };
            start = span.end;
            if !ring.get(span.start).is_some_and(|h| h.is_live()) || lock.covers(&ring, level, span)
            {
                continue;
            }
            seen += 1;
            let Some(unit) = parts.unit(level, span) else { continue };
            let value = parts.strategy.value(&unit, &env);
            if best.is_none_or(|(v, _)| value < v) {
                best = Some((value, span));
            }
        }
        best.map(|(_, span)| span)
    }

    /// The oldest evictable unit of `level` from `oldest` on that holds no current result
    /// (a result no newer live one of its [supersede key](crate::message::Message) follows:
    /// the newest read of a file), or a current one older than the newest current units that
    /// fit in what the low-water mark leaves the history: at a compaction the newest version
    /// of each file an agent read stays ahead of older turns, newest first, as its edits
    /// quote it (as an agent's own compaction re-reads the files it worked on). Without keys,
    /// `oldest`. O(`B`).
    #[cfg(feature = "compaction-cut")]
    fn past_current_results(&self, level: Level, lock: &Lock, oldest: UnitSpan) -> UnitSpan {
        let newest = self.newest_by_key();
        if newest.is_empty() {
            return oldest;
        }
        let pinned = self.level_tokens(Level::Permanent);
        let room = self.config.low_water_tokens().saturating_sub(pinned);
        let evictable = |start: usize| self.evictable_from(level, lock, start);
        let mut total = 0u32;
        let mut next = Some(oldest);
        while let Some(unit) = next {
            let tokens = self.current_result_tokens(level, unit, &newest);
            total = total.saturating_add(tokens.unwrap_or(0));
            next = evictable(unit.end);
        }
        if total == 0 {
            return oldest;
        }
        // Walking from the oldest, `total` is what the current units from here on cost.
        let mut next = Some(oldest);
        while let Some(unit) = next {
            match self.current_result_tokens(level, unit, &newest) {
                Some(tokens) if total <= room => total = total.saturating_sub(tokens),
                _ => return unit,
            }
            next = evictable(unit.end);
        }
        oldest
    }

    /// The live tokens of `unit` of `level` when it holds a current result: one `newest` says
    /// is the newest of its key.
    #[cfg(feature = "compaction-cut")]
    fn current_result_tokens(
        &self,
        level: Level,
        unit: UnitSpan,
        newest: &NewestByKey,
    ) -> Option<u32> {
        let ring = self.ring(level);
        let live = (unit.start..unit.end).filter_map(|i| ring.get(i)).filter(|h| h.is_live());
        let current = live.clone().any(|h| {
            let key = Trailer::of(h, ring.record(h)).key;
            h.role == Role::Tool && key != 0 && newest.is_newest(key, ring.id(h))
        });
        current.then(|| live.fold(0u32, |sum, h| sum.saturating_add(h.tokens)))
    }

    /// Evicts `unit`, first asking the strategy whether a summary of it should stay.
    pub(crate) fn leave(&mut self, level: Level, unit: UnitSpan) {
        if level.is_history() && self.strategy.needs(&self.config).summary_sources {
            let decision = {
                let parts = self.parts();
                let env = parts.env();
                match parts.unit(level, unit) {
                    Some(view) => parts.strategy.on_leave(&view, &env),
                    None => Leave::Drop,
                }
            };
            if let Leave::Summarize { detail, rolling } = decision {
                self.summarize_unit(level, unit, detail, rolling);
            }
        }
        self.evict(level, unit);
    }
}
