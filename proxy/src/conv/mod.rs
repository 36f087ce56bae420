//! One conversation: a [`Session`] (archive rows, checkpoints, calibration) and what the
//! proxy recorded of the messages it holds (`state`: fingerprints, session ids, content
//! blocks), kept in the session's checkpoints. A message is stored once: its archive row,
//! which keeps the client's raw JSON, plus the snapshot.
//!
//! Its steps: [`Conv::ingest`] takes a request's new messages, [`Conv::compose`] writes the
//! body to forward, [`Conv::record_answer`] keeps the upstream's answer for the next request.

mod answer;
mod compose;
mod ingest;
mod paths;
mod settings;
mod state;
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
pub use settings::{ConvSettings, WHOLE};
pub use stores::{ARCHIVE_CACHE_KIB, LEFTOVER_SIDE_STORE, Stores, persisted_keys, prepare_state};

use crate::wire::Provider;
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
}

/// One conversation, resident.
pub struct Conv {
    key: String,
    provider: Provider,
    session: Session,
    writer: Arc<Deferred<SqliteArchive>>,
    /// What the session holds, message by message; in the checkpoints.
    recorded: Recorded,
    /// Tokens per `" ~"` of the filler that stands for an opaque block's cost.
    filler_rate: f64,
    /// What the conversation was opened with.
    settings: ConvSettings,
    /// The reply reserve the session is configured with: the largest `max_tokens` a request
    /// asked for since the conversation was loaded (`None` before its first request).
    reserve: Option<u32>,
    /// Session ids of the messages the last payload emitted.
    last_emitted: Vec<u64>,
    /// Some message of this conversation has left the core (evicted or summarized): only then
    /// can retrieval find anything the payload does not hold already.
    evicted_any: bool,
    /// The retrieved block sent with every payload since the last compaction (not kept in
    /// checkpoints: retrieved again after a restart).
    recalled: Option<String>,
    /// Something left the core since `recalled` was retrieved.
    recall_stale: bool,
    dirty: bool,
    exchanges: u32,
    last_used: Instant,
    /// The upstream's last answer, not yet in the session: taken with the next request's
    /// messages (as the client's copy when the client echoes it), or at the next checkpoint.
    pending_answer: Option<Value>,
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

/// Rows queued to the archive's writer past which a request's work leaves the async threads
/// (queueing more would wait for room).
const WRITER_BACKLOG: usize = 5_000;

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
        let dir = conv_dir(state_dir, key);
        for generation in 0..MAX_GENERATIONS {
            let (name, checkpoints) = paths::generation(key, &dir, generation);
            let builder = stores::session_builder(stores, &name, checkpoints);
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
        let mut conv = Self::from_parts(key, provider, session, stores, recorded, settings);
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
    /// read and no write. Its window is written with its first checkpoint.
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
        let checkpoints = conv_dir(state_dir, key).join("checkpoints");
        let session = stores::session_builder(stores, key, checkpoints)
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
        Self {
            key: key.to_string(),
            provider,
            session,
            writer: stores.writer.clone(),
            recorded,
            filler_rate,
            settings,
            reserve: None,
            last_emitted: Vec::new(),
            evicted_any: false,
            recalled: None,
            recall_stale: false,
            dirty: false,
            exchanges: 0,
            last_used: Instant::now(),
            pending_answer: None,
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

    /// Whether [`ingest`](Self::ingest) and [`compose`](Self::compose) of the next request stay
    /// in memory: the archive's rows go to its writer thread, and retrieval (a full-text query
    /// of the archive) is off because nothing of this conversation has left the core yet, or
    /// because the settings turn it off.
    pub fn request_in_memory(&self) -> bool {
        // A writer far behind makes queueing wait for room: not on an async thread.
        !self.retrieves() && self.writer_queue() < WRITER_BACKLOG
    }

    /// Whether composing queries the archive: retrieval is on and something of this
    /// conversation has left the core.
    fn retrieves(&self) -> bool {
        self.settings.recall && self.evicted_any
    }

    fn writer_queue(&self) -> usize {
        self.writer.stats().queued_rows
    }

    /// Writes a checkpoint if something changed since the last one: the session's state with
    /// what the conversation recorded, after the answer still waiting is taken.
    ///
    /// # Errors
    /// Session errors.
    pub fn checkpoint(&mut self) -> Result<(), ConvError> {
        if self.dirty {
            self.settle_answer()?;
            self.session.set_caller_state(self.recorded.encode().map_err(ConvError::State)?);
            self.session.checkpoint()?;
            self.dirty = false;
            self.exchanges = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
