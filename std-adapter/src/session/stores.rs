//! The ports a session writes to, and the lease it writes them under.

use std::sync::Arc;

use super::lease::Lease;
use crate::store::{ArchiveStore, CheckpointSink};

/// A session's storage: its archive and checkpoint ports (either may be absent), the lease it
/// holds on its scope, and how many checkpoints it keeps.
#[derive(Debug)]
pub(crate) struct Stores {
    pub(crate) archive: Option<Arc<dyn ArchiveStore>>,
    pub(crate) checkpoints: Option<Arc<dyn CheckpointSink>>,
    /// The fence from the archive's [`acquire`](ArchiveStore::acquire) (every write carries
    /// it), and what the latest checkpoint and the rows after it reproduce.
    pub(crate) lease: Lease,
    /// Checkpoints kept after each save (at least 1).
    pub(crate) keep: usize,
}
