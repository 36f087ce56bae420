//! Forgetting: a message's text out of the archive, its full-text index, its keywords and the
//! summaries that quoted it, with no copy left in the database file or its WAL.

use super::error::from_sql_int;
use super::{Archive, ArchiveError};

/// What replaces forgotten text.
pub const FORGOTTEN: &str = "[forgotten]";

/// What [`Archive::forget`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Messages whose text was replaced, by id.
    pub messages: Vec<u64>,
    /// Summaries that quoted forgotten text or stand for a forgotten message: their text is
    /// scrubbed, and they are to be rewritten from their (scrubbed) sources.
    pub summaries: Vec<u64>,
}

impl Archive {
    /// Ids of `session`'s messages whose content, tool calls or original text contain `text`
    /// (exact, case-sensitive), oldest first.
    ///
    /// # Errors
    /// SQLite errors.
    pub fn messages_containing(&self, session: &str, text: &str) -> Result<Vec<u64>, ArchiveError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 AND (instr(m.content, ?2) > 0 OR instr(m.tool_text, ?2) > 0
                 OR instr(coalesce(m.original, ''), ?2) > 0
                 OR instr(coalesce(m.tool_calls, ''), ?2) > 0)
             ORDER BY m.id",
        )?;
        let mut rows = stmt.query(rusqlite::params![session, text])?;
        let mut ids = Vec::new();
        while let Some(row) = rows.next()? {
            ids.push(from_sql_int("message id", row.get(0)?)?);
        }
        Ok(ids)
    }

    /// Forgets messages `ids` of `session` (their text becomes [`FORGOTTEN`]; the rows stay so
    /// ids and units keep their meaning) and every occurrence of each of `texts` in the
    /// session's messages and summaries. Keywords of the touched messages are deleted, the
    /// full-text indexes are rebuilt without the text, and the database is vacuumed with
    /// `secure_delete` on and its WAL truncated, so no byte of the text stays in the files.
    ///
    /// # Errors
    /// SQLite errors; nothing changes then.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1,
    ///     ChatMessage::text(Role::User, "the deploy key is hunter2-xyz"))])?;
    /// let forgotten = archive.forget("s", &[], &["hunter2-xyz"])?;
    /// assert_eq!(forgotten.messages, [1]);
    /// assert!(archive.search(Some("s"), "hunter2", 5)?.is_empty());
    /// assert_eq!(archive.get("s", 1)?.unwrap().message.content, "the deploy key is [forgotten]");
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn forget(
        &mut self,
        session: &str,
        ids: &[u64],
        texts: &[&str],
    ) -> Result<Forgotten, ArchiveError> {
        let Some(session_id) = self.session_id(session)? else { return Ok(Forgotten::default()) };
        self.conn().pragma_update(None, "secure_delete", true)?;
        let mut messages: Vec<u64> = ids.to_vec();
        for text in texts.iter().filter(|t| !t.is_empty()) {
            messages.extend(self.messages_containing(session, text)?);
        }
        messages.sort_unstable();
        messages.dedup();
        let mut summaries = Vec::new();
        // Held through the scrub below (a write too): a clone, so `self` stays free.
        let gate = self.gate.clone();
        let _turn = super::write_turn(&gate);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for &id in &messages {
            let Ok(id) = i64::try_from(id) else { continue };
            tx.execute(
                "DELETE FROM keywords WHERE message_pk IN
                     (SELECT pk FROM messages WHERE session_id = ?1 AND id = ?2)",
                rusqlite::params![session_id, id],
            )?;
            let mut stmt = tx.prepare_cached(
                "SELECT u.id FROM summaries u JOIN summary_sources ss ON ss.summary_pk = u.pk
                 WHERE u.session_id = ?1 AND ss.source_id = ?2",
            )?;
            let mut rows = stmt.query(rusqlite::params![session_id, id])?;
            while let Some(row) = rows.next()? {
                summaries.push(from_sql_int("summary id", row.get(0)?)?);
            }
        }
        for &id in ids {
            let Ok(id) = i64::try_from(id) else { continue };
            tx.execute(
                "UPDATE messages SET content = ?3, tool_calls = NULL, tool_text = '',
                     original = NULL
                 WHERE session_id = ?1 AND id = ?2",
                rusqlite::params![session_id, id, FORGOTTEN],
            )?;
        }
        for text in texts.iter().filter(|t| !t.is_empty()) {
            tx.execute(
                "UPDATE messages SET content = replace(content, ?2, ?3),
                     tool_text = replace(tool_text, ?2, ?3),
                     original = replace(original, ?2, ?3),
                     tool_calls = CASE WHEN instr(coalesce(tool_calls, ''), ?2) > 0
                         THEN NULL ELSE tool_calls END
                 WHERE session_id = ?1 AND (instr(content, ?2) > 0 OR instr(tool_text, ?2) > 0
                     OR instr(coalesce(original, ''), ?2) > 0
                     OR instr(coalesce(tool_calls, ''), ?2) > 0)",
                rusqlite::params![session_id, text, FORGOTTEN],
            )?;
            let mut stmt = tx.prepare_cached(
                "SELECT id FROM summaries WHERE session_id = ?1 AND instr(text, ?2) > 0",
            )?;
            let mut rows = stmt.query(rusqlite::params![session_id, text])?;
            while let Some(row) = rows.next()? {
                summaries.push(from_sql_int("summary id", row.get(0)?)?);
            }
            drop(rows);
            tx.execute(
                "UPDATE summaries SET text = replace(text, ?2, ?3)
                 WHERE session_id = ?1 AND instr(text, ?2) > 0",
                rusqlite::params![session_id, text, FORGOTTEN],
            )?;
        }
        tx.commit()?;
        drop(conn);
        summaries.sort_unstable();
        summaries.dedup();
        self.scrub()?;
        tracing::info!(
            session,
            messages = messages.len(),
            summaries = summaries.len(),
            "archive: forgot"
        );
        Ok(Forgotten { messages, summaries })
    }

    /// Leaves no deleted byte in the files: merges the full-text indexes (dropping deleted
    /// entries), rewrites the database and truncates the WAL.
    fn scrub(&mut self) -> Result<(), ArchiveError> {
        self.conn().execute_batch(
            "INSERT INTO messages_fts(messages_fts) VALUES ('optimize');
             INSERT INTO summaries_fts(summaries_fts) VALUES ('optimize');
             VACUUM;",
        )?;
        if self.journal_mode()? == "wal" {
            self.conn().query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(())
    }
}
