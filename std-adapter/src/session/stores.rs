//! The ports a session writes to, and the fence it writes them with.

use std::sync::Arc;

use crate::store::{ArchiveStore, CheckpointSink, Fence};

/// A session's storage: its archive and checkpoint ports (either may be absent), the fence it
/// holds for its scope, and how many checkpoints it keeps.
#[derive(Debug)]
pub(crate) struct Stores {
    pub(crate) archive: Option<Arc<dyn ArchiveStore>>,
    pub(crate) checkpoints: Option<Arc<dyn CheckpointSink>>,
    /// From the archive's [`acquire`](ArchiveStore::acquire) at build ([`Fence::NONE`] for
    /// adapters without leases); every write carries it.
    pub(crate) fence: Fence,
    /// Checkpoints kept after each save (at least 1).
    pub(crate) keep: usize,
}
