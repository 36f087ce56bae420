//! [`Session::forget`]: a message's text out of the window, the archive (index included) and
//! every checkpoint.
//!
//! The core keeps text in fixed rings; a forgotten text is overwritten there in place by a
//! marker of the same byte length (`[forgotten]` padded with `_`, or `*` when shorter), so the
//! message keeps its id, role, unit and token count, and the core state is rebuilt from its
//! masked snapshot. Checkpoints get the same mask through the sink's
//! [`rewrite`](crate::store::CheckpointSink::rewrite) (the core snapshot's CRC recomputed, each
//! replaced atomically). The archive replaces the text with
//! [`FORGOTTEN`](crate::store::FORGOTTEN) through [`forget`](crate::store::ArchiveStore::forget),
//! and leaves no byte of it behind.

use super::persist::HEADER_LEN;
use super::{Session, SessionError};
use crate::store::{Forget, Forgotten};

/// Offset of the core snapshot in a session checkpoint payload, and of its length field.
const CORE_AT: usize = HEADER_LEN;

/// What [`Session::forget`] and [`Session::forget_matching`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForgetReport {
    /// Archived messages and summaries that held the text.
    pub archive: Forgotten,
    /// Whether the window (the core) held it.
    pub in_window: bool,
    /// Checkpoint files rewritten.
    pub checkpoints_rewritten: usize,
}

/// The same-length marker for `len` bytes.
fn marker(len: usize) -> Vec<u8> {
    let label = b"[forgotten]";
    if len < label.len() {
        return vec![b'*'; len];
    }
    let mut out = label.to_vec();
    out.resize(len, b'_');
    out
}

/// Overwrites every occurrence of each needle in `bytes`; how many it found.
fn mask(bytes: &mut [u8], needles: &[&[u8]]) -> usize {
    let mut found = 0;
    for needle in needles.iter().filter(|n| !n.is_empty()) {
        let cover = marker(needle.len());
        let mut at = 0;
        while at + needle.len() <= bytes.len() {
            if bytes.get(at..at + needle.len()) == Some(*needle) {
                if let Some(slot) = bytes.get_mut(at..at + needle.len()) {
                    slot.copy_from_slice(&cover);
                }
                found += 1;
                at += needle.len();
            } else {
                at += 1;
            }
        }
    }
    found
}

/// Rewrites a core snapshot's trailing CRC-32 (over every byte before it).
fn reseal_snapshot(core: &mut [u8]) {
    let Some(body) = core.len().checked_sub(4) else { return };
    let crc = crc32fast::hash(core.get(..body).unwrap_or_default());
    if let Some(trailer) = core.get_mut(body..) {
        trailer.copy_from_slice(&crc.to_le_bytes());
    }
}

/// A checkpoint's bytes with every needle masked (`None` when it held none): a session
/// payload's core snapshot is resealed (its CRC recomputed); other bytes (a damaged
/// checkpoint's, stored as they are) are only masked.
fn mask_checkpoint(bytes: &[u8], needles: &[&[u8]]) -> Option<Vec<u8>> {
    let mut masked = bytes.to_vec();
    if mask(&mut masked, needles) == 0 {
        return None;
    }
    if masked.starts_with(b"CWSESS") {
        let core_len = masked
            .get(8..CORE_AT)
            .and_then(|b| b.try_into().ok())
            .map_or(0, |b: [u8; 4]| u32::from_le_bytes(b) as usize);
        if let Some(core) = masked.get_mut(CORE_AT..CORE_AT + core_len) {
            reseal_snapshot(core);
        }
    }
    Some(masked)
}

impl Session {
    /// Forgets message `id`: its text leaves the window (a same-length `[forgotten]` marker
    /// takes its place, keeping its role and unit), the archive (its index included)
    /// and every checkpoint; summaries that stand for it or quote it are scrubbed and listed
    /// for rewrite.
    ///
    /// # Errors
    /// [`SessionError::Setting`] when no message `id` is known; archive, snapshot and I/O
    /// errors.
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role, session::SessionBuilder};
    /// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
    /// let id = session.push(&ChatMessage::text(Role::User, "my PIN is 4417, keep it"))?.id;
    /// let report = session.forget(id)?;
    /// assert!(report.in_window && report.archive.messages == [id]);
    /// assert!(!session.manager().get(id).unwrap().content().contains("4417"));
    /// let query = ctxwin_std::store::SearchQuery::new("4417", 5);
    /// assert!(session.archive().unwrap().search(session.scope(), &query)?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forget(&mut self, id: u64) -> Result<ForgetReport, SessionError> {
        self.serving(true, |session| session.forget_once(id))
    }

    fn forget_once(&mut self, id: u64) -> Result<ForgetReport, SessionError> {
        self.sync_archive()?;
        let mut texts: Vec<String> = Vec::new();
        if let Some(message) = self.manager.get(id) {
            texts.push(message.content().to_string());
        }
        if let Some(archive) = self.stores.archive.as_deref()
            && let Some(row) = archive.get(&self.scope, id)?
        {
            texts.push(row.message.content.clone());
            texts.extend(row.original.clone());
        }
        texts.retain(|t| !t.is_empty());
        texts.sort();
        texts.dedup();
        if texts.is_empty() {
            return Err(SessionError::Setting(format!("no message {id} to forget")));
        }
        self.forget_texts(&[id], &texts)
    }

    /// Forgets every occurrence of `text` (exact bytes): in the window, the archive and every
    /// checkpoint, as [`forget`](Self::forget) does for one message.
    ///
    /// # Errors
    /// [`SessionError::Setting`] for an empty `text`; archive, snapshot and I/O errors.
    pub fn forget_matching(&mut self, text: &str) -> Result<ForgetReport, SessionError> {
        if text.is_empty() {
            return Err(SessionError::Setting("nothing to forget: the text is empty".into()));
        }
        self.serving(true, |session| {
            session.sync_archive()?;
            session.forget_texts(&[], &[text.to_string()])
        })
    }

    /// Sets entity `key` to `value` (or deletes its value with `None`) and forgets the old
    /// value as [`forget_matching`](Self::forget_matching) does: out of the window, the archive
    /// and every checkpoint. A new value that contains the old one keeps it, of course. With a
    /// checkpoint store, a checkpoint holding the new value is written before it returns.
    ///
    /// # Errors
    /// [`SessionError::Setting`] for an undeclared key or a value too long for the table;
    /// as [`forget_matching`](Self::forget_matching).
    ///
    /// ```
    /// use ctxwin_core::{Config, EntitySchema};
    /// use ctxwin_std::session::SessionBuilder;
    /// let config = Config { entity_schema: EntitySchema::new(&["card"]).unwrap(), ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// session.update_entity("card", Some("4111-2222"))?;
    /// session.update_entity("card", None)?;
    /// assert_eq!(session.manager().entities().get("card"), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn update_entity(
        &mut self,
        key: &str,
        value: Option<&str>,
    ) -> Result<ForgetReport, SessionError> {
        self.serving(true, |session| session.update_entity_once(key, value))
    }

    fn update_entity_once(
        &mut self,
        key: &str,
        value: Option<&str>,
    ) -> Result<ForgetReport, SessionError> {
        let old = self.manager.entities().get(key).map(str::to_string);
        self.manager
            .set_entity(key, value)
            .map_err(|e| SessionError::Setting(format!("entity {key:?}: {e}")))?;
        let report = match old {
            Some(old) if !old.is_empty() && !value.is_some_and(|v| v.contains(old.as_str())) => {
                self.sync_archive()?;
                self.forget_texts(&[], &[old])?
            }
            _ => ForgetReport::default(),
        };
        // The rewritten checkpoints hold the old value masked, not the new one: the newest
        // checkpoint must carry the update, or a restart would bring back the mask.
        if self.stores.checkpoints.is_some() {
            self.checkpoint_once()?;
        }
        Ok(report)
    }

    fn forget_texts(
        &mut self,
        ids: &[u64],
        texts: &[String],
    ) -> Result<ForgetReport, SessionError> {
        let needles: Vec<&[u8]> = texts.iter().map(String::as_bytes).collect();
        // Masked text in the window is not what the rows after the checkpoint replay to.
        self.stores.lease.changed();
        // The window: mask the snapshot, restore from it.
        let mut core = vec![0u8; self.manager.snapshot_len()];
        let len = self.manager.snapshot_into(&mut core).map_err(SessionError::Snapshot)?.len();
        core.truncate(len);
        let in_window = mask(&mut core, &needles) > 0;
        if in_window {
            reseal_snapshot(&mut core);
            self.manager.restore_from(&core).map_err(SessionError::Snapshot)?;
        }
        // Under a lease the masked window is checkpointed before the archive changes: the
        // newest checkpoint is then not the one another instance's state continues from, so
        // that instance restores it instead of resuming on a state holding the text
        // ([`Session::reload`]). A failed checkpoint forgets nothing.
        if self.leased() && self.stores.checkpoints.is_some() {
            self.checkpoint_once()?;
        }
        let strs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let fence = self.stores.lease.fence;
        let archive = match self.stores.archive.as_deref() {
            Some(archive) => archive.forget(&self.scope, fence, &Forget { ids, texts: &strs })?,
            None => Forgotten::default(),
        };
        if let Some(index) = self.recall.semantic.as_mut() {
            index.remove(&archive.messages);
        }
        let checkpoints_rewritten = match self.stores.checkpoints.as_deref() {
            Some(sink) => {
                sink.rewrite(&self.scope, fence, &|bytes| mask_checkpoint(bytes, &needles))?
            }
            None => 0,
        };
        tracing::info!(scope = %self.scope, in_window, checkpoints_rewritten, "session: forgot");
        Ok(ForgetReport { archive, in_window, checkpoints_rewritten })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "sqlite")]
    use crate::message::ChatMessage;
    #[cfg(feature = "sqlite")]
    use crate::session::SessionBuilder;
    #[cfg(feature = "sqlite")]
    use ctxwin_core::{Config, EntitySchema, Role};

    #[cfg(feature = "sqlite")]
    fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(files_holding(&path, needle));
            } else if std::fs::read(&path).unwrap().windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
        found
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn a_deleted_entity_value_leaves_no_byte_on_disk() {
        let secret = "4111-9876-5432-1001";
        let dir = tempfile::tempdir().unwrap();
        let config =
            Config { entity_schema: EntitySchema::new(&["card"]).unwrap(), ..Config::DEFAULT };
        let mut session = SessionBuilder::new("s")
            .config(config)
            .archive(dir.path().join("archive.db"))
            .checkpoints(dir.path().join("checkpoints"))
            .build()
            .unwrap();
        session.push(&ChatMessage::text(Role::User, format!("my card is {secret}"))).unwrap();
        session.update_entity("card", Some(secret)).unwrap();
        session.checkpoint().unwrap();
        session.update_entity("card", Some("4111-0000-0000-0000")).unwrap();
        session.checkpoint().unwrap();
        assert!(files_holding(dir.path(), secret.as_bytes()).is_empty());
        assert_eq!(session.manager().entities().get("card"), Some("4111-0000-0000-0000"));
        session.update_entity("card", None).unwrap();
        assert!(files_holding(dir.path(), b"4111-0000-0000-0000").is_empty());
        assert_eq!(session.manager().entities().get("card"), None);
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn forgetting_before_the_first_checkpoint_finds_no_directory_and_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoints = dir.path().join("checkpoints");
        let mut session = SessionBuilder::new("s")
            .archive(dir.path().join("archive.db"))
            .checkpoints(&checkpoints)
            .build()
            .unwrap();
        session.push(&ChatMessage::text(Role::User, "token sk-live-123")).unwrap();
        let report = session.forget_matching("sk-live-123").unwrap();
        assert_eq!((report.in_window, report.checkpoints_rewritten), (true, 0));
        assert!(!checkpoints.exists());
    }

    #[test]
    fn masks_keep_lengths() {
        let mut bytes = b"a secret-token-123 and secret-token-123".to_vec();
        assert_eq!(mask(&mut bytes, &[b"secret-token-123"]), 2);
        assert_eq!(bytes, b"a [forgotten]_____ and [forgotten]_____".to_vec());
        let mut short = b"pin 42!".to_vec();
        mask(&mut short, &[b"42"]);
        assert_eq!(short, b"pin **!".to_vec());
    }
}
