//! `ctxwin build`: the payload to send now, to standard output.

use crate::args::BuildArgs;
use crate::error::CliError;
use crate::input;
use crate::output::Output;
use crate::payload;
use crate::state::Workspace;
use ctxwin_std::archive::as_dynamic_context;
use ctxwin_std::session::Session;

/// Characters of retrieved text one payload carries at most (about 2,000 tokens).
const RETRIEVED_CHARS: usize = 8_000;

pub(crate) fn run(
    session: &mut Session,
    workspace: &mut Workspace,
    args: &BuildArgs,
) -> Result<Output, CliError> {
    let mut dynamic = args
        .dynamic
        .iter()
        .map(|text| input::text_argument(text, workspace.config.limits.max_input_bytes))
        .collect::<Result<Vec<String>, CliError>>()?;
    if let Some(query) = &args.retrieve {
        let (block, items) = retrieve(session, query, args.retrieve_limit)?;
        if items > 0 {
            dynamic.push(block);
            workspace.notes.retrieved_items += items;
        }
    }
    let dynamic: Vec<&str> =
        dynamic.iter().map(String::as_str).filter(|text| !text.trim().is_empty()).collect();
    let composed = session.compose(&dynamic)?;
    payload::render(&composed.conversation, args.format).map(Output::Raw)
}

/// Archived messages matching `query` that are no longer in the context, best first, as one
/// dynamic-context block; and how many it holds.
pub(crate) fn retrieve(
    session: &Session,
    query: &str,
    limit: usize,
) -> Result<(String, u64), CliError> {
    let Some(archive) = session.archive() else { return Ok((String::new(), 0)) };
    let mut hits = archive.search(Some(session.name()), query, limit.saturating_mul(4))?;
    hits.retain(|hit| session.manager().get(hit.id).is_none());
    hits.truncate(limit);
    let block = as_dynamic_context(&hits, RETRIEVED_CHARS);
    let items = block.lines().skip(1).count() as u64;
    Ok((block, items))
}
