//! The `ctxwin` command-line tool: a persistent context window driven from the shell.
//!
//! State lives in a directory (`.ctxwin/` by default, `--dir` to change): `ctxwin.toml`, the
//! SQLite archive and the checkpoints — or, with `[store] url = "postgres://…"` (or
//! `CTXWIN_STORE_URL`), the archive and checkpoints in a PostgreSQL database shared by a
//! fleet. Each command is one process: it restores the session
//! from the newest checkpoint, runs, and writes a checkpoint when it changed anything, so a
//! restart continues where the last command left off. Everything works with the embedded
//! defaults (the estimator, the extractive summarizer, no server); `--tokenizer` counts
//! exactly, and `--llm-url` (or the `[llm]` section of `ctxwin.toml`) names an
//! OpenAI-compatible server: the session then has the model rewrite its summaries and extract
//! entities in the background, and each command waits up to `wait_secs` for the answers
//! before it saves (the extractive text stays when the model fails).
//!
//! This crate is the `ctxwin` binary's library: it uses only `ctxwin-std`'s public API (the
//! configuration file, command-line parsing and progress bars live here, so `ctxwin-std`
//! does not depend on `toml`, `clap` or `indicatif`).
//!
//! | command | what it does |
//! |---|---|
//! | `init [--config FILE]` | creates the state directory with a commented configuration |
//! | `add <role> <content>` | one message (`--tool-call-id`, `--tool-calls`, `--level`, `--important`) |
//! | `import <file>` | an OpenAI or Anthropic JSON/JSONL conversation (`--format`, else detected) |
//! | `build` | the payload to standard output, with archived turns recalled for the newest user message or `--retrieve QUERY` into the free room (`--format`, `--dynamic`, `--no-retrieve`) |
//! | `stats` | tokens used per level, messages, summaries, compression, retrieved items |
//! | `compress` / `summarize` | compression now (`--target PERCENT`) / a summary now (`--keep N`) |
//! | `checkpoint`, `checkpoints`, `restore <id\|latest>` | checkpoints by hand |
//! | `recover` | rebuild the context from the archive (every checkpoint damaged, or not its archive's) |
//! | `search <query>` / `search --summary ID` | archive search, drill-down into a summary |
//! | `forget <id>` / `forget --match TEXT` | a message or a text out of the window, archive and checkpoints |
//! | `prune --keep N [--all]` / `prune --delete NAME` | old checkpoints, or a whole conversation, out of the store |
//! | `trim --budget N <file\|->` | stateless: the payload ctxwin would send for a conversation |
//! | `proxy --upstream URL` | the OpenAI/Anthropic proxy of `ctxwin-proxy`, state in `DIR/proxy/` or the `[store] url` database (`--listen`, `--max-resident`) |
//!
//! `--json` prints every report as JSON. Errors are one line on standard error, with the
//! distinct exit codes of [`Exit`]; no input makes the tool panic, and a damaged state
//! directory is reported, never reset.
//!
//! Cargo features, all on by default: `sqlite` (state directories), `http` (`--llm-url`,
//! `--embeddings-url`), `tokenizers` (`--tokenizer`), `proxy` (`ctxwin proxy`). Built with
//! `--no-default-features`, `ctxwin trim` works as always with the estimator and builds in a
//! fraction of the time; what needs a missing feature exits with code 8 naming it.
//!
//! # Examples
//!
//! ```
//! use ctxwin_cli::{Exit, run};
//! let dir = tempfile::tempdir()?;
//! let state = dir.path().join("state");
//! let state = state.to_str().unwrap();
//! assert_eq!(run(["ctxwin", "--dir", state, "init"]), Exit::Ok);
//! assert_eq!(run(["ctxwin", "--dir", state, "add", "user", "Is CI green?"]), Exit::Ok);
//! assert_eq!(run(["ctxwin", "--dir", state, "init"]), Exit::NoState);
//! assert_eq!(run(["ctxwin", "--dir", state, "restore", "not-an-id"]), Exit::BadInput);
//! # Ok::<(), std::io::Error>(())
//! ```

mod args;
mod commands;
mod config_file;
mod embeddings;
mod error;
mod input;
mod llm;
mod notes;
mod output;
mod payload;
mod state;

use std::ffi::OsString;
use std::io::Write;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

pub use error::{CliError, Exit};

/// Runs `ctxwin` with `args` (the first is the program name): parses them, runs the command,
/// prints its output to standard output and any error as one line on standard error.
///
/// ```
/// assert_eq!(ctxwin_cli::run(["ctxwin", "--version"]), ctxwin_cli::Exit::Ok);
/// assert_eq!(ctxwin_cli::run(["ctxwin", "frobnicate"]), ctxwin_cli::Exit::Usage);
/// ```
pub fn run<I, T>(args: I) -> Exit
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match args::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => return usage(&error, &args),
    };
    let result = commands::dispatch(&cli).and_then(|output| output.print(cli.json));
    match result {
        Ok(()) => Exit::Ok,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: {error}");
            error.exit()
        }
    }
}

/// The process's `main`: [`run`] over the real arguments, with a panic hook that turns a bug
/// into one line and exit code 1 instead of a backtrace.
pub fn main() -> std::process::ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(
            std::io::stderr(),
            "error: internal error ({info}); this is a bug in ctxwin, please report it"
        );
    }));
    let exit = std::panic::catch_unwind(|| run(std::env::args_os())).unwrap_or(Exit::Internal);
    std::process::ExitCode::from(exit.code())
}

/// Prints what clap found: help and version as they are, usage errors as one line.
fn usage(error: &clap::Error, args: &[OsString]) -> Exit {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            Exit::Ok
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            Exit::Usage
        }
        _ => {
            let line = one_line(&error.render().to_string(), || command_usage(args));
            let _ = writeln!(std::io::stderr(), "error: {line}");
            Exit::Usage
        }
    }
}

/// The usage of the subcommand `args` name (clap leaves it out of value errors).
fn command_usage(args: &[OsString]) -> String {
    let mut command = args::Cli::command();
    command.build();
    let name = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok()
        .and_then(|matches| matches.subcommand_name().map(str::to_string));
    let usage = match name.and_then(|name| command.find_subcommand_mut(name)) {
        Some(subcommand) => subcommand.render_usage(),
        None => command.render_usage(),
    };
    let usage = usage.to_string();
    usage.trim().strip_prefix("Usage:").unwrap_or(&usage).trim().to_string()
}

/// Clap's rendered error on one line: the message (a list after a colon joined with commas,
/// tips after semicolons), then the usage of the command it concerns (clap's, else
/// `fallback`'s) and where its help is.
///
/// "the following required arguments were not provided: --budget <TOKENS>, <FILE>; usage:
/// ctxwin trim --budget <TOKENS> <FILE> (see `ctxwin trim --help`)"
fn one_line(rendered: &str, fallback: impl FnOnce() -> String) -> String {
    let mut message = String::new();
    let mut usage = None;
    let mut in_list = false;
    for line in rendered.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if let Some(rest) = line.strip_prefix("Usage:") {
            usage = usage.or_else(|| Some(rest.trim().to_string()));
            continue;
        }
        if line.starts_with("For more information") || usage.is_some() {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        if message.is_empty() {
            in_list = line.ends_with(':');
        } else if in_list && !line.starts_with("tip:") {
            message.push_str(if message.ends_with(':') { " " } else { ", " });
        } else if line.starts_with('[') {
            message.push(' ');
        } else {
            in_list = false;
            message.push_str("; ");
        }
        message.push_str(line);
    }
    if message.is_empty() {
        message.push_str("invalid arguments");
    }
    let usage = usage.unwrap_or_else(fallback);
    let command: Vec<&str> =
        usage.split_whitespace().take_while(|word| !word.starts_with(['[', '<', '-'])).collect();
    format!("{message}; usage: {usage} (see `{} --help`)", command.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line_naming_the_subcommand() {
        let rendered = "error: the following required arguments were not provided:\n  \
                        --budget <TOKENS>\n  <FILE>\n\nUsage: ctxwin trim --budget <TOKENS> <FILE>\n\n\
                        For more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered, String::new),
            "the following required arguments were not provided: --budget <TOKENS>, <FILE>; \
             usage: ctxwin trim --budget <TOKENS> <FILE> (see `ctxwin trim --help`)"
        );
        let tip = "error: unrecognized subcommand 'initt'\n\n  tip: a similar subcommand exists: \
                   'init'\n\nUsage: ctxwin [OPTIONS] <COMMAND>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(tip, String::new),
            "unrecognized subcommand 'initt'; tip: a similar subcommand exists: 'init'; \
             usage: ctxwin [OPTIONS] <COMMAND> (see `ctxwin --help`)"
        );
        assert_eq!(
            one_line("", || "ctxwin stats [OPTIONS]".into()),
            "invalid arguments; usage: ctxwin stats [OPTIONS] (see `ctxwin stats --help`)"
        );
    }

    #[test]
    fn real_parse_errors_render_on_one_line() {
        for args in [
            &["ctxwin", "trim"][..],
            &["ctxwin", "search"],
            &["ctxwin", "compress", "--target", "0"],
            &["ctxwin", "build", "--format", "xml"],
            &["ctxwin", "--dir"],
            &["ctxwin", "initt"],
        ] {
            let error = args::Cli::try_parse_from(args).unwrap_err();
            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
            let line = one_line(&error.render().to_string(), || command_usage(&os));
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains("usage: ctxwin"), "{line}");
        }
        for args in
            [&["ctxwin", "trim", "x"][..], &["ctxwin", "--json", "trim", "--budget", "1", "x"]]
        {
            let error = args::Cli::try_parse_from(args).unwrap_err();
            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
            let line = one_line(&error.render().to_string(), || command_usage(&os));
            assert!(line.ends_with("(see `ctxwin trim --help`)"), "{line}");
            assert!(line.contains("--budget <TOKENS>"), "{line}");
        }
    }
}
