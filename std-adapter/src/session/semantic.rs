//! Optional semantic recall: an [`Embedder`]'s vectors of the session's archived messages, held
//! in memory for ranking, cached in the archive, and fused with BM25.
//!
//! Vectors are made lazily: before a compose retrieves, the messages archived since the last
//! compose are embedded in batches (those the archive has vectors for are loaded instead) and
//! cached in the archive under the embedder's model name. The query is embedded at recall.
//!
//! The two rankings are fused as [`Hybrid`] says. Any embedder failure (an unreachable or slow endpoint, a
//! malformed answer) leaves that build with the lexical ranking alone, counted in
//! [`SemanticStats::fallbacks`]; nothing fails and nothing is lost.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxwin_core::StrategyKind;
use ctxwin_core::task::MAX_RELEVANCES;

use super::{Hybrid, Session, SessionError};
use crate::embed::{EmbedError, Embedder, dot, normalized};

/// What semantic recall has done in this session ([`Session::semantic_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SemanticStats {
    /// The embedder's model name.
    pub model: String,
    /// Messages with a vector in memory.
    pub vectors: u64,
    /// Texts this session sent to the embedder (messages and queries).
    pub embedded: u64,
    /// Vectors loaded from the archive's cache instead.
    pub loaded: u64,
    /// Builds that ranked lexically because the embedder failed.
    pub fallbacks: u64,
    /// The last embedder error, if any.
    pub last_error: Option<String>,
}

/// How long after a failure builds rank lexically without asking the embedder again: a slow
/// or dead endpoint costs one timeout, not one per build.
pub const EMBEDDER_COOLDOWN: Duration = Duration::from_secs(30);

/// An embedder as the builder holds it.
#[derive(Clone)]
pub(crate) struct EmbedderSlot(pub(crate) Arc<dyn Embedder>);

impl fmt::Debug for EmbedderSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Embedder").field(&self.0.model()).finish()
    }
}

/// The session's vectors, normalized, in one flat array.
pub(crate) struct SemanticIndex {
    embedder: Arc<dyn Embedder>,
    pub(crate) hybrid: Hybrid,
    ids: Vec<u64>,
    flat: Vec<f32>,
    dims: usize,
    /// Highest message id looked at so far.
    seen: u64,
    embedded: u64,
    loaded: u64,
    fallbacks: Cell<u64>,
    last_error: RefCell<Option<String>>,
    /// When the embedder last failed.
    failed_at: Cell<Option<Instant>>,
    /// The running task's number and goal, and the goal's vector (normalized): embedded once
    /// per task.
    goal: Option<(u32, String, Vec<f32>)>,
}

impl SemanticIndex {
    pub(crate) fn new(slot: EmbedderSlot, hybrid: Hybrid) -> Self {
        Self {
            embedder: slot.0,
            hybrid,
            ids: Vec::new(),
            flat: Vec::new(),
            dims: 0,
            seen: 0,
            embedded: 0,
            loaded: 0,
            fallbacks: Cell::new(0),
            last_error: RefCell::new(None),
            failed_at: Cell::new(None),
            goal: None,
        }
    }

    /// Forgets every vector loaded (the session reloaded: ids may stand for other rows now);
    /// the next build loads them again from the archive.
    pub(crate) fn reset(&mut self) {
        self.ids.clear();
        self.flat.clear();
        self.dims = 0;
        self.seen = 0;
    }

    fn push(&mut self, id: u64, vector: Vec<f32>) -> Result<(), EmbedError> {
        if self.dims == 0 {
            self.dims = vector.len();
        }
        if vector.len() != self.dims {
            return Err(EmbedError::Dimensions { expected: self.dims, found: vector.len() });
        }
        self.ids.push(id);
        self.flat.extend(normalized(vector));
        Ok(())
    }

    /// Counts a failure: this build ranks lexically.
    pub(crate) fn fell_back(&self, error: &EmbedError) {
        tracing::warn!(%error, "semantic recall: embedder failed; this build ranks lexically");
        self.fallbacks.set(self.fallbacks.get().saturating_add(1));
        *self.last_error.borrow_mut() = Some(error.to_string());
        self.failed_at.set(Some(Instant::now()));
    }

    /// Whether the embedder failed less than [`EMBEDDER_COOLDOWN`] ago (such a build is
    /// counted as a fallback and ranks lexically without asking).
    fn cooling_down(&self) -> bool {
        let cooling = self.failed_at.get().is_some_and(|at| at.elapsed() < EMBEDDER_COOLDOWN);
        if cooling {
            self.fallbacks.set(self.fallbacks.get().saturating_add(1));
        }
        cooling
    }

    /// The query's vector, normalized.
    pub(crate) fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedError> {
        if self.cooling_down() {
            return Err(EmbedError::CoolingDown);
        }
        let mut vectors = self.embedder.embed(&[query])?;
        let vector = vectors.pop().ok_or(EmbedError::Count { inputs: 1, vectors: 0 })?;
        if self.dims != 0 && vector.len() != self.dims {
            return Err(EmbedError::Dimensions { expected: self.dims, found: vector.len() });
        }
        Ok(normalized(vector))
    }

    /// The normalized vector of task `number`'s `goal`, embedded on the first call for that
    /// task.
    fn goal_vector(&mut self, number: u32, goal: &str) -> Result<Vec<f32>, EmbedError> {
        if let Some((known, text, vector)) = &self.goal
            && *known == number
            && text == goal
        {
            return Ok(vector.clone());
        }
        let vector = self.embed_query(goal)?;
        self.embedded += 1;
        self.goal = Some((number, goal.to_owned(), vector.clone()));
        Ok(vector)
    }

    /// The `limit` messages closest to `query` (a normalized vector) among those `keep`
    /// accepts, best first, with their cosine similarity.
    pub(crate) fn nearest(
        &self,
        query: &[f32],
        limit: usize,
        keep: impl Fn(u64) -> bool,
    ) -> Vec<(u64, f32)> {
        if self.dims == 0 || query.len() != self.dims || limit == 0 {
            return Vec::new();
        }
        let mut scored: Vec<(u64, f32)> = self
            .ids
            .iter()
            .zip(self.flat.chunks_exact(self.dims))
            .filter(|(id, _)| keep(**id))
            .map(|(id, v)| (*id, dot(v, query)))
            .collect();
        let by_score = |a: &(u64, f32), b: &(u64, f32)| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0));
        if scored.len() > limit {
            scored.select_nth_unstable_by(limit, by_score);
            scored.truncate(limit);
        }
        scored.sort_by(by_score);
        scored
    }

    /// The cosine similarity of message `id` to `query` (a normalized vector), if it has a
    /// vector.
    pub(crate) fn similarity(&self, query: &[f32], id: u64) -> Option<f32> {
        // Ids are pushed in increasing order (sync walks the archive in id order).
        let at = self.ids.binary_search(&id).ok()?;
        let v = self.flat.get(at * self.dims..(at + 1) * self.dims)?;
        Some(dot(v, query))
    }

    /// Drops the vectors of `ids` (forgotten messages).
    pub(crate) fn remove(&mut self, ids: &[u64]) {
        if ids.is_empty() || self.dims == 0 {
            return;
        }
        let dims = self.dims;
        let mut kept_ids = Vec::with_capacity(self.ids.len());
        let mut kept = Vec::with_capacity(self.flat.len());
        for (id, v) in self.ids.iter().zip(self.flat.chunks_exact(dims)) {
            if !ids.contains(id) {
                kept_ids.push(*id);
                kept.extend_from_slice(v);
            }
        }
        self.ids = kept_ids;
        self.flat = kept;
    }

    fn stats(&self) -> SemanticStats {
        SemanticStats {
            model: self.embedder.model().to_owned(),
            vectors: self.ids.len() as u64,
            embedded: self.embedded,
            loaded: self.loaded,
            fallbacks: self.fallbacks.get(),
            last_error: self.last_error.borrow().clone(),
        }
    }
}

/// Texts embedded per call while catching up (the embedder batches further).
const SYNC_CHUNK: usize = 256;

impl Session {
    /// Brings the semantic index up to date: vectors for every message archived since the
    /// last call, loaded from the archive's cache or embedded (in batches) and cached there.
    /// Returns how many messages gained a vector. [`compose`](Self::compose) calls it before
    /// retrieving; call it yourself to embed ahead of time. Without an embedder, 0.
    ///
    /// An embedder failure is not an error: it is counted in [`SemanticStats::fallbacks`], the
    /// messages not yet embedded are tried again next time, and retrieval ranks lexically
    /// until they are; for [`EMBEDDER_COOLDOWN`] after a failure the embedder is not asked.
    ///
    /// # Errors
    /// Archive errors.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::embed::{EmbedError, Embedder};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// struct Length;
    /// impl Embedder for Length {
    ///     fn model(&self) -> &str { "length" }
    ///     fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
    ///         Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect())
    ///     }
    /// }
    /// let mut session =
    ///     SessionBuilder::new("s").archive_in_memory().embedder(Arc::new(Length)).build()?;
    /// session.push(&ChatMessage::text(Role::User, "hello"))?;
    /// assert_eq!(session.sync_vectors()?, 1);
    /// assert_eq!(session.sync_vectors()?, 0);
    /// assert_eq!(session.semantic_stats().unwrap().vectors, 1);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn sync_vectors(&mut self) -> Result<usize, SessionError> {
        if self.stores.archive.is_none()
            || self.recall.semantic.as_ref().is_none_or(SemanticIndex::cooling_down)
        {
            return Ok(0);
        }
        // Rows newer than `seen` are read once: they must all be written.
        self.commit()?;
        let (Some(index), Some(archive)) =
            (self.recall.semantic.as_mut(), self.stores.archive.as_deref())
        else {
            return Ok(0);
        };
        let model = index.embedder.model().to_owned();
        let rows = archive.vectors(&self.scope, &model, index.seen)?;
        let mut added = 0;
        let mut pending: Vec<(u64, String)> = Vec::new();
        for row in rows {
            match row.vector {
                Some(vector) => {
                    if let Err(error) = index.push(row.id, vector) {
                        index.fell_back(&error);
                        return Ok(added);
                    }
                    index.loaded += 1;
                    added += 1;
                }
                None if row.content.trim().is_empty() => {}
                None => pending.push((row.id, row.content)),
            }
            index.seen = index.seen.max(row.id);
        }
        let mut done_upto = index.seen;
        for chunk in pending.chunks(SYNC_CHUNK) {
            let texts: Vec<&str> = chunk.iter().map(|(_, text)| text.as_str()).collect();
            let answer = index.embedder.embed(&texts).and_then(|vectors| {
                if vectors.len() == texts.len() {
                    Ok(vectors)
                } else {
                    Err(EmbedError::Count { inputs: texts.len(), vectors: vectors.len() })
                }
            });
            let vectors = match answer {
                Ok(vectors) => vectors,
                Err(error) => {
                    index.fell_back(&error);
                    // Try these again next time.
                    done_upto = chunk[0].0.saturating_sub(1);
                    break;
                }
            };
            index.embedded += texts.len() as u64;
            let rows: Vec<(u64, Vec<f32>)> = chunk.iter().map(|(id, _)| *id).zip(vectors).collect();
            archive.put_vectors(&self.scope, self.stores.lease.fence, &model, &rows)?;
            for (id, vector) in rows {
                if let Err(error) = index.push(id, vector) {
                    index.fell_back(&error);
                    return Ok(added);
                }
                added += 1;
            }
        }
        index.seen = done_upto;
        Ok(added)
    }

    /// While a task runs under the importance strategy, with an embedder: supplies the core
    /// with the cosine similarity of the task's oldest live messages to its goal (negative
    /// as 0, in thousandths), which the core weighs as their task relevance beside the
    /// lexical one ([`set_task_relevance`](ctxwin_core::ContextManager::set_task_relevance)).
    /// The goal is embedded once per task; the messages' vectors are the archive's
    /// ([`sync_vectors`](Self::sync_vectors)). Nothing without a running task, and an
    /// embedder failure leaves the lexical relevance alone (counted as a fallback).
    ///
    /// # Errors
    /// Archive errors.
    pub(super) fn supply_task_relevance(&mut self) -> Result<(), SessionError> {
        let importance = self.manager.config().strategy == StrategyKind::Importance;
        if !importance || self.recall.semantic.is_none() || self.stores.archive.is_none() {
            return Ok(());
        }
        let Some(task) = self.manager.current_task().copied() else { return Ok(()) };
        self.sync_vectors()?;
        let Some(index) = self.recall.semantic.as_mut() else { return Ok(()) };
        let goal = match index.goal_vector(task.number(), task.goal()) {
            Ok(goal) => goal,
            Err(error) => {
                index.fell_back(&error);
                return Ok(());
            }
        };
        let relevances: Vec<(u64, u16)> = self
            .manager
            .history()
            .filter(|m| task.contains(m.id()))
            .filter_map(|m| {
                let similarity = index.similarity(&goal, m.id())?;
                Some((m.id(), (similarity.clamp(0.0, 1.0) * 1000.0).round() as u16))
            })
            .take(MAX_RELEVANCES)
            .collect();
        self.manager.set_task_relevance(&relevances)?;
        Ok(())
    }

    /// What semantic recall has done, when the session has an embedder.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert!(session.semantic_stats().is_none());
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn semantic_stats(&self) -> Option<SemanticStats> {
        self.recall.semantic.as_ref().map(SemanticIndex::stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Vec<f32>>);
    impl Embedder for Fixed {
        fn model(&self) -> &str {
            "fixed"
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            Ok(texts.iter().map(|t| self.0[t.len() % self.0.len()].clone()).collect())
        }
    }

    fn index() -> SemanticIndex {
        SemanticIndex::new(EmbedderSlot(Arc::new(Fixed(vec![vec![1.0, 0.0]]))), Hybrid::DEFAULT)
    }

    #[test]
    fn nearest_ranks_by_cosine_and_skips_what_keep_refuses() {
        let mut index = index();
        index.push(1, vec![1.0, 0.0]).unwrap();
        index.push(2, vec![0.0, 1.0]).unwrap();
        index.push(3, vec![1.0, 1.0]).unwrap();
        let near = index.nearest(&normalized(vec![1.0, 0.2]), 2, |_| true);
        assert_eq!(near.iter().map(|n| n.0).collect::<Vec<_>>(), [1, 3]);
        let near = index.nearest(&normalized(vec![1.0, 0.2]), 5, |id| id != 1);
        assert_eq!(near.iter().map(|n| n.0).collect::<Vec<_>>(), [3, 2]);
        index.remove(&[3]);
        assert_eq!(index.nearest(&[1.0, 0.0], 5, |_| true).len(), 2);
    }

    /// Build speed and anything else, on two dimensions: a toy model for tests.
    struct BuildSpeed;
    impl Embedder for BuildSpeed {
        fn model(&self) -> &str {
            "build-speed"
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let words = ["build", "sccache", "compile", "faster"];
            Ok(texts
                .iter()
                .map(|t| {
                    let lower = t.to_lowercase();
                    let hits = words.iter().filter(|w| lower.contains(*w)).count() as f32;
                    vec![hits, if hits == 0.0 { 1.0 } else { 0.0 }]
                })
                .collect())
        }
    }

    /// Pushes two equally old notes (the one about build speed first, sharing no word of
    /// five letters or more with the goal), composes once, then pushes filler until one of
    /// the two leaves; returns which left first (0: the build-speed note) and the session.
    fn first_to_leave(embedder: Option<Arc<dyn Embedder>>, task: bool) -> (usize, Session) {
        use crate::message::ChatMessage;
        use crate::session::{PushOptions, SessionBuilder};
        use ctxwin_core::{Config, Role};
        let config = Config {
            strategy: StrategyKind::Importance,
            locked_tail: 1,
            working_budget: 400,
            trigger_percent: 80,
            low_water_percent: 80,
            ..Config::DEFAULT
        };
        let store = Arc::new(crate::store::MemoryStore::new());
        let mut builder = SessionBuilder::new("s").config(config).archive_store(store);
        if let Some(embedder) = embedder {
            builder = builder.embedder(embedder);
        }
        let mut session = builder.build().unwrap();
        if task {
            session.start_task("speed up the build").unwrap();
        }
        // The task starts on the system clock: the notes are as old as that, the filler newer.
        let base = super::super::now_ms();
        let at = |minute: u64| PushOptions {
            timestamp: Some(base + minute * 60_000),
            ..Default::default()
        };
        let notes = ["Enabling sccache halves compile times", "The staging backups run nightly"];
        let ids: Vec<u64> = notes
            .iter()
            .map(|n| session.push_with(&ChatMessage::text(Role::Assistant, *n), at(0)).unwrap().id)
            .collect();
        session.push_with(&ChatMessage::text(Role::User, "go on"), at(1)).unwrap();
        session.compose(&[]).unwrap();
        for i in 0..200u64 {
            let gone: Vec<usize> =
                (0..2).filter(|&k| session.manager().get(ids[k]).is_none()).collect();
            if let [one] = gone.as_slice() {
                return (*one, session);
            }
            assert!(gone.is_empty(), "both left at once");
            let filler = ChatMessage::text(Role::Assistant, format!("step {i}: lorem ipsum dolor"));
            session.push_with(&filler, at(2 + i)).unwrap();
        }
        panic!("neither left");
    }

    #[test]
    fn the_goals_embedding_keeps_a_unit_about_the_task_that_shares_no_word_with_it() {
        // Lexically the two notes tie (neither shares a word with the goal): the older leaves.
        assert_eq!(first_to_leave(None, true).0, 0);
        // With an embedder the note about build speed is relevant to the task and stays.
        let (left, session) = first_to_leave(Some(Arc::new(BuildSpeed)), true);
        assert_eq!(left, 1);
        let stats = session.semantic_stats().unwrap();
        assert_eq!(stats.fallbacks, 0);
        // Without a task nothing is supplied: the older leaves first, as without an embedder.
        let (left, session) = first_to_leave(Some(Arc::new(BuildSpeed)), false);
        assert_eq!(left, 0);
        assert!(session.manager().current_task().is_none());
    }

    #[test]
    fn the_goal_is_embedded_once_per_task() {
        let mut index = index();
        index.goal_vector(1, "speed up the build").unwrap();
        index.goal_vector(1, "speed up the build").unwrap();
        assert_eq!(index.embedded, 1);
        index.goal_vector(2, "write the changelog").unwrap();
        assert_eq!(index.embedded, 2);
    }

    #[test]
    fn vectors_of_another_length_are_refused() {
        let mut index = index();
        index.push(1, vec![1.0, 0.0]).unwrap();
        assert!(matches!(index.push(2, vec![1.0]), Err(EmbedError::Dimensions { .. })));
        assert!(index.nearest(&[1.0], 5, |_| true).is_empty());
    }

    /// Words of one concept share a dimension: a toy model for tests.
    #[cfg(feature = "sqlite")]
    struct Concepts;
    #[cfg(feature = "sqlite")]
    impl Embedder for Concepts {
        fn model(&self) -> &str {
            "concepts"
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let groups: [&[&str]; 3] =
                [&["dog", "puppy", "hound"], &["violin", "cello"], &["rain", "weather"]];
            Ok(texts
                .iter()
                .map(|text| {
                    let lower = text.to_lowercase();
                    let mut v: Vec<f32> = groups
                        .iter()
                        .map(|g| g.iter().filter(|w| lower.contains(*w)).count() as f32)
                        .collect();
                    v.push(0.1);
                    v
                })
                .collect())
        }
    }

    #[cfg(feature = "sqlite")]
    #[derive(Default)]
    struct Broken(std::sync::atomic::AtomicUsize);
    #[cfg(feature = "sqlite")]
    impl Embedder for Broken {
        fn model(&self) -> &str {
            "broken"
        }
        fn embed(&self, _: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(EmbedError::Config("down".into()))
        }
    }

    #[cfg(feature = "sqlite")]
    fn chat(embedder: Option<Arc<dyn Embedder>>) -> Session {
        use crate::message::ChatMessage;
        use ctxwin_core::{Config, Role};
        let config = Config { max_messages: 4, locked_tail: 1, ..Config::DEFAULT };
        let mut builder = super::super::SessionBuilder::new("s").config(config).archive_in_memory();
        if let Some(embedder) = embedder {
            builder = builder.embedder(embedder);
        }
        let mut session = builder.build().unwrap();
        session
            .push(&ChatMessage::text(Role::User, "We adopted a puppy from the shelter."))
            .unwrap();
        for turn in 0..20 {
            let text = format!("Status report {turn}: nothing new on the build.");
            session.push(&ChatMessage::text(Role::User, text)).unwrap();
        }
        session.push(&ChatMessage::text(Role::User, "What about your dog?")).unwrap();
        session
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn hybrid_recall_finds_a_turn_sharing_no_word_with_the_request() {
        let mut lexical = chat(None);
        let mut settings = lexical.retrieval().to_owned();
        settings.max_items = 1;
        settings.neighbours = false;
        let options = super::super::ComposeOptions::new(&[]).retrieval(settings);
        assert!(!lexical.compose_with(options).unwrap().recall.block.contains("puppy"));
        let mut hybrid = chat(Some(Arc::new(Concepts)));
        let payload = hybrid.compose_with(options).unwrap();
        assert!(payload.recall.block.contains("puppy"), "{}", payload.recall.block);
        let stats = hybrid.semantic_stats().unwrap();
        assert_eq!((stats.vectors, stats.fallbacks), (22, 0));
        // Cached in the archive: a fresh index loads them instead of embedding.
        assert_eq!(hybrid.archive().unwrap().usage(hybrid.scope()).unwrap().vectors, 22);
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn a_failing_embedder_falls_back_to_the_lexical_payload() {
        let mut lexical = chat(None);
        let embedder = Arc::new(Broken::default());
        let mut broken = chat(Some(embedder.clone()));
        let payload = broken.compose(&[]).unwrap();
        assert_eq!(payload, lexical.compose(&[]).unwrap());
        let stats = broken.semantic_stats().unwrap();
        assert_eq!(stats.vectors, 0);
        assert!(stats.fallbacks >= 1 && stats.last_error.is_some(), "{stats:?}");
        // Within the cooldown the next build does not ask the embedder again.
        assert_eq!(broken.compose(&[]).unwrap(), payload);
        assert_eq!(embedder.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn forgotten_messages_leave_the_index() {
        let mut session = chat(Some(Arc::new(Concepts)));
        session.sync_vectors().unwrap();
        session.forget_matching("puppy").unwrap();
        assert_eq!(session.semantic_stats().unwrap().vectors, 21);
        assert_eq!(session.archive().unwrap().usage(session.scope()).unwrap().vectors, 21);
    }
}
