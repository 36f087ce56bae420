//! [`Faulty`]: fault injection for tests — writes or reads that fail on demand, and writes held
//! back until released, around any store.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::port::{ArchiveStore, CheckpointSink, Write};
use super::{
    ArchivedMessage, CheckpointId, CheckpointInfo, Fence, Forget, Forgotten, MetricsSummary, Scope,
    SearchHit, SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow,
};

#[derive(Debug, Default)]
struct Settings {
    /// Every write fails with this until healed.
    writes: Option<String>,
    /// The next this many writes fail (then they succeed again).
    next_writes: usize,
    /// Every read fails with this until healed.
    reads: Option<String>,
    /// Writes wait while held.
    held: bool,
}

/// The faults a [`Faulty`] store injects, shared with the test that sets them.
///
/// ```
/// use ctxwin_std::store::{ArchiveStore, ErrorKind, Faulty, Fence, MemoryStore, Scope};
/// let store = Faulty::new(MemoryStore::new());
/// let faults = store.faults();
/// faults.fail_writes("disk on fire");
/// let error = store.put(&Scope::local("s"), Fence::NONE, &[]).unwrap_err();
/// assert!(error.to_string().contains("disk on fire") && error.kind() == ErrorKind::Io);
/// faults.heal();
/// store.put(&Scope::local("s"), Fence::NONE, &[])?;
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
#[derive(Debug, Default)]
pub struct Faults {
    settings: Mutex<Settings>,
    released: Condvar,
}

/// Writes of a [`Faulty`] store wait while this lives ([`Faults::hold`]).
#[derive(Debug)]
pub struct Hold {
    faults: Arc<Faults>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.faults.lock().held = false;
        self.faults.released.notify_all();
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every write fails with `reason` (an I/O error) until [`heal`](Self::heal).
    pub fn fail_writes(&self, reason: &str) {
        self.lock().writes = Some(reason.to_string());
    }

    /// The next `count` writes fail with `reason`.
    pub fn fail_next_writes(&self, count: usize, reason: &str) {
        let mut settings = self.lock();
        settings.next_writes = count;
        settings.writes.get_or_insert_with(|| reason.to_string());
    }

    /// Every read fails with `reason` until [`heal`](Self::heal).
    pub fn fail_reads(&self, reason: &str) {
        self.lock().reads = Some(reason.to_string());
    }

    /// Ends every failure.
    pub fn heal(&self) {
        let mut settings = self.lock();
        settings.writes = None;
        settings.next_writes = 0;
        settings.reads = None;
    }

    /// Holds writes back (they wait, as behind another writer's long transaction) until the
    /// returned guard drops.
    pub fn hold(self: &Arc<Self>) -> Hold {
        self.lock().held = true;
        Hold { faults: self.clone() }
    }

    /// Waits while held, then the injected failure of a write, if any.
    fn before_write(&self) -> Result<(), StoreError> {
        let mut settings = self.lock();
        while settings.held {
            settings = self.released.wait(settings).unwrap_or_else(PoisonError::into_inner);
        }
        let Some(reason) = settings.writes.clone() else { return Ok(()) };
        if settings.next_writes > 0 {
            settings.next_writes -= 1;
            if settings.next_writes == 0 {
                settings.writes = None;
            }
        }
        Err(StoreError::Io { detail: format!("injected: {reason}"), source: None })
    }

    fn before_read(&self) -> Result<(), StoreError> {
        match self.lock().reads.clone() {
            Some(reason) => {
                Err(StoreError::Io { detail: format!("injected: {reason}"), source: None })
            }
            None => Ok(()),
        }
    }
}

/// A store whose writes and reads fail, or wait, when a test says so ([`Faults`]): how tests
/// exercise what a full disk, a lost connection or a slow transaction does to the layers
/// above, with any adapter underneath.
#[derive(Debug)]
pub struct Faulty<S> {
    inner: S,
    faults: Arc<Faults>,
}

impl<S> Faulty<S> {
    /// `inner`, with no fault set yet.
    pub fn new(inner: S) -> Self {
        Self { inner, faults: Arc::default() }
    }

    /// The faults to set.
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: ArchiveStore> ArchiveStore for Faulty<S> {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        self.faults.before_write()?;
        self.inner.write(writes)
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.faults.before_read()?;
        self.inner.get_many(scope, ids)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.faults.before_read()?;
        self.inner.rows_after(scope, after, limit)
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.faults.before_read()?;
        self.inner.max_id(scope)
    }

    fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
        self.faults.before_read()?;
        self.inner.archived_through(scope, wanted)
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        self.faults.before_read()?;
        self.inner.search(scope, query)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.faults.before_read()?;
        self.inner.summary(scope, id)
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        self.faults.before_read()?;
        self.inner.search_summaries(scope, query)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.faults.before_write()?;
        self.inner.put_vectors(scope, fence, model, vectors)
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        self.faults.before_read()?;
        self.inner.vectors(scope, model, after)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        self.faults.before_read()?;
        self.inner.metrics(scope)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        self.faults.before_read()?;
        self.inner.usage(scope)
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.faults.before_write()?;
        self.inner.forget(scope, fence, what)
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.faults.before_write()?;
        self.inner.delete_from(scope, fence, first)
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.faults.before_write()?;
        self.inner.delete_conversation(scope, fence)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.faults.before_read()?;
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
        self.inner.flush(scope)
    }
}

impl<S: CheckpointSink> CheckpointSink for Faulty<S> {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        self.faults.before_write()?;
        self.inner.save(scope, fence, payload)
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        self.faults.before_read()?;
        self.inner.ids(scope)
    }

    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        self.faults.before_read()?;
        self.inner.newest_id(scope)
    }

    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        self.faults.before_read()?;
        self.inner.load(scope, id)
    }

    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        self.faults.before_read()?;
        self.inner.list(scope)
    }

    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        self.faults.before_write()?;
        self.inner.prune(scope, fence, keep)
    }

    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        self.faults.before_write()?;
        self.inner.rewrite(scope, fence, mask)
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
    use crate::store::{MemoryStore, conformance};

    #[test]
    fn passes_the_conformance_suites_when_healthy() {
        conformance::archive(&|| Arc::new(Faulty::new(MemoryStore::new())));
        conformance::checkpoints(&|| Arc::new(Faulty::new(MemoryStore::new())));
    }

    #[test]
    fn failures_come_and_go() {
        let store = Faulty::new(MemoryStore::new());
        let s = Scope::local("s");
        store.faults().fail_next_writes(2, "flaky");
        assert!(store.put(&s, Fence::NONE, &[]).is_err());
        assert!(store.put(&s, Fence::NONE, &[]).is_err());
        store.put(&s, Fence::NONE, &[]).unwrap();
        store.faults().fail_reads("gone");
        assert!(store.max_id(&s).is_err());
        store.faults().heal();
        assert_eq!(store.max_id(&s).unwrap(), None);
    }

    #[test]
    fn a_hold_makes_writes_wait() {
        let store = Arc::new(Faulty::new(MemoryStore::new()));
        let hold = store.faults().hold();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || store.put(&Scope::local("s"), Fence::NONE, &[]))
        };
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!writer.is_finished());
        drop(hold);
        writer.join().unwrap().unwrap();
    }
}
