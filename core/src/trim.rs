//! Stateless trim: what a manager would keep of a whole conversation, found by walking from
//! the newest message backwards until the budget is full, so its cost is O(kept), not
//! O(history).
//!
//! ## Semantics
//!
//! [`trim`] keeps what a sliding-window [`ContextManager`](crate::manager::ContextManager)
//! holds after every message was pushed, when its level budgets do not bind (levels are
//! quotas: the history may use everything the pinned messages leave) and it evicts just
//! enough to fit:
//!
//! - **pinned**: the leading messages whose level is [`Level::Permanent`] (system prompts)
//!   and the tool definitions always stay; `pinned + request_overhead` over the budget is
//!   [`Error::PinnedOverBudget`];
//! - **history**: whole units (a message and the tool results that follow it), newest first,
//!   while they fit `budget - pinned - request_overhead`; the first unit that does not fit
//!   ends the walk, so the kept history is a contiguous suffix (the longest that fits);
//! - **locks**: the newest [`Config::locked_tail`] history messages stay as far as the budget
//!   holds them (whatever [`Config::max_messages`] says); the newest unit (with a locked tail
//!   at all) and, with [`Config::lock_newest_user`], the newest user message always stay (a
//!   lone newest user message before the suffix is kept with it): those over the budget are
//!   [`Error::PinnedOverBudget`];
//! - **units**: same rules as [`push`](crate::manager::ContextManager::push): a result
//!   answers a waiting call of its unit ([`Error::OrphanToolResult`],
//!   [`Error::DuplicateToolResult`]), calls a later message leaves unanswered get a synthetic
//!   [`ABORTED_RESULT`] or are dropped ([`Config::unanswered_calls`]), a conversation ending
//!   with unanswered calls is [`Error::ToolCallsPending`]; a result over
//!   [`Config::observation_limit`] (or over what its unit leaves of the history budget, less
//!   room for the unit's results still to come) is reduced to head and tail lines;
//!   [`Config::max_messages`] bounds the kept history.
//!
//! Only the messages walked are read, validated and counted: an error in a message older
//! than the kept suffix is not seen (a manager would have refused it at push).
//!
//! Not supported (the manager handles these; [`TrimError::Unsupported`]): a strategy other
//! than the sliding window (summaries, entities), a system message after the first history
//! message, messages placed in the session or volatile level, and results with a supersede
//! key (whether a compaction cut one depends on when each came). The walk refuses a late
//! system message or a supersede key it meets; [`trim`] over a slice also checks the roles of
//! the messages it does not walk (a comparison per message, no counting).
//!
//! ## Output
//!
//! [`Trimmed`] is O(1) memory: the pinned prefix `0..pinned`, an optional lone newest user
//! message, and the kept suffix `start..len`. Reduced results and synthetic results are made
//! again, lazily, when [`items`](Trimmed::items) walks the kept messages (a few counter calls
//! per reduced result).

use core::ops::Range;

use crate::config::{Config, StrategyKind, UnansweredCalls};
use crate::counter::TokenCounter;
use crate::error::{Error, InvalidMessage, Pinned};
use crate::json;
use crate::level::Level;
use crate::manager::{ABORTED_RESULT, validate};
use crate::message::{MAX_TOOL_CALLS, Message};
use crate::record::{ToolCall, bit};
use crate::reduce::{self, MIN_REDUCED_TOKENS, Reduction};
use crate::role::Role;

/// A conversation [`trim`] can walk from either end: messages by index, oldest first.
///
/// Implemented for slices of [`Message`]; a caller that parses lazily (a JSONL file read
/// from its end) implements it over its own storage.
pub trait Conversation {
    /// Number of messages.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Message `index` (`None` past the end).
    fn message(&self, index: usize) -> Option<Message<'_>>;
}

impl<'a> Conversation for [Message<'a>] {
    fn len(&self) -> usize {
        <[Message<'a>]>::len(self)
    }

    fn message(&self, index: usize) -> Option<Message<'_>> {
        self.get(index).copied()
    }
}

/// Why [`trim`] cannot answer for a manager (use a manager for these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Unsupported {
    /// The configuration names a strategy other than the sliding window.
    Strategy(StrategyKind),
    /// A system (permanent-level) message after the first history message, at this index.
    LateSystemMessage(usize),
    /// A message placed in the session or volatile level, at this index.
    Level(usize),
    /// A [`Config::compaction_limit`]: what a compaction cuts depends on when each came.
    CompactionLimit,
    /// A result with a [`supersede_key`](crate::message::Message::supersede_key), at this
    /// index: whether a compaction cut it depends on when each came.
    SupersedeKey(usize),
}

/// Why [`trim`] gave no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TrimError {
    /// What a manager would refuse too (at push or compose), at message `index` when one is
    /// to blame.
    Refused {
        /// The manager's error.
        error: Error,
        /// The message it is about, if any.
        index: Option<usize>,
    },
    /// What only a manager handles.
    Unsupported(Unsupported),
}

impl From<Error> for TrimError {
    fn from(error: Error) -> Self {
        TrimError::Refused { error, index: None }
    }
}

impl core::fmt::Display for TrimError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TrimError::Refused { error, index: Some(index) } => {
                write!(f, "message {index}: {error}")
            }
            TrimError::Refused { error, index: None } => write!(f, "{error}"),
            TrimError::Unsupported(Unsupported::Strategy(kind)) => {
                write!(f, "trim runs the sliding window only, not {kind}")
            }
            TrimError::Unsupported(Unsupported::LateSystemMessage(index)) => {
                write!(f, "message {index}: a system message after the history started")
            }
            TrimError::Unsupported(Unsupported::Level(index)) => {
                write!(f, "message {index}: placed in the session or volatile level")
            }
            TrimError::Unsupported(Unsupported::CompactionLimit) => {
                f.write_str("trim does not cut results at compactions (compaction_limit is set)")
            }
            TrimError::Unsupported(Unsupported::SupersedeKey(index)) => {
                write!(f, "message {index}: trim does not cut superseded results (a supersede key)")
            }
        }
    }
}

impl core::error::Error for TrimError {}

fn refused(error: impl Into<Error>, index: usize) -> TrimError {
    TrimError::Refused { error: error.into(), index: Some(index) }
}

/// The counting rules of a manager, shared by the walk and the lazy items.
struct Rules<'c, K> {
    config: &'c Config,
    counter: &'c K,
}

impl<K: TokenCounter> Rules<'_, K> {
    /// Same as the manager's `framed_tokens`.
    fn framed<'t>(
        &self,
        content: u32,
        calls: impl IntoIterator<Item = &'t ToolCall<'t>>,
        call_id: Option<&str>,
    ) -> u32 {
        let calls_tokens = calls.into_iter().fold(0u32, |sum, call| {
            sum.saturating_add(self.counter.count_tool_call(call))
                .saturating_add(u32::from(self.config.tool_call_overhead))
        });
        content
            .saturating_add(calls_tokens)
            .saturating_add(call_id.map_or(0, |id| self.counter.count_call_id(id)))
            .saturating_add(u32::from(self.config.message_overhead))
    }
}

/// A history unit as a manager would hold it once closed.
#[derive(Clone, Copy, Debug)]
struct Unit {
    head: usize,
    end: usize,
    tokens: u32,
    /// Messages it holds (synthetic results included, a dropped head excluded).
    messages: u32,
    /// Calls of the head and which got a result.
    calls: u8,
    answered: u64,
}

/// What one tool result becomes: its content as stored and its tokens.
enum Stored<'a> {
    Plain(&'a str),
    Reduced(Reduction<'a>),
}

/// The kept part of a conversation (see the [module docs](self)).
#[derive(Debug)]
pub struct Trimmed<'s, S: ?Sized, K> {
    source: &'s S,
    config: &'s Config,
    counter: &'s K,
    tools: &'s [&'s str],
    pinned: usize,
    user: Option<usize>,
    start: usize,
    tokens: u32,
    messages: usize,
}

impl<S: ?Sized, K> Clone for Trimmed<'_, S, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: ?Sized, K> Copy for Trimmed<'_, S, K> {}

/// Content of a kept message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrimmedContent<'a> {
    /// As given.
    Plain(&'a str),
    /// A tool result reduced to its first lines, a `[Data Truncated]` marker and its last
    /// lines.
    Reduced(ReducedText<'a>),
}

impl TrimmedContent<'_> {
    /// The pieces in order (one for plain text).
    pub fn parts(&self) -> [&str; 3] {
        match self {
            TrimmedContent::Plain(text) => [text, "", ""],
            TrimmedContent::Reduced(reduced) => reduced.0.parts(),
        }
    }
}

impl core::fmt::Display for TrimmedContent<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.parts().iter().try_for_each(|part| f.write_str(part))
    }
}

/// A reduced tool output (head, marker, tail), made without allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReducedText<'a>(Reduction<'a>);

/// One message of a [`Trimmed`] payload, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrimmedItem<'a> {
    /// Message `index` of the conversation.
    Message {
        /// Its index.
        index: usize,
        /// Its content as sent.
        content: TrimmedContent<'a>,
        /// Bit `i` set: the message's tool call `i` is sent (all of them unless
        /// [`UnansweredCalls::DropCalls`] removed unanswered ones).
        calls: u64,
    },
    /// The synthetic result of a call a later message left unanswered
    /// ([`ABORTED_RESULT`]).
    Aborted {
        /// The call it answers.
        call_id: &'a str,
    },
}

/// What a sliding-window manager configured with `config` would keep of `conversation`, plus
/// the tool definitions `tools`, counting with `counter` (see the [module docs](self)).
///
/// ```
/// use ctxwin_core::{Config, Message, ToolCall};
/// use ctxwin_core::estimator::Estimator;
/// use ctxwin_core::trim::{trim, TrimmedItem};
///
/// let calls = [ToolCall::new("c1", "run", "{}")];
/// let old = "x ".repeat(1_000); // about 750 tokens: one fits, two do not
/// let conversation = [
///     Message::system("You are terse."),
///     Message::user(&old),
///     Message::assistant(&old),
///     Message::user("Run it."),
///     Message::assistant("").with_tool_calls(&calls),
///     Message::tool_result("c1", "ok"),
/// ];
/// let config = Config { context_window: 1_000, reserved_for_reply: 0, permanent_budget: 0,
///                       session_budget: 0, working_budget: 0, locked_tail: 2,
///                       ..Config::DEFAULT };
/// let counter = Estimator::new();
/// let kept = trim(&conversation[..], &[], &config, &counter)?;
/// assert_eq!(kept.indices().collect::<Vec<_>>(), [0, 2, 3, 4, 5]);
/// assert!(kept.tokens() <= 1_000);
/// assert!(matches!(kept.items().last(), Some(TrimmedItem::Message { index: 5, .. })));
/// # Ok::<(), ctxwin_core::trim::TrimError>(())
/// ```
///
/// # Errors
///
/// [`TrimError::Refused`] for what a manager refuses (a malformed message, an orphan result,
/// pending calls at the end, pinned content (`index: None`) or the live request (`index` of
/// the newest unit's or the newest user message's head) over the budget);
/// [`TrimError::Unsupported`] for what only a manager handles.
pub fn trim<'s, K: TokenCounter>(
    conversation: &'s [Message<'s>],
    tools: &'s [&'s str],
    config: &'s Config,
    counter: &'s K,
) -> Result<Trimmed<'s, [Message<'s>], K>, TrimError> {
    let trimmed = trim_from(conversation, tools, config, counter)?;
    // Roles of what the walk skipped: a late system message there is still pinned for a
    // manager. A comparison per message; nothing is counted.
    let skipped = conversation.get(trimmed.pinned..trimmed.start).unwrap_or_default();
    if let Some(at) =
        skipped.iter().position(|m| m.level.unwrap_or(m.default_level()) != Level::Working)
    {
        let index = trimmed.pinned + at;
        let late = conversation.get(index).map(|m| m.level.unwrap_or(m.default_level()));
        return Err(TrimError::Unsupported(match late {
            Some(Level::Permanent) => Unsupported::LateSystemMessage(index),
            _ => Unsupported::Level(index),
        }));
    }
    Ok(trimmed)
}

/// [`trim`] over any [`Conversation`], reading only the pinned prefix and the messages the
/// walk needs (a late system message older than the kept suffix is not seen).
///
/// # Errors
///
/// As [`trim`].
pub fn trim_from<'s, S: Conversation + ?Sized, K: TokenCounter>(
    source: &'s S,
    tools: &'s [&'s str],
    config: &'s Config,
    counter: &'s K,
) -> Result<Trimmed<'s, S, K>, TrimError> {
    config.validate().map_err(Error::InvalidConfig)?;
    if config.strategy != StrategyKind::SlidingWindow || !config.entity_schema.is_empty() {
        return Err(TrimError::Unsupported(Unsupported::Strategy(config.strategy)));
    }
    if config.compaction_limit != 0 {
        return Err(TrimError::Unsupported(Unsupported::CompactionLimit));
    }
    let rules = Rules { config, counter };
    let len = source.len();
    let budget = config.budget();
    // Pinned: tool definitions and the leading permanent-level messages.
    let mut pinned_tokens = 0u32;
    for tool in tools {
        if !json::is_object(tool) {
            return Err(Error::InvalidToolDefinition.into());
        }
        pinned_tokens = pinned_tokens.saturating_add(rules.framed(counter.count(tool), [], None));
    }
    let mut pinned = 0;
    while let Some(message) = source.message(pinned) {
        let level = message.level.unwrap_or(message.default_level());
        if level != Level::Permanent {
            break;
        }
        validate(&message).map_err(|e| refused(e, pinned))?;
        if !message.tool_calls.is_empty() {
            return Err(refused(InvalidMessage::WrongLevel(level), pinned));
        }
        pinned_tokens =
            pinned_tokens.saturating_add(rules.framed(counter.count(message.content), [], None));
        pinned += 1;
    }
    // A payload pays the request overhead once, with its first token (as a manager's `used`).
    let overhead = u32::from(config.request_overhead);
    let fixed = pinned_tokens.saturating_add(if pinned_tokens > 0 { overhead } else { 0 });
    if fixed > budget {
        let pinned = Pinned { permanent: pinned_tokens, ..Pinned::default() };
        return Err(Error::PinnedOverBudget { needed: fixed, budget, pinned }.into());
    }
    // What one history message or unit may cost: the working level's budget when levels are
    // quotas (everything the pinned messages leave).
    let level_budget = budget.saturating_sub(pinned_tokens);
    // The newest user message, reserved first when locked.
    let user = if config.lock_newest_user {
        (pinned..len).rev().find(|&i| source.message(i).is_some_and(|m| m.role == Role::User))
    } else {
        None
    };
    let mut reserved = 0u32;
    if let Some(index) = user {
        reserved = unit_at(source, &rules, index, pinned, level_budget)?.tokens;
    }
    let history_overhead = if pinned_tokens > 0 { 0 } else { overhead };
    let room = budget.saturating_sub(fixed).saturating_sub(history_overhead);
    let tail = u32::from(config.locked_tail);
    let max = config.max_messages;
    let mut used = 0u32;
    let mut messages = 0u32;
    let mut start = len;
    let mut end = len;
    while end > pinned {
        let head = unit_head(source, end, pinned)?;
        let unit = unit_at(source, &rules, head, pinned, level_budget)?;
        let holds_user = user.is_some_and(|u| (unit.head..unit.end).contains(&u));
        // The live request stays whatever it costs; the rest of the locked tail while it fits.
        let live = holds_user || (end == len && tail > 0);
        let locked = messages < tail;
        let extra = if holds_user { 0 } else { reserved };
        let extra_messages =
            u32::from(extra > 0 || (user.is_some() && !holds_user && reserved > 0));
        let fits_tokens = used.saturating_add(unit.tokens).saturating_add(extra) <= room;
        let fits = fits_tokens && (max == 0 || messages + unit.messages + extra_messages <= max);
        if !(fits || (locked && fits_tokens) || live) {
            break;
        }
        used = used.saturating_add(unit.tokens);
        messages = messages.saturating_add(unit.messages);
        if holds_user {
            reserved = 0;
        }
        if used.saturating_add(extra) > room {
            let needed = fixed.saturating_add(history_overhead).saturating_add(used + extra);
            let pinned = Pinned { permanent: pinned_tokens, live: used + extra, dynamic: 0 };
            return Err(refused(Error::PinnedOverBudget { needed, budget, pinned }, unit.head));
        }
        start = unit.head;
        end = unit.head;
    }
    let lone_user = user.filter(|&u| u < start);
    if let Some(index) = lone_user {
        used = used.saturating_add(reserved);
        messages = messages.saturating_add(1);
        if used > room {
            let needed = fixed.saturating_add(history_overhead).saturating_add(used);
            let pinned = Pinned { permanent: pinned_tokens, live: used, dynamic: 0 };
            return Err(refused(Error::PinnedOverBudget { needed, budget, pinned }, index));
        }
    }
    let tokens = fixed.saturating_add(if used > 0 { history_overhead } else { 0 }) + used;
    Ok(Trimmed {
        source,
        config,
        counter,
        tools,
        pinned,
        user: lone_user,
        start,
        tokens,
        messages: pinned + messages as usize,
    })
}

/// The head of the unit ending (exclusively) at `end`: the nearest non-tool message before.
fn unit_head<S: Conversation + ?Sized>(
    source: &S,
    end: usize,
    pinned: usize,
) -> Result<usize, TrimError> {
    let mut head = end - 1;
    loop {
        let Some(message) = source.message(head) else {
            return Err(refused(Error::OrphanToolResult, head));
        };
        if message.role != Role::Tool {
            return Ok(head);
        }
        if head == pinned {
            return Err(refused(Error::OrphanToolResult, head));
        }
        head -= 1;
    }
}

/// The unit starting at `head`, checked and counted as a manager stores it.
fn unit_at<S: Conversation + ?Sized, K: TokenCounter>(
    source: &S,
    rules: &Rules<'_, K>,
    head: usize,
    pinned: usize,
    level_budget: u32,
) -> Result<Unit, TrimError> {
    let first = source.message(head).ok_or(refused(Error::OrphanToolResult, head))?;
    check_history(&first, head, pinned)?;
    let head_tokens = rules.framed(rules.counter.count(first.content), first.tool_calls, None);
    if head_tokens > level_budget {
        return Err(refused(
            Error::MessageTooLarge { needed: head_tokens, limit: level_budget },
            head,
        ));
    }
    let calls = first.tool_calls.len().min(MAX_TOOL_CALLS) as u8;
    let mut unit =
        Unit { head, end: head + 1, tokens: head_tokens, messages: 1, calls, answered: 0 };
    while let Some(message) = source.message(unit.end) {
        if message.role != Role::Tool {
            break;
        }
        check_history(&message, unit.end, pinned)?;
        let (_, tokens) = result(rules, &first, &message, &mut unit, level_budget)
            .map_err(|e| refused(e, unit.end))?;
        unit.tokens = unit.tokens.saturating_add(tokens);
        unit.messages += 1;
        unit.end += 1;
    }
    let unanswered = calls.saturating_sub(unit.answered.count_ones() as u8);
    if unanswered > 0 {
        if unit.end >= source.len() {
            return Err(Error::ToolCallsPending { unanswered }.into());
        }
        match rules.config.unanswered_calls {
            UnansweredCalls::SynthesizeAborted => {
                for (index, call) in first.tool_calls.iter().enumerate() {
                    if unit.answered & bit(index) == 0 {
                        let aborted = rules.counter.count(ABORTED_RESULT);
                        let tokens = rules.framed(aborted, [], Some(call.id));
                        unit.tokens = unit.tokens.saturating_add(tokens);
                        unit.messages += 1;
                    }
                }
            }
            UnansweredCalls::DropCalls => {
                let kept = first
                    .tool_calls
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| unit.answered & bit(*i) != 0)
                    .map(|(_, c)| c);
                let rewritten = rules.framed(rules.counter.count(first.content), kept, None);
                unit.tokens = unit.tokens - head_tokens + rewritten;
                if unit.answered == 0 && first.content.is_empty() {
                    unit.tokens = 0;
                    unit.messages = 0;
                }
            }
        }
    }
    Ok(unit)
}

/// A walked history message: well formed, in the working level.
fn check_history(message: &Message<'_>, index: usize, pinned: usize) -> Result<(), TrimError> {
    validate(message).map_err(|e| refused(e, index))?;
    #[cfg(feature = "compaction-cut")]
    if message.supersede_key != 0 {
        return Err(TrimError::Unsupported(Unsupported::SupersedeKey(index)));
    }
    match message.level.unwrap_or(message.default_level()) {
        Level::Working => Ok(()),
        Level::Permanent if index >= pinned => {
            Err(TrimError::Unsupported(Unsupported::LateSystemMessage(index)))
        }
        _ => Err(TrimError::Unsupported(Unsupported::Level(index))),
    }
}

/// A tool result of the unit headed by `head`: what it stores and its tokens, marking its
/// call answered (as the manager's `push_tool_result`).
fn result<'m, K: TokenCounter>(
    rules: &Rules<'_, K>,
    head: &Message<'_>,
    message: &Message<'m>,
    unit: &mut Unit,
    level_budget: u32,
) -> Result<(Stored<'m>, u32), Error> {
    let call_id = message.tool_call_id.unwrap_or_default();
    let all_answered = unit.answered.count_ones() as u8 >= unit.calls;
    let index = head
        .tool_calls
        .iter()
        .position(|call| call.id == call_id)
        .filter(|_| !all_answered)
        .ok_or(Error::OrphanToolResult)?;
    if unit.answered & bit(index) != 0 {
        return Err(Error::DuplicateToolResult);
    }
    let framing = rules.framed(0, [], Some(call_id));
    let room = level_budget.saturating_sub(unit.tokens.saturating_add(framing));
    let waiting = u32::from(unit.calls.saturating_sub(unit.answered.count_ones() as u8 + 1));
    let reserve = MIN_REDUCED_TOKENS.saturating_add(framing);
    let observation_limit = if message.whole { u32::MAX } else { rules.config.observation_limit };
    let limit = reduce::result_limit(observation_limit, room, waiting, reserve);
    let raw = rules.counter.count(message.content);
    let (stored, tokens) = if raw <= limit {
        (Stored::Plain(message.content), rules.framed(raw, [], Some(call_id)))
    } else if limit >= MIN_REDUCED_TOKENS {
        let reduction = reduce::reduce(message.content, limit, rules.counter);
        let counted = reduction.parts().iter().map(|p| rules.counter.count(p)).sum::<u32>();
        (Stored::Reduced(reduction), rules.framed(counted, [], Some(call_id)))
    } else {
        return Err(Error::MessageTooLarge { needed: raw, limit });
    };
    if tokens > level_budget {
        return Err(Error::MessageTooLarge { needed: tokens, limit: level_budget });
    }
    unit.answered |= bit(index);
    Ok((stored, tokens))
}

impl<'s, S: Conversation + ?Sized, K: TokenCounter> Trimmed<'s, S, K> {
    /// Tokens of the payload: pinned messages, tool definitions, kept history, the request
    /// overhead; never over the budget.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Messages in the payload (synthetic results included, tool definitions not).
    pub fn message_count(&self) -> usize {
        self.messages
    }

    /// The pinned prefix of the conversation.
    pub fn pinned(&self) -> Range<usize> {
        0..self.pinned
    }

    /// The newest user message, kept alone before the suffix because it is locked.
    pub fn lone_user(&self) -> Option<usize> {
        self.user
    }

    /// The kept suffix of the conversation.
    pub fn suffix(&self) -> Range<usize> {
        self.start..self.source.len()
    }

    /// The tool definitions, as given.
    pub fn tools(&self) -> &'s [&'s str] {
        self.tools
    }

    /// Indices of the kept conversation messages, oldest first (a head whose calls were all
    /// dropped is still listed; [`items`](Self::items) leaves it out).
    pub fn indices(&self) -> impl Iterator<Item = usize> + use<'s, S, K> {
        (0..self.pinned).chain(self.user).chain(self.start..self.source.len())
    }

    /// The payload's messages, oldest first, with reduced and synthetic results made again.
    pub fn items(&self) -> Items<'s, S, K> {
        Items {
            trimmed: *self,
            pinned: 0,
            user: true,
            next: self.start,
            unit: None,
            aborted: 0,
            level_budget: self.config.budget().saturating_sub(self.pinned_tokens()),
        }
    }

    fn pinned_tokens(&self) -> u32 {
        let rules = Rules { config: self.config, counter: self.counter };
        let tools = self.tools.iter().map(|t| rules.framed(self.counter.count(t), [], None));
        let messages = (0..self.pinned)
            .filter_map(|i| self.source.message(i))
            .map(|m| rules.framed(self.counter.count(m.content), [], None));
        tools.chain(messages).fold(0u32, u32::saturating_add)
    }
}

/// Iterator of [`Trimmed::items`].
#[derive(Clone, Copy, Debug)]
pub struct Items<'s, S: ?Sized, K> {
    trimmed: Trimmed<'s, S, K>,
    /// Next pinned message.
    pinned: usize,
    /// The lone user message is still to come.
    user: bool,
    /// Next suffix message.
    next: usize,
    /// The unit being walked in the suffix.
    unit: Option<Unit>,
    /// Next call index to check for a synthetic result, once the unit's results are out.
    aborted: usize,
    level_budget: u32,
}

/// Bits of the first `calls` calls.
fn all_calls(calls: u8) -> u64 {
    if calls >= 64 { u64::MAX } else { (1u64 << calls) - 1 }
}

impl<'s, S: Conversation + ?Sized, K: TokenCounter> Iterator for Items<'s, S, K> {
    type Item = TrimmedItem<'s>;

    fn next(&mut self) -> Option<TrimmedItem<'s>> {
        let t = self.trimmed;
        let rules = Rules { config: t.config, counter: t.counter };
        if self.pinned < t.pinned {
            let index = self.pinned;
            self.pinned += 1;
            return Some(plain(index, t.source.message(index)?.content, u64::MAX));
        }
        if self.user {
            self.user = false;
            if let Some(index) = t.user {
                return Some(plain(index, t.source.message(index)?.content, u64::MAX));
            }
        }
        loop {
            let Some(mut unit) = self.unit else {
                let head = t.source.message(self.next)?;
                let calls = head.tool_calls.len().min(MAX_TOOL_CALLS) as u8;
                let tokens = rules.framed(t.counter.count(head.content), head.tool_calls, None);
                let index = self.next;
                self.unit = Some(Unit {
                    head: index,
                    end: index + 1,
                    tokens,
                    messages: 1,
                    calls,
                    answered: 0,
                });
                self.aborted = 0;
                self.next += 1;
                if calls == 0 {
                    return Some(plain(index, head.content, u64::MAX));
                }
                // Which calls get a result decides what the head sends when calls are dropped.
                let mut answered = 0u64;
                let mut at = index + 1;
                while let Some(m) = t.source.message(at).filter(|m| m.role == Role::Tool) {
                    if let Some(i) =
                        head.tool_calls.iter().position(|c| Some(c.id) == m.tool_call_id)
                    {
                        answered |= bit(i);
                    }
                    at += 1;
                }
                if rules.config.unanswered_calls == UnansweredCalls::DropCalls {
                    if answered == 0 && head.content.is_empty() {
                        continue;
                    }
                    return Some(plain(index, head.content, answered));
                }
                return Some(plain(index, head.content, all_calls(calls)));
            };
            if let Some(message) = t.source.message(unit.end).filter(|m| m.role == Role::Tool) {
                let head = t.source.message(unit.head)?;
                let index = unit.end;
                let (stored, tokens) =
                    result(&rules, &head, &message, &mut unit, self.level_budget).ok()?;
                unit.tokens = unit.tokens.saturating_add(tokens);
                unit.end += 1;
                self.next = unit.end;
                self.unit = Some(unit);
                let content = match stored {
                    Stored::Plain(text) => TrimmedContent::Plain(text),
                    Stored::Reduced(reduction) => TrimmedContent::Reduced(ReducedText(reduction)),
                };
                return Some(TrimmedItem::Message { index, content, calls: u64::MAX });
            }
            // The unit's results are out: synthetic results for its unanswered calls.
            if rules.config.unanswered_calls == UnansweredCalls::SynthesizeAborted {
                let head = t.source.message(unit.head)?;
                while self.aborted < usize::from(unit.calls) {
                    let index = self.aborted;
                    self.aborted += 1;
                    if unit.answered & bit(index) == 0 {
                        let call = head.tool_calls.get(index)?;
                        return Some(TrimmedItem::Aborted { call_id: call.id });
                    }
                }
            }
            self.unit = None;
            self.next = unit.end;
        }
    }
}

fn plain(index: usize, content: &str, calls: u64) -> TrimmedItem<'_> {
    TrimmedItem::Message { index, content: TrimmedContent::Plain(content), calls }
}
