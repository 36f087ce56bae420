//! Bulk import: a whole conversation into the core, archived in large transactions.

use std::collections::HashSet;

use ctxwin_core::{Error as CoreError, Role};

use super::checkpointing::{CheckpointPolicy, PeriodicCheckpointer};
use super::convert::{row_from_ref, tool_definition_from_json};
use super::push::PushOptions;
use super::report::ImportReport;
use super::{RestorePoint, Session, SessionError, now_ms};
use crate::message::{ChatMessage, Conversation};
use crate::store::{ArchivedMessage, CheckpointId, CompressionRecord};

/// Rows journaled before one archive write.
const FLUSH_ROWS: usize = 2_000;

/// How far apart `import` places consecutive messages that carry no time of their own: an
/// untimed message `k` places before the end of the imported conversation is `k` minutes
/// older than the import, so ages follow turn order (with the default hierarchical ages, the
/// newest five turns are under 5 minutes old, turns up to 30 back under 30 minutes).
///
/// ```
/// assert_eq!(ctxwin_std::session::UNTIMED_TURN_INTERVAL_MS, 60_000);
/// ```
pub const UNTIMED_TURN_INTERVAL_MS: u64 = 60_000;

/// Every message's time for an import of `count` messages at `now`: its own where
/// `timestamps` has one, else its turn order back from `now`
/// ([`UNTIMED_TURN_INTERVAL_MS`] per message).
fn turn_order_times(timestamps: &[Option<u64>], count: usize, now: u64) -> Vec<Option<u64>> {
    (0..count)
        .map(|index| {
            let back = u64::try_from(count - 1 - index).unwrap_or(u64::MAX);
            let turn_time = now.saturating_sub(back.saturating_mul(UNTIMED_TURN_INTERVAL_MS));
            Some(timestamps.get(index).copied().flatten().unwrap_or(turn_time))
        })
        .collect()
}

/// What an import journaled since its last write, and every id it stored.
struct Batch {
    /// Rows journaled since the last write.
    rows: usize,
    ids: HashSet<u64>,
    /// The tracker's next id at the last write.
    since: u64,
}

impl Session {
    /// Pushes a whole conversation: the system prompt, the tool definitions not declared yet,
    /// then every message in order, stamped in turn order up to the import time
    /// ([`UNTIMED_TURN_INTERVAL_MS`] apart; [`import_timed`](Self::import_timed) keeps the times
    /// an input carries).
    ///
    /// Unlike [`push`](Self::push), rows are written in batches of a few thousand per
    /// write: each message is journaled after the core stored it, and the journal is written
    /// before anything is released from the core's outbox and before the checkpoint written
    /// at the end (when one is due), so a crash loses nothing a checkpoint claims. Summaries
    /// are recorded in the state they have at each batch.
    ///
    /// # Errors
    /// [`SessionError::Import`] naming the first item the core refused; everything before it
    /// is stored and archived, nothing after it is.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, Conversation, ToolCall, core::Role};
    /// let conversation = Conversation {
    ///     messages: vec![
    ///         ChatMessage::text(Role::User, "list files"),
    ///         ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", "{}")]),
    ///         ChatMessage::tool_result("c1", "Cargo.toml"),
    ///     ],
    ///     ..Default::default()
    /// };
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let report = session.import(&conversation)?;
    /// assert_eq!(report.ids, [1, 2, 3]);
    /// assert_eq!(session.archive().unwrap().get(session.scope(), 3)?.unwrap().unit, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn import(&mut self, conversation: &Conversation) -> Result<ImportReport, SessionError> {
        self.import_timed(conversation, &[])
    }

    /// Like [`import`](Self::import), with the time of each message where the input had one
    /// (`timestamps[i]` for `conversation.messages[i]`, ms since the Unix epoch, e.g. from
    /// [`message_timestamps`](crate::format::message_timestamps)); messages without one are
    /// placed in turn order before the import time, [`UNTIMED_TURN_INTERVAL_MS`] apart. Ages
    /// then come from when things were said, or from how many turns ago.
    ///
    /// # Errors
    /// As [`import`](Self::import).
    ///
    /// ```
    /// use ctxwin_std::{format, session::SessionBuilder};
    /// let jsonl = "{\"role\":\"user\",\"content\":\"hi\",\"timestamp\":\"2023-05-08T13:56:00Z\"}\n";
    /// let conversation = format::read(jsonl, format::Format::OpenAiJsonl).unwrap();
    /// let stamps = format::message_timestamps(jsonl, conversation.messages.len());
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let report = session.import_timed(&conversation, &stamps)?;
    /// let stored = session.archive().unwrap().get_many(session.scope(), &report.ids).unwrap();
    /// assert_eq!(stored[0].timestamp, 1_683_554_160_000);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn import_timed(
        &mut self,
        conversation: &Conversation,
        timestamps: &[Option<u64>],
    ) -> Result<ImportReport, SessionError> {
        // Not redone when overtaken: what was stored before stays, as after any failed item.
        self.serving(false, |session| session.import_once(conversation, timestamps))
    }

    fn import_once(
        &mut self,
        conversation: &Conversation,
        timestamps: &[Option<u64>],
    ) -> Result<ImportReport, SessionError> {
        self.commit()?;
        self.ensure_reproducible()?;
        let mut report = ImportReport::default();
        let mut batch = Batch { rows: 0, ids: HashSet::new(), since: self.tracker.next_id };
        let ingested = self.manager.stats().counters.tokens_ingested;
        let times = turn_order_times(timestamps, conversation.messages.len(), now_ms());
        let result = self.import_items(conversation, &times, &mut batch, &mut report);
        // Whatever was stored is archived, also when an item was refused.
        let flushed = self.flush(&mut batch, &mut report);
        result?;
        flushed?;
        self.record_import_compression(ingested, &report)?;
        let stored = u32::try_from(report.stored).unwrap_or(u32::MAX);
        let due = self.checkpointing.periodic.on_messages(stored);
        // Under a lease, a checkpoint closes every import: its tool definitions take ids no
        // row of the archive replays.
        if self.stores.checkpoints.is_some() && (due || self.leased()) {
            report.checkpoint = Some(self.checkpoint_once()?);
        }
        tracing::info!(
            scope = %self.scope,
            stored = report.stored,
            evicted = report.units_evicted,
            "session: import done"
        );
        Ok(report)
    }

    /// Imports a whole conversation all or nothing, `chunk` messages per [`import`](Self::import)
    /// call (`progress` hears each chunk's report and how many messages are done).
    ///
    /// No periodic checkpoint is written while it runs, and one checkpoint is written at the
    /// end: a process killed half-way leaves the newest checkpoint from before the import,
    /// so the next session continues from there (the rows written meanwhile are moved to the
    /// side session `<name>@rewound-<id>`, never kept twice). When an item is refused, the
    /// session goes back to that checkpoint the same way before the error is returned: a
    /// retry imports everything once.
    ///
    /// # Errors
    /// [`SessionError::NoCheckpoints`] without a checkpoint store; [`SessionError::Import`]
    /// naming the first refused item, its index counted over the whole conversation.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, Conversation, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let mut session = SessionBuilder::new("s")
    ///     .archive(dir.path().join("a.db"))
    ///     .checkpoints(dir.path().join("ckpt"))
    ///     .build()?;
    /// let mut messages: Vec<_> = (0..5).map(|n| ChatMessage::text(Role::User, format!("m{n}"))).collect();
    /// messages.push(ChatMessage::tool_result("nobody-called", "orphan"));
    /// let bad = Conversation { messages, ..Default::default() };
    /// assert!(session.import_atomic(&bad, 2, |_, _| {}).is_err());
    /// assert_eq!(session.manager().history().count(), 0, "nothing of it stays");
    /// assert_eq!(session.archive().unwrap().usage(session.scope())?.messages, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn import_atomic(
        &mut self,
        conversation: &Conversation,
        chunk: usize,
        progress: impl FnMut(&ImportReport, usize),
    ) -> Result<CheckpointId, SessionError> {
        self.import_atomic_timed(conversation, &[], chunk, progress)
    }

    /// [`import_atomic`](Self::import_atomic) with message times, as
    /// [`import_timed`](Self::import_timed).
    ///
    /// # Errors
    /// As [`import_atomic`](Self::import_atomic).
    pub fn import_atomic_timed(
        &mut self,
        conversation: &Conversation,
        timestamps: &[Option<u64>],
        chunk: usize,
        mut progress: impl FnMut(&ImportReport, usize),
    ) -> Result<CheckpointId, SessionError> {
        if self.stores.checkpoints.is_none() {
            return Err(SessionError::NoCheckpoints { operation: "import_atomic" });
        }
        let start = match self.checkpointing.last.clone() {
            Some(id) => id,
            None => self.checkpoint_once()?,
        };
        let policy = self.checkpointing.periodic.policy();
        self.checkpointing.periodic = PeriodicCheckpointer::new(CheckpointPolicy::DISABLED);
        // Turn-order times over the whole conversation, not per chunk.
        let times = turn_order_times(timestamps, conversation.messages.len(), now_ms());
        let result = self.import_chunks(conversation, &times, chunk.max(1), &mut progress);
        let result = match result {
            Ok(()) => {
                self.checkpointing.periodic = PeriodicCheckpointer::new(policy);
                self.checkpoint_once()
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(id) => Ok(id),
            // Overtaken: the session reloaded the store's state, which the new holder serves;
            // going back would undo its writes too.
            Err(error) if self.leased() && super::lease::is_fenced(&error) => {
                self.checkpointing.periodic = PeriodicCheckpointer::new(policy);
                Err(error)
            }
            Err(error) => {
                if let Err(undo) = self.restore(RestorePoint::Id(start.clone())) {
                    tracing::warn!(%undo, %start, "session: cannot go back to the checkpoint before the import");
                }
                self.checkpointing.periodic = PeriodicCheckpointer::new(policy);
                Err(error)
            }
        }
    }

    fn import_chunks(
        &mut self,
        conversation: &Conversation,
        timestamps: &[Option<u64>],
        chunk: usize,
        progress: &mut impl FnMut(&ImportReport, usize),
    ) -> Result<(), SessionError> {
        let mut head = Some((conversation.system.clone(), conversation.tools.clone()));
        let mut offset = 0usize;
        let total = conversation.messages.len();
        while head.is_some() || offset < total {
            let end = offset.saturating_add(chunk).min(total);
            let (system, tools) = head.take().unwrap_or_default();
            let part = Conversation {
                system,
                tools,
                messages: conversation.messages[offset..end].to_vec(),
            };
            let times = timestamps.get(offset..end.min(timestamps.len())).unwrap_or_default();
            let report = self.import_timed(&part, times).map_err(|error| match error {
                SessionError::Import { item, source } => {
                    let item =
                        match item.strip_prefix("message ").and_then(|n| n.parse::<usize>().ok()) {
                            Some(index) => format!("message {}", index.saturating_add(offset)),
                            None => item,
                        };
                    SessionError::Import { item, source }
                }
                other => other,
            })?;
            offset = end;
            progress(&report, offset);
        }
        Ok(())
    }

    fn import_items(
        &mut self,
        conversation: &Conversation,
        timestamps: &[Option<u64>],
        batch: &mut Batch,
        report: &mut ImportReport,
    ) -> Result<(), SessionError> {
        let failed =
            |item: String| move |source| SessionError::Import { item, source: Box::new(source) };
        if let Some(system) = &conversation.system {
            let prompt = ChatMessage::text(Role::System, system.as_str());
            self.import_one(&prompt, None, batch, report)
                .map_err(failed("system prompt".into()))?;
        }
        let declared: HashSet<String> = self
            .manager
            .messages(ctxwin_core::Level::Permanent)
            .filter(|m| m.is_tool_definition())
            .filter_map(|m| tool_definition_from_json(m.content()).ok())
            .map(|tool| tool.name)
            .collect();
        for tool in conversation.tools.iter().filter(|tool| !declared.contains(&tool.name)) {
            self.add_tool(tool).map_err(failed(format!("tool {:?}", tool.name)))?;
            report.tools += 1;
        }
        for (index, message) in conversation.messages.iter().enumerate() {
            let at = timestamps.get(index).copied().flatten();
            let id = self
                .import_one(message, at, batch, report)
                .map_err(failed(format!("message {index}")))?;
            report.ids.push(id);
        }
        Ok(())
    }

    /// Stores one message in the core and buffers its archive row.
    fn import_one(
        &mut self,
        message: &ChatMessage,
        at: Option<u64>,
        batch: &mut Batch,
        report: &mut ImportReport,
    ) -> Result<u64, SessionError> {
        let head = (message.role == Role::Tool).then(|| self.pending_head().map(|h| h.id()));
        let timestamp = at.unwrap_or_else(now_ms);
        let options = PushOptions { timestamp: Some(timestamp), ..PushOptions::default() };
        self.make_tier_room(message, &options)?;
        let id = match self.push_core(message, &options, timestamp) {
            Err(CoreError::OutboxFull { .. }) => {
                self.flush(batch, report)?;
                self.push_core(message, &options, timestamp)?
            }
            other => other?,
        };
        self.saw_id(id);
        let unit = head.flatten().unwrap_or(id);
        let stored = self.find_record(id);
        let row = match stored {
            Some(stored) => {
                if stored.was_reduced() {
                    report.reduced += 1;
                    report.tokens_saved +=
                        u64::from(stored.original_tokens().saturating_sub(stored.tokens()));
                }
                let mut row = row_from_ref(&stored, unit);
                if stored.content() != message.content {
                    row.original = Some(message.content.clone());
                }
                row
            }
            // Not found only if it left the core at once; keep the message as it came.
            None => ArchivedMessage::new(id, unit, message.clone()).with_timestamp(timestamp),
        };
        let mut row = row;
        row.message.name.clone_from(&message.name);
        row.message.is_error = message.is_error;
        if self.stores.archive.is_some() {
            self.journal.add_rows(&self.scope, self.stores.lease.fence, vec![row]);
            batch.rows += 1;
        }
        batch.ids.insert(id);
        report.stored += 1;
        self.counters.messages_pushed += 1;
        if batch.rows >= FLUSH_ROWS {
            self.flush(batch, report)?;
        }
        Ok(id)
    }

    /// Records the import as one compression event: the tokens it brought in against what the
    /// context holds after it.
    fn record_import_compression(
        &mut self,
        ingested_before: u64,
        report: &ImportReport,
    ) -> Result<(), SessionError> {
        let stats = self.manager.stats();
        if self.stores.archive.is_none() || (report.units_evicted == 0 && report.summaries == 0) {
            return Ok(());
        }
        let brought = stats.counters.tokens_ingested.saturating_sub(ingested_before);
        let mut record = CompressionRecord::new(
            now_ms(),
            brought,
            u64::from(stats.used),
            self.manager.config().strategy.as_str(),
        );
        record.units_evicted = u32::try_from(report.units_evicted).unwrap_or(u32::MAX);
        record.summaries_made = u32::try_from(report.summaries).unwrap_or(u32::MAX);
        self.journal.add_event(&self.scope, self.stores.lease.fence, record);
        self.commit()
    }

    /// Writes what the batch journaled (with the records the core wrote and the summaries),
    /// then releases the outbox.
    fn flush(&mut self, batch: &mut Batch, report: &mut ImportReport) -> Result<(), SessionError> {
        let ids = &batch.ids;
        let after = self.after_op(batch.since, &|id| ids.contains(&id))?;
        report.rows_written += batch.rows;
        batch.rows = 0;
        batch.since = self.tracker.next_id;
        report.units_evicted += after.drained.units.len();
        report.messages_evicted += after.drained.messages;
        report.summaries += after.summaries.len();
        Ok(())
    }
}
