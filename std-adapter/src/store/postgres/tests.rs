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

/// As behind a transaction-mode pooler that keeps no prepared statement: every statement
/// sent unnamed (`?prepared_statements=off`).
#[test]
fn passes_the_conformance_suites_with_every_statement_unnamed() {
    let Some(first) = TestSchema::new("unnamed") else { return };
    drop(first.unwrap());
    let schemas = Mutex::new(Vec::new());
    let open = || {
        let schema = TestSchema::new("unnamed").unwrap().unwrap();
        let url = format!("{}&prepared_statements=off", schema.url());
        let store = Arc::new(PgStore::open(&url).unwrap());
        assert!(!store.inner.options.prepared_statements);
        schemas.lock().unwrap().push(schema);
        store
    };
    conformance::archive(&open);
    conformance::checkpoints(&open);
}

/// A store that keeps its statements prepared has the server keep their generic plans
/// (planned once per connection, not on every execution); one sending them unnamed leaves
/// the server's setting alone.
#[test]
fn prepared_statements_run_on_generic_plans() {
    let Some(schema) = TestSchema::new("generic plans") else { return };
    let schema = schema.unwrap();
    let setting = |store: &PgStore| -> String {
        store
            .run(|client| {
                let row =
                    client.query_typed_one("SELECT current_setting('plan_cache_mode')", &[])?;
                get(&row, 0)
            })
            .unwrap()
    };
    assert_eq!(setting(&schema.open().unwrap()), "force_generic_plan");
    let unnamed = PgStore::open(&format!("{}&prepared_statements=off", schema.url())).unwrap();
    assert_eq!(setting(&unnamed), "auto");
}

#[test]
fn the_url_turns_prepared_statements_off_and_nothing_else() {
    let plain = "postgres://u:p@h:1/d";
    assert_eq!(take_prepared_setting(plain).unwrap(), (plain.to_string(), None));
    let (url, off) = take_prepared_setting(&format!("{plain}?prepared_statements=off")).unwrap();
    assert_eq!((url.as_str(), off), (plain, Some(false)));
    let (url, on) =
        take_prepared_setting(&format!("{plain}?options=-cx%3Dy&prepared_statements=on")).unwrap();
    assert_eq!((url, on), (format!("{plain}?options=-cx%3Dy"), Some(true)));
    let invalid = take_prepared_setting(&format!("{plain}?prepared_statements=maybe")).unwrap_err();
    assert_eq!(invalid.kind(), crate::store::ErrorKind::Invalid);
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

/// A lease's commit does not wait for the disk (`raise_fence`): a server crash can lose it.
/// Simulated here by putting the conversation's row back as it was before the raise, as
/// recovery from a log without the raise would: the previous holder writes on, the one whose
/// lease was lost is refused, and when the same fence number is handed out again to a third
/// handle, the two holding that number are told apart by the holder.
#[test]
fn a_lease_lost_in_a_crash_leaves_no_two_writers_on_one_fence() {
    let Some(schema) = TestSchema::new("lost lease") else { return };
    let schema = schema.unwrap();
    let (a, b, c) = (schema.open().unwrap(), schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::new("t", "c");
    let row = |id: u64, text: &str| {
        crate::store::ArchivedMessage::new(
            id,
            id,
            crate::ChatMessage::text(ctxwin_core::Role::User, text),
        )
    };
    let fenced = |result: Result<(), StoreError>| {
        assert_eq!(result.unwrap_err().kind(), crate::store::ErrorKind::Fenced);
    };
    let first = a.acquire(&s).unwrap();
    a.put(&s, first, &[row(1, "a holds it")]).unwrap();
    // The crash loses `b`'s raise: the row is back to `a`'s fence and holder.
    let lost = b.acquire(&s).unwrap();
    assert!(lost > first);
    let recover = |fence: Fence, holder: i64| {
        a.run(|client| {
            let fence = i64::try_from(fence.0).unwrap();
            client.query_typed(
                "UPDATE conversations SET fence = $1, holder = $2 WHERE tenant = 't' AND name = 'c'",
                &[(&fence, Type::INT8), (&holder, Type::INT8)],
            )?;
            Ok(())
        })
        .unwrap();
    };
    recover(first, a.inner.holder);
    // 1. `b`'s fence is newer than the newest: refused; `a`, as far as the database knows
    //    still the holder, writes on.
    fenced(b.put(&s, lost, &[row(2, "b on a lost lease")]));
    a.put(&s, first, &[row(2, "a writes on")]).unwrap();
    assert_eq!(a.acquire_if_overtaken(&s, first).unwrap(), None, "a still holds it");
    // 2. The same number handed out again, to `c`: `b` holds it too, but not as the holder.
    let again = c.acquire(&s).unwrap();
    assert_eq!(again, lost, "the crash let the number be handed out twice");
    fenced(b.put(&s, lost, &[row(3, "b on c's number")]));
    fenced(crate::store::CheckpointSink::save(&b, &s, lost, b"b's snapshot").map(drop));
    fenced(a.put(&s, first, &[row(3, "a after c took it")]));
    c.put(&s, again, &[row(3, "c holds it")]).unwrap();
    assert_eq!(c.acquire_if_overtaken(&s, again).unwrap(), None, "c holds it");
    // `b`'s catch-up finds itself overtaken (same number, another holder) and takes it back.
    let retaken = b.acquire_if_overtaken(&s, lost).unwrap().expect("b was overtaken");
    assert!(retaken > again);
    fenced(c.put(&s, again, &[row(4, "c, overtaken")]));
    b.put(&s, retaken, &[row(4, "b holds it now")]).unwrap();
    let texts: Vec<String> =
        a.rows_after(&s, 0, 10).unwrap().into_iter().map(|row| row.message.content).collect();
    assert_eq!(texts, ["a holds it", "a writes on", "c holds it", "b holds it now"]);
}

/// Saves in one statement: each handle's frame is made for the sequence it expects, so two
/// handles taking turns (each one's expectation stale after the other's save) still store
/// every checkpoint at its sequence, in order, each loading back; a save under a stale fence
/// (and one under the newest number from the wrong handle) stores nothing; a prune goes with
/// the save.
#[test]
fn saves_in_one_statement_keep_sequences_and_fences() {
    use crate::store::CheckpointSink;
    let Some(schema) = TestSchema::new("one statement saves") else { return };
    let schema = schema.unwrap();
    let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::new("t", "saves");
    let first = a.acquire(&s).unwrap();
    let one = a.save(&s, first, b"a 1").unwrap();
    let (two, pruned) = a.save_and_prune(&s, first, b"a 2", 2).unwrap();
    assert!(pruned.unwrap().is_empty());
    let second = b.acquire(&s).unwrap();
    let fenced = |result: Result<CheckpointId, StoreError>| {
        assert_eq!(result.unwrap_err().kind(), crate::store::ErrorKind::Fenced);
    };
    fenced(a.save(&s, first, b"a on a stale lease"));
    // `b` knows no sequence for the conversation, `a` a stale one after `b` saved.
    let (three, pruned) = b.save_and_prune(&s, second, b"b 3", 2).unwrap();
    assert_eq!(pruned.unwrap(), [one]);
    let third = a.acquire(&s).unwrap();
    fenced(b.save(&s, second, b"b on a stale lease"));
    let (four, pruned) = a.save_and_prune(&s, third, b"a 4", 3).unwrap();
    assert!(pruned.unwrap().is_empty());
    assert_eq!(a.ids(&s).unwrap(), [four.clone(), three.clone(), two.clone()]);
    for (id, payload) in [(&two, &b"a 2"[..]), (&three, b"b 3"), (&four, b"a 4")] {
        assert_eq!(b.load(&s, id).unwrap(), payload, "{id}: its frame's sequence is its row's");
    }
    let sequences = a
        .run(|client| {
            let rows = client.query_typed("SELECT seq FROM checkpoints ORDER BY seq", &[])?;
            rows.iter().map(|row| get::<i64>(row, 0)).collect::<Pg<Vec<i64>>>()
        })
        .unwrap();
    assert_eq!(sequences, [2, 3, 4]);
    let newest = a
        .run(|client| {
            let row = client.query_typed_one("SELECT checkpoint_seq FROM conversations", &[])?;
            get::<i64>(&row, 0)
        })
        .unwrap();
    assert_eq!(newest, 4, "a refused save raised no sequence");
}

/// The newest checkpoint read right after a lease is answered from what the handle saw
/// only while no save happened since: another handle's save (a newer sequence found by
/// the lease) and a rewrite by this one are read from the server.
#[test]
fn the_newest_checkpoint_after_a_lease_is_never_an_older_one() {
    use crate::store::CheckpointSink;
    let Some(schema) = TestSchema::new("newest after lease") else { return };
    let schema = schema.unwrap();
    let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::new("t", "newest");
    let newest = |store: &PgStore| {
        let mut bytes = Vec::new();
        store
            .load_latest(&s, &mut |payload| {
                bytes = payload.to_vec();
                Ok(())
            })
            .unwrap();
        bytes
    };
    let first = a.acquire(&s).unwrap();
    assert_eq!(a.newest_id(&s).unwrap(), None);
    let x = a.save(&s, first, b"x").unwrap();
    assert_eq!(newest(&a), b"x");
    // The lease finds the sequence of `x`, which `a` saved and read: `x` is the newest.
    assert_eq!(a.acquire_if_overtaken(&s, Fence(0)).unwrap().map(|_| ()), Some(()));
    assert_eq!(newest(&a), b"x");
    let held = a.acquire(&s).unwrap();
    assert_eq!(a.newest_id(&s).unwrap(), Some(x.clone()));
    // `b` takes the conversation and saves `y`; `a`'s lease taken back finds a newer sequence.
    let theirs = b.acquire(&s).unwrap();
    let y = b.save(&s, theirs, b"y").unwrap();
    assert!(a.acquire_if_overtaken(&s, held).unwrap().is_some());
    assert_eq!(a.newest_id(&s).unwrap(), Some(y.clone()));
    let again = a.acquire(&s).unwrap();
    assert_eq!(newest(&a), b"y");
    // A rewrite (a forget) of what `a` read: the lease finds the same sequence, the read
    // still returns the rewritten payload.
    assert_eq!(newest(&a), b"y");
    a.rewrite(&s, again, &|payload| (payload == b"y").then(|| b"masked".to_vec())).unwrap();
    a.acquire(&s).unwrap();
    assert_eq!(newest(&a), b"masked");

    // A conversation `a` saw without checkpoints: none while the lease finds none saved,
    // `b`'s once it saved one.
    let t = Scope::new("t", "empty");
    let mine = a.acquire(&t).unwrap();
    let none = |store: &PgStore| store.load_latest(&t, &mut |_| Ok(())).unwrap().is_none();
    assert!(none(&a));
    a.acquire_if_overtaken(&t, Fence(0)).unwrap();
    assert!(none(&a));
    let theirs = b.acquire(&t).unwrap();
    b.save(&t, theirs, b"b's").unwrap();
    assert!(a.acquire_if_overtaken(&t, mine).unwrap().is_some());
    assert!(!none(&a));
}

/// How far a conversation's rows reach is answered from what the handle wrote or read,
/// and asked again after its own delete and after a lease it took (another handle may
/// have deleted meanwhile).
#[test]
fn rows_known_stored_are_asked_again_after_a_delete_or_a_lease() {
    let Some(schema) = TestSchema::new("archived through") else { return };
    let schema = schema.unwrap();
    let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::new("t", "through");
    let rows = |ids: std::ops::RangeInclusive<u64>| -> Vec<crate::store::ArchivedMessage> {
        ids.map(|id| {
            let text = format!("row {id}");
            crate::store::ArchivedMessage::new(
                id,
                id,
                crate::ChatMessage::text(ctxwin_core::Role::User, text),
            )
        })
        .collect()
    };
    let held = a.acquire(&s).unwrap();
    assert_eq!(a.archived_through(&s, 3).unwrap(), 0);
    a.put(&s, held, &rows(1..=3)).unwrap();
    assert_eq!(a.archived_through(&s, 3).unwrap(), 3);
    assert_eq!(a.archived_through(&s, 5).unwrap(), 3);
    a.delete_from(&s, held, 3).unwrap();
    assert_eq!(a.archived_through(&s, 3).unwrap(), 2, "its own delete");
    a.put(&s, held, &rows(3..=3)).unwrap();
    let theirs = b.acquire(&s).unwrap();
    b.delete_from(&s, theirs, 2).unwrap();
    assert!(a.acquire_if_overtaken(&s, held).unwrap().is_some());
    assert_eq!(a.archived_through(&s, 3).unwrap(), 1, "another handle's delete");
    assert_eq!(b.archived_through(&s, 1).unwrap(), 1);
}
