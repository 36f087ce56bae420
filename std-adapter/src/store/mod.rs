//! Storage as ports: what a session keeps, behind object-safe traits, with adapters and
//! wrappers stacked on them.
//!
//! * [`ArchiveStore`]: every message a session pushed (full text, the client's raw JSON),
//!   summaries with their sources, vectors, compression events; read back by id, by
//!   full-text search (normalised scores), from a summary down to its sources.
//! * [`CheckpointSink`]: opaque snapshot bytes of a conversation, crash-safe, newest first.
//! * [`RecordStore`]: keyed records of a tenant's namespace, under the caller's own keys,
//!   listed in key order and filtered on JSON fields (the Python package's LangGraph
//!   checkpoint saver keeps LangGraph's checkpoints there; see [`records`]).
//!
//! Every call names a [`Scope`] (tenant and conversation) and adapters put it into the query
//! or key; every write carries a [`Fence`]; every stored row and checkpoint carries a
//! [checksum] verified on every read (damage is [`StoreError::Damaged`], never text served).
//! [`StoreError`] is the one error type: no backend's type appears in a signature here.
//!
//! **Adapters:** [`sqlite::SqliteArchive`] (an SQLite file, archive and records; cargo
//! feature `sqlite`, on by default), [`CheckpointDir`] (a directory of framed files),
//! [`MemoryStore`] (archive and checkpoints in memory: tests, short runs, a model of the
//! contract), [`MemoryRecords`] (records in memory), and `postgres::PgStore` (all three on
//! PostgreSQL; feature `postgres`).
//!
//! **Wrappers** implement the same trait around an inner one, and stack:
//! [`Batched`] (writes held until a read or [`flush`](ArchiveStore::flush)),
//! [`Deferred`] (writes queued to a background thread that writes many conversations' rows
//! per transaction), [`Retrying`] (retries what a busy store refused), [`Faulty`] (fault
//! injection for tests).
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, MemoryStore, Scope, SearchQuery};
//! use ctxwin_std::{ChatMessage, core::Role};
//!
//! let store: Arc<dyn ArchiveStore> = Arc::new(MemoryStore::new());
//! let scope = Scope::local("s1");
//! let ask = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "why does the lexer panic?"));
//! store.put(&scope, Fence::NONE, &[ask])?;
//! let hits = store.search(&scope, &SearchQuery::new("lexer", 5))?;
//! assert_eq!((hits[0].id, hits[0].score), (1, 1.0));
//! assert!(store.search(&Scope::new("other-tenant", "s1"), &SearchQuery::new("lexer", 5))?.is_empty());
//! # Ok::<(), ctxwin_std::store::StoreError>(())
//! ```

mod batched;
pub mod checkpoint;
pub mod checksum;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod deferred;
mod dir;
mod error;
mod faulty;
mod memory;
mod open;
mod port;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod records;
mod retrying;
mod scope;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod text;
mod types;

pub use batched::Batched;
pub use checkpoint::{CheckpointId, CheckpointInfo, CheckpointStatus, Loaded, SkipReason, Skipped};
pub use deferred::{Deferred, DeferredOptions, DeferredStats};
pub use dir::{CheckpointDir, STALE_TEMP_AGE};
pub use error::{ErrorKind, StoreError};
pub use faulty::{Faults, Faulty};
pub use memory::MemoryStore;
pub use open::{
    Deleted, Location, Ports, STORE_URL_VAR, open, open_bound, open_checkpoints, open_records,
};
pub use port::{ArchiveStore, CheckpointSink, PendingOp, PendingWrite, Unwritten, Write, WriteOp};
pub use records::{MemoryRecords, Record, RecordQuery, RecordStore, RecordWrite};
pub use retrying::Retrying;
pub use scope::{Fence, Scope};
pub use text::{BM25_B, BM25_K1};
pub use types::{
    ArchivedMessage, CompressionRecord, FORGOTTEN, Forget, Forgotten, MetricsSummary, SearchHit,
    SearchQuery, StrategyMetrics, SummaryHit, SummaryRecord, Usage, VectorRow,
};

/// The archive port on the SQLite file at `path`, created (with its schema and identity) if
/// missing: how a state directory opens its `archive.db` without naming the adapter.
///
/// # Errors
/// As [`SqliteArchive::open`](sqlite::SqliteArchive::open).
///
/// ```
/// use ctxwin_std::store::{Scope, open_archive};
/// let dir = tempfile::tempdir()?;
/// let archive = open_archive(dir.path().join("archive.db"))?;
/// assert_eq!(archive.usage(&Scope::local("main"))?.messages, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "sqlite")]
pub fn open_archive(
    path: impl AsRef<std::path::Path>,
) -> Result<std::sync::Arc<dyn ArchiveStore>, StoreError> {
    Ok(std::sync::Arc::new(sqlite::SqliteArchive::open(path)?))
}

/// 128 random bits as hex, from the standard library's randomly seeded hasher: a new store's
/// identity.
pub(crate) fn new_identity() -> String {
    use std::hash::{BuildHasher, Hasher};
    let half = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.write_u32(std::process::id());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        hasher.write_u128(now.map_or(0, |elapsed| elapsed.as_nanos()));
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}
