//! Messages going in ([`Message`], borrowed from the caller) and coming out ([`MessageRef`],
//! borrowed from the manager).

use crate::header::{Header, flags};
use crate::level::Level;
use crate::record;
pub use crate::record::ToolCall;
use crate::role::Role;

/// Most tool calls one assistant message may carry.
pub const MAX_TOOL_CALLS: usize = 64;

/// A message to store, borrowed from the caller; the manager copies what it keeps.
///
/// Build one with the role constructors and refine it with the `with_*`/`at` methods:
///
/// ```
/// use ctxwin_core::{Level, Message, Role, ToolCall};
/// let calls = [ToolCall::new("c1", "ls", "{}")];
/// let ask = Message::user("list the files").at(1_000);
/// let act = Message::assistant("").with_tool_calls(&calls).at(1_500);
/// let done = Message::tool_result("c1", "Cargo.toml\nsrc/").in_level(Level::Volatile);
/// assert_eq!(ask.role, Role::User);
/// assert_eq!(act.tool_calls.len(), 1);
/// assert_eq!(done.tool_call_id, Some("c1"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Message<'a> {
    /// Author.
    pub role: Role,
    /// Text content (the tool output for [`Role::Tool`]).
    pub content: &'a str,
    /// Calls requested by an assistant message (empty otherwise).
    pub tool_calls: &'a [ToolCall<'a>],
    /// For [`Role::Tool`]: the id of the call this result answers.
    pub tool_call_id: Option<&'a str>,
    /// Caller's clock when the message was created (milliseconds by convention).
    pub timestamp: u64,
    /// Marked important by the caller (kept longer by the importance strategy).
    pub important: bool,
    /// Where to store it; `None` picks the role's default ([`Message::default_level`]).
    pub level: Option<Level>,
    /// For [`Role::Tool`]: kept whole, not reduced to
    /// [`Config::observation_limit`](crate::config::Config::observation_limit) (a caller's
    /// per-tool policy, such as file reads the model quotes back); reduced only when it alone
    /// is more than its unit may hold.
    pub whole: bool,
    /// For [`Role::Tool`]: what the result shows, as a caller's key (say a hash of a file
    /// read's path); 0 for none. At a compaction an older result is cut to a short note when
    /// a newer live one has the same key: the newer shows the same thing, as it is now; and
    /// the newest of each key stays ahead of older turns. Kept and acted on with the
    /// `compaction-cut` feature (a default) only.
    #[cfg(feature = "compaction-cut")]
    pub supersede_key: u32,
}

impl<'a> Message<'a> {
    /// A message with `role` and `content`, no tool data, timestamp 0.
    ///
    /// ```
    /// let m = ctxwin_core::Message::new(ctxwin_core::Role::User, "hi");
    /// assert_eq!(m.content, "hi");
    /// ```
    pub const fn new(role: Role, content: &'a str) -> Self {
        Self {
            role,
            content,
            tool_calls: &[],
            tool_call_id: None,
            timestamp: 0,
            important: false,
            level: None,
            whole: false,
            #[cfg(feature = "compaction-cut")]
            supersede_key: 0,
        }
    }

    /// A system message (stored in the permanent level unless told otherwise).
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Message::system("be brief").default_level(), ctxwin_core::Level::Permanent);
    /// ```
    pub const fn system(content: &'a str) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Message::user("hi").role, ctxwin_core::Role::User);
    /// ```
    pub const fn user(content: &'a str) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Message::assistant("ok").role, ctxwin_core::Role::Assistant);
    /// ```
    pub const fn assistant(content: &'a str) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// The result of the tool call `call_id`.
    ///
    /// ```
    /// let m = ctxwin_core::Message::tool_result("c1", "42");
    /// assert_eq!(m.tool_call_id, Some("c1"));
    /// ```
    pub const fn tool_result(call_id: &'a str, content: &'a str) -> Self {
        let mut message = Self::new(Role::Tool, content);
        message.tool_call_id = Some(call_id);
        message
    }

    /// The same message carrying `calls`.
    ///
    /// ```
    /// use ctxwin_core::{Message, ToolCall};
    /// let calls = [ToolCall::new("c1", "ls", "{}")];
    /// assert_eq!(Message::assistant("").with_tool_calls(&calls).tool_calls.len(), 1);
    /// ```
    pub const fn with_tool_calls(mut self, calls: &'a [ToolCall<'a>]) -> Self {
        self.tool_calls = calls;
        self
    }

    /// The same message stamped with the caller's clock.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Message::user("hi").at(7).timestamp, 7);
    /// ```
    pub const fn at(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The same message, marked important.
    ///
    /// ```
    /// assert!(ctxwin_core::Message::user("remember this").important().important);
    /// ```
    pub const fn important(mut self) -> Self {
        self.important = true;
        self
    }

    /// The same message, kept whole (see [`Message::whole`]).
    ///
    /// ```
    /// assert!(ctxwin_core::Message::tool_result("c1", "file contents").whole().whole);
    /// ```
    pub const fn whole(mut self) -> Self {
        self.whole = true;
        self
    }

    /// The same message with a [`supersede_key`](Message::supersede_key).
    ///
    /// ```
    /// let read = ctxwin_core::Message::tool_result("c1", "fn main() {}").superseding(0x5eed);
    /// assert_eq!(read.supersede_key, 0x5eed);
    /// ```
    #[cfg(feature = "compaction-cut")]
    pub const fn superseding(mut self, key: u32) -> Self {
        self.supersede_key = key;
        self
    }

    /// The same message, stored in `level`.
    ///
    /// ```
    /// use ctxwin_core::{Level, Message};
    /// assert_eq!(Message::user("x").in_level(Level::Volatile).level, Some(Level::Volatile));
    /// ```
    pub const fn in_level(mut self, level: Level) -> Self {
        self.level = Some(level);
        self
    }

    /// The level used when [`level`](Self::level) is `None`: permanent for system messages,
    /// working for the rest. Tool results always join their call's level.
    ///
    /// ```
    /// use ctxwin_core::{Level, Message};
    /// assert_eq!(Message::user("x").default_level(), Level::Working);
    /// ```
    pub const fn default_level(&self) -> Level {
        match self.role {
            Role::System => Level::Permanent,
            _ => Level::Working,
        }
    }
}

/// A stored message, borrowed from the manager.
///
/// ```
/// use ctxwin_core::{ContextManager, Message};
/// let mut manager = ContextManager::<ctxwin_core::TinyCapacities>::new();
/// manager.push(Message::user("hello").at(5))?;
/// let stored = manager.history().next_back().unwrap();
/// assert_eq!((stored.content(), stored.timestamp()), ("hello", 5));
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct MessageRef<'a> {
    header: &'a Header,
    record: &'a [u8],
    level: Level,
    /// Epoch of the header's id offset.
    id_epoch: u32,
}

impl<'a> MessageRef<'a> {
    pub(crate) fn new(header: &'a Header, record: &'a [u8], level: Level, id_epoch: u32) -> Self {
        Self { header, record, level, id_epoch }
    }

    /// Hashes of up to four identifiers, paths or numbers (all 0 when not computed).
    pub(crate) fn terms(&self) -> [u16; 4] {
        record::Trailer::of(self.header, self.record).terms
    }

    /// Manager-wide id, increasing with every push (stable across snapshots).
    // Out of line: the 64-bit id (epoch base + offset) is rebuilt at every merge step.
    #[inline(never)]
    pub fn id(&self) -> u64 {
        crate::header::full_id(self.id_epoch, self.header.id)
    }

    /// Author.
    pub fn role(&self) -> Role {
        self.header.role
    }

    /// Level it is stored in.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Text content (reduced, if [`was_reduced`](Self::was_reduced)).
    pub fn content(&self) -> &'a str {
        record::content(self.header, self.record)
    }

    /// Tool calls of an assistant message, in order.
    pub fn tool_calls(&self) -> record::ToolCalls<'a> {
        record::ToolCalls::new(self.header, self.record)
    }

    /// Number of tool calls.
    pub fn tool_call_count(&self) -> usize {
        if self.header.has(flags::SUMMARY) { 0 } else { self.header.items as usize }
    }

    /// For a tool result, the id of the call it answers.
    pub fn tool_call_id(&self) -> Option<&'a str> {
        (self.header.role == Role::Tool).then(|| record::tail_text(self.header, self.record))
    }

    /// Caller's timestamp.
    pub fn timestamp(&self) -> u64 {
        self.header.timestamp
    }

    /// Token cost as counted at insert, per-message overhead included.
    pub fn tokens(&self) -> u32 {
        self.header.tokens
    }

    /// Token cost before reduction or compression.
    pub fn original_tokens(&self) -> u32 {
        record::original_tokens(self.header, self.record)
    }

    /// Whether the stored text is shorter than what was pushed.
    pub fn was_reduced(&self) -> bool {
        self.header.has(flags::REDUCED)
    }

    /// Whether the caller marked it important.
    pub fn is_important(&self) -> bool {
        self.header.has(flags::IMPORTANT)
    }

    /// Whether the manager wrote it (an aborted-call result, a summary).
    pub fn is_synthetic(&self) -> bool {
        self.header.has(flags::SYNTHETIC)
    }

    /// Whether it is a summary standing for earlier messages.
    pub fn is_summary(&self) -> bool {
        self.header.has(flags::SUMMARY)
    }

    /// Whether it is a tool definition (permanent level).
    pub fn is_tool_definition(&self) -> bool {
        self.header.has(flags::TOOL_DEFINITION)
    }

    /// For a summary: the id ranges (inclusive) of the messages it stands for.
    pub fn summary_sources(&self) -> record::SourceRanges<'a> {
        record::SourceRanges::new(self.header, self.record)
    }

    /// Hierarchical detail of the stored text: 0 full, 1 paragraph, 2 one line, 3 a digest of
    /// merged summaries.
    pub fn detail(&self) -> u8 {
        self.header.detail
    }
}
