//! The record port's conformance suite (`store::conformance::records`): what
//! [`RecordStore`] promises, checked the same way on every adapter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::json;

use super::{Record, RecordQuery, RecordStore, RecordWrite};
use crate::store::{ErrorKind, Scope};

/// One check.
type Check = fn(&dyn RecordStore);

/// Runs every record check, each on a fresh store from `open`.
///
/// ```
/// use std::sync::Arc;
/// use ctxwin_std::store::{MemoryRecords, conformance};
/// conformance::records(&|| Arc::new(MemoryRecords::new()));
/// ```
pub fn records<S: RecordStore + ?Sized>(open: &dyn Fn() -> Arc<S>) {
    let checks: [(&str, Check); 7] = [
        ("round trip", round_trip),
        ("all or nothing", all_or_nothing),
        ("scoping", scoping),
        ("listing", listing),
        ("fields", fields),
        ("deleting", deleting),
        ("any text", any_text),
    ];
    for (name, check) in checks {
        let store = open();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&Records(store.as_ref()));
        }));
        if let Err(panic) = result {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("record conformance check {name:?} failed: {what}");
        }
    }
}

/// A `?Sized` store as a `dyn RecordStore`.
#[derive(Debug)]
struct Records<'a, S: RecordStore + ?Sized>(&'a S);

impl<S: RecordStore + ?Sized> RecordStore for Records<'_, S> {
    fn apply(
        &self,
        scope: &Scope,
        writes: &[RecordWrite<'_>],
    ) -> Result<(), crate::store::StoreError> {
        self.0.apply(scope, writes)
    }
    fn get(
        &self,
        scope: &Scope,
        collection: &str,
        keys: &[&str],
    ) -> Result<Vec<Record>, crate::store::StoreError> {
        self.0.get(scope, collection, keys)
    }
    fn list(
        &self,
        scope: &Scope,
        query: &RecordQuery<'_>,
    ) -> Result<Vec<Record>, crate::store::StoreError> {
        self.0.list(scope, query)
    }
    fn delete_namespace(&self, scope: &Scope) -> Result<u64, crate::store::StoreError> {
        self.0.delete_namespace(scope)
    }
    fn namespaces(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        self.0.namespaces(tenant, after, limit)
    }
}

fn record(collection: &str, key: &str, value: &str) -> Record {
    Record::new(collection, key, value.as_bytes().to_vec())
}

fn keys(records: &[Record]) -> Vec<&str> {
    records.iter().map(|record| record.key.as_str()).collect()
}

fn put_all(store: &dyn RecordStore, scope: &Scope, records: &[Record]) {
    let writes: Vec<_> = records.iter().map(RecordWrite::Put).collect();
    store.apply(scope, &writes).unwrap();
}

fn round_trip(store: &dyn RecordStore) {
    let s = Scope::new("t", "thread");
    let a = record("c", "a", "first").with_fields(r#"{"step": 1, "source": "input"}"#).unwrap();
    let binary = Record::new("c", "b", vec![0, 255, 1, 0]);
    store.apply(&s, &[RecordWrite::Put(&a), RecordWrite::Put(&binary)]).unwrap();
    assert_eq!(store.get(&s, "c", &["b", "a", "missing"]).unwrap(), [a.clone(), binary.clone()]);
    assert!(store.get(&s, "other collection", &["a"]).unwrap().is_empty());
    // A put replaces; an insert keeps what is there and adds what is not.
    let replaced = record("c", "a", "second");
    store.apply(&s, &[RecordWrite::Put(&replaced)]).unwrap();
    let found = store.get(&s, "c", &["a"]).unwrap();
    assert_eq!(found, std::slice::from_ref(&replaced), "fields go with the value");
    let kept = record("c", "a", "third");
    let new = record("c", "n", "new");
    store.apply(&s, &[RecordWrite::Insert(&kept), RecordWrite::Insert(&new)]).unwrap();
    assert_eq!(store.get(&s, "c", &["a", "n"]).unwrap(), [replaced, new]);
    // Later writes of one call see the earlier ones.
    let once = record("c", "x", "once");
    let twice = record("c", "x", "twice");
    store.apply(&s, &[RecordWrite::Put(&once), RecordWrite::Insert(&twice)]).unwrap();
    assert_eq!(store.get(&s, "c", &["x"]).unwrap()[0].value, b"once");
    let empty = Record::new("c", "", Vec::new());
    store.apply(&s, &[RecordWrite::Put(&empty)]).unwrap();
    assert_eq!(store.get(&s, "c", &[""]).unwrap(), [empty], "an empty key and value");
}

fn all_or_nothing(store: &dyn RecordStore) {
    let s = Scope::new("t", "thread");
    let good = record("c", "a", "value");
    let nameless = record("", "b", "value");
    let error =
        store.apply(&s, &[RecordWrite::Put(&good), RecordWrite::Put(&nameless)]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(store.get(&s, "c", &["a"]).unwrap().is_empty(), "a refused write stored something");
    assert!(store.namespaces("t", None, 10).unwrap().is_empty());
    store.apply(&s, &[]).unwrap();
}

fn scoping(store: &dyn RecordStore) {
    let mine = Scope::new("acme", "thread");
    let scopes =
        [Scope::new("other", "thread"), Scope::new("acme", "thread-2"), Scope::local("thread")];
    put_all(store, &mine, &[record("c", "k", "mine")]);
    for scope in &scopes {
        put_all(
            store,
            scope,
            &[record("c", "k", &format!("of {scope}")), record("c", "only-there", "x")],
        );
    }
    assert_eq!(store.get(&mine, "c", &["k", "only-there"]).unwrap(), [record("c", "k", "mine")]);
    assert_eq!(keys(&store.list(&mine, &RecordQuery::new("c", 10)).unwrap()), ["k"]);
    assert_eq!(store.namespaces("acme", None, 10).unwrap(), ["thread", "thread-2"]);
    assert_eq!(store.namespaces("acme", Some("thread"), 10).unwrap(), ["thread-2"]);
    assert_eq!(store.namespaces("acme", None, 1).unwrap(), ["thread"]);
    assert_eq!(store.namespaces("", None, 10).unwrap(), ["thread"]);
    assert!(store.namespaces("nobody", None, 10).unwrap().is_empty());
    // Deleting one namespace, or a prefix in it, leaves every other scope's records.
    store.apply(&mine, &[RecordWrite::DeletePrefix { collection: "c", prefix: "" }]).unwrap();
    assert_eq!(store.delete_namespace(&scopes[0]).unwrap(), 2);
    for scope in &scopes[1..] {
        assert_eq!(
            store.get(scope, "c", &["k"]).unwrap()[0].value,
            format!("of {scope}").as_bytes()
        );
    }
    assert_eq!(
        store.namespaces("acme", None, 10).unwrap(),
        ["thread-2"],
        "an emptied namespace is not listed"
    );
    assert!(store.namespaces("other", None, 10).unwrap().is_empty());
}

fn listing(store: &dyn RecordStore) {
    let s = Scope::local("thread");
    let names =
        ["", "ns", "ns\u{1f}01", "ns\u{1f}02", "ns\u{1f}03", "ns2\u{1f}01", "nt", "é", "\u{10348}"];
    put_all(store, &s, &names.map(|key| record("c", key, key)));
    put_all(store, &s, &[record("d", "ns\u{1f}00", "another collection")]);
    let list = |query: RecordQuery<'_>| -> Vec<String> {
        store.list(&s, &query).unwrap().into_iter().map(|r| r.key).collect()
    };
    // Keys order as their UTF-8 bytes: U+00E9 before U+10348.
    assert_eq!(list(RecordQuery::new("c", 100)), names);
    let mut reversed = names;
    reversed.reverse();
    assert_eq!(list(RecordQuery::new("c", 100).descending()), reversed);
    assert_eq!(
        list(RecordQuery::new("c", 100).prefix("ns\u{1f}")),
        ["ns\u{1f}01", "ns\u{1f}02", "ns\u{1f}03"]
    );
    assert_eq!(list(RecordQuery::new("c", 1).prefix("ns\u{1f}").descending()), ["ns\u{1f}03"]);
    assert_eq!(
        list(RecordQuery::new("c", 10).prefix("ns\u{1f}").before("ns\u{1f}03").descending()),
        ["ns\u{1f}02", "ns\u{1f}01"]
    );
    assert_eq!(
        list(RecordQuery::new("c", 10).prefix("ns\u{1f}").after("ns\u{1f}01")),
        ["ns\u{1f}02", "ns\u{1f}03"]
    );
    assert_eq!(
        list(RecordQuery::new("c", 10).after("ns").before("nt")),
        ["ns\u{1f}01", "ns\u{1f}02", "ns\u{1f}03", "ns2\u{1f}01"]
    );
    assert!(list(RecordQuery::new("c", 0)).is_empty());
    assert!(list(RecordQuery::new("c", 10).prefix("zz")).is_empty());
    assert_eq!(list(RecordQuery::new("d", 10)), ["ns\u{1f}00"]);
    // Paging through in both directions gives every key once.
    let mut paged: Vec<String> = Vec::new();
    loop {
        let after = paged.last().cloned();
        let mut query = RecordQuery::new("c", 2);
        if let Some(after) = &after {
            query = query.after(after);
        }
        let page = list(query);
        if page.is_empty() {
            break;
        }
        paged.extend(page);
    }
    assert_eq!(paged, names);
    let mut paged: Vec<String> = Vec::new();
    loop {
        let before = paged.last().cloned();
        let mut query = RecordQuery::new("c", 4).descending();
        if let Some(before) = &before {
            query = query.before(before);
        }
        let page = list(query);
        if page.is_empty() {
            break;
        }
        paged.extend(page);
    }
    assert_eq!(paged, reversed);
}

fn fields(store: &dyn RecordStore) {
    let s = Scope::local("thread");
    let with = |key: &str, fields: serde_json::Value| {
        record("c", key, key).with_fields(&fields.to_string()).unwrap()
    };
    put_all(
        store,
        &s,
        &[
            with("1", json!({"source": "input", "step": -1, "run_id": "r1"})),
            with(
                "2",
                json!({"source": "loop", "step": 0, "run_id": "r1", "writes": {"a": [1, 2]}}),
            ),
            with("3", json!({"source": "loop", "step": 1, "run_id": "r2", "score": 0.5})),
            with("4", json!({"source": "loop", "step": 2.0, "run_id": "r2", "parents": {}})),
            record("c", "5", "no fields"),
        ],
    );
    let matching = |filter: serde_json::Value, query: RecordQuery<'_>| -> Vec<String> {
        let filter = filter.as_object().cloned().unwrap();
        store.list(&s, &query.matching(Some(&filter))).unwrap().into_iter().map(|r| r.key).collect()
    };
    let all = RecordQuery::new("c", 10);
    assert_eq!(matching(json!({"source": "loop"}), all), ["2", "3", "4"]);
    assert_eq!(matching(json!({"source": "loop", "run_id": "r2"}), all), ["3", "4"]);
    assert_eq!(matching(json!({"step": 2}), all), ["4"], "numbers match by value");
    assert_eq!(matching(json!({"step": "2"}), all), Vec::<String>::new(), "a string is no number");
    assert_eq!(matching(json!({"score": 0.5}), all), ["3"]);
    assert_eq!(matching(json!({"writes": {"a": [1, 2]}}), all), ["2"], "nested values, whole");
    assert_eq!(
        matching(json!({"writes": {"a": [1]}}), all),
        Vec::<String>::new(),
        "equality, not containment"
    );
    assert_eq!(matching(json!({"parents": {}}), all), ["4"]);
    assert_eq!(
        matching(json!({"missing": null}), all),
        Vec::<String>::new(),
        "an absent field is not null"
    );
    assert_eq!(matching(json!({}), all), ["1", "2", "3", "4", "5"]);
    // The limit counts matching records, from the query's end.
    assert_eq!(
        matching(json!({"source": "loop"}), RecordQuery::new("c", 2).descending()),
        ["4", "3"]
    );
    assert_eq!(matching(json!({"run_id": "r1"}), RecordQuery::new("c", 1).after("1")), ["2"]);
}

fn deleting(store: &dyn RecordStore) {
    let s = Scope::local("thread");
    let keys_of = |collection: &str| -> Vec<String> {
        store
            .list(&s, &RecordQuery::new(collection, 100))
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect()
    };
    put_all(store, &s, &["a/1", "a/2", "ab/1", "b/1"].map(|key| record("c", key, "v")));
    put_all(store, &s, &[record("d", "a/1", "v")]);
    store
        .apply(
            &s,
            &[
                RecordWrite::Delete { collection: "c", key: "b/1" },
                RecordWrite::Delete { collection: "c", key: "absent" },
            ],
        )
        .unwrap();
    assert_eq!(keys_of("c"), ["a/1", "a/2", "ab/1"]);
    store.apply(&s, &[RecordWrite::DeletePrefix { collection: "c", prefix: "a/" }]).unwrap();
    assert_eq!(keys_of("c"), ["ab/1"]);
    assert_eq!(keys_of("d"), ["a/1"], "a prefix deletes in its collection only");
    // A delete then a put in one call: the put stays.
    let again = record("c", "a/1", "again");
    store
        .apply(
            &s,
            &[RecordWrite::DeletePrefix { collection: "c", prefix: "" }, RecordWrite::Put(&again)],
        )
        .unwrap();
    assert_eq!(keys_of("c"), ["a/1"]);
    assert_eq!(store.delete_namespace(&s).unwrap(), 2);
    assert!(keys_of("c").is_empty() && keys_of("d").is_empty());
    assert_eq!(store.delete_namespace(&s).unwrap(), 0);
}

fn any_text(store: &dyn RecordStore) {
    // NUL and U+FFFF in every name (PostgreSQL's text cannot hold U+0000 as such).
    let s = Scope::new("te\0nant\u{ffff}", "thr\0ead");
    let odd = record("col\0lection", "k\0e\u{ffff}y", "v")
        .with_fields(r#"{"a\u0000": "b\u0000"}"#)
        .unwrap();
    put_all(store, &s, std::slice::from_ref(&odd));
    let found = store.get(&s, "col\0lection", &["k\0e\u{ffff}y"]).unwrap();
    assert_eq!(found, std::slice::from_ref(&odd));
    assert_eq!(store.list(&s, &RecordQuery::new("col\0lection", 10).prefix("k\0")).unwrap(), [odd]);
    assert_eq!(store.namespaces("te\0nant\u{ffff}", None, 10).unwrap(), ["thr\0ead"]);
    assert!(store.namespaces("te", None, 10).unwrap().is_empty());
}

/// Damage to a stored record's value (by `damage(scope, collection, key)`, adapter-specific)
/// is reported as [`ErrorKind::Damaged`] by every read that would serve it, and its
/// neighbours are served.
pub fn damaged_record<S: RecordStore + ?Sized>(
    store: &S,
    damage: &dyn Fn(&Scope, &str, &str) -> bool,
) {
    let s = Scope::new("t", "damaged");
    put_all(
        &Records(store),
        &s,
        &[
            record("c", "a", "intact"),
            record("c", "b", "soon damaged"),
            record("c", "c", "intact too"),
        ],
    );
    assert!(damage(&s, "c", "b"), "the damage found no record");
    let kind = |result: Result<Vec<Record>, crate::store::StoreError>| result.unwrap_err().kind();
    assert_eq!(kind(store.get(&s, "c", &["b"])), ErrorKind::Damaged);
    assert_eq!(kind(store.list(&s, &RecordQuery::new("c", 10))), ErrorKind::Damaged);
    assert_eq!(store.get(&s, "c", &["a", "c"]).unwrap().len(), 2);
    assert_eq!(keys(&store.list(&s, &RecordQuery::new("c", 1)).unwrap()), ["a"]);
}
