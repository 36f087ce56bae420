//! Tests against a real server: a fresh schema of the database `CTXWIN_PG_URL` names for
//! each test (so runs and tests never see each other's rows), dropped afterwards.
//! `scripts/pg-server.sh start` prints such a URL. Without the variable a test says it
//! skipped and passes.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{PgOptions, PgStore};
use crate::store::StoreError;

/// The variable naming the test server.
pub const URL_VAR: &str = "CTXWIN_PG_URL";

/// A schema of its own on the test server, dropped (with everything in it) on drop.
#[derive(Debug)]
pub struct TestSchema {
    base: String,
    name: String,
    url: String,
}

impl TestSchema {
    /// A new empty schema for `test`; `None`, after saying so on standard error, when
    /// [`URL_VAR`] is not set.
    ///
    /// # Errors
    /// When the server cannot be reached or the schema cannot be made.
    pub fn new(test: &str) -> Option<Result<Self, StoreError>> {
        let Ok(base) = std::env::var(URL_VAR) else {
            eprintln!(
                "skipped {test}: {URL_VAR} is not set (scripts/pg-server.sh start prints one)"
            );
            return None;
        };
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let label: String = test
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(30)
            .collect();
        let name = format!(
            "t_{label}_{}_{}_{nanos}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{name}");
        let schema = Self { base, name, url };
        Some(schema.execute(&format!("CREATE SCHEMA {}", schema.name)).map(|()| schema))
    }

    /// The URL of the schema (its `search_path` set by the connection's options).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A store on the schema with default options.
    ///
    /// # Errors
    /// As [`PgStore::open`].
    pub fn open(&self) -> Result<PgStore, StoreError> {
        PgStore::open(&self.url)
    }

    /// A store on the schema with `options`.
    ///
    /// # Errors
    /// As [`PgStore::open_with`].
    pub fn open_with(&self, options: PgOptions) -> Result<PgStore, StoreError> {
        PgStore::open_with(&self.url, options)
    }

    /// A plain connection to the schema, for what a test checks behind the store's back.
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub fn client(&self) -> Result<postgres::Client, StoreError> {
        postgres::Client::connect(&self.url, postgres::NoTls)
            .map_err(|error| StoreError::Io { detail: error.to_string(), source: None })
    }

    fn execute(&self, sql: &str) -> Result<(), StoreError> {
        let mut client = postgres::Client::connect(&self.base, postgres::NoTls)
            .map_err(|error| StoreError::Io { detail: error.to_string(), source: None })?;
        client.batch_execute(sql).map_err(|error| StoreError::Backend { detail: error.to_string() })
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        if let Err(error) = self.execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name)) {
            eprintln!("could not drop test schema {}: {error}", self.name);
        }
    }
}
