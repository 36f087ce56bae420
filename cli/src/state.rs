//! The state directory and the session a command runs on: restored from the latest checkpoint
//! at start, checkpointed at the end when the command changed it.
//!
//! ```text
//! .ctxwin/
//!   ctxwin.toml     configuration (`ctxwin init` writes it commented)
//!   archive.db      SQLite archive: every message, summaries with their sources
//!   checkpoints/    crash-safe checkpoints, newest kept
//!   cli.json        the command line's own counters (retrieved items, last compression)
//!   lock            locked while a command runs, so concurrent commands take turns
//! ```
//!
//! With a PostgreSQL store (`[store] url` or `CTXWIN_STORE_URL`) the archive and the
//! checkpoints are in the database instead (no `archive.db`, no `checkpoints/`): commands
//! reach them through the storage ports ([`Ports`]) that [`store::open_bound`] returns
//! either way, and the session holds the conversation's lease while it writes.

use std::io::Write;
use std::path::{Path, PathBuf};

use ctxwin_core::{Config, stats::Counters};

use super::config_file::{self, FileConfig};
use super::embeddings;
use super::error::CliError;
use super::llm;
use super::notes::{Compression, Notes};
use std::time::{Duration, Instant};

use super::llm::LlmClient;
use ctxwin_std::embed::Embedder;
use ctxwin_std::session::{Counter, Session, SessionBuilder};
use ctxwin_std::statefs::{self, StateLock};
use ctxwin_std::store::{self, ErrorKind, Location, Ports, STORE_URL_VAR, Scope};
#[cfg(feature = "tokenizers")]
use ctxwin_std::tokens::ExactCounter;
use std::sync::Arc;

/// The flags every command shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Globals<'a> {
    /// `--dir`.
    pub dir: &'a Path,
    /// `--tokenizer`.
    pub tokenizer: Option<&'a str>,
    /// `--llm-url` (or `CTXWIN_LLM_URL`).
    pub llm_url: Option<&'a str>,
    /// `--embeddings-url` and `--embeddings-model` (or `CTXWIN_EMBED_URL`, `CTXWIN_EMBED_MODEL`).
    pub embeddings: (Option<&'a str>, Option<&'a str>),
    /// The command's name, written into the lock file for those who wait on it.
    pub command: &'a str,
}

/// Paths inside a state directory.
#[derive(Clone, Debug)]
pub(crate) struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub(crate) fn new(root: &Path) -> StateDir {
        StateDir { root: root.to_path_buf() }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn config(&self) -> PathBuf {
        self.root.join(config_file::FILE_NAME)
    }

    pub(crate) fn archive(&self) -> PathBuf {
        self.root.join("archive.db")
    }

    pub(crate) fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// Where the archive and checkpoints of this directory's session are: `[store] url`
    /// of `config`, overridden by [`STORE_URL_VAR`], else this directory.
    pub(crate) fn location(&self, config: &FileConfig) -> Result<Location, CliError> {
        match Location::resolve(config.store_url.as_deref(), &self.root) {
            Location::Directory(dir) if dir != self.root => Err(CliError::Config(format!(
                "{STORE_URL_VAR}={} is not a postgres:// URL; unset it to keep the store in {}",
                dir.display(),
                self.root.display()
            ))),
            location => Ok(location),
        }
    }

    pub(crate) fn notes(&self) -> PathBuf {
        self.root.join("cli.json")
    }

    pub(crate) fn lock_path(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// Waits up to `wait` until no other command works on this directory (saying once on
    /// standard error who holds it), and keeps it so until the returned lock is dropped (the
    /// operating system releases it if the process dies).
    pub(crate) fn lock(&self, wait: Duration, command: &str) -> Result<StateLock, CliError> {
        let path = self.lock_path();
        let root = self.root.display().to_string();
        Ok(StateLock::acquire(&path, wait, &format!("ctxwin {command}"), |holder| {
            let _ = writeln!(
                std::io::stderr(),
                "waiting for {root}: {holder} holds its lock (up to {} s)",
                wait.as_secs()
            );
        })?)
    }

    /// Refuses a state directory where one of ctxwin's files is a symlink (or not the kind of
    /// file it should be): nothing is ever written outside the directory.
    pub(crate) fn refuse_symlinks(&self) -> Result<(), CliError> {
        let archive = self.archive();
        let sidecar = |suffix: &str| {
            let mut name = archive.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        let in_place = [
            self.lock_path(),
            sidecar("-wal"),
            sidecar("-shm"),
            sidecar("-journal"),
            archive.clone(),
        ];
        let replaced = [self.config(), self.notes()];
        Ok(statefs::refuse_symlinks(&in_place, &replaced, &[self.checkpoints()])?)
    }

    /// The directory relative paths in the configuration start from: the one holding the
    /// state directory.
    pub(crate) fn base(&self) -> PathBuf {
        match self.root.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// Checks the directory holds a configuration; says what to do when it does not.
    pub(crate) fn require(&self) -> Result<(), CliError> {
        let root = self.root.display();
        if !self.root.is_dir() {
            return Err(CliError::NoState(format!(
                "no ctxwin state in {root}; run `ctxwin init` first (or pass --dir)"
            )));
        }
        if !self.config().is_file() {
            return Err(CliError::NoState(format!(
                "{root} holds no {}; run `ctxwin init` there, or pass the right --dir",
                config_file::FILE_NAME
            )));
        }
        Ok(())
    }

    /// Checks the store at `location` is complete when it is this directory (a database is
    /// checked by opening it).
    pub(crate) fn require_store(&self, location: &Location) -> Result<(), CliError> {
        if !matches!(location, Location::Directory(_)) {
            return Ok(());
        }
        let root = self.root.display();
        for (path, what) in [(self.archive(), "archive.db"), (self.checkpoints(), "checkpoints/")] {
            if !path.exists() {
                return Err(CliError::Corrupt(format!(
                    "{root} is incomplete: {what} is missing; restore it from a backup, run `ctxwin init` to complete a state that holds no message yet, or `ctxwin recover` to rebuild the context from the archive"
                )));
            }
        }
        Ok(())
    }

    /// Makes an empty `checkpoints/` again in a state directory whose archive is there and
    /// whose checkpoints directory is gone, so that `recover` can rebuild the context from
    /// the archive; does nothing otherwise (a missing configuration or archive is reported
    /// by [`Workspace::load`]).
    pub(crate) fn recreate_checkpoints_dir(&self) -> Result<(), CliError> {
        if !self.config().is_file() || !self.archive().is_file() || self.checkpoints().exists() {
            return Ok(());
        }
        self.refuse_symlinks()?;
        let config = FileConfig::load(&self.config())?;
        if let Location::Directory(_) = self.location(&config)? {
            let path = self.checkpoints();
            std::fs::create_dir(&path).map_err(|e| CliError::io("create", &path, &e))?;
        }
        Ok(())
    }
}

/// The input cap of the state directory `globals` names (`[limits] max_input_bytes`), read
/// before anything is locked; the default when the configuration cannot be read (the command
/// then reports that).
pub(crate) fn input_limit(globals: &Globals<'_>) -> u64 {
    let dir = StateDir::new(globals.dir);
    FileConfig::load(&dir.config())
        .map_or(statefs::DEFAULT_MAX_INPUT_BYTES, |config| config.limits.max_input_bytes)
}

/// The token counter: `--tokenizer` (relative to the working directory), else the file's
/// `[tokenizer] path`, else the estimator.
pub(crate) fn counter(flag: Option<&str>, file: Option<PathBuf>) -> Result<Counter, CliError> {
    let (path, origin) = match (flag, file) {
        (Some(flag), _) => (PathBuf::from(flag), "--tokenizer"),
        (None, Some(path)) => (path, "[tokenizer] path"),
        (None, None) => return Ok(Counter::default()),
    };
    exact(&path, origin)
}

#[cfg(feature = "tokenizers")]
fn exact(path: &Path, origin: &str) -> Result<Counter, CliError> {
    let loaded = match path.to_str() {
        Some("cl100k") => ExactCounter::cl100k(),
        Some("smollm2") => ExactCounter::smollm2(),
        _ => ExactCounter::from_file(path),
    };
    loaded.map(Counter::Exact).map_err(|e| {
        CliError::Config(format!(
            "{origin} {}: {e}; give a Hugging Face tokenizer.json, or cl100k or smollm2",
            path.display()
        ))
    })
}

#[cfg(not(feature = "tokenizers"))]
fn exact(_: &Path, origin: &str) -> Result<Counter, CliError> {
    Err(CliError::without_feature("tokenizers", origin))
}

/// A state directory with its configuration, LLM client and notes, ready to build sessions.
pub(crate) struct Workspace {
    pub dir: StateDir,
    pub config: FileConfig,
    pub llm: Option<LlmClient>,
    /// The embeddings server for hybrid recall, when one is configured.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Until when the command waits for the model's answers: `[llm] wait_secs` from the
    /// moment the state was locked, for all waits of the command together.
    llm_deadline: Option<Instant>,
    pub notes: Notes,
    /// Where the archive and the checkpoints are.
    pub location: Location,
    /// The archive and checkpoint ports of the session's store.
    pub ports: Ports,
    counter: Counter,
    /// Held while the command runs.
    _lock: StateLock,
}

impl Workspace {
    /// Loads the state directory's configuration, counter, LLM settings and notes.
    pub(crate) fn load(globals: &Globals<'_>) -> Result<Workspace, CliError> {
        let dir = StateDir::new(globals.dir);
        dir.require()?;
        dir.refuse_symlinks()?;
        // Read-only and never written by a command: read before the lock, for its wait.
        let config = FileConfig::load(&dir.config())?;
        let location = dir.location(&config)?;
        dir.require_store(&location)?;
        let lock = dir.lock(config.limits.lock_wait, globals.command)?;
        let counter = counter(globals.tokenizer, config.tokenizer_path(&dir.base()))?;
        let llm = llm::client(globals.llm_url, &config.llm)?;
        let embedder = embeddings::embedder(globals.embeddings, &config.embeddings)?;
        let notes = Notes::load(&dir.notes())?;
        let ports = store::open_bound(&location, &Scope::local(config.session.as_str()))?;
        let llm_deadline = Instant::now().checked_add(llm::wait(&config.llm));
        Ok(Workspace {
            dir,
            config,
            llm,
            embedder,
            llm_deadline,
            notes,
            location,
            ports,
            counter,
            _lock: lock,
        })
    }

    /// The session's scope in the store.
    pub(crate) fn scope(&self) -> Scope {
        Scope::local(self.config.session.as_str())
    }

    /// A session builder over this directory's store with `config`, restoring the latest
    /// checkpoint.
    pub(crate) fn builder(&self, config: Config) -> SessionBuilder {
        let builder = SessionBuilder::new(self.config.session.as_str())
            .config(config)
            .counter(self.counter.clone())
            .ports(self.ports.clone())
            .checkpoint_interval_messages(self.config.checkpoint_interval_messages)
            .keep_checkpoints(self.config.keep_checkpoints)
            .retrieval(self.config.retrieval)
            .task_detection(self.config.task_detection)
            .restore_latest(true);
        let builder = match &self.embedder {
            Some(embedder) => builder.embedder(embedder.clone()),
            None => builder,
        };
        llm::attach_llm(builder, self.llm.as_ref())
    }

    /// Opens the session, continuing from the newest checkpoint. With `strict`, a newest
    /// checkpoint that is damaged or does not restore is an error (nothing is silently
    /// skipped); `restore` opens without it to get past one. `adjust` changes the
    /// configuration for this process only (a forced compression).
    pub(crate) fn open(
        &self,
        strict: bool,
        adjust: impl FnOnce(Config) -> Config,
    ) -> Result<Session, CliError> {
        let scope = self.scope();
        let sink = self.ports.checkpoints.as_ref();
        let newest = sink.ids(&scope)?.into_iter().next();
        if strict && let Some(newest) = &newest {
            match sink.load(&scope, newest) {
                Ok(_) => {}
                Err(error) if error.kind() == ErrorKind::Damaged => {
                    return Err(CliError::Corrupt(format!(
                        "{error}; `ctxwin restore latest` continues from the newest intact checkpoint (`ctxwin checkpoints` lists them)"
                    )));
                }
                Err(error) => return Err(error.into()),
            }
        }
        let session = self.builder(adjust(self.config.context)).build()?;
        let restored = session.stats()?.last_checkpoint;
        if strict
            && let Some(newest) = newest
            && restored.as_deref() != Some(newest.as_str())
        {
            return Err(CliError::Corrupt(format!(
                "the newest checkpoint {newest} does not restore for session {:?} (restored {}); check `session` in ctxwin.toml, or run `ctxwin restore latest`",
                self.config.session,
                restored.as_deref().unwrap_or("none"),
            )));
        }
        Ok(session)
    }

    /// How much of the command's wait for the model's answers is left.
    pub(crate) fn llm_wait(&self) -> Duration {
        self.llm_deadline
            .map_or(Duration::ZERO, |deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// Where the LLM stands, for reports.
    pub(crate) fn llm_description(&self) -> String {
        llm::describe(self.llm.as_ref())
    }
}

/// What a session looks like from outside, to tell whether a command changed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    next_id: u64,
    used: u32,
    counters: Counters,
}

impl Mark {
    fn of(session: &Session) -> Mark {
        let manager = session.manager();
        Mark {
            next_id: manager.next_id(),
            used: manager.used(),
            counters: manager.stats().counters,
        }
    }
}

/// How a command uses the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checkpointing {
    /// Checkpoint at the end when the command changed the session.
    WhenChanged,
    /// Never (the command writes its own, or only reads).
    Never,
}

/// Runs `command` (named `name` in the notes) on the opened session, then checkpoints when it
/// changed the session — also when the command failed half-way, so that what reached the
/// archive is covered by a checkpoint.
pub(crate) fn run<T>(
    workspace: &mut Workspace,
    mut session: Session,
    name: &str,
    checkpointing: Checkpointing,
    command: impl FnOnce(&mut Session, &mut Workspace) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let before = Mark::of(&session);
    let result = command(&mut session, workspace);
    // The model's answers are applied before the checkpoint: the worker dies with the process.
    llm::settle(&mut session, workspace.llm_wait());
    let after = Mark::of(&session);
    if after != before
        && checkpointing == Checkpointing::WhenChanged
        && let Err(error) = session.checkpoint()
    {
        let error = CliError::from(error);
        return match result {
            Ok(_) => Err(error.context("the command ran but its checkpoint failed")),
            Err(first) => {
                tracing::warn!(%error, "cli: checkpoint after a failed command failed too");
                Err(first)
            }
        };
    }
    let (was, now) = (before.counters, after.counters);
    if now.units_evicted > was.units_evicted || now.summaries_added > was.summaries_added {
        workspace.notes.last_compression = Some(Compression {
            at_ms: super::notes::now_ms(),
            command: name.to_string(),
            units_evicted: now.units_evicted.saturating_sub(was.units_evicted),
            tokens_evicted: now.tokens_evicted.saturating_sub(was.tokens_evicted),
            summaries: now.summaries_added.saturating_sub(was.summaries_added),
            tokens_after: after.used,
        });
    }
    workspace.notes.save_if_changed(&workspace.dir.notes())?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_says_run_init() {
        let dir = tempfile::tempdir().unwrap();
        let error = StateDir::new(&dir.path().join("nope")).require().unwrap_err();
        assert_eq!(error.exit(), crate::Exit::NoState);
        assert!(error.to_string().contains("run `ctxwin init`"), "{error}");
    }

    #[test]
    fn relative_paths_start_next_to_the_state_directory() {
        assert_eq!(StateDir::new(Path::new(".ctxwin")).base(), PathBuf::from("."));
        assert_eq!(StateDir::new(Path::new("/p/.ctxwin")).base(), PathBuf::from("/p"));
    }

    #[test]
    fn unknown_tokenizers_are_configuration_errors() {
        let error = counter(Some("/no/such/tokenizer.json"), None).unwrap_err();
        assert_eq!(error.exit(), crate::Exit::Config);
        assert!(counter(None, None).is_ok());
    }
}
