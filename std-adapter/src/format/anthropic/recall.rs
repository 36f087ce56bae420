//! Anthropic shapes of the recall tool ([`recall`](crate::format::recall)): its definition,
//! its `tool_use` calls in an answer, the assistant turn and `tool_result` turn of a
//! follow-up, the rounds' answers merged.

use serde_json::{Value, json};

use crate::format::recall::{
    AnswerCalls, RECALL_DESCRIPTION, RECALL_TOOL, RecallCall, RecallResult, input_schema,
};

/// The recall tool's definition, an entry of `tools`.
pub(in crate::format) fn recall_tool() -> Value {
    json!({"name": RECALL_TOOL, "description": RECALL_DESCRIPTION, "input_schema": input_schema()})
}

/// Whether content block `block` is a call of the recall tool.
fn is_recall_use(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_use")
        && block.get("name").and_then(Value::as_str) == Some(RECALL_TOOL)
}

/// The `tool_use` blocks of `answer`'s content.
pub(in crate::format) fn recall_calls(answer: &Value) -> AnswerCalls {
    let mut calls = AnswerCalls::default();
    let blocks = answer.get("content").and_then(Value::as_array).into_iter().flatten();
    for block in blocks.filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use")) {
        if is_recall_use(block) {
            let id = block.get("id").and_then(Value::as_str).unwrap_or_default();
            calls.recall.push(RecallCall::read(id, block.get("input").unwrap_or(&Value::Null)));
        } else {
            calls.others += 1;
        }
    }
    calls
}

/// The assistant turn of `answer` and a user turn with one `tool_result` per result.
pub(in crate::format) fn recall_follow_up(
    answer: &Value,
    results: &[RecallResult],
) -> Option<Vec<Value>> {
    let content = answer.get("content")?.clone();
    let blocks: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut block =
                json!({"type": "tool_result", "tool_use_id": r.call_id, "content": r.text});
            if r.is_error {
                block["is_error"] = Value::Bool(true);
            }
            block
        })
        .collect();
    Some(vec![
        json!({"role": "assistant", "content": content}),
        json!({"role": "user", "content": blocks}),
    ])
}

/// The last answer's envelope with every answer's content blocks but the recall calls.
pub(in crate::format) fn recall_merge(answers: &[Value]) -> Option<Value> {
    let mut merged = answers.last()?.clone();
    let content: Vec<Value> = answers
        .iter()
        .filter_map(|a| a.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|b| !is_recall_use(b))
        .cloned()
        .collect();
    let calls_left =
        content.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"));
    let object = merged.as_object_mut()?;
    object.insert("content".into(), Value::Array(content));
    if !calls_left && object.get("stop_reason").and_then(Value::as_str) == Some("tool_use") {
        object.insert("stop_reason".into(), Value::from("end_turn"));
    }
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_answer_keeps_the_clients_call_and_its_stop() {
        let answer = json!({"content": [
            {"type": "tool_use", "id": "t1", "name": RECALL_TOOL, "input": {"id": 3}},
            {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}], "stop_reason": "tool_use"});
        let merged = recall_merge(&[answer]).unwrap();
        assert_eq!(merged["content"].as_array().unwrap().len(), 1);
        assert_eq!(merged["content"][0]["name"], "Read");
        assert_eq!(merged["stop_reason"], "tool_use");
        let only = json!({"content": [{"type": "tool_use", "id": "t1", "name": RECALL_TOOL, "input": {"id": 3}}], "stop_reason": "tool_use"});
        assert_eq!(recall_merge(&[only]).unwrap()["stop_reason"], "end_turn");
    }
}
