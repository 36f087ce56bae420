//! The one error type of manager operations.

use crate::config::ConfigError;
use crate::level::Level;

/// Why a message was refused or a payload could not be composed. Nothing is lost on error:
/// a refused message is not stored (the caller still holds it), and evicted units wait in the
/// outbox.
///
/// ```
/// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let orphan = manager.push(Message::tool_result("call_9", "42"));
/// assert_eq!(orphan, Err(Error::OrphanToolResult));
/// assert_eq!(Error::OrphanToolResult.to_string(), "tool result answers no pending tool call");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// A tool result whose call is not waiting in the window.
    OrphanToolResult,
    /// A second result for a call that already has one.
    DuplicateToolResult,
    /// The message is malformed (see the reason).
    InvalidMessage(InvalidMessage),
    /// A tool definition that is not a JSON object.
    InvalidToolDefinition,
    /// One message costs more than its level can ever hold.
    MessageTooLarge {
        /// Tokens (or bytes, for arena limits) the message needs.
        needed: u32,
        /// What the level allows for one message.
        limit: u32,
    },
    /// A level that is never evicted (permanent) or cannot evict enough would exceed its budget.
    LevelOverBudget {
        /// The level.
        level: Level,
        /// Tokens the level would hold.
        needed: u32,
        /// Its budget.
        budget: u32,
    },
    /// The level has no room even after evicting every unit it may evict.
    LevelFull {
        /// The level.
        level: Level,
    },
    /// The level needs the space of evicted units the caller has not drained yet.
    OutboxFull {
        /// The level.
        level: Level,
    },
    /// What no eviction can make smaller (the permanent level, the live request, dynamic
    /// context) alone exceeds the budget; no payload is produced rather than one over the
    /// window. Older turns, summaries and the older units of the locked tail are not pinned:
    /// they leave, or shrink, first.
    PinnedOverBudget {
        /// Tokens the pinned content needs (framing included: `pinned` and the entity block
        /// and request overhead).
        needed: u32,
        /// The total budget.
        budget: u32,
        /// What those tokens are.
        pinned: Pinned,
    },
    /// Tool calls are still waiting for results; a payload now would be rejected by providers.
    ToolCallsPending {
        /// How many calls have no result yet.
        unanswered: u8,
    },
    /// The configuration is inconsistent.
    InvalidConfig(ConfigError),
    /// Writing the payload failed.
    Io(embedded_io::ErrorKind),
    /// A stored message is too many ids older than the next one: headers keep ids as 32-bit
    /// offsets from a base at most 2^31 below the oldest stored id, so a span of 2^31 ids
    /// always fits and one of 2^32 never does. Unreachable below 2,147,483,648 pushes; once
    /// the oldest messages (e.g. a system prompt) leave, pushes succeed again.
    IdSpan {
        /// Id of the oldest stored message.
        oldest: u64,
    },
    /// [`finish_task`](crate::manager::ContextManager::finish_task) without a task running.
    #[cfg(feature = "tasks")]
    NoOpenTask,
    /// [`push_opening_task`](crate::manager::ContextManager::push_opening_task) with a tool
    /// result: it belongs to its call's unit, which a task boundary cannot split.
    #[cfg(feature = "tasks")]
    TaskInsideUnit,
}

/// What a payload cannot leave out, in tokens, when it alone is over the budget
/// ([`Error::PinnedOverBudget`]); the rest of `needed` is framing (the entity block and the
/// request overhead). Older turns, summaries and the locked tail's older units are never
/// pinned.
///
/// ```
/// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::system("You are terse."))?;
/// manager.push(Message::user("What changed?"))?;
/// let huge = "word ".repeat(40_000);
/// let too_much = [huge.as_str()];
/// match manager.compose(&too_much) {
///     Err(Error::PinnedOverBudget { needed, budget, pinned }) => {
///         assert!(pinned.dynamic > budget && pinned.permanent > 0 && pinned.live > 0);
///         assert!(needed >= pinned.total());
///         assert_eq!(pinned.largest(), ctxwin_core::error::PinnedPart::Dynamic);
///     }
///     other => unreachable!("a dynamic context over the window cannot fit: {other:?}"),
/// }
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pinned {
    /// The permanent level: system prompt, rules, tool definitions.
    pub permanent: u32,
    /// The live request: the newest user message and the newest unit (the calls and results
    /// the model answers next), each with its unit, and a unit still waiting for results.
    pub live: u32,
    /// The dynamic context passed to `compose` (the tokens asked of `make_space`).
    pub dynamic: u32,
}

/// One part of [`Pinned`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PinnedPart {
    /// [`Pinned::permanent`].
    Permanent,
    /// [`Pinned::live`].
    Live,
    /// [`Pinned::dynamic`].
    Dynamic,
}

impl Pinned {
    /// The sum of the three parts.
    pub const fn total(&self) -> u32 {
        self.permanent.saturating_add(self.live).saturating_add(self.dynamic)
    }

    /// The largest part (ties: dynamic, then the live request, then permanent: what a caller
    /// changes most easily first).
    pub const fn largest(&self) -> PinnedPart {
        if self.dynamic >= self.live && self.dynamic >= self.permanent {
            PinnedPart::Dynamic
        } else if self.live >= self.permanent {
            PinnedPart::Live
        } else {
            PinnedPart::Permanent
        }
    }
}

/// What is wrong with a message.
///
/// ```
/// use ctxwin_core::{ContextManager, Error, InvalidMessage, Message, TinyCapacities, ToolCall};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let calls = [ToolCall::new("c1", "ls", "{}")];
/// let result = manager.push(Message::user("x").with_tool_calls(&calls));
/// assert_eq!(result, Err(Error::InvalidMessage(InvalidMessage::ToolCallsOnNonAssistant)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidMessage {
    /// Only assistant messages may carry tool calls.
    ToolCallsOnNonAssistant,
    /// A tool result without `tool_call_id`.
    MissingToolCallId,
    /// A `tool_call_id` on a message that is not a tool result.
    UnexpectedToolCallId,
    /// A tool call or tool result with an empty id.
    EmptyToolCallId,
    /// Two calls in one message share an id.
    DuplicateToolCallId,
    /// More than [`MAX_TOOL_CALLS`](crate::message::MAX_TOOL_CALLS) calls.
    TooManyToolCalls,
    /// A tool call id or tool result id over 128 bytes, a tool name over 65,535 bytes, or
    /// arguments over `u32::MAX` bytes.
    FieldTooLong,
    /// A summary standing for more than
    /// [`MAX_SUMMARY_RANGES`](crate::manager::MAX_SUMMARY_RANGES) source id ranges.
    TooManySummaryRanges,
    /// The level does not take this kind of message (tool calls or results outside the
    /// history levels).
    WrongLevel(Level),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::OrphanToolResult => f.write_str("tool result answers no pending tool call"),
            Error::DuplicateToolResult => f.write_str("tool call already has a result"),
            Error::InvalidMessage(why) => write!(f, "invalid message: {why}"),
            Error::InvalidToolDefinition => f.write_str("tool definition is not a JSON object"),
            Error::MessageTooLarge { needed, limit } => {
                write!(f, "message needs {needed}, more than the {limit} one message may take")
            }
            Error::LevelOverBudget { level, needed, budget } => {
                write!(f, "{level} level would hold {needed} tokens, over its budget of {budget}")
            }
            Error::LevelFull { level } => write!(f, "{level} level is full of locked messages"),
            Error::OutboxFull { level } => {
                write!(f, "{level} level needs the space of evicted units: drain the outbox")
            }
            Error::PinnedOverBudget { needed, budget, pinned } => write!(
                f,
                "pinned content needs {needed} tokens, {} over the budget of {budget}: permanent {}, live request {}, dynamic context {}",
                needed.saturating_sub(*budget),
                pinned.permanent,
                pinned.live,
                pinned.dynamic
            ),
            Error::ToolCallsPending { unanswered } => {
                write!(f, "{unanswered} tool call(s) still wait for results")
            }
            Error::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
            Error::Io(kind) => write!(f, "write failed: {kind:?}"),
            Error::IdSpan { oldest } => {
                write!(f, "message {oldest} is too many ids (2^31 or more) older than the next one")
            }
            #[cfg(feature = "tasks")]
            Error::NoOpenTask => f.write_str("no task is running"),
            #[cfg(feature = "tasks")]
            Error::TaskInsideUnit => f.write_str("a tool result cannot begin a task"),
        }
    }
}

impl core::fmt::Display for InvalidMessage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InvalidMessage::ToolCallsOnNonAssistant => {
                f.write_str("only assistant messages carry tool calls")
            }
            InvalidMessage::MissingToolCallId => f.write_str("tool result without tool_call_id"),
            InvalidMessage::UnexpectedToolCallId => {
                f.write_str("tool_call_id on a non-tool message")
            }
            InvalidMessage::EmptyToolCallId => f.write_str("empty tool call id"),
            InvalidMessage::DuplicateToolCallId => f.write_str("two tool calls share an id"),
            InvalidMessage::TooManyToolCalls => f.write_str("more than 64 tool calls"),
            InvalidMessage::FieldTooLong => {
                f.write_str("tool call id over 128 bytes, name over 65535 or arguments over 4 GiB")
            }
            InvalidMessage::TooManySummaryRanges => {
                f.write_str("more than 16 summary source ranges")
            }
            InvalidMessage::WrongLevel(level) => write!(f, "the {level} level does not take it"),
        }
    }
}

impl core::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(error: ConfigError) -> Self {
        Error::InvalidConfig(error)
    }
}

impl From<InvalidMessage> for Error {
    fn from(error: InvalidMessage) -> Self {
        Error::InvalidMessage(error)
    }
}
