//! Leases: serving a conversation that other processes may serve too (a fleet on one
//! PostgreSQL). The store hands out a fence per conversation
//! ([`acquire`](crate::store::ArchiveStore::acquire)) and refuses, inside each write's own
//! transaction, a write whose fence is older than the newest handed out. A session whose
//! write is refused that way has been overtaken: it [`reload`](Session::reload)s — takes the
//! lease again, restores the newest checkpoint and pushes the rows written after it into the
//! core again, in id order — and redoes the operation on that state. Before each operation
//! it also reads the newest fence ([`current_fence`](crate::store::ArchiveStore::current_fence),
//! one query) and reloads first when another process took the lease meanwhile, so it never
//! decides on a stale state (a payload composed without writing is not checked by any
//! fence). A session taken back whose state the store still reproduces (another process only
//! pushed rows since) resumes on it: only the rows after its own are replayed. Two sessions serving one conversation therefore serialize: each write lands on
//! everything the other wrote, never between its writes.
//!
//! **What a reload reproduces.** Pushing a conversation's rows again into the core restored
//! from a checkpoint gives the same ids, evictions and summaries the writer's core made, as
//! long as nothing but pushes changed the core since that checkpoint. So a leased session
//! writes a checkpoint before it writes rows on a state that pushes alone do not explain: after
//! a compose that evicted, a calibration that moved the window, a tool definition, a model's
//! summary or entity swapped in, a forget, a restore, new caller state. A row whose id the
//! replay does not reproduce is reported ([`StoreError::Mismatch`]), never written over.
//! The replay runs under the configuration the checkpoint records (the writer's, whatever
//! the reloading session was configured with); the session's own applies again after it,
//! so a takeover by a session configured as the writer was changes nothing and writes no
//! checkpoint of its own.
//!
//! Without a checkpoint port a reload replays every row from an empty context, and nothing
//! guards the replay against states pushes do not reproduce: give a leased session its
//! checkpoints. Stores without leases (SQLite, a directory of checkpoints) hand out
//! [`Fence::NONE`]: none of this runs for them.

use ctxwin_core::{Config, Level};

use super::persist::RestorePoint;
use super::push::PushOptions;
use super::report::ReloadReport;
use super::{Session, SessionError, SessionManager};
use crate::format::fingerprint::{FNV_SEED, fnv1a};
use crate::message::ChatMessage;
use crate::store::{ArchivedMessage, CheckpointId, ErrorKind, Fence, StoreError};

/// How many times an operation refused as stale is redone after a reload before the error is
/// returned (another process took the lease again every time).
const ATTEMPTS: usize = 4;

/// Rows read per page while replaying.
const PAGE: usize = 1_000;

/// The lease a session writes under.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The fence every write carries ([`Fence::NONE`]: the store has no leases).
    pub(crate) fence: Fence,
    /// The state the newest checkpoint plus the rows after it reproduce, as last known
    /// (`None`: unknown, or not reproducible).
    reproducible: Option<ReplayMark>,
    /// Whether an operation overtaken by another process is redone on the reloaded state
    /// ([`Session::redo_when_overtaken`]).
    redo: bool,
    /// The rows the last reload replayed, until the next operation
    /// ([`Session::take_replayed`]).
    replayed: Vec<ArchivedMessage>,
    /// What the last reload did ([`Session::last_reload`]).
    last: Option<ReloadReport>,
}

impl Lease {
    pub(crate) fn new(fence: Fence) -> Self {
        Self { fence, reproducible: None, redo: true, replayed: Vec::new(), last: None }
    }

    /// Whether the store hands out leases.
    pub(crate) fn is_held(&self) -> bool {
        !self.fence.is_none()
    }

    /// Something pushes cannot reproduce changed the state (a swapped summary, a forget).
    pub(crate) fn changed(&mut self) {
        self.reproducible = None;
    }
}

/// What of a session's state decides what later pushes do, and pushes alone do not change
/// in ways a replay would miss: ids, tokens per level, the core's configuration (the
/// calibrated window), its eviction and summary counts, its entities, the caller's state.
/// The counts of composes and cached prompt tokens are left out: they decide nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplayMark {
    next_id: u64,
    levels: [u32; 4],
    config: Config,
    counters: [u64; 13],
    entities: u64,
    caller: u64,
}

impl ReplayMark {
    fn of(session: &Session) -> Self {
        let manager = &session.manager;
        let c = manager.stats().counters;
        let mut entities = FNV_SEED;
        for (key, value) in manager.entities().iter() {
            entities = fnv1a(fnv1a(entities, key.as_bytes()), &[0xff]);
            entities = match value {
                Some(value) => fnv1a(fnv1a(entities, value.as_bytes()), &[0xfe]),
                None => fnv1a(entities, &[0xfd]),
            };
        }
        Self {
            next_id: manager.next_id(),
            levels: Level::ALL.map(|level| manager.level_tokens(level)),
            config: *manager.config(),
            counters: [
                c.messages_pushed,
                c.tokens_ingested,
                c.units_evicted,
                c.messages_evicted,
                c.tokens_evicted,
                c.observations_reduced,
                c.calls_aborted,
                c.calls_dropped,
                c.summaries_added,
                c.summaries_merged,
                c.summaries_failed,
                c.summaries_replaced,
                c.compactions,
            ],
            entities,
            caller: fnv1a(FNV_SEED, &session.checkpointing.caller_state),
        }
    }
}

/// Whether `error` says a write was refused because another process took the lease.
pub(crate) fn is_fenced(error: &SessionError) -> bool {
    match error {
        SessionError::Store(store) => store.kind() == ErrorKind::Fenced,
        SessionError::AfterStore { source, .. } | SessionError::Import { source, .. } => {
            is_fenced(source)
        }
        _ => false,
    }
}

impl SessionError {
    /// Whether this says another process took the conversation: a write refused as stale
    /// (the session has reloaded by then).
    ///
    /// ```
    /// use ctxwin_std::session::SessionError;
    /// use ctxwin_std::store::{Fence, Scope, StoreError};
    /// let scope = Scope::local("chat");
    /// let fenced = StoreError::Fenced { scope, fence: Fence(1), current: Fence(2) };
    /// assert!(SessionError::from(fenced).is_overtaken());
    /// assert!(!SessionError::NoArchive { operation: "reload" }.is_overtaken());
    /// ```
    pub fn is_overtaken(&self) -> bool {
        is_fenced(self)
    }
}

impl Session {
    /// Takes the conversation's lease again and rebuilds the session from the store: the
    /// newest checkpoint (or an empty context when there is none), then every archived
    /// message written after it, pushed into the core again in id order (the ids it gets
    /// are checked against the rows'). What a refused write left in the journal is dropped:
    /// the store refused it, and the operation that made it is redone on the new state.
    ///
    /// When the session's own state is what that checkpoint and the rows up to its own
    /// reproduce (it left nothing unwritten and changed nothing but by pushes since), the
    /// newest checkpoint is still the one it continues from and its last row is archived, it
    /// is what this rebuild would give: the session keeps it and replays only the rows after
    /// its own ([`ReloadReport::resumed`]), reading and decoding no checkpoint.
    ///
    /// A leased session (its archive hands out leases: PostgreSQL) does this by itself when
    /// a write is refused as stale, and redoes the operation; call it to pick up what another
    /// process wrote before reading (a search, stats) without writing. On a store without
    /// leases it rebuilds the same way.
    ///
    /// # Errors
    /// [`SessionError::NoArchive`]; [`StoreError::Mismatch`] when the rows after the
    /// checkpoint do not replay to their ids (they were not all written by pushes on it);
    /// store errors. The session must not be used after an error other than a store's
    /// transient one (retry the reload).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store };
    /// let build = || SessionBuilder::new("chat").ports(ports.clone()).assume_new(true).build();
    /// let (mut first, mut second) = (build()?, build()?);
    /// first.push(&ChatMessage::text(Role::User, "one"))?;
    /// first.checkpoint()?;
    /// first.push(&ChatMessage::text(Role::User, "two"))?;
    /// let report = second.reload()?;
    /// assert_eq!(report.replayed, 1, "the checkpoint, then the row after it");
    /// assert_eq!(second.push(&ChatMessage::text(Role::User, "three"))?.id, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reload(&mut self) -> Result<ReloadReport, SessionError> {
        let archive =
            self.stores.archive.clone().ok_or(SessionError::NoArchive { operation: "reload" })?;
        let fence = archive.acquire(&self.scope)?;
        let report = self.reload_under(fence)?;
        self.counters.reloads += 1;
        Ok(report)
    }

    /// [`reload`](Self::reload) under `fence`, a lease just taken.
    pub(super) fn reload_under(&mut self, fence: Fence) -> Result<ReloadReport, SessionError> {
        let reproducible =
            self.journal.len() == 0 && self.stores.lease.reproducible == Some(ReplayMark::of(self));
        let (dropped, fenced) = self.journal.clear();
        if dropped > 0 && fenced {
            tracing::debug!(scope = %self.scope, dropped, "session: reload drops writes the store refused as stale");
        } else if dropped > 0 {
            tracing::warn!(scope = %self.scope, dropped, "session: reload drops writes the store refused");
        }
        self.stores.lease.fence = fence;
        self.stores.lease.replayed.clear();
        if reproducible && let Some(replayed) = self.resume()? {
            self.stores.lease.reproducible = Some(ReplayMark::of(self));
            let checkpoint = self.checkpointing.last.clone();
            tracing::info!(scope = %self.scope, fence = fence.0, ?checkpoint, replayed, "session: resumed");
            let report = ReloadReport { fence, checkpoint, replayed, dropped, resumed: true };
            self.stores.lease.last = Some(report.clone());
            return Ok(report);
        }
        self.stores.lease.changed();
        self.stores.lease.replayed.clear();
        let own = self.calibration.configured;
        let replay = self.restore_and_replay();
        // The session's own configuration applies again (a change from the replayed one is
        // checkpointed before the next row, as any reconfiguration).
        self.calibration.configured = own;
        let (checkpoint, replayed) = replay?;
        self.apply_calibration()?;
        tracing::info!(scope = %self.scope, fence = fence.0, ?checkpoint, replayed, "session: reloaded");
        let report = ReloadReport { fence, checkpoint, replayed, dropped, resumed: false };
        self.stores.lease.last = Some(report.clone());
        Ok(report)
    }

    /// The cheap reload: when the session's state is what the newest checkpoint and the rows
    /// up to its own reproduce, it is what a restore of that checkpoint and a replay of those
    /// rows would rebuild, so only the rows written after its own are replayed on it (no
    /// checkpoint read, nothing decoded). Checked first, in two queries: the newest
    /// checkpoint is still the one the session continues from (a holder that changed the
    /// state otherwise than by pushes — a compose that evicted, a calibration, a restore, a
    /// forget — wrote a newer one before writing on it), and the session's last row is still
    /// archived (a rewind or a delete since would have removed it). The number of rows
    /// replayed; `None` when the state cannot continue (the caller restores the checkpoint).
    /// The caller checked that the state is reproducible and the journal empty.
    fn resume(&mut self) -> Result<Option<usize>, SessionError> {
        let (Some(last), Some(sink), Some(archive)) = (
            self.checkpointing.last.clone(),
            self.stores.checkpoints.clone(),
            self.stores.archive.clone(),
        ) else {
            return Ok(None);
        };
        let own = self.manager.next_id().saturating_sub(1);
        if own == 0 || sink.newest_id(&self.scope)?.as_ref() != Some(&last) {
            return Ok(None);
        }
        let rows = archive.rows_after(&self.scope, own - 1, PAGE)?;
        if rows.first().is_none_or(|row| row.id != own) {
            return Ok(None);
        }
        let full = rows.len() == PAGE;
        let mut replayed = 0;
        for row in rows.into_iter().skip(1) {
            if let Err(error) = self.replay_row(&row) {
                // Not what pushes on this state give: the checkpoint is restored instead.
                tracing::warn!(scope = %self.scope, %error, "session: the rows after its own do not replay on its state; restoring the checkpoint");
                return Ok(None);
            }
            self.stores.lease.replayed.push(row);
            replayed += 1;
        }
        if full {
            replayed += self.replay_rows()?;
        }
        #[cfg(feature = "http")]
        self.forget_llm_texts();
        if let Some(index) = self.recall.semantic.as_mut() {
            index.reset();
        }
        self.checkpointing.periodic.on_messages(u32::try_from(replayed).unwrap_or(u32::MAX));
        self.apply_calibration()?;
        Ok(Some(replayed))
    }

    /// Restores the newest checkpoint and replays the rows after it under the configuration
    /// the checkpoint was written under: a leased writer checkpoints before it writes a row on
    /// a changed configuration, so that is the one its rows were pushed under, and the
    /// replay makes its decisions (the session's own configuration could evict otherwise).
    /// The state reached is what the store reproduces.
    fn restore_and_replay(&mut self) -> Result<(Option<CheckpointId>, usize), SessionError> {
        let (checkpoint, covered) = self.restore_newest()?;
        if let Some(stored) = self.checkpointing.configured
            && stored != self.calibration.configured
        {
            self.calibration.configured = stored;
            self.apply_calibration()?;
        }
        let replayed = self.replay_rows()?;
        // A row after the checkpoint proves the archive holds what it covers (ids are dense
        // up to the replayed ones); without one, the archive is asked (one query).
        if let (Some(id), Some(covered), 0) = (&checkpoint, covered, replayed) {
            self.verify_covered(id, covered)?;
        }
        #[cfg(feature = "http")]
        self.forget_llm_texts();
        if let Some(index) = self.recall.semantic.as_mut() {
            index.reset();
        }
        // Periodic checkpoints count the conversation's messages, whoever pushed them.
        self.checkpointing.periodic.on_messages(u32::try_from(replayed).unwrap_or(u32::MAX));
        self.stores.lease.reproducible = Some(ReplayMark::of(self));
        Ok((checkpoint, replayed))
    }

    /// Restores the newest checkpoint that restores, or empties the session when there is
    /// none (`None` then); with the highest message id it covers, which the caller checks
    /// the archive holds ([`verify_covered`](Self::verify_covered)).
    fn restore_newest(&mut self) -> Result<(Option<CheckpointId>, Option<u64>), SessionError> {
        if self.stores.checkpoints.is_some()
            && let Some((id, restored, _skipped)) = self.load_point(RestorePoint::Latest)?
        {
            let covered = self.adopt(&id, restored, true)?;
            return Ok((Some(id), covered));
        }
        let counter = self.manager.counter().clone();
        self.manager = SessionManager::small(self.calibration.configured, counter)?;
        self.tracker = super::Tracker::new();
        self.counters =
            super::SessionCounters { reloads: self.counters.reloads, ..Default::default() };
        self.calibration.calibrator.reset();
        self.checkpointing = super::Checkpointing::new(self.checkpointing.periodic.policy());
        self.apply_calibration()?;
        Ok((None, None))
    }

    /// Pushes every archived row after the core's ids into the core again, in id order:
    /// rows the core writes itself (results of calls a push closed) come back from the push
    /// that wrote them; a row the replay does not give its id is a mismatch. How many rows
    /// were pushed.
    fn replay_rows(&mut self) -> Result<usize, SessionError> {
        let Some(archive) = self.stores.archive.clone() else { return Ok(0) };
        let mut replayed = 0;
        loop {
            let after = self.manager.next_id().saturating_sub(1);
            let rows = archive.rows_after(&self.scope, after, PAGE)?;
            if rows.is_empty() {
                return Ok(replayed);
            }
            let full = rows.len() == PAGE;
            for row in rows {
                if row.id < self.manager.next_id() {
                    continue;
                }
                self.replay_row(&row)?;
                self.stores.lease.replayed.push(row);
                replayed += 1;
            }
            if !full {
                return Ok(replayed);
            }
        }
    }

    /// Pushes archived `row` into the core as its writer pushed it (full text, time, level),
    /// without writing anything: the archive has it, and the summaries the push makes.
    fn replay_row(&mut self, row: &ArchivedMessage) -> Result<(), SessionError> {
        let expected = self.manager.next_id();
        if row.id != expected {
            return Err(mismatch(self, row.id, expected));
        }
        let mut message: ChatMessage = row.message.clone();
        message.content = row.full_text().to_string();
        // A tool result its writer stored whole is replayed whole: it may have been pushed
        // as one the observation limit does not cut (`PushOptions::whole`).
        let options = PushOptions {
            timestamp: Some(row.timestamp),
            level: Some(row.level),
            whole: row.original.is_none(),
            ..Default::default()
        };
        self.make_tier_room(&message, &options)?;
        let id = self.push_core(&message, &options, row.timestamp)?;
        if id != row.id {
            return Err(mismatch(self, row.id, id));
        }
        self.saw_id(id);
        self.counters.messages_pushed += 1;
        self.mark_summaries_recorded();
        self.drain_outbox();
        self.prune_summary_marks();
        Ok(())
    }

    /// Whether the session writes under a lease.
    pub(super) fn leased(&self) -> bool {
        self.stores.lease.is_held()
    }

    /// The state now is what the newest checkpoint and the rows after it reproduce (after a
    /// checkpoint, and after a push on such a state).
    pub(super) fn note_reproducible(&mut self) {
        if self.leased() {
            self.stores.lease.reproducible = Some(ReplayMark::of(self));
        }
    }

    /// Before writing rows under a lease: writes a checkpoint when the state is not what the
    /// newest checkpoint and the rows after it reproduce, so that a process that reloads
    /// replays exactly what this one did.
    pub(super) fn ensure_reproducible(&mut self) -> Result<(), SessionError> {
        if !self.leased() || self.stores.checkpoints.is_none() {
            return Ok(());
        }
        if self.stores.lease.reproducible == Some(ReplayMark::of(self)) {
            return Ok(());
        }
        tracing::debug!(scope = %self.scope, "session: checkpoint before writing on a changed state");
        self.checkpoint_once()?;
        Ok(())
    }

    /// Reads the newest fence and reloads when another process took the lease since this
    /// session took it (one query, which takes the lease back when it was taken:
    /// [`acquire_if_overtaken`](crate::store::ArchiveStore::acquire_if_overtaken)): its state
    /// may be stale, and nothing should be decided on a stale state (the store would refuse
    /// the writes, but a payload composed without writing would go out as it is). Returns whether it reloaded. Every operation does this first,
    /// unless [`redo_when_overtaken`](Self::redo_when_overtaken) is off: then the caller does,
    /// at the start of its unit of work. Nothing on a store without leases.
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
    /// let mut session = SessionBuilder::new("chat").ports(ports).build()?;
    /// assert!(!session.catch_up()?);
    /// store.acquire(session.scope())?; // another process takes the conversation
    /// assert!(session.catch_up()?);
    /// assert_eq!(session.counters().reloads, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`reload`](Self::reload); the store's when the fence does not read.
    pub fn catch_up(&mut self) -> Result<bool, SessionError> {
        if !self.leased() {
            return Ok(false);
        }
        let Some(archive) = self.stores.archive.clone() else { return Ok(false) };
        // Reading the fence and taking the lease back are one round trip where the store can.
        let Some(fence) = archive.acquire_if_overtaken(&self.scope, self.stores.lease.fence)?
        else {
            return Ok(false);
        };
        tracing::debug!(scope = %self.scope, "session: another process took the lease; reloading");
        self.reload_under(fence)?;
        self.counters.reloads += 1;
        Ok(true)
    }

    /// The rows the last [`reload`](Self::reload) (or [`catch_up`](Self::catch_up), or the
    /// build that restored the session under a lease) replayed: the archived messages after
    /// its checkpoint, in id order, as read then. Handed over once, and kept only until the
    /// session's next operation: a caller that rebuilds a record of its own from the same
    /// rows (a proxy's) takes them here instead of reading them again.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
    /// let build = || SessionBuilder::new("chat").ports(ports.clone()).restore_latest(true).build();
    /// let (mut first, mut second) = (build()?, build()?);
    /// first.push(&ChatMessage::text(Role::User, "one"))?;
    /// assert!(second.catch_up()?);
    /// let rows = second.take_replayed();
    /// assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
    /// assert!(second.take_replayed().is_empty(), "handed over once");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_replayed(&mut self) -> Vec<ArchivedMessage> {
        std::mem::take(&mut self.stores.lease.replayed)
    }

    /// What the session's last reload did ([`reload`](Self::reload), a
    /// [`catch_up`](Self::catch_up) that found the lease taken, an operation redone after
    /// one): whether it restored a checkpoint or [resumed](ReloadReport::resumed) on its own
    /// state, and the rows it replayed. `None` before the first.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
    /// let build = || SessionBuilder::new("chat").ports(ports.clone()).restore_latest(true).build();
    /// let mut first = build()?;
    /// first.push(&ChatMessage::text(Role::User, "one"))?;
    /// first.checkpoint()?;
    /// let mut second = build()?;
    /// second.push(&ChatMessage::text(Role::User, "two"))?;
    /// assert!(first.catch_up()?);
    /// let report = first.last_reload().unwrap();
    /// assert!(report.resumed, "its state continues the newest checkpoint: row 2 replayed on it");
    /// assert_eq!(report.replayed, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn last_reload(&self) -> Option<&ReloadReport> {
        self.stores.lease.last.as_ref()
    }

    /// The fence the session writes under: the lease it took last ([`Fence::NONE`] on a
    /// store without leases).
    ///
    /// ```
    /// use ctxwin_std::store::{Fence, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store };
    /// let mut session = SessionBuilder::new("chat").ports(ports).build()?;
    /// let first = session.fence();
    /// assert!(first > Fence::NONE);
    /// session.reload()?;
    /// assert!(session.fence() > first, "a reload takes the lease again");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fence(&self) -> Fence {
        self.stores.lease.fence
    }

    /// Whether operations read the newest fence first ([`catch_up`](Self::catch_up)) and an
    /// operation whose write the store refuses as stale is redone on the reloaded state
    /// (`true`, the default). Off, an operation does neither: it runs on the session's state,
    /// and when the store refuses one of its writes as stale the session reloads and the
    /// operation returns [`StoreError::Fenced`] ([`SessionError::is_overtaken`]) having done
    /// nothing on the new state. For a caller whose unit of work spans several operations (a
    /// proxy taking a request's messages one push at a time): it calls
    /// [`catch_up`](Self::catch_up) once at the start of each unit, and when overtaken redoes
    /// the whole unit on the reloaded state — one push redone on a state another process
    /// extended would land after that process's messages. Its operations then cost no query
    /// of the fence each; what it composes without writing after another process took the
    /// conversation within the unit is ordered before that process's work.
    ///
    /// ```
    /// use ctxwin_std::store::{ArchiveStore, MemoryStore, Ports};
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
    /// let mut session = SessionBuilder::new("chat").ports(ports).build()?;
    /// session.redo_when_overtaken(false);
    /// session.push(&ChatMessage::text(Role::User, "one"))?;
    /// store.acquire(session.scope())?; // another process takes the conversation
    /// let error = session.push(&ChatMessage::text(Role::User, "two")).unwrap_err();
    /// assert!(error.is_overtaken());
    /// assert_eq!(session.manager().history().count(), 1, "reloaded, and nothing redone");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn redo_when_overtaken(&mut self, redo: bool) {
        self.stores.lease.redo = redo;
    }

    /// Runs `op`; when the store refused one of its writes as stale (another process took
    /// the lease), reloads, and with `retry` runs it again on the reloaded state (up to
    /// [`ATTEMPTS`] times). Without `retry` (an operation that may have written part of its
    /// work, as an import) the error is returned after the reload.
    pub(super) fn serving<T>(
        &mut self,
        retry: bool,
        mut op: impl FnMut(&mut Self) -> Result<T, SessionError>,
    ) -> Result<T, SessionError> {
        let mut attempt = 1;
        self.stores.lease.replayed = Vec::new();
        loop {
            if self.stores.lease.redo {
                self.catch_up()?;
            }
            match op(self) {
                Err(error) if self.leased() && is_fenced(&error) => {
                    tracing::info!(scope = %self.scope, %error, attempt, "session: overtaken; reloading");
                    if attempt > 1 {
                        // Overtaken again: the other holder is writing now. Let it finish
                        // rather than take the lease back from it at once, over and over.
                        std::thread::sleep(backoff(attempt));
                    }
                    // Whatever comes next starts from the store's state.
                    self.reload()?;
                    if !retry || !self.stores.lease.redo || attempt >= ATTEMPTS {
                        return Err(error);
                    }
                    attempt += 1;
                }
                Ok(value) => {
                    self.settle();
                    return Ok(value);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// After an operation under a lease: writes a checkpoint when the state is not what the
    /// newest checkpoint and the rows after it reproduce (a compose evicted, the calibrated
    /// window moved, a tool was added), so that whoever serves the conversation next
    /// continues from exactly this state. A failure is logged: the operation is done, and the
    /// next push checkpoints first ([`ensure_reproducible`](Self::ensure_reproducible)).
    fn settle(&mut self) {
        if !self.leased() || self.stores.checkpoints.is_none() {
            return;
        }
        if self.stores.lease.reproducible == Some(ReplayMark::of(self)) {
            return;
        }
        if let Err(error) = self.checkpoint_once() {
            tracing::warn!(scope = %self.scope, %error, "session: checkpoint after the operation failed");
            self.counters.checkpoint_failures += 1;
        }
    }
}

/// A random wait of up to `attempt` × 2 ms.
fn backoff(attempt: usize) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_usize(attempt);
    let ceiling = u64::try_from(attempt).unwrap_or(u64::MAX).saturating_mul(2_000).max(1);
    std::time::Duration::from_micros(hasher.finish() % ceiling)
}

fn mismatch(session: &Session, row: u64, replayed: u64) -> SessionError {
    SessionError::Store(StoreError::Mismatch {
        detail: format!(
            "conversation {}: archived message {row} replays as id {replayed} on checkpoint {}; it was not written by a push on that state (run a recovery)",
            session.scope,
            session
                .checkpointing
                .last
                .as_ref()
                .map_or_else(|| "none".to_string(), ToString::to_string)
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::session::SessionBuilder;
    use crate::store::{ArchiveStore, CheckpointSink, MemoryStore, Ports, Scope};
    use ctxwin_core::Role;

    fn ports(store: &Arc<MemoryStore>) -> Ports {
        Ports { archive: store.clone(), checkpoints: store.clone() }
    }

    /// A session on `store` that restores the newest checkpoint and writes one only when asked.
    fn restoring(store: &Arc<MemoryStore>) -> Session {
        let builder = SessionBuilder::new("s").ports(ports(store));
        builder.restore_latest(true).checkpoint_interval_messages(0).build().unwrap()
    }

    #[test]
    fn a_write_refused_every_time_is_an_error_after_a_few_reloads() {
        let store = Arc::new(MemoryStore::new());
        let mut session = SessionBuilder::new("s").ports(ports(&store)).build().unwrap();
        assert!(session.leased(), "the memory store hands out leases");
        let scope = Scope::local("s");
        let mut attempts = 0;
        let result: Result<(), SessionError> = session.serving(true, |_| {
            attempts += 1;
            let current = store.acquire(&scope)?;
            Err(StoreError::Fenced { scope: scope.clone(), fence: Fence(1), current }.into())
        });
        assert!(result.as_ref().is_err_and(is_fenced), "{result:?}");
        assert_eq!(attempts, ATTEMPTS);
        assert_eq!(session.stats().unwrap().counters.reloads, ATTEMPTS as u64);
        let mut once = 0;
        let _ = session.serving(false, |_| -> Result<(), SessionError> {
            once += 1;
            let current = store.acquire(&scope)?;
            Err(StoreError::Fenced { scope: scope.clone(), fence: Fence(1), current }.into())
        });
        assert_eq!(once, 1, "not redone without retry");
    }

    #[test]
    fn a_tool_output_pushed_whole_is_replayed_whole() {
        use crate::message::{ChatMessage, ToolCall};
        use crate::session::PushOptions;
        let store = Arc::new(MemoryStore::new());
        let config = ctxwin_core::Config { observation_limit: 64, ..ctxwin_core::Config::DEFAULT };
        let build = || {
            SessionBuilder::new("s").ports(ports(&store)).config(config).assume_new(true).build()
        };
        let (mut writer, mut reader) = (build().unwrap(), build().unwrap());
        writer.push(&ChatMessage::text(Role::User, "read a.rs and run the tests")).unwrap();
        writer.checkpoint().unwrap();
        let calls = vec![ToolCall::new("r", "Read", "{}"), ToolCall::new("t", "Bash", "{}")];
        writer.push(&ChatMessage::assistant_calls("", calls)).unwrap();
        let file: String = (0..80).map(|i| format!("{i:>6}\tlet x{i} = {i};\n")).collect();
        let whole = PushOptions { whole: true, ..PushOptions::default() };
        let read = writer.push_with(&ChatMessage::tool_result("r", file.clone()), whole).unwrap();
        let log = writer.push(&ChatMessage::tool_result("t", file.clone())).unwrap();
        let contents = |session: &Session| {
            [read.id, log.id].map(|id| session.manager().get(id).unwrap().content().to_string())
        };
        let written = contents(&writer);
        assert_eq!(written[0], file);
        assert!(written[1].contains("[Data Truncated]"), "the other one is reduced");
        assert_eq!(reader.reload().unwrap().replayed, 3);
        assert_eq!(contents(&reader), written, "replayed as it was pushed");
    }

    #[test]
    fn a_changed_state_is_checkpointed_before_rows_are_written_on_it() {
        let store = Arc::new(MemoryStore::new());
        let mut session = SessionBuilder::new("s").ports(ports(&store)).build().unwrap();
        let scope = Scope::local("s");
        session.push(&ChatMessage::text(Role::User, "one")).unwrap();
        session.push(&ChatMessage::text(Role::User, "two")).unwrap();
        assert!(store.ids(&scope).unwrap().is_empty(), "pushes alone need no checkpoint");
        session.set_caller_state(b"window=1".to_vec());
        session.push(&ChatMessage::text(Role::User, "three")).unwrap();
        assert_eq!(store.ids(&scope).unwrap().len(), 1, "the caller's state changed");
        session.record_usage(1_000, 1_300).unwrap();
        session.push(&ChatMessage::text(Role::User, "four")).unwrap();
        assert_eq!(store.ids(&scope).unwrap().len(), 2, "the calibrated window changed");
        // What the newest checkpoint and the rows after it give is this session's state.
        let mut other =
            SessionBuilder::new("s").ports(ports(&store)).restore_latest(true).build().unwrap();
        assert_eq!(other.caller_state(), b"window=1");
        assert_eq!(other.manager().config(), session.manager().config());
        let texts = |s: &Session| {
            s.manager().history().map(|m| m.content().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(texts(&other), texts(&session));
        assert_eq!(other.push(&ChatMessage::text(Role::User, "five")).unwrap().id, 5);
    }

    #[test]
    fn a_reload_replays_under_the_writers_configuration_and_keeps_its_own() {
        let store = Arc::new(MemoryStore::new());
        let scope = Scope::local("s");
        let writer = Config { reserved_for_reply: 2_000, ..Config::DEFAULT };
        let build = |config: Config| {
            let builder = SessionBuilder::new("s").ports(ports(&store)).config(config);
            builder.restore_latest(true).build().unwrap()
        };
        let mut first = build(writer);
        first.push(&ChatMessage::text(Role::User, "one")).unwrap();
        first.checkpoint().unwrap();
        first.push(&ChatMessage::text(Role::User, "two")).unwrap();
        let mut second = build(Config::DEFAULT);
        assert_eq!(second.configured(), &Config::DEFAULT, "its own configuration");
        assert_eq!(second.checkpoint_configured(), Some(&writer), "the rows' configuration");
        // Configured as the writer was, it changes nothing a replay would miss.
        second.reconfigure(|config| *config = writer).unwrap();
        second.push(&ChatMessage::text(Role::User, "three")).unwrap();
        assert_eq!(store.ids(&scope).unwrap().len(), 1, "no checkpoint of its own");
        // Configured otherwise, its next row is written on a checkpoint of its configuration.
        let mut third = build(Config::DEFAULT);
        third.push(&ChatMessage::text(Role::User, "four")).unwrap();
        assert_eq!(store.ids(&scope).unwrap().len(), 2);
        assert_eq!(third.checkpoint_configured(), Some(&Config::DEFAULT));
    }

    /// The core's state of `session` as a snapshot.
    fn snapshot(session: &Session) -> Vec<u8> {
        let mut bytes = vec![0u8; session.manager().snapshot_len()];
        let len = session.manager().snapshot_into(&mut bytes).unwrap().len();
        bytes.truncate(len);
        bytes
    }

    #[test]
    fn a_session_taken_back_resumes_on_its_state_as_a_restore_would_rebuild_it() {
        let store = Arc::new(MemoryStore::new());
        let build = || restoring(&store);
        let (mut a, mut b) = (build(), build());
        a.push(&ChatMessage::text(Role::User, "one")).unwrap();
        a.checkpoint().unwrap();
        for n in 0..6 {
            let (writer, reader) = if n % 2 == 0 { (&mut b, &mut a) } else { (&mut a, &mut b) };
            writer.push(&ChatMessage::text(Role::User, format!("message {n}"))).unwrap();
            writer.push(&ChatMessage::text(Role::Assistant, format!("answer {n}"))).unwrap();
            assert!(reader.catch_up().unwrap());
            let report = reader.last_reload().unwrap().clone();
            // Each continues the checkpoint `a` wrote, on the session's own state.
            assert!(report.resumed, "takeover {n}: {report:?}");
            assert_eq!(report.replayed, 2, "only the other's two rows");
            assert_eq!(reader.take_replayed().len(), 2);
            // What a restore of the checkpoint and a replay of every row after it gives.
            let fresh = build();
            assert_eq!(snapshot(reader), snapshot(&fresh), "takeover {n}");
            assert_eq!(ReplayMark::of(reader), ReplayMark::of(&fresh), "takeover {n}");
            assert!(reader.catch_up().unwrap(), "the fresh session took the lease");
            assert!(reader.last_reload().unwrap().resumed, "it wrote nothing: resumed");
        }
        assert_eq!(a.push(&ChatMessage::text(Role::User, "last")).unwrap().id, 14);
    }

    #[test]
    fn a_session_restores_when_its_state_is_not_the_newest_checkpoints() {
        let store = Arc::new(MemoryStore::new());
        let build = || restoring(&store);
        let (mut a, mut b) = (build(), build());
        a.push(&ChatMessage::text(Role::User, "one")).unwrap();
        a.checkpoint().unwrap();
        assert!(b.catch_up().unwrap());
        b.push(&ChatMessage::text(Role::User, "two")).unwrap();
        // A newer checkpoint: the other's state may hold what pushes do not reproduce.
        b.checkpoint().unwrap();
        assert!(a.catch_up().unwrap());
        assert!(!a.last_reload().unwrap().resumed, "restored the newer checkpoint");
        // A state changed since its checkpoint (new caller state) is not resumed on either.
        a.set_caller_state(b"changed".to_vec());
        assert!(b.catch_up().unwrap());
        b.push(&ChatMessage::text(Role::User, "three")).unwrap();
        assert!(a.catch_up().unwrap());
        assert!(!a.last_reload().unwrap().resumed);
        assert_eq!(a.caller_state(), b"", "the checkpoint's, not its own");
        // Its last row gone (a rewind by another holder): restored, never resumed past it.
        assert!(b.catch_up().unwrap());
        let scope = Scope::local("s");
        store.delete_from(&scope, Fence::NONE, 3).unwrap();
        assert!(a.catch_up().unwrap());
        assert!(!a.last_reload().unwrap().resumed);
        assert_eq!(a.manager().next_id(), 3);
    }

    #[test]
    fn a_forget_under_a_lease_makes_the_other_holders_restore() {
        let store = Arc::new(MemoryStore::new());
        let build = || restoring(&store);
        let (mut a, mut b) = (build(), build());
        a.push(&ChatMessage::text(Role::User, "my PIN is 4417")).unwrap();
        a.push(&ChatMessage::text(Role::User, "deploy")).unwrap();
        a.checkpoint().unwrap();
        assert!(b.catch_up().unwrap());
        b.forget_matching("4417").unwrap();
        assert!(a.catch_up().unwrap());
        assert!(!a.last_reload().unwrap().resumed, "the forget wrote a newer checkpoint");
        assert!(a.manager().history().all(|m| !m.content().contains("4417")));
    }

    #[test]
    fn rows_that_do_not_replay_to_their_ids_are_a_mismatch() {
        let store = Arc::new(MemoryStore::new());
        let scope = Scope::local("s");
        let row = ArchivedMessage::new(4, 4, ChatMessage::text(Role::User, "written past a gap"));
        store.put(&scope, Fence::NONE, &[row]).unwrap();
        let built = SessionBuilder::new("s").ports(ports(&store)).restore_latest(true).build();
        let error = built.unwrap_err();
        assert!(matches!(&error, SessionError::Store(StoreError::Mismatch { .. })), "{error}");
        assert!(error.to_string().contains("message 4 replays as id 1"), "{error}");
    }
}
