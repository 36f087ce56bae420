//! Compression events, their totals, and what a conversation holds.

use postgres::types::Type;

use super::error::{Failure, Pg, from_sql_int, get};
use super::escape::scope_params;
use super::escape::{escape, unescape};
use super::{PgStore, Tx};
use crate::store::error::to_i64;
use crate::store::{CompressionRecord, MetricsSummary, Scope, StoreError, StrategyMetrics, Usage};

/// A compression event checked and encoded for SQL.
pub(super) struct EncodedEvent {
    timestamp: i64,
    before: i64,
    after: i64,
    units_evicted: i64,
    summaries_made: i64,
    strategy: String,
}

/// Checks and encodes `record`.
pub(super) fn encode_event(record: &CompressionRecord) -> Pg<EncodedEvent> {
    Ok(EncodedEvent {
        timestamp: to_i64("timestamp", record.timestamp)?,
        before: to_i64("tokens_before", record.tokens_before)?,
        after: to_i64("tokens_after", record.tokens_after)?,
        units_evicted: i64::from(record.units_evicted),
        summaries_made: i64::from(record.summaries_made),
        strategy: escape(&record.strategy).into_owned(),
    })
}

/// Appends an event of conversation `conversation` inside `tx`.
pub(super) fn insert_event(tx: &mut Tx<'_>, conversation: i64, event: &EncodedEvent) -> Pg<()> {
    tx.query(
        "INSERT INTO compression_events (conversation_id, timestamp, tokens_before, tokens_after,
                                         units_evicted, summaries_made, strategy)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            (&conversation, Type::INT8),
            (&event.timestamp, Type::INT8),
            (&event.before, Type::INT8),
            (&event.after, Type::INT8),
            (&event.units_evicted, Type::INT8),
            (&event.summaries_made, Type::INT8),
            (&event.strategy, Type::TEXT),
        ],
    )?;
    Ok(())
}

impl PgStore {
    pub(super) fn metrics_pg(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                "SELECT e.strategy, count(*)::int8, sum(e.tokens_before)::int8,
                        sum(e.tokens_after)::int8, sum(e.units_evicted)::int8,
                        sum(e.summaries_made)::int8
                 FROM compression_events e JOIN conversations c ON c.id = e.conversation_id
                 WHERE c.tenant = $1 AND c.name = $2
                 GROUP BY e.strategy",
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            let mut entries = Vec::with_capacity(rows.len());
            for row in &rows {
                let strategy = unescape(get(row, 0)?).map_err(|detail| {
                    Failure(StoreError::damaged("a compression event's strategy", detail))
                })?;
                entries.push(StrategyMetrics {
                    strategy,
                    events: from_sql_int("event count", get(row, 1)?)?,
                    tokens_before: from_sql_int("tokens_before", get(row, 2)?)?,
                    tokens_after: from_sql_int("tokens_after", get(row, 3)?)?,
                    units_evicted: from_sql_int("units_evicted", get(row, 4)?)?,
                    summaries_made: from_sql_int("summaries_made", get(row, 5)?)?,
                });
            }
            entries.sort_by(|a, b| a.strategy.cmp(&b.strategy));
            let mut summary = MetricsSummary::default();
            for entry in entries {
                summary.total.add(&entry);
                summary.by_strategy.push(entry);
            }
            Ok(summary)
        })
    }

    pub(super) fn usage_pg(&self, scope: &Scope) -> Result<Usage, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let row = client.query_typed_one(
                "WITH c AS (SELECT id FROM conversations WHERE tenant = $1 AND name = $2)
                 SELECT
                     (SELECT count(*) FROM messages m, c WHERE m.conversation_id = c.id),
                     (SELECT count(*) FROM summaries u, c WHERE u.conversation_id = c.id),
                     (SELECT count(*) FROM message_vectors v, c WHERE v.conversation_id = c.id),
                     (SELECT count(*) FROM compression_events e, c
                      WHERE e.conversation_id = c.id),
                     (SELECT coalesce(sum(pg_total_relation_size(t.oid)), 0)::int8
                      FROM pg_class t
                      WHERE t.relkind = 'r' AND t.relnamespace =
                          (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))",
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            Ok(Usage {
                messages: from_sql_int("row count", get(&row, 0)?)?,
                summaries: from_sql_int("row count", get(&row, 1)?)?,
                vectors: from_sql_int("row count", get(&row, 2)?)?,
                compression_events: from_sql_int("row count", get(&row, 3)?)?,
                store_bytes: Some(from_sql_int("store size", get(&row, 4)?)?),
            })
        })
    }
}
