//! `ctxwin entity [KEY [VALUE] [--delete]]`: show, update or delete the values the entity
//! strategy keeps; a replaced or deleted value is forgotten as `forget --match` forgets a text.

use serde_json::{Map, Value, json};

use crate::args::EntityArgs;
use crate::error::CliError;
use crate::output::Output;
use ctxwin_std::session::Session;

pub(crate) fn run(session: &mut Session, args: &EntityArgs) -> Result<Output, CliError> {
    let Some(key) = args.key.as_deref() else { return Ok(list(session)) };
    let known = session.manager().entities().iter().any(|(name, _)| name == key);
    if !known {
        let keys: Vec<&str> = session.manager().entities().iter().map(|(name, _)| name).collect();
        return Err(CliError::Usage(format!(
            "no entity key {key:?} in [context] entity_schema (keys: {})",
            if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
        )));
    }
    let new = match (&args.value, args.delete) {
        (None, false) => {
            let value = session.manager().entities().get(key).map(str::to_string);
            let text = format!("{key}: {}\n", value.as_deref().unwrap_or("(no value)"));
            return Ok(Output::Report { text, json: json!({ key: value }) });
        }
        (Some(value), _) => Some(value.as_str()),
        (None, true) => None,
    };
    let report = session.update_entity(key, new)?;
    let text = format!(
        "{key}: {}; old value forgotten in {} archived message(s), {} checkpoint(s) rewritten\n",
        new.unwrap_or("(deleted)"),
        report.archive.messages.len(),
        report.checkpoints_rewritten,
    );
    let json = json!({
        "key": key,
        "value": new,
        "messages": report.archive.messages,
        "summaries": report.archive.summaries,
        "checkpoints_rewritten": report.checkpoints_rewritten,
    });
    Ok(Output::Report { text, json })
}

fn list(session: &Session) -> Output {
    let entities = session.manager().entities();
    let mut text = String::new();
    let mut json = Map::new();
    for (key, value) in entities.iter() {
        text.push_str(&format!("{key}: {}\n", value.unwrap_or("(no value)")));
        json.insert(key.to_string(), value.map_or(Value::Null, Value::from));
    }
    if text.is_empty() {
        text.push_str("no entity keys: set [context] entity_schema in ctxwin.toml\n");
    }
    Output::Report { text, json: Value::Object(json) }
}
