//! Reducing old tool results at a compaction
//! ([`Config::compaction_limit`](crate::config::Config::compaction_limit)): results stored whole
//! while there was room are cut to head and tail, oldest first, before whole units leave, so
//! that a compaction keeps more turns. The live request, the locked tail and results pushed
//! [`whole`](crate::message::Message::whole) are never cut.
//!
//! A result a newer live result [supersedes](crate::message::Message::supersede_key) (the
//! same file read again, say) is cut to [`SUPERSEDED_NOTE`] at every compaction, whatever the
//! limit: the newer one shows the same thing as it is now, and the compaction rewrites the
//! cached prefix anyway.
//!
//! A record is rewritten in its own span (head, marker, tail, call id, trailer: never longer
//! than before), so the cut needs no scratch buffer and moves no other record.

use core::ops::ControlFlow;

use super::ContextManager;
use super::evict::{UnitSpan, unit_end};
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::header::{Header, flags};
use crate::level::Level;
use crate::record::{self, SpanWriter, Trailer};
use crate::reduce;
use crate::ring::{move_left, move_right};
use crate::role::Role;
use crate::stats::bump;
use crate::strategy::Strategy;

/// Longest omission marker: `\n[Data Truncated]\n... (N lines omitted) ...\n`.
const MARKER_MAX: usize = 64;

/// What a superseded result is cut to.
pub const SUPERSEDED_NOTE: &str =
    "[Superseded] A newer result of the same call follows; this older one was cut.";

/// Supersede keys a compaction tracks (the oldest seen first); results of further keys stay.
#[cfg(feature = "compaction-cut")]
const KEYS_TRACKED: usize = 64;

/// The newest live result's id of each supersede key seen, up to [`KEYS_TRACKED`] keys.
#[cfg(feature = "compaction-cut")]
pub(super) struct NewestByKey {
    entries: [(u32, u64); KEYS_TRACKED],
    len: usize,
    /// Whether some key has more than one live result.
    repeated: bool,
}

#[cfg(feature = "compaction-cut")]
impl NewestByKey {
    /// Whether result `id` of `key` is the newest live one of its key (false for a key not
    /// tracked).
    pub(super) fn is_newest(&self, key: u32, id: u64) -> bool {
        self.entries.iter().take(self.len).any(|&(k, newest)| k == key && newest == id)
    }

    /// Whether no key was seen.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn note(&mut self, key: u32, id: u64) {
        let len = self.len;
        if let Some(entry) = self.entries.iter_mut().take(len).find(|(k, _)| *k == key) {
            entry.1 = entry.1.max(id);
            self.repeated = true;
        } else if let Some(entry) = self.entries.get_mut(len) {
            *entry = (key, id);
            self.len += 1;
        }
    }

    fn supersedes(&self, key: u32, id: u64) -> bool {
        self.entries.iter().take(self.len).any(|&(k, newest)| k == key && newest > id)
    }
}

/// Where a cut record's pieces go: the head's length, the marker, where the tail starts.
struct Cut {
    head: usize,
    marker: [u8; MARKER_MAX],
    marker_len: usize,
    tail: usize,
    tokens: u32,
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Cuts old tool results to [`Config::compaction_limit`](crate::config::Config) tokens,
    /// volatile before working, oldest first, until usage is at most `low`. O(`B`) per level:
    /// each record is read once and rewritten in place.
    pub(super) fn cut_old_results(&mut self, low: u32) {
        let limit = self.config.compaction_limit;
        if limit == 0 || self.used() <= low {
            return;
        }
        self.each_unlocked_record(|manager, level, index| {
            if manager.used() <= low {
                return ControlFlow::Break(());
            }
            manager.cut_result(level, index, limit);
            ControlFlow::Continue(())
        });
    }

    /// Calls `cut` on every record of the history levels outside the lock, volatile before
    /// working, oldest first, until it breaks. A cut rewrites a record in its own span, so
    /// the indices hold.
    fn each_unlocked_record(
        &mut self,
        mut cut: impl FnMut(&mut Self, Level, usize) -> ControlFlow<()>,
    ) {
        let lock = self.lock();
        for level in [Level::Volatile, Level::Working] {
            let mut start = 0;
            loop {
                let ring = self.ring(level);
                if start >= ring.len() {
                    break;
                }
                let end = unit_end(&ring, start);
                if !lock.covers(&ring, level, UnitSpan { start, end }) {
                    for index in start..end {
                        if cut(self, level, index).is_break() {
                            return;
                        }
                    }
                }
                start = end;
            }
        }
    }

    /// Cuts every live result outside the lock that a newer live result of the same
    /// supersede key follows to [`SUPERSEDED_NOTE`]. O(`B` × [`KEYS_TRACKED`]).
    #[cfg(feature = "compaction-cut")]
    pub(super) fn cut_superseded(&mut self) {
        let newest = self.newest_by_key();
        if !newest.repeated {
            return;
        }
        self.each_unlocked_record(|manager, level, index| {
            manager.cut_if_superseded(level, index, &newest);
            ControlFlow::Continue(())
        });
    }

    /// The newest live result of each supersede key. O(`B`).
    #[cfg(feature = "compaction-cut")]
    pub(super) fn newest_by_key(&self) -> NewestByKey {
        let mut newest = NewestByKey { entries: [(0, 0); KEYS_TRACKED], len: 0, repeated: false };
        for level in [Level::Volatile, Level::Working] {
            let ring = self.ring(level);
            for header in ring.iter().filter(|h| h.role == Role::Tool && h.is_live()) {
                let key = Trailer::of(header, ring.record(header)).key;
                if key != 0 {
                    newest.note(key, ring.id(header));
                }
            }
        }
        newest
    }

    /// Cuts the tool result at `index` of `level` to [`SUPERSEDED_NOTE`] when `newest` says
    /// a newer one has its key and the note is shorter.
    #[cfg(feature = "compaction-cut")]
    fn cut_if_superseded(&mut self, level: Level, index: usize, newest: &NewestByKey) {
        let ring = self.ring(level);
        let Some(header) = ring.get(index).copied() else { return };
        if header.role != Role::Tool || !header.is_live() {
            return;
        }
        let bytes = ring.record(&header);
        let trailer = Trailer::of(&header, bytes);
        if trailer.key == 0 || !newest.supersedes(trailer.key, ring.id(&header)) {
            return;
        }
        let content_len = record::content(&header, bytes).len();
        let call_id = record::tail_text(&header, bytes);
        let call_id_len = call_id.len();
        let tokens = self.framed_tokens(self.counter.count(SUPERSEDED_NOTE), [], Some(call_id));
        let original = trailer.original.unwrap_or(header.tokens);
        let trailer = Trailer { original: Some(original), key: 0, ..trailer };
        let note = SUPERSEDED_NOTE.as_bytes();
        let trailer_at = note.len() + call_id_len;
        let new_len = trailer_at + trailer.len();
        if new_len >= header.len as usize || tokens >= header.tokens {
            return;
        }
        let mut ring = self.ring_mut(level);
        let Some(span) = ring.record_mut(index) else { return };
        // The call id first: the note may be longer than what it replaces.
        if note.len() < content_len {
            move_left(span, content_len, call_id_len, note.len());
        } else {
            move_right(span, content_len, call_id_len, note.len());
        }
        let Some(note_at) = span.get_mut(..note.len()) else { return };
        note_at.iter_mut().zip(note).for_each(|(byte, from)| *byte = *from);
        let Some(trailer_span) = span.get_mut(trailer_at..new_len) else { return };
        trailer.write(&mut SpanWriter::new(trailer_span));
        if ring.truncate_record(index, new_len as u32).is_none() {
            return;
        }
        self.store_cut(level, index, &header, (note.len(), tokens), trailer.flag());
    }

    /// Records that the result `before` at `index` of `level` now has `content_len` bytes of
    /// `tokens` (flagged reduced, and `trailer_flag`), in its header, the live totals and the
    /// counters.
    fn store_cut(
        &mut self,
        level: Level,
        index: usize,
        before: &Header,
        (content_len, tokens): (usize, u32),
        trailer_flag: u8,
    ) {
        let mut ring = self.ring_mut(level);
        let Some(stored) = ring.get_mut(index) else { return };
        stored.content_len = content_len as u32;
        stored.tokens = tokens;
        stored.flags |= flags::REDUCED | trailer_flag;
        let after: Header = *stored;
        self.remove_live(level, before);
        self.add_live(level, &after);
        let counters = &mut self.state.counters;
        counters.last_compression_turn = Some(self.state.turn);
        bump(&mut counters.observations_reduced, 1);
        bump(&mut counters.tokens_saved_by_reduction, u64::from(before.tokens - tokens));
    }

    /// Cuts the tool result at `index` of `level` to `limit` tokens when it is live, costs
    /// more, was neither reduced nor pushed whole, and the cut is shorter.
    fn cut_result(&mut self, level: Level, index: usize, limit: u32) {
        let ring = self.ring(level);
        let Some(header) = ring.get(index).copied() else { return };
        if header.role != Role::Tool
            || !header.is_live()
            || header.has(flags::REDUCED)
            || header.tokens <= limit
        {
            return;
        }
        let bytes = ring.record(&header);
        let trailer = Trailer::of(&header, bytes);
        if trailer.whole {
            return;
        }
        let content = record::content(&header, bytes);
        let call_id = record::tail_text(&header, bytes);
        let Some(cut) = self.plan_cut(content, call_id, limit) else { return };
        let kept_tail = content.len() - cut.tail;
        let body_end = content.len() + call_id.len();
        let trailer = Trailer { original: Some(header.tokens), ..trailer };
        let trailer_at = cut.head + cut.marker_len + kept_tail + call_id.len();
        let new_len = trailer_at + trailer.len();
        if new_len >= header.len as usize || cut.tokens >= header.tokens {
            return;
        }
        let mut ring = self.ring_mut(level);
        let Some(span) = ring.record_mut(index) else { return };
        // The tail and the call id first (a marker longer than the omitted middle would
        // overwrite the tail's start), then the marker, then the trailer. No `copy_within`
        // or `copy_from_slice` of unproven lengths: the core has no panic paths.
        let (from, len, to) = (cut.tail, body_end - cut.tail, cut.head + cut.marker_len);
        if to < from {
            move_left(span, from, len, to);
        } else {
            move_right(span, from, len, to);
        }
        let Some(marker_at) = span.get_mut(cut.head..to) else { return };
        marker_at.iter_mut().zip(&cut.marker).for_each(|(byte, marker)| *byte = *marker);
        let Some(trailer_span) = span.get_mut(trailer_at..new_len) else { return };
        trailer.write(&mut SpanWriter::new(trailer_span));
        if ring.truncate_record(index, new_len as u32).is_none() {
            return;
        }
        let content_len = cut.head + cut.marker_len + kept_tail;
        self.store_cut(level, index, &header, (content_len, cut.tokens), trailer.flag());
    }

    /// The cut of a result's `content` (answering `call_id`) to `limit` tokens (as a push
    /// reduces to the observation limit: the content's count, framing aside); `None` when the
    /// content fits or the marker does not fit its buffer.
    fn plan_cut(&self, content: &str, call_id: &str, limit: u32) -> Option<Cut> {
        if self.counter.count(content) <= limit {
            return None;
        }
        let reduction = reduce::reduce(content, limit, &self.counter);
        let stored = reduction.parts().iter().map(|p| self.counter.count(p)).sum::<u32>();
        let text = reduction.marker().as_bytes();
        if text.len() > MARKER_MAX {
            return None;
        }
        let mut marker = [0u8; MARKER_MAX];
        marker.iter_mut().zip(text).for_each(|(byte, from)| *byte = *from);
        Some(Cut {
            head: reduction.head.len(),
            marker,
            marker_len: text.len(),
            tail: content.len() - reduction.tail.len(),
            tokens: self.framed_tokens(stored, [], Some(call_id)),
        })
    }
}

#[cfg(all(test, feature = "compaction-cut"))]
mod tests {
    use crate::capacity::DefaultCapacities;
    use crate::config::Config;
    use crate::manager::ContextManager;
    use crate::message::Message;
    use crate::record::ToolCall;
    use crate::reduce::TRUNCATION_MARKER;

    use super::SUPERSEDED_NOTE;

    type Manager = ContextManager<DefaultCapacities>;

    /// A window whose compactions keep a third of the budget; results stored whole.
    fn config(compaction_limit: u32) -> Config {
        Config {
            context_window: 12_000,
            reserved_for_reply: 1_000,
            permanent_budget: 1_000,
            session_budget: 1_000,
            working_budget: 9_000,
            observation_limit: u32::MAX,
            low_water_percent: 60,
            locked_tail: 2,
            compaction_limit,
            ..Config::DEFAULT
        }
    }

    fn output(turn: usize) -> String {
        (0..120).map(|line| format!("turn {turn} line {line}: src/lib.rs ok\n")).collect()
    }

    /// Pushes `turns` turns of a read and its ~1,700-token output (the one of `whole_turn`
    /// pushed whole); returns the results' ids.
    fn run(manager: &mut Manager, turns: usize, whole_turn: usize) -> Vec<u64> {
        let mut ids = Vec::new();
        for turn in 0..turns {
            let id = format!("c{turn}");
            manager.push(Message::user(&format!("read part {turn}"))).unwrap();
            let calls = [ToolCall::new(&id, "read", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            let text = output(turn);
            let result = Message::tool_result(&id, &text);
            let result = if turn == whole_turn { result.whole() } else { result };
            ids.push(manager.push(result).unwrap());
        }
        ids
    }

    #[test]
    fn a_compaction_cuts_old_results_before_whole_turns_leave() {
        let mut cut = Manager::with_config(config(200)).unwrap();
        let ids = run(&mut cut, 8, 2);
        let mut plain = Manager::with_config(config(0)).unwrap();
        run(&mut plain, 8, 2);
        assert!(cut.used() <= cut.budget());
        // Without the limit, the compaction evicted whole turns; with it, more stay.
        assert!(plain.stats().counters.units_evicted > 0);
        assert!(
            cut.stats().counters.units_evicted < plain.stats().counters.units_evicted,
            "{:?} / {:?}",
            cut.stats().counters,
            plain.stats().counters
        );
        let newest = cut.get(*ids.last().unwrap()).unwrap();
        assert!(!newest.was_reduced(), "the live request's result stays whole");
        assert_eq!(newest.content(), output(7));
        let whole = cut.get(ids[2]).unwrap();
        assert!(!whole.was_reduced(), "a result pushed whole is never cut");
        assert_eq!(whole.content(), output(2));
        let oldest = cut.get(ids[0]).unwrap();
        assert!(oldest.was_reduced());
        assert!(oldest.content().contains(TRUNCATION_MARKER), "{}", oldest.content());
        assert!(oldest.content().starts_with("turn 0 line 0:"));
        assert!(oldest.content().ends_with("turn 0 line 119: src/lib.rs ok\n"));
        assert_eq!(oldest.tool_call_id(), Some("c0"));
        assert!(oldest.original_tokens() > 4 * oldest.tokens());
        let counters = cut.stats().counters;
        assert!(counters.observations_reduced >= 1);
        assert_eq!(counters.units_evicted, 0, "{counters:?}");
        assert_eq!(counters.compactions, 1, "a compaction that only cut counts");
        // The live totals are what the records cost.
        let stored: u32 = cut.history().map(|m| m.tokens()).sum();
        assert!(cut.used() >= stored);
    }

    #[test]
    fn cut_results_and_the_whole_mark_survive_a_snapshot() {
        let mut manager = Manager::with_config(config(200)).unwrap();
        let ids = run(&mut manager, 8, 2);
        let mut buf = vec![0u8; manager.snapshot_len()];
        let bytes = manager.snapshot_into(&mut buf).unwrap().to_vec();
        let mut restored = Manager::with_config(config(200)).unwrap();
        restored.restore_from(&bytes).unwrap();
        let sent = |m: &Manager| -> Vec<(String, u32, bool)> {
            m.history().map(|m| (m.content().to_owned(), m.tokens(), m.was_reduced())).collect()
        };
        assert_eq!(sent(&restored), sent(&manager));
        assert_eq!(restored.used(), manager.used());
        // The same pushes after the restore cut the same records: the whole one never.
        let more = |m: &mut Manager| {
            for turn in 8..12 {
                let id = format!("c{turn}");
                m.push(Message::user(&format!("read part {turn}"))).unwrap();
                let calls = [ToolCall::new(&id, "read", "{}")];
                m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
                m.push(Message::tool_result(&id, &output(turn))).unwrap();
            }
        };
        more(&mut manager);
        more(&mut restored);
        assert_eq!(sent(&restored), sent(&manager));
        if let Some(whole) = restored.get(ids[2]) {
            assert!(!whole.was_reduced());
        }
        let mut again = vec![0u8; restored.snapshot_len()];
        let mut first = vec![0u8; manager.snapshot_len()];
        assert_eq!(
            restored.snapshot_into(&mut again).unwrap(),
            manager.snapshot_into(&mut first).unwrap()
        );
    }

    /// Pushes `turns` reads of files `turn % files` (keyed by file when `keyed`), outputs of
    /// ~500 tokens; returns the results' ids.
    fn read_files(manager: &mut Manager, turns: usize, files: usize, keyed: bool) -> Vec<u64> {
        let mut ids = Vec::new();
        for turn in 0..turns {
            let (id, file) = (format!("c{turn}"), turn % files);
            manager.push(Message::user(&format!("read file {file}"))).unwrap();
            let calls = [ToolCall::new(&id, "read", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            let key = if keyed { 100 + file as u32 } else { 0 };
            let text = short_output(turn);
            ids.push(manager.push(Message::tool_result(&id, &text).superseding(key)).unwrap());
        }
        ids
    }

    fn short_output(turn: usize) -> String {
        output(turn).lines().take(36).map(|line| format!("{line}\n")).collect()
    }

    /// The file a result of [`read_files`] read.
    fn file_of(result: &crate::message::MessageRef<'_>) -> usize {
        let call = result.tool_call_id().unwrap_or_default();
        call.get(1..).and_then(|n| n.parse::<usize>().ok()).unwrap_or(usize::MAX) % 3
    }

    #[test]
    fn a_compaction_cuts_superseded_results_to_a_note_and_keeps_the_newest_whole() {
        let mut keyed = Manager::with_config(config(0)).unwrap();
        let ids = read_files(&mut keyed, 60, 3, true);
        let mut plain = Manager::with_config(config(0)).unwrap();
        read_files(&mut plain, 60, 3, false);
        let kept: Vec<_> = ids.iter().filter_map(|&id| keyed.get(id)).collect();
        let notes = kept.iter().filter(|r| r.content() == SUPERSEDED_NOTE).count();
        assert!(notes >= 3, "{notes} of {}", kept.len());
        for (n, result) in kept.iter().enumerate() {
            let newer = kept.iter().skip(n + 1).any(|r| file_of(r) == file_of(result));
            if result.content() == SUPERSEDED_NOTE {
                assert!(newer, "only a result a newer one supersedes is cut");
                assert!(result.was_reduced());
                assert!(result.original_tokens() > 10 * result.tokens());
            } else {
                assert!(!result.was_reduced());
            }
            if !newer {
                assert_ne!(result.content(), SUPERSEDED_NOTE, "each file's newest stays whole");
            }
        }
        assert!(keyed.used() <= keyed.budget());
        let (with, without) = (keyed.stats().counters, plain.stats().counters);
        assert!(with.units_evicted < without.units_evicted, "{with:?} / {without:?}");
        assert!(with.compactions < without.compactions, "{with:?} / {without:?}");
        let stored: u32 = keyed.history().map(|m| m.tokens()).sum();
        assert!(keyed.used() >= stored);
    }

    #[test]
    fn supersede_keys_and_their_cuts_survive_a_snapshot() {
        let mut manager = Manager::with_config(config(0)).unwrap();
        read_files(&mut manager, 25, 3, true);
        let mut buf = vec![0u8; manager.snapshot_len()];
        let bytes = manager.snapshot_into(&mut buf).unwrap().to_vec();
        let mut restored = Manager::with_config(config(0)).unwrap();
        restored.restore_from(&bytes).unwrap();
        let sent = |m: &Manager| -> Vec<(String, u32)> {
            m.history().map(|m| (m.content().to_owned(), m.tokens())).collect()
        };
        assert_eq!(sent(&restored), sent(&manager));
        let more = |m: &mut Manager| {
            for turn in 25..45 {
                let id = format!("c{turn}");
                m.push(Message::user("read again")).unwrap();
                let calls = [ToolCall::new(&id, "read", "{}")];
                m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
                let key = 100 + (turn % 3) as u32;
                m.push(Message::tool_result(&id, &short_output(turn)).superseding(key)).unwrap();
            }
        };
        more(&mut manager);
        more(&mut restored);
        assert!(manager.history().any(|m| m.content() == SUPERSEDED_NOTE));
        assert_eq!(sent(&restored), sent(&manager), "the keys came back with the records");
        let mut again = vec![0u8; restored.snapshot_len()];
        let mut first = vec![0u8; manager.snapshot_len()];
        assert_eq!(
            restored.snapshot_into(&mut again).unwrap(),
            manager.snapshot_into(&mut first).unwrap()
        );
    }

    #[test]
    fn a_compaction_keeps_the_newest_read_of_each_file_ahead_of_older_turns() {
        // Four files read once early, then long build logs: at the compaction the reads stay
        // (the newest of their keys) and the logs between them leave.
        let mut manager = Manager::with_config(config(0)).unwrap();
        let mut reads = Vec::new();
        for file in 0..4u32 {
            let id = format!("r{file}");
            manager.push(Message::user(&format!("read file {file}"))).unwrap();
            let calls = [ToolCall::new(&id, "read", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            let text = short_output(file as usize);
            let result = Message::tool_result(&id, &text).superseding(100 + file);
            reads.push(manager.push(result).unwrap());
        }
        let mut logs = Vec::new();
        while manager.stats().counters.compactions == 0 {
            let id = format!("b{}", logs.len());
            manager.push(Message::user("build it")).unwrap();
            let calls = [ToolCall::new(&id, "build", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            logs.push(manager.push(Message::tool_result(&id, &short_output(99))).unwrap());
        }
        assert!(reads.iter().all(|&id| manager.get(id).is_some()), "every newest read stays");
        assert!(manager.get(logs[0]).is_none(), "the oldest log left");
        assert!(manager.used() <= manager.budget());
        // Read again, file 0's older read is no longer current: at the next compaction it
        // is cut, and the reads are not kept past what the low-water mark leaves the history.
        manager.push(Message::user("read file 0 again")).unwrap();
        let calls = [ToolCall::new("r0b", "read", "{}")];
        manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
        let text = short_output(0);
        let newest = manager.push(Message::tool_result("r0b", &text).superseding(100)).unwrap();
        let compactions = manager.stats().counters.compactions;
        while manager.stats().counters.compactions == compactions {
            manager.push(Message::user("build it")).unwrap();
            let id = format!("b{}", logs.len());
            let calls = [ToolCall::new(&id, "build", "{}")];
            manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
            logs.push(manager.push(Message::tool_result(&id, &short_output(99))).unwrap());
        }
        assert!(manager.get(newest).is_some_and(|m| !m.was_reduced()));
        assert!(manager.get(reads[0]).is_none_or(|m| m.content() == SUPERSEDED_NOTE));
        assert!(reads[1..].iter().all(|&id| manager.get(id).is_some()));
        assert!(manager.used() <= manager.config().low_water_tokens());
    }

    #[test]
    fn without_keys_a_compaction_evicts_oldest_first() {
        let mut manager = Manager::with_config(config(0)).unwrap();
        let ids = read_files(&mut manager, 30, 3, false);
        let kept: Vec<bool> = ids.iter().map(|&id| manager.get(id).is_some()).collect();
        let first_kept = kept.iter().position(|&k| k).unwrap();
        assert!(first_kept > 0);
        assert!(kept[first_kept..].iter().all(|&k| k), "a suffix stays: {kept:?}");
    }

    #[test]
    fn a_limit_under_32_tokens_is_refused() {
        assert!(Config { compaction_limit: 31, ..Config::DEFAULT }.validate().is_err());
        assert!(Config { compaction_limit: 32, ..Config::DEFAULT }.validate().is_ok());
        assert!(Config { compaction_limit: 0, ..Config::DEFAULT }.validate().is_ok());
    }
}
