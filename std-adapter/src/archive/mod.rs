//! The archive: an embedded SQLite database that keeps every unit the core evicts, the
//! summaries made of them, their keywords and compression metrics, and finds them again.
//!
//! * Writes are transactional: [`Archive::store_unit`] returns only after the unit is committed,
//!   so the caller may release it from the core; re-storing a message id updates it in place.
//! * Retrieval: BM25 full-text search over content, tool calls and original texts
//!   ([`Archive::search`]), by recency ([`Archive::recent`]), by keyword
//!   ([`Archive::by_keyword`]), and from a summary down to the messages it stands for
//!   ([`Archive::drill_down`]). [`as_dynamic_context`] formats hits for the payload.
//! * Message and unit ids are the core's per-session counters, so every lookup names its
//!   session.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::archive::{Archive, ArchivedMessage};
//! use ctxwin_std::{ChatMessage, core::Role};
//!
//! let mut archive = Archive::open_in_memory()?;
//! let ask = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "why does the lexer panic?"));
//! archive.store_unit("s1", &[ask])?;
//! let hits = archive.search(Some("s1"), "lexer", 5)?;
//! assert_eq!(hits[0].id, 1);
//! assert_eq!(archive.get("s1", 1)?.unwrap().message.content, "why does the lexer panic?");
//! # Ok::<(), ctxwin_std::archive::ArchiveError>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rusqlite::{Connection, OptionalExtension, Row};

use crate::message::{ChatMessage, ToolCall};
use ctxwin_core::Role;

mod context;
mod error;
mod forget;
mod integrity;
pub mod keywords;
mod metrics;
pub mod schema;
mod search;
mod store;
mod summaries;
mod types;
mod vectors;
mod writer;

pub use context::{as_dynamic_context, messages_as_dynamic_context};
pub use error::{ArchiveError, SqliteFailure};
pub use forget::{FORGOTTEN, Forgotten};
pub use integrity::QUICK_CHECK_MAX_BYTES;
pub use metrics::{ArchiveStats, MetricsSummary, StrategyMetrics};
pub use search::{KeywordCount, KeywordHit, SearchHit, SummaryHit};
pub use types::{ArchivedMessage, CompressionRecord, SummaryRecord};
pub use vectors::VectorRow;
pub use writer::{ArchiveWriter, SubmitError, Ticket, WriterOptions, WriterStats};

use error::from_sql_int;

/// A handle on one archive database. Writes take `&mut self`. To share the database between
/// sessions and threads, [`clone`](Clone::clone) the handle (the clones share its one SQLite
/// connection, taking turns on it), or open the file again (a connection each: WAL lets readers
/// run beside one writer).
///
/// A connection costs about 200 KiB (page cache, lookaside, parsed schema, compiled
/// statements) and sees the pages another connection wrote as stale: many sessions on one file
/// (the proxy's) cost less memory and rereading through clones of one handle.
/// Handles on the same file in one process take turns for their write transactions on an
/// in-process lock before SQLite's: many connections writing one archive queue for it instead
/// of sleeping in SQLite's busy handler (1 to 100 ms a try) or failing with "database is
/// locked" once its timeout passes.
#[derive(Debug)]
pub struct Archive {
    /// Shared by this handle's clones; locked for one statement or transaction at a time.
    conn: Arc<Mutex<Connection>>,
    /// The write lock of this file in this process (none in memory).
    gate: Option<Arc<Mutex<()>>>,
    /// Connections for searches ([`with_read_connections`](Archive::with_read_connections)),
    /// shared by the clones too.
    readers: Option<Arc<Readers>>,
}

/// An archive's read connections and where the next wait for one goes.
#[derive(Debug)]
struct Readers {
    connections: Vec<Mutex<Connection>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Clone for Archive {
    /// Another handle on the same connection (not a new connection): the clones share its page
    /// cache and compiled statements, and take turns on it.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// let other = archive.clone();
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// assert_eq!(other.message_count(Some("s"))?, 1);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    fn clone(&self) -> Self {
        Self { conn: self.conn.clone(), gate: self.gate.clone(), readers: self.readers.clone() }
    }
}

/// The in-process write lock of the archive file at `path`: one per file.
fn gate_for(path: &Path) -> Arc<Mutex<()>> {
    static GATES: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut gates =
        GATES.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
    gates.entry(key).or_default().clone()
}

/// Files this process has opened and checked in depth (their canonical paths).
fn checked_files() -> MutexGuard<'static, std::collections::HashSet<PathBuf>> {
    static CHECKED: OnceLock<Mutex<std::collections::HashSet<PathBuf>>> = OnceLock::new();
    CHECKED.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner)
}

fn checked_before(key: &Path) -> bool {
    checked_files().contains(key)
}

fn mark_checked(key: PathBuf) {
    checked_files().insert(key);
}

/// Takes this file's turn to write (held until the guard drops). Callers hold it around one
/// write transaction and call no other method that takes it meanwhile.
fn write_turn(gate: &Option<Arc<Mutex<()>>>) -> Option<MutexGuard<'_, ()>> {
    gate.as_deref().map(|gate| gate.lock().unwrap_or_else(PoisonError::into_inner))
}

impl Archive {
    /// Opens (creating if needed) the archive at `path`, in WAL mode with
    /// `synchronous = NORMAL` and foreign keys on, and migrates its schema.
    ///
    /// # Errors
    /// [`ArchiveError::Sqlite`] if the file cannot be opened or is not a database,
    /// [`ArchiveError::SchemaTooNew`] if a newer build wrote it.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let archive = ctxwin_std::archive::Archive::open(dir.path().join("archive.db"))?;
    /// assert_eq!(archive.journal_mode()?, "wal");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ArchiveError> {
        let path = path.as_ref();
        let mut conn = Connection::open(path)?;
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        // The deep check reads the whole file: once per process (a proxy opens its shared
        // archive for every conversation it loads); the header is checked every time.
        let deep = !checked_before(&key);
        integrity::check_file(&conn, path, deep)?;
        schema::configure(&conn, true)?;
        schema::migrate(&mut conn)?;
        integrity::ensure_identity(&conn)?;
        if deep {
            mark_checked(key);
        }
        tracing::debug!(path = %path.display(), deep, "archive: opened");
        Ok(Self::with(conn, Some(gate_for(path))))
    }

    /// Opens a private in-memory archive (no WAL: there is no file), for tests and short runs.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.stats()?.messages, 0);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn open_in_memory() -> Result<Self, ArchiveError> {
        let mut conn = Connection::open_in_memory()?;
        schema::configure(&conn, false)?;
        schema::migrate(&mut conn)?;
        integrity::ensure_identity(&conn)?;
        Ok(Self::with(conn, None))
    }

    fn with(conn: Connection, gate: Option<Arc<Mutex<()>>>) -> Self {
        Self { conn: Arc::new(Mutex::new(conn)), gate, readers: None }
    }

    /// This handle with `count` more connections to its file for searches (`search`, `rank`,
    /// `get_many` and the other reads of retrieval), read-only and shared by its clones. In WAL
    /// mode a reader never waits for a writer: with many sessions sharing one connection and
    /// one [`ArchiveWriter`] committing their rows on it, a search otherwise waits for the
    /// writer's whole transaction, and searches of several threads wait for each other. A
    /// search takes a free reader, or waits for one. Searches see what is committed when they
    /// start. An in-memory archive has no file to open twice, and `count` 0 opens nothing:
    /// the handle is returned unchanged. Each connection has its own page cache (2 MB at
    /// most by default).
    ///
    /// # Errors
    /// [`ArchiveError::Sqlite`] when a connection cannot be opened.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let mut archive = Archive::open(dir.path().join("a.db"))?.with_read_connections(2)?;
    /// let text = ChatMessage::text(Role::User, "the staging database runs Postgres 16");
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1, text)])?;
    /// assert_eq!(archive.search(Some("s"), "postgres", 5)?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_read_connections(mut self, count: usize) -> Result<Self, ArchiveError> {
        let path = self.conn().path().filter(|path| !path.is_empty()).map(PathBuf::from);
        let Some(path) = path.filter(|_| count > 0) else { return Ok(self) };
        let mut connections = Vec::with_capacity(count);
        for _ in 0..count {
            let reader = Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            reader.busy_timeout(std::time::Duration::from_secs(5))?;
            connections.push(Mutex::new(reader));
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        self.readers = Some(Arc::new(Readers { connections, next }));
        Ok(self)
    }

    /// A connection for a search, locked: a free read connection, else the next one in turn
    /// (waited for), else (none opened) the shared one.
    fn read_conn(&self) -> MutexGuard<'_, Connection> {
        let Some(readers) = self.readers.as_deref() else { return self.conn() };
        for reader in &readers.connections {
            match reader.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        let turn = readers.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let count = readers.connections.len().max(1);
        match readers.connections.get(turn % count) {
            Some(reader) => reader.lock().unwrap_or_else(PoisonError::into_inner),
            None => self.conn(),
        }
    }

    /// Whether `other` is a clone of this handle (the same connection), not another one.
    ///
    /// ```
    /// use ctxwin_std::archive::Archive;
    /// let archive = Archive::open_in_memory()?;
    /// assert!(archive.shares_connection(&archive.clone()));
    /// assert!(!archive.shares_connection(&Archive::open_in_memory()?));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn shares_connection(&self, other: &Archive) -> bool {
        Arc::ptr_eq(&self.conn, &other.conn)
    }

    /// The connection, locked, for tests elsewhere in the crate (to hold writers off it).
    #[cfg(test)]
    pub(crate) fn conn_for_tests(&self) -> MutexGuard<'_, Connection> {
        self.conn()
    }

    /// Makes every message insert fail with `reason` until [`heal_writes_for_tests`]
    /// (a trigger), for tests of failed writes elsewhere in the crate.
    ///
    /// [`heal_writes_for_tests`]: Self::heal_writes_for_tests
    #[cfg(test)]
    pub(crate) fn fail_writes_for_tests(&self, reason: &str) {
        let sql = format!(
            "CREATE TABLE fail_writes (x);
             INSERT INTO fail_writes VALUES (1);
             CREATE TRIGGER fail_writes BEFORE INSERT ON messages
             WHEN EXISTS (SELECT 1 FROM fail_writes)
             BEGIN SELECT RAISE(ABORT, '{reason}'); END;"
        );
        if let Err(error) = self.conn().execute_batch(&sql) {
            panic!("test setup: {error}");
        }
    }

    /// Ends [`fail_writes_for_tests`](Self::fail_writes_for_tests).
    #[cfg(test)]
    pub(crate) fn heal_writes_for_tests(&self) {
        if let Err(error) = self.conn().execute_batch("DELETE FROM fail_writes") {
            panic!("test setup: {error}");
        }
    }

    /// This handle's connection, locked until the guard drops. Callers hold it for one
    /// statement or transaction and call no other method meanwhile (they lock it too).
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Caps this handle's SQLite page cache at `kib` KiB (SQLite's default is 2,000 KiB for
    /// each connection, filled as pages are read). A process holding many handles (the proxy:
    /// one per resident session) bounds its memory with it; pages that do not fit are read
    /// again from the operating system's file cache.
    ///
    /// # Errors
    /// SQLite errors.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// archive.set_cache_kib(128)?;
    /// assert_eq!(archive.cache_kib()?, 128);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn set_cache_kib(&self, kib: u32) -> Result<(), ArchiveError> {
        self.conn().pragma_update(None, "cache_size", -i64::from(kib))?;
        Ok(())
    }

    /// The page cache cap of this handle in KiB (see [`set_cache_kib`](Self::set_cache_kib)).
    ///
    /// # Errors
    /// SQLite errors.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.cache_kib()?, 2_000);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn cache_kib(&self) -> Result<u64, ArchiveError> {
        let size: i64 = self.conn().pragma_query_value(None, "cache_size", |row| row.get(0))?;
        // Negative: KiB; positive: pages.
        let page: i64 = self.conn().pragma_query_value(None, "page_size", |row| row.get(0))?;
        let kib = if size < 0 { -size } else { size.saturating_mul(page) / 1024 };
        Ok(u64::try_from(kib).unwrap_or(0))
    }

    /// Copies the WAL's committed pages into the database file and syncs it (a passive
    /// checkpoint: writers on other connections go on meanwhile). Returns the pages the WAL
    /// holds and those copied so far; does nothing in memory.
    ///
    /// A commit that leaves more than 1,000 pages in the WAL does this itself, syncing the
    /// disk before it returns (the only time a write with `synchronous = NORMAL` waits for
    /// it). Another handle calling this regularly leaves commits less to copy, off their path.
    ///
    /// # Errors
    /// SQLite errors.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("archive.db");
    /// drop(Archive::open(&path)?); // a new file's schema is in its WAL until the last close
    /// let mut archive = Archive::open(&path)?;
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// let other = Archive::open(&path)?;
    /// let (pages, copied) = other.checkpoint_wal()?;
    /// assert!(pages > 0 && copied == pages);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_wal(&self) -> Result<(u64, u64), ArchiveError> {
        if self.gate.is_none() {
            return Ok((0, 0));
        }
        let (log, copied): (i64, i64) =
            self.conn().query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })?;
        Ok((u64::try_from(log).unwrap_or(0), u64::try_from(copied).unwrap_or(0)))
    }

    /// The journal mode in force (`"wal"` for a file, `"memory"` in memory).
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.journal_mode()?, "memory");
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn journal_mode(&self) -> Result<String, ArchiveError> {
        let mode: String =
            self.conn().pragma_query_value(None, "journal_mode", |row| row.get(0))?;
        Ok(mode.to_lowercase())
    }

    /// The schema version of the open database (`PRAGMA user_version`).
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, schema::SCHEMA_VERSION};
    /// assert_eq!(Archive::open_in_memory()?.schema_version()?, SCHEMA_VERSION);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn schema_version(&self) -> Result<i64, ArchiveError> {
        schema::version(&self.conn())
    }

    /// The row id of session `name`, if it has stored anything.
    fn session_id(&self, name: &str) -> Result<Option<i64>, ArchiveError> {
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached("SELECT id FROM sessions WHERE name = ?1")?;
        Ok(stmt.query_row([name], |row| row.get(0)).optional()?)
    }
}

/// The row id of session `name`, created if new (looked up first: every write of a session
/// but its first finds the row, and an insert attempt would cost a write).
fn ensure_session(conn: &Connection, name: &str) -> Result<i64, ArchiveError> {
    let mut select = conn.prepare_cached("SELECT id FROM sessions WHERE name = ?1")?;
    if let Some(id) = select.query_row([name], |row| row.get(0)).optional()? {
        return Ok(id);
    }
    let mut insert = conn.prepare_cached("INSERT INTO sessions (name) VALUES (?1) RETURNING id")?;
    Ok(insert.query_row([name], |row| row.get(0))?)
}

/// The `messages` columns [`decode_message`] reads, in its order, for a table aliased `m`.
const MESSAGE_COLUMNS: &str = "m.id, m.unit, m.level, m.role, m.content, m.tool_calls, \
     m.tool_call_id, m.original, m.timestamp, m.tokens, m.name, m.is_error";

/// Decodes one row selected with [`MESSAGE_COLUMNS`] first.
fn decode_message(row: &Row<'_>) -> Result<ArchivedMessage, ArchiveError> {
    let level: i64 = row.get(2)?;
    let level = u8::try_from(level)
        .ok()
        .and_then(types::level_from_code)
        .ok_or_else(|| ArchiveError::Corrupt(format!("unknown level {level}")))?;
    let role_name: String = row.get(3)?;
    let role = Role::parse(&role_name)
        .ok_or_else(|| ArchiveError::Corrupt(format!("unknown role {role_name:?}")))?;
    let tool_calls: Option<String> = row.get(5)?;
    let tool_calls: Vec<ToolCall> = match tool_calls {
        Some(json) => serde_json::from_str(&json)?,
        None => Vec::new(),
    };
    let tokens: i64 = row.get(9)?;
    Ok(ArchivedMessage {
        id: from_sql_int("message id", row.get(0)?)?,
        unit: from_sql_int("unit id", row.get(1)?)?,
        level,
        message: ChatMessage {
            role,
            content: row.get(4)?,
            tool_calls,
            tool_call_id: row.get(6)?,
            name: row.get(10)?,
            is_error: row.get(11)?,
        },
        timestamp: from_sql_int("timestamp", row.get(8)?)?,
        tokens: u32::try_from(tokens)
            .map_err(|_| ArchiveError::Corrupt(format!("token count {tokens}")))?,
        original: row.get(7)?,
    })
}

/// Runs `stmt` and decodes every row as a message.
fn collect_messages(
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<ArchivedMessage>, ArchiveError> {
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode_message(row)?);
    }
    Ok(out)
}

/// Clamps a caller's `limit` for SQL.
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_on_one_file_share_a_write_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        // Created and closed first: a new file's schema is in its WAL until the last close.
        drop(Archive::open(&path).unwrap());
        drop(Archive::open(dir.path().join("b.db")).unwrap());
        let a = Archive::open(&path).unwrap();
        let b = Archive::open(dir.path().join(".").join("a.db")).unwrap();
        let other = Archive::open(dir.path().join("b.db")).unwrap();
        assert!(Arc::ptr_eq(a.gate.as_ref().unwrap(), b.gate.as_ref().unwrap()));
        assert!(!Arc::ptr_eq(a.gate.as_ref().unwrap(), other.gate.as_ref().unwrap()));
        assert!(Archive::open_in_memory().unwrap().gate.is_none());
    }

    #[test]
    fn the_deep_check_runs_once_per_process_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let key = || std::fs::canonicalize(&path).unwrap();
        drop(Archive::open(&path).unwrap());
        assert!(checked_before(&key()));
        assert!(!checked_before(&dir.path().join("b.db")));
        // A header damaged later is still found by the next open.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] = b'X';
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(Archive::open(&path), Err(ArchiveError::Corrupt(_))));
    }

    #[test]
    fn clones_share_one_connection_and_a_bad_write_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path().join("a.db")).unwrap();
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let mut archive = archive.clone();
                std::thread::spawn(move || {
                    for id in 1..=30_u64 {
                        let text = format!("writer {w} message {id}");
                        let row = ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text));
                        assert_eq!(archive.store_messages(&format!("s{w}"), &[row]).unwrap(), 1);
                    }
                    // A bad row fails its own write only.
                    let bad = ArchivedMessage::new(u64::MAX, 1, ChatMessage::text(Role::User, "x"));
                    assert!(matches!(
                        archive.store_messages(&format!("s{w}"), &[bad]),
                        Err(ArchiveError::OutOfRange { .. })
                    ));
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        assert!(Arc::ptr_eq(&archive.conn, &archive.clone().conn));
        assert_eq!(archive.message_count(None).unwrap(), 8 * 30);
        assert_eq!(archive.get("s3", 30).unwrap().unwrap().message.content, "writer 3 message 30");
    }

    #[test]
    fn many_writers_on_one_file_never_see_it_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        drop(Archive::open(&path).unwrap());
        let writers: Vec<_> = (0..16)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut archive = Archive::open(&path).unwrap();
                    archive.set_cache_kib(64).unwrap();
                    for id in 1..=40_u64 {
                        let text = format!("writer {w} message {id}");
                        let row = ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text));
                        archive.store_unit(&format!("s{w}"), &[row]).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let archive = Archive::open(&path).unwrap();
        assert_eq!(archive.message_count(None).unwrap(), 16 * 40);
    }
}
