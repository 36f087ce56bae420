//! Summaries: stored with their sources (an array) and checksum, read back verified.

use postgres::Row;
use postgres::types::Type;

use super::error::{Failure, Pg, from_sql_int, get};
use super::escape::scope_params;
use super::escape::{escape, unescape};
use super::{PgStore, Tx};
use crate::store::error::to_i64;
use crate::store::{Scope, StoreError, SummaryRecord, checksum};

/// The `summaries` columns [`decode`] reads, for a table aliased `u`.
pub(super) const SUMMARY_COLUMNS: &str = "u.id, u.level, u.text, u.created_at, u.tokens_before, \
     u.tokens_after, u.source_ids, u.checksum";

/// A summary checked and encoded for SQL.
pub(super) struct Encoded {
    id: i64,
    level: i16,
    text: String,
    created_at: i64,
    tokens_before: i64,
    tokens_after: i64,
    sources: Vec<i64>,
    checksum: i64,
}

/// Checks and encodes summary `record` of `scope`.
pub(super) fn encode(scope: &Scope, record: &SummaryRecord) -> Pg<Encoded> {
    Ok(Encoded {
        id: to_i64("summary id", record.id)?,
        level: i16::from(record.level),
        text: escape(&record.text).into_owned(),
        created_at: to_i64("timestamp", record.created_at)?,
        tokens_before: i64::from(record.tokens_before),
        tokens_after: i64::from(record.tokens_after),
        sources: record
            .source_ids
            .iter()
            .map(|&source| to_i64("source id", source))
            .collect::<Result<_, _>>()?,
        checksum: checksum::summary(scope, record) as i64,
    })
}

/// Upserts a summary of conversation `conversation` inside `tx`.
pub(super) fn upsert(tx: &mut Tx<'_>, conversation: i64, summary: &Encoded) -> Pg<()> {
    tx.query(
        "INSERT INTO summaries (conversation_id, id, level, text, created_at, tokens_before,
                                tokens_after, source_ids, checksum)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (conversation_id, id) DO UPDATE SET
             level = excluded.level, text = excluded.text, created_at = excluded.created_at,
             tokens_before = excluded.tokens_before, tokens_after = excluded.tokens_after,
             source_ids = excluded.source_ids, checksum = excluded.checksum",
        &[
            (&conversation, Type::INT8),
            (&summary.id, Type::INT8),
            (&summary.level, Type::INT2),
            (&summary.text, Type::TEXT),
            (&summary.created_at, Type::INT8),
            (&summary.tokens_before, Type::INT8),
            (&summary.tokens_after, Type::INT8),
            (&summary.sources, Type::INT8_ARRAY),
            (&summary.checksum, Type::INT8),
        ],
    )?;
    Ok(())
}

/// A summary selected with [`SUMMARY_COLUMNS`] first, and its stored checksum, unverified.
pub(super) fn decode(scope: &Scope, row: &Row) -> Pg<(SummaryRecord, i64)> {
    let id = from_sql_int("summary id", get(row, 0)?)?;
    let name = format!("summary {id} of conversation {:?}", scope.to_string());
    let damaged = |detail: String| Failure(StoreError::damaged(name.clone(), detail));
    let (level, before, after): (i16, i64, i64) = (get(row, 1)?, get(row, 4)?, get(row, 5)?);
    let sources: Vec<i64> = get(row, 6)?;
    let record = SummaryRecord {
        id,
        level: u8::try_from(level).map_err(|_| damaged(format!("level {level}")))?,
        text: unescape(get(row, 2)?).map_err(&damaged)?,
        source_ids: sources
            .into_iter()
            .map(|source| from_sql_int("source id", source))
            .collect::<Result<_, _>>()?,
        created_at: from_sql_int("timestamp", get(row, 3)?)?,
        tokens_before: u32::try_from(before)
            .map_err(|_| damaged(format!("tokens_before {before}")))?,
        tokens_after: u32::try_from(after).map_err(|_| damaged(format!("tokens_after {after}")))?,
    };
    Ok((record, get(row, 7)?))
}

/// A summary selected with [`SUMMARY_COLUMNS`] first, verified against its checksum.
pub(super) fn decode_verified(scope: &Scope, row: &Row) -> Pg<SummaryRecord> {
    let (record, stored) = decode(scope, row)?;
    let computed = checksum::summary(scope, &record);
    if stored as u64 == computed {
        return Ok(record);
    }
    let name = format!("summary {} of conversation {:?}", record.id, scope.to_string());
    Err(Failure(checksum::mismatch(name, stored as u64, computed)))
}

impl PgStore {
    pub(super) fn summary_pg(
        &self,
        scope: &Scope,
        id: u64,
    ) -> Result<Option<SummaryRecord>, StoreError> {
        let Ok(id) = i64::try_from(id) else { return Ok(None) };
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM summaries u
                     JOIN conversations c ON c.id = u.conversation_id
                     WHERE c.tenant = $1 AND c.name = $2 AND u.id = $3"
                ),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&id, Type::INT8)],
            )?;
            rows.first().map(|row| decode_verified(scope, row)).transpose()
        })
    }
}
