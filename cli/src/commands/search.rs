//! `ctxwin search <query>` and `ctxwin search --summary <id>`: the archive, by keywords or by
//! what a summary stands for.

use serde_json::json;

use crate::args::SearchArgs;
use crate::error::CliError;
use crate::output::{Output, Table, one_line, thousands};
use crate::state::Workspace;
use ctxwin_std::session::Session;
use ctxwin_std::store::{ArchiveStore, SearchQuery};

/// Characters of a message or summary shown in a table row.
const ROW_CHARS: usize = 100;

pub(crate) fn run(
    session: &mut Session,
    _: &mut Workspace,
    args: &SearchArgs,
) -> Result<Output, CliError> {
    let archive =
        session.archive().ok_or_else(|| CliError::Internal("the session has no archive".into()))?;
    match (&args.query, args.summary) {
        (_, Some(id)) => drill_down(session, archive, id, args.limit),
        (Some(query), None) => search(session, archive, query, args.limit),
        (None, None) => Err(CliError::Usage("give words to search for, or --summary <id>".into())),
    }
}

fn search(
    session: &Session,
    archive: &dyn ArchiveStore,
    query: &str,
    limit: usize,
) -> Result<Output, CliError> {
    let scope = session.scope();
    let hits = archive.search(scope, &SearchQuery::new(query, limit).with_snippets())?;
    let summaries = archive.search_summaries(scope, &SearchQuery::new(query, limit))?;
    let mut table = Table::new(&[
        ("id", true),
        ("unit", true),
        ("role", false),
        ("where", false),
        ("score", true),
        ("match", false),
    ]);
    let mut rows = Vec::with_capacity(hits.len());
    for hit in &hits {
        let in_context = session.manager().get(hit.id).is_some();
        let place = if in_context { "context" } else { "archive" };
        table.row(vec![
            hit.id.to_string(),
            hit.unit.to_string(),
            hit.role.as_str().into(),
            place.into(),
            format!("{:.2}", hit.score),
            one_line(&hit.snippet, ROW_CHARS),
        ]);
        rows.push(json!({
            "id": hit.id, "unit": hit.unit, "role": hit.role.as_str(), "in_context": in_context,
            "timestamp": hit.timestamp, "score": hit.score, "snippet": hit.snippet,
        }));
    }
    let mut text = if hits.is_empty() {
        format!("no archived message matches {query:?}\n")
    } else {
        table.render()
    };
    let mut summary_rows = Vec::with_capacity(summaries.len());
    if !summaries.is_empty() {
        let mut table = Table::new(&[("summary", true), ("score", true), ("text", false)]);
        for hit in &summaries {
            table.row(vec![
                hit.id.to_string(),
                format!("{:.2}", hit.score),
                one_line(&hit.text, ROW_CHARS),
            ]);
            summary_rows.push(
                json!({"id": hit.id, "level": hit.level, "score": hit.score, "text": hit.text}),
            );
        }
        text.push('\n');
        text.push_str(&table.render());
        text.push_str("drill down: ctxwin search --summary <id>\n");
    }
    Ok(Output::report(text, json!({"query": query, "messages": rows, "summaries": summary_rows})))
}

fn drill_down(
    session: &Session,
    archive: &dyn ArchiveStore,
    id: u64,
    limit: usize,
) -> Result<Output, CliError> {
    let scope = session.scope();
    let summary = archive.summary(scope, id)?.ok_or_else(|| {
        CliError::BadInput(format!(
            "no summary {id} in the archive; `ctxwin search <words>` lists summaries with their ids"
        ))
    })?;
    let sources = archive.drill_down(scope, id)?;
    let mut table = Table::new(&[("id", true), ("unit", true), ("role", false), ("text", false)]);
    let mut rows = Vec::with_capacity(sources.len());
    for message in &sources {
        rows.push(json!({
            "id": message.id, "unit": message.unit, "role": message.message.role.as_str(),
            "content": message.full_text(), "tool_call_id": message.message.tool_call_id,
        }));
    }
    for message in sources.iter().take(limit.max(1)) {
        table.row(vec![
            message.id.to_string(),
            message.unit.to_string(),
            message.message.role.as_str().into(),
            one_line(message.full_text(), ROW_CHARS),
        ]);
    }
    let shown = sources.len().min(limit.max(1));
    let mut text = format!(
        "summary {id} ({} → {} tokens) stands for {} messages:\n{}\n\n",
        thousands(summary.tokens_before),
        thousands(summary.tokens_after),
        sources.len(),
        summary.text.trim_end()
    );
    text.push_str(&table.render());
    if shown < sources.len() {
        text.push_str(&format!(
            "… {} more (raise --limit, or use --json for all)\n",
            sources.len() - shown
        ));
    }
    let json = json!({
        "summary": {"id": id, "text": summary.text, "tokens_before": summary.tokens_before, "tokens_after": summary.tokens_after},
        "messages": rows,
    });
    Ok(Output::report(text, json))
}
