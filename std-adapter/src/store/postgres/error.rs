//! PostgreSQL's and the pool's errors mapped onto [`StoreError`]: inside the adapter,
//! [`Failure`] carries either, so `?` works on both and no `postgres` type leaves the module.

use postgres::error::SqlState;

use crate::store::StoreError;

/// An error inside the PostgreSQL adapter (private: callers see [`StoreError`]).
#[derive(Debug)]
pub(super) struct Failure(pub(super) StoreError);

/// Results inside the adapter.
pub(super) type Pg<T> = Result<T, Failure>;

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Self(error)
    }
}

impl From<Failure> for StoreError {
    fn from(failure: Failure) -> Self {
        failure.0
    }
}

impl From<serde_json::Error> for Failure {
    fn from(error: serde_json::Error) -> Self {
        Self(StoreError::damaged("a stored row's tool calls", error.to_string()))
    }
}

impl From<postgres::Error> for Failure {
    fn from(error: postgres::Error) -> Self {
        Self(map(&error))
    }
}

impl From<r2d2::Error> for Failure {
    fn from(error: r2d2::Error) -> Self {
        Self(map_pool(&error.to_string()))
    }
}

/// What PostgreSQL's SQLSTATE `code` means to a caller of the ports.
fn kind_of(code: &SqlState) -> fn(String) -> StoreError {
    let busy = |detail| StoreError::Busy { detail };
    let io = |detail| StoreError::Io { detail, source: None };
    let full = |detail| StoreError::Full { detail };
    let invalid = |detail| StoreError::Invalid { detail };
    let damaged =
        |detail| StoreError::damaged("the PostgreSQL store (damaged, or not ctxwin's)", detail);
    let backend = |detail| StoreError::Backend { detail };
    match code.code() {
        // Another transaction holds what this one needs, past `lock_timeout`; a deadlock or a
        // serialization failure PostgreSQL resolved by aborting this one; the server is
        // starting or has no connection slot left: trying again later may work.
        "40001" | "40P01" | "55P03" | "57014" | "57P03" | "53300" => busy,
        "53100" => full,
        "57P01" | "57P02" => io,
        // A value PostgreSQL cannot hold (a number out of range, a text too long to index).
        "22003" | "22021" | "22P05" | "54000" => invalid,
        // A table or column of the adapter's own statements is missing or of another type,
        // or PostgreSQL found its own pages damaged.
        "42P01" | "42703" | "42804" | "XX001" | "XX002" => damaged,
        code if code.starts_with("08") => io,
        _ => backend,
    }
}

/// A [`StoreError`] for a `postgres` error.
fn map(error: &postgres::Error) -> StoreError {
    if let Some(db) = error.as_db_error() {
        let mut detail = format!("postgres {}: {}", db.code().code(), db.message());
        if let Some(more) = db.detail() {
            detail.push_str(&format!(" ({more})"));
        }
        return kind_of(db.code())(detail);
    }
    let detail = format!("postgres: {error}");
    if error.is_closed()
        || std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
    {
        return StoreError::Io { detail, source: None };
    }
    StoreError::Backend { detail }
}

/// A [`StoreError`] for the pool's error `text`: no connection within the timeout. With
/// a cause (the server refused, the password is wrong) it is the medium's failure; without one
/// every connection was busy.
pub(super) fn map_pool(text: &str) -> StoreError {
    let detail = format!("PostgreSQL connection pool: {text}");
    if text.trim_end() == "timed out waiting for connection" {
        StoreError::Busy { detail }
    } else {
        StoreError::Io { detail, source: None }
    }
}

/// A stored `i64` back as `u64`; negative values mean the row was not written by ctxwin.
pub(super) fn from_sql_int(what: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| {
        StoreError::damaged("a row of the PostgreSQL store", format!("negative {what} {value}"))
    })
}

/// Column `index` of `row` as a `T`: a type PostgreSQL did not give is a table that is not
/// ctxwin's (or damaged), not a bug to panic on.
pub(super) fn get<'a, T: postgres::types::FromSql<'a>>(
    row: &'a postgres::Row,
    index: usize,
) -> Pg<T> {
    row.try_get(index).map_err(|error| {
        Failure(StoreError::damaged(
            "a row of the PostgreSQL store",
            format!("column {index}: {error}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ErrorKind;

    #[test]
    fn sqlstates_map_to_kinds() {
        let kind = |code: &str| kind_of(&SqlState::from_code(code))(String::new()).kind();
        assert_eq!(kind("40P01"), ErrorKind::Busy);
        assert_eq!(kind("55P03"), ErrorKind::Busy);
        assert_eq!(kind("53100"), ErrorKind::Full);
        assert_eq!(kind("08006"), ErrorKind::Io);
        assert_eq!(kind("54000"), ErrorKind::Invalid);
        assert_eq!(kind("42P01"), ErrorKind::Damaged);
        assert_eq!(kind("23505"), ErrorKind::Backend);
        assert_eq!(map_pool("timed out waiting for connection").kind(), ErrorKind::Busy);
        assert_eq!(
            map_pool("timed out waiting for connection: connection refused").kind(),
            ErrorKind::Io
        );
        assert_eq!(from_sql_int("id", -1).unwrap_err().kind(), ErrorKind::Damaged);
    }
}
