//! [`SessionError`]: every way a session operation can fail, each saying what to do.

use ctxwin_core::{ConfigError, Error as CoreError, SnapshotError};

use crate::format::FormatError;
use crate::store::{CheckpointId, StoreError};
use crate::tokens::{CalibrationError, TokenizerError};

/// Why a [`Session`](super::Session) operation failed. Nothing is lost on error: a refused
/// message is not in the context (the caller still holds it), and evicted units stay in the
/// core's outbox until the archive has them.
///
/// ```
/// use ctxwin_std::session::SessionError;
/// use ctxwin_std::core::Error;
/// let error = SessionError::Core(Error::OrphanToolResult);
/// assert!(error.to_string().contains("push the assistant message with the tool call first"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The context manager refused the operation.
    #[error("context manager refused: {0}; {hint}", hint = core_hint(.0))]
    Core(CoreError),
    /// The configuration does not validate.
    #[error("invalid configuration: {0}; fix the Config given to SessionBuilder::config")]
    Config(ConfigError),
    /// A builder setting is out of range or contradicts another.
    #[error("invalid session setting: {0}")]
    Setting(String),
    /// The archive or the checkpoint sink failed ([`StoreError::kind`] says how).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A checkpoint's content was refused (a damaged or foreign file, another session's).
    #[error(
        "checkpoint {id} cannot be restored: {reason}; restore an older one or start without restore_latest"
    )]
    BadCheckpoint {
        /// The checkpoint.
        id: CheckpointId,
        /// Why it was refused.
        reason: String,
    },
    /// Writing a snapshot failed.
    #[error("snapshot: {0:?}; this is a bug if it repeats, please report it")]
    Snapshot(SnapshotError),
    /// A payload could not be written in a provider format.
    #[error("format: {0}")]
    Format(#[from] FormatError),
    /// The tokenizer could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// A provider usage report was refused by the calibrator.
    #[error(
        "calibration: {0}; pass the payload's estimated tokens and the provider's prompt tokens"
    )]
    Calibration(#[from] CalibrationError),
    /// A tool definition's parameters (or a stored definition) are not valid JSON.
    #[error("tool definition {name:?}: {reason}; parameters must be a JSON schema object")]
    ToolDefinition {
        /// The tool's name (empty if unknown).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The operation needs an archive the session was built without.
    #[error(
        "{operation} needs an archive: build the session with .archive(path) or .archive_in_memory()"
    )]
    NoArchive {
        /// What was asked.
        operation: &'static str,
    },
    /// The operation needs a checkpoint store the session was built without.
    #[error("{operation} needs a checkpoint store: build the session with .checkpoints(dir)")]
    NoCheckpoints {
        /// What was asked.
        operation: &'static str,
    },
    /// A new session would reuse message ids its archive already holds.
    #[error(
        "the archive already holds {messages} messages of session {session:?} and there is no checkpoint to continue from; build with .checkpoints(dir).restore_latest(true), or use another session name"
    )]
    ArchiveInUse {
        /// The session name.
        session: String,
        /// Messages archived under it.
        messages: u64,
    },
    /// The core took message `id`, but writing its rows (and what the core did with it) to
    /// the archive failed: they are held in the session's journal, evicted units stay in the
    /// core's outbox, and the next call writes them first.
    #[error(
        "message {id} is in the context, but writing it to the archive failed: {source}; it is held and the next call writes it"
    )]
    AfterStore {
        /// The stored message's id.
        id: u64,
        /// What failed.
        source: Box<SessionError>,
    },
    /// One item of an import was refused; everything before it was stored and archived.
    #[error("import stopped at {item}: {source}; fix it and import the rest from there")]
    Import {
        /// Which item: `message 12`, `tool "ls"`, `system prompt`.
        item: String,
        /// Why.
        source: Box<SessionError>,
    },
    /// The operation needs LLM work the session was built without.
    #[error("{operation} needs an LLM: build the session with .llm(client)")]
    NoLlm {
        /// What was asked.
        operation: &'static str,
    },
    /// The background thread that runs LLM jobs could not start.
    #[error("cannot start the LLM worker thread: {0}; the process is out of threads or memory")]
    LlmWorker(String),
    /// The helper thread that allocates the manager could not run.
    #[error("cannot allocate the context manager: {0}; the process is out of threads or memory")]
    Allocation(String),
}

impl From<CoreError> for SessionError {
    fn from(error: CoreError) -> Self {
        SessionError::Core(error)
    }
}

impl From<ConfigError> for SessionError {
    fn from(error: ConfigError) -> Self {
        SessionError::Config(error)
    }
}

/// What the caller can do about a core refusal.
fn core_hint(error: &CoreError) -> &'static str {
    match error {
        CoreError::OrphanToolResult => "push the assistant message with the tool call first",
        CoreError::DuplicateToolResult => "each tool call takes one result",
        CoreError::InvalidMessage(_) => "fix the message's role, tool calls or tool_call_id",
        CoreError::InvalidToolDefinition => "pass a JSON object",
        CoreError::MessageTooLarge { .. } => {
            "split the message, or raise the level's budget in the Config"
        }
        CoreError::LevelOverBudget { .. } => {
            "shorten the system prompt or tool definitions, or raise permanent_budget"
        }
        CoreError::LevelFull { .. } => "the locked messages fill the level: lower locked_tail",
        CoreError::OutboxFull { .. } => "the session drains its outbox itself; retry the call",
        CoreError::PinnedOverBudget { .. } => {
            "pass less dynamic context, or raise the window or lower locked_tail"
        }
        CoreError::ToolCallsPending { .. } => {
            "push the missing tool results, or call abort_pending_calls"
        }
        CoreError::InvalidConfig(_) => "fix the Config given to SessionBuilder::config",
        _ => "see ctxwin_core::Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxwin_core::Level;

    #[test]
    fn every_message_names_a_remedy() {
        let errors = [
            SessionError::Core(CoreError::OutboxFull { level: Level::Working }),
            SessionError::NoArchive { operation: "retrieve" },
            SessionError::NoCheckpoints { operation: "checkpoint" },
            SessionError::NoLlm { operation: "wait_for_summaries" },
            SessionError::ArchiveInUse { session: "s".into(), messages: 3 },
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.contains(';') || text.contains(": build"), "{text}");
        }
    }

    #[test]
    fn errors_cross_threads() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<SessionError>();
    }
}
