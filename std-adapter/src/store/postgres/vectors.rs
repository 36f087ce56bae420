//! Semantic vectors cached beside the messages they describe: one per message and model,
//! little-endian `f32` bytes in a `bytea` with their checksum (no extension needed; callers
//! compute similarities).

use postgres::types::Type;

use super::error::{Failure, get};
use super::escape::escape;
use super::escape::scope_params;
use super::rows::{MESSAGE_COLUMNS, decode_unverified, verify};
use super::{PgStore, lock_scope, row_name};
use crate::store::error::to_i64;
use crate::store::{Fence, Scope, StoreError, VectorRow, checksum};

impl PgStore {
    pub(super) fn put_vectors_pg(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        let mut ids = Vec::with_capacity(vectors.len());
        let mut blobs = Vec::with_capacity(vectors.len());
        let mut sums = Vec::with_capacity(vectors.len());
        for (index, (id, vector)) in vectors.iter().enumerate() {
            let sql_id = to_i64("message id", *id)?;
            // One statement cannot write a row twice: the last vector of an id wins.
            if vectors.get(index + 1..).is_some_and(|later| later.iter().any(|(i, _)| i == id)) {
                continue;
            }
            ids.push(sql_id);
            blobs.push(encode(vector));
            sums.push(checksum::vector(scope, *id, model, vector) as i64);
        }
        let model = escape(model).into_owned();
        self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else { return Ok(()) };
            tx.query(
                "INSERT INTO message_vectors (conversation_id, message_id, model, vector, checksum)
                 SELECT $1, v.id, $2, v.vector, v.checksum
                 FROM unnest($3::int8[], $4::bytea[], $5::int8[]) AS v (id, vector, checksum)
                 JOIN messages m ON m.conversation_id = $1 AND m.id = v.id
                 ON CONFLICT (conversation_id, message_id, model) DO UPDATE SET
                     vector = excluded.vector, checksum = excluded.checksum",
                &[
                    (&conversation, Type::INT8),
                    (&model, Type::TEXT),
                    (&ids, Type::INT8_ARRAY),
                    (&blobs, Type::BYTEA_ARRAY),
                    (&sums, Type::INT8_ARRAY),
                ],
            )?;
            Ok(())
        })
    }

    pub(super) fn vectors_pg(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        let (tenant, name) = scope_params(scope);
        let model_key = escape(model).into_owned();
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.run(|client| {
            // Whole rows: the content served is verified against the row's checksum.
            let rows = client.query_typed(
                &format!(
                    "SELECT {MESSAGE_COLUMNS}, v.vector, v.checksum
                     FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     LEFT JOIN message_vectors v ON v.conversation_id = m.conversation_id
                         AND v.message_id = m.id AND v.model = $4
                     WHERE c.tenant = $1 AND c.name = $2 AND m.id > $3 ORDER BY m.id"
                ),
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&after, Type::INT8),
                    (&model_key, Type::TEXT),
                ],
            )?;
            let mut out = Vec::with_capacity(rows.len());
            for row in &rows {
                let message = verify(scope, decode_unverified(scope, row)?, get(row, 13)?)?;
                let blob: Option<Vec<u8>> = get(row, 14)?;
                let vector = match blob {
                    Some(blob) => {
                        let vector = decode(&blob).map_err(|detail| {
                            Failure(StoreError::damaged(row_name(scope, message.id), detail))
                        })?;
                        let stored: Option<i64> = get(row, 15)?;
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
        })
    }
}

fn encode(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode(blob: &[u8]) -> Result<Vec<f32>, String> {
    if !blob.len().is_multiple_of(4) {
        return Err(format!("a vector of {} bytes", blob.len()));
    }
    Ok(blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
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
