//! The conformance suite and the adapter's own checks, against the server `CTXWIN_PG_URL`
//! names (each store in a fresh schema); they say they skipped without it.

use std::sync::{Arc, Mutex};

use super::testing::TestSchema;
use super::*;
use crate::store::{ArchiveStore, CheckpointId, conformance};

/// Runs `check` with a function opening a fresh store each call (each in its own schema,
/// kept until the check ends); skips without a server.
fn with_stores(test: &str, check: impl FnOnce(&dyn Fn() -> Arc<PgStore>)) {
    let Some(first) = TestSchema::new(test) else { return };
    drop(first.unwrap());
    let schemas = Mutex::new(Vec::new());
    let open = || {
        let schema = TestSchema::new(test).unwrap().unwrap();
        let store = Arc::new(schema.open().unwrap());
        schemas.lock().unwrap().push(schema);
        store
    };
    check(&open);
}

#[test]
fn passes_the_archive_conformance_suite() {
    with_stores("archive conformance", |open| conformance::archive(open));
}

#[test]
fn passes_the_checkpoint_conformance_suite() {
    with_stores("checkpoint conformance", |open| conformance::checkpoints(open));
}

#[test]
fn passes_the_record_conformance_suite() {
    with_stores("record conformance", |open| conformance::records(open));
}

#[test]
fn a_damaged_record_is_reported_not_served() {
    with_stores("record damage", |open| {
        let store = open();
        let damage = |scope: &Scope, collection: &str, key: &str| {
            store.damage_record_for_tests(scope, collection, key).unwrap()
        };
        conformance::damaged_record(store.as_ref(), &damage);
    });
}

#[test]
fn damage_is_reported_not_served() {
    with_stores("damage", |open| {
        let store = open();
        let damage = |scope: &Scope, id: u64| store.damage_row_for_tests(scope, id).unwrap();
        conformance::damaged_row(store.as_ref(), &damage);
        let sink = open();
        let damage =
            |scope: &Scope, id: &CheckpointId| sink.damage_checkpoint_for_tests(scope, id).unwrap();
        conformance::damaged_checkpoint(sink.as_ref(), &damage);
    });
}

#[test]
fn nul_bytes_and_the_escape_round_trip() {
    with_stores("nul", |open| {
        let store = open();
        let scope = Scope::new("te\0nant\u{FFFF}", "conv\0");
        let text = "binary \0 output \u{FFFF} end";
        let row = crate::store::ArchivedMessage::new(
            1,
            1,
            crate::ChatMessage::text(ctxwin_core::Role::Tool, text),
        )
        .with_original(format!("{text} in full"))
        .with_raw(format!("{{\"content\":\"{text}\"}}"));
        store.put(&scope, Fence::NONE, std::slice::from_ref(&row)).unwrap();
        assert_eq!(store.get(&scope, 1).unwrap(), Some(row));
        assert_eq!(store.conversations("te\0nant\u{FFFF}", "conv").unwrap(), ["conv\0"]);
        let hits = store.search(&scope, &crate::store::SearchQuery::new("binary output", 5));
        assert_eq!(hits.unwrap().len(), 1);
        let forgotten = store
            .forget(&scope, Fence::NONE, &crate::store::Forget { ids: &[], texts: &["\0"] })
            .unwrap();
        assert_eq!(forgotten.messages, [1]);
        assert!(!store.get(&scope, 1).unwrap().unwrap().message.content.contains('\0'));
    });
}

#[test]
fn opens_refuse_bad_urls_and_options() {
    let invalid = PgStore::open("postgres://a:b@127.0.0.1:1/x?bogus=1").unwrap_err();
    assert_eq!(invalid.kind(), crate::store::ErrorKind::Invalid, "{invalid}");
    let options = PgOptions { max_connections: 1, min_idle: 2, ..PgOptions::default() };
    let invalid = PgStore::open_with("postgres://127.0.0.1/x", options).unwrap_err();
    assert_eq!(invalid.kind(), crate::store::ErrorKind::Invalid);
    let options = PgOptions { connect_timeout: Duration::from_secs(2), ..PgOptions::default() };
    let unreachable =
        PgStore::open_with("postgres://ctxwin:pw@127.0.0.1:1/x", options).unwrap_err();
    assert_eq!(unreachable.kind(), crate::store::ErrorKind::Io, "{unreachable}");
    assert!(!unreachable.to_string().contains("pw"), "no password in errors: {unreachable}");
}

#[test]
fn ranks_as_the_in_memory_store_does() {
    use crate::store::{ArchivedMessage, MemoryStore, SearchHit, SearchQuery};
    with_stores("bm25", |open| {
        let pg = open();
        let memory = MemoryStore::new();
        let texts = [
            "the tokenizer drops emoji",
            "deploy to staging after the emoji fix",
            "emoji emoji emoji everywhere",
            "nothing relevant here",
            "the deploy key rotates on friday, deploy it",
            "Sofia has taken up pottery and took a class",
            "what hobby did Sofia take up",
        ];
        let rows: Vec<_> = (1..)
            .zip(texts)
            .map(|(id, text)| {
                let message = crate::ChatMessage::text(ctxwin_core::Role::User, text);
                ArchivedMessage::new(id, id, message)
            })
            .collect();
        let s = Scope::local("s");
        pg.put(&s, Fence::NONE, &rows).unwrap();
        // Another conversation's rows change no score (statistics are the conversation's).
        pg.put(&Scope::local("other"), Fence::NONE, &rows[..2]).unwrap();
        memory.put(&s, Fence::NONE, &rows).unwrap();
        let ranked = |hits: Vec<SearchHit>| -> Vec<(u64, f64)> {
            hits.iter().map(|hit| (hit.id, hit.score)).collect()
        };
        for text in ["emoji", "deploy emoji", "Sofia take up pottery", "the", "DEPLOY"] {
            let query = SearchQuery::new(text, 10);
            let (from_pg, from_memory) = (
                ranked(pg.search(&s, &query).unwrap()),
                ranked(memory.search(&s, &query).unwrap()),
            );
            assert_eq!(from_pg.len(), from_memory.len(), "{text}: {from_pg:?} {from_memory:?}");
            for ((pg_id, pg_score), (id, score)) in from_pg.iter().zip(&from_memory) {
                assert_eq!(pg_id, id, "{text}: {from_pg:?} {from_memory:?}");
                assert!((pg_score - score).abs() < 1e-9, "{text}: {from_pg:?} {from_memory:?}");
            }
        }
        let snipped = pg.search(&s, &SearchQuery::new("pottery", 1).with_snippets()).unwrap();
        assert_eq!(snipped[0].snippet, "Sofia has taken up «pottery» and took a class");
    });
}

#[test]
fn prune_and_delete_through_the_ports() {
    let Some(schema) = TestSchema::new("ports") else { return };
    let schema = schema.unwrap();
    let location = crate::store::Location::parse(schema.url());
    crate::store::open::prune_and_delete(&crate::store::open(&location).unwrap());
}
