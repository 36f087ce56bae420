//! What the snapshot body is made of: postcard-encoded mirrors of the manager's state, kept
//! apart from the public types so that changing those never changes the format by accident.

use serde::{Deserialize, Serialize};

use crate::config::StrategyKind;
use crate::config::{Config, OutboxMode, UnansweredCalls};
use crate::entities::{EntitySchema, MAX_ENTITY_KEY_LEN, MAX_ENTITY_KEYS};
use crate::header::Header;
use crate::level::Level;
use crate::manager::{Pending, State};
use crate::role::Role;
use crate::stats::Counters;

/// `"CWSN"`: ctxwin snapshot.
pub(crate) const MAGIC: [u8; 4] = *b"CWSN";
/// The one format version this build reads and writes. 2 added `tool_call_overhead` and
/// `lock_newest_user` at the end of the configuration; version-1 bytes are refused with
/// `SnapshotError::UnsupportedVersion { found: 1 }`.
pub(crate) const FORMAT_VERSION: u16 = 2;
/// Bytes before the body: magic, version, flags, fingerprint, 4 × capacities, body length.
pub(crate) const HEADER_LEN: usize = 4 + 2 + 2 + 4 + 4 * 8 + 4;
/// Bytes after the body: the CRC.
pub(crate) const TRAILER_LEN: usize = 4;

/// Largest postcard varint of a `u16`, `u32`, `u64`.
const V16: usize = 3;
const V32: usize = 5;
const V64: usize = 10;

/// An entity schema on the wire: a sequence of key strings.
pub(crate) struct SchemaWire(pub EntitySchema);

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
    checkpoint_interval_messages: u32,
    entity_schema: SchemaWire,
    tool_call_overhead: u16,
    lock_newest_user: bool,
}

const SCHEMA_MAX: usize = V32 + MAX_ENTITY_KEYS * (V32 + MAX_ENTITY_KEY_LEN);
pub(crate) const CONFIG_MAX: usize = 9 * V32 + 7 * V16 + 5 + 2 * V64 + SCHEMA_MAX;

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
            checkpoint_interval_messages: c.checkpoint_interval_messages,
            entity_schema: SchemaWire(c.entity_schema),
            tool_call_overhead: c.tool_call_overhead,
            lock_newest_user: c.lock_newest_user,
        }
    }
}

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
            checkpoint_interval_messages: self.checkpoint_interval_messages,
            entity_schema: self.entity_schema.0,
            tool_call_overhead: self.tool_call_overhead,
            lock_newest_user: self.lock_newest_user,
        })
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PendingWire {
    pub level: u8,
    pub calls: u8,
    pub answered: u64,
}

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
}

const COUNTERS_MAX: usize = 15 * V64 + 1 + V64;

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
        }
    }
}

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
        }
    }
}

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
    #[serde(borrow)]
    pub bytes: &'a [u8],
}

/// Largest encoding of a record's fields besides its bytes.
pub(crate) const RECORD_OVERHEAD_MAX: usize = 2 * V64 + 3 * V32 + 4 + 4 * V16 + V32;

impl<'a> RecordWire<'a> {
    pub(crate) fn new(header: &Header, bytes: &'a [u8]) -> Self {
        RecordWire {
            id: header.id,
            timestamp: header.timestamp,
            content_len: header.content_len,
            tokens: header.tokens,
            original_tokens: header.original_tokens,
            role: header.role as u8,
            flags: header.flags,
            items: header.items,
            detail: header.detail,
            terms: header.terms,
            bytes,
        }
    }

    /// The header this record describes (its span is set when it is stored).
    pub(crate) fn header(&self, role: Role) -> Header {
        Header {
            id: self.id,
            timestamp: self.timestamp,
            start: 0,
            len: self.bytes.len() as u32,
            content_len: self.content_len,
            tokens: self.tokens,
            original_tokens: self.original_tokens,
            role,
            flags: self.flags,
            items: self.items,
            detail: self.detail,
            terms: self.terms,
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
        + TRAILER_LEN
        + CONFIG_MAX
        + STATE_MAX
        + level(m0, b0)
        + level(m1, b1)
        + level(m2, b2)
        + level(m3, b3)
        + entity_table
}
