//! `ctxwin init`: a new state directory with its configuration, archive and first checkpoint
//! (the archive and checkpoint in the state directory, or in the PostgreSQL database of
//! `[store] url` / `CTXWIN_STORE_URL`).

use std::fs;
use std::io::Write;
use std::path::Path;

use serde_json::json;

use crate::args::InitArgs;
use crate::config_file::{self, FileConfig};
use crate::error::CliError;
use crate::llm;
use crate::output::{Output, pairs, thousands};
use crate::state::{self, Globals, StateDir, Workspace};
use ctxwin_std::statefs;
use ctxwin_std::store::{self, Location, Scope};

pub(crate) fn run(globals: &Globals<'_>, args: &InitArgs) -> Result<Output, CliError> {
    let dir = StateDir::new(globals.dir);
    if let Found::HalfMade = inspect(&dir)? {
        return complete(&dir, args, globals);
    }
    let (text, origin) = match &args.config {
        Some(path) => {
            let text = fs::read_to_string(path).map_err(|e| CliError::io("read", path, &e))?;
            (text, path.clone())
        }
        None => (config_file::default_toml(), dir.config()),
    };
    // Everything is checked before anything is created.
    let config = FileConfig::parse(&text, &origin)?;
    let location = dir.location(&config)?;
    state::counter(globals.tokenizer, config.tokenizer_path(&dir.base()))?;
    llm::client(globals.llm_url, &config.llm)?;
    crate::embeddings::embedder(globals.embeddings, &config.embeddings)?;
    // Built in a temporary directory and renamed into place: a killed `init` leaves nothing
    // behind that looks like a state, and of two concurrent ones exactly one wins while the
    // other touches nothing of its.
    let mut checkpoint = String::new();
    let made = statefs::create_dir_atomically(dir.root(), config_file::FILE_NAME, |temp| {
        checkpoint = create(temp, &text, &location, globals)?;
        Ok::<(), CliError>(())
    });
    match made {
        Ok(()) => Ok(report(&dir, &config, &location, &checkpoint, globals)),
        Err(_) if dir.config().exists() => Err(CliError::NoState(format!(
            "{} already holds a ctxwin state (another `ctxwin init` made it just now)",
            dir.root().display()
        ))),
        Err(error) => Err(error),
    }
}

/// What `init` finds in its directory.
enum Found {
    /// No state: a new one is made.
    Nothing,
    /// A configuration and no checkpoint, with no message stored: what an `init` killed
    /// before it finished (or a configuration written by hand) leaves; `init` completes it.
    HalfMade,
}

/// An existing state is never overwritten: a complete one, or one whose store holds
/// messages, is refused; a configuration alone (with an empty store or none) is half-made.
fn inspect(dir: &StateDir) -> Result<Found, CliError> {
    let root = dir.root();
    if root.exists() && !root.is_dir() {
        return Err(CliError::Io(format!(
            "{} is a file, not a directory; pass another --dir",
            root.display()
        )));
    }
    let taken = || {
        CliError::NoState(format!(
            "{} already holds a ctxwin state; use it as it is, pass another --dir, or remove the directory first",
            root.display()
        ))
    };
    if !dir.config().exists() {
        return match dir.archive().exists() || dir.checkpoints().exists() {
            true => Err(taken()),
            false => Ok(Found::Nothing),
        };
    }
    dir.refuse_symlinks()?;
    let config = FileConfig::load(&dir.config())?;
    let location = dir.location(&config)?;
    let scope = Scope::local(config.session.as_str());
    if !store::open_checkpoints(&location, &scope)?.ids(&scope)?.is_empty() {
        return Err(taken());
    }
    let archive_exists = !matches!(location, Location::Directory(_)) || dir.archive().exists();
    if archive_exists
        && let Some(last) = store::open_bound(&location, &scope)?.archive.max_id(&scope)?
    {
        return Err(CliError::Corrupt(format!(
            "{} holds messages (up to id {last}) but no checkpoint; restore checkpoints/ from a backup, or run `ctxwin recover` to rebuild the context from the archive",
            root.display()
        )));
    }
    Ok(Found::HalfMade)
}

/// Completes a half-made state with its own configuration: the store's missing parts and
/// the first checkpoint.
fn complete(dir: &StateDir, args: &InitArgs, globals: &Globals<'_>) -> Result<Output, CliError> {
    if args.config.is_some() {
        return Err(CliError::NoState(format!(
            "{} already has its {}; run `ctxwin init` without --config to complete the state with it, or remove the file first",
            dir.root().display(),
            config_file::FILE_NAME
        )));
    }
    let config = FileConfig::load(&dir.config())?;
    let location = dir.location(&config)?;
    if let Location::Directory(_) = location {
        fs::create_dir_all(dir.checkpoints())
            .map_err(|e| CliError::io("create", &dir.checkpoints(), &e))?;
        let scope = Scope::local(config.session.as_str());
        drop(store::open_bound(&location, &scope)?);
    }
    let workspace = Workspace::load(globals)?;
    let scope = workspace.scope();
    // Another `init` may have completed it while this one waited for the lock.
    let checkpoint = match workspace.ports.checkpoints.ids(&scope)?.into_iter().next() {
        Some(newest) => newest.to_string(),
        None => workspace.builder(workspace.config.context).build()?.checkpoint()?.to_string(),
    };
    Ok(report(dir, &config, &location, &checkpoint, globals))
}

/// Writes the configuration in `root` (a temporary directory that becomes the state
/// directory), creates the store when it is that directory (its archive and checkpoints
/// directory), and writes the first checkpoint.
fn create(
    root: &Path,
    text: &str,
    location: &Location,
    globals: &Globals<'_>,
) -> Result<String, CliError> {
    let dir = StateDir::new(root);
    let path = dir.config();
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| CliError::io("create", &path, &e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| CliError::io("write", &path, &e))?;
    if let Location::Directory(_) = location {
        fs::create_dir_all(dir.checkpoints())
            .map_err(|e| CliError::io("create", &dir.checkpoints(), &e))?;
        let session = FileConfig::parse(text, &path)?.session;
        drop(store::open_bound(&Location::Directory(root.to_path_buf()), &Scope::local(session))?);
    }
    let globals = Globals { dir: root, ..*globals };
    let workspace = Workspace::load(&globals)?;
    let mut session = workspace.builder(workspace.config.context).build()?;
    Ok(session.checkpoint()?.to_string())
}

fn report(
    dir: &StateDir,
    config: &FileConfig,
    location: &Location,
    checkpoint: &str,
    globals: &Globals<'_>,
) -> Output {
    let context = &config.context;
    let counter = if globals.tokenizer.is_some() || config.tokenizer.is_some() {
        "exact"
    } else {
        "estimator"
    };
    let root = display(dir.root());
    let text = format!(
        "initialized {root}\n{}next: `ctxwin add user \"…\"` or `ctxwin import <file>`; edit {} to change budgets\n",
        pairs(&[
            ("session", config.session.clone()),
            ("strategy", context.strategy.to_string()),
            (
                "budget",
                format!(
                    "{} tokens ({} window - {} reply)",
                    thousands(context.budget()),
                    thousands(context.context_window),
                    thousands(context.reserved_for_reply)
                )
            ),
            ("counter", counter.to_string()),
            ("store", store_name(location)),
            ("checkpoint", checkpoint.to_string()),
        ]),
        display(&dir.config()),
    );
    let json = json!({
        "dir": root,
        "session": config.session,
        "strategy": context.strategy.as_str(),
        "budget": context.budget(),
        "counter": counter,
        "store": store_name(location),
        "checkpoint": checkpoint,
    });
    Output::report(text, json)
}

/// The store, for people: "this directory" or the database without its password.
fn store_name(location: &Location) -> String {
    match location {
        Location::Directory(_) => "this directory (archive.db, checkpoints/)".into(),
        Location::Postgres(_) => location.to_string(),
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
