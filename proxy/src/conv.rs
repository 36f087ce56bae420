//! One conversation: a [`Session`] (archive, checkpoints, calibration) plus the proxy's side
//! store, which records the sequence of message fingerprints the session holds and the raw
//! JSON of each message, keyed by the session's message ids.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ctxwin_std::core::{Config, Error as CoreError, Level, Role};
use ctxwin_std::session::{
    ComposeOptions, PushOptions, RecallFor, Session, SessionBuilder, SessionError,
};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{ArchiveStore, Deferred};
use ctxwin_std::{ChatMessage, core::counter::TokenCounter};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use crate::assemble::Answer;
use crate::hash::{canonical, digest_hex, hash_str, is_hex_name};
use crate::wire::{
    Analyzed, KeptPart, ManagedBody, Part, Provider, Request, analyze_item, analyze_message,
};

/// What went wrong in a conversation.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    /// The session refused or failed.
    #[error("{0}")]
    Session(#[from] SessionError),
    /// The side store failed.
    #[error("proxy store: {0}")]
    Store(#[from] rusqlite::Error),
    /// The state directory failed.
    #[error("state directory: {0}")]
    Io(#[from] std::io::Error),
    /// A message of the request does not read.
    #[error("{0}")]
    BadRequest(String),
    /// The conversation was unloaded while a request held its lock (never expected).
    #[error("the conversation is not loaded")]
    Unloaded,
}

impl ConvError {
    /// The core refusal behind this error, if it is one.
    pub fn core(&self) -> Option<&CoreError> {
        match self {
            ConvError::Session(SessionError::Core(error)) => Some(error),
            ConvError::Session(SessionError::AfterStore { source, .. }) => match source.as_ref() {
                SessionError::Core(error) => Some(error),
                _ => None,
            },
            _ => None,
        }
    }
}

/// One message of the recorded sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    fp: u64,
    /// Hash of the raw JSON last seen for it (equal bytes need no reading).
    raw_hash: u64,
    /// A system message leading the conversation (kept permanently).
    pinned: bool,
    /// Hash of its tool-call ids (0 without calls).
    calls: u64,
    /// Session ids of its parts, in order.
    ids: Vec<u64>,
    /// Anthropic content-block indexes of each part.
    blocks: Vec<Vec<usize>>,
    /// Estimated tokens of all its parts.
    tokens: u32,
    /// Built from an upstream answer (the client has not echoed it yet).
    from_answer: bool,
}

/// How an incoming history relates to what the session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingest {
    /// It extends the recorded sequence: `new` messages were pushed; `tokens_in` is the
    /// estimated cost of the whole history the client sent.
    Extended {
        /// Messages pushed now.
        new: usize,
        /// Estimated tokens of every incoming message.
        tokens_in: u64,
        /// Units evicted by the pushes.
        evicted: usize,
    },
    /// It differs from the recorded sequence at this index: nothing was pushed.
    Diverged(usize),
}

/// A composed request body.
#[derive(Debug)]
pub struct Composed {
    /// The body to forward.
    pub body: Vec<u8>,
    /// Its estimated tokens (the session's count).
    pub tokens: u32,
    /// Units evicted to compose it.
    pub evicted: usize,
    /// The emitted message prefix is the same as last time (the provider's prompt cache holds).
    pub cache_stable: bool,
}

/// One conversation, resident.
pub struct Conv {
    key: String,
    provider: Provider,
    session: Session,
    db: Store,
    writer: Arc<Deferred<SqliteArchive>>,
    entries: Vec<Entry>,
    by_id: HashMap<u64, (usize, usize)>,
    placeholders: HashSet<u64>,
    tools_fp: u64,
    filler_rate: f64,
    last_emitted: Vec<u64>,
    /// Some message of this conversation has left the core (evicted or summarized): only then
    /// can retrieval find anything the payload does not hold already.
    evicted_any: bool,
    dirty: bool,
    exchanges: u32,
    last_used: Instant,
    /// Side-store rows to write at the next checkpoint, with their raw JSON (rows newer than
    /// the checkpoint would be forgotten at a restore anyway).
    unsaved: std::collections::BTreeMap<usize, String>,
    /// `meta` rows of a new conversation (its window), written with the first flush's entries.
    unsaved_meta: Vec<(&'static str, String)>,
    /// The upstream's last answer, not yet in the session: taken with the next request's
    /// messages (as the client's copy when the client echoes it), or at the next checkpoint.
    pending_answer: Option<Value>,
}

impl std::fmt::Debug for Conv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conv")
            .field("key", &self.key)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// The core configuration of a proxied conversation for a `window`-token model.
pub fn session_config(window: u32, reserve: u32) -> Config {
    let reserve = reserve.min(window / 8).max(1);
    let budget = window - reserve;
    Config {
        context_window: window,
        reserved_for_reply: reserve,
        permanent_budget: budget / 4,
        session_budget: budget / 20,
        working_budget: budget * 65 / 100,
        ..Config::DEFAULT
    }
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS entries (
    conv TEXT NOT NULL,
    seq INTEGER NOT NULL,
    fp INTEGER NOT NULL,
    raw_hash INTEGER NOT NULL,
    pinned INTEGER NOT NULL,
    calls INTEGER NOT NULL,
    ids TEXT NOT NULL,
    blocks TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    from_answer INTEGER NOT NULL,
    max_id INTEGER NOT NULL,
    raw TEXT NOT NULL,
    PRIMARY KEY (conv, seq)
);
CREATE TABLE IF NOT EXISTS meta (
    conv TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conv, key)
);
";

/// The side store: one connection for every conversation of a proxy (a connection each would
/// hold a page cache each and, writing one file, wait on each other in SQLite's busy handler).
pub type Store = Arc<Mutex<Connection>>;

/// Page cache of the archive connection every conversation shares, in KiB (SQLite's default
/// is 2,000). One connection for all: a connection each cost about 200 KiB per resident
/// conversation, and each found its cache stale after every other one's write.
pub const ARCHIVE_CACHE_KIB: u32 = 2_048;

/// What every conversation of a proxy shares: the side store and one archive connection.
#[derive(Clone, Debug)]
pub struct Stores {
    /// The side store.
    pub side: Store,
    /// The archive (`<state_dir>/archive.db`): the writer's inner store, whose handle (one
    /// connection, and read connections for searches) every conversation shares.
    pub archive: SqliteArchive,
    /// A second connection to the archive, for WAL checkpoints off the request path
    /// ([`crate::server::App::checkpoint_wal`]).
    pub wal: SqliteArchive,
    /// The archive port every session writes: the archive behind a [`Deferred`] writer
    /// thread, which writes every conversation's rows many requests to a transaction, off
    /// the request path (a session's reads wait for its own queued rows).
    pub writer: Arc<Deferred<SqliteArchive>>,
}

/// The side store's connection, locked.
fn lock(store: &Store) -> MutexGuard<'_, Connection> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens the side store shared by every conversation under `state_dir` (see [`Store`]).
///
/// # Errors
/// SQLite and I/O errors.
pub fn open_store(state_dir: &Path) -> Result<Connection, ConvError> {
    std::fs::create_dir_all(state_dir)?;
    let db = Connection::open(state_dir.join("proxy.db"))?;
    db.busy_timeout(Duration::from_secs(10))?;
    db.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(db)
}

/// Opens the side store (creating its tables) and the archive every conversation shares
/// (once, at start).
///
/// # Errors
/// SQLite and I/O errors.
pub fn prepare_state(state_dir: &Path) -> Result<Stores, ConvError> {
    let db = open_store(state_dir)?;
    db.execute_batch(SCHEMA)?;
    let path = state_dir.join("archive.db");
    // Opened and closed first: a new file's schema stays in its WAL until its last connection
    // closes, and opening a second one checks the file's header.
    drop(SqliteArchive::open(&path).map_err(SessionError::from)?);
    // Retrieval's searches read on connections of their own, one per blocking-pool worker: in
    // WAL mode they never wait for the writer thread's transactions on the shared one, nor
    // for each other.
    let archive = SqliteArchive::open(&path)
        .and_then(|archive| archive.with_read_connections(crate::server::workers()))
        .map_err(SessionError::from)?;
    archive.set_cache_kib(ARCHIVE_CACHE_KIB).map_err(SessionError::from)?;
    let wal = SqliteArchive::open(&path).map_err(SessionError::from)?;
    wal.set_cache_kib(64).map_err(SessionError::from)?;
    let writer = Arc::new(Deferred::spawn(archive.clone())?);
    Ok(Stores { side: Arc::new(Mutex::new(db)), archive, wal, writer })
}

/// The keys of the conversations under the state directory that have something stored: rows
/// in the side store or messages in the archive (`key`, `key#N` for later generations and
/// `key@…` for rows a restore set aside). A key not among them, and not seen since, is new:
/// [`Conv::create`] builds it without reading anything.
///
/// # Errors
/// SQLite errors.
pub fn persisted_keys(stores: &Stores) -> Result<HashSet<String>, ConvError> {
    let mut keys: HashSet<String> = HashSet::new();
    {
        let db = lock(&stores.side);
        let mut stmt = db.prepare("SELECT conv FROM meta UNION SELECT conv FROM entries")?;
        for key in stmt.query_map([], |row| row.get::<_, String>(0))? {
            keys.insert(key?);
        }
    }
    for name in stores.archive.conversations("", "").map_err(SessionError::from)? {
        let key = name.split(['#', '@']).next().unwrap_or(&name);
        keys.insert(key.to_string());
    }
    Ok(keys)
}

/// The session settings every conversation shares.
fn session_builder(
    stores: &Stores,
    name: &str,
    checkpoints: PathBuf,
    window: u32,
    reserve: u32,
) -> SessionBuilder {
    SessionBuilder::new(name)
        .config(session_config(window, reserve))
        .archive_store(stores.writer.clone())
        .checkpoints(checkpoints)
        .keep_checkpoints(3)
        // The proxy checkpoints when a conversation idles or unloads, not every N messages.
        .checkpoint_interval_messages(0)
}

/// Rows queued to the archive's writer past which a request's work leaves the async threads
/// (queueing more would wait for room).
const WRITER_BACKLOG: usize = 5_000;

fn to_sql(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Conv {
    /// Opens (or creates) conversation `key` in `dir`, continuing from its newest checkpoint.
    /// A new conversation uses `window`; an existing one keeps the window it was created with.
    /// Opening a new conversation writes nothing: its checkpoint directory and side-store rows
    /// (the window among them) are written at its first checkpoint.
    ///
    /// # Errors
    /// Session, store and I/O errors.
    pub fn open(
        state_dir: &Path,
        stores: &Stores,
        key: &str,
        provider: Provider,
        window: u32,
        reserve: u32,
    ) -> Result<Self, ConvError> {
        let store = &stores.side;
        let meta = |name: &str| -> Result<Option<String>, rusqlite::Error> {
            lock(store)
                .prepare_cached("SELECT value FROM meta WHERE conv = ?1 AND key = ?2")?
                .query_row([key, name], |row| row.get(0))
                .optional()
        };
        let set_meta = |name: &str, value: &str| -> Result<(), rusqlite::Error> {
            lock(store)
                .prepare_cached(
                    "INSERT OR REPLACE INTO meta (conv, key, value) VALUES (?1, ?2, ?3)",
                )?
                .execute([key, name, value])
                .map(drop)
        };
        // A new conversation's window is written by its first flush: opening one writes
        // nothing, and until a checkpoint there is nothing to restore it for.
        let mut unsaved_meta = Vec::new();
        let window = match meta("window")? {
            Some(w) => w.parse().unwrap_or(window),
            None => {
                unsaved_meta.push(("window", window.to_string()));
                window
            }
        };
        // The session's name in the shared archive: the key, or `key#N` after a crash left
        // rows of a generation that never reached a checkpoint (they stay, under their name).
        let mut generation: u32 = meta("generation")?.and_then(|g| g.parse().ok()).unwrap_or(0);
        let dir = conv_dir(state_dir, key);
        let session = loop {
            let (name, checkpoints) = if generation == 0 {
                (key.to_string(), dir.join("checkpoints"))
            } else {
                (format!("{key}#{generation}"), dir.join(format!("checkpoints-{generation}")))
            };
            let built = session_builder(stores, &name, checkpoints, window, reserve)
                .restore_latest(true)
                .build();
            match built {
                Ok(session) => break session,
                Err(SessionError::ArchiveInUse { messages, .. }) if generation < 1_000 => {
                    tracing::warn!(
                        session = %name,
                        messages,
                        "proxy: archived rows without a checkpoint (a crash before the first one); starting the next generation"
                    );
                    generation += 1;
                    set_meta("generation", &generation.to_string())?;
                    lock(store).execute("DELETE FROM entries WHERE conv = ?1", [key])?;
                }
                Err(error) => return Err(error.into()),
            }
        };
        let next_id = session.manager().next_id();
        // Entries pushed after the checkpoint the session restored are gone from it: forget
        // them too (the client resends them; the archive rows are rewritten under the same ids).
        // Looked up first: a delete takes the write lock even when it finds nothing.
        let stale: bool = lock(store)
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM entries WHERE conv = ?1 AND max_id >= ?2)",
            )?
            .query_row(params![key, to_sql(next_id)], |row| row.get(0))?;
        let dropped = if stale {
            lock(store).execute(
                "DELETE FROM entries WHERE conv = ?1 AND max_id >= ?2",
                params![key, to_sql(next_id)],
            )?
        } else {
            0
        };
        if dropped > 0 {
            tracing::info!(
                session = key,
                dropped,
                "proxy: messages after the checkpoint will be taken again"
            );
        }
        let mut entries = Vec::new();
        {
            let db = lock(store);
            let mut stmt = db.prepare_cached(
                "SELECT fp, ids, blocks, tokens, from_answer, raw_hash, pinned, calls FROM entries WHERE conv = ?1 ORDER BY seq",
            )?;
            let rows = stmt.query_map([key], |row| {
                let fp: i64 = row.get(0)?;
                let ids: String = row.get(1)?;
                let blocks: String = row.get(2)?;
                let tokens: i64 = row.get(3)?;
                let from_answer: bool = row.get(4)?;
                let raw_hash: i64 = row.get(5)?;
                let pinned: bool = row.get(6)?;
                let calls: i64 = row.get(7)?;
                Ok(Entry {
                    calls: calls as u64,
                    fp: fp as u64,
                    raw_hash: raw_hash as u64,
                    pinned,
                    ids: serde_json::from_str(&ids).unwrap_or_default(),
                    blocks: serde_json::from_str(&blocks).unwrap_or_default(),
                    tokens: u32::try_from(tokens).unwrap_or(0),
                    from_answer,
                })
            })?;
            for row in rows {
                entries.push(row?);
            }
        }
        let placeholders: HashSet<u64> = meta("placeholders")?
            .and_then(|p| serde_json::from_str::<Vec<u64>>(&p).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|id| *id < next_id)
            .collect();
        let tools_fp = meta("tools_fp")?.and_then(|t| t.parse().ok()).unwrap_or(0);
        let tools_fp = if placeholders.is_empty() { 0 } else { tools_fp };
        let mut conv = Self::from_parts(key, provider, session, stores, unsaved_meta);
        conv.entries = entries;
        conv.placeholders = placeholders;
        conv.tools_fp = tools_fp;
        conv.index();
        conv.evicted_any = conv
            .entries
            .iter()
            .flat_map(|e| e.ids.iter())
            .any(|id| conv.session.manager().get(*id).is_none());
        Ok(conv)
    }

    /// Creates conversation `key`, which the caller knows has nothing stored (no side-store
    /// rows, no archived messages, no checkpoint: [`persisted_keys`] lists those that do):
    /// memory work only, no read and no write. Its window is written at its first checkpoint.
    ///
    /// # Errors
    /// Session errors (a configuration the core refuses).
    pub fn create(
        state_dir: &Path,
        stores: &Stores,
        key: &str,
        provider: Provider,
        window: u32,
        reserve: u32,
    ) -> Result<Self, ConvError> {
        let checkpoints = conv_dir(state_dir, key).join("checkpoints");
        let session =
            session_builder(stores, key, checkpoints, window, reserve).assume_new(true).build()?;
        let unsaved_meta = vec![("window", window.to_string())];
        Ok(Self::from_parts(key, provider, session, stores, unsaved_meta))
    }

    /// A conversation around `session` with no recorded messages.
    fn from_parts(
        key: &str,
        provider: Provider,
        session: Session,
        stores: &Stores,
        unsaved_meta: Vec<(&'static str, String)>,
    ) -> Self {
        let sample = " ~".repeat(1_000);
        let filler_rate = f64::from(session.manager().counter().count(&sample)).max(1.0) / 1_000.0;
        Self {
            key: key.to_string(),
            provider,
            session,
            db: stores.side.clone(),
            writer: stores.writer.clone(),
            entries: Vec::new(),
            by_id: HashMap::new(),
            placeholders: HashSet::new(),
            tools_fp: 0,
            filler_rate,
            last_emitted: Vec::new(),
            evicted_any: false,
            dirty: false,
            exchanges: 0,
            last_used: Instant::now(),
            unsaved: std::collections::BTreeMap::new(),
            unsaved_meta,
            pending_answer: None,
        }
    }

    fn index(&mut self) {
        self.by_id.clear();
        for (e, entry) in self.entries.iter().enumerate() {
            for (p, id) in entry.ids.iter().enumerate() {
                self.by_id.insert(*id, (e, p));
            }
        }
    }

    /// The conversation's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The session (for stats and tests).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Messages recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether something changed since the last checkpoint.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether [`ingest`](Self::ingest) and [`compose`](Self::compose) of the next request stay
    /// in memory: the archive's rows go to its writer thread, and retrieval (a full-text query
    /// of the archive) is off because nothing of this conversation has left the core yet.
    pub fn request_in_memory(&self) -> bool {
        // A writer far behind makes queueing wait for room: not on an async thread.
        !self.evicted_any && self.writer_queue() < WRITER_BACKLOG
    }

    fn writer_queue(&self) -> usize {
        self.writer.stats().queued_rows
    }

    /// Compares the request's history with the recorded sequence and pushes what is new.
    /// `hashes` are the items' raw hashes ([`crate::wire::raw_hashes`]): a message sent with
    /// the same bytes as last time is known without being read.
    ///
    /// # Errors
    /// [`ConvError::BadRequest`] for a message that does not read; session refusals (a tool
    /// result without its call, a message larger than its level) and store failures. Messages
    /// pushed before the failure stay recorded.
    pub fn ingest(&mut self, request: &Request, hashes: &[u64]) -> Result<Ingest, ConvError> {
        self.last_used = Instant::now();
        // The request's messages and the answer before them are queued to the writer as they
        // are pushed (written with other conversations' rows, many to a transaction).
        self.ingest_messages(request, hashes)
    }

    /// [`ingest`](Self::ingest)'s work.
    fn ingest_messages(&mut self, request: &Request, hashes: &[u64]) -> Result<Ingest, ConvError> {
        let mut diverged = self.compare_prefix(request, hashes)?;
        let mut evicted = 0;
        if let Some(message) = self.pending_answer.take() {
            match analyze_message(self.provider, &message) {
                // The client's copy comes with the new messages below.
                Ok(answer) if diverged.is_none() && self.echoes(request, &answer) => {}
                Ok(answer) => {
                    let raw = message.to_string();
                    evicted += self.record(&answer, &raw, hash_str(&raw), true)?;
                    // The request is compared with the answer now recorded too.
                    diverged = self.compare_prefix(request, hashes)?;
                }
                Err(reason) => {
                    tracing::warn!(session = %self.key, reason, "proxy: answer not recorded");
                }
            }
        }
        if let Some(at) = diverged {
            self.evicted_any |= evicted > 0;
            return Ok(Ingest::Diverged(at));
        }
        let provider = self.provider;
        let analyze =
            |i: usize| analyze_item(provider, request, i).map_err(|e| ConvError::BadRequest(e.0));
        let known = self.entries.len();
        let incoming = request.items.len();
        if let Some(last) = self.entries.last_mut()
            && last.from_answer
            && incoming > known
        {
            last.from_answer = false;
        }
        if let Some(tools) = request.fields.get("tools") {
            let parsed: Value = serde_json::from_str(tools.get()).unwrap_or(Value::Null);
            let fp = hash_str(&canonical(&parsed));
            if fp != self.tools_fp && parsed.as_array().is_some_and(|a| !a.is_empty()) {
                let text = format!("[tool definitions]\n{}", tools.get());
                let options =
                    PushOptions { level: Some(Level::Permanent), ..PushOptions::default() };
                let report =
                    self.session.push_with(&ChatMessage::text(Role::System, text), options)?;
                evicted += report.evicted_units.len();
                self.placeholders.insert(report.id);
                self.tools_fp = fp;
                self.dirty = true;
            }
        }
        let mut new = 0;
        for (i, &hash) in hashes.iter().enumerate().take(incoming).skip(known) {
            let message = analyze(i)?;
            evicted += self.record(&message, request.items[i].get(), hash, false)?;
            new += 1;
        }
        let tokens_in = self.entries.iter().map(|e| u64::from(e.tokens)).sum();
        self.evicted_any |= evicted > 0;
        Ok(Ingest::Extended { new, tokens_in, evicted })
    }

    /// Whether the request carries, right after the recorded messages, the client's copy of
    /// `answer`: the same message, or an assistant message with the same tool calls (the
    /// client's library serializes it its own way).
    fn echoes(&self, request: &Request, answer: &Analyzed) -> bool {
        let at = self.entries.len();
        if at >= request.items.len() {
            return false;
        }
        analyze_item(self.provider, request, at).is_ok_and(|copy| {
            copy.fp == answer.fp
                || (copy.role == "assistant" && calls_hash(&copy) == calls_hash(answer))
        })
    }

    /// Compares the request's history with the recorded messages: the index where it leaves
    /// them, if it does. A recorded message the client sends serialized otherwise is updated.
    fn compare_prefix(
        &mut self,
        request: &Request,
        hashes: &[u64],
    ) -> Result<Option<usize>, ConvError> {
        let provider = self.provider;
        let analyze =
            |i: usize| analyze_item(provider, request, i).map_err(|e| ConvError::BadRequest(e.0));
        let known = self.entries.len();
        let incoming = request.items.len();
        for (i, &hash) in hashes.iter().enumerate().take(known.min(incoming)) {
            if self.entries[i].raw_hash == hash {
                continue;
            }
            let message = analyze(i)?;
            if self.entries[i].fp == message.fp {
                // The same message, serialized otherwise (a cache mark moved).
                self.entries[i].raw_hash = hash;
                continue;
            }
            // The client's copy of an answer the proxy assembled: the same message, serialized
            // by the client's library. Adopt its fingerprint.
            // The tool calls must be the same: the core holds them, and their results.
            let adopt = i + 1 == known
                && self.entries[i].from_answer
                && message.role == "assistant"
                && self.entries[i].calls == calls_hash(&message);
            if !adopt {
                return Ok(Some(i));
            }
            tracing::debug!(session = %self.key, index = i, "proxy: adopting the client's copy of an answer");
            let entry = &mut self.entries[i];
            entry.fp = message.fp;
            entry.raw_hash = hash;
            entry.from_answer = false;
            self.unsaved.insert(i, request.items[i].get().to_string());
        }
        if incoming < known {
            return Ok(Some(incoming));
        }
        Ok(None)
    }

    /// Pushes the parts of one message and records it. Returns the units evicted.
    fn record(
        &mut self,
        message: &Analyzed,
        raw: &str,
        raw_hash: u64,
        from_answer: bool,
    ) -> Result<usize, ConvError> {
        let seq = self.entries.len();
        let leading = seq == 0 || self.entries[seq - 1].pinned;
        let pinned =
            leading && message.parts.len() == 1 && message.parts[0].chat.role == Role::System;
        let mut entry = Entry {
            fp: message.fp,
            raw_hash,
            pinned,
            calls: calls_hash(message),
            ids: Vec::new(),
            blocks: Vec::new(),
            tokens: 0,
            from_answer,
        };
        let mut evicted = 0;
        let mut failure = None;
        for part in &message.parts {
            let chat = self.rendering(part);
            let level = if part.chat.role == Role::System {
                Some(if pinned { Level::Permanent } else { Level::Working })
            } else {
                None
            };
            let options = PushOptions { level, ..PushOptions::default() };
            match self.session.push_with(&chat, options) {
                Ok(report) => {
                    evicted += report.evicted_units.len();
                    entry.tokens = entry.tokens.saturating_add(
                        self.session.manager().get(report.id).map_or(0, |m| m.tokens()),
                    );
                    entry.ids.push(report.id);
                    entry.blocks.push(part.blocks.clone());
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        if !entry.ids.is_empty() {
            self.unsaved.insert(seq, raw.to_string());
            for (p, id) in entry.ids.iter().enumerate() {
                self.by_id.insert(*id, (seq, p));
            }
            self.entries.push(entry);
            self.dirty = true;
        }
        self.evicted_any |= evicted > 0;
        match failure {
            Some(error) => Err(error.into()),
            None => Ok(evicted),
        }
    }

    /// The session's copy of `part`: its text, a line per opaque block, and a filler whose
    /// token count is the blocks' estimated cost.
    fn rendering(&self, part: &Part) -> ChatMessage {
        let mut chat = part.chat.clone();
        if part.opaque.is_empty() {
            return chat;
        }
        let counter = self.session.manager().counter();
        for opaque in &part.opaque {
            let label = format!("[{}]", opaque.label);
            let have = counter.count(&label);
            let need = opaque.tokens.saturating_sub(have);
            if !chat.content.is_empty() {
                chat.content.push('\n');
            }
            chat.content.push_str(&label);
            let reps = (f64::from(need) / self.filler_rate).ceil() as usize;
            chat.content.push_str(&" ~".repeat(reps));
        }
        chat
    }

    /// Composes the payload for `request` and writes the body to forward.
    ///
    /// # Errors
    /// `PinnedOverBudget` when what must stay does not fit; `ToolCallsPending`; store errors.
    pub fn compose(&mut self, request: &Request) -> Result<Composed, ConvError> {
        // Retrieval leaves out what the payload holds: before anything of this conversation
        // left the core it can find nothing, and its full-text search is most of a request's
        // cost (the archive is shared by every conversation).
        let recall = if self.evicted_any { RecallFor::Settings } else { RecallFor::Nothing };
        let payload = self.session.compose_with(ComposeOptions::new(&[]).recall(recall))?;
        self.evicted_any |= payload.evicted_units > 0;
        let manager = self.session.manager();
        let permanent: Vec<_> = manager.messages(Level::Permanent).collect();
        let history: Vec<_> = manager.history().collect();
        let rendered = &payload.conversation.messages;
        let system_end = rendered.len().saturating_sub(history.len());
        let extra: Vec<String> = rendered
            .get(permanent.len().min(system_end)..system_end)
            .unwrap_or_default()
            .iter()
            .map(|m| m.content.clone())
            .collect();
        // Which parts of each entry the payload keeps, and the reduced text of kept parts.
        let mut kept: HashMap<usize, Vec<KeptPart>> = HashMap::new();
        let mut order: Vec<Slot> = Vec::new();
        let mut emitted_ids = Vec::new();
        let mut first_history = None;
        for (n, message) in permanent.iter().chain(history.iter()).enumerate() {
            if n == permanent.len() {
                first_history = Some(order.len());
            }
            let id = message.id();
            if self.placeholders.contains(&id) {
                continue;
            }
            emitted_ids.push(id);
            match self.by_id.get(&id) {
                Some(&(entry, part)) => {
                    let reduced = message.was_reduced().then(|| message.content().to_string());
                    let parts = kept.entry(entry).or_default();
                    if parts.is_empty() {
                        order.push(Slot::Entry(entry));
                    }
                    parts.push(KeptPart { part, reduced });
                }
                None => order.push(Slot::Core(ChatMessage {
                    role: message.role(),
                    content: message.content().to_string(),
                    tool_calls: Vec::new(),
                    tool_call_id: message.tool_call_id().map(str::to_string),
                    is_error: false,
                    name: None,
                })),
            }
        }
        let tokens = payload.tokens;
        let evicted = payload.evicted_units;
        let mut body = ManagedBody::new(self.provider, request, extra);
        for (n, slot) in order.into_iter().enumerate() {
            if first_history == Some(n) {
                body.history_starts();
            }
            match slot {
                Slot::Entry(e) => {
                    let raw = self.raw(request, e)?;
                    if self.provider == Provider::Anthropic && request.has_system_item && e == 0 {
                        body.system(raw);
                        continue;
                    }
                    let parts = kept.remove(&e).unwrap_or_default();
                    body.message(&raw, &self.entries[e].blocks, &parts);
                }
                Slot::Core(chat) => body.core_message(&chat),
            }
        }
        let body = body.finish();
        let cache_stable =
            !self.last_emitted.is_empty() && emitted_ids.starts_with(&self.last_emitted);
        self.last_emitted = emitted_ids;
        self.dirty = true;
        Ok(Composed { body, tokens, evicted, cache_stable })
    }

    /// The raw JSON of entry `e`: from this request, or the store.
    fn raw(&self, request: &Request, e: usize) -> Result<String, ConvError> {
        if let Some(raw) = request.items.get(e) {
            return Ok(raw.get().to_string());
        }
        if let Some(raw) = self.unsaved.get(&e) {
            return Ok(raw.clone());
        }
        Ok(lock(&self.db).query_row(
            "SELECT raw FROM entries WHERE conv = ?1 AND seq = ?2",
            params![self.key, to_sql(e as u64)],
            |row| row.get(0),
        )?)
    }

    /// Records the upstream's answer, usage fed to the calibrator now. The message waits for
    /// the next request (taken in its archive transaction; see [`ingest`](Self::ingest)) or
    /// the next checkpoint, whichever comes first. Returns the units evicted (by an earlier
    /// answer still waiting, taken now).
    ///
    /// # Errors
    /// Session refusals and store failures.
    pub fn record_answer(&mut self, answer: &Answer, sent_tokens: u32) -> Result<usize, ConvError> {
        let evicted = self.settle_answer()?;
        self.pending_answer = Some(answer.message.clone());
        self.dirty = true;
        if let Some(prompt) = answer.prompt_tokens.filter(|p| *p > 0)
            && sent_tokens > 0
            && let Err(error) = self.session.record_usage(sent_tokens, prompt)
        {
            tracing::warn!(session = %self.key, %error, "proxy: usage not recorded");
        }
        Ok(evicted)
    }

    /// Pushes the waiting answer into the session (its rows queued to the writer).
    /// Returns the units evicted.
    fn settle_answer(&mut self) -> Result<usize, ConvError> {
        let Some(message) = self.pending_answer.take() else { return Ok(0) };
        let analyzed = match analyze_message(self.provider, &message) {
            Ok(analyzed) => analyzed,
            Err(reason) => {
                tracing::warn!(session = %self.key, reason, "proxy: answer not recorded");
                return Ok(0);
            }
        };
        let raw = message.to_string();
        let raw_hash = hash_str(&raw);
        self.record(&analyzed, &raw, raw_hash, true)
    }

    /// Whether recording the next answer and counting its exchange would touch the disk: a
    /// checkpoint falls due (every `every`), or the archive's writer is so far behind that
    /// queueing the rows of an answer still waiting would wait for room.
    pub fn answer_needs_io(&self, every: u32) -> bool {
        self.exchanges.saturating_add(1) >= every
            || (self.pending_answer.is_some() && self.writer_queue() >= WRITER_BACKLOG)
    }

    /// Counts one exchange; true when `every` have passed since the last checkpoint.
    pub fn exchange_done(&mut self, every: u32) -> bool {
        self.last_used = Instant::now();
        self.exchanges = self.exchanges.saturating_add(1);
        self.exchanges >= every
    }

    /// How long since the conversation was last used.
    pub fn idle(&self) -> Duration {
        self.last_used.elapsed()
    }

    /// Writes a checkpoint if something changed since the last one.
    ///
    /// # Errors
    /// Session errors.
    pub fn checkpoint(&mut self) -> Result<(), ConvError> {
        if self.dirty {
            self.settle_answer()?;
            self.flush()?;
            self.session.checkpoint()?;
            self.dirty = false;
            self.exchanges = 0;
        }
        Ok(())
    }

    /// Writes the side-store rows recorded since the last checkpoint, in one transaction.
    fn flush(&mut self) -> Result<(), ConvError> {
        let mut db = lock(&self.db);
        let tx = db.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO entries (conv, seq, fp, raw_hash, pinned, ids, blocks, tokens, from_answer, max_id, raw, calls)
                 VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?12)",
            )?;
            for (seq, raw) in &self.unsaved {
                let Some(entry) = self.entries.get(*seq) else { continue };
                let max_id = entry.ids.iter().copied().max().unwrap_or(0);
                insert.execute(params![
                    to_sql(*seq as u64),
                    entry.fp as i64,
                    entry.raw_hash as i64,
                    entry.pinned,
                    serde_json::to_string(&entry.ids).unwrap_or_default(),
                    serde_json::to_string(&entry.blocks).unwrap_or_default(),
                    i64::from(entry.tokens),
                    entry.from_answer,
                    to_sql(max_id),
                    raw,
                    self.key,
                    entry.calls as i64
                ])?;
            }
            let ids: Vec<u64> = self.placeholders.iter().copied().collect();
            tx.execute(
                "INSERT OR REPLACE INTO meta (conv, key, value) VALUES (?3, 'placeholders', ?1), (?3, 'tools_fp', ?2)",
                params![serde_json::to_string(&ids).unwrap_or_default(), self.tools_fp.to_string(), self.key],
            )?;
            for (name, value) in &self.unsaved_meta {
                tx.execute(
                    "INSERT OR REPLACE INTO meta (conv, key, value) VALUES (?1, ?2, ?3)",
                    params![self.key, name, value],
                )?;
            }
        }
        tx.commit()?;
        self.unsaved.clear();
        self.unsaved_meta.clear();
        Ok(())
    }
}

/// Hash of a message's tool-call ids, in order (0 without calls).
fn calls_hash(message: &Analyzed) -> u64 {
    let ids: Vec<&str> = message
        .parts
        .iter()
        .flat_map(|p| p.chat.tool_calls.iter().map(|c| c.id.as_str()))
        .collect();
    if ids.is_empty() { 0 } else { hash_str(&ids.join("\u{1}")) }
}

/// A message to emit, in payload order.
enum Slot {
    Entry(usize),
    Core(ChatMessage),
}

/// The directory of conversation `key` under `state_dir`: `<tenant>/<conversation>` for a key
/// [`crate::keys`] built, else one named by a hash of the key (no name from a key reaches a
/// path as it is).
///
/// ```
/// use std::path::Path;
/// let key = format!("{}.{}", "a".repeat(64), "b".repeat(64));
/// let dir = ctxwin_proxy::conv::conv_dir(Path::new("s"), &key);
/// assert_eq!(dir, Path::new("s").join("a".repeat(64)).join("b".repeat(64)));
/// let other = ctxwin_proxy::conv::conv_dir(Path::new("s"), "../x");
/// assert!(other.starts_with("s") && other.file_name().unwrap().len() == 64);
/// ```
pub fn conv_dir(state_dir: &Path, key: &str) -> PathBuf {
    match key.split_once('.') {
        Some((tenant, conversation)) if is_tenant_key(key) => {
            state_dir.join(tenant).join(conversation)
        }
        _ => state_dir.join(digest_hex(&[b"ctxwin directory v1", key.as_bytes()])),
    }
}

/// Whether `key` is `<tenant>.<conversation>`, as [`crate::keys`] builds them (a key stored
/// before tenants is not).
pub fn is_tenant_key(key: &str) -> bool {
    key.split_once('.')
        .is_some_and(|(tenant, conversation)| is_hex_name(tenant) && is_hex_name(conversation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(messages: &[Value]) -> Request {
        let body = json!({"model": "m", "messages": messages}).to_string();
        Request::parse(Provider::OpenAi, body.as_bytes()).unwrap()
    }

    fn turn(conv: &mut Conv, messages: &[Value]) -> String {
        let request = request(messages);
        let hashes = crate::wire::raw_hashes(&request);
        assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
        String::from_utf8(conv.compose(&request).unwrap().body).unwrap()
    }

    #[test]
    fn a_reduced_tool_output_of_text_blocks_is_sent_reduced() {
        let dir = tempfile::tempdir().unwrap();
        let store = prepare_state(dir.path()).unwrap();
        let long: String = (0..800).map(|i| format!("line {i} of the build log\n")).collect();
        let blocks = json!([{"type": "text", "text": long}, {"type": "text", "text": "exit 1", "cache_control": {"type": "ephemeral"}}]);
        // OpenAI: a tool message whose content is an array of text parts.
        let mut conv =
            Conv::open(dir.path(), &store, "o", Provider::OpenAi, 32_768, 1_024).unwrap();
        let messages = [
            json!({"role": "user", "content": "build it"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": blocks}),
        ];
        let body: Value = serde_json::from_str(&turn(&mut conv, &messages)).unwrap();
        let content = &body["messages"][2]["content"];
        let sent = content[0]["text"].as_str().unwrap();
        assert!(sent.len() < long.len() / 2, "sent {} of {} bytes", sent.len(), long.len());
        assert_eq!(content.as_array().unwrap().len(), 1);
        assert_eq!(content[0]["cache_control"], json!({"type": "ephemeral"}));
        // Anthropic: a tool_result block whose content is an array of text blocks.
        let mut conv =
            Conv::open(dir.path(), &store, "a", Provider::Anthropic, 32_768, 1_024).unwrap();
        let messages = [
            json!({"role": "user", "content": "build it"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "build", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": blocks}]}),
        ];
        let body = {
            let body = json!({"model": "m", "max_tokens": 100, "messages": messages}).to_string();
            let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
            let hashes = crate::wire::raw_hashes(&request);
            conv.ingest(&request, &hashes).unwrap();
            String::from_utf8(conv.compose(&request).unwrap().body).unwrap()
        };
        let body: Value = serde_json::from_str(&body).unwrap();
        let content = &body["messages"][2]["content"][0]["content"];
        let sent = content[0]["text"].as_str().unwrap();
        assert!(sent.len() < long.len() / 2, "sent {} of {} bytes", sent.len(), long.len());
        assert_eq!(content[0]["cache_control"], json!({"type": "ephemeral"}));
    }

    #[test]
    fn persisted_keys_name_every_conversation_with_something_stored() {
        let dir = tempfile::tempdir().unwrap();
        let store = prepare_state(dir.path()).unwrap();
        let messages = [json!({"role": "user", "content": "Is the build green?"})];
        // Checkpointed: side-store rows and archive rows.
        let mut saved =
            Conv::create(dir.path(), &store, "saved", Provider::OpenAi, 8_192, 512).unwrap();
        turn(&mut saved, &messages);
        saved.checkpoint().unwrap();
        // Never checkpointed: archive rows only (as after a crash).
        let mut crashed =
            Conv::create(dir.path(), &store, "crashed", Provider::OpenAi, 8_192, 512).unwrap();
        turn(&mut crashed, &messages);
        crashed.session.sync_archive().unwrap();
        // Created, nothing pushed: nothing stored.
        let idle = Conv::create(dir.path(), &store, "idle", Provider::OpenAi, 8_192, 512).unwrap();
        drop((saved, crashed, idle));
        // A later generation's rows, and rows a restore set aside, count for their key.
        let row = |text: &str| {
            ctxwin_std::store::ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, text))
        };
        let archive = store.archive.clone();
        let local = ctxwin_std::store::Scope::local;
        let none = ctxwin_std::store::Fence::NONE;
        archive.put(&local("next#1"), none, &[row("a")]).unwrap();
        archive.put(&local("aside@rewound-1"), none, &[row("b")]).unwrap();
        let mut keys: Vec<String> = persisted_keys(&store).unwrap().into_iter().collect();
        keys.sort();
        assert_eq!(keys, ["aside", "crashed", "next", "saved"]);
        // A created conversation's checkpoint opens like any other.
        let reopened =
            Conv::open(dir.path(), &store, "saved", Provider::OpenAi, 1_024, 512).unwrap();
        assert_eq!(reopened.len(), 1);
        assert_eq!(reopened.session().manager().config().context_window, 8_192);
    }

    #[test]
    fn a_waiting_answer_is_taken_once_echoed_or_at_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = prepare_state(dir.path()).unwrap();
        let mut conv = Conv::open(dir.path(), &store, "w", Provider::OpenAi, 8_192, 512).unwrap();
        let rows = |conv: &mut Conv| {
            conv.session.sync_archive().unwrap();
            conv.session().archive().unwrap().usage(conv.session.scope()).unwrap().messages
        };
        let mut messages = vec![json!({"role": "user", "content": "Is the build green?"})];
        turn(&mut conv, &messages);
        let answer = json!({"role": "assistant", "content": "Yes, all 42 tests pass."});
        let reply = Answer { message: answer.clone(), prompt_tokens: None };
        conv.record_answer(&reply, 0).unwrap();
        assert_eq!((rows(&mut conv), conv.len()), (1, 1), "the answer waits for the next request");
        // The client echoes it (its library adds a field) with the next question: one row each.
        messages.push(
            json!({"role": "assistant", "content": "Yes, all 42 tests pass.", "refusal": null}),
        );
        messages.push(json!({"role": "user", "content": "Deploy it."}));
        turn(&mut conv, &messages);
        assert_eq!((rows(&mut conv), conv.len()), (3, 3));
        // An answer no request follows is taken at the checkpoint.
        conv.record_answer(&Answer { message: answer, prompt_tokens: None }, 0).unwrap();
        conv.checkpoint().unwrap();
        assert_eq!((rows(&mut conv), conv.len()), (4, 4));
    }

    #[test]
    fn retrieval_starts_with_the_first_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let store = prepare_state(dir.path()).unwrap();
        let mut conv = Conv::open(dir.path(), &store, "t", Provider::OpenAi, 2_048, 256).unwrap();
        assert_eq!(conv.writer.inner().cache_kib().unwrap(), u64::from(ARCHIVE_CACHE_KIB));
        let mut messages = vec![
            json!({"role": "user", "content": "The staging database runs Postgres 16."}),
            json!({"role": "assistant", "content": "Noted."}),
        ];
        turn(&mut conv, &messages);
        assert!(!conv.evicted_any, "nothing has left the core");
        let mut n = 0;
        while !conv.evicted_any {
            n += 1;
            assert!(n < 200, "the fact never left the window");
            messages.push(json!({"role": "user", "content": format!("Filler turn {n}: list the open pull requests, the failing jobs and who owns each of them.")}));
            messages.push(json!({"role": "assistant", "content": format!("Reply {n}: three pull requests are open and one job fails.")}));
            turn(&mut conv, &messages);
        }
        messages
            .push(json!({"role": "user", "content": "Which Postgres version does staging run?"}));
        let body = turn(&mut conv, &messages);
        assert!(conv.evicted_any);
        assert!(body.contains("Retrieved from archive"), "{body}");
        assert!(body.contains("runs Postgres 16"), "{body}");
        // Reopened from its checkpoint, it still knows that something left.
        conv.checkpoint().unwrap();
        drop(conv);
        let conv = Conv::open(dir.path(), &store, "t", Provider::OpenAi, 2_048, 256).unwrap();
        assert!(conv.evicted_any);
    }
}
