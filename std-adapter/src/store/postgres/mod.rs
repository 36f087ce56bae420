//! [`PgStore`]: both ports on PostgreSQL, the store many processes share (a fleet of proxy
//! instances, agents on several hosts), with leases that fence stale writers.
//!
//! * **Scoped in SQL.** A [`Scope`] is a row of `conversations` (tenant, name); every
//!   statement joins on it, and every row's search vector holds its conversation's lexeme,
//!   so a search intersects the conversation's postings with the words' in the GIN index.
//! * **Fenced.** [`acquire`](crate::store::ArchiveStore::acquire) raises the conversation's fence and
//!   returns it; every write (rows, summaries, vectors, forget, deletes, checkpoint saves,
//!   prunes, rewrites) locks the conversation's row in its own transaction and is refused
//!   with [`StoreError::Fenced`] when its fence is older than the row's. A holder that was
//!   paused or partitioned cannot write over its successor; no clock is compared. An
//!   `acquire` waits for a write in flight of the old holder, so once it returns no write of
//!   the old fence can commit. Writes with [`Fence::NONE`] (an operator's command) are not
//!   checked.
//! * **Verified.** Rows, summaries, vectors carry the [checksum](crate::store::checksum)
//!   computed in Rust and verified on every read; checkpoints carry their frame's CRC.
//! * **Search** is PostgreSQL's text search (English stemming) with BM25 computed in SQL
//!   from the conversation's own counts: scores normalised as every adapter's
//!   ([`SearchHit::score`](crate::store::SearchHit::score)). Message rows are written
//!   without their search vector; a search first indexes its conversation's rows written
//!   or changed since its last one (schema V4), so a write costs no text analysis and a
//!   conversation nobody searches none at all.
//! * **Pooled** with a floor of [`PgOptions::min_idle`] connections (0 by default: an idle
//!   process holds none once [`PgOptions::idle_timeout`] passes) and a ceiling of
//!   [`PgOptions::max_connections`].
//! * **Prepared, or pooler-safe.** By default each statement is prepared once per connection
//!   and kept ([`PgOptions::prepared_statements`]): the server parses and plans it once, not
//!   on every use (its connections are opened with `plan_cache_mode = force_generic_plan`),
//!   and a lease check or a lease taken is one statement, its connection's `lock_timeout`
//!   set when it opened. With
//!   `prepared_statements` off (`?prepared_statements=off` in the URL) no statement relies on
//!   session state: every statement is sent unnamed with its types, locks and settings are
//!   transaction-scoped (`pg_advisory_xact_lock`, `SET LOCAL`), every write an explicit
//!   transaction; it runs behind PgBouncer in transaction mode. What the store sends is
//!   counted process-wide ([`statement_counts`]).
//! * **Group commit.** In either mode, rows of one conversation written while other threads
//!   of the process write theirs go in one statement with them: one transaction and one
//!   commit for all, each conversation's fence checked on its own (a stale one's rows are
//!   refused alone), each caller answered once the statement committed (`group` module).
//! * **Checkpoints** are framed payloads in a table, ordered by a per-conversation sequence:
//!   a session's snapshot is stored once per save and its rows once in `messages` (storage
//!   grows with the messages plus the checkpoints kept, not messages × checkpoints).
//! * **Forget means gone** from the live data: rows, the search vectors (cleared), vectors
//!   (dropped), summaries and checkpoints (rewritten), then `VACUUM` of the touched tables
//!   so no dead row version keeps the text in the tables' pages. What PostgreSQL keeps
//!   outside them — WAL segments not yet recycled, replicas, base backups — still holds it
//!   until they turn over (see the README's fleet section).
//!
//! # Operating it
//!
//! * **A schema of its own**: the tables go in the connection's current schema. Give ctxwin a
//!   role whose `search_path` starts with its schema (`ALTER ROLE ctxwin SET search_path =
//!   ctxwin`), or put `?options=-csearch_path%3Dctxwin` in the URL when connecting directly
//!   (a pooler may refuse or drop the `options` startup parameter — PgBouncer does unless
//!   configured for it — while the role's setting works behind any pooler).
//! * **Behind a transaction-mode pooler** put `prepared_statements=off` in the URL (or
//!   [`PgOptions::prepared_statements`] `false`): then no statement is prepared by name, no
//!   setting or lock outlives its transaction, and no startup option is sent (PgBouncer's
//!   `max_prepared_statements` may stay 0). Connected directly (or through a session-mode
//!   pooler) leave it on: PostgreSQL then spends about 40% less CPU per request of a
//!   proxy fleet (README, fleet section).
//! * **Connections**: at most [`PgOptions::max_connections`] per process (4 by default),
//!   none while idle past [`PgOptions::idle_timeout`] (60 s) unless
//!   [`PgOptions::min_idle`] says otherwise. Twenty idle agents hold no connection
//!   (`tests/postgres_fleet.rs`).
//! * **Server settings worth setting**: `idle_in_transaction_session_timeout` (a client
//!   stopped mid-transaction releases its conversation's lock); TCP keepalives are set by
//!   the client (30 s idle) so a partitioned instance's transaction ends within minutes.
//! * **What a forget leaves on the server's disks.** After
//!   [`forget`](crate::store::ArchiveStore::forget) and a checkpoint
//!   [`rewrite`](crate::store::CheckpointSink::rewrite), a `pg_dump` holds no byte of the
//!   text (rows, search vectors, vectors, summaries, checkpoints; checked by
//!   `tests/postgres_fleet.rs`), and the `VACUUM` that follows leaves no copy in the tables'
//!   pages (the same test counts 0 in their files). Three places still hold it: the GIN
//!   indexes keep every word they ever indexed as a key, with no row pointing at it, until
//!   [`PgStore::rebuild_search_indexes`] (`REINDEX … CONCURRENTLY`) rebuilds them (6 copies
//!   before, 0 after, in that test); the write-ahead log holds every version written until
//!   its segments are recycled (after checkpoints, past `wal_keep_size`; the test found
//!   dozens in `pg_wal`); and whatever copied the WAL or the pages before the forget (WAL
//!   archives, replicas' WAL, base backups, the file system's free blocks) keeps them until
//!   it expires. A hard guarantee needs those retention windows, or encrypted storage whose
//!   key goes with the data.
//! * **TLS** is not built in: reach the server on a private network or a local socket, or
//!   through a TLS-terminating proxy.
//!
//! # Examples
//!
//! ```no_run
//! use ctxwin_std::store::postgres::PgStore;
//! use ctxwin_std::store::{ArchiveStore, ArchivedMessage, CheckpointSink, Scope};
//! use ctxwin_std::{ChatMessage, core::Role};
//!
//! let store = PgStore::open("postgres://ctxwin:secret@db.internal/ctxwin")?;
//! let scope = Scope::new("acme", "chat-7");
//! let fence = store.acquire(&scope)?; // this process now holds the conversation
//! let ask = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "deploy to staging"));
//! store.put(&scope, fence, &[ask])?;
//! store.save(&scope, fence, b"snapshot")?;
//! # Ok::<(), ctxwin_std::store::StoreError>(())
//! ```

mod checkpoints;
mod conn;
mod error;
mod escape;
mod forget;
mod group;
#[cfg(test)]
mod indexing_tests;
mod metrics;
mod port;
mod records;
mod rows;
pub mod schema;
mod search;
mod summaries;
#[doc(hidden)]
pub mod testing;
#[cfg(test)]
mod tests;
mod vectors;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::{NoTls, Row};
use r2d2_postgres::PostgresConnectionManager;

use crate::store::{Fence, Scope, StoreError};
use conn::Conn;
pub use conn::{StatementCounts, statement_counts};
use error::{Failure, Pg, get};
use escape::escape;

/// How a [`PgStore`] connects and pools.
///
/// ```
/// use ctxwin_std::store::postgres::PgOptions;
/// let options = PgOptions { max_connections: 8, ..PgOptions::default() };
/// assert_eq!(options.min_idle, 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// Most connections the store opens (at least 1).
    pub max_connections: u32,
    /// Connections kept open while idle (at most `max_connections`): 0 lets an idle process
    /// hold none.
    pub min_idle: u32,
    /// How long an unused connection above `min_idle` stays open.
    pub idle_timeout: Duration,
    /// How long a connection may live before it is replaced (a server-side failover, a
    /// pooler's restart are picked up).
    pub max_lifetime: Duration,
    /// How long to wait for a connection (a new one, or a free one of the pool).
    pub connect_timeout: Duration,
    /// How long a write waits for a lock another transaction holds (the same conversation
    /// written by another instance) before it fails as [`StoreError::Busy`].
    pub lock_timeout: Duration,
    /// Whether [`forget`](crate::store::ArchiveStore::forget) and checkpoint rewrites `VACUUM`
    /// the tables they changed, so no dead row version keeps the forgotten text.
    pub vacuum_after_forget: bool,
    /// Whether statements are prepared once per connection and kept (`true` by default):
    /// the server then parses and plans each statement once per connection instead of on
    /// every use (the connections are opened with `plan_cache_mode = force_generic_plan`
    /// and the lock timeout as startup options). Turn it off behind a transaction-mode
    /// pooler that does not keep prepared statements (PgBouncer before 1.21, or with
    /// `max_prepared_statements = 0`): every statement is then sent unnamed. With a URL,
    /// `?prepared_statements=off` ([`PgStore::open`]).
    pub prepared_statements: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 4,
            min_idle: 0,
            idle_timeout: Duration::from_secs(60),
            max_lifetime: Duration::from_secs(30 * 60),
            connect_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(10),
            vacuum_after_forget: true,
            prepared_statements: true,
        }
    }
}

type Manager = PostgresConnectionManager<NoTls>;
type Pool = r2d2::Pool<Manager>;
type Pooled = r2d2::PooledConnection<Manager>;

/// A connection's last use, kept beside it in the pool: one idle longer than [`PROBE_AFTER`]
/// is checked before use (the server or a pooler may have closed it).
struct LastUsed(Instant);

/// Idle time after which a pooled connection is checked before use.
const PROBE_AFTER: Duration = Duration::from_secs(5);

/// Both storage ports on one PostgreSQL database (its current schema): an
/// [`ArchiveStore`](crate::store::ArchiveStore) and a
/// [`CheckpointSink`](crate::store::CheckpointSink). Clones share the pool; share one
/// handle between the two ports and every session of a process.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once dropped ([`Inner::drop`]).
    pool: Option<Pool>,
    identity: String,
    /// This handle as a lease holder (`conversations.holder`): random, nonzero, drawn when
    /// the handle is opened.
    holder: i64,
    /// The server and database, without credentials, for messages.
    place: String,
    options: PgOptions,
    /// Rows of many conversations written in one statement ([`group`]).
    group: group::Group,
    /// Checkpoint sequences as last seen, for saves in one statement ([`checkpoints`]).
    checkpoints: checkpoints::Known,
    /// How far each conversation's rows are known stored ([`rows::Archived`]).
    archived: rows::Archived,
}

impl Drop for Inner {
    /// Closes the pool's connections on a thread of its own, and waits for it. The
    /// synchronous client closes a connection by blocking on a runtime of its own, which
    /// panics on a thread that runs an async runtime ("Cannot start a runtime from within a
    /// runtime"): a proxy's last handle may go with a connection task, on such a thread.
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        let closing = std::thread::Builder::new()
            .name("ctxwin-pg-close".to_string())
            .spawn(move || drop(pool));
        if closing.is_ok_and(|thread| thread.join().is_err()) {
            tracing::debug!("postgres store: closing the pool's connections failed");
        }
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("place", &self.inner.place)
            .field("identity", &self.inner.identity)
            .finish_non_exhaustive()
    }
}

/// Connections in use and idle, from [`PgStore::pool_state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    /// Connections open.
    pub connections: u32,
    /// Of which idle.
    pub idle: u32,
}

/// Bytes the store's tables take, indexes and TOAST included, from [`PgStore::sizes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableSizes {
    /// `messages`.
    pub messages: u64,
    /// `summaries`.
    pub summaries: u64,
    /// `message_vectors`.
    pub vectors: u64,
    /// `checkpoints`.
    pub checkpoints: u64,
    /// Everything else (`conversations`, `compression_events`, metadata).
    pub other: u64,
}

/// The one maintenance thread every pool of the process shares (r2d2 starts three per pool
/// otherwise).
fn maintenance() -> Arc<scheduled_thread_pool::ScheduledThreadPool> {
    static POOL: OnceLock<Arc<scheduled_thread_pool::ScheduledThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Arc::new(
            scheduled_thread_pool::ScheduledThreadPool::builder()
                .num_threads(1)
                .thread_name_pattern("ctxwin-pg-pool")
                .build(),
        )
    })
    .clone()
}

/// Connection failures the pool meets, reported through `tracing`.
#[derive(Debug)]
struct ReportErrors;

impl r2d2::HandleError<postgres::Error> for ReportErrors {
    fn handle_error(&self, error: postgres::Error) {
        tracing::warn!(%error, "postgres store: connection failed");
    }
}

impl PgStore {
    /// Opens the store at `url` (`postgres://user:password@host:port/database`, any parameter
    /// of libpq's URL form the `postgres` crate reads, e.g. `?options=-csearch_path%3Dctxwin`
    /// for a schema of its own) with [`PgOptions::default`], and migrates its schema.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a URL that does not parse, [`StoreError::Io`] when the
    /// server cannot be reached, [`StoreError::SchemaTooNew`], backend errors.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, PgOptions::default())
    }

    /// As [`open`](Self::open), with `options`.
    ///
    /// # Errors
    /// As [`open`](Self::open); [`StoreError::Invalid`] for options out of range.
    pub fn open_with(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        if options.max_connections == 0 || options.min_idle > options.max_connections {
            return Err(StoreError::invalid(format!(
                "postgres pool: max_connections {} must be at least 1 and at least min_idle {}",
                options.max_connections, options.min_idle
            )));
        }
        let (url, prepared) = take_prepared_setting(url)?;
        let mut options = options;
        if let Some(prepared) = prepared {
            options.prepared_statements = prepared;
        }
        let mut config: postgres::Config = url.parse().map_err(|error| {
            StoreError::invalid(format!("not a PostgreSQL URL ({error}); expected postgres://user:password@host:port/database"))
        })?;
        if config.get_application_name().is_none() {
            config.application_name("ctxwin");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        // A partitioned peer's connection (and the locks its transaction holds) is noticed in
        // about a minute instead of the kernel's two hours.
        config.keepalives_idle(Duration::from_secs(30));
        config.notice_callback(|notice| {
            tracing::debug!(message = notice.message(), "postgres store: notice");
        });
        if options.prepared_statements {
            // Set once per connection (not behind a transaction-mode pooler, where it would
            // not follow the transactions): what a write of rows made of one statement
            // waits for a lock at most, as a transaction's `SET LOCAL` does; and generic
            // plans for the prepared statements, which are all addressed by key: left to
            // choose, the server planned the group row write anew on every execution (its
            // custom plan, sized to the arrays, always looked cheaper), a third of its CPU
            // per fleet request.
            let timeout = format!(
                "-c lock_timeout={} -c plan_cache_mode=force_generic_plan",
                options.lock_timeout.as_millis().max(1)
            );
            let startup = match config.get_options() {
                Some(given) => format!("{given} {timeout}"),
                None => timeout,
            };
            config.options(&startup);
        }
        let place = place_of(&config);
        let pool = r2d2::Pool::builder()
            .max_size(options.max_connections)
            .min_idle(Some(options.min_idle))
            .idle_timeout(Some(options.idle_timeout))
            .max_lifetime(Some(options.max_lifetime))
            .connection_timeout(options.connect_timeout)
            .test_on_check_out(false)
            .thread_pool(maintenance())
            .error_handler(Box::new(ReportErrors))
            .build_unchecked(PostgresConnectionManager::new(config, NoTls));
        let mut conn = checkout(&pool, &place)?;
        let version = schema::migrate(&mut conn)?;
        let identity: String = get(
            &conn
                .query_typed_one("SELECT value FROM ctxwin_meta WHERE key = 'identity'", &[])
                .map_err(Failure::from)?,
            0,
        )?;
        drop(conn);
        tracing::debug!(%place, version, "postgres store: opened");
        let holder = new_holder();
        let pool = Some(pool);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                identity,
                holder,
                place,
                options,
                group: group::Group::default(),
                checkpoints: checkpoints::Known::default(),
                archived: rows::Archived::default(),
            }),
        })
    }

    /// The server and database this store is on, without credentials.
    pub fn server(&self) -> &str {
        &self.inner.place
    }

    /// Connections open and idle now.
    pub fn pool_state(&self) -> PoolState {
        let Some(pool) = &self.inner.pool else { return PoolState { connections: 0, idle: 0 } };
        let state = pool.state();
        PoolState { connections: state.connections, idle: state.idle_connections }
    }

    /// The schema version of the store (the newest migration applied).
    ///
    /// # Errors
    /// Backend errors.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.run(|client| {
            let row =
                client.query_typed_one("SELECT max(version)::int8 FROM ctxwin_migrations", &[])?;
            Ok(get::<Option<i64>>(&row, 0)?.unwrap_or(0))
        })
    }

    /// Bytes each of the store's tables takes (`pg_total_relation_size`: heap, TOAST and
    /// indexes).
    ///
    /// # Errors
    /// Backend errors.
    pub fn sizes(&self) -> Result<TableSizes, StoreError> {
        self.run(|client| {
            let rows = client.query_typed(
                "SELECT c.relname::text, pg_total_relation_size(c.oid)::int8 FROM pg_class c
                 WHERE c.relkind = 'r'
                   AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())",
                &[],
            )?;
            let mut sizes = TableSizes::default();
            for row in &rows {
                let (name, bytes): (String, i64) = (get(row, 0)?, get(row, 1)?);
                let bytes = u64::try_from(bytes).unwrap_or(0);
                match name.as_str() {
                    "messages" => sizes.messages += bytes,
                    "summaries" => sizes.summaries += bytes,
                    "message_vectors" => sizes.vectors += bytes,
                    "checkpoints" => sizes.checkpoints += bytes,
                    _ => sizes.other += bytes,
                }
            }
            Ok(sizes)
        })
    }

    /// Rebuilds the full-text indexes (`REINDEX INDEX CONCURRENTLY`: writes go on
    /// meanwhile). A GIN index keeps the key of every word it ever indexed, with no row
    /// pointing at it once the rows are gone or scrubbed: after a
    /// [`forget`](crate::store::ArchiveStore::forget) of a secret, its (lower-cased) word is
    /// still in the index's pages until they are rebuilt. It is not in a dump; this takes it
    /// off the index files too. Costs a pass over every conversation's rows.
    ///
    /// # Errors
    /// Backend errors.
    pub fn rebuild_search_indexes(&self) -> Result<(), StoreError> {
        self.run(|client| {
            // One statement per call: REINDEX CONCURRENTLY cannot run in a transaction block.
            client.batch_execute("REINDEX INDEX CONCURRENTLY messages_search")?;
            client.batch_execute("REINDEX INDEX CONCURRENTLY summaries_search")?;
            Ok(())
        })
    }

    /// Runs `work` on a pooled connection.
    fn run<T>(&self, work: impl FnOnce(&mut Conn) -> Pg<T>) -> Result<T, StoreError> {
        let pool = self.inner.pool.as_ref().ok_or_else(|| StoreError::Io {
            detail: format!("{}: the store is closed", self.inner.place),
            source: None,
        })?;
        let pooled = checkout(pool, &self.inner.place)?;
        let mut conn = Conn::new(pooled, self.inner.options.prepared_statements);
        Ok(work(&mut conn)?)
    }

    /// Runs `work` in a transaction (committed when it returns `Ok`, rolled back otherwise).
    fn transaction<T>(&self, work: impl FnOnce(&mut Tx<'_>) -> Pg<T>) -> Result<T, StoreError> {
        let (lock_timeout, holder) = (self.inner.options.lock_timeout, self.inner.holder);
        self.run(|client| {
            let mut tx = Tx::begin(client, lock_timeout, holder)?;
            let out = work(&mut tx)?;
            tx.commit()?;
            Ok(out)
        })
    }

    /// `VACUUM`s `tables` when the options ask for it (after forgetting).
    fn vacuum(&self, tables: &str) -> Result<(), StoreError> {
        if !self.inner.options.vacuum_after_forget {
            return Ok(());
        }
        self.run(|client| Ok(client.batch_execute(&format!("VACUUM {tables}"))?))
    }
}

/// A connection of `pool`, checked first when it has been idle a while.
fn checkout(pool: &Pool, place: &str) -> Result<Pooled, StoreError> {
    for _ in 0..=pool.max_size() {
        let mut conn = pool.get().map_err(|error| error::map_pool(&format!("{place}: {error}")))?;
        let idle = r2d2::PooledConnection::extensions(&conn)
            .get::<LastUsed>()
            .is_some_and(|used| used.0.elapsed() > PROBE_AFTER);
        // A connection the server or a pooler closed while it was idle fails its first
        // statement: found here, it is dropped (the pool sees it closed) instead of failing
        // the caller's work.
        if idle && conn.simple_query("").is_err() {
            continue;
        }
        r2d2::PooledConnection::extensions_mut(&mut conn).insert(LastUsed(Instant::now()));
        return Ok(conn);
    }
    Err(StoreError::Io {
        detail: format!("{place}: every pooled connection was closed"),
        source: None,
    })
}

/// `url` without its `prepared_statements=on|off` parameter (ctxwin's, not libpq's), and
/// that parameter's value.
fn take_prepared_setting(url: &str) -> Result<(String, Option<bool>), StoreError> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_string(), None)) };
    let mut setting = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("prepared_statements", value)) => {
                setting = Some(match value {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => {
                        return Err(StoreError::invalid(format!(
                            "prepared_statements={value} in the PostgreSQL URL: expected on or off"
                        )));
                    }
                });
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, setting))
}

/// `config`'s hosts, ports and database, for messages (never its user or password).
fn place_of(config: &postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
            #[cfg(unix)]
            postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
        })
        .collect();
    format!("postgres://{}/{}", hosts.join(","), config.get_dbname().unwrap_or(""))
}

/// A random, nonzero number naming a store handle as a lease holder: the process's hash
/// keys (random), its id, the handles opened before in it and the time, hashed.
fn new_holder() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(OPENED.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(now.map_or(0, |elapsed| elapsed.as_nanos()));
    i64::try_from(hasher.finish() >> 1).unwrap_or(i64::MAX).max(1)
}

/// A transaction on a pooled connection: `BEGIN` and its `SET LOCAL`s in one round trip,
/// rolled back when dropped uncommitted. Its fenced writes are this handle's: `holder`.
struct Tx<'a> {
    client: &'a mut Conn,
    open: bool,
    holder: i64,
}

impl<'a> Tx<'a> {
    fn begin(client: &'a mut Conn, lock_timeout: Duration, holder: i64) -> Pg<Self> {
        conn::note_transaction();
        client.batch_execute(&format!(
            "BEGIN; SET LOCAL lock_timeout = {}",
            lock_timeout.as_millis().max(1)
        ))?;
        client.in_transaction = true;
        Ok(Self { client, open: true, holder })
    }

    fn commit(mut self) -> Pg<()> {
        self.open = false;
        self.client.in_transaction = false;
        Ok(self.client.batch_execute("COMMIT")?)
    }

    /// Runs `sql` (sent unnamed, with its parameters' types) and returns its rows.
    fn query(&mut self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Pg<Vec<Row>> {
        Ok(self.client.query_typed(sql, params)?)
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        self.client.in_transaction = false;
        if self.open && self.client.batch_execute("ROLLBACK").is_err() {
            tracing::debug!("postgres store: rollback failed (the connection is gone)");
        }
    }
}

/// The `conversations` row of `scope` inside `tx`, locked until the transaction ends, after
/// checking `fence` against the newest handed out and its holder. Created on a scope's
/// first write when `create`; `None` when it does not exist and is not to be created.
fn lock_scope(tx: &mut Tx<'_>, scope: &Scope, fence: Fence, create: bool) -> Pg<Option<i64>> {
    let (tenant, name) = (escape(&scope.tenant), escape(&scope.conversation));
    for attempt in 0..2 {
        let found = tx.query(
            "SELECT id, fence, holder FROM conversations WHERE tenant = $1 AND name = $2
             FOR NO KEY UPDATE",
            &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
        )?;
        if let Some(row) = found.first() {
            let (id, current, holder): (i64, i64, i64) = (get(row, 0)?, get(row, 1)?, get(row, 2)?);
            check_fence(scope, fence, current, holder == tx.holder)?;
            return Ok(Some(id));
        }
        if !create || attempt > 0 {
            break;
        }
        tx.query(
            "INSERT INTO conversations (tenant, name) VALUES ($1, $2)
             ON CONFLICT (tenant, name) DO NOTHING",
            &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
        )?;
    }
    if create {
        return Err(Failure(StoreError::Backend {
            detail: format!("conversation {scope} vanished while it was created"),
        }));
    }
    Ok(None)
}

/// Refuses `fence` for a conversation whose lease was taken (`current`, its newest fence,
/// is not 0) unless it is that newest fence and this handle took it (`own`): an older one
/// is a stale holder's; the newest number taken by another handle, one a server crash let
/// be handed out twice; a newer one than the newest, one whose lease the crash lost (see
/// [`PgStore::raise_fence`]). A conversation nobody leased takes any fence (a session
/// writing a side conversation of its own, as a rewind's, writes it with its lease's).
fn check_fence(scope: &Scope, fence: Fence, current: i64, own: bool) -> Pg<()> {
    let current = Fence(u64::try_from(current).unwrap_or(0));
    if !fence.is_none() && !current.is_none() && (fence != current || !own) {
        return Err(Failure(StoreError::Fenced { scope: scope.clone(), fence, current }));
    }
    Ok(())
}

/// `text` (escaped: no U+0000) as an SQL string literal, in escape-string syntax so that it
/// reads the same whatever the server's `standard_conforming_strings`.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

impl PgStore {
    /// Raises `scope`'s fence, names this handle its holder and returns it (the row is
    /// created on its first lease); with `held`, only when the newest fence is not `held`
    /// taken by this handle (`None` otherwise: nothing changes). The conversation's
    /// checkpoint sequence as of the raise (the row as locked, after any write in flight
    /// committed) is noted for the reads of the newest checkpoint that follow
    /// ([`checkpoints`]: one of them is answered without a query when this handle read or
    /// saved that checkpoint). One round trip: when the
    /// store prepares statements, one prepared statement ([`RAISE`], [`RAISE_IF_OVERTAKEN`]);
    /// otherwise the transaction, its settings, the statement and the commit go as one simple
    /// query, the scope's names as literals. Either waits for a write of the conversation in
    /// flight, at most the lock timeout.
    ///
    /// **The commit does not wait for the disk** (`synchronous_commit = off`): a durable
    /// commit waits for a flush of the write-ahead log, the largest part of a takeover on a
    /// busy server. What a server crash can lose, then, is the newest raises (WAL not yet
    /// flushed: at most three `wal_writer_delay`s old), never one a write under it
    /// followed: every fenced write commits durably, and flushing its commit flushes the
    /// log before it, the raise included. A raise lost is therefore one nobody wrote under:
    /// the database is as if that lease was never taken, and its previous holder may write
    /// on (what the conversation holds is its). Two hazards remain, and the holder closes
    /// both, since a write is taken only with the newest fence *and* from the handle that
    /// took it ([`check_fence`]):
    ///
    /// 1. The crash rolled the fence back from `n` to `n − 1` while the instance that took
    ///    `n` still holds it: its writes carry a fence newer than the newest and are
    ///    refused; its next [`acquire_if_overtaken`](crate::store::ArchiveStore::acquire_if_overtaken)
    ///    (the fence is not its `n` of its own) takes the lease again and reloads.
    /// 2. After the crash the same `n` is handed out again, to another instance: the fence
    ///    numbers are equal, the holders are not, so the first instance's writes are
    ///    refused and its next `acquire_if_overtaken` finds itself overtaken and reloads —
    ///    two writers on one fence never both write.
    ///
    /// Sessions on one handle (one process) are told apart by the fence alone: two sessions
    /// of one conversation on one handle could share a fence after such a crash (the proxy
    /// serves a conversation with one session per process). A failover to an asynchronous
    /// standby can lose durable commits too, and is beyond any fence.
    fn raise_fence(&self, scope: &Scope, held: Option<Fence>) -> Result<Option<Fence>, StoreError> {
        if self.inner.options.prepared_statements {
            return self.raise_fence_prepared(scope, held);
        }
        let (tenant, name) =
            (literal(&escape(&scope.tenant)), literal(&escape(&scope.conversation)));
        let holder = self.inner.holder;
        let statement = match held {
            None => format!(
                "INSERT INTO conversations (tenant, name, fence, holder)
                 VALUES ({tenant}, {name}, 1, {holder})
                 ON CONFLICT (tenant, name) DO UPDATE
                 SET fence = conversations.fence + 1, holder = {holder}
                 RETURNING fence, checkpoint_seq"
            ),
            Some(held) => format!(
                "UPDATE conversations SET fence = fence + 1, holder = {holder}
                 WHERE tenant = {tenant} AND name = {name}
                   AND (fence <> {} OR holder <> {holder})
                 RETURNING fence, checkpoint_seq",
                i64::try_from(held.0).unwrap_or(i64::MAX)
            ),
        };
        let timeout = self.inner.options.lock_timeout.as_millis().max(1);
        let sql = format!(
            "BEGIN; SET LOCAL lock_timeout = {timeout}; SET LOCAL synchronous_commit = off; \
             {statement}; COMMIT"
        );
        self.run(|client| {
            conn::note_transaction();
            let messages = match client.simple_query(&sql) {
                Ok(messages) => messages,
                Err(error) => {
                    // The transaction the query began stays open, failed: closed before the
                    // connection goes back to the pool.
                    if client.batch_execute("ROLLBACK").is_err() {
                        tracing::debug!("postgres store: rollback failed (the connection is gone)");
                    }
                    return Err(error.into());
                }
            };
            let Some(row) = messages.iter().find_map(|message| match message {
                postgres::SimpleQueryMessage::Row(row) => Some(row),
                _ => None,
            }) else {
                return Ok(None);
            };
            let number = |at: usize| -> Pg<i64> {
                let value = row.get(at).unwrap_or_default();
                value.parse().map_err(|_| {
                    Failure(StoreError::Backend { detail: format!("{value:?} returned") })
                })
            };
            let fence = Fence(error::from_sql_int("fence", number(0)?)?);
            self.inner.checkpoints.raised(scope, number(1)?);
            self.inner.archived.forget(scope);
            Ok(Some(fence))
        })
    }
}

/// [`PgStore::raise_fence`] with `held`, as one statement (kept prepared): the
/// conversation's fence raised and this handle (`$3`) named its holder, unless the newest
/// fence is `$4` taken by this handle. `synchronous_commit` is set off for the statement's
/// own transaction (`set_config(…, true)`), as the simple-query form's `SET LOCAL` does: the
/// setting is read when the transaction commits, after the statement ran. A check that
/// raises nothing writes nothing and commits without a flush either way.
const RAISE_IF_OVERTAKEN: &str = "
WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE conversations SET fence = fence + 1, holder = $3
WHERE tenant = $1 AND name = $2 AND (fence <> $4 OR holder <> $3)
  AND EXISTS (SELECT FROM unflushed)
RETURNING fence, checkpoint_seq";

/// [`PgStore::raise_fence`] without `held`, as one statement (kept prepared): the
/// conversation's row created with fence 1 on its first lease, its fence raised otherwise,
/// this handle (`$3`) named its holder; `synchronous_commit` off as in
/// [`RAISE_IF_OVERTAKEN`].
const RAISE: &str = "
WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO conversations (tenant, name, fence, holder)
SELECT $1, $2, 1, $3 FROM unflushed
ON CONFLICT (tenant, name) DO UPDATE SET fence = conversations.fence + 1, holder = $3
RETURNING fence, checkpoint_seq";

impl PgStore {
    /// [`raise_fence`](Self::raise_fence) on a connection whose lock timeout was set when it
    /// opened (the store prepares statements): one prepared statement, its own transaction.
    fn raise_fence_prepared(
        &self,
        scope: &Scope,
        held: Option<Fence>,
    ) -> Result<Option<Fence>, StoreError> {
        let (tenant, name) = escape::scope_params(scope);
        let holder = self.inner.holder;
        self.run(|client| {
            let rows = match held {
                None => client.query_typed(
                    RAISE,
                    &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&holder, Type::INT8)],
                )?,
                Some(held) => {
                    let held = i64::try_from(held.0).unwrap_or(i64::MAX);
                    client.query_typed(
                        RAISE_IF_OVERTAKEN,
                        &[
                            (&tenant, Type::TEXT),
                            (&name, Type::TEXT),
                            (&holder, Type::INT8),
                            (&held, Type::INT8),
                        ],
                    )?
                }
            };
            let Some(row) = rows.first() else { return Ok(None) };
            let fence = Fence(error::from_sql_int("fence", get::<i64>(row, 0)?)?);
            self.inner.checkpoints.raised(scope, get(row, 1)?);
            // Another handle may have deleted rows while it held the lease.
            self.inner.archived.forget(scope);
            Ok(Some(fence))
        })
    }
}

/// The name of row `id` of `scope` in errors.
fn row_name(scope: &Scope, id: u64) -> String {
    format!("message {id} of conversation {:?}", scope.to_string())
}

/// `limit` for SQL.
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}
