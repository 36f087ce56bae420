//! [`CheckpointSink`] for [`PgStore`]: each checkpoint a row holding its framed payload
//! ([`frame`]: sequence, length, CRC-32), ordered by the conversation's checkpoint sequence,
//! which every save raises under the conversation's lock: "newest" is the order saves
//! committed in, whatever a clock said. A save stores the snapshot alone (a session's rows
//! are in `messages` once), so a conversation's checkpoints take what its kept snapshots
//! take.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, UNIX_EPOCH};

use postgres::Row;
use postgres::types::Type;

use super::error::{Failure, Pg, from_sql_int, get};
use super::escape::scope_params;
use super::{PgStore, Tx, check_fence, lock_scope};
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
        .inspect(|found: &Vec<(CheckpointId, i64, Vec<u8>)>| {
            if skip == 0 {
                self.note_newest(scope, found.first().map(|(id, seq, _)| (*seq, id)));
                if let Some((id, seq, stored)) = found.first() {
                    self.inner.checkpoints.keep_frame(scope, id, *seq, stored);
                }
            }
        })
    }

    /// Notes the newest checkpoint of `scope` as read (its sequence and id; `None`: there
    /// is none, which a conversation's sequence 0 is the likely reason of) for the next
    /// save's guess ([`Known`]).
    fn note_newest(&self, scope: &Scope, newest: Option<(i64, &CheckpointId)>) {
        let (sequence, id) = newest.map_or((0, None), |(seq, id)| (seq, Some(id.clone())));
        self.inner.checkpoints.note(scope, sequence, id);
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

/// A checkpoint saved: its id, its sequence, and the ids pruned with it, oldest first.
struct Saved {
    id: CheckpointId,
    sequence: i64,
    pruned: Vec<CheckpointId>,
}

/// The id a checkpoint saved now takes, later than `floor` (the newest stored).
fn new_id(floor: Option<&CheckpointId>) -> Pg<CheckpointId> {
    let now = clock::now();
    Ok(CheckpointId::next_after(now, floor).ok_or_else(|| {
        StoreError::invalid(format!("the clock reads {now:?}, outside 1970..=9999"))
    })?)
}

/// Ids deleted by a prune, from rows of (id, seq) from `id_at`, `seq_at`: oldest first.
fn pruned_ids(rows: &[Row], id_at: usize, seq_at: usize) -> Pg<Vec<CheckpointId>> {
    let mut pruned = rows
        .iter()
        .map(|row| Ok((get::<i64>(row, seq_at)?, parse_id(row, id_at)?)))
        .collect::<Pg<Vec<_>>>()?;
    pruned.sort();
    Ok(pruned.into_iter().map(|(_, id)| id).collect())
}

/// How many older checkpoints a save keeping `keep` leaves (the statement's snapshot does
/// not see the row it inserts: `keep - 1`); all of them without `keep`.
fn older_kept(keep: Option<usize>) -> i64 {
    keep.map_or(i64::MAX, |keep| i64::try_from(keep.saturating_sub(1)).unwrap_or(i64::MAX))
}

/// Saves `payload` as `scope`'s newest checkpoint inside `tx`; with `keep`, deletes in the
/// same statement all but the newest `keep` (the new one among them).
fn save_in(
    tx: &mut Tx<'_>,
    scope: &Scope,
    fence: Fence,
    payload: &[u8],
    keep: Option<usize>,
) -> Pg<Saved> {
    let (conversation, sequence, floor) = next_sequence(tx, scope, fence)?;
    let id = new_id(floor.as_ref())?;
    let framed = frame::sequenced(u64::try_from(sequence).unwrap_or(0), payload);
    let key = id.as_str();
    let older = older_kept(keep);
    let rows = tx.query(
        "WITH saved AS (
             INSERT INTO checkpoints (conversation_id, seq, id, frame) VALUES ($1, $2, $3, $4)
         )
         DELETE FROM checkpoints WHERE conversation_id = $1 AND seq NOT IN (
             SELECT seq FROM checkpoints WHERE conversation_id = $1 ORDER BY seq DESC LIMIT $5)
         RETURNING id, seq",
        &[
            (&conversation, Type::INT8),
            (&sequence, Type::INT8),
            (&key, Type::TEXT),
            (&framed, Type::BYTEA),
            (&older, Type::INT8),
        ],
    )?;
    Ok(Saved { pruned: pruned_ids(&rows, 0, 1)?, id, sequence })
}

/// A checkpoint saved in one statement, its own transaction
/// ([`PgStore::save_in_one_statement`]): `$1`, `$2` the conversation's tenant and name; `$3`
/// the checkpoint sequence the frame `$7` was made for the conversation to be at (its frame
/// holds the next); `$4` the fence carried, `$5` this handle's holder number; `$6` the new
/// id; `$8` the older checkpoints kept. The conversation's row is locked by the `UPDATE`
/// that raises its sequence, which happens only when the sequence is `$3` and the fence
/// passes as [`check_fence`] checks it (on the row as locked: a concurrent writer's newer
/// version is what the condition is evaluated on). Rows: `(1, sequence, NULL, NULL, NULL)`
/// when saved, then `(2, seq, id, NULL, NULL)` for each checkpoint pruned; otherwise
/// `(0, sequence, newest id, fence, holder)` as the statement's snapshot saw the
/// conversation; none when the conversation does not exist.
const SAVE: &str = "
WITH cur AS (
    SELECT c.checkpoint_seq, c.fence, c.holder,
        (SELECT k.id FROM checkpoints k WHERE k.conversation_id = c.id
         ORDER BY k.seq DESC LIMIT 1) AS newest
    FROM conversations c WHERE c.tenant = $1 AND c.name = $2
), raised AS (
    UPDATE conversations c SET checkpoint_seq = c.checkpoint_seq + 1
    WHERE c.tenant = $1 AND c.name = $2 AND c.checkpoint_seq = $3
      AND ($4 = 0 OR c.fence = 0 OR (c.fence = $4 AND c.holder = $5))
    RETURNING c.id, c.checkpoint_seq
), saved AS (
    INSERT INTO checkpoints (conversation_id, seq, id, frame)
    SELECT id, checkpoint_seq, $6, $7 FROM raised
), pruned AS (
    DELETE FROM checkpoints k USING raised
    WHERE k.conversation_id = raised.id AND k.seq NOT IN (
        SELECT seq FROM checkpoints WHERE conversation_id = raised.id
        ORDER BY seq DESC LIMIT $8)
    RETURNING k.id, k.seq
)
SELECT 1, checkpoint_seq, NULL::text, NULL::int8, NULL::int8 FROM raised
UNION ALL SELECT 2, seq, id, NULL, NULL FROM pruned
UNION ALL SELECT 0, checkpoint_seq, newest, fence, holder FROM cur
    WHERE NOT EXISTS (SELECT FROM raised)";

/// Tries of [`PgStore::save_in_one_statement`] before the locking transaction.
const SAVE_TRIES: usize = 3;

/// What this handle last saw of conversations' checkpoints: each one's checkpoint sequence
/// and newest id (saved, or read with the newest checkpoint or the ids), what a save in one
/// statement expects (a guess the statement checks); the sequence its last lease taken
/// found ([`PgStore::raise_fence`]); and the frame of the newest checkpoint it last read.
/// The last two answer the next read of the newest checkpoint without a query when the
/// lease was taken within [`FRESH`] and found the sequence of what this handle holds: the
/// sequence rises with every save, so the newest checkpoint is still that one. Used once
/// each (the lease's sequence by the first read after it). At most [`KNOWN`] conversations,
/// [`FRAMES`] frames of at most [`FRAME_BYTES`].
#[derive(Default)]
pub(super) struct Known(Mutex<KnownState>);

#[derive(Default)]
struct KnownState {
    newest: HashMap<Scope, (i64, Option<CheckpointId>)>,
    raised: HashMap<Scope, (i64, Instant)>,
    frames: HashMap<Scope, (CheckpointId, i64, Vec<u8>)>,
}

/// Conversations [`Known`] holds at most (it starts over when full).
const KNOWN: usize = 4_096;
/// Frames [`Known`] holds at most.
const FRAMES: usize = 64;
/// Bytes of the largest frame [`Known`] holds.
const FRAME_BYTES: usize = 1 << 20;
/// How long the sequence a lease found answers a read of the newest checkpoint: the read
/// follows the lease at once, in the same operation (a reload, a session's build).
const FRESH: Duration = Duration::from_millis(250);

/// `map` emptied when it holds `most` entries and `scope` is not one.
fn bounded<V>(map: &mut HashMap<Scope, V>, scope: &Scope, most: usize) {
    if map.len() >= most && !map.contains_key(scope) {
        map.clear();
    }
}

impl Known {
    fn lock(&self) -> std::sync::MutexGuard<'_, KnownState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, scope: &Scope, sequence: i64, newest: Option<CheckpointId>) {
        let mut known = self.lock();
        bounded(&mut known.newest, scope, KNOWN);
        known.newest.insert(scope.clone(), (sequence, newest));
    }

    fn get(&self, scope: &Scope) -> Option<(i64, Option<CheckpointId>)> {
        self.lock().newest.get(scope).cloned()
    }

    /// A lease of `scope` taken now found its checkpoint sequence at `sequence`.
    pub(super) fn raised(&self, scope: &Scope, sequence: i64) {
        let mut known = self.lock();
        bounded(&mut known.raised, scope, KNOWN);
        known.raised.insert(scope.clone(), (sequence, Instant::now()));
    }

    /// The sequence a lease of `scope` taken within [`FRESH`] found, once.
    fn take_raised(&self, known: &mut KnownState, scope: &Scope) -> Option<i64> {
        let (sequence, at) = known.raised.remove(scope)?;
        (at.elapsed() < FRESH).then_some(sequence)
    }

    /// The newest checkpoint's id of `scope` when a fresh lease found the sequence this
    /// handle knows its newest id for (`Some(None)`: there is none).
    fn newest_id(&self, scope: &Scope) -> Option<Option<CheckpointId>> {
        let mut known = self.lock();
        let raised = self.take_raised(&mut known, scope)?;
        match known.newest.get(scope) {
            Some((sequence, id)) if *sequence == raised => Some(id.clone()),
            _ => None,
        }
    }

    /// Keeps `stored`, the frame of `scope`'s newest checkpoint `id` at `sequence`, as read.
    fn keep_frame(&self, scope: &Scope, id: &CheckpointId, sequence: i64, stored: &[u8]) {
        if stored.len() > FRAME_BYTES {
            return;
        }
        let mut known = self.lock();
        bounded(&mut known.frames, scope, FRAMES);
        known.frames.insert(scope.clone(), (id.clone(), sequence, stored.to_vec()));
    }

    /// The frame kept of `scope`'s newest checkpoint when a fresh lease found its sequence
    /// (`Some(None)`: the lease found the sequence of a conversation seen without any).
    fn newest_frame(&self, scope: &Scope) -> Option<Option<(CheckpointId, i64, Vec<u8>)>> {
        let mut known = self.lock();
        let frame = known.frames.remove(scope);
        let raised = self.take_raised(&mut known, scope)?;
        match frame {
            Some(frame) if frame.1 == raised => Some(Some(frame)),
            _ if known.newest.get(scope) == Some(&(raised, None)) => Some(None),
            _ => None,
        }
    }

    /// Forgets the frame kept of `scope` (its checkpoints were rewritten or pruned).
    fn drop_frame(&self, scope: &Scope) {
        self.lock().frames.remove(scope);
    }
}

impl PgStore {
    /// Saves `payload` as `scope`'s newest checkpoint (pruning to `keep`): in one statement
    /// ([`SAVE`]) when the store prepares statements (the connection carries the lock
    /// timeout), else in a transaction that locks the conversation first.
    fn save_pg(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: Option<usize>,
    ) -> Result<Saved, StoreError> {
        let saved = match self.inner.options.prepared_statements {
            true => self.save_in_one_statement(scope, fence, payload, keep)?,
            false => None,
        };
        let saved = match saved {
            Some(saved) => saved,
            None => self.transaction(|tx| save_in(tx, scope, fence, payload, keep))?,
        };
        self.inner.checkpoints.note(scope, saved.sequence, Some(saved.id.clone()));
        Ok(saved)
    }

    /// [`SAVE`] with the sequence and newest id this handle knows for `scope`, again with
    /// what the statement found when they were not the conversation's (another handle
    /// saved since); `None` when the conversation does not exist yet or the tries ran out
    /// (the caller saves in a transaction). The frame's sequence and CRC are computed here,
    /// for the sequence expected; the statement saves it only at that sequence.
    fn save_in_one_statement(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
        keep: Option<usize>,
    ) -> Result<Option<Saved>, StoreError> {
        let (tenant, name) = scope_params(scope);
        let (holder, older) = (self.inner.holder, older_kept(keep));
        let carried = i64::try_from(fence.0).unwrap_or(i64::MAX);
        // Unknown: a sequence no conversation is at, answered with the conversation's own.
        let mut expected = self.inner.checkpoints.get(scope).unwrap_or((-1, None));
        for _ in 0..SAVE_TRIES {
            let (at, floor) = &expected;
            let sequence = at.saturating_add(1);
            let id = new_id(floor.as_ref())?;
            let framed = frame::sequenced(u64::try_from(sequence).unwrap_or(0), payload);
            let key = id.as_str();
            let rows = self.run(|client| {
                Ok(client.query_typed(
                    SAVE,
                    &[
                        (&tenant, Type::TEXT),
                        (&name, Type::TEXT),
                        (at, Type::INT8),
                        (&carried, Type::INT8),
                        (&holder, Type::INT8),
                        (&key, Type::TEXT),
                        (&framed, Type::BYTEA),
                        (&older, Type::INT8),
                    ],
                )?)
            })?;
            let Some(first) = rows.first() else { return Ok(None) };
            let kind: i32 = get(first, 0)?;
            if kind != 0 {
                let pruned: Vec<Row> = rows
                    .into_iter()
                    .filter(|row| get::<i32>(row, 0).is_ok_and(|k| k == 2))
                    .collect();
                return Ok(Some(Saved { pruned: pruned_ids(&pruned, 2, 1)?, id, sequence }));
            }
            let (current, found): (i64, i64) = (get(first, 3)?, get(first, 4)?);
            check_fence(scope, fence, current, found == holder).map_err(|Failure(e)| e)?;
            let newest = match get::<Option<String>>(first, 2)? {
                Some(_) => Some(parse_id(first, 2).map_err(|Failure(e)| e)?),
                None => None,
            };
            expected = (get(first, 1)?, newest);
        }
        Ok(None)
    }
}

impl CheckpointSink for PgStore {
    fn save(
        &self,
        scope: &Scope,
        fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        let id = self.save_pg(scope, fence, payload, None)?.id;
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
        let Saved { id, pruned, .. } = self.save_pg(scope, fence, payload, Some(keep))?;
        tracing::debug!(%id, %scope, bytes = payload.len(), pruned = pruned.len(), "postgres store: checkpoint saved");
        Ok((id, Ok(pruned)))
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!("SELECT k.id, k.seq FROM {SCOPED_CHECKPOINTS} ORDER BY k.seq DESC"),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            let ids = rows.iter().map(|row| parse_id(row, 0)).collect::<Pg<Vec<_>>>()?;
            let newest = rows.first().map(|row| get::<i64>(row, 1)).transpose()?;
            self.note_newest(scope, newest.zip(ids.first()));
            Ok(ids)
        })
    }

    /// Without a query when the lease this handle took just now found the checkpoint
    /// sequence of the newest checkpoint it knows (`Known`).
    fn newest_id(&self, scope: &Scope) -> Result<Option<CheckpointId>, StoreError> {
        if let Some(newest) = self.inner.checkpoints.newest_id(scope) {
            return Ok(newest);
        }
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT k.id, k.seq FROM {SCOPED_CHECKPOINTS} ORDER BY k.seq DESC LIMIT 1"
                ),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            let Some(row) = rows.first() else { return Ok(None) };
            let id = parse_id(row, 0)?;
            self.note_newest(scope, Some((get(row, 1)?, &id)));
            Ok(Some(id))
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
        self.inner.checkpoints.drop_frame(scope);
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
        self.inner.checkpoints.drop_frame(scope);
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
        let mut fresh = match self.inner.checkpoints.newest_frame(scope) {
            Some(None) => return Ok(None),
            Some(frame) => frame,
            None => None,
        };
        for skip in 0_i64.. {
            let newest = match fresh.take() {
                Some(kept) => Some(kept),
                None => self.newest(scope, skip, 1)?.into_iter().next(),
            };
            let Some((id, seq, stored)) = newest else {
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
