//! Victim choice: which unit of a level leaves next (the oldest the lock allows, or the
//! lowest-valued when the strategy scores units), and what the strategy makes of it as it leaves.

use super::ContextManager;
use super::evict::{Lock, UnitSpan, unit_end};
use super::summary::VALUE_WINDOW;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::level::Level;
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
