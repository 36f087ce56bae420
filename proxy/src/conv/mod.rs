//! One conversation: a [`Session`] (archive rows, checkpoints, calibration) and what the
//! proxy recorded of the messages it holds (`state`: fingerprints, session ids, content
//! blocks), kept in the session's checkpoints. A message is stored once: its archive row,
//! which keeps the client's raw JSON, plus the snapshot.
//!
//! Its steps: [`Conv::ingest`] takes a request's new messages, [`Conv::compose`] writes the
//! body to forward, [`Conv::record_answer`] keeps the upstream's answer for the next request.

mod answer;
pub mod bill;
mod cold;
mod compose;
mod fleet;
mod ingest;
mod measure;
mod paths;
mod recall;
mod settings;
mod state;
mod stored;
mod stores;
mod validate;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxwin_std::core::Error as CoreError;
use ctxwin_std::core::counter::TokenCounter;
use ctxwin_std::session::{Session, SessionError};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{Deferred, StoreError};
use serde_json::Value;

pub use paths::{conv_dir, is_tenant_key};
pub use settings::{ConvSettings, RECALL_LIMIT_FACTOR, WHOLE};
pub use stored::stored_bills;
pub use stores::{
    ARCHIVE_CACHE_KIB, LEFTOVER_SIDE_STORE, LocalStores, Stores, fleet_secret, fleet_secret_scope,
    open_fleet, open_stores, persisted_keys, prepare_state,
};

use crate::wire::{PromptRanges, Provider, Request};
use bill::{Bill, Forwarded};
use state::Recorded;

/// What went wrong in a conversation.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    /// The session refused or failed.
    #[error("{0}")]
    Session(#[from] SessionError),
    /// The archive failed.
    #[error("archive: {0}")]
    Store(#[from] StoreError),
    /// What the conversation recorded, in its checkpoint, does not read (never reset: the
    /// conversation is refused until it is repaired or removed).
    #[error("conversation state: {0}")]
    State(String),
    /// The state directory failed.
    #[error("state directory: {0}")]
    Io(#[from] std::io::Error),
    /// A message of the request does not read.
    #[error("{0}")]
    BadRequest(String),
    /// The conversation was unloaded while a request held its lock (never expected).
    #[error("the conversation is not loaded")]
    Unloaded,
}

impl ConvError {
    /// The core refusal behind this error, if it is one.
    pub fn core(&self) -> Option<&CoreError> {
        match self {
            ConvError::Session(SessionError::Core(error)) => Some(error),
            ConvError::Session(SessionError::AfterStore { source, .. }) => match source.as_ref() {
                SessionError::Core(error) => Some(error),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether this says another instance of the fleet took the conversation (the session
    /// has reloaded; the request is redone on the new state).
    pub fn is_overtaken(&self) -> bool {
        match self {
            ConvError::Session(error) => error.is_overtaken(),
            ConvError::Store(error) => error.kind() == ctxwin_std::store::ErrorKind::Fenced,
            _ => false,
        }
    }
}

/// How an incoming history relates to what the session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingest {
    /// It extends the recorded sequence: `new` messages were pushed; `tokens_in` is the
    /// estimated cost of the whole history the client sent.
    Extended {
        /// Messages pushed now.
        new: usize,
        /// Estimated tokens of every incoming message.
        tokens_in: u64,
        /// Units evicted by the pushes.
        evicted: usize,
    },
    /// It differs from the recorded sequence at this index: nothing was pushed.
    Diverged(usize),
}

/// A composed request body.
#[derive(Debug)]
pub struct Composed {
    /// The body to forward.
    pub body: Vec<u8>,
    /// Its estimated tokens (the session's count).
    pub tokens: u32,
    /// Units evicted to compose it.
    pub evicted: usize,
    /// The emitted message prefix is the same as last time (the provider's prompt cache holds).
    pub cache_stable: bool,
    /// Compression ratios of the tasks that finished since the previous payload (their
    /// messages' tokens over their summary's).
    pub tasks_finished: Vec<f64>,
    /// Where the prompt (`tools`, `system`, `messages`) is in `body`.
    pub prompt: PromptRanges,
    /// The body declares the recall tool: the proxy answers its calls.
    pub recall: bool,
    /// Tokens the budget leaves after the payload: what recalled text may take.
    pub room: u32,
}

/// One conversation, resident.
pub struct Conv {
    key: String,
    provider: Provider,
    session: Session,
    /// The archive's writer thread (`None` in a fleet: rows are written in the session's own
    /// transactions, under its lease).
    writer: Option<Arc<Deferred<SqliteArchive>>>,
    /// Served by a fleet: other instances may serve it too ([`Conv::catch_up`]).
    fleet: bool,
    /// In a fleet: the conversation moves between instances (another one served it before
    /// this one loaded it, or since: a catch-up found it, or a write was refused as stale),
    /// so its requests read the lease first ([`Conv::lease_proved_by_writes`]), until
    /// [`QUIET_CHECKS`](fleet::QUIET_CHECKS) reads in a row find it still here.
    roams: bool,
    /// Lease reads in a row that found the conversation still this instance's.
    quiet: u32,
    /// The raw hash of the last request's tool definitions and the fingerprint they had
    /// then: the same bytes again, with the same fingerprint recorded, are not parsed and
    /// fingerprinted again ([`Conv::tools_to_push`]; not kept in checkpoints).
    tools_seen: (u64, u64),
    /// The session's reloads this conversation's record was rebuilt for.
    seen_reloads: u64,
    /// In a fleet: the id after the last message the record in the newest checkpoint names
    /// (what a rebuild reads again is the rows from it: [`Conv::replay_length`]). The
    /// session's own checkpoints carry the record last set, so only this conversation's
    /// move it.
    stored_next: u64,
    /// What the session holds, message by message; in the checkpoints.
    recorded: Recorded,
    /// Tokens per `" ~"` of the filler that stands for an opaque block's cost.
    filler_rate: f64,
    /// What the conversation was opened with.
    settings: ConvSettings,
    /// The reply reserve the session is configured with: the largest `max_tokens` a request
    /// asked for since the conversation was loaded (`None` before its first request); in a
    /// fleet, since any instance loaded it (the newest checkpoint's, [`Conv::catch_up`]).
    reserve: Option<u32>,
    /// Session ids of the messages the last payload emitted.
    last_emitted: Vec<u64>,
    /// Block hashes of the last forwarded prompt ([`bill::prompt_blocks`]; not kept in
    /// checkpoints).
    prompt_blocks: Vec<u64>,
    /// The forwarded request waiting for its answer, measured ([`Conv::measure`]).
    forwarded: Option<Forwarded>,
    /// The newest task number counted in the metrics.
    tasks_reported: u32,
    /// Some message of this conversation has left the core (evicted or summarized): only then
    /// can retrieval find anything the payload does not hold already.
    evicted_any: bool,
    /// The retrieved block sent with every payload since the last compaction (not kept in
    /// checkpoints: retrieved again after a restart).
    recalled: Option<String>,
    /// The time of the request being taken, ms since the Unix epoch, when its client says it
    /// (`[proxy] clock_header`); 0: the wall clock ([`Conv::set_request_time`]).
    request_at_ms: u64,
    /// Something left the core since the last payload was composed (a compaction in this
    /// request: the cached prefix is rewritten anyway).
    recall_stale: bool,
    /// The session id of the live request (the newest user message) `recalled` was retrieved
    /// for.
    recalled_for: Option<u64>,
    /// Units a compose evicted before it stopped for a new retrieved block
    /// ([`Conv::compose_in_memory`]): counted by the compose that finishes the payload.
    evicted_unsent: usize,
    dirty: bool,
    exchanges: u32,
    last_used: Instant,
    /// The upstream's last answer, not in the session: the next request carries the client's
    /// copy of it (pushed with its messages) or supersedes it; kept in the checkpoints.
    pending_answer: Option<Value>,
    /// The client's own tool is named like the recall tool, which is then not declared:
    /// said once.
    recall_clash_logged: bool,
}

impl std::fmt::Debug for Conv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conv")
            .field("key", &self.key)
            .field("entries", &self.recorded.entries.len())
            .finish_non_exhaustive()
    }
}

/// Generations a conversation may start (after crashes before a first checkpoint, or over
/// checkpoints of an older proxy) before it is refused.
const MAX_GENERATIONS: u32 = 1_000;

/// In a fleet, a conversation is checkpointed (idle, every `checkpoint_every` exchanges, on
/// unload or shutdown) only once this many messages were archived after its newest
/// checkpoint: until then its rows hold all another instance needs to serve it (the proxy's
/// record is rebuilt from them), and a reload replays at most about this many.
const FLEET_CHECKPOINT_ROWS: u64 = 32;

/// Rows queued to the archive's writer past which a request's work leaves the async threads
/// (queueing more would wait for room).
const WRITER_BACKLOG: usize = 5_000;

/// Bytes queued to the archive's writer past which a request's work leaves the async threads:
/// a quarter of what the writer queues before a write waits for room (rows of 2 MB bodies'
/// tool outputs reach that bound long before the row count does).
const WRITER_BACKLOG_BYTES: usize =
    ctxwin_std::store::DeferredOptions::DEFAULT.max_queued_bytes / 4;

impl Conv {
    /// Opens (or creates) conversation `key` in `state_dir`, continuing from its newest
    /// checkpoint. A new conversation uses the window of `settings`; an existing one keeps the
    /// window it was created with. Opening a new conversation writes nothing: its checkpoint directory is
    /// written at its first checkpoint.
    ///
    /// The session's name in the shared archive is the key, or `key#N` after a crash left
    /// rows of a generation that never reached a checkpoint, or its checkpoints were written
    /// by an older proxy (whose index of them was `proxy.db`, no longer read): those rows
    /// stay, under their name, and the client's resend starts the next generation.
    ///
    /// # Errors
    /// Session, store and I/O errors; [`ConvError::State`] when the recorded messages in the
    /// checkpoint do not read.
    pub fn open(
        state_dir: &Path,
        stores: &Stores,
        key: &str,
        provider: Provider,
        settings: &ConvSettings,
    ) -> Result<Self, ConvError> {
        let local = match stores {
            Stores::Local(local) => local,
            Stores::Fleet(ports) => return Self::open_fleet(ports, key, provider, settings),
        };
        let dir = conv_dir(state_dir, key);
        for generation in 0..MAX_GENERATIONS {
            let (name, checkpoints) = paths::generation(key, &dir, generation);
            let builder = settings.policies(stores::session_builder(local, &name, checkpoints));
            let stored = builder.stored_caller_state()?;
            let window = match stored.as_deref() {
                Some([]) => {
                    tracing::warn!(session = %name, "proxy: checkpoints of an older proxy (its index was proxy.db, not read); starting the next generation");
                    continue;
                }
                Some(bytes) => Recorded::decode(bytes).map_err(ConvError::State)?.window,
                None => settings.window,
            };
            let config = settings.session_config(window, settings.reserve, 0);
            let built = builder.config(config).restore_latest(true).build();
            match built {
                Ok(session) if session.caller_state().is_empty() && stored.is_some() => {
                    tracing::warn!(session = %name, "proxy: an older proxy's checkpoint restored; starting the next generation");
                }
                Ok(session) => {
                    let settings = ConvSettings { window, ..settings.clone() };
                    return Self::restored(key, provider, session, stores, settings);
                }
                Err(SessionError::ArchiveInUse { messages, .. })
                    if generation + 1 < MAX_GENERATIONS =>
                {
                    tracing::warn!(session = %name, messages, "proxy: archived rows without a checkpoint (a crash before the first one); starting the next generation");
                }
                Err(error) => return Err(error.into()),
            }
        }
        Err(ConvError::State(format!("{MAX_GENERATIONS} generations of {key} are unusable")))
    }

    /// A conversation around `session` as built or restored: what it recorded, from the
    /// checkpoint (nothing for a new one).
    fn restored(
        key: &str,
        provider: Provider,
        session: Session,
        stores: &Stores,
        settings: ConvSettings,
    ) -> Result<Self, ConvError> {
        let recorded = match session.caller_state() {
            [] => Recorded::new(settings.window),
            bytes => Recorded::decode(bytes).map_err(ConvError::State)?,
        };
        let pending = recorded.pending.as_deref().map(serde_json::from_str).transpose();
        let pending = pending.map_err(|e| ConvError::State(format!("the waiting answer: {e}")))?;
        let mut conv = Self::from_parts(key, provider, session, stores, recorded, settings);
        conv.pending_answer = pending;
        conv.evicted_any = conv
            .recorded
            .entries
            .iter()
            .flat_map(|e| e.ids.iter())
            .any(|id| conv.session.manager().get(*id).is_none());
        Ok(conv)
    }

    /// Creates conversation `key`, which the caller knows has nothing stored (no archived
    /// messages, no checkpoint: [`persisted_keys`] lists those that do): memory work only, no
    /// read and no write. Its window is written with its first checkpoint. In a fleet, where
    /// another instance may have stored it since, it is [`open`](Self::open)ed.
    ///
    /// # Errors
    /// Session errors (a configuration the core refuses).
    pub fn create(
        state_dir: &Path,
        stores: &Stores,
        key: &str,
        provider: Provider,
        settings: &ConvSettings,
    ) -> Result<Self, ConvError> {
        let local = match stores {
            Stores::Local(local) => local,
            Stores::Fleet(ports) => return Self::open_fleet(ports, key, provider, settings),
        };
        let checkpoints = conv_dir(state_dir, key).join("checkpoints");
        let session = settings
            .policies(stores::session_builder(local, key, checkpoints))
            .config(settings.session_config(settings.window, settings.reserve, 0))
            .assume_new(true)
            .build()?;
        let recorded = Recorded::new(settings.window);
        Ok(Self::from_parts(key, provider, session, stores, recorded, settings.clone()))
    }

    /// A conversation around `session`, which holds what `recorded` says.
    fn from_parts(
        key: &str,
        provider: Provider,
        session: Session,
        stores: &Stores,
        recorded: Recorded,
        settings: ConvSettings,
    ) -> Self {
        let sample = " ~".repeat(1_000);
        let filler_rate = f64::from(session.manager().counter().count(&sample)).max(1.0) / 1_000.0;
        // Tasks a restored conversation finished before were counted then.
        let tasks_reported =
            session.tasks().iter().filter(|t| !t.is_open()).map(|t| t.number()).max().unwrap_or(0);
        Self {
            key: key.to_string(),
            provider,
            writer: match stores {
                Stores::Local(local) => Some(local.writer.clone()),
                Stores::Fleet(_) => None,
            },
            fleet: stores.is_fleet(),
            roams: false,
            quiet: 0,
            tools_seen: (0, 0),
            seen_reloads: session.counters().reloads,
            stored_next: session.manager().next_id(),
            session,
            recorded,
            filler_rate,
            settings,
            reserve: None,
            last_emitted: Vec::new(),
            prompt_blocks: Vec::new(),
            forwarded: None,
            tasks_reported,
            evicted_any: false,
            recalled: None,
            request_at_ms: 0,
            recall_stale: false,
            recalled_for: None,
            evicted_unsent: 0,
            dirty: false,
            exchanges: 0,
            last_used: Instant::now(),
            pending_answer: None,
            recall_clash_logged: false,
        }
    }

    /// Takes the next request as sent at `at_ms` (ms since the Unix epoch): its messages are
    /// stamped with it, and the pause before it is measured to it. 0: the wall clock.
    pub fn set_request_time(&mut self, at_ms: u64) {
        self.request_at_ms = at_ms;
    }

    /// The time of the request being taken: [`Conv::set_request_time`]'s, else the wall
    /// clock.
    fn request_time(&self) -> u64 {
        match self.request_at_ms {
            0 => measure::unix_ms(),
            at => at,
        }
    }

    /// The conversation's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The session (for stats and tests).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// What the conversation cost so far ([`bill`]).
    pub fn bill(&self) -> &Bill {
        &self.recorded.bill
    }

    /// Messages recorded.
    pub fn len(&self) -> usize {
        self.recorded.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.recorded.entries.is_empty()
    }

    /// Whether something changed since the last checkpoint.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// How long since the conversation was last used.
    pub fn idle(&self) -> Duration {
        self.last_used.elapsed()
    }

    /// Bytes of `request`'s items past the ones recorded: what [`ingest`](Self::ingest)
    /// reads, counts and queues for the archive (a bound: a request that diverges pushes
    /// less, or nothing).
    pub fn new_bytes(&self, request: &Request) -> usize {
        let known = self.recorded.entries.len();
        request.items.iter().skip(known).map(|item| item.get().len()).sum()
    }

    /// Whether [`ingest`](Self::ingest) and [`compose_in_memory`](Self::compose_in_memory) of
    /// the next request stay in memory: the archive's rows go to its writer thread, and no
    /// push searches the archive (error memory is off). Retrieval (a full-text query of the
    /// archive) runs only where the block is renewed, which `compose_in_memory` leaves to
    /// [`compose`](Self::compose). In a fleet never: every request reads the lease and writes
    /// its rows in the database.
    pub fn request_in_memory(&self) -> bool {
        // A writer far behind makes queueing wait for room: not on an async thread.
        !self.fleet && !self.session.error_memory_enabled() && !self.writer_behind()
    }

    /// Whether composing queries the archive: retrieval is on and something of this
    /// conversation has left the core.
    fn retrieves(&self) -> bool {
        self.settings.recall && self.evicted_any
    }

    /// Whether the archive's writer is so far behind that queueing rows may wait for room.
    fn writer_behind(&self) -> bool {
        self.writer.as_ref().is_some_and(|writer| {
            let stats = writer.stats();
            stats.queued_rows >= WRITER_BACKLOG || stats.queued_bytes >= WRITER_BACKLOG_BYTES
        })
    }

    /// Writes a checkpoint if something changed since the last one: the session's state with
    /// what the conversation recorded, the answer still waiting included. In a fleet,
    /// nothing when another instance served the conversation since: what this one holds is
    /// stale (the answer still waiting comes back with its client's next request); and
    /// nothing while a rebuild would read fewer than `FLEET_CHECKPOINT_ROWS` messages again.
    ///
    /// # Errors
    /// Session errors.
    pub fn checkpoint(&mut self) -> Result<(), ConvError> {
        if !self.dirty {
            return Ok(());
        }
        // Decided before the lease is read: a checkpoint that would not be written costs no
        // query (a stale instance's answer waiting goes at its next request's catch-up).
        if self.fleet && self.replay_length() < FLEET_CHECKPOINT_ROWS {
            // The rows are in the database already and a reload replays them; the answer
            // still waiting is the client's to bring back with its next request.
            self.dirty = false;
            return Ok(());
        }
        if self.stale_here()? {
            return Ok(());
        }
        self.recorded.pending = self.pending_answer.as_ref().map(Value::to_string);
        self.session.set_caller_state(self.recorded.encode().map_err(ConvError::State)?);
        match self.session.checkpoint().map_err(ConvError::from) {
            Err(error) if error.is_overtaken() => self.resync(),
            Err(error) => Err(error),
            Ok(_) => {
                self.dirty = false;
                self.exchanges = 0;
                self.stored_next = self.session.manager().next_id();
                Ok(())
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
