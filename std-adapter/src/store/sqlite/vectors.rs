//! Semantic vectors cached beside the messages they describe, one per message and model, each
//! with its checksum.

use rusqlite::Connection;

use super::error::{Failure, Sql};
use super::{SqliteArchive, decode_unverified, row_name, verify};
use crate::store::error::to_i64;
use crate::store::{Scope, StoreError, VectorRow, checksum};

impl SqliteArchive {
    pub(super) fn put_vectors_sql(
        &self,
        scope: &Scope,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Sql<()> {
        let encoded = vectors
            .iter()
            .map(|(id, vector)| {
                let sum = checksum::vector(scope, *id, model, vector) as i64;
                Ok((to_i64("message id", *id)?, encode(vector), sum))
            })
            .collect::<Sql<Vec<_>>>()?;
        let _turn = super::write_turn(&self.gate);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let Some(session_id) = super::session_id(&tx, scope)? else { return Ok(()) };
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO message_vectors (message_pk, model, vector, checksum)
                 SELECT pk, ?3, ?4, ?5 FROM messages WHERE session_id = ?1 AND id = ?2",
            )?;
            for (id, blob, sum) in &encoded {
                stmt.execute(rusqlite::params![session_id, id, model, blob, sum])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub(super) fn vectors_sql(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Sql<Vec<VectorRow>> {
        let Some(session_id) = self.session_id(scope)? else { return Ok(Vec::new()) };
        let conn = self.read_conn();
        // Whole rows: the content served is verified against the row's checksum.
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {}, v.vector, v.checksum FROM messages m
             LEFT JOIN message_vectors v ON v.message_pk = m.pk AND v.model = ?3
             WHERE m.session_id = ?1 AND m.id > ?2 ORDER BY m.id",
            super::MESSAGE_COLUMNS
        ))?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let mut rows = stmt.query(rusqlite::params![session_id, after, model])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let message = verify(scope, decode_unverified(scope, row)?, row.get(13)?)?;
            let blob: Option<Vec<u8>> = row.get(14)?;
            let vector = match blob {
                Some(blob) => {
                    let vector = decode(&blob).map_err(|detail| {
                        Failure(StoreError::damaged(row_name(scope, message.id), detail))
                    })?;
                    let stored: Option<i64> = row.get(15)?;
                    let computed = checksum::vector(scope, message.id, model, &vector);
                    if stored.map(|s| s as u64) != Some(computed) {
                        let what = format!("vector of {}", row_name(scope, message.id));
                        return Err(Failure(checksum::mismatch(
                            what,
                            stored.unwrap_or_default() as u64,
                            computed,
                        )));
                    }
                    Some(vector)
                }
                None => None,
            };
            out.push(VectorRow { id: message.id, content: message.message.content, vector });
        }
        Ok(out)
    }
}

fn encode(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode(blob: &[u8]) -> Result<Vec<f32>, String> {
    if !blob.len().is_multiple_of(4) {
        return Err(format!("a vector blob of {} bytes", blob.len()));
    }
    Ok(blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// Computes the checksums of vectors written before schema version 5; how many.
pub(super) fn backfill(conn: &Connection) -> Sql<u64> {
    let mut select = conn.prepare(
        "SELECT v.message_pk, v.model, v.vector, m.id, s.tenant, s.name
         FROM message_vectors v JOIN messages m ON m.pk = v.message_pk
         JOIN sessions s ON s.id = m.session_id",
    )?;
    let mut update = conn
        .prepare("UPDATE message_vectors SET checksum = ?3 WHERE message_pk = ?1 AND model = ?2")?;
    let mut rows = select.query([])?;
    let mut done = 0;
    while let Some(row) = rows.next()? {
        let (pk, model, blob): (i64, String, Vec<u8>) = (row.get(0)?, row.get(1)?, row.get(2)?);
        let scope = Scope::new(row.get::<_, String>(4)?, row.get::<_, String>(5)?);
        let id: i64 = row.get(3)?;
        if let (Ok(vector), Ok(id)) = (decode(&blob), u64::try_from(id)) {
            let sum = checksum::vector(&scope, id, &model, &vector) as i64;
            update.execute(rusqlite::params![pk, model, sum])?;
            done += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_blobs_are_damage() {
        assert!(decode(&[0, 0, 0]).is_err());
        assert_eq!(decode(&encode(&[1.5, -2.0])).unwrap(), [1.5, -2.0]);
    }
}
