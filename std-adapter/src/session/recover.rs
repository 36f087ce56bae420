//! Rebuilding a session from its archive, for when no checkpoint restores (or none may be
//! trusted): every archived message is pushed again, in id order, into a fresh context, and
//! one checkpoint is written.

use super::{Session, SessionError};
use crate::message::{ChatMessage, Conversation};
use crate::store::checkpoint::clock;
use crate::store::{ArchiveStore, ArchivedMessage, CheckpointId, Fence, Scope};

/// Where [`take_for_recovery`] found the messages to rebuild from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySource {
    /// The messages, oldest id first, with their full text.
    pub messages: Vec<ArchivedMessage>,
    /// The conversation they were read from.
    pub from: String,
    /// The side conversation (same tenant) that keeps them as they were
    /// (`<name>@recovered-<time>`).
    pub kept_in: String,
}

/// The prefix of the side sessions [`take_for_recovery`] makes.
fn recovered_prefix(session: &str) -> String {
    format!("{session}@recovered-")
}

/// Every row of `scope`, oldest first.
fn all_rows(
    archive: &dyn ArchiveStore,
    scope: &Scope,
) -> Result<Vec<ArchivedMessage>, SessionError> {
    const PAGE: usize = 5_000;
    let mut rows: Vec<ArchivedMessage> = Vec::new();
    loop {
        let after = rows.last().map_or(0, |row| row.id);
        let page = archive.rows_after(scope, after, PAGE)?;
        let done = page.len() < PAGE;
        rows.extend(page);
        if done {
            return Ok(rows);
        }
    }
}

/// Takes the archived messages of `scope` out of its way so that it can be rebuilt: they are
/// copied to the side conversation `<conversation>@recovered-<time>` of the same tenant and
/// removed from `scope`. When `scope` has none (a recovery interrupted after this step), the
/// newest such side conversation is the source again, so running a recovery twice loses
/// nothing.
///
/// # Errors
/// Archive errors.
///
/// ```
/// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Fence, MemoryStore, Scope};
/// use ctxwin_std::session::take_for_recovery;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let archive = MemoryStore::new();
/// let s = Scope::local("s");
/// archive.put(&s, Fence::NONE, &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
/// let source = take_for_recovery(&archive, &s)?;
/// assert_eq!(source.messages.len(), 1);
/// assert_eq!(archive.usage(&s)?.messages, 0);
/// assert_eq!(take_for_recovery(&archive, &s)?.messages.len(), 1, "a second run finds them");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn take_for_recovery(
    archive: &dyn ArchiveStore,
    scope: &Scope,
) -> Result<RecoverySource, SessionError> {
    let own = all_rows(archive, scope)?;
    if own.is_empty() {
        let prefix = recovered_prefix(&scope.conversation);
        if let Some(side) = archive.conversations(&scope.tenant, &prefix)?.into_iter().max() {
            let messages = all_rows(archive, &scope.sibling(side.as_str()))?;
            return Ok(RecoverySource { messages, from: side.clone(), kept_in: side });
        }
        return Ok(RecoverySource {
            messages: Vec::new(),
            from: scope.conversation.clone(),
            kept_in: String::new(),
        });
    }
    let micros =
        clock::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_micros());
    let side = format!("{}{micros:020}", recovered_prefix(&scope.conversation));
    archive.put(&scope.sibling(side.as_str()), Fence::NONE, &own)?;
    archive.flush(&scope.sibling(side.as_str()))?;
    archive.delete_from(scope, Fence::NONE, 0)?;
    Ok(RecoverySource { messages: own, from: scope.conversation.clone(), kept_in: side })
}

impl Session {
    /// Pushes `messages` (as [`take_for_recovery`] returns them) into this session, which must
    /// be empty, all or nothing, and writes one checkpoint: the state the archive describes.
    /// Each message comes back with its full text; tool definitions and summaries are not
    /// archived as messages and are not restored (the summaries are made again as the
    /// context fills).
    ///
    /// # Errors
    /// [`SessionError::Setting`] when the session already holds messages; as
    /// [`import_atomic`](Self::import_atomic).
    pub fn recover_from(
        &mut self,
        messages: &[ArchivedMessage],
    ) -> Result<CheckpointId, SessionError> {
        if self.manager.history().next().is_some() {
            return Err(SessionError::Setting(
                "recovery rebuilds an empty session; this one holds messages".into(),
            ));
        }
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|row| {
                let mut message = row.message.clone();
                if let Some(original) = &row.original {
                    message.content.clone_from(original);
                }
                message
            })
            .collect();
        let conversation = Conversation { messages, ..Conversation::default() };
        self.import_atomic(&conversation, 500, |_, _| {})
    }
}
