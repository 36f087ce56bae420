//! [`StoreError`]: the ports' one error type, and its [`ErrorKind`].

use super::checkpoint::Skipped;
use super::{Fence, Scope};

/// Everything a storage port can report. Adapters map their backend's errors into these
/// variants; no backend type (SQLite's, PostgreSQL's) appears in them, so a caller reacts to
/// the [`kind`](StoreError::kind) whatever the adapter.
///
/// ```
/// use ctxwin_std::store::{ErrorKind, StoreError};
/// let error = StoreError::Damaged { what: "message 7 of main".into(), detail: "checksum mismatch".into() };
/// assert_eq!(error.kind(), ErrorKind::Damaged);
/// assert!(error.to_string().contains("message 7 of main"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Something asked for by name is not stored (a summary to drill into, a checkpoint id).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, named.
        what: String,
    },
    /// Stored data failed its checksum or does not decode: reported, never served.
    #[error("damaged {what}: {detail}")]
    Damaged {
        /// What is damaged (which row of which conversation, which file).
        what: String,
        /// How it was found out.
        detail: String,
    },
    /// A write carried a fence older than the newest handed out for its conversation: another
    /// process holds the conversation now.
    #[error(
        "conversation {scope} is held by a newer writer (fence {current:?}); this write's fence {fence:?} is stale"
    )]
    Fenced {
        /// The conversation.
        scope: Scope,
        /// The fence the write carried.
        fence: Fence,
        /// The newest fence handed out.
        current: Fence,
    },
    /// The store is locked by another writer past the adapter's wait.
    #[error("busy: {detail}")]
    Busy {
        /// What the backend said.
        detail: String,
    },
    /// Reading or writing the medium failed (permissions, a vanished file, a dropped
    /// connection).
    #[error("I/O: {detail}")]
    Io {
        /// What failed, naming the file or connection.
        detail: String,
        /// The operating system's error, when there is one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The medium is full.
    #[error("full: {detail}")]
    Full {
        /// What the backend said.
        detail: String,
    },
    /// A write the store cannot take (an id above `i64::MAX`, a checkpoint id of another
    /// conversation): nothing of it was written.
    #[error("invalid: {detail}")]
    Invalid {
        /// What is wrong with it.
        detail: String,
    },
    /// The archive is not the one the checkpoints were written with, or lacks rows they
    /// cover.
    #[error("{detail}")]
    Mismatch {
        /// What does not match.
        detail: String,
    },
    /// The store was written by a newer build.
    #[error("store schema version {found} is newer than the {supported} this build supports")]
    SchemaTooNew {
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// Checkpoints exist, but none is usable (each damaged or refused).
    #[error("no usable checkpoint in {place}: all {} were skipped", skipped.len())]
    NoUsableCheckpoint {
        /// Where the checkpoints are.
        place: String,
        /// Every checkpoint tried, newest first, with why it was refused.
        skipped: Vec<Skipped>,
    },
    /// A deferred write ([`Deferred`](super::Deferred)) failed; its rows stay queued, in order,
    /// and are retried: wait again later, nothing was dropped.
    #[error(
        "deferred write failed ({failures} failed attempts in a row, {queued_rows} rows still queued and retried): {reason}"
    )]
    Deferred {
        /// The failed attempt's error, as text.
        reason: String,
        /// Its kind.
        cause: ErrorKind,
        /// Attempts that failed since the last commit.
        failures: u64,
        /// Rows queued and not committed.
        queued_rows: usize,
    },
    /// The deferred writer's thread has ended: what it had not committed was not written.
    #[error("the deferred writer has stopped; {rows} queued rows were not written")]
    Stopped {
        /// Rows queued and never committed.
        rows: usize,
    },
    /// Anything else the backend reported.
    #[error("{detail}")]
    Backend {
        /// What the backend said.
        detail: String,
    },
}

/// What kind of failure a [`StoreError`] is: what a caller (the command line's exit codes, a
/// retry policy) branches on.
///
/// ```
/// use ctxwin_std::store::{ErrorKind, StoreError};
/// assert_eq!(StoreError::Busy { detail: "locked".into() }.kind(), ErrorKind::Busy);
/// assert!(ErrorKind::Busy.is_transient());
/// assert!(!ErrorKind::Damaged.is_transient());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`StoreError::NotFound`].
    NotFound,
    /// Damaged or foreign data: [`StoreError::Damaged`], [`StoreError::Mismatch`],
    /// [`StoreError::SchemaTooNew`], [`StoreError::NoUsableCheckpoint`].
    Damaged,
    /// [`StoreError::Fenced`].
    Fenced,
    /// [`StoreError::Busy`].
    Busy,
    /// [`StoreError::Io`], [`StoreError::Stopped`].
    Io,
    /// [`StoreError::Full`].
    Full,
    /// [`StoreError::Invalid`].
    Invalid,
    /// [`StoreError::Backend`].
    Backend,
}

impl ErrorKind {
    /// Whether trying again later may succeed (a lock held by another writer).
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::Busy)
    }
}

impl StoreError {
    /// The kind of failure; a [`StoreError::Deferred`] has the kind of the write that failed.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Damaged { .. }
            | Self::Mismatch { .. }
            | Self::SchemaTooNew { .. }
            | Self::NoUsableCheckpoint { .. } => ErrorKind::Damaged,
            Self::Fenced { .. } => ErrorKind::Fenced,
            Self::Busy { .. } => ErrorKind::Busy,
            Self::Io { .. } | Self::Stopped { .. } => ErrorKind::Io,
            Self::Full { .. } => ErrorKind::Full,
            Self::Invalid { .. } => ErrorKind::Invalid,
            Self::Deferred { cause, .. } => *cause,
            Self::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// An I/O error on `path` while doing `action`.
    pub(crate) fn io(action: &str, path: &std::path::Path, source: std::io::Error) -> Self {
        let detail = format!("cannot {action} {}: {source}", path.display());
        if source.kind() == std::io::ErrorKind::StorageFull {
            return Self::Full { detail };
        }
        Self::Io { detail, source: Some(source) }
    }

    /// Damage to `what`, found out by `detail`.
    pub(crate) fn damaged(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::Damaged { what: what.into(), detail: detail.into() }
    }

    /// A value a store cannot take.
    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        Self::Invalid { detail: detail.into() }
    }
}

/// `value` as SQL's signed 64-bit integer, or [`StoreError::Invalid`] naming `what`: every
/// adapter refuses what SQL databases cannot store, so that stores agree on what they take.
pub(crate) fn to_i64(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::invalid(format!("{what} {value} is above i64::MAX")))
}
