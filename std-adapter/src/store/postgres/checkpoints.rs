//! [`CheckpointSink`] for [`PgStore`]: each checkpoint a row holding its framed payload
//! ([`frame`]: sequence, length, CRC-32), ordered by the conversation's checkpoint sequence,
//! which every save raises under the conversation's lock: "newest" is the order saves
//! committed in, whatever a clock said. A save stores the snapshot alone (a session's rows
//! are in `messages` once), so a conversation's checkpoints take what its kept snapshots
//! take.

use std::time::{Duration, UNIX_EPOCH};

use postgres::Row;
use postgres::types::Type;

use super::error::{Failure, Pg, from_sql_int, get};
use super::escape::scope_params;
use super::{PgStore, Tx, lock_scope};
use crate::store::checkpoint::{
    CheckpointId, CheckpointInfo, CheckpointStatus, Loaded, SkipReason, Skipped, clock, frame,
};
use crate::store::{CheckpointSink, Fence, Scope, StoreError};

/// The checkpoints of one conversation: `$1` its tenant, `$2` its name.
const SCOPED_CHECKPOINTS: &str = "checkpoints k JOIN conversations c ON c.id = k.conversation_id
     WHERE c.tenant = $1 AND c.name = $2";

/// A stored id back; one that does not parse is damage.
fn parse_id(row: &Row, index: usize) -> Pg<CheckpointId> {
    let text: String = get(row, index)?;
    CheckpointId::parse(&text).map_err(|error| {
        Failure(StoreError::damaged(format!("checkpoint id {text:?}"), error.to_string()))
    })
}

/// The payload of a stored frame of checkpoint `id` of `scope` at sequence `seq`, verified.
fn payload(
    scope: &Scope,
    id: &CheckpointId,
    seq: i64,
    stored: &[u8],
) -> Result<Vec<u8>, StoreError> {
    let what = || format!("checkpoint {id} of {scope}");
    let (sequence, range) =
        frame::open(stored).map_err(|error| StoreError::damaged(what(), error.to_string()))?;
    if i64::try_from(sequence).ok() != Some(seq) {
        return Err(StoreError::damaged(
            what(),
            format!("its frame says sequence {sequence}, its row {seq}"),
        ));
    }
    Ok(stored.get(range).unwrap_or_default().to_vec())
}

impl PgStore {
    /// Checkpoint `id` of `scope` read and verified, or `None`.
    fn load_pg(&self, scope: &Scope, id: &CheckpointId) -> Result<Option<Vec<u8>>, StoreError> {
        let (tenant, name) = scope_params(scope);
        let key = id.as_str();
        let found = self.run(|client| {
            let rows = client.query_typed(
                &format!("SELECT k.seq, k.frame FROM {SCOPED_CHECKPOINTS} AND k.id = $3"),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&key, Type::TEXT)],
            )?;
            rows.first().map(|row| Ok((get::<i64>(row, 0)?, get::<Vec<u8>>(row, 1)?))).transpose()
        })?;
        found.map(|(seq, stored)| payload(scope, id, seq, &stored)).transpose()
    }

    /// The newest checkpoints of `scope` from `skip` on, at most `take`, with their frames.
    fn newest(
        &self,
        scope: &Scope,
        skip: i64,
        take: i64,
    ) -> Result<Vec<(CheckpointId, i64, Vec<u8>)>, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT k.id, k.seq, k.frame FROM {SCOPED_CHECKPOINTS}
                     ORDER BY k.seq DESC OFFSET $3 LIMIT $4"
                ),
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&skip, Type::INT8),
                    (&take, Type::INT8),
                ],
            )?;
            rows.iter().map(|row| Ok((parse_id(row, 0)?, get(row, 1)?, get(row, 2)?))).collect()
        })
    }

    /// Damages the stored frame of checkpoint `id` of `scope` (a byte flipped, as bit rot
    /// would): for tests of the checksums. Whether there was one.
    ///
    /// # Errors
    /// Backend errors.
    #[doc(hidden)]
    pub fn damage_checkpoint_for_tests(
        &self,
        scope: &Scope,
        id: &CheckpointId,
    ) -> Result<bool, StoreError> {
        let (tenant, name) = scope_params(scope);
        let key = id.as_str();
        self.run(|client| {
            let rows = client.query_typed(
                "UPDATE checkpoints k SET frame = set_byte(k.frame, length(k.frame) - 1,
                     get_byte(k.frame, length(k.frame) - 1) # 64)
                 FROM conversations c
                 WHERE c.id = k.conversation_id AND c.tenant = $1 AND c.name = $2 AND k.id = $3
                 RETURNING 1",
                &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&key, Type::TEXT)],
            )?;
            Ok(!rows.is_empty())
        })
    }
}

/// Locks `scope`'s conversation for a save (creating it), checks `fence`, raises its
/// checkpoint sequence; the conversation, the new sequence and the newest id.
fn next_sequence(
    tx: &mut Tx<'_>,
    scope: &Scope,
    fence: Fence,
) -> Pg<(i64, i64, Option<CheckpointId>)> {
    let conversation = lock_scope(tx, scope, fence, true)?.unwrap_or_default();
    let rows = tx.query(
        "WITH raised AS (
             UPDATE conversations SET checkpoint_seq = checkpoint_seq + 1 WHERE id = $1
             RETURNING checkpoint_seq
         )
         SELECT (SELECT checkpoint_seq FROM raised),
                (SELECT id FROM checkpoints WHERE conversation_id = $1 ORDER BY seq DESC LIMIT 1)",
        &[(&conversation, Type::INT8)],
    )?;
    let Some(row) = rows.first() else {
        return Err(Failure(StoreError::Backend {
            detail: format!("no checkpoint sequence for {scope}"),
        }));
    };
    let sequence: i64 = get(row, 0)?;
    let floor = match get::<Option<String>>(row, 1)? {
        Some(text) => Some(CheckpointId::parse(&text).map_err(|error| {
            Failure(StoreError::damaged(format!("checkpoint id {text:?}"), error.to_string()))
        })?),
        None => None,
    };
    Ok((conversation, sequence, floor))
}

/// Saves `payload` as `scope`'s newest checkpoint inside `tx`; with `keep`, deletes in the
/// same statement all but the newest `keep` (the new one among them): the new id and the
/// ids deleted, oldest first.
fn save_in(
    tx: &mut Tx<'_>,
    scope: &Scope,
    fence: Fence,
    payload: &[u8],
    keep: Option<usize>,
) -> Pg<(CheckpointId, Vec<CheckpointId>)> {
    let (conversation, sequence, floor) = next_sequence(tx, scope, fence)?;
    let now = clock::now();
    let id = CheckpointId::next_after(now, floor.as_ref()).ok_or_else(|| {
        StoreError::invalid(format!("the clock reads {now:?}, outside 1970..=9999"))
    })?;
    let framed = frame::sequenced(u64::try_from(sequence).unwrap_or(0), payload);
    let key = id.as_str();
    let insert =
        "INSERT INTO checkpoints (conversation_id, seq, id, frame) VALUES ($1, $2, $3, $4)";
    let params: [(&(dyn postgres::types::ToSql + Sync), Type); 4] = [
        (&conversation, Type::INT8),
        (&sequence, Type::INT8),
        (&key, Type::TEXT),
        (&framed, Type::BYTEA),
    ];
    let Some(keep) = keep else {
        tx.query(insert, &params)?;
        return Ok((id, Vec::new()));
    };
    // The statement's snapshot does not see the row it inserts: the older ones kept are
    // `keep - 1`.
    let older = i64::try_from(keep.saturating_sub(1)).unwrap_or(i64::MAX);
    let sql = format!(
        "WITH saved AS ({insert} RETURNING seq)
         DELETE FROM checkpoints WHERE conversation_id = $1 AND seq NOT IN (
             SELECT seq FROM checkpoints WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $5)
         RETURNING id, seq"
    );
    let [a, b, c, d] = params;
    let rows = tx.query(&sql, &[a, b, c, d, (&older, Type::INT8)])?;
    let mut pruned = rows
        .iter()
        .map(|row| Ok((get::<i64>(row, 1)?, parse_id(row, 0)?)))
        .collect::<Pg<Vec<_>>>()?;
    pruned.sort();
    Ok((id, pruned.into_iter().map(|(_, id)| id).collect()))
}

impl CheckpointSink for PgStore {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        let (id, _) = self.transaction(|tx| save_in(tx, scope, fence, payload, None))?;
        tracing::debug!(%id, %scope, bytes = payload.len(), "postgres store: checkpoint saved");
        Ok(id)
    }

    /// One transaction, the prune in the insert's statement.
    fn save_and_prune(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: usize,
    ) -> Result<(CheckpointId, Result<Vec<CheckpointId>, StoreError>), StoreError> {
        if keep == 0 {
            let id = self.save(scope, fence, payload)?;
            return Ok((id, self.prune(scope, fence, keep)));
        }
        let (id, pruned) = self.transaction(|tx| save_in(tx, scope, fence, payload, Some(keep)))?;
        tracing::debug!(%id, %scope, bytes = payload.len(), pruned = pruned.len(), "postgres store: checkpoint saved");
        Ok((id, Ok(pruned)))
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!("SELECT k.id FROM {SCOPED_CHECKPOINTS} ORDER BY k.seq DESC"),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            rows.iter().map(|row| parse_id(row, 0)).collect()
        })
    }

    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        self.load_pg(scope, id)?
            .ok_or_else(|| StoreError::NotFound { what: format!("checkpoint {id} of {scope}") })
    }

    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        let (tenant, name) = scope_params(scope);
        let rows = self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT k.id, k.seq, k.frame,
                            (extract(epoch FROM k.written_at) * 1000000)::int8
                     FROM {SCOPED_CHECKPOINTS} ORDER BY k.seq DESC"
                ),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            rows.iter()
                .map(|row| {
                    let micros = from_sql_int("checkpoint time", get(row, 3)?)?;
                    Ok((parse_id(row, 0)?, get::<i64>(row, 1)?, get::<Vec<u8>>(row, 2)?, micros))
                })
                .collect::<Pg<Vec<_>>>()
        })?;
        Ok(rows
            .into_iter()
            .map(|(id, seq, stored, micros)| CheckpointInfo {
                location: self.location(scope, &id),
                size: stored.len() as u64,
                modified: UNIX_EPOCH.checked_add(Duration::from_micros(micros)),
                status: match payload(scope, &id, seq, &stored) {
                    Ok(_) => CheckpointStatus::Ok,
                    Err(error) => CheckpointStatus::Damaged(error.to_string()),
                },
                id,
            })
            .collect())
    }

    fn prune(
        &self,
        scope: &Scope,
        fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else {
                return Ok(Vec::new());
            };
            let rows = tx.query(
                "DELETE FROM checkpoints WHERE conversation_id = $1 AND seq NOT IN (
                     SELECT seq FROM checkpoints WHERE conversation_id = $1
                     ORDER BY seq DESC LIMIT $2)
                 RETURNING id, seq",
                &[(&conversation, Type::INT8), (&keep, Type::INT8)],
            )?;
            let mut pruned = rows
                .iter()
                .map(|row| Ok((get::<i64>(row, 1)?, parse_id(row, 0)?)))
                .collect::<Pg<Vec<_>>>()?;
            pruned.sort();
            Ok(pruned.into_iter().map(|(_, id)| id).collect())
        })
    }

    fn rewrite(
        &self,
        scope: &Scope,
        fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        let rewritten = self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else { return Ok(0) };
            let rows = tx.query(
                "SELECT seq, frame FROM checkpoints WHERE conversation_id = $1 ORDER BY seq",
                &[(&conversation, Type::INT8)],
            )?;
            let mut rewritten = 0;
            for row in &rows {
                let (seq, stored): (i64, Vec<u8>) = (get(row, 0)?, get(row, 1)?);
                let masked = match frame::open(&stored) {
                    Ok((sequence, range)) => stored
                        .get(range)
                        .and_then(mask)
                        .map(|payload| frame::sequenced(sequence, &payload)),
                    // A damaged checkpoint may hold the text too: masked as it is (and stays
                    // damaged).
                    Err(_) => mask(&stored),
                };
                let Some(masked) = masked else { continue };
                tx.query(
                    "UPDATE checkpoints SET frame = $3, written_at = now()
                     WHERE conversation_id = $1 AND seq = $2",
                    &[(&conversation, Type::INT8), (&seq, Type::INT8), (&masked, Type::BYTEA)],
                )?;
                rewritten += 1;
            }
            Ok(rewritten)
        })?;
        if rewritten > 0 {
            self.vacuum("checkpoints")?;
        }
        Ok(rewritten)
    }

    /// The newest checkpoint first, with its payload in the same round trip (a restore
    /// usually takes it); older ones one at a time when it is refused.
    fn load_latest(
        &self,
        scope: &Scope,
        accept: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Option<Loaded>, StoreError> {
        let mut skipped = Vec::new();
        for skip in 0_i64.. {
            let Some((id, seq, stored)) = self.newest(scope, skip, 1)?.into_iter().next() else {
                break;
            };
            let reason = match payload(scope, &id, seq, &stored) {
                Ok(bytes) => match accept(&bytes) {
                    Ok(()) => return Ok(Some(Loaded { id, bytes, skipped })),
                    Err(why) => SkipReason::Rejected(why),
                },
                Err(StoreError::Damaged { detail, .. }) => SkipReason::Damaged(detail),
                Err(error) => return Err(error),
            };
            tracing::warn!(%id, %scope, %reason, "postgres store: skipping checkpoint");
            skipped.push(Skipped { location: self.location(scope, &id), id, reason });
        }
        if skipped.is_empty() {
            return Ok(None);
        }
        Err(StoreError::NoUsableCheckpoint { place: self.place(scope), skipped })
    }

    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        format!("{} checkpoint {id} of {scope}", self.inner.place)
    }

    fn place(&self, scope: &Scope) -> String {
        format!("{} checkpoints of {scope}", self.inner.place)
    }
}
