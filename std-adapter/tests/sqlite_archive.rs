//! Integration tests of the SQLite archive adapter against real database files in a temp
//! dir, through the archive port (the conformance suite runs in the crate's unit tests; these
//! add what is SQLite's: ranking, stemming, WAL, reopening, schema versions, a failing
//! transaction, ten thousand rows).

use std::path::PathBuf;
use std::time::Instant;

use ctxwin_std::core::{Level, Role};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{
    ArchiveStore, ArchivedMessage, CompressionRecord, ErrorKind, Fence, Scope, SearchQuery,
    StoreError, SummaryRecord,
};
use ctxwin_std::{ChatMessage, ToolCall};
use tempfile::TempDir;

fn local(name: &str) -> Scope {
    Scope::local(name)
}

fn put(archive: &SqliteArchive, scope: &str, rows: &[ArchivedMessage]) -> Result<(), StoreError> {
    archive.put(&local(scope), Fence::NONE, rows)
}

fn ids(archive: &SqliteArchive, scope: &str, query: &str, limit: usize) -> Vec<u64> {
    let hits = archive.search(&local(scope), &SearchQuery::new(query, limit)).unwrap();
    hits.iter().map(|h| h.id).collect()
}

fn messages(archive: &SqliteArchive, scope: &str) -> u64 {
    archive.usage(&local(scope)).unwrap().messages
}

fn temp_db() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.db");
    (dir, path)
}

fn text(id: u64, role: Role, content: &str) -> ArchivedMessage {
    ArchivedMessage::new(id, id, ChatMessage::text(role, content)).with_timestamp(1_000 + id)
}

/// An assistant call to `read_file` and its reduced, failed result, as one unit.
fn tool_unit(first_id: u64, unit: u64) -> Vec<ArchivedMessage> {
    let call = ToolCall::new("call_7", "read_file", r#"{"path":"src/lexer.rs"}"#);
    let mut result = ChatMessage::tool_result("call_7", "fn lex() {\n[Data Truncated]\n}");
    result.is_error = true;
    let mut request = ChatMessage::assistant_calls("looking into it", vec![call]);
    request.name = Some("coder".into());
    vec![
        ArchivedMessage::new(first_id, unit, request)
            .with_level(Level::Working)
            .with_timestamp(50)
            .with_tokens(21),
        ArchivedMessage::new(first_id + 1, unit, result)
            .with_level(Level::Volatile)
            .with_timestamp(51)
            .with_tokens(12)
            .with_original(
                "fn lex() {\n    let cursor = Cursor::new(src);\n    tokenize_heredoc(cursor)\n}",
            ),
    ]
}

#[test]
fn round_trip_keeps_tool_calls_levels_and_original_text() {
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    let unit = tool_unit(10, 4);
    put(&archive, "s1", &unit).unwrap();
    let s1 = local("s1");
    assert_eq!(archive.get(&s1, 10).unwrap().as_ref(), unit.first());
    assert_eq!(archive.get(&s1, 11).unwrap().as_ref(), unit.get(1));
    let stored = archive.get_many(&s1, &[10, 11]).unwrap();
    assert_eq!(stored, unit);
    assert_eq!(
        (stored[0].message.name.as_deref(), stored[1].message.is_error),
        (Some("coder"), true)
    );
    assert_eq!(archive.get(&s1, 12).unwrap(), None);
    assert_eq!(archive.get(&local("other"), 10).unwrap(), None);

    // The middle of the reduced output, the tool name and an argument are all searchable.
    assert_eq!(ids(&archive, "s1", "tokenize_heredoc", 5), [11]);
    let by_tool = archive.search(&s1, &SearchQuery::new("read_file", 5)).unwrap();
    assert_eq!(by_tool.first().map(|h| (h.id, h.unit, h.role)), Some((10, 4, Role::Assistant)));
    assert_eq!(ids(&archive, "s1", "src/lexer.rs", 5).first(), Some(&10));
}

#[test]
fn restoring_an_id_never_duplicates() {
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    let unit = tool_unit(1, 1);
    put(&archive, "s", &unit).unwrap();
    put(&archive, "s", &unit).unwrap();
    assert_eq!(messages(&archive, "s"), 2);

    let mut changed = unit.clone();
    if let Some(call) = changed.first_mut() {
        call.message.content = "now the parser".into();
        call.level = Level::Session;
    }
    put(&archive, "s", &changed).unwrap();
    assert_eq!(archive.stats().unwrap().messages, 2);
    assert_eq!(archive.get_many(&local("s"), &[1, 2]).unwrap(), changed);
    assert_eq!(ids(&archive, "s", "parser", 5).len(), 1);
    assert!(ids(&archive, "s", "looking", 5).is_empty());
}

#[test]
fn a_write_is_stored_whole_or_not_at_all() {
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    put(&archive, "s", &[text(1, Role::User, "before")]).unwrap();

    // Another connection makes the third insert fail inside the transaction.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "CREATE TRIGGER fail_boom BEFORE INSERT ON messages WHEN new.content = 'boom'
         BEGIN SELECT RAISE(ABORT, 'boom refused'); END;",
    )
    .unwrap();
    let unit = vec![
        ArchivedMessage::new(2, 2, ChatMessage::text(Role::Assistant, "one")),
        ArchivedMessage::new(3, 2, ChatMessage::text(Role::Tool, "two")),
        ArchivedMessage::new(4, 2, ChatMessage::text(Role::Tool, "boom")),
    ];
    // A failure inside the transaction (a constraint someone else added): nothing written.
    let err = put(&archive, "s", &unit).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("boom refused"), "{err}");
    assert!(archive.get_many(&local("s"), &[2, 3, 4]).unwrap().is_empty());
    assert_eq!(archive.stats().unwrap().messages, 1);
    assert!(ids(&archive, "s", "one two", 5).is_empty());

    raw.execute_batch("DROP TRIGGER fail_boom").unwrap();
    put(&archive, "s", &unit).unwrap();
    assert_eq!(messages(&archive, "s"), 4);
}

#[test]
fn the_most_specific_mention_ranks_first() {
    let archive = SqliteArchive::open_in_memory().unwrap();
    let filler = "we talked about many other things like deployment schedules, coffee, \
                  the weather, code review etiquette, vacation plans and the build server";
    archive
        .put(
            &local("s"),
            Fence::NONE,
            &[
                text(1, Role::User, &format!("{filler}; oh and the lexer came up once")),
                text(2, Role::Assistant, "The lexer panics on unicode escapes in the lexer tests"),
                text(3, Role::User, "deploy the build server tonight"),
                text(4, Role::User, &format!("{filler}, plus unicode once")),
            ],
        )
        .unwrap();
    let hits = archive.search(&local("s"), &SearchQuery::new("lexer", 10)).unwrap();
    assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(hits[0].score, 1.0);
    assert!(hits.first().unwrap().score > hits.get(1).unwrap().score);

    // Matching both words beats matching one.
    let both = ids(&archive, "s", "unicode lexer", 10);
    assert_eq!(both.first(), Some(&2));
    assert_eq!(both.len(), 3);
    // Stemming: "panicking"/"panics" share a stem.
    assert_eq!(ids(&archive, "s", "panic", 10).first(), Some(&2));
    assert!(ids(&archive, "nobody", "lexer", 10).is_empty());
    assert!(ids(&archive, "s", "lexer", 0).is_empty());
}

#[test]
fn hostile_queries_never_error() {
    let archive = SqliteArchive::open_in_memory().unwrap();
    archive
        .put(
            &local("s"),
            Fence::NONE,
            &[
                text(1, Role::User, r#"quote " star * minus -x col:val (paren) AND OR NOT NEAR"#),
                text(2, Role::User, "naïve café 日本語のテキスト emoji 🦀 done"),
            ],
        )
        .unwrap();
    let hostile = [
        "\"",
        "\"\"",
        "*",
        "**",
        "AND",
        "OR",
        "NOT",
        "AND OR",
        "a AND",
        "NEAR(a b)",
        "-x",
        "- x",
        "col:val",
        "content:lexer",
        "{content}: x",
        "(",
        ")",
        "(()",
        "^start",
        "x +",
        "'",
        "'; DROP TABLE messages; --",
        "\\",
        "\u{0}",
        "\u{202e}rtl",
        "日本語",
        "🦀",
        "naive",
        "a\"b",
        "\"unterminated",
        "star*",
        "NEAR/3",
        "x:y:z",
        "",
        "   ",
        "\n\t",
    ];
    let s = local("s");
    for query in hostile {
        let hits = archive.search(&s, &SearchQuery::new(query, 10).with_snippets());
        assert!(hits.is_ok(), "query {query:?} failed: {hits:?}");
        assert!(archive.search_summaries(&s, &SearchQuery::new(query, 10)).is_ok(), "{query:?}");
    }
    assert!(ids(&archive, "s", "", 10).is_empty());
    assert_eq!(ids(&archive, "s", "col:val", 10).first(), Some(&1));
    assert_eq!(ids(&archive, "s", "naive cafe", 10).first(), Some(&2));
    assert_eq!(messages(&archive, "s"), 2);
}

#[test]
fn drill_down_returns_the_originals_in_order() {
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    let s = local("s");
    let mut all = vec![text(1, Role::User, "read the lexer")];
    all.extend(tool_unit(2, 2));
    all.push(text(4, Role::Assistant, "the lexer uses heredocs"));
    all.push(text(5, Role::User, "now the parser"));
    put(&archive, "s", &all).unwrap();

    let mut level1 = SummaryRecord::new(100, 1, "looked at the lexer", vec![4, 1, 3, 2]);
    level1.tokens_before = 80;
    level1.tokens_after = 9;
    archive.put_summary(&s, Fence::NONE, &level1).unwrap();
    let next = SummaryRecord::new(101, 1, "parser next", vec![5]);
    archive.put_summary(&s, Fence::NONE, &next).unwrap();
    let top = SummaryRecord::new(200, 2, "lexer then parser", vec![101, 100]);
    archive.put_summary(&s, Fence::NONE, &top).unwrap();

    let ids =
        |summary| archive.drill_down(&s, summary).unwrap().iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(100), [1, 2, 3, 4]);
    assert_eq!(ids(200), [1, 2, 3, 4, 5]);
    assert_eq!(archive.drill_down(&s, 100).unwrap().get(2), all.get(2));
    assert_eq!(archive.summary(&s, 100).unwrap(), Some(level1));
    let found = archive.search_summaries(&s, &SearchQuery::new("parser", 5)).unwrap();
    assert_eq!(found.iter().map(|h| h.id).collect::<Vec<_>>(), [101, 200]);
    assert_eq!(archive.drill_down(&s, 4).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn file_archives_run_in_wal_mode() {
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    assert_eq!(archive.journal_mode().unwrap(), "wal");
    put(&archive, "s", &[text(1, Role::User, "hello")]).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    assert!(path.with_extension("db-wal").exists());
}

#[test]
fn reopening_keeps_everything() {
    let (_dir, path) = temp_db();
    let s = local("s");
    {
        let archive = SqliteArchive::open(&path).unwrap();
        put(&archive, "s", &tool_unit(1, 1)).unwrap();
        let summary = SummaryRecord::new(9, 1, "read the lexer", vec![1, 2]);
        archive.put_summary(&s, Fence::NONE, &summary).unwrap();
        let mut event = CompressionRecord::new(5, 10_000, 2_500, "summarize-oldest");
        event.units_evicted = 3;
        event.summaries_made = 1;
        archive.record_compression(&s, Fence::NONE, &event).unwrap();
    }
    let archive = SqliteArchive::open(&path).unwrap();
    assert_eq!(archive.rows_after(&s, 0, 10).unwrap(), tool_unit(1, 1));
    assert_eq!(archive.drill_down(&s, 9).unwrap().len(), 2);
    assert_eq!(ids(&archive, "s", "tokenize_heredoc", 5).len(), 1);
    let metrics = archive.metrics(&s).unwrap();
    assert_eq!(
        (metrics.total.events, metrics.total.tokens_saved(), metrics.total.units_evicted),
        (1, 7_500, 3)
    );
    let stats = archive.stats().unwrap();
    assert_eq!((stats.sessions, stats.messages, stats.summaries), (1, 2, 1));
    assert_eq!(stats.compression_events, 1);
    assert!(stats.db_size_bytes > 0);
}

#[test]
fn a_newer_schema_is_refused() {
    let (_dir, path) = temp_db();
    drop(SqliteArchive::open(&path).unwrap());
    rusqlite::Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
    let refused = SqliteArchive::open(&path).unwrap_err();
    assert!(matches!(refused, StoreError::SchemaTooNew { found: 99, .. }), "{refused}");
}

#[test]
fn conversations_and_tenants_with_the_same_ids_stay_apart() {
    let archive = SqliteArchive::open_in_memory().unwrap();
    put(&archive, "a", &[text(1, Role::User, "alpha planning")]).unwrap();
    put(&archive, "b", &[text(1, Role::User, "beta planning")]).unwrap();
    let other = Scope::new("acme", "a");
    archive.put(&other, Fence::NONE, &[text(1, Role::User, "acme planning")]).unwrap();
    assert_eq!(archive.get(&local("a"), 1).unwrap().unwrap().message.content, "alpha planning");
    assert_eq!(archive.get(&local("b"), 1).unwrap().unwrap().message.content, "beta planning");
    assert_eq!(archive.get(&other, 1).unwrap().unwrap().message.content, "acme planning");
    assert_eq!(ids(&archive, "b", "planning", 10), [1]);
    let acme = archive.search(&other, &SearchQuery::new("planning", 10)).unwrap();
    assert_eq!(acme.iter().map(|h| h.content.as_str()).collect::<Vec<_>>(), ["acme planning"]);
    assert_eq!(archive.conversations("", "").unwrap(), ["a", "b"]);
    assert_eq!(archive.conversations("acme", "").unwrap(), ["a"]);
}

/// A deterministic generator, so the import test needs no random-number crate.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

const WORDS: &[&str] = &[
    "build", "parser", "lexer", "deploy", "cache", "token", "budget", "summary", "queue", "retry",
    "timeout", "schema", "index", "review", "branch", "merge", "config", "metric", "trace",
    "error",
];

#[test]
fn ten_thousand_messages_import_and_stay_retrievable() {
    const N: u64 = 10_000;
    let (_dir, path) = temp_db();
    let archive = SqliteArchive::open(&path).unwrap();
    let bulk = local("bulk");
    let mut rng = Lcg(42);
    let planted: Vec<(u64, String)> = (0..40)
        .map(|i| (1 + rng.next() % N, format!("zqplant{i:03}x")))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect();

    let mut messages = Vec::new();
    let mut unit = 0_u64;
    let mut id = 1_u64;
    while id <= N {
        unit += 1;
        let body: Vec<&str> =
            (0..12).map(|_| *WORDS.get((rng.next() % 20) as usize).unwrap()).collect();
        let base = format!("message {id} {}", body.join(" "));
        let mut body = base.clone();
        if let Some((_, token)) = planted.iter().find(|(at, _)| *at == id) {
            body.push(' ');
            body.push_str(token);
        }
        if id.is_multiple_of(3) && id < N {
            // An assistant call and its reduced result; plants go in the original's middle.
            let call = ToolCall::new(format!("c{id}"), "grep", format!(r#"{{"pattern":"{id}"}}"#));
            messages.push(
                ArchivedMessage::new(id, unit, ChatMessage::assistant_calls(body, vec![call]))
                    .with_timestamp(id),
            );
            let result_id = id + 1;
            let full = format!("head {result_id} middle {base} tail");
            let mut result = ArchivedMessage::new(
                result_id,
                unit,
                ChatMessage::tool_result(
                    format!("c{id}"),
                    format!("head {result_id} [Data Truncated] tail"),
                ),
            )
            .with_level(Level::Volatile)
            .with_timestamp(result_id)
            .with_original(full);
            let plant_result = planted.iter().find(|(at, _)| *at == result_id);
            if let (Some((_, token)), Some(original)) = (plant_result, result.original.as_mut()) {
                original.push(' ');
                original.push_str(token);
            }
            messages.push(result);
            id += 2;
            continue;
        }
        let role = if id.is_multiple_of(2) { Role::User } else { Role::Assistant };
        messages.push(
            ArchivedMessage::new(id, unit, ChatMessage::text(role, body))
                .with_timestamp(id)
                .with_tokens(20),
        );
        id += 1;
    }
    assert_eq!(messages.len() as u64, N);

    let started = Instant::now();
    for batch in messages.chunks(2_000) {
        archive.put(&bulk, Fence::NONE, batch).unwrap();
    }
    let elapsed = started.elapsed();
    let stats = archive.stats().unwrap();
    eprintln!("imported {N} messages in {elapsed:?}; db {} bytes", stats.db_size_bytes);
    assert_eq!(stats.messages, N);

    for message in &messages {
        assert_eq!(archive.get(&bulk, message.id).unwrap().as_ref(), Some(message));
    }
    for (at, token) in &planted {
        assert_eq!(ids(&archive, "bulk", token, 5), [*at], "{token}");
    }
    let last = archive.rows_after(&bulk, N - 3, 10).unwrap();
    assert_eq!(last.iter().map(|m| m.id).collect::<Vec<_>>(), [N - 2, N - 1, N]);
    drop(archive);
    let reopened = SqliteArchive::open(&path).unwrap();
    assert_eq!(reopened.usage(&bulk).unwrap().messages, N);
}
