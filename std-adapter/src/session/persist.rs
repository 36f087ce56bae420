//! Checkpoints: the core's snapshot plus the session's own state, saved in the checkpoint
//! store and restored from it.
//!
//! A session checkpoint's payload (inside the store's CRC-checked frame) is:
//!
//! | bytes | field |
//! |---|---|
//! | 6 | magic `CWSESS` |
//! | 2 | version, little-endian (1) |
//! | 4 | length `n` of the core snapshot, little-endian |
//! | `n` | the core snapshot (`core/SNAPSHOT.md`) |
//! | rest | the session state as JSON: name, id tracking, calibrator, counters |

use ctxwin_core::SnapshotError;
use serde::{Deserialize, Serialize};

use super::report::RestoreReport;
use super::stats::SessionCounters;
use super::sync::Tracker;
use super::tier::SessionManager;
use super::{Session, SessionError};
use crate::archive::ArchiveError;
use crate::checkpoint::{CheckpointId, CheckpointInfo};
use crate::tokens::Calibrator;

const MAGIC: &[u8; 6] = b"CWSESS";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 12;

/// Which checkpoint [`Session::restore`] goes back to.
///
/// ```
/// use ctxwin_std::session::RestorePoint;
/// assert_eq!(RestorePoint::default(), RestorePoint::Latest);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RestorePoint {
    /// The newest checkpoint that restores; damaged or foreign files are skipped.
    #[default]
    Latest,
    /// This checkpoint.
    Id(CheckpointId),
}

/// The session's state besides the core, as kept in a checkpoint.
#[derive(Debug, Serialize, Deserialize)]
struct SessionState {
    session: String,
    tracker: Tracker,
    calibrator: Calibrator,
    counters: SessionCounters,
    /// The archive the checkpoint was written with (absent in checkpoints of older builds and
    /// of sessions without an archive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    archive: Option<ArchiveBinding>,
}

/// What a checkpoint knows of its archive: which one it is, and the highest message id the
/// checkpoint covers (every id up to it that the session archived must be there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ArchiveBinding {
    identity: String,
    covered: u64,
}

fn encode(core: &[u8], state: &SessionState) -> Result<Vec<u8>, SessionError> {
    let json = serde_json::to_vec(state)
        .map_err(|e| SessionError::Setting(format!("session state does not serialize: {e}")))?;
    let core_len = u32::try_from(core.len())
        .map_err(|_| SessionError::Setting("snapshot over 4 GiB".into()))?;
    let mut payload = Vec::with_capacity(HEADER_LEN + core.len() + json.len());
    payload.extend_from_slice(MAGIC);
    payload.extend_from_slice(&VERSION.to_le_bytes());
    payload.extend_from_slice(&core_len.to_le_bytes());
    payload.extend_from_slice(core);
    payload.extend_from_slice(&json);
    Ok(payload)
}

/// Splits a payload into the core snapshot and the session state.
fn decode(payload: &[u8]) -> Result<(&[u8], SessionState), String> {
    let header = payload.get(..HEADER_LEN).ok_or("shorter than its header")?;
    if header.get(..6) != Some(&MAGIC[..]) {
        return Err("not a session checkpoint (bad magic)".into());
    }
    let version = u16::from_le_bytes([header[6], header[7]]);
    if version != VERSION {
        return Err(format!("session checkpoint version {version}, this build reads {VERSION}"));
    }
    let core_len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let end = HEADER_LEN.checked_add(core_len).ok_or("length overflows")?;
    let core = payload.get(HEADER_LEN..end).ok_or("core snapshot cut short")?;
    let state = payload.get(end..).ok_or("session state missing")?;
    let state = serde_json::from_slice(state).map_err(|e| format!("session state: {e}"))?;
    Ok((core, state))
}

impl Session {
    /// Writes a checkpoint now: the core's whole state and the session's (calibration, id
    /// tracking, counters). Units waiting in the outbox are archived first.
    ///
    /// # Errors
    /// [`SessionError::NoCheckpoints`] without a store; store and archive errors.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let dir = tempfile::tempdir()?;
    /// let mut session = SessionBuilder::new("s").checkpoints(dir.path()).build()?;
    /// let id = session.checkpoint()?;
    /// assert_eq!(session.checkpoints()?[0].id, id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint(&mut self) -> Result<CheckpointId, SessionError> {
        if self.store.is_none() {
            return Err(SessionError::NoCheckpoints { operation: "checkpoint" });
        }
        self.end_batch()?;
        self.after_op(self.tracker.next_id, &|_| false)?;
        // Never a checkpoint over rows still queued: a restore after a crash relies on them.
        self.sync_archive()?;
        let mut core = vec![0u8; self.manager.snapshot_len()];
        let len = self.manager.snapshot_into(&mut core).map_err(SessionError::Snapshot)?.len();
        core.truncate(len);
        let next = self.manager.next_id();
        if next != self.tracker.next_id {
            tracing::warn!(
                tracked = self.tracker.next_id,
                next,
                "session: id tracking corrected from the snapshot"
            );
            self.tracker.next_id = next;
        }
        let archive = self.archive_binding()?;
        self.counters.checkpoints_written += 1;
        let state = SessionState {
            session: self.name.clone(),
            tracker: self.tracker.clone(),
            calibrator: self.calibrator.clone(),
            counters: self.counters.clone(),
            archive,
        };
        let saved = encode(&core, &state).and_then(|payload| match self.store.as_ref() {
            Some(store) => Ok(store.save(&payload)?),
            None => Err(SessionError::NoCheckpoints { operation: "checkpoint" }),
        });
        match saved {
            Ok(id) => {
                tracing::info!(session = %self.name, %id, bytes = core.len(), "session: checkpoint");
                self.periodic.checkpointed();
                self.last_checkpoint = Some(id.clone());
                Ok(id)
            }
            Err(error) => {
                self.counters.checkpoints_written -= 1;
                Err(error)
            }
        }
    }

    /// The archive's identity and the highest archived message id below the next id.
    fn archive_binding(&self) -> Result<Option<ArchiveBinding>, SessionError> {
        let Some(archive) = self.archive.as_ref() else { return Ok(None) };
        let newest = archive.max_message_id(&self.name)?.unwrap_or(0);
        let covered = newest.min(self.tracker.next_id.saturating_sub(1));
        Ok(Some(ArchiveBinding { identity: archive.identity()?, covered }))
    }

    /// Checks the archive is the one checkpoint `id` was written with and holds what it
    /// covers.
    fn verify_archive(
        &self,
        id: &CheckpointId,
        binding: Option<&ArchiveBinding>,
    ) -> Result<(), SessionError> {
        let (Some(archive), Some(binding)) = (self.archive.as_ref(), binding) else {
            return Ok(());
        };
        let identity = archive.identity()?;
        if identity != binding.identity {
            return Err(ArchiveError::Mismatch(format!(
                "the archive ({identity}) is not the one checkpoint {id} was written with ({}): it was replaced, recreated or emptied",
                binding.identity
            ))
            .into());
        }
        let newest = archive.max_message_id(&self.name)?.unwrap_or(0);
        if newest < binding.covered {
            return Err(ArchiveError::Mismatch(format!(
                "the archive holds messages of session {:?} up to id {newest}, but checkpoint {id} covers up to {}: messages are missing",
                self.name, binding.covered
            ))
            .into());
        }
        Ok(())
    }

    /// The checkpoints in the store, newest first, with their health.
    ///
    /// # Errors
    /// [`SessionError::NoCheckpoints`] without a store; I/O errors.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let session = ctxwin_std::session::SessionBuilder::new("s").checkpoints(dir.path()).build()?;
    /// assert!(session.checkpoints()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>, SessionError> {
        let store =
            self.store.as_ref().ok_or(SessionError::NoCheckpoints { operation: "checkpoints" })?;
        Ok(store.list()?)
    }

    /// Goes back to a checkpoint: the core's state, calibration and id tracking as they were.
    /// The configuration stays the one the session was built with.
    ///
    /// Archived messages newer than the checkpoint are moved to the session
    /// `"<name>@rewound-<checkpoint id>"` first, since new messages will reuse their ids: the
    /// session's own rows then hold exactly what the checkpoint covers, and nothing is kept
    /// twice. The checkpoint must have been written with this archive (it records the
    /// archive's identity and the highest message id it covers; a mismatch is
    /// [`ArchiveError::Mismatch`]).
    /// (Summaries recorded after the checkpoint are derived data: they are replaced as their
    /// ids are reused.)
    ///
    /// Each candidate is restored straight into this session's manager, which the core does
    /// all or nothing: a checkpoint that does not restore leaves the manager as it was, and
    /// the first that does is the one kept, so no scratch manager is needed.
    ///
    /// # Errors
    /// [`SessionError::BadCheckpoint`] for a checkpoint that does not restore (the session is
    /// then unchanged); [`SessionError::NoCheckpoints`]; store errors, including
    /// `NoValidCheckpoint` when no file restores.
    ///
    /// ```
    /// use ctxwin_std::session::{RestorePoint, SessionBuilder};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let dir = tempfile::tempdir()?;
    /// let mut session = SessionBuilder::new("s").checkpoints(dir.path()).build()?;
    /// session.push(&ChatMessage::text(Role::User, "keep"))?;
    /// let id = session.checkpoint()?;
    /// session.push(&ChatMessage::text(Role::User, "undo me"))?;
    /// session.restore(RestorePoint::Id(id))?;
    /// assert_eq!(session.manager().history().count(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn restore(&mut self, point: RestorePoint) -> Result<RestoreReport, SessionError> {
        // Rows still owed to the archive belong to the timeline being left: write them first
        // (they are then copied aside with the other rewound messages).
        self.end_batch()?;
        self.sync_archive()?;
        let Session { store, manager, name, .. } = self;
        let store = store.as_ref().ok_or(SessionError::NoCheckpoints { operation: "restore" })?;
        let (id, state, skipped) = match point {
            RestorePoint::Id(id) => {
                let bytes = store.load(&id)?;
                let state = restore_into(manager, name, &bytes)
                    .map_err(|reason| SessionError::BadCheckpoint { id: id.clone(), reason })?;
                (id, state, Vec::new())
            }
            RestorePoint::Latest => {
                let mut restored = None;
                let found = store.load_latest_valid(|bytes| {
                    restore_into(manager, name, bytes).map(|state| restored = Some(state))
                })?;
                match (found, restored) {
                    (Some(found), Some(state)) => (found.id, state, found.skipped),
                    _ => return Err(SessionError::NoCheckpoints { operation: "restore" }),
                }
            }
        };
        self.finish_restore(id, state, skipped)
    }

    /// At build: continues from the newest checkpoint if there is one.
    pub(super) fn restore_latest_if_any(&mut self) -> Result<Option<RestoreReport>, SessionError> {
        let has_checkpoints = match self.store.as_ref() {
            Some(store) => !store.ids()?.is_empty(),
            None => false,
        };
        if !has_checkpoints {
            return Ok(None);
        }
        self.restore(RestorePoint::Latest).map(Some)
    }

    fn finish_restore(
        &mut self,
        id: CheckpointId,
        restored: Restored,
        skipped: Vec<crate::checkpoint::Skipped>,
    ) -> Result<RestoreReport, SessionError> {
        let Restored { state } = restored;
        self.verify_archive(&id, state.archive.as_ref())?;
        self.tracker = state.tracker;
        self.tracker.next_id = self.manager.next_id();
        self.trusted_from = self.tracker.next_id;
        self.phantom = None;
        self.forget_llm_texts();
        self.calibrator = state.calibrator;
        self.counters = state.counters;
        self.counters.restores += 1;
        self.periodic = crate::checkpoint::PeriodicCheckpointer::new(self.periodic.policy());
        self.last_checkpoint = Some(id.clone());
        self.apply_calibration()?;
        let (rewound, rewound_to) = self.preserve_rewound(&id)?;
        tracing::info!(session = %self.name, %id, skipped = skipped.len(), "session: restored");
        Ok(RestoreReport { id, skipped, rewound, rewound_to })
    }

    /// Copies archived messages with ids the restored core will hand out again to a side
    /// session, so nothing archived is overwritten.
    fn preserve_rewound(
        &mut self,
        id: &CheckpointId,
    ) -> Result<(Vec<u64>, Option<String>), SessionError> {
        let Some(archive) = self.archive.as_mut() else { return Ok((Vec::new(), None)) };
        let next = self.tracker.next_id;
        let mut limit = 64usize;
        let newer = loop {
            let recent = archive.recent(&self.name, limit)?;
            let reached = recent.len() < limit || recent.first().is_some_and(|m| m.id < next);
            if reached {
                break recent.into_iter().filter(|m| m.id >= next).collect::<Vec<_>>();
            }
            limit = limit.saturating_mul(4);
        };
        if newer.is_empty() {
            return Ok((Vec::new(), None));
        }
        let side = format!("{}@rewound-{id}", self.name);
        archive.store_messages(&side, &newer)?;
        // The session's own rows now hold exactly what the checkpoint covers: the timeline
        // left behind lives on in the side session only, never twice.
        archive.delete_from(&self.name, next)?;
        tracing::warn!(
            session = %self.name,
            messages = newer.len(),
            copied_to = %side,
            "session: archived messages newer than the checkpoint were copied aside"
        );
        Ok((newer.into_iter().map(|m| m.id).collect(), Some(side)))
    }

    /// Writes the periodic checkpoint when due; a failure is logged and retried next time.
    pub(super) fn periodic_checkpoint(&mut self) -> Option<CheckpointId> {
        if self.store.is_none() || !self.periodic.on_messages(1) {
            return None;
        }
        match self.checkpoint() {
            Ok(id) => Some(id),
            Err(error) => {
                tracing::warn!(session = %self.name, %error, "session: periodic checkpoint failed");
                self.counters.checkpoint_failures += 1;
                None
            }
        }
    }
}

/// A checkpoint loaded into the manager.
struct Restored {
    state: SessionState,
}

/// Checks a payload belongs to session `name` and restores its core part into `manager`
/// (all or nothing: on error the manager is unchanged).
fn restore_into(
    manager: &mut SessionManager,
    name: &str,
    payload: &[u8],
) -> Result<Restored, String> {
    let (core, state) = decode(payload)?;
    if state.session != name {
        return Err(format!("it belongs to session {:?}", state.session));
    }
    manager.restore_tiered(core).map_err(|error| match error {
        SessionError::Snapshot(error) => snapshot_reason(&error),
        other => other.to_string(),
    })?;
    Ok(Restored { state })
}

fn snapshot_reason(error: &SnapshotError) -> String {
    format!("core snapshot refused: {error:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_damage_is_named() {
        let state = SessionState {
            session: "s".into(),
            tracker: Tracker::new(),
            calibrator: Calibrator::new(),
            counters: SessionCounters::default(),
            archive: None,
        };
        let payload = encode(b"core bytes", &state).unwrap();
        let (core, decoded) = decode(&payload).unwrap();
        assert_eq!((core, decoded.session.as_str()), (&b"core bytes"[..], "s"));
        assert!(decode(&payload[..8]).unwrap_err().contains("header"));
        assert!(decode(b"CWSNxxxxxxxxxxxx").unwrap_err().contains("magic"));
        assert!(decode(&payload[..20]).unwrap_err().contains("cut short"));
        let mut bad_json = payload.clone();
        bad_json.truncate(payload.len() - 1);
        assert!(decode(&bad_json).unwrap_err().contains("session state"));
    }
}
