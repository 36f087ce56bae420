//! The two ports: [`ArchiveStore`] and [`CheckpointSink`], and the [`Write`]s an archive takes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use super::checkpoint::{CheckpointId, CheckpointInfo, Loaded, SkipReason, Skipped};
use super::types::{
    ArchivedMessage, CompressionRecord, Forget, Forgotten, MetricsSummary, SearchHit, SearchQuery,
    SummaryHit, SummaryRecord, Usage, VectorRow,
};
use super::{Fence, Scope, StoreError};

/// One write of an [`ArchiveStore::write`] batch, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct Write<'a> {
    /// Whose it is.
    pub scope: &'a Scope,
    /// The writer's fence for the scope ([`Fence::NONE`] unfenced).
    pub fence: Fence,
    /// What to write.
    pub op: WriteOp<'a>,
}

/// What a [`Write`] writes.
#[derive(Clone, Copy, Debug)]
pub enum WriteOp<'a> {
    /// Message rows, upserted by id in this order (a row put again replaces the stored one).
    Rows(&'a [ArchivedMessage]),
    /// A summary and its sources, upserted by id.
    Summary(&'a SummaryRecord),
    /// A compression event, appended.
    Compression(&'a CompressionRecord),
}

/// An owned [`Write`]: what a queue holds until it writes ([`Deferred`](super::Deferred),
/// [`Batched`](super::Batched), a session's journal).
///
/// ```
/// use ctxwin_std::store::{ArchivedMessage, Fence, PendingOp, PendingWrite, Scope, WriteOp};
/// use ctxwin_std::{ChatMessage, core::Role};
/// let row = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"));
/// let pending = PendingWrite { scope: Scope::local("s"), fence: Fence::NONE, op: PendingOp::Rows(vec![row]) };
/// assert!(matches!(pending.as_write().op, WriteOp::Rows(rows) if rows.len() == 1));
/// assert_eq!(pending.rows(), 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PendingWrite {
    /// Whose it is.
    pub scope: Scope,
    /// The writer's fence.
    pub fence: Fence,
    /// What to write.
    pub op: PendingOp,
}

/// What a [`PendingWrite`] writes.
#[derive(Clone, Debug, PartialEq)]
pub enum PendingOp {
    /// Message rows.
    Rows(Vec<ArchivedMessage>),
    /// A summary.
    Summary(SummaryRecord),
    /// A compression event.
    Compression(CompressionRecord),
}

impl PendingWrite {
    /// Borrowed, for [`ArchiveStore::write`].
    pub fn as_write(&self) -> Write<'_> {
        let op = match &self.op {
            PendingOp::Rows(rows) => WriteOp::Rows(rows),
            PendingOp::Summary(summary) => WriteOp::Summary(summary),
            PendingOp::Compression(record) => WriteOp::Compression(record),
        };
        Write { scope: &self.scope, fence: self.fence, op }
    }

    /// Message rows it holds (0 for a summary or an event).
    pub fn rows(&self) -> usize {
        match &self.op {
            PendingOp::Rows(rows) => rows.len(),
            _ => 0,
        }
    }
}

impl Write<'_> {
    /// Owned, for a queue.
    pub fn to_pending(&self) -> PendingWrite {
        let op = match self.op {
            WriteOp::Rows(rows) => PendingOp::Rows(rows.to_vec()),
            WriteOp::Summary(summary) => PendingOp::Summary(summary.clone()),
            WriteOp::Compression(record) => PendingOp::Compression(record.clone()),
        };
        PendingWrite { scope: self.scope.clone(), fence: self.fence, op }
    }
}

/// Writes a store did not take ([`ArchiveStore::write_owned`]): the error, and the writes
/// handed back, in order.
#[derive(Debug)]
pub struct Unwritten {
    /// Why.
    pub error: StoreError,
    /// The writes not taken, in order (all of them, unless a wrapper queued some first).
    pub writes: Vec<PendingWrite>,
}

/// The archive port: every message a session pushed (with its full text), the summaries made
/// of them, vectors, compression events; found again by id, by search, from a summary down to
/// its sources. Object-safe: callers hold an `Arc<dyn ArchiveStore>` and never name an
/// adapter. Adapters: [`SqliteArchive`](super::sqlite::SqliteArchive) (a file),
/// [`MemoryStore`](super::MemoryStore); wrappers stack on any of them
/// ([`Batched`](super::Batched), [`Deferred`](super::Deferred),
/// [`Retrying`](super::Retrying), [`Faulty`](super::Faulty)).
///
/// **The contract every adapter keeps** (checked by one conformance suite,
/// `store::conformance`, that every adapter and wrapper passes):
///
/// * **Scoped.** Every call names its [`Scope`] and the adapter puts it into the query or
///   key: another scope's rows are never returned, counted or ranked in.
/// * **Writes are all or nothing, in order.** [`write`](Self::write) applies its batch in
///   one transaction; on error nothing of it was written. Rows are upserts by id.
/// * **What SQL stores.** Ids, units and timestamps above `i64::MAX` are refused
///   ([`StoreError::Invalid`]) by every adapter.
/// * **Verified reads.** Every row, summary and vector carries a [checksum](super::checksum)
///   of its values and scope, verified on every read: damage is [`StoreError::Damaged`]
///   naming what, never text served.
/// * **Normalised search scores** in `(0, 1]`, best hit `1.0` ([`SearchHit::score`]).
/// * **Fenced writes.** Adapters with leases refuse a write whose [`Fence`] is older than the
///   newest [`acquire`](Self::acquire)d ([`StoreError::Fenced`]); the others accept any.
/// * **Durable on `Ok`** unless a wrapper says otherwise: [`flush`](Self::flush) waits for
///   what a wrapper holds.
pub trait ArchiveStore: Send + Sync + fmt::Debug {
    /// Applies `writes` in order, in one transaction: all or nothing.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a value the store cannot take (nothing written),
    /// [`StoreError::Fenced`], backend errors.
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError>;

    /// [`write`](Self::write), taking the writes by value: a wrapper that keeps them (in a
    /// queue, in memory) takes them without copying. On error the writes it did not take
    /// come back, in order.
    ///
    /// # Errors
    /// As [`write`](Self::write), with the writes not taken.
    fn write_owned(&self, writes: Vec<PendingWrite>) -> Result<(), Unwritten> {
        let borrowed: Vec<Write<'_>> = writes.iter().map(PendingWrite::as_write).collect();
        let written = self.write(&borrowed);
        drop(borrowed);
        written.map_err(|error| Unwritten { error, writes })
    }

    /// Upserts `rows` of `scope` by id, in order, all or nothing.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn put(&self, scope: &Scope, fence: Fence, rows: &[ArchivedMessage]) -> Result<(), StoreError> {
        self.write(&[Write { scope, fence, op: WriteOp::Rows(rows) }])
    }

    /// Upserts a summary of `scope` and its sources.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn put_summary(
        &self,
        scope: &Scope,
        fence: Fence,
        summary: &SummaryRecord,
    ) -> Result<(), StoreError> {
        self.write(&[Write { scope, fence, op: WriteOp::Summary(summary) }])
    }

    /// Records a compression event of `scope`.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn record_compression(
        &self,
        scope: &Scope,
        fence: Fence,
        record: &CompressionRecord,
    ) -> Result<(), StoreError> {
        self.write(&[Write { scope, fence, op: WriteOp::Compression(record) }])
    }

    /// The rows `ids` of `scope` that are stored, in id order, each once.
    ///
    /// # Errors
    /// [`StoreError::Damaged`] for a row that fails its checksum; backend errors.
    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError>;

    /// Row `id` of `scope`, if stored.
    ///
    /// # Errors
    /// As [`get_many`](Self::get_many).
    fn get(&self, scope: &Scope, id: u64) -> Result<Option<ArchivedMessage>, StoreError> {
        Ok(self.get_many(scope, &[id])?.into_iter().find(|row| row.id == id))
    }

    /// Rows of `scope` with ids above `after`, ascending, at most `limit`: how a reader pages
    /// through a conversation (a reload, a recovery, rows copied aside).
    ///
    /// # Errors
    /// As [`get_many`](Self::get_many).
    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError>;

    /// The highest message id stored for `scope`.
    ///
    /// # Errors
    /// Backend errors.
    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError>;

    /// `wanted`, or the highest message id stored for `scope` when it is lower (0 without
    /// any): how far the stored rows reach towards `wanted`. A store may answer without
    /// asking its backend when it knows rows through `wanted` are stored (PostgreSQL: the
    /// rows this handle wrote or read).
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, MemoryStore, Scope};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = MemoryStore::new();
    /// let scope = Scope::local("chat");
    /// assert_eq!(store.archived_through(&scope, 2)?, 0);
    /// store.put(&scope, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// assert_eq!(store.archived_through(&scope, 2)?, 1);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// Backend errors.
    fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
        Ok(self.max_id(scope)?.unwrap_or(0).min(wanted))
    }

    /// Messages of `scope` whose content, tool calls or original text match the words of
    /// `query`, best first, scores normalised ([`SearchHit::score`]).
    ///
    /// # Errors
    /// [`StoreError::Damaged`] for a hit that fails its checksum; backend errors. No query
    /// text makes it fail.
    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError>;

    /// [`search`](Self::search) for a reader that holds some of the scope's messages itself
    /// (`held(id)`: the messages in its window), and never wants them found. A store that
    /// writes later ([`Deferred`](super::Deferred)) answers without waiting for writes of held
    /// messages only; every message not held is searched as [`search`](Self::search) would.
    ///
    /// # Errors
    /// As [`search`](Self::search).
    fn search_beyond(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
        held: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let _ = held;
        self.search(scope, query)
    }

    /// Summary `id` of `scope`, if stored.
    ///
    /// # Errors
    /// [`StoreError::Damaged`]; backend errors.
    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError>;

    /// Summaries of `scope` whose text matches `query`, best first, scores normalised.
    ///
    /// # Errors
    /// As [`search`](Self::search).
    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError>;

    /// The rows summary `id` of `scope` stands for, in id order, each once: a source that is
    /// no row but another summary is expanded in turn (a level-2 summary drills down to the
    /// messages under its level-1 summaries); sources not stored are skipped.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when there is no such summary; as [`get_many`](Self::get_many).
    fn drill_down(&self, scope: &Scope, id: u64) -> Result<Vec<ArchivedMessage>, StoreError> {
        let root = self.summary(scope, id)?.ok_or_else(|| StoreError::NotFound {
            what: format!("summary {id} of conversation {scope}"),
        })?;
        let mut expanded = BTreeSet::from([id]);
        let mut found: BTreeMap<u64, ArchivedMessage> = BTreeMap::new();
        let mut pending: Vec<u64> = root.source_ids;
        while !pending.is_empty() {
            pending.retain(|source| !found.contains_key(source) && !expanded.contains(source));
            let rows = self.get_many(scope, &pending)?;
            let mut next = Vec::new();
            for source in pending.drain(..) {
                if let Some(row) = rows.iter().find(|row| row.id == source) {
                    found.insert(source, row.clone());
                } else if expanded.insert(source)
                    && let Some(child) = self.summary(scope, source)?
                {
                    next.extend(child.source_ids);
                }
            }
            pending = next;
        }
        Ok(found.into_values().collect())
    }

    /// Caches `vectors` (message id, vector) of `scope` for `model`, replacing older ones;
    /// ids with no stored row are skipped. A later change of a row's content drops its
    /// vectors (they described the old text).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError>;

    /// Rows of `scope` with ids above `after`, in id order, each with its cached vector for
    /// `model` when there is one: what an embedding index loads, and what it still has to
    /// embed.
    ///
    /// # Errors
    /// As [`get_many`](Self::get_many).
    fn vectors(&self, scope: &Scope, model: &str, after: u64)
    -> Result<Vec<VectorRow>, StoreError>;

    /// Totals of the compression events of `scope`.
    ///
    /// # Errors
    /// Backend errors.
    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError>;

    /// What `scope` holds, and the whole store's size when the adapter can tell.
    ///
    /// # Errors
    /// Backend errors.
    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError>;

    /// Forgets, in `scope`, rows `what.ids` (their text becomes
    /// [`FORGOTTEN`](super::FORGOTTEN); the rows stay) and every occurrence of each of
    /// `what.texts` in rows (content, tool calls, original, raw JSON) and summaries; indexes
    /// and vectors of touched rows follow. No byte of forgotten text stays on the
    /// medium (an adapter rewrites what deleted data could linger in).
    ///
    /// # Errors
    /// As [`write`](Self::write); nothing changes then.
    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError>;

    /// Deletes the rows and summaries of `scope` with ids from `first` on (a conversation
    /// rewound to a checkpoint, after copying them aside); how many rows went.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError>;

    /// Deletes everything of `scope` (prune); how many rows went.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError>;

    /// The conversations of `tenant` whose names start with `prefix`, sorted.
    ///
    /// # Errors
    /// Backend errors.
    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError>;

    /// The store's identity: written once when it was created, so a checkpoint can tell its
    /// own archive from a swapped or recreated one.
    ///
    /// # Errors
    /// [`StoreError::Damaged`] when it is missing.
    fn identity(&self) -> Result<String, StoreError>;

    /// Takes (or renews) the write lease of `scope`: the fence to write it with. Adapters
    /// without leases return [`Fence::NONE`].
    ///
    /// # Errors
    /// Backend errors.
    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        let _ = scope;
        Ok(Fence::NONE)
    }

    /// The newest fence handed out for `scope`, without taking the lease: a holder whose
    /// fence is older has been overtaken (reads it before deciding on state that may be
    /// stale). [`Fence::NONE`] from adapters without leases, and for a scope never leased.
    ///
    /// # Errors
    /// Backend errors.
    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        let _ = scope;
        Ok(Fence::NONE)
    }

    /// Takes the write lease of `scope` when a fence newer than `held` was handed out since
    /// (another process took the conversation): the new fence; `None` when `held` is still
    /// the newest, and nothing is taken. What a holder does before each unit of work: one
    /// round trip where the adapter can (PostgreSQL), [`current_fence`](Self::current_fence)
    /// then [`acquire`](Self::acquire) by default.
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Scope};
    /// let store = MemoryStore::new();
    /// let scope = Scope::local("chat");
    /// let held = store.acquire(&scope)?;
    /// assert_eq!(store.acquire_if_overtaken(&scope, held)?, None);
    /// let other = store.acquire(&scope)?; // another process takes the conversation
    /// let taken = store.acquire_if_overtaken(&scope, held)?.unwrap();
    /// assert!(taken > other);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// Backend errors.
    fn acquire_if_overtaken(
        &self,
        scope: &Scope,
        held: Fence,
    ) -> Result<Option<Fence>, StoreError> {
        if self.current_fence(scope)? > held {
            return self.acquire(scope).map(Some);
        }
        Ok(None)
    }

    /// Waits until every write of `scope` handed over so far is durable (wrappers that hold
    /// or queue writes); nothing to do for adapters that commit in [`write`](Self::write).
    ///
    /// # Errors
    /// The failure of a held write (it stays held and is retried).
    fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
        let _ = scope;
        Ok(())
    }
}

/// The checkpoint port: opaque snapshot bytes of a conversation, kept crash-safe. Adapters:
/// [`CheckpointDir`](super::CheckpointDir) (files), [`MemoryStore`](super::MemoryStore).
///
/// **The contract** (checked by the conformance suite): a save is atomic (a crash leaves the
/// new checkpoint whole or absent) and durable on `Ok`; every checkpoint carries a checksum
/// verified on every load (damage is reported, never returned as bytes); "newest" is the
/// order saves happened in, whatever a clock said; another scope's checkpoints are never
/// listed or loaded.
pub trait CheckpointSink: Send + Sync + fmt::Debug {
    /// Saves `payload` as the newest checkpoint of `scope`.
    ///
    /// # Errors
    /// [`StoreError::Fenced`]; I/O errors (nothing was saved).
    fn save(&self, scope: &Scope, fence: Fence, payload: &[u8])
    -> Result<CheckpointId, StoreError>;

    /// Ids of `scope`'s checkpoints, newest first, without reading them.
    ///
    /// # Errors
    /// I/O errors.
    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError>;

    /// The id of `scope`'s newest checkpoint (the first of [`ids`](Self::ids)), without
    /// reading it; `None` when it has none. A store may answer it without asking its
    /// backend when it knows no save happened since it last saw it (PostgreSQL, right after
    /// a lease taken).
    ///
    /// ```
    /// use ctxwin_std::store::{CheckpointSink, Fence, MemoryStore, Scope};
    /// let store = MemoryStore::new();
    /// let scope = Scope::local("chat");
    /// assert_eq!(store.newest_id(&scope)?, None);
    /// let id = store.save(&scope, Fence::NONE, b"snapshot")?;
    /// assert_eq!(store.newest_id(&scope)?, Some(id));
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// I/O errors.
    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        Ok(self.ids(scope)?.into_iter().next())
    }

    /// Checkpoint `id`'s payload, verified.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; [`StoreError::Damaged`] naming the checkpoint; I/O errors.
    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError>;

    /// Every checkpoint of `scope`, newest first, each read and verified.
    ///
    /// # Errors
    /// I/O errors.
    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError>;

    /// Deletes all but the newest `keep` checkpoints of `scope` (intact or not); the ids
    /// deleted.
    ///
    /// # Errors
    /// [`StoreError::Fenced`]; I/O errors.
    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError>;

    /// [`save`](Self::save)s `payload`, then [`prune`](Self::prune)s to the newest `keep`
    /// (the new one among them); an adapter may do both in one transaction (PostgreSQL).
    /// The new checkpoint's id, with what the prune did: the checkpoint is saved even when
    /// the prune failed.
    ///
    /// ```
    /// use ctxwin_std::store::{CheckpointSink, Fence, MemoryStore, Scope};
    /// let store = MemoryStore::new();
    /// let scope = Scope::local("chat");
    /// let first = store.save(&scope, Fence::NONE, b"one")?;
    /// let (second, pruned) = store.save_and_prune(&scope, Fence::NONE, b"two", 1)?;
    /// assert_eq!(pruned?, vec![first]);
    /// assert_eq!(store.ids(&scope)?, vec![second]);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// As [`save`](Self::save) (nothing was saved).
    #[allow(clippy::type_complexity)]
    fn save_and_prune(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: usize,
    ) -> Result<(CheckpointId, Result<Vec<CheckpointId>, StoreError>), StoreError> {
        let id = self.save(scope, fence, payload)?;
        Ok((id, self.prune(scope, fence, keep)))
    }

    /// Rewrites every checkpoint of `scope` through `mask` (forgetting text): `mask` gets a
    /// checkpoint's bytes (the payload of an intact one, everything stored of a damaged one,
    /// which may hold the text too) and returns the new bytes, or `None` to leave it. The
    /// rewrite is atomic per checkpoint and keeps its place in the order. Returns how many
    /// were rewritten.
    ///
    /// # Errors
    /// [`StoreError::Fenced`]; I/O errors.
    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError>;

    /// The newest checkpoint of `scope` that is intact and that `accept` takes; newer ones
    /// are passed over and reported in [`Loaded::skipped`] (logged too), never deleted.
    /// `None` when `scope` has no checkpoint.
    ///
    /// # Errors
    /// [`StoreError::NoUsableCheckpoint`] when checkpoints exist and none is usable; I/O
    /// errors.
    fn load_latest(
        &self,
        scope: &Scope,
        accept: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Option<Loaded>, StoreError> {
        let ids = self.ids(scope)?;
        if ids.is_empty() {
            return Ok(None);
        }
        let mut skipped = Vec::new();
        for id in ids {
            let reason = match self.load(scope, &id) {
                Ok(bytes) => match accept(&bytes) {
                    Ok(()) => return Ok(Some(Loaded { id, bytes, skipped })),
                    Err(why) => SkipReason::Rejected(why),
                },
                Err(StoreError::NotFound { .. }) => SkipReason::Vanished,
                Err(StoreError::Damaged { detail, .. }) => SkipReason::Damaged(detail),
                Err(error) => return Err(error),
            };
            tracing::warn!(%id, %scope, %reason, "store: skipping checkpoint");
            skipped.push(Skipped { location: self.location(scope, &id), id, reason });
        }
        Err(StoreError::NoUsableCheckpoint { place: self.place(scope), skipped })
    }

    /// Where checkpoint `id` of `scope` is kept, for people (a path, a key).
    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        format!("{} {id}", self.place(scope))
    }

    /// Where `scope`'s checkpoints are kept, for people.
    fn place(&self, scope: &Scope) -> String {
        format!("checkpoints of {scope}")
    }
}

macro_rules! forward_archive {
    ($($wrapper:tt)*) => {
        impl<T: ArchiveStore + ?Sized> ArchiveStore for $($wrapper)*<T> {
            fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
                (**self).write(writes)
            }
            fn write_owned(&self, writes: Vec<PendingWrite>) -> Result<(), Unwritten> {
                (**self).write_owned(writes)
            }
            fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
                (**self).get_many(scope, ids)
            }
            fn get(&self, scope: &Scope, id: u64) -> Result<Option<ArchivedMessage>, StoreError> {
                (**self).get(scope, id)
            }
            fn rows_after(&self, scope: &Scope, after: u64, limit: usize) -> Result<Vec<ArchivedMessage>, StoreError> {
                (**self).rows_after(scope, after, limit)
            }
            fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
                (**self).max_id(scope)
            }
            fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
                (**self).archived_through(scope, wanted)
            }
            fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
                (**self).search(scope, query)
            }
            fn search_beyond(&self, scope: &Scope, query: &SearchQuery<'_>, held: &dyn Fn(u64) -> bool) -> Result<Vec<SearchHit>, StoreError> {
                (**self).search_beyond(scope, query, held)
            }
            fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
                (**self).summary(scope, id)
            }
            fn search_summaries(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SummaryHit>, StoreError> {
                (**self).search_summaries(scope, query)
            }
            fn drill_down(&self, scope: &Scope, id: u64) -> Result<Vec<ArchivedMessage>, StoreError> {
                (**self).drill_down(scope, id)
            }
            fn put_vectors(&self, scope: &Scope, fence: Fence, model: &str, vectors: &[(u64, Vec<f32>)]) -> Result<(), StoreError> {
                (**self).put_vectors(scope, fence, model, vectors)
            }
            fn vectors(&self, scope: &Scope, model: &str, after: u64) -> Result<Vec<VectorRow>, StoreError> {
                (**self).vectors(scope, model, after)
            }
            fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
                (**self).metrics(scope)
            }
            fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
                (**self).usage(scope)
            }
            fn forget(&self, scope: &Scope, fence: Fence, what: &Forget<'_>) -> Result<Forgotten, StoreError> {
                (**self).forget(scope, fence, what)
            }
            fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
                (**self).delete_from(scope, fence, first)
            }
            fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
                (**self).delete_conversation(scope, fence)
            }
            fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
                (**self).conversations(tenant, prefix)
            }
            fn identity(&self) -> Result<String, StoreError> {
                (**self).identity()
            }
            fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
                (**self).acquire(scope)
            }
            fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
                (**self).current_fence(scope)
            }
            fn acquire_if_overtaken(&self, scope: &Scope, held: Fence) -> Result<Option<Fence>, StoreError> {
                (**self).acquire_if_overtaken(scope, held)
            }
            fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
                (**self).flush(scope)
            }
        }
    };
}

forward_archive!(Arc);
forward_archive!(Box);

impl<T: CheckpointSink + ?Sized> CheckpointSink for Arc<T> {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        (**self).save(scope, fence, payload)
    }
    #[allow(clippy::type_complexity)]
    fn save_and_prune(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: usize,
    ) -> Result<(CheckpointId, Result<Vec<CheckpointId>, StoreError>), StoreError> {
        (**self).save_and_prune(scope, fence, payload, keep)
    }
    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        (**self).ids(scope)
    }
    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        (**self).newest_id(scope)
    }
    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        (**self).load(scope, id)
    }
    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        (**self).list(scope)
    }
    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        (**self).prune(scope, fence, keep)
    }
    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        (**self).rewrite(scope, fence, mask)
    }
    fn load_latest(
        &self,
        scope: &Scope,
        accept: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Option<Loaded>, StoreError> {
        (**self).load_latest(scope, accept)
    }
    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        (**self).location(scope, id)
    }
    fn place(&self, scope: &Scope) -> String {
        (**self).place(scope)
    }
}
