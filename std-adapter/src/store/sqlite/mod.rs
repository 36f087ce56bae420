//! [`SqliteArchive`]: the archive port on an embedded SQLite database (WAL, one file), with
//! an FTS5 full-text index, summaries with their sources, vectors and compression metrics.
//!
//! * A [`Scope`] is a row of `sessions` (tenant, name): every query joins or filters on its
//!   id, and the full-text index holds it, so a search intersects the conversation's postings
//!   with the words' instead of ranking every conversation's matches.
//! * Every row stores its [checksum], verified on every read;
//!   [`open`](SqliteArchive::open) also runs SQLite's own checks once per process and file.
//! * Fences are accepted and not checked: one process writes a file (handles in a process
//!   take turns on an in-process lock before SQLite's).
//! * What is SQLite's own (WAL checkpoints, the page cache, `quick_check`, read connections)
//!   are methods of the adapter, not of the port.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::store::sqlite::SqliteArchive;
//! use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope, SearchQuery};
//! use ctxwin_std::{ChatMessage, core::Role};
//!
//! let archive = SqliteArchive::open_in_memory()?;
//! let scope = Scope::local("s1");
//! let ask = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "why does the lexer panic?"));
//! archive.put(&scope, Fence::NONE, &[ask])?;
//! let hits = archive.search(&scope, &SearchQuery::new("lexer", 5))?;
//! assert_eq!(hits[0].id, 1);
//! assert_eq!(archive.get(&scope, 1)?.unwrap().message.content, "why does the lexer panic?");
//! # Ok::<(), ctxwin_std::store::StoreError>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rusqlite::{Connection, OptionalExtension, Row};

use crate::message::{ChatMessage, ToolCall};
use crate::store::{ArchivedMessage, Scope, StoreError, checksum};
use ctxwin_core::Role;

mod error;
mod forget;
mod integrity;
mod metrics;
mod port;
mod records;
mod rows;
pub mod schema;
mod search;
mod summaries;
mod vectors;

pub use integrity::QUICK_CHECK_MAX_BYTES;
pub use metrics::ArchiveStats;

use error::{Failure, Sql, from_sql_int};

/// The archive port on one SQLite database file (or an in-memory database). Writes take `&mut self`. To share the database between
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
pub struct SqliteArchive {
    /// Shared by this handle's clones; locked for one statement or transaction at a time.
    conn: Arc<Mutex<Connection>>,
    /// The write lock of this file in this process (none in memory).
    gate: Option<Arc<Mutex<()>>>,
    /// Connections for searches ([`with_read_connections`](SqliteArchive::with_read_connections)),
    /// shared by the clones too.
    readers: Option<Arc<Readers>>,
    /// Rows this handle writes enter the full-text index at once (else when their
    /// conversation is searched: [`index_when_searched`](SqliteArchive::index_when_searched)).
    index_on_write: bool,
}

/// An archive's read connections and where the next wait for one goes.
#[derive(Debug)]
struct Readers {
    connections: Vec<Mutex<Connection>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Clone for SqliteArchive {
    /// Another handle on the same connection (not a new connection): the clones share its page
    /// cache and compiled statements, and take turns on it.
    ///
    /// ```
    /// use ctxwin_std::store::sqlite::SqliteArchive;
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let archive = SqliteArchive::open_in_memory()?;
    /// let other = archive.clone();
    /// let s = Scope::local("s");
    /// archive.put(&s, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// assert_eq!(other.usage(&s)?.messages, 1);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    fn clone(&self) -> Self {
        Self {
            conn: self.conn.clone(),
            gate: self.gate.clone(),
            readers: self.readers.clone(),
            index_on_write: self.index_on_write,
        }
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

impl SqliteArchive {
    /// Opens (creating if needed) the archive at `path`, in WAL mode with
    /// `synchronous = NORMAL` and foreign keys on, and migrates its schema. The first open of
    /// a file in a process checks it in depth (SQLite's integrity or quick check, by size);
    /// every open checks its header.
    ///
    /// # Errors
    /// [`StoreError::Damaged`] for a damaged file or one that is no database,
    /// [`StoreError::SchemaTooNew`] if a newer build wrote it, [`StoreError::Io`].
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let archive = ctxwin_std::store::sqlite::SqliteArchive::open(dir.path().join("archive.db"))?;
    /// assert_eq!(archive.journal_mode()?, "wal");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Ok(Self::open_sql(path.as_ref())?)
    }

    fn open_sql(path: &Path) -> Sql<Self> {
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
    /// use ctxwin_std::store::{ArchiveStore, Scope};
    /// let archive = ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?;
    /// assert_eq!(archive.usage(&Scope::local("s"))?.messages, 0);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let open = || -> Sql<Self> {
            let mut conn = Connection::open_in_memory()?;
            schema::configure(&conn, false)?;
            schema::migrate(&mut conn)?;
            integrity::ensure_identity(&conn)?;
            Ok(Self::with(conn, None))
        };
        Ok(open()?)
    }

    fn with(conn: Connection, gate: Option<Arc<Mutex<()>>>) -> Self {
        Self { conn: Arc::new(Mutex::new(conn)), gate, readers: None, index_on_write: true }
    }

    /// This handle with the rows it writes left out of the full-text index until their
    /// conversation is searched: a search of a conversation first indexes its rows still
    /// waiting (work bounded by the rows written since its last search), and a conversation
    /// nobody searches costs no indexing. For a writer whose conversations are rarely or
    /// never searched (the proxy with retrieval off): tokenizing every row as it was written
    /// was a quarter of its CPU. Searches find the same rows either way; other handles on the
    /// file keep their own choice (the default: indexed as written).
    ///
    /// ```
    /// use ctxwin_std::store::sqlite::SqliteArchive;
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope, SearchQuery};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let archive = SqliteArchive::open_in_memory()?.index_when_searched();
    /// let s = Scope::local("s");
    /// archive.put(&s, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "the lexer panics"))])?;
    /// assert_eq!(archive.search(&s, &SearchQuery::new("lexer", 5))?.len(), 1);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn index_when_searched(mut self) -> Self {
        self.index_on_write = false;
        self
    }

    /// This handle with `count` more connections to its file for searches (`search`,
    /// `get_many` and the other reads of retrieval), read-only and shared by its clones. In
    /// WAL mode a reader never waits for a writer: with many sessions sharing one connection
    /// and a [`Deferred`](crate::store::Deferred) writer committing their rows on it, a search
    /// otherwise waits for the writer's whole transaction, and searches of several threads
    /// wait for each other. A search takes a free reader, or waits for one. Searches see what
    /// is committed when they start. An in-memory archive has no file to open twice, and
    /// `count` 0 opens nothing: the handle is returned unchanged. Each connection has its own
    /// page cache (2 MB at most by default).
    ///
    /// # Errors
    /// [`StoreError::Io`] when a connection cannot be opened.
    ///
    /// ```
    /// use ctxwin_std::store::sqlite::SqliteArchive;
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope, SearchQuery};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let archive = SqliteArchive::open(dir.path().join("a.db"))?.with_read_connections(2)?;
    /// let text = ChatMessage::text(Role::User, "the staging database runs Postgres 16");
    /// let s = Scope::local("s");
    /// archive.put(&s, Fence::NONE, &[ArchivedMessage::new(1, 1, text)])?;
    /// assert_eq!(archive.search(&s, &SearchQuery::new("postgres", 5))?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_read_connections(mut self, count: usize) -> Result<Self, StoreError> {
        let path = self.conn().path().filter(|path| !path.is_empty()).map(PathBuf::from);
        let Some(path) = path.filter(|_| count > 0) else { return Ok(self) };
        let open = || -> Sql<Vec<Mutex<Connection>>> {
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
            Ok(connections)
        };
        let connections = open()?;
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
    /// use ctxwin_std::store::sqlite::SqliteArchive;
    /// let archive = SqliteArchive::open_in_memory()?;
    /// assert!(archive.shares_connection(&archive.clone()));
    /// assert!(!archive.shares_connection(&SqliteArchive::open_in_memory()?));
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn shares_connection(&self, other: &SqliteArchive) -> bool {
        Arc::ptr_eq(&self.conn, &other.conn)
    }

    /// The connection, locked, for tests elsewhere in the crate (to hold writers off it).
    #[cfg(test)]
    pub(crate) fn conn_for_tests(&self) -> MutexGuard<'_, Connection> {
        self.conn()
    }

    /// This handle's connection, locked until the guard drops. Callers hold it for one
    /// statement or transaction and call no other method meanwhile (they lock it too).
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Caps this handle's SQLite page cache at `kib` KiB (SQLite's default is 2,000 KiB for
    /// each connection, filled as pages are read). A process holding many handles bounds its
    /// memory with it; pages that do not fit are read again from the operating system's file
    /// cache.
    ///
    /// # Errors
    /// Backend errors.
    ///
    /// ```
    /// let archive = ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?;
    /// archive.set_cache_kib(128)?;
    /// assert_eq!(archive.cache_kib()?, 128);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn set_cache_kib(&self, kib: u32) -> Result<(), StoreError> {
        let set = || -> Sql<()> {
            self.conn().pragma_update(None, "cache_size", -i64::from(kib))?;
            Ok(())
        };
        Ok(set()?)
    }

    /// The page cache cap of this handle in KiB (see [`set_cache_kib`](Self::set_cache_kib)).
    ///
    /// # Errors
    /// Backend errors.
    ///
    /// ```
    /// let archive = ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?;
    /// assert_eq!(archive.cache_kib()?, 2_000);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn cache_kib(&self) -> Result<u64, StoreError> {
        let read = || -> Sql<u64> {
            let size: i64 = self.conn().pragma_query_value(None, "cache_size", |row| row.get(0))?;
            // Negative: KiB; positive: pages.
            let page: i64 = self.conn().pragma_query_value(None, "page_size", |row| row.get(0))?;
            let kib = if size < 0 { -size } else { size.saturating_mul(page) / 1024 };
            Ok(u64::try_from(kib).unwrap_or(0))
        };
        Ok(read()?)
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
    /// Backend errors.
    ///
    /// ```
    /// use ctxwin_std::store::sqlite::SqliteArchive;
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, Scope};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("archive.db");
    /// drop(SqliteArchive::open(&path)?); // a new file's schema is in its WAL until the last close
    /// let archive = SqliteArchive::open(&path)?;
    /// let row = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"));
    /// archive.put(&Scope::local("s"), Fence::NONE, &[row])?;
    /// let other = SqliteArchive::open(&path)?;
    /// let (pages, copied) = other.checkpoint_wal()?;
    /// assert!(pages > 0 && copied == pages);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_wal(&self) -> Result<(u64, u64), StoreError> {
        if self.gate.is_none() {
            return Ok((0, 0));
        }
        let run = || -> Sql<(i64, i64)> {
            Ok(self.conn().query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })?)
        };
        let (log, copied) = run()?;
        Ok((u64::try_from(log).unwrap_or(0), u64::try_from(copied).unwrap_or(0)))
    }

    /// The journal mode in force (`"wal"` for a file, `"memory"` in memory).
    ///
    /// # Errors
    /// Backend errors.
    ///
    /// ```
    /// let archive = ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?;
    /// assert_eq!(archive.journal_mode()?, "memory");
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn journal_mode(&self) -> Result<String, StoreError> {
        let read = || -> Sql<String> {
            Ok(self.conn().pragma_query_value(None, "journal_mode", |row| row.get(0))?)
        };
        Ok(read()?.to_lowercase())
    }

    /// The schema version of the open database (`PRAGMA user_version`).
    ///
    /// # Errors
    /// Backend errors.
    ///
    /// ```
    /// use ctxwin_std::store::sqlite::{SqliteArchive, schema::SCHEMA_VERSION};
    /// assert_eq!(SqliteArchive::open_in_memory()?.schema_version()?, SCHEMA_VERSION);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(schema::version(&self.conn())?)
    }

    /// The row id of `scope`'s `sessions` row, if it has stored anything.
    fn session_id(&self, scope: &Scope) -> Sql<Option<i64>> {
        let conn = self.read_conn();
        session_id(&conn, scope)
    }
}

/// The row id of `scope` on `conn`, if it has stored anything.
fn session_id(conn: &Connection, scope: &Scope) -> Sql<Option<i64>> {
    let mut stmt =
        conn.prepare_cached("SELECT id FROM sessions WHERE tenant = ?1 AND name = ?2")?;
    Ok(stmt.query_row([&scope.tenant, &scope.conversation], |row| row.get(0)).optional()?)
}

/// The row id of `scope`, created if new (looked up first: every write of a conversation but
/// its first finds the row, and an insert attempt would cost a write).
fn ensure_session(conn: &Connection, scope: &Scope) -> Sql<i64> {
    if let Some(id) = session_id(conn, scope)? {
        return Ok(id);
    }
    let mut insert =
        conn.prepare_cached("INSERT INTO sessions (tenant, name) VALUES (?1, ?2) RETURNING id")?;
    Ok(insert.query_row([&scope.tenant, &scope.conversation], |row| row.get(0))?)
}

/// The `messages` columns [`decode_message`] reads, in its order, for a table aliased `m`.
const MESSAGE_COLUMNS: &str = "m.id, m.unit, m.level, m.role, m.content, m.tool_calls, \
     m.tool_call_id, m.original, m.timestamp, m.tokens, m.name, m.is_error, m.raw, m.checksum";

/// What names row `id` of `scope` in errors.
fn row_name(scope: &Scope, id: u64) -> String {
    format!("message {id} of conversation {:?}", scope.to_string())
}

/// Decodes one row of `scope` selected with [`MESSAGE_COLUMNS`] first, and verifies its
/// checksum.
fn decode_message(scope: &Scope, row: &Row<'_>) -> Sql<ArchivedMessage> {
    let decoded = decode_unverified(scope, row)?;
    let stored: Option<i64> = row.get(13)?;
    verify(scope, decoded, stored)
}

/// `decoded` if `stored` is its checksum.
fn verify(scope: &Scope, decoded: ArchivedMessage, stored: Option<i64>) -> Sql<ArchivedMessage> {
    let computed = checksum::message(scope, &decoded);
    match stored {
        Some(stored) if stored as u64 == computed => Ok(decoded),
        Some(stored) => {
            Err(Failure(checksum::mismatch(row_name(scope, decoded.id), stored as u64, computed)))
        }
        None => Err(Failure(StoreError::damaged(
            row_name(scope, decoded.id),
            "its checksum is missing",
        ))),
    }
}

/// Decodes one row selected with [`MESSAGE_COLUMNS`] first, without its checksum.
fn decode_unverified(scope: &Scope, row: &Row<'_>) -> Sql<ArchivedMessage> {
    let id = from_sql_int("message id", row.get(0)?)?;
    let damaged = |detail: String| Failure(StoreError::damaged(row_name(scope, id), detail));
    let level: i64 = row.get(2)?;
    let level = u8::try_from(level)
        .ok()
        .and_then(crate::store::types::level_from_code)
        .ok_or_else(|| damaged(format!("unknown level {level}")))?;
    let role_name: String = row.get(3)?;
    let role =
        Role::parse(&role_name).ok_or_else(|| damaged(format!("unknown role {role_name:?}")))?;
    let tool_calls: Option<String> = row.get(5)?;
    let tool_calls: Vec<ToolCall> = match tool_calls {
        Some(json) => {
            serde_json::from_str(&json).map_err(|e| damaged(format!("tool calls: {e}")))?
        }
        None => Vec::new(),
    };
    let tokens: i64 = row.get(9)?;
    Ok(ArchivedMessage {
        id,
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
        tokens: u32::try_from(tokens).map_err(|_| damaged(format!("token count {tokens}")))?,
        original: row.get(7)?,
        raw: row.get(12)?,
    })
}

/// Runs `stmt` and decodes every row as a message of `scope`.
fn collect_messages(
    scope: &Scope,
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Sql<Vec<ArchivedMessage>> {
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode_message(scope, row)?);
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
    use crate::store::{ArchiveStore, ErrorKind, Fence};

    fn row(id: u64, text: impl Into<String>) -> ArchivedMessage {
        ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text.into()))
    }

    #[test]
    fn passes_the_archive_conformance_suite_in_memory_and_on_disk() {
        use crate::store::conformance;
        conformance::archive(&|| Arc::new(SqliteArchive::open_in_memory().unwrap()));
        let dir = tempfile::tempdir().unwrap();
        let count = std::sync::atomic::AtomicUsize::new(0);
        conformance::archive(&|| {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Arc::new(SqliteArchive::open(dir.path().join(format!("{n}.db"))).unwrap())
        });
        // Rows indexed when their conversation is searched: the same contract.
        conformance::archive(&|| {
            Arc::new(SqliteArchive::open_in_memory().unwrap().index_when_searched())
        });
        conformance::archive(&|| {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = dir.path().join(format!("{n}.db"));
            Arc::new(SqliteArchive::open(path).unwrap().index_when_searched())
        });
    }

    #[test]
    fn the_index_holds_exactly_the_indexed_rows_whoever_wrote_them() {
        use crate::store::{Forget, SearchQuery};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let eager = SqliteArchive::open(&path).unwrap();
        let lazy = SqliteArchive::open(&path).unwrap().index_when_searched();
        let (a, b) = (Scope::local("a"), Scope::local("b"));
        let indexed_docs = || -> i64 {
            let conn = eager.conn_for_tests();
            conn.query_row("SELECT count(*) FROM messages_fts_docsize", [], |r| r.get(0)).unwrap()
        };
        let consistent = || {
            // FTS5 checks its index against the messages table (rank 1): every row with its
            // current text, nothing else (so only once no row waits).
            let conn = eager.conn_for_tests();
            conn.execute_batch(
                "INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)",
            )
            .unwrap();
        };
        let hits = |archive: &SqliteArchive, scope: &Scope, text: &str| -> Vec<u64> {
            let found = archive.search(scope, &SearchQuery::new(text, 20)).unwrap();
            found.into_iter().map(|h| h.id).collect()
        };
        lazy.put(&a, Fence::NONE, &[row(1, "lexer panics on heredoc"), row(2, "parser ok")])
            .unwrap();
        eager.put(&b, Fence::NONE, &[row(1, "lexer fine here")]).unwrap();
        assert_eq!(indexed_docs(), 1, "only the eager handle's row is indexed yet");
        // A lazy row rewritten before any search, an eager row rewritten by the lazy handle
        // (it leaves the index until searched), a lazy row forgotten.
        lazy.put(&a, Fence::NONE, &[row(2, "parser rewritten")]).unwrap();
        lazy.put(&b, Fence::NONE, &[row(1, "lexer replaced entirely")]).unwrap();
        assert_eq!(indexed_docs(), 0);
        lazy.put(&a, Fence::NONE, &[row(3, "secret token zebra")]).unwrap();
        lazy.forget(&a, Fence::NONE, &Forget { ids: &[], texts: &["zebra"] }).unwrap();
        for file in ["a.db", "a.db-wal"] {
            let bytes = std::fs::read(dir.path().join(file)).unwrap_or_default();
            assert!(!bytes.windows(5).any(|w| w == b"zebra"), "{file} keeps the forgotten text");
        }
        // The searches index what waits of their own conversation, and only that.
        assert_eq!(hits(&eager, &a, "lexer"), [1]);
        assert_eq!(indexed_docs(), 3);
        assert!(hits(&eager, &a, "zebra").is_empty());
        assert_eq!(hits(&lazy, &a, "rewritten"), [2]);
        assert_eq!(hits(&lazy, &b, "replaced"), [1]);
        assert!(hits(&lazy, &b, "fine").is_empty());
        assert_eq!(indexed_docs(), 4);
        consistent();
        // Indexed rows rewritten, rewound and deleted keep the index exact.
        eager.put(&a, Fence::NONE, &[row(1, "lexer fixed")]).unwrap();
        lazy.put(&a, Fence::NONE, &[row(2, "parser again")]).unwrap();
        lazy.delete_from(&a, Fence::NONE, 3).unwrap();
        eager.delete_conversation(&b, Fence::NONE).unwrap();
        assert_eq!(indexed_docs(), 1, "row 2 waits again, 3 and b's are gone");
        assert_eq!(hits(&lazy, &a, "lexer fixed heredoc"), [1]);
        assert!(hits(&lazy, &a, "panics").is_empty());
        assert_eq!(hits(&lazy, &a, "again"), [2]);
        consistent();
    }

    #[test]
    fn a_row_changed_behind_its_checksum_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let archive = SqliteArchive::open(dir.path().join("a.db")).unwrap();
        let damage = |scope: &Scope, id: u64| {
            let conn = archive.conn_for_tests();
            let changed = conn.execute(
                "UPDATE messages SET content = content || '!'
                 WHERE id = ?1 AND session_id = (SELECT id FROM sessions WHERE tenant = ?2 AND name = ?3)",
                rusqlite::params![id as i64, scope.tenant, scope.conversation],
            );
            changed == Ok(1)
        };
        crate::store::conformance::damaged_row(&archive, &damage);
    }

    #[test]
    fn handles_on_one_file_share_a_write_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        // Created and closed first: a new file's schema is in its WAL until the last close.
        drop(SqliteArchive::open(&path).unwrap());
        drop(SqliteArchive::open(dir.path().join("b.db")).unwrap());
        let a = SqliteArchive::open(&path).unwrap();
        let b = SqliteArchive::open(dir.path().join(".").join("a.db")).unwrap();
        let other = SqliteArchive::open(dir.path().join("b.db")).unwrap();
        assert!(Arc::ptr_eq(a.gate.as_ref().unwrap(), b.gate.as_ref().unwrap()));
        assert!(!Arc::ptr_eq(a.gate.as_ref().unwrap(), other.gate.as_ref().unwrap()));
        assert!(SqliteArchive::open_in_memory().unwrap().gate.is_none());
    }

    #[test]
    fn the_deep_check_runs_once_per_process_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let key = || std::fs::canonicalize(&path).unwrap();
        drop(SqliteArchive::open(&path).unwrap());
        assert!(checked_before(&key()));
        assert!(!checked_before(&dir.path().join("b.db")));
        // A header damaged later is still found by the next open.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] = b'X';
        std::fs::write(&path, bytes).unwrap();
        let error = SqliteArchive::open(&path).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Damaged, "{error}");
    }

    #[test]
    fn clones_share_one_connection_and_a_bad_write_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let archive = SqliteArchive::open(dir.path().join("a.db")).unwrap();
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let archive = archive.clone();
                std::thread::spawn(move || {
                    let scope = Scope::local(format!("s{w}"));
                    for id in 1..=30_u64 {
                        let text = format!("writer {w} message {id}");
                        archive.put(&scope, Fence::NONE, &[row(id, text)]).unwrap();
                    }
                    // A bad row fails its own write only.
                    let bad = row(u64::MAX, "x");
                    let error = archive.put(&scope, Fence::NONE, &[bad]).unwrap_err();
                    assert_eq!(error.kind(), ErrorKind::Invalid);
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        assert!(Arc::ptr_eq(&archive.conn, &archive.clone().conn));
        assert_eq!(archive.stats().unwrap().messages, 8 * 30);
        let s3 = Scope::local("s3");
        assert_eq!(archive.get(&s3, 30).unwrap().unwrap().message.content, "writer 3 message 30");
    }

    #[test]
    fn many_writers_on_one_file_never_see_it_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        drop(SqliteArchive::open(&path).unwrap());
        let writers: Vec<_> = (0..16)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let archive = SqliteArchive::open(&path).unwrap();
                    archive.set_cache_kib(64).unwrap();
                    let scope = Scope::local(format!("s{w}"));
                    for id in 1..=40_u64 {
                        archive.put(&scope, Fence::NONE, &[row(id, format!("{w}/{id}"))]).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let archive = SqliteArchive::open(&path).unwrap();
        assert_eq!(archive.stats().unwrap().messages, 16 * 40);
    }
}
