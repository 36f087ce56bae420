//! The archive's integrity: its identity, SQLite's quick check on open, the highest message id
//! it holds, and dropping what a rewound timeline left behind.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::error::{ArchiveError, from_sql_int, to_sql_int};
use super::{Archive, ArchivedMessage, MESSAGE_COLUMNS, collect_messages};

/// Archives up to this size get SQLite's `PRAGMA quick_check` when a process first opens them
/// (a few milliseconds per megabyte); larger ones are checked by [`Archive::quick_check`] on
/// demand. Later opens of the same file by the same process check the header only.
pub const QUICK_CHECK_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Archives up to this size get the full `PRAGMA integrity_check` instead, which also checks
/// every index against its table.
const INTEGRITY_CHECK_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Checks the 100-byte SQLite header of an archive file that exists and is not empty, then,
/// when `deep`, runs the quick check when the file is small enough.
pub(super) fn check_file(conn: &Connection, path: &Path, deep: bool) -> Result<(), ArchiveError> {
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
        Ok(()) => check_header(&header).map_err(|what| {
            ArchiveError::Corrupt(format!("the SQLite file header is damaged: {what}"))
        })?,
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(ArchiveError::Corrupt(format!(
                "the file is {size} bytes, shorter than a SQLite header"
            )));
        }
        Err(error) => {
            return Err(ArchiveError::Corrupt(format!("the file header cannot be read: {error}")));
        }
    }
    if !deep {
        Ok(())
    } else if size <= INTEGRITY_CHECK_MAX_BYTES {
        check(conn, "integrity_check")
    } else if size <= QUICK_CHECK_MAX_BYTES {
        check(conn, "quick_check")
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
    if !(1..=4).contains(&u32_at(44)) {
        return Err(format!("schema format {}", u32_at(44)));
    }
    if u32_at(56) != 1 {
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

fn check(conn: &Connection, pragma: &str) -> Result<(), ArchiveError> {
    let mut stmt = conn.prepare(&format!("PRAGMA {pragma}"))?;
    let findings: Vec<String> =
        stmt.query_map([], |row| row.get(0))?.collect::<Result<_, rusqlite::Error>>()?;
    match findings.as_slice() {
        [ok] if ok == "ok" => Ok(()),
        _ => Err(ArchiveError::Corrupt(format!(
            "SQLite's {pragma} failed: {}",
            findings.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        ))),
    }
}

/// Gives a new archive its identity (once; an existing one keeps its own).
pub(super) fn ensure_identity(conn: &Connection) -> Result<(), ArchiveError> {
    conn.execute(
        "INSERT INTO archive_meta (key, value) VALUES ('identity', ?1) ON CONFLICT (key) DO NOTHING",
        [new_identity()],
    )?;
    Ok(())
}

/// 128 random bits as hex, from the standard library's randomly seeded hasher.
fn new_identity() -> String {
    let half = |salt: u64| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.write_u32(std::process::id());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        hasher.write_u128(now.map_or(0, |elapsed| elapsed.as_nanos()));
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

impl Archive {
    /// The archive's identity: a random id written when the file was created, so that a
    /// checkpoint can tell its own archive from a swapped or recreated one.
    ///
    /// ```
    /// let a = ctxwin_std::archive::Archive::open_in_memory()?;
    /// let b = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(a.identity()?.len(), 32);
    /// assert_ne!(a.identity()?, b.identity()?);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    ///
    /// # Errors
    /// [`ArchiveError::Corrupt`] when the identity is missing.
    pub fn identity(&self) -> Result<String, ArchiveError> {
        self.conn()
            .query_row("SELECT value FROM archive_meta WHERE key = 'identity'", [], |row| {
                row.get(0)
            })
            .optional()?
            .ok_or_else(|| ArchiveError::Corrupt("the archive has no identity".into()))
    }

    /// Runs SQLite's `PRAGMA quick_check`.
    ///
    /// # Errors
    /// [`ArchiveError::Corrupt`] naming the first problems found.
    pub fn quick_check(&self) -> Result<(), ArchiveError> {
        check(&self.conn(), "quick_check")
    }

    /// The highest message id archived for `session`, if any.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// assert_eq!(archive.max_message_id("s")?, None);
    /// archive.store_unit("s", &[ArchivedMessage::new(7, 7, ChatMessage::text(Role::User, "x"))])?;
    /// assert_eq!(archive.max_message_id("s")?, Some(7));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    ///
    /// # Errors
    /// SQLite errors.
    pub fn max_message_id(&self, session: &str) -> Result<Option<u64>, ArchiveError> {
        let max: Option<i64> = self.conn().query_row(
            "SELECT max(m.id) FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.name = ?1",
            [session],
            |row| row.get(0),
        )?;
        max.map(|id| from_sql_int("message id", id)).transpose()
    }

    /// Every message of `session`, oldest id first.
    ///
    /// # Errors
    /// SQLite errors; [`ArchiveError::Corrupt`] for a damaged row.
    pub fn all_messages(&self, session: &str) -> Result<Vec<ArchivedMessage>, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 ORDER BY m.id"
        ))?;
        collect_messages(&mut stmt, [session])
    }

    /// The names of the archive's sessions that start with `prefix`, sorted.
    ///
    /// # Errors
    /// SQLite errors.
    pub fn session_names(&self, prefix: &str) -> Result<Vec<String>, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT name FROM sessions WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name",
        )?;
        let names = stmt.query_map([prefix], |row| row.get(0))?.collect::<Result<_, _>>()?;
        Ok(names)
    }

    /// Deletes the messages and summaries of `session` with ids from `first` on, in one
    /// transaction; returns how many messages went. A session rewound to a checkpoint calls
    /// this after copying them aside, so its archive holds exactly what its checkpoint covers.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// for id in 1..=3 {
    ///     archive.store_unit("s", &[ArchivedMessage::new(id, id, ChatMessage::text(Role::User, "x"))])?;
    /// }
    /// assert_eq!(archive.delete_from("s", 2)?, 2);
    /// assert_eq!(archive.max_message_id("s")?, Some(1));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    ///
    /// # Errors
    /// SQLite errors (nothing is deleted then).
    pub fn delete_from(&mut self, session: &str, first: u64) -> Result<usize, ArchiveError> {
        let first = to_sql_int("message id", first)?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let deleted = tx.execute(
            "DELETE FROM messages WHERE id >= ?2
             AND session_id = (SELECT id FROM sessions WHERE name = ?1)",
            rusqlite::params![session, first],
        )?;
        tx.execute(
            "DELETE FROM summaries WHERE id >= ?2
             AND session_id = (SELECT id FROM sessions WHERE name = ?1)",
            rusqlite::params![session, first],
        )?;
        tx.commit()?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_keeps_its_identity_and_damage_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let first = Archive::open(&path).unwrap().identity().unwrap();
        assert_eq!(Archive::open(&path).unwrap().identity().unwrap(), first);
        let other = Archive::open(dir.path().join("b.db")).unwrap().identity().unwrap();
        assert_ne!(first, other);
        Archive::open(&path).unwrap().quick_check().unwrap();
    }
}
