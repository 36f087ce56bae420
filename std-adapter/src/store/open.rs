//! Choosing a store: a [`Location`] (a state directory, or a PostgreSQL URL from
//! `[store] url` in `ctxwin.toml` or [`STORE_URL_VAR`]) opened as [`Ports`], the two ports a
//! session, the command line and the proxy use alike; and what `ctxwin prune` does through
//! them, whatever the adapters.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    ArchiveStore, CheckpointDir, CheckpointId, CheckpointSink, Fence, RecordStore, Scope,
    StoreError,
};

/// The environment variable naming the store; it wins over `[store] url`.
pub const STORE_URL_VAR: &str = "CTXWIN_STORE_URL";

/// Where a process keeps its conversations.
///
/// ```
/// use std::path::{Path, PathBuf};
/// use ctxwin_std::store::Location;
/// let fleet = Location::parse("postgres://ctxwin:secret@db.internal/ctxwin");
/// assert!(matches!(fleet, Location::Postgres(_)));
/// assert_eq!(fleet.to_string(), "postgres://ctxwin:…@db.internal/ctxwin", "no password shown");
/// assert_eq!(Location::parse(".ctxwin"), Location::Directory(PathBuf::from(".ctxwin")));
/// // The environment wins over the file, the file over the state directory.
/// let chosen = Location::resolve_from(None, Some("postgresql://db/x"), Path::new(".ctxwin"));
/// assert_eq!(chosen, Location::Postgres("postgresql://db/x".into()));
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// A state directory: `archive.db` (SQLite) and `checkpoints/` (files) in it.
    Directory(PathBuf),
    /// A PostgreSQL database (`postgres://` or `postgresql://`), both ports in it.
    Postgres(String),
}

impl Location {
    /// `url_or_dir` as a location: a `postgres://` or `postgresql://` URL, else a directory.
    pub fn parse(url_or_dir: &str) -> Self {
        let lower = url_or_dir.trim_start().to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Self::Postgres(url_or_dir.trim().to_string())
        } else {
            Self::Directory(PathBuf::from(url_or_dir))
        }
    }

    /// The store a process uses: [`STORE_URL_VAR`] when set and not empty, else
    /// `configured` (`[store] url`), else `state_dir`.
    pub fn resolve(configured: Option<&str>, state_dir: &Path) -> Self {
        let env = std::env::var(STORE_URL_VAR).ok();
        Self::resolve_from(env.as_deref(), configured, state_dir)
    }

    /// As [`resolve`](Self::resolve), with the variable's value given.
    pub fn resolve_from(env: Option<&str>, configured: Option<&str>, state_dir: &Path) -> Self {
        match [env, configured].into_iter().flatten().find(|value| !value.trim().is_empty()) {
            Some(value) => Self::parse(value),
            None => Self::Directory(state_dir.to_path_buf()),
        }
    }
}

impl fmt::Display for Location {
    /// A directory's path; a URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Directory(dir) => write!(f, "{}", dir.display()),
            Self::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Directory(dir) => f.debug_tuple("Directory").field(dir).finish(),
            Self::Postgres(_) => f.debug_tuple("Postgres").field(&self.to_string()).finish(),
        }
    }
}

/// `url` with the password of its user part replaced by `…` (and `password=` parameters).
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:…@{host}"),
            None => format!("{user}@{host}"),
        },
        None => authority.to_string(),
    };
    let path = match path.split_once('?') {
        Some((db, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| if p.starts_with("password=") { "password=…".into() } else { p.into() })
                .collect();
            format!("{db}?{}", params.join("&"))
        }
        None => path.to_string(),
    };
    format!("{scheme}://{authority}/{path}")
}

/// The two ports of one store, shared: what [`open`] returns and what sessions, the command
/// line and the proxy hold.
#[derive(Clone, Debug)]
pub struct Ports {
    /// Messages, summaries, vectors, compression events.
    pub archive: Arc<dyn ArchiveStore>,
    /// Checkpoints.
    pub checkpoints: Arc<dyn CheckpointSink>,
}

/// What [`Ports::delete_conversation`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Message rows.
    pub messages: u64,
    /// Checkpoints.
    pub checkpoints: Vec<CheckpointId>,
}

/// Opens the store at `location` for any number of conversations: a directory's
/// `archive.db` and `checkpoints/<tenant>/<conversation>/` ([`CheckpointDir::per_scope`]), or
/// a PostgreSQL database with `PgOptions::default()` (`store::postgres`; both ports
/// on one pool).
///
/// ```
/// use ctxwin_std::store::{Fence, Location, Scope, open};
/// let dir = tempfile::tempdir()?;
/// let ports = open(&Location::Directory(dir.path().to_path_buf()))?;
/// let scope = Scope::new("acme", "chat");
/// ports.checkpoints.save(&scope, Fence::NONE, b"snapshot")?;
/// assert!(dir.path().join("archive.db").exists());
/// assert!(dir.path().join("checkpoints/acme/chat").is_dir());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As the adapter's `open`; [`StoreError::Invalid`] for a kind of store this build lacks
/// (cargo features `sqlite`, `postgres`).
pub fn open(location: &Location) -> Result<Ports, StoreError> {
    match location {
        Location::Directory(dir) => {
            let checkpoints = Arc::new(CheckpointDir::per_scope(dir.join("checkpoints")));
            Ok(Ports { archive: open_archive_file(dir)?, checkpoints })
        }
        Location::Postgres(url) => open_postgres(url),
    }
}

/// Opens the store at `location` for one conversation, `scope`: as [`open`], but a
/// directory keeps the checkpoints in `checkpoints/` itself ([`CheckpointDir::bound`]), as a
/// command-line state directory does.
///
/// # Errors
/// As [`open`].
pub fn open_bound(location: &Location, scope: &Scope) -> Result<Ports, StoreError> {
    match location {
        Location::Directory(dir) => {
            let checkpoints = CheckpointDir::bound(dir.join("checkpoints"), scope.clone());
            Ok(Ports { archive: open_archive_file(dir)?, checkpoints: Arc::new(checkpoints) })
        }
        Location::Postgres(url) => open_postgres(url),
    }
}

/// The checkpoint port alone of the store at `location`, for `scope`: as [`open_bound`]'s,
/// without opening a directory's archive (listing checkpoints works when `archive.db` is
/// damaged).
///
/// ```
/// use ctxwin_std::store::{Fence, Location, Scope, open_checkpoints};
/// let dir = tempfile::tempdir()?;
/// let scope = Scope::local("main");
/// let sink = open_checkpoints(&Location::Directory(dir.path().to_path_buf()), &scope)?;
/// sink.save(&scope, Fence::NONE, b"snapshot")?;
/// assert!(!dir.path().join("archive.db").exists());
/// assert_eq!(sink.ids(&scope)?.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`open`].
pub fn open_checkpoints(
    location: &Location,
    scope: &Scope,
) -> Result<Arc<dyn CheckpointSink>, StoreError> {
    match location {
        Location::Directory(dir) => {
            Ok(Arc::new(CheckpointDir::bound(dir.join("checkpoints"), scope.clone())))
        }
        Location::Postgres(url) => Ok(open_postgres(url)?.checkpoints),
    }
}

/// The record port of the store at `location`: table `records` of a directory's
/// `archive.db` (SQLite), or of the PostgreSQL database. The directory must exist.
///
/// ```
/// use ctxwin_std::store::{Location, Record, RecordStore, RecordWrite, Scope, open_records};
/// let dir = tempfile::tempdir()?;
/// let records = open_records(&Location::Directory(dir.path().to_path_buf()))?;
/// let record = Record::new("checkpoint", "0001", b"state".to_vec());
/// records.apply(&Scope::local("thread"), &[RecordWrite::Put(&record)])?;
/// assert!(dir.path().join("archive.db").exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`open`].
pub fn open_records(location: &Location) -> Result<Arc<dyn RecordStore>, StoreError> {
    match location {
        Location::Directory(dir) => open_records_file(dir),
        Location::Postgres(url) => open_postgres_records(url),
    }
}

#[cfg(feature = "sqlite")]
fn open_records_file(dir: &Path) -> Result<Arc<dyn RecordStore>, StoreError> {
    Ok(Arc::new(super::sqlite::SqliteArchive::open(dir.join("archive.db"))?))
}

#[cfg(not(feature = "sqlite"))]
fn open_records_file(dir: &Path) -> Result<Arc<dyn RecordStore>, StoreError> {
    Err(StoreError::invalid(format!(
        "{} is a state directory, and this build has no SQLite store (cargo feature `sqlite`)",
        dir.display()
    )))
}

#[cfg(feature = "postgres")]
fn open_postgres_records(url: &str) -> Result<Arc<dyn RecordStore>, StoreError> {
    Ok(Arc::new(super::postgres::PgStore::open(url)?))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres_records(url: &str) -> Result<Arc<dyn RecordStore>, StoreError> {
    Err(StoreError::invalid(format!(
        "{} is a PostgreSQL store, and this build has no PostgreSQL adapter (cargo feature `postgres`)",
        redact(url)
    )))
}

#[cfg(feature = "sqlite")]
fn open_archive_file(dir: &Path) -> Result<Arc<dyn ArchiveStore>, StoreError> {
    Ok(Arc::new(super::sqlite::SqliteArchive::open(dir.join("archive.db"))?))
}

#[cfg(not(feature = "sqlite"))]
fn open_archive_file(dir: &Path) -> Result<Arc<dyn ArchiveStore>, StoreError> {
    Err(StoreError::invalid(format!(
        "{} is a state directory, and this build has no SQLite archive (cargo feature `sqlite`)",
        dir.display()
    )))
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Ports, StoreError> {
    let store = Arc::new(super::postgres::PgStore::open(url)?);
    Ok(Ports { archive: store.clone(), checkpoints: store })
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(url: &str) -> Result<Ports, StoreError> {
    Err(StoreError::invalid(format!(
        "{} is a PostgreSQL store, and this build has no PostgreSQL adapter (cargo feature `postgres`)",
        redact(url)
    )))
}

impl Ports {
    /// Deletes everything `scope` holds in both ports: its rows, summaries, vectors,
    /// compression events, and every checkpoint (`ctxwin prune --delete`). Written with
    /// `fence` (an operator's command: [`Fence::NONE`]).
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, CheckpointSink, Fence, MemoryStore, Ports, Scope};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store };
    /// let scope = Scope::local("old");
    /// ports.archive.put(&scope, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// ports.checkpoints.save(&scope, Fence::NONE, b"snapshot")?;
    /// let deleted = ports.delete_conversation(&scope, Fence::NONE)?;
    /// assert_eq!((deleted.messages, deleted.checkpoints.len()), (1, 1));
    /// assert!(ports.archive.conversations("", "")?.is_empty());
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// As the ports' [`delete_conversation`](ArchiveStore::delete_conversation) and
    /// [`prune`](CheckpointSink::prune); the checkpoints go first, so a failure leaves no
    /// checkpoint covering rows that are gone.
    pub fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<Deleted, StoreError> {
        let checkpoints = self.checkpoints.prune(scope, fence, 0)?;
        let messages = self.archive.delete_conversation(scope, fence)?;
        Ok(Deleted { messages, checkpoints })
    }

    /// Keeps the newest `keep` checkpoints of every conversation of `tenant` the archive
    /// lists (`ctxwin prune --keep N`); the conversations pruned, each with the ids deleted.
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, CheckpointSink, Fence, MemoryStore, Ports, Scope};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store };
    /// let scope = Scope::local("chat");
    /// ports.archive.put(&scope, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// for n in 0..5u8 {
    ///     ports.checkpoints.save(&scope, Fence::NONE, &[n])?;
    /// }
    /// let pruned = ports.prune_checkpoints("", 2, Fence::NONE)?;
    /// assert_eq!((pruned[0].0.as_str(), pruned[0].1.len()), ("chat", 3));
    /// assert_eq!(ports.checkpoints.ids(&scope)?.len(), 2);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// As the ports' [`conversations`](ArchiveStore::conversations) and
    /// [`prune`](CheckpointSink::prune); conversations pruned before a failure stay pruned.
    pub fn prune_checkpoints(
        &self,
        tenant: &str,
        keep: usize,
        fence: Fence,
    ) -> Result<Vec<(String, Vec<CheckpointId>)>, StoreError> {
        let mut pruned = Vec::new();
        for conversation in self.archive.conversations(tenant, "")? {
            let scope = Scope::new(tenant, conversation.as_str());
            let deleted = self.checkpoints.prune(&scope, fence, keep)?;
            if !deleted.is_empty() {
                pruned.push((conversation, deleted));
            }
        }
        Ok(pruned)
    }
}

/// What `ctxwin prune` does, checked on `ports` (empty of tenant `t`): a conversation deleted
/// from both ports, the others' checkpoints pruned to the newest.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn prune_and_delete(ports: &Ports) {
    use crate::message::ChatMessage;
    use crate::store::ArchivedMessage;
    use ctxwin_core::Role;
    let (keep, gone) = (Scope::new("t", "keep"), Scope::new("t", "gone"));
    for scope in [&keep, &gone] {
        let row = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"));
        ports.archive.put(scope, Fence::NONE, &[row]).unwrap();
        for n in 0..4u8 {
            ports.checkpoints.save(scope, Fence::NONE, &[n]).unwrap();
        }
    }
    let deleted = ports.delete_conversation(&gone, Fence::NONE).unwrap();
    assert_eq!((deleted.messages, deleted.checkpoints.len()), (1, 4));
    let pruned = ports.prune_checkpoints("t", 1, Fence::NONE).unwrap();
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0].1.len(), 3);
    assert_eq!(ports.checkpoints.ids(&keep).unwrap().len(), 1);
    assert!(ports.checkpoints.ids(&gone).unwrap().is_empty());
    assert_eq!(ports.archive.conversations("t", "").unwrap(), ["keep"]);
    let latest = ports.checkpoints.load_latest(&keep, &mut |_| Ok(())).unwrap().unwrap();
    assert_eq!(latest.bytes, [3]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact("postgres://u:p@h:5432/db"), "postgres://u:…@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("postgres://h/db?user=u&password=p"),
            "postgres://h/db?user=u&password=…"
        );
        assert_eq!(redact("postgresql://u:p@h"), "postgresql://u:…@h/");
    }

    #[test]
    fn the_environment_wins_then_the_file_then_the_directory() {
        let dir = Path::new("/state");
        let pg = "postgres://db/x";
        assert_eq!(Location::resolve_from(Some(pg), Some("/other"), dir), Location::parse(pg));
        assert_eq!(
            Location::resolve_from(Some(" "), Some("/other"), dir),
            Location::Directory("/other".into())
        );
        assert_eq!(Location::resolve_from(None, None, dir), Location::Directory(dir.into()));
        assert_eq!(
            Location::parse("POSTGRESQL://db/x"),
            Location::Postgres("POSTGRESQL://db/x".into())
        );
        assert!(!format!("{:?}", Location::parse("postgres://u:hunter2@h/db")).contains("hunter2"));
    }

    #[test]
    fn both_file_and_memory_ports_prune_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Arc::new(crate::store::MemoryStore::new());
        prune_and_delete(&Ports { archive: memory.clone(), checkpoints: memory });
        let directory = open(&Location::Directory(dir.path().to_path_buf()));
        if cfg!(feature = "sqlite") {
            prune_and_delete(&directory.unwrap());
        } else {
            assert!(matches!(directory, Err(StoreError::Invalid { .. })));
        }
    }
}
