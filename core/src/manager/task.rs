//! Tasks in the manager: starting and finishing one, the structured summary a finished task
//! leaves in the session level, the one compaction a new task starts with, and which units
//! leave first while tasks run (a finished task's, then the open task's dead ends).

use super::ContextManager;
use super::evict::{Lock, UnitSpan, unit_end};
use super::summary::{MIN_SUMMARY_TOKENS, Target};
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::error::Error;
use crate::level::Level;
use crate::message::Message;
use crate::record;
use crate::role::Role;
use crate::stats::bump;
use crate::strategy::Strategy;
use crate::summarize::{Detail, SummarizeError, SummarySource, TaskRequest, TextBuffer};
use crate::task::{Task, looks_like_error};

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Starts a task with a short `goal` (kept up to [`GOAL_BYTES`](crate::task::GOAL_BYTES))
    /// at the caller's `timestamp`; messages pushed from now on belong to it. Returns its
    /// number.
    ///
    /// A task still running is finished first (its summary written, as by
    /// [`finish_task`](Self::finish_task) with no outcome). Then, in one compaction, every
    /// unit of a finished task and every volatile unit leaves the context (to the outbox,
    /// where the caller archives them), except the locked tail: the payload's prefix changes
    /// once for the whole switch. Refused while tool calls wait for results.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.set_config(ctxwin_core::Config { locked_tail: 1, ..ctxwin_core::Config::DEFAULT })?;
    /// manager.start_task("find why the build is slow", 0)?;
    /// manager.push(Message::user("Why is the build slow?"))?;
    /// manager.push(Message::assistant("Decided: enable sccache in .cargo/config.toml."))?;
    /// manager.push(Message::assistant("cargo build -v output ...").in_level(Level::Volatile))?;
    /// manager.push(Message::assistant("Done: sccache is on."))?;
    /// assert_eq!(manager.start_task("write the release notes", 1)?, 2);
    /// // The first task left a summary; its messages left but the locked ones (the newest
    /// // message and the newest user message).
    /// assert!(manager.session().next().unwrap().content().starts_with("Task 1: find why"));
    /// assert_eq!(manager.history().count(), 2);
    /// assert_eq!(manager.messages(Level::Volatile).count(), 0);
    /// assert_eq!(manager.tasks().len(), 2);
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn start_task(&mut self, goal: &str, timestamp: u64) -> Result<u32, Error> {
        self.ensure_configured()?;
        self.refuse_pending()?;
        let ingested = self.state.counters.tokens_ingested;
        Ok(self.open_task(goal, None, ingested, timestamp))
    }

    /// Pushes `message` and, only if it is accepted, starts a task with `goal` that begins
    /// at it (as [`start_task`](Self::start_task) would have just before it): for a caller
    /// that finds task boundaries by itself (a new request after a finished tool loop), so
    /// that a refused message starts nothing and changes nothing. Calls still waiting for
    /// results are closed by the push first (their results belong to the task before).
    /// Returns the message's id. A tool result belongs to its call's unit and cannot begin
    /// a task: [`Error::TaskInsideUnit`], nothing pushed.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let id = manager.push_opening_task(Message::user("Add a --json flag"), "add a --json flag")?;
    /// assert_eq!(manager.current_task().map(|t| t.first_id()), Some(id));
    /// let huge = "word ".repeat(50_000);
    /// assert!(manager.push_opening_task(Message::user(&huge), "too big").is_err());
    /// assert_eq!(manager.tasks().len(), 1, "a refused message starts no task");
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn push_opening_task(&mut self, message: Message<'_>, goal: &str) -> Result<u64, Error> {
        if message.role == Role::Tool {
            return Err(Error::TaskInsideUnit);
        }
        let id = self.push(message)?;
        let ingested = self.state.counters.tokens_ingested;
        let own = self.get(id).map_or(0, |m| u64::from(m.original_tokens()));
        self.open_task(goal, Some(id), ingested.saturating_sub(own), message.timestamp);
        Ok(id)
    }

    /// Finishes the running task (its span ending before message `first`, or at the newest
    /// message), compacts, and opens a task beginning at `first` (else at the next id issued)
    /// that started when `ingested` tokens had been ingested. Returns its number.
    fn open_task(&mut self, goal: &str, first: Option<u64>, ingested: u64, timestamp: u64) -> u32 {
        self.state.now = self.state.now.max(timestamp);
        if self.tasks.open().is_some() {
            let last = first.map_or(self.state.issued, |id| id.saturating_sub(1));
            self.close_task("", last, timestamp);
        }
        self.compact_for_task();
        // The summary may have put usage over the high-water mark, as a push can (what that
        // writes comes before the new task).
        self.collect();
        let number = self.tasks.last().map_or(0, |task| task.number).saturating_add(1);
        let first_id = first.unwrap_or_else(|| self.state.next_id());
        let task = Task::open(number, first_id, timestamp, goal).ingested_from(ingested);
        self.tasks.push(task);
        number
    }

    /// Finishes the running task with an `outcome` ("" to let the summary take the last
    /// answer's first sentence) at the caller's `timestamp`: one structured summary of it
    /// (goal, outcome, files touched, errors and what resolved them, decisions) goes to the
    /// session level, written by the strategy's summarizer
    /// ([`Summarizer::summarize_task`](crate::summarize::Summarizer::summarize_task), the
    /// extractive one by default) within
    /// [`summary_tokens`](crate::config::Config::summary_tokens), and its units become the
    /// first to leave when room is needed. Returns the finished task (its compression ratio
    /// included). [`Error::NoOpenTask`] without a running task; refused while tool calls wait
    /// for results.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// assert_eq!(manager.finish_task("", 0), Err(Error::NoOpenTask));
    /// manager.start_task("bump the MSRV", 0)?;
    /// manager.push(Message::user("Bump the MSRV to 1.87 in Cargo.toml"))?;
    /// manager.push(Message::assistant("Done: Cargo.toml now says rust-version = 1.87."))?;
    /// let task = manager.finish_task("MSRV is 1.87", 5)?;
    /// assert_eq!(task.finished_at(), Some(5));
    /// let summary = manager.get(task.summary_id().unwrap()).unwrap();
    /// assert!(summary.content().contains("Outcome: MSRV is 1.87"));
    /// assert!(summary.content().contains("Files: Cargo.toml"));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn finish_task(&mut self, outcome: &str, timestamp: u64) -> Result<Task, Error> {
        self.ensure_configured()?;
        if self.tasks.open().is_none() {
            return Err(Error::NoOpenTask);
        }
        self.refuse_pending()?;
        self.state.now = self.state.now.max(timestamp);
        self.close_task(outcome, self.state.issued, timestamp);
        // The summary may have put usage over the high-water mark, as a push can.
        self.collect();
        self.tasks.last().copied().ok_or(Error::NoOpenTask)
    }

    /// The tasks kept (at most [`MAX_TASKS`](crate::task::MAX_TASKS)), oldest first.
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert!(manager.tasks().is_empty());
    /// ```
    pub fn tasks(&self) -> &[Task] {
        self.tasks.as_slice()
    }

    /// The task running now, if any.
    ///
    /// ```
    /// let mut manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// manager.start_task("triage issue 12", 0)?;
    /// assert_eq!(manager.current_task().map(|t| t.goal()), Some("triage issue 12"));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn current_task(&self) -> Option<&Task> {
        self.tasks.open()
    }

    /// The kept task message `id` belongs to.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let before = manager.push(Message::user("hello"))?;
    /// manager.start_task("greet", 0)?;
    /// let inside = manager.push(Message::user("hi again"))?;
    /// assert!(manager.task_of(before).is_none());
    /// assert_eq!(manager.task_of(inside).map(|t| t.number()), Some(1));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn task_of(&self, id: u64) -> Option<&Task> {
        self.tasks.as_slice().iter().rev().find(|task| task.contains(id))
    }

    /// Supplies how relevant messages of the running task are to it, in thousandths (1000
    /// at most, kept to 4 thousandths): e.g. an embedder's cosine similarity of each message to the goal, computed by
    /// a caller that has one. The importance strategy's task relevance of a unit is then the
    /// best of its lexical share of the goal and of the newest request, and the highest value
    /// supplied for its messages. Replaces what was supplied before; keeps the first
    /// [`MAX_RELEVANCES`](crate::task::MAX_RELEVANCES) entries naming live messages of the
    /// running task (supply the oldest first: they are the ones scored for eviction) and
    /// returns how many it kept. Not kept in snapshots; a new task forgets them.
    /// [`Error::NoOpenTask`] without a running task.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.start_task("speed up the build", 0)?;
    /// let id = manager.push(Message::assistant("sccache halves compile times").at(1))?;
    /// assert_eq!(manager.set_task_relevance(&[(id, 800), (id + 99, 900)])?, 1);
    /// assert_eq!(manager.task_relevance(id), Some(800));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn set_task_relevance(&mut self, relevances: &[(u64, u16)]) -> Result<usize, Error> {
        let Some(open) = self.tasks.open().copied() else { return Err(Error::NoOpenTask) };
        let live =
            |id: u64| open.contains(id) && self.get(id).is_some_and(|m| m.level().is_history());
        let mut table = *self.tasks.relevances();
        let kept = table.replace(relevances, open.first_id, live);
        *self.tasks.relevances_mut() = table;
        Ok(kept)
    }

    /// The relevance to the running task supplied for message `id`
    /// ([`set_task_relevance`](Self::set_task_relevance)).
    pub fn task_relevance(&self, id: u64) -> Option<u16> {
        let open = self.tasks.open()?;
        self.tasks.relevances().of(id, open.first_id)
    }

    /// [`Error::ToolCallsPending`] while calls wait for results: a task boundary between a
    /// call and its result would split a unit.
    fn refuse_pending(&self) -> Result<(), Error> {
        match self.unanswered_calls() {
            0 => Ok(()),
            unanswered => Err(Error::ToolCallsPending { unanswered }),
        }
    }

    /// Closes the running task at message `last` and writes its summary.
    fn close_task(&mut self, outcome: &str, last: u64, timestamp: u64) {
        let Some(open) = self.tasks.open().copied() else { return };
        let mut task = Task {
            open: false,
            last_id: last,
            finished: timestamp,
            source_tokens: self
                .state
                .counters
                .tokens_ingested
                .saturating_sub(open.ingested)
                .min(u64::from(u32::MAX)) as u32,
            ..open
        };
        if let Some(slot) = self.tasks.last_mut() {
            *slot = task;
        }
        if last < open.first_id {
            return;
        }
        self.keep_session_in_budget();
        let written = {
            let parts = self.parts();
            let budget = parts.budget(Detail::Paragraph);
            let messages = SummarySource::new(parts.history(), open.first_id, last);
            if budget < MIN_SUMMARY_TOKENS {
                Err(SummarizeError::Rejected)
            } else if messages.clone().next().is_none() {
                Err(SummarizeError::NothingToKeep)
            } else {
                let request = TaskRequest {
                    number: open.number,
                    goal: task.goal(),
                    outcome,
                    messages,
                    budget,
                    counter: parts.counter,
                };
                let mut out = TextBuffer::new(parts.scratch);
                let done = parts.strategy.summarizer().summarize_task(&request, &mut out);
                match done {
                    Ok(()) if !out.is_empty() => Ok(out.len()),
                    Ok(()) => Err(SummarizeError::Rejected),
                    Err(error) => Err(error),
                }
            }
        };
        let written = match written {
            Ok(written) => written,
            Err(SummarizeError::NothingToKeep) => return,
            Err(_) => {
                bump(&mut self.state.counters.summaries_failed, 1);
                return;
            }
        };
        let issued = self.state.issued;
        // Stored as a digest: never cut to a line by age, as paragraphs are.
        self.store_summary(
            written,
            &[(open.first_id, last)],
            Detail::Digest,
            timestamp,
            false,
            Target::Append,
        );
        if self.state.issued > issued {
            task.summary_id = self.state.issued;
            task.summary_tokens = self.get(task.summary_id).map_or(0, |m| m.tokens());
            if let Some(slot) = self.tasks.last_mut() {
                *slot = task;
            }
        }
        self.keep_session_in_budget();
    }

    /// The compaction a new task starts with: every unit of a finished task (its summary
    /// stands for it) and every volatile unit leaves, outside the locked tail, in one pass
    /// (eviction only flags records, so the indices hold until the end).
    fn compact_for_task(&mut self) {
        let before = self.changes();
        let lock = self.lock();
        for level in [Level::Volatile, Level::Working] {
            let mut start = 0;
            loop {
                let ring = self.ring(level);
                if start >= ring.len() {
                    break;
                }
                let span = UnitSpan { start, end: unit_end(&ring, start) };
                start = span.end;
                let Some(head) = ring.get(span.start) else { break };
                let finished = self.tasks.finished_holds(ring.id(head));
                let leaves = head.is_live()
                    && (finished || level == Level::Volatile)
                    && !lock.covers(&ring, level, span);
                if !leaves {
                    continue;
                }
                if finished {
                    self.evict(level, span);
                } else {
                    self.leave(level, span);
                }
            }
        }
        self.end_eviction(true, before);
    }

    /// The unit of `level` to leave first while tasks run: the oldest unlocked unit of a
    /// finished task, else the open task's oldest dead end (a call unit whose results read as
    /// errors, followed later by a call unit that succeeded). `None` otherwise: the strategy
    /// chooses. One pass over the ring.
    pub(super) fn task_victim(&self, level: Level, lock: &Lock) -> Option<UnitSpan> {
        let ring = self.ring(level);
        let open = self.tasks.open();
        let mut dead_end: Option<UnitSpan> = None;
        let mut start = 0;
        while start < ring.len() {
            let span = UnitSpan { start, end: unit_end(&ring, start) };
            start = span.end;
            let Some(head) = ring.get(span.start) else { break };
            let id = ring.id(head);
            let free = head.is_live() && !lock.covers(&ring, level, span);
            if free && self.tasks.finished_holds(id) {
                return Some(span);
            }
            let answered = span.end > span.start + 1;
            if head.items == 0 || !answered || !open.is_some_and(|task| task.contains(id)) {
                continue;
            }
            let failed = (span.start + 1..span.end)
                .filter_map(|i| ring.get(i))
                .any(|h| looks_like_error(record::content(h, ring.record(h))));
            match dead_end {
                None if failed && free => dead_end = Some(span),
                Some(found) if !failed => return Some(found),
                _ => {}
            }
        }
        None
    }
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Takes a restored task as the newest (snapshot restore, after `reset_to`).
    pub(crate) fn load_task(&mut self, task: &Task) {
        self.tasks.push(*task);
    }
}
