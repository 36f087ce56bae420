//! [`MemoryRecords`]: the record port in memory (tests, short runs, `":memory:"` in the
//! Python package), and the plainest statement of its contract.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Record, RecordQuery, RecordStore, RecordWrite, parse_fields, validate};
use crate::store::{Scope, StoreError, checksum};

/// A record as held: its value, its fields' JSON text and the checksum of both.
#[derive(Clone, Debug)]
struct Held {
    value: Vec<u8>,
    fields: Option<String>,
    checksum: u64,
}

/// Records by scope, then by (collection, key).
type Namespaces = BTreeMap<Scope, BTreeMap<(String, String), Held>>;

/// The record port in memory: scoped maps, checksums verified on every read.
///
/// ```
/// use ctxwin_std::store::{MemoryRecords, Record, RecordStore, RecordWrite, Scope};
/// let store = MemoryRecords::new();
/// let s = Scope::local("thread");
/// let record = Record::new("element", "h1", b"first".to_vec());
/// store.apply(&s, &[RecordWrite::Insert(&record)])?;
/// let again = Record::new("element", "h1", b"second".to_vec());
/// store.apply(&s, &[RecordWrite::Insert(&again)])?;
/// assert_eq!(store.get(&s, "element", &["h1"])?[0].value, b"first", "an insert keeps the first");
/// # Ok::<(), ctxwin_std::store::StoreError>(())
/// ```
#[derive(Default)]
pub struct MemoryRecords {
    namespaces: Mutex<Namespaces>,
}

impl std::fmt::Debug for MemoryRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRecords")
            .field("namespaces", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl MemoryRecords {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Namespaces> {
        self.namespaces.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes a byte of the value of record `collection`/`key` of `scope` without its
    /// checksum, as bit rot would (the conformance suite's damage check). Whether there was
    /// such a record with a value.
    #[doc(hidden)]
    pub fn damage_record_for_tests(&self, scope: &Scope, collection: &str, key: &str) -> bool {
        let mut namespaces = self.lock();
        let held = namespaces
            .get_mut(scope)
            .and_then(|records| records.get_mut(&(collection.to_string(), key.to_string())));
        match held.and_then(|held| held.value.first_mut()) {
            Some(byte) => {
                *byte ^= 0x20;
                true
            }
            None => false,
        }
    }
}

fn held(scope: &Scope, record: &Record) -> Held {
    Held {
        value: record.value.clone(),
        fields: record.fields_text(),
        checksum: checksum::record(scope, record),
    }
}

/// `held` as a record, after verifying its checksum.
fn served(scope: &Scope, collection: &str, key: &str, held: &Held) -> Result<Record, StoreError> {
    let computed =
        checksum::record_parts(scope, collection, key, &held.value, held.fields.as_deref());
    if computed != held.checksum {
        return Err(checksum::mismatch(
            Record::name(scope, collection, key),
            held.checksum,
            computed,
        ));
    }
    let fields = held.fields.as_deref().map(parse_fields).transpose().map_err(|error| {
        StoreError::damaged(Record::name(scope, collection, key), error.to_string())
    })?;
    Ok(Record { collection: collection.into(), key: key.into(), value: held.value.clone(), fields })
}

impl RecordStore for MemoryRecords {
    fn apply(&self, scope: &Scope, writes: &[RecordWrite<'_>]) -> Result<(), StoreError> {
        validate(writes)?;
        let mut namespaces = self.lock();
        let records = namespaces.entry(scope.clone()).or_default();
        for write in writes {
            match write {
                RecordWrite::Put(record) => {
                    records.insert(
                        (record.collection.clone(), record.key.clone()),
                        held(scope, record),
                    );
                }
                RecordWrite::Insert(record) => {
                    records
                        .entry((record.collection.clone(), record.key.clone()))
                        .or_insert_with(|| held(scope, record));
                }
                RecordWrite::Delete { collection, key } => {
                    records.remove(&((*collection).to_string(), (*key).to_string()));
                }
                RecordWrite::DeletePrefix { collection, prefix } => {
                    records.retain(|(c, k), _| c != collection || !k.starts_with(prefix));
                }
            }
        }
        if records.is_empty() {
            namespaces.remove(scope);
        }
        Ok(())
    }

    fn get(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, StoreError> {
        let namespaces = self.lock();
        let Some(records) = namespaces.get(scope) else { return Ok(Vec::new()) };
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter_map(|key| {
                records
                    .get(&(collection.to_string(), key.to_string()))
                    .map(|held| served(scope, collection, key, held))
            })
            .collect()
    }

    fn list(&self, scope: &Scope, query: &RecordQuery<'_>) -> Result<Vec<Record>, StoreError> {
        let namespaces = self.lock();
        let Some(records) = namespaces.get(scope) else { return Ok(Vec::new()) };
        let start = (query.collection.to_string(), query.prefix.to_string());
        let in_collection = records
            .range(start..)
            .take_while(|((c, k), _)| c == query.collection && k.starts_with(query.prefix));
        let selected: Vec<_> = in_collection.filter(|((_, key), _)| query.holds_key(key)).collect();
        let ordered: Box<dyn Iterator<Item = _>> = if query.descending {
            Box::new(selected.into_iter().rev())
        } else {
            Box::new(selected.into_iter())
        };
        let mut out = Vec::new();
        for ((collection, key), held) in ordered {
            if out.len() >= query.limit {
                break;
            }
            let record = served(scope, collection, key, held)?;
            if query.holds_fields(record.fields.as_ref()) {
                out.push(record);
            }
        }
        Ok(out)
    }

    fn delete_namespace(&self, scope: &Scope) -> Result<u64, StoreError> {
        Ok(self.lock().remove(scope).map_or(0, |records| records.len() as u64))
    }

    fn namespaces(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let namespaces = self.lock();
        let start = Scope::new(tenant, after.unwrap_or_default());
        Ok(namespaces
            .range(start..)
            .map(|(scope, _)| scope)
            .take_while(|scope| scope.tenant == tenant)
            .filter(|scope| after.is_none_or(|after| scope.conversation.as_str() > after))
            .take(limit)
            .map(|scope| scope.conversation.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    #[test]
    fn passes_the_record_conformance_suite() {
        conformance::records(&|| std::sync::Arc::new(MemoryRecords::new()));
    }

    #[test]
    fn damage_is_reported_not_served() {
        let store = MemoryRecords::new();
        let damage = |scope: &Scope, collection: &str, key: &str| {
            store.damage_record_for_tests(scope, collection, key)
        };
        conformance::damaged_record(&store, &damage);
    }
}
