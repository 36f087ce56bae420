//! Reading a snapshot body: every invariant is checked while decoding, and a [`Sink`] either
//! only validates or stores. Restore runs the same decode twice, validating then loading, so a
//! snapshot that fails any check leaves the manager untouched without a scratch copy of it.
//!
//! The body is postcard's wire format, read by hand ([`Reader`]) exactly as postcard reads
//! it (the same varint limits and the same errors), straight into the manager's own types: no
//! serde code, no wire temporaries, and one copy of the decoder (the sink is a trait object)
//! whatever the manager type.

use super::error::{Invariant, SnapshotError};
use super::wire::{V16, V32, V64, level_from, role_from};
use crate::config::{Config, OutboxMode, StrategyKind, UnansweredCalls};
use crate::header::{Header, flags};
use crate::json;
use crate::level::Level;
use crate::manager::{Pending, State};
use crate::record::{self, Fault, bit};
use crate::role::Role;

/// Largest id clock a snapshot may carry.
const MAX_NEXT_ID: u64 = 1 << 63;

/// Where decoded records go.
pub(crate) trait Sink<'a> {
    fn begin(&mut self, config: &Config, state: &State);
    fn record(&mut self, level: Level, header: &Header, bytes: &'a [u8]);
    fn entity(&mut self, index: usize, value: Option<&'a [u8]>);
    fn end(&mut self);
}

/// Validates only.
pub(crate) struct Validate;

impl<'a> Sink<'a> for Validate {
    fn begin(&mut self, _: &Config, _: &State) {}
    fn record(&mut self, _: Level, _: &Header, _: &'a [u8]) {}
    fn entity(&mut self, _: usize, _: Option<&'a [u8]>) {}
    fn end(&mut self) {}
}

/// Reads postcard's encoding of one field at a time from the front of the body; any
/// shortfall or bad encoding is [`SnapshotError::Malformed`].
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

/// Bits of a varint's last byte that fit the type (postcard's `max_of_last_byte`).
const fn last_byte_max(bits: u32) -> u8 {
    (1u8 << (bits % 7)) - 1
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, SnapshotError> {
        let (&byte, rest) = self.rest.split_first().ok_or(SnapshotError::Malformed)?;
        self.rest = rest;
        Ok(byte)
    }

    /// A varint of at most `max` bytes whose last byte is at most `last` (as postcard's
    /// `try_take_varint_*`: non-minimal encodings are accepted, overlong ones are not).
    fn varint(&mut self, max: usize, last: u8) -> Result<u64, SnapshotError> {
        let mut value = 0u64;
        for index in 0..max {
            let byte = self.u8()?;
            value |= u64::from(byte & 0x7F) << (7 * index);
            if byte & 0x80 == 0 {
                if index + 1 == max && byte > last {
                    return Err(SnapshotError::Malformed);
                }
                return Ok(value);
            }
        }
        Err(SnapshotError::Malformed)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(self.varint(V16, last_byte_max(16))? as u16)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(self.varint(V32, last_byte_max(32))? as u32)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.varint(V64, last_byte_max(64))
    }

    /// A length (postcard's `usize`: as wide as the target's pointers).
    fn len(&mut self) -> Result<usize, SnapshotError> {
        const MAX: usize = (usize::BITS as usize).div_ceil(7);
        Ok(self.varint(MAX, last_byte_max(usize::BITS))? as usize)
    }

    /// An `Option` tag: whether a value follows.
    fn some(&mut self) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotError::Malformed),
        }
    }

    fn option_u64(&mut self) -> Result<Option<u64>, SnapshotError> {
        Ok(if self.some()? { Some(self.u64()?) } else { None })
    }

    /// A byte string: a length, then that many bytes.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let len = self.len()?;
        let (bytes, rest) = self.rest.split_at_checked(len).ok_or(SnapshotError::Malformed)?;
        self.rest = rest;
        Ok(bytes)
    }
}

/// What the record and entity checks need of the configuration and state.
struct Head {
    next_id: u64,
    last_user_id: Option<u64>,
    pending: Option<Pending>,
    tokens: [u32; 4],
    schema_len: usize,
}

/// Reads the configuration (in `ConfigWire` order) into `config`.
fn read_config(r: &mut Reader<'_>, c: &mut Config) -> Result<(), SnapshotError> {
    c.context_window = r.u32()?;
    c.reserved_for_reply = r.u32()?;
    c.permanent_budget = r.u32()?;
    c.session_budget = r.u32()?;
    c.working_budget = r.u32()?;
    c.trigger_percent = r.u8()?;
    c.locked_tail = r.u16()?;
    c.max_messages = r.u32()?;
    c.observation_limit = r.u32()?;
    c.message_overhead = r.u16()?;
    c.request_overhead = r.u16()?;
    let (unanswered, outbox, strategy) = (r.u8()?, r.u8()?, r.u8()?);
    c.summarize_threshold = r.u16()?;
    c.summarize_batch = r.u16()?;
    c.summary_tokens = r.u32()?;
    c.importance_threshold = r.u16()?;
    c.working_age_ms = r.u64()?;
    c.session_age_ms = r.u64()?;
    c.checkpoint_interval_messages = r.u32()?;
    let keys = r.len()?;
    for _ in 0..keys {
        let key = core::str::from_utf8(r.bytes()?).map_err(|_| SnapshotError::Malformed)?;
        c.entity_schema.push(key).map_err(|_| SnapshotError::Malformed)?;
    }
    let invalid = SnapshotError::Invalid(Invariant::Config);
    c.unanswered_calls = match unanswered {
        0 => UnansweredCalls::SynthesizeAborted,
        1 => UnansweredCalls::DropCalls,
        _ => return Err(invalid),
    };
    c.outbox = match outbox {
        0 => OutboxMode::Hold,
        1 => OutboxMode::Discard,
        _ => return Err(invalid),
    };
    c.strategy = *StrategyKind::ALL.get(usize::from(strategy)).ok_or(invalid)?;
    Ok(())
}

/// Reads the state (in `StateWire` order) into `state`.
fn read_state(r: &mut Reader<'_>, s: &mut State) -> Result<(), SnapshotError> {
    let next_id = r.u64()?;
    s.turn = r.u64()?;
    s.last_user_id = r.option_u64()?;
    let pending = if r.some()? { Some((r.u8()?, r.u8()?, r.u64()?)) } else { None };
    let c = &mut s.counters;
    for counter in [
        &mut c.messages_pushed,
        &mut c.tokens_ingested,
        &mut c.units_evicted,
        &mut c.messages_evicted,
        &mut c.tokens_evicted,
        &mut c.units_discarded,
        &mut c.units_drained,
        &mut c.observations_reduced,
        &mut c.tokens_saved_by_reduction,
        &mut c.calls_aborted,
        &mut c.calls_dropped,
        &mut c.summaries_added,
        &mut c.summaries_merged,
        &mut c.summaries_failed,
        &mut c.summaries_replaced,
    ] {
        *counter = r.u64()?;
    }
    c.last_compression_turn = r.option_u64()?;
    for tokens in s.tokens.iter_mut() {
        *tokens = r.u32()?;
    }
    s.now = r.u64()?;
    let invalid = SnapshotError::Invalid(Invariant::Pending);
    s.issued = next_id.checked_sub(1).ok_or(invalid)?;
    let pending = match pending {
        None => None,
        Some((level, calls, answered)) => {
            Some(Pending { level: level_from(level).ok_or(invalid)?, calls, answered })
        }
    };
    s.set_pending(pending);
    Ok(())
}

/// Decodes and checks the configuration and the state and hands them to `sink`. Out of line,
/// so the two (several hundred bytes) are off the stack while the records are read.
#[inline(never)]
fn head(
    r: &mut Reader<'_>,
    fingerprint: u32,
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'_>,
) -> Result<Head, SnapshotError> {
    let mut config = Config::DEFAULT;
    config.entity_schema = crate::entities::EntitySchema::EMPTY;
    read_config(r, &mut config)?;
    if config.validate().is_err() {
        return Err(SnapshotError::Invalid(Invariant::Config));
    }
    // A strategy that runs one kind never restores a configuration naming another.
    if runs.is_some_and(|kind| kind != config.strategy) {
        return Err(SnapshotError::Invalid(Invariant::Config));
    }
    if config.fingerprint() != fingerprint {
        return Err(SnapshotError::Invalid(Invariant::Fingerprint));
    }
    let mut state = State::NEW;
    read_state(r, &mut state)?;
    // No session reaches 2^63 messages; a larger id clock is corruption, and would overflow.
    if state.next_id() > MAX_NEXT_ID {
        return Err(SnapshotError::Invalid(Invariant::Order { level: Level::Permanent }));
    }
    let pending = state.pending();
    if pending.is_some_and(|p| !p.level.is_history() || p.calls == 0 || usize::from(p.calls) > 64) {
        return Err(SnapshotError::Invalid(Invariant::Pending));
    }
    sink.begin(&config, &state);
    Ok(Head {
        next_id: state.next_id(),
        last_user_id: state.last_user_id,
        pending,
        tokens: state.tokens,
        schema_len: config.entity_schema.len(),
    })
}

/// Reads one record's header fields (in `RecordWire` order) and its bytes.
fn read_record<'a>(r: &mut Reader<'a>, level: Level) -> Result<(Header, &'a [u8]), SnapshotError> {
    let mut header = Header::EMPTY;
    header.id = r.u64()?;
    header.timestamp = r.u64()?;
    header.content_len = r.u32()?;
    header.tokens = r.u32()?;
    header.original_tokens = r.u32()?;
    let role = r.u8()?;
    header.flags = r.u8()?;
    header.items = r.u8()?;
    header.detail = r.u8()?;
    for term in header.terms.iter_mut() {
        *term = r.u16()?;
    }
    let bytes = r.bytes()?;
    header.len = bytes.len() as u32;
    header.role = role_from(role).ok_or(SnapshotError::Invalid(Invariant::Role { level }))?;
    Ok((header, bytes))
}

/// The unit being read in a history level: its head and which of its calls have results.
struct OpenUnit<'a> {
    header: Header,
    bytes: &'a [u8],
    answered: u64,
}

impl OpenUnit<'_> {
    fn calls(&self) -> usize {
        if self.header.role == Role::Assistant { usize::from(self.header.items) } else { 0 }
    }

    fn is_complete(&self) -> bool {
        self.answered.count_ones() as usize == self.calls()
    }
}

/// Running checks over one level's records.
struct LevelCheck<'a> {
    level: Level,
    next_id: u64,
    last_id: Option<u64>,
    unit: Option<OpenUnit<'a>>,
    tokens: u64,
    bytes: usize,
}

impl<'a> LevelCheck<'a> {
    fn new(level: Level, next_id: u64) -> Self {
        Self { level, next_id, last_id: None, unit: None, tokens: 0, bytes: 0 }
    }

    fn record(&mut self, header: &Header, bytes: &'a [u8]) -> Result<(), Invariant> {
        let level = self.level;
        if self.last_id.is_some_and(|last| header.id <= last) || header.id >= self.next_id {
            return Err(Invariant::Order { level });
        }
        self.last_id = Some(header.id);
        if header.flags & !flags::KNOWN != 0 || header.detail > 3 {
            return Err(Invariant::Flags { level });
        }
        record::check(header, bytes).map_err(|fault| match fault {
            Fault::Span => Invariant::Span { level },
            Fault::Text => Invariant::Text { level },
        })?;
        self.check_kind(header, bytes)?;
        if level.is_history() {
            self.check_unit(header, bytes)?;
        }
        if header.is_live() {
            self.tokens = self.tokens.saturating_add(u64::from(header.tokens));
        }
        self.bytes += bytes.len();
        Ok(())
    }

    /// Which kinds of message each level may hold.
    fn check_kind(&self, header: &Header, bytes: &[u8]) -> Result<(), Invariant> {
        let level = self.level;
        let tool_definition = header.has(flags::TOOL_DEFINITION);
        let summary = header.has(flags::SUMMARY);
        let calls = header.role == Role::Assistant && header.items > 0 && !summary;
        let allowed = match level {
            Level::Permanent => {
                !header.has(flags::EVICTED) && !summary && !calls && header.role != Role::Tool
            }
            Level::Session => {
                !tool_definition && !calls && header.role != Role::Tool && header.items <= 32
            }
            Level::Working | Level::Volatile => {
                !tool_definition && !summary && usize::from(header.items) <= 64
            }
        };
        if !allowed || (header.items > 0 && !calls && !summary) {
            return Err(Invariant::Role { level });
        }
        if tool_definition
            && (header.role != Role::System || !json::is_object(record::content(header, bytes)))
        {
            return Err(Invariant::ToolDefinition);
        }
        Ok(())
    }

    /// A tool result continues the open unit and answers one of its calls, once; a unit is
    /// evicted whole or not at all; a unit must be complete before the next one starts.
    fn check_unit(&mut self, header: &Header, bytes: &'a [u8]) -> Result<(), Invariant> {
        let level = self.level;
        if header.role != Role::Tool {
            if self.unit.as_ref().is_some_and(|unit| !unit.is_complete()) {
                return Err(Invariant::IncompleteUnit { level });
            }
            self.unit = Some(OpenUnit { header: *header, bytes, answered: 0 });
            return Ok(());
        }
        let unit = self.unit.as_mut().ok_or(Invariant::OrphanToolResult { level })?;
        let call_id = record::tail_text(header, bytes);
        let index = record::ToolCalls::new(&unit.header, unit.bytes)
            .take(unit.calls())
            .position(|call| call.id == call_id)
            .ok_or(Invariant::OrphanToolResult { level })?;
        if unit.answered & bit(index) != 0 {
            return Err(Invariant::OrphanToolResult { level });
        }
        unit.answered |= bit(index);
        if header.has(flags::EVICTED) != unit.header.has(flags::EVICTED) {
            return Err(Invariant::Eviction { level });
        }
        Ok(())
    }

    /// End of the level: totals match, and only the pending unit may still wait for results.
    fn finish(self, head: &Head, byte_capacity: usize) -> Result<(), Invariant> {
        let level = self.level;
        if self.bytes > byte_capacity {
            return Err(Invariant::TooManyBytes { level });
        }
        let stored = head.tokens.get(level.index()).copied().unwrap_or(0);
        if u64::from(stored) != self.tokens {
            return Err(Invariant::TokenTotals { level });
        }
        let pending_here = head.pending.filter(|p| p.level == level);
        match (self.unit.filter(|unit| !unit.is_complete()), pending_here) {
            (None, None) => Ok(()),
            (Some(unit), Some(pending))
                if unit.header.is_live()
                    && usize::from(pending.calls) == unit.calls()
                    && pending.answered == unit.answered =>
            {
                Ok(())
            }
            (Some(_), None) => Err(Invariant::IncompleteUnit { level }),
            _ => Err(Invariant::Pending),
        }
    }
}

/// Decodes `body`, checking every invariant, and hands the result to `sink`. Out of line: the
/// validating and the loading pass must not share one stack frame on a device.
#[inline(never)]
pub(crate) fn decode<'a>(
    body: &'a [u8],
    capacities: [(usize, usize); 4],
    (entity_keys, value_bytes): (usize, usize),
    fingerprint: u32,
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'a>,
) -> Result<(), SnapshotError> {
    let mut r = Reader::new(body);
    let head = head(&mut r, fingerprint, runs, sink)?;
    let mut last_user_seen = head.last_user_id.is_none();
    for (level, (messages, bytes)) in Level::ALL.into_iter().zip(capacities) {
        let count = r.u32()?;
        if count as usize > messages {
            return Err(SnapshotError::Invalid(Invariant::TooManyMessages { level }));
        }
        let mut check = LevelCheck::new(level, head.next_id);
        for _ in 0..count {
            let (header, bytes) = read_record(&mut r, level)?;
            check.record(&header, bytes).map_err(SnapshotError::Invalid)?;
            if head.last_user_id == Some(header.id) {
                last_user_seen |=
                    level.is_history() && header.role == Role::User && header.is_live();
            }
            sink.record(level, &header, bytes);
        }
        check.finish(&head, bytes).map_err(SnapshotError::Invalid)?;
    }
    if !last_user_seen {
        return Err(SnapshotError::Invalid(Invariant::LastUser));
    }
    let count = r.u32()?;
    if count as usize > entity_keys {
        return Err(SnapshotError::Invalid(Invariant::Entities));
    }
    for index in 0..count as usize {
        let value = if r.some()? { Some(r.bytes()?) } else { None };
        let declared = index < head.schema_len;
        let fits = value.is_none_or(|v| v.len() <= value_bytes && core::str::from_utf8(v).is_ok());
        if !fits || (value.is_some() && !declared) {
            return Err(SnapshotError::Invalid(Invariant::Entities));
        }
        sink.entity(index, value);
    }
    if !r.is_empty() {
        return Err(SnapshotError::Malformed);
    }
    sink.end();
    Ok(())
}
