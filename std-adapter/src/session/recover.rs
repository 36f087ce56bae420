//! Rebuilding a session from its archive, for when no checkpoint restores (or none may be
//! trusted): every archived message is pushed again, in id order, into a fresh context, and
//! one checkpoint is written.

use super::{Session, SessionError};
use crate::archive::{Archive, ArchivedMessage};
use crate::checkpoint::{CheckpointId, clock};
use crate::message::{ChatMessage, Conversation};

/// Where [`take_for_recovery`] found the messages to rebuild from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySource {
    /// The messages, oldest id first, with their full text.
    pub messages: Vec<ArchivedMessage>,
    /// The archive session they were read from.
    pub from: String,
    /// The side session that keeps them as they were (`<name>@recovered-<time>`).
    pub kept_in: String,
}

/// The prefix of the side sessions [`take_for_recovery`] makes.
fn recovered_prefix(session: &str) -> String {
    format!("{session}@recovered-")
}

/// Takes the archived messages of `session` out of its way so that it can be rebuilt: they are
/// copied to the side session `<session>@recovered-<time>` and removed from `session`. When
/// `session` has none (a recovery interrupted after this step), the newest such side session
/// is the source again, so running a recovery twice loses nothing.
///
/// # Errors
/// Archive errors.
///
/// ```
/// use ctxwin_std::archive::{Archive, ArchivedMessage};
/// use ctxwin_std::session::take_for_recovery;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut archive = Archive::open_in_memory()?;
/// archive.store_unit("s", &[ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
/// let source = take_for_recovery(&mut archive, "s")?;
/// assert_eq!(source.messages.len(), 1);
/// assert_eq!(archive.message_count(Some("s"))?, 0);
/// assert_eq!(take_for_recovery(&mut archive, "s")?.messages.len(), 1, "a second run finds them");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn take_for_recovery(
    archive: &mut Archive,
    session: &str,
) -> Result<RecoverySource, SessionError> {
    let own = archive.all_messages(session)?;
    if own.is_empty() {
        let prefix = recovered_prefix(session);
        if let Some(side) = archive.session_names(&prefix)?.into_iter().max() {
            let messages = archive.all_messages(&side)?;
            return Ok(RecoverySource { messages, from: side.clone(), kept_in: side });
        }
        return Ok(RecoverySource {
            messages: Vec::new(),
            from: session.to_string(),
            kept_in: String::new(),
        });
    }
    let micros =
        clock::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_micros());
    let side = format!("{}{micros:020}", recovered_prefix(session));
    archive.store_messages(&side, &own)?;
    archive.delete_from(session, 0)?;
    Ok(RecoverySource { messages: own, from: session.to_string(), kept_in: side })
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
