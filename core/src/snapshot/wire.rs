//! What the snapshot body is made of, field by field, and its encoder: postcard's wire format
//! (LEB128 varints for `u16`/`u32`/`u64`, `u8` raw, `Option` as a 0/1 tag, byte strings as a
//! varint length then the bytes) written by hand, straight from the manager's own types, so
//! the format never changes with them by accident and no serde code reaches the firmware.
//!
//! The `*Wire` mirrors below (tests only) derive serde: the tests encode them with postcard
//! itself and check that both encoders write the same bytes and the decoder reads postcard's.

#[cfg(test)]
use serde::{Deserialize, Serialize};

use super::flavor::Out;
use crate::config::Config;
use crate::config::RETIRED_CHECKPOINT_INTERVAL;
#[cfg(test)]
use crate::config::StrategyKind;
#[cfg(test)]
use crate::config::{DynamicPlacement, OutboxMode, UnansweredCalls};
#[cfg(test)]
use crate::entities::EntitySchema;
use crate::entities::{Entities, MAX_ENTITY_KEY_LEN, MAX_ENTITY_KEYS};
use crate::header::{Header, flags};
use crate::level::Level;
#[cfg(test)]
use crate::manager::Pending;
use crate::manager::State;
use crate::record::{self, Trailer};
use crate::ring::RingRef;
use crate::role::Role;
#[cfg(test)]
use crate::stats::Counters;

/// `"CWSN"`: ctxwin snapshot.
pub(crate) const MAGIC: [u8; 4] = *b"CWSN";
/// The format version this build writes. Version 5 added each record's supersede key (after
/// its terms; 0 for none). Version 4 appended `compaction_limit` to the
/// configuration and marks a record pushed whole ([`WIRE_WHOLE`]); version 3 appended the task
/// table to the body;
/// version 2 (no task table) is still read, as a manager without tasks. Version 2 added the
/// water marks, `fit_budgets`, `dynamic_placement`, `tool_call_overhead` and
/// `lock_newest_user` at the end of the configuration and the cache counters; version-1 bytes
/// are refused with `SnapshotError::UnsupportedVersion { found: 1 }`.
pub(crate) const FORMAT_VERSION: u16 = 5;
/// The oldest version this build reads.
pub(crate) const OLDEST_READ: u16 = 2;
/// The first version with a task table at the end of the body.
pub(crate) const TASKS_SINCE: u16 = 3;
/// The first version with `compaction_limit` and [`WIRE_WHOLE`].
pub(crate) const WHOLE_SINCE: u16 = 4;
/// The first version with a record's supersede key.
pub(crate) const KEY_SINCE: u16 = 5;
/// A record's wire flags bit for a tool result pushed whole (the trailer's `whole`): the bit
/// of `flags::TRAILER`, which the wire never carries.
pub(crate) const WIRE_WHOLE: u8 = flags::TRAILER;
/// Bytes before the body: magic, version, flags, fingerprint, 4 × capacities, body length.
pub(crate) const HEADER_LEN: usize = 4 + 2 + 2 + 4 + 4 * 8 + 4;
/// Bytes after the body: the CRC.
pub(crate) const TRAILER_LEN: usize = 4;

/// Largest postcard varint of a `u16`, `u32`, `u64`.
pub(crate) const V16: usize = 3;
pub(crate) const V32: usize = 5;
pub(crate) const V64: usize = 10;

/// An entity schema on the wire: a sequence of key strings.
#[cfg(test)]
pub(crate) struct SchemaWire(pub EntitySchema);

#[cfg(test)]
impl Serialize for SchemaWire {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // An exact length: postcard cannot encode a sequence of unknown length.
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for key in self.0.keys() {
            seq.serialize_element(key)?;
        }
        seq.end()
    }
}

#[cfg(test)]
impl<'de> Deserialize<'de> for SchemaWire {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = SchemaWire;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("entity keys")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SchemaWire, A::Error> {
                let mut schema = EntitySchema::EMPTY;
                while let Some(key) = seq.next_element::<&str>()? {
                    schema.push(key).map_err(|_| serde::de::Error::custom("bad entity key"))?;
                }
                Ok(SchemaWire(schema))
            }
        }
        deserializer.deserialize_seq(Keys)
    }
}

#[cfg(test)]
#[derive(Serialize, Deserialize)]
pub(crate) struct ConfigWire {
    context_window: u32,
    reserved_for_reply: u32,
    permanent_budget: u32,
    session_budget: u32,
    working_budget: u32,
    trigger_percent: u8,
    locked_tail: u16,
    max_messages: u32,
    observation_limit: u32,
    message_overhead: u16,
    request_overhead: u16,
    unanswered_calls: u8,
    outbox: u8,
    strategy: u8,
    summarize_threshold: u16,
    summarize_batch: u16,
    summary_tokens: u32,
    importance_threshold: u16,
    working_age_ms: u64,
    session_age_ms: u64,
    /// Retired (a std-side setting now): written as the old default, read only to verify the
    /// fingerprint, which hashed it.
    pub checkpoint_interval_messages: u32,
    entity_schema: SchemaWire,
    low_water_percent: u8,
    fit_budgets: bool,
    dynamic_placement: u8,
    tool_call_overhead: u16,
    lock_newest_user: bool,
    compaction_limit: u32,
}

const SCHEMA_MAX: usize = V32 + MAX_ENTITY_KEYS * (V32 + MAX_ENTITY_KEY_LEN);
pub(crate) const CONFIG_MAX: usize = 10 * V32 + 7 * V16 + 5 + 2 * V64 + SCHEMA_MAX + 3;

#[cfg(test)]
impl From<&Config> for ConfigWire {
    fn from(c: &Config) -> Self {
        ConfigWire {
            context_window: c.context_window,
            reserved_for_reply: c.reserved_for_reply,
            permanent_budget: c.permanent_budget,
            session_budget: c.session_budget,
            working_budget: c.working_budget,
            trigger_percent: c.trigger_percent,
            locked_tail: c.locked_tail,
            max_messages: c.max_messages,
            observation_limit: c.observation_limit,
            message_overhead: c.message_overhead,
            request_overhead: c.request_overhead,
            unanswered_calls: c.unanswered_calls as u8,
            outbox: c.outbox as u8,
            strategy: c.strategy as u8,
            summarize_threshold: c.summarize_threshold,
            summarize_batch: c.summarize_batch,
            summary_tokens: c.summary_tokens,
            importance_threshold: c.importance_threshold,
            working_age_ms: c.working_age_ms,
            session_age_ms: c.session_age_ms,
            checkpoint_interval_messages: RETIRED_CHECKPOINT_INTERVAL,
            entity_schema: SchemaWire(c.entity_schema),
            low_water_percent: c.low_water_percent,
            fit_budgets: c.fit_budgets,
            dynamic_placement: c.dynamic_placement as u8,
            tool_call_overhead: c.tool_call_overhead,
            lock_newest_user: c.lock_newest_user,
            compaction_limit: c.compaction_limit,
        }
    }
}

#[cfg(test)]
impl ConfigWire {
    /// The configuration, or `None` for an unknown enum value.
    pub(crate) fn to_config(&self) -> Option<Config> {
        Some(Config {
            context_window: self.context_window,
            reserved_for_reply: self.reserved_for_reply,
            permanent_budget: self.permanent_budget,
            session_budget: self.session_budget,
            working_budget: self.working_budget,
            trigger_percent: self.trigger_percent,
            locked_tail: self.locked_tail,
            max_messages: self.max_messages,
            observation_limit: self.observation_limit,
            message_overhead: self.message_overhead,
            request_overhead: self.request_overhead,
            unanswered_calls: match self.unanswered_calls {
                0 => UnansweredCalls::SynthesizeAborted,
                1 => UnansweredCalls::DropCalls,
                _ => return None,
            },
            outbox: match self.outbox {
                0 => OutboxMode::Hold,
                1 => OutboxMode::Discard,
                _ => return None,
            },
            strategy: *StrategyKind::ALL.get(usize::from(self.strategy))?,
            summarize_threshold: self.summarize_threshold,
            summarize_batch: self.summarize_batch,
            summary_tokens: self.summary_tokens,
            importance_threshold: self.importance_threshold,
            working_age_ms: self.working_age_ms,
            session_age_ms: self.session_age_ms,
            entity_schema: self.entity_schema.0,
            low_water_percent: self.low_water_percent,
            fit_budgets: self.fit_budgets,
            dynamic_placement: match self.dynamic_placement {
                0 => DynamicPlacement::AfterTools,
                1 => DynamicPlacement::BeforeNewestUser,
                _ => return None,
            },
            tool_call_overhead: self.tool_call_overhead,
            lock_newest_user: self.lock_newest_user,
            compaction_limit: self.compaction_limit,
        })
    }
}

#[cfg(test)]
#[derive(Serialize, Deserialize)]
pub(crate) struct PendingWire {
    pub level: u8,
    pub calls: u8,
    pub answered: u64,
}

#[cfg(test)]
#[derive(Serialize, Deserialize)]
pub(crate) struct CountersWire {
    messages_pushed: u64,
    tokens_ingested: u64,
    units_evicted: u64,
    messages_evicted: u64,
    tokens_evicted: u64,
    units_discarded: u64,
    units_drained: u64,
    observations_reduced: u64,
    tokens_saved_by_reduction: u64,
    calls_aborted: u64,
    calls_dropped: u64,
    summaries_added: u64,
    summaries_merged: u64,
    summaries_failed: u64,
    summaries_replaced: u64,
    last_compression_turn: Option<u64>,
    compactions: u64,
    composes: u64,
    composes_extending: u64,
    prompt_tokens_cached: u64,
    prompt_tokens_new: u64,
    last_prefix_tokens: u32,
    prefix_changes: u8,
    last_dynamic_digest: u32,
}

const COUNTERS_MAX: usize = 15 * V64 + 1 + V64 + 5 * V64 + 2 * V32 + 1;

#[cfg(test)]
impl From<&Counters> for CountersWire {
    fn from(c: &Counters) -> Self {
        CountersWire {
            messages_pushed: c.messages_pushed,
            tokens_ingested: c.tokens_ingested,
            units_evicted: c.units_evicted,
            messages_evicted: c.messages_evicted,
            tokens_evicted: c.tokens_evicted,
            units_discarded: c.units_discarded,
            units_drained: c.units_drained,
            observations_reduced: c.observations_reduced,
            tokens_saved_by_reduction: c.tokens_saved_by_reduction,
            calls_aborted: c.calls_aborted,
            calls_dropped: c.calls_dropped,
            summaries_added: c.summaries_added,
            summaries_merged: c.summaries_merged,
            summaries_failed: c.summaries_failed,
            summaries_replaced: c.summaries_replaced,
            last_compression_turn: c.last_compression_turn,
            compactions: c.compactions,
            composes: c.composes,
            composes_extending: c.composes_extending,
            prompt_tokens_cached: c.prompt_tokens_cached,
            prompt_tokens_new: c.prompt_tokens_new,
            last_prefix_tokens: c.last_prefix_tokens,
            prefix_changes: c.prefix_changes,
            last_dynamic_digest: c.last_dynamic_digest,
        }
    }
}

#[cfg(test)]
impl From<&CountersWire> for Counters {
    fn from(c: &CountersWire) -> Self {
        Counters {
            messages_pushed: c.messages_pushed,
            tokens_ingested: c.tokens_ingested,
            units_evicted: c.units_evicted,
            messages_evicted: c.messages_evicted,
            tokens_evicted: c.tokens_evicted,
            units_discarded: c.units_discarded,
            units_drained: c.units_drained,
            observations_reduced: c.observations_reduced,
            tokens_saved_by_reduction: c.tokens_saved_by_reduction,
            calls_aborted: c.calls_aborted,
            calls_dropped: c.calls_dropped,
            summaries_added: c.summaries_added,
            summaries_merged: c.summaries_merged,
            summaries_failed: c.summaries_failed,
            summaries_replaced: c.summaries_replaced,
            last_compression_turn: c.last_compression_turn,
            compactions: c.compactions,
            composes: c.composes,
            composes_extending: c.composes_extending,
            prompt_tokens_cached: c.prompt_tokens_cached,
            prompt_tokens_new: c.prompt_tokens_new,
            last_prefix_tokens: c.last_prefix_tokens,
            prefix_changes: c.prefix_changes,
            last_dynamic_digest: c.last_dynamic_digest,
        }
    }
}

#[cfg(test)]
#[derive(Serialize, Deserialize)]
pub(crate) struct StateWire {
    pub next_id: u64,
    pub turn: u64,
    pub last_user_id: Option<u64>,
    pub pending: Option<PendingWire>,
    pub counters: CountersWire,
    /// Live tokens per level, checked against the records on restore.
    pub tokens: [u32; 4],
    /// The caller's clock.
    pub now: u64,
}

pub(crate) const STATE_MAX: usize = 3 * V64 + (1 + V64) + (1 + 2 + V64) + COUNTERS_MAX + 4 * V32;

#[cfg(test)]
impl From<&State> for StateWire {
    fn from(s: &State) -> Self {
        StateWire {
            next_id: s.next_id(),
            turn: s.turn,
            last_user_id: s.last_user_id,
            pending: s.pending().map(|p| PendingWire {
                level: p.level as u8,
                calls: p.calls,
                answered: p.answered,
            }),
            counters: CountersWire::from(&s.counters),
            tokens: s.tokens,
            now: s.now,
        }
    }
}

#[cfg(test)]
impl StateWire {
    /// The state (per-level live counts and bytes are recomputed after loading).
    pub(crate) fn to_state(&self) -> Option<State> {
        let pending = match &self.pending {
            None => None,
            Some(p) => {
                Some(Pending { level: level_from(p.level)?, calls: p.calls, answered: p.answered })
            }
        };
        let mut state = State::NEW;
        state.issued = self.next_id.checked_sub(1)?;
        state.turn = self.turn;
        state.last_user_id = self.last_user_id;
        state.set_pending(pending);
        state.tokens = self.tokens;
        state.now = self.now;
        state.counters = Counters::from(&self.counters);
        Some(state)
    }
}

pub(crate) fn level_from(code: u8) -> Option<Level> {
    Level::ALL.get(usize::from(code)).copied()
}

pub(crate) fn role_from(code: u8) -> Option<Role> {
    [Role::System, Role::User, Role::Assistant, Role::Tool].get(usize::from(code)).copied()
}

/// One stored message: its header fields and its record bytes.
#[cfg(test)]
#[derive(Serialize, Deserialize)]
pub(crate) struct RecordWire<'a> {
    pub id: u64,
    pub timestamp: u64,
    pub content_len: u32,
    pub tokens: u32,
    pub original_tokens: u32,
    pub role: u8,
    pub flags: u8,
    pub items: u8,
    pub detail: u8,
    pub terms: [u16; 4],
    pub key: u32,
    #[serde(borrow)]
    pub bytes: &'a [u8],
}

/// Largest encoding of a record's fields besides its bytes.
pub(crate) const RECORD_OVERHEAD_MAX: usize = 2 * V64 + 3 * V32 + 4 + 4 * V16 + V32 + V32;

#[cfg(test)]
impl<'a> RecordWire<'a> {
    /// The wire form of a stored record (`record` with its trailer, if any).
    pub(crate) fn new(header: &Header, record: &'a [u8]) -> Self {
        let trailer = Trailer::of(header, record);
        RecordWire {
            id: header.id.into(),
            timestamp: header.timestamp,
            content_len: header.content_len,
            tokens: header.tokens,
            original_tokens: trailer.original.unwrap_or(header.tokens),
            role: header.role as u8,
            flags: wire_flags(header, &trailer),
            items: header.items,
            detail: header.detail,
            terms: trailer.terms,
            key: trailer.supersede_key(),
            bytes: record::body(header, record),
        }
    }

    /// The header this record describes (its span is set when it is stored).
    pub(crate) fn header(&self, role: Role) -> Header {
        Header {
            id: self.id as u32,
            timestamp: self.timestamp,
            start: 0,
            len: self.bytes.len() as u32,
            content_len: self.content_len,
            tokens: self.tokens,
            role,
            flags: self.flags,
            items: self.items,
            detail: self.detail,
        }
    }
}

/// Upper bound of a snapshot's size for levels of these `(messages, bytes)` capacities and an
/// entity table of `entities` values of `value_bytes` each.
pub(crate) const fn max_size(
    capacities: [(usize, usize); 4],
    entities: usize,
    value_bytes: usize,
) -> usize {
    const fn level(messages: usize, bytes: usize) -> usize {
        V32 + messages * RECORD_OVERHEAD_MAX + bytes
    }
    let [(m0, b0), (m1, b1), (m2, b2), (m3, b3)] = capacities;
    let entity_table = V32 + entities * (1 + V32 + value_bytes);
    HEADER_LEN
        + TASKS_MAX
        + TRAILER_LEN
        + CONFIG_MAX
        + STATE_MAX
        + level(m0, b0)
        + level(m1, b1)
        + level(m2, b2)
        + level(m3, b3)
        + entity_table
}

/// Most bytes of the task table: a count, then per task four `u32` and five `u64` varints, the
/// open flag and the goal as a byte string.
#[cfg(feature = "tasks")]
const TASKS_MAX: usize =
    V32 + crate::task::MAX_TASKS * (3 * V32 + 6 * V64 + 1 + V32 + crate::task::GOAL_BYTES);
/// Without the `tasks` feature the table is always empty: its count alone.
#[cfg(not(feature = "tasks"))]
const TASKS_MAX: usize = V32;

/// A task on the wire, in order (tests only: the hand-written encoder writes the same bytes).
#[cfg(all(test, feature = "tasks"))]
#[derive(Serialize, Deserialize)]
pub(crate) struct TaskWire<'a> {
    pub number: u32,
    pub first_id: u64,
    pub last_id: u64,
    pub started: u64,
    pub finished: u64,
    pub source_tokens: u32,
    pub summary_tokens: u32,
    pub summary_id: u64,
    pub ingested: u64,
    pub open: bool,
    pub goal: &'a [u8],
}

#[cfg(all(test, feature = "tasks"))]
impl<'a> From<&'a crate::task::Task> for TaskWire<'a> {
    fn from(t: &'a crate::task::Task) -> Self {
        TaskWire {
            number: t.number,
            first_id: t.first_id,
            last_id: t.last_id,
            started: t.started,
            finished: t.finished,
            source_tokens: t.source_tokens,
            summary_tokens: t.summary_tokens,
            summary_id: t.summary_id,
            ingested: t.ingested,
            open: t.open,
            goal: t.goal().as_bytes(),
        }
    }
}

/// The task table, in `TaskWire` order.
#[cfg(feature = "tasks")]
fn encode_tasks(e: &mut Enc<'_>, tasks: &[crate::task::Task]) {
    e.varint(tasks.len() as u64);
    for t in tasks {
        e.varint(t.number.into());
        e.varint(t.first_id);
        e.varint(t.last_id);
        e.varint(t.started);
        e.varint(t.finished);
        e.varint(t.source_tokens.into());
        e.varint(t.summary_tokens.into());
        e.varint(t.summary_id);
        e.varint(t.ingested);
        e.u8(u8::from(t.open));
        e.bytes(t.goal().as_bytes());
    }
}

/// Writes postcard's encoding of each field into an [`Out`]; stops writing at the first
/// failure, which [`finish`](Enc::finish) reports.
pub(crate) struct Enc<'o> {
    out: &'o mut dyn Out,
    ok: bool,
}

impl<'o> Enc<'o> {
    pub(crate) fn new(out: &'o mut dyn Out) -> Self {
        Enc { out, ok: true }
    }

    /// Whether every byte was written.
    pub(crate) fn finish(self) -> bool {
        self.ok
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.ok {
            self.ok = self.out.put(bytes);
        }
    }

    /// A `u8`: one raw byte.
    fn u8(&mut self, value: u8) {
        self.put(&[value]);
    }

    /// A `u16`, `u32` or `u64`: LEB128, 7 bits a byte, low first.
    pub(crate) fn varint(&mut self, value: u64) {
        let mut buf = [0u8; V64];
        let mut len = 0;
        let mut rest = value;
        for slot in buf.iter_mut() {
            let low = (rest & 0x7F) as u8;
            rest >>= 7;
            len += 1;
            if rest == 0 {
                *slot = low;
                break;
            }
            *slot = low | 0x80;
        }
        self.put(buf.get(..len).unwrap_or_default());
    }

    /// A byte string: varint length, then the bytes.
    fn bytes(&mut self, bytes: &[u8]) {
        self.varint(bytes.len() as u64);
        self.put(bytes);
    }

    fn option_u64(&mut self, value: Option<u64>) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                self.varint(value);
            }
        }
    }
}

/// The configuration, in `ConfigWire` order.
fn encode_config(e: &mut Enc<'_>, c: &Config) {
    e.varint(c.context_window.into());
    e.varint(c.reserved_for_reply.into());
    e.varint(c.permanent_budget.into());
    e.varint(c.session_budget.into());
    e.varint(c.working_budget.into());
    e.u8(c.trigger_percent);
    e.varint(c.locked_tail.into());
    e.varint(c.max_messages.into());
    e.varint(c.observation_limit.into());
    e.varint(c.message_overhead.into());
    e.varint(c.request_overhead.into());
    e.u8(c.unanswered_calls as u8);
    e.u8(c.outbox as u8);
    e.u8(c.strategy as u8);
    e.varint(c.summarize_threshold.into());
    e.varint(c.summarize_batch.into());
    e.varint(c.summary_tokens.into());
    e.varint(c.importance_threshold.into());
    e.varint(c.working_age_ms);
    e.varint(c.session_age_ms);
    e.varint(RETIRED_CHECKPOINT_INTERVAL.into());
    e.varint(c.entity_schema.len() as u64);
    for key in c.entity_schema.keys() {
        e.bytes(key.as_bytes());
    }
    e.u8(c.low_water_percent);
    e.u8(u8::from(c.fit_budgets));
    e.u8(c.dynamic_placement as u8);
    e.varint(c.tool_call_overhead.into());
    e.u8(u8::from(c.lock_newest_user));
    e.varint(c.compaction_limit.into());
}

/// The state, in `StateWire` order.
fn encode_state(e: &mut Enc<'_>, s: &State) {
    e.varint(s.next_id());
    e.varint(s.turn);
    e.option_u64(s.last_user_id);
    match s.pending() {
        None => e.u8(0),
        Some(p) => {
            e.u8(1);
            e.u8(p.level as u8);
            e.u8(p.calls);
            e.varint(p.answered);
        }
    }
    // One call per field, not a loop over an array: the array's copy costs more code.
    let c = &s.counters;
    e.varint(c.messages_pushed);
    e.varint(c.tokens_ingested);
    e.varint(c.units_evicted);
    e.varint(c.messages_evicted);
    e.varint(c.tokens_evicted);
    e.varint(c.units_discarded);
    e.varint(c.units_drained);
    e.varint(c.observations_reduced);
    e.varint(c.tokens_saved_by_reduction);
    e.varint(c.calls_aborted);
    e.varint(c.calls_dropped);
    e.varint(c.summaries_added);
    e.varint(c.summaries_merged);
    e.varint(c.summaries_failed);
    e.varint(c.summaries_replaced);
    e.option_u64(c.last_compression_turn);
    e.varint(c.compactions);
    e.varint(c.composes);
    e.varint(c.composes_extending);
    e.varint(c.prompt_tokens_cached);
    e.varint(c.prompt_tokens_new);
    e.varint(c.last_prefix_tokens.into());
    e.u8(c.prefix_changes);
    e.varint(c.last_dynamic_digest.into());
    let [permanent, session, working, volatile] = s.tokens;
    e.varint(permanent.into());
    e.varint(session.into());
    e.varint(working.into());
    e.varint(volatile.into());
    e.varint(s.now);
}

/// A record's flags on the wire: the header's, without `flags::TRAILER` (the trailer's fields
/// travel as fields), with [`WIRE_WHOLE`] for a record pushed whole.
fn wire_flags(h: &Header, trailer: &Trailer) -> u8 {
    (h.flags & !flags::TRAILER) | if trailer.whole { WIRE_WHOLE } else { 0 }
}

/// One stored message, in `RecordWire` order: the trailer's fields as header fields, the
/// record's bytes without it.
fn encode_record(e: &mut Enc<'_>, id: u64, h: &Header, record: &[u8]) {
    let trailer = Trailer::of(h, record);
    e.varint(id);
    e.varint(h.timestamp);
    e.varint(h.content_len.into());
    e.varint(h.tokens.into());
    e.varint(trailer.original.unwrap_or(h.tokens).into());
    e.put(&[h.role as u8, wire_flags(h, &trailer), h.items, h.detail]);
    let [first, second, third, fourth] = trailer.terms;
    e.varint(first.into());
    e.varint(second.into());
    e.varint(third.into());
    e.varint(fourth.into());
    e.varint(trailer.supersede_key().into());
    e.bytes(record::body(h, record));
}

/// Writes the fixed header in front of the body into `out`: magic, version, flags,
/// fingerprint, the four levels' capacities, the body's length. Returns whether every byte
/// was written (none is after the first that was not).
pub(crate) fn encode_header(
    out: &mut dyn Out,
    fingerprint: u32,
    capacities: [(usize, usize); 4],
    body_len: usize,
) -> bool {
    let mut e = Enc::new(out);
    e.put(&MAGIC);
    e.put(&FORMAT_VERSION.to_le_bytes());
    e.put(&0u16.to_le_bytes());
    e.put(&fingerprint.to_le_bytes());
    for (messages, bytes) in capacities {
        e.put(&(messages as u32).to_le_bytes());
        e.put(&(bytes as u32).to_le_bytes());
    }
    e.put(&(body_len as u32).to_le_bytes());
    e.finish()
}

/// Encodes a whole body into `out`: configuration, state, the four levels, the entity table
/// of `keys` values. Returns whether every byte was written. Not generic: one copy serves
/// every manager type and every output.
#[inline(never)]
pub(crate) fn encode_body(
    out: &mut dyn Out,
    config: &Config,
    state: &State,
    rings: &[RingRef<'_>; 4],
    entities: Entities<'_>,
    keys: usize,
    #[cfg(feature = "tasks")] tasks: &[crate::task::Task],
) -> bool {
    let mut e = Enc::new(out);
    encode_config(&mut e, config);
    encode_state(&mut e, state);
    for ring in rings {
        e.varint(ring.len() as u64);
        for header in ring.iter() {
            encode_record(&mut e, ring.id(header), header, ring.record(header));
        }
    }
    e.varint(keys as u64);
    for index in 0..keys {
        match entities.value(index) {
            None => e.u8(0),
            Some(value) => {
                e.u8(1);
                e.bytes(value.as_bytes());
            }
        }
    }
    #[cfg(feature = "tasks")]
    encode_tasks(&mut e, tasks);
    #[cfg(not(feature = "tasks"))]
    e.varint(0);
    e.finish()
}
