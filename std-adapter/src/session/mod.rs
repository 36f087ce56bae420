//! [`Session`]: one agent's context window with everything a server adds around the core —
//! an archive that keeps every evicted unit, crash-safe checkpoints, exact token counts and
//! calibration against the provider's billed tokens.
//!
//! A session owns a boxed core [`ContextManager`](ctxwin_core::ContextManager) (a
//! [`SessionManager`]: [`SmallCapacities`] until its content needs [`ServerCapacities`]), an
//! optional SQLite [`Archive`], an optional [`CheckpointStore`] with a
//! [`PeriodicCheckpointer`], and a [`Calibrator`]. Build one with [`SessionBuilder`].
//!
//! * **Nothing is lost.** [`push`](Session::push) writes the message to the archive *before*
//!   the core sees it, with its full text (the core may store a huge tool output reduced;
//!   the archive row then keeps the original). Units the core evicts are written to the
//!   archive before the session releases them from the core's outbox, and the summaries the
//!   core makes are recorded with the message ids they stand for, so
//!   [`Archive::drill_down`] finds the originals. [`retrieve`](Session::retrieve) searches the
//!   archive and formats hits as dynamic context for [`compose`](Session::compose).
//! * **Restarts.** A checkpoint holds the core's snapshot plus the session's own state
//!   (calibration, id tracking); a session built with
//!   [`restore_latest`](SessionBuilder::restore_latest) continues where the newest intact
//!   checkpoint left off, skipping damaged files. Checkpoints are taken every
//!   [`checkpoint_interval_messages`](SessionBuilder::checkpoint_interval_messages) pushes.
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
//! * **Threads.** `Session` is `Send` but not `Sync` (the archive's SQLite connection is not
//!   `Sync`); share one between threads as a [`SharedSession`] (`Arc<Mutex<Session>>`).
//!
//! # Message ids and units
//!
//! Archive rows are keyed by the core's message ids, and a row's unit is the id of its core
//! unit's first message (an assistant message with tool calls; its results share its unit).
//! Because the archive is written before the core assigns an id, the session predicts it:
//! the core's `next_id`, plus the synthetic results of calls the message closes. A summary
//! the core writes while making room can take that id first; such a wrong guess is repaired
//! in the archive (counted in [`SessionCounters::id_repairs`]).
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

mod batch;
mod builder;
mod calibrate;
mod capacities;
mod compose;
mod convert;
mod counter;
mod deferred;
mod error;
mod forget;
mod fusion;
mod import;
mod llm;
mod persist;
mod push;
mod recover;
mod report;
mod retrieve;
mod semantic;
mod stats;
mod sync;
mod tier;

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ctxwin_core::Config;

use crate::archive::{Archive, ArchivedMessage};
use crate::checkpoint::{CheckpointId, CheckpointStore, PeriodicCheckpointer};
use crate::tokens::Calibrator;

pub use builder::SessionBuilder;
pub use capacities::{ServerCapacities, SmallCapacities};
pub use compose::ComposedPayload;
pub use convert::tool_definition_json;
pub use counter::Counter;
pub use error::SessionError;
pub use forget::ForgetReport;
pub use fusion::Hybrid;
pub use import::UNTIMED_TURN_INTERVAL_MS;
pub use llm::{LlmOptions, LlmStats, LlmWait};
pub use persist::RestorePoint;
pub use push::PushOptions;
pub use recover::{RecoverySource, take_for_recovery};
pub use report::{ImportReport, PushReport, Reduction, RestoreReport};
pub use retrieve::{RETRIEVED_HEADER, Recall, RetrievalSettings};
pub use semantic::{EMBEDDER_COOLDOWN, SemanticStats};
pub use stats::{
    ArchiveUsage, CalibrationStats, SessionCounters, SessionStats, TokenCacheStats, thousands,
};
pub use tier::{ServerManager, SessionManager, SmallManager};

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

/// One agent's context window, archive, checkpoints and calibration. See the
/// [module documentation](self).
pub struct Session {
    name: String,
    manager: SessionManager,
    /// The configuration the caller asked for (framing applied); calibration only ever
    /// lowers the window the core gets from it.
    configured: Config,
    archive: Option<Archive>,
    store: Option<CheckpointStore>,
    periodic: PeriodicCheckpointer,
    calibrator: Calibrator,
    tracker: Tracker,
    counters: SessionCounters,
    last_checkpoint: Option<CheckpointId>,
    /// Archive rows whose write failed, written before anything else on the next operation
    /// (and before any checkpoint), so a failed write loses nothing while the process lives.
    pending_rows: Vec<ArchivedMessage>,
    /// The id of a row written ahead for a message the core then refused.
    phantom: Option<u64>,
    /// Messages from this id on were archived by this session; older ones (restored from a
    /// checkpoint) are checked against the archive when they leave the core.
    trusted_from: u64,
    /// The model's summaries and extraction, when built with [`SessionBuilder::llm`].
    llm: Option<llm::LlmState>,
    /// How [`recall`](Session::recall) and the automatic recall at compose retrieve.
    retrieval: RetrievalSettings,
    /// Vectors for hybrid recall, when built with [`SessionBuilder::embedder`].
    semantic: Option<semantic::SemanticIndex>,
    /// Rows of the open archive batch ([`Session::begin_batch`]), in write order.
    batch: Option<Vec<ArchivedMessage>>,
    /// The shared writer rows go to instead of being written now
    /// ([`SessionBuilder::archive_writer`]), and the newest ticket it gave this session.
    deferred: Option<deferred::Deferred>,
}

impl Session {
    /// The session's name: its key in the archive.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("agent-7").build()?;
    /// assert_eq!(session.name(), "agent-7");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
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

    /// The archive, when the session has one (for drill-down, keyword lookups, metrics).
    /// With an [`archive_writer`](SessionBuilder::archive_writer), rows handed to the writer
    /// are there once [`sync_archive`](Self::sync_archive) returns.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").archive_in_memory().build()?;
    /// assert_eq!(session.archive().unwrap().message_count(Some("s"))?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive(&self) -> Option<&Archive> {
        self.archive.as_ref()
    }

    /// The configuration the session was built with (before calibration).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.configured().context_window, 32_768);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn configured(&self) -> &Config {
        &self.configured
    }

    /// The calibrator fed by [`record_usage`](Self::record_usage).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.calibrator().observations(), 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn calibrator(&self) -> &Calibrator {
        &self.calibrator
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

impl std::fmt::Debug for Session {
    // The manager's rings are megabytes of bytes: show what identifies the session instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.name)
            .field("counter", &self.manager.counter().kind())
            .field("used", &self.manager.used())
            .field("budget", &self.manager.budget())
            .field("next_id", &self.tracker.next_id)
            .field("archive", &self.archive.is_some())
            .field("checkpoints", &self.store.as_ref().map(CheckpointStore::dir))
            .field("last_checkpoint", &self.last_checkpoint)
            .field("llm", &self.llm.is_some())
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
        assert!(text.len() < 300 && text.contains("\"short\""), "{text}");
    }

    #[test]
    fn clock_is_past_2020() {
        assert!(now_ms() > 1_577_836_800_000);
    }
}
