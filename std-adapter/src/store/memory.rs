//! [`MemoryStore`]: both ports in memory — a real adapter (tests, short runs, a process that
//! keeps nothing), and the plainest statement of the ports' contract: scoped maps, checksums
//! verified on every read, fences checked, BM25 over a conversation's rows.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::checkpoint::{CheckpointId, CheckpointInfo, CheckpointStatus, clock, frame};
use super::error::to_i64;
use super::port::{ArchiveStore, CheckpointSink, Write, WriteOp};
use super::types::{normalise, scrub_row};
use super::{
    ArchivedMessage, FORGOTTEN, Fence, Forget, Forgotten, MetricsSummary, Scope, SearchHit,
    SearchQuery, StoreError, StrategyMetrics, SummaryHit, SummaryRecord, Usage, VectorRow,
    checksum, text,
};
use crate::store::CompressionRecord;

/// A value and the checksum stored with it.
#[derive(Clone, Debug)]
struct Stored<T> {
    value: T,
    checksum: u64,
}

/// What one conversation holds.
#[derive(Clone, Debug, Default)]
struct Conversation {
    rows: BTreeMap<u64, Stored<ArchivedMessage>>,
    summaries: BTreeMap<u64, Stored<SummaryRecord>>,
    /// By (message id, model).
    vectors: BTreeMap<(u64, String), Stored<Vec<f32>>>,
    events: Vec<CompressionRecord>,
    /// Checkpoints, oldest first: sequence, id, framed bytes.
    checkpoints: Vec<(u64, CheckpointId, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct State {
    conversations: BTreeMap<Scope, Conversation>,
    /// The newest fence handed out per conversation.
    fences: BTreeMap<Scope, u64>,
    /// Raised by every checkpoint save.
    sequence: u64,
}

/// Both ports in memory: an [`ArchiveStore`] and a [`CheckpointSink`] in one value (share it
/// as two `Arc<dyn …>`s of one `Arc<MemoryStore>`). Fences are real: [`acquire`] hands out a
/// newer one each time and writes with an older one are refused.
///
/// [`acquire`]: ArchiveStore::acquire
///
/// ```
/// use std::sync::Arc;
/// use ctxwin_std::store::{ArchiveStore, CheckpointSink, ErrorKind, Fence, MemoryStore, Scope};
/// let store = Arc::new(MemoryStore::new());
/// let scope = Scope::local("s");
/// let first = store.acquire(&scope)?;
/// let second = store.acquire(&scope)?;
/// assert!(second > first);
/// let stale = store.put(&scope, first, &[]).unwrap_err();
/// assert_eq!(stale.kind(), ErrorKind::Fenced);
/// let id = store.save(&scope, second, b"snapshot")?;
/// assert_eq!(store.load(&scope, &id)?, b"snapshot");
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
pub struct MemoryStore {
    state: Mutex<State>,
    identity: String,
}

impl std::fmt::Debug for MemoryStore {
    // It may hold thousands of rows: show what identifies it instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("identity", &self.identity)
            .field("conversations", &self.lock().conversations.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with a new identity.
    pub fn new() -> Self {
        Self { state: Mutex::new(State::default()), identity: super::new_identity() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes a byte of row `id` of `scope` without its checksum, as bit rot would (tests of
    /// the checksums: the conformance suite). Whether there was such a row.
    #[doc(hidden)]
    pub fn damage_row_for_tests(&self, scope: &Scope, id: u64) -> bool {
        let mut state = self.lock();
        let row = state.conversations.get_mut(scope).and_then(|c| c.rows.get_mut(&id));
        let Some(row) = row else { return false };
        let content = &mut row.value.message.content;
        let flipped: String = content
            .chars()
            .enumerate()
            .map(|(i, c)| if i == 0 && c.is_ascii() { (c as u8 ^ 0x01) as char } else { c })
            .collect();
        *content = if flipped == *content { format!("{content}!") } else { flipped };
        true
    }

    /// Changes a byte of checkpoint `id` of `scope` (tests). Whether there was one.
    #[doc(hidden)]
    pub fn damage_checkpoint_for_tests(&self, scope: &Scope, id: &CheckpointId) -> bool {
        let mut state = self.lock();
        let Some(conversation) = state.conversations.get_mut(scope) else { return false };
        let found = conversation.checkpoints.iter_mut().find(|(_, saved, _)| saved == id);
        let Some((_, _, bytes)) = found else { return false };
        if let Some(byte) = bytes.last_mut() {
            *byte ^= 0x40;
        }
        true
    }
}

/// Refuses a write with `fence` when a newer one was handed out for `scope`.
fn check_fence(state: &State, scope: &Scope, fence: Fence) -> Result<(), StoreError> {
    let current = state.fences.get(scope).copied().unwrap_or(0);
    if !fence.is_none() && fence.0 < current {
        return Err(StoreError::Fenced { scope: scope.clone(), fence, current: Fence(current) });
    }
    Ok(())
}

/// Checks a write before anything of its batch is applied.
fn check(state: &State, write: &Write<'_>) -> Result<(), StoreError> {
    check_fence(state, write.scope, write.fence)?;
    match write.op {
        WriteOp::Rows(rows) => {
            for row in rows {
                to_i64("message id", row.id)?;
                to_i64("unit id", row.unit)?;
                to_i64("timestamp", row.timestamp)?;
            }
        }
        WriteOp::Summary(summary) => {
            to_i64("summary id", summary.id)?;
            to_i64("timestamp", summary.created_at)?;
            for &source in &summary.source_ids {
                to_i64("source id", source)?;
            }
        }
        WriteOp::Compression(event) => {
            to_i64("timestamp", event.timestamp)?;
            to_i64("tokens_before", event.tokens_before)?;
            to_i64("tokens_after", event.tokens_after)?;
        }
    }
    Ok(())
}

/// Stores `row` of `scope`, dropping its vectors when its content changed.
fn put_row(conversation: &mut Conversation, scope: &Scope, row: &ArchivedMessage) {
    let changed = conversation
        .rows
        .get(&row.id)
        .is_some_and(|old| old.value.message.content != row.message.content);
    if changed {
        conversation.vectors.retain(|(id, _), _| *id != row.id);
    }
    let stored = Stored { value: row.clone(), checksum: checksum::message(scope, row) };
    conversation.rows.insert(row.id, stored);
}

impl Conversation {
    fn row(&self, scope: &Scope, id: u64) -> Result<Option<ArchivedMessage>, StoreError> {
        let Some(stored) = self.rows.get(&id) else { return Ok(None) };
        let computed = checksum::message(scope, &stored.value);
        if computed != stored.checksum {
            let what = format!("message {id} of conversation {:?}", scope.to_string());
            return Err(checksum::mismatch(what, stored.checksum, computed));
        }
        Ok(Some(stored.value.clone()))
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        let Some(stored) = self.summaries.get(&id) else { return Ok(None) };
        let computed = checksum::summary(scope, &stored.value);
        if computed != stored.checksum {
            let what = format!("summary {id} of conversation {:?}", scope.to_string());
            return Err(checksum::mismatch(what, stored.checksum, computed));
        }
        Ok(Some(stored.value.clone()))
    }
}

impl ArchiveStore for MemoryStore {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        let mut state = self.lock();
        for write in writes {
            check(&state, write)?;
        }
        for write in writes {
            let conversation = state.conversations.entry(write.scope.clone()).or_default();
            match write.op {
                WriteOp::Rows(rows) => {
                    for row in rows {
                        put_row(conversation, write.scope, row);
                    }
                }
                WriteOp::Summary(summary) => {
                    let checksum = checksum::summary(write.scope, summary);
                    conversation
                        .summaries
                        .insert(summary.id, Stored { value: summary.clone(), checksum });
                }
                WriteOp::Compression(event) => conversation.events.push(event.clone()),
            }
        }
        Ok(())
    }

    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        let state = self.lock();
        let Some(conversation) = state.conversations.get(scope) else { return Ok(Vec::new()) };
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut out = Vec::new();
        for id in ids {
            out.extend(conversation.row(scope, id)?);
        }
        Ok(out)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        let state = self.lock();
        let Some(conversation) = state.conversations.get(scope) else { return Ok(Vec::new()) };
        let ids: Vec<u64> = conversation
            .rows
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(id, _)| *id)
            .filter(|_| after < u64::MAX)
            .collect();
        ids.into_iter().filter_map(|id| conversation.row(scope, id).transpose()).collect()
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        let state = self.lock();
        Ok(state.conversations.get(scope).and_then(|c| c.rows.keys().next_back().copied()))
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        let terms = text::query_terms(query.text);
        let state = self.lock();
        let Some(conversation) = state.conversations.get(scope) else { return Ok(Vec::new()) };
        if terms.is_empty() || query.limit == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<&Stored<ArchivedMessage>> = conversation.rows.values().collect();
        let docs: Vec<Vec<String>> = rows
            .iter()
            .map(|stored| {
                let row = &stored.value;
                let mut doc = text::terms(&row.message.content);
                for call in &row.message.tool_calls {
                    doc.extend(text::terms(&call.name));
                    doc.extend(text::terms(&call.arguments));
                }
                doc.extend(row.original.as_deref().map(text::terms).unwrap_or_default());
                doc
            })
            .collect();
        let mut scored = text::bm25(&docs, &terms);
        scored.truncate(query.limit);
        let mut scores: Vec<f64> = scored.iter().map(|(_, score)| *score).collect();
        normalise(&mut scores);
        let mut hits = Vec::with_capacity(scored.len());
        for ((index, _), score) in scored.into_iter().zip(scores) {
            let Some(id) = rows.get(index).map(|stored| stored.value.id) else { continue };
            let Some(row) = conversation.row(scope, id)? else { continue };
            let snippet = if query.snippets {
                text::snippet(&row.message.content, &terms)
            } else {
                String::new()
            };
            hits.push(SearchHit {
                id,
                unit: row.unit,
                role: row.message.role,
                timestamp: row.timestamp,
                content: row.message.content,
                snippet,
                score,
            });
        }
        Ok(hits)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        let state = self.lock();
        match state.conversations.get(scope) {
            Some(conversation) => conversation.summary(scope, id),
            None => Ok(None),
        }
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        let terms = text::query_terms(query.text);
        let state = self.lock();
        let Some(conversation) = state.conversations.get(scope) else { return Ok(Vec::new()) };
        let summaries: Vec<u64> = conversation.summaries.keys().copied().collect();
        let docs: Vec<Vec<String>> =
            conversation.summaries.values().map(|stored| text::terms(&stored.value.text)).collect();
        let mut scored = text::bm25(&docs, &terms);
        scored.truncate(query.limit);
        let mut scores: Vec<f64> = scored.iter().map(|(_, score)| *score).collect();
        normalise(&mut scores);
        let mut hits = Vec::new();
        for ((index, _), score) in scored.into_iter().zip(scores) {
            let Some(&id) = summaries.get(index) else { continue };
            if let Some(summary) = conversation.summary(scope, id)? {
                hits.push(SummaryHit { id, level: summary.level, text: summary.text, score });
            }
        }
        Ok(hits)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else { return Ok(()) };
        for (id, vector) in vectors {
            if conversation.rows.contains_key(id) {
                let checksum = checksum::vector(scope, *id, model, vector);
                let stored = Stored { value: vector.clone(), checksum };
                conversation.vectors.insert((*id, model.to_string()), stored);
            }
        }
        Ok(())
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        let state = self.lock();
        let Some(conversation) = state.conversations.get(scope) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for &id in conversation.rows.keys().filter(|&&id| id > after) {
            let Some(row) = conversation.row(scope, id)? else { continue };
            let vector = match conversation.vectors.get(&(id, model.to_string())) {
                Some(stored) => {
                    let computed = checksum::vector(scope, id, model, &stored.value);
                    if computed != stored.checksum {
                        let what = format!("vector of message {id} of conversation {scope}");
                        return Err(checksum::mismatch(what, stored.checksum, computed));
                    }
                    Some(stored.value.clone())
                }
                None => None,
            };
            out.push(VectorRow { id, content: row.message.content, vector });
        }
        Ok(out)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        let state = self.lock();
        let mut by_name: BTreeMap<&str, StrategyMetrics> = BTreeMap::new();
        for event in state.conversations.get(scope).map(|c| c.events.as_slice()).unwrap_or_default()
        {
            let entry = by_name.entry(&event.strategy).or_insert_with(|| StrategyMetrics {
                strategy: event.strategy.clone(),
                ..StrategyMetrics::default()
            });
            entry.add(&StrategyMetrics {
                strategy: String::new(),
                events: 1,
                tokens_before: event.tokens_before,
                tokens_after: event.tokens_after,
                units_evicted: u64::from(event.units_evicted),
                summaries_made: u64::from(event.summaries_made),
            });
        }
        let mut summary = MetricsSummary::default();
        for entry in by_name.into_values() {
            summary.total.add(&entry);
            summary.by_strategy.push(entry);
        }
        Ok(summary)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        let state = self.lock();
        let Some(c) = state.conversations.get(scope) else { return Ok(Usage::default()) };
        Ok(Usage {
            messages: c.rows.len() as u64,
            summaries: c.summaries.len() as u64,
            vectors: c.vectors.len() as u64,
            compression_events: c.events.len() as u64,
            store_bytes: None,
        })
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else {
            return Ok(Forgotten::default());
        };
        let texts: Vec<&str> = what.texts.iter().copied().filter(|t| !t.is_empty()).collect();
        let what = Forget { ids: what.ids, texts: &texts };
        let mut forgotten = Forgotten::default();
        let ids: Vec<u64> = conversation.rows.keys().copied().collect();
        for id in ids {
            let Some(stored) = conversation.rows.get(&id) else { continue };
            let mut row = stored.value.clone();
            scrub_row(&mut row, &what);
            let holds = texts.iter().any(|t| row_holds(&stored.value, t));
            if what.ids.contains(&id) || holds {
                forgotten.messages.push(id);
                put_row(conversation, scope, &row);
            }
        }
        for (id, stored) in conversation.summaries.iter_mut() {
            let stands_for = stored.value.source_ids.iter().any(|s| forgotten.messages.contains(s));
            let quotes = texts.iter().any(|t| stored.value.text.contains(t));
            if stands_for || quotes {
                for text in &texts {
                    stored.value.text = stored.value.text.replace(text, FORGOTTEN);
                }
                stored.checksum = checksum::summary(scope, &stored.value);
                forgotten.summaries.push(*id);
            }
        }
        Ok(forgotten)
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else { return Ok(0) };
        let gone = conversation.rows.split_off(&first);
        conversation.summaries.split_off(&first);
        conversation.vectors.retain(|(id, _), _| *id < first);
        Ok(gone.len() as u64)
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else { return Ok(0) };
        let rows = conversation.rows.len() as u64;
        let checkpoints = std::mem::take(&mut conversation.checkpoints);
        *conversation = Conversation { checkpoints, ..Conversation::default() };
        Ok(rows)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        let state = self.lock();
        Ok(state
            .conversations
            .iter()
            .filter(|(scope, c)| {
                scope.tenant == tenant
                    && scope.conversation.starts_with(prefix)
                    && !(c.rows.is_empty() && c.summaries.is_empty() && c.events.is_empty())
            })
            .map(|(scope, _)| scope.conversation.clone())
            .collect())
    }

    fn identity(&self) -> Result<String, StoreError> {
        Ok(self.identity.clone())
    }

    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        let mut state = self.lock();
        let fence = state.fences.entry(scope.clone()).or_insert(0);
        *fence = fence.saturating_add(1);
        Ok(Fence(*fence))
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        Ok(Fence(self.lock().fences.get(scope).copied().unwrap_or(0)))
    }
}

/// Whether `row` holds `text` where forget looks for it.
fn row_holds(row: &ArchivedMessage, text: &str) -> bool {
    let m = &row.message;
    m.content.contains(text)
        || row.original.as_deref().is_some_and(|o| o.contains(text))
        || row.raw.as_deref().is_some_and(|r| r.contains(text))
        || m.tool_calls
            .iter()
            .any(|c| c.id.contains(text) || c.name.contains(text) || c.arguments.contains(text))
}

impl CheckpointSink for MemoryStore {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        state.sequence = state.sequence.saturating_add(1);
        let sequence = state.sequence;
        let conversation = state.conversations.entry(scope.clone()).or_default();
        let floor = conversation.checkpoints.last().map(|(_, id, _)| id);
        let now = clock::now();
        let id = CheckpointId::next_after(now, floor).ok_or_else(|| {
            StoreError::invalid(format!("the clock reads {now:?}, outside 1970..=9999"))
        })?;
        conversation.checkpoints.push((sequence, id.clone(), frame::sequenced(sequence, payload)));
        Ok(id)
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        let state = self.lock();
        let saved = state.conversations.get(scope).map(|c| c.checkpoints.as_slice());
        Ok(saved.unwrap_or_default().iter().rev().map(|(_, id, _)| id.clone()).collect())
    }

    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        let state = self.lock();
        let saved = state
            .conversations
            .get(scope)
            .and_then(|c| c.checkpoints.iter().find(|(_, saved, _)| saved == id));
        let Some((_, _, bytes)) = saved else {
            return Err(StoreError::NotFound { what: format!("checkpoint {id} of {scope}") });
        };
        let (_, range) = frame::open(bytes).map_err(|e| {
            StoreError::damaged(format!("checkpoint {id} of {scope}"), e.to_string())
        })?;
        Ok(bytes.get(range).unwrap_or_default().to_vec())
    }

    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        let state = self.lock();
        let saved = state.conversations.get(scope).map(|c| c.checkpoints.as_slice());
        Ok(saved
            .unwrap_or_default()
            .iter()
            .rev()
            .map(|(_, id, bytes)| CheckpointInfo {
                id: id.clone(),
                location: format!("memory: checkpoint {id} of {scope}"),
                size: bytes.len() as u64,
                modified: None,
                status: match frame::open(bytes) {
                    Ok(_) => CheckpointStatus::Ok,
                    Err(error) => CheckpointStatus::Damaged(error.to_string()),
                },
            })
            .collect())
    }

    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else { return Ok(Vec::new()) };
        let excess = conversation.checkpoints.len().saturating_sub(keep);
        Ok(conversation.checkpoints.drain(..excess).map(|(_, id, _)| id).collect())
    }

    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        let mut state = self.lock();
        check_fence(&state, scope, fence)?;
        let Some(conversation) = state.conversations.get_mut(scope) else { return Ok(0) };
        let mut rewritten = 0;
        for (sequence, _, bytes) in &mut conversation.checkpoints {
            let masked = match frame::open(bytes) {
                Ok((_, range)) => bytes
                    .get(range)
                    .and_then(mask)
                    .map(|payload| frame::sequenced(*sequence, &payload)),
                Err(_) => mask(bytes),
            };
            if let Some(masked) = masked {
                *bytes = masked;
                rewritten += 1;
            }
        }
        Ok(rewritten)
    }

    fn place(&self, scope: &Scope) -> String {
        format!("memory: checkpoints of {scope}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    #[test]
    fn passes_the_archive_conformance_suite() {
        conformance::archive(&|| std::sync::Arc::new(MemoryStore::new()));
    }

    #[test]
    fn passes_the_checkpoint_conformance_suite() {
        conformance::checkpoints(&|| std::sync::Arc::new(MemoryStore::new()));
    }

    #[test]
    fn damage_is_reported_not_served() {
        let store = std::sync::Arc::new(MemoryStore::new());
        let damage = {
            let store = store.clone();
            move |scope: &Scope, id: u64| store.damage_row_for_tests(scope, id)
        };
        conformance::damaged_row(store.as_ref(), &damage);
        let sink = std::sync::Arc::new(MemoryStore::new());
        let damage = {
            let sink = sink.clone();
            move |scope: &Scope, id: &CheckpointId| sink.damage_checkpoint_for_tests(scope, id)
        };
        conformance::damaged_checkpoint(sink.as_ref(), &damage);
    }
}
