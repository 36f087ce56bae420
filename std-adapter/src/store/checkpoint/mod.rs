//! What a [`CheckpointSink`](super::CheckpointSink) hands out: ids, listings, the checkpoint a
//! restore settled on and what it passed over; the frame (magic, sequence, length, CRC-32)
//! every adapter keeps a checkpoint's bytes in; and the clock ids are made from.

pub mod clock;
pub mod frame;
mod id;

use std::fmt;
use std::time::SystemTime;

pub use frame::{FLAG_SEQUENCE, FORMAT_VERSION, FrameError, MAGIC};
pub use id::{CheckpointId, IdError};

/// One checkpoint as [`CheckpointSink::list`](super::CheckpointSink::list) sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its id.
    pub id: CheckpointId,
    /// Where it is kept (a file's path, a key), for people.
    pub location: String,
    /// Bytes it takes, framing included.
    pub size: u64,
    /// When it was last written, where the medium tells.
    pub modified: Option<SystemTime>,
    /// Whether it is intact.
    pub status: CheckpointStatus,
}

/// Health of a checkpoint.
///
/// ```
/// use ctxwin_std::store::checkpoint::CheckpointStatus;
/// assert_eq!(CheckpointStatus::Ok.to_string(), "ok");
/// assert!(CheckpointStatus::Damaged("torn".into()).to_string().starts_with("damaged"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointStatus {
    /// Framing and CRC check out.
    Ok,
    /// Torn or damaged (what is wrong).
    Damaged(String),
    /// It could not be read (the error's message).
    Unreadable(String),
}

impl fmt::Display for CheckpointStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Damaged(error) => write!(f, "damaged: {error}"),
            Self::Unreadable(error) => write!(f, "unreadable: {error}"),
        }
    }
}

/// The checkpoint a [`load_latest`](super::CheckpointSink::load_latest) settled on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    /// Its id.
    pub id: CheckpointId,
    /// Its payload, verified against its checksum.
    pub bytes: Vec<u8>,
    /// Newer checkpoints passed over, newest first, each with its reason.
    pub skipped: Vec<Skipped>,
}

/// A checkpoint passed over while looking for the newest usable one.
///
/// ```
/// use ctxwin_std::store::checkpoint::{CheckpointId, SkipReason, Skipped};
/// let skipped = Skipped {
///     id: CheckpointId::parse("20260101T000000.000000Z-000003")?,
///     location: "snapshots/20260101T000000.000000Z-000003.ckpt".into(),
///     reason: SkipReason::Rejected("unknown snapshot version".into()),
/// };
/// assert!(skipped.to_string().contains("unknown snapshot version"));
/// # Ok::<(), ctxwin_std::store::checkpoint::IdError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its id.
    pub id: CheckpointId,
    /// Where it is kept.
    pub location: String,
    /// Why it was passed over.
    pub reason: SkipReason,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.id, self.location, self.reason)
    }
}

/// Why a checkpoint was passed over.
///
/// ```
/// use ctxwin_std::store::checkpoint::SkipReason;
/// let reason = SkipReason::Damaged("torn file: 3 bytes".into());
/// assert!(reason.to_string().starts_with("damaged"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Its frame or checksum is broken (a torn write, bit rot, a foreign file): what is
    /// wrong.
    Damaged(String),
    /// Intact, but the caller refused its payload (another session's, a version it cannot
    /// read).
    Rejected(String),
    /// It disappeared between listing and reading (pruned by another process).
    Vanished,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Damaged(error) => write!(f, "damaged: {error}"),
            Self::Rejected(why) => write!(f, "rejected: {why}"),
            Self::Vanished => f.write_str("vanished while reading"),
        }
    }
}
