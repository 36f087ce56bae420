//! Summaries: stored with their sources and checksum, read back verified.

use rusqlite::Connection;

use super::SqliteArchive;
use super::error::{Failure, Sql, from_sql_int};
use crate::store::error::to_i64;
use crate::store::{Scope, StoreError, SummaryRecord, checksum};

/// A summary checked and encoded for SQL.
pub(super) struct EncodedSummary<'a> {
    id: i64,
    created_at: i64,
    sources: Vec<i64>,
    checksum: i64,
    record: &'a SummaryRecord,
}

/// Checks and encodes summary `record` of `scope`.
pub(super) fn encode<'a>(scope: &Scope, record: &'a SummaryRecord) -> Sql<EncodedSummary<'a>> {
    Ok(EncodedSummary {
        id: to_i64("summary id", record.id)?,
        created_at: to_i64("timestamp", record.created_at)?,
        sources: record
            .source_ids
            .iter()
            .map(|&source| to_i64("source id", source))
            .collect::<Result<_, _>>()?,
        checksum: checksum::summary(scope, record) as i64,
        record,
    })
}

/// Upserts a summary and replaces its sources, inside the caller's transaction.
pub(super) fn write(conn: &Connection, session_id: i64, summary: &EncodedSummary<'_>) -> Sql<()> {
    let record = summary.record;
    let pk: i64 = conn
        .prepare_cached(
            "INSERT INTO summaries
                 (session_id, id, level, text, created_at, tokens_before, tokens_after, checksum)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (session_id, id) DO UPDATE SET
                 level = excluded.level, text = excluded.text,
                 created_at = excluded.created_at, tokens_before = excluded.tokens_before,
                 tokens_after = excluded.tokens_after, checksum = excluded.checksum
             RETURNING pk",
        )?
        .query_row(
            rusqlite::params![
                session_id,
                summary.id,
                record.level,
                record.text,
                summary.created_at,
                record.tokens_before,
                record.tokens_after,
                summary.checksum,
            ],
            |row| row.get(0),
        )?;
    conn.prepare_cached("DELETE FROM summary_sources WHERE summary_pk = ?1")?.execute([pk])?;
    let mut add = conn.prepare_cached(
        "INSERT INTO summary_sources (summary_pk, position, source_id) VALUES (?1, ?2, ?3)",
    )?;
    for (position, source) in (0_i64..).zip(&summary.sources) {
        add.execute(rusqlite::params![pk, position, source])?;
    }
    tracing::debug!(id = record.id, sources = summary.sources.len(), "archive: summary stored");
    Ok(())
}

/// A stored summary and its checksum, by pk; `None` when no row has that pk.
struct Stored {
    record: SummaryRecord,
    checksum: Option<i64>,
}

/// Reads the summary at `pk` (its row fetched by the caller) with its sources.
fn read(conn: &Connection, pk: i64, row: &rusqlite::Row<'_>) -> Sql<Stored> {
    let mut stmt = conn.prepare_cached(
        "SELECT source_id FROM summary_sources WHERE summary_pk = ?1 ORDER BY position",
    )?;
    let mut rows = stmt.query([pk])?;
    let mut source_ids = Vec::new();
    while let Some(source) = rows.next()? {
        source_ids.push(from_sql_int("source id", source.get(0)?)?);
    }
    let id = from_sql_int("summary id", row.get(1)?)?;
    let corrupt = |what: &str, value: i64| {
        Failure(StoreError::damaged(format!("summary {id}"), format!("{what} {value}")))
    };
    let (level, before, after): (i64, i64, i64) = (row.get(2)?, row.get(5)?, row.get(6)?);
    Ok(Stored {
        record: SummaryRecord {
            id,
            level: u8::try_from(level).map_err(|_| corrupt("level", level))?,
            text: row.get(3)?,
            source_ids,
            created_at: from_sql_int("timestamp", row.get(4)?)?,
            tokens_before: u32::try_from(before).map_err(|_| corrupt("tokens_before", before))?,
            tokens_after: u32::try_from(after).map_err(|_| corrupt("tokens_after", after))?,
        },
        checksum: row.get(7)?,
    })
}

const SUMMARY_COLUMNS: &str = "u.pk, u.id, u.level, u.text, u.created_at, u.tokens_before, \
     u.tokens_after, u.checksum";

impl SqliteArchive {
    pub(super) fn summary_sql(&self, scope: &Scope, id: u64) -> Sql<Option<SummaryRecord>> {
        let Ok(id) = i64::try_from(id) else { return Ok(None) };
        let Some(session_id) = self.session_id(scope)? else { return Ok(None) };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries u WHERE u.session_id = ?1 AND u.id = ?2"
        ))?;
        let mut rows = stmt.query([session_id, id])?;
        let Some(row) = rows.next()? else { return Ok(None) };
        let stored = read(&conn, row.get(0)?, row)?;
        let computed = checksum::summary(scope, &stored.record);
        let name = || format!("summary {id} of conversation {:?}", scope.to_string());
        match stored.checksum {
            Some(sum) if sum as u64 == computed => Ok(Some(stored.record)),
            Some(sum) => Err(Failure(checksum::mismatch(name(), sum as u64, computed))),
            None => Err(Failure(StoreError::damaged(name(), "its checksum is missing"))),
        }
    }
}

/// Summary `id` of session `session_id` as stored, unverified (forget rewrites it), if any.
pub(super) fn unverified(
    conn: &Connection,
    session_id: i64,
    id: i64,
) -> Sql<Option<SummaryRecord>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries u WHERE u.session_id = ?1 AND u.id = ?2"
    ))?;
    let mut rows = stmt.query([session_id, id])?;
    match rows.next()? {
        Some(row) => Ok(Some(read(conn, row.get(0)?, row)?.record)),
        None => Ok(None),
    }
}

/// Computes the checksums of summaries written before schema version 5; how many.
pub(super) fn backfill(conn: &Connection) -> Sql<u64> {
    let mut select = conn.prepare(&format!(
        "SELECT {SUMMARY_COLUMNS}, s.tenant, s.name
         FROM summaries u JOIN sessions s ON s.id = u.session_id"
    ))?;
    let mut update = conn.prepare("UPDATE summaries SET checksum = ?2 WHERE pk = ?1")?;
    let mut rows = select.query([])?;
    let mut done = 0;
    while let Some(row) = rows.next()? {
        let pk: i64 = row.get(0)?;
        let scope = Scope::new(row.get::<_, String>(8)?, row.get::<_, String>(9)?);
        if let Ok(stored) = read(conn, pk, row) {
            update.execute([pk, checksum::summary(&scope, &stored.record) as i64])?;
            done += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ArchiveStore, ErrorKind, Fence};

    #[test]
    fn unknown_summary_is_a_typed_error() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let err = archive.drill_down(&Scope::local("s"), 7).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn cycles_and_missing_sources_terminate() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let s = Scope::local("s");
        archive.put_summary(&s, Fence::NONE, &SummaryRecord::new(1, 2, "a", vec![2, 99])).unwrap();
        archive.put_summary(&s, Fence::NONE, &SummaryRecord::new(2, 2, "b", vec![1])).unwrap();
        assert!(archive.drill_down(&s, 1).unwrap().is_empty());
    }

    #[test]
    fn restoring_replaces_sources() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let s = Scope::local("s");
        archive
            .put_summary(&s, Fence::NONE, &SummaryRecord::new(1, 1, "a", vec![5, 6, 7]))
            .unwrap();
        archive.put_summary(&s, Fence::NONE, &SummaryRecord::new(1, 1, "b", vec![8])).unwrap();
        let stored = archive.summary(&s, 1).unwrap().unwrap();
        assert_eq!((stored.text.as_str(), stored.source_ids), ("b", vec![8]));
        assert_eq!(archive.usage(&s).unwrap().summaries, 1);
    }
}
