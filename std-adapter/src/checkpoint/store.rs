//! The on-disk store: atomic saves, listing, verified loads, fallback restore, retention.

use std::convert::Infallible;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::frame::{self, FrameError};
use super::{CheckpointError, CheckpointId, SkipReason, Skipped, clock};

/// Where a session keeps its checkpoints unless configured otherwise (relative to its
/// working directory).
pub const DEFAULT_DIR: &str = ".ctxwin/snapshots";
/// How many checkpoints a store keeps unless told otherwise.
pub const DEFAULT_KEEP: NonZeroUsize = NonZeroUsize::new(10).expect("10 is not zero");
/// Temp files of this store older than this are leftovers of a crashed writer and are
/// deleted by [`CheckpointStore::open`]. Far longer than any single write takes.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

const CHECKPOINT_EXT: &str = "ckpt";
const TEMP_EXT: &str = "tmp";
/// Each attempt after a collision takes a newer id, so a handful always suffices unless
/// something keeps creating files with our names.
const MAX_ID_ATTEMPTS: u32 = 64;

/// A directory of crash-safe checkpoint files, `<id>.ckpt`, holding opaque snapshot bytes.
///
/// A save writes `<id>.tmp`, fsyncs it, renames it to `<id>.ckpt` and fsyncs the
/// directory, so a reader (or a restart after a crash) sees either the whole new
/// checkpoint or none of it. Each file carries its own framing and CRC-32, so a file
/// damaged later is detected and skipped. Files that are not `<valid id>.ckpt` are ignored.
/// [`open`](Self::open) creates the directory at once, [`lazy`](Self::lazy) at the first save.
///
/// # Examples
///
/// ```
/// use ctxwin_std::checkpoint::CheckpointStore;
/// use std::num::NonZeroUsize;
///
/// let dir = tempfile::tempdir()?;
/// let store = CheckpointStore::open(dir.path().join("snapshots"))?
///     .with_keep(NonZeroUsize::new(2).unwrap());
/// store.save(b"one")?;
/// store.save(b"two")?;
/// let newest = store.save(b"three")?;
///
/// let restored = store.load_latest()?.expect("a checkpoint exists");
/// assert_eq!((restored.id, restored.bytes), (newest, b"three".to_vec()));
/// assert_eq!(store.list()?.len(), 2, "only the newest two are kept");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: NonZeroUsize,
}

/// One checkpoint file as [`CheckpointStore::list`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its id.
    pub id: CheckpointId,
    /// Full path of the file.
    pub path: PathBuf,
    /// File size in bytes, framing included.
    pub size: u64,
    /// Modification time, where the file system reports one.
    pub modified: Option<SystemTime>,
    /// Whether the file is intact.
    pub status: CheckpointStatus,
}

/// Health of a checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointStatus {
    /// Framing and CRC check out.
    Ok,
    /// The file is torn or damaged.
    Corrupt(FrameError),
    /// The file could not be read (the I/O error's message).
    Unreadable(String),
}

impl fmt::Display for CheckpointStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ok => f.write_str("ok"),
            Self::Corrupt(error) => write!(f, "corrupt: {error}"),
            Self::Unreadable(error) => write!(f, "unreadable: {error}"),
        }
    }
}

/// The checkpoint a restore settled on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// Id of the checkpoint restored.
    pub id: CheckpointId,
    /// Its payload, verified against the CRC.
    pub bytes: Vec<u8>,
    /// Newer checkpoint files passed over, newest first, each with its reason.
    pub skipped: Vec<Skipped>,
}

impl CheckpointStore {
    /// Opens the store at `dir`, creating the directory if needed and deleting temp files
    /// that crashed writers left behind more than [`STALE_TEMP_AGE`] ago.
    ///
    /// ```
    /// use ctxwin_std::checkpoint::{CheckpointStore, DEFAULT_KEEP};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path().join("a/b"))?;
    /// assert!(store.dir().is_dir());
    /// assert_eq!(store.keep(), DEFAULT_KEEP);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CheckpointError> {
        let store = Self::lazy(dir);
        create_dir_durably(&store.dir)?;
        store.remove_stale_temps(&store.scan()?, SystemTime::now());
        Ok(store)
    }

    /// The store at `dir`, without touching the disk: the directory is created (durably, as
    /// by [`open`](Self::open)) by the first [`save`](Self::save), and until then the store
    /// simply holds no checkpoint. Stale temp files are removed by saves.
    ///
    /// A session opens its store this way, so that a new one costs no directory creation
    /// and no fsync before it has anything to keep.
    ///
    /// ```
    /// use ctxwin_std::checkpoint::CheckpointStore;
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::lazy(dir.path().join("a/b"));
    /// assert!(!store.dir().exists());
    /// assert!(store.load_latest()?.is_none());
    /// assert!(store.list()?.is_empty());
    /// assert!(!store.dir().exists(), "reads create nothing");
    /// let id = store.save(b"first")?;
    /// assert_eq!(store.load_latest()?.map(|found| found.id), Some(id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lazy(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), keep: DEFAULT_KEEP }
    }

    /// Keeps only the newest `keep` checkpoints after each save.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::CheckpointStore;
    /// use std::num::NonZeroUsize;
    /// let dir = tempfile::tempdir()?;
    /// let three = NonZeroUsize::new(3).unwrap();
    /// assert_eq!(CheckpointStore::open(dir.path())?.with_keep(three).keep(), three);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_keep(self, keep: NonZeroUsize) -> Self {
        Self { keep, ..self }
    }

    /// The store directory.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::CheckpointStore;
    /// let dir = tempfile::tempdir()?;
    /// assert_eq!(CheckpointStore::open(dir.path())?.dir(), dir.path());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many checkpoints a save keeps.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointStore, DEFAULT_KEEP};
    /// let dir = tempfile::tempdir()?;
    /// assert_eq!(CheckpointStore::open(dir.path())?.keep(), DEFAULT_KEEP);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep(&self) -> NonZeroUsize {
        self.keep
    }

    /// The path of the checkpoint file `id` (whether or not it exists).
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointId, CheckpointStore};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let id = CheckpointId::parse("20260101T000000.000000Z-000000")?;
    /// assert_eq!(store.path_of(&id), dir.path().join("20260101T000000.000000Z-000000.ckpt"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn path_of(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{id}.{CHECKPOINT_EXT}"))
    }

    fn temp_path_of(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{id}.{TEMP_EXT}"))
    }

    /// Writes `payload` as a new checkpoint, atomically and durably, then prunes the store
    /// to the newest [`keep`](Self::keep) checkpoints.
    ///
    /// The directory and its missing ancestors are created first, each made durable in its
    /// parent; temp files crashed writers left more than [`STALE_TEMP_AGE`] ago are removed.
    /// A failed prune is logged, not returned: the checkpoint itself is safe.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::CheckpointStore;
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let first = store.save(b"a")?;
    /// let second = store.save(b"b")?;
    /// assert!(second > first);
    /// assert_eq!(store.load(&first)?, b"a");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save(&self, payload: &[u8]) -> Result<CheckpointId, CheckpointError> {
        create_dir_durably(&self.dir)?;
        let scanned = self.scan()?;
        self.remove_stale_temps(&scanned, SystemTime::now());
        let ordered = self.order(scanned);
        let sequence = ordered.iter().map(|(seq, _)| *seq).max().unwrap_or(0).saturating_add(1);
        let floor = ordered.iter().map(|(_, id)| id).max();
        let now = clock::now();
        if let Some(floor) = floor.filter(|floor| floor.timestamp() > now) {
            tracing::warn!(
                newest = %floor,
                "checkpoint: the newest checkpoint is dated after the clock; the new one is numbered after it"
            );
        }
        let (id, temp, file) = self.create_temp(now, floor)?;
        let path = self.path_of(&id);
        let framed = frame::sequenced(sequence, payload);
        if let Err(error) = write_and_publish(file, &temp, &path, &framed) {
            // Best effort: a leftover is ignored by readers and removed by a later open.
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        sync_dir(&self.dir).map_err(|e| CheckpointError::io("fsync directory", &self.dir, e))?;
        tracing::debug!(%id, sequence, bytes = payload.len(), "checkpoint saved");
        if let Err(error) = self.prune() {
            tracing::warn!(%error, dir = %self.dir.display(), "pruning old checkpoints failed");
        }
        Ok(id)
    }

    /// Reserves a fresh id by creating its temp file exclusively.
    ///
    /// Another process may have picked the same id: exclusive creation of the temp file
    /// settles who owns it, and the check for an existing `.ckpt` catches a writer that
    /// already renamed its temp file away. Either way we move on to a newer id.
    fn create_temp(
        &self,
        now: SystemTime,
        floor: Option<&CheckpointId>,
    ) -> Result<(CheckpointId, PathBuf, File), CheckpointError> {
        for _ in 0..MAX_ID_ATTEMPTS {
            let id = CheckpointId::next_after(now, floor)
                .ok_or(CheckpointError::ClockOutOfRange { now })?;
            let temp = self.temp_path_of(&id);
            let file = match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(CheckpointError::io("create", temp, e)),
            };
            match fs::symlink_metadata(self.path_of(&id)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((id, temp, file)),
                _ => {
                    drop(file);
                    let _ = fs::remove_file(&temp);
                }
            }
        }
        Err(CheckpointError::IdsExhausted { dir: self.dir.clone(), attempts: MAX_ID_ATTEMPTS })
    }

    /// Ids of all checkpoint files, newest first, without reading them.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::CheckpointStore;
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let (a, b) = (store.save(b"a")?, store.save(b"b")?);
    /// assert_eq!(store.ids()?, [b, a]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// "Newest" is the highest sequence number, which every save raises by one whatever the
    /// clock says: a checkpoint written while the clock ran ahead, or a file renamed to a
    /// later id, never passes one saved after it. Ids break ties (files of older builds,
    /// without a sequence number, all count as 0).
    pub fn ids(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
        Ok(self.ordered()?.into_iter().map(|(_, id)| id).collect())
    }

    /// Every checkpoint file's (sequence, id), newest first. The sequence is read from the
    /// file's first bytes, unverified: a damaged file is found out when it is loaded.
    fn ordered(&self) -> Result<Vec<(u64, CheckpointId)>, CheckpointError> {
        Ok(self.order(self.scan()?))
    }

    /// The checkpoints among `scanned`, ordered as [`ordered`](Self::ordered) says.
    fn order(&self, scanned: Vec<(FileKind, CheckpointId)>) -> Vec<(u64, CheckpointId)> {
        let peeked: Vec<(Option<u64>, CheckpointId)> = scanned
            .into_iter()
            .filter_map(|(kind, id)| (kind == FileKind::Checkpoint).then_some(id))
            .map(|id| (self.peek_sequence(&id), id))
            .collect();
        // A file whose header cannot be read goes where its id puts it among the readable
        // ones: a damaged newest file is still the newest (and reported as such).
        let mut ordered: Vec<(u64, CheckpointId)> = peeked
            .iter()
            .map(|(sequence, id)| {
                let placed = sequence.unwrap_or_else(|| {
                    peeked
                        .iter()
                        .filter(|(known, other)| known.is_some() && other <= id)
                        .filter_map(|(known, _)| *known)
                        .max()
                        .unwrap_or(0)
                });
                (placed, id.clone())
            })
            .collect();
        ordered.sort_unstable_by(|a, b| b.cmp(a));
        ordered
    }

    /// The sequence number file `id` claims; `None` when it cannot be read.
    fn peek_sequence(&self, id: &CheckpointId) -> Option<u64> {
        let mut start = [0u8; frame::HEADER_LEN + frame::SEQUENCE_LEN];
        let read = File::open(self.path_of(id)).and_then(|mut file| {
            let mut filled = 0;
            while filled < start.len() {
                match io::Read::read(&mut file, &mut start[filled..])? {
                    0 => break,
                    n => filled += n,
                }
            }
            Ok(filled)
        });
        read.ok().and_then(|filled| frame::peek_sequence(&start[..filled]))
    }

    /// The sequence number of checkpoint `id`, verified with the rest of the file.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn sequence(&self, id: &CheckpointId) -> Result<u64, CheckpointError> {
        Ok(self.load_framed(id)?.0)
    }

    /// All checkpoint files, newest first, each read and verified.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointStatus, CheckpointStore};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let id = store.save(b"payload")?;
    /// std::fs::write(dir.path().join("notes.txt"), "not a checkpoint")?;
    /// let listed = store.list()?;
    /// assert_eq!(listed.len(), 1);
    /// assert_eq!((&listed[0].id, &listed[0].status), (&id, &CheckpointStatus::Ok));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let mut infos = Vec::new();
        for id in self.ids()? {
            let path = self.path_of(&id);
            let (size, modified) = match fs::metadata(&path) {
                Ok(meta) => (meta.len(), meta.modified().ok()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(CheckpointError::io("stat", path, e)),
            };
            let status = match self.load(&id) {
                Ok(_) => CheckpointStatus::Ok,
                Err(CheckpointError::NotFound { .. }) => continue,
                Err(CheckpointError::Corrupt { source, .. }) => CheckpointStatus::Corrupt(source),
                Err(error) => CheckpointStatus::Unreadable(error.to_string()),
            };
            infos.push(CheckpointInfo { id, path, size, modified, status });
        }
        Ok(infos)
    }

    /// Reads checkpoint `id` and returns its payload after checking framing and CRC.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointError, CheckpointStore};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let id = store.save(b"payload")?;
    /// assert_eq!(store.load(&id)?, b"payload");
    ///
    /// std::fs::write(store.path_of(&id), b"CTXWCKPT")?;
    /// assert!(matches!(store.load(&id), Err(CheckpointError::Corrupt { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(&self, id: &CheckpointId) -> Result<Vec<u8>, CheckpointError> {
        Ok(self.load_framed(id)?.1)
    }

    fn load_framed(&self, id: &CheckpointId) -> Result<(u64, Vec<u8>), CheckpointError> {
        let path = self.path_of(id);
        let mut bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CheckpointError::NotFound { id: id.clone(), dir: self.dir.clone() });
            }
            Err(e) => return Err(CheckpointError::io("read", path, e)),
        };
        let (sequence, range) = frame::open(&bytes).map_err(|source| CheckpointError::Corrupt {
            id: id.clone(),
            path,
            source,
        })?;
        bytes.truncate(range.end);
        bytes.drain(..range.start);
        Ok((sequence, bytes))
    }

    /// The newest intact checkpoint, or `None` when the store holds no checkpoint file.
    ///
    /// Newer files that are torn or corrupt are skipped, logged with `tracing::warn!` and
    /// reported in [`Restored::skipped`]. When files exist but none is intact, the error is
    /// [`CheckpointError::NoValidCheckpoint`].
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointStore, SkipReason};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// assert!(store.load_latest()?.is_none());
    /// let good = store.save(b"good")?;
    /// let torn = store.save(b"torn")?;
    /// std::fs::write(store.path_of(&torn), b"CTXW")?;
    ///
    /// let restored = store.load_latest()?.unwrap();
    /// assert_eq!((restored.id, restored.bytes), (good, b"good".to_vec()));
    /// assert_eq!(restored.skipped[0].id, torn);
    /// assert!(matches!(restored.skipped[0].reason, SkipReason::Corrupt(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_latest(&self) -> Result<Option<Restored>, CheckpointError> {
        self.load_latest_valid(|_| Ok::<(), Infallible>(()))
    }

    /// Like [`load_latest`](Self::load_latest), but also skips checkpoints whose payload
    /// `validate` refuses (say, a snapshot the core cannot decode).
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::{CheckpointStore, SkipReason};
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let good = store.save(b"v1:state")?;
    /// store.save(b"v9:state")?;
    /// let restored = store
    ///     .load_latest_valid(|bytes| if bytes.starts_with(b"v1:") { Ok(()) } else { Err("unknown version") })?
    ///     .unwrap();
    /// assert_eq!(restored.id, good);
    /// assert_eq!(restored.skipped[0].reason, SkipReason::Rejected("unknown version".into()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_latest_valid<F, E>(
        &self,
        mut validate: F,
    ) -> Result<Option<Restored>, CheckpointError>
    where
        F: FnMut(&[u8]) -> Result<(), E>,
        E: fmt::Display,
    {
        let ids = self.ids()?;
        if ids.is_empty() {
            return Ok(None);
        }
        let mut skipped = Vec::new();
        for id in ids {
            let reason = match self.load(&id) {
                Ok(bytes) => match validate(&bytes) {
                    Ok(()) => return Ok(Some(Restored { id, bytes, skipped })),
                    Err(why) => SkipReason::Rejected(why.to_string()),
                },
                Err(CheckpointError::Corrupt { source, .. }) => SkipReason::Corrupt(source),
                Err(CheckpointError::NotFound { .. }) => SkipReason::Vanished,
                Err(error) => return Err(error),
            };
            let path = self.path_of(&id);
            tracing::warn!(%id, path = %path.display(), %reason, "skipping checkpoint");
            skipped.push(Skipped { id, path, reason });
        }
        Err(CheckpointError::NoValidCheckpoint { dir: self.dir.clone(), skipped })
    }

    /// Deletes all but the newest [`keep`](Self::keep) checkpoint files (intact or not) and
    /// returns the ids deleted. [`save`](Self::save) calls this after every checkpoint.
    ///
    /// ```
    /// # use ctxwin_std::checkpoint::CheckpointStore;
    /// use std::num::NonZeroUsize;
    /// let dir = tempfile::tempdir()?;
    /// let store = CheckpointStore::open(dir.path())?;
    /// let old = store.save(b"old")?;
    /// let new = store.save(b"new")?;
    /// let store = store.with_keep(NonZeroUsize::MIN);
    /// assert_eq!(store.prune()?, [old]);
    /// assert_eq!(store.ids()?, [new]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prune(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
        let mut removed = Vec::new();
        for id in self.ids()?.into_iter().skip(self.keep.get()) {
            let path = self.path_of(&id);
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::debug!(%id, "pruned checkpoint");
                    removed.push(id);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CheckpointError::io("delete", path, e)),
            }
        }
        Ok(removed)
    }

    /// Deletes the temp files among `scanned` last modified more than [`STALE_TEMP_AGE`]
    /// before `now`. Failures are logged: leftovers are harmless.
    fn remove_stale_temps(&self, scanned: &[(FileKind, CheckpointId)], now: SystemTime) {
        for (kind, id) in scanned {
            if *kind != FileKind::Temp {
                continue;
            }
            let temp = self.temp_path_of(id);
            let age = fs::metadata(&temp)
                .and_then(|meta| meta.modified())
                .map(|modified| now.duration_since(modified).unwrap_or_default());
            match age {
                Ok(age) if age > STALE_TEMP_AGE => match fs::remove_file(&temp) {
                    Ok(()) => {
                        tracing::info!(path = %temp.display(), "removed stale checkpoint temp file")
                    }
                    Err(error) => {
                        tracing::warn!(path = %temp.display(), %error, "cannot remove stale temp file")
                    }
                },
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(error) => {
                    tracing::warn!(path = %temp.display(), %error, "cannot stat temp file")
                }
            }
        }
    }

    /// The regular files of the store directory that are ours: `<id>.ckpt` and `<id>.tmp`.
    /// A directory not created yet holds none.
    fn scan(&self) -> Result<Vec<(FileKind, CheckpointId)>, CheckpointError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::io("list", &self.dir, e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io("list", &self.dir, e))?;
            // Symlinks and directories are never ours, even when named like a checkpoint.
            let is_file = entry.file_type().is_ok_and(|kind| kind.is_file());
            if let (true, Some(ours)) = (is_file, classify(&entry.file_name())) {
                found.push(ours);
            }
        }
        Ok(found)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Checkpoint,
    Temp,
}

fn classify(name: &OsStr) -> Option<(FileKind, CheckpointId)> {
    let (stem, ext) = name.to_str()?.rsplit_once('.')?;
    let kind = match ext {
        CHECKPOINT_EXT => FileKind::Checkpoint,
        TEMP_EXT => FileKind::Temp,
        _ => return None,
    };
    Some((kind, CheckpointId::parse(stem).ok()?))
}

fn write_and_publish(
    mut file: File,
    temp: &Path,
    path: &Path,
    framed: &[u8],
) -> Result<(), CheckpointError> {
    file.write_all(framed).map_err(|e| CheckpointError::io("write", temp, e))?;
    file.sync_all().map_err(|e| CheckpointError::io("fsync", temp, e))?;
    drop(file);
    fs::rename(temp, path).map_err(|e| CheckpointError::io("rename into place", temp, e))
}

/// Creates `dir` and its missing ancestors, then fsyncs the parent of each one created so
/// the new directory entries survive a power cut.
fn create_dir_durably(dir: &Path) -> Result<(), CheckpointError> {
    let missing: Vec<&Path> =
        dir.ancestors().take_while(|path| !path.as_os_str().is_empty() && !path.exists()).collect();
    fs::create_dir_all(dir).map_err(|e| CheckpointError::io("create directory", dir, e))?;
    for created in missing {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent).map_err(|e| CheckpointError::io("fsync directory", parent, e))?;
        }
    }
    Ok(())
}

/// Makes a rename or create in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Windows cannot open a directory as a `File`; NTFS journals the rename itself.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(keep: usize) -> (tempfile::TempDir, CheckpointStore) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            CheckpointStore::open(dir.path()).unwrap().with_keep(NonZeroUsize::new(keep).unwrap());
        (dir, store)
    }

    #[test]
    fn saves_round_trip_and_list_newest_first() {
        let (_dir, store) = store(1000);
        let saved: Vec<_> = (0..300u32).map(|n| store.save(&n.to_le_bytes()).unwrap()).collect();
        assert!(saved.windows(2).all(|pair| pair[0] < pair[1]), "ids created fast still sort");
        let listed = store.list().unwrap();
        let listed_ids: Vec<_> = listed.iter().map(|info| info.id.clone()).collect();
        let mut expected = saved.clone();
        expected.reverse();
        assert_eq!(listed_ids, expected);
        assert!(listed.iter().all(|info| info.status == CheckpointStatus::Ok));
        assert!(listed.iter().all(|info| info.size
            == (frame::HEADER_LEN + frame::SEQUENCE_LEN + 4 + frame::TRAILER_LEN) as u64));
        for (n, id) in saved.iter().enumerate() {
            assert_eq!(store.load(id).unwrap(), (n as u32).to_le_bytes());
        }
        let latest = store.load_latest().unwrap().unwrap();
        assert_eq!(latest.id, saved[299]);
        assert!(latest.skipped.is_empty());
    }

    #[test]
    fn keeps_only_the_newest_n() {
        let (_dir, store) = store(3);
        let saved: Vec<_> = (0..7u8).map(|n| store.save(&[n]).unwrap()).collect();
        assert_eq!(store.ids().unwrap(), [saved[6].clone(), saved[5].clone(), saved[4].clone()]);
        assert!(matches!(store.load(&saved[0]), Err(CheckpointError::NotFound { .. })));
        assert_eq!(store.load_latest().unwrap().unwrap().bytes, [6]);
    }

    #[test]
    fn torn_and_corrupt_files_are_skipped_with_fallback() {
        let (_dir, store) = store(10);
        let good = store.save(b"good state").unwrap();
        let flipped = store.save(b"bit rot here").unwrap();
        let torn = store.save(b"torn write").unwrap();
        let cut = store.save(b"cut short").unwrap();

        let mut bytes = fs::read(store.path_of(&flipped)).unwrap();
        bytes[frame::HEADER_LEN + frame::SEQUENCE_LEN + 2] ^= 0x40;
        fs::write(store.path_of(&flipped), bytes).unwrap();
        fs::write(store.path_of(&torn), b"CTXWCK").unwrap();
        let bytes = fs::read(store.path_of(&cut)).unwrap();
        fs::write(store.path_of(&cut), &bytes[..bytes.len() - 3]).unwrap();

        let restored = store.load_latest().unwrap().unwrap();
        assert_eq!((restored.id, restored.bytes), (good.clone(), b"good state".to_vec()));
        let skipped: Vec<_> =
            restored.skipped.iter().map(|s| (s.id.clone(), s.reason.clone())).collect();
        let full = bytes.len() as u64;
        assert_eq!(
            skipped[0],
            (
                cut.clone(),
                SkipReason::Corrupt(FrameError::Truncated { expected: full, actual: full - 3 })
            )
        );
        assert_eq!(skipped[1], (torn.clone(), SkipReason::Corrupt(FrameError::Torn { len: 6 })));
        assert_eq!(skipped[2].0, flipped);
        assert!(matches!(skipped[2].1, SkipReason::Corrupt(FrameError::CrcMismatch { .. })));
        assert_eq!(skipped.len(), 3);
        assert_eq!(restored.skipped[1].path, store.path_of(&torn));

        let statuses: Vec<_> =
            store.list().unwrap().into_iter().map(|info| (info.id, info.status)).collect();
        assert_eq!(statuses[1], (torn, CheckpointStatus::Corrupt(FrameError::Torn { len: 6 })));
        assert_eq!(statuses[3], (good, CheckpointStatus::Ok));

        assert!(matches!(
            store.load(&flipped),
            Err(CheckpointError::Corrupt { source: FrameError::CrcMismatch { .. }, .. })
        ));
    }

    #[test]
    fn no_intact_checkpoint_is_an_error_and_no_file_is_none() {
        let (_dir, store) = store(10);
        assert_eq!(store.load_latest().unwrap(), None);
        let only = store.save(b"x").unwrap();
        fs::write(store.path_of(&only), b"garbage that is long enough to hold a header").unwrap();
        match store.load_latest() {
            Err(CheckpointError::NoValidCheckpoint { dir, skipped }) => {
                assert_eq!(dir, store.dir());
                assert_eq!(skipped.len(), 1);
                assert!(matches!(
                    skipped[0].reason,
                    SkipReason::Corrupt(FrameError::BadMagic { .. })
                ));
            }
            other => panic!("expected NoValidCheckpoint, got {other:?}"),
        }
    }

    #[test]
    fn validation_hook_skips_rejected_snapshots() {
        let (_dir, store) = store(10);
        let accepted = store.save(b"ok:1").unwrap();
        let rejected = store.save(b"bad:2").unwrap();
        let restored = store
            .load_latest_valid(|bytes| {
                if bytes.starts_with(b"ok:") {
                    Ok(())
                } else {
                    Err(format!("{} bytes refused", bytes.len()))
                }
            })
            .unwrap()
            .unwrap();
        assert_eq!(restored.id, accepted);
        assert_eq!(
            restored.skipped,
            [Skipped {
                path: store.path_of(&rejected),
                id: rejected,
                reason: SkipReason::Rejected("5 bytes refused".into())
            }]
        );
    }

    #[test]
    fn temp_and_foreign_files_are_ignored() {
        let (dir, store) = store(2);
        let good = store.save(b"good").unwrap();
        let newer = CheckpointId::parse("99991231T235959.999999Z-999999").unwrap();
        fs::write(dir.path().join(format!("{newer}.tmp")), b"half a write").unwrap();
        fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        fs::write(dir.path().join("latest.ckpt"), b"not an id").unwrap();
        fs::write(dir.path().join(format!("{newer}.ckpt.bak")), b"backup").unwrap();
        fs::create_dir(dir.path().join("20000101T000000.000000Z-000000.ckpt")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            "/etc/hostname",
            dir.path().join("21000101T000000.000000Z-000000.ckpt"),
        )
        .unwrap();

        assert_eq!(store.ids().unwrap(), std::slice::from_ref(&good));
        assert_eq!(store.list().unwrap().len(), 1);
        assert_eq!(store.load_latest().unwrap().unwrap().id, good);
        for _ in 0..3 {
            store.save(b"more").unwrap();
        }
        assert_eq!(store.ids().unwrap().len(), 2);
        for kept in ["notes.txt", "latest.ckpt", "20000101T000000.000000Z-000000.ckpt"] {
            assert!(dir.path().join(kept).exists(), "{kept} must survive pruning");
        }
        assert!(
            dir.path().join(format!("{newer}.tmp")).exists(),
            "a fresh temp file is left alone"
        );
    }

    #[test]
    fn open_removes_only_stale_temp_files_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("20200101T000000.000000Z-000001.tmp");
        let fresh = dir.path().join("20200101T000000.000000Z-000002.tmp");
        let foreign = dir.path().join("editor-swap.tmp");
        for path in [&old, &fresh, &foreign] {
            fs::write(path, b"partial").unwrap();
        }
        let long_ago = SystemTime::now() - STALE_TEMP_AGE - Duration::from_secs(5);
        for path in [&old, &foreign] {
            File::options().write(true).open(path).unwrap().set_modified(long_ago).unwrap();
        }
        CheckpointStore::open(dir.path()).unwrap();
        assert!(!old.exists());
        assert!(fresh.exists());
        assert!(foreign.exists());
    }

    #[test]
    fn ids_from_text_are_checked_before_touching_the_disk() {
        let (_dir, store) = store(10);
        let load = |text: &str| -> Result<Vec<u8>, CheckpointError> { store.load(&text.parse()?) };
        for hostile in ["../../etc/passwd", "/etc/passwd", "a/b", "", "x.ckpt"] {
            assert!(matches!(load(hostile), Err(CheckpointError::InvalidId(_))), "{hostile:?}");
        }
        assert!(matches!(
            load("20260101T000000.000000Z-000000"),
            Err(CheckpointError::NotFound { .. })
        ));
    }

    #[test]
    fn a_lazy_store_reads_a_missing_directory_as_empty_and_creates_it_at_the_first_save() {
        let root = tempfile::tempdir().unwrap();
        let nested = root.path().join("conv/checkpoints");
        let store = CheckpointStore::lazy(&nested).with_keep(NonZeroUsize::MIN);
        assert_eq!(store.ids().unwrap(), []);
        assert_eq!(store.list().unwrap(), []);
        assert_eq!(store.load_latest().unwrap(), None);
        assert_eq!(store.prune().unwrap(), []);
        let id = CheckpointId::parse("20260101T000000.000000Z-000000").unwrap();
        assert!(matches!(store.load(&id), Err(CheckpointError::NotFound { .. })));
        assert!(!root.path().join("conv").exists(), "reads create nothing");

        let first = store.save(b"first").unwrap();
        assert!(nested.is_dir());
        let second = store.save(b"second").unwrap();
        assert_eq!(store.ids().unwrap(), std::slice::from_ref(&second));
        let reopened = CheckpointStore::lazy(&nested);
        assert_eq!(reopened.load_latest().unwrap().map(|found| found.id), Some(second));
        assert!(matches!(store.load(&first), Err(CheckpointError::NotFound { .. })));
    }

    #[test]
    fn a_lazy_store_refuses_a_file_where_its_directory_goes() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("checkpoints");
        fs::write(&path, b"not a directory").unwrap();
        let store = CheckpointStore::lazy(&path);
        assert!(matches!(store.ids(), Err(CheckpointError::Io { .. })));
        assert!(store.save(b"x").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"not a directory");
    }

    #[test]
    fn saves_remove_only_stale_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("20200101T000000.000000Z-000001.tmp");
        let fresh = dir.path().join("20200101T000000.000000Z-000002.tmp");
        for path in [&old, &fresh] {
            fs::write(path, b"partial").unwrap();
        }
        let long_ago = SystemTime::now() - STALE_TEMP_AGE - Duration::from_secs(5);
        File::options().write(true).open(&old).unwrap().set_modified(long_ago).unwrap();
        let store = CheckpointStore::lazy(dir.path());
        assert!(old.exists(), "a lazy store touches nothing until it saves");
        store.save(b"x").unwrap();
        assert!(!old.exists());
        assert!(fresh.exists());
    }

    #[test]
    fn open_creates_nested_directories() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join(DEFAULT_DIR);
        let store = CheckpointStore::open(&nested).unwrap();
        assert!(nested.is_dir());
        store.save(b"x").unwrap();
        assert_eq!(store.ids().unwrap().len(), 1);
    }
}
