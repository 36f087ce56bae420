//! Writing a batch (rows, summaries, compression events of one or more conversations) in one
//! transaction, and reading rows back by id and in id order.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::error::{Sql, from_sql_int};
use super::{
    MESSAGE_COLUMNS, SqliteArchive, collect_messages, ensure_session, keywords_of, sql_limit,
};
use crate::store::error::to_i64;
use crate::store::{ArchivedMessage, Scope, Write, WriteOp, checksum};

/// Inserts a message, or updates it when its id exists and something differs. Returns the
/// row's pk when a row was written (an identical row writes nothing: no index churn).
const UPSERT: &str = "
INSERT INTO messages (session_id, id, unit, level, role, content, tool_calls, tool_text,
                      tool_call_id, original, timestamp, tokens, name, is_error, raw, checksum)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
ON CONFLICT (session_id, id) DO UPDATE SET
    unit = excluded.unit, level = excluded.level, role = excluded.role,
    content = excluded.content, tool_calls = excluded.tool_calls,
    tool_text = excluded.tool_text, tool_call_id = excluded.tool_call_id,
    original = excluded.original, timestamp = excluded.timestamp, tokens = excluded.tokens,
    name = excluded.name, is_error = excluded.is_error, raw = excluded.raw,
    checksum = excluded.checksum
WHERE messages.checksum IS NOT excluded.checksum
   OR (messages.unit, messages.level, messages.role, messages.content, messages.tool_calls,
       messages.tool_call_id, messages.original, messages.timestamp, messages.tokens,
       messages.name, messages.is_error, messages.raw)
   IS NOT (excluded.unit, excluded.level, excluded.role, excluded.content, excluded.tool_calls,
           excluded.tool_call_id, excluded.original, excluded.timestamp, excluded.tokens,
           excluded.name, excluded.is_error, excluded.raw)
RETURNING pk";

/// A message checked and encoded for SQL, before any write starts.
pub(super) struct Encoded<'a> {
    id: i64,
    unit: i64,
    timestamp: i64,
    tool_calls: Option<String>,
    tool_text: String,
    keywords: Vec<(String, u32)>,
    checksum: i64,
    source: &'a ArchivedMessage,
}

/// The text of a message's tool calls the index searches: names and arguments.
pub(super) fn tool_text(message: &ArchivedMessage) -> String {
    let calls = &message.message.tool_calls;
    calls
        .iter()
        .map(|call| format!("{} {}", call.name, call.arguments))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks and encodes row `message` of `scope`.
pub(super) fn encode<'a>(scope: &Scope, message: &'a ArchivedMessage) -> Sql<Encoded<'a>> {
    let id = to_i64("message id", message.id)?;
    let unit = to_i64("unit id", message.unit)?;
    let timestamp = to_i64("timestamp", message.timestamp)?;
    let calls = &message.message.tool_calls;
    let tool_calls = if calls.is_empty() { None } else { Some(serde_json::to_string(calls)?) };
    let tool_text = tool_text(message);
    let keywords = keywords_of(message, &tool_text);
    let checksum = checksum::message(scope, message) as i64;
    Ok(Encoded { id, unit, timestamp, tool_calls, tool_text, keywords, checksum, source: message })
}

/// Writes encoded messages of session `session_id` inside the caller's transaction.
pub(super) fn write_rows(conn: &Connection, session_id: i64, batch: &[Encoded<'_>]) -> Sql<()> {
    let mut upsert = conn.prepare_cached(UPSERT)?;
    let mut clear_keywords = conn.prepare_cached("DELETE FROM keywords WHERE message_pk = ?1")?;
    let mut add_keyword = conn
        .prepare_cached("INSERT INTO keywords (keyword, message_pk, count) VALUES (?1, ?2, ?3)")?;
    for m in batch {
        let msg = &m.source.message;
        let pk: Option<i64> = upsert
            .query_row(
                rusqlite::params![
                    session_id,
                    m.id,
                    m.unit,
                    crate::store::types::level_code(m.source.level),
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
                    m.source.raw,
                    m.checksum,
                ],
                |row| row.get(0),
            )
            .optional()?;
        let Some(pk) = pk else { continue };
        clear_keywords.execute([pk])?;
        for (keyword, count) in &m.keywords {
            add_keyword.execute(rusqlite::params![keyword, pk, count])?;
        }
    }
    Ok(())
}

/// A write of a batch, checked and encoded before the transaction starts.
enum Prepared<'a> {
    Rows(Vec<Encoded<'a>>),
    Summary(super::summaries::EncodedSummary<'a>),
    Compression(super::metrics::EncodedEvent<'a>),
}

impl SqliteArchive {
    /// Applies `writes` in one transaction, in order. Every value is checked and encoded
    /// first, so bad input writes nothing.
    pub(super) fn commit(&self, writes: &[Write<'_>]) -> Sql<()> {
        let prepared = writes
            .iter()
            .map(|write| {
                Ok(match write.op {
                    WriteOp::Rows(rows) => Prepared::Rows(
                        rows.iter().map(|row| encode(write.scope, row)).collect::<Sql<_>>()?,
                    ),
                    WriteOp::Summary(record) => {
                        Prepared::Summary(super::summaries::encode(write.scope, record)?)
                    }
                    WriteOp::Compression(record) => {
                        Prepared::Compression(super::metrics::encode(record)?)
                    }
                })
            })
            .collect::<Sql<Vec<_>>>()?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut last: Option<(&Scope, i64)> = None;
        for (write, prepared) in writes.iter().zip(&prepared) {
            let session_id = match last {
                Some((scope, id)) if scope == write.scope => id,
                _ => ensure_session(&tx, write.scope)?,
            };
            last = Some((write.scope, session_id));
            match prepared {
                Prepared::Rows(rows) => write_rows(&tx, session_id, rows)?,
                Prepared::Summary(summary) => super::summaries::write(&tx, session_id, summary)?,
                Prepared::Compression(event) => super::metrics::write(&tx, session_id, event)?,
            }
        }
        tx.commit()?;
        tracing::trace!(writes = writes.len(), "archive: batch committed");
        Ok(())
    }

    pub(super) fn get_many_sql(&self, scope: &Scope, ids: &[u64]) -> Sql<Vec<ArchivedMessage>> {
        let mut list: Vec<i64> = ids.iter().filter_map(|&id| i64::try_from(id).ok()).collect();
        list.sort_unstable();
        list.dedup();
        if list.is_empty() {
            return Ok(Vec::new());
        }
        let Some(session_id) = self.session_id(scope)? else { return Ok(Vec::new()) };
        let conn = self.read_conn();
        if let [id] = list[..] {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.session_id = ?1 AND m.id = ?2"
            ))?;
            return collect_messages(scope, &mut stmt, rusqlite::params![session_id, id]);
        }
        // The ids go as one JSON array parameter, so every list runs the same cached statement:
        // a statement text per list was prepared anew each time, and pushed the searches'
        // statements out of the connection's cache.
        let ids = format!("[{}]", list.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m
             WHERE m.session_id = ?1 AND m.id IN (SELECT value FROM json_each(?2)) ORDER BY m.id"
        ))?;
        collect_messages(scope, &mut stmt, rusqlite::params![session_id, ids])
    }

    pub(super) fn rows_after_sql(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Sql<Vec<ArchivedMessage>> {
        let Some(session_id) = self.session_id(scope)? else { return Ok(Vec::new()) };
        let Ok(after) = i64::try_from(after) else { return Ok(Vec::new()) };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m
             WHERE m.session_id = ?1 AND m.id > ?2 ORDER BY m.id LIMIT ?3"
        ))?;
        collect_messages(scope, &mut stmt, rusqlite::params![session_id, after, sql_limit(limit)])
    }

    pub(super) fn max_id_sql(&self, scope: &Scope) -> Sql<Option<u64>> {
        let Some(session_id) = self.session_id(scope)? else { return Ok(None) };
        let max: Option<i64> = self.read_conn().query_row(
            "SELECT max(id) FROM messages WHERE session_id = ?1",
            [session_id],
            |row| row.get(0),
        )?;
        Ok(max.map(|id| from_sql_int("message id", id)).transpose()?)
    }

    pub(super) fn delete_from_sql(&self, scope: &Scope, first: u64) -> Sql<u64> {
        let first = to_i64("message id", first)?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some(session_id) = super::session_id(&tx, scope)? else { return Ok(0) };
        let deleted = tx.execute(
            "DELETE FROM messages WHERE session_id = ?1 AND id >= ?2",
            [session_id, first],
        )?;
        tx.execute(
            "DELETE FROM summaries WHERE session_id = ?1 AND id >= ?2",
            [session_id, first],
        )?;
        tx.commit()?;
        Ok(deleted as u64)
    }

    pub(super) fn delete_conversation_sql(&self, scope: &Scope) -> Sql<u64> {
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some(session_id) = super::session_id(&tx, scope)? else { return Ok(0) };
        let deleted = tx.execute("DELETE FROM messages WHERE session_id = ?1", [session_id])?;
        tx.execute("DELETE FROM summaries WHERE session_id = ?1", [session_id])?;
        tx.execute("DELETE FROM compression_metrics WHERE session_id = ?1", [session_id])?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", [session_id])?;
        tx.commit()?;
        Ok(deleted as u64)
    }

    pub(super) fn conversations_sql(&self, tenant: &str, prefix: &str) -> Sql<Vec<String>> {
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT name FROM sessions WHERE tenant = ?1 AND substr(name, 1, length(?2)) = ?2
             ORDER BY name",
        )?;
        let names =
            stmt.query_map([tenant, prefix], |row| row.get(0))?.collect::<Result<_, _>>()?;
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ChatMessage;
    use crate::store::{ArchiveStore, ErrorKind, Fence};
    use ctxwin_core::Role;

    #[test]
    fn out_of_range_id_writes_nothing() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let s = Scope::local("s");
        let good = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "a"));
        let bad = ArchivedMessage::new(u64::MAX, 1, ChatMessage::text(Role::User, "b"));
        let err = archive.put(&s, Fence::NONE, &[good, bad]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert_eq!(archive.usage(&s).unwrap().messages, 0);
    }

    #[test]
    fn keywords_follow_an_update() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let s = Scope::local("s");
        let first = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see old_name"));
        archive.put(&s, Fence::NONE, &[first]).unwrap();
        let second = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see new_name"));
        archive.put(&s, Fence::NONE, &[second]).unwrap();
        assert!(archive.by_keyword(&s, "old_name", 10).unwrap().is_empty());
        assert_eq!(archive.by_keyword(&s, "new_name", 10).unwrap().len(), 1);
        let old = crate::store::SearchQuery::new("old", 10);
        assert!(archive.search(&s, &old).unwrap().is_empty());
    }
}
