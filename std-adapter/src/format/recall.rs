//! The recall tool a proxy declares so that a model can read back a tool output the proxy
//! cut: the marker a reduced output ends with, the tool's definition appended to a request's
//! `tools`, the recall calls of an answer, the follow-up body that carries their results, and
//! the answers of the rounds merged into the one answer the client gets.
//!
//! Everything written here is deterministic (serde_json's `Map` order), so a declaration or
//! a marker is the same bytes on every request: a provider's prompt cache keeps hitting.

use indexmap::IndexMap;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Provider, anthropic, openai};

/// The name of the recall tool.
///
/// ```
/// assert_eq!(ctxwin_std::format::RECALL_TOOL, "ctxwin_recall");
/// ```
pub const RECALL_TOOL: &str = "ctxwin_recall";

/// What the recall tool's definition tells the model.
pub(in crate::format) const RECALL_DESCRIPTION: &str = "Returns the whole text of a tool output that was cut to its head and tail to save room (its last line names the id). Give from_line and to_line (1-based, inclusive) to read part of a long output.";

/// The tool's input schema (JSON Schema), the same for both providers.
pub(in crate::format) fn input_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "description": "The id the cut output's last line names."},
            "from_line": {"type": "integer", "description": "First line to return (1-based); the first line when left out."},
            "to_line": {"type": "integer", "description": "Last line to return (inclusive); the last line when left out."}
        },
        "required": ["id"]
    })
}

/// The line appended to a reduced tool output whose whole text is archived under `id`.
///
/// ```
/// let marker = ctxwin_std::format::recall_marker(1234);
/// assert_eq!(marker, "\n[ctxwin: output cut; call ctxwin_recall with {\"id\": 1234} to read it whole]");
/// ```
pub fn recall_marker(id: u64) -> String {
    format!("\n[ctxwin: output cut; call {RECALL_TOOL} with {{\"id\": {id}}} to read it whole]")
}

/// Whether the raw `tools` of a request (a JSON array) already has a tool named
/// [`RECALL_TOOL`]: then the proxy neither declares nor answers it.
///
/// ```
/// use ctxwin_std::format::{names_recall_tool, Provider};
/// let tools = r#"[{"name":"ctxwin_recall","input_schema":{"type":"object"}}]"#;
/// assert!(names_recall_tool(Provider::Anthropic, Some(tools)));
/// assert!(!names_recall_tool(Provider::Anthropic, Some(r#"[{"name":"Read","description":"ctxwin_recall"}]"#)));
/// assert!(!names_recall_tool(Provider::OpenAi, None));
/// ```
pub fn names_recall_tool(provider: Provider, tools: Option<&str>) -> bool {
    let Some(tools) = tools else { return false };
    // Most tool lists never mention the name: only those are parsed.
    if !tools.contains(RECALL_TOOL) {
        return false;
    }
    let Ok(list) = serde_json::from_str::<Vec<Value>>(tools) else { return false };
    list.iter().any(|tool| {
        let name = match provider {
            Provider::Anthropic => tool.get("name"),
            Provider::OpenAi => tool.get("function").and_then(|f| f.get("name")),
        };
        name.and_then(Value::as_str) == Some(RECALL_TOOL)
    })
}

/// The raw `tools` array with the recall tool appended after the client's tools, whose bytes
/// stay as sent (a cache mark on the client's last tool keeps covering the same prefix); a
/// one-tool array when the request has none. `None` when `tools` is not a JSON array.
///
/// ```
/// use ctxwin_std::format::{tools_with_recall, Provider};
/// let tools = r#"[{"name":"Read","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}} ]"#;
/// let declared = tools_with_recall(Provider::Anthropic, Some(tools)).unwrap();
/// assert!(declared.starts_with(&tools[..tools.len() - 2]));
/// assert!(declared.contains(r#",{"description":"#));
/// assert!(tools_with_recall(Provider::OpenAi, None).unwrap().starts_with(r#"[{"function":{"#));
/// assert_eq!(tools_with_recall(Provider::OpenAi, Some("{}")), None);
/// ```
pub fn tools_with_recall(provider: Provider, tools: Option<&str>) -> Option<String> {
    let definition = match provider {
        Provider::Anthropic => anthropic::recall_tool(),
        Provider::OpenAi => openai::recall_tool(),
    }
    .to_string();
    let Some(tools) = tools else { return Some(format!("[{definition}]")) };
    let inner = tools.trim().strip_prefix('[')?.strip_suffix(']')?;
    let end = tools.rfind(']')?;
    let head = tools.get(..end)?;
    Some(match inner.trim().is_empty() {
        true => format!("{head}{definition}]"),
        false => format!("{head},{definition}]"),
    })
}

/// The client's `tools` of a list [`tools_with_recall`] wrote (`declared`): the list
/// without the recall tool appended to it, as the client sent it; any other list as it is.
///
/// ```
/// use ctxwin_std::format::{tools_with_recall, without_recall_tool, Provider};
/// let tools = r#"[{"name":"Read","input_schema":{"type":"object"}} ]"#;
/// let declared = tools_with_recall(Provider::Anthropic, Some(tools)).unwrap();
/// assert_eq!(without_recall_tool(Provider::Anthropic, &declared), tools);
/// assert_eq!(without_recall_tool(Provider::Anthropic, tools), tools);
/// ```
pub fn without_recall_tool(provider: Provider, declared: &str) -> String {
    let definition = match provider {
        Provider::Anthropic => anthropic::recall_tool(),
        Provider::OpenAi => openai::recall_tool(),
    }
    .to_string();
    let after_others = format!(",{definition}]");
    let alone = format!("{definition}]");
    match declared.strip_suffix(&after_others).or_else(|| declared.strip_suffix(&alone)) {
        Some(head) => format!("{head}]"),
        None => declared.to_string(),
    }
}

/// A call of the recall tool in an answer.
///
/// ```
/// let call = ctxwin_std::format::RecallCall { call_id: "toolu_1".into(), id: Some(7), from_line: None, to_line: Some(40) };
/// assert_eq!(call.id, Some(7));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallCall {
    /// The call's id (`tool_use` id, OpenAI `tool_calls[].id`).
    pub call_id: String,
    /// The archived output's id; `None` when the input names none (an error result).
    pub id: Option<u64>,
    /// The first line asked for (1-based).
    pub from_line: Option<usize>,
    /// The last line asked for (inclusive).
    pub to_line: Option<usize>,
}

impl RecallCall {
    /// The call `call_id` with the tool input `input` (a JSON object).
    pub(in crate::format) fn read(call_id: &str, input: &Value) -> Self {
        let number = |key: &str| input.get(key).and_then(Value::as_u64);
        let line = |key: &str| number(key).and_then(|n| usize::try_from(n).ok());
        Self {
            call_id: call_id.to_string(),
            id: number("id"),
            from_line: line("from_line"),
            to_line: line("to_line"),
        }
    }
}

/// The tool calls of an answer: those of the recall tool, and how many others (the client's).
///
/// ```
/// use ctxwin_std::format::{answer_calls, Provider};
/// let answer = serde_json::json!({"content": [
///     {"type": "text", "text": "Reading it."},
///     {"type": "tool_use", "id": "t1", "name": "ctxwin_recall", "input": {"id": 9}},
///     {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}]});
/// let calls = answer_calls(Provider::Anthropic, &answer);
/// assert_eq!((calls.recall.len(), calls.others), (1, 1));
/// assert_eq!(calls.recall[0].id, Some(9));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnswerCalls {
    /// The recall tool's calls, in order.
    pub recall: Vec<RecallCall>,
    /// Calls of any other tool.
    pub others: usize,
}

/// The tool calls of `answer`, a provider's (non-streamed) response body.
pub fn answer_calls(provider: Provider, answer: &Value) -> AnswerCalls {
    match provider {
        Provider::Anthropic => anthropic::recall_calls(answer),
        Provider::OpenAi => openai::recall_calls(answer),
    }
}

/// An assembled assistant `message` (a streamed answer's, as a proxy keeps it) in the shape
/// of a non-streamed answer, for [`answer_calls`], [`follow_up_body`] and [`merge_answers`].
///
/// ```
/// use ctxwin_std::format::{answer_calls, message_as_answer, Provider};
/// let message = serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
///     {"id": "c1", "type": "function", "function": {"name": "ctxwin_recall", "arguments": "{\"id\": 2}"}}]});
/// let answer = message_as_answer(Provider::OpenAi, &message);
/// assert_eq!(answer_calls(Provider::OpenAi, &answer).recall[0].id, Some(2));
/// ```
pub fn message_as_answer(provider: Provider, message: &Value) -> Value {
    match provider {
        Provider::Anthropic => message.clone(),
        Provider::OpenAi => serde_json::json!({"choices": [{"index": 0, "message": message}]}),
    }
}

/// The result of one recall call.
///
/// ```
/// let result = ctxwin_std::format::RecallResult { call_id: "t1".into(), text: "no output 5 in this conversation".into(), is_error: true };
/// assert!(result.is_error);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallResult {
    /// The call it answers.
    pub call_id: String,
    /// The archived text (or the lines asked for), or what went wrong.
    pub text: String,
    /// The call could not be answered (Anthropic `is_error`; an `error: ` prefix for OpenAI).
    pub is_error: bool,
}

/// The request `body` (as forwarded) continued with `answer`'s assistant message and the
/// recall `results` after it, every other byte as it was: the provider reads the whole prefix
/// from the cache the first call wrote. `None` when `body` or `answer` does not read.
///
/// ```
/// use ctxwin_std::format::{follow_up_body, Provider, RecallResult};
/// let body = br#"{"model":"m","messages":[{"role":"user","content":"go"}],"max_tokens":9}"#;
/// let answer = serde_json::json!({"content": [{"type": "tool_use", "id": "t1", "name": "ctxwin_recall", "input": {"id": 3}}]});
/// let results = [RecallResult { call_id: "t1".into(), text: "whole".into(), is_error: false }];
/// let next = String::from_utf8(follow_up_body(Provider::Anthropic, body, &answer, &results).unwrap()).unwrap();
/// assert!(next.starts_with(r#"{"model":"m","messages":[{"role":"user","content":"go"},{"content":[{"id":"t1""#));
/// assert!(next.ends_with(r#"[{"content":"whole","tool_use_id":"t1","type":"tool_result"}],"role":"user"}],"max_tokens":9}"#));
/// ```
pub fn follow_up_body(
    provider: Provider,
    body: &[u8],
    answer: &Value,
    results: &[RecallResult],
) -> Option<Vec<u8>> {
    let mut map: IndexMap<String, Box<RawValue>> = serde_json::from_slice(body).ok()?;
    let mut messages: Vec<Box<RawValue>> = serde_json::from_str(map.get("messages")?.get()).ok()?;
    let added = match provider {
        Provider::Anthropic => anthropic::recall_follow_up(answer, results)?,
        Provider::OpenAi => openai::recall_follow_up(answer, results)?,
    };
    for message in added {
        messages.push(serde_json::value::to_raw_value(&message).ok()?);
    }
    map.insert("messages".into(), serde_json::value::to_raw_value(&messages).ok()?);
    serde_json::to_vec(&map).ok()
}

/// The answers of a client request's rounds (the first, each follow-up's, the last) as the one
/// answer the client gets: the last one's envelope, the content of all of them in order
/// without the recall calls, the usage of all of them summed. A stop for tool use with no
/// call left becomes the end of the turn. `None` without answers.
///
/// ```
/// use ctxwin_std::format::{merge_answers, Provider};
/// use serde_json::json;
/// let first = json!({"id": "a", "content": [{"type": "text", "text": "Reading it."},
///     {"type": "tool_use", "id": "t1", "name": "ctxwin_recall", "input": {"id": 3}}],
///     "stop_reason": "tool_use", "usage": {"input_tokens": 100, "output_tokens": 5}});
/// let last = json!({"id": "b", "content": [{"type": "text", "text": "Line 40 says 7."}],
///     "stop_reason": "end_turn", "usage": {"input_tokens": 300, "output_tokens": 7}});
/// let merged = merge_answers(Provider::Anthropic, &[first, last]).unwrap();
/// assert_eq!(merged["id"], "b");
/// assert_eq!(merged["content"], json!([{"type": "text", "text": "Reading it."}, {"type": "text", "text": "Line 40 says 7."}]));
/// assert_eq!(merged["usage"], json!({"input_tokens": 400, "output_tokens": 12}));
/// ```
pub fn merge_answers(provider: Provider, answers: &[Value]) -> Option<Value> {
    let mut merged = match provider {
        Provider::Anthropic => anthropic::recall_merge(answers)?,
        Provider::OpenAi => openai::recall_merge(answers)?,
    };
    let usages: Vec<&Value> = answers.iter().filter_map(|a| a.get("usage")).collect();
    if let (Some(object), false) = (merged.as_object_mut(), usages.is_empty()) {
        object.insert("usage".into(), summed(&usages));
    }
    Some(merged)
}

/// `values` summed: numbers added, objects key by key, anything else the last one's.
pub(in crate::format) fn summed(values: &[&Value]) -> Value {
    let Some(last) = values.last() else { return Value::Null };
    match last {
        Value::Number(_) => {
            let numbers = values.iter().filter_map(|v| v.as_number());
            if values.iter().all(|v| v.as_u64().is_some()) {
                Value::from(numbers.filter_map(serde_json::Number::as_u64).sum::<u64>())
            } else {
                Value::from(numbers.filter_map(serde_json::Number::as_f64).sum::<f64>())
            }
        }
        Value::Object(object) => {
            let mut out = serde_json::Map::new();
            let keys = values.iter().filter_map(|v| v.as_object()).flat_map(|o| o.keys());
            for key in keys {
                if out.contains_key(key) {
                    continue;
                }
                let of_key: Vec<&Value> = values.iter().filter_map(|v| v.get(key)).collect();
                let value = match object.get(key) {
                    Some(Value::Number(_) | Value::Object(_)) => summed(&of_key),
                    Some(other) => other.clone(),
                    None => summed(&of_key),
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        other => (*other).clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_sums_numbers_and_nested_objects_and_keeps_the_last_of_the_rest() {
        let a = json!({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}, "tier": "a"});
        let b = json!({"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 6}, "tier": "b", "x": 1.5});
        assert_eq!(
            summed(&[&a, &b]),
            json!({"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 10}, "tier": "b", "x": 1.5})
        );
    }

    #[test]
    fn the_declaration_is_the_same_bytes_every_time_and_follows_the_clients_tools() {
        for provider in [Provider::Anthropic, Provider::OpenAi] {
            let a = tools_with_recall(provider, Some("[{\"name\":\"a\"}]")).unwrap();
            assert_eq!(a, tools_with_recall(provider, Some("[{\"name\":\"a\"}]")).unwrap());
            assert!(a.starts_with("[{\"name\":\"a\"},{"));
            let list: Vec<Value> = serde_json::from_str(&a).unwrap();
            assert_eq!(list.len(), 2);
            let empty = tools_with_recall(provider, Some("[ ]")).unwrap();
            assert_eq!(serde_json::from_str::<Vec<Value>>(&empty).unwrap().len(), 1);
            assert!(names_recall_tool(provider, Some(&a)));
        }
    }
}
