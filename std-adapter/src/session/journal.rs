//! [`Journal`]: what the core decided and the archive does not have yet, in order.

use crate::store::{
    ArchiveStore, ArchivedMessage, CompressionRecord, ErrorKind, Fence, PendingOp, PendingWrite,
    Scope, StoreError, SummaryRecord,
};

/// The one ordered queue between the core and the archive port. An operation appends the
/// rows, summaries and events the core produced, then [`commit`](Self::commit)s them in one
/// [`write_owned`](ArchiveStore::write_owned) (one transaction); only then does the session
/// release what the core evicted. A failed write leaves every entry here, in order, and the
/// next operation writes them first; a checkpoint is never written while the journal holds
/// any.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    writes: Vec<PendingWrite>,
    /// Whether the store refused the last write as stale: another process took the lease,
    /// which a fleet's instance finds out by writing (an expected event, not a failure).
    fenced: bool,
}

impl Journal {
    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.writes.len()
    }

    /// Drops every entry held (writes the store refused for good: a stale lease's); how
    /// many there were, and whether the store refused them as stale.
    pub(crate) fn clear(&mut self) -> (usize, bool) {
        let fenced = std::mem::take(&mut self.fenced);
        (std::mem::take(&mut self.writes).len(), fenced)
    }

    /// Appends message rows (to the last entry when it holds rows of the same scope: one
    /// write of many rows).
    pub(crate) fn add_rows(&mut self, scope: &Scope, fence: Fence, rows: Vec<ArchivedMessage>) {
        if rows.is_empty() {
            return;
        }
        if let Some(PendingWrite { scope: last, fence: f, op: PendingOp::Rows(held) }) =
            self.writes.last_mut()
            && last == scope
            && *f == fence
        {
            held.extend(rows);
            return;
        }
        let op = PendingOp::Rows(rows);
        self.writes.push(PendingWrite { scope: scope.clone(), fence, op });
    }

    /// Appends a summary record.
    pub(crate) fn add_summary(&mut self, scope: &Scope, fence: Fence, summary: SummaryRecord) {
        let op = PendingOp::Summary(summary);
        self.writes.push(PendingWrite { scope: scope.clone(), fence, op });
    }

    /// Appends a compression event.
    pub(crate) fn add_event(&mut self, scope: &Scope, fence: Fence, event: CompressionRecord) {
        let op = PendingOp::Compression(event);
        self.writes.push(PendingWrite { scope: scope.clone(), fence, op });
    }

    /// Writes everything held to `store`, in order, in one write; how many rows it took. On
    /// error, what the store did not take stays held, in order.
    pub(crate) fn commit(&mut self, store: &dyn ArchiveStore) -> Result<usize, StoreError> {
        if self.writes.is_empty() {
            return Ok(0);
        }
        let writes = std::mem::take(&mut self.writes);
        let rows: usize = writes.iter().map(PendingWrite::rows).sum();
        match store.write_owned(writes) {
            Ok(()) => {
                self.fenced = false;
                Ok(rows)
            }
            Err(unwritten) => {
                let (held, error) = (unwritten.writes.len(), &unwritten.error);
                self.fenced = error.kind() == ErrorKind::Fenced;
                if self.fenced {
                    tracing::debug!(held, %error, "session: archive write refused as stale");
                } else {
                    tracing::warn!(held, %error, "session: archive write failed; kept in the journal");
                }
                self.writes = unwritten.writes;
                Err(unwritten.error)
            }
        }
    }
}
