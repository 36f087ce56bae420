//! The archive's SQLite schema, its migrations and the connection settings.
//!
//! The schema version lives in `PRAGMA user_version`. [`MIGRATIONS`] is append-only: entry `i`
//! takes a database from version `i` to `i + 1`, each applied in its own transaction, so a file
//! written by an older build is upgraded on open and a newer one is refused.

use rusqlite::{Connection, TransactionBehavior};

use super::error::ArchiveError;

/// Migration scripts, oldest first. Never edit a published entry: append a new one.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4];

/// The schema version this build writes.
///
/// ```
/// assert_eq!(ctxwin_std::archive::schema::SCHEMA_VERSION, 4);
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

/// Applies the connection settings: foreign keys, a busy timeout, and for files WAL with
/// `synchronous = NORMAL` (a commit survives a crash of the process; the last commits may be
/// lost on power failure, never corrupted).
pub(crate) fn configure(conn: &Connection, on_disk: bool) -> Result<(), ArchiveError> {
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
pub(crate) fn version(conn: &Connection) -> Result<i64, ArchiveError> {
    Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// Brings the schema to [`SCHEMA_VERSION`], one transaction per step.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), ArchiveError> {
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(ArchiveError::SchemaTooNew { found, supported: SCHEMA_VERSION });
    }
    for (from, script) in (0_i64..).zip(MIGRATIONS.iter()).skip_while(|(v, _)| *v < found) {
        // IMMEDIATE takes the write lock first, so two processes opening a new file at once do
        // not both try to create the tables.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if version(&tx)? == from {
            tx.execute_batch(script)?;
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
        for script in &MIGRATIONS[..3] {
            conn.execute_batch(script).unwrap();
        }
        conn.pragma_update(None, "user_version", 3).unwrap();
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
    fn refuses_a_newer_schema() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, ArchiveError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION)
        );
    }
}
