//! [`Retrying`]: calls a busy store refused, tried again after a pause.

use std::time::Duration;

use super::port::{ArchiveStore, CheckpointSink, Write};
use super::{
    ArchivedMessage, CheckpointId, CheckpointInfo, Fence, Forget, Forgotten, MetricsSummary, Scope,
    SearchHit, SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow,
};

/// Retries a call whose error is [transient](super::ErrorKind::is_transient) (another writer
/// holds a lock), up to `attempts` times in all, pausing `pause` before the first retry and
/// twice as long before each next one. Writes are all or nothing, so trying one again is
/// safe; any other error returns at once.
///
/// ```
/// use ctxwin_std::store::{ArchiveStore, Faulty, Fence, MemoryStore, Retrying, Scope};
/// use std::time::Duration;
/// let store = Retrying::new(Faulty::new(MemoryStore::new()), 3, Duration::from_millis(1));
/// store.put(&Scope::local("s"), Fence::NONE, &[])?;
/// assert_eq!(store.attempts(), 3);
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct Retrying<S> {
    inner: S,
    attempts: u32,
    pause: Duration,
}

impl<S> Retrying<S> {
    /// `inner`, each call tried up to `attempts` times (at least once).
    pub fn new(inner: S, attempts: u32, pause: Duration) -> Self {
        Self { inner, attempts: attempts.max(1), pause }
    }

    /// How many times a call is tried at most.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn retry<T>(&self, call: impl Fn() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut pause = self.pause;
        let mut tried = 1;
        loop {
            match call() {
                Err(error) if error.kind().is_transient() && tried < self.attempts => {
                    tracing::debug!(%error, tried, "store: busy, trying again");
                    std::thread::sleep(pause);
                    pause = pause.saturating_mul(2);
                    tried += 1;
                }
                other => return other,
            }
        }
    }
}

impl<S: ArchiveStore> ArchiveStore for Retrying<S> {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        self.retry(|| self.inner.write(writes))
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.retry(|| self.inner.get_many(scope, ids))
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.retry(|| self.inner.rows_after(scope, after, limit))
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.retry(|| self.inner.max_id(scope))
    }

    fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
        self.retry(|| self.inner.archived_through(scope, wanted))
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        self.retry(|| self.inner.search(scope, query))
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.retry(|| self.inner.summary(scope, id))
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        self.retry(|| self.inner.search_summaries(scope, query))
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.retry(|| self.inner.put_vectors(scope, fence, model, vectors))
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        self.retry(|| self.inner.vectors(scope, model, after))
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        self.retry(|| self.inner.metrics(scope))
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        self.retry(|| self.inner.usage(scope))
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.retry(|| self.inner.forget(scope, fence, what))
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.retry(|| self.inner.delete_from(scope, fence, first))
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.retry(|| self.inner.delete_conversation(scope, fence))
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.retry(|| self.inner.conversations(tenant, prefix))
    }

    fn identity(&self) -> Result<String, StoreError> {
        self.retry(|| self.inner.identity())
    }

    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.retry(|| self.inner.acquire(scope))
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.retry(|| self.inner.current_fence(scope))
    }

    fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
        self.retry(|| self.inner.flush(scope))
    }
}

impl<S: CheckpointSink> CheckpointSink for Retrying<S> {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        self.retry(|| self.inner.save(scope, fence, payload))
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        self.retry(|| self.inner.ids(scope))
    }

    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        self.retry(|| self.inner.newest_id(scope))
    }

    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        self.retry(|| self.inner.load(scope, id))
    }

    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        self.retry(|| self.inner.list(scope))
    }

    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        self.retry(|| self.inner.prune(scope, fence, keep))
    }

    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        self.retry(|| self.inner.rewrite(scope, fence, mask))
    }

    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        self.inner.location(scope, id)
    }

    fn place(&self, scope: &Scope) -> String {
        self.inner.place(scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ErrorKind, MemoryStore, conformance};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Busy for the first `busy` writes.
    #[derive(Debug)]
    struct Busy {
        inner: MemoryStore,
        busy: AtomicU32,
    }

    impl Busy {
        fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
            if self.busy.load(Ordering::SeqCst) > 0 {
                self.busy.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::Busy { detail: "locked".into() });
            }
            self.inner.write(writes)
        }
    }

    #[test]
    fn passes_the_conformance_suites() {
        let pause = Duration::from_millis(1);
        conformance::archive(&|| Arc::new(Retrying::new(MemoryStore::new(), 3, pause)));
        conformance::checkpoints(&|| Arc::new(Retrying::new(MemoryStore::new(), 3, pause)));
    }

    #[test]
    fn transient_errors_are_retried_and_others_are_not() {
        let busy = Busy { inner: MemoryStore::new(), busy: AtomicU32::new(2) };
        let retrying = Retrying::new(&busy, 3, Duration::from_millis(1));
        retrying.retry(|| retrying.inner().write(&[])).unwrap();
        busy.busy.store(5, Ordering::SeqCst);
        let error = retrying.retry(|| retrying.inner().write(&[])).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Busy);
        let calls = AtomicU32::new(0);
        let invalid = retrying.retry(|| -> Result<(), StoreError> {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::invalid("bad"))
        });
        assert!(invalid.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
