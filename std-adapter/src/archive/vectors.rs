//! Semantic vectors cached beside the messages they describe, one per message and model.

use super::error::{from_sql_int, to_sql_int};
use super::{Archive, ArchiveError};

/// An archived message of a session as the embedding cache sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorRow {
    /// Message id.
    pub id: u64,
    /// The message's content (what its vector describes).
    pub content: String,
    /// Its cached vector for the model asked about, if any.
    pub vector: Option<Vec<f32>>,
}

impl Archive {
    /// Caches `vectors` (message id, vector) of `session` for `model`, replacing older ones.
    /// Ids with no archived message are skipped. A later change of a message's content (an
    /// update, a [`forget`](Self::forget)) deletes its vectors.
    ///
    /// # Errors
    /// SQLite errors; nothing is stored then.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "a dog"))])?;
    /// archive.store_vectors("s", "m", &[(1, vec![0.5, -1.0]), (9, vec![1.0, 1.0])])?;
    /// let rows = archive.vector_rows("s", "m", 0)?;
    /// assert_eq!(rows.len(), 1);
    /// assert_eq!(rows[0].vector.as_deref(), Some(&[0.5, -1.0][..]));
    /// assert!(archive.vector_rows("s", "other-model", 0)?[0].vector.is_none());
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn store_vectors(
        &mut self,
        session: &str,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), ArchiveError> {
        let Some(session_id) = self.session_id(session)? else { return Ok(()) };
        let gate = self.gate.clone();
        let _turn = super::write_turn(&gate);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO message_vectors (message_pk, model, vector)
                 SELECT pk, ?3, ?4 FROM messages WHERE session_id = ?1 AND id = ?2",
            )?;
            for (id, vector) in vectors {
                let id = to_sql_int("message id", *id)?;
                stmt.execute(rusqlite::params![session_id, id, model, encode(vector)])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// `session`'s messages with ids above `after`, in id order, each with its cached vector
    /// for `model` when there is one: what an embedding index loads, and what it still has to
    /// embed.
    ///
    /// # Errors
    /// SQLite errors; [`ArchiveError::Corrupt`] for a vector blob that is not whole `f32`s.
    pub fn vector_rows(
        &self,
        session: &str,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, ArchiveError> {
        let Some(session_id) = self.session_id(session)? else { return Ok(Vec::new()) };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT m.id, m.content, v.vector FROM messages m
             LEFT JOIN message_vectors v ON v.message_pk = m.pk AND v.model = ?3
             WHERE m.session_id = ?1 AND m.id > ?2 ORDER BY m.id",
        )?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let mut rows = stmt.query(rusqlite::params![session_id, after, model])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let blob: Option<Vec<u8>> = row.get(2)?;
            out.push(VectorRow {
                id: from_sql_int("message id", row.get(0)?)?,
                content: row.get(1)?,
                vector: blob.map(|b| decode(&b)).transpose()?,
            });
        }
        Ok(out)
    }

    /// Vectors cached for `session` (every model).
    ///
    /// # Errors
    /// SQLite errors.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// assert_eq!(archive.vector_count("s")?, 0);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn vector_count(&self, session: &str) -> Result<u64, ArchiveError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT count(*) FROM message_vectors v JOIN messages m ON m.pk = v.message_pk
             JOIN sessions s ON s.id = m.session_id WHERE s.name = ?1",
        )?;
        from_sql_int("vector count", stmt.query_row([session], |row| row.get(0))?)
    }
}

fn encode(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode(blob: &[u8]) -> Result<Vec<f32>, ArchiveError> {
    if !blob.len().is_multiple_of(4) {
        return Err(ArchiveError::Corrupt(format!("a vector blob of {} bytes", blob.len())));
    }
    Ok(blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::ArchivedMessage;
    use crate::message::ChatMessage;
    use ctxwin_core::Role;

    fn archive_with(texts: &[&str]) -> Archive {
        let mut archive = Archive::open_in_memory().unwrap();
        for (i, text) in texts.iter().enumerate() {
            let id = i as u64 + 1;
            let row = ArchivedMessage::new(id, id, ChatMessage::text(Role::User, *text));
            archive.store_unit("s", &[row]).unwrap();
        }
        archive
    }

    #[test]
    fn a_content_change_drops_the_vector() {
        let mut archive = archive_with(&["one", "two"]);
        archive.store_vectors("s", "m", &[(1, vec![1.0]), (2, vec![2.0])]).unwrap();
        let changed = ArchivedMessage::new(2, 2, ChatMessage::text(Role::User, "deux"));
        archive.store_unit("s", &[changed]).unwrap();
        let rows = archive.vector_rows("s", "m", 0).unwrap();
        assert_eq!(rows[0].vector.as_deref(), Some(&[1.0][..]));
        assert_eq!(rows[1].vector, None);
        assert_eq!(archive.vector_rows("s", "m", 1).unwrap().len(), 1);
    }

    #[test]
    fn forgetting_a_message_deletes_its_vectors() {
        let mut archive = archive_with(&["my key is hunter2", "fine"]);
        archive.store_vectors("s", "m", &[(1, vec![1.0, 2.0]), (2, vec![3.0, 4.0])]).unwrap();
        archive.store_vectors("s", "n", &[(1, vec![5.0])]).unwrap();
        archive.forget("s", &[], &["hunter2"]).unwrap();
        assert_eq!(archive.vector_count("s").unwrap(), 1);
        archive.forget("s", &[2], &[]).unwrap();
        assert_eq!(archive.vector_count("s").unwrap(), 0);
    }

    #[test]
    fn bad_blobs_are_corrupt() {
        assert!(matches!(decode(&[0, 0, 0]), Err(ArchiveError::Corrupt(_))));
        assert_eq!(decode(&encode(&[1.5, -2.0])).unwrap(), [1.5, -2.0]);
    }
}
