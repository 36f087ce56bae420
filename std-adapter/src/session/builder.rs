//! [`SessionBuilder`]: configuring and opening a [`Session`].

use std::num::NonZeroUsize;
use std::path::PathBuf;

use ctxwin_core::{Config, OutboxMode};

use super::llm::{LlmOptions, LlmState};
use super::semantic::{EmbedderSlot, SemanticIndex};
use super::stats::SessionCounters;
use super::sync::Tracker;
use super::{Counter, Hybrid, RetrievalSettings, Session, SessionError, SessionManager};
use crate::archive::{Archive, ArchiveWriter};
use crate::checkpoint::{CheckpointPolicy, CheckpointStore, DEFAULT_KEEP, PeriodicCheckpointer};
use crate::embed::Embedder;
use crate::llm::LlmClient;
use crate::tokens::{Calibrator, CalibratorConfig, ChatFraming};

/// Where the archive lives.
#[derive(Clone, Debug, Default)]
enum ArchiveAt {
    #[default]
    Nowhere,
    Memory,
    File(PathBuf),
    /// A handle shared with other sessions (one connection for all).
    Shared(Archive),
}

impl ArchiveAt {
    fn is_nowhere(&self) -> bool {
        matches!(self, Self::Nowhere)
    }
}

/// Configures a [`Session`]: its name, the core's configuration, the token counter, chat
/// framing, archive, checkpoints and calibration.
///
/// ```
/// use ctxwin_core::Config;
/// use ctxwin_std::session::{Counter, SessionBuilder};
/// use ctxwin_std::tokens::{ChatFraming, ExactCounter};
///
/// let dir = tempfile::tempdir()?;
/// let session = SessionBuilder::new("agent-1")
///     .config(Config { context_window: 128_000, working_budget: 90_000, ..Config::DEFAULT })
///     .counter(Counter::Exact(ExactCounter::cl100k()?))
///     .framing(ChatFraming::OPENAI)
///     .archive(dir.path().join("archive.db"))
///     .checkpoints(dir.path().join("snapshots"))
///     .checkpoint_interval_messages(20)
///     .keep_checkpoints(5)
///     .restore_latest(true)
///     .build()?;
/// assert_eq!(session.manager().budget(), 128_000 - 4_096);
/// assert_eq!(session.stats()?.counter, "exact");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct SessionBuilder {
    name: String,
    config: Config,
    counter: Counter,
    framing: Option<ChatFraming>,
    archive: ArchiveAt,
    checkpoints: Option<PathBuf>,
    checkpoint_policy: CheckpointPolicy,
    keep: usize,
    restore_latest: bool,
    assume_new: bool,
    calibrator: CalibratorConfig,
    llm: Option<LlmClient>,
    llm_options: LlmOptions,
    retrieval: RetrievalSettings,
    embedder: Option<EmbedderSlot>,
    hybrid: Hybrid,
    writer: Option<ArchiveWriter>,
}

impl SessionBuilder {
    /// A session called `name` (its key in the archive), with [`Config::DEFAULT`], the
    /// estimator, no archive and no checkpoints.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert!(session.archive().is_none());
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            config: Config::DEFAULT,
            counter: Counter::default(),
            framing: None,
            archive: ArchiveAt::Nowhere,
            checkpoints: None,
            checkpoint_policy: CheckpointPolicy::DEFAULT,
            keep: DEFAULT_KEEP.get(),
            restore_latest: false,
            assume_new: false,
            calibrator: CalibratorConfig::DEFAULT,
            llm: None,
            llm_options: LlmOptions::default(),
            retrieval: RetrievalSettings::DEFAULT,
            embedder: None,
            hybrid: Hybrid::DEFAULT,
            writer: None,
        }
    }

    /// The core's budgets and policies. With an archive, `outbox` must be
    /// [`OutboxMode::Hold`] (the default): the session drains the outbox itself.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The token counter (the estimator by default).
    pub fn counter(mut self, counter: impl Into<Counter>) -> Self {
        self.counter = counter.into();
        self
    }

    /// The chat API's framing: sets the config's `message_overhead` and `request_overhead`
    /// (applied at build, whatever the call order).
    ///
    /// ```
    /// use ctxwin_std::tokens::ChatFraming;
    /// let session = ctxwin_std::session::SessionBuilder::new("s").framing(ChatFraming::new(6, 4)).build()?;
    /// assert_eq!(session.manager().config().message_overhead, 6);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn framing(mut self, framing: ChatFraming) -> Self {
        self.framing = Some(framing);
        self
    }

    /// Archives to the SQLite database at `path` (created if needed; shared by sessions).
    pub fn archive(mut self, path: impl Into<PathBuf>) -> Self {
        self.archive = ArchiveAt::File(path.into());
        self
    }

    /// Archives through `archive`, a handle other sessions hold clones of: the sessions share
    /// its one SQLite connection (page cache, compiled statements) instead of opening one each,
    /// and take turns on it. A process running many sessions on one archive (the proxy) saves
    /// a connection's memory (about 200 KiB) per session, and rereads no pages another
    /// connection wrote.
    ///
    /// ```
    /// use ctxwin_std::archive::Archive;
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let archive = Archive::open_in_memory()?;
    /// let mut a = SessionBuilder::new("a").archive_shared(&archive).build()?;
    /// let mut b = SessionBuilder::new("b").archive_shared(&archive).build()?;
    /// a.push(&ChatMessage::text(Role::User, "from a"))?;
    /// b.push(&ChatMessage::text(Role::User, "from b"))?;
    /// assert_eq!(archive.message_count(None)?, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive_shared(mut self, archive: &Archive) -> Self {
        self.archive = ArchiveAt::Shared(archive.clone());
        self
    }

    /// Hands the session's archive rows to `writer`, a background writer shared with other
    /// sessions, instead of committing them on the caller's path; archives through the
    /// writer's archive (as [`archive_shared`](Self::archive_shared) with it does). The build
    /// fails with [`SessionError::Setting`] when a later `archive*` call names another
    /// archive: the writer must write the connection the session reads.
    ///
    /// Rows that would be written at once (at [`end_batch`](super::Session::end_batch), or
    /// after each push outside a batch) are queued instead, and the writer commits what many
    /// sessions queued in one transaction. Whatever reads the archive or depends on its rows
    /// waits for this session's rows first: [`checkpoint`](super::Session::checkpoint),
    /// [`restore`](super::Session::restore), the `forget` calls, [`stats`](super::Session::stats),
    /// retrieval ([`recall`](super::Session::recall), [`retrieve`](super::Session::retrieve),
    /// composing with retrieval on; composing without retrieval does not wait), the
    /// semantic index's catch-up, LLM summary jobs, and dropping the session.
    ///
    /// **Durability.** A row is committed when [`sync_archive`](super::Session::sync_archive)
    /// or [`checkpoint`](super::Session::checkpoint) returns `Ok` (or the writer's
    /// [`wait`](ArchiveWriter::wait) on a later ticket does), and not before: the session may
    /// already have let the core release evicted units whose rows are still queued, so a
    /// process crash before then loses those rows, exactly like an open batch today. A
    /// checkpoint never covers uncommitted rows, so restoring after a crash gives a
    /// consistent state that lacks the turns after it; the proxy's clients resend their
    /// whole history, and the proxy pushes those turns again. A failed commit loses nothing
    /// while the process lives: the writer keeps the rows queued and retries them, and the
    /// waiting call returns [`ArchiveError::DeferredWrite`](crate::archive::ArchiveError).
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchiveWriter};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let archive = Archive::open_in_memory()?;
    /// let writer = ArchiveWriter::spawn(&archive)?;
    /// let mut a = SessionBuilder::new("a").archive_writer(&writer).build()?;
    /// let mut b = SessionBuilder::new("b").archive_writer(&writer).build()?;
    /// for session in [&mut a, &mut b] {
    ///     session.begin_batch();
    ///     session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
    ///     session.push(&ChatMessage::text(Role::Assistant, "Yes."))?;
    ///     session.end_batch()?; // queued, not committed
    /// }
    /// b.sync_archive()?; // a's rows were queued first: committed too
    /// assert_eq!(archive.message_count(None)?, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive_writer(mut self, writer: &ArchiveWriter) -> Self {
        self.archive = ArchiveAt::Shared(writer.archive().clone());
        self.writer = Some(writer.clone());
        self
    }

    /// Archives to a private in-memory database (gone with the session).
    pub fn archive_in_memory(mut self) -> Self {
        self.archive = ArchiveAt::Memory;
        self
    }

    /// How the session retrieves archived turns into payloads ([`RetrievalSettings::DEFAULT`]:
    /// automatically for the live request, into all the free room).
    pub fn retrieval(mut self, settings: RetrievalSettings) -> Self {
        self.retrieval = settings;
        self
    }

    /// Ranks archived turns for recall by BM25 fused with the cosine similarity of `embedder`'s
    /// vectors ([`Hybrid`]), instead of BM25 alone. Needs an archive (vectors are cached
    /// there, keyed by message and [`Embedder::model`]). A failing or slow embedder never
    /// fails a build: that build ranks lexically
    /// ([`SemanticStats::fallbacks`](super::SemanticStats)).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::embed::HttpEmbedder;
    /// use ctxwin_std::session::{SessionBuilder, SessionError};
    /// let embedder = Arc::new(HttpEmbedder::new("http://127.0.0.1:8090", "all-MiniLM-L6-v2")?);
    /// let session = SessionBuilder::new("s").archive_in_memory().embedder(embedder.clone()).build()?;
    /// assert_eq!(session.semantic_stats().unwrap().model, "all-MiniLM-L6-v2");
    /// let no_archive = SessionBuilder::new("s").embedder(embedder).build();
    /// assert!(matches!(no_archive, Err(SessionError::Setting(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn embedder(mut self, embedder: std::sync::Arc<dyn Embedder>) -> Self {
        self.embedder = Some(EmbedderSlot(embedder));
        self
    }

    /// The fusion parameters of hybrid recall ([`Hybrid::DEFAULT`]; used with
    /// [`embedder`](Self::embedder)).
    pub fn hybrid(mut self, hybrid: Hybrid) -> Self {
        self.hybrid = hybrid;
        self
    }

    /// Keeps checkpoints in directory `dir`, created (durably) at the first checkpoint: a new
    /// session writes nothing at build. Give each session its own directory: a restore skips
    /// checkpoints of other sessions, and retention counts them all.
    pub fn checkpoints(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoints = Some(dir.into());
        self
    }

    /// Messages between periodic checkpoints (50 by default; 0 disables them). They are taken
    /// only with a checkpoint store ([`checkpoints`](Self::checkpoints)).
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role, session::SessionBuilder};
    /// let dir = tempfile::tempdir()?;
    /// let mut session =
    ///     SessionBuilder::new("s").checkpoints(dir.path()).checkpoint_interval_messages(2).build()?;
    /// session.push(&ChatMessage::text(Role::User, "one"))?;
    /// let report = session.push(&ChatMessage::text(Role::User, "two"))?;
    /// assert!(report.checkpoint.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_interval_messages(mut self, messages: u32) -> Self {
        self.checkpoint_policy = CheckpointPolicy::every(messages);
        self
    }

    /// How many checkpoints to keep (10 by default; at least 1).
    pub fn keep_checkpoints(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }

    /// Whether to continue from the newest intact checkpoint at build (when there is one).
    pub fn restore_latest(mut self, restore: bool) -> Self {
        self.restore_latest = restore;
        self
    }

    /// Declares that nothing of this session is stored: no checkpoint in its directory and
    /// no archived message under its name. [`build`](Self::build) then reads neither (no
    /// directory listing, no archive query), which makes building a session a few
    /// microseconds of memory work. For callers that know what they stored, as the proxy does
    /// for a conversation it has never seen; a wrong claim would reuse the ids of archived
    /// messages, so without that knowledge leave it off (the default).
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let session = SessionBuilder::new("fresh").archive_in_memory().assume_new(true).build()?;
    /// assert_eq!(session.manager().history().count(), 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn assume_new(mut self, new: bool) -> Self {
        self.assume_new = new;
        self
    }

    /// How the calibrator weighs usage reports.
    pub fn calibrator(mut self, config: CalibratorConfig) -> Self {
        self.calibrator = config;
        self
    }

    /// Rewrites the core's summaries and extracts entity values with the model `client`
    /// talks to, on a background worker thread, as [`LlmOptions`] say (both by default). Needs
    /// an archive: jobs read a summary's sources back from it. See
    /// [`Session::wait_for_summaries`](super::Session::wait_for_summaries).
    ///
    /// ```
    /// use ctxwin_std::llm::LlmClientBuilder;
    /// use ctxwin_std::session::{SessionBuilder, SessionError};
    /// let client = LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let session = SessionBuilder::new("s").archive_in_memory().llm(client.clone()).build()?;
    /// assert!(session.llm_stats().is_some());
    /// let no_archive = SessionBuilder::new("s").llm(client).build();
    /// assert!(matches!(no_archive, Err(SessionError::Setting(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn llm(mut self, client: LlmClient) -> Self {
        self.llm = Some(client);
        self
    }

    /// What the model is used for (with [`llm`](Self::llm)).
    ///
    /// ```
    /// use ctxwin_std::session::{LlmOptions, SessionBuilder};
    /// let builder = SessionBuilder::new("s").llm_options(LlmOptions { extraction: false, ..LlmOptions::default() });
    /// assert!(builder.build().is_ok());
    /// ```
    pub fn llm_options(mut self, options: LlmOptions) -> Self {
        self.llm_options = options;
        self
    }

    /// Opens the archive and checkpoint store, allocates the manager and, with
    /// [`restore_latest`](Self::restore_latest), restores the newest intact checkpoint (a
    /// checkpoint directory not created yet holds none). The checkpoint store is only read.
    ///
    /// # Errors
    /// [`SessionError::Setting`] for an empty name, `keep_checkpoints(0)` or a discarding
    /// outbox with an archive; [`SessionError::Config`]; archive and store errors;
    /// [`SessionError::ArchiveInUse`] when the archive holds messages of this session and no
    /// checkpoint continues them (their ids would be reused).
    ///
    /// ```
    /// use ctxwin_std::session::{SessionBuilder, SessionError};
    /// let error = SessionBuilder::new("").build().unwrap_err();
    /// assert!(matches!(error, SessionError::Setting(_)));
    /// ```
    pub fn build(self) -> Result<Session, SessionError> {
        if self.name.is_empty() {
            return Err(SessionError::Setting("the session name must not be empty".into()));
        }
        let keep = NonZeroUsize::new(self.keep)
            .ok_or_else(|| SessionError::Setting("keep_checkpoints must be at least 1".into()))?;
        let mut configured = self.config;
        if let Some(framing) = self.framing {
            configured = framing.apply(configured);
        }
        if !self.archive.is_nowhere() && configured.outbox == OutboxMode::Discard {
            return Err(SessionError::Setting(
                "OutboxMode::Discard would release evicted units unarchived; use OutboxMode::Hold with an archive".into(),
            ));
        }
        if self.llm.is_some() && self.archive.is_nowhere() {
            return Err(SessionError::Setting(
                "LLM summaries read their sources from the archive: add .archive(path) or .archive_in_memory()".into(),
            ));
        }
        if self.embedder.is_some() && self.archive.is_nowhere() {
            return Err(SessionError::Setting(
                "semantic recall caches vectors in the archive: add .archive(path) or .archive_in_memory()".into(),
            ));
        }
        let calibrator = Calibrator::with_config(self.calibrator)?;
        let manager = SessionManager::small(configured, self.counter)?;
        let archive = match self.archive {
            ArchiveAt::Nowhere => None,
            ArchiveAt::Memory => Some(Archive::open_in_memory()?),
            ArchiveAt::File(path) => Some(Archive::open(path)?),
            ArchiveAt::Shared(archive) => Some(archive),
        };
        let deferred = super::deferred::Deferred::for_archive(self.writer, archive.as_ref())?;
        let store = self.checkpoints.map(|dir| CheckpointStore::lazy(dir).with_keep(keep));
        let mut session = Session {
            name: self.name,
            manager,
            configured,
            archive,
            store,
            periodic: PeriodicCheckpointer::new(self.checkpoint_policy),
            calibrator,
            tracker: Tracker::new(),
            counters: SessionCounters::default(),
            last_checkpoint: None,
            pending_rows: Vec::new(),
            phantom: None,
            trusted_from: 1,
            llm: match self.llm {
                Some(client) => Some(LlmState::start(client, self.llm_options)?),
                None => None,
            },
            retrieval: self.retrieval,
            semantic: self.embedder.map(|slot| SemanticIndex::new(slot, self.hybrid)),
            batch: None,
            deferred,
        };
        let restored = if self.restore_latest && !self.assume_new {
            session.restore_latest_if_any()?
        } else {
            None
        };
        if restored.is_none()
            && !self.assume_new
            && let Some(archive) = session.archive.as_ref()
        {
            session.archive_settled()?;
            let messages = archive.message_count(Some(&session.name))?;
            if messages > 0 {
                return Err(SessionError::ArchiveInUse { session: session.name.clone(), messages });
            }
        }
        tracing::info!(
            session = %session.name,
            restored = ?restored.as_ref().map(|r| r.id.to_string()),
            "session: opened"
        );
        Ok(session)
    }
}
