//! What every conversation of a proxy shares: the archive (one SQLite file for all, behind a
//! deferred writer thread) and the checkpoint files of the state directory, or in a fleet both
//! storage ports on one PostgreSQL database; and how a conversation's session is configured
//! on them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxwin_std::session::{SessionBuilder, SessionError};
use ctxwin_std::store::postgres::{PgOptions, PgStore};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{ArchiveStore, Deferred, Fence, Location, Ports, Scope};

use super::ConvError;
use crate::config::ProxyConfig;
use crate::hash::KeyedHash;

/// Page cache of the archive connection every conversation shares, in KiB (SQLite's default
/// is 2,000). One connection for all: a connection each cost about 200 KiB per resident
/// conversation, and each found its cache stale after every other one's write.
pub const ARCHIVE_CACHE_KIB: u32 = 2_048;

/// The file an older proxy kept its own index of messages in (`meta` and `entries` tables).
/// It is no longer read: a message is stored once, in the archive, plus the checkpoints.
pub const LEFTOVER_SIDE_STORE: &str = "proxy.db";

/// Where the conversations of a proxy are kept.
#[derive(Clone, Debug)]
pub enum Stores {
    /// The state directory: one process serves its conversations.
    Local(LocalStores),
    /// Both ports on a PostgreSQL database ([`ctxwin_std::store::open`]) that several
    /// instances share: each conversation's session holds its lease
    /// ([`Conv::catch_up`](super::Conv::catch_up)).
    Fleet(Ports),
}

impl Stores {
    /// Whether several instances share the store.
    pub fn is_fleet(&self) -> bool {
        matches!(self, Self::Fleet(_))
    }

    /// The state directory's stores (`None` in a fleet).
    pub fn local(&self) -> Option<&LocalStores> {
        match self {
            Self::Local(local) => Some(local),
            Self::Fleet(_) => None,
        }
    }
}

/// What every conversation of a proxy on a state directory shares: one archive.
#[derive(Clone, Debug)]
pub struct LocalStores {
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
/// left (`proxy.db`) is not read: one warning names it. Rows enter the full-text index as
/// they are written when `searched` (retrieval on: its searches then find them indexed off
/// the request path), else when their conversation is first searched
/// ([`SqliteArchive::index_when_searched`]: a proxy that never searches does not tokenize
/// every row).
///
/// # Errors
/// Store and I/O errors.
pub fn prepare_state(state_dir: &Path, searched: bool) -> Result<Stores, ConvError> {
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
    let archive = if searched { archive } else { archive.index_when_searched() };
    archive.set_cache_kib(ARCHIVE_CACHE_KIB).map_err(SessionError::from)?;
    let wal = SqliteArchive::open(&path).map_err(SessionError::from)?;
    wal.set_cache_kib(64).map_err(SessionError::from)?;
    let writer = Arc::new(Deferred::spawn(archive.clone())?);
    Ok(Stores::Local(LocalStores { archive, wal, writer }))
}

/// Opens the PostgreSQL database at `url` that a fleet of instances shares (its schema is
/// created or migrated once, under an advisory lock).
///
/// # Errors
/// Store errors: a URL that does not parse, a server that cannot be reached.
pub fn open_fleet(url: &str) -> Result<Stores, ConvError> {
    // A connection for each session task the instance runs at once (each holds one for a
    // statement or a transaction): none idle past the pool's timeout.
    let connections = u32::try_from(crate::pool::fleet_workers()).unwrap_or(u32::MAX);
    let options = PgOptions { max_connections: connections, ..PgOptions::default() };
    let store = Arc::new(PgStore::open_with(url, options)?);
    Ok(Stores::Fleet(Ports { archive: store.clone(), checkpoints: store }))
}

/// Where the fleet keeps the secret its instances name tenants and conversations with
/// ([`crate::hash::KeyedHash`]): a scope of the checkpoint port no session uses (sessions
/// are of the local tenant `""`).
pub fn fleet_secret_scope() -> Scope {
    Scope::new("ctxwin-proxy", "tenant.key")
}

/// The secret every instance of the fleet names tenants and conversations with (what
/// `<state_dir>/tenant.key` is for one process), kept in the database so that any instance
/// computes the same names: created by the first instance, 32 bytes from the system's
/// random generator. Instances starting at once may each save one; all of them use the
/// oldest.
///
/// # Errors
/// Store errors; a damaged secret is reported, never replaced (every name it keyed would be
/// lost).
pub fn fleet_secret(ports: &Ports) -> Result<Vec<u8>, ConvError> {
    let scope = fleet_secret_scope();
    if ports.checkpoints.ids(&scope)?.is_empty() {
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| ConvError::State("the system's random generator failed".into()))?;
        ports.checkpoints.save(&scope, Fence::NONE, &secret)?;
    }
    let oldest = ports.checkpoints.ids(&scope)?.pop();
    let oldest =
        oldest.ok_or_else(|| ConvError::State("the fleet's secret was not saved".into()))?;
    let secret = ports.checkpoints.load(&scope, &oldest)?;
    if secret.len() != 32 {
        return Err(ConvError::State(format!(
            "the fleet's secret ({scope}) holds {} bytes, not 32",
            secret.len()
        )));
    }
    Ok(secret)
}

/// Opens where the proxy keeps its conversations, as `config` says (the state directory, or
/// with [`ProxyConfig::store_url`] a fleet's database), and the keyed hash that names them:
/// the state directory's secret, or the fleet's ([`fleet_secret`]).
///
/// # Errors
/// What failed, naming the directory or the database (without its password).
pub fn open_stores(config: &ProxyConfig) -> Result<(Stores, KeyedHash), String> {
    let Some(url) = &config.store_url else {
        let dir = &config.state_dir;
        let failed = |e: &dyn std::fmt::Display| format!("state directory {}: {e}", dir.display());
        let stores = prepare_state(dir, config.retrieval.auto).map_err(|e| failed(&e))?;
        let keys = KeyedHash::for_state_dir(dir).map_err(|e| failed(&e))?;
        return Ok((stores, keys));
    };
    let place = Location::parse(url).to_string();
    let open = || -> Result<(Stores, KeyedHash), ConvError> {
        let stores = open_fleet(url)?;
        let secret = match &stores {
            Stores::Fleet(ports) => fleet_secret(ports)?,
            Stores::Local(_) => Vec::new(),
        };
        Ok((stores, KeyedHash::new(&secret)))
    };
    // The synchronous PostgreSQL client blocks on a runtime of its own: not on an async
    // thread, which is where a proxy starts.
    std::thread::scope(|scope| scope.spawn(open).join())
        .map_err(|_| format!("store {place}: opening it panicked"))?
        .map_err(|e| format!("store {place}: {e}"))
}

/// The keys of the conversations under the state directory that have something stored:
/// messages in the archive (`key`, `key#N` for later generations and `key@…` for rows a
/// restore set aside). A key not among them, and not seen since, is new:
/// [`Conv::create`](super::Conv::create) builds it without reading anything.
///
/// # Errors
/// Store errors.
pub fn persisted_keys(stores: &Stores) -> Result<HashSet<String>, ConvError> {
    // A fleet's conversations are always opened from the database: another instance may
    // have stored one since.
    let Stores::Local(stores) = stores else { return Ok(HashSet::new()) };
    let names = stores.archive.conversations("", "").map_err(SessionError::from)?;
    Ok(names.iter().map(|name| name.split(['#', '@']).next().unwrap_or(name).to_string()).collect())
}

/// The session settings every conversation shares, for session `name` checkpointed in
/// `checkpoints` (the configuration is the caller's: it depends on the conversation's window).
pub(super) fn session_builder(
    stores: &LocalStores,
    name: &str,
    checkpoints: PathBuf,
) -> SessionBuilder {
    SessionBuilder::new(name)
        .archive_store(stores.writer.clone())
        .checkpoints(checkpoints)
        .keep_checkpoints(KEEP_CHECKPOINTS)
        // The proxy checkpoints when a conversation idles or unloads, not every N messages.
        .checkpoint_interval_messages(0)
}

/// Checkpoints kept per conversation.
const KEEP_CHECKPOINTS: usize = 3;

/// The session settings of conversation `name` in a fleet: both ports of the database; its
/// rows are written in the request's own transactions, each checked against the lease.
pub(super) fn fleet_builder(ports: &Ports, name: &str) -> SessionBuilder {
    SessionBuilder::new(name)
        .ports(ports.clone())
        .keep_checkpoints(KEEP_CHECKPOINTS)
        .checkpoint_interval_messages(0)
}

#[cfg(test)]
mod tests {
    use ctxwin_std::store::postgres::testing::TestSchema;

    use super::*;

    #[test]
    fn a_fleet_store_whose_last_handle_goes_on_an_async_thread_closes_there() {
        let Some(schema) = TestSchema::new("proxy_store_drop") else { return };
        let schema = schema.unwrap();
        let stores = open_fleet(schema.url()).unwrap();
        let Stores::Fleet(ports) = &stores else { unreachable!() };
        // A connection idle in the pool, as after serving a request.
        ports.archive.current_fence(&Scope::local("c")).unwrap();
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        // As a connection task holding the last reference to the app at shutdown.
        let dropped =
            runtime.block_on(async move { tokio::spawn(async move { drop(stores) }).await });
        assert!(dropped.is_ok(), "{dropped:?}");
    }
}
