//! [`SessionBuilder`]: configuring and opening a [`Session`].

use std::path::PathBuf;
use std::sync::Arc;

use ctxwin_core::{Config, OutboxMode};

use super::checkpointing::{CheckpointPolicy, Checkpointing};
use super::lease::Lease;
#[cfg(feature = "http")]
use super::llm::{LlmOptions, LlmState};
use super::retrieve::Retrieval;
use super::semantic::{EmbedderSlot, SemanticIndex};
use super::stats::SessionCounters;
use super::stores::Stores;
use super::sync::Tracker;
use super::tasks::{TaskDetection, TaskState};
use super::{
    Calibration, Counter, Hybrid, Journal, RetrievalSettings, Session, SessionError, SessionManager,
};
use crate::embed::Embedder;
#[cfg(feature = "http")]
use crate::llm::LlmClient;
use crate::store::{ArchiveStore, CheckpointDir, CheckpointSink, Location, Ports, Scope};
use crate::tokens::{Calibrator, CalibratorConfig, ChatFraming};

/// Checkpoints a session keeps unless told otherwise.
const DEFAULT_KEEP: usize = 10;

/// Where the archive is.
#[derive(Clone, Debug, Default)]
enum ArchiveAt {
    #[default]
    Nowhere,
    /// An SQLite database in memory.
    #[cfg(feature = "sqlite")]
    Memory,
    /// An SQLite database file.
    #[cfg(feature = "sqlite")]
    File(PathBuf),
    /// A port the caller made (shared with other sessions, wrapped, another adapter).
    Store(Arc<dyn ArchiveStore>),
    /// The store at a location, opened at build ([`store::open_bound`](crate::store::open_bound)).
    At(Location),
}

impl ArchiveAt {
    fn is_nowhere(&self) -> bool {
        matches!(self, Self::Nowhere)
    }
}

/// Where the checkpoints are.
#[derive(Clone, Debug, Default)]
enum CheckpointsAt {
    #[default]
    Nowhere,
    /// A directory of this session's own.
    Dir(PathBuf),
    /// A sink the caller made.
    Sink(Arc<dyn CheckpointSink>),
    /// The checkpoint port of the store the archive is at ([`ArchiveAt::At`]).
    WithArchive,
}

/// A session's archive and checkpoint ports, either absent.
type OpenedStores = (Option<Arc<dyn ArchiveStore>>, Option<Arc<dyn CheckpointSink>>);

/// The archive and checkpoint ports `archive` and `checkpoints` name, opened for `scope`.
fn open_stores(
    archive: ArchiveAt,
    checkpoints: CheckpointsAt,
    scope: &Scope,
) -> Result<OpenedStores, SessionError> {
    let mut opened: Option<Ports> = None;
    let archive = match archive {
        ArchiveAt::Nowhere => None,
        #[cfg(feature = "sqlite")]
        ArchiveAt::Memory => {
            Some(Arc::new(crate::store::sqlite::SqliteArchive::open_in_memory()?) as Arc<_>)
        }
        #[cfg(feature = "sqlite")]
        ArchiveAt::File(path) => {
            Some(Arc::new(crate::store::sqlite::SqliteArchive::open(path)?) as _)
        }
        ArchiveAt::Store(store) => Some(store),
        ArchiveAt::At(location) => {
            let ports = crate::store::open_bound(&location, scope)?;
            let archive = ports.archive.clone();
            opened = Some(ports);
            Some(archive)
        }
    };
    let checkpoints: Option<Arc<dyn CheckpointSink>> = match checkpoints {
        CheckpointsAt::Nowhere => None,
        CheckpointsAt::Dir(dir) => Some(Arc::new(CheckpointDir::bound(dir, scope.clone()))),
        CheckpointsAt::Sink(sink) => Some(sink),
        CheckpointsAt::WithArchive => opened.map(|ports| ports.checkpoints),
    };
    Ok((archive, checkpoints))
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
    tenant: String,
    config: Config,
    counter: Counter,
    framing: Option<ChatFraming>,
    archive: ArchiveAt,
    checkpoints: CheckpointsAt,
    checkpoint_policy: CheckpointPolicy,
    keep: usize,
    restore_latest: bool,
    assume_new: bool,
    calibrator: CalibratorConfig,
    #[cfg(feature = "http")]
    llm: Option<LlmClient>,
    #[cfg(feature = "http")]
    llm_options: LlmOptions,
    retrieval: RetrievalSettings,
    embedder: Option<EmbedderSlot>,
    hybrid: Hybrid,
    task_detection: TaskDetection,
    error_memory: Option<bool>,
    supersede: Vec<String>,
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
            tenant: String::new(),
            config: Config::DEFAULT,
            counter: Counter::default(),
            framing: None,
            archive: ArchiveAt::Nowhere,
            checkpoints: CheckpointsAt::Nowhere,
            checkpoint_policy: CheckpointPolicy::DEFAULT,
            keep: DEFAULT_KEEP,
            restore_latest: false,
            assume_new: false,
            calibrator: CalibratorConfig::DEFAULT,
            #[cfg(feature = "http")]
            llm: None,
            #[cfg(feature = "http")]
            llm_options: LlmOptions::default(),
            retrieval: RetrievalSettings::DEFAULT,
            embedder: None,
            hybrid: Hybrid::DEFAULT,
            task_detection: TaskDetection::Off,
            error_memory: None,
            supersede: Vec::new(),
        }
    }

    /// Error memory on or off: a tool error whose signature matches an earlier archived one
    /// brings that error's resolution back into the payload's free room
    /// ([`Session::error_memory`]). By default it is on while the session uses tasks (task
    /// detection on, or a task started), so a session without tasks is unchanged.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let session = SessionBuilder::new("s").error_memory(true).build()?;
    /// assert!(session.error_memory_enabled());
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn error_memory(mut self, on: bool) -> Self {
        self.error_memory = Some(on);
        self
    }

    /// Tools whose result a newer result of the same call (same arguments) supersedes: at a
    /// compaction the core cuts the older to a note, and the archive keeps it whole (none by
    /// default). For file reads: the newer read shows the file as it is now.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let session = SessionBuilder::new("s").supersede(["Read", "read_file"]).build()?;
    /// assert_eq!(session.supersede_tools(), ["Read", "read_file"]);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn supersede(mut self, tools: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.supersede = tools.into_iter().map(Into::into).collect();
        self
    }

    /// How the session finds task boundaries nobody announces ([`TaskDetection::Off`] by
    /// default: only [`Session::start_task`] starts tasks).
    ///
    /// ```
    /// use ctxwin_std::session::{SessionBuilder, TaskDetection};
    /// let session = SessionBuilder::new("s").task_detection(TaskDetection::NewRequest).build()?;
    /// assert_eq!(session.task_detection(), TaskDetection::NewRequest);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn task_detection(mut self, detection: TaskDetection) -> Self {
        self.task_detection = detection;
        self
    }

    /// The tenant the session belongs to: its [`Scope`] in the stores is `(tenant, name)`
    /// (the local tenant `""` by default). Another tenant's rows and checkpoints are never
    /// read, searched or counted.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
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
    #[cfg(feature = "sqlite")]
    pub fn archive(mut self, path: impl Into<PathBuf>) -> Self {
        self.archive = ArchiveAt::File(path.into());
        self
    }

    /// Archives through `store`, a port the caller made: shared with other sessions (one
    /// SQLite connection for all), behind wrappers ([`Deferred`](crate::store::Deferred) to
    /// write many sessions' rows per transaction off the caller's path,
    /// [`Batched`](crate::store::Batched), [`Retrying`](crate::store::Retrying)), or another
    /// adapter. The session writes it in its scope only. Its durability is the port's: see the
    /// [module documentation](super).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Scope};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(MemoryStore::new());
    /// let mut a = SessionBuilder::new("a").archive_store(store.clone()).build()?;
    /// let mut b = SessionBuilder::new("b").tenant("acme").archive_store(store.clone()).build()?;
    /// a.push(&ChatMessage::text(Role::User, "from a"))?;
    /// b.push(&ChatMessage::text(Role::User, "from b"))?;
    /// assert_eq!(store.usage(&Scope::local("a"))?.messages, 1);
    /// assert_eq!(store.usage(&Scope::new("acme", "b"))?.messages, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive_store(mut self, store: Arc<dyn ArchiveStore>) -> Self {
        self.archive = ArchiveAt::Store(store);
        self
    }

    /// Keeps the archive and the checkpoints in `ports`, both ports of one store as
    /// [`store::open`](crate::store::open) returns them (shared by every session of the
    /// process: one SQLite connection or one PostgreSQL pool for all).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{ArchiveStore, CheckpointSink, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
    /// let mut session = SessionBuilder::new("chat").ports(ports).build()?;
    /// session.push(&ChatMessage::text(Role::User, "hello"))?;
    /// session.checkpoint()?;
    /// assert_eq!(store.usage(session.scope())?.messages, 1);
    /// assert_eq!(store.ids(session.scope())?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ports(mut self, ports: Ports) -> Self {
        self.archive = ArchiveAt::Store(ports.archive);
        self.checkpoints = CheckpointsAt::Sink(ports.checkpoints);
        self
    }

    /// Keeps the archive and the checkpoints in the store at `location`, opened at build
    /// for this session ([`store::open_bound`](crate::store::open_bound)): a state
    /// directory's `archive.db` and `checkpoints/`, or a PostgreSQL database
    /// ([`Location::resolve`] reads `CTXWIN_STORE_URL`).
    ///
    /// ```
    /// use ctxwin_std::store::Location;
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let location = Location::Directory(dir.path().to_path_buf());
    /// let mut session = SessionBuilder::new("main").store(location).build()?;
    /// session.push(&ChatMessage::text(Role::User, "hello"))?;
    /// session.checkpoint()?;
    /// assert!(dir.path().join("archive.db").is_file());
    /// assert_eq!(std::fs::read_dir(dir.path().join("checkpoints"))?.count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store(mut self, location: Location) -> Self {
        self.archive = ArchiveAt::At(location);
        self.checkpoints = CheckpointsAt::WithArchive;
        self
    }

    /// Archives to a private in-memory SQLite database (gone with the session).
    #[cfg(feature = "sqlite")]
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

    /// Keeps checkpoints in directory `dir`, the session's own
    /// ([`CheckpointDir::bound`]), created (durably) at the first checkpoint: a new session
    /// writes nothing at build.
    pub fn checkpoints(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checkpoints = CheckpointsAt::Dir(dir.into());
        self
    }

    /// Keeps checkpoints in `sink`, a port the caller made (a directory per scope, memory,
    /// another adapter, wrapped for tests); the session saves and reads its scope only.
    pub fn checkpoint_sink(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.checkpoints = CheckpointsAt::Sink(sink);
        self
    }

    /// Messages between periodic checkpoints (50 by default; 0 disables them). They are taken
    /// only with checkpoints ([`checkpoints`](Self::checkpoints)).
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
    /// On a store that hands out leases (PostgreSQL) the session then
    /// [`reload`](super::Session::reload)s: the newest checkpoint and every message archived
    /// after it (written by another process that served the conversation).
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
    #[cfg(feature = "http")]
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
    #[cfg(feature = "http")]
    pub fn llm_options(mut self, options: LlmOptions) -> Self {
        self.llm_options = options;
        self
    }

    /// The caller's state ([`Session::caller_state`]) in the newest intact checkpoint this
    /// builder would restore, read without building: `None` when there is no checkpoint
    /// (empty for a checkpoint written without one). For a caller whose settings live there
    /// and decide how to build, as a proxy's conversation keeps the window it was created
    /// with. The checkpoints are only read.
    ///
    /// # Errors
    /// Store errors, including `NoUsableCheckpoint` when checkpoints exist and none reads.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let dir = tempfile::tempdir()?;
    /// let builder = || SessionBuilder::new("s").checkpoints(dir.path());
    /// assert_eq!(builder().stored_caller_state()?, None);
    /// let mut session = builder().build()?;
    /// session.set_caller_state(b"window=8192".to_vec());
    /// session.checkpoint()?;
    /// assert_eq!(builder().stored_caller_state()?.as_deref(), Some(&b"window=8192"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stored_caller_state(&self) -> Result<Option<Vec<u8>>, SessionError> {
        let scope = Scope::new(self.tenant.clone(), self.name.clone());
        let sink: Arc<dyn CheckpointSink> = match &self.checkpoints {
            CheckpointsAt::Nowhere => return Ok(None),
            CheckpointsAt::Dir(dir) => Arc::new(CheckpointDir::bound(dir.clone(), scope.clone())),
            CheckpointsAt::Sink(sink) => sink.clone(),
            CheckpointsAt::WithArchive => match &self.archive {
                ArchiveAt::At(location) => crate::store::open_bound(location, &scope)?.checkpoints,
                _ => return Ok(None),
            },
        };
        let mut found = None;
        sink.load_latest(&scope, &mut |bytes| {
            super::persist::caller_state_in(bytes, &self.name).map(|state| found = Some(state))
        })?;
        Ok(found)
    }

    /// Opens the archive and checkpoint sink, allocates the manager and, with
    /// [`restore_latest`](Self::restore_latest), restores the newest intact checkpoint (a
    /// checkpoint directory not created yet holds none). The checkpoints are only read. The
    /// session's fence is the archive's [`acquire`](ArchiveStore::acquire) of its scope.
    ///
    /// # Errors
    /// [`SessionError::Setting`] for an empty name, `keep_checkpoints(0)` or a discarding
    /// outbox with an archive; [`SessionError::Config`]; store errors;
    /// [`SessionError::ArchiveInUse`] when the archive holds messages of this session and no
    /// checkpoint continues them (their ids would be reused).
    ///
    /// ```
    /// use ctxwin_std::session::{SessionBuilder, SessionError};
    /// let error = SessionBuilder::new("").build().unwrap_err();
    /// assert!(matches!(error, SessionError::Setting(_)));
    /// ```
    pub fn build(self) -> Result<Session, SessionError> {
        let configured = self.check()?;
        let scope = Scope::new(self.tenant, self.name);
        let calibrator = Calibrator::with_config(self.calibrator)?;
        let manager = SessionManager::small(configured, self.counter)?;
        let (archive, checkpoints) = open_stores(self.archive, self.checkpoints, &scope)?;
        let fence = match archive.as_deref() {
            Some(archive) => archive.acquire(&scope)?,
            None => crate::store::Fence::NONE,
        };
        let leased = !fence.is_none();
        let mut session = Session {
            scope,
            manager,
            calibration: Calibration { configured, calibrator },
            stores: Stores { archive, checkpoints, lease: Lease::new(fence), keep: self.keep },
            journal: Journal::default(),
            tracker: Tracker::new(),
            counters: SessionCounters::default(),
            checkpointing: Checkpointing::new(self.checkpoint_policy),
            #[cfg(feature = "http")]
            llm: match self.llm {
                Some(client) => Some(LlmState::start(client, self.llm_options)?),
                None => None,
            },
            recall: Retrieval {
                settings: self.retrieval,
                semantic: self.embedder.map(|slot| SemanticIndex::new(slot, self.hybrid)),
                line_costs: crate::tokens::CountCache::new(super::retrieve::LINE_COSTS),
                searches: std::sync::atomic::AtomicU64::new(0),
            },
            task_state: TaskState {
                detection: self.task_detection,
                error_memory_setting: self.error_memory,
                ..TaskState::default()
            },
            supersede: self.supersede.into(),
        };
        let restored = if self.assume_new {
            // Nothing stored: the empty session is what the store reproduces.
            session.note_reproducible();
            None
        } else if leased && self.restore_latest {
            // Under a lease, the newest checkpoint and every row written after it.
            session.reload_under(fence)?.checkpoint
        } else {
            let restored = match self.restore_latest {
                true => session.restore_latest_if_any()?.map(|report| report.id),
                false => None,
            };
            if restored.is_none() {
                session.refuse_archived_name()?;
                // No row, and no checkpoint either: the empty session is what the store
                // reproduces.
                if leased && session.checkpoints_stored()? == 0 {
                    session.note_reproducible();
                }
            }
            restored
        };
        tracing::info!(
            scope = %session.scope,
            restored = ?restored.as_ref().map(ToString::to_string),
            fence = fence.0,
            "session: opened"
        );
        Ok(session)
    }

    /// The configuration with framing applied, once every setting is checked.
    fn check(&self) -> Result<Config, SessionError> {
        if self.name.is_empty() {
            return Err(SessionError::Setting("the session name must not be empty".into()));
        }
        if self.keep == 0 {
            return Err(SessionError::Setting("keep_checkpoints must be at least 1".into()));
        }
        let mut configured = self.config;
        if let Some(framing) = self.framing {
            configured = framing.apply(configured);
        }
        if !self.archive.is_nowhere() && configured.outbox == OutboxMode::Discard {
            return Err(SessionError::Setting(
                "OutboxMode::Discard would release evicted units unarchived; use OutboxMode::Hold with an archive".into(),
            ));
        }
        #[cfg(feature = "http")]
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
        Ok(configured)
    }
}

impl Session {
    /// How many checkpoints of the session's scope are stored.
    fn checkpoints_stored(&self) -> Result<usize, SessionError> {
        Ok(match self.stores.checkpoints.as_deref() {
            Some(sink) => sink.ids(&self.scope)?.len(),
            None => 0,
        })
    }

    /// A new session (no checkpoint continues it) whose name the archive already holds
    /// messages of would reuse their ids: refused.
    fn refuse_archived_name(&self) -> Result<(), SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(()) };
        if archive.max_id(&self.scope)?.is_none() {
            return Ok(());
        }
        let messages = archive.usage(&self.scope)?.messages;
        Err(SessionError::ArchiveInUse { session: self.scope.to_string(), messages })
    }
}
