//! A pooled connection as the adapter uses it: statements sent through it are counted
//! ([`statement_counts`]), and kept prepared on the connection when the store's
//! [`PgOptions::prepared_statements`](super::PgOptions::prepared_statements) says so.
//!
//! A statement sent unnamed is parsed and planned by the server every time: for the short
//! statements a request makes (a lease check, a row upsert) that is most of their server
//! time. Prepared once per connection, each later use is a bind and an execute. A
//! transaction-mode pooler (PgBouncer before 1.21, or with `max_prepared_statements = 0`)
//! hands each transaction another server connection, where the prepared statement does not
//! exist: turn them off there (the statements are then sent unnamed, as before).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use postgres::types::{ToSql, Type};
use postgres::{Row, SimpleQueryMessage, Statement};

use super::Pooled;

/// Statements kept prepared per connection at most: past them, a statement not kept is
/// sent unnamed (statements built with varying text do not fill the server's memory).
const KEPT: usize = 128;

/// What the adapter sent to the server, process-wide, since the process started.
///
/// ```
/// let counts = ctxwin_std::store::postgres::statement_counts();
/// assert!(counts.round_trips >= counts.transactions);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatementCounts {
    /// Transactions (explicit ones, and statements run on their own, each its own).
    pub transactions: u64,
    /// Round trips to the server (a prepare and its first execution are two).
    pub round_trips: u64,
    /// Statements prepared (once per connection and statement).
    pub prepared: u64,
    /// Statements by kind (their verb and first table, e.g. `INSERT messages`; `BEGIN`,
    /// `COMMIT`), in name order.
    pub by_kind: Vec<(String, u64)>,
}

static TRANSACTIONS: AtomicU64 = AtomicU64::new(0);
static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);
static PREPARED: AtomicU64 = AtomicU64::new(0);
static KINDS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// What this process's PostgreSQL stores sent to their servers so far (for a proxy's
/// `/metrics`, and measurements).
pub fn statement_counts() -> StatementCounts {
    let kinds = KINDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    StatementCounts {
        transactions: TRANSACTIONS.load(Ordering::Relaxed),
        round_trips: ROUND_TRIPS.load(Ordering::Relaxed),
        prepared: PREPARED.load(Ordering::Relaxed),
        by_kind: kinds.iter().map(|(kind, n)| (kind.clone(), *n)).collect(),
    }
}

/// `sql`'s verb and the table it names first (`SELECT conversations`), or its verb alone.
fn kind_of(sql: &str) -> String {
    let mut words = sql
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | ','))
        .filter(|w| !w.is_empty());
    let verb = words.next().unwrap_or("").to_ascii_uppercase();
    let after = match verb.as_str() {
        "SELECT" | "DELETE" | "WITH" => "FROM",
        "INSERT" => "INTO",
        "UPDATE" => "",
        _ => return verb,
    };
    let mut table = None;
    let mut armed = after.is_empty();
    for word in words {
        if armed {
            table = Some(word);
            break;
        }
        armed = word.eq_ignore_ascii_case(after);
    }
    match table {
        Some(table) => format!("{verb} {table}"),
        None => verb,
    }
}

fn note(sql: &str, round_trips: u64) {
    ROUND_TRIPS.fetch_add(round_trips, Ordering::Relaxed);
    let mut kinds = KINDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *kinds.entry(kind_of(sql)).or_insert(0) += 1;
}

/// Counts a transaction (a `BEGIN`, or a statement run on its own).
pub(super) fn note_transaction() {
    TRANSACTIONS.fetch_add(1, Ordering::Relaxed);
}

/// The statements kept prepared on one connection (in its pool extensions).
#[derive(Default)]
struct Kept(HashMap<String, Statement>);

/// A pooled connection: counts what it sends, prepares what it may keep.
pub(super) struct Conn {
    pooled: Pooled,
    prepare: bool,
    /// Inside an explicit transaction (its statements are not counted as transactions).
    pub(super) in_transaction: bool,
}

impl Conn {
    pub(super) fn new(pooled: Pooled, prepare: bool) -> Self {
        Self { pooled, prepare, in_transaction: false }
    }

    /// Runs `sql` with `params` (of the given types); prepared and kept on this connection
    /// when the store prepares statements, sent unnamed otherwise.
    pub(super) fn query_typed(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, postgres::Error> {
        if !self.in_transaction {
            note_transaction();
        }
        let Some(statement) = self.statement(sql, params)? else {
            note(sql, 1);
            return self.pooled.query_typed(sql, params);
        };
        note(sql, 1);
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
        self.pooled.query(&statement, &values)
    }

    /// As [`query_typed`](Self::query_typed), for exactly one row.
    pub(super) fn query_typed_one(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Row, postgres::Error> {
        if !self.in_transaction {
            note_transaction();
        }
        let Some(statement) = self.statement(sql, params)? else {
            note(sql, 1);
            return self.pooled.query_typed_one(sql, params);
        };
        note(sql, 1);
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
        self.pooled.query_one(&statement, &values)
    }

    /// The statement kept for `sql`, prepared now when it is not yet and there is room;
    /// `None` when statements are sent unnamed.
    fn statement(
        &mut self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<Statement>, postgres::Error> {
        if !self.prepare {
            return Ok(None);
        }
        let kept = r2d2::PooledConnection::extensions(&self.pooled).get::<Kept>();
        if let Some(statement) = kept.and_then(|kept| kept.0.get(sql)) {
            return Ok(Some(statement.clone()));
        }
        if kept.is_some_and(|kept| kept.0.len() >= KEPT) {
            return Ok(None);
        }
        let types: Vec<Type> = params.iter().map(|(_, ty)| ty.clone()).collect();
        let statement = self.pooled.prepare_typed(sql, &types)?;
        ROUND_TRIPS.fetch_add(1, Ordering::Relaxed);
        PREPARED.fetch_add(1, Ordering::Relaxed);
        let extensions = r2d2::PooledConnection::extensions_mut(&mut self.pooled);
        if extensions.get::<Kept>().is_none() {
            extensions.insert(Kept::default());
        }
        if let Some(kept) = extensions.get_mut::<Kept>() {
            kept.0.insert(sql.to_owned(), statement.clone());
        }
        Ok(Some(statement))
    }

    /// Runs `sql`, statements separated by `;`, in one round trip (the simple protocol).
    pub(super) fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
        note(sql, 1);
        self.pooled.batch_execute(sql)
    }

    /// As [`batch_execute`](Self::batch_execute), with the rows as text.
    pub(super) fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<SimpleQueryMessage>, postgres::Error> {
        note(sql, 1);
        self.pooled.simple_query(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::kind_of;

    #[test]
    fn a_statement_is_named_by_its_verb_and_first_table() {
        assert_eq!(kind_of("SELECT id, fence FROM conversations WHERE x"), "SELECT conversations");
        assert_eq!(kind_of("\n  INSERT INTO messages (a) VALUES ($1)"), "INSERT messages");
        assert_eq!(kind_of("UPDATE conversations SET fence = 1"), "UPDATE conversations");
        assert_eq!(kind_of("BEGIN; SET LOCAL lock_timeout = 5"), "BEGIN");
        assert_eq!(kind_of("COMMIT"), "COMMIT");
        assert_eq!(kind_of("WITH r AS (UPDATE t SET a = 1) SELECT (SELECT a FROM r), 1"), "WITH r");
    }
}
