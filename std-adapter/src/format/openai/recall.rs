//! OpenAI shapes of the recall tool ([`recall`](crate::format::recall)): its definition,
//! its `tool_calls` in an answer, the assistant message and `tool` messages of a follow-up,
//! the rounds' answers merged.

use serde_json::{Value, json};

use crate::format::recall::{
    AnswerCalls, RECALL_DESCRIPTION, RECALL_TOOL, RecallCall, RecallResult, input_schema,
};

/// The recall tool's definition, an entry of `tools`.
pub(in crate::format) fn recall_tool() -> Value {
    json!({"type": "function", "function": {"name": RECALL_TOOL, "description": RECALL_DESCRIPTION, "parameters": input_schema()}})
}

/// The first choice's message of `answer`.
fn message(answer: &Value) -> Option<&Value> {
    answer.get("choices")?.get(0)?.get("message")
}

/// Whether `call` (an entry of `tool_calls`) calls the recall tool.
fn is_recall_call(call: &Value) -> bool {
    call.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) == Some(RECALL_TOOL)
}

/// The `tool_calls` of `answer`'s first choice.
pub(in crate::format) fn recall_calls(answer: &Value) -> AnswerCalls {
    let mut calls = AnswerCalls::default();
    let listed = message(answer).and_then(|m| m.get("tool_calls")).and_then(Value::as_array);
    for call in listed.into_iter().flatten() {
        if is_recall_call(call) {
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
            let arguments = call.get("function").and_then(|f| f.get("arguments"));
            // The model's arguments are JSON text; text that does not read names no id.
            let input = arguments
                .and_then(Value::as_str)
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or(Value::Null);
            calls.recall.push(RecallCall::read(id, &input));
        } else {
            calls.others += 1;
        }
    }
    calls
}

/// The assistant message of `answer` (its content and calls) and one `tool` message per
/// result (OpenAI has no error flag: an error's text says so).
pub(in crate::format) fn recall_follow_up(
    answer: &Value,
    results: &[RecallResult],
) -> Option<Vec<Value>> {
    let message = message(answer)?;
    let mut out = vec![json!({
        "role": "assistant",
        "content": message.get("content").cloned().unwrap_or(Value::Null),
        "tool_calls": message.get("tool_calls")?.clone(),
    })];
    for result in results {
        let text = match result.is_error {
            true => format!("error: {}", result.text),
            false => result.text.clone(),
        };
        out.push(json!({"role": "tool", "tool_call_id": result.call_id, "content": text}));
    }
    Some(out)
}

/// The last answer's envelope, its first choice's message holding every answer's text
/// (joined by a blank line) and the calls that are not the recall tool's.
pub(in crate::format) fn recall_merge(answers: &[Value]) -> Option<Value> {
    let mut merged = answers.last()?.clone();
    let texts: Vec<&str> = answers
        .iter()
        .filter_map(|a| message(a)?.get("content")?.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    let calls: Vec<Value> = answers
        .iter()
        .filter_map(|a| message(a)?.get("tool_calls")?.as_array())
        .flatten()
        .filter(|c| !is_recall_call(c))
        .cloned()
        .collect();
    let choice = merged.get_mut("choices")?.get_mut(0)?.as_object_mut()?;
    let calls_left = !calls.is_empty();
    if !calls_left && choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls") {
        choice.insert("finish_reason".into(), Value::from("stop"));
    }
    let message = choice.get_mut("message")?.as_object_mut()?;
    let content = match texts.is_empty() {
        true => Value::Null,
        false => Value::from(texts.join("\n\n")),
    };
    message.insert("content".into(), content);
    match calls_left {
        true => message.insert("tool_calls".into(), Value::Array(calls)),
        false => message.remove("tool_calls"),
    };
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str, arguments: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
    }

    #[test]
    fn calls_follow_up_and_merge() {
        let first = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "Reading.",
            "tool_calls": [call("c1", RECALL_TOOL, r#"{"id": 5, "from_line": 2}"#)]}}]});
        let calls = recall_calls(&first);
        assert_eq!(calls.others, 0);
        assert_eq!(
            calls.recall[0],
            RecallCall { call_id: "c1".into(), id: Some(5), from_line: Some(2), to_line: None }
        );
        let results =
            [RecallResult { call_id: "c1".into(), text: "no such output".into(), is_error: true }];
        let added = recall_follow_up(&first, &results).unwrap();
        assert_eq!(
            added[1],
            json!({"role": "tool", "tool_call_id": "c1", "content": "error: no such output"})
        );
        let last = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [call("c2", "run", "{}"), call("c3", RECALL_TOOL, "{}")]}}]});
        let merged = recall_merge(&[first, last]).unwrap();
        assert_eq!(merged["choices"][0]["message"]["content"], "Reading.");
        assert_eq!(merged["choices"][0]["message"]["tool_calls"], json!([call("c2", "run", "{}")]));
        assert_eq!(merged["choices"][0]["finish_reason"], "tool_calls");
    }
}
