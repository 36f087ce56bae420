//! Safe file handling inside a state directory: bounded input reads, a state lock waited on
//! with a timeout that names its holder, files opened without following symlinks, atomic
//! replacement through create-new temp files, and atomic creation of a whole directory.
//!
//! Everything here is meant for a directory that may hold anything (a `.ctxwin/` checked into
//! a repository, say): no function writes through a symlink, so nothing is ever written
//! outside the directory whatever it contains.
//!
//! ```
//! use ctxwin_std::statefs;
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("notes.json");
//! statefs::replace_file(&path, b"{}")?;
//! assert_eq!(statefs::read_bounded_file(&path, 16, "notes")?, b"{}");
//! assert!(statefs::read_bounded_file(&path, 1, "notes").is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The default cap on one input (a message, a conversation file): 64 MiB.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// The default time a command waits for another command's lock on the state directory.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(30);

/// What went wrong with a state file or an input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFsError {
    /// An input was larger than the cap.
    #[error("{what} is larger than the {cap} bytes allowed")]
    TooLarge {
        /// What was read (a path or "standard input").
        what: String,
        /// The cap in bytes.
        cap: u64,
    },
    /// An input is not UTF-8 text.
    #[error("{what} is not UTF-8 text (binary or another encoding)")]
    NotUtf8 {
        /// What was read.
        what: String,
    },
    /// A path inside the state directory is a symlink (or not the kind of file expected).
    #[error(
        "{} is a symlink, a hard link or not a regular file; ctxwin never writes through it",
        path.display()
    )]
    Unsafe {
        /// The path refused.
        path: PathBuf,
    },
    /// The state lock was not released in time.
    #[error(
        "{} is held by {holder} and was not released within {} s",
        path.display(),
        waited.as_secs()
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, as it wrote itself into the lock file ("pid 42 (ctxwin add)").
        holder: String,
        /// How long this process waited.
        waited: Duration,
    },
    /// An I/O error.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl StateFsError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> StateFsError {
        if is_symlink_refusal(&source) {
            return StateFsError::Unsafe { path: path.to_path_buf() };
        }
        StateFsError::Io { action, path: path.to_path_buf(), source }
    }
}

/// `ELOOP`: what `O_NOFOLLOW` answers for a symlink.
fn is_symlink_refusal(error: &io::Error) -> bool {
    #[cfg(unix)]
    {
        error.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = error;
        false
    }
}

/// Options that refuse to follow a symlink in the last path component.
fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
    }
    #[cfg(not(unix))]
    {
        options
    }
}

/// Reads at most `cap` bytes from `reader`; more is [`StateFsError::TooLarge`].
///
/// ```
/// let error = ctxwin_std::statefs::read_bounded(&b"12345"[..], 4, "input").unwrap_err();
/// assert_eq!(error.to_string(), "input is larger than the 4 bytes allowed");
/// ```
pub fn read_bounded(reader: impl Read, cap: u64, what: &str) -> Result<Vec<u8>, StateFsError> {
    let mut bytes = Vec::new();
    reader
        .take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| StateFsError::io("read", Path::new(what), e))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > cap {
        return Err(StateFsError::TooLarge { what: what.to_string(), cap });
    }
    Ok(bytes)
}

/// The file at `path`, at most `cap` bytes (named `what` in errors).
///
/// # Errors
/// [`StateFsError::TooLarge`], [`StateFsError::Io`].
pub fn read_bounded_file(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>, StateFsError> {
    let file = File::open(path).map_err(|e| StateFsError::io("read", path, e))?;
    read_bounded(file, cap, what).map_err(|error| match error {
        StateFsError::Io { source, .. } => StateFsError::io("read", path, source),
        other => other,
    })
}

/// `bytes` as text, or [`StateFsError::NotUtf8`] naming `what`. A NUL byte counts as binary.
///
/// ```
/// use ctxwin_std::statefs::utf8;
/// assert_eq!(utf8(b"ok".to_vec(), "x").unwrap(), "ok");
/// assert!(utf8(vec![0xff], "x").is_err());
/// assert!(utf8(b"a\0b".to_vec(), "x").is_err());
/// ```
pub fn utf8(bytes: Vec<u8>, what: &str) -> Result<String, StateFsError> {
    if bytes.contains(&0) {
        return Err(StateFsError::NotUtf8 { what: what.to_string() });
    }
    String::from_utf8(bytes).map_err(|_| StateFsError::NotUtf8 { what: what.to_string() })
}

/// Whether a regular file has other hard links: writing it in place would write them too.
fn shares_inode(meta: &fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        meta.nlink() > 1
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        false
    }
}

/// Fails with [`StateFsError::Unsafe`] for each path that exists as a symlink or as the wrong
/// kind of file: `in_place` are files written in place (which must also have a single link, or
/// the write would reach the other names), `replaced` files only ever replaced by a rename or
/// read, `dirs` directories.
///
/// # Errors
/// [`StateFsError::Unsafe`] naming the first such path.
pub fn refuse_symlinks(
    in_place: &[PathBuf],
    replaced: &[PathBuf],
    dirs: &[PathBuf],
) -> Result<(), StateFsError> {
    let kinds = in_place
        .iter()
        .map(|p| (p, Kind::InPlace))
        .chain(replaced.iter().map(|p| (p, Kind::Replaced)))
        .chain(dirs.iter().map(|p| (p, Kind::Dir)));
    for (path, want) in kinds {
        match fs::symlink_metadata(path) {
            Ok(meta) => {
                let kind = meta.file_type();
                let fits = match want {
                    Kind::Dir => kind.is_dir(),
                    Kind::Replaced => kind.is_file(),
                    Kind::InPlace => kind.is_file() && !shares_inode(&meta),
                };
                if kind.is_symlink() || !fits {
                    return Err(StateFsError::Unsafe { path: path.clone() });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StateFsError::io("inspect", path, e)),
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    InPlace,
    Replaced,
    Dir,
}

/// Replaces the file at `path` with `bytes` atomically: a fresh temp file beside it created
/// exclusively (never through a symlink), fsynced, renamed over `path`. A symlink at `path`
/// is replaced, never followed.
///
/// # Errors
/// [`StateFsError::Io`].
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), StateFsError> {
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut attempt = 0u32;
    let (temp, mut file) = loop {
        let temp = dir.join(format!(".{name}.{}.{attempt}.tmp", std::process::id()));
        match no_follow(OpenOptions::new().write(true).create_new(true)).open(&temp) {
            Ok(file) => break (temp, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 64 => {
                // A leftover of a crashed process with our pid: it is ours to remove.
                let _ = fs::remove_file(&temp);
                attempt += 1;
            }
            Err(e) => return Err(StateFsError::io("create", &temp, e)),
        }
    };
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|()| fs::rename(&temp, path)) {
        let _ = fs::remove_file(&temp);
        return Err(StateFsError::io("write", path, e));
    }
    Ok(())
}

/// The lock on a state directory, held while this value lives (the operating system releases
/// it if the process dies).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock file at `path` (created if missing, never through a symlink), waiting
    /// up to `wait` for another holder. `holder` describes this process ("ctxwin add") and is
    /// written into the file for those who wait; `on_wait` is told once, after a second of
    /// waiting, who holds it.
    ///
    /// # Errors
    /// [`StateFsError::LockTimeout`] naming the holder; [`StateFsError::Unsafe`] for a
    /// symlink; I/O errors.
    ///
    /// ```
    /// use ctxwin_std::statefs::{StateFsError, StateLock};
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("lock");
    /// let held = StateLock::acquire(&path, Duration::ZERO, "test one", |_| {})?;
    /// let refused = StateLock::acquire(&path, Duration::from_millis(50), "test two", |_| {});
    /// assert!(matches!(refused, Err(StateFsError::LockTimeout { ref holder, .. }) if holder.contains("test one")));
    /// drop(held);
    /// StateLock::acquire(&path, Duration::ZERO, "test two", |_| {})?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(
        path: &Path,
        wait: Duration,
        holder: &str,
        mut on_wait: impl FnMut(&str),
    ) -> Result<StateLock, StateFsError> {
        let mut file =
            no_follow(OpenOptions::new().create(true).truncate(false).write(true).read(true))
                .open(path)
                .map_err(|e| StateFsError::io("create", path, e))?;
        let start = Instant::now();
        let deadline = start.checked_add(wait);
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) => {}
                Err(fs::TryLockError::Error(e)) => return Err(StateFsError::io("lock", path, e)),
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(StateFsError::LockTimeout {
                    path: path.to_path_buf(),
                    holder: read_holder(path),
                    waited: now.duration_since(start),
                });
            }
            if !told && now.duration_since(start) >= Duration::from_secs(1) {
                told = true;
                on_wait(&read_holder(path));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let line = format!("pid {} ({holder})\n", std::process::id());
        let noted = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(line.as_bytes()));
        if let Err(error) = noted {
            tracing::debug!(%error, "statefs: cannot note the lock holder");
        }
        Ok(StateLock { _file: file })
    }
}

/// Who holds the lock, as the holder wrote it.
fn read_holder(path: &Path) -> String {
    let text = no_follow(OpenOptions::new().read(true))
        .open(path)
        .and_then(|file| read_bounded(file, 256, "lock").map_err(io::Error::other))
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    if text.is_empty() { "another process".to_string() } else { text }
}

/// Creates directory `target` atomically: `fill` populates a fresh temp directory beside it,
/// which is then renamed to `target`. Either the whole directory appears or nothing does; a
/// crash leaves only a `.<name>.init-<pid>` directory that is never read. Returns
/// [`io::ErrorKind::AlreadyExists`] (as [`StateFsError::Io`]) when `target` exists (also
/// when a concurrent caller won the race), and never touches an existing `target`.
///
/// When `target` is an existing directory with other files in it, the entries `fill` made are
/// moved into it one by one (none may exist there yet), `marker` last and with create-new
/// semantics: until `marker` appears the directory holds no state, and a second caller finds
/// it there and fails.
///
/// # Errors
/// `fill`'s error, or [`StateFsError::Io`].
pub fn create_dir_atomically<E: From<StateFsError>>(
    target: &Path,
    marker: &str,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let parent = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| StateFsError::io("create", &parent, e))?;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    remove_stale_temps(&parent, &format!(".{name}.init-"));
    let temp = parent.join(format!(".{name}.init-{}", std::process::id()));
    if fs::symlink_metadata(&temp).is_ok() {
        let _ = fs::remove_dir_all(&temp);
    }
    fs::create_dir(&temp).map_err(|e| StateFsError::io("create", &temp, e))?;
    let result = fill(&temp).and_then(|()| {
        sync_dir(&temp).map_err(|e| StateFsError::io("fsync", &temp, e))?;
        match rename_no_replace(&temp, target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {
                move_into(&temp, target, marker)?;
            }
            Err(e) => return Err(StateFsError::io("create", target, e).into()),
        }
        sync_dir(&parent).map_err(|e| StateFsError::io("fsync", &parent, e))?;
        Ok(())
    });
    let _ = fs::remove_dir_all(&temp);
    result
}

/// How old the temporary directory of a killed `create_dir_atomically` must be before another
/// call removes it (far longer than any creation takes).
const STALE_TEMP_DIR_AGE: Duration = Duration::from_secs(600);

/// Removes the directories in `parent` named `<prefix><digits>` (real directories, not
/// symlinks) last modified more than [`STALE_TEMP_DIR_AGE`] ago: what killed callers left.
fn remove_stale_temps(parent: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.strip_prefix(prefix)) else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stale = entry.metadata().ok().filter(|meta| meta.is_dir()).and_then(|meta| {
            meta.modified().ok()?.elapsed().ok().map(|age| age > STALE_TEMP_DIR_AGE)
        });
        if stale == Some(true) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Moves the entries of `from` into the existing directory `to`, none replacing anything,
/// `marker` last.
fn move_into(from: &Path, to: &Path, marker: &str) -> Result<(), StateFsError> {
    let mut names: Vec<_> = fs::read_dir(from)
        .map_err(|e| StateFsError::io("list", from, e))?
        .filter_map(|entry| entry.ok().map(|entry| entry.file_name()))
        .collect();
    names.sort_by_key(|name| name == marker);
    if names.iter().any(|name| fs::symlink_metadata(to.join(name)).is_ok()) {
        return Err(StateFsError::io(
            "create",
            to,
            io::Error::new(io::ErrorKind::AlreadyExists, "it already holds state files"),
        ));
    }
    for name in names {
        let (source, dest) = (from.join(&name), to.join(&name));
        let moved = if name == marker {
            // link(2) never replaces: of two racing callers, one gets EEXIST. The temporary
            // name goes at once, leaving the file a single link.
            fs::hard_link(&source, &dest).and_then(|()| fs::remove_file(&source))
        } else if fs::symlink_metadata(&dest).is_ok() {
            Err(io::Error::new(io::ErrorKind::AlreadyExists, "it exists"))
        } else {
            fs::rename(&source, &dest)
        };
        moved.map_err(|e| StateFsError::io("create", &dest, e))?;
    }
    sync_dir(to).map_err(|e| StateFsError::io("fsync", to, e))
}

/// The secret of `len` bytes kept in the file at `path`, created on first use with the bytes
/// `fill` writes (the operating system's random generator, say). A new file is readable by its
/// owner only (mode 0600): written to a fresh temp file beside it (never through a symlink),
/// fsynced, and linked in place only if nothing is there yet, so two processes starting at
/// once end up with one secret. An existing file is read without following a symlink, its
/// mode narrowed to 0600; one of another size is reported, never replaced (whatever the secret
/// keys would be lost with it).
///
/// ```
/// use ctxwin_std::statefs::secret_file;
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("tenant.key");
/// let first = secret_file(&path, 32, |bytes| {
///     bytes.fill(7);
///     Ok(())
/// })?;
/// let again = secret_file(&path, 32, |_| unreachable!("it exists"))?;
/// assert_eq!((first.len(), first), (32, again));
/// assert!(secret_file(&path, 16, |_| Ok(())).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`StateFsError::Unsafe`] for a symlink or not a regular file; [`StateFsError::Io`] for a
/// file of another size, `fill`'s error and I/O errors.
pub fn secret_file(
    path: &Path,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
) -> Result<Vec<u8>, StateFsError> {
    if let Some(secret) = read_secret(path, len)? {
        return Ok(secret);
    }
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut bytes = vec![0u8; len];
    fill(&mut bytes).map_err(|e| StateFsError::io("generate", path, e))?;
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // A leftover of a crashed process with our pid: it is ours to remove.
    let _ = fs::remove_file(&temp);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file =
        no_follow(&mut options).open(&temp).map_err(|e| StateFsError::io("create", &temp, e))?;
    let written = file.write_all(&bytes).and_then(|()| file.sync_all());
    drop(file);
    // A link fails if anything is at `path` (another process's secret, a symlink): no
    // check-then-rename race. Where links are refused, a rename that does not replace.
    let linked = written.and_then(|()| match fs::hard_link(&temp, path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => rename_no_replace(&temp, path),
        other => other,
    });
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => sync_dir(&dir).map_err(|e| StateFsError::io("fsync", &dir, e))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StateFsError::io("create", path, e)),
    }
    read_secret(path, len)?
        .ok_or_else(|| StateFsError::io("read", path, io::ErrorKind::NotFound.into()))
}

/// The secret at `path` ([`secret_file`]), `None` when there is no file.
fn read_secret(path: &Path, len: usize) -> Result<Option<Vec<u8>>, StateFsError> {
    let file = match no_follow(OpenOptions::new().read(true)).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StateFsError::io("read", path, e)),
    };
    let meta = file.metadata().map_err(|e| StateFsError::io("inspect", path, e))?;
    if !meta.is_file() {
        return Err(StateFsError::Unsafe { path: path.to_path_buf() });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            file.set_permissions(fs::Permissions::from_mode(0o600))
                .map_err(|e| StateFsError::io("narrow the mode of", path, e))?;
        }
    }
    let cap = u64::try_from(len).unwrap_or(u64::MAX);
    let bytes = read_bounded(&file, cap, &path.display().to_string());
    match bytes {
        Ok(bytes) if bytes.len() == len => Ok(Some(bytes)),
        Ok(_) | Err(StateFsError::TooLarge { .. }) => Err(StateFsError::io(
            "read",
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a secret of {len} bytes (kept as it is: restore it from a backup)"),
            ),
        )),
        Err(error) => Err(error),
    }
}

/// Renames `from` to `to` unless `to` exists (an empty directory counts as free, as
/// `rename(2)` allows: an existing empty `--dir` is initialized in place of it).
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    match fs::symlink_metadata(to) {
        Ok(meta) if meta.is_dir() && !meta.file_type().is_symlink() => {
            // rename(2) replaces an empty directory and fails on a non-empty one.
            fs::rename(from, to).map_err(|e| match e.raw_os_error() {
                #[cfg(unix)]
                Some(code) if code == libc::ENOTEMPTY || code == libc::EEXIST => {
                    io::Error::new(io::ErrorKind::DirectoryNotEmpty, "the directory is not empty")
                }
                _ => e,
            })
        }
        Ok(_) => Err(io::Error::new(io::ErrorKind::AlreadyExists, "it exists")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::rename(from, to),
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_never_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.txt");
        fs::write(&outside, "precious").unwrap();
        let state = dir.path().join("state");
        fs::create_dir(&state).unwrap();
        let path = state.join("cli.json");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert!(!fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    }

    #[cfg(unix)]
    #[test]
    fn a_lock_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, dir.path().join("lock")).unwrap();
        let error =
            StateLock::acquire(&dir.path().join("lock"), Duration::ZERO, "t", |_| {}).unwrap_err();
        assert!(matches!(error, StateFsError::Unsafe { .. }), "{error}");
        assert!(!target.exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_is_created_once_owner_only_and_never_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenant.key");
        let outside = dir.path().join("outside");
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        let refused = secret_file(&path, 8, |b| {
            b.fill(1);
            Ok(())
        });
        assert!(matches!(refused, Err(StateFsError::Unsafe { .. })), "{refused:?}");
        assert!(!outside.exists());
        fs::remove_file(&path).unwrap();
        let secret = secret_file(&path, 8, |b| {
            b.copy_from_slice(b"12345678");
            Ok(())
        })
        .unwrap();
        assert_eq!(secret, b"12345678");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(secret_file(&path, 8, |_| Ok(())).unwrap(), b"12345678");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        fs::write(&path, b"short").unwrap();
        assert!(secret_file(&path, 8, |_| Ok(())).is_err(), "a damaged secret is reported");
        assert_eq!(fs::read(&path).unwrap(), b"short", "and kept");
    }

    #[test]
    fn atomic_directories_appear_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("state");
        let failed: Result<(), StateFsError> = create_dir_atomically(&target, "m", |temp| {
            fs::write(temp.join("half"), "x").unwrap();
            Err(StateFsError::TooLarge { what: "x".into(), cap: 0 })
        });
        assert!(failed.is_err());
        assert!(!target.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "the temp directory is gone");
        create_dir_atomically::<StateFsError>(&target, "m", |temp| {
            fs::write(temp.join("whole"), "x").map_err(|e| StateFsError::io("w", temp, e))
        })
        .unwrap();
        assert!(target.join("whole").is_file());
        let again = create_dir_atomically::<StateFsError>(&target, "whole", |temp| {
            fs::write(temp.join("whole"), "y").map_err(|e| StateFsError::io("w", temp, e))
        });
        assert!(
            matches!(again, Err(StateFsError::Io { ref source, .. }) if source.kind() == io::ErrorKind::AlreadyExists)
        );
        assert!(target.join("whole").is_file(), "an existing directory is never touched");

        // What a killed caller left long ago goes; a fresh one (a concurrent caller's) stays.
        let old = dir.path().join(".other.init-12345");
        let fresh = dir.path().join(".other.init-12346");
        let foreign = dir.path().join(".other.init-backup");
        for path in [&old, &fresh, &foreign] {
            fs::create_dir(path).unwrap();
        }
        let long_ago = std::time::SystemTime::now() - STALE_TEMP_DIR_AGE * 2;
        for path in [&old, &foreign] {
            File::open(path).unwrap().set_modified(long_ago).unwrap();
        }
        create_dir_atomically::<StateFsError>(&dir.path().join("other"), "m", |_| Ok(())).unwrap();
        assert!(!old.exists());
        assert!(fresh.exists() && foreign.exists());
    }
}
