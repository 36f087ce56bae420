//! Group commit: the rows of every conversation that threads of one process write at the
//! same time go to the server in one statement, one transaction, one commit
//! ([`GROUP_UPSERT`]), each conversation's fence checked on its own inside it.
//!
//! A writer queues its conversation's rows. When no statement of the group is in flight it
//! sends one with everything queued (the leader); otherwise it waits, and the statement in
//! flight's leader, once done, finds the rows queued meanwhile and the next leader sends
//! them. Nobody waits for a timer: alone, a write is one statement as before; under load the
//! rows of many conversations share a statement and its commit (the log flush). A caller
//! returns only after the statement that carried its rows committed.
//!
//! * **Fenced per conversation.** A conversation whose fence is stale writes nothing, and
//!   its caller alone gets [`StoreError::Fenced`]; the others commit.
//! * **Never waits for a lock.** Conversations another transaction holds locked are skipped
//!   (`SKIP LOCKED`), as are conversations not created yet and every conversation of a
//!   statement that failed: their callers write alone, in a transaction of their own (which
//!   waits for the lock at most the lock timeout, creates the conversation, reports its own
//!   error). So one busy conversation never holds up the others, two instances' groups never
//!   deadlock, and the statement needs no session setting (safe behind a transaction-mode
//!   pooler).
//! * **One scope once per statement**: a second write of a conversation already in the
//!   statement being built waits for the next one (its rows after the first's, in order).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use postgres::types::Type;

use super::error::{Failure, get};
use super::escape::scope_params;
use super::rows::{Columns, Param, row_conflict};
use super::{PgStore, check_fence};
use crate::store::{Fence, Scope, StoreError};

/// Most conversations one statement writes: a statement's cost stays bounded.
const MOST: usize = 64;

/// Upserts the rows of many conversations in one statement. `$1`, `$2`, `$3`: each
/// conversation's tenant, name (escaped) and the fence its write carries; `$4` this
/// handle's holder number; `$5` each row's conversation (its position in `$1`…, from 1),
/// `$6`… the rows' columns as the `messages` upsert takes them. Each conversation's row is
/// locked unless another transaction holds it (skipped), its fence checked as
/// [`check_fence`] does, its rows written only when it passes. Returns, for each
/// conversation found and locked, its position, its fence and its holder.
///
/// Each conversation is looked up on its own (`LATERAL`, the lock inside): joined with
/// the arrays, the prepared statement's generic plan scanned all of `conversations` and
/// hashed it while the table was small (400 rows: 0.13 ms of execution against 0.07).
pub(super) const GROUP_UPSERT: &str = concat!(
    "
WITH c AS (
    SELECT b.k, c.id, c.fence AS current, c.holder, b.fence AS carried
    FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS b(tenant, name, fence, k),
    LATERAL (SELECT id, fence, holder FROM conversations
             WHERE tenant = b.tenant AND name = b.name
             FOR NO KEY UPDATE SKIP LOCKED) c
), allowed AS (
    SELECT k, id FROM c
    WHERE carried = 0 OR current = 0 OR (current = carried AND holder = $4)
), written AS (
    INSERT INTO messages AS m (conversation_id, id, unit, level, role, content, tool_calls,
        tool_text, tool_call_id, original, timestamp, tokens, name, is_error, raw, checksum)
    SELECT allowed.id, r.id, r.unit, r.level, r.role, r.content, r.tool_calls, r.tool_text,
        r.tool_call_id, r.original, r.timestamp, r.tokens, r.name, r.is_error, r.raw,
        r.checksum
    FROM unnest($5::int8[], $6::int8[], $7::int8[], $8::int2[], $9::text[], $10::text[],
        $11::text[], $12::text[], $13::text[], $14::text[], $15::int8[], $16::int8[],
        $17::text[], $18::bool[], $19::text[], $20::int8[])
        AS r(k, id, unit, level, role, content, tool_calls, tool_text, tool_call_id,
             original, timestamp, tokens, name, is_error, raw, checksum)
    JOIN allowed ON allowed.k = r.k",
    row_conflict!(),
    "
    RETURNING 1
)
SELECT k, current, holder FROM c"
);

/// The writes of a process's threads waiting to go in a statement, and what the statements
/// sent answered for each.
#[derive(Default)]
pub(super) struct Group {
    state: Mutex<State>,
    answered: Condvar,
}

#[derive(Default)]
struct State {
    next: u64,
    queued: Vec<Queued>,
    /// Whether a statement of the group is in flight (its leader sends it).
    leading: bool,
    outcomes: HashMap<u64, Outcome>,
    /// Statements sent, and the writes they carried.
    statements: u64,
    writes: u64,
}

/// One caller's write: its ticket, conversation, fence and rows.
struct Queued {
    ticket: u64,
    scope: Scope,
    fence: Fence,
    rows: Columns,
}

/// What became of a queued write.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// Written and committed.
    Written,
    /// Refused: the conversation's newest fence and whether this handle took it.
    Refused { current: i64, own: bool },
    /// Not written: the caller writes alone.
    Alone,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `rows` of `scope` under `fence` and returns what became of them: sent by this
    /// thread, when no statement is in flight, with everything queued meanwhile (`send`
    /// answers each write of the batch in order), or by the thread leading then.
    fn write(
        &self,
        scope: &Scope,
        fence: Fence,
        rows: Columns,
        mut send: impl FnMut(&mut [Queued]) -> Vec<Outcome>,
    ) -> Outcome {
        let mut state = self.lock();
        let ticket = state.next;
        state.next += 1;
        state.queued.push(Queued { ticket, scope: scope.clone(), fence, rows });
        loop {
            if let Some(outcome) = state.outcomes.remove(&ticket) {
                return outcome;
            }
            if state.leading {
                state = self.answered.wait(state).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.leading = true;
            let mut batch = take_batch(&mut state.queued);
            drop(state);
            let tickets = batch.iter().map(|q| q.ticket).filter(|&t| t != ticket).collect();
            let mut leading = Leading { group: self, tickets };
            let outcomes = send(&mut batch);
            let mut answered = self.lock();
            answered.statements += 1;
            answered.writes += batch.len() as u64;
            for (queued, outcome) in batch.iter().zip(outcomes) {
                answered.outcomes.insert(queued.ticket, outcome);
            }
            drop(answered);
            leading.tickets.clear();
            drop(leading);
            state = self.lock();
        }
    }
}

/// Clears the group's leader when the statement is done, whatever happened to it: a
/// leader that panicked left its batch's writes (`tickets`) unanswered, and their callers
/// would wait for ever, or lead empty statements for ever; they write alone instead.
struct Leading<'a> {
    group: &'a Group,
    /// The other callers' writes of the statement in flight still without an outcome (the
    /// leader's own is answered by its return, or by its panic).
    tickets: Vec<u64>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut state = self.group.lock();
        for &ticket in &self.tickets {
            state.outcomes.entry(ticket).or_insert(Outcome::Alone);
        }
        state.leading = false;
        drop(state);
        self.group.answered.notify_all();
    }
}

impl PgStore {
    /// Writes `rows` of `scope` under `fence` with the rows other threads write at the same
    /// time, in one statement; returns once it committed. `false` when nothing was written
    /// and the caller is to write alone (the conversation is not created yet, another
    /// transaction holds it, or the statement failed).
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when `fence` is stale.
    pub(super) fn group_upsert(
        &self,
        scope: &Scope,
        fence: Fence,
        rows: Columns,
    ) -> Result<bool, StoreError> {
        let outcome = self.inner.group.write(scope, fence, rows, |batch| self.send_group(batch));
        match outcome {
            Outcome::Written => Ok(true),
            Outcome::Alone => Ok(false),
            Outcome::Refused { current, own } => {
                check_fence(scope, fence, current, own).map_err(|Failure(e)| e)?;
                Ok(false)
            }
        }
    }

    /// Sends `batch` in one [`GROUP_UPSERT`]: what became of each write, in order (every one
    /// [`Outcome::Alone`] when the statement failed).
    fn send_group(&self, batch: &mut [Queued]) -> Vec<Outcome> {
        let mut tenants = Vec::with_capacity(batch.len());
        let mut names = Vec::with_capacity(batch.len());
        let mut fences = Vec::with_capacity(batch.len());
        let mut positions = Vec::new();
        let mut rows = Columns::default();
        for (at, queued) in batch.iter_mut().enumerate() {
            let (tenant, name) = scope_params(&queued.scope);
            tenants.push(tenant);
            names.push(name);
            fences.push(i64::try_from(queued.fence.0).unwrap_or(i64::MAX));
            let k = i64::try_from(at + 1).unwrap_or(i64::MAX);
            positions.extend(std::iter::repeat_n(k, queued.rows.len()));
            rows.append(std::mem::take(&mut queued.rows));
        }
        let holder = self.inner.holder;
        let found = self.run(|client| {
            let mut params: Vec<Param<'_>> = vec![
                (&tenants, Type::TEXT_ARRAY),
                (&names, Type::TEXT_ARRAY),
                (&fences, Type::INT8_ARRAY),
                (&holder, Type::INT8),
                (&positions, Type::INT8_ARRAY),
            ];
            params.extend(rows.params());
            let found = client.query_typed(GROUP_UPSERT, &params)?;
            let mut by_position = HashMap::with_capacity(found.len());
            for row in &found {
                let (k, current, by): (i64, i64, i64) = (get(row, 0)?, get(row, 1)?, get(row, 2)?);
                by_position.insert(k, (current, by));
            }
            Ok(by_position)
        });
        let found = match found {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%error, writes = batch.len(), "postgres store: group write failed; each writes alone");
                return vec![Outcome::Alone; batch.len()];
            }
        };
        tracing::trace!(writes = batch.len(), "postgres store: group committed");
        batch
            .iter()
            .enumerate()
            .map(|(at, queued)| {
                let k = i64::try_from(at + 1).unwrap_or(i64::MAX);
                match found.get(&k) {
                    None => Outcome::Alone,
                    Some(&(current, by)) => {
                        let own = by == holder;
                        if check_fence(&queued.scope, queued.fence, current, own).is_ok() {
                            Outcome::Written
                        } else {
                            Outcome::Refused { current, own }
                        }
                    }
                }
            })
            .collect()
    }
}

/// Takes from `queued` the writes the next statement sends: at most [`MOST`], one per
/// conversation (a later write of a conversation taken stays queued, after it in order).
fn take_batch(queued: &mut Vec<Queued>) -> Vec<Queued> {
    let mut batch: Vec<Queued> = Vec::new();
    let mut left = Vec::new();
    for write in queued.drain(..) {
        let taken = left.iter().any(|other: &Queued| other.scope == write.scope)
            || batch.iter().any(|other| other.scope == write.scope);
        if taken || batch.len() >= MOST {
            left.push(write);
        } else {
            batch.push(write);
        }
    }
    *queued = left;
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::TestSchema;
    use crate::store::{ArchiveStore, ArchivedMessage, ErrorKind};
    use crate::{ChatMessage, core::Role};

    fn rows(scope: &Scope, texts: &[&str]) -> Columns {
        let rows: Vec<ArchivedMessage> = (1..)
            .zip(texts)
            .map(|(id, text)| ArchivedMessage::new(id, id, ChatMessage::text(Role::User, *text)))
            .collect();
        super::super::rows::encode(scope, &rows).unwrap()
    }

    fn texts(store: &PgStore, scope: &Scope) -> Vec<String> {
        store.rows_after(scope, 0, 100).unwrap().into_iter().map(|r| r.message.content).collect()
    }

    /// A leader that panics while its statement is out leaves no write of its batch waiting:
    /// the other caller of the batch gets `Alone` (it writes alone) without sending a
    /// statement, and the group takes writes again. No server needed: the statements are
    /// stand-ins.
    #[test]
    fn a_leader_that_panics_leaves_its_batch_to_write_alone() {
        let group = Group::default();
        let scopes: Vec<Scope> = (0..3).map(|n| Scope::new("t", format!("c{n}"))).collect();
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let write = |scope: &Scope, first: bool| {
            group.write(scope, Fence::NONE, Columns::default(), |batch| {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if !first {
                    std::panic::panic_any("the statement's leader failed mid-way");
                }
                // The first statement stays out until both other writes are queued behind
                // it: the next statement carries the two.
                while group.lock().queued.len() < 2 {
                    std::thread::yield_now();
                }
                vec![Outcome::Written; batch.len()]
            })
        };
        let (first, others) = std::thread::scope(|threads| {
            let first = threads.spawn(|| write(&scopes[0], true));
            while !group.lock().leading {
                std::thread::yield_now();
            }
            let others: Vec<_> = scopes[1..]
                .iter()
                .map(|scope| threads.spawn(move || write(scope, false)))
                .collect();
            (first.join(), others.into_iter().map(|h| h.join()).collect::<Vec<_>>())
        });
        assert!(matches!(first, Ok(Outcome::Written)), "{first:?}");
        let panicked = others.iter().filter(|result| result.is_err()).count();
        let alone = others.iter().filter(|result| matches!(result, Ok(Outcome::Alone))).count();
        assert_eq!((panicked, alone), (1, 1), "{others:?}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 2, "no empty statement");
        let state = group.lock();
        assert!(state.queued.is_empty() && state.outcomes.is_empty() && !state.leading);
        drop(state);
        let written = |batch: &mut [Queued]| vec![Outcome::Written; batch.len()];
        let next = group.write(&scopes[1], Fence::NONE, Columns::default(), written);
        assert!(matches!(next, Outcome::Written), "the group goes on");
    }

    /// One statement carries three conversations: one under a stale fence (refused alone,
    /// nothing of it written), one whose lease is current (written), one not created yet
    /// (left to write alone); and a conversation another transaction holds locked is skipped
    /// instead of waited for.
    #[test]
    fn one_statement_fences_each_conversation_on_its_own() {
        let Some(schema) = TestSchema::new("group fence") else { return };
        let schema = schema.unwrap();
        let (a, b) = (schema.open().unwrap(), schema.open().unwrap());
        let (stale, held, new, locked) = (
            Scope::new("t", "stale"),
            Scope::new("t", "held"),
            Scope::new("t", "new"),
            Scope::new("t", "locked"),
        );
        let old = a.acquire(&stale).unwrap();
        let current = b.acquire(&stale).unwrap();
        let fence = a.acquire(&held).unwrap();
        let lock_fence = a.acquire(&locked).unwrap();
        let mut batch = vec![
            Queued { ticket: 0, scope: stale.clone(), fence: old, rows: rows(&stale, &["x", "y"]) },
            Queued { ticket: 1, scope: held.clone(), fence, rows: rows(&held, &["kept", "too"]) },
            Queued { ticket: 2, scope: new.clone(), fence: Fence::NONE, rows: rows(&new, &["n"]) },
            Queued {
                ticket: 3,
                scope: locked.clone(),
                fence: lock_fence,
                rows: rows(&locked, &["l"]),
            },
        ];
        let mut other = schema.client().unwrap();
        let mut holding = other.transaction().unwrap();
        holding
            .execute("SELECT 1 FROM conversations WHERE name = 'locked' FOR UPDATE", &[])
            .unwrap();
        let outcomes = a.send_group(&mut batch);
        holding.rollback().unwrap();
        assert!(
            matches!(outcomes[0], Outcome::Refused { current: c, own: false } if c == current.0 as i64),
            "{outcomes:?}"
        );
        assert!(matches!(outcomes[1], Outcome::Written), "{outcomes:?}");
        assert!(matches!(outcomes[2], Outcome::Alone), "{outcomes:?}");
        assert!(matches!(outcomes[3], Outcome::Alone), "{outcomes:?}");
        assert_eq!(texts(&a, &held), ["kept", "too"]);
        assert!(texts(&a, &stale).is_empty(), "a fenced conversation's rows are absent");
        assert!(texts(&a, &new).is_empty());
        assert!(texts(&a, &locked).is_empty());
    }

    /// Threads writing at once, each its own conversation, one of them under a stale fence:
    /// every other thread's rows are all there, the fenced one gets `Fenced` and wrote none,
    /// and the statements carried several conversations each.
    #[test]
    fn writers_at_once_share_statements_and_a_fenced_one_fails_alone() {
        let Some(schema) = TestSchema::new("group threads") else { return };
        let schema = schema.unwrap();
        let (store, rival) = (schema.open().unwrap(), schema.open().unwrap());
        let scopes: Vec<Scope> = (0..16).map(|n| Scope::new("t", format!("c{n}"))).collect();
        let fences: Vec<Fence> = scopes.iter().map(|s| store.acquire(s).unwrap()).collect();
        rival.acquire(&scopes[5]).unwrap();
        let results: Vec<Vec<Result<(), StoreError>>> = std::thread::scope(|threads| {
            let handles: Vec<_> = scopes
                .iter()
                .zip(&fences)
                .map(|(scope, &fence)| {
                    let store = &store;
                    threads.spawn(move || {
                        (1..=20)
                            .map(|id| {
                                let text = format!("{scope} row {id}");
                                let row = ArchivedMessage::new(
                                    id,
                                    id,
                                    ChatMessage::text(Role::User, text),
                                );
                                store.put(scope, fence, &[row])
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        for (n, (scope, results)) in scopes.iter().zip(&results).enumerate() {
            if n == 5 {
                assert!(
                    results.iter().all(|r| r.as_ref().unwrap_err().kind() == ErrorKind::Fenced)
                );
                assert!(texts(&store, scope).is_empty());
            } else {
                assert!(results.iter().all(Result::is_ok), "{scope}: {results:?}");
                let expected: Vec<String> =
                    (1..=20).map(|id| format!("{scope} row {id}")).collect();
                assert_eq!(texts(&store, scope), expected);
            }
        }
        let state = store.inner.group.lock();
        assert!(state.queued.is_empty() && state.outcomes.is_empty() && !state.leading);
        assert_eq!(state.writes, 16 * 20);
        assert!(state.statements < state.writes, "{} statements", state.statements);
    }
}
