//! One conformance suite for every adapter and wrapper of the two ports: what
//! [`ArchiveStore`] and [`CheckpointSink`] promise, checked the same way whatever is behind
//! them. A new adapter is done when it passes (cargo feature `conformance` makes this module
//! public to other crates' adapters).
//!
//! Each check panics with what broke; each suite runs every check on a fresh store from
//! `open`. Damage is adapter-specific (a byte flipped in a file, in memory), so the damage
//! checks take the adapter's way of doing it.
//!
//! ```
//! use std::sync::Arc;
//! use ctxwin_std::store::{MemoryStore, conformance};
//! conformance::archive(&|| Arc::new(MemoryStore::new()));
//! conformance::checkpoints(&|| Arc::new(MemoryStore::new()));
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

pub use super::records::conformance::{damaged_record, records};
use super::{
    ArchiveStore, ArchivedMessage, CheckpointId, CheckpointSink, CheckpointStatus,
    CompressionRecord, ErrorKind, FORGOTTEN, Fence, Forget, PendingOp, PendingWrite, Scope,
    SearchQuery, SkipReason, StoreError, SummaryRecord,
};
use crate::message::{ChatMessage, ToolCall};
use ctxwin_core::{Level, Role};

/// One check of the archive suite.
type ArchiveCheck = fn(&dyn ArchiveStore);

/// One check of the checkpoint suite.
type SinkCheck = fn(&dyn CheckpointSink);

/// Runs every archive check, each on a fresh store from `open`.
pub fn archive<S: ArchiveStore + ?Sized>(open: &dyn Fn() -> Arc<S>) {
    let checks: [(&str, ArchiveCheck); 12] = [
        ("round trip", round_trip),
        ("all or nothing", all_or_nothing),
        ("scoping", scoping),
        ("search", search),
        ("summaries", summaries),
        ("vectors", vectors),
        ("metrics and usage", metrics_and_usage),
        ("forget", forget),
        ("delete and list", delete_and_list),
        ("identity", identity),
        ("fences", fences),
        ("paging", paging),
    ];
    for (name, check) in checks {
        let store = open();
        let store: &S = &store;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&Adapter(store));
        }));
        if let Err(panic) = result {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("archive conformance check {name:?} failed: {what}");
        }
    }
    let (a, b) = (open(), open());
    assert_ne!(a.identity().unwrap(), b.identity().unwrap(), "two stores share an identity");
}

/// Runs every checkpoint check, each on a fresh sink from `open`.
pub fn checkpoints<S: CheckpointSink + ?Sized>(open: &dyn Fn() -> Arc<S>) {
    let checks: [(&str, SinkCheck); 5] = [
        ("save and load", save_and_load),
        ("prune", prune),
        ("load latest", load_latest),
        ("rewrite", rewrite),
        ("checkpoint scoping", checkpoint_scoping),
    ];
    for (name, check) in checks {
        let sink = open();
        let sink: &S = &sink;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&Sink(sink));
        }));
        if let Err(panic) = result {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("checkpoint conformance check {name:?} failed: {what}");
        }
    }
}

/// A `?Sized` store as a `dyn ArchiveStore` (a `&dyn` of an unsized store cannot be made
/// directly).
#[derive(Debug)]
struct Adapter<'a, S: ArchiveStore + ?Sized>(&'a S);

impl<S: ArchiveStore + ?Sized> ArchiveStore for Adapter<'_, S> {
    fn write(&self, writes: &[super::Write<'_>]) -> Result<(), StoreError> {
        self.0.write(writes)
    }
    fn write_owned(&self, writes: Vec<PendingWrite>) -> Result<(), super::Unwritten> {
        self.0.write_owned(writes)
    }
    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.0.get_many(scope, ids)
    }
    fn get(&self, scope: &Scope, id: u64) -> Result<Option<ArchivedMessage>, StoreError> {
        self.0.get(scope, id)
    }
    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.0.rows_after(scope, after, limit)
    }
    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.0.max_id(scope)
    }
    fn archived_through(&self, scope: &Scope, wanted: u64) -> Result<u64, StoreError> {
        self.0.archived_through(scope, wanted)
    }
    fn search(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<super::SearchHit>, StoreError> {
        self.0.search(scope, query)
    }
    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.0.summary(scope, id)
    }
    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<super::SummaryHit>, StoreError> {
        self.0.search_summaries(scope, query)
    }
    fn drill_down(&self, scope: &Scope, id: u64) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.0.drill_down(scope, id)
    }
    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.0.put_vectors(scope, fence, model, vectors)
    }
    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<super::VectorRow>, StoreError> {
        self.0.vectors(scope, model, after)
    }
    fn metrics(&self, scope: &Scope) -> Result<super::MetricsSummary, StoreError> {
        self.0.metrics(scope)
    }
    fn usage(&self, scope: &Scope) -> Result<super::Usage, StoreError> {
        self.0.usage(scope)
    }
    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<super::Forgotten, StoreError> {
        self.0.forget(scope, fence, what)
    }
    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.0.delete_from(scope, fence, first)
    }
    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.0.delete_conversation(scope, fence)
    }
    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.0.conversations(tenant, prefix)
    }
    fn identity(&self) -> Result<String, StoreError> {
        self.0.identity()
    }
    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.0.acquire(scope)
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.0.current_fence(scope)
    }

    fn acquire_if_overtaken(
        &self,
        scope: &Scope,
        held: Fence,
    ) -> Result<Option<Fence>, StoreError> {
        self.0.acquire_if_overtaken(scope, held)
    }
    fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
        self.0.flush(scope)
    }
}

/// A `?Sized` sink as a `dyn CheckpointSink`.
#[derive(Debug)]
struct Sink<'a, S: CheckpointSink + ?Sized>(&'a S);

impl<S: CheckpointSink + ?Sized> CheckpointSink for Sink<'_, S> {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        self.0.save(scope, fence, payload)
    }
    fn save_and_prune(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: usize,
    ) -> Result<(CheckpointId, Result<Vec<CheckpointId>, StoreError>), StoreError> {
        self.0.save_and_prune(scope, fence, payload, keep)
    }
    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        self.0.ids(scope)
    }
    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        self.0.newest_id(scope)
    }
    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        self.0.load(scope, id)
    }
    fn list(&self, scope: &Scope) -> Result<Vec<super::CheckpointInfo>, StoreError> {
        self.0.list(scope)
    }
    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        self.0.prune(scope, fence, keep)
    }
    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        self.0.rewrite(scope, fence, mask)
    }
    fn load_latest(
        &self,
        scope: &Scope,
        accept: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Option<super::Loaded>, StoreError> {
        self.0.load_latest(scope, accept)
    }
    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        self.0.location(scope, id)
    }
    fn place(&self, scope: &Scope) -> String {
        self.0.place(scope)
    }
}

fn text(id: u64, role: Role, content: &str) -> ArchivedMessage {
    ArchivedMessage::new(id, id, ChatMessage::text(role, content)).with_timestamp(1_000 + id)
}

/// A row with every field set.
fn full_row(id: u64) -> ArchivedMessage {
    let mut message = ChatMessage::tool_result(format!("call_{id}"), "head [Data Truncated] tail");
    message.name = Some("reader".into());
    message.is_error = true;
    ArchivedMessage::new(id, 7, message)
        .with_level(Level::Volatile)
        .with_timestamp(1_700_000_000_000)
        .with_tokens(321)
        .with_original("head middle tail")
        .with_raw(r#"{"role":"tool","tool_call_id":"call_1","content":"head middle tail"}"#)
}

fn put(store: &dyn ArchiveStore, scope: &Scope, rows: &[ArchivedMessage]) {
    store.put(scope, Fence::NONE, rows).unwrap();
    store.flush(scope).unwrap();
}

fn round_trip(store: &dyn ArchiveStore) {
    let s = Scope::local("conv");
    let call = ToolCall::new("c1", "read_file", r#"{"path":"Cargo.toml"}"#);
    let asks = ArchivedMessage::new(3, 3, ChatMessage::assistant_calls("reading", vec![call]));
    let rows = [text(1, Role::User, "hello"), full_row(2), asks];
    put(store, &s, &rows);
    for row in &rows {
        assert_eq!(store.get(&s, row.id).unwrap().as_ref(), Some(row), "row {}", row.id);
    }
    assert_eq!(store.get(&s, 99).unwrap(), None);
    let many = store.get_many(&s, &[3, 99, 1, 3]).unwrap();
    assert_eq!(many.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 3], "id order, each once");
    assert_eq!(store.max_id(&s).unwrap(), Some(3));
    let replaced = text(1, Role::User, "hello again");
    put(store, &s, std::slice::from_ref(&replaced));
    assert_eq!(store.get(&s, 1).unwrap(), Some(replaced), "a row put again replaces it");
}

fn all_or_nothing(store: &dyn ArchiveStore) {
    let (a, b) = (Scope::local("a"), Scope::new("t", "b"));
    let good = [text(1, Role::User, "fine")];
    let bad = [text(2, Role::User, "bad").with_timestamp(u64::MAX)];
    let batch = [
        PendingWrite { scope: a.clone(), fence: Fence::NONE, op: PendingOp::Rows(good.to_vec()) },
        PendingWrite { scope: b.clone(), fence: Fence::NONE, op: PendingOp::Rows(bad.to_vec()) },
    ];
    let writes: Vec<_> = batch.iter().map(PendingWrite::as_write).collect();
    let error = store.write(&writes).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    store.flush(&a).unwrap();
    assert_eq!(store.get(&a, 1).unwrap(), None, "nothing of a refused batch is written");
    let refused = store.write_owned(batch.to_vec()).unwrap_err();
    assert_eq!((refused.error.kind(), refused.writes.len()), (ErrorKind::Invalid, 2));
    assert_eq!(refused.writes, batch, "what was not written comes back, in order");
    store.flush(&a).unwrap();
    assert_eq!(store.get(&a, 1).unwrap(), None);
    let huge = [ArchivedMessage::new(u64::MAX, 1, ChatMessage::text(Role::User, "x"))];
    assert_eq!(store.put(&a, Fence::NONE, &huge).unwrap_err().kind(), ErrorKind::Invalid);
    let summary = SummaryRecord::new(50, 1, "both scopes in one batch", vec![1]);
    let batch = [
        PendingWrite { scope: a.clone(), fence: Fence::NONE, op: PendingOp::Rows(good.to_vec()) },
        PendingWrite { scope: b.clone(), fence: Fence::NONE, op: PendingOp::Summary(summary) },
    ];
    let writes: Vec<_> = batch.iter().map(PendingWrite::as_write).collect();
    store.write(&writes).unwrap();
    store.flush(&a).unwrap();
    store.flush(&b).unwrap();
    assert!(store.get(&a, 1).unwrap().is_some() && store.summary(&b, 50).unwrap().is_some());
    let owned = vec![PendingWrite {
        scope: a.clone(),
        fence: Fence::NONE,
        op: PendingOp::Rows(vec![text(2, Role::User, "taken by value")]),
    }];
    store.write_owned(owned).unwrap();
    store.flush(&a).unwrap();
    assert_eq!(store.get(&a, 2).unwrap().unwrap().message.content, "taken by value");
}

fn scoping(store: &dyn ArchiveStore) {
    let mine = Scope::new("acme", "chat");
    let theirs = Scope::new("globex", "chat");
    let local = Scope::local("chat");
    put(store, &mine, &[text(1, Role::User, "the deploy key rotates on friday")]);
    let query = SearchQuery::new("deploy key", 10);
    let alone = store.search(&mine, &query).unwrap();
    let crowd: Vec<_> = (1..=40)
        .map(|id| text(id, Role::User, &format!("deploy key number {id} of the other tenant")))
        .collect();
    put(store, &theirs, &crowd);
    put(store, &local, &[text(1, Role::User, "local deploy key")]);
    assert_eq!(store.search(&mine, &query).unwrap(), alone, "another scope is never ranked in");
    assert_eq!(
        store.get(&mine, 1).unwrap().unwrap().message.content,
        "the deploy key rotates on friday"
    );
    assert_eq!(store.max_id(&mine).unwrap(), Some(1));
    assert_eq!(store.rows_after(&mine, 0, 100).unwrap().len(), 1);
    assert_eq!(store.usage(&mine).unwrap().messages, 1);
    assert_eq!(store.usage(&theirs).unwrap().messages, 40);
    assert!(store.search(&Scope::new("nobody", "chat"), &query).unwrap().is_empty());
    assert_eq!(store.conversations("acme", "").unwrap(), ["chat"]);
    assert_eq!(store.conversations("", "").unwrap(), ["chat"]);
    assert!(store.conversations("nobody", "").unwrap().is_empty());
}

fn search(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    let rows = [
        text(1, Role::User, "the tokenizer drops emoji"),
        text(2, Role::Assistant, "deploy to staging after the emoji fix"),
        text(3, Role::User, "emoji emoji emoji everywhere"),
        text(4, Role::User, "nothing relevant here"),
    ];
    put(store, &s, &rows);
    let hits = store.search(&s, &SearchQuery::new("emoji", 10)).unwrap();
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert_eq!(hits[0].score, 1.0, "the best hit scores 1");
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score), "best first");
    assert!(hits.iter().all(|h| h.score > 0.0 && h.score <= 1.0), "scores in (0, 1]");
    assert!(hits.iter().all(|h| h.snippet.is_empty()), "no snippet unless asked");
    let hit = hits.iter().find(|h| h.id == 2).unwrap();
    assert_eq!((hit.role, hit.unit, hit.timestamp), (Role::Assistant, 2, 1_002));
    assert_eq!(hit.content, rows[1].message.content);
    let snipped = store.search(&s, &SearchQuery::new("emoji", 10).with_snippets()).unwrap();
    assert!(snipped.iter().all(|h| h.snippet.contains("«")), "{snipped:?}");
    assert_eq!(store.search(&s, &SearchQuery::new("emoji", 1)).unwrap().len(), 1);
    assert!(store.search(&s, &SearchQuery::new("emoji", 0)).unwrap().is_empty());
    for hostile in ["", "   ", "\"* AND -x (", "NEAR(a b)", "col:val", "😀", "'; DROP TABLE x"] {
        store.search(&s, &SearchQuery::new(hostile, 5).with_snippets()).unwrap();
        store.search_summaries(&s, &SearchQuery::new(hostile, 5)).unwrap();
    }
    let original = [text(5, Role::Tool, "[Data Truncated]").with_original("a stacktrace in full")];
    put(store, &s, &original);
    let found = store.search(&s, &SearchQuery::new("stacktrace", 5)).unwrap();
    assert_eq!(found.first().map(|h| h.id), Some(5), "originals are searched");
}

fn summaries(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    let rows: Vec<_> = (1..=4).map(|id| text(id, Role::User, &format!("step {id}"))).collect();
    put(store, &s, &rows);
    let mut one = SummaryRecord::new(10, 1, "steps one and two of the migration", vec![1, 2]);
    one.tokens_before = 90;
    one.tokens_after = 12;
    one.created_at = 5;
    for summary in [one.clone(), SummaryRecord::new(11, 1, "steps three and four", vec![3, 4])] {
        store.put_summary(&s, Fence::NONE, &summary).unwrap();
    }
    store
        .put_summary(&s, Fence::NONE, &SummaryRecord::new(20, 2, "all steps", vec![11, 10, 99]))
        .unwrap();
    store.flush(&s).unwrap();
    assert_eq!(store.summary(&s, 10).unwrap(), Some(one));
    assert_eq!(store.summary(&s, 12).unwrap(), None);
    let ids: Vec<u64> = store.drill_down(&s, 20).unwrap().iter().map(|m| m.id).collect();
    assert_eq!(ids, [1, 2, 3, 4], "drill-down expands summaries of summaries, in id order");
    assert_eq!(store.drill_down(&s, 77).unwrap_err().kind(), ErrorKind::NotFound);
    let hits = store.search_summaries(&s, &SearchQuery::new("migration", 5)).unwrap();
    assert_eq!(hits.iter().map(|h| (h.id, h.level)).collect::<Vec<_>>(), [(10, 1)]);
    assert_eq!(hits[0].score, 1.0);
    store.put_summary(&s, Fence::NONE, &SummaryRecord::new(10, 1, "replaced", vec![4])).unwrap();
    store.flush(&s).unwrap();
    assert_eq!(store.summary(&s, 10).unwrap().unwrap().source_ids, [4]);
}

fn vectors(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    put(store, &s, &[text(1, Role::User, "one"), text(2, Role::User, "two")]);
    store
        .put_vectors(
            &s,
            Fence::NONE,
            "m",
            &[(1, vec![0.5, -1.0]), (2, vec![2.0, 0.0]), (9, vec![1.0, 1.0])],
        )
        .unwrap();
    store.put_vectors(&s, Fence::NONE, "n", &[(1, vec![3.0])]).unwrap();
    let rows = store.vectors(&s, "m", 0).unwrap();
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2], "ids with no row skipped");
    assert_eq!(rows[0].vector.as_deref(), Some(&[0.5, -1.0][..]));
    assert_eq!(rows[0].content, "one");
    assert_eq!(store.vectors(&s, "m", 1).unwrap().len(), 1);
    assert!(store.vectors(&s, "other", 0).unwrap().iter().all(|r| r.vector.is_none()));
    assert_eq!(store.usage(&s).unwrap().vectors, 3);
    put(store, &s, &[text(2, Role::User, "deux")]);
    let rows = store.vectors(&s, "m", 0).unwrap();
    assert_eq!(rows[1].vector, None, "a content change drops the vector");
    assert!(store.vectors(&Scope::local("other"), "m", 0).unwrap().is_empty());
}

fn metrics_and_usage(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    store
        .record_compression(&s, Fence::NONE, &CompressionRecord::new(1, 100, 50, "reduce"))
        .unwrap();
    let mut summarize = CompressionRecord::new(2, 100, 10, "summarize");
    summarize.units_evicted = 3;
    store.record_compression(&s, Fence::NONE, &summarize).unwrap();
    store.record_compression(&Scope::local("t"), Fence::NONE, &summarize).unwrap();
    store.flush(&s).unwrap();
    let metrics = store.metrics(&s).unwrap();
    assert_eq!((metrics.total.events, metrics.total.tokens_saved()), (2, 140));
    assert_eq!(
        metrics.by_strategy.iter().map(|m| m.strategy.as_str()).collect::<Vec<_>>(),
        ["reduce", "summarize"]
    );
    assert_eq!(metrics.total.units_evicted, 3);
    let usage = store.usage(&s).unwrap();
    assert_eq!((usage.messages, usage.compression_events), (0, 2));
    assert_eq!(store.metrics(&Scope::local("none")).unwrap().total.events, 0);
}

fn forget(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    let other = Scope::new("other", "s");
    let secret = "hunter2-xyz";
    let call = ToolCall::new("c9", "login", format!(r#"{{"password":"{secret}"}}"#));
    let rows = [
        text(1, Role::User, &format!("the deploy key is {secret}")),
        text(2, Role::User, "keep this one"),
        text(3, Role::Tool, "[Data Truncated]").with_original(format!("log line {secret}")),
        ArchivedMessage::new(4, 4, ChatMessage::assistant_calls("", vec![call])),
        text(5, Role::User, "raw only").with_raw(format!(r#"{{"content":"{secret}"}}"#)),
        text(6, Role::User, "forget me by id"),
    ];
    put(store, &s, &rows);
    put(store, &other, &rows);
    store
        .put_summary(&s, Fence::NONE, &SummaryRecord::new(20, 1, format!("said {secret}"), vec![2]))
        .unwrap();
    store
        .put_summary(&s, Fence::NONE, &SummaryRecord::new(21, 1, "stands for six", vec![6]))
        .unwrap();
    store
        .put_vectors(&s, Fence::NONE, "m", &[(1, vec![1.0]), (6, vec![1.0]), (2, vec![1.0])])
        .unwrap();
    let forgotten = store.forget(&s, Fence::NONE, &Forget { ids: &[6], texts: &[secret] }).unwrap();
    assert_eq!(forgotten.messages, [1, 3, 4, 5, 6]);
    assert_eq!(forgotten.summaries, [20, 21]);
    for row in store.rows_after(&s, 0, 100).unwrap() {
        let all = format!("{row:?}");
        assert!(!all.contains(secret), "row {} still holds the text: {all}", row.id);
    }
    assert_eq!(
        store.get(&s, 1).unwrap().unwrap().message.content,
        format!("the deploy key is {FORGOTTEN}")
    );
    assert_eq!(store.get(&s, 6).unwrap().unwrap().message.content, FORGOTTEN);
    assert_eq!(store.get(&s, 2).unwrap().unwrap(), rows[1], "untouched rows stay");
    assert!(!store.summary(&s, 20).unwrap().unwrap().text.contains(secret));
    assert!(store.search(&s, &SearchQuery::new(secret, 5)).unwrap().is_empty());
    assert!(store.search(&s, &SearchQuery::new("hunter2", 5)).unwrap().is_empty());
    let vectors = store.vectors(&s, "m", 0).unwrap();
    let with: Vec<u64> = vectors.iter().filter(|r| r.vector.is_some()).map(|r| r.id).collect();
    assert_eq!(with, [2], "vectors of changed rows go");
    assert_eq!(store.get(&other, 1).unwrap().unwrap(), rows[0], "another scope is untouched");
}

fn delete_and_list(store: &dyn ArchiveStore) {
    let s = Scope::local("main");
    let rows: Vec<_> = (1..=5).map(|id| text(id, Role::User, &format!("turn {id}"))).collect();
    put(store, &s, &rows);
    put(store, &Scope::local("main@rewound-1"), &rows[..1]);
    put(store, &Scope::local("other"), &rows[..1]);
    store.put_summary(&s, Fence::NONE, &SummaryRecord::new(4, 1, "late", vec![1])).unwrap();
    store.flush(&s).unwrap();
    assert_eq!(store.delete_from(&s, Fence::NONE, 3).unwrap(), 3);
    assert_eq!(store.max_id(&s).unwrap(), Some(2));
    assert_eq!(store.summary(&s, 4).unwrap(), None, "summaries from the id on go too");
    assert_eq!(store.conversations("", "main").unwrap(), ["main", "main@rewound-1"]);
    assert_eq!(store.delete_conversation(&s, Fence::NONE).unwrap(), 2);
    assert_eq!(store.max_id(&s).unwrap(), None);
    assert_eq!(store.conversations("", "").unwrap(), ["main@rewound-1", "other"]);
}

fn identity(store: &dyn ArchiveStore) {
    let first = store.identity().unwrap();
    assert!(!first.is_empty());
    put(store, &Scope::local("s"), &[text(1, Role::User, "x")]);
    assert_eq!(store.identity().unwrap(), first, "an identity never changes");
}

fn fences(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    let first = store.acquire(&s).unwrap();
    store.put(&s, first, &[text(1, Role::User, "first writer")]).unwrap();
    store.put(&s, Fence::NONE, &[text(2, Role::User, "unfenced")]).unwrap();
    store.flush(&s).unwrap();
    assert_eq!(store.current_fence(&s).unwrap(), first);
    let second = store.acquire(&s).unwrap();
    if first.is_none() {
        assert!(second.is_none(), "an adapter without leases hands out no fences");
        assert!(store.current_fence(&s).unwrap().is_none());
        return;
    }
    assert!(second > first, "a new lease has a newer fence");
    assert_eq!(store.current_fence(&s).unwrap(), second, "the newest, read without taking it");
    assert!(store.current_fence(&Scope::local("never leased")).unwrap().is_none());
    let stale = store.put(&s, first, &[text(1, Role::User, "stale writer")]);
    let stale = stale.and_then(|()| store.flush(&s));
    assert_eq!(stale.unwrap_err().kind(), ErrorKind::Fenced);
    assert_eq!(store.get(&s, 1).unwrap().unwrap().message.content, "first writer");
    store.put(&s, second, &[text(1, Role::User, "new holder")]).unwrap();
    store.flush(&s).unwrap();
    assert_eq!(store.get(&s, 1).unwrap().unwrap().message.content, "new holder");
    // Taken over only when overtaken; names any text may be (quotes, backslashes).
    assert_eq!(store.acquire_if_overtaken(&s, second).unwrap(), None, "still the newest");
    assert_eq!(store.current_fence(&s).unwrap(), second, "nothing taken");
    let third = store.acquire_if_overtaken(&s, first).unwrap().expect("overtaken: taken");
    assert!(third > second);
    assert_eq!(store.current_fence(&s).unwrap(), third);
    let odd = Scope::new("o'neil \\ ", "it's 'quoted' \\' -- ;");
    assert_eq!(store.acquire_if_overtaken(&odd, first).unwrap(), None, "never leased");
    let (taken, newer) = (store.acquire(&odd).unwrap(), store.acquire(&odd).unwrap());
    assert_eq!(store.current_fence(&odd).unwrap(), newer);
    let retaken = store.acquire_if_overtaken(&odd, taken).unwrap().expect("overtaken: taken");
    assert!(retaken > newer);
    assert_eq!(store.current_fence(&s).unwrap(), third, "another scope's lease is its own");
}

fn paging(store: &dyn ArchiveStore) {
    let s = Scope::local("s");
    let rows: Vec<_> = (1..=25).map(|id| text(id * 2, Role::User, &format!("turn {id}"))).collect();
    put(store, &s, &rows);
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = store.rows_after(&s, after, 7).unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        assert!(page.len() <= 7);
        seen.extend(page.iter().map(|r| r.id));
    }
    assert_eq!(seen, rows.iter().map(|r| r.id).collect::<Vec<_>>());
    assert!(store.rows_after(&s, u64::MAX, 10).unwrap().is_empty());
}

/// Damage to a stored row (by `damage`, the adapter's way of flipping bytes where it keeps
/// row `id` of a scope) is reported as [`ErrorKind::Damaged`] by every read that would serve
/// it, and never served as text.
pub fn damaged_row<S: ArchiveStore + ?Sized>(store: &S, damage: &dyn Fn(&Scope, u64) -> bool) {
    let s = Scope::new("t", "damaged");
    let rows = [
        text(1, Role::User, "an intact neighbour"),
        text(2, Role::User, "the quarterly report is due on monday"),
        text(3, Role::User, "another intact neighbour"),
    ];
    store.put(&s, Fence::NONE, &rows).unwrap();
    store.flush(&s).unwrap();
    assert!(damage(&s, 2), "the adapter could not damage the row");
    let damaged = |result: Result<(), StoreError>| {
        let error = result.expect_err("a damaged row was served");
        assert_eq!(error.kind(), ErrorKind::Damaged, "{error}");
    };
    damaged(store.get(&s, 2).map(drop));
    damaged(store.get_many(&s, &[1, 2, 3]).map(drop));
    damaged(store.rows_after(&s, 0, 10).map(drop));
    damaged(store.search(&s, &SearchQuery::new("quarterly report", 5)).map(drop));
    damaged(store.vectors(&s, "m", 0).map(drop));
    assert_eq!(store.get(&s, 1).unwrap().as_ref(), Some(&rows[0]), "intact rows still read");
}

/// Damage to a stored checkpoint (by `damage`) is reported, and a restore falls back to the
/// newest intact one and says what it skipped.
pub fn damaged_checkpoint<S: CheckpointSink + ?Sized>(
    sink: &S,
    damage: &dyn Fn(&Scope, &CheckpointId) -> bool,
) {
    let s = Scope::new("t", "damaged");
    let good = sink.save(&s, Fence::NONE, b"intact payload").unwrap();
    let bad = sink.save(&s, Fence::NONE, b"the newest payload, soon damaged").unwrap();
    assert!(damage(&s, &bad), "the adapter could not damage the checkpoint");
    assert_eq!(sink.load(&s, &bad).unwrap_err().kind(), ErrorKind::Damaged);
    let loaded = sink.load_latest(&s, &mut |_| Ok(())).unwrap().unwrap();
    assert_eq!((loaded.id, loaded.bytes), (good, b"intact payload".to_vec()));
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!(loaded.skipped[0].id, bad);
    assert!(matches!(loaded.skipped[0].reason, SkipReason::Damaged(_)));
    let listed = sink.list(&s).unwrap();
    assert!(matches!(listed[0].status, CheckpointStatus::Damaged(_)), "{:?}", listed[0]);
    assert_eq!(listed[1].status, CheckpointStatus::Ok);
}

fn save_and_load(sink: &dyn CheckpointSink) {
    let s = Scope::new("t", "c");
    assert!(sink.ids(&s).unwrap().is_empty());
    assert_eq!(sink.load_latest(&s, &mut |_| Ok(())).unwrap(), None);
    let ids: Vec<_> = (0..5u8).map(|n| sink.save(&s, Fence::NONE, &[n; 3]).unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow");
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(sink.ids(&s).unwrap(), newest_first);
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(sink.load(&s, id).unwrap(), [n as u8; 3]);
    }
    let listed = sink.list(&s).unwrap();
    assert_eq!(listed.iter().map(|i| i.id.clone()).collect::<Vec<_>>(), newest_first);
    assert!(listed.iter().all(|i| i.status == CheckpointStatus::Ok && i.size >= 3));
    let missing = CheckpointId::parse("20000101T000000.000000Z-000000").unwrap();
    assert_eq!(sink.load(&s, &missing).unwrap_err().kind(), ErrorKind::NotFound);
    let empty = sink.save(&s, Fence::NONE, b"").unwrap();
    assert_eq!(sink.load(&s, &empty).unwrap(), b"");
}

fn prune(sink: &dyn CheckpointSink) {
    let s = Scope::local("c");
    let ids: Vec<_> = (0..6u8).map(|n| sink.save(&s, Fence::NONE, &[n]).unwrap()).collect();
    let pruned = sink.prune(&s, Fence::NONE, 2).unwrap();
    assert_eq!(pruned.len(), 4);
    assert!(pruned.iter().all(|id| ids[..4].contains(id)));
    assert_eq!(sink.ids(&s).unwrap(), [ids[5].clone(), ids[4].clone()]);
    assert!(sink.prune(&s, Fence::NONE, 2).unwrap().is_empty());
    // Saved and pruned at once: the new one is among those kept.
    let (newest, pruned) = sink.save_and_prune(&s, Fence::NONE, &[6], 2).unwrap();
    assert_eq!(pruned.unwrap(), [ids[4].clone()]);
    assert_eq!(sink.ids(&s).unwrap(), [newest.clone(), ids[5].clone()]);
    assert_eq!(sink.load(&s, &newest).unwrap(), [6]);
    let (only, pruned) = sink.save_and_prune(&s, Fence::NONE, &[7], 1).unwrap();
    let mut pruned = pruned.unwrap();
    pruned.sort();
    assert_eq!(pruned, [ids[5].clone(), newest], "in any order");
    assert_eq!(sink.ids(&s).unwrap(), [only]);
}

fn load_latest(sink: &dyn CheckpointSink) {
    let s = Scope::local("c");
    let accepted = sink.save(&s, Fence::NONE, b"v1:state").unwrap();
    let rejected = sink.save(&s, Fence::NONE, b"v9:state").unwrap();
    let loaded = sink
        .load_latest(&s, &mut |bytes| {
            if bytes.starts_with(b"v1:") { Ok(()) } else { Err("unknown version".into()) }
        })
        .unwrap()
        .unwrap();
    assert_eq!(loaded.id, accepted);
    assert_eq!(loaded.skipped[0].id, rejected);
    assert_eq!(loaded.skipped[0].reason, SkipReason::Rejected("unknown version".into()));
    let none = sink.load_latest(&s, &mut |_| Err("no".into())).unwrap_err();
    assert!(
        matches!(none, StoreError::NoUsableCheckpoint { ref skipped, .. } if skipped.len() == 2)
    );
}

fn rewrite(sink: &dyn CheckpointSink) {
    let s = Scope::local("c");
    let old = sink.save(&s, Fence::NONE, b"the secret is 42").unwrap();
    let kept = sink.save(&s, Fence::NONE, b"nothing to hide").unwrap();
    let new = sink.save(&s, Fence::NONE, b"secret again").unwrap();
    let mask = |bytes: &[u8]| -> Option<Vec<u8>> {
        let text = String::from_utf8_lossy(bytes);
        text.contains("secret").then(|| text.replace("secret", "******").into_bytes())
    };
    assert_eq!(sink.rewrite(&s, Fence::NONE, &mask).unwrap(), 2);
    assert_eq!(sink.load(&s, &old).unwrap(), b"the ****** is 42");
    assert_eq!(sink.load(&s, &kept).unwrap(), b"nothing to hide");
    assert_eq!(sink.ids(&s).unwrap(), [new.clone(), kept, old], "the order is kept");
    assert_eq!(sink.load_latest(&s, &mut |_| Ok(())).unwrap().unwrap().id, new);
}

fn checkpoint_scoping(sink: &dyn CheckpointSink) {
    let (a, b) = (Scope::new("acme", "c"), Scope::new("globex", "c"));
    let id = sink.save(&a, Fence::NONE, b"acme's").unwrap();
    assert!(sink.ids(&b).unwrap().is_empty(), "another scope's checkpoints are never listed");
    assert!(sink.load(&b, &id).is_err(), "nor loaded");
    assert_eq!(sink.load_latest(&b, &mut |_| Ok(())).unwrap(), None);
    sink.save(&b, Fence::NONE, b"globex's").unwrap();
    assert_eq!(sink.prune(&b, Fence::NONE, 0).unwrap().len(), 1);
    assert_eq!(sink.load(&a, &id).unwrap(), b"acme's", "pruning one scope leaves the other");
}
