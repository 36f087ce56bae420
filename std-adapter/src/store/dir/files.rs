//! One directory of checkpoint files: atomic saves, listing, verified loads, retention.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::store::StoreError;
use crate::store::checkpoint::{CheckpointId, CheckpointInfo, CheckpointStatus, clock, frame};

/// Temp files of this store older than this are leftovers of a crashed writer and are
/// deleted by the next save. Far longer than any single write takes.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

const CHECKPOINT_EXT: &str = "ckpt";
const TEMP_EXT: &str = "tmp";
/// Each attempt after a collision takes a newer id, so a handful always suffices unless
/// something keeps creating files with our names.
const MAX_ID_ATTEMPTS: u32 = 64;

/// A directory of crash-safe checkpoint files, `<id>.ckpt`, holding opaque snapshot bytes.
///
/// A save writes `<id>.tmp`, fsyncs it, renames it to `<id>.ckpt` and fsyncs the directory,
/// so a reader (or a restart after a crash) sees either the whole new checkpoint or none of
/// it. Each file carries its own framing and CRC-32, so a file damaged later is detected.
/// Files that are not `<valid id>.ckpt` are ignored. The directory is created (durably) by the
/// first save: until then it simply holds no checkpoint.
#[derive(Clone, Debug)]
pub(super) struct Files {
    dir: PathBuf,
}

impl Files {
    /// The checkpoint files of `dir`, without touching the disk.
    pub(super) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The path of checkpoint file `id` (whether or not it exists).
    pub(super) fn path_of(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{id}.{CHECKPOINT_EXT}"))
    }

    fn temp_path_of(&self, id: &CheckpointId) -> PathBuf {
        self.dir.join(format!("{id}.{TEMP_EXT}"))
    }

    /// Writes `payload` as a new checkpoint, atomically and durably. The directory and its
    /// missing ancestors are created first, each made durable in its parent; temp files
    /// crashed writers left more than [`STALE_TEMP_AGE`] ago are removed.
    pub(super) fn save(&self, payload: &[u8]) -> Result<CheckpointId, StoreError> {
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
            // Best effort: a leftover is ignored by readers and removed by a later save.
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        sync_dir(&self.dir).map_err(|e| StoreError::io("fsync directory", &self.dir, e))?;
        tracing::debug!(%id, sequence, bytes = payload.len(), "checkpoint saved");
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
    ) -> Result<(CheckpointId, PathBuf, File), StoreError> {
        for _ in 0..MAX_ID_ATTEMPTS {
            let id = CheckpointId::next_after(now, floor).ok_or_else(|| {
                StoreError::invalid(format!("the clock reads {now:?}, outside 1970..=9999"))
            })?;
            let temp = self.temp_path_of(&id);
            let file = match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(StoreError::io("create", &temp, e)),
            };
            match fs::symlink_metadata(self.path_of(&id)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((id, temp, file)),
                _ => {
                    drop(file);
                    let _ = fs::remove_file(&temp);
                }
            }
        }
        Err(StoreError::Io {
            detail: format!(
                "no free checkpoint id in {} after {MAX_ID_ATTEMPTS} attempts",
                self.dir.display()
            ),
            source: None,
        })
    }

    /// Ids of all checkpoint files, newest first, without reading them.
    ///
    /// "Newest" is the highest sequence number, which every save raises by one whatever the
    /// clock says: a checkpoint written while the clock ran ahead, or a file renamed to a
    /// later id, never passes one saved after it. Ids break ties (files of older builds,
    /// without a sequence number, all count as 0).
    pub(super) fn ids(&self) -> Result<Vec<CheckpointId>, StoreError> {
        Ok(self.order(self.scan()?).into_iter().map(|(_, id)| id).collect())
    }

    /// The checkpoints among `scanned`, newest first, with the sequence each file claims (read
    /// from its first bytes, unverified: a damaged file is found out when it is loaded).
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

    /// All checkpoint files, newest first, each read and verified.
    pub(super) fn list(&self) -> Result<Vec<CheckpointInfo>, StoreError> {
        let mut infos = Vec::new();
        for id in self.ids()? {
            let path = self.path_of(&id);
            let (size, modified) = match fs::metadata(&path) {
                Ok(meta) => (meta.len(), meta.modified().ok()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io("stat", &path, e)),
            };
            let status = match self.load_framed(&id) {
                Ok(_) => CheckpointStatus::Ok,
                Err(Failed::Missing) => continue,
                Err(Failed::Frame(error)) => CheckpointStatus::Damaged(error.to_string()),
                Err(Failed::Store(error)) => CheckpointStatus::Unreadable(error.to_string()),
            };
            let location = path.display().to_string();
            infos.push(CheckpointInfo { id, location, size, modified, status });
        }
        Ok(infos)
    }

    /// Checkpoint `id`'s payload after checking framing and CRC.
    pub(super) fn load(&self, id: &CheckpointId) -> Result<Vec<u8>, StoreError> {
        match self.load_framed(id) {
            Ok((_, payload)) => Ok(payload),
            Err(Failed::Missing) => Err(StoreError::NotFound {
                what: format!("checkpoint {id} in {}", self.dir.display()),
            }),
            Err(Failed::Frame(error)) => Err(StoreError::damaged(
                format!("checkpoint file {}", self.path_of(id).display()),
                error.to_string(),
            )),
            Err(Failed::Store(error)) => Err(error),
        }
    }

    /// The verified sequence number and payload of file `id`.
    fn load_framed(&self, id: &CheckpointId) -> Result<(u64, Vec<u8>), Failed> {
        let path = self.path_of(id);
        let mut bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Failed::Missing),
            Err(e) => return Err(Failed::Store(StoreError::io("read", &path, e))),
        };
        let (sequence, range) = frame::open(&bytes).map_err(Failed::Frame)?;
        bytes.truncate(range.end);
        bytes.drain(..range.start);
        Ok((sequence, bytes))
    }

    /// Deletes all but the newest `keep` checkpoint files (intact or not); the ids deleted.
    pub(super) fn prune(&self, keep: usize) -> Result<Vec<CheckpointId>, StoreError> {
        let mut removed = Vec::new();
        for id in self.ids()?.into_iter().skip(keep) {
            let path = self.path_of(&id);
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::debug!(%id, "pruned checkpoint");
                    removed.push(id);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("delete", &path, e)),
            }
        }
        Ok(removed)
    }

    /// Rewrites every checkpoint file through `mask` (see
    /// [`CheckpointSink::rewrite`](crate::store::CheckpointSink::rewrite)): an intact file's
    /// payload is masked and framed again under the same sequence number, a damaged file's
    /// bytes are masked as they are; each replaced atomically (write, sync, rename).
    pub(super) fn rewrite(
        &self,
        mask: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        let mut rewritten = 0;
        for id in self.ids()? {
            let path = self.path_of(&id);
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io("read", &path, e)),
            };
            let masked = match frame::open(&bytes) {
                Ok((sequence, range)) => bytes
                    .get(range)
                    .and_then(mask)
                    .map(|payload| frame::sequenced(sequence, &payload)),
                Err(_) => mask(&bytes),
            };
            let Some(masked) = masked else { continue };
            let temp = self.dir.join(format!("{id}.{TEMP_EXT}"));
            let file = File::create(&temp).map_err(|e| StoreError::io("create", &temp, e))?;
            write_and_publish(file, &temp, &path, &masked)?;
            sync_dir(&self.dir).map_err(|e| StoreError::io("fsync directory", &self.dir, e))?;
            rewritten += 1;
        }
        Ok(rewritten)
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
    fn scan(&self) -> Result<Vec<(FileKind, CheckpointId)>, StoreError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io("list", &self.dir, e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &self.dir, e))?;
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
) -> Result<(), StoreError> {
    file.write_all(framed).map_err(|e| StoreError::io("write", temp, e))?;
    file.sync_all().map_err(|e| StoreError::io("fsync", temp, e))?;
    drop(file);
    fs::rename(temp, path).map_err(|e| StoreError::io("rename into place", temp, e))
}

/// Why a file did not load.
enum Failed {
    /// It is not there.
    Missing,
    /// Its frame is broken.
    Frame(frame::FrameError),
    /// Reading it failed.
    Store(StoreError),
}

/// Creates `dir` and its missing ancestors, then fsyncs the parent of each one created so
/// the new directory entries survive a power cut.
fn create_dir_durably(dir: &Path) -> Result<(), StoreError> {
    let missing: Vec<&Path> =
        dir.ancestors().take_while(|path| !path.as_os_str().is_empty() && !path.exists()).collect();
    fs::create_dir_all(dir).map_err(|e| StoreError::io("create directory", dir, e))?;
    for created in missing {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent).map_err(|e| StoreError::io("fsync directory", parent, e))?;
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
