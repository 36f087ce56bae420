//! The archive's error type.

/// Everything that can go wrong reading or writing the archive.
///
/// ```
/// use ctxwin_std::archive::ArchiveError;
/// let err = ArchiveError::OutOfRange { what: "message id", value: u64::MAX };
/// assert!(err.to_string().contains("message id"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// SQLite reported an error (I/O, corruption, a locked database, ...).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A `u64` (id, timestamp, count) is above `i64::MAX`, which SQLite cannot store.
    #[error("{what} {value} is larger than SQLite's 64-bit signed integer")]
    OutOfRange {
        /// Which field.
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// `store_unit` was given messages that belong to different units.
    #[error("one unit must hold one unit id, got {first} and {other}")]
    MixedUnit {
        /// The first message's unit id.
        first: u64,
        /// The first unit id that differs from it.
        other: u64,
    },
    /// The database was written by a newer version of this crate.
    #[error("archive schema version {found} is newer than the {supported} this build supports")]
    SchemaTooNew {
        /// `PRAGMA user_version` found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// No summary with this id in this session.
    #[error("no summary {id} in session {session:?}")]
    SummaryNotFound {
        /// Session searched.
        session: String,
        /// Summary id asked for.
        id: u64,
    },
    /// The archive is not the one the checkpoints were written with, or lacks messages they
    /// cover.
    #[error("{0}")]
    Mismatch(String),
    /// A stored row cannot be decoded (written by another program, or damaged).
    #[error("corrupt archive row: {0}")]
    Corrupt(String),
    /// Tool calls could not be encoded or decoded as JSON.
    #[error("tool calls json: {0}")]
    Json(#[from] serde_json::Error),
    /// The deferred writer ([`ArchiveWriter`](super::ArchiveWriter)) failed to commit queued
    /// rows. They stay queued, in order, and the writer tries again after a short pause: wait
    /// again later (nothing was dropped).
    #[error(
        "deferred archive write failed ({failures} failed attempts in a row, {queued_rows} rows still queued and retried): {reason}"
    )]
    DeferredWrite {
        /// The failed attempt's error, as text.
        reason: String,
        /// What kind of SQLite failure it was, when it was one.
        failure: Option<SqliteFailure>,
        /// Attempts that failed since the last commit.
        failures: u64,
        /// Rows queued and not committed when it failed.
        queued_rows: usize,
    },
    /// The deferred writer's thread has ended (its last handle was dropped and it gave up
    /// retrying, or it died): rows it had not committed were not written.
    #[error("the deferred archive writer has stopped; {rows} queued rows were not written")]
    WriterStopped {
        /// Rows queued and never committed.
        rows: usize,
    },
}

/// What kind of SQLite failure an [`ArchiveError::Sqlite`] is, for callers that react to it
/// (the CLI's exit codes) without naming `rusqlite`'s error codes themselves.
///
/// ```
/// use ctxwin_std::archive::{Archive, ArchiveError, SqliteFailure};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("archive.db");
/// let archive = Archive::open(&path)?;
/// drop(archive);
/// // A table ctxwin's fixed statements need is gone: SQLite's generic error, a damaged file.
/// let sqlite = rusqlite::Connection::open(&path)?;
/// sqlite.execute_batch("DROP TABLE messages")?;
/// drop(sqlite);
/// let error = match Archive::open(&path) {
///     Err(error) => error,
///     Ok(mut archive) => archive.message_count(None).err().expect("no messages table"),
/// };
/// assert!(
///     matches!(error, ArchiveError::Corrupt(_) | ArchiveError::Mismatch(_))
///         || error.sqlite_failure() == Some(SqliteFailure::Generic)
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqliteFailure {
    /// The file is damaged or not a SQLite database.
    Damaged,
    /// Another connection holds a lock (busy or locked).
    Locked,
    /// SQLite's generic error on one of ctxwin's fixed statements (no such table, a schema
    /// that does not parse): the file is damaged or is not ctxwin's archive.
    Generic,
    /// Any other error SQLite reported (I/O, permissions, a full disk, ...).
    Other,
    /// The error came from the `rusqlite` layer, not from SQLite (a type conversion, ...).
    NotFromSqlite,
}

impl ArchiveError {
    /// The kind of SQLite failure this is; `None` unless it is [`ArchiveError::Sqlite`] (or an
    /// [`ArchiveError::DeferredWrite`] that SQLite failed).
    ///
    /// ```
    /// use ctxwin_std::archive::ArchiveError;
    /// let err = ArchiveError::Corrupt("bad row".into());
    /// assert_eq!(err.sqlite_failure(), None);
    /// ```
    pub fn sqlite_failure(&self) -> Option<SqliteFailure> {
        let sqlite = match self {
            Self::Sqlite(sqlite) => sqlite,
            Self::DeferredWrite { failure, .. } => return *failure,
            _ => return None,
        };
        Some(match sqlite.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                SqliteFailure::Damaged
            }
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                SqliteFailure::Locked
            }
            Some(rusqlite::ErrorCode::Unknown) => SqliteFailure::Generic,
            Some(_) => SqliteFailure::Other,
            None => SqliteFailure::NotFromSqlite,
        })
    }
}

/// Converts a caller's `u64` into SQLite's `i64`, or a typed error.
pub(crate) fn to_sql_int(what: &'static str, value: u64) -> Result<i64, ArchiveError> {
    i64::try_from(value).map_err(|_| ArchiveError::OutOfRange { what, value })
}

/// Converts a stored `i64` back; negative values mean the row was not written by us.
pub(crate) fn from_sql_int(what: &'static str, value: i64) -> Result<u64, ArchiveError> {
    u64::try_from(value).map_err(|_| ArchiveError::Corrupt(format!("negative {what} {value}")))
}
