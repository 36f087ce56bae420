//! Forgetting: text out of a conversation's rows (content, tool calls, original, raw JSON),
//! its summaries, the full-text index and vectors, with no copy left in the database file or
//! its WAL.

use rusqlite::Connection;

use super::error::{Sql, from_sql_int};
use super::{MESSAGE_COLUMNS, SqliteArchive, decode_message};
use crate::store::types::scrub_row;
use crate::store::{ArchivedMessage, FORGOTTEN, Forget, Forgotten, Scope};

/// Ids of the rows of session `session_id` holding `text` anywhere (exact, case-sensitive).
fn containing(conn: &Connection, session_id: i64, text: &str) -> Sql<Vec<u64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id FROM messages
         WHERE session_id = ?1 AND (instr(content, ?2) > 0 OR instr(tool_text, ?2) > 0
             OR instr(coalesce(original, ''), ?2) > 0 OR instr(coalesce(tool_calls, ''), ?2) > 0
             OR instr(coalesce(raw, ''), ?2) > 0)
         ORDER BY id",
    )?;
    let mut rows = stmt.query(rusqlite::params![session_id, text])?;
    let mut ids = Vec::new();
    while let Some(row) = rows.next()? {
        ids.push(from_sql_int("message id", row.get(0)?)?);
    }
    Ok(ids)
}

/// Ids of the summaries of session `session_id` that stand for one of `ids` or quote one of
/// `texts`.
fn summaries_touched(
    conn: &Connection,
    session_id: i64,
    ids: &[u64],
    texts: &[&str],
) -> Sql<Vec<u64>> {
    let mut found = Vec::new();
    let mut by_source = conn.prepare_cached(
        "SELECT u.id FROM summaries u JOIN summary_sources ss ON ss.summary_pk = u.pk
         WHERE u.session_id = ?1 AND ss.source_id = ?2",
    )?;
    for &id in ids {
        let Ok(id) = i64::try_from(id) else { continue };
        let mut rows = by_source.query([session_id, id])?;
        while let Some(row) = rows.next()? {
            found.push(from_sql_int("summary id", row.get(0)?)?);
        }
    }
    let mut by_text = conn
        .prepare_cached("SELECT id FROM summaries WHERE session_id = ?1 AND instr(text, ?2) > 0")?;
    for text in texts {
        let mut rows = by_text.query(rusqlite::params![session_id, text])?;
        while let Some(row) = rows.next()? {
            found.push(from_sql_int("summary id", row.get(0)?)?);
        }
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// A damaged row holding forgotten text: scrubbed in SQL, its checksum left as it is (the row
/// stays reported as damaged, and the text is gone).
fn scrub_in_place(conn: &Connection, session_id: i64, id: u64, what: &Forget<'_>) -> Sql<()> {
    let Ok(id) = i64::try_from(id) else { return Ok(()) };
    if what.ids.iter().any(|&forgotten| i64::try_from(forgotten) == Ok(id)) {
        conn.execute(
            "UPDATE messages SET content = ?3, tool_calls = NULL, tool_text = '', original = NULL,
                 raw = NULL
             WHERE session_id = ?1 AND id = ?2",
            rusqlite::params![session_id, id, FORGOTTEN],
        )?;
    }
    for text in what.texts.iter().filter(|t| !t.is_empty()) {
        conn.execute(
            "UPDATE messages SET content = replace(content, ?3, ?4),
                 tool_text = replace(tool_text, ?3, ?4), original = replace(original, ?3, ?4),
                 raw = CASE WHEN instr(coalesce(raw, ''), ?3) > 0 THEN NULL ELSE raw END,
                 tool_calls = CASE WHEN instr(coalesce(tool_calls, ''), ?3) > 0
                     THEN NULL ELSE tool_calls END
             WHERE session_id = ?1 AND id = ?2",
            rusqlite::params![session_id, id, text, FORGOTTEN],
        )?;
    }
    Ok(())
}

impl SqliteArchive {
    pub(super) fn forget_sql(&self, scope: &Scope, what: &Forget<'_>) -> Sql<Forgotten> {
        let Some(session_id) = self.session_id(scope)? else { return Ok(Forgotten::default()) };
        let texts: Vec<&str> = what.texts.iter().copied().filter(|t| !t.is_empty()).collect();
        let what = Forget { ids: what.ids, texts: &texts };
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        conn.pragma_update(None, "secure_delete", true)?;
        let tx = conn.transaction()?;
        let mut messages: Vec<u64> = what.ids.to_vec();
        for text in &texts {
            messages.extend(containing(&tx, session_id, text)?);
        }
        messages.sort_unstable();
        messages.dedup();
        let summaries = summaries_touched(&tx, session_id, &messages, &texts)?;
        let mut rewritten: Vec<ArchivedMessage> = Vec::new();
        for &id in &messages {
            match read_row(&tx, scope, session_id, id) {
                Ok(Some(mut row)) => {
                    scrub_row(&mut row, &what);
                    rewritten.push(row);
                }
                Ok(None) => {}
                Err(_) => scrub_in_place(&tx, session_id, id, &what)?,
            }
        }
        let encoded =
            rewritten.iter().map(|row| super::rows::encode(scope, row)).collect::<Sql<Vec<_>>>()?;
        super::rows::write_rows(&tx, session_id, &encoded, self.index_on_write)?;
        for &id in &summaries {
            let Ok(sql_id) = i64::try_from(id) else { continue };
            let Some(mut summary) = super::summaries::unverified(&tx, session_id, sql_id)? else {
                continue;
            };
            for text in &texts {
                summary.text = summary.text.replace(text, FORGOTTEN);
            }
            super::summaries::write(&tx, session_id, &super::summaries::encode(scope, &summary)?)?;
        }
        tx.commit()?;
        drop(conn);
        self.scrub()?;
        tracing::info!(
            %scope,
            messages = messages.len(),
            summaries = summaries.len(),
            "archive: forgot"
        );
        Ok(Forgotten { messages, summaries })
    }

    /// Leaves no deleted byte in the files: merges the full-text indexes (dropping deleted
    /// entries), rewrites the database and truncates the WAL.
    fn scrub(&self) -> Sql<()> {
        self.conn().execute_batch(
            "INSERT INTO messages_fts(messages_fts) VALUES ('optimize');
             INSERT INTO summaries_fts(summaries_fts) VALUES ('optimize');
             VACUUM;",
        )?;
        if self.gate.is_some() {
            self.conn().query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(())
    }
}

/// Row `id` of `scope` (session `session_id`) on `conn`, verified.
fn read_row(
    conn: &Connection,
    scope: &Scope,
    session_id: i64,
    id: u64,
) -> Sql<Option<ArchivedMessage>> {
    let Ok(id) = i64::try_from(id) else { return Ok(None) };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.session_id = ?1 AND m.id = ?2"
    ))?;
    let mut rows = stmt.query([session_id, id])?;
    rows.next()?.map(|row| decode_message(scope, row)).transpose()
}
