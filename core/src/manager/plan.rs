//! Plans a strategy asks for after a push: folding the oldest turns into the rolling summary,
//! compressing history by age, trimming to the locked tail.

use super::ContextManager;
use super::evict::{UnitSpan, unit_end};
use super::summary::Target;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::header::flags;
use crate::level::Level;
use crate::ring::RingRef;
use crate::role::Role;
use crate::strategy::{Plan, Strategy};
use crate::summarize::{Detail, SummarySource};

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Live history units (both levels), oldest first by first id.
    fn history_units(&self) -> HistoryUnits<'_> {
        HistoryUnits { rings: [self.ring(Level::Working), self.ring(Level::Volatile)], at: [0, 0] }
    }

    /// Runs what the strategy asks for after a push, or, when the manager compacts
    /// ([`Config::compacts`](crate::config::Config::compacts)), nothing: the plan waits for
    /// the next compaction ([`run_deferred_plan`](Self::run_deferred_plan)), so summaries
    /// change only where the payload's prefix breaks anyway.
    pub(crate) fn run_plan(&mut self, plan: Plan) {
        if !self.config.compacts() {
            self.execute_plan(plan);
        }
    }

    /// At a compaction: asks the strategy for its plan now and runs it.
    pub(crate) fn run_deferred_plan(&mut self) {
        if !self.strategy.needs(&self.config).plans {
            return;
        }
        let plan = {
            let parts = self.parts();
            let env = parts.env();
            parts.strategy.after_push(&env)
        };
        self.execute_plan(plan);
    }

    fn execute_plan(&mut self, plan: Plan) {
        match plan {
            Plan::Nothing => {}
            Plan::FoldOldestTurns { turns } => self.fold_oldest_turns(turns),
            Plan::CompressByAge { history_age, session_age } => {
                self.compress_by_age(history_age, session_age)
            }
            Plan::TrimToTail => {
                let lock = self.lock();
                while let Some((level, unit)) = [Level::Volatile, Level::Working]
                    .into_iter()
                    .find_map(|level| self.oldest_evictable(level, &lock).map(|unit| (level, unit)))
                {
                    self.evict(level, unit);
                }
            }
        }
    }

    /// Folds the oldest `turns` user turns outside the locked tail into the rolling summary.
    #[inline(never)]
    pub(super) fn fold_oldest_turns(&mut self, turns: u16) {
        let lock = self.lock();
        let mut users = 0u16;
        let mut range = (u64::MAX, 0u64);
        for (level, span, first, last) in self.history_units() {
            let ring = self.ring(level);
            if lock.covers(&ring, level, span) {
                break;
            }
            if ring.get(span.start).is_some_and(|h| h.role == Role::User) {
                users += 1;
                if users > turns {
                    break;
                }
            }
            range = (range.0.min(first), range.1.max(last));
        }
        if range.0 > range.1 {
            return;
        }
        self.keep_session_in_budget();
        let rolling_at = self.rolling_index();
        let (written, ranges, newest) = {
            let mut parts = self.parts();
            let (previous, mut ranges) = parts.previous_summary(rolling_at);
            ranges.add(range);
            let source = SummarySource::new(parts.history(), range.0, range.1);
            let newest = source.clone().map(|m| m.timestamp()).max().unwrap_or(0);
            // A running memory: as many statements as `summary_tokens` holds.
            let budget = parts.budget(Detail::Paragraph);
            (parts.summarize(previous, source, Detail::Digest, budget), ranges.finish(), newest)
        };
        if let Ok(written) = written {
            let target = rolling_at.map_or(Target::Append, Target::Replace);
            self.store_summary(written, ranges.as_slice(), Detail::Digest, newest, true, target);
            self.keep_session_in_budget();
        }
        let in_range = |(_, _, first, last): &(Level, UnitSpan, u64, u64)| {
            *first >= range.0 && *last <= range.1
        };
        while let Some((level, span, _, _)) = self.history_units().find(in_range) {
            self.evict(level, span);
        }
    }

    /// Hierarchical: history units older than `history_age` become paragraph summaries;
    /// paragraph summaries older than `session_age` become one line.
    #[inline(never)]
    pub(super) fn compress_by_age(&mut self, history_age: u64, session_age: u64) {
        let now = self.state.now;
        let lock = self.lock();
        loop {
            let old = self.history_units().find(|&(level, span, _, _)| {
                let ring = self.ring(level);
                let newest = (span.start..span.end)
                    .filter_map(|i| ring.get(i))
                    .map(|h| h.timestamp)
                    .max()
                    .unwrap_or(0);
                newest.saturating_add(history_age) <= now && !lock.covers(&ring, level, span)
            });
            let Some((level, span, _, _)) = old else { break };
            self.summarize_unit(level, span, Detail::Paragraph, false);
            self.evict(level, span);
        }
        let mut index = 0;
        while let Some(header) = self.ring(Level::Session).get(index).copied() {
            let stale = header.timestamp.saturating_add(session_age) <= now;
            if header.is_live()
                && header.has(flags::SUMMARY)
                && header.detail < Detail::Line.code()
                && stale
            {
                let entries = self.ring(Level::Session).len();
                self.rewrite_summary(index, Detail::Line, None);
                if self.ring(Level::Session).len() < entries {
                    // Dropped: the next entry moved into this index.
                    continue;
                }
            }
            index += 1;
        }
    }
}

/// Live history units of both levels in order of their first id.
struct HistoryUnits<'a> {
    rings: [RingRef<'a>; 2],
    at: [usize; 2],
}

impl Iterator for HistoryUnits<'_> {
    type Item = (Level, UnitSpan, u64, u64);

    fn next(&mut self) -> Option<Self::Item> {
        let mut heads = [None::<(u64, UnitSpan)>; 2];
        for ((head, ring), at) in heads.iter_mut().zip(&self.rings).zip(&mut self.at) {
            while *at < ring.len() {
                let span = UnitSpan { start: *at, end: unit_end(ring, *at) };
                match ring.get(*at) {
                    Some(h) if h.is_live() => {
                        *head = Some((ring.id(h), span));
                        break;
                    }
                    _ => *at = span.end,
                }
            }
        }
        let pick = match heads {
            [Some(w), Some(v)] => usize::from(v.0 < w.0),
            [Some(_), None] => 0,
            [None, Some(_)] => 1,
            [None, None] => return None,
        };
        let (_, span) = heads.get(pick).copied().flatten()?;
        let ring = self.rings.get(pick)?;
        if let Some(at) = self.at.get_mut(pick) {
            *at = span.end;
        }
        let level = if pick == 0 { Level::Working } else { Level::Volatile };
        let first = ring.get(span.start).map_or(0, |h| ring.id(h));
        let last = ring.get(span.end.saturating_sub(1)).map_or(first, |h| ring.id(h));
        Some((level, span, first, last))
    }
}
