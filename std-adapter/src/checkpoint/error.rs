//! Errors of the checkpoint store and the report of skipped files.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use super::{CheckpointId, FrameError, IdError};

/// What went wrong in a [`CheckpointStore`](super::CheckpointStore) operation.
///
/// Every variant names the file, id or directory involved.
///
/// ```
/// use ctxwin_std::checkpoint::{CheckpointError, CheckpointId, CheckpointStore};
/// let dir = tempfile::tempdir()?;
/// let store = CheckpointStore::open(dir.path())?;
/// let id = CheckpointId::parse("20260101T000000.000000Z-000000")?;
/// assert!(matches!(store.load(&id), Err(CheckpointError::NotFound { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A string given as an id is not one.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// No checkpoint with this id exists in the store.
    #[error("checkpoint {id} not found in {dir}")]
    NotFound {
        /// The id asked for.
        id: CheckpointId,
        /// The store directory.
        dir: PathBuf,
    },
    /// The file exists but is not a complete, intact checkpoint.
    #[error("checkpoint file {path} is corrupt: {source}")]
    Corrupt {
        /// Id of the file.
        id: CheckpointId,
        /// Full path of the file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: FrameError,
    },
    /// A file-system operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `"fsync"` or `"rename into place"`.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Checkpoint files exist, but none of them is usable.
    #[error("no usable checkpoint in {dir}: all {} files were skipped", skipped.len())]
    NoValidCheckpoint {
        /// The store directory.
        dir: PathBuf,
        /// Every file tried, newest first, and why it was refused.
        skipped: Vec<Skipped>,
    },
    /// The wall clock is outside the years 1970..=9999 that ids can name.
    #[error("system clock reads {now:?}, outside the 1970..=9999 range checkpoint ids can name")]
    ClockOutOfRange {
        /// The clock reading.
        now: SystemTime,
    },
    /// Every fresh id tried was already taken (by other processes writing the same store).
    #[error("no free checkpoint id in {dir} after {attempts} attempts")]
    IdsExhausted {
        /// The store directory.
        dir: PathBuf,
        /// How many ids were tried.
        attempts: u32,
    },
}

impl CheckpointError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io { op, path: path.into(), source }
    }
}

/// A checkpoint file passed over while looking for the newest usable one.
///
/// ```
/// use ctxwin_std::checkpoint::{CheckpointId, SkipReason, Skipped};
/// let skipped = Skipped {
///     id: CheckpointId::parse("20260101T000000.000000Z-000003")?,
///     path: "snapshots/20260101T000000.000000Z-000003.ckpt".into(),
///     reason: SkipReason::Rejected("unknown snapshot version".into()),
/// };
/// assert!(skipped.to_string().contains("unknown snapshot version"));
/// # Ok::<(), ctxwin_std::checkpoint::IdError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Id of the skipped file.
    pub id: CheckpointId,
    /// Full path of the skipped file.
    pub path: PathBuf,
    /// Why it was skipped.
    pub reason: SkipReason,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.id, self.path.display(), self.reason)
    }
}

/// Why a checkpoint file was skipped.
///
/// ```
/// use ctxwin_std::checkpoint::{FrameError, SkipReason};
/// let reason = SkipReason::Corrupt(FrameError::Torn { len: 3 });
/// assert!(reason.to_string().starts_with("corrupt"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The framing or its CRC is broken (torn write, bit rot, foreign file).
    Corrupt(FrameError),
    /// The framing is intact but the caller's validation refused the payload.
    Rejected(String),
    /// The file disappeared between listing and reading (pruned by another process).
    Vanished,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Corrupt(error) => write!(f, "corrupt: {error}"),
            Self::Rejected(why) => write!(f, "rejected by validation: {why}"),
            Self::Vanished => f.write_str("vanished while reading"),
        }
    }
}
