//! Reading a snapshot body: every invariant is checked while decoding, and a [`Sink`] either
//! only validates or stores. Restore runs the same decode twice, validating then loading, so a
//! snapshot that fails any check leaves the manager untouched without a scratch copy of it.

use serde::Deserialize;

use super::error::{Invariant, SnapshotError};
use super::wire::{ConfigWire, RecordWire, StateWire, role_from};
use crate::config::{Config, StrategyKind};
use crate::header::{Header, flags};
use crate::json;
use crate::level::Level;
use crate::manager::State;
use crate::record::{self, Fault, bit};
use crate::role::Role;

/// Largest id clock a snapshot may carry.
const MAX_NEXT_ID: u64 = 1 << 63;

/// Where decoded records go.
pub(crate) trait Sink<'a> {
    fn begin(&mut self, config: Config, state: State);
    fn record(&mut self, level: Level, header: Header, bytes: &'a [u8]);
    fn entity(&mut self, index: usize, value: Option<&'a [u8]>);
    fn end(&mut self);
}

/// Validates only.
pub(crate) struct Validate;

impl<'a> Sink<'a> for Validate {
    fn begin(&mut self, _: Config, _: State) {}
    fn record(&mut self, _: Level, _: Header, _: &'a [u8]) {}
    fn entity(&mut self, _: usize, _: Option<&'a [u8]>) {}
    fn end(&mut self) {}
}

fn take<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<(T, &'a [u8]), SnapshotError> {
    postcard::take_from_bytes(bytes).map_err(|_| SnapshotError::Malformed)
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
    fn finish(self, state: &State, byte_capacity: usize) -> Result<(), Invariant> {
        let level = self.level;
        if self.bytes > byte_capacity {
            return Err(Invariant::TooManyBytes { level });
        }
        let stored = state.tokens.get(level.index()).copied().unwrap_or(0);
        if u64::from(stored) != self.tokens {
            return Err(Invariant::TokenTotals { level });
        }
        let pending_here = state.pending().filter(|p| p.level == level);
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
pub(crate) fn decode<'a, S: Sink<'a>>(
    body: &'a [u8],
    capacities: [(usize, usize); 4],
    (entity_keys, value_bytes): (usize, usize),
    fingerprint: u32,
    runs: Option<StrategyKind>,
    sink: &mut S,
) -> Result<(), SnapshotError> {
    let (wire, rest) = take::<ConfigWire>(body)?;
    let config = wire.to_config().ok_or(SnapshotError::Invalid(Invariant::Config))?;
    if config.validate().is_err() {
        return Err(SnapshotError::Invalid(Invariant::Config));
    }
    // A strategy that runs one kind never restores a configuration naming another.
    if runs.is_some_and(|kind| kind != config.strategy) {
        return Err(SnapshotError::Invalid(Invariant::Config));
    }
    // The retired checkpoint interval is hashed as written, so older snapshots still verify.
    if config.fingerprint_with(wire.checkpoint_interval_messages) != fingerprint {
        return Err(SnapshotError::Invalid(Invariant::Fingerprint));
    }
    let (state, mut rest) = take::<StateWire>(rest)?;
    let state = state.to_state().ok_or(SnapshotError::Invalid(Invariant::Pending))?;
    // No session reaches 2^63 messages; a larger id clock is corruption, and would overflow.
    if state.next_id() > MAX_NEXT_ID {
        return Err(SnapshotError::Invalid(Invariant::Order { level: Level::Permanent }));
    }
    if state
        .pending()
        .is_some_and(|p| !p.level.is_history() || p.calls == 0 || usize::from(p.calls) > 64)
    {
        return Err(SnapshotError::Invalid(Invariant::Pending));
    }
    sink.begin(config, state);
    let mut last_user_seen = state.last_user_id.is_none();
    for (level, (messages, bytes)) in Level::ALL.into_iter().zip(capacities) {
        let (count, after) = take::<u32>(rest)?;
        rest = after;
        if count as usize > messages {
            return Err(SnapshotError::Invalid(Invariant::TooManyMessages { level }));
        }
        let mut check = LevelCheck::new(level, state.next_id());
        for _ in 0..count {
            let (wire, after) = take::<RecordWire<'a>>(rest)?;
            rest = after;
            let role =
                role_from(wire.role).ok_or(SnapshotError::Invalid(Invariant::Role { level }))?;
            let header = wire.header(role);
            check.record(&header, wire.bytes).map_err(SnapshotError::Invalid)?;
            if state.last_user_id == Some(header.id) {
                last_user_seen |= level.is_history() && role == Role::User && header.is_live();
            }
            sink.record(level, header, wire.bytes);
        }
        check.finish(&state, bytes).map_err(SnapshotError::Invalid)?;
    }
    if !last_user_seen {
        return Err(SnapshotError::Invalid(Invariant::LastUser));
    }
    let (count, after) = take::<u32>(rest)?;
    rest = after;
    if count as usize > entity_keys {
        return Err(SnapshotError::Invalid(Invariant::Entities));
    }
    for index in 0..count as usize {
        let (value, after) = take::<Option<&'a [u8]>>(rest)?;
        rest = after;
        let declared = index < config.entity_schema.len();
        let fits = value.is_none_or(|v| v.len() <= value_bytes && core::str::from_utf8(v).is_ok());
        if !fits || (value.is_some() && !declared) {
            return Err(SnapshotError::Invalid(Invariant::Entities));
        }
        sink.entity(index, value);
    }
    if !rest.is_empty() {
        return Err(SnapshotError::Malformed);
    }
    sink.end();
    Ok(())
}
