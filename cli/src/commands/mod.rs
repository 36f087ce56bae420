//! One module per command; [`dispatch`] runs the one the command line names.

mod add;
mod build;
mod checkpoints;
mod compress;
mod entity;
mod forget;
mod import;
mod init;
#[cfg(feature = "proxy")]
mod proxy;
mod prune;
mod search;
mod stats;
#[cfg(feature = "proxy")]
mod stats_proxy;
mod task;
mod trim;

use ctxwin_core::Config;

use super::args::{Cli, Command};
use super::error::CliError;
use super::input;
use super::output::Output;
use super::state::{self, Checkpointing, Globals, Workspace};
use ctxwin_std::session::Session;

/// Runs the command `cli` names and returns what to print.
pub(crate) fn dispatch(cli: &Cli) -> Result<Output, CliError> {
    let globals = Globals {
        dir: &cli.dir,
        tokenizer: cli.tokenizer.as_deref(),
        llm_url: cli.llm_url.as_deref(),
        embeddings: (cli.embeddings_url.as_deref(), cli.embeddings_model.as_deref()),
        command: name(&cli.command),
    };
    let same = |config: Config| config;
    match &cli.command {
        Command::Init(args) => init::run(&globals, args),
        Command::Trim(args) => trim::run(&globals, args),
        Command::Checkpoints => checkpoints::list(&globals),
        #[cfg(feature = "proxy")]
        Command::Proxy(args) => proxy::run(&globals, args),
        #[cfg(not(feature = "proxy"))]
        Command::Proxy(_) => Err(CliError::without_feature("proxy", "`ctxwin proxy`")),
        Command::Prune(args) => prune::run(&globals, args),
        Command::Add(args) => {
            // Input is read (bounded) before the state is locked: a slow pipe blocks no one.
            state::StateDir::new(globals.dir).require()?;
            let message = add::message(args, state::input_limit(&globals))?;
            on_session(&globals, "add", same, Checkpointing::WhenChanged, |s, w| {
                add::run(s, w, args, &message)
            })
        }
        Command::Import(args) => {
            state::StateDir::new(globals.dir).require()?;
            let limit = state::input_limit(&globals);
            let read = input::read_timed(&args.file, args.format.map(Into::into), limit)?;
            on_session(&globals, "import", same, Checkpointing::WhenChanged, |s, w| {
                import::run(s, w, args, read)
            })
        }
        Command::Build(args) => {
            on_session(&globals, "build", same, Checkpointing::WhenChanged, |s, w| {
                build::run(s, w, args)
            })
        }
        #[cfg(feature = "proxy")]
        Command::Stats(args) if args.proxy => stats_proxy::run(&globals),
        #[cfg(not(feature = "proxy"))]
        Command::Stats(args) if args.proxy => {
            Err(CliError::without_feature("proxy", "`ctxwin stats --proxy`"))
        }
        Command::Stats(_) => on_session(&globals, "stats", same, Checkpointing::Never, stats::run),
        Command::Compress(args) => on_session(
            &globals,
            "compress",
            |config| compress::compress_config(config, args),
            Checkpointing::WhenChanged,
            |s, w| compress::compress(s, w, args),
        ),
        Command::Summarize(args) => on_session(
            &globals,
            "summarize",
            |config| compress::summarize_config(config, args),
            Checkpointing::WhenChanged,
            |s, w| compress::summarize(s, w, args),
        ),
        Command::Checkpoint => {
            on_session(&globals, "checkpoint", same, Checkpointing::Never, checkpoints::write)
        }
        Command::Restore(args) => checkpoints::restore(&globals, args),
        Command::Recover => checkpoints::recover(&globals),
        Command::Search(args) => {
            on_session(&globals, "search", same, Checkpointing::Never, |s, w| {
                search::run(s, w, args)
            })
        }
        // Forget rewrites every checkpoint itself.
        Command::Forget(args) => {
            on_session(&globals, "forget", same, Checkpointing::Never, |s, _| forget::run(s, args))
        }
        Command::Entity(args) => {
            // An update checkpoints itself (the forgotten value's checkpoints are rewritten).
            on_session(&globals, "entity", same, Checkpointing::Never, |s, _| entity::run(s, args))
        }
        Command::Task(args) => {
            on_session(&globals, "task", same, Checkpointing::WhenChanged, |s, _| {
                task::run(s, args)
            })
        }
    }
}

/// The command's name, as the command line spells it.
fn name(command: &Command) -> &'static str {
    match command {
        Command::Init(_) => "init",
        Command::Add(_) => "add",
        Command::Import(_) => "import",
        Command::Build(_) => "build",
        Command::Stats(_) => "stats",
        Command::Compress(_) => "compress",
        Command::Summarize(_) => "summarize",
        Command::Checkpoint => "checkpoint",
        Command::Checkpoints => "checkpoints",
        Command::Restore(_) => "restore",
        Command::Recover => "recover",
        Command::Search(_) => "search",
        Command::Prune(_) => "prune",
        Command::Trim(_) => "trim",
        Command::Forget(_) => "forget",
        Command::Entity(_) => "entity",
        Command::Proxy(_) => "proxy",
        Command::Task(_) => "task",
    }
}

/// Loads the state directory, opens its session (strictly: a damaged newest checkpoint is an
/// error) with the configuration `adjust`ed for this process, and runs `command` on it.
fn on_session(
    globals: &Globals<'_>,
    name: &str,
    adjust: impl FnOnce(Config) -> Config,
    checkpointing: Checkpointing,
    command: impl FnOnce(&mut Session, &mut Workspace) -> Result<Output, CliError>,
) -> Result<Output, CliError> {
    let mut workspace = Workspace::load(globals)?;
    let session = workspace.open(true, adjust)?;
    state::run(&mut workspace, session, name, checkpointing, command)
}
