//! [`Session`]: one agent's context window with everything a server adds around the core —
//! an archive that keeps every evicted unit, crash-safe checkpoints, exact token counts and
//! calibration against the provider's billed tokens.
//!
//! A session owns a boxed core [`ContextManager`](ctxwin_core::ContextManager) (a
//! [`SessionManager`]: [`SmallCapacities`] until its content needs [`ServerCapacities`]), an
//! optional archive and checkpoint sink (the storage ports, [`crate::store`]), and a
//! [`Calibrator`]. Build one with [`SessionBuilder`].
//!
//! * **The core decides, then the session writes what it decided.** A
//!   [`push`](Session::push) is: the core's check (a refused message stores nothing), the
//!   core's push (the message's id is known now), then the rows the core produced — the
//!   message's row with the text the core keeps, its full text and the client's raw JSON;
//!   results the core wrote for aborted calls; new or changed summaries with their sources —
//!   appended to one ordered journal and written to the archive port in one write. Only then
//!   are evicted units released from the core's outbox. Nothing is predicted.
//! * **Durability, per archive.** With an adapter that commits in its
//!   [`write`](crate::store::ArchiveStore::write) (SQLite, memory), `push` returns `Ok` after
//!   its rows are committed. Through a [`Batched`](crate::store::Batched) or
//!   [`Deferred`](crate::store::Deferred) wrapper, rows are durable once the wrapper flushed
//!   them ([`sync_archive`](Session::sync_archive), a checkpoint): a crash loses what it
//!   held, never anything a checkpoint covers. A failed write keeps the rows in the journal,
//!   in order ([`SessionError::AfterStore`]); the next operation writes them first, and no
//!   checkpoint is written while it holds any.
//! * **Retrieval.** One [`recall`](Session::recall): archived turns matching the live request
//!   (or a query) fill the room the payload has left, the core saying what room that is.
//! * **Restarts.** A checkpoint holds the core's snapshot plus the session's own state
//!   (calibration, id tracking); a session built with
//!   [`restore_latest`](SessionBuilder::restore_latest) continues where the newest intact
//!   checkpoint left off, skipping damaged files. Checkpoints are taken every
//!   [`checkpoint_interval_messages`](SessionBuilder::checkpoint_interval_messages) pushes.
//! * **Fleets.** On a store that hands out leases (PostgreSQL through
//!   [`SessionBuilder::store`] or [`SessionBuilder::ports`]; the memory store too) every
//!   write carries the session's fence, and the database refuses it once another process
//!   took the conversation. The session then [`reload`](Session::reload)s — the newest
//!   checkpoint plus the messages archived after it, pushed again — and redoes the
//!   operation; before each operation it reads the newest fence and reloads first when it
//!   was overtaken, and after one it checkpoints a state pushes alone would not reproduce.
//!   Any process serves any conversation; two serving one at once take turns, and neither
//!   loses, duplicates or interleaves the other's messages.
//! * **Calibration.** [`record_usage`](Session::record_usage) feeds the provider's
//!   `usage.prompt_tokens` to the calibrator and sets the core's effective window so that a
//!   composed payload, scaled by the worst ratio seen, still fits the real window: the
//!   estimator is never the reason a request is rejected, and when it over-counts (the
//!   default margin does on most text) the window it plans with grows to fill the real one.
//! * **LLM summaries.** With [`SessionBuilder::llm`], a background worker rewrites the core's
//!   extractive summaries (and extracts entity values) with a model; the agent keeps composing
//!   with the extractive text until the model's is swapped in. Failures fall back and are
//!   counted; see [`LlmStats`] and [`Session::wait_for_summaries`].
//! * **Semantic recall (optional).** With [`SessionBuilder::embedder`], recall fuses BM25
//!   with the cosine similarity of an [`Embedder`](crate::embed::Embedder)'s vectors
//!   ([`Hybrid`]); vectors are cached in the archive and every embedder failure falls back to
//!   BM25 for that build ([`Session::semantic_stats`]).
//! * **Threads.** `Session` is `Send` but not `Sync` (its core manager is not shared); share
//!   one between threads as a [`SharedSession`] (`Arc<Mutex<Session>>`).
//!
//! # Message ids and units
//!
//! Archive rows are keyed by the core's message ids, in the session's [`Scope`] (tenant and
//! conversation), and a row's unit is the id of its core unit's first message (an assistant
//! message with tool calls; its results share its unit).
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::session::SessionBuilder;
//! use ctxwin_std::{ChatMessage, ToolCall, core::Role};
//!
//! let mut session = SessionBuilder::new("demo").archive_in_memory().build()?;
//! session.push(&ChatMessage::text(Role::System, "You are a build assistant."))?;
//! session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
//! let call = ToolCall::new("c1", "run", r#"{"cmd":"cargo test"}"#);
//! session.push(&ChatMessage::assistant_calls("", vec![call]))?;
//! let report = session.push(&ChatMessage::tool_result("c1", "test result: ok. 42 passed"))?;
//! assert_eq!(report.unit, 3, "a result joins its call's unit");
//!
//! let payload = session.compose(&["Task: keep CI green"])?;
//! assert_eq!(payload.conversation.messages.len(), 5);
//! assert!(payload.tokens <= session.manager().budget());
//! let body = payload.write(ctxwin_std::format::Format::AnthropicJson)?;
//! assert!(body.contains(r#""tool_use_id": "c1""#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod calibrate;
mod capacities;
mod checkpointing;
mod compact;
mod compose;
mod convert;
mod core;
mod counter;
mod error;
mod forget;
mod fusion;
mod import;
mod journal;
mod lease;
#[cfg(feature = "http")]
mod llm;
mod persist;
mod push;
mod recover;
mod report;
mod retrieval_section;
mod retrieve;
mod semantic;
mod stats;
mod stores;
mod supersede;
mod sync;
mod task_summary;
mod tasks;

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ctxwin_core::Config;

use crate::store::{ArchiveStore, Scope};
use crate::tokens::Calibrator;

pub use builder::SessionBuilder;
pub use capacities::{ServerCapacities, ServerManager, SmallCapacities, SmallManager};
pub use checkpointing::{CheckpointPolicy, PeriodicCheckpointer};
pub use compose::{ComposeOptions, ComposedPayload, Origin, RecallFor};
pub use convert::tool_definition_json;
pub use core::{SessionCore, SessionManager};
pub use counter::{Counter, RecentCounts};
pub use error::SessionError;
pub use forget::ForgetReport;
pub use fusion::Hybrid;
pub use import::UNTIMED_TURN_INTERVAL_MS;
#[cfg(feature = "http")]
pub use llm::{LlmOptions, LlmStats, LlmWait};
pub use persist::RestorePoint;
pub use push::PushOptions;
pub use recover::{RecoverySource, take_for_recovery};
pub use report::{ImportReport, PushReport, Reduction, ReloadReport, RestoreReport};
pub use retrieval_section::RetrievalSection;
pub use retrieve::{RETRIEVED_HEADER, Recall, RetrievalSettings};
pub use semantic::{EMBEDDER_COOLDOWN, SemanticStats};
pub use stats::{
    ArchiveUsage, CalibrationStats, SessionCounters, SessionStats, TASK_RATIO_WARNING, TaskRatio,
    TaskStats, thousands,
};
pub use supersede::supersede_key;
pub use tasks::{ERROR_MEMORY_HEADER, ErrorMemory, TaskDetection};

mod builder;

use checkpointing::Checkpointing;
use journal::Journal;
use retrieve::Retrieval;
use stores::Stores;
use sync::Tracker;

/// A session shared between threads. Lock it for each operation.
///
/// ```
/// use ctxwin_std::session::{SessionBuilder, SharedSession};
/// use ctxwin_std::{ChatMessage, core::Role};
///
/// let shared: SharedSession = SessionBuilder::new("shared").build()?.into_shared();
/// let worker = {
///     let shared = shared.clone();
///     std::thread::spawn(move || {
///         let mut session = shared.lock().unwrap();
///         session.push(&ChatMessage::text(Role::User, "from another thread")).map(|r| r.id)
///     })
/// };
/// assert_eq!(worker.join().unwrap()?, 1);
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
pub type SharedSession = Arc<Mutex<Session>>;

/// The configuration a session was built with, and the calibrator that lowers the window the
/// core gets from it.
#[derive(Debug)]
struct Calibration {
    /// The configuration the caller asked for (framing applied); calibration only ever
    /// lowers the window the core gets from it.
    configured: Config,
    calibrator: Calibrator,
}

/// One agent's context window, archive, checkpoints and calibration. See the
/// [module documentation](self).
pub struct Session {
    /// Whose rows and checkpoints these are: the tenant and the session's name.
    scope: Scope,
    manager: SessionManager,
    calibration: Calibration,
    /// The archive and checkpoint ports, and the fence the session writes them with.
    stores: Stores,
    /// What the core decided and the archive does not have yet, in order.
    journal: Journal,
    tracker: Tracker,
    counters: SessionCounters,
    /// The periodic policy, the last checkpoint, and the caller's state kept in checkpoints.
    checkpointing: Checkpointing,
    /// The model's summaries and extraction, when built with [`SessionBuilder::llm`].
    #[cfg(feature = "http")]
    llm: Option<llm::LlmState>,
    /// How recall retrieves, and the vectors of hybrid recall.
    recall: Retrieval,
    /// Task detection and error memory (the task table itself is the core's).
    task_state: tasks::TaskState,
    /// Tools whose results a newer result of the same call supersedes
    /// ([`SessionBuilder::supersede`]).
    supersede: std::sync::Arc<[String]>,
}

impl Session {
    /// The session's name: its conversation in the archive.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("agent-7").build()?;
    /// assert_eq!(session.name(), "agent-7");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.scope.conversation
    }

    /// The session's scope in its stores: its tenant and name.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("chat").tenant("acme").build()?;
    /// assert_eq!(session.scope().to_string(), "acme/chat");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The core manager, read-only (its history, levels, stats, counter).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.manager().used(), 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn manager(&self) -> &SessionManager {
        &self.manager
    }

    /// The archive port, when the session has one (for drill-down, searches, metrics: read
    /// it in [`scope`](Self::scope)). Rows the journal holds after a failed write are not
    /// there yet; [`sync_archive`](Self::sync_archive) writes and flushes them.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").archive_in_memory().build()?;
    /// assert_eq!(session.archive().unwrap().usage(session.scope())?.messages, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive(&self) -> Option<&dyn ArchiveStore> {
        self.stores.archive.as_deref()
    }

    /// The configuration the session was built with (before calibration).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.configured().context_window, 32_768);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn configured(&self) -> &Config {
        &self.calibration.configured
    }

    /// The calibrator fed by [`record_usage`](Self::record_usage).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.calibrator().observations(), 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn calibrator(&self) -> &Calibrator {
        &self.calibration.calibrator
    }

    /// Wraps the session for sharing between threads.
    ///
    /// ```
    /// let shared = ctxwin_std::session::SessionBuilder::new("s").build()?.into_shared();
    /// assert_eq!(shared.lock().unwrap().name(), "s");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn into_shared(self) -> SharedSession {
        Arc::new(Mutex::new(self))
    }
}

impl Drop for Session {
    /// Writes what the journal holds and flushes the archive's wrappers, logging a failure
    /// (the rows are then lost with the process, and no checkpoint covers them).
    fn drop(&mut self) {
        if let Err(error) = self.sync_archive() {
            tracing::error!(scope = %self.scope, %error, "session: archive rows not written at drop");
        }
    }
}

impl std::fmt::Debug for Session {
    // The manager's rings are megabytes of bytes: show what identifies the session instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("scope", &self.scope)
            .field("counter", &self.manager.counter().kind())
            .field("used", &self.manager.used())
            .field("budget", &self.manager.budget())
            .field("next_id", &self.tracker.next_id)
            .field("archive", &self.stores.archive.is_some())
            .field("checkpoints", &self.stores.checkpoints.is_some())
            .field("journal", &self.journal.len())
            .field("last_checkpoint", &self.checkpointing.last)
            .finish_non_exhaustive()
    }
}

/// The system clock in milliseconds since the Unix epoch (0 if the clock reads earlier).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Session>();
        assert_send::<SharedSession>();
        fn assert_sync<T: Sync>() {}
        assert_sync::<SharedSession>();
    }

    #[test]
    fn debug_output_stays_short() {
        let session = SessionBuilder::new("short").build().unwrap();
        let text = format!("{session:?}");
        assert!(text.len() < 400 && text.contains("\"short\""), "{text}");
    }

    #[test]
    fn clock_is_past_2020() {
        assert!(now_ms() > 1_577_836_800_000);
    }
}
