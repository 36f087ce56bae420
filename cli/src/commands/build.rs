//! `ctxwin build`: the payload to send now, to standard output.

use crate::args::BuildArgs;
use crate::error::CliError;
use crate::input;
use crate::output::Output;
use crate::payload;
use crate::state::Workspace;
use ctxwin_std::session::{ComposeOptions, RecallFor, Session};

pub(crate) fn run(
    session: &mut Session,
    workspace: &mut Workspace,
    args: &BuildArgs,
) -> Result<Output, CliError> {
    let dynamic = args
        .dynamic
        .iter()
        .map(|text| input::text_argument(text, workspace.config.limits.max_input_bytes))
        .collect::<Result<Vec<String>, CliError>>()?;
    let dynamic: Vec<&str> =
        dynamic.iter().map(String::as_str).filter(|text| !text.trim().is_empty()).collect();
    let mut settings = *session.retrieval();
    if let Some(limit) = args.retrieve_limit {
        settings.max_items = limit;
    }
    let recall = match (&args.retrieve, args.no_retrieve) {
        (Some(query), _) => RecallFor::Query(query),
        (None, true) => RecallFor::Nothing,
        (None, false) => RecallFor::Settings,
    };
    let options = ComposeOptions::new(&dynamic).recall(recall).retrieval(settings);
    let composed = session.compose_with(options)?;
    workspace.notes.retrieved_items += composed.recall.ids.len() as u64;
    payload::render(&composed.conversation, args.format).map(Output::Raw)
}
