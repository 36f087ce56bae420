//! Pushing one message: write-ahead to the archive, into the core, then the archive brought
//! up to date and a periodic checkpoint.

use ctxwin_core::{Error as CoreError, Level, Message, Role, UnansweredCalls};

use super::convert::{core_calls, row_from_ref, tool_definition_json};
use super::report::{PushReport, Reduction};
use super::{Session, SessionError, now_ms};
use crate::archive::ArchivedMessage;
use crate::message::{ChatMessage, ToolDefinition};

/// The core's borrowed view of `message` as pushed with `options` at `timestamp`.
fn core_message<'a>(
    message: &'a ChatMessage,
    calls: &'a [ctxwin_core::ToolCall<'a>],
    options: &PushOptions,
    timestamp: u64,
) -> Message<'a> {
    let mut core = Message::new(message.role, &message.content).at(timestamp);
    core.tool_calls = calls;
    core.tool_call_id = message.tool_call_id.as_deref();
    core.important = options.important;
    core.level = options.level;
    core
}

/// How to store a pushed message.
///
/// ```
/// use ctxwin_std::session::{PushOptions, SessionBuilder};
/// use ctxwin_std::{ChatMessage, core::{Level, Role}};
/// let mut session = SessionBuilder::new("s").build()?;
/// let verbose = PushOptions { level: Some(Level::Volatile), timestamp: Some(5), ..Default::default() };
/// let id = session.push_with(&ChatMessage::text(Role::Assistant, "long notes"), verbose)?.id;
/// let stored = session.manager().get(id).unwrap();
/// assert_eq!((stored.level(), stored.timestamp()), (Level::Volatile, 5));
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushOptions {
    /// Milliseconds since the Unix epoch; the system clock when `None`.
    pub timestamp: Option<u64>,
    /// The level to store it in; the role's default when `None` (system messages permanent,
    /// the rest working). Tool results always join their call's level.
    pub level: Option<Level>,
    /// Marked important (kept longer by the importance strategy).
    pub important: bool,
}

/// Where a message will go, decided before anything is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    id: u64,
    unit: u64,
    level: Level,
    tokens: u32,
}

/// A message the core accepted, and what was known before.
#[derive(Clone, Copy, Debug)]
struct Pushed {
    plan: Plan,
    id: u64,
    /// The tracker's next id before the push.
    since: u64,
    timestamp: u64,
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
    /// let row = session.archive().unwrap().get("s", report.id)?.unwrap();
    /// assert_eq!(row.message.content, "Deploy to staging");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push(&mut self, message: &ChatMessage) -> Result<PushReport, SessionError> {
        self.push_with(message, PushOptions::default())
    }

    /// Stores one message.
    ///
    /// 1. Checks what the core would refuse (shape, a tool result without its call, a message
    ///    larger than its level) and refuses it first, writing nothing.
    /// 2. Writes it to the archive with its full text (write-ahead).
    /// 3. Pushes it into the core; if the core needs the space of evicted units, archives and
    ///    releases them and retries once.
    /// 4. If the core stored it reduced, updates the row: the reduced text as content, the
    ///    full text as original.
    /// 5. Archives what the core wrote itself, records new or changed summaries with their
    ///    sources, writes evicted units to the archive and only then releases them.
    /// 6. Writes a checkpoint when
    ///    [`checkpoint_interval_messages`](super::SessionBuilder::checkpoint_interval_messages)
    ///    pushes have passed (a failed periodic checkpoint is logged and retried on the next
    ///    push).
    ///
    /// # Errors
    /// [`SessionError::Core`] when the core refuses the message (nothing is stored);
    /// [`SessionError::Archive`] when the write-ahead fails (nothing is stored). After the core
    /// stored the message, a failure to archive evicted units is
    /// [`SessionError::AfterStore`]: the units stay in the core's outbox and the next call
    /// archives them.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let orphan = session.push(&ChatMessage::tool_result("c1", "42"));
    /// assert!(orphan.is_err());
    /// assert_eq!(session.archive().unwrap().message_count(Some("s"))?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push_with(
        &mut self,
        message: &ChatMessage,
        options: PushOptions,
    ) -> Result<PushReport, SessionError> {
        self.poll_llm();
        let timestamp = options.timestamp.unwrap_or_else(now_ms);
        self.make_tier_room(message, &options)?;
        let mut plan = self.plan(message, &options)?;
        self.write_ahead(message, &plan, timestamp)?;
        let since = self.tracker.next_id;
        let mut displaced = Vec::new();
        let id = match self.push_core(message, &options, timestamp) {
            Ok(id) => id,
            Err(CoreError::OutboxFull { level }) => {
                tracing::debug!(%level, "session: core needs drained space; archiving and retrying");
                let replanned = self.replan_after_drain(message, &options, since, timestamp, &plan);
                match replanned {
                    Ok(again) if again.id != plan.id => {
                        displaced.push(plan.id);
                        plan = again;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        self.refused(plan.id);
                        return Err(error);
                    }
                }
                match self.push_core(message, &options, timestamp) {
                    Ok(id) => id,
                    Err(error) => {
                        self.refused(plan.id);
                        return Err(error.into());
                    }
                }
            }
            Err(error) => {
                self.refused(plan.id);
                return Err(error.into());
            }
        };
        let pushed = Pushed { plan, id, since, timestamp };
        self.finish_push(message, pushed, displaced)
            .map_err(|source| SessionError::AfterStore { id, source: Box::new(source) })
    }

    /// Everything after the core accepted message `id`.
    fn finish_push(
        &mut self,
        message: &ChatMessage,
        pushed: Pushed,
        mut displaced: Vec<u64>,
    ) -> Result<PushReport, SessionError> {
        let Pushed { mut plan, id, since, timestamp } = pushed;
        if id != plan.id {
            tracing::warn!(predicted = plan.id, id, "session: core gave another id than predicted");
            displaced.push(plan.id);
            if message.role != Role::Tool {
                plan.unit = id;
            }
            plan.id = id;
            // Queued on failure: the core holds the message now, its row must follow.
            self.write_rows(vec![self.ahead_row(message, &plan, timestamp)])?;
        }
        if self.phantom == Some(id) {
            self.phantom = None;
        }
        self.saw_id(id);
        self.counters.messages_pushed += 1;
        let reduced = self.update_stored_row(message, &plan, timestamp)?;
        let after = self.after_op(since, &|known| known == id)?;
        for wrong in displaced {
            self.repair_displaced(wrong)?;
        }
        if plan.level.is_history() {
            self.schedule_llm_extraction(id, message);
        }
        let checkpoint = self.periodic_checkpoint();
        tracing::debug!(
            id,
            unit = plan.unit,
            evicted = after.drained.units.len(),
            "session: pushed"
        );
        Ok(PushReport {
            id,
            unit: plan.unit,
            reduced,
            evicted_units: after.drained.units,
            evicted_messages: after.drained.messages,
            summaries: after.summaries,
            checkpoint,
        })
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
        let json = tool_definition_json(tool)?;
        self.manager.grow_for(Level::Permanent, json.len())?;
        let id = self.manager.add_tool_definition(&json)?;
        self.tracker.tool_definitions.insert(id);
        self.saw_id(id);
        self.settle_phantom(&|_| false)?;
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
        let since = self.tracker.next_id;
        if let Err(CoreError::OutboxFull { .. }) = self.manager.abort_pending_calls() {
            self.after_op(since, &|_| false)?;
            self.manager.abort_pending_calls()?;
        }
        self.after_op(since, &|_| false)?;
        Ok(())
    }

    /// After the core asked for the space of evicted units: archives and releases them, plans
    /// again (the eviction may have used ids) and writes the row under the new id if it moved.
    fn replan_after_drain(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions,
        since: u64,
        timestamp: u64,
        written: &Plan,
    ) -> Result<Plan, SessionError> {
        self.after_op(since, &|_| false)?;
        let plan = self.plan(message, options)?;
        if plan != *written {
            self.write_ahead(message, &plan, timestamp)?;
        }
        Ok(plan)
    }

    /// Moves the manager to the server tier when `message` would take a ring of the small
    /// tier past its mark (before anything is written: a failed move stores nothing).
    pub(super) fn make_tier_room(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions,
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

    /// Decides id, unit, level and cost, refusing what the core would refuse (its own
    /// [`check`](ctxwin_core::ContextManager::check)).
    fn plan(&self, message: &ChatMessage, options: &PushOptions) -> Result<Plan, SessionError> {
        let calls = core_calls(message);
        let tokens = self.manager.check(&core_message(message, &calls, options, 0))?;
        let (level, unit) = match self.pending_head() {
            Some(head) if message.role == Role::Tool => (head.level(), Some(head.id())),
            _ => {
                let default =
                    if message.role == Role::System { Level::Permanent } else { Level::Working };
                (options.level.unwrap_or(default), None)
            }
        };
        let config = self.manager.config();
        let closes_calls = message.role != Role::Tool
            && level.is_history()
            && config.unanswered_calls == UnansweredCalls::SynthesizeAborted;
        let aborted = if closes_calls { u64::from(self.manager.unanswered_calls()) } else { 0 };
        let id = self.manager.next_id().saturating_add(aborted);
        Ok(Plan { id, unit: unit.unwrap_or(id), level, tokens })
    }

    /// Archives `message` under the planned id, full text as content; on failure nothing is
    /// written and the push stops.
    fn write_ahead(
        &mut self,
        message: &ChatMessage,
        plan: &Plan,
        timestamp: u64,
    ) -> Result<(), SessionError> {
        if self.archive.is_none() {
            return Ok(());
        }
        let row = self.ahead_row(message, plan, timestamp);
        let Some(row) = self.batched(vec![row]) else { return Ok(()) };
        if self.is_deferred() {
            // Not kept on failure: the push stops here, the core never sees the message.
            return self.submit_rows(row, false);
        }
        if let Some(archive) = self.archive.as_mut() {
            archive.store_unit(&self.name, &row)?;
            self.counters.archive_rows_written += 1;
        }
        Ok(())
    }

    fn ahead_row(&self, message: &ChatMessage, plan: &Plan, timestamp: u64) -> ArchivedMessage {
        ArchivedMessage::new(plan.id, plan.unit, message.clone())
            .with_level(plan.level)
            .with_timestamp(timestamp)
            .with_tokens(plan.tokens)
    }

    pub(super) fn push_core(
        &mut self,
        message: &ChatMessage,
        options: &PushOptions,
        timestamp: u64,
    ) -> Result<u64, CoreError> {
        let calls = core_calls(message);
        self.manager.push(core_message(message, &calls, options, timestamp))
    }

    /// When the core stored something else than was written ahead (reduced text, another
    /// count), rewrites the row: stored text as content, full text as original.
    fn update_stored_row(
        &mut self,
        message: &ChatMessage,
        plan: &Plan,
        timestamp: u64,
    ) -> Result<Option<Reduction>, SessionError> {
        let Some(stored) = self.find_record(plan.id) else { return Ok(None) };
        let reduced = stored.was_reduced().then(|| Reduction {
            original_tokens: stored.original_tokens(),
            stored_tokens: stored.tokens(),
        });
        let differs = stored.content() != message.content
            || stored.tokens() != plan.tokens
            || stored.timestamp() != timestamp
            || stored.level() != plan.level;
        if !differs {
            return Ok(reduced);
        }
        let mut row = row_from_ref(&stored, plan.unit);
        row.message.name.clone_from(&message.name);
        row.message.is_error = message.is_error;
        if stored.content() != message.content {
            row.original = Some(message.content.clone());
        }
        self.write_rows(vec![row])?;
        Ok(reduced)
    }

    /// A message written ahead was refused by the core: its row stays until the next message
    /// takes the same id and overwrites it, or is repaired when something else takes the id.
    fn refused(&mut self, id: u64) {
        if self.archive.is_some() {
            tracing::debug!(id, "session: core refused a message written ahead");
            self.counters.refused_after_write_ahead += 1;
            self.phantom = Some(id);
        }
    }
}
