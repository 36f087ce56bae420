//! Pushing one message: the core's check and push, then the rows the core produced journaled
//! and written, and a periodic checkpoint.

use ctxwin_core::task::Task;
use ctxwin_core::{Error as CoreError, Level, Message, Role};

use super::convert::{core_calls, row_from_ref, tool_definition_json};
use super::report::{PushReport, Reduction};
use super::{Session, SessionError, now_ms};
use crate::message::{ChatMessage, ToolDefinition};
use crate::store::ArchivedMessage;

/// The core's borrowed view of `message` as pushed with `options` at `timestamp`.
fn core_message<'a>(
    message: &'a ChatMessage,
    calls: &'a [ctxwin_core::ToolCall<'a>],
    options: &PushOptions<'_>,
    timestamp: u64,
) -> Message<'a> {
    let mut core = Message::new(message.role, &message.content).at(timestamp);
    core.tool_calls = calls;
    core.tool_call_id = message.tool_call_id.as_deref();
    core.important = options.important;
    core.level = options.level;
    core.whole = options.whole;
    core
}

/// How to store a pushed message.
///
/// ```
/// use ctxwin_std::session::{PushOptions, SessionBuilder};
/// use ctxwin_std::{ChatMessage, core::{Level, Role}};
/// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
/// let raw = r#"{"role":"assistant","content":"long notes"}"#;
/// let options = PushOptions { level: Some(Level::Volatile), timestamp: Some(5), raw: Some(raw), ..Default::default() };
/// let id = session.push_with(&ChatMessage::text(Role::Assistant, "long notes"), options)?.id;
/// let stored = session.manager().get(id).unwrap();
/// assert_eq!((stored.level(), stored.timestamp()), (Level::Volatile, 5));
/// let row = session.archive().unwrap().get(session.scope(), id)?.unwrap();
/// assert_eq!(row.raw.as_deref(), Some(raw));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushOptions<'a> {
    /// Milliseconds since the Unix epoch; the system clock when `None`.
    pub timestamp: Option<u64>,
    /// The level to store it in; the role's default when `None` (system messages permanent,
    /// the rest working). Tool results always join their call's level.
    pub level: Option<Level>,
    /// Marked important (kept longer by the importance strategy).
    pub important: bool,
    /// The message exactly as the client sent it (its provider JSON), kept in its archive row
    /// ([`ArchivedMessage::raw`]): a proxy writes the message back from it byte for byte.
    pub raw: Option<&'a str>,
    /// For a tool result: kept whole, not reduced to the configured observation limit (a
    /// per-tool policy such as "never cut file reads"); reduced only when it alone is more
    /// than its unit may hold of the history ([`ctxwin_core::Message::whole`]).
    pub whole: bool,
}

impl Session {
    /// Pushes `message` with the system clock's timestamp; see [`push_with`](Self::push_with).
    ///
    /// # Errors
    /// As [`push_with`](Self::push_with).
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let report = session.push(&ChatMessage::text(Role::User, "Deploy to staging"))?;
    /// let row = session.archive().unwrap().get(session.scope(), report.id)?.unwrap();
    /// assert_eq!(row.message.content, "Deploy to staging");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push(&mut self, message: &ChatMessage) -> Result<PushReport, SessionError> {
        self.push_with(message, PushOptions::default())
    }

    /// Stores one message. The core decides, then the session writes what it decided:
    ///
    /// 1. Writes what the journal still holds from a failed write (a push while the archive
    ///    fails is refused, storing nothing).
    /// 2. Checks what the core would refuse (shape, a tool result without its call, a message
    ///    larger than its level) and refuses it, storing nothing.
    /// 3. Pushes it into the core, which gives it its id; if the core needs the space of
    ///    evicted units, the session writes and releases them first and pushes again.
    /// 4. Journals its row (the text the core keeps, the full text when the core reduced it,
    ///    the client's raw JSON), the records the core wrote itself (results of calls the
    ///    message closed) and new or changed summaries; writes the journal; only then
    ///    releases what the core evicted.
    /// 5. Writes a checkpoint when
    ///    [`checkpoint_interval_messages`](super::SessionBuilder::checkpoint_interval_messages)
    ///    pushes have passed (a failed periodic checkpoint is logged and retried on the next
    ///    push).
    ///
    /// # Errors
    /// [`SessionError::Core`] when the core refuses the message (nothing is stored);
    /// [`SessionError::Store`] when the journal of an earlier operation cannot be written
    /// (nothing of this message is stored). After the core took the message, a failed write
    /// is [`SessionError::AfterStore`]: the core holds the message, its rows stay in the
    /// journal, and the next call writes them.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let orphan = session.push(&ChatMessage::tool_result("c1", "42"));
    /// assert!(orphan.is_err());
    /// assert_eq!(session.archive().unwrap().usage(session.scope())?.messages, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push_with(
        &mut self,
        message: &ChatMessage,
        options: PushOptions<'_>,
    ) -> Result<PushReport, SessionError> {
        self.serving(true, |session| session.push_once(message, options))
    }

    /// [`push_with`](Self::push_with), once.
    fn push_once(
        &mut self,
        message: &ChatMessage,
        options: PushOptions<'_>,
    ) -> Result<PushReport, SessionError> {
        #[cfg(feature = "http")]
        self.poll_llm();
        self.commit()?;
        self.ensure_reproducible()?;
        let timestamp = options.timestamp.unwrap_or_else(now_ms);
        self.check_at(message, &options, timestamp)?;
        // Decided on the history before the push; the core starts the task only if it takes
        // the message, so a refused push starts nothing.
        let opens = self.detected_goal(message);
        let finishing = opens.as_ref().and_then(|_| self.manager.current_task().map(Task::number));
        let head = (message.role == Role::Tool).then(|| self.pending_head().map(|h| h.id()));
        let since = self.manager.next_id();
        let goal = opens.as_deref();
        let id = match self.push_core_opening(message, &options, timestamp, goal) {
            Err(CoreError::OutboxFull { level }) => {
                tracing::debug!(%level, "session: core needs drained space; writing and retrying");
                self.after_op(since, &|_| false)?;
                self.push_core_opening(message, &options, timestamp, goal)?
            }
            pushed => pushed?,
        };
        if opens.is_some() {
            self.task_state.detected += 1;
        }
        let unit = head.flatten().unwrap_or(id);
        let after_store = |source| SessionError::AfterStore { id, source: Box::new(source) };
        let whole = self.whole_task_summary(finishing, "");
        let report = self.finish_push(message, &options, id, unit, since).map_err(after_store)?;
        self.record_whole_task_summary(whole).map_err(after_store)?;
        // A task boundary is no archive row a replay would see: a reload must find it in a
        // checkpoint.
        if opens.is_some() && self.stores.checkpoints.is_some() {
            self.checkpoint_once().map_err(after_store)?;
        }
        self.note_reproducible();
        self.note_for_error_memory(message, id);
        Ok(report)
    }

    /// What [`push_with`](Self::push_with) would refuse for `message`, found without storing
    /// anything: its shape, its size (against the capacity tier the session grows to for it,
    /// which is memory work), and for a tool result whether it answers a call pending now. For
    /// a caller that takes several messages at once and must store none of them when one is
    /// refused.
    ///
    /// # Errors
    /// [`SessionError::Core`] with the core's refusal.
    ///
    /// ```
    /// use ctxwin_std::session::{PushOptions, SessionBuilder};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let orphan = ChatMessage::tool_result("c1", "42");
    /// assert!(session.check(&orphan, PushOptions::default()).is_err());
    /// session.check(&ChatMessage::text(Role::User, "hi"), PushOptions::default())?;
    /// assert_eq!(session.archive().unwrap().usage(session.scope())?.messages, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(
        &mut self,
        message: &ChatMessage,
        options: PushOptions<'_>,
    ) -> Result<(), SessionError> {
        let timestamp = options.timestamp.unwrap_or_else(now_ms);
        self.check_at(message, &options, timestamp)
    }

    fn check_at(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
        timestamp: u64,
    ) -> Result<(), SessionError> {
        self.make_tier_room(message, options)?;
        let calls = core_calls(message);
        self.manager.check(&core_message(message, &calls, options, timestamp))?;
        Ok(())
    }

    /// Everything after the core took message `id` of unit `unit`.
    fn finish_push(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
        id: u64,
        unit: u64,
        since: u64,
    ) -> Result<PushReport, SessionError> {
        self.saw_id(id);
        self.counters.messages_pushed += 1;
        // `level` decides on LLM extraction, which needs the `http` feature.
        #[cfg_attr(not(feature = "http"), allow(unused_variables))]
        let (row, reduced, level) = self.row_of(message, options, id, unit);
        if self.stores.archive.is_some() {
            self.journal.add_rows(&self.scope, self.stores.lease.fence, vec![row]);
        }
        let after = self.after_op(since, &|known| known == id)?;
        #[cfg(feature = "http")]
        if level.is_history() {
            self.schedule_llm_extraction(id, message);
        }
        let checkpoint = self.periodic_checkpoint();
        tracing::debug!(id, unit, evicted = after.drained.units.len(), "session: pushed");
        Ok(PushReport {
            id,
            unit,
            reduced,
            evicted_units: after.drained.units,
            evicted_messages: after.drained.messages,
            summaries: after.summaries,
            checkpoint,
        })
    }

    /// The archive row of message `id` as the core stored it (reduced text as content), with
    /// what the core does not keep: the full text when it was reduced, the author's name, the
    /// error flag and the client's raw JSON. Also the reduction, and the level it went to.
    fn row_of(
        &self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
        id: u64,
        unit: u64,
    ) -> (ArchivedMessage, Option<Reduction>, Level) {
        let (mut row, reduced) = match self.find_record(id) {
            Some(stored) => {
                let reduced = stored.was_reduced().then(|| Reduction {
                    original_tokens: stored.original_tokens(),
                    stored_tokens: stored.tokens(),
                });
                let mut row = row_from_ref(&stored, unit);
                if stored.content() != message.content {
                    row.original = Some(message.content.clone());
                }
                (row, reduced)
            }
            // Only if it left the core at once and the outbox was drained: keep it as it came.
            None => (ArchivedMessage::new(id, unit, message.clone()), None),
        };
        row.message.name.clone_from(&message.name);
        row.message.is_error = message.is_error;
        row.raw = options.raw.map(str::to_string);
        let level = row.level;
        (row, reduced, level)
    }

    /// Adds a tool the model may call; it is sent in every payload's `tools`.
    ///
    /// # Errors
    /// [`SessionError::ToolDefinition`] if `parameters` is not a JSON object;
    /// [`SessionError::Core`] if the permanent level cannot take it.
    ///
    /// ```
    /// use ctxwin_std::ToolDefinition;
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.add_tool(&ToolDefinition {
    ///     name: "ls".into(),
    ///     description: "list files".into(),
    ///     parameters: r#"{"type":"object","properties":{}}"#.into(),
    /// })?;
    /// assert_eq!(session.compose(&[])?.conversation.tools[0].name, "ls");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn add_tool(&mut self, tool: &ToolDefinition) -> Result<u64, SessionError> {
        self.serving(true, |session| session.add_tool_once(tool))
    }

    fn add_tool_once(&mut self, tool: &ToolDefinition) -> Result<u64, SessionError> {
        let json = tool_definition_json(tool)?;
        self.manager.grow_for(Level::Permanent, json.len())?;
        let id = self.manager.add_tool_definition(&json)?;
        self.tracker.tool_definitions.insert(id);
        self.saw_id(id);
        Ok(id)
    }

    /// Closes every call still waiting for a result, as `Config::unanswered_calls` says, so
    /// that [`compose`](Self::compose) can run; the synthetic results are archived.
    ///
    /// # Errors
    /// [`SessionError::Core`] if the closing results do not fit; archive errors.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, ToolCall};
    /// let mut session = SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "slow", "{}")]))?;
    /// assert!(session.compose(&[]).is_err());
    /// session.abort_pending_calls()?;
    /// assert_eq!(session.compose(&[])?.conversation.messages.len(), 2);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn abort_pending_calls(&mut self) -> Result<(), SessionError> {
        self.serving(true, Self::abort_pending_calls_once)
    }

    fn abort_pending_calls_once(&mut self) -> Result<(), SessionError> {
        self.commit()?;
        self.ensure_reproducible()?;
        let since = self.tracker.next_id;
        if let Err(CoreError::OutboxFull { .. }) = self.manager.abort_pending_calls() {
            self.after_op(since, &|_| false)?;
            self.manager.abort_pending_calls()?;
        }
        self.after_op(since, &|_| false)?;
        Ok(())
    }

    /// Moves the manager to the server tier when `message` would take a ring of the small
    /// tier past its mark (before anything is written: a failed move stores nothing).
    pub(super) fn make_tier_room(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
    ) -> Result<(), SessionError> {
        let level = match message.role {
            Role::Tool => self.pending_head().map_or(Level::Working, |head| head.level()),
            Role::System => options.level.unwrap_or(Level::Permanent),
            _ => options.level.unwrap_or(Level::Working),
        };
        let calls: usize = message
            .tool_calls
            .iter()
            .map(|c| c.id.len() + c.name.len() + c.arguments.len() + 8)
            .sum();
        let bytes =
            message.content.len() + calls + message.tool_call_id.as_ref().map_or(0, String::len);
        self.manager.grow_for(level, bytes)
    }

    pub(super) fn push_core(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
        timestamp: u64,
    ) -> Result<u64, CoreError> {
        self.push_core_opening(message, options, timestamp, None)
    }

    /// [`push_core`](Self::push_core), starting a task with `goal` at the message when the
    /// core takes it.
    fn push_core_opening(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions<'_>,
        timestamp: u64,
        goal: Option<&str>,
    ) -> Result<u64, CoreError> {
        let calls = core_calls(message);
        let mut core = core_message(message, &calls, options, timestamp);
        core.supersede_key = self.supersede_key_of(message);
        match goal {
            Some(goal) => self.manager.push_opening_task(core, goal),
            None => self.manager.push(core),
        }
    }
}
