//! What every conversation of a proxy shares: the archive (one SQLite file for all, behind a
//! deferred writer thread), and how a conversation's session is configured on it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxwin_std::session::{SessionBuilder, SessionError};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{ArchiveStore, Deferred};

use super::ConvError;

/// Page cache of the archive connection every conversation shares, in KiB (SQLite's default
/// is 2,000). One connection for all: a connection each cost about 200 KiB per resident
/// conversation, and each found its cache stale after every other one's write.
pub const ARCHIVE_CACHE_KIB: u32 = 2_048;

/// The file an older proxy kept its own index of messages in (`meta` and `entries` tables).
/// It is no longer read: a message is stored once, in the archive, plus the checkpoints.
pub const LEFTOVER_SIDE_STORE: &str = "proxy.db";

/// What every conversation of a proxy shares: one archive.
#[derive(Clone, Debug)]
pub struct Stores {
    /// The archive (`<state_dir>/archive.db`): the writer's inner store, whose handle (one
    /// connection, and read connections for searches) every conversation shares.
    pub archive: SqliteArchive,
    /// A second connection to the archive, for WAL checkpoints off the request path
    /// ([`crate::app::App::checkpoint_wal`]).
    pub wal: SqliteArchive,
    /// The archive port every session writes: the archive behind a [`Deferred`] writer
    /// thread, which writes every conversation's rows many requests to a transaction, off
    /// the request path (a session's reads wait for its own queued rows).
    pub writer: Arc<Deferred<SqliteArchive>>,
}

/// Opens the archive every conversation shares (once, at start). A side store an older proxy
/// left (`proxy.db`) is not read: one warning names it.
///
/// # Errors
/// Store and I/O errors.
pub fn prepare_state(state_dir: &Path) -> Result<Stores, ConvError> {
    std::fs::create_dir_all(state_dir)?;
    let leftover = state_dir.join(LEFTOVER_SIDE_STORE);
    if leftover.exists() {
        tracing::warn!(
            path = %leftover.display(),
            "proxy: the side store of an older ctxwin proxy is not read (messages are stored once, in archive.db, with the checkpoints); the conversations it indexed continue as new generations. Delete it (and its -wal, -shm files) once no older proxy needs it"
        );
    }
    let path = state_dir.join("archive.db");
    // Opened and closed first: a new file's schema stays in its WAL until its last connection
    // closes, and opening a second one checks the file's header.
    drop(SqliteArchive::open(&path).map_err(SessionError::from)?);
    // Retrieval's searches read on connections of their own, one per blocking-pool worker: in
    // WAL mode they never wait for the writer thread's transactions on the shared one, nor
    // for each other.
    let archive = SqliteArchive::open(&path)
        .and_then(|archive| archive.with_read_connections(crate::pool::workers()))
        .map_err(SessionError::from)?;
    archive.set_cache_kib(ARCHIVE_CACHE_KIB).map_err(SessionError::from)?;
    let wal = SqliteArchive::open(&path).map_err(SessionError::from)?;
    wal.set_cache_kib(64).map_err(SessionError::from)?;
    let writer = Arc::new(Deferred::spawn(archive.clone())?);
    Ok(Stores { archive, wal, writer })
}

/// The keys of the conversations under the state directory that have something stored:
/// messages in the archive (`key`, `key#N` for later generations and `key@…` for rows a
/// restore set aside). A key not among them, and not seen since, is new:
/// [`Conv::create`](super::Conv::create) builds it without reading anything.
///
/// # Errors
/// Store errors.
pub fn persisted_keys(stores: &Stores) -> Result<HashSet<String>, ConvError> {
    let names = stores.archive.conversations("", "").map_err(SessionError::from)?;
    Ok(names.iter().map(|name| name.split(['#', '@']).next().unwrap_or(name).to_string()).collect())
}

/// The session settings every conversation shares, for session `name` checkpointed in
/// `checkpoints` (the configuration is the caller's: it depends on the conversation's window).
pub(super) fn session_builder(stores: &Stores, name: &str, checkpoints: PathBuf) -> SessionBuilder {
    SessionBuilder::new(name)
        .archive_store(stores.writer.clone())
        .checkpoints(checkpoints)
        .keep_checkpoints(3)
        // The proxy checkpoints when a conversation idles or unloads, not every N messages.
        .checkpoint_interval_messages(0)
}
