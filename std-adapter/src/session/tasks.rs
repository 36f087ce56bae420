//! Tasks in a session (issue 30): starting and finishing them (the core keeps the boundaries
//! and writes the summary; the session archives what the switch evicted, hands the new summary
//! to the model when one is configured, and checkpoints the boundary), finding task
//! boundaries where the caller does not say them, and error memory: a tool error seen before
//! brings back, from the archive, the turns that resolved it.

use ctxwin_core::task::{Task, error_signature, looks_like_error};
use ctxwin_core::{Error as CoreError, Role};

use super::{Session, SessionError, now_ms};
use crate::message::ChatMessage;
use crate::store::{ArchivedMessage, SearchQuery, SummaryRecord};

/// Archive hits an error's search looks through for an earlier occurrence.
const ERROR_HITS: usize = 20;
/// Rows after an earlier error read for its resolution.
const RESOLUTION_ROWS: usize = 12;
/// Bytes of one line quoted in a resolution block.
const QUOTE: usize = 300;

/// When a session starts tasks by itself ([`SessionBuilder::task_detection`](super::SessionBuilder::task_detection)).
///
/// ```
/// use ctxwin_std::session::TaskDetection;
/// assert_eq!(TaskDetection::default(), TaskDetection::Off);
/// assert!(TaskDetection::NewRequest.explain().contains("not a reply"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskDetection {
    /// Only [`Session::start_task`] starts tasks.
    #[default]
    Off,
    /// A user message starts a task when it is a new request: the agent's previous message
    /// was a final answer (no tool calls) that did not end in a question, and the agent used
    /// tools since the last boundary (a finished tool loop); or when no task ran yet.
    NewRequest,
}

impl TaskDetection {
    /// What it does, in one sentence (for `ctxwin stats`).
    pub fn explain(self) -> &'static str {
        match self {
            TaskDetection::Off => "tasks start only when asked (`ctxwin task start`)",
            TaskDetection::NewRequest => {
                "a user message starts a task when it is a new request after a finished tool \
                 loop (the agent answered without calls) and not a reply to the agent's question"
            }
        }
    }

    /// Its name in `ctxwin.toml` (`[tasks] detect`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskDetection::Off => "off",
            TaskDetection::NewRequest => "new-request",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s names.
    pub fn parse(name: &str) -> Option<Self> {
        [TaskDetection::Off, TaskDetection::NewRequest].into_iter().find(|d| d.as_str() == name)
    }
}

/// An earlier occurrence of the newest tool error and what resolved it, read back from the
/// archive ([`Session::error_memory`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMemory {
    /// Id of the error result that repeated.
    pub repeat_id: u64,
    /// Id of the earlier error result with the same signature whose resolution comes first
    /// (the first occurrence the archive search found).
    pub earlier_id: u64,
    /// Ids of the archived turns that resolved it, in order.
    pub resolution_ids: Vec<u64>,
    /// The block sent as dynamic context while the error is being handled.
    pub block: String,
}

/// Where an error-memory block goes on from the first occurrence's resolution to the newest's.
const AGAIN: &str = "\nIt happened again";

/// Header of an error-memory block in a payload.
pub const ERROR_MEMORY_HEADER: &str = "[Earlier resolution of this error]";

impl Session {
    /// Starts a task with a short `goal` (the core keeps 64 bytes of it): messages pushed from
    /// now on belong to it. A task still running is finished first (its summary written), and
    /// in one compaction every unit of a finished task and every volatile unit leaves the
    /// window, into the archive, except the locked tail. Returns the task's number.
    ///
    /// # Errors
    /// [`SessionError::Core`] with `ToolCallsPending` while calls wait for results (nothing
    /// changes); archive and checkpoint errors.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// assert_eq!(session.start_task("fix the flaky test")?, 1);
    /// session.push(&ChatMessage::text(Role::User, "tests/net.rs fails once in ten runs"))?;
    /// session.push(&ChatMessage::text(Role::Assistant, "Decided to retry the bind in tests/net.rs."))?;
    /// let task = session.finish_task("fixed")?;
    /// assert!(task.summary_id().is_some());
    /// assert_eq!(session.start_task("write the changelog")?, 2);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn start_task(&mut self, goal: &str) -> Result<u32, SessionError> {
        self.serving(true, |session| {
            session.task_op("", &mut |core, now| core.start_task(goal, now))
        })
    }

    /// Finishes the running task with an `outcome` ("" lets the summary take the last
    /// answer's first sentence): the core writes its structured summary into the session
    /// level, and its units leave first when room is needed. With a model configured
    /// ([`SessionBuilder::llm`](super::SessionBuilder::llm)) the summary is rewritten by it
    /// in the background, the extractive one staying on any failure. Returns the task, its
    /// compression ratio included.
    ///
    /// # Errors
    /// [`SessionError::Core`] with `NoOpenTask` or `ToolCallsPending` (nothing changes);
    /// archive and checkpoint errors.
    pub fn finish_task(&mut self, outcome: &str) -> Result<Task, SessionError> {
        self.serving(true, |session| {
            session.task_op(outcome, &mut |core, now| core.finish_task(outcome, now))
        })
    }

    /// The tasks the core keeps (the newest four), oldest first.
    pub fn tasks(&self) -> &[Task] {
        self.manager.tasks()
    }

    /// The task running now.
    pub fn current_task(&self) -> Option<&Task> {
        self.manager.current_task()
    }

    /// How this session finds task boundaries by itself.
    pub fn task_detection(&self) -> TaskDetection {
        self.task_state.detection
    }

    /// The earlier resolution of the newest tool error, when it repeated one the archive
    /// holds: composed payloads carry its [`block`](ErrorMemory::block) (in the room left,
    /// never evicting anything for it) until the next user message or the next tool result
    /// that is not an error.
    pub fn error_memory(&self) -> Option<&ErrorMemory> {
        self.task_state.error_memory.as_ref()
    }

    /// One task operation: the core decides; when it finished a task (ended with `outcome`),
    /// the session writes that task's summary again from all its archived messages
    /// ([`summarize_whole_task`](Self::summarize_whole_task)); then it archives what the core
    /// evicted and records the new summary (scheduling the model's rewrite), and checkpoints,
    /// so that a reload finds the boundary (it is not an archive row that a replay would see).
    fn task_op<T>(
        &mut self,
        outcome: &str,
        op: &mut dyn FnMut(&mut dyn super::SessionCore, u64) -> Result<T, CoreError>,
    ) -> Result<T, SessionError> {
        #[cfg(feature = "http")]
        self.poll_llm();
        self.commit()?;
        self.ensure_reproducible()?;
        let since = self.tracker.next_id;
        let open = self.manager.current_task().map(Task::number);
        let done = op(&mut *self.manager, now_ms())?;
        let whole = self.whole_task_summary(open, outcome);
        self.after_op(since, &|_| false)?;
        self.record_whole_task_summary(whole)?;
        if self.stores.checkpoints.is_some() {
            self.checkpoint_once()?;
        }
        Ok(done)
    }

    /// The summary of task `open` written again from all its archived messages, once the core
    /// has finished it; `None` when the core's own summary read the whole task, or when the
    /// rewrite failed (the core's summary stays: a warning, not an error).
    pub(super) fn whole_task_summary(
        &mut self,
        open: Option<u32>,
        outcome: &str,
    ) -> Option<SummaryRecord> {
        match self.summarize_whole_task(open?, outcome) {
            Ok(whole) => whole,
            Err(error) => {
                tracing::warn!(%error, "session: the task summary stays the core's");
                None
            }
        }
    }

    /// Records [`whole_task_summary`](Self::whole_task_summary)'s summary in place of the
    /// core's, after the core's outbox is written.
    pub(super) fn record_whole_task_summary(
        &mut self,
        whole: Option<SummaryRecord>,
    ) -> Result<(), SessionError> {
        if let Some(record) = whole {
            self.journal.add_summary(&self.scope, self.stores.lease.fence, record);
            self.commit()?;
        }
        Ok(())
    }

    /// Before a user message is pushed: the goal of the task it opens, when detection says
    /// it is a new request (its first line). The push starts the task, only if the core
    /// takes the message.
    pub(super) fn detected_goal(&self, message: &ChatMessage) -> Option<String> {
        if message.role != Role::User || self.task_state.detection == TaskDetection::Off {
            return None;
        }
        let first = self.manager.tasks().is_empty();
        if !(first || self.after_finished_tool_loop()) {
            return None;
        }
        let goal = message.content.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        Some(goal.to_string())
    }

    /// Whether the agent's newest message is a final answer without calls that is not a
    /// question, after at least one tool call in the running task.
    fn after_finished_tool_loop(&self) -> bool {
        let mut history = self.manager.history().rev();
        let Some(last) = history.next() else { return false };
        let answered = last.role() == Role::Assistant
            && last.tool_call_count() == 0
            && !last.content().trim_end().ends_with('?');
        let from = self.manager.current_task().map_or(0, Task::first_id);
        answered
            && history
                .take_while(|m| m.id() >= from && m.role() != Role::User)
                .any(|m| m.tool_call_count() > 0)
    }

    /// After a message was pushed: a tool error whose signature matches an earlier archived
    /// one brings back its resolution; a user message or a result that is not an error ends
    /// the error memory.
    /// Whether error memory is on: as [`SessionBuilder::error_memory`](super::SessionBuilder::error_memory)
    /// says, else while the session uses tasks (detection on, or a task started), so that a
    /// session without tasks composes and costs as before.
    pub fn error_memory_enabled(&self) -> bool {
        self.task_state.error_memory_setting.unwrap_or_else(|| {
            self.task_state.detection != TaskDetection::Off || !self.manager.tasks().is_empty()
        })
    }

    /// A failed archive read only costs the memory (logged): the message is stored.
    pub(super) fn note_for_error_memory(&mut self, message: &ChatMessage, id: u64) {
        if !self.error_memory_enabled() {
            self.task_state.error_memory = None;
            return;
        }
        let error = message.role == Role::Tool && looks_like_error(&message.content);
        if !error {
            if matches!(message.role, Role::User | Role::Tool) {
                self.task_state.error_memory = None;
            }
            return;
        }
        let Some(signature) = error_signature(&message.content) else { return };
        self.task_state.error_memory = match self.recall_resolution(signature, &message.content, id)
        {
            Ok(memory) => memory,
            Err(error) => {
                tracing::warn!(%error, "session: error memory could not read the archive");
                None
            }
        };
    }

    /// The error-memory block when it fits in the room a payload with `dynamic` has left (it
    /// never makes anything leave): whole, else only the first occurrence's resolution.
    pub(super) fn with_error_memory(&self, dynamic: &[&str]) -> Option<String> {
        let memory = self.task_state.error_memory.as_ref()?;
        let room = self.manager.dynamic_room(dynamic);
        let first = memory.block.split(AGAIN).next().unwrap_or_default();
        [memory.block.as_str(), first]
            .into_iter()
            .find(|block| self.manager.dynamic_tokens(block) <= room)
            .map(str::to_string)
    }

    /// The earlier archived errors with `signature` and the turns that resolved them: the
    /// first occurrence (where it was worked out) and the newest, when they differ; for each,
    /// the rows after it up to the first tool result that is not an error and the answer
    /// that follows. Scoped inside the storage calls; `None` without an archive or a
    /// resolution, or when the resolution is still in the window.
    fn recall_resolution(
        &self,
        signature: u32,
        content: &str,
        repeat_id: u64,
    ) -> Result<Option<ErrorMemory>, SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(None) };
        let line = error_line(content);
        self.recall.searches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hits = archive.search(&self.scope, &SearchQuery::new(line, ERROR_HITS))?;
        let mut earlier: Vec<u64> = hits
            .iter()
            .filter(|hit| hit.role == Role::Tool && hit.id < repeat_id)
            .filter(|hit| error_signature(&hit.content) == Some(signature))
            .map(|hit| hit.id)
            .collect();
        earlier.sort_unstable();
        earlier.dedup();
        let occurrences: Vec<u64> = match (earlier.first(), earlier.last()) {
            (Some(&first), Some(&newest)) if first != newest => vec![first, newest],
            (Some(&first), _) => vec![first],
            _ => return Ok(None),
        };
        let mut resolved: Vec<(u64, Vec<ArchivedMessage>)> = Vec::new();
        for earlier_id in occurrences {
            let rows = archive.rows_after(&self.scope, earlier_id, RESOLUTION_ROWS)?;
            let rows: Vec<ArchivedMessage> =
                resolution(&rows, repeat_id).into_iter().cloned().collect();
            if !rows.is_empty() {
                resolved.push((earlier_id, rows));
            }
        }
        let in_window =
            |rows: &Vec<ArchivedMessage>| rows.iter().all(|row| self.manager.get(row.id).is_some());
        if resolved.is_empty() || resolved.iter().all(|(_, rows)| in_window(rows)) {
            return Ok(None);
        }
        let earlier_id = resolved.first().map_or(0, |(id, _)| *id);
        let block = resolution_block(line, &resolved);
        let resolution_ids =
            resolved.iter().flat_map(|(_, rows)| rows.iter().map(|row| row.id)).collect();
        Ok(Some(ErrorMemory { repeat_id, earlier_id, resolution_ids, block }))
    }
}

/// What a session keeps about tasks besides the core's table.
#[derive(Debug, Default)]
pub(super) struct TaskState {
    pub(super) detection: TaskDetection,
    /// Error memory on or off as the builder said (`None`: on while tasks are used).
    pub(super) error_memory_setting: Option<bool>,
    /// Tasks detection started.
    pub(super) detected: u64,
    pub(super) error_memory: Option<ErrorMemory>,
}

/// The first line of `content` that reads as an error (else its first line).
fn error_line(content: &str) -> &str {
    let line = content
        .lines()
        .find(|line| looks_like_error(line))
        .or_else(|| content.lines().next())
        .unwrap_or_default();
    clip(line.trim(), QUOTE)
}

fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The rows that resolved an error, from the rows after it: up to and including the first
/// tool result that is not an error (with the call that asked for it), then the answer that
/// follows it, if any; nothing when no result succeeded before `before`.
fn resolution(rows: &[ArchivedMessage], before: u64) -> Vec<&ArchivedMessage> {
    let rows: Vec<&ArchivedMessage> = rows.iter().filter(|row| row.id < before).collect();
    let Some(fixed) = rows
        .iter()
        .position(|row| row.message.role == Role::Tool && !looks_like_error(&row.message.content))
    else {
        return Vec::new();
    };
    let mut end = fixed + 1;
    if rows
        .get(end)
        .is_some_and(|row| row.message.role == Role::Assistant && row.message.tool_calls.is_empty())
    {
        end += 1;
    }
    rows[..end].to_vec()
}

/// The resolutions as one block of dynamic context: the first occurrence's, then the
/// newest's.
fn resolution_block(line: &str, resolved: &[(u64, Vec<ArchivedMessage>)]) -> String {
    let mut block = String::from(ERROR_MEMORY_HEADER);
    for (i, (earlier_id, rows)) in resolved.iter().enumerate() {
        if i == 0 {
            block.push_str(&format!(
                "\nThe same error happened before (message {earlier_id}): {line}\nWhat resolved it then:"
            ));
        } else {
            block.push_str(&format!("{AGAIN} (message {earlier_id}); what ended it that time:"));
        }
        for row in rows {
            let message = &row.message;
            for call in &message.tool_calls {
                block.push_str(&format!("\n- call {} {}", call.name, clip(&call.arguments, QUOTE)));
            }
            let text = message.content.trim();
            if text.is_empty() {
                continue;
            }
            let first = clip(text.lines().next().unwrap_or_default(), QUOTE);
            let who = match message.role {
                Role::Tool => "result",
                Role::Assistant => "assistant",
                Role::User => "user",
                Role::System => "system",
            };
            block.push_str(&format!("\n- {who}: {first}"));
        }
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::session::SessionBuilder;

    fn round(session: &mut Session, id: &str, name: &str, args: &str, result: &str) {
        let calls = vec![ToolCall::new(id, name, args)];
        session.push(&ChatMessage::assistant_calls("", calls)).unwrap();
        session.push(&ChatMessage::tool_result(id, result)).unwrap();
    }

    #[test]
    #[cfg(feature = "sqlite")] // archive_in_memory is SQLite in memory
    fn a_repeated_error_brings_back_its_resolution_from_the_archive() {
        let config = ctxwin_core::Config { max_messages: 6, locked_tail: 2, ..Default::default() };
        let mut session =
            SessionBuilder::new("s").config(config).archive_in_memory().build().unwrap();
        assert!(!session.error_memory_enabled(), "off in a session without tasks");
        session.start_task("build it").unwrap();
        assert!(session.error_memory_enabled());
        session.push(&ChatMessage::text(Role::User, "build it")).unwrap();
        let failure = "error: linker `cc` not found\n  = note: No such file (os error 2)";
        round(&mut session, "a", "run", r#"{"cmd":"cargo build"}"#, failure);
        round(&mut session, "b", "run", r#"{"cmd":"apt-get install -y gcc"}"#, "Setting up gcc");
        session
            .push(&ChatMessage::text(Role::Assistant, "Installed gcc: the linker was missing."))
            .unwrap();
        for turn in 0..6 {
            session.push(&ChatMessage::text(Role::User, format!("unrelated {turn}"))).unwrap();
        }
        assert!(session.error_memory().is_none());
        // The same failure in another container.
        let again = "error: linker `cc` not found\n  = note: No such file (os error 2)";
        round(&mut session, "c", "run", r#"{"cmd":"cargo build --release"}"#, again);
        let memory = session.error_memory().expect("the earlier resolution");
        assert_eq!(memory.earlier_id, 3);
        assert_eq!(memory.resolution_ids, [4, 5, 6]);
        assert!(memory.block.contains("call run {\"cmd\":\"apt-get install -y gcc\"}"));
        assert!(memory.block.contains("assistant: Installed gcc"));
        let payload = session.compose(&[]).unwrap();
        assert!(
            payload.conversation.messages.iter().any(|m| m.content.contains("apt-get install")),
            "the resolution is in the payload"
        );
        // Handled: the next successful result ends it.
        round(&mut session, "d", "run", r#"{"cmd":"cargo build"}"#, "Finished");
        assert!(session.error_memory().is_none());
    }

    #[test]
    #[cfg(feature = "sqlite")] // archive_in_memory is SQLite in memory
    fn an_error_seen_twice_brings_back_how_it_was_worked_out_the_first_time() {
        let config = ctxwin_core::Config { max_messages: 6, locked_tail: 2, ..Default::default() };
        let mut session =
            SessionBuilder::new("s").config(config).archive_in_memory().build().unwrap();
        session.start_task("build it").unwrap();
        session.push(&ChatMessage::text(Role::User, "build it")).unwrap();
        let failure = "error: linker `cc` not found";
        round(&mut session, "a", "run", r#"{"cmd":"cargo build"}"#, failure);
        round(&mut session, "b", "run", r#"{"cmd":"apt-get install -y gcc"}"#, "Setting up gcc");
        session
            .push(&ChatMessage::text(Role::Assistant, "Installed gcc: the linker was missing."))
            .unwrap();
        for turn in 0..6 {
            session.push(&ChatMessage::text(Role::User, format!("unrelated {turn}"))).unwrap();
        }
        // The second time, the agent repeats what worked without saying it again.
        round(&mut session, "c", "run", r#"{"cmd":"cargo build"}"#, failure);
        session
            .push(&ChatMessage::text(Role::Assistant, "This again; same as last time."))
            .unwrap();
        round(&mut session, "d", "run", r#"{"cmd":"cargo build"}"#, "Finished");
        session.push(&ChatMessage::text(Role::Assistant, "Builds now.")).unwrap();
        for turn in 0..6 {
            session.push(&ChatMessage::text(Role::User, format!("more {turn}"))).unwrap();
        }
        round(&mut session, "e", "run", r#"{"cmd":"cargo build"}"#, failure);
        let memory = session.error_memory().expect("the earlier resolutions");
        assert_eq!(memory.earlier_id, 3, "the first occurrence comes first");
        assert!(memory.block.contains("apt-get install -y gcc"), "{}", memory.block);
        assert!(memory.block.contains("It happened again"), "{}", memory.block);
        assert!(memory.block.contains("same as last time"), "{}", memory.block);
    }

    #[test]
    fn error_memory_reads_only_its_own_tenant_and_conversation() {
        let store = std::sync::Arc::new(crate::store::MemoryStore::new());
        let config = ctxwin_core::Config { max_messages: 4, locked_tail: 1, ..Default::default() };
        let open = |tenant: &str, name: &str| {
            SessionBuilder::new(name)
                .tenant(tenant)
                .config(config)
                .error_memory(true)
                .archive_store(store.clone())
                .build()
                .unwrap()
        };
        let failure = "error: linker `cc` not found";
        let mut first = open("acme", "agent");
        first.push(&ChatMessage::text(Role::User, "build it")).unwrap();
        round(&mut first, "a", "run", r#"{"cmd":"cargo build"}"#, failure);
        round(&mut first, "b", "run", r#"{"cmd":"apt-get install -y gcc"}"#, "Setting up gcc");
        for turn in 0..4 {
            first.push(&ChatMessage::text(Role::User, format!("unrelated {turn}"))).unwrap();
        }
        // Its own conversation remembers (the resolution left the window).
        round(&mut first, "r", "run", r#"{"cmd":"cargo build"}"#, failure);
        assert!(first.error_memory().is_some());
        for (tenant, name) in [("acme", "other-agent"), ("globex", "agent")] {
            let mut other = open(tenant, name);
            other.push(&ChatMessage::text(Role::User, "build it")).unwrap();
            round(&mut other, "c", "run", r#"{"cmd":"cargo build"}"#, failure);
            assert!(other.error_memory().is_none(), "{tenant}/{name} saw another's archive");
        }
    }

    /// A session detecting tasks whose archive fails when the test says so, after one
    /// finished task: the next user message is a new request.
    fn detecting_with_faults() -> (Session, std::sync::Arc<crate::store::Faults>) {
        let store = crate::store::Faulty::new(crate::store::MemoryStore::new());
        let faults = store.faults();
        let mut session = SessionBuilder::new("s")
            .archive_store(std::sync::Arc::new(store))
            .task_detection(TaskDetection::NewRequest)
            .build()
            .unwrap();
        session.push(&ChatMessage::text(Role::User, "List the crates")).unwrap();
        round(&mut session, "a", "ls", "{}", "core cli proxy");
        session.push(&ChatMessage::text(Role::Assistant, "Three crates.")).unwrap();
        (session, faults)
    }

    #[test]
    fn a_new_request_the_archive_cannot_take_opens_a_task_only_with_the_message() {
        let (mut session, faults) = detecting_with_faults();
        let next = session.manager().next_id();
        faults.fail_writes("disk full");
        let pushed = session.push(&ChatMessage::text(Role::User, "Now bump the version"));
        match pushed {
            // Taken by the core, its rows waiting in the journal: the task began with it.
            Err(SessionError::AfterStore { id, .. }) => {
                assert_eq!(
                    session.current_task().map(|t| (t.number(), t.first_id())),
                    Some((2, id))
                );
                assert!(session.manager().get(id).is_some());
            }
            // Refused: nothing changed, no task started.
            Err(error) => {
                assert_eq!(session.tasks().len(), 1, "refused ({error}), yet a task started");
                assert_eq!(session.manager().next_id(), next);
            }
            Ok(report) => panic!("a failing archive took message {}", report.id),
        }
        faults.heal();
        session.sync_archive().unwrap();
        assert_eq!(session.tasks().len(), 2);
        assert_eq!(session.current_task().unwrap().goal(), "Now bump the version");
    }

    #[test]
    fn a_refused_new_request_starts_no_task() {
        let (mut session, _faults) = detecting_with_faults();
        let orphan = ChatMessage { role: Role::User, ..ChatMessage::tool_result("zz", "x") };
        assert!(session.push(&orphan).is_err());
        assert_eq!(session.tasks().len(), 1);
        assert!(session.current_task().is_some_and(|t| t.number() == 1));
    }

    #[test]
    fn detection_does_not_refuse_a_request_while_calls_wait() {
        let mut session =
            SessionBuilder::new("s").task_detection(TaskDetection::NewRequest).build().unwrap();
        let calls = vec![ToolCall::new("a", "ls", "{}")];
        session.push(&ChatMessage::assistant_calls("", calls)).unwrap();
        // The push closes the waiting call, then the task begins at the request.
        let id = session.push(&ChatMessage::text(Role::User, "Do this instead")).unwrap().id;
        assert_eq!(session.current_task().map(|t| t.first_id()), Some(id));
        assert_eq!(session.manager().unanswered_calls(), 0);
    }

    #[test]
    #[cfg(feature = "sqlite")] // archive_in_memory is SQLite in memory
    fn detection_starts_a_task_at_a_new_request_after_a_tool_loop_not_at_a_reply() {
        let mut session = SessionBuilder::new("s")
            .archive_in_memory()
            .task_detection(TaskDetection::NewRequest)
            .build()
            .unwrap();
        session.push(&ChatMessage::text(Role::User, "List the crates")).unwrap();
        assert_eq!(session.tasks().len(), 1, "the first request starts a task");
        round(&mut session, "a", "ls", "{}", "core cli proxy");
        session.push(&ChatMessage::text(Role::Assistant, "Which one should I open?")).unwrap();
        session.push(&ChatMessage::text(Role::User, "core")).unwrap();
        assert_eq!(session.tasks().len(), 1, "a reply to a question is not a new task");
        round(&mut session, "b", "open", "{}", "core/src/lib.rs");
        session.push(&ChatMessage::text(Role::Assistant, "core is the no_std crate.")).unwrap();
        session.push(&ChatMessage::text(Role::User, "Now bump the version")).unwrap();
        assert_eq!(session.tasks().len(), 2);
        assert_eq!(session.current_task().unwrap().goal(), "Now bump the version");
        assert!(session.tasks()[0].summary_id().is_some());
    }
}
