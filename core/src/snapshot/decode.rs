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
use crate::config::{Config, DynamicPlacement, OutboxMode, StrategyKind, UnansweredCalls};
use crate::header::{Header, epoch_above, flags, id_base};
use crate::json;
use crate::level::Level;
use crate::manager::{Pending, State};
use crate::record::{self, Fault, Trailer, bit};
use crate::role::Role;

/// Largest id clock a snapshot may carry.
const MAX_NEXT_ID: u64 = 1 << 63;

/// Why the decoder refused a body: a [`SnapshotError`] of the two kinds it can be, in two
/// bytes, so a refusal comes back in registers instead of through memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// [`SnapshotError::Malformed`].
    Malformed,
    /// [`SnapshotError::Invalid`].
    Invalid(Invariant),
}

impl From<Invariant> for Refusal {
    fn from(why: Invariant) -> Self {
        Refusal::Invalid(why)
    }
}

impl From<Refusal> for SnapshotError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Malformed => SnapshotError::Malformed,
            Refusal::Invalid(why) => SnapshotError::Invalid(why),
        }
    }
}

/// Where decoded records go.
pub(crate) trait Sink<'a> {
    fn config(&mut self, config: &Config);
    fn state(&mut self, state: &State);
    /// One record as the snapshot has it: `header` without [`flags::TRAILER`], `bytes`
    /// without the trailer the manager keeps after them.
    fn record(&mut self, level: Level, header: &Header, trailer: Trailer, bytes: &'a [u8]);
    fn entity(&mut self, index: usize, value: Option<&'a [u8]>);
    /// One task of the table, oldest first (version 3 on).
    #[cfg(feature = "tasks")]
    fn task(&mut self, task: &crate::task::Task);
    fn end(&mut self);
}

/// Validates only.
pub(crate) struct Validate;

impl<'a> Sink<'a> for Validate {
    fn config(&mut self, _: &Config) {}
    fn state(&mut self, _: &State) {}
    fn record(&mut self, _: Level, _: &Header, _: Trailer, _: &'a [u8]) {}
    fn entity(&mut self, _: usize, _: Option<&'a [u8]>) {}
    #[cfg(feature = "tasks")]
    fn task(&mut self, _: &crate::task::Task) {}
    fn end(&mut self) {}
}

/// Reads postcard's encoding of one field at a time from the front of the body. A shortfall
/// or bad encoding is sticky: from then on [`check`](Reader::check) reports
/// [`Refusal::Malformed`] (a read past the end returns zero or nothing). So a field is
/// read without a `Result` and a branch per call, and a group of fields is checked once,
/// before anything read from it is used.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
    bad: bool,
}

/// Bits of a varint's last byte that fit the type (postcard's `max_of_last_byte`).
const fn last_byte_max(bits: u32) -> u8 {
    (1u8 << (bits % 7)) - 1
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes, bad: false }
    }

    /// Whether every read so far found its bytes and was well encoded.
    pub(crate) fn check(&self) -> Result<(), Refusal> {
        if self.bad { Err(Refusal::Malformed) } else { Ok(()) }
    }

    /// Whether every read so far succeeded and nothing is left.
    pub(crate) fn is_done(&self) -> bool {
        !self.bad && self.rest.is_empty()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&byte, rest)) => {
                self.rest = rest;
                byte
            }
            None => {
                self.bad = true;
                0
            }
        }
    }

    /// A varint of at most `max` bytes whose last byte is at most `last` (as postcard's
    /// `try_take_varint_*`: non-minimal encodings are accepted, overlong ones are not).
    fn varint(&mut self, max: usize, last: u8) -> u64 {
        let mut value = 0u64;
        for index in 0..max {
            let byte = self.u8();
            value |= u64::from(byte & 0x7F) << (7 * index);
            if byte & 0x80 == 0 {
                self.bad |= index + 1 == max && byte > last;
                return value;
            }
        }
        self.bad = true;
        0
    }

    pub(crate) fn u16(&mut self) -> u16 {
        self.varint(V16, last_byte_max(16)) as u16
    }

    pub(crate) fn u32(&mut self) -> u32 {
        self.varint(V32, last_byte_max(32)) as u32
    }

    pub(crate) fn u64(&mut self) -> u64 {
        self.varint(V64, last_byte_max(64))
    }

    /// A length (postcard's `usize`: as wide as the target's pointers).
    fn len(&mut self) -> usize {
        const MAX: usize = (usize::BITS as usize).div_ceil(7);
        self.varint(MAX, last_byte_max(usize::BITS)) as usize
    }

    /// A `bool`, or an `Option` tag (whether a value follows): 0 or 1.
    fn flag(&mut self) -> bool {
        let byte = self.u8();
        self.bad |= byte > 1;
        byte == 1
    }

    fn option_u64(&mut self) -> Option<u64> {
        if self.flag() { Some(self.u64()) } else { None }
    }

    /// A byte string: a length, then that many bytes.
    pub(crate) fn bytes(&mut self) -> &'a [u8] {
        let len = self.len();
        match self.rest.split_at_checked(len) {
            Some((bytes, rest)) => {
                self.rest = rest;
                bytes
            }
            None => {
                self.bad = true;
                &[]
            }
        }
    }
}

/// What the record and entity checks need of the configuration and state.
struct Head {
    next_id: u64,
    /// What the loaded headers count their ids from (the base of `State::id_epoch`).
    id_base: u64,
    last_user_id: Option<u64>,
    pending: Option<Pending>,
    tokens: [u32; 4],
    schema_len: usize,
}

/// Reads the configuration (in `ConfigWire` order) into `config`.
/// Returns the retired checkpoint interval the snapshot carries (hashed into its fingerprint).
/// Out of line: its temporaries stay off the frame that holds the configuration and the
/// state while the sink runs.
#[inline(never)]
fn read_config(r: &mut Reader<'_>, c: &mut Config, version: u16) -> Result<u32, Refusal> {
    c.context_window = r.u32();
    c.reserved_for_reply = r.u32();
    c.permanent_budget = r.u32();
    c.session_budget = r.u32();
    c.working_budget = r.u32();
    c.trigger_percent = r.u8();
    c.locked_tail = r.u16();
    c.max_messages = r.u32();
    c.observation_limit = r.u32();
    c.message_overhead = r.u16();
    c.request_overhead = r.u16();
    let (unanswered, outbox, strategy) = (r.u8(), r.u8(), r.u8());
    c.summarize_threshold = r.u16();
    c.summarize_batch = r.u16();
    c.summary_tokens = r.u32();
    c.importance_threshold = r.u16();
    c.working_age_ms = r.u64();
    c.session_age_ms = r.u64();
    let retired_checkpoint_interval = r.u32();
    let keys = r.len();
    for _ in 0..keys {
        // Checked per key: the count comes from the input, and the schema refuses the 9th key.
        let key = r.bytes();
        r.check()?;
        let key = core::str::from_utf8(key).map_err(|_| Refusal::Malformed)?;
        c.entity_schema.push(key).map_err(|_| Refusal::Malformed)?;
    }
    c.low_water_percent = r.u8();
    c.fit_budgets = r.flag();
    let placement = r.u8();
    c.tool_call_overhead = r.u16();
    c.lock_newest_user = r.flag();
    if version >= super::wire::WHOLE_SINCE {
        c.compaction_limit = r.u32();
    }
    r.check()?;
    let invalid = Refusal::Invalid(Invariant::Config);
    c.dynamic_placement = match placement {
        0 => DynamicPlacement::AfterTools,
        1 => DynamicPlacement::BeforeNewestUser,
        _ => return Err(invalid),
    };
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
    Ok(retired_checkpoint_interval)
}

/// Reads the state (in `StateWire` order) into `state`.
/// Out of line: its temporaries stay off the frame that holds the configuration and the
/// state while the sink runs.
#[inline(never)]
fn read_state(r: &mut Reader<'_>, s: &mut State) -> Result<(), Refusal> {
    let next_id = r.u64();
    s.turn = r.u64();
    s.last_user_id = r.option_u64();
    let pending = if r.flag() { Some((r.u8(), r.u8(), r.u64())) } else { None };
    // One read per field, not a loop over an array of references: the array costs more code.
    let c = &mut s.counters;
    c.messages_pushed = r.u64();
    c.tokens_ingested = r.u64();
    c.units_evicted = r.u64();
    c.messages_evicted = r.u64();
    c.tokens_evicted = r.u64();
    c.units_discarded = r.u64();
    c.units_drained = r.u64();
    c.observations_reduced = r.u64();
    c.tokens_saved_by_reduction = r.u64();
    c.calls_aborted = r.u64();
    c.calls_dropped = r.u64();
    c.summaries_added = r.u64();
    c.summaries_merged = r.u64();
    c.summaries_failed = r.u64();
    c.summaries_replaced = r.u64();
    c.last_compression_turn = r.option_u64();
    c.compactions = r.u64();
    c.composes = r.u64();
    c.composes_extending = r.u64();
    c.prompt_tokens_cached = r.u64();
    c.prompt_tokens_new = r.u64();
    c.last_prefix_tokens = r.u32();
    c.prefix_changes = r.u8();
    c.last_dynamic_digest = r.u32();
    s.tokens = [r.u32(), r.u32(), r.u32(), r.u32()];
    s.now = r.u64();
    r.check()?;
    let invalid = Refusal::Invalid(Invariant::Pending);
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

/// Decodes and checks the configuration, then the state, and hands each to `sink`.
fn head(
    r: &mut Reader<'_>,
    (fingerprint, version): (u32, u16),
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'_>,
) -> Result<Head, Refusal> {
    let schema_len = head_config(r, (fingerprint, version), runs, sink)?;
    head_state(r, schema_len, sink)
}

/// Decodes and checks the configuration and hands it to `sink`; returns its schema's length.
/// Out of line, and apart from the state: each is about 300 bytes, and only one of them is
/// on the stack at a time, never while the records are read.
#[inline(never)]
fn head_config(
    r: &mut Reader<'_>,
    (fingerprint, version): (u32, u16),
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'_>,
) -> Result<usize, Refusal> {
    // Zero, not `Config::DEFAULT`: every field is read, and a zero start needs no 272-byte
    // image of the defaults in flash.
    let mut config = Config::ZERO;
    let retired_checkpoint_interval = read_config(r, &mut config, version)?;
    if config.validate().is_err() {
        return Err(Refusal::Invalid(Invariant::Config));
    }
    // A strategy that runs one kind never restores a configuration naming another.
    if runs.is_some_and(|kind| kind != config.strategy) {
        return Err(Refusal::Invalid(Invariant::Config));
    }
    // The retired checkpoint interval is hashed as written, so older snapshots still verify.
    if config.fingerprint_with(retired_checkpoint_interval) != fingerprint {
        return Err(Refusal::Invalid(Invariant::Fingerprint));
    }
    sink.config(&config);
    Ok(config.entity_schema.len())
}

/// Decodes and checks the state and hands it to `sink` (see [`head_config`]).
#[inline(never)]
fn head_state(
    r: &mut Reader<'_>,
    schema_len: usize,
    sink: &mut dyn Sink<'_>,
) -> Result<Head, Refusal> {
    let mut state = State::NEW;
    read_state(r, &mut state)?;
    // No session reaches 2^63 messages; a larger id clock is corruption, and would overflow.
    if state.next_id() > MAX_NEXT_ID {
        return Err(Refusal::Invalid(Invariant::Order { level: Level::Permanent }));
    }
    let pending = state.pending();
    if pending.is_some_and(|p| !p.level.is_history() || p.calls == 0 || usize::from(p.calls) > 64) {
        return Err(Refusal::Invalid(Invariant::Pending));
    }
    // The one base under which every id a snapshot may hold (below `next_id`) has a 32-bit
    // offset; the records must not be older (checked per record).
    state.id_epoch = epoch_above(state.next_id().saturating_sub(1 << 32));
    sink.state(&state);
    Ok(Head {
        next_id: state.next_id(),
        id_base: id_base(state.id_epoch),
        last_user_id: state.last_user_id,
        pending,
        tokens: state.tokens,
        schema_len,
    })
}

/// Reads one record's header fields (in `RecordWire` order), what the manager keeps of them
/// in the record's trailer, and its bytes. A token count before reduction is only kept for a
/// record marked reduced.
fn read_record<'a>(
    r: &mut Reader<'a>,
    level: Level,
    version: u16,
) -> Result<(u64, Header, Trailer, &'a [u8]), Refusal> {
    let mut header = Header::EMPTY;
    let mut trailer = Trailer::NONE;
    let id = r.u64();
    header.timestamp = r.u64();
    header.content_len = r.u32();
    header.tokens = r.u32();
    let original = r.u32();
    let role = r.u8();
    header.flags = r.u8();
    header.items = r.u8();
    header.detail = r.u8();
    trailer.terms = [r.u16(), r.u16(), r.u16(), r.u16()];
    let key = if version >= super::wire::KEY_SINCE { r.u32() } else { 0 };
    #[cfg(feature = "compaction-cut")]
    {
        trailer.key = key;
    }
    let bytes = r.bytes();
    r.check()?;
    header.len = bytes.len() as u32;
    header.role = role_from(role).ok_or(Refusal::Invalid(Invariant::Role { level }))?;
    if key != 0 && header.role != Role::Tool {
        return Err(Refusal::Invalid(Invariant::Flags { level }));
    }
    if version >= super::wire::WHOLE_SINCE && header.has(super::wire::WIRE_WHOLE) {
        header.flags &= !super::wire::WIRE_WHOLE;
        trailer.whole = true;
    }
    if header.has(flags::REDUCED) {
        trailer.original = Some(original);
    } else if original != header.tokens {
        return Err(Refusal::Invalid(Invariant::Flags { level }));
    }
    Ok((id, header, trailer, bytes))
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
    /// Ids must lie in `id_base..next_id`.
    id_base: u64,
    next_id: u64,
    last_id: Option<u64>,
    unit: Option<OpenUnit<'a>>,
    tokens: u64,
    bytes: usize,
}

impl<'a> LevelCheck<'a> {
    fn new(level: Level, (id_base, next_id): (u64, u64)) -> Self {
        Self { level, id_base, next_id, last_id: None, unit: None, tokens: 0, bytes: 0 }
    }

    fn record(
        &mut self,
        id: u64,
        header: &Header,
        trailer: Trailer,
        bytes: &'a [u8],
    ) -> Result<(), Invariant> {
        let level = self.level;
        if self.last_id.is_some_and(|last| id <= last) || id >= self.next_id || id < self.id_base {
            return Err(Invariant::Order { level });
        }
        self.last_id = Some(id);
        // Only a tool result is ever pushed whole.
        if header.flags & !flags::KNOWN != 0
            || header.detail > 3
            || (trailer.whole && header.role != Role::Tool)
        {
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
        self.bytes += bytes.len() + trailer.len();
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
    entities: (usize, usize),
    format: (u32, u16),
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'a>,
) -> Result<(), SnapshotError> {
    decode_body(body, capacities, entities, format, runs, sink).map_err(SnapshotError::from)
}

fn decode_body<'a>(
    body: &'a [u8],
    capacities: [(usize, usize); 4],
    (entity_keys, value_bytes): (usize, usize),
    (fingerprint, version): (u32, u16),
    runs: Option<StrategyKind>,
    sink: &mut dyn Sink<'a>,
) -> Result<(), Refusal> {
    let mut r = Reader::new(body);
    let head = head(&mut r, (fingerprint, version), runs, sink)?;
    let mut last_user_seen = head.last_user_id.is_none();
    for level in Level::ALL {
        let (messages, bytes) = capacities.get(level.index()).copied().unwrap_or_default();
        let count = r.u32();
        r.check()?;
        if count as usize > messages {
            return Err(Refusal::Invalid(Invariant::TooManyMessages { level }));
        }
        let mut check = LevelCheck::new(level, (head.id_base, head.next_id));
        for _ in 0..count {
            let (id, mut header, trailer, bytes) = read_record(&mut r, level, version)?;
            check.record(id, &header, trailer, bytes)?;
            header.id = u32::try_from(id.saturating_sub(head.id_base)).unwrap_or(u32::MAX);
            if head.last_user_id == Some(id) {
                last_user_seen |=
                    level.is_history() && header.role == Role::User && header.is_live();
            }
            sink.record(level, &header, trailer, bytes);
        }
        check.finish(&head, bytes)?;
    }
    if !last_user_seen {
        return Err(Refusal::Invalid(Invariant::LastUser));
    }
    let count = r.u32();
    r.check()?;
    if count as usize > entity_keys {
        return Err(Refusal::Invalid(Invariant::Entities));
    }
    for index in 0..count as usize {
        let value = if r.flag() { Some(r.bytes()) } else { None };
        r.check()?;
        let declared = index < head.schema_len;
        let fits = value.is_none_or(|v| v.len() <= value_bytes && core::str::from_utf8(v).is_ok());
        if !fits || (value.is_some() && !declared) {
            return Err(Refusal::Invalid(Invariant::Entities));
        }
        sink.entity(index, value);
    }
    if version >= super::wire::TASKS_SINCE {
        read_tasks(&mut r, head.next_id, sink)?;
    }
    if !r.is_done() {
        return Err(Refusal::Malformed);
    }
    sink.end();
    Ok(())
}

/// Decodes and checks the task table (version 3 on) and hands each task to `sink`: at most
/// [`MAX_TASKS`](crate::task::MAX_TASKS), numbered and placed in increasing order without
/// overlapping, only the newest open, ids below `next_id`, goals of UTF-8 within
/// [`GOAL_BYTES`](crate::task::GOAL_BYTES). Without the `tasks` feature only an empty table
/// restores (a manager that cannot run tasks does not silently drop them).
#[inline(never)]
fn read_tasks(r: &mut Reader<'_>, next_id: u64, sink: &mut dyn Sink<'_>) -> Result<(), Refusal> {
    let count = r.u32();
    r.check()?;
    #[cfg(not(feature = "tasks"))]
    {
        let _ = (next_id, sink);
        match count {
            0 => Ok(()),
            _ => Err(Refusal::Invalid(Invariant::Tasks)),
        }
    }
    #[cfg(feature = "tasks")]
    {
        use crate::task::{GOAL_BYTES, MAX_TASKS, Task};
        if count as usize > MAX_TASKS {
            return Err(Refusal::Invalid(Invariant::Tasks));
        }
        let mut previous: Option<Task> = None;
        for index in 0..count {
            let mut task = Task::EMPTY;
            task.number = r.u32();
            task.first_id = r.u64();
            task.last_id = r.u64();
            task.started = r.u64();
            task.finished = r.u64();
            task.source_tokens = r.u32();
            task.summary_tokens = r.u32();
            task.summary_id = r.u64();
            task.ingested = r.u64();
            let open = r.u8();
            let goal = r.bytes();
            r.check()?;
            task.open = open == 1;
            task.set_goal(goal);
            let newest = index + 1 == count;
            let ordered = previous
                .is_none_or(|p| p.number < task.number && !p.open && p.last_id < task.first_id);
            let valid = open <= 1
                && (newest || !task.open)
                && goal.len() <= GOAL_BYTES
                && usize::from(task.goal_len) == goal.len()
                && task.first_id <= next_id
                && (task.open || task.last_id.saturating_add(1) >= task.first_id)
                && (task.open || task.last_id < next_id)
                && ordered;
            if !valid {
                return Err(Refusal::Invalid(Invariant::Tasks));
            }
            sink.task(&task);
            previous = Some(task);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The decoder against hand-made bodies (the private wire structs); round trips and golden
    //! bytes are in `core/tests/snapshot.rs`.
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
        let mut len = 0;
        let mut put = |value: &dyn erased::Encode| len += value.encode(&mut body[len..]);
        put(&ConfigWire::from(config));
        put(state);
        for records in levels {
            put(&(records.len() as u32));
            for record in records {
                put(record);
            }
        }
        put(&0u32);
        // No tasks.
        put(&0u32);
        body.truncate(len);
        let capacities = crate::capacity::capacities_of::<TinyCapacities>();
        let mut bytes = header_bytes(config.fingerprint(), capacities, len).to_vec();
        bytes.extend_from_slice(&body);
        let crc = crc::crc32(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// postcard encoding through a trait object, so `assemble` can take mixed parts.
    mod erased {
        pub trait Encode {
            fn encode(&self, out: &mut [u8]) -> usize;
        }
        impl<T: serde::Serialize> Encode for T {
            fn encode(&self, out: &mut [u8]) -> usize {
                postcard::to_slice(self, out).unwrap().len()
            }
        }
    }

    fn record<'a>(id: u64, role: Role, content: &'a [u8], tokens: u32) -> RecordWire<'a> {
        let header = Header { role, content_len: content.len() as u32, tokens, ..Header::EMPTY };
        RecordWire { id, ..RecordWire::new(&header, content) }
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
        // 0x80 on the wire is a result pushed whole: never a user message.
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

    /// A manager holding every kind of record: pinned, a summary with sources, a tool unit
    /// with a reduced result, locked and volatile messages, evicted units and a pending call.
    fn busy() -> Tiny {
        let mut m = Tiny::new();
        m.push(Message::system("Be terse.")).unwrap();
        m.add_tool_definition(r#"{"name":"ls","parameters":{}}"#).unwrap();
        m.add_summary("Earlier: chose Rust.", &[(1, 3)], 5).unwrap();
        m.push(Message::user("go").at(10)).unwrap();
        let calls = [ToolCall::new("a", "ls", "{}")];
        m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
        let long: String = (0..400).map(|i| format!("line {i}\n")).collect();
        m.push(Message::tool_result("a", &long)).unwrap();
        for i in 0..12 {
            let _ = m.push(Message::assistant(&format!("step {i} {}", "x".repeat(150))).at(20 + i));
        }
        m.push(Message::assistant("noise").in_level(Level::Volatile).important()).unwrap();
        let calls = [ToolCall::new("b", "cat", "{}"), ToolCall::new("c", "cat", "{}")];
        m.push(Message::assistant("two reads").with_tool_calls(&calls)).unwrap();
        m.push(Message::tool_result("c", "done")).unwrap();
        m
    }

    /// A manager that has evicted many units (large ids and counters on the wire).
    fn many() -> Tiny {
        let config = Config { outbox: crate::config::OutboxMode::Discard, ..Config::DEFAULT };
        let mut m = Tiny::with_config(config).unwrap();
        for i in 0..300u64 {
            m.push(Message::user(&format!("message {i}")).at(i * 1_000_000)).unwrap();
        }
        m
    }

    /// The body of `manager`'s snapshot as postcard itself writes it, from the serde mirrors.
    fn postcard_body<C: Capacities>(manager: &ContextManager<C>) -> Vec<u8> {
        use crate::entities::EntityStorage;
        let mut body = vec![0u8; ContextManager::<C>::SNAPSHOT_MAX_SIZE];
        let mut len = 0;
        let mut put = |value: &dyn erased::Encode| len += value.encode(&mut body[len..]);
        put(&ConfigWire::from(manager.config()));
        put(&StateWire::from(manager.state()));
        for level in Level::ALL {
            let ring = manager.ring(level);
            put(&(ring.len() as u32));
            for header in ring.iter() {
                put(&RecordWire::new(header, ring.record(header)));
            }
        }
        let keys = <C::Entities as EntityStorage>::KEYS;
        put(&(keys as u32));
        let values = manager.entity_values();
        for index in 0..keys {
            put(&values.value(index).map(str::as_bytes));
        }
        #[cfg(feature = "tasks")]
        {
            put(&(manager.tasks().len() as u32));
            for task in manager.tasks() {
                put(&super::super::wire::TaskWire::from(task));
            }
        }
        #[cfg(not(feature = "tasks"))]
        put(&0u32);
        body.truncate(len);
        body
    }

    fn body(snapshot: &[u8]) -> &[u8] {
        &snapshot[HEADER_LEN..snapshot.len() - TRAILER_LEN]
    }

    /// A manager with an entity schema and values (none without the `entities` feature,
    /// whose configuration refuses a schema).
    fn with_entities() -> Option<Tiny> {
        if !cfg!(feature = "entities") {
            return None;
        }
        let schema = crate::entities::EntitySchema::new(&["city", "date"]).unwrap();
        let config = Config { entity_schema: schema, ..Config::DEFAULT };
        let mut m = Tiny::with_config(config).unwrap();
        m.push(Message::user("hi")).unwrap();
        m.load_entity(1, Some(b"May"));
        m.recount_entities();
        Some(m)
    }

    #[test]
    fn the_hand_written_encoder_writes_postcards_bytes() {
        let managers = [Some(busy()), Some(many()), Some(Tiny::new()), with_entities()];
        for manager in managers.into_iter().flatten() {
            let bytes = snapshot(&manager);
            assert_eq!(body(&bytes), &postcard_body(&manager)[..]);
        }
    }

    #[test]
    fn postcard_reads_what_the_hand_written_encoder_writes() {
        let manager = busy();
        let bytes = snapshot(&manager);
        let (config, mut rest) = postcard::take_from_bytes::<ConfigWire>(body(&bytes)).unwrap();
        assert_eq!(config.to_config().as_ref(), Some(manager.config()));
        let (state, after) = postcard::take_from_bytes::<StateWire>(rest).unwrap();
        rest = after;
        let state = state.to_state().unwrap();
        assert_eq!(state.next_id(), manager.state().next_id());
        assert_eq!(state.counters, manager.state().counters);
        assert_eq!(state.pending(), manager.state().pending());
        for level in Level::ALL {
            let (count, after) = postcard::take_from_bytes::<u32>(rest).unwrap();
            rest = after;
            let ring = manager.ring(level);
            assert_eq!(count as usize, ring.len());
            for stored in ring.iter() {
                let (record, after) = postcard::take_from_bytes::<RecordWire<'_>>(rest).unwrap();
                rest = after;
                let header = record.header(stored.role);
                let bytes = record::body(stored, ring.record(stored));
                let flags = stored.flags & !flags::TRAILER;
                let len = bytes.len() as u32;
                assert_eq!(header, Header { start: 0, len, flags, ..*stored });
                assert_eq!(record.bytes, bytes);
                let trailer = Trailer::of(stored, ring.record(stored));
                assert_eq!(record.terms, trailer.terms);
                assert_eq!(record.original_tokens, trailer.original.unwrap_or(stored.tokens));
            }
        }
    }

    #[test]
    fn non_minimal_and_overlong_varints_are_read_as_postcard_reads_them() {
        // 5 as a two-byte varint is accepted (postcard does), a u16 with a too-large last byte or
        // a u32 of six bytes is not.
        let read = |bytes: &[u8], field: fn(&mut Reader<'_>) -> u64| {
            let mut r = Reader::new(bytes);
            let value = field(&mut r);
            r.check().map(|()| value)
        };
        let u16 = |r: &mut Reader<'_>| u64::from(r.u16());
        let u32 = |r: &mut Reader<'_>| u64::from(r.u32());
        let u64 = |r: &mut Reader<'_>| r.u64();
        assert_eq!(read(&[0x85, 0x00], u32), Ok(5));
        assert_eq!(postcard::from_bytes::<u32>(&[0x85, 0x00]), Ok(5));
        for (bytes, u16_ok) in [(&[0xff, 0xff, 0x03][..], true), (&[0xff, 0xff, 0x04][..], false)] {
            assert_eq!(read(bytes, u16).is_ok(), u16_ok);
            assert_eq!(postcard::from_bytes::<u16>(bytes).is_ok(), u16_ok);
        }
        let six = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert!(read(&six, u32).is_err());
        assert!(postcard::from_bytes::<u32>(&six).is_err());
        let u64_max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(read(&u64_max, u64), Ok(u64::MAX));
        let too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(read(&too_big, u64).is_err());
        assert!(postcard::from_bytes::<u64>(&too_big).is_err());
        assert_eq!(read(&[2], |r| u64::from(r.u8())), Ok(2));
        assert!(read(&[0x80], u32).is_err(), "a varint cut short");
        let mut r = Reader::new(&[3, b'a']);
        assert_eq!(r.bytes(), b"");
        assert!(r.check().is_err(), "a byte string longer than the input");
    }

    /// A failed read is sticky: the reader stays failed even when later reads find their
    /// bytes, and a read past the end returns zero.
    #[test]
    fn a_failed_read_fails_every_later_check() {
        let mut r = Reader::new(&[2, 0xff, 7]);
        assert!(!r.flag() && r.check().is_err(), "a tag of 2 is neither None nor Some");
        assert_eq!(r.u8(), 0xff);
        assert!(r.check().is_err() && !r.is_done());
        let mut r = Reader::new(&[1]);
        assert!(r.flag() && r.is_done());
        assert_eq!(r.u8(), 0);
        assert!(r.check().is_err() && !r.is_done(), "reading past the end");
    }
}
