//! `ctxwin._native.Records`: keyed records of a tenant's namespaces through the record port
//! (`store::open_records`: table `records` of a state directory's `archive.db`, of a
//! PostgreSQL database, or memory). The LangGraph checkpoint saver
//! (`ctxwin.langgraph.CtxwinSaver`) keeps its checkpoints, pending writes, channel values
//! and message elements here.
//!
//! A record crosses as `(key, value, fields)`: `value` bytes, `fields` the JSON text of an
//! object or `None`. A write is `(op, collection, key, value, fields)` with `op` one of
//! `"put"` (replace), `"insert"` (keep what is there), `"delete"` and `"delete_prefix"`
//! (`key` is the prefix; `value` and `fields` `None`).

use std::sync::Arc;

use ctxwin_std::store::{
    self, Location, MemoryRecords, Record, RecordQuery, RecordStore, RecordWrite, Scope,
    records::{Fields, parse_fields},
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{self, Kind};
use crate::items::create_dir;

/// A record as Python gets it: key, value, fields' JSON text.
type Served<'py> = (String, Bound<'py, PyBytes>, Option<String>);

/// A write as Python gives it: op, collection, key (or prefix), value, fields' JSON text.
type Given<'py> = (String, String, String, Option<Bound<'py, PyBytes>>, Option<String>);

/// The record port behind `store`: `":memory:"`, a `postgres://` URL, or a state directory
/// (created if missing).
fn open(store: &str) -> PyResult<Arc<dyn RecordStore>> {
    if store == ":memory:" {
        return Ok(Arc::new(MemoryRecords::new()));
    }
    let location = Location::parse(store);
    if let Location::Directory(dir) = &location {
        create_dir(dir)?;
    }
    store::open_records(&location).map_err(errors::store)
}

fn fields_of(json: Option<&str>) -> PyResult<Option<Fields>> {
    json.map(parse_fields).transpose().map_err(|e| errors::error(Kind::InvalidInput, e.to_string()))
}

fn served<'py>(py: Python<'py>, records: Vec<Record>) -> Vec<Served<'py>> {
    records
        .into_iter()
        .map(|record| {
            let fields = record.fields.map(|fields| serde_json::Value::Object(fields).to_string());
            (record.key, PyBytes::new(py, &record.value), fields)
        })
        .collect()
}

/// A write of Python's as the port's: a record to store, or a key (prefix) to delete.
enum Change {
    Put(Record),
    Insert(Record),
    Delete(String, String),
    DeletePrefix(String, String),
}

impl Change {
    fn parse((op, collection, key, value, fields): Given<'_>) -> PyResult<Change> {
        let record = |value: Option<Bound<'_, PyBytes>>| -> PyResult<Record> {
            let value = value.ok_or_else(|| {
                errors::error(Kind::Usage, format!("a {op:?} of record {key:?} needs a value"))
            })?;
            let mut record =
                Record::new(collection.clone(), key.clone(), value.as_bytes().to_vec());
            record.fields = fields_of(fields.as_deref())?;
            Ok(record)
        };
        match op.as_str() {
            "put" => Ok(Change::Put(record(value)?)),
            "insert" => Ok(Change::Insert(record(value)?)),
            "delete" => Ok(Change::Delete(collection, key)),
            "delete_prefix" => Ok(Change::DeletePrefix(collection, key)),
            _ => Err(errors::error(
                Kind::Usage,
                format!("unknown record write {op:?}: use put, insert, delete or delete_prefix"),
            )),
        }
    }

    fn as_write(&self) -> RecordWrite<'_> {
        match self {
            Change::Put(record) => RecordWrite::Put(record),
            Change::Insert(record) => RecordWrite::Insert(record),
            Change::Delete(collection, key) => RecordWrite::Delete { collection, key },
            Change::DeletePrefix(collection, prefix) => {
                RecordWrite::DeletePrefix { collection, prefix }
            }
        }
    }
}

/// Keyed records of one tenant's namespaces in one store (safe to share between threads,
/// every call made with the GIL released).
#[pyclass(frozen, module = "ctxwin._native")]
pub(crate) struct Records {
    store: Arc<dyn RecordStore>,
    tenant: String,
}

impl Records {
    fn scope(&self, namespace: &str) -> Scope {
        Scope::new(self.tenant.clone(), namespace)
    }
}

#[pymethods]
impl Records {
    #[new]
    #[pyo3(signature = (store, *, tenant=String::new()))]
    fn new(py: Python<'_>, store: &str, tenant: String) -> PyResult<Records> {
        let store = py.detach(|| open(store))?;
        Ok(Records { store, tenant })
    }

    /// Applies the writes to `namespace`'s records, all or none.
    fn apply(&self, py: Python<'_>, namespace: &str, writes: Vec<Given<'_>>) -> PyResult<()> {
        let changes = writes.into_iter().map(Change::parse).collect::<PyResult<Vec<_>>>()?;
        let scope = self.scope(namespace);
        py.detach(|| {
            let writes: Vec<RecordWrite<'_>> = changes.iter().map(Change::as_write).collect();
            self.store.apply(&scope, &writes).map_err(errors::store)
        })
    }

    /// The records of `collection` under `keys` that exist, in key order.
    fn get<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        collection: &str,
        keys: Vec<String>,
    ) -> PyResult<Vec<Served<'py>>> {
        let scope = self.scope(namespace);
        let records = py.detach(|| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.store.get(&scope, collection, &keys).map_err(errors::store)
        })?;
        Ok(served(py, records))
    }

    /// Records of `collection` in key order (see `RecordQuery`).
    #[pyo3(signature = (namespace, collection, *, limit, prefix="", after=None, before=None, descending=false, fields=None))]
    #[allow(clippy::too_many_arguments)]
    fn list<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        collection: &str,
        limit: usize,
        prefix: &str,
        after: Option<&str>,
        before: Option<&str>,
        descending: bool,
        fields: Option<&str>,
    ) -> PyResult<Vec<Served<'py>>> {
        let scope = self.scope(namespace);
        let fields = fields_of(fields)?;
        let records = py.detach(|| {
            let mut query =
                RecordQuery::new(collection, limit).prefix(prefix).matching(fields.as_ref());
            query.after = after;
            query.before = before;
            query.descending = descending;
            self.store.list(&scope, &query).map_err(errors::store)
        })?;
        Ok(served(py, records))
    }

    /// Removes every record of `namespace`; how many there were.
    fn delete_namespace(&self, py: Python<'_>, namespace: &str) -> PyResult<u64> {
        let scope = self.scope(namespace);
        py.detach(|| self.store.delete_namespace(&scope).map_err(errors::store))
    }

    /// The tenant's namespaces holding records, ascending, after `after`, at most `limit`.
    #[pyo3(signature = (*, limit, after=None))]
    fn namespaces(
        &self,
        py: Python<'_>,
        limit: usize,
        after: Option<&str>,
    ) -> PyResult<Vec<String>> {
        py.detach(|| self.store.namespaces(&self.tenant, after, limit).map_err(errors::store))
    }
}
