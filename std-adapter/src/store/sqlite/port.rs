//! [`ArchiveStore`] for [`SqliteArchive`]: each method a call of the module doing the work.

use super::SqliteArchive;
use crate::store::{
    ArchiveStore, ArchivedMessage, Fence, Forget, Forgotten, MetricsSummary, Scope, SearchHit,
    SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow, Write,
};

/// Fences are accepted and not checked: one process writes an archive file (see the module
/// documentation), so there is no lease to lose.
impl ArchiveStore for SqliteArchive {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        Ok(self.commit(writes)?)
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        Ok(self.get_many_sql(scope, ids)?)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        Ok(self.rows_after_sql(scope, after, limit)?)
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        Ok(self.max_id_sql(scope)?)
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        Ok(self.search_sql(scope, query)?)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        Ok(self.summary_sql(scope, id)?)
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        Ok(self.search_summaries_sql(scope, query)?)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        _fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        Ok(self.put_vectors_sql(scope, model, vectors)?)
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        Ok(self.vectors_sql(scope, model, after)?)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        Ok(self.metrics_sql(scope)?)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        Ok(self.usage_sql(scope)?)
    }

    fn forget(
        &self,
        scope: &Scope,
        _fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        Ok(self.forget_sql(scope, what)?)
    }

    fn delete_from(&self, scope: &Scope, _fence: Fence, first: u64) -> Result<u64, StoreError> {
        Ok(self.delete_from_sql(scope, first)?)
    }

    fn delete_conversation(&self, scope: &Scope, _fence: Fence) -> Result<u64, StoreError> {
        Ok(self.delete_conversation_sql(scope)?)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.conversations_sql(tenant, prefix)?)
    }

    fn identity(&self) -> Result<String, StoreError> {
        Ok(super::integrity::identity(&self.conn())?)
    }
}
