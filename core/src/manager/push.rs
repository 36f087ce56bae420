//! Storing messages: validation, tool-call units, observation reduction.

use super::{ContextManager, Pending};
use crate::capacity::Capacities;
use crate::config::UnansweredCalls;
use crate::counter::TokenCounter;
use crate::error::{Error, InvalidMessage};
use crate::header::{Header, epoch_below, flags, id_base};
use crate::json;
use crate::level::Level;
use crate::message::{MAX_TOOL_CALLS, Message};
use crate::record::ToolCall;
use crate::record::{self, SpanWriter, Trailer, bit};
use crate::reduce::{self, MIN_REDUCED_TOKENS, Reduction};
use crate::role::Role;
use crate::stats::bump;
use crate::strategy::Strategy;
use crate::terms::key_terms;

/// Longest tool call id accepted, in bytes (providers use about 30).
pub const MAX_TOOL_CALL_ID_LEN: usize = 128;

/// Content of the synthetic result stored for a call that never got one.
pub const ABORTED_RESULT: &str = "[ctxwin] Tool call aborted: no result was received.";

/// What a new record's content is made of. The reduction by reference: with its marker
/// buffer inline, every `Content` (the synthetic results' too) would take 80 bytes of stack.
enum Content<'a> {
    Plain(&'a str),
    Reduced(&'a Reduction<'a>),
}

impl Content<'_> {
    fn len(&self) -> usize {
        match self {
            Content::Plain(text) => text.len(),
            Content::Reduced(reduction) => reduction.len(),
        }
    }

    fn write(&self, out: &mut SpanWriter<'_>) {
        match self {
            Content::Plain(text) => out.put(text.as_bytes()),
            Content::Reduced(reduction) => {
                reduction.parts().iter().for_each(|p| out.put(p.as_bytes()))
            }
        }
    }
}

/// Role-specific data stored after the content.
enum Extra<'a> {
    None,
    Calls(&'a [ToolCall<'a>]),
    CallId(&'a str),
    Ranges(&'a [(u64, u64)]),
    /// Zero bytes, overwritten once the record is stored.
    Blank(usize),
}

impl Extra<'_> {
    fn len(&self) -> usize {
        match self {
            Extra::None => 0,
            Extra::Calls(calls) => record::calls_len(calls),
            Extra::CallId(id) => id.len(),
            Extra::Ranges(ranges) => ranges.len() * record::RANGE_ENTRY,
            Extra::Blank(len) => *len,
        }
    }

    fn write(&self, out: &mut SpanWriter<'_>) {
        match self {
            Extra::None => {}
            Extra::Calls(calls) => out.put_calls(calls),
            Extra::CallId(id) => out.put(id.as_bytes()),
            Extra::Ranges(ranges) => ranges.iter().for_each(|&(a, b)| out.put_range(a, b)),
            Extra::Blank(len) => out.put_zeros(*len),
        }
    }
}

pub(crate) fn validate(message: &Message<'_>) -> Result<(), InvalidMessage> {
    if !message.tool_calls.is_empty() && message.role != Role::Assistant {
        return Err(InvalidMessage::ToolCallsOnNonAssistant);
    }
    match (message.role, message.tool_call_id) {
        (Role::Tool, None) => return Err(InvalidMessage::MissingToolCallId),
        (Role::Tool, Some("")) => return Err(InvalidMessage::EmptyToolCallId),
        (Role::Tool, Some(id)) if id.len() > MAX_TOOL_CALL_ID_LEN => {
            return Err(InvalidMessage::FieldTooLong);
        }
        (Role::Tool, Some(_)) => {}
        (_, Some(_)) => return Err(InvalidMessage::UnexpectedToolCallId),
        (_, None) => {}
    }
    if message.tool_calls.len() > MAX_TOOL_CALLS {
        return Err(InvalidMessage::TooManyToolCalls);
    }
    for (index, call) in message.tool_calls.iter().enumerate() {
        if call.id.is_empty() {
            return Err(InvalidMessage::EmptyToolCallId);
        }
        if call.id.len() > MAX_TOOL_CALL_ID_LEN
            || call.name.len() > usize::from(u16::MAX)
            || u32::try_from(call.arguments.len()).is_err()
        {
            return Err(InvalidMessage::FieldTooLong);
        }
        if message.tool_calls.iter().take(index).any(|earlier| earlier.id == call.id) {
            return Err(InvalidMessage::DuplicateToolCallId);
        }
    }
    Ok(())
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Stores a message and returns its id; evicts to the outbox if the budget requires.
    ///
    /// - System messages go to the permanent level, others to the working level, unless
    ///   [`Message::level`] says otherwise; a tool result always joins its call's unit.
    /// - A tool result must answer a call that is waiting in the window
    ///   ([`Error::OrphanToolResult`] otherwise); one over
    ///   [`Config::observation_limit`](crate::config::Config::observation_limit) tokens is stored
    ///   reduced, unless it is [`Message::whole`] (then only one over its unit's room is).
    /// - A history message arriving while calls still wait closes them first: each gets a
    ///   synthetic "aborted" result, or is dropped from its message
    ///   ([`Config::unanswered_calls`](crate::config::Config::unanswered_calls)).
    ///
    /// On error nothing is stored.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities, ToolCall};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let calls = [ToolCall::new("c1", "date", "{}"), ToolCall::new("c2", "uptime", "{}")];
    /// manager.push(Message::assistant("").with_tool_calls(&calls))?;
    /// manager.push(Message::tool_result("c1", "Sunday"))?;
    /// assert_eq!(manager.push(Message::tool_result("c1", "again")), Err(Error::DuplicateToolResult));
    /// manager.push(Message::user("never mind"))?; // c2 gets an "aborted" result
    /// assert_eq!(manager.unanswered_calls(), 0);
    /// assert_eq!(manager.history().count(), 4);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn push(&mut self, message: Message<'_>) -> Result<u64, Error> {
        self.ensure_configured()?;
        validate(&message)?;
        self.refresh_entities();
        if message.role == Role::Tool {
            return self.push_tool_result(&message);
        }
        let (level, tokens, extra) = self.checked(&message)?;
        let terms = if self.strategy.needs(&self.config).terms {
            let texts = core::iter::once(message.content)
                .chain(message.tool_calls.iter().map(|c| c.arguments));
            key_terms(texts)
        } else {
            [0; 4]
        };
        let trailer = Trailer { terms, ..Trailer::NONE };
        let len = message.content.len() + extra.len() + trailer.len();
        if level.is_history() {
            self.make_room_closing(level, Some(len))?;
            self.close_pending();
        } else {
            self.make_room(level, len, 1)?;
        }
        let mut header = Header {
            id: 0,
            timestamp: message.timestamp,
            role: message.role,
            items: message.tool_calls.len() as u8,
            tokens,
            ..Header::EMPTY
        };
        if message.important {
            header.flags |= flags::IMPORTANT;
        }
        let id = self.store(level, header, &Content::Plain(message.content), &extra, trailer)?;
        if message.role == Role::User && level.is_history() {
            self.state.turn = self.state.turn.saturating_add(1);
            self.state.last_user_id = Some(id);
        }
        if !message.tool_calls.is_empty() {
            self.state.set_pending(Some(Pending {
                level,
                calls: message.tool_calls.len() as u8,
                answered: 0,
            }));
        }
        self.after_push(message.role, level, id);
        self.collect();
        Ok(id)
    }

    /// Stores a tool definition (a JSON object such as
    /// `{"name":…,"description":…,"parameters":{…}}`) in the permanent level; it is written to
    /// the request's `tools` list.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.add_tool_definition(r#"{"name":"ls","parameters":{"type":"object"}}"#)?;
    /// assert_eq!(manager.add_tool_definition("not json"), Err(Error::InvalidToolDefinition));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn add_tool_definition(&mut self, function_json: &str) -> Result<u64, Error> {
        self.ensure_configured()?;
        if !json::is_object(function_json) {
            return Err(Error::InvalidToolDefinition);
        }
        let tokens = self.framed_tokens(self.counter.count(function_json), [], None);
        self.check_fits(Level::Permanent, tokens, function_json.len())?;
        self.make_room(Level::Permanent, function_json.len(), 1)?;
        let header =
            Header { role: Role::System, flags: flags::TOOL_DEFINITION, tokens, ..Header::EMPTY };
        let plain = Content::Plain(function_json);
        let id = self.store(Level::Permanent, header, &plain, &Extra::None, Trailer::NONE)?;
        // Its room comes from the history, as a system message's does.
        self.collect();
        Ok(id)
    }

    /// Adds a summary to the session level, standing for the messages in `sources` (inclusive
    /// id ranges, at most [`MAX_SUMMARY_RANGES`](crate::manager::MAX_SUMMARY_RANGES)), so a caller can
    /// drill down to the originals in its archive (an LLM summary computed off the critical
    /// path, a key decision).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.add_summary("Decided: use PostgreSQL 16.", &[(1, 12)], 60_000)?;
    /// assert_eq!(manager.stats().summaries(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn add_summary(
        &mut self,
        text: &str,
        sources: &[(u64, u64)],
        timestamp: u64,
    ) -> Result<u64, Error> {
        self.ensure_configured()?;
        if sources.len() > crate::manager::MAX_SUMMARY_RANGES {
            return Err(InvalidMessage::TooManySummaryRanges.into());
        }
        let tokens = self.framed_tokens(self.counter.count(text), [], None);
        let extra = Extra::Ranges(sources);
        self.check_fits(Level::Session, tokens, text.len() + extra.len())?;
        self.make_room(Level::Session, text.len() + extra.len(), 1)?;
        let header = Header {
            timestamp,
            role: Role::System,
            flags: flags::SUMMARY | flags::SYNTHETIC,
            items: sources.len() as u8,
            tokens,
            ..Header::EMPTY
        };
        let id =
            self.store(Level::Session, header, &Content::Plain(text), &extra, Trailer::NONE)?;
        let counters = &mut self.state.counters;
        bump(&mut counters.summaries_added, 1);
        self.state.counters.last_compression_turn = Some(self.state.turn);
        self.collect();
        Ok(id)
    }

    /// Closes every call still waiting for a result, as
    /// [`Config::unanswered_calls`](crate::config::Config::unanswered_calls) says; for when a tool will
    /// never answer.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities, ToolCall};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let calls = [ToolCall::new("c1", "slow_tool", "{}")];
    /// manager.push(Message::assistant("").with_tool_calls(&calls))?;
    /// manager.abort_pending_calls()?;
    /// assert!(manager.compose(&[]).is_ok());
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn abort_pending_calls(&mut self) -> Result<(), Error> {
        if let Some(pending) = self.state.pending() {
            self.make_room_closing(pending.level, None)?;
        }
        self.close_pending();
        self.collect();
        Ok(())
    }

    /// Makes room for a new record of `record` bytes (if any) in history level `level`, plus
    /// the synthetic results closing the pending unit would store, so that closing and storing
    /// cannot fail half-way.
    fn make_room_closing(&mut self, level: Level, record: Option<usize>) -> Result<(), Error> {
        let (len, slots) = record.map_or((0, 0), |len| (len, 1));
        let Some(pending) = self.state.pending() else {
            return self.make_room(level, len, slots);
        };
        let (bytes, results) = match self.drops_calls() {
            true => (0, 0),
            false => self.aborted_results_size(pending),
        };
        if pending.level == level {
            return self.make_room(level, len + bytes, slots + results);
        }
        self.make_room(pending.level, bytes, results)?;
        self.make_room(level, len, slots)
    }

    /// Bytes and records the synthetic results for `pending`'s unanswered calls take.
    fn aborted_results_size(&self, pending: Pending) -> (usize, usize) {
        let ring = self.ring(pending.level);
        let Some(head) = self.pending_head(pending.level).and_then(|i| ring.get(i)) else {
            return (0, 0);
        };
        record::ToolCalls::new(head, ring.record(head))
            .enumerate()
            .filter(|(index, _)| pending.answered & bit(*index) == 0)
            .fold((0, 0), |(bytes, count), (_, call)| {
                (bytes + ABORTED_RESULT.len() + call.id.len(), count + 1)
            })
    }

    /// The waiting call a result for `call_id` answers: the pending unit, its head's index and
    /// the call's position; [`Error::OrphanToolResult`] or [`Error::DuplicateToolResult`]
    /// otherwise.
    fn answered_call(&self, call_id: &str) -> Result<(Pending, usize, usize), Error> {
        let pending = self.state.pending().ok_or(Error::OrphanToolResult)?;
        let head = self.pending_head(pending.level).ok_or(Error::OrphanToolResult)?;
        let index = self
            .ring(pending.level)
            .get(head)
            .and_then(|header| {
                let ring = self.ring(pending.level);
                record::ToolCalls::new(header, ring.record(header)).position_of(call_id)
            })
            .ok_or(Error::OrphanToolResult)?;
        if pending.answered & bit(index) != 0 {
            return Err(Error::DuplicateToolResult);
        }
        Ok((pending, head, index))
    }

    /// The checks [`push`](Self::push) makes before it stores or evicts anything: the manager
    /// is configured, the message is well formed for its level, fits its level's budget and
    /// arena (a tool result is reduced instead), and a tool result answers a call that is
    /// waiting. For a caller that writes a message elsewhere first (an archive) and wants the
    /// usual refusals to leave no trace. `push` can still refuse for room that eviction cannot
    /// make ([`Error::LevelFull`], [`Error::OutboxFull`], a result too large to reduce).
    ///
    /// Returns the tokens the message costs as pushed, framing included (a tool result's
    /// before any reduction).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// assert_eq!(manager.check(&Message::tool_result("c1", "42")), Err(Error::OrphanToolResult));
    /// let tokens = manager.check(&Message::user("hi"))?;
    /// let id = manager.push(Message::user("hi"))?;
    /// assert_eq!(manager.get(id).map(|m| m.tokens()), Some(tokens));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn check(&self, message: &Message<'_>) -> Result<u32, Error> {
        self.ensure_configured()?;
        validate(message)?;
        if let (Role::Tool, Some(call_id)) = (message.role, message.tool_call_id) {
            self.answered_call(call_id)?;
            return Ok(self.framed_tokens(self.counter.count(message.content), [], Some(call_id)));
        }
        self.checked(message).map(|(_, tokens, _)| tokens)
    }

    /// A message other than a tool result, checked for its level and size: its level, framed
    /// tokens and the extra it stores besides its content.
    fn checked<'m>(&self, message: &Message<'m>) -> Result<(Level, u32, Extra<'m>), Error> {
        let level = message.level.unwrap_or(message.default_level());
        if !message.tool_calls.is_empty() && !level.is_history() {
            return Err(InvalidMessage::WrongLevel(level).into());
        }
        let content_tokens = self.counter.count(message.content);
        let tokens = self.framed_tokens(content_tokens, message.tool_calls.iter().copied(), None);
        let extra = if message.tool_calls.is_empty() {
            Extra::None
        } else {
            Extra::Calls(message.tool_calls)
        };
        self.check_fits(level, tokens, message.content.len() + extra.len())?;
        Ok((level, tokens, extra))
    }

    /// The id the next stored record will get. Ids are handed out in order, so a push that
    /// first closes `n` waiting calls with synthetic results gives the message
    /// `next_id() + n` (see [`unanswered_calls`](Self::unanswered_calls)).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let expected = manager.next_id();
    /// assert_eq!(manager.push(Message::user("hi"))?, expected);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn next_id(&self) -> u64 {
        self.state.next_id()
    }

    fn push_tool_result(&mut self, message: &Message<'_>) -> Result<u64, Error> {
        let call_id = message.tool_call_id.unwrap_or_default();
        let (pending, head, index) = self.answered_call(call_id)?;
        let level = pending.level;
        let unit_tokens = self.unit_tokens(level, head);
        let framing = self.framed_tokens(0, [], Some(call_id));
        let room =
            self.config.level_budget(level).saturating_sub(unit_tokens.saturating_add(framing));
        let waiting = u32::from(pending.unanswered().saturating_sub(1));
        let reserve = MIN_REDUCED_TOKENS.saturating_add(framing);
        let observation_limit =
            if message.whole { u32::MAX } else { self.config.observation_limit };
        let limit = reduce::result_limit(observation_limit, room, waiting, reserve);
        let raw_tokens = self.counter.count(message.content);
        let reduction;
        let content = if raw_tokens <= limit {
            Content::Plain(message.content)
        } else if limit >= MIN_REDUCED_TOKENS {
            reduction = reduce::reduce(message.content, limit, &self.counter);
            Content::Reduced(&reduction)
        } else {
            return Err(Error::MessageTooLarge { needed: raw_tokens, limit });
        };
        let original_tokens = self.framed_tokens(raw_tokens, [], Some(call_id));
        let extra = Extra::CallId(call_id);
        let tokens = match &content {
            Content::Plain(_) => original_tokens,
            Content::Reduced(reduction) => {
                let stored = reduction.parts().iter().map(|p| self.counter.count(p)).sum::<u32>();
                self.framed_tokens(stored, [], Some(call_id))
            }
        };
        let trailer = Trailer {
            original: matches!(content, Content::Reduced(_)).then_some(original_tokens),
            terms: if self.strategy.needs(&self.config).terms {
                key_terms([message.content])
            } else {
                [0; 4]
            },
            whole: message.whole,
            #[cfg(feature = "compaction-cut")]
            key: message.supersede_key,
        };
        let len = content.len() + extra.len() + trailer.len();
        self.check_fits(level, tokens, len)?;
        self.make_room(level, len, 1)?;
        let header = Header {
            timestamp: message.timestamp,
            role: Role::Tool,
            flags: if matches!(content, Content::Reduced(_)) { flags::REDUCED } else { 0 }
                | if message.important { flags::IMPORTANT } else { 0 },
            tokens,
            ..Header::EMPTY
        };
        let id = self.store(level, header, &content, &extra, trailer)?;
        if let Content::Reduced(_) = content {
            let counters = &mut self.state.counters;
            bump(&mut counters.observations_reduced, 1);
            bump(
                &mut counters.tokens_saved_by_reduction,
                u64::from(original_tokens.saturating_sub(tokens)),
            );
        }
        self.mark_answered(index);
        self.after_push(Role::Tool, level, id);
        self.collect();
        Ok(id)
    }

    fn mark_answered(&mut self, index: usize) {
        if let Some(mut pending) = self.state.pending() {
            pending.answered |= bit(index);
            self.state.set_pending((pending.unanswered() > 0).then_some(pending));
        }
    }

    /// Index of the pending unit's assistant message: the newest non-tool message of `level`.
    pub(crate) fn pending_head(&self, level: Level) -> Option<usize> {
        let ring = self.ring(level);
        (0..ring.len()).rev().find(|&i| ring.get(i).is_some_and(|h| h.role != Role::Tool))
    }

    /// Live tokens of the unit starting at `head`.
    fn unit_tokens(&self, level: Level, head: usize) -> u32 {
        let ring = self.ring(level);
        (head..ring.len()).filter_map(|i| ring.get(i)).map(|h| h.tokens).sum()
    }

    /// A message's token cost: content, tool-call strings, result id, and framing.
    pub(crate) fn framed_tokens<'c>(
        &self,
        content: u32,
        calls: impl IntoIterator<Item = ToolCall<'c>>,
        call_id: Option<&str>,
    ) -> u32 {
        let calls_tokens = calls.into_iter().fold(0u32, |sum, call| {
            sum.saturating_add(self.counter.count_tool_call(&call))
                .saturating_add(u32::from(self.config.tool_call_overhead))
        });
        content
            .saturating_add(calls_tokens)
            .saturating_add(call_id.map_or(0, |id| self.counter.count_call_id(id)))
            .saturating_add(u32::from(self.config.message_overhead))
    }

    /// Refuses a message no amount of eviction could make room for.
    fn check_fits(&self, level: Level, tokens: u32, len: usize) -> Result<(), Error> {
        let ring = self.ring(level);
        if len > ring.arena_capacity() {
            return Err(Error::MessageTooLarge {
                needed: len as u32,
                limit: ring.arena_capacity() as u32,
            });
        }
        let budget = self.config.level_budget(level);
        if tokens > budget {
            return Err(Error::MessageTooLarge { needed: tokens, limit: budget });
        }
        if level == Level::Permanent {
            let needed = self.level_tokens(level).saturating_add(tokens);
            if needed > budget {
                return Err(Error::LevelOverBudget { level, needed, budget });
            }
        }
        Ok(())
    }

    /// Writes a record to `level`, where room was made, and returns its new id.
    fn store(
        &mut self,
        level: Level,
        mut header: Header,
        content: &Content<'_>,
        extra: &Extra<'_>,
        trailer: Trailer,
    ) -> Result<u64, Error> {
        let len = content.len() + extra.len() + trailer.len();
        let id = self.state.next_id();
        header.id = self.next_header_id()?;
        header.content_len = content.len() as u32;
        header.flags = (header.flags & !flags::TRAILER) | trailer.flag();
        let stored = self.ring_mut(level).push_back(header, len, |span| {
            let mut out = SpanWriter::new(span);
            content.write(&mut out);
            extra.write(&mut out);
            trailer.write(&mut out);
        });
        if stored.is_none() {
            return Err(Error::LevelFull { level });
        }
        self.state.issue_id();
        self.state.now = self.state.now.max(header.timestamp);
        header.start = 0;
        header.len = len as u32;
        self.add_live(level, &header);
        let counters = &mut self.state.counters;
        bump(&mut counters.messages_pushed, 1);
        bump(&mut counters.tokens_ingested, u64::from(trailer.original.unwrap_or(header.tokens)));
        Ok(id)
    }

    /// The next id as a header offset. When it does not fit in 32 bits, every stored header
    /// is rebased to the epoch at or below the oldest stored id first (O(capacity), once per
    /// 2^31 ids at most while old messages leave); [`Error::IdSpan`] when even that offset
    /// does not fit (a message 2^31 to 2^32 ids older than the next is still stored).
    pub(super) fn next_header_id(&mut self) -> Result<u32, Error> {
        let next = self.state.next_id();
        let base = id_base(self.state.id_epoch);
        if let Ok(offset) = u32::try_from(next.saturating_sub(base)) {
            return Ok(offset);
        }
        let oldest = Level::ALL
            .into_iter()
            .filter_map(|level| {
                let ring = self.ring(level);
                ring.first().map(|h| ring.id(h))
            })
            .min()
            .unwrap_or(next);
        let epoch = epoch_below(oldest);
        let Ok(offset) = u32::try_from(next.saturating_sub(id_base(epoch))) else {
            return Err(Error::IdSpan { oldest });
        };
        let shift = u32::try_from(id_base(epoch).saturating_sub(base)).unwrap_or(u32::MAX);
        for level in Level::ALL {
            let mut ring = self.ring_mut(level);
            for index in 0..ring.as_ref().len() {
                if let Some(header) = ring.get_mut(index) {
                    header.id = header.id.saturating_sub(shift);
                }
            }
        }
        self.state.id_epoch = epoch;
        Ok(offset)
    }

    /// Gives every unanswered call of the pending unit a synthetic "aborted" result, or drops
    /// the calls, so the history stays valid for providers.
    /// Room for this was made by [`make_room_closing`](Self::make_room_closing).
    fn close_pending(&mut self) {
        let Some(pending) = self.state.pending() else { return };
        let Some(head) = self.pending_head(pending.level) else {
            self.state.set_pending(None);
            return;
        };
        match self.drops_calls() {
            true => self.drop_unanswered(pending, head),
            false => self.synthesize_aborted(pending, head),
        }
    }

    /// Whether unanswered calls are dropped rather than answered with synthetic results: a
    /// build without the `drop-calls` feature refuses that setting, and links no dropping.
    fn drops_calls(&self) -> bool {
        cfg!(feature = "drop-calls") && self.config.unanswered_calls == UnansweredCalls::DropCalls
    }

    #[inline(never)]
    fn synthesize_aborted(&mut self, pending: Pending, head: usize) {
        for index in 0..usize::from(pending.calls) {
            if pending.answered & bit(index) != 0 {
                continue;
            }
            // The call id is copied inside the arena after the result is stored: no copy of
            // it (up to 128 bytes) on the stack of the push path.
            let (id_at, id_len, tokens) = {
                let ring = self.ring(pending.level);
                let Some((h, span)) = ring.get(head).and_then(|h| {
                    Some((h, record::ToolCalls::new(h, ring.record(h)).id_span(index)?))
                }) else {
                    continue;
                };
                let len = span.len().min(MAX_TOOL_CALL_ID_LEN);
                let id = ring.record(h).get(span.start..span.start + len).unwrap_or_default();
                let call_id = core::str::from_utf8(id).unwrap_or_default();
                let aborted = self.counter.count(ABORTED_RESULT);
                (span.start, len, self.framed_tokens(aborted, [], Some(call_id)))
            };
            let header =
                Header { role: Role::Tool, flags: flags::SYNTHETIC, tokens, ..Header::EMPTY };
            let content = Content::Plain(ABORTED_RESULT);
            let stored = self
                .store(pending.level, header, &content, &Extra::Blank(id_len), Trailer::NONE)
                .is_ok();
            if stored {
                let mut ring = self.ring_mut(pending.level);
                let result = ring.as_ref().len().saturating_sub(1);
                // Both spans were just checked by `id_span` and `store`: the copy cannot miss.
                let _ = ring.copy_between((head, id_at), (result, ABORTED_RESULT.len()), id_len);
                self.mark_answered(index);
                let counters = &mut self.state.counters;
                bump(&mut counters.calls_aborted, 1);
            }
        }
    }

    /// Rewrites the pending unit's assistant record without its unanswered calls.
    #[inline(never)]
    fn drop_unanswered(&mut self, pending: Pending, head: usize) {
        let level = pending.level;
        let Some(header) = self.ring(level).get(head).copied() else { return };
        let count = usize::from(pending.calls).min(MAX_TOOL_CALLS);
        let before = {
            let ring = self.ring(level);
            Trailer::of(&header, ring.record(&header))
        };
        let trailer =
            Trailer { original: Some(before.original.unwrap_or(header.tokens)), ..before };
        let mut ring = self.ring_mut(level);
        let Some(span) = ring.record_mut(head) else { return };
        let body_len = span.len().saturating_sub(before.len());
        let body = span.get_mut(..body_len).unwrap_or_default();
        let new_len =
            record::retain_calls(body, header.content_len as usize, count, pending.answered);
        // Dropping a call frees at least its table entry, more than the trailer can grow.
        let end = new_len.saturating_add(trailer.len()).min(span.len());
        trailer.write(&mut SpanWriter::new(span.get_mut(new_len..end).unwrap_or_default()));
        let _ = ring.truncate_record(head, end as u32);
        let kept = pending.answered.count_ones() as u8;
        if let Some(stored) = ring.get_mut(head) {
            stored.items = kept;
            stored.flags |= flags::REDUCED | trailer.flag();
        }
        let tokens = {
            let ring = self.ring(level);
            ring.get(head).map_or(0, |h| self.record_tokens(h, ring.record(h)))
        };
        let mut updated = header;
        if let Some(stored) = self.ring_mut(level).get_mut(head) {
            stored.tokens = tokens;
            updated = *stored;
        }
        self.remove_live(level, &header);
        self.add_live(level, &updated);
        self.state.set_pending(None);
        let counters = &mut self.state.counters;
        bump(&mut counters.calls_dropped, u64::from(pending.unanswered()));
        if kept == 0 && header.content_len == 0 {
            // Nothing answered, so the assistant message is still the newest of its level.
            if let Some(removed) = self.ring_mut(level).pop_back() {
                self.remove_live(level, &removed);
            }
        }
    }

    /// Recounts a stored record's tokens the way [`framed_tokens`](Self::framed_tokens) counted it.
    pub(crate) fn record_tokens(&self, header: &Header, record: &[u8]) -> u32 {
        let content = self.counter.count(record::content(header, record));
        let call_id = (header.role == Role::Tool).then(|| record::tail_text(header, record));
        self.framed_tokens(content, record::ToolCalls::new(header, record), call_id)
    }
}

#[cfg(test)]
mod tests {
    use crate::capacity::TinyCapacities;
    use crate::config::{Config, StrategyKind};
    use crate::error::{Error, InvalidMessage};
    use crate::manager::{ContextManager, MAX_SUMMARY_RANGES};
    use crate::message::Message;
    use crate::record::ToolCall;

    #[test]
    fn ids_past_32_bits_stay_exact_through_a_rebase_and_a_snapshot() {
        let mut manager = ContextManager::<TinyCapacities>::new();
        manager.state.issued = u64::from(u32::MAX) - 2;
        let mut ids = Vec::new();
        for text in ["a", "b", "c", "d"] {
            ids.push(manager.push(Message::user(text)).unwrap());
        }
        let first = u64::from(u32::MAX) - 1;
        assert_eq!(ids, [first, first + 1, first + 2, first + 3]);
        assert_eq!(manager.state.id_epoch, 1, "rebased to the epoch below the oldest id");
        let listed: Vec<u64> = manager.history().map(|m| m.id()).collect();
        assert_eq!(listed, ids);
        assert_eq!(manager.get(first + 2).map(|m| m.content()), Some("c"));
        let mut buf = vec![0u8; manager.snapshot_len()];
        let bytes = manager.snapshot_into(&mut buf).unwrap();
        let mut restored = ContextManager::<TinyCapacities>::new();
        restored.restore_from(bytes).unwrap();
        let listed: Vec<u64> = restored.history().map(|m| m.id()).collect();
        assert_eq!(listed, ids);
        assert_eq!(restored.push(Message::user("e")), Ok(first + 4));
    }

    #[test]
    fn a_message_2_to_the_32_ids_old_is_a_typed_error_not_a_wrap() {
        let mut manager = ContextManager::<TinyCapacities>::new();
        manager.push(Message::system("rules")).unwrap();
        manager.state.issued = 1 << 32;
        assert_eq!(manager.push(Message::user("late")), Err(Error::IdSpan { oldest: 1 }));
        assert_eq!(manager.history().count(), 0);
        assert_eq!(
            manager.messages(crate::level::Level::Permanent).map(|m| m.id()).next(),
            Some(1)
        );
    }

    #[cfg(feature = "drop-calls")]
    #[test]
    fn dropping_calls_keeps_the_trailer_and_records_the_count_before() {
        let config = Config {
            strategy: StrategyKind::Importance,
            unanswered_calls: crate::config::UnansweredCalls::DropCalls,
            ..Config::DEFAULT
        };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        manager.push(Message::user("read src/lib.rs and src/main.rs")).unwrap();
        let calls = [
            ToolCall::new("c1", "read", r#"{"path":"src/lib.rs"}"#),
            ToolCall::new("c2", "read", r#"{"path":"src/main.rs"}"#),
        ];
        let head = manager.push(Message::assistant("two reads").with_tool_calls(&calls)).unwrap();
        let (terms, before) = {
            let stored = manager.get(head).unwrap();
            (stored.terms(), stored.tokens())
        };
        assert_ne!(terms, [0; 4]);
        manager.push(Message::tool_result("c2", "fn main() {}")).unwrap();
        manager.push(Message::user("never mind")).unwrap();
        let stored = manager.get(head).unwrap();
        let kept: Vec<&str> = stored.tool_calls().map(|c| c.id).collect();
        assert_eq!(kept, ["c2"]);
        assert_eq!(stored.content(), "two reads");
        assert!(stored.was_reduced() && stored.tokens() < before);
        assert_eq!((stored.original_tokens(), stored.terms()), (before, terms));
        let mut buf = vec![0u8; manager.snapshot_len()];
        let bytes = manager.snapshot_into(&mut buf).unwrap().to_vec();
        let mut restored = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        restored.restore_from(&bytes).unwrap();
        let again = restored.get(head).unwrap();
        assert_eq!((again.original_tokens(), again.terms()), (before, terms));
        assert_eq!(again.tool_calls().map(|c| c.id).collect::<Vec<_>>(), ["c2"]);
    }

    #[test]
    fn terms_and_original_counts_live_in_the_trailer_and_survive_a_snapshot() {
        let config = Config { strategy: StrategyKind::Importance, ..Config::DEFAULT };
        let mut manager = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        manager.push(Message::user("check src/main.rs line 42")).unwrap();
        let calls = [ToolCall::new("c1", "read", r#"{"path":"src/main.rs"}"#)];
        manager.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
        let huge: String = (0..2000).map(|i| format!("src/main.rs:{i}: ok\n")).collect();
        let id = manager.push(Message::tool_result("c1", &huge)).unwrap();
        let result = manager.get(id).unwrap();
        assert!(result.was_reduced() && result.original_tokens() > 4 * result.tokens());
        assert_eq!(result.tool_call_id(), Some("c1"));
        let terms: Vec<[u16; 4]> = manager.history().map(|m| m.terms()).collect();
        assert!(terms.iter().all(|t| t.iter().any(|&h| h != 0)), "{terms:?}");
        let mut buf = vec![0u8; manager.snapshot_len()];
        let bytes = manager.snapshot_into(&mut buf).unwrap().to_vec();
        let mut restored = ContextManager::<TinyCapacities>::with_config(config).unwrap();
        restored.restore_from(&bytes).unwrap();
        let again: Vec<[u16; 4]> = restored.history().map(|m| m.terms()).collect();
        assert_eq!(again, terms);
        let result = restored.get(id).unwrap();
        assert_eq!(result.original_tokens(), manager.get(id).unwrap().original_tokens());
        assert_eq!(result.tool_call_id(), Some("c1"));
        let mut second = vec![0u8; restored.snapshot_len()];
        assert_eq!(restored.snapshot_into(&mut second).unwrap(), &bytes[..]);
    }

    #[test]
    fn too_many_summary_ranges_has_its_own_error() {
        let mut manager = ContextManager::<TinyCapacities>::new();
        let ranges = [(1u64, 1u64); MAX_SUMMARY_RANGES + 1];
        assert_eq!(
            manager.add_summary("gist", &ranges, 0),
            Err(Error::InvalidMessage(InvalidMessage::TooManySummaryRanges))
        );
        assert!(manager.add_summary("gist", &ranges[..MAX_SUMMARY_RANGES], 0).is_ok());
    }
}
