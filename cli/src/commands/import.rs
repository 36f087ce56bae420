//! `ctxwin import <file>`: a whole conversation into the context, all or nothing (one
//! checkpoint at the end; a refused message or a killed process leaves the state as it was
//! before), in chunks so a progress bar can follow long files.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::args::ImportArgs;
use crate::error::CliError;
use crate::output::{Output, pairs, thousands};
use crate::state::Workspace;
use ctxwin_std::Conversation;
use ctxwin_std::format::Format;
use ctxwin_std::session::{ImportReport, Session, SessionError};

/// Messages per [`Session::import`] call: large enough to keep the archive's batched writes,
/// small enough for the bar to move.
const CHUNK: usize = 500;

/// Files with fewer messages get no progress bar.
const BAR_FROM: usize = 2 * CHUNK;

/// The sum of the chunks' reports.
#[derive(Debug, Default)]
struct Totals {
    stored: usize,
    tools: usize,
    reduced: usize,
    tokens_saved: u64,
    units_evicted: usize,
    messages_evicted: usize,
    summaries: usize,
    first_id: Option<u64>,
    last_id: Option<u64>,
}

impl Totals {
    fn add(&mut self, report: &ImportReport) {
        self.stored += report.stored;
        self.tools += report.tools;
        self.reduced += report.reduced;
        self.tokens_saved += report.tokens_saved;
        self.units_evicted += report.units_evicted;
        self.messages_evicted += report.messages_evicted;
        self.summaries += report.summaries;
        self.first_id = self.first_id.or(report.ids.first().copied());
        self.last_id = report.ids.last().copied().or(self.last_id);
    }
}

pub(crate) fn run(
    session: &mut Session,
    _: &mut Workspace,
    args: &ImportArgs,
    (conversation, format, timestamps): (Conversation, Format, Vec<Option<u64>>),
) -> Result<Output, CliError> {
    let count = conversation.messages.len();
    let bar = progress_bar(count);
    let result = import_chunks(session, conversation, &timestamps, &bar);
    bar.finish_and_clear();
    let totals = result?;
    let manager = session.manager();
    let (used, budget) = (manager.used(), manager.budget());
    let in_context = manager.stats().messages();
    let text = format!(
        "imported {} messages from {} ({format})\n{}",
        thousands(count as u64),
        args.file.display(),
        pairs(&[
            (
                "stored",
                format!(
                    "{} messages, {} tool definitions",
                    thousands(totals.stored as u64),
                    totals.tools
                )
            ),
            (
                "reduced",
                format!(
                    "{} tool outputs ({} tokens saved; the archive keeps them whole)",
                    totals.reduced,
                    thousands(totals.tokens_saved)
                )
            ),
            (
                "evicted",
                format!(
                    "{} messages in {} units, to the archive",
                    thousands(totals.messages_evicted as u64),
                    thousands(totals.units_evicted as u64)
                )
            ),
            ("summaries", totals.summaries.to_string()),
            (
                "context",
                format!(
                    "{} / {} tokens, {} messages",
                    thousands(used),
                    thousands(budget),
                    thousands(in_context)
                )
            ),
        ]),
    );
    let json = json!({
        "file": args.file.display().to_string(),
        "format": format.name(),
        "messages": count,
        "stored": totals.stored,
        "tools": totals.tools,
        "first_id": totals.first_id,
        "last_id": totals.last_id,
        "reduced": totals.reduced,
        "tokens_saved": totals.tokens_saved,
        "units_evicted": totals.units_evicted,
        "messages_evicted": totals.messages_evicted,
        "summaries": totals.summaries,
        "used": used,
        "budget": budget,
        "messages_in_context": in_context,
    });
    Ok(Output::report(text, json))
}

/// A bar on standard error for long files, hidden when standard error is not a terminal.
fn progress_bar(messages: usize) -> ProgressBar {
    if messages < BAR_FROM || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(messages as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "importing {bar:40} {human_pos}/{human_len} messages ({per_sec}, {eta} left)",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Imports `conversation` all or nothing, [`CHUNK`] messages at a time, advancing `bar`.
/// Messages carry their own time where the file has one.
fn import_chunks(
    session: &mut Session,
    conversation: Conversation,
    timestamps: &[Option<u64>],
    bar: &ProgressBar,
) -> Result<Totals, CliError> {
    let total = conversation.messages.len();
    let mut totals = Totals::default();
    let done = session.import_atomic_timed(&conversation, timestamps, CHUNK, |report, offset| {
        totals.add(report);
        bar.set_position(offset as u64);
    });
    match done {
        Ok(_) => Ok(totals),
        Err(error) => Err(stopped(error, 0, total)),
    }
}

/// An import error with the message index counted over the whole file.
pub(crate) fn stopped(error: SessionError, offset: usize, total: usize) -> CliError {
    match error {
        SessionError::Import { item, source } => {
            let item = match item.strip_prefix("message ").and_then(|n| n.parse::<usize>().ok()) {
                Some(index) => {
                    let index = index + offset;
                    format!(
                        "import stopped at message {} of {total} (nothing of the file was kept)",
                        index + 1
                    )
                }
                None => format!("import stopped at the {item} (nothing of the file was kept)"),
            };
            CliError::from(*source).context(&item)
        }
        other => CliError::from(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxwin_core::Error as CoreError;

    #[test]
    fn stopped_imports_count_over_the_whole_file() {
        let error = SessionError::Import {
            item: "message 3".into(),
            source: Box::new(SessionError::Core(CoreError::OrphanToolResult)),
        };
        let error = stopped(error, 1_000, 2_000);
        assert_eq!(error.exit(), crate::Exit::BadInput);
        assert!(
            error.to_string().starts_with(
                "import stopped at message 1004 of 2000 (nothing of the file was kept): "
            ),
            "{error}"
        );
    }

    #[test]
    fn short_files_get_no_bar() {
        assert!(progress_bar(10).is_hidden());
    }
}
