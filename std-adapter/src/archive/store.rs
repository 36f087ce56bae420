//! Writing messages (one unit, or a bulk import) and reading them back by id, unit and recency.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::error::{ArchiveError, to_sql_int};
use super::{
    Archive, ArchivedMessage, MESSAGE_COLUMNS, collect_messages, decode_message, ensure_session,
    keywords, sql_limit,
};

/// Messages per transaction in [`Archive::store_messages`]: large enough that commits do not
/// dominate, small enough that the WAL stays a few megabytes.
const IMPORT_BATCH: usize = 2_000;

/// Inserts a message, or updates it when its id exists and something differs. `original` is
/// never cleared: a re-store without it keeps the full text stored earlier. Returns the row's pk
/// when a row was written.
const UPSERT: &str = "
INSERT INTO messages (session_id, id, unit, level, role, content, tool_calls, tool_text,
                      tool_call_id, original, timestamp, tokens, name, is_error)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
ON CONFLICT (session_id, id) DO UPDATE SET
    unit = excluded.unit, level = excluded.level, role = excluded.role,
    content = excluded.content, tool_calls = excluded.tool_calls,
    tool_text = excluded.tool_text, tool_call_id = excluded.tool_call_id,
    original = coalesce(excluded.original, messages.original),
    timestamp = excluded.timestamp, tokens = excluded.tokens, name = excluded.name,
    is_error = excluded.is_error
WHERE (messages.unit, messages.level, messages.role, messages.content, messages.tool_calls,
       messages.tool_call_id, messages.original, messages.timestamp, messages.tokens,
       messages.name, messages.is_error)
   IS NOT (excluded.unit, excluded.level, excluded.role, excluded.content, excluded.tool_calls,
           excluded.tool_call_id, coalesce(excluded.original, messages.original),
           excluded.timestamp, excluded.tokens, excluded.name, excluded.is_error)
RETURNING pk";

/// A message checked and encoded for SQL, before any write starts.
struct Encoded<'a> {
    id: i64,
    unit: i64,
    timestamp: i64,
    tool_calls: Option<String>,
    tool_text: String,
    keywords: Vec<(String, u32)>,
    source: &'a ArchivedMessage,
}

/// The message's id, unit and timestamp as SQLite integers: everything [`encode`] can refuse,
/// checked without the cost of encoding (the deferred writer checks rows when they are queued).
pub(super) fn sql_keys(message: &ArchivedMessage) -> Result<(i64, i64, i64), ArchiveError> {
    Ok((
        to_sql_int("message id", message.id)?,
        to_sql_int("unit id", message.unit)?,
        to_sql_int("timestamp", message.timestamp)?,
    ))
}

fn encode(message: &ArchivedMessage) -> Result<Encoded<'_>, ArchiveError> {
    let (id, unit, timestamp) = sql_keys(message)?;
    let calls = &message.message.tool_calls;
    let tool_calls = if calls.is_empty() { None } else { Some(serde_json::to_string(calls)?) };
    let tool_text = calls
        .iter()
        .map(|call| format!("{} {}", call.name, call.arguments))
        .collect::<Vec<_>>()
        .join("\n");
    let keywords = keywords::extract_all(
        [message.message.content.as_str(), tool_text.as_str()]
            .into_iter()
            .chain(message.original.as_deref()),
    );
    Ok(Encoded { id, unit, timestamp, tool_calls, tool_text, keywords, source: message })
}

/// Writes encoded messages inside the caller's transaction; returns how many rows changed.
fn write(conn: &Connection, session_id: i64, batch: &[Encoded<'_>]) -> Result<usize, ArchiveError> {
    let mut upsert = conn.prepare_cached(UPSERT)?;
    let mut clear_keywords = conn.prepare_cached("DELETE FROM keywords WHERE message_pk = ?1")?;
    let mut add_keyword = conn
        .prepare_cached("INSERT INTO keywords (keyword, message_pk, count) VALUES (?1, ?2, ?3)")?;
    let mut written = 0_usize;
    for m in batch {
        let msg = &m.source.message;
        let pk: Option<i64> = upsert
            .query_row(
                rusqlite::params![
                    session_id,
                    m.id,
                    m.unit,
                    super::types::level_code(m.source.level),
                    msg.role.as_str(),
                    msg.content,
                    m.tool_calls,
                    m.tool_text,
                    msg.tool_call_id,
                    m.source.original,
                    m.timestamp,
                    m.source.tokens,
                    msg.name,
                    msg.is_error,
                ],
                |row| row.get(0),
            )
            .optional()?;
        let Some(pk) = pk else { continue };
        written = written.saturating_add(1);
        clear_keywords.execute([pk])?;
        for (keyword, count) in &m.keywords {
            add_keyword.execute(rusqlite::params![keyword, pk, count])?;
        }
    }
    Ok(written)
}

impl Archive {
    /// Writes encoded rows of one or more sessions in one transaction, in order; returns how
    /// many rows changed. On error nothing of them was written.
    fn commit_groups(&self, groups: &[(&str, &[Encoded<'_>])]) -> Result<usize, ArchiveError> {
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut written = 0_usize;
        let mut last: Option<(&str, i64)> = None;
        for &(session, rows) in groups {
            let session_id = match last {
                Some((name, id)) if name == session => id,
                _ => ensure_session(&tx, session)?,
            };
            last = Some((session, session_id));
            written = written.saturating_add(write(&tx, session_id, rows)?);
        }
        tx.commit()?;
        Ok(written)
    }

    /// Stores rows of several sessions in ONE transaction, in the order given (rows are upserts
    /// by session and id: a later row of the same id wins). All or nothing: every row is
    /// checked before the write starts, and on error nothing was written. Returns how many
    /// rows were inserted or changed.
    ///
    /// A transaction costs far more than its rows (the WAL frames of every page it touches,
    /// the full-text index's new segment): this is how [`ArchiveWriter`](super::ArchiveWriter)
    /// writes what many sessions queued at once.
    ///
    /// # Errors
    /// [`ArchiveError::OutOfRange`] for ids or timestamps above `i64::MAX`, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let mut archive = Archive::open_in_memory()?;
    /// let a = [ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "from a"))];
    /// let b = [ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "from b"))];
    /// assert_eq!(archive.store_sessions(&[("a", &a[..]), ("b", &b[..])])?, 2);
    /// assert_eq!(archive.get("b", 1)?.unwrap().message.content, "from b");
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn store_sessions(
        &mut self,
        groups: &[(&str, &[ArchivedMessage])],
    ) -> Result<usize, ArchiveError> {
        let encoded = groups
            .iter()
            .map(|&(session, rows)| {
                rows.iter().map(encode).collect::<Result<Vec<_>, _>>().map(|rows| (session, rows))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let borrowed: Vec<(&str, &[Encoded<'_>])> =
            encoded.iter().map(|(session, rows)| (*session, rows.as_slice())).collect();
        let written = self.commit_groups(&borrowed)?;
        tracing::debug!(
            sessions = groups.len(),
            messages = encoded.iter().map(|(_, rows)| rows.len()).sum::<usize>(),
            written,
            "archive: rows of several sessions stored"
        );
        Ok(written)
    }

    /// Stores one evicted unit in a single transaction: when this returns `Ok`, every message is
    /// committed and the core may release the unit; on error nothing of it was written.
    ///
    /// Re-storing an id updates that message in place (never a duplicate); an identical
    /// re-store writes nothing. Returns how many messages were inserted or changed.
    ///
    /// # Errors
    /// [`ArchiveError::MixedUnit`] if the messages name different units,
    /// [`ArchiveError::OutOfRange`] for ids or timestamps above `i64::MAX`, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, ToolCall};
    ///
    /// let mut archive = Archive::open_in_memory()?;
    /// let unit = [
    ///     ArchivedMessage::new(4, 2, ChatMessage::assistant_calls("", vec![
    ///         ToolCall::new("c1", "read_file", r#"{"path":"Cargo.toml"}"#),
    ///     ])),
    ///     ArchivedMessage::new(5, 2, ChatMessage::tool_result("c1", "[package] … [Data Truncated] …"))
    ///         .with_original("[package]\nname = \"demo\"\n"),
    /// ];
    /// assert_eq!(archive.store_unit("s", &unit)?, 2);
    /// assert_eq!(archive.store_unit("s", &unit)?, 0);
    /// assert_eq!(archive.unit("s", 2)?, unit);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn store_unit(
        &mut self,
        session: &str,
        messages: &[ArchivedMessage],
    ) -> Result<usize, ArchiveError> {
        if let Some(first) = messages.first()
            && let Some(other) = messages.iter().find(|m| m.unit != first.unit)
        {
            return Err(ArchiveError::MixedUnit { first: first.unit, other: other.unit });
        }
        let encoded = messages.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
        let written = self.commit_groups(&[(session, &encoded)])?;
        tracing::debug!(session, messages = messages.len(), written, "archive: unit stored");
        Ok(written)
    }

    /// Bulk import: stores any number of messages (of any units) in batched transactions.
    ///
    /// Every message is checked before the first write, so bad input writes nothing. A SQLite
    /// failure midway leaves the batches before it committed; storing again is safe because
    /// re-stores are idempotent. Returns how many messages were inserted or changed.
    ///
    /// # Errors
    /// [`ArchiveError::OutOfRange`] for ids or timestamps above `i64::MAX`, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let mut archive = Archive::open_in_memory()?;
    /// let history: Vec<_> = (1..=100)
    ///     .map(|i| ArchivedMessage::new(i, i, ChatMessage::text(Role::User, format!("note {i}"))))
    ///     .collect();
    /// assert_eq!(archive.store_messages("s", &history)?, 100);
    /// assert_eq!(archive.message_count(Some("s"))?, 100);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn store_messages(
        &mut self,
        session: &str,
        messages: &[ArchivedMessage],
    ) -> Result<usize, ArchiveError> {
        let encoded = messages.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
        let mut written = 0_usize;
        for batch in encoded.chunks(IMPORT_BATCH) {
            written = written.saturating_add(self.commit_groups(&[(session, batch)])?);
        }
        tracing::debug!(session, messages = messages.len(), written, "archive: messages imported");
        Ok(written)
    }

    /// The message `id` of `session`, if archived.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.get("s", 1)?, None);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn get(&self, session: &str, id: u64) -> Result<Option<ArchivedMessage>, ArchiveError> {
        let Ok(id) = i64::try_from(id) else { return Ok(None) };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 AND m.id = ?2"
        ))?;
        let mut rows = stmt.query(rusqlite::params![session, id])?;
        rows.next()?.map(decode_message).transpose()
    }

    /// The messages of unit `unit` in `session`, in id order (empty if none).
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert!(archive.unit("s", 1)?.is_empty());
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn unit(&self, session: &str, unit: u64) -> Result<Vec<ArchivedMessage>, ArchiveError> {
        let Ok(unit) = i64::try_from(unit) else { return Ok(Vec::new()) };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 AND m.unit = ?2 ORDER BY m.id"
        ))?;
        collect_messages(&mut stmt, rusqlite::params![session, unit])
    }

    /// The last `limit` messages of `session` by id, oldest first (ready to replay in order).
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// for i in 1..=5 {
    ///     archive.store_unit("s", &[ArchivedMessage::new(i, i, ChatMessage::text(Role::User, "x"))])?;
    /// }
    /// let ids: Vec<u64> = archive.recent("s", 2)?.iter().map(|m| m.id).collect();
    /// assert_eq!(ids, [4, 5]);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn recent(
        &self,
        session: &str,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 ORDER BY m.id DESC LIMIT ?2"
        ))?;
        let mut newest_first =
            collect_messages(&mut stmt, rusqlite::params![session, sql_limit(limit)])?;
        newest_first.reverse();
        Ok(newest_first)
    }

    /// How many messages are archived, in `session` or (with `None`) in all sessions.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.message_count(None)?, 0);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn message_count(&self, session: Option<&str>) -> Result<u64, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT count(*) FROM messages m
             WHERE ?1 IS NULL OR m.session_id = (SELECT id FROM sessions WHERE name = ?1)",
        )?;
        let count: i64 = stmt.query_row([session], |row| row.get(0))?;
        super::error::from_sql_int("message count", count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ChatMessage;
    use ctxwin_core::Role;

    #[test]
    fn out_of_range_id_writes_nothing() {
        let mut archive = Archive::open_in_memory().unwrap();
        let good = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "a"));
        let bad = ArchivedMessage::new(u64::MAX, 1, ChatMessage::text(Role::User, "b"));
        let err = archive.store_messages("s", &[good, bad]).unwrap_err();
        assert!(matches!(err, ArchiveError::OutOfRange { what: "message id", .. }));
        assert_eq!(archive.message_count(None).unwrap(), 0);
    }

    #[test]
    fn restore_without_original_keeps_the_stored_original() {
        let mut archive = Archive::open_in_memory().unwrap();
        let reduced =
            ArchivedMessage::new(1, 1, ChatMessage::tool_result("c", "a [Data Truncated] z"));
        archive.store_unit("s", &[reduced.clone().with_original("a b c z")]).unwrap();
        assert_eq!(archive.store_unit("s", &[reduced]).unwrap(), 0);
        let stored = archive.get("s", 1).unwrap().unwrap();
        assert_eq!(stored.original.as_deref(), Some("a b c z"));
    }

    #[test]
    fn keywords_follow_an_update() {
        let mut archive = Archive::open_in_memory().unwrap();
        let first = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see old_name"));
        archive.store_unit("s", &[first]).unwrap();
        let second = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see new_name"));
        assert_eq!(archive.store_unit("s", &[second]).unwrap(), 1);
        assert!(archive.by_keyword(None, "old_name", 10).unwrap().is_empty());
        assert_eq!(archive.by_keyword(None, "new_name", 10).unwrap().len(), 1);
        assert!(archive.search(None, "old", 10).unwrap().is_empty());
    }
}
