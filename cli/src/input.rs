//! Reading what commands take: text arguments (`@FILE`, `-`), conversation files in any
//! supported format, and tool calls given as JSON.

use std::path::Path;

use serde_json::Value;

use super::error::CliError;
use ctxwin_std::format::{self, Format};
use ctxwin_std::statefs;
use ctxwin_std::{Conversation, ToolCall};

/// The whole of `path` as text, or standard input for `-`, at most `cap` bytes.
pub(crate) fn read_text(path: &Path, cap: u64) -> Result<String, CliError> {
    let (bytes, what) = if path == Path::new("-") {
        let what = "standard input";
        (statefs::read_bounded(std::io::stdin().lock(), cap, what), what.to_string())
    } else {
        let what = path.display().to_string();
        (statefs::read_bounded_file(path, cap, &what), what)
    };
    let bytes = bytes.map_err(|error| match error {
        statefs::StateFsError::Io { source, .. } => CliError::io("read", Path::new(&what), &source),
        other => CliError::from(other),
    })?;
    Ok(statefs::utf8(bytes, &what)?)
}

/// A text argument: `@FILE` is the file's content, `-` standard input, anything else itself;
/// files and standard input hold at most `cap` bytes.
pub(crate) fn text_argument(argument: &str, cap: u64) -> Result<String, CliError> {
    match argument.strip_prefix('@') {
        Some(path) if !path.is_empty() => read_text(Path::new(path), cap),
        _ if argument == "-" => read_text(Path::new("-"), cap),
        _ => Ok(argument.to_string()),
    }
}

/// The conversation in `path` (`-` for standard input), in `format` or the detected one.
/// Returns it with the format read.
pub(crate) fn read_conversation(
    path: &Path,
    format: Option<Format>,
    cap: u64,
) -> Result<(Conversation, Format), CliError> {
    read_timed(path, format, cap).map(|(conversation, format, _)| (conversation, format))
}

/// Like [`read_conversation`], with each message's time where the file has one
/// ([`format::message_timestamps`]).
pub(crate) fn read_timed(
    path: &Path,
    format: Option<Format>,
    cap: u64,
) -> Result<(Conversation, Format, Vec<Option<u64>>), CliError> {
    let text = read_text(path, cap)?;
    let name =
        if path == Path::new("-") { "standard input".into() } else { path.display().to_string() };
    let format = match format {
        Some(format) => format,
        None => format::detect(&text).ok_or_else(|| {
            CliError::BadInput(format!(
                "{name} is not an OpenAI or Anthropic conversation (JSON or JSONL); pass --format if it is one"
            ))
        })?,
    };
    let conversation = format::read(&text, format)
        .map_err(|e| CliError::BadInput(format!("{name} ({format}): {e}")))?;
    let timestamps = format::message_timestamps(&text, conversation.messages.len());
    Ok((conversation, format, timestamps))
}

/// Tool calls from `--tool-calls`: OpenAI's `[{"id","type","function":{"name","arguments"}}]`
/// or flat `[{"id","name","arguments"}]`, `arguments` as JSON text or a JSON value. A single
/// object stands for a one-element array.
pub(crate) fn tool_calls(json: &str) -> Result<Vec<ToolCall>, CliError> {
    let bad = |what: String| {
        CliError::BadInput(format!(
            "--tool-calls: {what}; expected [{{\"id\":\"c1\",\"function\":{{\"name\":\"ls\",\"arguments\":\"{{}}\"}}}}]"
        ))
    };
    let value: Value = serde_json::from_str(json).map_err(|e| bad(format!("not JSON ({e})")))?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return Err(bad("not an array of calls".into())),
    };
    let mut calls = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let field =
            |name: &str| item.get("function").and_then(|f| f.get(name)).or_else(|| item.get(name));
        let text = |name: &str| -> Result<String, CliError> {
            match field(name) {
                Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
                _ => Err(bad(format!("call {index} has no \"{name}\" string"))),
            }
        };
        let id = match item.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => return Err(bad(format!("call {index} has no \"id\" string"))),
        };
        let name = text("name")?;
        let arguments = match field("arguments") {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        };
        calls.push(ToolCall::new(id, name, arguments));
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tool_call_shapes_read() {
        let openai = r#"[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"dir\":\".\"}"}}]"#;
        let flat = r#"{"id":"c1","name":"ls","arguments":{"dir":"."}}"#;
        let expected = vec![ToolCall::new("c1", "ls", r#"{"dir":"."}"#)];
        assert_eq!(tool_calls(openai).unwrap(), expected);
        assert_eq!(tool_calls(flat).unwrap(), expected);
        assert_eq!(tool_calls(r#"[{"id":"c2","name":"now"}]"#).unwrap()[0].arguments, "{}");
    }

    #[test]
    fn bad_tool_calls_say_what_is_missing() {
        for (json, needle) in [
            ("not json", "not JSON"),
            ("42", "not an array"),
            (r#"[{"name":"ls"}]"#, "call 0 has no \"id\""),
            (r#"[{"id":"c1"}]"#, "no \"name\""),
        ] {
            let error = tool_calls(json).unwrap_err();
            assert!(error.to_string().contains(needle), "{error}");
            assert_eq!(error.exit(), crate::Exit::BadInput);
        }
    }

    #[test]
    fn text_arguments_read_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("note.txt");
        std::fs::write(&path, "from a file").unwrap();
        assert_eq!(text_argument(&format!("@{}", path.display()), 100).unwrap(), "from a file");
        assert_eq!(text_argument("plain", 100).unwrap(), "plain");
        assert_eq!(text_argument("@", 100).unwrap(), "@");
        let missing =
            text_argument(&format!("@{}", dir.path().join("no").display()), 100).unwrap_err();
        assert_eq!(missing.exit(), super::super::Exit::Io);
    }

    #[test]
    fn conversations_are_detected_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, "{\"role\":\"user\",\"content\":\"hi\"}\n").unwrap();
        let (conversation, format) = read_conversation(&path, None, 1 << 20).unwrap();
        assert_eq!((conversation.messages.len(), format), (1, Format::OpenAiJsonl));
        std::fs::write(&path, "hello").unwrap();
        let error = read_conversation(&path, None, 1 << 20).unwrap_err();
        assert!(error.to_string().contains("pass --format"), "{error}");
        std::fs::write(&path, "{\"role\":\"user\",\"content\":42}\n").unwrap();
        let error = read_conversation(&path, Some(Format::OpenAiJsonl), 1 << 20).unwrap_err();
        assert!(error.to_string().contains("line 1"), "{error}");
    }
}
