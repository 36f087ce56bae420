//! The archive's integrity: SQLite's checks on open, its identity, and the checksums of rows
//! written before they had any.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use super::error::{Failure, Sql};
use super::{MESSAGE_COLUMNS, SqliteArchive};
use crate::store::{Scope, StoreError, checksum};

/// Archives up to this size get SQLite's `PRAGMA quick_check` when a process first opens them
/// (a few milliseconds per megabyte); larger ones are checked by [`SqliteArchive::quick_check`] on
/// demand. Later opens of the same file by the same process check the header only.
pub const QUICK_CHECK_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Archives up to this size get the full `PRAGMA integrity_check` instead, which also checks
/// every index against its table.
const INTEGRITY_CHECK_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Checks the 100-byte SQLite header of an archive file that exists and is not empty, then,
/// when `deep`, runs the quick check when the file is small enough.
pub(super) fn check_file(conn: &Connection, path: &Path, deep: bool) -> Sql<()> {
    let size = std::fs::metadata(path).map(|meta| meta.len()).unwrap_or(0);
    if size == 0 {
        return Ok(());
    }
    let mut header = [0u8; 100];
    let read = std::fs::File::open(path).and_then(|mut file| {
        use std::io::Read;
        file.read_exact(&mut header)
    });
    match read {
        Ok(()) => check_header(&header)
            .map_err(|what| damaged(path, format!("the SQLite file header is damaged: {what}")))?,
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(damaged(path, format!("{size} bytes, shorter than a SQLite header")));
        }
        Err(error) => return Err(Failure(StoreError::io("read the header of", path, error))),
    }
    if !deep {
        Ok(())
    } else if size <= INTEGRITY_CHECK_MAX_BYTES {
        check(conn, "integrity_check", path)
    } else if size <= QUICK_CHECK_MAX_BYTES {
        check(conn, "quick_check", path)
    } else {
        Ok(())
    }
}

/// The fields of a SQLite database header (sqlite.org/fileformat.html, 1.3) that a file
/// ctxwin created always has: any other value is damage.
fn check_header(header: &[u8; 100]) -> Result<(), String> {
    let u16_at = |at: usize| u16::from_be_bytes([header[at], header[at + 1]]);
    let u32_at = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if &header[..16] != b"SQLite format 3\0" {
        return Err("bad magic".into());
    }
    let page = u16_at(16);
    if !(page == 1 || (page >= 512 && page.is_power_of_two())) {
        return Err(format!("page size {page}"));
    }
    if !matches!(header[18], 1 | 2) || !matches!(header[19], 1 | 2) {
        return Err(format!("file format versions {} / {}", header[18], header[19]));
    }
    if header[20] != 0 {
        return Err(format!("{} reserved bytes per page", header[20]));
    }
    if header[21..24] != [64, 32, 32] {
        return Err(format!("payload fractions {:?}", &header[21..24]));
    }
    // 0 (schema format, text encoding) is an empty database: the main file of a new database
    // in WAL mode says so until the WAL's pages (the tables) are checkpointed into it, while
    // another handle has it open.
    if u32_at(44) > 4 {
        return Err(format!("schema format {}", u32_at(44)));
    }
    if u32_at(56) > 1 {
        return Err(format!("text encoding {} (ctxwin writes UTF-8)", u32_at(56)));
    }
    if u32_at(52) != 0 || u32_at(64) != 0 {
        return Err("auto-vacuum flags set".into());
    }
    if u32_at(68) != 0 || header[72..92].iter().any(|&b| b != 0) {
        return Err("application id or reserved bytes set".into());
    }
    Ok(())
}

/// The damage of the archive file at `path`.
fn damaged(path: &Path, detail: String) -> Failure {
    Failure(StoreError::damaged(format!("archive file {}", path.display()), detail))
}

fn check(conn: &Connection, pragma: &str, path: &Path) -> Sql<()> {
    let mut stmt = conn.prepare(&format!("PRAGMA {pragma}"))?;
    let findings: Vec<String> =
        stmt.query_map([], |row| row.get(0))?.collect::<Result<_, rusqlite::Error>>()?;
    match findings.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        _ => Err(damaged(
            path,
            format!(
                "SQLite's {pragma} failed: {}",
                findings.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
            ),
        )),
    }
}

/// Gives a new archive its identity (once; an existing one keeps its own).
pub(super) fn ensure_identity(conn: &Connection) -> Sql<()> {
    conn.execute(
        "INSERT INTO archive_meta (key, value) VALUES ('identity', ?1) ON CONFLICT (key) DO NOTHING",
        [crate::store::new_identity()],
    )?;
    Ok(())
}

impl SqliteArchive {
    /// Runs SQLite's `PRAGMA quick_check` (structure, not values: rows are checked by their
    /// checksums as they are read).
    ///
    /// # Errors
    /// [`StoreError::Damaged`] naming the first problems found.
    ///
    /// ```
    /// ctxwin_std::store::sqlite::SqliteArchive::open_in_memory()?.quick_check()?;
    /// # Ok::<(), ctxwin_std::store::StoreError>(())
    /// ```
    pub fn quick_check(&self) -> Result<(), StoreError> {
        let path = self.conn().path().unwrap_or_default().to_string();
        Ok(check(&self.conn(), "quick_check", Path::new(&path))?)
    }
}

/// The archive's identity (see [`ArchiveStore::identity`](crate::store::ArchiveStore::identity)).
pub(super) fn identity(conn: &Connection) -> Sql<String> {
    conn.query_row("SELECT value FROM archive_meta WHERE key = 'identity'", [], |row| row.get(0))
        .optional()?
        .ok_or_else(|| Failure(StoreError::damaged("the archive database", "it has no identity")))
}

/// Computes the checksums of rows written before schema version 5 (inside its migration's
/// transaction). A row that does not decode keeps none: it is reported damaged when read.
pub(super) fn backfill_checksums(conn: &Connection) -> Sql<()> {
    let mut select = conn.prepare(&format!(
        "SELECT {MESSAGE_COLUMNS}, s.tenant, s.name, m.pk
         FROM messages m JOIN sessions s ON s.id = m.session_id"
    ))?;
    let mut update = conn.prepare("UPDATE messages SET checksum = ?2 WHERE pk = ?1")?;
    let mut rows = select.query([])?;
    let mut done = 0_u64;
    while let Some(row) = rows.next()? {
        let scope = Scope::new(row.get::<_, String>(14)?, row.get::<_, String>(15)?);
        let pk: i64 = row.get(16)?;
        if let Ok(message) = super::decode_unverified(&scope, row) {
            update.execute([pk, checksum::message(&scope, &message) as i64])?;
            done += 1;
        }
    }
    drop(rows);
    let summaries = super::summaries::backfill(conn)?;
    let vectors = super::vectors::backfill(conn)?;
    tracing::info!(messages = done, summaries, vectors, "archive: checksums computed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_opens_again_before_its_wal_is_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive.db");
        let first = crate::store::sqlite::SqliteArchive::open(&path).unwrap();
        let mut header = [0u8; 100];
        std::io::Read::read_exact(&mut std::fs::File::open(&path).unwrap(), &mut header).unwrap();
        assert_eq!(header[44..48], [0, 0, 0, 0], "the tables are still in the WAL");
        let second = crate::store::sqlite::SqliteArchive::open(&path).unwrap();
        assert_eq!(second.schema_version().unwrap(), first.schema_version().unwrap());
    }

    #[test]
    fn a_file_keeps_its_identity_and_damage_is_caught() {
        use crate::store::ArchiveStore;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let first = SqliteArchive::open(&path).unwrap().identity().unwrap();
        assert_eq!(SqliteArchive::open(&path).unwrap().identity().unwrap(), first);
        let other = SqliteArchive::open(dir.path().join("b.db")).unwrap().identity().unwrap();
        assert_ne!(first, other);
        SqliteArchive::open(&path).unwrap().quick_check().unwrap();
    }
}
