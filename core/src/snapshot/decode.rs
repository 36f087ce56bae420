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

#[cfg(test)]
mod tests {
    //! The decoder against hand-made bodies (the private wire structs); round trips and golden
    //! bytes are in `core/tests/snapshot.rs`.
    use super::super::flavor::Fill;
    use super::super::wire::{ConfigWire, HEADER_LEN, RecordWire, StateWire, TRAILER_LEN};
    use super::super::{crc, header_bytes};
    use super::*;
    use crate::capacity::Capacities;
    use crate::config::Config;
    use crate::header::{Header, flags};
    use crate::manager::ContextManager;
    use crate::{Message, OpenAiRequest, Role, TinyCapacities, ToolCall};

    type Tiny = ContextManager<TinyCapacities>;

    fn snapshot<C: Capacities>(manager: &ContextManager<C>) -> Vec<u8> {
        let mut buffer = vec![0u8; ContextManager::<C>::SNAPSHOT_MAX_SIZE];
        let len = manager.snapshot_into(&mut buffer).unwrap().len();
        buffer.truncate(len);
        buffer
    }

    /// Restores `bytes` into a fresh manager; if it is accepted, the manager must be usable.
    fn restore_any(bytes: &[u8]) -> Result<(), SnapshotError> {
        let mut m = Tiny::new();
        let result = m.restore_from(bytes);
        if result.is_ok() {
            let _ = m.stats();
            let mut body = vec![0u8; 256 * 1024];
            let _ = m
                .compose(&["dynamic"])
                .and_then(|p| p.write_openai(&mut body[..], OpenAiRequest::default()));
            let _ = m.push(Message::user("after"));
            m.drain_outbox(|_| {});
        }
        result
    }

    /// Assembles a snapshot from hand-made parts, with a correct header and CRC.
    fn assemble(config: &Config, state: &StateWire, levels: [&[RecordWire<'_>]; 4]) -> Vec<u8> {
        let mut body = vec![0u8; 8192];
        let mut out = Fill { buf: &mut body, at: 0 };
        out = postcard::serialize_with_flavor(&ConfigWire::from(config), out).unwrap();
        out = postcard::serialize_with_flavor(state, out).unwrap();
        for records in levels {
            out = postcard::serialize_with_flavor(&(records.len() as u32), out).unwrap();
            for record in records {
                out = postcard::serialize_with_flavor(record, out).unwrap();
            }
        }
        out = postcard::serialize_with_flavor(&0u32, out).unwrap();
        let len = out.at;
        body.truncate(len);
        let capacities = crate::capacity::capacities_of::<TinyCapacities>();
        let mut bytes = header_bytes(config.fingerprint(), capacities, len).to_vec();
        bytes.extend_from_slice(&body);
        let crc = crc::crc32(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn record<'a>(id: u64, role: Role, content: &'a [u8], tokens: u32) -> RecordWire<'a> {
        let header = Header {
            id,
            role,
            content_len: content.len() as u32,
            tokens,
            original_tokens: tokens,
            ..Header::EMPTY
        };
        RecordWire::new(&header, content)
    }

    fn state(next_id: u64, tokens: [u32; 4]) -> StateWire {
        let mut state = crate::manager::State::NEW;
        state.issued = next_id - 1;
        state.tokens = tokens;
        StateWire::from(&state)
    }

    #[test]
    fn decoded_state_that_breaks_an_invariant_is_refused() {
        let config = Config::DEFAULT;
        let invalid = |bytes: Vec<u8>| match restore_any(&bytes) {
            Err(SnapshotError::Invalid(why)) => why,
            other => panic!("expected an invariant error, got {other:?}"),
        };
        let user = record(1, Role::User, b"hi", 5);
        assert!(
            restore_any(&assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[user], &[]]))
                .is_ok()
        );

        let result = [0x61u8, 0x61];
        let mut orphan = record(1, Role::Tool, &result, 5);
        orphan.content_len = 1;
        let working = Level::Working;
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[orphan], &[]])),
            Invariant::OrphanToolResult { level: working }
        );
        let not_utf8 = record(1, Role::User, &[0xff, 0xfe], 5);
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[not_utf8], &[]])),
            Invariant::Text { level: working }
        );
        let mut outside = record(1, Role::User, b"hi", 5);
        outside.content_len = 40;
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[outside], &[]])),
            Invariant::Span { level: working }
        );
        assert_eq!(
            invalid(assemble(
                &config,
                &state(2, [0, 0, 6, 0]),
                [&[], &[], &[record(1, Role::User, b"hi", 5)], &[]]
            )),
            Invariant::TokenTotals { level: working }
        );
        let twice = [record(1, Role::User, b"a", 5), record(1, Role::User, b"b", 5)];
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 10, 0]), [&[], &[], &twice, &[]])),
            Invariant::Order { level: working }
        );
        let mut tool_in_permanent = record(1, Role::Tool, b"xy", 5);
        tool_in_permanent.content_len = 1;
        assert_eq!(
            invalid(assemble(
                &config,
                &state(2, [5, 0, 0, 0]),
                [&[tool_in_permanent], &[], &[], &[]]
            )),
            Invariant::Role { level: Level::Permanent }
        );
        let mut evicted_rule = record(1, Role::System, b"rule", 5);
        evicted_rule.flags = flags::EVICTED;
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 0, 0]), [&[evicted_rule], &[], &[], &[]])),
            Invariant::Role { level: Level::Permanent }
        );
        let mut unknown_flag = record(1, Role::User, b"hi", 5);
        unknown_flag.flags = 0x80;
        assert_eq!(
            invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[unknown_flag], &[]])),
            Invariant::Flags { level: working }
        );
        let mut last_user = state(2, [0, 0, 5, 0]);
        last_user.last_user_id = Some(7);
        assert_eq!(
            invalid(assemble(
                &config,
                &last_user,
                [&[], &[], &[record(1, Role::User, b"hi", 5)], &[]]
            )),
            Invariant::LastUser
        );
        let bad_config = Config { trigger_percent: 0, ..config };
        let bytes = assemble(&bad_config, &state(1, [0; 4]), [&[], &[], &[], &[]]);
        assert_eq!(invalid(bytes), Invariant::Config);
    }

    #[test]
    fn an_unanswered_call_must_be_the_pending_unit() {
        let mut m = Tiny::new();
        let calls = [ToolCall::new("a", "ls", "{}")];
        m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
        let bytes = snapshot(&m);
        assert!(restore_any(&bytes).is_ok());
        // Forge the state so the unit is no longer marked pending: the decoder must notice.
        let body = &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN];
        let (config, rest) = postcard::take_from_bytes::<ConfigWire>(body).unwrap();
        let (mut state, _) = postcard::take_from_bytes::<StateWire>(rest).unwrap();
        state.pending = None;
        let header = *m.ring(Level::Working).first().unwrap();
        let record = RecordWire::new(&header, m.ring(Level::Working).record(&header));
        let forged = assemble(&config.to_config().unwrap(), &state, [&[], &[], &[record], &[]]);
        assert_eq!(
            restore_any(&forged),
            Err(SnapshotError::Invalid(Invariant::IncompleteUnit { level: Level::Working }))
        );
    }

    /// Snapshots from before `checkpoint_interval_messages` left `Config` carry whatever value was
    /// configured, hashed into their fingerprint: they still restore, and the value is ignored.
    #[test]
    fn a_retired_checkpoint_interval_of_any_value_still_verifies() {
        let mut m = Tiny::new();
        m.push(Message::user("ok").at(2)).unwrap();
        let bytes = snapshot(&m);
        let body = &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN];
        let (mut wire, rest) = postcard::take_from_bytes::<ConfigWire>(body).unwrap();
        assert_eq!(wire.checkpoint_interval_messages, 50, "written as the old default");
        wire.checkpoint_interval_messages = 20;
        let mut old_body = vec![0u8; body.len() + 8];
        let len = postcard::to_slice(&wire, &mut old_body).unwrap().len();
        old_body.truncate(len);
        old_body.extend_from_slice(rest);
        let old = |fingerprint: u32| {
            let capacities = crate::capacity::capacities_of::<TinyCapacities>();
            let mut old = header_bytes(fingerprint, capacities, old_body.len()).to_vec();
            old.extend_from_slice(&old_body);
            let crc = crc::crc32(&old);
            old.extend_from_slice(&crc.to_le_bytes());
            old
        };
        let mut restored = Tiny::new();
        restored.restore_from(&old(m.config().fingerprint_with(20))).unwrap();
        assert_eq!(restored.config(), m.config());
        assert_eq!(snapshot(&restored), bytes, "written back with the old default");
        assert_eq!(
            Tiny::new().restore_from(&old(m.config().fingerprint())),
            Err(SnapshotError::Invalid(Invariant::Fingerprint))
        );
    }

    /// Found by `cargo fuzz`: counters restored at their maximum must not overflow on the next
    /// push (they saturate).
    #[test]
    fn counters_at_their_maximum_saturate() {
        let mut state = crate::manager::State::NEW;
        state.issued = 4;
        state.turn = u64::MAX;
        state.counters = crate::stats::Counters {
            messages_pushed: u64::MAX,
            tokens_ingested: u64::MAX,
            units_evicted: u64::MAX,
            messages_evicted: u64::MAX,
            tokens_evicted: u64::MAX,
            ..crate::stats::Counters::default()
        };
        let bytes = assemble(&Config::DEFAULT, &StateWire::from(&state), [&[], &[], &[], &[]]);
        let mut m = Tiny::new();
        m.restore_from(&bytes).unwrap();
        m.push(Message::user("hi")).unwrap();
        assert_eq!(m.stats().counters.messages_pushed, u64::MAX);
        assert_eq!(m.turn(), u64::MAX);
        let mut too_far = state;
        too_far.issued = u64::MAX - 1;
        let bytes = assemble(&Config::DEFAULT, &StateWire::from(&too_far), [&[], &[], &[], &[]]);
        assert!(matches!(
            m.restore_from(&bytes),
            Err(SnapshotError::Invalid(Invariant::Order { .. }))
        ));
    }
}
