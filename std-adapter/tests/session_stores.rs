//! A session on the storage ports: write after the core through the journal, with the archive
//! behind wrappers (deferred, batched, failing on demand), other adapters and tenants.

use std::sync::Arc;
use std::time::Duration;

use ctxwin_core::{Config, Role};
use ctxwin_std::session::{ComposeOptions, RecallFor, Session, SessionBuilder, SessionError};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{
    ArchiveStore, ArchivedMessage, Batched, CheckpointSink, Deferred, DeferredOptions, ErrorKind,
    Faulty, MemoryStore, Scope,
};
use ctxwin_std::{ChatMessage, ToolCall};

fn fast() -> DeferredOptions {
    DeferredOptions {
        retry_min: Duration::from_millis(2),
        retry_max: Duration::from_millis(20),
        ..DeferredOptions::DEFAULT
    }
}

fn small() -> Config {
    Config { max_messages: 12, locked_tail: 2, ..Config::DEFAULT }
}

fn user(text: impl Into<String>) -> ChatMessage {
    ChatMessage::text(Role::User, text.into())
}

/// A request of a conversation: the user's question and the model's answer, sometimes a tool
/// call with a large result (stored reduced: its row keeps the full text).
fn request(session: &mut Session, turn: usize) {
    session.push(&user(format!("question {turn} about crate_{turn}"))).unwrap();
    if turn.is_multiple_of(3) {
        let call = ToolCall::new(format!("c{turn}"), "read", r#"{"path":"x"}"#);
        session.push(&ChatMessage::assistant_calls("", vec![call])).unwrap();
        let output = format!("line of output {turn}\n").repeat(400);
        session.push(&ChatMessage::tool_result(format!("c{turn}"), output)).unwrap();
    }
    session.push(&ChatMessage::text(Role::Assistant, format!("answer {turn}"))).unwrap();
}

/// Every row of `scope`, timestamps zeroed (the clock differs between two runs).
fn rows(archive: &dyn ArchiveStore, scope: &Scope) -> Vec<ArchivedMessage> {
    let rows = archive.rows_after(scope, 0, usize::MAX).unwrap();
    rows.into_iter().map(|row| ArchivedMessage { timestamp: 0, ..row }).collect()
}

type HeldSqlite = Deferred<Faulty<SqliteArchive>>;

fn deferred_sqlite() -> Arc<HeldSqlite> {
    let archive = SqliteArchive::open_in_memory().unwrap();
    Arc::new(Deferred::spawn_with(Faulty::new(archive), fast()).unwrap())
}

#[test]
fn every_archive_wrapper_stores_what_a_direct_archive_stores() {
    let direct: Arc<dyn ArchiveStore> = Arc::new(SqliteArchive::open_in_memory().unwrap());
    let deferred: Arc<dyn ArchiveStore> =
        Arc::new(Deferred::spawn_with(SqliteArchive::open_in_memory().unwrap(), fast()).unwrap());
    let batched: Arc<dyn ArchiveStore> =
        Arc::new(Batched::new(SqliteArchive::open_in_memory().unwrap()));
    let memory: Arc<dyn ArchiveStore> = Arc::new(MemoryStore::new());
    let stores = [direct, deferred, batched, memory];
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let stores = stores.clone();
            std::thread::spawn(move || {
                let names: Vec<String> = (0..3).map(|i| format!("t{thread}-{i}")).collect();
                for name in &names {
                    let mut sessions: Vec<Session> = stores
                        .iter()
                        .map(|store| {
                            let builder = SessionBuilder::new(name).config(small());
                            builder.archive_store(store.clone()).build().unwrap()
                        })
                        .collect();
                    for turn in 0..10 {
                        for session in &mut sessions {
                            request(session, turn);
                        }
                    }
                    for session in &mut sessions {
                        session.sync_archive().unwrap();
                    }
                }
                names
            })
        })
        .collect();
    for thread in threads {
        for name in thread.join().unwrap() {
            let scope = Scope::local(name.as_str());
            let expected = rows(stores[0].as_ref(), &scope);
            assert!(expected.len() > 20, "{name}: {}", expected.len());
            for store in &stores[1..] {
                assert_eq!(rows(store.as_ref(), &scope), expected, "{name} through {store:?}");
            }
        }
    }
}

#[test]
fn a_deferred_push_queues_and_does_not_wait_for_the_archive() {
    let store = deferred_sqlite();
    let mut session = SessionBuilder::new("s").archive_store(store.clone()).build().unwrap();
    let hold = store.inner().faults().hold();
    session.push(&user("queued")).unwrap();
    assert_eq!(store.stats().queued_rows, 1);
    drop(hold);
    session.sync_archive().unwrap();
    assert_eq!(store.inner().inner().usage(session.scope()).unwrap().messages, 1);
    assert_eq!(session.stats().unwrap().archive.unwrap().messages, 1);
}

#[test]
fn a_checkpoint_waits_for_deferred_rows_and_a_restore_finds_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let archive = SqliteArchive::open(dir.path().join("a.db")).unwrap();
    let store = Arc::new(Deferred::spawn_with(Faulty::new(archive.clone()), fast()).unwrap());
    let build = || {
        SessionBuilder::new("s")
            .config(small())
            .archive_store(store.clone())
            .checkpoints(dir.path().join("ckpt"))
            .checkpoint_interval_messages(0)
            .restore_latest(true)
    };
    let mut session = build().build().unwrap();
    for turn in 0..10 {
        request(&mut session, turn);
    }
    let hold = store.inner().faults().hold();
    let expected_next = session.manager().next_id();
    let (waited, checkpoint) = std::thread::scope(|scope| {
        let saving = scope.spawn(|| session.checkpoint());
        std::thread::sleep(Duration::from_millis(30));
        let waited = !saving.is_finished();
        drop(hold);
        (waited, saving.join().unwrap())
    });
    assert!(waited, "the checkpoint waited for the queued rows");
    checkpoint.unwrap();
    let before = rows(&archive, session.scope());
    assert_eq!(before.last().map(|row| row.id), Some(expected_next - 1));
    drop(session);
    let restored = build().build().unwrap();
    assert_eq!(restored.manager().next_id(), expected_next);
    assert_eq!(rows(restored.archive().unwrap(), restored.scope()), before);
}

#[test]
fn compose_recalls_rows_pushed_just_before_and_without_retrieval_never_waits() {
    let store = deferred_sqlite();
    let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
    let mut session =
        SessionBuilder::new("s").config(config).archive_store(store.clone()).build().unwrap();
    let hold = store.inner().faults().hold();
    session.push(&user("The staging database is Postgres 16.")).unwrap();
    for turn in 0..3 {
        session.push(&user(format!("turn {turn}"))).unwrap();
    }
    assert!(store.stats().queued_rows > 0);
    // No retrieval: no archive read, no wait.
    let quiet = ComposeOptions::new(&[]).recall(RecallFor::Nothing);
    let (finished, plain) = std::thread::scope(|scope| {
        let composing = scope.spawn(|| session.compose_with(quiet));
        std::thread::sleep(Duration::from_millis(100));
        (composing.is_finished(), composing.join().unwrap())
    });
    assert!(finished, "compose without retrieval waited for the archive");
    assert!(plain.unwrap().recall.ids.is_empty());
    let asked = ComposeOptions::new(&[]).recall(RecallFor::Query("which postgres version"));
    let composing = std::thread::scope(|scope| {
        let composing = scope.spawn(|| session.compose_with(asked));
        std::thread::sleep(Duration::from_millis(20));
        drop(hold);
        composing.join().unwrap()
    });
    let payload = composing.unwrap();
    assert_eq!(payload.recall.ids, [1, 2]);
    assert!(payload.conversation.messages[0].content.contains("Postgres 16"));
}

#[test]
fn a_failed_deferred_commit_is_reported_and_no_checkpoint_covers_it() {
    let store = deferred_sqlite();
    store.inner().faults().fail_writes("disk on fire");
    let dir = tempfile::tempdir().unwrap();
    let mut session = SessionBuilder::new("s")
        .archive_store(store.clone())
        .checkpoints(dir.path())
        .build()
        .unwrap();
    session.push(&user("kept")).unwrap();
    let error = session.checkpoint().unwrap_err();
    assert!(error.to_string().contains("disk on fire"), "{error}");
    assert!(session.checkpoints().unwrap().is_empty(), "no checkpoint over uncommitted rows");
    store.inner().faults().heal();
    session.checkpoint().unwrap();
    assert_eq!(store.usage(session.scope()).unwrap().messages, 1);
}

#[test]
fn a_failed_direct_write_is_held_in_order_and_written_by_the_next_call() {
    let store = Arc::new(Faulty::new(SqliteArchive::open_in_memory().unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let mut session = SessionBuilder::new("s")
        .archive_store(store.clone())
        .checkpoints(dir.path())
        .build()
        .unwrap();
    session.push(&user("first")).unwrap();
    store.faults().fail_writes("full");
    // The core took it; its row is held.
    let held = session.push(&user("second")).unwrap_err();
    assert!(matches!(held, SessionError::AfterStore { id: 2, .. }), "{held}");
    assert_eq!(session.manager().history().count(), 2);
    // While the archive fails, a push is refused whole: the held rows come first.
    let refused = session.push(&user("third")).unwrap_err();
    assert!(matches!(&refused, SessionError::Store(e) if e.kind() == ErrorKind::Io), "{refused}");
    assert_eq!(session.manager().history().count(), 2, "nothing of it stored");
    assert!(session.checkpoint().is_err(), "no checkpoint while rows are held");
    assert!(session.checkpoints().unwrap().is_empty());
    store.faults().heal();
    session.push(&user("third")).unwrap();
    let contents: Vec<String> = store
        .rows_after(session.scope(), 0, 10)
        .unwrap()
        .into_iter()
        .map(|row| row.message.content)
        .collect();
    assert_eq!(contents, ["first", "second", "third"]);
    session.checkpoint().unwrap();
}

#[test]
fn dropping_a_session_flushes_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let archive = SqliteArchive::open(&path).unwrap();
    let batched = Arc::new(Batched::new(archive.clone()));
    let mut session = SessionBuilder::new("s").archive_store(batched.clone()).build().unwrap();
    session.push(&user("kept")).unwrap();
    assert_eq!(archive.usage(session.scope()).unwrap().messages, 0, "held by the wrapper");
    drop(session);
    assert_eq!(archive.usage(&Scope::local("s")).unwrap().messages, 1);
}

#[test]
fn tenants_with_the_same_conversation_names_never_meet() {
    let store = Arc::new(MemoryStore::new());
    let sessions: Vec<Session> = ["acme", "globex"]
        .into_iter()
        .map(|tenant| {
            let mut session = SessionBuilder::new("chat")
                .tenant(tenant)
                .config(Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT })
                .archive_store(store.clone())
                .checkpoint_sink(store.clone())
                .build()
                .unwrap();
            session.push(&user(format!("{tenant}'s deploy key is {tenant}-key-7"))).unwrap();
            for turn in 0..3 {
                session.push(&user(format!("turn {turn}"))).unwrap();
            }
            session.checkpoint().unwrap();
            session
        })
        .collect();
    for session in &sessions {
        let recall = session.recall("what is the deploy key", &[]).unwrap();
        let tenant = &session.scope().tenant;
        assert!(recall.block.contains(&format!("{tenant}-key-7")), "{}", recall.block);
        assert!(!recall.block.contains(if tenant == "acme" { "globex" } else { "acme" }));
        assert_eq!(store.ids(session.scope()).unwrap().len(), 1);
    }
    // A new session of one tenant continues from that tenant's checkpoint only.
    let again = SessionBuilder::new("chat")
        .tenant("acme")
        .archive_store(store.clone())
        .checkpoint_sink(store.clone())
        .restore_latest(true)
        .build()
        .unwrap();
    assert_eq!(again.manager().next_id(), sessions[0].manager().next_id());
}

#[test]
fn an_overtaken_session_reloads_and_serves_on() {
    let store = Arc::new(MemoryStore::new());
    let build = || {
        SessionBuilder::new("chat")
            .archive_store(store.clone())
            .checkpoint_sink(store.clone())
            .restore_latest(true)
            .build()
            .unwrap()
    };
    let mut first = build();
    first.push(&user("from the first holder")).unwrap();
    // Another process takes the conversation over (a newer lease) and writes.
    let mut second = build();
    assert_eq!(second.push(&user("from the second holder")).unwrap().id, 2);
    // The first one's write is refused as stale: it reloads and pushes on top.
    assert_eq!(first.push(&user("from the first again")).unwrap().id, 3);
    assert_eq!(first.stats().unwrap().counters.reloads, 1);
    let texts: Vec<String> = store
        .rows_after(&Scope::local("chat"), 0, 10)
        .unwrap()
        .into_iter()
        .map(|row| row.message.content)
        .collect();
    assert_eq!(texts, ["from the first holder", "from the second holder", "from the first again"]);
    let history: Vec<String> = first.manager().history().map(|m| m.content().to_string()).collect();
    assert_eq!(history, texts);
}

#[test]
fn the_caller_state_travels_in_checkpoints() {
    let store = Arc::new(MemoryStore::new());
    let build = || {
        SessionBuilder::new("s")
            .archive_store(store.clone())
            .checkpoint_sink(store.clone())
            .restore_latest(true)
            .build()
            .unwrap()
    };
    let mut session = build();
    session.push(&user("hello")).unwrap();
    session.set_caller_state(br#"{"window":8192,"index":[1]}"#.to_vec());
    session.checkpoint().unwrap();
    session.set_caller_state(b"not checkpointed".to_vec());
    drop(session);
    let again = build();
    assert_eq!(again.caller_state(), br#"{"window":8192,"index":[1]}"#);
    assert_eq!(again.manager().history().count(), 1);
}
