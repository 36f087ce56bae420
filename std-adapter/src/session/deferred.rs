//! Deferred archive writes ([`SessionBuilder::archive_writer`](super::SessionBuilder)): rows
//! handed to a shared [`ArchiveWriter`] instead of committed on the caller's path, and the
//! waits before anything that reads them back.

use super::{Session, SessionError};
use crate::archive::{Archive, ArchiveWriter, ArchivedMessage, Ticket};

/// The writer a session submits its rows to, and the newest ticket it got.
#[derive(Debug)]
pub(super) struct Deferred {
    writer: ArchiveWriter,
    ticket: Ticket,
}

impl Deferred {
    /// The deferred mode of a session archiving to `archive`, when built with a writer: the
    /// writer must write to that same handle (the same connection).
    pub(super) fn for_archive(
        writer: Option<ArchiveWriter>,
        archive: Option<&Archive>,
    ) -> Result<Option<Self>, SessionError> {
        let Some(writer) = writer else { return Ok(None) };
        if !archive.is_some_and(|archive| writer.archive().shares_connection(archive)) {
            return Err(SessionError::Setting(
                "archive_writer needs the session to archive through the writer's own archive handle: drop the later .archive(...)/.archive_in_memory() call, or pass a writer started on the archive given to .archive_shared(...)".into(),
            ));
        }
        Ok(Some(Self { writer, ticket: Ticket::NONE }))
    }
}

impl Session {
    /// Waits until every archive row this session handed to its
    /// [`archive_writer`](super::SessionBuilder::archive_writer) is committed (rows of a failed
    /// write are handed over again first). Rows of an open batch are not handed over before
    /// [`end_batch`](Self::end_batch). Without a writer, rows are committed when written:
    /// this only retries rows a failed write left behind.
    ///
    /// When this returns `Ok`, every row the session wrote so far is in the archive, as
    /// [`Archive::get`] and searches on [`archive`](Self::archive) see it.
    ///
    /// # Errors
    /// [`ArchiveError::DeferredWrite`](crate::archive::ArchiveError::DeferredWrite) when the
    /// writer failed to commit them (they stay queued and are retried: call it again later),
    /// [`ArchiveError::WriterStopped`](crate::archive::ArchiveError::WriterStopped), or a
    /// failed direct write.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchiveWriter};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let archive = Archive::open_in_memory()?;
    /// let writer = ArchiveWriter::spawn(&archive)?;
    /// let mut session = SessionBuilder::new("s").archive_writer(&writer).build()?;
    /// session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
    /// session.sync_archive()?;
    /// assert_eq!(archive.message_count(Some("s"))?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sync_archive(&mut self) -> Result<(), SessionError> {
        self.write_pending_rows()?;
        self.archive_settled()
    }

    /// Waits, writing nothing, until every row queued under this session's name is committed
    /// (also rows an earlier session of the same name queued and could not flush at drop).
    pub(super) fn archive_settled(&self) -> Result<(), SessionError> {
        let Some(deferred) = self.deferred.as_ref() else { return Ok(()) };
        let queued = deferred.writer.pending_ticket(&self.name).unwrap_or(Ticket::NONE);
        deferred.writer.wait(queued.max(deferred.ticket))?;
        Ok(())
    }

    pub(super) fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Hands `rows` to the writer. On failure the rows not queued are kept for the next
    /// operation when `keep` (rows of messages the core holds), dropped otherwise (a
    /// write-ahead whose push then fails).
    pub(super) fn submit_rows(
        &mut self,
        rows: Vec<ArchivedMessage>,
        keep: bool,
    ) -> Result<(), SessionError> {
        let Some(deferred) = self.deferred.as_mut() else { return Ok(()) };
        let count = rows.len() as u64;
        match deferred.writer.submit(&self.name, rows) {
            Ok(ticket) => {
                deferred.ticket = deferred.ticket.max(ticket);
                self.counters.archive_rows_written += count;
                Ok(())
            }
            Err(refused) => {
                if let Some(ticket) = refused.queued {
                    deferred.ticket = deferred.ticket.max(ticket);
                }
                self.counters.archive_rows_written +=
                    count.saturating_sub(refused.rows.len() as u64);
                if keep {
                    tracing::warn!(rows = refused.rows.len(), error = %refused.error, "session: archive writer refused rows; kept for retry");
                    self.pending_rows.extend(refused.rows);
                }
                Err(refused.error.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::archive::{Archive, ArchiveWriter, ArchivedMessage, WriterOptions};
    use crate::session::{RetrievalSettings, SessionBuilder, SessionError};
    use crate::{ChatMessage, ToolCall, core::Role};
    use ctxwin_core::Config;
    use std::time::Duration;

    fn fast(archive: &Archive) -> ArchiveWriter {
        let options = WriterOptions {
            retry_min: Duration::from_millis(2),
            retry_max: Duration::from_millis(20),
            ..WriterOptions::DEFAULT
        };
        ArchiveWriter::spawn_with(archive, options).unwrap()
    }

    /// A request of a conversation: the user's question and the model's answer, sometimes a
    /// tool call with a large result (stored reduced: its row is updated after the push).
    fn request(session: &mut crate::session::Session, turn: usize) {
        session.begin_batch();
        session
            .push(&ChatMessage::text(Role::User, format!("question {turn} about crate_{turn}")))
            .unwrap();
        if turn.is_multiple_of(3) {
            let call = ToolCall::new(format!("c{turn}"), "read", r#"{"path":"x"}"#);
            session.push(&ChatMessage::assistant_calls("", vec![call])).unwrap();
            let output = format!("line of output {turn}\n").repeat(400);
            session.push(&ChatMessage::tool_result(format!("c{turn}"), output)).unwrap();
        }
        session.push(&ChatMessage::text(Role::Assistant, format!("answer {turn}"))).unwrap();
        session.end_batch().unwrap();
    }

    fn rows(archive: &Archive, name: &str) -> Vec<ArchivedMessage> {
        archive
            .recent(name, 100_000)
            .unwrap()
            .into_iter()
            .map(|mut row| {
                row.timestamp = 0;
                row
            })
            .collect()
    }

    fn small() -> Config {
        Config { max_messages: 12, locked_tail: 2, ..Config::DEFAULT }
    }

    #[test]
    fn deferred_sessions_archive_what_direct_ones_do() {
        let direct = Archive::open_in_memory().unwrap();
        let deferred = Archive::open_in_memory().unwrap();
        let writer = fast(&deferred);
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let (direct, writer) = (direct.clone(), writer.clone());
                std::thread::spawn(move || {
                    let names: Vec<String> = (0..3).map(|i| format!("t{thread}-{i}")).collect();
                    let mut plain: Vec<_> = names
                        .iter()
                        .map(|n| {
                            SessionBuilder::new(n)
                                .config(small())
                                .archive_shared(&direct)
                                .build()
                                .unwrap()
                        })
                        .collect();
                    let mut queued: Vec<_> = names
                        .iter()
                        .map(|n| {
                            SessionBuilder::new(n)
                                .config(small())
                                .archive_writer(&writer)
                                .build()
                                .unwrap()
                        })
                        .collect();
                    for turn in 0..10 {
                        for (a, b) in plain.iter_mut().zip(queued.iter_mut()) {
                            request(a, turn);
                            request(b, turn);
                        }
                    }
                    for session in &mut queued {
                        session.sync_archive().unwrap();
                    }
                    names
                })
            })
            .collect();
        for thread in threads {
            for name in thread.join().unwrap() {
                let expected = rows(&direct, &name);
                assert!(expected.len() > 20, "{name}: {}", expected.len());
                assert_eq!(rows(&deferred, &name), expected, "{name}");
            }
        }
        let stats = writer.stats();
        assert!(stats.transactions < stats.submissions, "{stats:?}");
    }

    #[test]
    fn rows_are_queued_not_written_until_synced() {
        let archive = Archive::open_in_memory().unwrap();
        let writer = fast(&archive);
        let mut session = SessionBuilder::new("s").archive_writer(&writer).build().unwrap();
        let held = archive.clone();
        // Hold the writer off the connection: the push must not wait for it.
        let guard = held.conn_for_tests();
        session.push(&ChatMessage::text(Role::User, "queued")).unwrap();
        assert_eq!(writer.stats().queued_rows, 1);
        drop(guard);
        session.sync_archive().unwrap();
        assert_eq!(archive.message_count(Some("s")).unwrap(), 1);
        assert_eq!(session.stats().unwrap().archive.unwrap().messages, 1);
    }

    #[test]
    fn checkpoint_after_deferred_pushes_restores_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path().join("a.db")).unwrap();
        let writer = fast(&archive);
        let build = || {
            SessionBuilder::new("s")
                .config(small())
                .archive_writer(&writer)
                .checkpoints(dir.path().join("ckpt"))
                .checkpoint_interval_messages(0)
                .restore_latest(true)
        };
        let mut session = build().build().unwrap();
        for turn in 0..10 {
            request(&mut session, turn);
        }
        let guard = archive.conn_for_tests();
        let expected_next = session.manager().next_id();
        let (waited, checkpoint) = std::thread::scope(|scope| {
            let saving = scope.spawn(|| session.checkpoint());
            std::thread::sleep(Duration::from_millis(30));
            let waited = !saving.is_finished();
            drop(guard);
            (waited, saving.join().unwrap())
        });
        // The checkpoint waited for the queued rows, which waited for the connection.
        assert!(waited);
        checkpoint.unwrap();
        let before = rows(&archive, "s");
        assert_eq!(before.last().map(|row| row.id), Some(expected_next - 1));
        drop(session);
        let restored = build().build().unwrap();
        assert_eq!(restored.manager().next_id(), expected_next);
        assert_eq!(rows(restored.archive().unwrap(), "s"), before);
    }

    #[test]
    fn compose_recalls_rows_pushed_just_before() {
        let archive = Archive::open_in_memory().unwrap();
        let writer = fast(&archive);
        let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
        let mut session =
            SessionBuilder::new("s").config(config).archive_writer(&writer).build().unwrap();
        let guard = archive.conn_for_tests();
        session
            .push(&ChatMessage::text(Role::User, "The staging database is Postgres 16."))
            .unwrap();
        for turn in 0..3 {
            session.push(&ChatMessage::text(Role::User, format!("turn {turn}"))).unwrap();
        }
        assert!(writer.stats().queued_rows > 0);
        let composing = std::thread::scope(|scope| {
            let composing =
                scope.spawn(|| session.compose_recall(&[], Some("which postgres version")));
            std::thread::sleep(Duration::from_millis(20));
            drop(guard);
            composing.join().unwrap()
        });
        let payload = composing.unwrap();
        assert_eq!(payload.recall.ids, [1, 2]);
        assert!(payload.conversation.messages[0].content.contains("Postgres 16"));
    }

    #[test]
    fn vectors_catch_up_on_rows_just_pushed() {
        struct Length;
        impl crate::embed::Embedder for Length {
            fn model(&self) -> &str {
                "length"
            }
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
                Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect())
            }
        }
        let archive = Archive::open_in_memory().unwrap();
        let writer = fast(&archive);
        let mut session = SessionBuilder::new("s")
            .archive_writer(&writer)
            .embedder(std::sync::Arc::new(Length))
            .build()
            .unwrap();
        let guard = archive.conn_for_tests();
        for text in ["one", "two", "three"] {
            session.push(&ChatMessage::text(Role::User, text)).unwrap();
        }
        let synced = std::thread::scope(|scope| {
            let syncing = scope.spawn(|| session.sync_vectors());
            std::thread::sleep(Duration::from_millis(20));
            drop(guard);
            syncing.join().unwrap()
        });
        assert_eq!(synced.unwrap(), 3);
        assert_eq!(session.semantic_stats().unwrap().vectors, 3);
    }

    #[test]
    fn compose_without_retrieval_does_not_wait() {
        let archive = Archive::open_in_memory().unwrap();
        let writer = fast(&archive);
        let off = RetrievalSettings { auto: false, ..RetrievalSettings::DEFAULT };
        let mut session =
            SessionBuilder::new("s").archive_writer(&writer).retrieval(off).build().unwrap();
        let guard = archive.conn_for_tests();
        session.push(&ChatMessage::text(Role::User, "hello")).unwrap();
        // The writer is held off the connection: a compose that waited would not finish.
        let (finished, payload) = std::thread::scope(|scope| {
            let composing = scope.spawn(|| session.compose(&[]));
            let started = std::time::Instant::now();
            while !composing.is_finished() && started.elapsed() < Duration::from_millis(500) {
                std::thread::sleep(Duration::from_millis(2));
            }
            let finished = composing.is_finished();
            drop(guard);
            (finished, composing.join().unwrap())
        });
        assert!(finished, "compose without retrieval waited for the writer");
        assert_eq!(payload.unwrap().conversation.messages.len(), 1);
    }

    #[test]
    fn a_failed_commit_is_reported_and_retried() {
        let archive = Archive::open_in_memory().unwrap();
        archive.fail_writes_for_tests("disk on fire");
        let writer = fast(&archive);
        let dir = tempfile::tempdir().unwrap();
        let mut session = SessionBuilder::new("s")
            .archive_writer(&writer)
            .checkpoints(dir.path())
            .build()
            .unwrap();
        session.push(&ChatMessage::text(Role::User, "kept")).unwrap();
        let error = session.checkpoint().unwrap_err();
        assert!(error.to_string().contains("disk on fire"), "{error}");
        assert!(session.checkpoints().unwrap().is_empty(), "no checkpoint over uncommitted rows");
        archive.heal_writes_for_tests();
        session.checkpoint().unwrap();
        assert_eq!(archive.message_count(Some("s")).unwrap(), 1);
    }

    #[test]
    fn drop_flushes_the_session_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let archive = Archive::open(&path).unwrap();
        let writer = fast(&archive);
        let mut session = SessionBuilder::new("s").archive_writer(&writer).build().unwrap();
        session.begin_batch();
        session.push(&ChatMessage::text(Role::User, "kept")).unwrap();
        let guard = archive.conn_for_tests();
        let waited = std::thread::scope(|scope| {
            let dropping = scope.spawn(move || drop(session));
            std::thread::sleep(Duration::from_millis(20));
            let waited = !dropping.is_finished();
            drop(guard);
            waited
        });
        assert!(waited, "the drop returned before its rows were committed");
        assert_eq!(writer.pending_ticket("s"), None);
        assert_eq!(archive.message_count(Some("s")).unwrap(), 1);
    }

    #[test]
    fn the_writer_must_write_the_session_archive() {
        let archive = Archive::open_in_memory().unwrap();
        let writer = fast(&archive);
        let other = SessionBuilder::new("s").archive_writer(&writer).archive_in_memory().build();
        assert!(matches!(other, Err(SessionError::Setting(_))));
        let same =
            SessionBuilder::new("s").archive_shared(&archive).archive_writer(&writer).build();
        assert!(same.is_ok());
    }
}
