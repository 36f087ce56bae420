//! Writing a batch (rows, summaries, compression events of one or more conversations) in one
//! transaction, and reading rows back by id and in id order.

use std::collections::HashMap;

use rusqlite::{Connection, TransactionBehavior};

use super::error::{Sql, from_sql_int};
use super::{MESSAGE_COLUMNS, SqliteArchive, collect_messages, ensure_session, sql_limit};
use crate::store::error::to_i64;
use crate::store::{ArchivedMessage, Scope, Write, WriteOp, checksum};

/// Inserts messages, or updates one whose id exists when something differs: the statement's
/// head, followed by [`UPSERT_ROW`] once per message, comma-separated, then [`UPSERT_TAIL`].
/// An identical row writes nothing: no index churn.
const UPSERT_HEAD: &str = "
INSERT INTO messages (session_id, id, unit, level, role, content, tool_calls, tool_text,
                      tool_call_id, original, timestamp, tokens, name, is_error, raw, checksum,
                      indexed)
VALUES ";

/// One message's values in an upsert.
const UPSERT_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// What an upsert does with a message whose id exists.
const UPSERT_TAIL: &str = "
ON CONFLICT (session_id, id) DO UPDATE SET
    unit = excluded.unit, level = excluded.level, role = excluded.role,
    content = excluded.content, tool_calls = excluded.tool_calls,
    tool_text = excluded.tool_text, tool_call_id = excluded.tool_call_id,
    original = excluded.original, timestamp = excluded.timestamp, tokens = excluded.tokens,
    name = excluded.name, is_error = excluded.is_error, raw = excluded.raw,
    checksum = excluded.checksum, indexed = excluded.indexed
WHERE messages.checksum IS NOT excluded.checksum
   OR (messages.unit, messages.level, messages.role, messages.content, messages.tool_calls,
       messages.tool_call_id, messages.original, messages.timestamp, messages.tokens,
       messages.name, messages.is_error, messages.raw)
   IS NOT (excluded.unit, excluded.level, excluded.role, excluded.content, excluded.tool_calls,
           excluded.tool_call_id, excluded.original, excluded.timestamp, excluded.tokens,
           excluded.name, excluded.is_error, excluded.raw)";

/// Messages one upsert statement writes, largest first (a batch is cut into these). Every
/// statement that writes a message opens a statement journal (its triggers write the
/// full-text index), and FTS5 flushes the terms it holds in memory to a new index segment
/// whenever one opens, then merges segments: with a statement per message that flushing
/// and merging was half the archive writer's time. A statement per 64 messages flushes once
/// for them.
const UPSERT_CHUNKS: [usize; 4] = [64, 16, 4, 1];

/// The upsert of `rows` messages.
fn upsert_sql(rows: usize) -> String {
    let mut sql = String::with_capacity(
        UPSERT_HEAD.len() + (UPSERT_ROW.len() + 2) * rows + UPSERT_TAIL.len(),
    );
    sql.push_str(UPSERT_HEAD);
    for n in 0..rows {
        if n > 0 {
            sql.push_str(", ");
        }
        sql.push_str(UPSERT_ROW);
    }
    sql.push_str(UPSERT_TAIL);
    sql
}

/// `items` cut into runs of the sizes in `chunks` (largest first, the last 1): as many of the
/// largest as fit, then of the next.
fn chunked<'a, T>(mut items: &'a [T], chunks: &[usize]) -> Vec<&'a [T]> {
    let mut out = Vec::new();
    for &size in chunks {
        while size > 0 && items.len() >= size {
            let (chunk, rest) = items.split_at(size);
            out.push(chunk);
            items = rest;
        }
    }
    out
}

/// A message checked and encoded for SQL, before any write starts.
pub(super) struct Encoded<'a> {
    id: i64,
    unit: i64,
    timestamp: i64,
    tool_calls: Option<String>,
    tool_text: String,
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
    let checksum = checksum::message(scope, message) as i64;
    Ok(Encoded { id, unit, timestamp, tool_calls, tool_text, checksum, source: message })
}

/// Writes encoded messages of session `session_id` inside the caller's transaction, into the
/// full-text index at once when `indexed` (else when the conversation is searched).
pub(super) fn write_rows(
    conn: &Connection,
    session_id: i64,
    batch: &[Encoded<'_>],
    indexed: bool,
) -> Sql<()> {
    let rows: Vec<(i64, &Encoded<'_>)> = batch.iter().map(|m| (session_id, m)).collect();
    write_sessions_rows(conn, &rows, indexed)
}

/// Writes encoded messages, each with its session's id, inside the caller's transaction,
/// many to a statement ([`UPSERT_CHUNKS`]). A message written twice is written once, where
/// it came first, with what it came with last: what writing them one by one leaves. Into the
/// full-text index at once when `indexed`.
pub(super) fn write_sessions_rows(
    conn: &Connection,
    rows: &[(i64, &Encoded<'_>)],
    indexed: bool,
) -> Sql<()> {
    let mut first_at: HashMap<(i64, i64), usize> = HashMap::with_capacity(rows.len());
    let mut unique: Vec<(i64, &Encoded<'_>)> = Vec::with_capacity(rows.len());
    for &(session_id, m) in rows {
        match first_at.get(&(session_id, m.id)) {
            Some(&at) => unique[at] = (session_id, m),
            None => {
                first_at.insert((session_id, m.id), unique.len());
                unique.push((session_id, m));
            }
        }
    }
    for chunk in chunked(&unique, &UPSERT_CHUNKS) {
        upsert(conn, chunk, indexed)?;
    }
    Ok(())
}

/// Upserts `chunk` in one statement.
fn upsert(conn: &Connection, chunk: &[(i64, &Encoded<'_>)], indexed: bool) -> Sql<()> {
    let mut statement = conn.prepare_cached(&upsert_sql(chunk.len()))?;
    let levels: Vec<u8> =
        chunk.iter().map(|(_, m)| crate::store::types::level_code(m.source.level)).collect();
    let roles: Vec<&str> = chunk.iter().map(|(_, m)| m.source.message.role.as_str()).collect();
    let mut params: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(chunk.len() * 17);
    for (n, (session_id, m)) in chunk.iter().enumerate() {
        let msg = &m.source.message;
        params.extend_from_slice(&[
            session_id as &dyn rusqlite::ToSql,
            &m.id,
            &m.unit,
            &levels[n],
            &roles[n],
            &msg.content,
            &m.tool_calls,
            &m.tool_text,
            &msg.tool_call_id,
            &m.source.original,
            &m.timestamp,
            &m.source.tokens,
            &msg.name,
            &msg.is_error,
            &m.source.raw,
            &m.checksum,
            &indexed,
        ]);
    }
    statement.execute(rusqlite::params_from_iter(params))?;
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
        // Consecutive writes of rows (of any conversations) are written together.
        let mut run: Vec<(i64, &Encoded<'_>)> = Vec::new();
        for (write, prepared) in writes.iter().zip(&prepared) {
            let session_id = match last {
                Some((scope, id)) if scope == write.scope => id,
                _ => ensure_session(&tx, write.scope)?,
            };
            last = Some((write.scope, session_id));
            if let Prepared::Rows(rows) = prepared {
                run.extend(rows.iter().map(|row| (session_id, row)));
                continue;
            }
            write_sessions_rows(&tx, &std::mem::take(&mut run), self.index_on_write)?;
            match prepared {
                Prepared::Rows(_) => {}
                Prepared::Summary(summary) => super::summaries::write(&tx, session_id, summary)?,
                Prepared::Compression(event) => super::metrics::write(&tx, session_id, event)?,
            }
        }
        write_sessions_rows(&tx, &run, self.index_on_write)?;
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
    fn a_batch_written_many_rows_to_a_statement_reads_as_written_one_by_one() {
        let (batched, single) =
            (SqliteArchive::open_in_memory().unwrap(), SqliteArchive::open_in_memory().unwrap());
        let (a, b) = (Scope::local("a"), Scope::local("b"));
        let text = |id: u64| match id % 3 {
            0 => format!("step {id}: parse_header failed in src/lexer.rs with error E0{id}"),
            1 => format!("Alice reviewed pull request {id} about the Postgres upgrade"),
            _ => format!("deploy {id} of billing_service finished; nothing else to report"),
        };
        let row = |id: u64, text: String| {
            ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text))
        };
        // 150 rows (every chunk size), two of them written twice in the batch, and rows of
        // another conversation between.
        let mut rows: Vec<ArchivedMessage> = (1..=150).map(|id| row(id, text(id))).collect();
        rows.push(row(7, "rewritten: the Kafka consumer_lag alert fired".into()));
        rows.push(row(150, "rewritten again: rollback_plan approved by Bob".into()));
        let other: Vec<ArchivedMessage> = (1..=5).map(|id| row(id, text(id + 1))).collect();
        let writes = [
            Write { scope: &a, fence: Fence::NONE, op: WriteOp::Rows(&rows[..100]) },
            Write { scope: &b, fence: Fence::NONE, op: WriteOp::Rows(&other) },
            Write { scope: &a, fence: Fence::NONE, op: WriteOp::Rows(&rows[100..]) },
        ];
        batched.commit(&writes).unwrap();
        for row in &rows[..100] {
            single.put(&a, Fence::NONE, std::slice::from_ref(row)).unwrap();
        }
        for row in &other {
            single.put(&b, Fence::NONE, std::slice::from_ref(row)).unwrap();
        }
        for row in &rows[100..] {
            single.put(&a, Fence::NONE, std::slice::from_ref(row)).unwrap();
        }
        for scope in [&a, &b] {
            assert_eq!(batched.usage(scope).unwrap(), single.usage(scope).unwrap());
            for query in
                ["parse_header lexer", "Alice Postgres", "billing deploy", "kafka lag", "rollback"]
            {
                let query = crate::store::SearchQuery::new(query, 20);
                let ids = |archive: &SqliteArchive| -> Vec<(u64, String)> {
                    let hits = archive.search(scope, &query).unwrap();
                    hits.into_iter().map(|h| (h.id, format!("{:.6}", h.score))).collect()
                };
                assert_eq!(ids(&batched), ids(&single), "{scope} {query:?}");
            }
        }
        let seven = batched.get(&a, 7).unwrap().unwrap();
        assert!(seven.message.content.starts_with("rewritten"));
        let lag = crate::store::SearchQuery::new("consumer_lag", 10);
        assert_eq!(batched.search(&a, &lag).unwrap().len(), 1);
    }

    #[test]
    fn the_index_follows_an_update() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let s = Scope::local("s");
        let first = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see old_name"));
        archive.put(&s, Fence::NONE, &[first]).unwrap();
        let second = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "see new_name"));
        archive.put(&s, Fence::NONE, &[second]).unwrap();
        let search = |text: &str| archive.search(&s, &crate::store::SearchQuery::new(text, 10));
        assert!(search("old_name").unwrap().is_empty());
        assert!(search("old").unwrap().is_empty());
        assert_eq!(search("new_name").unwrap().len(), 1);
    }
}
