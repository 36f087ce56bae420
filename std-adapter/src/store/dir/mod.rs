//! [`CheckpointDir`]: the checkpoint port on directories of crash-safe files.
//!
//! - **Atomic and durable saves**: temp file, `fsync`, `rename`, directory `fsync`. A crash
//!   at any point leaves the previous checkpoints intact and the new one either complete or
//!   absent.
//! - **Self-checking files**: magic `CTXWCKPT`, format version, payload length and a CRC-32
//!   trailer ([`frame`](crate::store::checkpoint::frame) documents the layout). A torn or
//!   damaged file is reported and skipped, never deleted by a read.
//! - **An order no clock can break**: every save raises a sequence number kept inside the
//!   file (under its CRC); the newest checkpoint is the one with the highest, whatever the
//!   clock said or a file is named. Ids sort by time too and never fall behind an existing
//!   one, and cannot name a path outside the directory.

mod files;

use std::path::PathBuf;

use files::Files;

use super::checkpoint::{CheckpointId, CheckpointInfo};
use super::port::CheckpointSink;
use super::{Fence, Scope, StoreError};

pub use files::STALE_TEMP_AGE;

/// Where a [`CheckpointDir`] keeps each scope's checkpoints.
#[derive(Clone, Debug)]
enum Layout {
    /// One directory, for one scope.
    Bound { dir: PathBuf, scope: Scope },
    /// `root/<tenant>/<conversation>/`, names escaped.
    PerScope { root: PathBuf },
}

/// The checkpoint port on the file system: each scope's checkpoints in a directory of their
/// own, as `<id>.ckpt` files (atomic, durable, self-checking, ordered by a sequence number kept
/// inside each file). Directories are created
/// (durably) by the first save; reads of a directory not created yet find no checkpoint.
/// Fences are accepted and not checked (one process writes a directory).
///
/// ```
/// use ctxwin_std::store::{CheckpointDir, CheckpointSink, Fence, Scope};
/// let dir = tempfile::tempdir()?;
/// let scope = Scope::local("main");
/// let sink = CheckpointDir::bound(dir.path().join("checkpoints"), scope.clone());
/// let first = sink.save(&scope, Fence::NONE, b"one")?;
/// let second = sink.save(&scope, Fence::NONE, b"two")?;
/// assert_eq!(sink.ids(&scope)?, [second.clone(), first]);
/// let latest = sink.load_latest(&scope, &mut |_| Ok(()))?.unwrap();
/// assert_eq!((latest.id, latest.bytes), (second, b"two".to_vec()));
/// // A directory bound to one conversation holds no other's.
/// assert!(sink.save(&Scope::local("other"), Fence::NONE, b"x").is_err());
/// assert!(sink.ids(&Scope::local("other"))?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    layout: Layout,
}

impl CheckpointDir {
    /// The checkpoints of `scope` alone, in `dir` (how a command-line state directory or a
    /// proxy's conversation directory keeps them). Another scope has no checkpoint here:
    /// listing, pruning or rewriting it finds none, saving or loading one is refused
    /// ([`StoreError::Invalid`]).
    pub fn bound(dir: impl Into<PathBuf>, scope: Scope) -> Self {
        Self { layout: Layout::Bound { dir: dir.into(), scope } }
    }

    /// Every scope's checkpoints under `root`, in `root/<tenant>/<conversation>/` (each name
    /// escaped to a plain file name: letters, digits and `_` kept, every other byte `%XX`; the
    /// local tenant `""` is `-`).
    ///
    /// ```
    /// use ctxwin_std::store::{CheckpointDir, Scope};
    /// let sink = CheckpointDir::per_scope("/state/checkpoints");
    /// let dir = sink.dir_of(&Scope::new("acme", "chat/7")).unwrap();
    /// assert_eq!(dir, std::path::Path::new("/state/checkpoints/acme/chat%2F7"));
    /// ```
    pub fn per_scope(root: impl Into<PathBuf>) -> Self {
        Self { layout: Layout::PerScope { root: root.into() } }
    }

    /// The directory holding `scope`'s checkpoints.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a scope a bound directory does not hold.
    pub fn dir_of(&self, scope: &Scope) -> Result<PathBuf, StoreError> {
        match &self.layout {
            Layout::Bound { dir, scope: bound } if bound == scope => Ok(dir.clone()),
            Layout::Bound { dir, scope: bound } => Err(StoreError::invalid(format!(
                "{} holds the checkpoints of conversation {bound}, not of {scope}",
                dir.display()
            ))),
            Layout::PerScope { root } => {
                Ok(root.join(escape(&scope.tenant)).join(escape(&scope.conversation)))
            }
        }
    }

    fn files(&self, scope: &Scope) -> Result<Files, StoreError> {
        Ok(Files::new(self.dir_of(scope)?))
    }

    /// `scope`'s files, or `None` for a scope a bound directory does not hold (it has no
    /// checkpoint there: listing, pruning or rewriting it finds nothing).
    fn held(&self, scope: &Scope) -> Option<Files> {
        self.dir_of(scope).ok().map(Files::new)
    }

    /// The path of checkpoint file `id` of `scope` (whether or not it exists).
    ///
    /// # Errors
    /// As [`dir_of`](Self::dir_of).
    pub fn path_of(&self, scope: &Scope, id: &CheckpointId) -> Result<PathBuf, StoreError> {
        Ok(self.files(scope)?.path_of(id))
    }
}

/// `name` as one plain path component: `[A-Za-z0-9_]` kept, every other byte `%XX`; `""` is
/// `-` (which no other name escapes to).
fn escape(name: &str) -> String {
    if name.is_empty() {
        return "-".into();
    }
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl CheckpointSink for CheckpointDir {
    fn save(
        &self,
        scope: &Scope,
        _fence: Fence,
        payload: &[u8],
    ) -> Result<CheckpointId, StoreError> {
        self.files(scope)?.save(payload)
    }

    fn ids(&self, scope: &Scope) -> Result<Vec<CheckpointId>, StoreError> {
        match self.held(scope) {
            Some(files) => files.ids(),
            None => Ok(Vec::new()),
        }
    }

    fn load(&self, scope: &Scope, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        self.files(scope)?.load(id)
    }

    fn list(&self, scope: &Scope) -> Result<Vec<CheckpointInfo>, StoreError> {
        match self.held(scope) {
            Some(files) => files.list(),
            None => Ok(Vec::new()),
        }
    }

    fn prune(
        &self,
        scope: &Scope,
        _fence: Fence,
        keep: usize,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        match self.held(scope) {
            Some(files) => files.prune(keep),
            None => Ok(Vec::new()),
        }
    }

    fn rewrite(
        &self,
        scope: &Scope,
        _fence: Fence,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        match self.held(scope) {
            Some(files) => files.rewrite(mask),
            None => Ok(0),
        }
    }

    fn location(&self, scope: &Scope, id: &CheckpointId) -> String {
        match self.path_of(scope, id) {
            Ok(path) => path.display().to_string(),
            Err(_) => format!("{} {id}", self.place(scope)),
        }
    }

    fn place(&self, scope: &Scope) -> String {
        match self.dir_of(scope) {
            Ok(dir) => dir.display().to_string(),
            Err(_) => format!("checkpoints of {scope}"),
        }
    }
}

#[cfg(test)]
mod tests;
