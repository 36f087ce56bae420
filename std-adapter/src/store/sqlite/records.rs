//! [`RecordStore`] for [`SqliteArchive`]: table `records` of the archive file (since schema
//! version 6). Names and keys are stored as their UTF-8 bytes, so keys compare byte by byte
//! and a prefix is a range of the primary key; a listing that matches fields reads its range
//! in order and stops once it has `limit` matches.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, TransactionBehavior, params_from_iter};

use super::SqliteArchive;
use super::error::{Failure, Sql};
use crate::store::records::{
    Record, RecordQuery, RecordStore, RecordWrite, parse_fields, prefix_end, validate,
};
use crate::store::{Scope, StoreError, checksum};

fn blob(text: &str) -> SqlValue {
    SqlValue::Blob(text.as_bytes().to_vec())
}

/// The scope's columns as the first two parameters of a statement.
fn scope_params(scope: &Scope) -> Vec<SqlValue> {
    vec![blob(&scope.tenant), blob(&scope.conversation)]
}

fn put(conn: &Connection, scope: &Scope, record: &Record, verb: &str) -> Sql<()> {
    let fields = record.fields_text();
    let sum = checksum::record(scope, record);
    conn.execute(
        &format!(
            "{verb} INTO records (tenant, namespace, collection, key, value, fields, checksum)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ),
        rusqlite::params![
            scope.tenant.as_bytes(),
            scope.conversation.as_bytes(),
            record.collection.as_bytes(),
            record.key.as_bytes(),
            record.value,
            fields,
            i64::try_from(sum).unwrap_or_default(),
        ],
    )?;
    Ok(())
}

/// A record read back: `key` decoded, the checksum verified, the fields parsed.
fn served(
    scope: &Scope,
    collection: &str,
    key: Vec<u8>,
    value: Vec<u8>,
    fields: Option<String>,
    stored: i64,
) -> Result<Record, StoreError> {
    let key = String::from_utf8(key).map_err(|_| {
        StoreError::damaged(format!("a record key of {collection} of {scope}"), "not UTF-8")
    })?;
    let computed = checksum::record_parts(scope, collection, &key, &value, fields.as_deref());
    let stored = u64::try_from(stored).unwrap_or(u64::MAX);
    if computed != stored {
        return Err(checksum::mismatch(Record::name(scope, collection, &key), stored, computed));
    }
    let fields = fields.as_deref().map(parse_fields).transpose().map_err(|error| {
        StoreError::damaged(Record::name(scope, collection, &key), error.to_string())
    })?;
    Ok(Record { collection: collection.into(), key, value, fields })
}

impl SqliteArchive {
    fn apply_sql(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Sql<()> {
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for write in writes {
            match write {
                RecordWrite::Put(record) => put(&tx, scope, record, "INSERT OR REPLACE")?,
                RecordWrite::Insert(record) => put(&tx, scope, record, "INSERT OR IGNORE")?,
                RecordWrite::Delete { collection, key } => {
                    tx.execute(
                        "DELETE FROM records WHERE tenant = ?1 AND namespace = ?2
                         AND collection = ?3 AND key = ?4",
                        params_from_iter(
                            scope_params(scope).into_iter().chain([blob(collection), blob(key)]),
                        ),
                    )?;
                }
                RecordWrite::DeletePrefix { collection, prefix } => {
                    let mut params = scope_params(scope);
                    params.extend([blob(collection), blob(prefix)]);
                    let mut sql = String::from(
                        "DELETE FROM records WHERE tenant = ?1 AND namespace = ?2
                         AND collection = ?3 AND key >= ?4",
                    );
                    if let Some(end) = prefix_end(prefix.as_bytes()) {
                        sql.push_str(" AND key < ?5");
                        params.push(SqlValue::Blob(end));
                    }
                    tx.execute(&sql, params_from_iter(params))?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn get_sql(&self, scope: &Scope, collection: &str, keys: &[&str]) -> Sql<Vec<Record>> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        let conn = self.conn();
        let mut statement = conn.prepare_cached(
            "SELECT value, fields, checksum FROM records
             WHERE tenant = ?1 AND namespace = ?2 AND collection = ?3 AND key = ?4",
        )?;
        let mut out = Vec::new();
        for key in keys {
            let params = scope_params(scope).into_iter().chain([blob(collection), blob(key)]);
            let mut rows = statement.query(params_from_iter(params))?;
            if let Some(row) = rows.next()? {
                let record = served(
                    scope,
                    collection,
                    key.as_bytes().to_vec(),
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                )?;
                out.push(record);
            }
        }
        Ok(out)
    }

    fn list_sql(&self, scope: &Scope, query: &RecordQuery<'_>) -> Sql<Vec<Record>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let mut params = scope_params(scope);
        params.extend([blob(query.collection), blob(query.prefix)]);
        let mut sql = String::from(
            "SELECT key, value, fields, checksum FROM records
             WHERE tenant = ?1 AND namespace = ?2 AND collection = ?3 AND key >= ?4",
        );
        let mut bound = |sql: &mut String, condition: &str, value: SqlValue| {
            params.push(value);
            sql.push_str(&format!(" AND key {condition} ?{}", params.len()));
        };
        if let Some(end) = prefix_end(query.prefix.as_bytes()) {
            bound(&mut sql, "<", SqlValue::Blob(end));
        }
        if let Some(after) = query.after {
            bound(&mut sql, ">", blob(after));
        }
        if let Some(before) = query.before {
            bound(&mut sql, "<", blob(before));
        }
        sql.push_str(if query.descending { " ORDER BY key DESC" } else { " ORDER BY key" });
        // With fields to match, the range is read in order until enough match.
        if query.fields.is_none() {
            sql.push_str(&format!(" LIMIT {}", super::sql_limit(query.limit)));
        }
        let conn = self.conn();
        let mut statement = conn.prepare(&sql)?;
        let mut rows = statement.query(params_from_iter(params))?;
        let mut out = Vec::new();
        while out.len() < query.limit {
            let Some(row) = rows.next()? else { break };
            let record = served(
                scope,
                query.collection,
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
            )?;
            if query.holds_fields(record.fields.as_ref()) {
                out.push(record);
            }
        }
        Ok(out)
    }

    fn delete_namespace_sql(&self, scope: &Scope) -> Sql<u64> {
        let _turn = super::write_turn(&self.gate);
        let conn = self.conn();
        let deleted = conn.execute(
            "DELETE FROM records WHERE tenant = ?1 AND namespace = ?2",
            params_from_iter(scope_params(scope)),
        )?;
        Ok(deleted as u64)
    }

    fn namespaces_sql(&self, tenant: &str, after: Option<&str>, limit: usize) -> Sql<Vec<String>> {
        let conn = self.conn();
        let mut params = vec![blob(tenant)];
        let mut sql = String::from("SELECT DISTINCT namespace FROM records WHERE tenant = ?1");
        if let Some(after) = after {
            params.push(blob(after));
            sql.push_str(" AND namespace > ?2");
        }
        sql.push_str(&format!(" ORDER BY namespace LIMIT {}", super::sql_limit(limit)));
        let mut statement = conn.prepare(&sql)?;
        let names = statement
            .query_map(params_from_iter(params), |row| row.get::<_, Vec<u8>>(0))?
            .map(|name| {
                String::from_utf8(name?).map_err(|_| {
                    Failure(StoreError::damaged(
                        format!("a record namespace of tenant {tenant:?}"),
                        "not UTF-8",
                    ))
                })
            })
            .collect::<Sql<Vec<_>>>()?;
        Ok(names)
    }

    /// Changes a byte of the value of record `collection`/`key` of `scope` behind its
    /// checksum (the conformance suite's damage check). Whether there was such a record.
    #[cfg(test)]
    pub(crate) fn damage_record_for_tests(
        &self,
        scope: &Scope,
        collection: &str,
        key: &str,
    ) -> bool {
        let conn = self.conn();
        let params = scope_params(scope).into_iter().chain([blob(collection), blob(key)]);
        conn.execute(
            "UPDATE records SET value = CAST(upper(CAST(value AS TEXT)) AS BLOB)
             WHERE tenant = ?1 AND namespace = ?2 AND collection = ?3 AND key = ?4",
            params_from_iter(params),
        )
        .is_ok_and(|changed| changed == 1)
    }
}

/// No fences (see the port's documentation); each call one transaction or statement.
impl RecordStore for SqliteArchive {
    fn apply(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Result<(), StoreError> {
        validate(writes)?;
        Ok(self.apply_sql(scope, writes)?)
    }

    fn get(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, StoreError> {
        Ok(self.get_sql(scope, collection, keys)?)
    }

    fn list(&self, scope: &Scope, query: &RecordQuery<'_>) -> Result<Vec<Record>, StoreError> {
        Ok(self.list_sql(scope, query)?)
    }

    fn delete_namespace(&self, scope: &Scope) -> Result<u64, StoreError> {
        Ok(self.delete_namespace_sql(scope)?)
    }

    fn namespaces(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        Ok(self.namespaces_sql(tenant, after, limit)?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::conformance;

    #[test]
    fn passes_the_record_conformance_suite_in_memory_and_on_disk() {
        conformance::records(&|| Arc::new(SqliteArchive::open_in_memory().unwrap()));
        let dir = tempfile::tempdir().unwrap();
        let count = std::sync::atomic::AtomicU32::new(0);
        conformance::records(&|| {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Arc::new(SqliteArchive::open(dir.path().join(format!("{n}.db"))).unwrap())
        });
    }

    #[test]
    fn damage_is_reported_not_served() {
        let archive = SqliteArchive::open_in_memory().unwrap();
        let damage = |scope: &Scope, collection: &str, key: &str| {
            archive.damage_record_for_tests(scope, collection, key)
        };
        conformance::damaged_record(&archive, &damage);
    }
}
