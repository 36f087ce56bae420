//! [`CliError`] and [`Exit`]: every failure of a `ctxwin` command as one line naming the problem
//! and what to do, and the distinct exit code scripts branch on.

use std::io;
use std::path::Path;

use ctxwin_core::Error as CoreError;
use ctxwin_core::error::{Pinned, PinnedPart};

use ctxwin_std::session::SessionError;
use ctxwin_std::statefs::StateFsError;
use ctxwin_std::store::{ErrorKind, StoreError};

/// The exit codes of `ctxwin`, one per kind of failure.
///
/// | code | meaning |
/// |---:|---|
/// | 0 | success |
/// | 1 | internal error (a bug: please report it) |
/// | 2 | usage: unknown command, flag or value |
/// | 3 | bad input: a conversation file, message, JSON value or id that does not parse or that the context refuses; input that is not UTF-8 or over `[limits] max_input_bytes` |
/// | 4 | I/O: a file or the state directory cannot be read or written, or stayed locked past `[limits] lock_wait_secs` |
/// | 5 | budget impossible: what must stay in the context does not fit the token budget |
/// | 6 | state corrupt: damaged checkpoints or archive, an archive that is not the checkpoints' own, a symlink in the state directory (reported, never reset) |
/// | 7 | no state: the state directory is missing (run `ctxwin init`), or `init` found one already |
/// | 8 | configuration: `ctxwin.toml`, `--tokenizer` or `--llm-url` is invalid, or needs a cargo feature this build left out |
///
/// ```
/// use ctxwin_cli::Exit;
/// assert_eq!(Exit::Budget.code(), 5);
/// assert_eq!(Exit::ALL.iter().map(|e| e.code()).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exit {
    /// Success.
    Ok,
    /// A bug in ctxwin.
    Internal,
    /// Wrong command-line usage.
    Usage,
    /// Input that does not parse or that the context refuses.
    BadInput,
    /// A file or directory cannot be read or written.
    Io,
    /// Pinned content exceeds the token budget.
    Budget,
    /// The state directory is damaged.
    Corrupt,
    /// No state directory (or `init` over an existing one).
    NoState,
    /// Invalid configuration.
    Config,
}

impl Exit {
    /// Every exit code, in numeric order.
    pub const ALL: [Exit; 9] = [
        Exit::Ok,
        Exit::Internal,
        Exit::Usage,
        Exit::BadInput,
        Exit::Io,
        Exit::Budget,
        Exit::Corrupt,
        Exit::NoState,
        Exit::Config,
    ];

    /// The process exit status.
    ///
    /// ```
    /// assert_eq!(ctxwin_cli::Exit::Corrupt.code(), 6);
    /// ```
    pub const fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Internal => 1,
            Exit::Usage => 2,
            Exit::BadInput => 3,
            Exit::Io => 4,
            Exit::Budget => 5,
            Exit::Corrupt => 6,
            Exit::NoState => 7,
            Exit::Config => 8,
        }
    }
}

/// Why a command failed; the text is the one line printed after `error: `.
///
/// ```
/// use ctxwin_cli::{CliError, Exit};
/// let error = CliError::BadInput("--tool-calls is not JSON".into());
/// assert_eq!(error.exit(), Exit::BadInput);
/// assert_eq!(error.to_string(), "--tool-calls is not JSON");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Wrong command-line usage.
    #[error("{0}")]
    Usage(String),
    /// Input that does not parse or that the context refuses.
    #[error("{0}")]
    BadInput(String),
    /// A file or directory cannot be read or written.
    #[error("{0}")]
    Io(String),
    /// Pinned content exceeds the token budget.
    #[error("{0}")]
    Budget(String),
    /// The state directory is damaged.
    #[error("{0}")]
    Corrupt(String),
    /// No state directory, or one where `init` wants to create it.
    #[error("{0}")]
    NoState(String),
    /// Invalid configuration.
    #[error("{0}")]
    Config(String),
    /// A bug.
    #[error("{0}; this is a bug in ctxwin, please report it")]
    Internal(String),
}

impl CliError {
    /// The exit code of this error.
    ///
    /// ```
    /// use ctxwin_cli::{CliError, Exit};
    /// assert_eq!(CliError::Io("disk full".into()).exit(), Exit::Io);
    /// ```
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::BadInput(_) => Exit::BadInput,
            CliError::Io(_) => Exit::Io,
            CliError::Budget(_) => Exit::Budget,
            CliError::Corrupt(_) => Exit::Corrupt,
            CliError::NoState(_) => Exit::NoState,
            CliError::Config(_) => Exit::Config,
            CliError::Internal(_) => Exit::Internal,
        }
    }

    /// An I/O failure on `path` while doing `action` ("read", "write", "create").
    pub(crate) fn io(action: &str, path: &Path, error: &io::Error) -> CliError {
        let hint = match error.kind() {
            io::ErrorKind::NotFound => "check the path",
            io::ErrorKind::PermissionDenied => "check the file's permissions",
            io::ErrorKind::InvalidData => "the file must be UTF-8 text",
            _ => "check the disk and the path",
        };
        CliError::Io(format!("cannot {action} {}: {error}; {hint}", path.display()))
    }

    /// `what` (a flag, a setting, a command) needs cargo feature `feature` of ctxwin-cli,
    /// which this build left out (README's first command builds with `--no-default-features`).
    ///
    /// "--tokenizer needs the `tokenizers` feature, which this ctxwin was built without;
    /// rebuild with default features (`cargo install --path cli`)"
    #[allow(dead_code, reason = "a build with every feature refuses nothing")]
    pub(crate) fn without_feature(feature: &str, what: &str) -> CliError {
        CliError::Config(format!(
            "{what} needs the `{feature}` feature, which this ctxwin was built without; rebuild \
             it with default features (`cargo install --path cli`)"
        ))
    }

    /// The same error with `context` in front of its message (same exit code).
    pub(crate) fn context(self, context: &str) -> CliError {
        let wrap = |message: String| format!("{context}: {message}");
        match self {
            CliError::Usage(m) => CliError::Usage(wrap(m)),
            CliError::BadInput(m) => CliError::BadInput(wrap(m)),
            CliError::Io(m) => CliError::Io(wrap(m)),
            CliError::Budget(m) => CliError::Budget(wrap(m)),
            CliError::Corrupt(m) => CliError::Corrupt(wrap(m)),
            CliError::NoState(m) => CliError::NoState(wrap(m)),
            CliError::Config(m) => CliError::Config(wrap(m)),
            CliError::Internal(m) => CliError::Internal(wrap(m)),
        }
    }
}

impl From<SessionError> for CliError {
    fn from(error: SessionError) -> Self {
        from_session(error)
    }
}

impl From<StoreError> for CliError {
    fn from(error: StoreError) -> Self {
        from_store(error)
    }
}

impl From<StateFsError> for CliError {
    fn from(error: StateFsError) -> Self {
        match error {
            StateFsError::TooLarge { .. } => CliError::BadInput(format!(
                "{error}; raise [limits] max_input_bytes in ctxwin.toml if it is meant to be read"
            )),
            StateFsError::NotUtf8 { .. } => CliError::BadInput(format!(
                "{error}; messages and conversations must be UTF-8 text"
            )),
            StateFsError::Unsafe { .. } => CliError::Corrupt(format!(
                "{error}; remove it (the state directory holds only ctxwin's own files)"
            )),
            StateFsError::LockTimeout { .. } => CliError::Io(format!(
                "the state directory is busy: {error}; wait for that command, or raise [limits] lock_wait_secs"
            )),
            StateFsError::Io { ref source, ref path, action } => CliError::io(action, path, source),
            _ => CliError::Io(error.to_string()),
        }
    }
}

/// What the command line can do about a session error.
fn from_session(error: SessionError) -> CliError {
    match error {
        SessionError::Core(core) => from_core(core),
        SessionError::Config(config) => CliError::Config(format!(
            "invalid configuration: {config}; fix the [context] section of ctxwin.toml"
        )),
        SessionError::Setting(setting) => CliError::Config(format!("{setting}; fix ctxwin.toml")),
        SessionError::Store(store) => from_store(store),
        SessionError::BadCheckpoint { id, reason } => CliError::Corrupt(format!(
            "checkpoint {id} cannot be restored: {reason}; restore another one (`ctxwin checkpoints` lists them)"
        )),
        SessionError::Format(format) => CliError::BadInput(format.to_string()),
        #[cfg(feature = "tokenizers")]
        SessionError::Tokenizer(tokenizer) => CliError::Config(format!(
            "{tokenizer}; pass a Hugging Face tokenizer.json (or cl100k, smollm2) to --tokenizer"
        )),
        SessionError::ToolDefinition { name, reason } => CliError::BadInput(format!(
            "tool definition {name:?}: {reason}; parameters must be a JSON schema object"
        )),
        SessionError::ArchiveInUse { session, messages } => CliError::Corrupt(format!(
            "the archive holds {messages} messages of session {session:?} but no checkpoint continues them; restore one with `ctxwin restore <id>`, or start a new state directory"
        )),
        SessionError::AfterStore { id, source } => {
            from_session(*source).context(&format!("message {id} was stored, then"))
        }
        SessionError::Import { item, source } => from_session(*source).context(&item),
        other => CliError::Internal(other.to_string()),
    }
}

/// What the command line can do about a refusal of the context manager.
pub(crate) fn from_core(error: CoreError) -> CliError {
    match error {
        CoreError::OrphanToolResult => CliError::BadInput(
            "the tool result answers no pending tool call; add the assistant message with the call first (--tool-calls)".into(),
        ),
        CoreError::DuplicateToolResult => {
            CliError::BadInput("that tool call already has a result".into())
        }
        CoreError::InvalidMessage(why) => CliError::BadInput(format!(
            "invalid message: {why}; tool calls go on assistant messages, --tool-call-id on tool results"
        )),
        CoreError::InvalidToolDefinition => {
            CliError::BadInput("a tool definition is not a JSON object".into())
        }
        CoreError::MessageTooLarge { needed, limit } => CliError::Budget(format!(
            "the message needs {needed}, more than the {limit} one message may take; split it or raise the level's budget in ctxwin.toml"
        )),
        CoreError::LevelOverBudget { level, needed, budget } => CliError::Budget(format!(
            "the {level} level would hold {needed} tokens, over its budget of {budget}; shorten the system prompt or tool definitions, or raise {level}_budget in ctxwin.toml"
        )),
        CoreError::LevelFull { level } => CliError::Budget(format!(
            "the {level} level is full of locked messages; lower locked_tail in ctxwin.toml"
        )),
        CoreError::PinnedOverBudget { needed, budget, pinned } => {
            CliError::Budget(pinned_over_budget(needed, budget, pinned))
        }
        CoreError::ToolCallsPending { unanswered } => CliError::BadInput(format!(
            "{unanswered} tool call(s) still wait for results; add them with `ctxwin add tool <output> --tool-call-id <id>` first"
        )),
        CoreError::InvalidConfig(config) => CliError::Config(format!(
            "invalid configuration: {config}; fix the [context] section of ctxwin.toml"
        )),
        other => CliError::Internal(format!("context manager: {other}")),
    }
}

/// What must stay does not fit: how much is over, which part is the largest and what to
/// change for it (older turns and summaries always give way, so they are never the cause).
fn pinned_over_budget(needed: u32, budget: u32, pinned: Pinned) -> String {
    let cause = match pinned.largest() {
        PinnedPart::Dynamic => {
            format!("the dynamic context (--dynamic) takes {} of them; pass less", pinned.dynamic)
        }
        PinnedPart::Live => format!(
            "the live request (the newest user message and the newest tool calls and results, which always stay) takes {} of them; shorten it or raise context_window in ctxwin.toml",
            pinned.live
        ),
        PinnedPart::Permanent => format!(
            "the system prompt and tool definitions take {} of them; shorten them or raise context_window in ctxwin.toml",
            pinned.permanent
        ),
    };
    format!(
        "what must stay in the context needs {needed} tokens, {} over the budget of {budget}: {cause} (system prompt and tools {}, live request {}, dynamic context {})",
        needed.saturating_sub(budget),
        pinned.permanent,
        pinned.live,
        pinned.dynamic
    )
}

/// What the command line can do about a storage failure: by its kind (no backend's error
/// type is named here), with what to do about each.
fn from_store(error: StoreError) -> CliError {
    match &error {
        StoreError::Mismatch { .. } => CliError::Corrupt(format!(
            "archive.db: {error}; put the right archive.db back, or `ctxwin recover` rebuilds the context from this one"
        )),
        StoreError::NoUsableCheckpoint { .. } => CliError::Corrupt(format!(
            "{error}; the archive still holds every message: `ctxwin checkpoints` shows what is left, `ctxwin recover` rebuilds the context from the archive"
        )),
        StoreError::SchemaTooNew { .. } => {
            CliError::Corrupt(format!("archive.db: {error}; it was written by a newer ctxwin"))
        }
        StoreError::Damaged { what, .. } if what.contains("checkpoint") => {
            CliError::Corrupt(format!(
                "{error}; the archive still holds every message: `ctxwin checkpoints` shows what is left, `ctxwin recover` rebuilds the context from the archive"
            ))
        }
        _ => match error.kind() {
            ErrorKind::Damaged => CliError::Corrupt(format!(
                "{error}; the damage was reported, not served: restore archive.db from a backup, or `ctxwin recover` rebuilds the context from what is intact"
            )),
            ErrorKind::NotFound => match &error {
                StoreError::NotFound { what } if what.starts_with("checkpoint") => {
                    CliError::BadInput(format!("no {what}; `ctxwin checkpoints` lists the ids"))
                }
                _ => CliError::BadInput(format!("{error}")),
            },
            ErrorKind::Busy => CliError::Io(format!(
                "{error}; another process holds the archive: wait for the other ctxwin command to finish"
            )),
            ErrorKind::Io | ErrorKind::Full => {
                CliError::Io(format!("{error}; check the disk and the files' permissions"))
            }
            ErrorKind::Invalid => CliError::BadInput(error.to_string()),
            _ => CliError::Internal(format!("store: {error}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxwin_core::Level;

    #[test]
    fn codes_are_distinct() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len());
    }

    #[test]
    fn core_refusals_map_to_their_kind() {
        let pinned = Pinned { permanent: 2, live: 6, dynamic: 0 };
        let budget = from_core(CoreError::PinnedOverBudget { needed: 9, budget: 5, pinned });
        assert_eq!(budget.exit(), Exit::Budget);
        let message = budget.to_string();
        assert!(message.contains("needs 9 tokens, 4 over the budget of 5"), "{message}");
        assert!(message.contains("the live request") && message.contains("takes 6"), "{message}");
        assert!(!message.contains("(--dynamic)") && !message.contains("locked_tail"), "{message}");
        let pinned = Pinned { permanent: 2, live: 1, dynamic: 6 };
        let dynamic = from_core(CoreError::PinnedOverBudget { needed: 9, budget: 5, pinned });
        assert!(dynamic.to_string().contains("--dynamic) takes 6"), "{dynamic}");
        assert!(!dynamic.to_string().contains("locked_tail"), "{dynamic}");
        assert_eq!(from_core(CoreError::OrphanToolResult).exit(), Exit::BadInput);
        assert_eq!(from_core(CoreError::LevelFull { level: Level::Working }).exit(), Exit::Budget);
    }

    #[test]
    fn wrapped_session_errors_keep_the_inner_kind() {
        let inner = SessionError::Core(CoreError::ToolCallsPending { unanswered: 2 });
        let error = CliError::from(SessionError::Import {
            item: "message 7".into(),
            source: Box::new(inner),
        });
        assert_eq!(error.exit(), Exit::BadInput);
        assert!(error.to_string().starts_with("message 7: 2 tool call(s)"), "{error}");
    }

    #[test]
    fn io_errors_name_path_and_remedy() {
        let error = CliError::io(
            "read",
            Path::new("x.jsonl"),
            &io::Error::new(io::ErrorKind::NotFound, "gone"),
        );
        assert_eq!(error.exit(), Exit::Io);
        assert_eq!(error.to_string(), "cannot read x.jsonl: gone; check the path");
    }
}
