//! Compression metrics and database statistics.

use super::error::{ArchiveError, from_sql_int, to_sql_int};
use super::{Archive, CompressionRecord, ensure_session};

/// Totals of the compression events of one strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrategyMetrics {
    /// Strategy name.
    pub strategy: String,
    /// Events recorded.
    pub events: u64,
    /// Sum of tokens before.
    pub tokens_before: u64,
    /// Sum of tokens after.
    pub tokens_after: u64,
    /// Sum of units evicted.
    pub units_evicted: u64,
    /// Sum of summaries made.
    pub summaries_made: u64,
}

/// Totals over all compression events, and per strategy (by name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSummary {
    /// Totals over every strategy (its `strategy` is empty).
    pub total: StrategyMetrics,
    /// One entry per strategy name, sorted by name.
    pub by_strategy: Vec<StrategyMetrics>,
}

impl StrategyMetrics {
    /// Tokens removed from the context (before − after, 0 if it grew).
    ///
    /// ```
    /// let m = ctxwin_std::archive::StrategyMetrics { tokens_before: 10, tokens_after: 4, ..Default::default() };
    /// assert_eq!(m.tokens_saved(), 6);
    /// ```
    pub fn tokens_saved(&self) -> u64 {
        self.tokens_before.saturating_sub(self.tokens_after)
    }

    /// `tokens_after / tokens_before` (1.0 when nothing was recorded): lower is stronger.
    ///
    /// ```
    /// let m = ctxwin_std::archive::StrategyMetrics { tokens_before: 10, tokens_after: 4, ..Default::default() };
    /// assert!((m.ratio() - 0.4).abs() < 1e-9);
    /// ```
    pub fn ratio(&self) -> f64 {
        if self.tokens_before == 0 {
            1.0
        } else {
            self.tokens_after as f64 / self.tokens_before as f64
        }
    }
}

/// Size and row counts of an archive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Sessions that stored anything.
    pub sessions: u64,
    /// Messages.
    pub messages: u64,
    /// Summaries.
    pub summaries: u64,
    /// Keyword rows (message, keyword pairs).
    pub keywords: u64,
    /// Compression events recorded.
    pub compression_events: u64,
    /// Database size in bytes (page count × page size, WAL content included).
    pub db_size_bytes: u64,
}

impl Archive {
    /// Records one compression event of `session`.
    ///
    /// # Errors
    /// [`ArchiveError::OutOfRange`] for values above `i64::MAX`, or a SQLite error.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, CompressionRecord};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.record_compression("s", &CompressionRecord::new(1, 1_000, 400, "summarize"))?;
    /// assert_eq!(archive.metrics_summary(Some("s"))?.total.tokens_saved(), 600);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn record_compression(
        &mut self,
        session: &str,
        record: &CompressionRecord,
    ) -> Result<(), ArchiveError> {
        let timestamp = to_sql_int("timestamp", record.timestamp)?;
        let before = to_sql_int("tokens_before", record.tokens_before)?;
        let after = to_sql_int("tokens_after", record.tokens_after)?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let session_id = ensure_session(&tx, session)?;
        tx.prepare_cached(
            "INSERT INTO compression_metrics (session_id, timestamp, tokens_before, tokens_after,
                                              units_evicted, summaries_made, strategy)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(rusqlite::params![
            session_id,
            timestamp,
            before,
            after,
            record.units_evicted,
            record.summaries_made,
            record.strategy,
        ])?;
        tx.commit()?;
        Ok(())
    }

    /// Totals of the recorded compression events, in `session` or all sessions.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, CompressionRecord};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.record_compression("s", &CompressionRecord::new(1, 100, 50, "reduce"))?;
    /// archive.record_compression("s", &CompressionRecord::new(2, 100, 10, "summarize"))?;
    /// let summary = archive.metrics_summary(None)?;
    /// assert_eq!(summary.total.events, 2);
    /// assert_eq!(summary.by_strategy[1].strategy, "summarize");
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn metrics_summary(&self, session: Option<&str>) -> Result<MetricsSummary, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT strategy, count(*), sum(tokens_before), sum(tokens_after),
                    sum(units_evicted), sum(summaries_made)
             FROM compression_metrics
             WHERE ?1 IS NULL OR session_id = (SELECT id FROM sessions WHERE name = ?1)
             GROUP BY strategy ORDER BY strategy",
        )?;
        let mut rows = stmt.query([session])?;
        let mut summary = MetricsSummary::default();
        while let Some(row) = rows.next()? {
            let entry = StrategyMetrics {
                strategy: row.get(0)?,
                events: from_sql_int("event count", row.get(1)?)?,
                tokens_before: from_sql_int("tokens_before", row.get(2)?)?,
                tokens_after: from_sql_int("tokens_after", row.get(3)?)?,
                units_evicted: from_sql_int("units_evicted", row.get(4)?)?,
                summaries_made: from_sql_int("summaries_made", row.get(5)?)?,
            };
            let total = &mut summary.total;
            total.events = total.events.saturating_add(entry.events);
            total.tokens_before = total.tokens_before.saturating_add(entry.tokens_before);
            total.tokens_after = total.tokens_after.saturating_add(entry.tokens_after);
            total.units_evicted = total.units_evicted.saturating_add(entry.units_evicted);
            total.summaries_made = total.summaries_made.saturating_add(entry.summaries_made);
            summary.by_strategy.push(entry);
        }
        Ok(summary)
    }

    /// Row counts and database size.
    ///
    /// ```
    /// let stats = ctxwin_std::archive::Archive::open_in_memory()?.stats()?;
    /// assert_eq!((stats.messages, stats.summaries), (0, 0));
    /// assert!(stats.db_size_bytes > 0);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn stats(&self) -> Result<ArchiveStats, ArchiveError> {
        let count = |table: &str| -> Result<u64, ArchiveError> {
            let n: i64 =
                self.conn()
                    .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))?;
            from_sql_int("row count", n)
        };
        let pages: i64 = self.conn().pragma_query_value(None, "page_count", |row| row.get(0))?;
        let page_size: i64 = self.conn().pragma_query_value(None, "page_size", |row| row.get(0))?;
        Ok(ArchiveStats {
            sessions: count("sessions")?,
            messages: count("messages")?,
            summaries: count("summaries")?,
            keywords: count("keywords")?,
            compression_events: count("compression_metrics")?,
            db_size_bytes: from_sql_int("database size", pages.saturating_mul(page_size))?,
        })
    }
}
