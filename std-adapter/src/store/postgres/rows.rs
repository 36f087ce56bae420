//! Message rows: a batch of writes (rows, summaries, compression events of one or more
//! conversations) in one transaction, rows read back verified, deletes and the list of
//! conversations.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use postgres::Row;
use postgres::types::{ToSql, Type};

use super::error::{Failure, Pg, from_sql_int, get};
use super::escape::{escape, escape_opt, scope_params, unescape, unescape_opt};
use super::{PgStore, Tx, lock_scope, row_name, sql_limit};
use crate::message::{ChatMessage, ToolCall};
use crate::store::error::to_i64;
use crate::store::{ArchivedMessage, Scope, StoreError, Write, WriteOp, checksum};
use ctxwin_core::Role;

/// The `messages` columns [`decode_unverified`] reads, in its order, for a table aliased `m`.
pub(super) const MESSAGE_COLUMNS: &str = "m.id, m.unit, m.level, m.role, m.content, \
     m.tool_calls, m.tool_call_id, m.original, m.timestamp, m.tokens, m.name, m.is_error, \
     m.raw, m.checksum";

/// Rows of one conversation: `$1` its tenant, `$2` its name (both escaped).
pub(super) const SCOPED_MESSAGES: &str = "messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.tenant = $1 AND c.name = $2";

/// The conflict clause of every `messages` upsert (aliased `m`): a row identical to the stored
/// one writes nothing (no new row version, no index churn), a changed one is rewritten, and
/// one whose indexed text changed loses its search vector (the next search of its
/// conversation indexes it again; its old length stays counted until then: see schema V4).
macro_rules! row_conflict {
    () => {
        "
ON CONFLICT (conversation_id, id) DO UPDATE SET
    unit = excluded.unit, level = excluded.level, role = excluded.role,
    content = excluded.content, tool_calls = excluded.tool_calls,
    tool_text = excluded.tool_text, tool_call_id = excluded.tool_call_id,
    original = excluded.original, timestamp = excluded.timestamp, tokens = excluded.tokens,
    name = excluded.name, is_error = excluded.is_error, raw = excluded.raw,
    checksum = excluded.checksum,
    search = CASE WHEN (m.content, m.tool_text, m.original)
                       IS NOT DISTINCT FROM (excluded.content, excluded.tool_text, excluded.original)
                  THEN m.search END
WHERE (m.unit, m.level, m.role, m.content, m.tool_calls, m.tool_call_id, m.original,
       m.timestamp, m.tokens, m.name, m.is_error, m.raw, m.checksum)
   IS DISTINCT FROM
      (excluded.unit, excluded.level, excluded.role, excluded.content, excluded.tool_calls,
       excluded.tool_call_id, excluded.original, excluded.timestamp, excluded.tokens,
       excluded.name, excluded.is_error, excluded.raw, excluded.checksum)"
    };
}
pub(super) use row_conflict;

/// Upserts rows given as parallel arrays; a row identical to the stored one writes nothing
/// (no new row version, no index churn).
pub(super) const UPSERT: &str = concat!(
    "
INSERT INTO messages AS m (conversation_id, id, unit, level, role, content, tool_calls,
    tool_text, tool_call_id, original, timestamp, tokens, name, is_error, raw, checksum)
SELECT $1, r.* FROM unnest($2::int8[], $3::int8[], $4::int2[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::int8[], $13::text[],
    $14::bool[], $15::text[], $16::int8[]) AS r
",
    row_conflict!()
);

/// The highest message id of each conversation this handle knows is stored (it wrote or
/// read it); at most [`ARCHIVED`] conversations. Deletes through this handle forget their
/// conversation, and so does a lease it takes: a delete through another handle needs the
/// lease (only an operator's unfenced delete can make it stale while this one holds it).
#[derive(Default)]
pub(super) struct Archived(Mutex<HashMap<Scope, u64>>);

/// Conversations [`Archived`] holds at most (it starts over when full).
const ARCHIVED: usize = 4_096;

impl Archived {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, u64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rows of `scope` through `id` are stored.
    pub(super) fn stored(&self, scope: &Scope, id: u64) {
        let mut known = self.lock();
        if known.len() >= ARCHIVED && !known.contains_key(scope) {
            known.clear();
        }
        let highest = known.entry(scope.clone()).or_insert(id);
        *highest = (*highest).max(id);
    }

    /// Whether rows of `scope` through `id` are known stored.
    pub(super) fn reaches(&self, scope: &Scope, id: u64) -> bool {
        self.lock().get(scope).is_some_and(|highest| *highest >= id)
    }

    /// Forgets what was known of `scope` (rows of it deleted).
    pub(super) fn forget(&self, scope: &Scope) {
        self.lock().remove(scope);
    }
}

/// A statement parameter with its type.
pub(super) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Rows checked and encoded as the parallel arrays [`UPSERT`] takes.
#[derive(Default)]
pub(super) struct Columns {
    ids: Vec<i64>,
    units: Vec<i64>,
    levels: Vec<i16>,
    roles: Vec<String>,
    contents: Vec<String>,
    tool_calls: Vec<Option<String>>,
    tool_texts: Vec<String>,
    tool_call_ids: Vec<Option<String>>,
    originals: Vec<Option<String>>,
    timestamps: Vec<i64>,
    tokens: Vec<i64>,
    names: Vec<Option<String>>,
    errors: Vec<bool>,
    raws: Vec<Option<String>>,
    checksums: Vec<i64>,
}

impl Columns {
    /// How many rows.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Appends `other`'s rows after these.
    pub(super) fn append(&mut self, mut other: Self) {
        self.ids.append(&mut other.ids);
        self.units.append(&mut other.units);
        self.levels.append(&mut other.levels);
        self.roles.append(&mut other.roles);
        self.contents.append(&mut other.contents);
        self.tool_calls.append(&mut other.tool_calls);
        self.tool_texts.append(&mut other.tool_texts);
        self.tool_call_ids.append(&mut other.tool_call_ids);
        self.originals.append(&mut other.originals);
        self.timestamps.append(&mut other.timestamps);
        self.tokens.append(&mut other.tokens);
        self.names.append(&mut other.names);
        self.errors.append(&mut other.errors);
        self.raws.append(&mut other.raws);
        self.checksums.append(&mut other.checksums);
    }

    /// The columns as statement parameters, in the order [`UPSERT`] and
    /// [`GROUP_UPSERT`](super::group) take them after their leading ones.
    pub(super) fn params(&self) -> [Param<'_>; 15] {
        [
            (&self.ids, Type::INT8_ARRAY),
            (&self.units, Type::INT8_ARRAY),
            (&self.levels, Type::INT2_ARRAY),
            (&self.roles, Type::TEXT_ARRAY),
            (&self.contents, Type::TEXT_ARRAY),
            (&self.tool_calls, Type::TEXT_ARRAY),
            (&self.tool_texts, Type::TEXT_ARRAY),
            (&self.tool_call_ids, Type::TEXT_ARRAY),
            (&self.originals, Type::TEXT_ARRAY),
            (&self.timestamps, Type::INT8_ARRAY),
            (&self.tokens, Type::INT8_ARRAY),
            (&self.names, Type::TEXT_ARRAY),
            (&self.errors, Type::BOOL_ARRAY),
            (&self.raws, Type::TEXT_ARRAY),
            (&self.checksums, Type::INT8_ARRAY),
        ]
    }
}

/// The text of a message's tool calls the index searches: names and arguments.
fn tool_text(message: &ArchivedMessage) -> String {
    let calls = &message.message.tool_calls;
    calls
        .iter()
        .map(|call| format!("{} {}", call.name, call.arguments))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks and encodes `rows` of `scope`; a row put twice in one batch is its last version.
pub(super) fn encode(scope: &Scope, rows: &[ArchivedMessage]) -> Pg<Columns> {
    let mut columns = Columns::default();
    for (index, row) in rows.iter().enumerate() {
        let id = to_i64("message id", row.id)?;
        let unit = to_i64("unit id", row.unit)?;
        let timestamp = to_i64("timestamp", row.timestamp)?;
        if rows.get(index + 1..).is_some_and(|later| later.iter().any(|r| r.id == row.id)) {
            continue;
        }
        let m = &row.message;
        let calls = if m.tool_calls.is_empty() {
            None
        } else {
            Some(escape(&serde_json::to_string(&m.tool_calls)?).into_owned())
        };
        columns.ids.push(id);
        columns.units.push(unit);
        columns.levels.push(i16::from(crate::store::types::level_code(row.level)));
        columns.roles.push(m.role.as_str().to_string());
        columns.contents.push(escape(&m.content).into_owned());
        columns.tool_calls.push(calls);
        columns.tool_texts.push(escape(&tool_text(row)).into_owned());
        columns.tool_call_ids.push(escape_opt(m.tool_call_id.as_deref()));
        columns.originals.push(escape_opt(row.original.as_deref()));
        columns.timestamps.push(timestamp);
        columns.tokens.push(i64::from(row.tokens));
        columns.names.push(escape_opt(m.name.as_deref()));
        columns.errors.push(m.is_error);
        columns.raws.push(escape_opt(row.raw.as_deref()));
        columns.checksums.push(checksum::message(scope, row) as i64);
    }
    Ok(columns)
}

/// Upserts encoded rows of conversation `conversation` inside `tx`.
pub(super) fn upsert(tx: &mut Tx<'_>, conversation: i64, rows: &Columns) -> Pg<()> {
    if rows.ids.is_empty() {
        return Ok(());
    }
    let mut params: Vec<Param<'_>> = vec![(&conversation, Type::INT8)];
    params.extend(rows.params());
    tx.query(UPSERT, &params)?;
    Ok(())
}

/// A write of a batch, checked and encoded before the transaction starts.
enum Prepared {
    Rows(Box<Columns>),
    Summary(super::summaries::Encoded),
    Compression(super::metrics::EncodedEvent),
}

/// Decodes one row selected with [`MESSAGE_COLUMNS`] first and verifies its checksum.
pub(super) fn decode_message(scope: &Scope, row: &Row) -> Pg<ArchivedMessage> {
    let decoded = decode_unverified(scope, row)?;
    verify(scope, decoded, get(row, 13)?)
}

/// `decoded` if `stored` is its checksum.
pub(super) fn verify(scope: &Scope, decoded: ArchivedMessage, stored: i64) -> Pg<ArchivedMessage> {
    let computed = checksum::message(scope, &decoded);
    if stored as u64 == computed {
        return Ok(decoded);
    }
    Err(Failure(checksum::mismatch(row_name(scope, decoded.id), stored as u64, computed)))
}

/// Decodes one row selected with [`MESSAGE_COLUMNS`] first, without its checksum.
pub(super) fn decode_unverified(scope: &Scope, row: &Row) -> Pg<ArchivedMessage> {
    let id = from_sql_int("message id", get(row, 0)?)?;
    let damaged = |detail: String| Failure(StoreError::damaged(row_name(scope, id), detail));
    let text = |index: usize| -> Pg<String> { unescape(get(row, index)?).map_err(damaged) };
    let optional =
        |index: usize| -> Pg<Option<String>> { unescape_opt(get(row, index)?).map_err(damaged) };
    let level: i16 = get(row, 2)?;
    let level = u8::try_from(level)
        .ok()
        .and_then(crate::store::types::level_from_code)
        .ok_or_else(|| damaged(format!("unknown level {level}")))?;
    let role_name: String = get(row, 3)?;
    let role =
        Role::parse(&role_name).ok_or_else(|| damaged(format!("unknown role {role_name:?}")))?;
    let tool_calls: Vec<ToolCall> = match optional(5)? {
        Some(json) => {
            serde_json::from_str(&json).map_err(|e| damaged(format!("tool calls: {e}")))?
        }
        None => Vec::new(),
    };
    let tokens: i64 = get(row, 9)?;
    Ok(ArchivedMessage {
        id,
        unit: from_sql_int("unit id", get(row, 1)?)?,
        level,
        message: ChatMessage {
            role,
            content: text(4)?,
            tool_calls,
            tool_call_id: optional(6)?,
            name: optional(10)?,
            is_error: get(row, 11)?,
        },
        timestamp: from_sql_int("timestamp", get(row, 8)?)?,
        tokens: u32::try_from(tokens).map_err(|_| damaged(format!("token count {tokens}")))?,
        original: optional(7)?,
        raw: optional(12)?,
    })
}

impl PgStore {
    /// Applies `writes` in one transaction, in order; every value is checked and encoded
    /// first, so bad input sends nothing.
    pub(super) fn commit(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        // One conversation's rows go with the rows of the conversations other threads write
        // at the same time: one statement, one commit for all (see `group`).
        if let [Write { scope, fence, op: WriteOp::Rows(rows) }] = writes
            && self.group_upsert(scope, *fence, encode(scope, rows)?)?
        {
            self.note_stored(writes);
            return Ok(());
        }
        let prepared = writes
            .iter()
            .map(|write| {
                Ok(match write.op {
                    WriteOp::Rows(rows) => Prepared::Rows(Box::new(encode(write.scope, rows)?)),
                    WriteOp::Summary(record) => {
                        Prepared::Summary(super::summaries::encode(write.scope, record)?)
                    }
                    WriteOp::Compression(record) => {
                        Prepared::Compression(super::metrics::encode_event(record)?)
                    }
                })
            })
            .collect::<Pg<Vec<_>>>()?;
        // Conversations are locked in one order by every writer (no deadlock between two
        // batches of the same conversations), each once, and every write's fence checked.
        let mut scopes: Vec<&Scope> = writes.iter().map(|write| write.scope).collect();
        scopes.sort();
        scopes.dedup();
        self.transaction(|tx| {
            let mut ids = Vec::with_capacity(scopes.len());
            for scope in &scopes {
                let fence = writes
                    .iter()
                    .filter(|write| write.scope == *scope)
                    .map(|write| write.fence)
                    .filter(|fence| !fence.is_none())
                    .min()
                    .unwrap_or_default();
                ids.push(lock_scope(tx, scope, fence, true)?.unwrap_or_default());
            }
            for (write, prepared) in writes.iter().zip(&prepared) {
                let at = scopes.binary_search(&write.scope).unwrap_or_default();
                let conversation = ids.get(at).copied().unwrap_or_default();
                match prepared {
                    Prepared::Rows(rows) => upsert(tx, conversation, rows)?,
                    Prepared::Summary(summary) => {
                        super::summaries::upsert(tx, conversation, summary)?;
                    }
                    Prepared::Compression(event) => {
                        super::metrics::insert_event(tx, conversation, event)?;
                    }
                }
            }
            Ok(())
        })?;
        self.note_stored(writes);
        tracing::trace!(writes = writes.len(), "postgres store: batch committed");
        Ok(())
    }

    /// Notes the rows of `writes`, committed, as stored ([`Archived`]).
    fn note_stored(&self, writes: &[Write<'_>]) {
        for write in writes {
            if let WriteOp::Rows(rows) = write.op
                && let Some(highest) = rows.iter().map(|row| row.id).max()
            {
                self.inner.archived.stored(write.scope, highest);
            }
        }
    }

    pub(super) fn get_many_pg(
        &self,
        scope: &Scope,
        ids: &[u64],
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        let mut list: Vec<i64> = ids.iter().filter_map(|&id| i64::try_from(id).ok()).collect();
        list.sort_unstable();
        list.dedup();
        if list.is_empty() {
            return Ok(Vec::new());
        }
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM {SCOPED_MESSAGES} AND m.id = ANY($3)
                     ORDER BY m.id"
                ),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT), (&list, Type::INT8_ARRAY)],
            )?;
            rows.iter().map(|row| decode_message(scope, row)).collect()
        })
    }

    pub(super) fn rows_after_pg(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        let Ok(after) = i64::try_from(after) else { return Ok(Vec::new()) };
        let (tenant, name) = scope_params(scope);
        let limit = sql_limit(limit);
        self.run(|client| {
            let rows = client.query_typed(
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM {SCOPED_MESSAGES} AND m.id > $3
                     ORDER BY m.id LIMIT $4"
                ),
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&after, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )?;
            let rows = rows.iter().map(|row| decode_message(scope, row)).collect::<Pg<Vec<_>>>()?;
            if let Some(last) = rows.last() {
                self.inner.archived.stored(scope, last.id);
            }
            Ok(rows)
        })
    }

    pub(super) fn max_id_pg(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        let (tenant, name) = scope_params(scope);
        self.run(|client| {
            let row = client.query_typed_one(
                &format!("SELECT max(m.id) FROM {SCOPED_MESSAGES}"),
                &[(&tenant, Type::TEXT), (&name, Type::TEXT)],
            )?;
            let max: Option<i64> = get(&row, 0)?;
            let max = max.map(|id| from_sql_int("message id", id)).transpose()?;
            if let Some(max) = max {
                self.inner.archived.stored(scope, max);
            }
            Ok(max)
        })
    }

    pub(super) fn delete_from_pg(
        &self,
        scope: &Scope,
        fence: crate::store::Fence,
        first: u64,
    ) -> Result<u64, StoreError> {
        let first = to_i64("message id", first)?;
        self.inner.archived.forget(scope);
        self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else { return Ok(0) };
            let params: [Param<'_>; 2] = [(&conversation, Type::INT8), (&first, Type::INT8)];
            let deleted = count(tx.query(
                "WITH gone AS (DELETE FROM messages WHERE conversation_id = $1 AND id >= $2
                               RETURNING 1)
                 SELECT count(*) FROM gone",
                &params,
            )?)?;
            tx.query("DELETE FROM summaries WHERE conversation_id = $1 AND id >= $2", &params)?;
            Ok(deleted)
        })
    }

    pub(super) fn delete_conversation_pg(
        &self,
        scope: &Scope,
        fence: crate::store::Fence,
    ) -> Result<u64, StoreError> {
        self.inner.archived.forget(scope);
        self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else { return Ok(0) };
            let params: [(&(dyn postgres::types::ToSql + Sync), Type); 1] =
                [(&conversation, Type::INT8)];
            let deleted = count(tx.query(
                "WITH gone AS (DELETE FROM messages WHERE conversation_id = $1 RETURNING 1)
                 SELECT count(*) FROM gone",
                &params,
            )?)?;
            tx.query("DELETE FROM summaries WHERE conversation_id = $1", &params)?;
            tx.query("DELETE FROM compression_events WHERE conversation_id = $1", &params)?;
            // The conversation's row stays: it holds the fence, so a writer holding an old
            // lease stays refused.
            Ok(deleted)
        })
    }

    pub(super) fn conversations_pg(
        &self,
        tenant: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (tenant, prefix) = (escape(tenant).into_owned(), escape(prefix).into_owned());
        self.run(|client| {
            let rows = client.query_typed(
                "SELECT c.name FROM conversations c
                 WHERE c.tenant = $1 AND starts_with(c.name, $2)
                   AND (EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id)
                     OR EXISTS (SELECT 1 FROM summaries u WHERE u.conversation_id = c.id)
                     OR EXISTS (SELECT 1 FROM compression_events e
                                WHERE e.conversation_id = c.id))",
                &[(&tenant, Type::TEXT), (&prefix, Type::TEXT)],
            )?;
            let mut names = rows
                .iter()
                .map(|row| {
                    unescape(get(row, 0)?).map_err(|detail| {
                        Failure(StoreError::damaged("a conversation's name", detail))
                    })
                })
                .collect::<Pg<Vec<String>>>()?;
            names.sort();
            Ok(names)
        })
    }
}

/// The count a `SELECT count(*)` returned.
pub(super) fn count(rows: Vec<Row>) -> Pg<u64> {
    match rows.first() {
        Some(row) => Ok(from_sql_int("row count", get(row, 0)?)?),
        None => Ok(0),
    }
}
