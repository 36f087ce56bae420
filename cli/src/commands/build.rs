//! `ctxwin build`: the payload to send now, to standard output.

use crate::args::BuildArgs;
use crate::error::CliError;
use crate::input;
use crate::output::Output;
use crate::payload;
use crate::state::Workspace;
use ctxwin_std::session::Session;

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
    if args.no_retrieve {
        settings.auto = false;
    }
    session.set_retrieval(settings);
    let composed = session.compose_recall(&dynamic, args.retrieve.as_deref())?;
    workspace.notes.retrieved_items += composed.recall.ids.len() as u64;
    payload::render(&composed.conversation, args.format).map(Output::Raw)
}
