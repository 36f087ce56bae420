//! [`RecordStore`]: the third storage port, keyed records. A record is a value (bytes) under
//! a key in a named collection of one [`Scope`] — a tenant and a namespace (the scope's
//! `conversation`: a LangGraph thread, an application's own grouping) — with optional JSON
//! fields a listing can filter on. It holds what is addressed by the caller's own keys rather
//! than by the archive's message ids or the checkpoint port's ids: the Python package's
//! LangGraph checkpoint saver keeps LangGraph's checkpoints, pending writes and channel values
//! here.
//!
//! As in the other ports, every call names its scope and adapters put it into the query or
//! key (never filter another scope's records afterwards); every record carries a
//! [checksum](crate::store::checksum::record) verified on every read (damage is
//! [`StoreError::Damaged`], never bytes served); a write of several records is all or none.
//! Keys order as their UTF-8 bytes, the same in every adapter. There are no leases: records
//! are written with fences of no kind (a caller that needs one writer per namespace keeps it
//! itself).
//!
//! **Adapters:** [`MemoryRecords`]; [`SqliteArchive`](crate::store::sqlite::SqliteArchive)
//! (table `records` of the state directory's `archive.db`, since schema version 6; cargo feature
//! `sqlite`); [`PgStore`](crate::store::postgres::PgStore) (table `records`, migration 2;
//! feature `postgres`). [`open_records`](crate::store::open_records) opens the one a
//! [`Location`](crate::store::Location) names.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::store::{MemoryRecords, Record, RecordQuery, RecordStore, RecordWrite, Scope};
//! let store = MemoryRecords::new();
//! let thread = Scope::new("acme", "thread-1");
//! let first = Record::new("checkpoint", "0001", b"first".to_vec()).with_fields(r#"{"step": 1}"#)?;
//! let second = Record::new("checkpoint", "0002", b"second".to_vec()).with_fields(r#"{"step": 2}"#)?;
//! store.apply(&thread, &[RecordWrite::Put(&first), RecordWrite::Put(&second)])?;
//! // The newest first, filtered on a field, inside the store.
//! let step = serde_json::json!({"step": 1});
//! let found = store.list(&thread, &RecordQuery::new("checkpoint", 10).descending().matching(step.as_object()))?;
//! assert_eq!(found, [first]);
//! // Another tenant's namespace of the same name holds nothing.
//! assert!(store.get(&Scope::new("other", "thread-1"), "checkpoint", &["0001"])?.is_empty());
//! # Ok::<(), ctxwin_std::store::StoreError>(())
//! ```

#[cfg(any(test, feature = "conformance"))]
pub(crate) mod conformance;
mod memory;

use std::fmt;

use serde_json::{Map, Value};

use super::{Scope, StoreError};

pub use memory::MemoryRecords;

/// JSON fields of a record: a JSON object, matched key by key.
pub type Fields = Map<String, Value>;

/// One keyed record: `value` under `key` in `collection` (of the scope it is written to),
/// with optional `fields` a [`RecordQuery`] can match.
///
/// ```
/// use ctxwin_std::store::Record;
/// let record = Record::new("elements", "9f2c", vec![1, 2, 3]);
/// assert_eq!((record.collection.as_str(), record.key.as_str()), ("elements", "9f2c"));
/// assert!(Record::new("c", "k", vec![]).with_fields("[1]").is_err(), "fields are an object");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Which collection of the scope (not empty).
    pub collection: String,
    /// The key within the collection.
    pub key: String,
    /// The value, as given.
    pub value: Vec<u8>,
    /// Fields a listing can match ([`RecordQuery::matching`]).
    pub fields: Option<Fields>,
}

impl Record {
    /// `value` under `key` in `collection`, without fields.
    pub fn new(collection: impl Into<String>, key: impl Into<String>, value: Vec<u8>) -> Self {
        Self { collection: collection.into(), key: key.into(), value, fields: None }
    }

    /// This record with the fields of the JSON object `json`.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when `json` is not a JSON object.
    pub fn with_fields(mut self, json: &str) -> Result<Self, StoreError> {
        self.fields = Some(parse_fields(json)?);
        Ok(self)
    }

    /// The fields as stored: JSON text (what the checksum covers), `None` without fields.
    pub(crate) fn fields_text(&self) -> Option<String> {
        self.fields.as_ref().map(|fields| Value::Object(fields.clone()).to_string())
    }

    /// `collection` and `key`, named for messages.
    pub(crate) fn name(scope: &Scope, collection: &str, key: &str) -> String {
        format!("record {collection}/{key:?} of {scope}")
    }
}

/// The JSON object `json` as [`Fields`].
///
/// # Errors
/// [`StoreError::Invalid`] when it is not one.
pub fn parse_fields(json: &str) -> Result<Fields, StoreError> {
    match serde_json::from_str(json) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(StoreError::invalid("a record's fields must be a JSON object")),
        Err(error) => Err(StoreError::invalid(format!("a record's fields are not JSON: {error}"))),
    }
}

/// One change of a [`RecordStore::apply`].
#[derive(Clone, Copy, Debug)]
pub enum RecordWrite<'a> {
    /// Stores the record, replacing one under its key.
    Put(&'a Record),
    /// Stores the record unless one is under its key (the first write is kept).
    Insert(&'a Record),
    /// Removes the record under `key` (nothing when there is none).
    Delete {
        /// The collection.
        collection: &'a str,
        /// The key.
        key: &'a str,
    },
    /// Removes every record of `collection` whose key starts with `prefix` (`""`: all).
    DeletePrefix {
        /// The collection.
        collection: &'a str,
        /// The start of the keys removed.
        prefix: &'a str,
    },
}

impl RecordWrite<'_> {
    /// The collection written.
    pub fn collection(&self) -> &str {
        match self {
            Self::Put(record) | Self::Insert(record) => &record.collection,
            Self::Delete { collection, .. } | Self::DeletePrefix { collection, .. } => collection,
        }
    }
}

/// Refuses writes an adapter cannot take, before any is written: a write names a collection.
pub(crate) fn validate(writes: &[RecordWrite<'_>]) -> Result<(), StoreError> {
    if writes.iter().any(|write| write.collection().is_empty()) {
        return Err(StoreError::invalid("a record write names no collection"));
    }
    Ok(())
}

/// What [`RecordStore::list`] returns: records of one collection, in key order (ascending,
/// or descending), within bounds, matching fields, at most `limit`.
///
/// ```
/// use ctxwin_std::store::RecordQuery;
/// let query = RecordQuery::new("checkpoint", 10).prefix("ns\u{1f}").before("ns\u{1f}0005").descending();
/// assert_eq!((query.limit, query.descending), (10, true));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RecordQuery<'a> {
    /// The collection listed.
    pub collection: &'a str,
    /// Only keys starting with it (`""`: every key).
    pub prefix: &'a str,
    /// Only keys greater than it.
    pub after: Option<&'a str>,
    /// Only keys less than it.
    pub before: Option<&'a str>,
    /// Greatest key first.
    pub descending: bool,
    /// Only records whose fields hold each of these with an equal JSON value (numbers equal
    /// by value); a record without fields matches only an empty filter.
    pub fields: Option<&'a Fields>,
    /// At most this many records (after matching the fields).
    pub limit: usize,
}

impl<'a> RecordQuery<'a> {
    /// At most `limit` records of `collection`, in ascending key order.
    pub fn new(collection: &'a str, limit: usize) -> Self {
        Self {
            collection,
            prefix: "",
            after: None,
            before: None,
            descending: false,
            fields: None,
            limit,
        }
    }

    /// Only keys starting with `prefix`.
    #[must_use]
    pub fn prefix(mut self, prefix: &'a str) -> Self {
        self.prefix = prefix;
        self
    }

    /// Only keys greater than `key` (the next page of an ascending listing).
    #[must_use]
    pub fn after(mut self, key: &'a str) -> Self {
        self.after = Some(key);
        self
    }

    /// Only keys less than `key` (the next page of a descending listing).
    #[must_use]
    pub fn before(mut self, key: &'a str) -> Self {
        self.before = Some(key);
        self
    }

    /// Greatest key first.
    #[must_use]
    pub fn descending(mut self) -> Self {
        self.descending = true;
        self
    }

    /// Only records whose fields match `fields` (none: every record).
    #[must_use]
    pub fn matching(mut self, fields: Option<&'a Fields>) -> Self {
        self.fields = fields;
        self
    }

    /// Whether `key` is within the query's prefix and bounds.
    pub(crate) fn holds_key(&self, key: &str) -> bool {
        key.starts_with(self.prefix)
            && self.after.is_none_or(|after| key > after)
            && self.before.is_none_or(|before| key < before)
    }

    /// Whether a record with `fields` matches the query's fields.
    pub(crate) fn holds_fields(&self, fields: Option<&Fields>) -> bool {
        let Some(wanted) = self.fields else { return true };
        if wanted.is_empty() {
            return true;
        }
        let Some(fields) = fields else { return false };
        wanted
            .iter()
            .all(|(name, value)| fields.get(name).is_some_and(|found| json_equal(found, value)))
    }
}

/// The least byte string greater than every string starting with `prefix`; `None` when there
/// is none (an empty prefix, or one of `0xFF` bytes only). Adapters turn a prefix into a range
/// of their key index: `prefix <= key < prefix_end(prefix)`.
///
/// ```
/// use ctxwin_std::store::records::prefix_end;
/// assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
/// assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
/// assert_eq!(prefix_end(b""), None);
/// ```
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// JSON equality with numbers compared by value (`1` equals `1.0`), as PostgreSQL's `jsonb`
/// compares them.
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(name, value)| y.get(name).is_some_and(|other| json_equal(value, other)))
        }
        _ => a == b,
    }
}

/// The keyed-record port (see the [module](self) documentation). Object-safe; adapters are
/// shared between threads as `Arc<dyn RecordStore>`.
///
/// **The contract every adapter keeps** (checked by `conformance::records`): the scope is
/// part of every key and query; [`apply`](Self::apply) is all or none; keys order by their
/// UTF-8 bytes; a record whose checksum fails is reported as [`StoreError::Damaged`].
pub trait RecordStore: Send + Sync + fmt::Debug {
    /// Applies `writes` to `scope`'s records in order, all or none.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a write naming no collection (nothing written); the
    /// backend's errors (nothing written).
    fn apply(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Result<(), StoreError>;

    /// The records of `collection` under `keys` that exist, in ascending key order.
    ///
    /// # Errors
    /// [`StoreError::Damaged`] for a record that fails its checksum; backend errors.
    fn get(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, StoreError>;

    /// The records `query` selects.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn list(&self, scope: &Scope, query: &RecordQuery<'_>) -> Result<Vec<Record>, StoreError>;

    /// Removes every record of `scope` (every collection); how many there were.
    ///
    /// # Errors
    /// Backend errors (nothing removed).
    fn delete_namespace(&self, scope: &Scope) -> Result<u64, StoreError>;

    /// The namespaces of `tenant` holding records, ascending, greater than `after` (`None`:
    /// from the first), at most `limit`.
    ///
    /// # Errors
    /// Backend errors.
    fn namespaces(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_are_equal_by_value_and_objects_key_by_key() {
        assert!(json_equal(&json!(1), &json!(1.0)));
        assert!(!json_equal(&json!(1), &json!("1")));
        assert!(json_equal(&json!({"a": [1, {"b": 2.0}]}), &json!({"a": [1.0, {"b": 2}]})));
        assert!(!json_equal(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(json_equal(&json!(u64::MAX), &json!(u64::MAX)));
        assert!(!json_equal(&json!(-1), &json!(u64::MAX)));
    }

    #[test]
    fn a_query_bounds_keys_and_matches_fields() {
        let wanted = parse_fields(r#"{"source": "loop", "step": 3}"#).unwrap();
        let query = RecordQuery::new("c", 5)
            .prefix("a/")
            .after("a/1")
            .before("a/9")
            .matching(Some(&wanted));
        assert!(query.holds_key("a/5"));
        assert!(!query.holds_key("a/1") && !query.holds_key("a/9") && !query.holds_key("b/5"));
        let fields = parse_fields(r#"{"source": "loop", "step": 3.0, "other": null}"#).unwrap();
        assert!(query.holds_fields(Some(&fields)));
        assert!(!query.holds_fields(None));
        assert!(RecordQuery::new("c", 1).holds_fields(None));
    }
}
