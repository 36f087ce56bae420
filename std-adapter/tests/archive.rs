//! Integration tests of the SQLite archive against real database files in a temp dir.

use std::path::PathBuf;
use std::time::Instant;

use ctxwin_std::archive::{
    Archive, ArchiveError, ArchivedMessage, CompressionRecord, SummaryRecord, as_dynamic_context,
};
use ctxwin_std::core::{Level, Role};
use ctxwin_std::{ChatMessage, ToolCall};
use tempfile::TempDir;

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
    let mut archive = Archive::open(&path).unwrap();
    let unit = tool_unit(10, 4);
    assert_eq!(archive.store_unit("s1", &unit).unwrap(), 2);

    assert_eq!(archive.get("s1", 10).unwrap().as_ref(), unit.first());
    assert_eq!(archive.get("s1", 11).unwrap().as_ref(), unit.get(1));
    assert_eq!(archive.unit("s1", 4).unwrap(), unit);
    let stored = archive.unit("s1", 4).unwrap();
    assert_eq!(
        (stored[0].message.name.as_deref(), stored[1].message.is_error),
        (Some("coder"), true)
    );
    assert_eq!(archive.get("s1", 12).unwrap(), None);
    assert_eq!(archive.get("other", 10).unwrap(), None);

    // The middle of the reduced output, the tool name and an argument are all searchable.
    let by_original = archive.search(Some("s1"), "tokenize_heredoc", 5).unwrap();
    assert_eq!(by_original.iter().map(|h| h.id).collect::<Vec<_>>(), [11]);
    let by_tool = archive.search(Some("s1"), "read_file", 5).unwrap();
    assert_eq!(by_tool.first().map(|h| (h.id, h.unit, h.role)), Some((10, 4, Role::Assistant)));
    let by_argument = archive.search(None, "src/lexer.rs", 5).unwrap();
    assert_eq!(by_argument.first().map(|h| h.id), Some(10));
    assert_eq!(archive.by_keyword(Some("s1"), "tokenize_heredoc", 5).unwrap().len(), 1);
}

#[test]
fn restoring_an_id_never_duplicates() {
    let (_dir, path) = temp_db();
    let mut archive = Archive::open(&path).unwrap();
    let unit = tool_unit(1, 1);
    assert_eq!(archive.store_unit("s", &unit).unwrap(), 2);
    assert_eq!(archive.store_unit("s", &unit).unwrap(), 0);
    assert_eq!(archive.store_messages("s", &unit).unwrap(), 0);
    assert_eq!(archive.message_count(Some("s")).unwrap(), 2);

    let mut changed = unit.clone();
    if let Some(call) = changed.first_mut() {
        call.message.content = "now the parser".into();
        call.level = Level::Session;
    }
    assert_eq!(archive.store_unit("s", &changed).unwrap(), 1);
    assert_eq!(archive.message_count(None).unwrap(), 2);
    assert_eq!(archive.unit("s", 1).unwrap(), changed);
    assert_eq!(archive.search(Some("s"), "parser", 5).unwrap().len(), 1);
    assert!(archive.search(Some("s"), "looking", 5).unwrap().is_empty());
}

#[test]
fn a_unit_is_stored_whole_or_not_at_all() {
    let (_dir, path) = temp_db();
    let mut archive = Archive::open(&path).unwrap();
    archive.store_unit("s", &[text(1, Role::User, "before")]).unwrap();

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
    let err = archive.store_unit("s", &unit).unwrap_err();
    assert!(matches!(err, ArchiveError::Sqlite(_)), "{err}");
    assert!(archive.unit("s", 2).unwrap().is_empty());
    assert_eq!(archive.message_count(None).unwrap(), 1);
    assert!(archive.search(None, "one two", 5).unwrap().is_empty());

    let mixed = [text(5, Role::User, "a"), text(6, Role::User, "b")];
    let err = archive.store_unit("s", &mixed).unwrap_err();
    assert!(matches!(err, ArchiveError::MixedUnit { first: 5, other: 6 }));
    assert_eq!(archive.message_count(None).unwrap(), 1);

    raw.execute_batch("DROP TRIGGER fail_boom").unwrap();
    assert_eq!(archive.store_unit("s", &unit).unwrap(), 3);
}

#[test]
fn the_most_specific_mention_ranks_first() {
    let mut archive = Archive::open_in_memory().unwrap();
    let filler = "we talked about many other things like deployment schedules, coffee, \
                  the weather, code review etiquette, vacation plans and the build server";
    archive
        .store_messages(
            "s",
            &[
                text(1, Role::User, &format!("{filler}; oh and the lexer came up once")),
                text(2, Role::Assistant, "The lexer panics on unicode escapes in the lexer tests"),
                text(3, Role::User, "deploy the build server tonight"),
                text(4, Role::User, &format!("{filler}, plus unicode once")),
            ],
        )
        .unwrap();
    let hits = archive.search(Some("s"), "lexer", 10).unwrap();
    assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), [2, 1]);
    assert!(hits.first().unwrap().score > hits.get(1).unwrap().score);

    // Matching both words beats matching one.
    let hits = archive.search(Some("s"), "unicode lexer", 10).unwrap();
    assert_eq!(hits.first().map(|h| h.id), Some(2));
    assert_eq!(hits.len(), 3);
    // Stemming: "panicking"/"panics" share a stem.
    assert_eq!(archive.search(None, "panic", 10).unwrap().first().map(|h| h.id), Some(2));
    assert!(archive.search(Some("nobody"), "lexer", 10).unwrap().is_empty());
    assert!(archive.search(Some("s"), "lexer", 0).unwrap().is_empty());
}

#[test]
fn hostile_queries_never_error() {
    let mut archive = Archive::open_in_memory().unwrap();
    archive
        .store_messages(
            "s",
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
    for query in hostile {
        let hits = archive.search(None, query, 10);
        assert!(hits.is_ok(), "query {query:?} failed: {hits:?}");
        assert!(archive.search_summaries(None, query, 10).is_ok(), "{query:?}");
    }
    assert!(archive.search(None, "", 10).unwrap().is_empty());
    assert_eq!(archive.search(None, "col:val", 10).unwrap().first().map(|h| h.id), Some(1));
    assert_eq!(archive.search(None, "naive cafe", 10).unwrap().first().map(|h| h.id), Some(2));
    assert_eq!(archive.message_count(None).unwrap(), 2);
}

#[test]
fn drill_down_returns_the_originals_in_order() {
    let (_dir, path) = temp_db();
    let mut archive = Archive::open(&path).unwrap();
    let mut all = vec![text(1, Role::User, "read the lexer")];
    all.extend(tool_unit(2, 2));
    all.push(text(4, Role::Assistant, "the lexer uses heredocs"));
    all.push(text(5, Role::User, "now the parser"));
    archive.store_messages("s", &all).unwrap();

    let mut level1 = SummaryRecord::new(100, 1, "looked at the lexer", vec![4, 1, 3, 2]);
    level1.tokens_before = 80;
    level1.tokens_after = 9;
    archive.store_summary("s", &level1).unwrap();
    archive.store_summary("s", &SummaryRecord::new(101, 1, "parser next", vec![5])).unwrap();
    archive
        .store_summary("s", &SummaryRecord::new(200, 2, "lexer then parser", vec![101, 100]))
        .unwrap();

    let ids = |summary| {
        archive.drill_down("s", summary).unwrap().iter().map(|m| m.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(100), [1, 2, 3, 4]);
    assert_eq!(ids(200), [1, 2, 3, 4, 5]);
    assert_eq!(archive.drill_down("s", 100).unwrap().get(2), all.get(2));
    assert_eq!(archive.summary("s", 100).unwrap(), Some(level1));
    let found = archive.search_summaries(Some("s"), "parser", 5).unwrap();
    assert_eq!(found.iter().map(|h| h.id).collect::<Vec<_>>(), [101, 200]);
    assert!(matches!(archive.drill_down("s", 4), Err(ArchiveError::SummaryNotFound { id: 4, .. })));
}

#[test]
fn file_archives_run_in_wal_mode() {
    let (_dir, path) = temp_db();
    let mut archive = Archive::open(&path).unwrap();
    assert_eq!(archive.journal_mode().unwrap(), "wal");
    archive.store_unit("s", &[text(1, Role::User, "hello")]).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    assert!(path.with_extension("db-wal").exists());
}

#[test]
fn reopening_keeps_everything() {
    let (_dir, path) = temp_db();
    {
        let mut archive = Archive::open(&path).unwrap();
        archive.store_unit("s", &tool_unit(1, 1)).unwrap();
        archive
            .store_summary("s", &SummaryRecord::new(9, 1, "read the lexer", vec![1, 2]))
            .unwrap();
        let mut event = CompressionRecord::new(5, 10_000, 2_500, "summarize-oldest");
        event.units_evicted = 3;
        event.summaries_made = 1;
        archive.record_compression("s", &event).unwrap();
    }
    let archive = Archive::open(&path).unwrap();
    assert_eq!(archive.unit("s", 1).unwrap(), tool_unit(1, 1));
    assert_eq!(archive.drill_down("s", 9).unwrap().len(), 2);
    assert_eq!(archive.search(None, "tokenize_heredoc", 5).unwrap().len(), 1);
    let metrics = archive.metrics_summary(Some("s")).unwrap();
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
    drop(Archive::open(&path).unwrap());
    rusqlite::Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
    assert!(matches!(Archive::open(&path), Err(ArchiveError::SchemaTooNew { found: 99, .. })));
}

#[test]
fn sessions_with_the_same_ids_stay_apart() {
    let mut archive = Archive::open_in_memory().unwrap();
    archive.store_unit("a", &[text(1, Role::User, "alpha planning")]).unwrap();
    archive.store_unit("b", &[text(1, Role::User, "beta planning")]).unwrap();
    assert_eq!(archive.get("a", 1).unwrap().unwrap().message.content, "alpha planning");
    assert_eq!(archive.get("b", 1).unwrap().unwrap().message.content, "beta planning");
    assert_eq!(archive.search(None, "planning", 10).unwrap().len(), 2);
    let only_b = archive.search(Some("b"), "planning", 10).unwrap();
    assert_eq!(only_b.iter().map(|h| h.session.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(archive.recent("a", 10).unwrap().len(), 1);
}

#[test]
fn retrieved_hits_format_as_dynamic_context() {
    let mut archive = Archive::open_in_memory().unwrap();
    archive.store_unit("s", &tool_unit(1, 1)).unwrap();
    archive.store_unit("s", &[text(3, Role::User, "Let's switch the queue to Postgres")]).unwrap();
    let hits = archive.search(Some("s"), "what did we decide about postgres?", 3).unwrap();
    let block = as_dynamic_context(&hits, 400);
    assert_eq!(
        block,
        "[Retrieved from archive]\n- (msg 3, user) Let's switch the queue to Postgres"
    );
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
    let mut archive = Archive::open(&path).unwrap();
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
    assert_eq!(archive.store_messages("bulk", &messages).unwrap(), N as usize);
    let elapsed = started.elapsed();
    let stats = archive.stats().unwrap();
    eprintln!(
        "imported {N} messages in {elapsed:?}; db {} bytes; {} keyword rows",
        stats.db_size_bytes, stats.keywords
    );
    assert_eq!(stats.messages, N);

    for message in &messages {
        assert_eq!(archive.get("bulk", message.id).unwrap().as_ref(), Some(message));
    }
    for (at, token) in &planted {
        let hits = archive.search(Some("bulk"), token, 5).unwrap();
        assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), [*at], "{token}");
        let by_kw = archive.by_keyword(Some("bulk"), token, 5).unwrap();
        assert_eq!(by_kw.iter().map(|h| h.id).collect::<Vec<_>>(), [*at], "{token}");
    }
    let recent = archive.recent("bulk", 3).unwrap();
    assert_eq!(recent.iter().map(|m| m.id).collect::<Vec<_>>(), [N - 2, N - 1, N]);
    drop(archive);
    let reopened = Archive::open(&path).unwrap();
    assert_eq!(reopened.message_count(Some("bulk")).unwrap(), N);
}
