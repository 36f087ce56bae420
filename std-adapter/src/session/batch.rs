//! Archive batches: the rows of several pushes written in one SQLite transaction.

use super::{Session, SessionError};
use crate::archive::ArchivedMessage;

impl Session {
    /// Starts an archive batch: until [`end_batch`](Self::end_batch), the rows pushes write
    /// (written ahead, updated, evicted units) are kept in order and then written in one
    /// transaction, instead of one transaction or more per message.
    ///
    /// A transaction costs much more than the rows in it (the WAL frames of every page it
    /// touches, the full-text index's segment): a caller taking several messages at once
    /// (a proxy request, an answer with the next question) pays it once.
    ///
    /// Nothing of the batch is acknowledged before [`end_batch`](Self::end_batch) returns:
    /// the pushes of a batch write the core and the batch's rows, both in memory, and a row
    /// whose write fails stays queued as after any failed write (written before anything else
    /// by the next operation, and before any checkpoint). [`checkpoint`](Self::checkpoint),
    /// [`restore`](Self::restore) and the `forget` calls end a batch first, and so does
    /// dropping the session.
    /// Retrieval reads the archive: end the batch before composing. Without an archive, or
    /// with LLM summaries (their worker reads sources from the archive at once), there is
    /// nothing to batch and rows are written as usual.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// session.begin_batch();
    /// session.push(&ChatMessage::text(Role::User, "Is the build green?"))?;
    /// session.push(&ChatMessage::text(Role::Assistant, "Yes."))?;
    /// assert_eq!(session.archive().unwrap().message_count(Some("s"))?, 0);
    /// session.end_batch()?;
    /// assert_eq!(session.archive().unwrap().message_count(Some("s"))?, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn begin_batch(&mut self) {
        if self.archive.is_some() && self.llm.is_none() && self.batch.is_none() {
            self.batch = Some(Vec::new());
        }
    }

    /// Ends an archive batch ([`begin_batch`](Self::begin_batch)): writes its rows in one
    /// transaction, or, with an [`archive_writer`](super::SessionBuilder::archive_writer),
    /// hands them to the writer without waiting for their commit
    /// ([`sync_archive`](Self::sync_archive) waits). Does nothing outside a batch.
    ///
    /// # Errors
    /// Archive errors; the rows then stay queued for the next operation.
    ///
    /// ```
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.end_batch()?;
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn end_batch(&mut self) -> Result<(), SessionError> {
        match self.batch.take() {
            Some(rows) => self.write_rows(rows),
            None => Ok(()),
        }
    }

    /// Keeps `rows` in the open batch; hands them back when there is none.
    pub(super) fn batched(&mut self, rows: Vec<ArchivedMessage>) -> Option<Vec<ArchivedMessage>> {
        match self.batch.as_mut() {
            Some(batch) => {
                batch.extend(rows);
                None
            }
            None => Some(rows),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Err(error) = self.end_batch() {
            tracing::error!(session = %self.name, %error, "session: batch rows lost at drop");
        }
        if self.is_deferred()
            && let Err(error) = self.sync_archive()
        {
            tracing::error!(session = %self.name, %error, "session: archive rows not committed at drop (still queued in the writer, which keeps retrying)");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::session::SessionBuilder;
    use crate::{ChatMessage, core::Role};

    #[test]
    fn a_batch_writes_what_single_pushes_write() {
        let texts = ["one", "two", "three"];
        let mut single = SessionBuilder::new("s").archive_in_memory().build().unwrap();
        let mut batched = SessionBuilder::new("s").archive_in_memory().build().unwrap();
        batched.begin_batch();
        for text in texts {
            single.push(&ChatMessage::text(Role::User, text)).unwrap();
            batched.push(&ChatMessage::text(Role::User, text)).unwrap();
        }
        batched.end_batch().unwrap();
        let rows = |s: &crate::session::Session| {
            s.archive()
                .unwrap()
                .recent("s", 10)
                .unwrap()
                .into_iter()
                .map(|mut m| {
                    m.timestamp = 0;
                    m
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(rows(&single), rows(&batched));
        assert_eq!(rows(&batched).len(), 3);
    }

    #[test]
    fn a_dropped_session_writes_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive.db");
        let mut session = SessionBuilder::new("s").archive(&path).build().unwrap();
        session.begin_batch();
        session.push(&ChatMessage::text(Role::User, "kept")).unwrap();
        drop(session);
        let archive = crate::archive::Archive::open(&path).unwrap();
        assert_eq!(archive.message_count(Some("s")).unwrap(), 1);
    }
}
