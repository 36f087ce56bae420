//! Compression events, what a conversation holds, and the database's own statistics.

use rusqlite::Connection;

use super::SqliteArchive;
use super::error::{Sql, from_sql_int};
use crate::store::error::to_i64;
use crate::store::{CompressionRecord, MetricsSummary, Scope, StoreError, StrategyMetrics, Usage};

/// Size and row counts of a whole archive database (every tenant and conversation): the
/// adapter's own figures for an operator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Conversations that stored anything.
    pub sessions: u64,
    /// Messages.
    pub messages: u64,
    /// Summaries.
    pub summaries: u64,
    /// Compression events recorded.
    pub compression_events: u64,
    /// Database size in bytes (page count × page size, WAL content included).
    pub db_size_bytes: u64,
}

/// A compression event checked and encoded for SQL.
pub(super) struct EncodedEvent<'a> {
    timestamp: i64,
    before: i64,
    after: i64,
    record: &'a CompressionRecord,
}

/// Checks and encodes `record`.
pub(super) fn encode(record: &CompressionRecord) -> Sql<EncodedEvent<'_>> {
    Ok(EncodedEvent {
        timestamp: to_i64("timestamp", record.timestamp)?,
        before: to_i64("tokens_before", record.tokens_before)?,
        after: to_i64("tokens_after", record.tokens_after)?,
        record,
    })
}

/// Appends a compression event inside the caller's transaction.
pub(super) fn write(conn: &Connection, session_id: i64, event: &EncodedEvent<'_>) -> Sql<()> {
    conn.prepare_cached(
        "INSERT INTO compression_metrics (session_id, timestamp, tokens_before, tokens_after,
                                          units_evicted, summaries_made, strategy)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(rusqlite::params![
        session_id,
        event.timestamp,
        event.before,
        event.after,
        event.record.units_evicted,
        event.record.summaries_made,
        event.record.strategy,
    ])?;
    Ok(())
}

impl SqliteArchive {
    pub(super) fn metrics_sql(&self, scope: &Scope) -> Sql<MetricsSummary> {
        let mut summary = MetricsSummary::default();
        let Some(session_id) = self.session_id(scope)? else { return Ok(summary) };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT strategy, count(*), sum(tokens_before), sum(tokens_after),
                    sum(units_evicted), sum(summaries_made)
             FROM compression_metrics WHERE session_id = ?1
             GROUP BY strategy ORDER BY strategy",
        )?;
        let mut rows = stmt.query([session_id])?;
        while let Some(row) = rows.next()? {
            let entry = StrategyMetrics {
                strategy: row.get(0)?,
                events: from_sql_int("event count", row.get(1)?)?,
                tokens_before: from_sql_int("tokens_before", row.get(2)?)?,
                tokens_after: from_sql_int("tokens_after", row.get(3)?)?,
                units_evicted: from_sql_int("units_evicted", row.get(4)?)?,
                summaries_made: from_sql_int("summaries_made", row.get(5)?)?,
            };
            summary.total.add(&entry);
            summary.by_strategy.push(entry);
        }
        Ok(summary)
    }

    pub(super) fn usage_sql(&self, scope: &Scope) -> Sql<Usage> {
        let store_bytes = Some(self.size_bytes()?);
        let Some(session_id) = self.session_id(scope)? else {
            return Ok(Usage { store_bytes, ..Usage::default() });
        };
        let conn = self.read_conn();
        let count = |sql: &str| -> Sql<u64> {
            let n: i64 = conn.prepare_cached(sql)?.query_row([session_id], |row| row.get(0))?;
            Ok(from_sql_int("row count", n)?)
        };
        Ok(Usage {
            messages: count("SELECT count(*) FROM messages WHERE session_id = ?1")?,
            summaries: count("SELECT count(*) FROM summaries WHERE session_id = ?1")?,
            vectors: count(
                "SELECT count(*) FROM message_vectors v JOIN messages m ON m.pk = v.message_pk
                 WHERE m.session_id = ?1",
            )?,
            compression_events: count(
                "SELECT count(*) FROM compression_metrics WHERE session_id = ?1",
            )?,
            store_bytes,
        })
    }

    /// Database size in bytes (page count × page size).
    fn size_bytes(&self) -> Sql<u64> {
        let conn = self.read_conn();
        let pages: i64 = conn.pragma_query_value(None, "page_count", |row| row.get(0))?;
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
        Ok(from_sql_int("database size", pages.saturating_mul(page_size))?)
    }

    /// Row counts and size of the whole database, every tenant and conversation.
    ///
    /// # Errors
    /// Backend errors.
    ///
    /// ```
    /// let stats = ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?.stats()?;
    /// assert_eq!((stats.messages, stats.summaries), (0, 0));
    /// assert!(stats.db_size_bytes > 0);
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn stats(&self) -> Result<ArchiveStats, StoreError> {
        let run = || -> Sql<ArchiveStats> {
            let count = |table: &str| -> Sql<u64> {
                let n: i64 =
                    self.conn().query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                        row.get(0)
                    })?;
                Ok(from_sql_int("row count", n)?)
            };
            Ok(ArchiveStats {
                sessions: count("sessions")?,
                messages: count("messages")?,
                summaries: count("summaries")?,
                compression_events: count("compression_metrics")?,
                db_size_bytes: self.size_bytes()?,
            })
        };
        Ok(run()?)
    }
}
