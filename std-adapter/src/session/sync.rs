//! Keeping the archive in step with the core after each operation: the records the core wrote
//! itself and the summaries it made or changed go into the journal, the journal is written,
//! and only then are evicted units released from the core's outbox.

use std::collections::{BTreeMap, BTreeSet};

use ctxwin_core::{Level, MessageRef, Role};
use serde::{Deserialize, Serialize};

use super::convert::row_from_ref;
use super::{Session, SessionError};
use crate::store::SummaryRecord;

/// What the session knows about the core's ids, kept in checkpoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tracker {
    /// The core's next id as of the last operation the session saw through (kept in
    /// checkpoints; `ContextManager::next_id` is the live value).
    pub next_id: u64,
    /// Summaries recorded in the archive, by id.
    pub summaries: BTreeMap<u64, SummaryMark>,
    /// Ids of tool definitions (never archived, left out of summary sources).
    pub tool_definitions: BTreeSet<u64>,
}

impl Tracker {
    pub(crate) fn new() -> Self {
        Self { next_id: 1, summaries: BTreeMap::new(), tool_definitions: BTreeSet::new() }
    }
}

/// A recorded summary: what it looked like, so a change is noticed, and what it stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SummaryMark {
    pub fingerprint: u64,
    pub ranges: Vec<(u64, u64)>,
    pub tokens_before: u32,
}

/// Units released from the core's outbox after the archive took them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Drained {
    /// First message id of each unit.
    pub units: Vec<u64>,
    pub messages: usize,
}

/// What [`Session::after_op`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AfterOp {
    pub summaries: Vec<u64>,
    pub drained: Drained,
}

impl Session {
    /// Brings the archive up to date after a core operation: journals the history records
    /// the core wrote itself since id `since` (results of aborted calls; ids `known` are the
    /// caller's own, journaled already) and new or changed summaries, writes the journal,
    /// then releases the outbox's units.
    ///
    /// Nothing is released while the journal holds a row: a failed write returns before the
    /// drain, and the next operation writes the journal first.
    pub(super) fn after_op(
        &mut self,
        since: u64,
        known: &dyn Fn(u64) -> bool,
    ) -> Result<AfterOp, SessionError> {
        self.journal_new_records(since, known);
        let summaries = self.journal_summaries();
        self.commit()?;
        // Sources are written by now: jobs read them from the archive.
        #[cfg(feature = "http")]
        self.schedule_llm_summaries(&summaries);
        let drained = self.drain_outbox();
        self.prune_summary_marks();
        Ok(AfterOp { summaries, drained })
    }

    /// Writes what the journal holds to the archive (nothing without one).
    pub(super) fn commit(&mut self) -> Result<(), SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else {
            self.journal = super::Journal::default();
            return Ok(());
        };
        let rows = self.journal.commit(archive)?;
        self.counters.archive_rows_written += rows as u64;
        Ok(())
    }

    /// Writes the journal, then waits until the archive holds everything durably (a
    /// [`Deferred`](crate::store::Deferred) or [`Batched`](crate::store::Batched) archive
    /// writes what it queued or held). When this returns `Ok`, every row the session wrote so
    /// far is in the archive, as its reads see it.
    ///
    /// # Errors
    /// The archive's: the rows stay in the journal (or the wrapper's queue) and are written
    /// by the next call.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{ArchiveStore, Deferred, MemoryStore};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(Deferred::spawn(MemoryStore::new())?);
    /// let mut session = SessionBuilder::new("s").archive_store(store.clone()).build()?;
    /// session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
    /// session.sync_archive()?;
    /// assert_eq!(store.inner().usage(session.scope())?.messages, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sync_archive(&mut self) -> Result<(), SessionError> {
        self.commit()?;
        if let Some(archive) = self.stores.archive.as_deref() {
            archive.flush(&self.scope)?;
        }
        Ok(())
    }

    /// The stored record `id`, live or waiting in the outbox.
    pub(super) fn find_record(&self, id: u64) -> Option<MessageRef<'_>> {
        self.manager.get(id).or_else(|| {
            self.manager
                .outbox()
                .flat_map(|unit| unit.messages().collect::<Vec<_>>())
                .find(|m| m.id() == id)
        })
    }

    /// The assistant message whose calls wait for results: the newest non-tool history message
    /// (a newer one would have closed the calls).
    pub(super) fn pending_head(&self) -> Option<MessageRef<'_>> {
        if self.manager.unanswered_calls() == 0 {
            return None;
        }
        self.manager.history().rev().find(|m| m.role() != Role::Tool)
    }

    /// Moves the id tracker past `id`.
    pub(super) fn saw_id(&mut self, id: u64) {
        self.tracker.next_id = self.tracker.next_id.max(id.saturating_add(1));
    }

    /// Journals the history records the core wrote since id `since` that are not `known`
    /// (the caller's own), each in its unit.
    fn journal_new_records(&mut self, since: u64, known: &dyn Fn(u64) -> bool) {
        let mut newest = 0u64;
        let mut rows = Vec::new();
        for level in Level::ALL {
            // Newest first: a tool record's unit head is the next non-tool record met.
            let mut waiting: Vec<MessageRef<'_>> = Vec::new();
            for message in self.manager.messages(level).rev() {
                newest = newest.max(message.id());
                if message.id() < since && waiting.is_empty() {
                    break;
                }
                let fresh = message.id() >= since && level.is_history() && !known(message.id());
                if message.role() == Role::Tool {
                    if fresh {
                        waiting.push(message);
                    }
                    continue;
                }
                rows.extend(waiting.drain(..).map(|result| row_from_ref(&result, message.id())));
                if fresh {
                    rows.push(row_from_ref(&message, message.id()));
                }
                if message.id() < since {
                    break;
                }
            }
            if !waiting.is_empty() {
                tracing::warn!(level = %level, "session: tool records without their call");
            }
        }
        for unit in self.manager.outbox() {
            newest = unit.messages().fold(newest, |max, m| max.max(m.id()));
            // What the core wrote in this operation and evicted in the same one (a synthetic
            // result closing an unanswered call, say) is in no level any more: journal it
            // from the outbox, before the drain can release it. Summaries are recorded apart.
            let fresh = unit.messages().filter(|m| {
                m.id() >= since && !known(m.id()) && !m.is_summary() && m.level().is_history()
            });
            rows.extend(fresh.map(|m| row_from_ref(&m, unit.first_id())));
        }
        self.saw_id(newest);
        if !rows.is_empty() {
            tracing::debug!(records = rows.len(), "session: journaling records the core wrote");
        }
        if self.stores.archive.is_some() {
            self.journal.add_rows(&self.scope, self.stores.lease.fence, rows);
        }
    }

    /// Journals every summary (live, or evicted and waiting) that is new or changed since it
    /// was last recorded. Returns their ids.
    pub(super) fn journal_summaries(&mut self) -> Vec<u64> {
        if self.stores.archive.is_none() {
            return Vec::new();
        }
        let records = self.fresh_summaries();
        let mut recorded = Vec::with_capacity(records.len());
        for (record, mark) in records {
            tracing::debug!(
                id = record.id,
                sources = record.source_ids.len(),
                "session: summary journaled"
            );
            self.counters.summaries_recorded += 1;
            self.tracker.summaries.insert(record.id, mark);
            recorded.push(record.id);
            self.journal.add_summary(&self.scope, self.stores.lease.fence, record);
        }
        recorded
    }

    /// Notes every new or changed summary as recorded without writing it: a replay made it
    /// again, and the archive holds the writer's.
    pub(super) fn mark_summaries_recorded(&mut self) {
        for (record, mark) in self.fresh_summaries() {
            self.tracker.summaries.insert(record.id, mark);
        }
    }

    /// Every summary (live, or evicted and waiting) that is new or changed since it was last
    /// recorded, as a record, with its mark.
    fn fresh_summaries(&self) -> Vec<(SummaryRecord, SummaryMark)> {
        let evicted = self
            .manager
            .outbox()
            .filter(|unit| unit.level() == Level::Session)
            .flat_map(|unit| unit.messages().collect::<Vec<_>>());
        let mut records = Vec::new();
        for summary in self.manager.session().chain(evicted).filter(MessageRef::is_summary) {
            let ranges: Vec<(u64, u64)> = summary.summary_sources().collect();
            let fingerprint = fingerprint(summary.content(), &ranges, summary.detail());
            let mark = self.tracker.summaries.get(&summary.id());
            if mark.is_some_and(|mark| mark.fingerprint == fingerprint) {
                continue;
            }
            let tokens_before = self.source_tokens(&ranges);
            let mut record = SummaryRecord::new(
                summary.id(),
                1,
                summary.content(),
                source_ids(&ranges, &self.tracker.tool_definitions),
            );
            record.created_at = summary.timestamp();
            record.tokens_before = tokens_before;
            record.tokens_after = summary.tokens();
            records.push((record, SummaryMark { fingerprint, ranges, tokens_before }));
        }
        records
    }

    /// Tokens of what the summary over `ranges` stands for, as far as the session saw it:
    /// earlier summaries it absorbed, plus the messages still in the core.
    fn source_tokens(&self, ranges: &[(u64, u64)]) -> u32 {
        let mut marks: Vec<&SummaryMark> = self
            .tracker
            .summaries
            .values()
            .filter(|mark| !mark.ranges.is_empty() && within(&mark.ranges, ranges))
            .collect();
        marks.sort_by_key(|mark| std::cmp::Reverse(span(&mark.ranges)));
        let mut covered: Vec<(u64, u64)> = Vec::new();
        let mut total = 0u32;
        for mark in marks {
            if !mark.ranges.iter().any(|&r| overlaps(&covered, r)) {
                total = total.saturating_add(mark.tokens_before);
                covered.extend_from_slice(&mark.ranges);
            }
        }
        let evicted = self.manager.outbox().flat_map(|unit| unit.messages().collect::<Vec<_>>());
        for message in self.manager.history().chain(evicted) {
            let id = message.id();
            if !message.is_summary() && contains(ranges, id) && !contains(&covered, id) {
                total = total.saturating_add(message.original_tokens());
            }
        }
        total
    }

    /// Releases the outbox's units from the core: every message in them was journaled when
    /// the core took it (or, restored from a checkpoint, is in the archive the checkpoint is
    /// bound to), and the journal is written.
    pub(super) fn drain_outbox(&mut self) -> Drained {
        let mut drained = Drained::default();
        for unit in self.manager.outbox() {
            drained.units.push(unit.first_id());
            drained.messages += unit.len();
        }
        if drained.units.is_empty() {
            return drained;
        }
        let released = self.manager.drain_outbox(&mut |_| {});
        self.counters.units_archived += released as u64;
        tracing::debug!(units = released, messages = drained.messages, "session: outbox drained");
        drained
    }

    /// Forgets recorded summaries the core no longer holds (after the outbox was drained).
    pub(super) fn prune_summary_marks(&mut self) {
        let live: BTreeSet<u64> = self.manager.session().map(|m| m.id()).collect();
        self.tracker.summaries.retain(|id, _| live.contains(id));
    }
}

/// Every id in `ranges` except tool definitions'.
fn source_ids(ranges: &[(u64, u64)], tool_definitions: &BTreeSet<u64>) -> Vec<u64> {
    ranges
        .iter()
        .flat_map(|&(first, last)| first..=last)
        .filter(|id| !tool_definitions.contains(id))
        .collect()
}

pub(super) fn contains(ranges: &[(u64, u64)], id: u64) -> bool {
    ranges.iter().any(|&(first, last)| (first..=last).contains(&id))
}

pub(super) fn overlaps(ranges: &[(u64, u64)], (first, last): (u64, u64)) -> bool {
    ranges.iter().any(|&(a, b)| a <= last && first <= b)
}

/// Whether every range of `inner` lies inside one of `outer`.
pub(super) fn within(inner: &[(u64, u64)], outer: &[(u64, u64)]) -> bool {
    inner.iter().all(|&(first, last)| outer.iter().any(|&(a, b)| a <= first && last <= b))
}

pub(super) fn span(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|&(first, last)| last.saturating_sub(first).saturating_add(1)).sum()
}

/// FNV-1a over a summary's text, source ranges and detail: stable across builds, unlike
/// `DefaultHasher`, because it is kept in checkpoints.
pub(super) fn fingerprint(text: &str, ranges: &[(u64, u64)], detail: u8) -> u64 {
    let range_bytes =
        ranges.iter().flat_map(|&(a, b)| a.to_le_bytes().into_iter().chain(b.to_le_bytes()));
    text.bytes()
        .chain([0xff, detail])
        .chain(range_bytes)
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ids_skip_tool_definitions() {
        let tools = BTreeSet::from([3]);
        assert_eq!(source_ids(&[(1, 4), (9, 9)], &tools), [1, 2, 4, 9]);
    }

    #[test]
    fn range_helpers() {
        assert!(within(&[(2, 3), (7, 7)], &[(1, 4), (6, 9)]));
        assert!(!within(&[(2, 5)], &[(1, 4), (5, 9)]));
        assert!(overlaps(&[(1, 4)], (4, 8)));
        assert!(!overlaps(&[(1, 4)], (5, 8)));
        assert_eq!(span(&[(1, 4), (9, 9)]), 5);
    }

    #[test]
    fn fingerprints_see_text_ranges_and_detail() {
        let base = fingerprint("summary", &[(1, 4)], 1);
        assert_eq!(base, fingerprint("summary", &[(1, 4)], 1));
        assert_ne!(base, fingerprint("summary!", &[(1, 4)], 1));
        assert_ne!(base, fingerprint("summary", &[(1, 5)], 1));
        assert_ne!(base, fingerprint("summary", &[(1, 4)], 2));
    }
}
