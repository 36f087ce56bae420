//! Message rows indexed when their conversation is searched (schema V4): every row gets
//! indexed, a changed row loses its stale vector, the counts BM25 reads stay equal to a
//! recount through writes, updates, forgets and deletes, a search indexes no other
//! conversation's rows, and a store migrated from version 3 searches old and new rows alike.

use postgres::types::Type;

use super::testing::TestSchema;
use super::*;
use crate::store::{ArchiveStore, ArchivedMessage, Forget, MemoryStore, SearchHit, SearchQuery};
use crate::{ChatMessage, core::Level, core::Role};

fn row(id: u64, text: &str) -> ArchivedMessage {
    ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text))
}

/// What the database holds for `scope`'s message rows.
#[derive(Debug, PartialEq, Eq)]
struct Index {
    /// Rows, and of them rows without a search vector.
    rows: i64,
    unindexed: i64,
    /// Indexed rows whose vector is not the one their text gives now.
    stale: i64,
    /// The conversation's counts (`messages`, `message_terms`) and what the rows say they
    /// hold (rows with a `search_len`, their sum).
    counts: (i64, i64),
    counted: (i64, i64),
    /// The counts a recount from the rows' text gives (every row indexed).
    recount: (i64, i64),
}

/// The search vector of a row aliased `m` of conversation `c`, computed afresh.
const FRESH: &str = "to_tsvector('ctxwin_english', left(m.content || ' ' || m.tool_text || ' '
    || coalesce(m.original, ''), 131072))";

fn index(schema: &TestSchema, scope: &Scope) -> Index {
    let sql = format!(
        "SELECT count(m.id), count(m.id) FILTER (WHERE m.search IS NULL),
             count(m.id) FILTER (WHERE m.search IS NOT NULL
                 AND m.search <> {FRESH} || array_to_tsvector(ARRAY['@ ' || c.id])),
             c.messages, c.message_terms, count(m.search_len),
             coalesce(sum(m.search_len), 0)::int8,
             coalesce(sum((SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)
                           FROM unnest({FRESH}))), 0)::int8
         FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id
         WHERE c.tenant = $1 AND c.name = $2
         GROUP BY c.id"
    );
    let mut client = schema.client().unwrap();
    let found = client
        .query_typed(
            &sql,
            &[(&scope.tenant.as_str(), Type::TEXT), (&scope.conversation.as_str(), Type::TEXT)],
        )
        .unwrap();
    let r = &found[0];
    Index {
        rows: r.get(0),
        unindexed: r.get(1),
        stale: r.get(2),
        counts: (r.get(3), r.get(4)),
        counted: (r.get(5), r.get(6)),
        recount: (r.get(0), r.get(7)),
    }
}

/// The conversation's counts hold what its rows say they hold, whatever is indexed.
fn assert_counted(schema: &TestSchema, scope: &Scope, when: &str) -> Index {
    let found = index(schema, scope);
    assert_eq!(found.counts, found.counted, "{when}: {found:?}");
    found
}

/// After a search every row of `scope` is indexed, none stale, and the counts are a recount.
fn assert_indexed(schema: &TestSchema, scope: &Scope, when: &str) {
    let found = assert_counted(schema, scope, when);
    assert_eq!((found.unindexed, found.stale), (0, 0), "{when}: {found:?}");
    assert_eq!(found.counts, found.recount, "{when}: {found:?}");
}

fn ids(hits: &[SearchHit]) -> Vec<u64> {
    hits.iter().map(|hit| hit.id).collect()
}

/// The ids of `scope`'s rows a search for `text` finds, in id order.
fn search(store: &PgStore, scope: &Scope, text: &str) -> Vec<u64> {
    let mut found = ids(&store.search(scope, &SearchQuery::new(text, 10)).unwrap());
    found.sort_unstable();
    found
}

#[test]
fn rows_are_indexed_by_a_search_of_their_conversation_and_no_other() {
    let Some(schema) = TestSchema::new("indexed when searched") else { return };
    let schema = schema.unwrap();
    let store = schema.open().unwrap();
    let (mine, theirs) = (Scope::new("t", "mine"), Scope::new("t", "theirs"));
    let texts = ["deploy to staging", "the deploy failed", "lunch at noon", "deploy again"];
    let rows: Vec<_> = (1..).zip(texts).map(|(id, text)| row(id, text)).collect();
    store.put(&mine, Fence::NONE, &rows).unwrap();
    store.put(&theirs, Fence::NONE, &rows[..3]).unwrap();
    let written = assert_counted(&schema, &mine, "written");
    assert_eq!((written.unindexed, written.counts), (4, (0, 0)), "rows are written unindexed");

    assert_eq!(search(&store, &mine, "deploy"), [1, 2, 4]);
    assert_indexed(&schema, &mine, "searched");
    let other = assert_counted(&schema, &theirs, "another conversation searched");
    assert_eq!((other.unindexed, other.counts), (3, (0, 0)), "{other:?}");

    store.put(&mine, Fence::NONE, &[row(5, "deploy once more")]).unwrap();
    assert_eq!(assert_counted(&schema, &mine, "one more").unindexed, 1);
    assert_eq!(search(&store, &mine, "once"), [5]);
    assert_indexed(&schema, &mine, "searched again");
    assert_eq!(search(&store, &theirs, "deploy"), [1, 2]);
    assert_indexed(&schema, &theirs, "theirs searched");
}

#[test]
fn a_changed_row_loses_its_vector_and_the_counts_follow_updates_forgets_and_deletes() {
    let Some(schema) = TestSchema::new("reindexed") else { return };
    let schema = schema.unwrap();
    let store = schema.open().unwrap();
    let s = Scope::new("t", "c");
    let texts = ["alpha one", "alpha two two", "gamma three", "secret delta four", "five"];
    let rows: Vec<_> = (1..).zip(texts).map(|(id, text)| row(id, text)).collect();
    store.put(&s, Fence::NONE, &rows).unwrap();
    assert_eq!(search(&store, &s, "alpha"), [1, 2]);
    assert_indexed(&schema, &s, "first search");

    // Row 2's text changes (twice before a search: its old length stays counted once);
    // row 3 changes but not its text (its vector is kept).
    store.put(&s, Fence::NONE, &[row(2, "beta")]).unwrap();
    store.put(&s, Fence::NONE, &[row(2, "beta beta beta words")]).unwrap();
    store.put(&s, Fence::NONE, &[row(3, "gamma three").with_level(Level::Session)]).unwrap();
    let changed = assert_counted(&schema, &s, "changed");
    assert_eq!((changed.unindexed, changed.stale), (1, 0), "{changed:?}");
    assert_eq!(search(&store, &s, "alpha"), [1], "no stale vector");
    assert_eq!(search(&store, &s, "beta"), [2]);
    assert_indexed(&schema, &s, "changed and searched");

    let forget = Forget { ids: &[], texts: &["secret"] };
    assert_eq!(store.forget(&s, Fence::NONE, &forget).unwrap().messages, [4]);
    assert_eq!(assert_counted(&schema, &s, "forgot").unindexed, 1);
    assert!(search(&store, &s, "secret").is_empty());
    assert_eq!(search(&store, &s, "delta"), [4]);
    assert_indexed(&schema, &s, "forgot and searched");

    // Deleted: row 3 changed since its indexing, row 6 never indexed, rows 4, 5 indexed.
    store.put(&s, Fence::NONE, &[row(3, "gamma changed"), row(6, "six")]).unwrap();
    store.delete_from(&s, Fence::NONE, 3).unwrap();
    assert_counted(&schema, &s, "deleted");
    assert_eq!(search(&store, &s, "alpha beta"), [1, 2]);
    assert_indexed(&schema, &s, "deleted and searched");
    store.put(&s, Fence::NONE, &[row(3, "gamma again")]).unwrap();
    store.delete_conversation(&s, Fence::NONE).unwrap();
    let gone = assert_counted(&schema, &s, "conversation deleted");
    assert_eq!((gone.rows, gone.counts), (0, (0, 0)));
}

#[test]
fn a_store_migrated_from_version_3_searches_rows_written_before_and_after() {
    let Some(schema) = TestSchema::new("from v3") else { return };
    let schema = schema.unwrap();
    let s = Scope::new("t", "old");
    let before = [row(1, "deploy the service"), row(2, "deploy failed twice, deploy")];
    let mut client = schema.client().unwrap();
    assert_eq!(schema::migrate_to(&mut client, 3).map_err(|Failure(e)| e).unwrap(), 3);
    let conversation: i64 = client
        .query_one("INSERT INTO conversations (tenant, name) VALUES ('t', 'old') RETURNING id", &[])
        .unwrap()
        .get(0);
    let columns = rows::encode(&s, &before).map_err(|Failure(e)| e).unwrap();
    let mut params: Vec<rows::Param<'_>> = vec![(&conversation, Type::INT8)];
    params.extend(columns.params());
    client.query_typed(rows::UPSERT, &params).unwrap();
    assert_eq!(index(&schema, &s).counts, index(&schema, &s).recount, "version 3 indexed");

    let store = schema.open().unwrap();
    assert_eq!(store.schema_version().unwrap(), 4);
    let after = [row(3, "lunch"), row(4, "deploy to staging")];
    store.put(&s, Fence::NONE, &after).unwrap();
    let migrated = assert_counted(&schema, &s, "migrated");
    assert_eq!((migrated.unindexed, migrated.stale), (2, 0), "old rows keep their vectors");

    let memory = MemoryStore::new();
    memory.put(&s, Fence::NONE, &before).unwrap();
    memory.put(&s, Fence::NONE, &after).unwrap();
    let query = SearchQuery::new("deploy", 10);
    let (from_pg, from_memory) =
        (store.search(&s, &query).unwrap(), memory.search(&s, &query).unwrap());
    assert_eq!(from_pg.len(), 3, "{from_pg:?}");
    assert_eq!(ids(&from_pg), ids(&from_memory));
    for (pg, memory) in from_pg.iter().zip(&from_memory) {
        assert!((pg.score - memory.score).abs() < 1e-9, "{from_pg:?} {from_memory:?}");
    }
    assert_indexed(&schema, &s, "searched after the migration");
}

/// Searches from two other handles while one writes new rows and rewrites old ones: whatever
/// the interleaving (two searches indexing at once, a write between a search's look and its
/// update), the counts hold what the rows say, and a last search leaves them a recount.
#[test]
fn searches_during_writes_leave_the_counts_a_recount() {
    let Some(schema) = TestSchema::new("index while writing") else { return };
    let schema = schema.unwrap();
    let writer = schema.open().unwrap();
    let searchers = [schema.open().unwrap(), schema.open().unwrap()];
    let s = Scope::new("t", "busy");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|threads| {
        for searcher in &searchers {
            threads.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    searcher.search(&s, &SearchQuery::new("deploy words", 5)).unwrap();
                }
            });
        }
        for id in 1..=120_u64 {
            let mut rows = vec![row(id, &format!("deploy {id} words"))];
            if id > 10 {
                rows.push(row(id - 10, &format!("deploy rewritten {id} more words than before")));
            }
            writer.put(&s, Fence::NONE, &rows).unwrap();
            if id == 100 {
                writer.delete_from(&s, Fence::NONE, 90).unwrap();
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_counted(&schema, &s, "written while searched");
    assert_eq!(search(&writer, &s, "rewritten").len(), 10, "a full page of hits");
    assert_indexed(&schema, &s, "searched at the end");
}
