//! Recall: archived turns brought back into this turn's payload, sized by the room the payload
//! has left, for an explicit query or for the live request (the newest user message).
//!
//! Retrieval only ever uses free room: the block is measured with the session's counter
//! before the core composes, so the core never evicts anything to fit it, and nothing it
//! does is kept (no eviction, no checkpoint, no change a later compose would see).
//!
//! Room: what the core says a payload with the caller's dynamic context leaves free
//! ([`ContextManager::dynamic_room`](ctxwin_core::ContextManager::dynamic_room)), capped by
//! [`RetrievalSettings::max_share_percent`]; the block is measured as the core will charge it.
//!
//! Ranking: the archive port's normalised lexical scores ([`SearchHit::score`](crate::store::SearchHit);
//! BM25 for every adapter: query words from [`ctxwin_core::terms::search_words`], irregular
//! verbs with their other forms), times a recency prior `1 + recency × position` (position 0
//! for the oldest candidate, 1 for the newest). A short reply that brings the turn it answers
//! (or a short question its answer) is ranked as the exchange of both: BM25's length
//! normalisation ([`BM25_K1`], [`BM25_B`]) is redone for the pair's length, so "Thanks, Mel!"
//! does not outrank a real statement about Mel for being two words long. Messages still in the
//! window (or quoted whole by its summaries) are left out, as are repeated texts.
//!
//! With an embedder ([`SessionBuilder::embedder`](super::SessionBuilder::embedder)), the
//! nearest messages by cosine similarity join the candidates and the two rankings are fused
//! ([`Hybrid`](super::Hybrid): the two lists interleaved rank by rank by default); a
//! failing embedder leaves the lexical ranking alone for that build.
//!
//! Packing: ranked hits first, best first, each with the turn a short one brings, while they
//! fit; then, in the room left, the context of the hits, best hit first: the exchange a hit
//! started (a short question about it from the other speaker and its answer), then the turns
//! just before and after it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ctxwin_core::Role;
use ctxwin_core::counter::TokenCounter;

use super::fusion::{Ranked, fuse};
use super::semantic::SemanticIndex;
use super::{Session, SessionError};
use crate::embed::EmbedError;
use crate::store::{ArchiveStore, ArchivedMessage, BM25_B, BM25_K1, SearchHit, SearchQuery};
use crate::tokens::CountCache;

/// First line of a retrieved block.
pub const RETRIEVED_HEADER: &str = "[Retrieved from archive]";

/// A reply of fewer words than this brings the turn it answers (its meaning is there), and a
/// question of fewer words its answer.
const SHORT_REPLY_WORDS: usize = 10;

/// How a session retrieves (set with [`SessionBuilder::retrieval`](super::SessionBuilder::retrieval);
/// one payload can use others: [`ComposeOptions::retrieval`](super::ComposeOptions)).
///
/// ```
/// let settings = ctxwin_std::session::RetrievalSettings::DEFAULT;
/// assert!(settings.auto && settings.max_share_percent == 100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetrievalSettings {
    /// Retrieve for the live request (the newest user message in the window) at every
    /// [`compose`](Session::compose), when the session has an archive.
    pub auto: bool,
    /// Most of the budget, in percent, the retrieved block may take; it never takes more than
    /// the room the payload has left.
    pub max_share_percent: u8,
    /// Most archived messages in one block.
    pub max_items: usize,
    /// Candidates ranked per query.
    pub candidates: usize,
    /// Whether a short reply brings the turn before it, and a short question the one after.
    pub neighbours: bool,
    /// Weight of the recency prior (0 for none).
    pub recency: f64,
}

impl RetrievalSettings {
    /// Automatic, up to all the free room, 200 items from 200 candidates, with neighbours and
    /// a recency weight of 0.2.
    pub const DEFAULT: Self = Self {
        auto: true,
        max_share_percent: 100,
        max_items: 200,
        candidates: 200,
        neighbours: true,
        recency: 0.2,
    };
}

impl Default for RetrievalSettings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What one retrieval put into the payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recall {
    /// The dynamic-context block (`[Retrieved from archive]`, then `- (msg ID, ROLE) text`
    /// lines, oldest first); empty when nothing fit or matched.
    pub block: String,
    /// The archived message ids it holds, oldest first.
    pub ids: Vec<u64>,
    /// Its token cost as a dynamic-context message (framing included); 0 when empty.
    pub tokens: u32,
}

/// A session's retrieval: its settings, and the vectors of hybrid recall.
pub(crate) struct Retrieval {
    pub(crate) settings: RetrievalSettings,
    /// Vectors for hybrid recall, when built with [`SessionBuilder::embedder`](super::SessionBuilder::embedder).
    pub(crate) semantic: Option<SemanticIndex>,
    /// The cost of each block line counted lately, by its text: a retrieval after every
    /// compaction ranks mostly the candidates the last one ranked, and counting their lines
    /// again (tool outputs of tens of kilobytes) was a tenth of a proxy's request.
    pub(crate) line_costs: CountCache,
    /// Archive searches run for the session so far ([`Session::archive_searches`]).
    pub(crate) searches: AtomicU64,
}

/// Lines [`Retrieval::line_costs`] holds the costs of (a few hundred kilobytes of keys).
pub(crate) const LINE_COSTS: usize = 8_192;

/// Lines shorter than this are counted each time: counting them costs about what hashing
/// them for the cache does.
const CACHED_LINE_BYTES: usize = 256;

impl std::fmt::Debug for Retrieval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retrieval")
            .field("settings", &self.settings)
            .field("semantic", &self.semantic.is_some())
            .finish()
    }
}

impl Session {
    /// The retrieval settings.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert!(session.retrieval().auto);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn retrieval(&self) -> &RetrievalSettings {
        &self.recall.settings
    }

    /// The live request: the newest user message in the window, if any.
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::text(Role::User, "Where does Mel live?"))?;
    /// session.push(&ChatMessage::text(Role::Assistant, "Let me look."))?;
    /// assert_eq!(session.live_request().as_deref(), Some("Where does Mel live?"));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn live_request(&self) -> Option<String> {
        self.manager.history().rfind(|m| m.role() == Role::User).map(|m| m.content().to_string())
    }

    /// Archive searches run for this session since it was built or restored: retrieval's
    /// full-text query, the task-summary query and error memory's look-up each count one.
    /// What a caller that freezes the retrieved block checks to show that composing without
    /// a new block queries nothing.
    ///
    /// ```
    /// use ctxwin_std::session::{ComposeOptions, RecallFor, SessionBuilder};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
    /// session.compose_with(ComposeOptions::new(&[]).recall(RecallFor::Nothing))?;
    /// assert_eq!(session.archive_searches(), 0);
    /// session.compose_with(ComposeOptions::new(&[]).recall(RecallFor::Query("build")))?;
    /// assert_eq!(session.archive_searches(), 1);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn archive_searches(&self) -> u64 {
        self.recall.searches.load(Relaxed)
    }

    /// Archived messages matching `query` that are not in the window, best first, as one block
    /// sized to the room a payload with `dynamic` leaves (capped by
    /// [`RetrievalSettings::max_share_percent`]), with the session's settings
    /// ([`recall_with`](Self::recall_with) takes others). Whole messages only; the block
    /// always fits: composing with `dynamic` and the block evicts nothing. This is the one
    /// retrieval: [`compose`](Self::compose) calls it for the live request.
    ///
    /// # Errors
    /// Archive errors. Without an archive the recall is empty.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// session.push(&ChatMessage::text(Role::User, "Caroline adopted two dogs in May."))?;
    /// for turn in 0..3 {
    ///     session.push(&ChatMessage::text(Role::User, format!("turn {turn}")))?;
    /// }
    /// let recall = session.recall("What is Caroline's dog called?", &[])?;
    /// assert!(recall.block.contains("two dogs in May"), "{}", recall.block);
    /// // The hit, and in the free room the turn after it.
    /// assert_eq!(recall.ids, [1, 2]);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn recall(&self, query: &str, dynamic: &[&str]) -> Result<Recall, SessionError> {
        self.recall_with(query, dynamic, &self.recall.settings)
    }

    /// [`recall`](Self::recall) with `settings` instead of the session's.
    ///
    /// # Errors
    /// As [`recall`](Self::recall).
    pub fn recall_with(
        &self,
        query: &str,
        dynamic: &[&str],
        settings: &RetrievalSettings,
    ) -> Result<Recall, SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(Recall::default()) };
        let room = self.recall_room(dynamic, settings);
        let mut packer = Packer::new(self.manager.counter(), room, settings.max_items)
            .with_costs(&self.recall.line_costs);
        if room <= packer.spent || settings.max_items == 0 {
            return Ok(Recall::default());
        }
        self.pack_task_summaries(archive, &mut packer, query)?;
        let Some(found) = self.candidates(archive, query, settings)? else {
            return Ok(self.finish(packer.chosen, room));
        };
        let Candidates { hits, extra, nearest, query_vector, neighbours } = found;
        let mut ranked = rank(hits, &neighbours, settings);
        if let (Some(index), Some(vector)) =
            (self.recall.semantic.as_ref(), query_vector.as_deref())
        {
            let cosine = |id: u64| index.similarity(vector, id);
            ranked = fuse(ranked, &nearest, extra, cosine, &index.hybrid);
        }
        self.pack_ranked(&mut packer, &ranked, &neighbours, settings);
        if settings.neighbours && !packer.full() {
            self.pack_context(archive, &mut packer, &ranked, neighbours)?;
        }
        Ok(self.finish(packer.chosen, room))
    }

    /// What retrieval ranks for `query`: the archive's hits outside the window, the messages
    /// only an embedder found, and the turns short hits may bring (fetched at once). `None`
    /// when nothing matched.
    fn candidates(
        &self,
        archive: &dyn ArchiveStore,
        query: &str,
        settings: &RetrievalSettings,
    ) -> Result<Option<Candidates>, SessionError> {
        // The window's messages are never candidates: their rows, still being written, are
        // not waited for.
        let held = |id: u64| self.manager.get(id).is_some();
        let query_of = SearchQuery::new(query, settings.candidates);
        self.recall.searches.fetch_add(1, Relaxed);
        let mut hits = archive.search_beyond(&self.scope, &query_of, &held)?;
        // What the window shows already: its messages, and text its summaries quote whole.
        let summaries: Vec<&str> = self.manager.session().map(|entry| entry.content()).collect();
        let shown = |id: u64, content: &str| {
            self.manager.get(id).is_some()
                || summaries.iter().any(|summary| summary.contains(content.trim()))
        };
        hits.retain(|hit| !shown(hit.id, &hit.content));
        // With an embedder: the nearest messages by meaning, and those BM25 did not find.
        let (query_vector, mut nearest) = self.nearest(query, settings.candidates);
        let missing: Vec<u64> = nearest
            .iter()
            .map(|n| n.0)
            .filter(|id| !hits.iter().any(|hit| hit.id == *id))
            .collect();
        let mut extra = archive.get_many(&self.scope, &missing)?;
        extra.retain(|m| {
            !shown(m.id, &m.message.content)
                && matches!(m.message.role, Role::User | Role::Assistant)
        });
        nearest.retain(|(id, _)| {
            hits.iter().any(|hit| hit.id == *id) || extra.iter().any(|m| m.id == *id)
        });
        if hits.is_empty() && extra.is_empty() {
            return Ok(None);
        }
        let wanted: Vec<u64> = if settings.neighbours {
            hits.iter()
                .map(|hit| (hit.id, hit.content.as_str()))
                .chain(extra.iter().map(|m| (m.id, m.message.content.as_str())))
                .filter(|(_, content)| content.split_whitespace().count() < SHORT_REPLY_WORDS)
                .filter_map(|(id, content)| neighbour_of(id, content))
                .collect()
        } else {
            Vec::new()
        };
        let neighbours: HashMap<u64, ArchivedMessage> =
            archive.get_many(&self.scope, &wanted)?.into_iter().map(|m| (m.id, m)).collect();
        Ok(Some(Candidates { hits, extra, nearest, query_vector, neighbours }))
    }

    /// Ranked hits first, best first, each with the turn a short one brings, while they fit.
    fn pack_ranked(
        &self,
        packer: &mut Packer<'_>,
        ranked: &[Ranked],
        neighbours: &HashMap<u64, ArchivedMessage>,
        settings: &RetrievalSettings,
    ) {
        for (_, id, role, content) in ranked {
            if packer.full() {
                break;
            }
            // A repeated short reply ("Thanks, Mel!") still brings what it answers.
            if packer.take(*id, *role, content) == Taken::No {
                continue;
            }
            if !settings.neighbours || content.split_whitespace().count() >= SHORT_REPLY_WORDS {
                continue;
            }
            let Some(neighbour) = neighbour_of(*id, content) else { continue };
            if self.manager.get(neighbour).is_some() {
                continue;
            }
            if let Some(other) = neighbours.get(&neighbour)
                && is_other_speaker(other, *role)
            {
                packer.take(neighbour, other.message.role, &other.message.content);
            }
        }
    }

    /// Free room left once every ranked hit had its chance: the context around the hits,
    /// best hit first. First the exchange a hit started (a short question about it from the
    /// other speaker, and the answer), then the turn before and the turn after.
    fn pack_context(
        &self,
        archive: &dyn ArchiveStore,
        packer: &mut Packer<'_>,
        ranked: &[Ranked],
        neighbours: HashMap<u64, ArchivedMessage>,
    ) -> Result<(), SessionError> {
        let primary: Vec<(u64, Role)> = ranked
            .iter()
            .filter(|(_, id, _, _)| packer.holds(*id))
            .map(|(_, id, role, _)| (*id, *role))
            .collect();
        let cheapest = packer.header.max(8);
        if packer.room.saturating_sub(packer.spent) <= cheapest {
            return Ok(());
        }
        let around: Vec<u64> = primary
            .iter()
            .flat_map(|&(id, _)| [id.saturating_sub(1), id + 1, id + 2])
            .filter(|&id| {
                id > 0
                    && !neighbours.contains_key(&id)
                    && !packer.holds(id)
                    && self.manager.get(id).is_none()
            })
            .collect();
        let mut context = neighbours;
        context.extend(archive.get_many(&self.scope, &around)?.into_iter().map(|m| (m.id, m)));
        let usable = |id: u64| {
            context.get(&id).filter(|m| {
                self.manager.get(id).is_none()
                    && matches!(m.message.role, Role::User | Role::Assistant)
            })
        };
        for &(id, role) in &primary {
            if packer.full() {
                break;
            }
            let (Some(question), Some(answer)) = (usable(id + 1), usable(id + 2)) else { continue };
            let text = question.message.content.trim_end();
            let asks = question.message.role != role
                && text.ends_with('?')
                && text.split_whitespace().count() < SHORT_REPLY_WORDS;
            if asks && packer.fits_both(question, answer) {
                for m in [question, answer] {
                    packer.take(m.id, m.message.role, &m.message.content);
                }
            }
        }
        for &(id, _) in &primary {
            for near in [id.saturating_sub(1), id + 1] {
                if packer.full() {
                    break;
                }
                if let Some(m) = usable(near) {
                    packer.take(m.id, m.message.role, &m.message.content);
                }
            }
        }
        Ok(())
    }

    /// The block of the `chosen` lines, oldest first. The lines were measured one by one:
    /// the block is checked as the core will count it, dropping the longest line (the fewest
    /// items lost) until it fits `room`.
    fn finish(&self, mut chosen: Vec<(u64, String)>, room: u32) -> Recall {
        chosen.sort_by_key(|(id, _)| *id);
        loop {
            if chosen.is_empty() {
                return Recall::default();
            }
            let block = render(&chosen);
            let tokens = self.manager.dynamic_tokens(&block);
            if tokens <= room {
                let ids = chosen.iter().map(|(id, _)| *id).collect();
                return Recall { block, ids, tokens };
            }
            if let Some(at) = (0..chosen.len()).max_by_key(|&i| chosen[i].1.len()) {
                chosen.remove(at);
            }
        }
    }

    /// With an embedder, the query's vector and the `limit` archived messages outside the
    /// window nearest to it by meaning, best first, with their cosines; nothing without one
    /// or when it fails (counted).
    fn nearest(&self, query: &str, limit: usize) -> (Option<Vec<f32>>, Vec<(u64, f32)>) {
        let Some(index) = self.recall.semantic.as_ref() else { return (None, Vec::new()) };
        match index.embed_query(query) {
            Ok(vector) => {
                let near = index.nearest(&vector, limit, |id| self.manager.get(id).is_none());
                (Some(vector), near)
            }
            Err(EmbedError::CoolingDown) => (None, Vec::new()),
            Err(error) => {
                index.fell_back(&error);
                (None, Vec::new())
            }
        }
    }

    /// Tokens a retrieved block may cost next to `dynamic`: what the core leaves free
    /// without evicting anything, capped by the settings' share of the budget.
    fn recall_room(&self, dynamic: &[&str], settings: &RetrievalSettings) -> u32 {
        let free = self.manager.dynamic_room(dynamic);
        let budget = self.manager.budget();
        let share = u64::from(settings.max_share_percent.min(100));
        let cap = u32::try_from(u64::from(budget) * share / 100).unwrap_or(u32::MAX);
        free.min(cap)
    }
}

/// What retrieval ranks ([`Session::candidates`]).
struct Candidates {
    /// The archive's hits outside the window, best first.
    hits: Vec<SearchHit>,
    /// Messages only the embedder found.
    extra: Vec<ArchivedMessage>,
    /// The embedder's nearest messages among the candidates, with their cosines.
    nearest: Vec<(u64, f32)>,
    /// The query's vector, when an embedder gave one.
    query_vector: Option<Vec<f32>>,
    /// The turns short hits may bring, by id.
    neighbours: HashMap<u64, ArchivedMessage>,
}

/// The archive's hits ranked: their normalised score times a recency prior over the
/// candidates' id range; a short hit that brings a turn is ranked as the exchange of both
/// (BM25's length normalisation, which favours a two-word "Thanks, Mel!", redone for the
/// pair's length: one occurrence assumed, `avgdl` from the candidates).
fn rank(
    hits: Vec<SearchHit>,
    neighbours: &HashMap<u64, ArchivedMessage>,
    settings: &RetrievalSettings,
) -> Vec<Ranked> {
    let words = |text: &str| text.split_whitespace().count().max(1) as f64;
    // Each hit's length, counted once (hits are whole tool outputs of tens of kilobytes).
    let lengths: Vec<f64> = hits.iter().map(|hit| words(&hit.content)).collect();
    let avgdl = lengths.iter().sum::<f64>() / hits.len().max(1) as f64;
    let norm = |length: f64| 1.0 + BM25_K1 * (1.0 - BM25_B + BM25_B * length / avgdl);
    let (low, high) =
        hits.iter().fold((u64::MAX, 0), |(lo, hi), hit| (lo.min(hit.id), hi.max(hit.id)));
    let span = high.saturating_sub(low).max(1) as f64;
    let mut ranked: Vec<Ranked> = hits
        .into_iter()
        .zip(lengths)
        .map(|(hit, length)| {
            let position = hit.id.saturating_sub(low) as f64 / span;
            let mut score = hit.score * (1.0 + settings.recency * position);
            if length < SHORT_REPLY_WORDS as f64
                && let Some(other) = neighbour_of(hit.id, &hit.content)
                    .and_then(|n| neighbours.get(&n))
                    .filter(|other| is_other_speaker(other, hit.role))
            {
                score *= norm(length) / norm(length + words(&other.message.content));
            }
            (score, hit.id, hit.role, hit.content)
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    ranked
}

/// The lines chosen for a block, and what they cost.
pub(super) struct Packer<'a> {
    counter: &'a super::Counter,
    /// Costs of long lines counted before ([`Retrieval::line_costs`]).
    costs: Option<&'a CountCache>,
    chosen: Vec<(u64, String)>,
    /// Tokens of the header and the lines chosen.
    spent: u32,
    /// Tokens of the header line.
    header: u32,
    room: u32,
    max_items: usize,
}

impl<'a> Packer<'a> {
    fn new(counter: &'a super::Counter, room: u32, max_items: usize) -> Self {
        let header = counter.count(RETRIEVED_HEADER).saturating_add(1);
        Self { counter, costs: None, chosen: Vec::new(), spent: header, header, room, max_items }
    }

    /// Takes the costs of long lines from `costs` and keeps those it counts there.
    fn with_costs(self, costs: &'a CountCache) -> Self {
        Self { costs: Some(costs), ..self }
    }

    /// A line's cost: its count and its newline.
    fn cost(&self, line: &str) -> u32 {
        let count = match self.costs {
            Some(costs) if line.len() >= CACHED_LINE_BYTES => {
                let key = costs.key(line);
                costs.get(key).unwrap_or_else(|| {
                    let count = self.counter.count(line);
                    costs.insert(key, count);
                    count
                })
            }
            _ => self.counter.count(line),
        };
        count.saturating_add(1)
    }

    fn full(&self) -> bool {
        self.chosen.len() >= self.max_items
    }

    fn holds(&self, id: u64) -> bool {
        self.chosen.iter().any(|(seen, _)| *seen == id)
    }

    /// Whether a short question and its answer fit together.
    fn fits_both(&self, question: &ArchivedMessage, answer: &ArchivedMessage) -> bool {
        let line = |m: &ArchivedMessage, text: &str| {
            self.cost(&format!("- (msg {}, {}) {}", m.id, m.message.role, text))
        };
        let cost = line(question, question.message.content.trim_end())
            .saturating_add(line(answer, &answer.message.content));
        self.spent.saturating_add(cost) <= self.room
    }

    /// Adds the line of message `id` when it fits and its text is not there yet.
    fn take(&mut self, id: u64, role: Role, text: &str) -> Taken {
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if flat.is_empty() {
            return Taken::No;
        }
        if self.chosen.iter().any(|(seen, line)| *seen == id || line.ends_with(&flat)) {
            return Taken::Already;
        }
        if self.push_line(id, format!("- (msg {id}, {role}) {flat}")) {
            Taken::Yes
        } else {
            Taken::No
        }
    }

    /// Adds the line of the archived summary `id` (its text on one line) when it fits and is
    /// not there yet.
    pub(super) fn take_summary(&mut self, id: u64, text: &str) -> bool {
        if self.full() || self.holds(id) || text.trim().is_empty() {
            return false;
        }
        self.push_line(id, format!("- (summary {id}) {text}"))
    }

    /// Adds `line` for `id` when it fits the room.
    fn push_line(&mut self, id: u64, line: String) -> bool {
        let cost = self.cost(&line);
        if self.spent.saturating_add(cost) > self.room {
            return false;
        }
        self.spent += cost;
        self.chosen.push((id, line));
        true
    }
}

/// The turn a short hit brings: a question its answer, a reply what it answers.
fn neighbour_of(id: u64, content: &str) -> Option<u64> {
    let next =
        if content.trim_end().ends_with('?') { id.checked_add(1) } else { id.checked_sub(1) };
    next.filter(|&n| n > 0)
}

/// Whether a candidate went into the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    Yes,
    /// Its text is there already.
    Already,
    /// Empty, or no room for it.
    No,
}

/// Whether `other` is another speaker's turn (what a reply by `role` answers, or the answer
/// to its question).
fn is_other_speaker(other: &ArchivedMessage, role: Role) -> bool {
    other.message.role != role && matches!(other.message.role, Role::User | Role::Assistant)
}

fn render(lines: &[(u64, String)]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut block = String::from(RETRIEVED_HEADER);
    for (_, line) in lines {
        block.push('\n');
        block.push_str(line);
    }
    block
}

// Every test recalls from an SQLite archive (its FTS5 ranking).
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::message::ChatMessage;
    use crate::session::SessionBuilder;
    use ctxwin_core::Config;

    /// A session whose window holds a few turns of a long chat about dogs and the weather.
    fn chat(budget: u32) -> Session {
        let config = Config {
            context_window: budget + 1_000,
            reserved_for_reply: 1_000,
            permanent_budget: budget / 8,
            session_budget: budget / 8,
            working_budget: budget / 2,
            ..Config::DEFAULT
        };
        let mut session =
            SessionBuilder::new("s").config(config).archive_in_memory().build().unwrap();
        for turn in 0..200u32 {
            let role = if turn % 2 == 0 { Role::User } else { Role::Assistant };
            let text = match turn % 5 {
                0 => format!("My dog number {turn} loves the park near the river, honestly."),
                1 => format!("Yes! {turn}"),
                _ => format!("The weather on day {turn} was grey and a little windy again."),
            };
            session.push(&ChatMessage::text(role, text)).unwrap();
        }
        session
    }

    #[test]
    fn a_long_line_is_counted_once_across_retrievals() {
        let mut session = chat(2_000);
        let long = format!("The kennel log for the dogs: {}", "walked, fed, brushed; ".repeat(14));
        session.push(&ChatMessage::text(Role::User, long)).unwrap();
        for turn in 0..200 {
            let role = if turn % 2 == 0 { Role::Assistant } else { Role::User };
            let text = format!("The weather on day {turn} was grey again.");
            session.push(&ChatMessage::text(role, text)).unwrap();
        }
        let query = || {
            crate::session::ComposeOptions::new(&[])
                .recall(crate::session::RecallFor::Query("kennel brushed"))
        };
        let first = session.compose_with(query()).unwrap().recall;
        assert!(first.block.contains("kennel log"), "{}", first.block);
        let counted = session.recall.line_costs.stats();
        assert!(counted.misses > 0 && counted.hits == 0, "{counted:?}");
        let second = session.compose_with(query()).unwrap().recall;
        assert_eq!(second, first);
        let again = session.recall.line_costs.stats();
        assert_eq!(again.misses, counted.misses, "a line was counted again");
        assert!(again.hits >= counted.misses, "{again:?}");
    }

    fn history_ids(session: &Session) -> Vec<u64> {
        session.manager().history().map(|m| m.id()).collect()
    }

    #[test]
    fn retrieval_fills_free_room_and_never_evicts() {
        let mut session = chat(2_000);
        let before = history_ids(&session);
        let used = session.manager().used();
        let options = crate::session::ComposeOptions::new(&[])
            .recall(crate::session::RecallFor::Query("dogs"));
        let payload = session.compose_with(options).unwrap();
        assert!(payload.recall.ids.len() > 5, "{:?}", payload.recall);
        assert!(payload.tokens <= payload.budget);
        assert_eq!(payload.evicted_units, 0);
        // The free room is mostly used.
        assert!(
            payload.tokens > payload.budget * 85 / 100,
            "{} / {}",
            payload.tokens,
            payload.budget
        );
        assert_eq!(history_ids(&session), before);
        assert_eq!(session.manager().used(), used);
        // Nothing retrieved is still in the window, and the ids are in order.
        assert!(payload.recall.ids.iter().all(|id| !before.contains(id)));
        assert!(payload.recall.ids.windows(2).all(|w| w[0] < w[1]));
        let again = session.compose(&[]).unwrap();
        assert_eq!(history_ids(&session), before);
        assert!(again.tokens <= again.budget);
    }

    #[test]
    fn a_short_reply_brings_the_turn_it_answers() {
        let session = chat(2_000);
        let settings = RetrievalSettings { max_items: 2, ..RetrievalSettings::DEFAULT };
        let recall = session.recall_with("Yes! 1", &[], &settings).unwrap();
        assert!(recall.ids.contains(&2) && recall.ids.contains(&1), "{recall:?}");
    }

    #[test]
    fn the_live_request_triggers_recall_unless_turned_off() {
        let mut session = chat(2_000);
        session.push(&ChatMessage::text(Role::User, "Where does my dog like to go?")).unwrap();
        assert!(!session.compose(&[]).unwrap().recall.ids.is_empty());
        let off = RetrievalSettings { auto: false, ..RetrievalSettings::DEFAULT };
        let options = crate::session::ComposeOptions::new(&[]).retrieval(off);
        assert!(session.compose_with(options).unwrap().recall.ids.is_empty());
        let asked = options.recall(crate::session::RecallFor::LiveRequest);
        assert!(!session.compose_with(asked).unwrap().recall.ids.is_empty());
        let nothing =
            crate::session::ComposeOptions::new(&[]).recall(crate::session::RecallFor::Nothing);
        assert!(session.compose_with(nothing).unwrap().recall.ids.is_empty());
    }

    #[test]
    fn a_hit_brings_the_exchange_it_started_and_irregular_verbs_match() {
        let mut session = chat(2_000);
        session
            .push(&ChatMessage::text(Role::User, "I have taken up pottery on weekends lately."))
            .unwrap();
        session.push(&ChatMessage::text(Role::Assistant, "Oh nice, who teaches you?")).unwrap();
        session
            .push(&ChatMessage::text(Role::User, "Mrs. Okafor, she ran a studio for years."))
            .unwrap();
        for turn in 0..600 {
            session.push(&ChatMessage::text(Role::User, format!("filler {turn}"))).unwrap();
        }
        // `take` finds `taken`; the question and answer that followed come with it.
        let recall = session.recall("Which hobby did she take up?", &[]).unwrap();
        assert!(recall.block.contains("taken up pottery"), "{}", recall.block);
        assert!(recall.block.contains("Mrs. Okafor"), "{}", recall.block);
    }

    #[test]
    fn a_short_reply_ranks_as_the_exchange_it_closes() {
        let mut session = chat(2_000);
        // A two-word reply naming Mel closes an exchange of 17 words; a ten-word turn about
        // Mel ranks above it, although BM25 alone favours the two-word reply.
        session
            .push(&ChatMessage::text(
                Role::User,
                "The garden party ran late again and everyone stayed until midnight talking \
                 about the weather.",
            ))
            .unwrap();
        session.push(&ChatMessage::text(Role::Assistant, "Thanks, Mel!")).unwrap();
        session
            .push(&ChatMessage::text(
                Role::User,
                "Mel bought a violin last spring and loves it so.",
            ))
            .unwrap();
        for turn in 0..600 {
            session.push(&ChatMessage::text(Role::User, format!("filler {turn}"))).unwrap();
        }
        let archive = session.archive().unwrap();
        let raw = archive.search(session.scope(), &SearchQuery::new("Who is Mel?", 5)).unwrap();
        assert!(raw[0].content.starts_with("Thanks"), "{raw:?}");
        let settings = RetrievalSettings { max_items: 1, ..RetrievalSettings::DEFAULT };
        let recall = session.recall_with("Who is Mel?", &[], &settings).unwrap();
        assert!(recall.block.contains("bought a violin"), "{}", recall.block);
        assert_eq!(recall.ids.len(), 1, "{}", recall.block);
    }

    #[test]
    fn possessives_match() {
        let mut session = chat(2_000);
        session
            .push(&ChatMessage::text(Role::User, "Caroline adopted a puppy called Biscuit."))
            .unwrap();
        // Enough filler that the fact leaves the 2,000-token window (recall skips what is in it).
        for turn in 0..600 {
            session.push(&ChatMessage::text(Role::User, format!("filler {turn}"))).unwrap();
        }
        let recall = session.recall("What is Caroline's puppy's name?", &[]).unwrap();
        assert!(recall.block.contains("Biscuit"), "{}", recall.block);
    }
}
