//! Checkpoints: the core's snapshot plus the session's own state, saved in the checkpoint
//! store and restored from it.
//!
//! A session checkpoint's payload (inside the sink's CRC-checked frame) is:
//!
//! | bytes | field |
//! |---|---|
//! | 6 | magic `CWSESS` |
//! | 2 | version, little-endian (2; 1 is still read) |
//! | 4 | length `n` of the core snapshot, little-endian |
//! | `n` | the core snapshot (`core/SNAPSHOT.md`) |
//! | 4 | length `m` of the session state, little-endian (version 2) |
//! | `m` | the session state as JSON: name, id tracking, calibrator, counters, archive binding, configuration |
//! | rest | the caller's state ([`Session::set_caller_state`]), opaque (version 2) |
//!
//! Version 1 (older builds) has no state length and no caller's state: the JSON runs to the
//! end.

use ctxwin_core::{Config, SnapshotError};
use serde::{Deserialize, Serialize};

use super::core::SessionManager;
use super::report::RestoreReport;
use super::stats::SessionCounters;
use super::sync::Tracker;
use super::{Session, SessionError};
use crate::store::{CheckpointId, CheckpointInfo, Skipped, StoreError};
use crate::tokens::Calibrator;

const MAGIC: &[u8; 6] = b"CWSESS";
const VERSION: u16 = 2;
pub(super) const HEADER_LEN: usize = 12;

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
    /// The configuration the session was configured with (before calibration) when it wrote
    /// the checkpoint (absent in checkpoints of older builds): under a lease, the rows after
    /// the checkpoint were pushed under it, and a reload replays them under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    configured: Option<Config>,
}

/// What a checkpoint knows of its archive: which one it is, and the highest message id the
/// checkpoint covers (every id up to it that the session archived must be there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ArchiveBinding {
    identity: String,
    covered: u64,
}

fn encode(core: &[u8], state: &SessionState, caller: &[u8]) -> Result<Vec<u8>, SessionError> {
    let json = serde_json::to_vec(state)
        .map_err(|e| SessionError::Setting(format!("session state does not serialize: {e}")))?;
    let too_big = |what: &str| SessionError::Setting(format!("{what} over 4 GiB"));
    let core_len = u32::try_from(core.len()).map_err(|_| too_big("snapshot"))?;
    let json_len = u32::try_from(json.len()).map_err(|_| too_big("session state"))?;
    let mut payload = Vec::with_capacity(HEADER_LEN + core.len() + 4 + json.len() + caller.len());
    payload.extend_from_slice(MAGIC);
    payload.extend_from_slice(&VERSION.to_le_bytes());
    payload.extend_from_slice(&core_len.to_le_bytes());
    payload.extend_from_slice(core);
    payload.extend_from_slice(&json_len.to_le_bytes());
    payload.extend_from_slice(&json);
    payload.extend_from_slice(caller);
    Ok(payload)
}

/// A payload's parts: the core snapshot, the session state and the caller's state.
struct Decoded<'a> {
    core: &'a [u8],
    state: SessionState,
    caller: &'a [u8],
}

/// Splits a payload into the core snapshot, the session state and the caller's state.
fn decode(payload: &[u8]) -> Result<Decoded<'_>, String> {
    let header = payload.get(..HEADER_LEN).ok_or("shorter than its header")?;
    if header.get(..6) != Some(&MAGIC[..]) {
        return Err("not a session checkpoint (bad magic)".into());
    }
    let version = u16::from_le_bytes([header[6], header[7]]);
    if version != 1 && version != VERSION {
        return Err(format!(
            "session checkpoint version {version}, this build reads 1 and {VERSION}"
        ));
    }
    let length = |at: usize| -> Result<usize, String> {
        let bytes = payload.get(at..at + 4).ok_or("a length cut short")?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize)
    };
    let end = HEADER_LEN.checked_add(length(8)?).ok_or("length overflows")?;
    let core = payload.get(HEADER_LEN..end).ok_or("core snapshot cut short")?;
    let (json, caller) = if version == 1 {
        (payload.get(end..).ok_or("session state missing")?, &[][..])
    } else {
        let start = end + 4;
        let json_end = start.checked_add(length(end)?).ok_or("length overflows")?;
        let json = payload.get(start..json_end).ok_or("session state cut short")?;
        (json, payload.get(json_end..).unwrap_or_default())
    };
    let state = serde_json::from_slice(json).map_err(|e| format!("session state: {e}"))?;
    Ok(Decoded { core, state, caller })
}

impl Session {
    /// Writes a checkpoint now: the core's whole state and the session's (calibration, id
    /// tracking, counters, the caller's state). Units waiting in the outbox are written to the
    /// archive and released first, and the archive is flushed: a checkpoint never covers a
    /// row the archive lacks.
    ///
    /// # Errors
    /// [`SessionError::NoCheckpoints`] without a checkpoint sink; store errors.
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
        self.serving(true, Self::checkpoint_once)
    }

    /// [`checkpoint`](Self::checkpoint), not redone when the store refuses it as stale.
    pub(super) fn checkpoint_once(&mut self) -> Result<CheckpointId, SessionError> {
        if self.stores.checkpoints.is_none() {
            return Err(SessionError::NoCheckpoints { operation: "checkpoint" });
        }
        self.after_op(self.tracker.next_id, &|_| false)?;
        // Never a checkpoint over rows not durable yet: a restore after a crash relies on them.
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
        let state = SessionState {
            session: self.scope.conversation.clone(),
            tracker: self.tracker.clone(),
            calibrator: self.calibration.calibrator.clone(),
            counters: SessionCounters {
                checkpoints_written: self.counters.checkpoints_written + 1,
                ..self.counters.clone()
            },
            archive: self.archive_binding()?,
            configured: Some(self.calibration.configured),
        };
        let payload = encode(&core, &state, &self.checkpointing.caller_state)?;
        let id = self.save(&payload)?;
        tracing::info!(scope = %self.scope, %id, bytes = core.len(), "session: checkpoint");
        self.counters.checkpoints_written += 1;
        self.checkpointing.periodic.checkpointed();
        self.checkpointing.last = Some(id.clone());
        self.checkpointing.configured = Some(self.calibration.configured);
        self.note_reproducible();
        Ok(id)
    }

    /// Saves `payload` as the newest checkpoint, then prunes to the checkpoints kept (a failed
    /// prune is logged: the checkpoint itself is safe).
    fn save(&self, payload: &[u8]) -> Result<CheckpointId, SessionError> {
        let sink = self
            .stores
            .checkpoints
            .as_deref()
            .ok_or(SessionError::NoCheckpoints { operation: "checkpoint" })?;
        let fence = self.stores.lease.fence;
        let (id, pruned) = sink.save_and_prune(&self.scope, fence, payload, self.stores.keep)?;
        if let Err(error) = pruned {
            tracing::warn!(%error, scope = %self.scope, "session: pruning old checkpoints failed");
        }
        Ok(id)
    }

    /// The opaque state of the caller kept in every checkpoint from now on (a proxy's window,
    /// its message index): restored with the session, so a caller keeps nothing of its own.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let dir = tempfile::tempdir()?;
    /// let build = || SessionBuilder::new("s").checkpoints(dir.path()).restore_latest(true).build();
    /// let mut session = build()?;
    /// session.set_caller_state(b"window=8192".to_vec());
    /// session.checkpoint()?;
    /// drop(session);
    /// assert_eq!(build()?.caller_state(), b"window=8192");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_caller_state(&mut self, state: Vec<u8>) {
        self.checkpointing.caller_state = state;
    }

    /// The caller's state as last set or restored (empty when none).
    pub fn caller_state(&self) -> &[u8] {
        &self.checkpointing.caller_state
    }

    /// The archive's identity and the highest archived message id below the next id.
    fn archive_binding(&self) -> Result<Option<ArchiveBinding>, SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(None) };
        let covered =
            archive.archived_through(&self.scope, self.tracker.next_id.saturating_sub(1))?;
        Ok(Some(ArchiveBinding { identity: archive.identity()?, covered }))
    }

    /// The configuration the newest checkpoint this session wrote or restored was written
    /// under (before calibration); `None` before any, or after restoring one of an older
    /// build. Under a lease (PostgreSQL), the configuration a reload replays the rows after
    /// the checkpoint under ([`reload`](Self::reload)): a caller whose settings follow the
    /// conversation (a proxy's reply reserve) continues from it.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let dir = tempfile::tempdir()?;
    /// let mut session = SessionBuilder::new("s").checkpoints(dir.path()).build()?;
    /// assert_eq!(session.checkpoint_configured(), None);
    /// session.reconfigure(|config| config.reserved_for_reply = 2_000)?;
    /// session.checkpoint()?;
    /// assert_eq!(session.checkpoint_configured().unwrap().reserved_for_reply, 2_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint_configured(&self) -> Option<&Config> {
        self.checkpointing.configured.as_ref()
    }

    /// Checks the archive is the one checkpoint `id` was written with and, unless `defer`,
    /// that it holds what the checkpoint covers; with `defer` the highest id it covers is
    /// returned for [`verify_covered`](Self::verify_covered) instead (a reload finds the
    /// rows after it anyway: any proves them there).
    fn verify_archive(
        &self,
        id: &CheckpointId,
        binding: Option<&ArchiveBinding>,
        defer: bool,
    ) -> Result<Option<u64>, SessionError> {
        let (Some(archive), Some(binding)) = (self.stores.archive.as_deref(), binding) else {
            return Ok(None);
        };
        let identity = archive.identity()?;
        if identity != binding.identity {
            return Err(StoreError::Mismatch {
                detail: format!(
                    "the archive ({identity}) is not the one checkpoint {id} was written with ({}): it was replaced, recreated or emptied",
                    binding.identity
                ),
            }
            .into());
        }
        if defer {
            return Ok(Some(binding.covered));
        }
        self.verify_covered(id, binding.covered)?;
        Ok(None)
    }

    /// Checks the archive holds the session's messages up to id `covered`, which checkpoint
    /// `id` covers.
    pub(super) fn verify_covered(
        &self,
        id: &CheckpointId,
        covered: u64,
    ) -> Result<(), SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(()) };
        let newest = archive.max_id(&self.scope)?.unwrap_or(0);
        if newest < covered {
            return Err(StoreError::Mismatch {
                detail: format!(
                    "the archive holds messages of session {:?} up to id {newest}, but checkpoint {id} covers up to {covered}: messages are missing",
                    self.scope.conversation
                ),
            }
            .into());
        }
        Ok(())
    }

    /// The checkpoints kept, newest first, with their health.
    ///
    /// # Errors
    /// [`SessionError::NoCheckpoints`] without a checkpoint sink; store errors.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let session = ctxwin_std::session::SessionBuilder::new("s").checkpoints(dir.path()).build()?;
    /// assert!(session.checkpoints()?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>, SessionError> {
        let sink = self
            .stores
            .checkpoints
            .as_deref()
            .ok_or(SessionError::NoCheckpoints { operation: "checkpoints" })?;
        Ok(sink.list(&self.scope)?)
    }

    /// Goes back to a checkpoint: the core's state, calibration, id tracking and the caller's
    /// state as they were. The configuration stays the one the session was built with.
    ///
    /// Archived messages newer than the checkpoint are moved to the conversation
    /// `"<name>@rewound-<checkpoint id>"` of the same tenant first, since new messages will
    /// reuse their ids: the session's own rows then hold exactly what the checkpoint covers,
    /// and nothing is kept twice. The checkpoint must have been written with this archive (it
    /// records the archive's identity and the highest message id it covers; a mismatch is
    /// [`StoreError::Mismatch`]). (Summaries recorded after the checkpoint are derived data:
    /// they are replaced as their ids are reused.)
    ///
    /// Each candidate is restored straight into this session's manager, which the core does
    /// all or nothing: a checkpoint that does not restore leaves the manager as it was, and
    /// the first that does is the one kept.
    ///
    /// # Errors
    /// [`SessionError::BadCheckpoint`] for a checkpoint that does not restore (the session is
    /// then unchanged); [`SessionError::NoCheckpoints`]; store errors, including
    /// `NoUsableCheckpoint` when none restores.
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
        self.serving(false, |session| session.restore_once(point.clone()))
    }

    fn restore_once(&mut self, point: RestorePoint) -> Result<RestoreReport, SessionError> {
        // Rows still owed to the archive belong to the timeline being left: write them first
        // (they are then copied aside with the other rewound messages).
        self.sync_archive()?;
        let (id, restored, skipped) =
            self.load_point(point)?.ok_or(SessionError::NoCheckpoints { operation: "restore" })?;
        self.adopt(&id, restored, false)?;
        self.counters.restores += 1;
        // The state is an older checkpoint's, not the newest one's plus the rows after it.
        self.stores.lease.changed();
        let (rewound, rewound_to) = self.preserve_rewound(&id)?;
        tracing::info!(scope = %self.scope, %id, skipped = skipped.len(), "session: restored");
        Ok(RestoreReport { id, skipped, rewound, rewound_to })
    }

    /// Restores checkpoint `point` into the manager (the first that restores, for
    /// [`RestorePoint::Latest`]): its id, the session's and the caller's state it holds, and
    /// the newer checkpoints passed over; `None` when the scope has no checkpoint.
    pub(super) fn load_point(
        &mut self,
        point: RestorePoint,
    ) -> Result<Option<(CheckpointId, Restored, Vec<Skipped>)>, SessionError> {
        let Session { stores, manager, scope, .. } = self;
        let sink = stores
            .checkpoints
            .as_deref()
            .ok_or(SessionError::NoCheckpoints { operation: "restore" })?;
        let name = scope.conversation.as_str();
        match point {
            RestorePoint::Id(id) => {
                let bytes = sink.load(scope, &id)?;
                let restored = restore_into(manager, name, &bytes)
                    .map_err(|reason| SessionError::BadCheckpoint { id: id.clone(), reason })?;
                Ok(Some((id, restored, Vec::new())))
            }
            RestorePoint::Latest => {
                let mut restored = None;
                let found = sink.load_latest(scope, &mut |bytes| {
                    restore_into(manager, name, bytes).map(|state| restored = Some(state))
                })?;
                match (found, restored) {
                    (Some(found), Some(state)) => Ok(Some((found.id, state, found.skipped))),
                    _ => Ok(None),
                }
            }
        }
    }

    /// At build: continues from the newest checkpoint if there is one.
    pub(super) fn restore_latest_if_any(&mut self) -> Result<Option<RestoreReport>, SessionError> {
        let has_checkpoints = match self.stores.checkpoints.as_deref() {
            Some(sink) => !sink.ids(&self.scope)?.is_empty(),
            None => false,
        };
        if !has_checkpoints {
            return Ok(None);
        }
        self.restore(RestorePoint::Latest).map(Some)
    }

    /// Takes the session's state from checkpoint `id`, restored into the manager: id
    /// tracking, calibration, counters, the caller's state, after checking the archive is the
    /// checkpoint's. With `defer`, whether the archive holds what the checkpoint covers is
    /// left to the caller: the highest id it covers is returned
    /// ([`verify_covered`](Self::verify_covered)).
    pub(super) fn adopt(
        &mut self,
        id: &CheckpointId,
        restored: Restored,
        defer: bool,
    ) -> Result<Option<u64>, SessionError> {
        let Restored { state, caller } = restored;
        let covered = self.verify_archive(id, state.archive.as_ref(), defer)?;
        self.tracker = state.tracker;
        self.tracker.next_id = self.manager.next_id();
        #[cfg(feature = "http")]
        self.forget_llm_texts();
        self.calibration.calibrator = state.calibrator;
        self.counters = SessionCounters { reloads: self.counters.reloads, ..state.counters };
        let policy = self.checkpointing.periodic.policy();
        self.checkpointing.periodic = super::PeriodicCheckpointer::new(policy);
        self.checkpointing.last = Some(id.clone());
        self.checkpointing.caller_state = caller;
        self.checkpointing.configured = state.configured;
        self.apply_calibration()?;
        Ok(covered)
    }

    /// Copies archived messages with ids the restored core will hand out again to a side
    /// conversation, so nothing archived is overwritten.
    fn preserve_rewound(
        &mut self,
        id: &CheckpointId,
    ) -> Result<(Vec<u64>, Option<String>), SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok((Vec::new(), None)) };
        let next = self.tracker.next_id;
        let newer = archive.rows_after(&self.scope, next.saturating_sub(1), usize::MAX)?;
        if newer.is_empty() {
            return Ok((Vec::new(), None));
        }
        let side = self.scope.sibling(format!("{}@rewound-{id}", self.scope.conversation));
        archive.put(&side, self.stores.lease.fence, &newer)?;
        archive.flush(&side)?;
        // The session's own rows now hold exactly what the checkpoint covers: the timeline
        // left behind lives on in the side conversation only, never twice.
        archive.delete_from(&self.scope, self.stores.lease.fence, next)?;
        tracing::warn!(
            scope = %self.scope,
            messages = newer.len(),
            copied_to = %side,
            "session: archived messages newer than the checkpoint were copied aside"
        );
        Ok((newer.into_iter().map(|m| m.id).collect(), Some(side.conversation)))
    }

    /// Writes the periodic checkpoint when due; a failure is logged and retried next time.
    pub(super) fn periodic_checkpoint(&mut self) -> Option<CheckpointId> {
        if self.stores.checkpoints.is_none() || !self.checkpointing.periodic.on_messages(1) {
            return None;
        }
        match self.checkpoint_once() {
            Ok(id) => Some(id),
            Err(error) => {
                tracing::warn!(scope = %self.scope, %error, "session: periodic checkpoint failed");
                self.counters.checkpoint_failures += 1;
                None
            }
        }
    }
}

/// The caller's state in a checkpoint payload of session `name`, without restoring it.
pub(super) fn caller_state_in(payload: &[u8], name: &str) -> Result<Vec<u8>, String> {
    let Decoded { state, caller, .. } = decode(payload)?;
    if state.session != name {
        return Err(format!("it belongs to session {:?}", state.session));
    }
    Ok(caller.to_vec())
}

/// A checkpoint loaded into the manager: the session's state and the caller's.
pub(super) struct Restored {
    state: SessionState,
    caller: Vec<u8>,
}

/// Checks a payload belongs to session `name` and restores its core part into `manager`
/// (all or nothing: on error the manager is unchanged).
fn restore_into(
    manager: &mut SessionManager,
    name: &str,
    payload: &[u8],
) -> Result<Restored, String> {
    let Decoded { core, state, caller } = decode(payload)?;
    if state.session != name {
        return Err(format!("it belongs to session {:?}", state.session));
    }
    manager.restore_tiered(core).map_err(|error| match error {
        SessionError::Snapshot(error) => snapshot_reason(&error),
        other => other.to_string(),
    })?;
    Ok(Restored { state, caller: caller.to_vec() })
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
            configured: Some(Config::DEFAULT),
        };
        let payload = encode(b"core bytes", &state, b"caller").unwrap();
        let decoded = decode(&payload).unwrap();
        assert_eq!((decoded.core, decoded.state.session.as_str()), (&b"core bytes"[..], "s"));
        assert_eq!(decoded.caller, b"caller");
        assert!(decode(&payload[..8]).err().unwrap().contains("header"));
        assert!(decode(b"CWSNxxxxxxxxxxxx").err().unwrap().contains("magic"));
        assert!(decode(&payload[..20]).err().unwrap().contains("cut short"));
        let mut bad_json = payload.clone();
        bad_json.truncate(payload.len() - 7);
        assert!(decode(&bad_json).err().unwrap().contains("session state"));
        // Version 1 (older builds): the JSON runs to the end, no caller's state.
        let json = serde_json::to_vec(&decoded.state).unwrap();
        let mut v1 = b"CWSESS".to_vec();
        v1.extend_from_slice(&1u16.to_le_bytes());
        v1.extend_from_slice(&3u32.to_le_bytes());
        v1.extend_from_slice(b"abc");
        v1.extend_from_slice(&json);
        let old = decode(&v1).unwrap();
        assert_eq!(
            (old.core, old.caller, old.state.session.as_str()),
            (&b"abc"[..], &b""[..], "s")
        );
    }
}
