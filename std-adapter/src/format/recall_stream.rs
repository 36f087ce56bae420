//! A streamed answer on its way to a client when the recall tool is declared
//! ([`recall`](super::recall)): its server-sent events pass through as they came until a
//! recall call starts; from there they are held. At the end the held events are released
//! without the recall calls (blocks and tool calls re-indexed), with or without the stream's
//! end (a follow-up's stream then continues it: its opening dropped, its block indexes after
//! those the client has).
//!
//! A stream without a recall call reaches the client byte for byte: only whole events are
//! passed on, each as it came.

use serde_json::Value;

use super::Provider;
use super::recall::{RECALL_TOOL, summed};

/// One round's stream, as the client gets it ([`RecallStream::feed`], then
/// [`RecallStream::release`]).
///
/// ```
/// use ctxwin_std::format::{Provider, RecallStream};
/// let mut stream = RecallStream::new(Provider::Anthropic);
/// let text = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
/// let recall = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"ctxwin_recall\",\"input\":{}}}\n\n";
/// assert_eq!(stream.feed(text.as_bytes()), text.as_bytes());
/// assert!(stream.feed(recall.as_bytes()).is_empty());
/// assert!(stream.holding());
/// assert!(stream.release(true, false).is_empty(), "the recall block is left out");
/// ```
#[derive(Debug)]
pub struct RecallStream {
    provider: Provider,
    /// Bytes of an event whose end has not come yet.
    partial: Vec<u8>,
    /// A follow-up's stream: its opening is dropped and its blocks follow the client's.
    continuation: bool,
    /// Anthropic: added to each block index (the blocks the client has from earlier rounds).
    offset: u64,
    /// Content blocks passed on in this round.
    blocks: u64,
    /// Events held since a recall call started.
    held: Vec<Vec<u8>>,
    /// The stream's end events, held back by a release without the end.
    ending: Vec<u8>,
    /// OpenAI: the client has text of this answer from earlier rounds.
    text_sent: bool,
    /// OpenAI: this round's first text starts with a blank line, after the earlier rounds'
    /// text (as a non-streamed answer's rounds are joined).
    separate: bool,
    /// The usage of the earlier rounds, summed: a follow-up's usage reaches the client with
    /// it added (as a non-streamed answer's rounds are summed).
    carried: Value,
    /// This round's usage (Anthropic: its `message_start`'s, updated by its `message_delta`).
    usage: Value,
}

impl RecallStream {
    /// The stream of the upstream's first answer.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
            partial: Vec::new(),
            continuation: false,
            offset: 0,
            blocks: 0,
            held: Vec::new(),
            ending: Vec::new(),
            text_sent: false,
            separate: false,
            carried: Value::Object(serde_json::Map::new()),
            usage: Value::Object(serde_json::Map::new()),
        }
    }

    /// The stream of the follow-up after this round: it continues what the client has.
    pub fn next_round(&self) -> Self {
        Self {
            continuation: true,
            offset: self.offset + self.blocks,
            text_sent: self.text_sent,
            separate: self.text_sent,
            carried: summed(&[&self.carried, &self.usage]),
            ..Self::new(self.provider)
        }
    }

    /// Whether a recall call started (what follows it is held).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Takes upstream bytes; returns those to pass on now.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = event_end(&self.partial) {
            let event: Vec<u8> = self.partial.drain(..end).collect();
            if self.holding() {
                self.held.push(event);
                continue;
            }
            match self.pass(&event) {
                Pass::Forward(bytes) => out.extend_from_slice(&bytes),
                Pass::Drop => {}
                Pass::Hold => self.held.push(event),
            }
        }
        out
    }

    /// What becomes of `event` before a recall call started.
    fn pass(&mut self, event: &[u8]) -> Pass {
        let Some(Data::Json(mut value)) = data(event) else { return Pass::Forward(event.to_vec()) };
        if self.usage_seen(&mut value) {
            return Pass::Forward(rewritten(event, &value));
        }
        match self.provider {
            Provider::Anthropic => {
                let kind = value.get("type").and_then(Value::as_str).unwrap_or_default();
                if kind == "message_start" && self.continuation {
                    return Pass::Drop;
                }
                if kind == "content_block_start" {
                    let block = value.get("content_block").unwrap_or(&Value::Null);
                    if block.get("type").and_then(Value::as_str) == Some("tool_use")
                        && block.get("name").and_then(Value::as_str) == Some(RECALL_TOOL)
                    {
                        return Pass::Hold;
                    }
                    self.blocks += 1;
                }
                match (block_index(&value), self.offset) {
                    (Some(index), offset) if offset > 0 => {
                        value["index"] = Value::from(index + offset);
                        Pass::Forward(rewritten(event, &value))
                    }
                    _ => Pass::Forward(event.to_vec()),
                }
            }
            Provider::OpenAi => {
                let delta = value.pointer("/choices/0/delta").unwrap_or(&Value::Null);
                let calls = delta.get("tool_calls").and_then(Value::as_array);
                if calls.into_iter().flatten().any(is_openai_recall) {
                    return Pass::Hold;
                }
                let opening = delta.get("role").is_some()
                    && delta.get("content").and_then(Value::as_str).is_none_or(str::is_empty)
                    && calls.is_none()
                    && value.pointer("/choices/0/finish_reason").is_none_or(Value::is_null);
                if self.continuation && opening {
                    return Pass::Drop;
                }
                let text = delta.get("content").and_then(Value::as_str).unwrap_or_default();
                if text.is_empty() {
                    return Pass::Forward(event.to_vec());
                }
                self.text_sent = true;
                if !std::mem::take(&mut self.separate) {
                    return Pass::Forward(event.to_vec());
                }
                let joined = format!("\n\n{text}");
                value["choices"][0]["delta"]["content"] = Value::from(joined);
                Pass::Forward(rewritten(event, &value))
            }
        }
    }

    /// The held events without the recall calls (the other blocks or calls re-indexed), and
    /// the stream's end when `with_end` (its stop for tool use made the end of the turn when
    /// no call is left, `calls_left` false); without it the end is kept for
    /// [`take_ending`](Self::take_ending). Bytes of an unfinished event go with the end.
    pub fn release(&mut self, with_end: bool, calls_left: bool) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let recalled = self.recall_indexes(&held);
        let (mut out, mut ending) = (Vec::new(), Vec::new());
        for event in &held {
            let Some(Data::Json(mut value)) = data(event) else {
                ending.extend_from_slice(event);
                continue;
            };
            let summed = self.usage_seen(&mut value);
            let kept = match self.provider {
                Provider::Anthropic => self.anthropic_kept(&mut value, &recalled, calls_left),
                Provider::OpenAi => openai_kept(&mut value, &recalled, calls_left),
            };
            let bytes = |changed: bool| match changed || summed {
                true => rewritten(event, &value),
                false => event.clone(),
            };
            match kept {
                Kept::Drop => {}
                Kept::Event(changed) => out.extend_from_slice(&bytes(changed)),
                Kept::End(changed) => ending.extend_from_slice(&bytes(changed)),
            }
        }
        ending.append(&mut self.partial);
        match with_end {
            true => out.extend_from_slice(&ending),
            false => self.ending = ending,
        }
        out
    }

    /// Notes the usage `value` reports (Anthropic `message_start` and `message_delta`, an
    /// OpenAI usage chunk); in a follow-up's stream, the final usage gets the earlier rounds'
    /// added (true: `value` was changed).
    fn usage_seen(&mut self, value: &mut Value) -> bool {
        let (found, last) = match self.provider {
            Provider::Anthropic => match value.get("type").and_then(Value::as_str) {
                Some("message_start") => (value.pointer("/message/usage"), false),
                Some("message_delta") => (value.get("usage"), true),
                _ => (None, false),
            },
            Provider::OpenAi => (value.get("usage").filter(|u| u.is_object()), true),
        };
        let Some(found) = found.cloned() else { return false };
        if let (Some(usage), Some(found)) = (self.usage.as_object_mut(), found.as_object()) {
            usage.extend(found.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if !(last && self.continuation) {
            return false;
        }
        value["usage"] = summed(&[&self.carried, &self.usage]);
        true
    }

    /// The end events a [`release`](Self::release) without the end kept (for a follow-up
    /// that failed: the client's stream still ends).
    pub fn take_ending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.ending)
    }

    /// The indexes of the recall calls among `held` (Anthropic blocks, OpenAI tool calls).
    fn recall_indexes(&self, held: &[Vec<u8>]) -> Vec<u64> {
        let mut indexes = Vec::new();
        for event in held {
            let Some(Data::Json(value)) = data(event) else { continue };
            match self.provider {
                Provider::Anthropic => {
                    let block = value.get("content_block").unwrap_or(&Value::Null);
                    if value.get("type").and_then(Value::as_str) == Some("content_block_start")
                        && block.get("name").and_then(Value::as_str) == Some(RECALL_TOOL)
                        && let Some(index) = block_index(&value)
                    {
                        indexes.push(index);
                    }
                }
                Provider::OpenAi => {
                    let calls =
                        value.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array);
                    for call in calls.into_iter().flatten().filter(|c| is_openai_recall(c)) {
                        indexes.extend(call.get("index").and_then(Value::as_u64));
                    }
                }
            }
        }
        indexes
    }

    /// What a held Anthropic event becomes: a recall block's left out, another block's
    /// re-indexed, the message's end kept apart.
    fn anthropic_kept(&mut self, value: &mut Value, recalled: &[u64], calls_left: bool) -> Kept {
        let kind = value.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
        match kind.as_str() {
            "message_delta" => {
                let stop = value.pointer("/delta/stop_reason").and_then(Value::as_str);
                let fix = !calls_left && stop == Some("tool_use");
                if fix {
                    value["delta"]["stop_reason"] = Value::from("end_turn");
                }
                Kept::End(fix)
            }
            "message_stop" => Kept::End(false),
            _ => match block_index(value) {
                Some(index) if recalled.contains(&index) => Kept::Drop,
                Some(index) => {
                    let below = recalled.iter().filter(|r| **r < index).count() as u64;
                    let new = index - below + self.offset;
                    if kind == "content_block_start" {
                        self.blocks += 1;
                    }
                    value["index"] = Value::from(new);
                    Kept::Event(new != index)
                }
                None => Kept::Event(false),
            },
        }
    }
}

/// What [`RecallStream::pass`] does with an event.
enum Pass {
    Forward(Vec<u8>),
    Drop,
    Hold,
}

/// What [`RecallStream::release`] does with a held event (`true`: its data was changed).
enum Kept {
    Drop,
    Event(bool),
    End(bool),
}

/// What a held OpenAI chunk becomes: its recall calls left out (the others re-indexed), a
/// chunk left with nothing dropped; the finish, the usage and `[DONE]` kept apart.
fn openai_kept(value: &mut Value, recalled: &[u64], calls_left: bool) -> Kept {
    let mut changed = false;
    if let Some(calls) =
        value.pointer_mut("/choices/0/delta/tool_calls").and_then(Value::as_array_mut)
    {
        let before = calls.len();
        calls.retain(|c| {
            !c.get("index").and_then(Value::as_u64).is_some_and(|i| recalled.contains(&i))
        });
        changed = calls.len() != before;
        for call in calls.iter_mut() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let below = recalled.iter().filter(|r| **r < index).count() as u64;
            if below > 0 {
                call["index"] = Value::from(index - below);
                changed = true;
            }
        }
        if calls.is_empty()
            && let Some(delta) =
                value.pointer_mut("/choices/0/delta").and_then(Value::as_object_mut)
        {
            delta.remove("tool_calls");
        }
    }
    let finish =
        value.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_string);
    let usage_only = value.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty);
    if let Some(finish) = finish {
        if !calls_left && finish == "tool_calls" {
            value["choices"][0]["finish_reason"] = Value::from("stop");
            changed = true;
        }
        return Kept::End(changed);
    }
    if usage_only {
        return Kept::End(changed);
    }
    let delta = value.pointer("/choices/0/delta").and_then(Value::as_object);
    match delta.is_some_and(serde_json::Map::is_empty) && changed {
        true => Kept::Drop,
        false => Kept::Event(changed),
    }
}

/// Whether `call` (an entry of a delta's `tool_calls`) starts a recall call.
fn is_openai_recall(call: &Value) -> bool {
    call.pointer("/function/name").and_then(Value::as_str) == Some(RECALL_TOOL)
}

/// An Anthropic event's block index.
fn block_index(value: &Value) -> Option<u64> {
    value.get("index").and_then(Value::as_u64)
}

/// Where the first whole event of `bytes` ends (after its blank line).
fn event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(bytes, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::find(bytes, b"\r\n\r\n").map(|at| at + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An event's data.
enum Data {
    Json(Value),
    Other,
}

/// The data of `event` (its `data:` lines joined), when it has any.
fn data(event: &[u8]) -> Option<Data> {
    let text = std::str::from_utf8(event).ok()?;
    let mut joined = String::new();
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data:") {
            if !joined.is_empty() {
                joined.push('\n');
            }
            joined.push_str(data.strip_prefix(' ').unwrap_or(data));
        }
    }
    if joined.is_empty() {
        return None;
    }
    Some(serde_json::from_str(&joined).map_or(Data::Other, Data::Json))
}

/// `event` with its data replaced by `value`, its other lines as they were.
fn rewritten(event: &[u8], value: &Value) -> Vec<u8> {
    let text = String::from_utf8_lossy(event);
    let mut out = String::with_capacity(event.len());
    let mut written = false;
    for line in text.lines() {
        if line.starts_with("data:") {
            if !written {
                out.push_str(&format!("data: {value}\n"));
                written = true;
            }
            continue;
        }
        if !line.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push('\n');
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn block(index: u64, block: Value) -> [String; 2] {
        [
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            ),
            event("content_block_stop", json!({"type": "content_block_stop", "index": index})),
        ]
    }

    fn indexes(bytes: &[u8]) -> Vec<(String, Option<u64>)> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let value: Value =
                    serde_json::from_str(e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                        .unwrap();
                (value["type"].as_str().unwrap().to_string(), value["index"].as_u64())
            })
            .collect()
    }

    #[test]
    fn anthropic_a_stream_without_recall_passes_byte_for_byte_in_any_chunking() {
        let mut all = vec![event("message_start", json!({"type": "message_start", "message": {}}))];
        all.extend(block(0, json!({"type": "text", "text": ""})));
        all.extend(block(1, json!({"type": "tool_use", "id": "t", "name": "Read", "input": {}})));
        all.push(event("message_stop", json!({"type": "message_stop"})));
        let bytes = all.concat().into_bytes();
        for size in [1, 7, 64, bytes.len()] {
            let mut stream = RecallStream::new(Provider::Anthropic);
            let mut out: Vec<u8> = bytes.chunks(size).flat_map(|c| stream.feed(c)).collect();
            assert!(!stream.holding());
            out.extend(stream.release(true, true));
            assert_eq!(out, bytes, "chunks of {size}");
        }
    }

    #[test]
    fn anthropic_recall_blocks_are_held_and_left_out_and_the_follow_up_continues_the_indexes() {
        let mut first = RecallStream::new(Provider::Anthropic);
        let mut out =
            first.feed(event("message_start", json!({"type": "message_start"})).as_bytes());
        out.extend(first.feed(block(0, json!({"type": "text", "text": ""})).concat().as_bytes()));
        let recall =
            block(1, json!({"type": "tool_use", "id": "r", "name": RECALL_TOOL, "input": {}}));
        out.extend(first.feed(recall.concat().as_bytes()));
        out.extend(first.feed(block(2, json!({"type": "text", "text": ""})).concat().as_bytes()));
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}});
        out.extend(first.feed(event("message_delta", delta).as_bytes()));
        out.extend(first.feed(event("message_stop", json!({"type": "message_stop"})).as_bytes()));
        assert!(first.holding());
        out.extend(first.release(false, false));
        let names = indexes(&out);
        assert_eq!(names.iter().filter(|(_, i)| *i == Some(1)).count(), 2, "{names:?}");
        assert!(!names.iter().any(|(t, _)| t == "message_stop"), "the end waits");
        let mut next = first.next_round();
        let mut more =
            next.feed(event("message_start", json!({"type": "message_start"})).as_bytes());
        more.extend(next.feed(block(0, json!({"type": "text", "text": ""})).concat().as_bytes()));
        more.extend(next.feed(event("message_stop", json!({"type": "message_stop"})).as_bytes()));
        assert_eq!(
            indexes(&more),
            [
                ("content_block_start".into(), Some(2)),
                ("content_block_stop".into(), Some(2)),
                ("message_stop".into(), None)
            ]
        );
        let ending = String::from_utf8(first.take_ending()).unwrap();
        assert!(ending.contains("\"end_turn\"") && ending.contains("message_stop"), "{ending}");
    }

    #[test]
    fn openai_recall_calls_leave_and_the_others_are_re_indexed() {
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let call = |index: u64, name: Option<&str>, arguments: &str| match name {
            Some(name) => {
                json!({"index": index, "id": format!("c{index}"), "type": "function", "function": {"name": name, "arguments": arguments}})
            }
            None => json!({"index": index, "function": {"arguments": arguments}}),
        };
        let mut stream = RecallStream::new(Provider::OpenAi);
        let opening = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        let mut out = stream.feed(opening.as_bytes());
        assert_eq!(out, opening.as_bytes());
        out.extend(stream.feed(
            chunk(json!({"tool_calls": [call(0, Some(RECALL_TOOL), "")]}), Value::Null).as_bytes(),
        ));
        out.extend(stream.feed(
            chunk(json!({"tool_calls": [call(0, None, "{\"id\":3}")]}), Value::Null).as_bytes(),
        ));
        out.extend(stream.feed(
            chunk(json!({"tool_calls": [call(1, Some("run"), "{}")]}), Value::Null).as_bytes(),
        ));
        out.extend(stream.feed(chunk(json!({}), json!("tool_calls")).as_bytes()));
        out.extend(stream.feed(b"data: [DONE]\n\n"));
        assert_eq!(out, opening.as_bytes(), "held from the recall call on");
        let rest = String::from_utf8(stream.release(true, true)).unwrap();
        assert!(!rest.contains(RECALL_TOOL), "{rest}");
        assert!(rest.contains(r#""tool_calls":[{"function":{"arguments":"{}","name":"run"},"id":"c1","index":0,"type":"function"}]"#), "{rest}");
        assert!(
            rest.contains(r#""finish_reason":"tool_calls""#) && rest.ends_with("data: [DONE]\n\n"),
            "{rest}"
        );
        let mut next = stream.next_round();
        assert!(next.feed(opening.as_bytes()).is_empty(), "a follow-up's opening is dropped");
    }
}
