//! `ctxwin prune --keep N [--all]` and `ctxwin prune --delete NAME`: old checkpoints, or a
//! whole conversation, out of the store (the state directory's, or the PostgreSQL database),
//! through the storage ports.

use serde_json::json;

use crate::args::PruneArgs;
use crate::error::CliError;
use crate::output::{Output, thousands};
use crate::state::{Globals, Workspace};
use ctxwin_std::store::{CheckpointId, Fence, Scope};

pub(crate) fn run(globals: &Globals<'_>, args: &PruneArgs) -> Result<Output, CliError> {
    let workspace = Workspace::load(globals)?;
    match (&args.delete, args.keep) {
        (Some(name), _) => delete(&workspace, name),
        (None, Some(keep)) => keep_newest(&workspace, keep as usize, args.all),
        (None, None) => Err(CliError::Usage("give --keep N or --delete NAME".into())),
    }
}

/// Deletes conversation `name` from both ports, under a lease of its own: a session serving
/// it elsewhere is fenced, so none of its writes lands after the delete.
fn delete(workspace: &Workspace, name: &str) -> Result<Output, CliError> {
    let ports = &workspace.ports;
    let scope = Scope::local(name);
    let stored = ports.archive.conversations(&scope.tenant, name)?.iter().any(|c| c == name);
    if !stored && ports.checkpoints.ids(&scope)?.is_empty() {
        return Err(CliError::BadInput(format!(
            "no conversation {name:?} in {}; the session of this directory is {:?}",
            workspace.location, workspace.config.session
        )));
    }
    let fence = ports.archive.acquire(&scope)?;
    let deleted = ports.delete_conversation(&scope, fence)?;
    let own = name == workspace.config.session;
    let mut text = format!(
        "deleted conversation {name:?}: {} messages, {} checkpoints\n",
        thousands(deleted.messages),
        deleted.checkpoints.len()
    );
    if own {
        text.push_str("it is this directory's session: the next command starts it empty\n");
    }
    let ids: Vec<&str> = deleted.checkpoints.iter().map(CheckpointId::as_str).collect();
    let json = json!({
        "deleted": name,
        "messages": deleted.messages,
        "checkpoints": ids,
        "session": own,
    });
    Ok(Output::report(text, json))
}

/// Keeps the newest `keep` checkpoints of the session, or of every conversation with `all`.
fn keep_newest(workspace: &Workspace, keep: usize, all: bool) -> Result<Output, CliError> {
    let ports = &workspace.ports;
    let scope = workspace.scope();
    // An operator's command, unfenced: whoever serves a conversation keeps its lease.
    let pruned: Vec<(String, Vec<CheckpointId>)> = if all {
        ports.prune_checkpoints(&scope.tenant, keep, Fence::NONE)?
    } else {
        let deleted = ports.checkpoints.prune(&scope, Fence::NONE, keep)?;
        if deleted.is_empty() { Vec::new() } else { vec![(scope.conversation.clone(), deleted)] }
    };
    let total: usize = pruned.iter().map(|(_, ids)| ids.len()).sum();
    let mut text = format!(
        "deleted {total} checkpoints of {} conversation(s), kept the newest {keep} of each\n",
        pruned.len()
    );
    for (conversation, ids) in &pruned {
        text.push_str(&format!("  {conversation}: {}\n", ids.len()));
    }
    let json = json!({
        "keep": keep,
        "deleted": total,
        "conversations": pruned
            .iter()
            .map(|(conversation, ids)| json!({
                "conversation": conversation,
                "checkpoints": ids.iter().map(CheckpointId::as_str).collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>(),
    });
    Ok(Output::report(text, json))
}
