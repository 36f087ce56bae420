//! A finished task's summary written from the whole task, and task summaries recalled.
//!
//! The core writes a task's summary from the messages still in its window when the task
//! finishes; what left earlier (the files read first, an early error and its fix, an approach
//! given up) is only in the archive. The session then writes the summary again, with the
//! core's writer ([`task_summary_of`]), from the task's messages read back from the archive
//! (scoped, at most [`TASK_ROWS`] of them) and puts it in place of the core's (same id,
//! sources and place). When the core merged the new summary into a digest at once (a full
//! session level), the whole-task summary is recorded in the archive under the summary's id
//! all the same: task summaries stay there as searchable units, and recall brings back the
//! ones the live request's words match ([`Session::pack_task_summaries`]).

use ctxwin_core::Level;
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::manager::ReplaceError;
use ctxwin_core::message::Message;
use ctxwin_core::summarize::{TaskHead, TextBuffer, task_summary_number, task_summary_of};
use ctxwin_core::task::Task;

use super::convert::core_calls;
use super::retrieve::Packer;
use super::{Session, SessionError};
use crate::store::{ArchiveStore, ArchivedMessage, Scope, SearchQuery, SummaryRecord};

/// Archived messages a task's summary is written from, at most: of a longer task, the first
/// and the last halves.
pub(super) const TASK_ROWS: usize = 400;
/// Bytes a summary is written into (the core's scratch size).
const SUMMARY_BYTES: usize = 16 * 1024;
/// Task summaries one recall brings back, at most.
const RECALLED_TASKS: usize = 2;
/// Summary hits a recall ranks.
const SUMMARY_HITS: usize = 8;

impl Session {
    /// Whether the session uses tasks: detection is on, or a task was started.
    pub(super) fn uses_tasks(&self) -> bool {
        self.task_state.detection != super::TaskDetection::Off || !self.manager.tasks().is_empty()
    }

    /// Writes the summary of finished task `number` (ended with `outcome`) again from all its
    /// archived messages when some of them left the window before it finished, in place of
    /// the core's. A summary that does not fit the session level goes in shorter, within what
    /// the core allows, and the whole one is returned: the caller records it in the archive
    /// under the same id once the operation's own records are written. So is the summary the
    /// core merged into a digest at once (a full session level), which the window no longer
    /// holds.
    ///
    /// # Errors
    /// Archive reads.
    pub(super) fn summarize_whole_task(
        &mut self,
        number: u32,
        outcome: &str,
    ) -> Result<Option<SummaryRecord>, SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(None) };
        let Some(task) = self.manager.tasks().iter().find(|t| t.number() == number).copied() else {
            return Ok(None);
        };
        let (Some(summary_id), Some(last)) = (task.summary_id(), task.last_id()) else {
            return Ok(None);
        };
        let rows = task_rows(archive, &self.scope, &task, last)?;
        let live_summary = self.manager.get(summary_id).is_some_and(|m| m.is_summary());
        let live = self.manager.history().filter(|m| task.contains(m.id())).count();
        if live_summary && rows.len() <= live {
            // The window held the whole task: the core's summary read all of it.
            return Ok(None);
        }
        let calls: Vec<Vec<ctxwin_core::ToolCall<'_>>> =
            rows.iter().map(|row| core_calls(&row.message)).collect();
        let messages: Vec<Message<'_>> = rows
            .iter()
            .zip(&calls)
            .map(|(row, calls)| Message {
                tool_calls: calls,
                tool_call_id: row.message.tool_call_id.as_deref(),
                ..Message::new(row.message.role, &row.message.content)
            })
            .collect();
        let config = self.manager.config();
        let overhead = u32::from(config.message_overhead);
        let budget =
            config.summary_tokens.min(config.level_budget(Level::Session)).saturating_sub(overhead);
        let write = |budget: u32, counter: &dyn TokenCounter| -> Option<String> {
            let mut bytes = vec![0u8; SUMMARY_BYTES];
            let mut out = TextBuffer::new(&mut bytes);
            let head = TaskHead { number, goal: task.goal(), outcome, budget, counter };
            task_summary_of(&head, messages.iter().copied(), &mut out).ok()?;
            Some(out.as_str().to_string())
        };
        let Some(whole) = write(budget, self.manager.counter()) else { return Ok(None) };
        let mut record =
            SummaryRecord::new(summary_id, 1, whole.as_str(), rows.iter().map(|r| r.id).collect());
        record.created_at = task.finished_at().unwrap_or_default();
        record.tokens_before = task.source_tokens();
        record.tokens_after = self.manager.counter().count(&whole);
        if !live_summary {
            return Ok(Some(record));
        }
        let shorter = match self.manager.replace_summary(summary_id, &whole) {
            Ok(_) => return Ok(None),
            Err(ReplaceError::TooLarge { limit, .. }) if limit > overhead => {
                write(limit - overhead, self.manager.counter())
            }
            Err(_) => None,
        };
        match shorter.map(|text| self.manager.replace_summary(summary_id, &text)) {
            Some(Ok(_)) => Ok(Some(record)),
            Some(Err(error)) => {
                tracing::debug!(%error, number, "session: the core's task summary stays");
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Into `packer`, before anything else: the archived task summaries that match `query`
    /// best (at most [`RECALLED_TASKS`], each scoring at least half the best), that the window
    /// does not hold. Only in a session that uses tasks: recall in one that does not is as
    /// before.
    ///
    /// # Errors
    /// Archive reads.
    pub(super) fn pack_task_summaries(
        &self,
        archive: &dyn ArchiveStore,
        packer: &mut Packer<'_>,
        query: &str,
    ) -> Result<(), SessionError> {
        if !self.uses_tasks() {
            return Ok(());
        }
        self.recall.searches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hits = archive.search_summaries(&self.scope, &SearchQuery::new(query, SUMMARY_HITS))?;
        let best = hits.iter().map(|hit| hit.score).fold(0.0, f64::max);
        let wanted = hits.iter().filter(|hit| {
            hit.score * 2.0 >= best
                && task_summary_number(&hit.text).is_some()
                && self.manager.get(hit.id).is_none()
        });
        for hit in wanted.take(RECALLED_TASKS) {
            let text: Vec<&str> = hit.text.lines().map(str::trim).collect();
            packer.take_summary(hit.id, &text.join(" | "));
        }
        Ok(())
    }
}

/// The archived messages of `task` (finished at id `last`), oldest first: all of them, or of
/// a task longer than [`TASK_ROWS`] ids its first and its last halves. Scoped in the reads.
fn task_rows(
    archive: &dyn ArchiveStore,
    scope: &Scope,
    task: &Task,
    last: u64,
) -> Result<Vec<ArchivedMessage>, SessionError> {
    let first = task.first_id();
    let within = |rows: Vec<ArchivedMessage>| -> Vec<ArchivedMessage> {
        rows.into_iter().filter(|row| row.id >= first && row.id <= last).collect()
    };
    let span = usize::try_from(last.saturating_sub(first).saturating_add(1)).unwrap_or(usize::MAX);
    if span <= TASK_ROWS {
        return Ok(within(archive.rows_after(scope, first.saturating_sub(1), TASK_ROWS)?));
    }
    let half = TASK_ROWS / 2;
    let mut rows = within(archive.rows_after(scope, first.saturating_sub(1), half)?);
    let tail_from = last.saturating_sub(half as u64);
    let newest = rows.last().map_or(0, |row| row.id);
    rows.extend(
        within(archive.rows_after(scope, tail_from, half)?).into_iter().filter(|r| r.id > newest),
    );
    Ok(rows)
}

// Every test reads an SQLite archive in memory.
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use ctxwin_core::{Config, Role};

    use crate::message::{ChatMessage, ToolCall};
    use crate::session::{ComposeOptions, RecallFor, Session, SessionBuilder};

    fn round(session: &mut Session, id: &str, name: &str, args: &str, result: &str) {
        let calls = vec![ToolCall::new(id, name, args)];
        session.push(&ChatMessage::assistant_calls("", calls)).unwrap();
        session.push(&ChatMessage::tool_result(id, result)).unwrap();
    }

    /// A task whose file, error and fix come first, then `checks` test runs that push them
    /// out of a small window.
    fn task(session: &mut Session, n: usize, goal: &str, checks: usize) {
        session.start_task(goal).unwrap();
        session.push(&ChatMessage::text(Role::User, format!("Please {goal}."))).unwrap();
        let file = format!(r#"{{"path":"src/part_{n}/writer.rs"}}"#);
        round(session, &format!("e{n}"), "edit_file", &file, "Applied 1 hunk(s).");
        round(
            session,
            &format!("t{n}"),
            "run",
            r#"{"cmd":"cargo test"}"#,
            &format!("error[E0599]: no method named `flush_{n}` found for struct `Writer{n}`"),
        );
        session
            .push(&ChatMessage::text(
                Role::Assistant,
                format!("That fails because the trait is not imported. Fix: import `Ext{n}`."),
            ))
            .unwrap();
        round(session, &format!("f{n}"), "edit_file", &file, "Applied 1 hunk(s).");
        for check in 0..checks {
            let ok = format!("test result: ok. {check} passed; 0 failed");
            round(session, &format!("c{n}_{check}"), "run", r#"{"cmd":"cargo test"}"#, &ok);
        }
        session.push(&ChatMessage::text(Role::Assistant, format!("Done: {goal}."))).unwrap();
        session.finish_task("").unwrap();
    }

    #[test]
    fn a_task_summary_covers_what_left_the_window_before_the_task_finished() {
        let config = Config { max_messages: 8, locked_tail: 2, ..Config::DEFAULT };
        let mut session =
            SessionBuilder::new("s").config(config).archive_in_memory().build().unwrap();
        task(&mut session, 1, "stream the export", 6);
        let task = session.tasks()[0];
        let id = task.summary_id().unwrap();
        let text = session.manager().core().get(id).unwrap().content().to_string();
        // The first edit and the error left (the request stays: the newest user message is
        // locked).
        assert!(session.manager().core().get(task.first_id() + 1).is_none(), "the edit left");
        assert!(text.starts_with("Task 1: stream the export\nOutcome: Done: stream the export."));
        assert!(text.contains("Files: src/part_1/writer.rs"), "{text}");
        assert!(text.contains("no method named `flush_1` found"), "{text}");
        assert!(text.contains("Fix: import `Ext1`"), "{text}");
        // The archive records the same text under the summary's id.
        session.sync_archive().unwrap();
        let record = session.archive().unwrap().summary(session.scope(), id).unwrap().unwrap();
        assert_eq!(record.text, text);
    }

    #[test]
    fn recall_brings_back_the_summary_of_an_old_task_its_query_names() {
        let config = Config {
            context_window: 3_000,
            reserved_for_reply: 500,
            session_budget: 150,
            max_messages: 10,
            locked_tail: 2,
            ..Config::DEFAULT
        };
        let goals = [
            "rotate refresh tokens on every use",
            "add cursor pagination to the invoices endpoint",
            "checksum every segment written to disk",
            "warm the cache after a deploy",
            "export ledgers as Parquet",
        ];
        let mut session =
            SessionBuilder::new("s").config(config).archive_in_memory().build().unwrap();
        for (n, goal) in goals.iter().enumerate() {
            task(&mut session, n + 1, goal, 3);
        }
        let question =
            "Which files did we change to add cursor pagination to the invoices endpoint?";
        let payload = session
            .compose_with(ComposeOptions::new(&[]).recall(RecallFor::Query(question)))
            .unwrap();
        let block = payload.recall.block;
        assert!(block.contains("(summary "), "{block}");
        assert!(block.contains("Task 2: add cursor pagination"), "{block}");
        assert!(block.contains("src/part_2/writer.rs"), "{block}");
        assert!(payload.tokens <= payload.budget);
        // A session without tasks recalls messages only.
        let mut plain =
            SessionBuilder::new("p").config(config).archive_in_memory().build().unwrap();
        plain.push(&ChatMessage::text(Role::User, "Please add cursor pagination.")).unwrap();
        let recall = plain.recall(question, &[]).unwrap();
        assert!(!recall.block.contains("(summary "), "{}", recall.block);
    }
}
