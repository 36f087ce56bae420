//! `ctxwin checkpoint`, `ctxwin checkpoints`, `ctxwin restore <id|latest>` and `ctxwin recover`.

use serde_json::json;

use crate::args::RestoreArgs;
use crate::error::CliError;
use crate::output::{Output, Table, thousands};
use crate::state::{self, Checkpointing, Globals, StateDir, Workspace};
use ctxwin_std::session::{RestorePoint, Session, take_for_recovery};
use ctxwin_std::store::{CheckpointId, CheckpointStatus, Scope, open_checkpoints};

/// `checkpoint`: one now, whatever changed.
pub(crate) fn write(session: &mut Session, _: &mut Workspace) -> Result<Output, CliError> {
    let id = session.checkpoint()?.to_string();
    let text = format!("checkpoint {id}\n");
    Ok(Output::report(text, json!({ "id": id })))
}

/// `checkpoints`: every checkpoint, newest first, with its health. Reads the checkpoint port
/// only, so it works when the session (or a state directory's archive) would not open.
pub(crate) fn list(globals: &Globals<'_>) -> Result<Output, CliError> {
    let dir = StateDir::new(globals.dir);
    dir.require()?;
    let config = crate::config_file::FileConfig::load(&dir.config())?;
    let location = dir.location(&config)?;
    dir.require_store(&location)?;
    let scope = Scope::local(config.session.as_str());
    let sink = open_checkpoints(&location, &scope)?;
    let listed = sink.list(&scope)?;
    let mut table =
        Table::new(&[("id", false), ("taken", false), ("bytes", true), ("status", false)]);
    let mut rows = Vec::with_capacity(listed.len());
    for (index, info) in listed.iter().enumerate() {
        let taken = taken(&info.id);
        let status = match &info.status {
            CheckpointStatus::Ok if index == 0 => "ok (latest)".to_string(),
            CheckpointStatus::Damaged(why) => format!("corrupt: {why}"),
            other => other.to_string(),
        };
        table.row(vec![info.id.to_string(), taken.clone(), thousands(info.size), status.clone()]);
        let detail = match &info.status {
            CheckpointStatus::Damaged(why) => format!("corrupt: {why}"),
            other => other.to_string(),
        };
        rows.push(json!({
            "id": info.id.as_str(),
            "taken": taken,
            "bytes": info.size,
            "ok": info.status == CheckpointStatus::Ok,
            "status": detail,
        }));
    }
    let text = if listed.is_empty() {
        format!("no checkpoints in {}\n", sink.place(&scope))
    } else {
        table.render()
    };
    Ok(Output::report(text, json!(rows)))
}

/// When checkpoint `id` was taken, as `YYYY-MM-DD HH:MM:SS UTC`.
fn taken(id: &CheckpointId) -> String {
    id.taken_utc()
}

/// `restore`: back to a checkpoint, then a new checkpoint of that state, so the next command
/// continues from it. Opens without the strict check: this is how to get past a damaged
/// newest checkpoint.
pub(crate) fn restore(globals: &Globals<'_>, args: &RestoreArgs) -> Result<Output, CliError> {
    let point = match args.checkpoint.as_str() {
        "latest" => RestorePoint::Latest,
        id => RestorePoint::Id(CheckpointId::parse(id).map_err(|e| {
            CliError::BadInput(format!("{e}; `ctxwin checkpoints` lists the ids (or use `latest`)"))
        })?),
    };
    let mut workspace = Workspace::load(globals)?;
    let session = workspace.open(false, |config| config)?;
    state::run(&mut workspace, session, "restore", Checkpointing::Never, |session, _| {
        let report = session.restore(point)?;
        let checkpoint = session.checkpoint()?.to_string();
        let mut text = format!("restored checkpoint {}\n", report.id);
        for skipped in &report.skipped {
            text.push_str(&format!("skipped {skipped}\n"));
        }
        if let Some(side) = &report.rewound_to {
            text.push_str(&format!(
                "{} archived messages newer than it were copied to session {side:?} (their ids will be reused)\n",
                report.rewound.len()
            ));
        }
        let manager = session.manager();
        text.push_str(&format!(
            "context {} / {} tokens, {} messages; new checkpoint {checkpoint}\n",
            thousands(manager.used()),
            thousands(manager.budget()),
            manager.stats().messages()
        ));
        let skipped: Vec<String> = report.skipped.iter().map(ToString::to_string).collect();
        let json = json!({
            "restored": report.id.as_str(),
            "skipped": skipped,
            "rewound": report.rewound,
            "rewound_to": report.rewound_to,
            "checkpoint": checkpoint,
            "used": manager.used(),
            "messages": manager.stats().messages(),
        });
        Ok(Output::report(text, json))
    })
}

/// `recover`: rebuilds the context from the archive when no checkpoint restores (or the
/// archive and checkpoints disagree): the session's archived messages are kept aside as they
/// were, pushed again into an empty context, and one new checkpoint is written.
pub(crate) fn recover(globals: &Globals<'_>) -> Result<Output, CliError> {
    StateDir::new(globals.dir).recreate_checkpoints_dir()?;
    let mut workspace = Workspace::load(globals)?;
    let name = workspace.config.session.clone();
    let source = take_for_recovery(workspace.ports.archive.as_ref(), &workspace.scope())?;
    let session = workspace.builder(workspace.config.context).restore_latest(false).build()?;
    state::run(&mut workspace, session, "recover", Checkpointing::Never, |session, _| {
        let checkpoint = session.recover_from(&source.messages)?.to_string();
        let manager = session.manager();
        let (count, used, in_context) =
            (source.messages.len(), manager.used(), manager.stats().messages());
        let text = format!(
            "rebuilt session {name:?} from {count} archived messages (kept as they were in session {:?})
             context {} / {} tokens, {in_context} messages; new checkpoint {checkpoint}
",
            source.kept_in,
            thousands(used),
            thousands(manager.budget()),
        );
        let json = json!({
            "session": name,
            "messages": count,
            "from": source.from,
            "kept_in": source.kept_in,
            "checkpoint": checkpoint,
            "used": used,
            "in_context": in_context,
        });
        Ok(Output::report(text, json))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_is_a_utc_date_and_time() {
        let id = CheckpointId::parse("20260101T000000.000000Z-000000").unwrap();
        assert_eq!(taken(&id), "2026-01-01 00:00:00 UTC");
    }
}
