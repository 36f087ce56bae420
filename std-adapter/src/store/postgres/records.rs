//! [`RecordStore`] for [`PgStore`]: table `records` (migration 2). Names and keys are escaped
//! as every text of the adapter and compared byte by byte (`COLLATE "C"`), so a key prefix is
//! a range of the primary key; fields are matched in SQL, as `jsonb`.

use postgres::Row;
use postgres::types::{ToSql, Type};

use super::error::{Failure, Pg, get};
use super::escape::{escape, scope_params, unescape};
use super::{PgStore, Tx};
use crate::store::records::{
    Record, RecordQuery, RecordStore, RecordWrite, parse_fields, validate,
};
use crate::store::{Scope, StoreError, checksum};

/// The records of one namespace: `$1` its tenant, `$2` its name.
const SCOPED: &str = "records WHERE tenant = $1 AND namespace = $2";

/// A parameter and its type, as `query_typed` takes them.
type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Record `collection`/`key` of a stored row (`value`, `fields`, `checksum` from column
/// `first`), verified.
fn served(scope: &Scope, collection: &str, key: String, row: &Row, first: usize) -> Pg<Record> {
    let value: Vec<u8> = get(row, first)?;
    let fields: Option<String> = get(row, first + 1)?;
    let stored: i64 = get(row, first + 2)?;
    let damaged = |detail: String| {
        Failure(StoreError::damaged(Record::name(scope, collection, &key), detail))
    };
    let fields = fields.map(unescape).transpose().map_err(damaged)?;
    let computed = checksum::record_parts(scope, collection, &key, &value, fields.as_deref());
    let stored = u64::try_from(stored).unwrap_or(u64::MAX);
    if computed != stored {
        return Err(Failure(checksum::mismatch(
            Record::name(scope, collection, &key),
            stored,
            computed,
        )));
    }
    let fields = fields
        .as_deref()
        .map(parse_fields)
        .transpose()
        .map_err(|error| damaged(error.to_string()))?;
    Ok(Record { collection: collection.into(), key, value, fields })
}

fn stored_key(scope: &Scope, row: &Row) -> Pg<String> {
    unescape(get(row, 0)?)
        .map_err(|detail| Failure(StoreError::damaged(format!("a record key of {scope}"), detail)))
}

fn put(tx: &mut Tx<'_>, scope: &Scope, record: &Record, replace: bool) -> Pg<()> {
    let (tenant, name) = scope_params(scope);
    let (collection, key) = (escape(&record.collection), escape(&record.key));
    let fields = record.fields_text();
    let stored_fields = fields.as_deref().map(|text| escape(text).into_owned());
    let sum = i64::try_from(checksum::record(scope, record)).unwrap_or_default();
    let on_conflict = if replace {
        "DO UPDATE SET value = excluded.value, fields = excluded.fields, checksum = excluded.checksum"
    } else {
        "DO NOTHING"
    };
    tx.query(
        &format!(
            "INSERT INTO records (tenant, namespace, collection, key, value, fields, checksum)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (tenant, namespace, collection, key) {on_conflict}"
        ),
        &[
            (&tenant, Type::TEXT),
            (&name, Type::TEXT),
            (&collection, Type::TEXT),
            (&key, Type::TEXT),
            (&record.value, Type::BYTEA),
            (&stored_fields, Type::TEXT),
            (&sum, Type::INT8),
        ],
    )?;
    Ok(())
}

impl PgStore {
    fn apply_pg(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Result<(), StoreError> {
        let (tenant, name) = scope_params(scope);
        self.transaction(|tx| {
            for write in writes {
                match write {
                    RecordWrite::Put(record) => put(tx, scope, record, true)?,
                    RecordWrite::Insert(record) => put(tx, scope, record, false)?,
                    RecordWrite::Delete { collection, key } => {
                        let (collection, key) = (escape(collection), escape(key));
                        tx.query(
                            &format!("DELETE FROM {SCOPED} AND collection = $3 AND key = $4"),
                            &[
                                (&tenant, Type::TEXT),
                                (&name, Type::TEXT),
                                (&collection, Type::TEXT),
                                (&key, Type::TEXT),
                            ],
                        )?;
                    }
                    RecordWrite::DeletePrefix { collection, prefix } => {
                        let (collection, prefix) = (escape(collection), escape(prefix));
                        tx.query(
                            &format!(
                                "DELETE FROM {SCOPED} AND collection = $3
                                 AND key >= $4 AND starts_with(key, $4)"
                            ),
                            &[
                                (&tenant, Type::TEXT),
                                (&name, Type::TEXT),
                                (&collection, Type::TEXT),
                                (&prefix, Type::TEXT),
                            ],
                        )?;
                    }
                }
            }
            Ok(())
        })
    }

    fn get_pg(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, StoreError> {
        let (tenant, name) = scope_params(scope);
        let stored_collection = escape(collection);
        let stored_keys: Vec<String> = keys.iter().map(|key| escape(key).into_owned()).collect();
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT key, value, fields, checksum FROM {SCOPED}
                     AND collection = $3 AND key = ANY($4) ORDER BY key"
                ),
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&stored_collection, Type::TEXT),
                    (&stored_keys, Type::TEXT_ARRAY),
                ],
            )?;
            let mut records = rows
                .iter()
                .map(|row| served(scope, collection, stored_key(scope, row)?, row, 1))
                .collect::<Pg<Vec<_>>>()?;
            // Byte order of the keys as given (the escape can move NUL and U+FFFF).
            records.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(records)
        })
    }

    fn list_pg(&self, scope: &Scope, query: &RecordQuery<'_>) -> Result<Vec<Record>, StoreError> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let (tenant, name) = scope_params(scope);
        let collection = escape(query.collection).into_owned();
        let prefix = escape(query.prefix).into_owned();
        let after = query.after.map(|key| escape(key).into_owned());
        let before = query.before.map(|key| escape(key).into_owned());
        let fields =
            query.fields.map(|fields| serde_json::Value::Object(fields.clone()).to_string());
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let mut params: Vec<Param<'_>> = vec![
            (&tenant, Type::TEXT),
            (&name, Type::TEXT),
            (&collection, Type::TEXT),
            (&prefix, Type::TEXT),
            (&limit, Type::INT8),
        ];
        let mut sql = format!(
            "SELECT key, value, fields, checksum FROM {SCOPED} AND collection = $3
             AND key >= $4 AND starts_with(key, $4)"
        );
        if let Some(after) = &after {
            params.push((after, Type::TEXT));
            sql.push_str(&format!(" AND key > ${}", params.len()));
        }
        if let Some(before) = &before {
            params.push((before, Type::TEXT));
            sql.push_str(&format!(" AND key < ${}", params.len()));
        }
        if let Some(fields) = &fields {
            params.push((fields, Type::TEXT));
            // Every wanted field equal as jsonb; a record without fields has none of them.
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM jsonb_each(${}::jsonb) wanted
                   WHERE (records.fields::jsonb -> wanted.key) IS DISTINCT FROM wanted.value)",
                params.len()
            ));
        }
        sql.push_str(if query.descending { " ORDER BY key DESC" } else { " ORDER BY key" });
        sql.push_str(" LIMIT $5");
        self.run(|client| {
            let rows = client.query_typed(&sql, &params)?;
            rows.iter()
                .map(|row| served(scope, query.collection, stored_key(scope, row)?, row, 1))
                .collect()
        })
    }

    fn delete_namespace_pg(&self, scope: &Scope) -> Result<u64, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.transaction(|tx| {
            let rows = tx.query(
                &format!(
                    "WITH gone AS (DELETE FROM {SCOPED} RETURNING 1) SELECT count(*) FROM gone"
                ),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            let count: i64 = rows.first().map(|row| get(row, 0)).transpose()?.unwrap_or(0);
            Ok(u64::try_from(count).unwrap_or(0))
        })
    }

    fn namespaces_pg(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let tenant = escape(tenant).into_owned();
        let after = after.map(|name| escape(name).into_owned());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(|client| {
            let rows = client.query_typed(
                "SELECT DISTINCT namespace FROM records
                 WHERE tenant = $1 AND ($2::text IS NULL OR namespace > $2)
                 ORDER BY namespace LIMIT $3",
                &[(&tenant, Type::TEXT), (&after, Type::TEXT), (&limit, Type::INT8)],
            )?;
            rows.iter()
                .map(|row| {
                    unescape(get(row, 0)?).map_err(|detail| {
                        Failure(StoreError::damaged("a record namespace".to_string(), detail))
                    })
                })
                .collect()
        })
    }

    /// Changes a byte of the value of record `collection`/`key` of `scope` behind its
    /// checksum (the conformance suite's damage check). Whether there was such a record.
    #[doc(hidden)]
    pub fn damage_record_for_tests(
        &self,
        scope: &Scope,
        collection: &str,
        key: &str,
    ) -> Result<bool, StoreError> {
        let (tenant, name) = scope_params(scope);
        let (collection, key) = (escape(collection), escape(key));
        self.run(|client| {
            let changed = client.query_typed(
                "UPDATE records SET value = set_byte(value, 0, get_byte(value, 0) # 32)
                 WHERE tenant = $1 AND namespace = $2 AND collection = $3 AND key = $4
                 RETURNING 1",
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&collection, Type::TEXT),
                    (&key, Type::TEXT),
                ],
            )?;
            Ok(changed.len() == 1)
        })
    }
}

/// No fences: records are not conversations of the archive (see the port's documentation).
impl RecordStore for PgStore {
    fn apply(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Result<(), StoreError> {
        validate(writes)?;
        self.apply_pg(scope, writes)
    }

    fn get(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, StoreError> {
        self.get_pg(scope, collection, keys)
    }

    fn list(&self, scope: &Scope, query: &RecordQuery<'_>) -> Result<Vec<Record>, StoreError> {
        self.list_pg(scope, query)
    }

    fn delete_namespace(&self, scope: &Scope) -> Result<u64, StoreError> {
        self.delete_namespace_pg(scope)
    }

    fn namespaces(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.namespaces_pg(tenant, after, limit)
    }
}
