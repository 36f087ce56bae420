//! [`ArchiveStore`] for [`PgStore`]: each method a call of the module doing the work.

use postgres::types::Type;

use super::PgStore;
use super::error::{from_sql_int, get};
use super::escape::scope_params;
use crate::store::{
    ArchiveStore, ArchivedMessage, Fence, Forget, Forgotten, MetricsSummary, Scope, SearchHit,
    SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow, Write,
};

/// Fences are checked: see the [module documentation](super).
impl ArchiveStore for PgStore {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        self.commit(writes)
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.get_many_pg(scope, ids)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.rows_after_pg(scope, after, limit)
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.max_id_pg(scope)
    }

    /// Without a query when this handle wrote or read the rows through `wanted` (rows go
    /// only by deletes, which forget what it knew of their conversation).
    fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
        if self.inner.archived.reaches(scope, wanted) {
            return Ok(wanted);
        }
        Ok(self.max_id_pg(scope)?.unwrap_or(0).min(wanted))
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        self.search_pg(scope, query)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.summary_pg(scope, id)
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        self.search_summaries_pg(scope, query)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.put_vectors_pg(scope, fence, model, vectors)
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        self.vectors_pg(scope, model, after)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        self.metrics_pg(scope)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        self.usage_pg(scope)
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.forget_pg(scope, fence, what)
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.delete_from_pg(scope, fence, first)
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.delete_conversation_pg(scope, fence)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.conversations_pg(tenant, prefix)
    }

    fn identity(&self) -> Result<String, StoreError> {
        Ok(self.inner.identity.clone())
    }

    /// Raises the conversation's fence in the database and returns it: from now on a write
    /// with an older fence is refused. Waits (at most the lock timeout) for a write of the
    /// conversation in flight.
    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        let fence = self.raise_fence(scope, None)?.ok_or_else(|| StoreError::Backend {
            detail: format!("no fence returned for {scope}"),
        })?;
        tracing::debug!(%scope, fence = fence.0, "postgres store: lease taken");
        Ok(fence)
    }

    /// One round trip: raises the fence only where the newest is not `held` taken by this
    /// handle (newer, or — after a server crash lost a lease's commit — the same number
    /// handed out to another handle, or older: see `raise_fence`).
    fn acquire_if_overtaken(
        &self,
        scope: &Scope,
        held: Fence,
    ) -> Result<Option<Fence>, StoreError> {
        let taken = self.raise_fence(scope, Some(held))?;
        if let Some(fence) = taken {
            tracing::debug!(%scope, fence = fence.0, "postgres store: lease taken over");
        }
        Ok(taken)
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                "SELECT fence FROM conversations WHERE tenant = $1 AND name = $2",
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            match rows.first() {
                Some(row) => Ok(Fence(from_sql_int("fence", get::<i64>(row, 0)?)?)),
                None => Ok(Fence::NONE),
            }
        })
    }
}

impl PgStore {
    /// Changes a byte of row `id` of `scope` behind its checksum, as bit rot would: for tests
    /// of the checksums. Whether there was such a row.
    ///
    /// # Errors
    /// Backend errors.
    #[doc(hidden)]
    pub fn damage_row_for_tests(&self, scope: &Scope, id: u64) -> Result<bool, StoreError> {
        let (tenant, name) = scope_params(scope);
        let id = i64::try_from(id).unwrap_or(i64::MAX);
        self.run(|client| {
            let rows = client.query_typed(
                "UPDATE messages m SET content = m.content || '!' FROM conversations c
                 WHERE c.id = m.conversation_id AND c.tenant = $1 AND c.name = $2 AND m.id = $3
                 RETURNING 1",
                &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&id, Type::INT8)],
            )?;
            Ok(!rows.is_empty())
        })
    }
}
