//! Summaries: what a leaving unit becomes, the rolling summary, rewriting a summary to less
//! detail, and merging summaries when the session level overflows.

use super::evict::{Lock, UnitSpan};
use super::{ContextManager, State};
use crate::capacity::{Capacities, ScratchStorage};
use crate::config::Config;
use crate::counter::TokenCounter;
use crate::header::{Header, flags};
use crate::level::Level;
use crate::record::{self, SpanWriter};
use crate::ring::{RingRef, RingStorage};
use crate::role::Role;
use crate::stats::bump;
use crate::strategy::{Env, Strategy, UnitView};
use crate::summarize::{Detail, SummarizeError, SummaryRequest, SummarySource, TextBuffer};
use crate::view::{History, LevelMessages};

/// Most source ranges one summary keeps; more are coalesced (over-approximating).
pub const MAX_SUMMARY_RANGES: usize = 16;
/// Evictable units whose value a strategy is asked for, per eviction.
pub(super) const VALUE_WINDOW: usize = 32;

/// Disjoint borrows of a manager's parts, so a strategy can be asked while reading the rings.
pub(super) struct Parts<'a, S> {
    pub(super) permanent: RingRef<'a>,
    pub(super) session: RingRef<'a>,
    pub(super) working: RingRef<'a>,
    pub(super) volatile: RingRef<'a>,
    pub(super) config: &'a Config,
    pub(super) state: &'a State,
    pub(super) counter: &'a dyn TokenCounter,
    pub(super) strategy: &'a mut S,
    pub(super) scratch: &'a mut [u8],
    #[cfg(feature = "tasks")]
    pub(super) tasks: &'a crate::task::Tasks,
}

impl<'a, S: Strategy> Parts<'a, S> {
    pub(super) fn ring(&self, level: Level) -> RingRef<'a> {
        match level {
            Level::Permanent => self.permanent,
            Level::Session => self.session,
            Level::Working => self.working,
            Level::Volatile => self.volatile,
        }
    }

    pub(super) fn history(&self) -> History<'a> {
        History::new(self.ring(Level::Working), self.ring(Level::Volatile))
    }

    pub(super) fn env(&self) -> Env<'a> {
        let env = Env::new(self.config, self.state.now, self.state.last_user_id, self.history());
        #[cfg(feature = "tasks")]
        let env = env.with_tasks(self.tasks);
        env
    }

    pub(super) fn unit(&self, level: Level, span: UnitSpan) -> Option<UnitView<'a>> {
        UnitView::new(level, LevelMessages::range(self.ring(level), level, span.start, span.end))
    }

    /// The text and source ranges of the session entry at `index` (the rolling summary a new
    /// one extends), or nothing.
    pub(super) fn previous_summary(&self, index: Option<usize>) -> (&'a str, Ranges) {
        let session = self.ring(Level::Session);
        let mut ranges = Ranges::new();
        let text = index.and_then(|i| session.get(i)).map_or("", |h| {
            record::SourceRanges::new(h, session.record(h)).for_each(|r| ranges.add(r));
            record::content(h, session.record(h))
        });
        (text, ranges)
    }

    /// The token budget of a new summary at `detail`: what the configuration allows within
    /// the session level's budget (as [`fit_budgets`](Config::fit_budgets) caps it to the
    /// window), less the message framing the stored summary will also cost.
    pub(super) fn budget(&self, detail: Detail) -> u32 {
        let level = self.config.level_budget(Level::Session);
        let cap = self.config.summary_tokens.min(level);
        let cap = match detail {
            Detail::Paragraph => cap,
            Detail::Line => cap.min(LINE_TOKENS),
            // Room for what comes next: a quarter of the level.
            Detail::Digest => level / 4 * 3,
        };
        cap.saturating_sub(u32::from(self.config.message_overhead))
    }

    /// Runs the summarizer into the scratch buffer within `budget` tokens; returns the bytes
    /// written.
    pub(super) fn summarize(
        &mut self,
        previous: &str,
        messages: SummarySource<'_>,
        detail: Detail,
        budget: u32,
    ) -> Result<usize, SummarizeError> {
        self.summarize_within(previous, messages, detail, budget, usize::MAX)
    }

    /// [`summarize`](Self::summarize) into at most `max_bytes` of the scratch buffer (the
    /// rest of the text is cut, as a full buffer cuts it).
    pub(super) fn summarize_within(
        &mut self,
        previous: &str,
        messages: SummarySource<'_>,
        detail: Detail,
        budget: u32,
        max_bytes: usize,
    ) -> Result<usize, SummarizeError> {
        if budget < MIN_SUMMARY_TOKENS {
            return Err(SummarizeError::Rejected);
        }
        let end = max_bytes.min(self.scratch.len());
        let mut out = TextBuffer::new(self.scratch.get_mut(..end).unwrap_or_default());
        let request = SummaryRequest { previous, messages, budget, detail, counter: self.counter };
        self.strategy.summarizer().summarize(&request, &mut out)?;
        if out.is_empty() { Err(SummarizeError::Rejected) } else { Ok(out.len()) }
    }
}

/// Smallest budget worth asking a summarizer for.
pub(super) const MIN_SUMMARY_TOKENS: u32 = 8;

/// Tokens of a one-line summary.
pub(super) const LINE_TOKENS: u32 = 40;

/// Sorted, coalesced source ranges, at most [`MAX_SUMMARY_RANGES`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ranges {
    items: [(u64, u64); MAX_SUMMARY_RANGES + 1],
    len: usize,
}

impl Ranges {
    pub(crate) fn new() -> Self {
        Ranges { items: [(0, 0); MAX_SUMMARY_RANGES + 1], len: 0 }
    }

    pub(crate) fn add(&mut self, (first, last): (u64, u64)) {
        if first > last {
            return;
        }
        if self.len == self.items.len() {
            self.squeeze(self.items.len() - 1);
        }
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = (first, last);
            self.len += 1;
        }
        let live = self.items.get_mut(..self.len).unwrap_or_default();
        crate::small::sort_by_key(live, |range| *range);
        // Coalesce overlapping or adjacent ranges in place.
        let mut kept = 0usize;
        for i in 0..self.len {
            let current = self.items.get(i).copied().unwrap_or_default();
            match kept.checked_sub(1).and_then(|k| self.items.get_mut(k)) {
                Some(previous) if current.0 <= previous.1.saturating_add(1) => {
                    previous.1 = previous.1.max(current.1)
                }
                _ => {
                    if let Some(slot) = self.items.get_mut(kept) {
                        *slot = current;
                    }
                    kept += 1;
                }
            }
        }
        self.len = kept;
    }

    /// Joins the closest neighbours until at most `max` ranges remain.
    pub(super) fn squeeze(&mut self, max: usize) {
        while self.len > max.max(1) {
            let live = self.items.get(..self.len).unwrap_or_default();
            let closest = (1..live.len()).min_by_key(|&i| {
                live.get(i)
                    .map_or(u64::MAX, |r| r.0)
                    .saturating_sub(live.get(i - 1).map_or(0, |r| r.1))
            });
            let Some(i) = closest else { break };
            let right = self.items.get(i).copied().unwrap_or_default();
            if let Some(left) = self.items.get_mut(i - 1) {
                left.1 = left.1.max(right.1);
            }
            for at in i..self.len - 1 {
                if let Some(next) = self.items.get(at + 1).copied() {
                    if let Some(slot) = self.items.get_mut(at) {
                        *slot = next;
                    }
                }
            }
            self.len -= 1;
        }
    }

    pub(crate) fn finish(mut self) -> Self {
        self.squeeze(MAX_SUMMARY_RANGES);
        self
    }

    pub(crate) fn as_slice(&self) -> &[(u64, u64)] {
        self.items.get(..self.len).unwrap_or_default()
    }
}

/// Where a new summary goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// A new session entry.
    Append,
    /// In place of the session entry at this index (keeping its order).
    Replace(usize),
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    pub(super) fn parts(&mut self) -> Parts<'_, S> {
        Parts {
            permanent: self.permanent.view(),
            session: self.session.view(),
            working: self.working.view(),
            volatile: self.volatile.view(),
            config: &self.config,
            state: &self.state,
            counter: &self.counter,
            strategy: &mut self.strategy,
            scratch: self.scratch.bytes_mut(),
            #[cfg(feature = "tasks")]
            tasks: &self.tasks,
        }
    }

    /// Index in the session ring of the rolling summary, if there is one.
    pub(super) fn rolling_index(&self) -> Option<usize> {
        let ring = self.ring(Level::Session);
        (0..ring.len())
            .rev()
            .find(|&i| ring.get(i).is_some_and(|h| h.is_live() && h.has(flags::ROLLING)))
    }

    /// Summarizes one unit into the session level (a summary of its own, or folded into the
    /// rolling summary); on failure the unit just leaves.
    #[inline(never)]
    pub(super) fn summarize_unit(
        &mut self,
        level: Level,
        unit: UnitSpan,
        detail: Detail,
        rolling: bool,
    ) {
        self.keep_session_in_budget();
        let rolling_at = if rolling { self.rolling_index() } else { None };
        let (written, ids, newest, ranges) = {
            let mut parts = self.parts();
            let Some(view) = parts.unit(level, unit) else { return };
            let ids = view.ids();
            let (previous, mut ranges) = parts.previous_summary(rolling_at);
            ranges.add(ids);
            let source = SummarySource::unit(view.messages(), ids.0, ids.1);
            let budget = parts.budget(detail);
            (
                parts.summarize(previous, source, detail, budget),
                ids,
                view.newest_timestamp(),
                ranges.finish(),
            )
        };
        let written = match written {
            Ok(written) => written,
            Err(SummarizeError::NothingToKeep) => return,
            Err(_) => {
                bump(&mut self.state.counters.summaries_failed, 1);
                return;
            }
        };
        let _ = ids;
        let target = rolling_at.map_or(Target::Append, Target::Replace);
        self.store_summary(written, ranges.as_slice(), detail, newest, rolling, target);
        self.keep_session_in_budget();
    }

    /// Merges the session level into a digest when it is over its budget (tokens, bytes or
    /// entries), so a new summary finds room without pushing an old one out.
    pub(super) fn keep_session_in_budget(&mut self) {
        self.fit_session(u32::MAX);
    }

    /// Stores the summary in the scratch buffer's first `len` bytes into the session level.
    #[inline(never)]
    pub(super) fn store_summary(
        &mut self,
        len: usize,
        ranges: &[(u64, u64)],
        detail: Detail,
        timestamp: u64,
        rolling: bool,
        target: Target,
    ) {
        let text = core::str::from_utf8(self.scratch.bytes().get(..len).unwrap_or_default())
            .unwrap_or_default();
        let tokens = self.framed_tokens(self.counter.count(text), [], None);
        let total = len + ranges.len() * record::RANGE_ENTRY;
        let header = Header {
            timestamp,
            role: Role::System,
            flags: flags::SUMMARY | flags::SYNTHETIC | if rolling { flags::ROLLING } else { 0 },
            items: ranges.len() as u8,
            detail: detail.code(),
            content_len: len as u32,
            tokens,
            ..Header::EMPTY
        };
        let write = |span: &mut [u8], text: &[u8]| {
            let mut out = SpanWriter::new(span);
            out.put(text);
            ranges.iter().for_each(|&(a, b)| out.put_range(a, b));
        };
        if let Some(old) = match target {
            Target::Replace(index) => self.ring(Level::Session).get(index).copied(),
            Target::Append => None,
        } {
            let index = match target {
                Target::Replace(index) => index,
                Target::Append => 0,
            };
            let replaced = {
                let scratch = self.scratch.bytes().get(..len).unwrap_or_default();
                let mut ring = self.session.view_mut();
                let done = ring.replace(index, total, |span| write(span, scratch)).is_some();
                if done {
                    ring.get_mut(index).map(|stored| {
                        *stored =
                            Header { id: old.id, start: stored.start, len: stored.len, ..header };
                        *stored
                    })
                } else {
                    // No room to grow in place: the old one goes, the new one is appended.
                    ring.retain(|h| h.id != old.id);
                    None
                }
            };
            self.remove_live(Level::Session, &old);
            let counters = &mut self.state.counters;
            bump(&mut counters.summaries_replaced, 1);
            if let Some(stored) = replaced {
                self.add_live(Level::Session, &stored);
                self.note_summary();
                return;
            }
        }
        if self.make_room(Level::Session, total, 1).is_err() {
            bump(&mut self.state.counters.summaries_failed, 1);
            return;
        }
        let Ok(id) = self.next_header_id() else { return };
        let scratch = self.scratch.bytes().get(..len).unwrap_or_default();
        let header = Header { id, ..header };
        if self.session.view_mut().push_back(header, total, |span| write(span, scratch)).is_some() {
            self.state.issue_id();
            self.add_live(Level::Session, &Header { len: total as u32, ..header });
            self.note_summary();
        }
    }

    pub(super) fn note_summary(&mut self) {
        let counters = &mut self.state.counters;
        bump(&mut counters.messages_pushed, 1);
        bump(&mut counters.summaries_added, 1);
        counters.last_compression_turn = Some(self.state.turn);
    }

    /// Rewrites the session summary at `index` at `detail` within `budget` tokens (the
    /// default budget for `detail` when `None`), in place. Returns whether it was rewritten.
    #[inline(never)]
    pub(super) fn rewrite_summary(
        &mut self,
        index: usize,
        detail: Detail,
        budget: Option<u32>,
    ) -> bool {
        let (written, ranges, header) = {
            let mut parts = self.parts();
            let session = parts.ring(Level::Session);
            let Some(header) = session.get(index).copied() else { return false };
            let mut ranges = Ranges::new();
            record::SourceRanges::new(&header, session.record(&header)).for_each(|r| ranges.add(r));
            let text = record::content(&header, session.record(&header));
            let budget = budget.unwrap_or_else(|| parts.budget(detail));
            (parts.summarize(text, SummarySource::empty(), detail, budget), ranges.finish(), header)
        };
        let written = match written {
            Ok(written) => written,
            Err(SummarizeError::NothingToKeep) => {
                // Nothing in it is worth a line: the messages it stood for are in the outbox.
                self.session.view_mut().retain(|h| h.id != header.id);
                self.remove_live(Level::Session, &header);
                let counters = &mut self.state.counters;
                bump(&mut counters.summaries_replaced, 1);
                return true;
            }
            Err(_) => return false,
        };
        let rolling = header.has(flags::ROLLING);
        self.store_summary(
            written,
            ranges.as_slice(),
            detail,
            header.timestamp,
            rolling,
            Target::Replace(index),
        );
        true
    }

    /// Brings the session level within its budget and within `room` tokens (what the payload
    /// leaves it), and under its ring's byte and entry marks: first every entry is merged
    /// into one [digest](Detail::Digest), a summary of the summaries standing for all their
    /// sources, within three quarters of the level (room for what comes next) or `room`;
    /// then, if the summarizer declined or that is still too much, the oldest entries leave
    /// through the outbox (the caller archives them) until the rest fits. One summarizer call
    /// and one pass over the ring: bounded by its capacity.
    #[inline(never)]
    pub(crate) fn fit_session(&mut self, room: u32) {
        let limit = self.config.level_budget(Level::Session).min(room);
        if !self.session_over(limit) {
            return;
        }
        self.merge_session(limit);
        // Locks nothing (and the session level is never locked).
        let lock = Lock { from_id: u64::MAX, user_id: None, pending: None };
        while self.session_over(limit) {
            let Some(entry) = self.oldest_evictable(Level::Session, &lock) else { break };
            self.evict(Level::Session, entry);
        }
    }

    /// Whether the session level holds more than `limit` tokens, or passes its ring's byte or
    /// entry mark.
    fn session_over(&self, limit: u32) -> bool {
        self.level_tokens(Level::Session) > limit || self.level_over(Level::Session)
    }

    /// [`fit_session`](Self::fit_session)'s merge: the summarizer first (a small frame), then
    /// the merged summary replaces the entries ([`replace_session`](Self::replace_session), out
    /// of line with its range table). When the summarizer declines, nothing changes here (the
    /// caller then lets the oldest entries go), so a strategy that never summarizes pays only
    /// for that.
    fn merge_session(&mut self, limit: u32) {
        let written = {
            let mut parts = self.parts();
            let session = parts.ring(Level::Session);
            let overhead = u32::from(parts.config.message_overhead);
            let budget = parts.budget(Detail::Digest).min(limit.saturating_sub(overhead));
            let source =
                SummarySource::unit(LevelMessages::new(session, Level::Session), 0, u64::MAX);
            // The budget is in tokens; a ring smaller than it binds in bytes: the digest takes
            // at most half the arena (with its range table), or storing it fails and the
            // entries it replaces are lost.
            let bytes = (session.arena_capacity() / 2)
                .saturating_sub(MAX_SUMMARY_RANGES * record::RANGE_ENTRY);
            parts.summarize_within("", source, Detail::Digest, budget, bytes)
        };
        if let Ok(written) = written {
            self.replace_session(written);
        }
    }

    /// Replaces the session level's live entries with the merged summary of `written` bytes
    /// waiting in the scratch: summaries merged in are superseded, entries the caller pushed
    /// leave through the outbox; the new summary stands for all their sources.
    #[inline(never)]
    fn replace_session(&mut self, written: usize) {
        let mut ranges = Ranges::new();
        let (mut newest, mut rolling) = (0u64, false);
        {
            let session = self.ring(Level::Session);
            for header in session.iter().filter(|h| h.is_live()) {
                if header.has(flags::SUMMARY) {
                    record::SourceRanges::new(header, session.record(header))
                        .for_each(|r| ranges.add(r));
                } else {
                    ranges.add((session.id(header), session.id(header)));
                }
                newest = newest.max(header.timestamp);
                rolling |= header.has(flags::ROLLING);
            }
        }
        let ranges = ranges.finish();
        let mut index = 0;
        while let Some(header) = self.ring(Level::Session).get(index).copied() {
            if !header.is_live() {
                index += 1;
            } else if header.has(flags::SUMMARY) {
                self.session.view_mut().retain(|h| h.id != header.id);
                self.remove_live(Level::Session, &header);
                let counters = &mut self.state.counters;
                bump(&mut counters.summaries_replaced, 1);
            } else {
                self.evict(Level::Session, UnitSpan { start: index, end: index + 1 });
                index += 1;
            }
        }
        self.store_summary(
            written,
            ranges.as_slice(),
            Detail::Digest,
            newest,
            rolling,
            Target::Append,
        );
        bump(&mut self.state.counters.summaries_merged, 1);
    }
}

#[cfg(test)]
impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// The working unit starting at logical index `start`, and the strategy environment.
    pub(crate) fn unit_and_env(&self, start: usize) -> Option<(UnitView<'_>, Env<'_>)> {
        let ring = self.ring(Level::Working);
        let span = UnitSpan { start, end: super::evict::unit_end(&ring, start) };
        let unit = UnitView::new(
            Level::Working,
            LevelMessages::range(ring, Level::Working, span.start, span.end),
        )?;
        let env = Env::new(&self.config, self.state.now, self.state.last_user_id, self.history());
        #[cfg(feature = "tasks")]
        let env = env.with_tasks(&self.tasks);
        Some((unit, env))
    }
}
