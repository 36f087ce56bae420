//! The PostgreSQL store as a fleet shares it, against a real server (`CTXWIN_PG_URL`, as
//! `scripts/pg-server.sh start` prints; each test in a fresh schema): leases and fences,
//! migrations under concurrent opens, the pool's floor, forgetting checked with `pg_dump`.
//! Each test says it skipped without the variable.

#![cfg(feature = "postgres")]

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use ctxwin_std::core::Role;
use ctxwin_std::store::postgres::testing::TestSchema;
use ctxwin_std::store::postgres::{PgOptions, PgStore, schema::SCHEMA_VERSION};
use ctxwin_std::store::{
    ArchiveStore, ArchivedMessage, CheckpointSink, ErrorKind, Fence, Forget, Scope, SearchQuery,
    SummaryRecord,
};
use ctxwin_std::{ChatMessage, ToolCall};

fn row(id: u64, text: &str) -> ArchivedMessage {
    ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text))
}

fn schema(test: &str) -> Option<TestSchema> {
    TestSchema::new(test).map(|schema| schema.expect("a fresh schema on the test server"))
}

#[test]
fn a_stale_holder_is_refused_every_write() {
    let Some(schema) = schema("stale holder") else { return };
    // Two instances: two stores, two pools, one database.
    let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::new("acme", "chat");
    let old = a.acquire(&s).unwrap();
    a.put(&s, old, &[row(1, "from the first holder")]).unwrap();
    a.save(&s, old, b"snapshot of the first holder").unwrap();
    let new = b.acquire(&s).unwrap();
    assert!(new > old);
    let fenced = |result: Result<(), ctxwin_std::store::StoreError>| {
        let error = result.expect_err("a stale fence was accepted");
        assert_eq!(error.kind(), ErrorKind::Fenced, "{error}");
    };
    fenced(a.put(&s, old, &[row(2, "stale")]));
    fenced(a.put_summary(&s, old, &SummaryRecord::new(9, 1, "stale", vec![1])));
    fenced(a.put_vectors(&s, old, "m", &[(1, vec![1.0])]));
    fenced(a.forget(&s, old, &Forget { ids: &[1], texts: &[] }).map(drop));
    fenced(a.delete_from(&s, old, 1).map(drop));
    fenced(a.delete_conversation(&s, old).map(drop));
    fenced(a.save(&s, old, b"stale snapshot").map(drop));
    fenced(a.prune(&s, old, 0).map(drop));
    fenced(a.rewrite(&s, old, &|_| Some(b"x".to_vec())).map(drop));
    // Nothing of the refused writes is there, and the new holder writes on.
    assert_eq!(b.rows_after(&s, 0, 10).unwrap(), [row(1, "from the first holder")]);
    assert_eq!(b.ids(&s).unwrap().len(), 1);
    b.put(&s, new, &[row(2, "from the second holder")]).unwrap();
    // A fence of one conversation says nothing about another.
    let other = Scope::new("acme", "other");
    a.put(&other, old, &[row(1, "another conversation")]).unwrap();
    // Deleting a conversation keeps its fence: an old holder stays refused.
    b.delete_conversation(&s, new).unwrap();
    fenced(a.put(&s, old, &[row(1, "after the delete")]));
}

#[test]
fn an_acquire_waits_for_the_write_in_flight_then_the_old_fence_is_refused() {
    let Some(schema) = schema("acquire waits") else { return };
    let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
    let s = Scope::local("chat");
    let old = a.acquire(&s).unwrap();
    a.put(&s, old, &[row(1, "one")]).unwrap();
    // The first holder's next write, caught inside its transaction: the conversation's row
    // locked as the adapter locks it, the fence checked, the row not yet committed.
    let mut writer = schema.client().unwrap();
    let mut tx = writer.transaction().unwrap();
    let current: i64 = tx
        .query_one(
            "SELECT fence FROM conversations WHERE tenant = '' AND name = 'chat' FOR NO KEY UPDATE",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(current as u64, old.0, "the in-flight write holds the current fence");
    let (sent, acquired) = std::sync::mpsc::channel();
    let taker = std::thread::spawn({
        let (b, s) = (b.clone(), s.clone());
        move || {
            let fence = b.acquire(&s).unwrap();
            sent.send(()).unwrap();
            // What a new holder does first: reload. It sees the old holder's last write.
            (fence, b.rows_after(&s, 0, 10).unwrap())
        }
    });
    assert!(
        acquired.recv_timeout(Duration::from_millis(300)).is_err(),
        "acquire returned while a write of the old holder was in flight"
    );
    let last = row(2, "two, committed while the lease changed hands");
    let sum = ctxwin_std::store::checksum::message(&s, &last) as i64;
    tx.execute(
        "INSERT INTO messages (conversation_id, id, unit, level, role, content, tool_text,
                               timestamp, tokens, is_error, checksum)
         SELECT id, 2, 2, 2, 'user', $1, '', 0, 0, false, $2 FROM conversations
         WHERE tenant = '' AND name = 'chat'",
        &[&last.message.content, &sum],
    )
    .unwrap();
    tx.commit().unwrap();
    let (new, seen) = taker.join().unwrap();
    assert!(new > old);
    assert_eq!(seen, [row(1, "one"), last], "the new holder sees the old one's last write");
    let refused = a.put(&s, old, &[row(2, "too late")]).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Fenced);
}

/// Two instances serving one conversation at once, each taking the lease, reloading and
/// writing turns until it is fenced: every write acknowledged is there, unchanged, in one
/// gapless sequence (no write of one holder lands between another's reload and writes).
#[test]
fn two_holders_serialize_and_never_overwrite_each_other() {
    let Some(schema) = schema("two holders") else { return };
    let s = Scope::new("acme", "contended");
    let acked: Arc<Mutex<Vec<ArchivedMessage>>> = Arc::default();
    let refusals = Arc::new(Mutex::new(0_u32));
    let start = Arc::new(Barrier::new(2));
    let holders: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let store = schema.open().unwrap();
            let (s, acked, refusals, start) =
                (s.clone(), acked.clone(), refusals.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for lease in 0..40_u64 {
                    let fence = store.acquire(&s).unwrap();
                    let mut next = store.max_id(&s).unwrap().unwrap_or(0) + 1;
                    for turn in 0..4 {
                        if (lease + turn) % 3 == 0 {
                            std::thread::yield_now();
                        }
                        let written = row(next, &format!("{name} lease {} turn {turn}", fence.0));
                        match store.put(&s, fence, std::slice::from_ref(&written)) {
                            Ok(()) => {
                                acked.lock().unwrap().push(written);
                                next += 1;
                            }
                            Err(error) if error.kind() == ErrorKind::Fenced => {
                                *refusals.lock().unwrap() += 1;
                                break;
                            }
                            Err(error) => panic!("{error}"),
                        }
                    }
                }
            })
        })
        .collect();
    for holder in holders {
        holder.join().unwrap();
    }
    let store = schema.open().unwrap();
    let stored = store.rows_after(&s, 0, 10_000).unwrap();
    let mut acked = acked.lock().unwrap().clone();
    acked.sort_by_key(|row| row.id);
    assert_eq!(stored, acked, "every acknowledged write, unchanged, and nothing else");
    let ids: Vec<u64> = stored.iter().map(|row| row.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "one gapless sequence");
    eprintln!(
        "two holders: {} writes acknowledged, {} refused as fenced",
        stored.len(),
        refusals.lock().unwrap()
    );
}

#[test]
fn migrations_run_once_when_many_processes_open_at_once() {
    let Some(schema) = schema("migrations") else { return };
    let threads = 8;
    let start = Arc::new(Barrier::new(threads));
    let opened: Vec<_> = (0..threads)
        .map(|_| {
            let (url, start) = (schema.url().to_string(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                PgStore::open(&url).map(|store| store.identity().unwrap())
            })
        })
        .collect();
    let identities: Vec<String> =
        opened.into_iter().map(|opener| opener.join().unwrap().unwrap()).collect();
    assert!(identities.windows(2).all(|w| w[0] == w[1]), "one store: {identities:?}");
    let mut client = schema.client().unwrap();
    let applied: Vec<(i32, String)> = client
        .query("SELECT version, name FROM ctxwin_migrations ORDER BY version", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(applied.len() as i64, SCHEMA_VERSION, "{applied:?}");
    assert_eq!(applied[0], (1, "fleet store".to_string()));
    assert_eq!(schema.open().unwrap().schema_version().unwrap(), SCHEMA_VERSION);
    // A store a newer build migrated is refused, not written.
    client
        .execute("INSERT INTO ctxwin_migrations (version, name) VALUES (99, 'future')", &[])
        .unwrap();
    let refused = schema.open().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Damaged, "{refused}");
    assert!(refused.to_string().contains("99"), "{refused}");
}

#[test]
fn a_write_waiting_past_the_lock_timeout_is_busy() {
    let Some(schema) = schema("lock timeout") else { return };
    let options = PgOptions { lock_timeout: Duration::from_millis(200), ..PgOptions::default() };
    let store = schema.open_with(options).unwrap();
    let s = Scope::local("chat");
    store.put(&s, Fence::NONE, &[row(1, "one")]).unwrap();
    let mut other = schema.client().unwrap();
    let mut held = other.transaction().unwrap();
    held.execute("SELECT 1 FROM conversations WHERE name = 'chat' FOR UPDATE", &[]).unwrap();
    let busy = store.put(&s, Fence::NONE, &[row(2, "two")]).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Busy, "{busy}");
    assert!(busy.kind().is_transient());
    held.rollback().unwrap();
    store.put(&s, Fence::NONE, &[row(2, "two")]).unwrap();
}

/// Connections the server sees from `application_name`.
fn server_connections(schema: &TestSchema, application: &str) -> i64 {
    let mut client = schema.client().unwrap();
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&application],
        )
        .unwrap()
        .get(0)
}

#[test]
fn idle_stores_hold_no_connection() {
    let Some(schema) = schema("pool floor") else { return };
    let application = format!("ctxwin_floor_{}", std::process::id());
    let url = format!("{}&application_name={application}", schema.url());
    let options = PgOptions { idle_timeout: Duration::from_secs(1), ..PgOptions::default() };
    // Twenty agents, each with its store, each doing a turn and going idle.
    let agents: Vec<PgStore> =
        (0..20).map(|_| PgStore::open_with(&url, options.clone()).unwrap()).collect();
    for (n, agent) in agents.iter().enumerate() {
        let s = Scope::local(format!("agent-{n}"));
        agent.put(&s, Fence::NONE, &[row(1, "a turn")]).unwrap();
        assert_eq!(agent.rows_after(&s, 0, 10).unwrap().len(), 1);
        assert!(agent.pool_state().connections <= 1, "{:?}", agent.pool_state());
    }
    let busy = server_connections(&schema, &application);
    assert!(busy <= 20, "{busy} connections for 20 agents taking turns one at a time");
    // One agent keeps a floor of one.
    let floor = PgStore::open_with(&url, PgOptions { min_idle: 1, ..options.clone() }).unwrap();
    // The pool's reaper runs every 30 s and closes what has been idle past the timeout.
    let deadline = Instant::now() + Duration::from_secs(75);
    let mut open = i64::MAX;
    while Instant::now() < deadline {
        open = server_connections(&schema, &application);
        if open <= 1 && agents.iter().all(|agent| agent.pool_state().connections == 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("pool floor: {busy} connections while 20 agents worked, {open} once idle");
    assert_eq!(open, 1, "idle agents hold no connection; the one with min_idle 1 holds one");
    assert_eq!(floor.pool_state().connections, 1);
}

/// The newest server binary directory's `pg_dump` (Debian keeps them in
/// /usr/lib/postgresql/N/bin), else the one on the PATH.
fn pg_dump() -> std::path::PathBuf {
    let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin/pg_dump"))
        .filter(|path| path.exists())
        .collect();
    found.sort_by_key(|path| {
        let version = path.iter().rev().nth(2).and_then(|v| v.to_str()?.parse::<u32>().ok());
        version.unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| "pg_dump".into())
}

/// Occurrences of `needle` in `haystack`.
fn occurrences(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).filter(|window| *window == needle).count()
}

/// Every form `secret` takes in a plain-format dump: as text, as bytea hex, and as a
/// tsvector lexeme (lower-case).
fn forms(secret: &str) -> Vec<Vec<u8>> {
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    let mut forms =
        vec![secret.as_bytes().to_vec(), hex.into_bytes(), secret.to_lowercase().into_bytes()];
    forms.dedup();
    forms
}

fn dump(schema: &TestSchema) -> Vec<u8> {
    let base = std::env::var("CTXWIN_PG_URL").unwrap();
    let output = std::process::Command::new(pg_dump())
        .args(["--no-owner", "--schema", schema.name(), "--dbname", &base])
        .output()
        .expect("pg_dump runs (Debian's postgresql-client)");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

#[test]
fn after_forget_a_dump_holds_no_byte_of_the_text() {
    let Some(schema) = schema("forget dump") else { return };
    let store = schema.open().unwrap();
    let (secret, kept) = ("hunter2xyzzy", "keepme7plugh");
    let s = Scope::new("acme", "leaky");
    let other = Scope::new("acme", "other");
    let call = ToolCall::new("c1", "login", format!(r#"{{"password":"{secret}"}}"#));
    let rows = [
        row(1, &format!("the password is {secret}")),
        ArchivedMessage::new(2, 2, ChatMessage::tool_result("c1", "[Data Truncated]"))
            .with_original(format!("log line {secret} and more")),
        ArchivedMessage::new(3, 3, ChatMessage::assistant_calls("", vec![call])),
        row(4, "raw only").with_raw(format!(r#"{{"role":"user","content":"{secret}"}}"#)),
        row(5, "nothing secret here"),
    ];
    store.put(&s, Fence::NONE, &rows).unwrap();
    store.put(&other, Fence::NONE, &[row(1, &format!("another conversation's {kept}"))]).unwrap();
    store
        .put_summary(&s, Fence::NONE, &SummaryRecord::new(10, 1, format!("said {secret}"), vec![1]))
        .unwrap();
    store.put_vectors(&s, Fence::NONE, "m", &[(1, vec![0.5; 8]), (5, vec![0.25; 8])]).unwrap();
    let snapshot = format!("postcard bytes ... {secret} ... more bytes");
    store.save(&s, Fence::NONE, snapshot.as_bytes()).unwrap();
    store.save(&s, Fence::NONE, b"a later snapshot without it").unwrap();
    let before = dump(&schema);
    let found = |dump: &[u8], text: &str| -> usize {
        forms(text).iter().map(|form| occurrences(dump, form)).sum()
    };
    assert!(
        found(&before, secret) >= 8,
        "the dump shows the text before: {}",
        found(&before, secret)
    );

    let forgotten = store.forget(&s, Fence::NONE, &Forget { ids: &[], texts: &[secret] }).unwrap();
    assert_eq!(forgotten.messages, [1, 2, 3, 4]);
    let mask = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        text.contains(secret).then(|| text.replace(secret, "[forgotten]").into_bytes())
    };
    assert_eq!(store.rewrite(&s, Fence::NONE, &mask).unwrap(), 1);

    let after = dump(&schema);
    assert_eq!(found(&after, secret), 0, "the dump still holds the forgotten text");
    assert!(found(&after, kept) > 0, "the other conversation's text stays (the grep works)");
    assert!(store.search(&s, &SearchQuery::new(secret, 5)).unwrap().is_empty());
    let vectors = store.vectors(&s, "m", 0).unwrap();
    let with: Vec<u64> = vectors.iter().filter(|r| r.vector.is_some()).map(|r| r.id).collect();
    assert_eq!(with, [5], "the vector of the scrubbed row went with its text");
    report_pages_on_disk(&schema, secret);
    store.rebuild_search_indexes().unwrap();
    eprintln!("forget: after rebuild_search_indexes:");
    report_pages_on_disk(&schema, secret);
    assert_eq!(found(&dump(&schema), kept), found(&after, kept), "the rebuild keeps every row");
}

/// What the table files and the WAL hold after the forget and its VACUUM (printed, for the
/// README's honest account; the dump is the contract). Needs the server's data directory on
/// this machine (the test server's is).
fn report_pages_on_disk(schema: &TestSchema, secret: &str) {
    let mut client = schema.client().unwrap();
    client.batch_execute("CHECKPOINT").ok();
    let Ok(data) = client.query_one("SHOW data_directory", &[]).map(|row| row.get::<_, String>(0))
    else {
        return;
    };
    // Every file of the schema: tables, their indexes, their TOAST tables and indexes.
    let files: Vec<String> = client
        .query(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c
             WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
               AND c.relkind IN ('r', 'i')
             UNION ALL
             SELECT pg_relation_filepath(t.oid) FROM pg_class c JOIN pg_class t
                 ON t.oid = c.reltoastrelid OR t.oid IN (
                     SELECT indexrelid FROM pg_index WHERE indrelid = c.reltoastrelid)
             WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)",
            &[&schema.name()],
        )
        .unwrap()
        .iter()
        .filter_map(|row| row.get::<_, Option<String>>(0))
        .collect();
    let mut in_tables = 0;
    for path in &files {
        if let Ok(bytes) = std::fs::read(std::path::Path::new(&data).join(path)) {
            let here = occurrences(&bytes, secret.as_bytes());
            if here > 0 {
                let name: String = client
                    .query_one(
                        "SELECT relname::text FROM pg_class WHERE relfilenode = $1::text::oid",
                        &[&path.rsplit('/').next().unwrap_or_default()],
                    )
                    .map_or_else(|_| path.clone(), |row| row.get(0));
                eprintln!("forget: {here} copies in {name}");
            }
            in_tables += here;
        }
    }
    let mut in_wal = 0;
    for entry in std::fs::read_dir(std::path::Path::new(&data).join("pg_wal"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(bytes) = std::fs::read(entry.path()) {
            in_wal += occurrences(&bytes, secret.as_bytes());
        }
    }
    eprintln!(
        "forget: after VACUUM and CHECKPOINT, {in_tables} copies in the {} files of the \
         tables, indexes and TOAST, {in_wal} in WAL segments not yet recycled",
        files.len()
    );
}
