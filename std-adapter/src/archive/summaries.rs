//! Summaries: storing them with their sources, and drilling down to the original messages.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{OptionalExtension, TransactionBehavior};

use super::error::{ArchiveError, from_sql_int, to_sql_int};
use super::{Archive, ArchivedMessage, SummaryRecord, ensure_session};

impl Archive {
    /// Stores a summary and the ids it stands for, in one transaction. Re-storing an id replaces
    /// the summary and its sources.
    ///
    /// # Errors
    /// [`ArchiveError::OutOfRange`] for an id or timestamp above `i64::MAX`, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, SummaryRecord};
    /// let mut archive = Archive::open_in_memory()?;
    /// let mut record = SummaryRecord::new(100, 1, "set up CI", vec![1, 2, 3]);
    /// record.tokens_before = 900;
    /// record.tokens_after = 40;
    /// archive.store_summary("s", &record)?;
    /// assert_eq!(archive.summary("s", 100)?, Some(record));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn store_summary(
        &mut self,
        session: &str,
        record: &SummaryRecord,
    ) -> Result<(), ArchiveError> {
        let id = to_sql_int("summary id", record.id)?;
        let created_at = to_sql_int("timestamp", record.created_at)?;
        let sources = record
            .source_ids
            .iter()
            .map(|&source| to_sql_int("source id", source))
            .collect::<Result<Vec<_>, _>>()?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let session_id = ensure_session(&tx, session)?;
        let pk: i64 = tx
            .prepare_cached(
                "INSERT INTO summaries
                     (session_id, id, level, text, created_at, tokens_before, tokens_after)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (session_id, id) DO UPDATE SET
                     level = excluded.level, text = excluded.text,
                     created_at = excluded.created_at, tokens_before = excluded.tokens_before,
                     tokens_after = excluded.tokens_after
                 RETURNING pk",
            )?
            .query_row(
                rusqlite::params![
                    session_id,
                    id,
                    record.level,
                    record.text,
                    created_at,
                    record.tokens_before,
                    record.tokens_after,
                ],
                |row| row.get(0),
            )?;
        tx.prepare_cached("DELETE FROM summary_sources WHERE summary_pk = ?1")?.execute([pk])?;
        {
            let mut add = tx.prepare_cached(
                "INSERT INTO summary_sources (summary_pk, position, source_id) VALUES (?1, ?2, ?3)",
            )?;
            for (position, source) in (0_i64..).zip(&sources) {
                add.execute(rusqlite::params![pk, position, source])?;
            }
        }
        tx.commit()?;
        tracing::debug!(
            session,
            id = record.id,
            sources = sources.len(),
            "archive: summary stored"
        );
        Ok(())
    }

    /// The summary `id` of `session`, if stored.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.summary("s", 1)?, None);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn summary(&self, session: &str, id: u64) -> Result<Option<SummaryRecord>, ArchiveError> {
        let Ok(id) = i64::try_from(id) else { return Ok(None) };
        let row = self
            .conn()
            .prepare_cached(
                "SELECT u.pk, u.id, u.level, u.text, u.created_at, u.tokens_before, u.tokens_after
                 FROM summaries u JOIN sessions s ON s.id = u.session_id
                 WHERE s.name = ?1 AND u.id = ?2",
            )?
            .query_row(rusqlite::params![session, id], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, i64>(5)?,
                    row.get::<_, i64>(6)?,
                ))
            })
            .optional()?;
        let Some((pk, id, level, text, created_at, before, after)) = row else { return Ok(None) };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT source_id FROM summary_sources WHERE summary_pk = ?1 ORDER BY position",
        )?;
        let mut rows = stmt.query([pk])?;
        let mut source_ids = Vec::new();
        while let Some(row) = rows.next()? {
            source_ids.push(from_sql_int("source id", row.get(0)?)?);
        }
        let corrupt =
            |what: &str, value: i64| ArchiveError::Corrupt(format!("summary {what} {value}"));
        Ok(Some(SummaryRecord {
            id: from_sql_int("summary id", id)?,
            level: u8::try_from(level).map_err(|_| corrupt("level", level))?,
            text,
            source_ids,
            created_at: from_sql_int("timestamp", created_at)?,
            tokens_before: u32::try_from(before).map_err(|_| corrupt("tokens_before", before))?,
            tokens_after: u32::try_from(after).map_err(|_| corrupt("tokens_after", after))?,
        }))
    }

    /// The archived messages summary `id` stands for, in id (conversation) order, each once.
    ///
    /// A source id that names no message but a summary of the same session is expanded in turn,
    /// so a level-2 summary drills down to the messages under its level-1 summaries. Sources not
    /// in the archive are skipped (and logged).
    ///
    /// # Errors
    /// [`ArchiveError::SummaryNotFound`] if there is no such summary, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage, SummaryRecord};
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let mut archive = Archive::open_in_memory()?;
    /// for id in 1..=4 {
    ///     let text = ChatMessage::text(Role::User, format!("step {id}"));
    ///     archive.store_unit("s", &[ArchivedMessage::new(id, id, text)])?;
    /// }
    /// archive.store_summary("s", &SummaryRecord::new(10, 1, "steps 1-2", vec![1, 2]))?;
    /// archive.store_summary("s", &SummaryRecord::new(11, 1, "steps 3-4", vec![3, 4]))?;
    /// archive.store_summary("s", &SummaryRecord::new(20, 2, "all steps", vec![11, 10]))?;
    /// let ids: Vec<u64> = archive.drill_down("s", 20)?.iter().map(|m| m.id).collect();
    /// assert_eq!(ids, [1, 2, 3, 4]);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn drill_down(&self, session: &str, id: u64) -> Result<Vec<ArchivedMessage>, ArchiveError> {
        let root = self
            .summary(session, id)?
            .ok_or_else(|| ArchiveError::SummaryNotFound { session: session.to_string(), id })?;
        let mut expanded = BTreeSet::from([id]);
        let mut found: BTreeMap<u64, ArchivedMessage> = BTreeMap::new();
        let mut missing: Vec<u64> = Vec::new();
        let mut pending: Vec<u64> = root.source_ids.into_iter().rev().collect();
        while let Some(source) = pending.pop() {
            if found.contains_key(&source) || expanded.contains(&source) {
                continue;
            }
            if let Some(message) = self.get(session, source)? {
                found.insert(source, message);
            } else if let Some(child) = self.summary(session, source)? {
                expanded.insert(source);
                pending.extend(child.source_ids.into_iter().rev());
            } else {
                missing.push(source);
            }
        }
        if !missing.is_empty() {
            tracing::warn!(
                session,
                summary = id,
                ?missing,
                "archive: summary sources not archived"
            );
        }
        Ok(found.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_summary_is_a_typed_error() {
        let archive = Archive::open_in_memory().unwrap();
        let err = archive.drill_down("s", 7).unwrap_err();
        assert!(matches!(err, ArchiveError::SummaryNotFound { id: 7, .. }));
    }

    #[test]
    fn cycles_and_missing_sources_terminate() {
        let mut archive = Archive::open_in_memory().unwrap();
        archive.store_summary("s", &SummaryRecord::new(1, 2, "a", vec![2, 99])).unwrap();
        archive.store_summary("s", &SummaryRecord::new(2, 2, "b", vec![1])).unwrap();
        assert!(archive.drill_down("s", 1).unwrap().is_empty());
    }

    #[test]
    fn restoring_replaces_sources() {
        let mut archive = Archive::open_in_memory().unwrap();
        archive.store_summary("s", &SummaryRecord::new(1, 1, "a", vec![5, 6, 7])).unwrap();
        archive.store_summary("s", &SummaryRecord::new(1, 1, "b", vec![8])).unwrap();
        let stored = archive.summary("s", 1).unwrap().unwrap();
        assert_eq!((stored.text.as_str(), stored.source_ids), ("b", vec![8]));
        assert_eq!(archive.stats().unwrap().summaries, 1);
    }
}
