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

    /// What the server spent on statements since the last call, from `pg_stat_statements`
    /// (which the server must preload; `None` otherwise or without [`URL_VAR`]), and a fresh
    /// count from here on: each statement's calls, execution time in ms, rows, and text,
    /// the most time first, summed over the schemas that ran it.
    pub fn statement_stats() -> Option<Vec<(i64, f64, i64, String)>> {
        let base = std::env::var(URL_VAR).ok()?;
        let mut client = postgres::Client::connect(&base, postgres::NoTls).ok()?;
        let rows = client
            .query(
                "SELECT sum(calls)::int8, sum(total_exec_time)::float8, sum(rows)::int8, query
                 FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND query NOT LIKE '%pg_stat_statements%'
                 GROUP BY query ORDER BY 2 DESC",
                &[],
            )
            .ok()?;
        client.batch_execute("SELECT pg_stat_statements_reset()").ok()?;
        Some(rows.iter().map(|row| (row.get(0), row.get(1), row.get(2), row.get(3))).collect())
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
