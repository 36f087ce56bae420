//! SQLite's errors mapped onto [`StoreError`]: inside the adapter, [`Failure`] carries either,
//! so `?` works on both and no `rusqlite` type leaves the module.

use crate::store::StoreError;

/// An error inside the SQLite adapter (private: callers see [`StoreError`]).
#[derive(Debug)]
pub(super) struct Failure(pub(super) StoreError);

/// Results inside the adapter.
pub(super) type Sql<T> = Result<T, Failure>;

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

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Self(map(error))
    }
}

/// What the archive database file is called in errors.
const DATABASE: &str = "the archive database";

fn map(error: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    let detail = error.to_string();
    match &error {
        rusqlite::Error::SqliteFailure(failure, _) => match failure.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                StoreError::damaged(DATABASE, detail)
            }
            // SQLite's generic error on one of the adapter's fixed statements (no such
            // table, a schema that does not parse): the file is damaged or not ctxwin's.
            ErrorCode::Unknown => {
                StoreError::damaged(format!("{DATABASE} (damaged, or not ctxwin's)"), detail)
            }
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Busy { detail },
            ErrorCode::DiskFull => StoreError::Full { detail },
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::SystemIoFailure
            | ErrorCode::FileLockingProtocolFailed => StoreError::Io { detail, source: None },
            _ => StoreError::Backend { detail: format!("sqlite: {detail}") },
        },
        // One of the adapter's fixed statements that the file's schema does not fit (a
        // table or column name changed by damage): as `ErrorCode::Unknown` above.
        rusqlite::Error::SqlInputError { .. } => {
            StoreError::damaged(format!("{DATABASE} (damaged, or not ctxwin's)"), detail)
        }
        // A value of the wrong type or out of range in a row: written by another program,
        // or damaged.
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::Utf8Error(..) => {
            StoreError::damaged(format!("a row of {DATABASE}"), detail)
        }
        _ => StoreError::Backend { detail: format!("sqlite: {detail}") },
    }
}

/// A stored `i64` back as `u64`; negative values mean the row was not written by us.
pub(super) fn from_sql_int(what: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| {
        StoreError::damaged(format!("a row of {DATABASE}"), format!("negative {what} {value}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ErrorKind;

    #[test]
    fn sqlite_codes_map_to_kinds() {
        let failure = |code: i32| {
            rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some("x".into()))
        };
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_CORRUPT)).kind(), ErrorKind::Damaged);
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_NOTADB)).kind(), ErrorKind::Damaged);
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_ERROR)).kind(), ErrorKind::Damaged);
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_BUSY)).kind(), ErrorKind::Busy);
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_FULL)).kind(), ErrorKind::Full);
        assert_eq!(map(failure(rusqlite::ffi::SQLITE_CANTOPEN)).kind(), ErrorKind::Io);
        assert_eq!(from_sql_int("id", -1).unwrap_err().kind(), ErrorKind::Damaged);
    }

    #[test]
    fn a_statement_the_schema_does_not_fit_is_damage() {
        // A byte flipped in a column's name in the stored schema: the adapter's statement
        // names a column the file no longer has.
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE messages (pk INTEGER PRIMARY KEY, rolf TEXT)").unwrap();
        let error = conn.prepare("SELECT m.role FROM messages m").unwrap_err();
        assert_eq!(map(error).kind(), ErrorKind::Damaged);
    }
}
