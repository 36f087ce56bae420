//! The archive's SQLite schema, its migrations and the connection settings.
//!
//! The schema version lives in `PRAGMA user_version`. [`MIGRATIONS`] is append-only: entry `i`
//! takes a database from version `i` to `i + 1`, each applied in its own transaction, so a file
//! written by an older build is upgraded on open and a newer one is refused.

use rusqlite::{Connection, TransactionBehavior};

use super::error::{Failure, Sql};
use crate::store::StoreError;

/// Migration scripts, oldest first. Never edit a published entry: append a new one.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

/// The schema version this build writes.
///
/// ```
/// assert_eq!(ctxwin_std::store::sqlite::schema::SCHEMA_VERSION, 8);
/// ```
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Version 1: sessions, messages (with the original text of reduced ones), keywords, summaries
/// with their sources, compression metrics, and FTS5 indexes kept in step by triggers.
const V1: &str = r#"
CREATE TABLE sessions (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

-- `id` and `unit` are the core manager's per-session counters; `pk` is the row id the FTS
-- index points at.
CREATE TABLE messages (
    pk           INTEGER PRIMARY KEY,
    session_id   INTEGER NOT NULL REFERENCES sessions(id),
    id           INTEGER NOT NULL,
    unit         INTEGER NOT NULL,
    level        INTEGER NOT NULL,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    tool_calls   TEXT,
    tool_text    TEXT NOT NULL,
    tool_call_id TEXT,
    original     TEXT,
    timestamp    INTEGER NOT NULL,
    tokens       INTEGER NOT NULL,
    name         TEXT,
    is_error     INTEGER NOT NULL DEFAULT 0,
    UNIQUE (session_id, id)
);
CREATE INDEX messages_unit ON messages(session_id, unit, id);

CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, tool_text, original,
    content = 'messages', content_rowid = 'pk',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, tool_text, original)
    VALUES (new.pk, new.content, new.tool_text, new.original);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original)
    VALUES ('delete', old.pk, old.content, old.tool_text, old.original);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original)
    VALUES ('delete', old.pk, old.content, old.tool_text, old.original);
    INSERT INTO messages_fts(rowid, content, tool_text, original)
    VALUES (new.pk, new.content, new.tool_text, new.original);
END;

CREATE TABLE keywords (
    keyword    TEXT NOT NULL,
    message_pk INTEGER NOT NULL REFERENCES messages(pk) ON DELETE CASCADE,
    count      INTEGER NOT NULL,
    PRIMARY KEY (keyword, message_pk)
) WITHOUT ROWID;
CREATE INDEX keywords_message ON keywords(message_pk);

CREATE TABLE summaries (
    pk            INTEGER PRIMARY KEY,
    session_id    INTEGER NOT NULL REFERENCES sessions(id),
    id            INTEGER NOT NULL,
    level         INTEGER NOT NULL,
    text          TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    tokens_before INTEGER NOT NULL,
    tokens_after  INTEGER NOT NULL,
    UNIQUE (session_id, id)
);
-- A source is a message id or, for a summary of summaries, a summary id of the same session.
CREATE TABLE summary_sources (
    summary_pk INTEGER NOT NULL REFERENCES summaries(pk) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    source_id  INTEGER NOT NULL,
    PRIMARY KEY (summary_pk, position)
) WITHOUT ROWID;

CREATE VIRTUAL TABLE summaries_fts USING fts5(
    text,
    content = 'summaries', content_rowid = 'pk',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER summaries_fts_insert AFTER INSERT ON summaries BEGIN
    INSERT INTO summaries_fts(rowid, text) VALUES (new.pk, new.text);
END;
CREATE TRIGGER summaries_fts_delete AFTER DELETE ON summaries BEGIN
    INSERT INTO summaries_fts(summaries_fts, rowid, text) VALUES ('delete', old.pk, old.text);
END;
CREATE TRIGGER summaries_fts_update AFTER UPDATE ON summaries BEGIN
    INSERT INTO summaries_fts(summaries_fts, rowid, text) VALUES ('delete', old.pk, old.text);
    INSERT INTO summaries_fts(rowid, text) VALUES (new.pk, new.text);
END;

CREATE TABLE compression_metrics (
    pk             INTEGER PRIMARY KEY,
    session_id     INTEGER NOT NULL REFERENCES sessions(id),
    timestamp      INTEGER NOT NULL,
    tokens_before  INTEGER NOT NULL,
    tokens_after   INTEGER NOT NULL,
    units_evicted  INTEGER NOT NULL,
    summaries_made INTEGER NOT NULL,
    strategy       TEXT NOT NULL
);
CREATE INDEX compression_metrics_session ON compression_metrics(session_id, timestamp);
"#;

/// Version 2: the archive's own facts, above all its identity (a random id written once, on
/// creation), which checkpoints record to tell their archive from any other.
const V2: &str = r#"
CREATE TABLE archive_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"#;

/// Version 3: semantic vectors of messages, one per message and embedding model (little-endian
/// `f32`s). A change of the message's content deletes its vectors (they described the old
/// text; forgetting relies on it), and so does deleting the message.
const V3: &str = r#"
CREATE TABLE message_vectors (
    message_pk INTEGER NOT NULL REFERENCES messages(pk) ON DELETE CASCADE,
    model      TEXT NOT NULL,
    vector     BLOB NOT NULL,
    PRIMARY KEY (message_pk, model)
) WITHOUT ROWID;
CREATE TRIGGER message_vectors_stale AFTER UPDATE OF content ON messages
WHEN old.content IS NOT new.content BEGIN
    DELETE FROM message_vectors WHERE message_pk = old.pk;
END;
"#;

/// Version 4: the full-text index also holds each message's session id (a column searched
/// only by name, weighted 0 in BM25), so a search within one session intersects the session's
/// postings with the words' instead of ranking every session's matches and filtering them: an
/// archive many sessions share (the proxy's) costs a session's search what its own messages
/// cost. The index is rebuilt from the messages.
const V4: &str = r#"
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;
DROP TABLE messages_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, tool_text, original, session_id,
    content = 'messages', content_rowid = 'pk',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, tool_text, original, session_id)
    VALUES (new.pk, new.content, new.tool_text, new.original, new.session_id);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original, session_id)
    VALUES ('delete', old.pk, old.content, old.tool_text, old.original, old.session_id);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original, session_id)
    VALUES ('delete', old.pk, old.content, old.tool_text, old.original, old.session_id);
    INSERT INTO messages_fts(rowid, content, tool_text, original, session_id)
    VALUES (new.pk, new.content, new.tool_text, new.original, new.session_id);
END;
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
"#;

/// Version 5: scopes and checksums. A conversation is a tenant's (`sessions.tenant`; `''` the
/// local tenant, which every conversation of older files belongs to), and its name is unique
/// per tenant. Rows gain the client's raw JSON (`messages.raw`), and messages, summaries and
/// vectors a checksum of their values and scope (`crate::store::checksum`), computed for
/// existing rows right after this script (a row that does not decode keeps none, and is
/// reported damaged when read). The summaries' full-text index holds the session id too, as
/// the messages' does since version 4. `sessions` is rebuilt (SQLite cannot change a table's
/// constraints in place), with foreign keys off for the step.
const V5: &str = r#"
CREATE TABLE sessions_v5 (
    id     INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    name   TEXT NOT NULL,
    UNIQUE (tenant, name)
);
INSERT INTO sessions_v5 (id, tenant, name) SELECT id, '', name FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v5 RENAME TO sessions;
ALTER TABLE messages ADD COLUMN raw TEXT;
ALTER TABLE messages ADD COLUMN checksum INTEGER;
ALTER TABLE summaries ADD COLUMN checksum INTEGER;
ALTER TABLE message_vectors ADD COLUMN checksum INTEGER;
DROP TRIGGER summaries_fts_insert;
DROP TRIGGER summaries_fts_delete;
DROP TRIGGER summaries_fts_update;
DROP TABLE summaries_fts;
CREATE VIRTUAL TABLE summaries_fts USING fts5(
    text, session_id,
    content = 'summaries', content_rowid = 'pk',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER summaries_fts_insert AFTER INSERT ON summaries BEGIN
    INSERT INTO summaries_fts(rowid, text, session_id) VALUES (new.pk, new.text, new.session_id);
END;
CREATE TRIGGER summaries_fts_delete AFTER DELETE ON summaries BEGIN
    INSERT INTO summaries_fts(summaries_fts, rowid, text, session_id)
    VALUES ('delete', old.pk, old.text, old.session_id);
END;
CREATE TRIGGER summaries_fts_update AFTER UPDATE ON summaries BEGIN
    INSERT INTO summaries_fts(summaries_fts, rowid, text, session_id)
    VALUES ('delete', old.pk, old.text, old.session_id);
    INSERT INTO summaries_fts(rowid, text, session_id) VALUES (new.pk, new.text, new.session_id);
END;
INSERT INTO summaries_fts(summaries_fts) VALUES ('rebuild');
"#;

/// Version 6: the record port ([`RecordStore`](crate::store::RecordStore)): keyed records of
/// a tenant's namespace, each with its checksum (`crate::store::checksum::record`). Names and
/// keys are their UTF-8 bytes as BLOBs: compared byte by byte (as every adapter orders keys),
/// NUL included, and a key prefix is a range of the primary key. Nothing older changes.
const V6: &str = r#"
CREATE TABLE records (
    tenant     BLOB NOT NULL,
    namespace  BLOB NOT NULL,
    collection BLOB NOT NULL,
    key        BLOB NOT NULL,
    value      BLOB NOT NULL,
    fields     TEXT,
    checksum   INTEGER NOT NULL,
    PRIMARY KEY (tenant, namespace, collection, key)
) WITHOUT ROWID;
"#;

/// Version 7: no keyword table. Every message's identifiers, paths, numbers and names were
/// extracted into `keywords` as it was written, for a lookup nothing but tests called (search
/// is the full-text index, which finds the same words): a quarter of a proxy's CPU, spent by
/// its archive writer on every row. PostgreSQL never had the table.
const V7: &str = r#"
DROP TABLE keywords;
"#;

/// Version 8: a message may wait to enter the full-text index until its conversation is
/// searched (`messages.indexed` 0; the writer chooses:
/// [`SqliteArchive::index_when_searched`](super::SqliteArchive::index_when_searched)). A
/// proxy that never searches (retrieval off, its default) spent a quarter of its CPU
/// tokenizing every row as it was written. The triggers keep the index holding exactly the
/// rows marked indexed, with their current text: a row inserted indexed enters it; an update
/// takes the old text out if it was in and puts the new one in if the row is indexed now (a
/// search indexes a conversation's waiting rows by setting the mark); a delete takes an
/// indexed row out. Rows written before this version are indexed.
const V8: &str = r#"
ALTER TABLE messages ADD COLUMN indexed INTEGER NOT NULL DEFAULT 1;
CREATE INDEX messages_unindexed ON messages(session_id) WHERE indexed = 0;
DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.indexed = 1 BEGIN
    INSERT INTO messages_fts(rowid, content, tool_text, original, session_id)
    VALUES (new.pk, new.content, new.tool_text, new.original, new.session_id);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.indexed = 1 BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original, session_id)
    VALUES ('delete', old.pk, old.content, old.tool_text, old.original, old.session_id);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_text, original, session_id)
    SELECT 'delete', old.pk, old.content, old.tool_text, old.original, old.session_id
    WHERE old.indexed = 1;
    INSERT INTO messages_fts(rowid, content, tool_text, original, session_id)
    SELECT new.pk, new.content, new.tool_text, new.original, new.session_id
    WHERE new.indexed = 1;
END;
"#;

/// Applies the connection settings: foreign keys, a busy timeout, and for files WAL with
/// `synchronous = NORMAL` (a commit survives a crash of the process; the last commits may be
/// lost on power failure, never corrupted).
pub(super) fn configure(conn: &Connection, on_disk: bool) -> Sql<()> {
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    if on_disk {
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "archive: WAL mode refused, using this journal mode");
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
    }
    Ok(())
}

/// Reads `PRAGMA user_version`.
pub(super) fn version(conn: &Connection) -> Sql<i64> {
    Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// Brings the schema to [`SCHEMA_VERSION`], one transaction per step, foreign keys off
/// meanwhile (a step may rebuild a table others refer to) and checked before each commit.
pub(super) fn migrate(conn: &mut Connection) -> Sql<()> {
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(Failure(StoreError::SchemaTooNew { found, supported: SCHEMA_VERSION }));
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    conn.pragma_update(None, "foreign_keys", false)?;
    let migrated = migrate_from(conn, found);
    conn.pragma_update(None, "foreign_keys", true)?;
    migrated
}

fn migrate_from(conn: &mut Connection, found: i64) -> Sql<()> {
    for (from, script) in (0_i64..).zip(MIGRATIONS.iter()).skip_while(|(v, _)| *v < found) {
        // IMMEDIATE takes the write lock first, so two processes opening a new file at once do
        // not both try to create the tables.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if version(&tx)? == from {
            tx.execute_batch(script)?;
            if from == 4 {
                super::integrity::backfill_checksums(&tx)?;
            }
            let violations: i64 =
                tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| {
                    row.get(0)
                })?;
            if violations > 0 {
                return Err(Failure(StoreError::damaged(
                    "the archive database",
                    format!("{violations} rows refer to rows that do not exist"),
                )));
            }
            tx.pragma_update(None, "user_version", from.saturating_add(1))?;
            tracing::info!(from, to = from.saturating_add(1), "archive: schema migrated");
        }
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `conn` at schema `version`, as a build of that version left it.
    fn at_version(conn: &Connection, version: usize) {
        for script in &MIGRATIONS[..version] {
            conn.execute_batch(script).unwrap();
        }
        conn.pragma_update(None, "user_version", version as i64).unwrap();
    }

    #[test]
    fn migrates_a_fresh_database_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        migrate(&mut conn).unwrap();
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'messages'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(tables, 1);
    }

    #[test]
    fn version_4_indexes_the_messages_a_version_3_file_holds() {
        let mut conn = Connection::open_in_memory().unwrap();
        at_version(&conn, 3);
        conn.execute_batch(
            "INSERT INTO sessions (id, name) VALUES (7, 'old');
             INSERT INTO messages (session_id, id, unit, level, role, content, tool_text, timestamp, tokens)
             VALUES (7, 1, 1, 2, 'user', 'the staging database runs Postgres 16', '', 0, 9);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let found: i64 = conn
            .query_row(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'session_id : \"7\" AND postgres'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 1);
    }

    #[test]
    fn version_5_scopes_and_checksums_the_rows_of_a_version_4_file() {
        use crate::store::{ArchiveStore, Scope, SearchQuery};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            at_version(&conn, 4);
            conn.execute_batch(
                "INSERT INTO archive_meta VALUES ('identity', 'old-identity');
                 INSERT INTO sessions (id, name) VALUES (7, 'old'), (8, 'broken');
                 INSERT INTO messages (session_id, id, unit, level, role, content, tool_text, original, timestamp, tokens)
                 VALUES (7, 1, 1, 2, 'user', 'the staging database runs Postgres 16', '', 'full text', 5, 9);
                 INSERT INTO messages (session_id, id, unit, level, role, content, tool_calls, tool_text, timestamp, tokens)
                 VALUES (8, 2, 2, 2, 'user', 'broken row', '{not json', '', 6, 1);
                 INSERT INTO summaries (id, session_id, level, text, created_at, tokens_before, tokens_after)
                 VALUES (10, 7, 1, 'about postgres', 1, 9, 2);
                 INSERT INTO summary_sources VALUES (1, 0, 1);
                 INSERT INTO message_vectors (message_pk, model, vector) VALUES (1, 'm', x'0000803f');",
            )
            .unwrap();
        }
        let archive = crate::store::sqlite::SqliteArchive::open(&path).unwrap();
        assert_eq!(archive.schema_version().unwrap(), SCHEMA_VERSION);
        let old = Scope::local("old");
        let row = archive.get(&old, 1).unwrap().unwrap();
        assert_eq!(
            (row.message.content.as_str(), row.original.as_deref()),
            ("the staging database runs Postgres 16", Some("full text"))
        );
        assert_eq!(archive.search(&old, &SearchQuery::new("postgres", 5)).unwrap()[0].id, 1);
        assert_eq!(archive.summary(&old, 10).unwrap().unwrap().source_ids, [1]);
        assert_eq!(
            archive.search_summaries(&old, &SearchQuery::new("postgres", 5)).unwrap()[0].id,
            10
        );
        assert_eq!(archive.vectors(&old, "m", 0).unwrap()[0].vector.as_deref(), Some(&[1.0][..]));
        // A row that did not decode has no checksum: reported, never served.
        let broken = Scope::local("broken");
        assert_eq!(archive.get(&broken, 2).unwrap_err().kind(), crate::store::ErrorKind::Damaged);
        assert_eq!(archive.conversations("", "").unwrap(), ["broken", "old"]);
        assert_eq!(archive.identity().unwrap(), "old-identity");
    }

    #[test]
    fn version_8_keeps_the_rows_of_a_version_7_file_in_the_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        at_version(&conn, 7);
        conn.execute_batch(
            "INSERT INTO sessions (id, tenant, name) VALUES (7, '', 'old');
             INSERT INTO messages (session_id, id, unit, level, role, content, tool_text, timestamp, tokens)
             VALUES (7, 1, 1, 2, 'user', 'the staging database runs Postgres 16', '', 0, 9),
                    (7, 2, 2, 2, 'user', 'and the lexer panics', '', 0, 5);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let waiting: i64 = conn
            .query_row("SELECT count(*) FROM messages WHERE indexed = 0", [], |r| r.get(0))
            .unwrap();
        assert_eq!(waiting, 0, "the rows a version 7 trigger indexed are marked indexed");
        // Their index entries follow an update and a delete: FTS5 finds its index and the
        // table in step (rank 1 compares the two).
        conn.execute_batch(
            "UPDATE messages SET content = 'the lexer is fixed' WHERE id = 2;
             DELETE FROM messages WHERE id = 1;
             INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1);",
        )
        .unwrap();
        let found = |word: &str| -> i64 {
            let query =
                format!("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH '{word}'");
            conn.query_row(&query, [], |r| r.get(0)).unwrap()
        };
        assert_eq!((found("fixed"), found("panics"), found("postgres")), (1, 0, 0));
    }

    #[test]
    fn refuses_a_newer_schema() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        let err = StoreError::from(migrate(&mut conn).unwrap_err());
        assert!(
            matches!(err, StoreError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION)
        );
    }
}
