//! [`Batched`]: writes held in memory until a read or a flush of their scope, then written in
//! one batch.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::error::to_i64;
use super::port::{ArchiveStore, PendingOp, PendingWrite, Unwritten, Write, WriteOp};
use super::{
    ArchivedMessage, ErrorKind, Fence, Forget, Forgotten, MetricsSummary, Scope, SearchHit,
    SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow,
};

/// Writes held per scope until that scope is read or [flushed](ArchiveStore::flush), then
/// written to the inner store in one [`write`](ArchiveStore::write) (one transaction): a
/// caller taking several messages at once pays a transaction's fixed cost once.
///
/// * **Durability:** nothing held is durable before the flush that writes it returns `Ok`; a
///   crash loses what is held. A session checkpoints only after flushing its scope, so a
///   crash never loses what a checkpoint covers.
/// * **Reads see the writes:** a read of a scope first writes what is held for it.
/// * **A failed write loses nothing:** what was held stays held, in order, and is written
///   again by the next flush or read; only writes refused for good (a stale
///   [`Fence`]) are dropped, their error returned once. Dropping the wrapper writes what is held (logging a
///   failure).
///
/// ```
/// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Batched, Fence, MemoryStore, Scope};
/// use ctxwin_std::{ChatMessage, core::Role};
/// let store = Batched::new(MemoryStore::new());
/// let s = Scope::local("s");
/// store.put(&s, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
/// assert_eq!(store.inner().usage(&s)?.messages, 0, "held");
/// store.flush(&s)?;
/// assert_eq!(store.inner().usage(&s)?.messages, 1);
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct Batched<S: ArchiveStore> {
    inner: S,
    held: Mutex<HashMap<Scope, Vec<PendingWrite>>>,
}

impl<S: ArchiveStore> Batched<S> {
    /// `inner`, holding nothing yet.
    pub fn new(inner: S) -> Self {
        Self { inner, held: Mutex::default() }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Writes held for every scope.
    pub fn held(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Scope, Vec<PendingWrite>>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what is held for `scope`; on failure it stays held, in order.
    fn push(&self, scope: &Scope) -> Result<(), StoreError> {
        let mut held = self.lock();
        let Some(pending) = held.remove(scope) else { return Ok(()) };
        let writes: Vec<Write<'_>> = pending.iter().map(PendingWrite::as_write).collect();
        let written = self.inner.write(&writes);
        drop(writes);
        // What can never be written (a stale fence) is dropped, and reported this once.
        if let Err(error) = &written
            && !matches!(error.kind(), ErrorKind::Fenced | ErrorKind::Invalid)
        {
            held.insert(scope.clone(), pending);
        }
        written
    }

    /// Writes what is held for every scope.
    fn push_all(&self) -> Result<(), StoreError> {
        let scopes: Vec<Scope> = self.lock().keys().cloned().collect();
        scopes.iter().try_for_each(|scope| self.push(scope))
    }
}

impl<S: ArchiveStore> Drop for Batched<S> {
    fn drop(&mut self) {
        if let Err(error) = self.push_all() {
            tracing::error!(%error, held = self.held(), "batched store: held writes lost at drop");
        }
    }
}

impl<S: ArchiveStore> ArchiveStore for Batched<S> {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        for write in writes {
            if let WriteOp::Rows(rows) = write.op {
                for row in rows {
                    to_i64("message id", row.id)?;
                    to_i64("unit id", row.unit)?;
                    to_i64("timestamp", row.timestamp)?;
                }
            }
        }
        let mut held = self.lock();
        for write in writes {
            held.entry(write.scope.clone()).or_default().push(write.to_pending());
        }
        Ok(())
    }

    /// Holds the writes themselves (no copy).
    fn write_owned(&self, writes: Vec<PendingWrite>) -> Result<(), Unwritten> {
        let checked: Result<(), StoreError> = writes.iter().try_for_each(|write| {
            if let PendingOp::Rows(rows) = &write.op {
                for row in rows {
                    to_i64("message id", row.id)?;
                    to_i64("unit id", row.unit)?;
                    to_i64("timestamp", row.timestamp)?;
                }
            }
            Ok(())
        });
        if let Err(error) = checked {
            return Err(Unwritten { error, writes });
        }
        let mut held = self.lock();
        for write in writes {
            held.entry(write.scope.clone()).or_default().push(write);
        }
        Ok(())
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.push(scope)?;
        self.inner.get_many(scope, ids)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.push(scope)?;
        self.inner.rows_after(scope, after, limit)
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.push(scope)?;
        self.inner.max_id(scope)
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        self.push(scope)?;
        self.inner.search(scope, query)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.push(scope)?;
        self.inner.summary(scope, id)
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        self.push(scope)?;
        self.inner.search_summaries(scope, query)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.push(scope)?;
        self.inner.put_vectors(scope, fence, model, vectors)
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        self.push(scope)?;
        self.inner.vectors(scope, model, after)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        self.push(scope)?;
        self.inner.metrics(scope)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        self.push(scope)?;
        self.inner.usage(scope)
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.push(scope)?;
        self.inner.forget(scope, fence, what)
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.push(scope)?;
        self.inner.delete_from(scope, fence, first)
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.push(scope)?;
        self.inner.delete_conversation(scope, fence)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.push_all()?;
        self.inner.conversations(tenant, prefix)
    }

    fn identity(&self) -> Result<String, StoreError> {
        self.inner.identity()
    }

    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.inner.acquire(scope)
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.inner.current_fence(scope)
    }

    fn acquire_if_overtaken(
        &self,
        scope: &Scope,
        held: Fence,
    ) -> Result<Option<Fence>, StoreError> {
        self.inner.acquire_if_overtaken(scope, held)
    }

    fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
        self.push(scope)?;
        self.inner.flush(scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Faulty, MemoryStore, conformance};
    use crate::{ChatMessage, core::Role};

    #[test]
    fn passes_the_archive_conformance_suite() {
        conformance::archive(&|| std::sync::Arc::new(Batched::new(MemoryStore::new())));
    }

    #[test]
    fn a_failed_flush_keeps_the_writes_in_order() {
        let store = Batched::new(Faulty::new(MemoryStore::new()));
        let s = Scope::local("s");
        let row =
            |id, text: &str| ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text));
        store.put(&s, Fence::NONE, &[row(1, "first")]).unwrap();
        store.put(&s, Fence::NONE, &[row(1, "second")]).unwrap();
        store.inner().faults().fail_writes("full");
        assert!(store.flush(&s).is_err());
        assert_eq!(store.held(), 2);
        store.inner().faults().heal();
        assert_eq!(store.get(&s, 1).unwrap().unwrap().message.content, "second");
        assert_eq!(store.held(), 0);
    }
}
