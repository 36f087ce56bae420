//! `ctxwin forget <id>` and `ctxwin forget --match TEXT`: out of the window, the archive and
//! every checkpoint.

use serde_json::json;

use crate::args::ForgetArgs;
use crate::error::CliError;
use crate::output::Output;
use ctxwin_std::session::Session;

pub(crate) fn run(session: &mut Session, args: &ForgetArgs) -> Result<Output, CliError> {
    let report = match (&args.text, args.id) {
        (Some(text), _) => session.forget_matching(text)?,
        (None, Some(id)) => session.forget(id)?,
        (None, None) => return Err(CliError::Usage("give a message id, or --match TEXT".into())),
    };
    let what = match (&args.text, args.id) {
        (Some(_), _) => "the text".to_string(),
        (None, id) => format!("message {}", id.unwrap_or(0)),
    };
    let summaries: Vec<String> = report.archive.summaries.iter().map(u64::to_string).collect();
    let text = format!(
        "forgot {what}: {} archived message(s), {} in the window, {} checkpoint(s) rewritten\n\
         summaries to rewrite: {}\n",
        report.archive.messages.len(),
        if report.in_window { "found" } else { "none" },
        report.checkpoints_rewritten,
        if summaries.is_empty() { "none".to_string() } else { summaries.join(", ") },
    );
    let json = json!({
        "messages": report.archive.messages,
        "summaries": report.archive.summaries,
        "in_window": report.in_window,
        "checkpoints_rewritten": report.checkpoints_rewritten,
    });
    Ok(Output::Report { text, json })
}
