//! Requests: every block kind read and written back byte for byte, the core's reduced content
//! rewritten in both providers, messages the core wrote, and properties over arbitrary input.

use ctxwin_std::format::{
    Analyzed, KeptPart, MANAGED_OPENING_TEXT, ManagedBody, Provider, Request, analyze,
    analyze_message,
};
use ctxwin_std::{ChatMessage, core::Role};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::json_value;

/// The [`Part::blocks`](ctxwin_std::format::Part) of each part of `message`.
fn blocks_of(message: &Analyzed) -> Vec<Vec<usize>> {
    message.parts.iter().map(|part| part.blocks.clone()).collect()
}

/// Every part of a message, kept, with `reduced(part)` as its reduced text.
fn kept(message: &Analyzed, reduced: impl Fn(usize) -> Option<String>) -> Vec<KeptPart> {
    (0..message.parts.len()).map(|part| KeptPart { part, reduced: reduced(part) }).collect()
}

/// `request` written back through [`ManagedBody`], the parts `keep(item, message)` returns
/// kept (every part, unreduced, by default), `extra` as the core's system texts.
fn write_back(
    provider: Provider,
    request: &Request,
    extra: Vec<String>,
    keep: impl Fn(usize, &Analyzed) -> Vec<KeptPart>,
) -> String {
    let analyzed = analyze(provider, request).unwrap();
    let mut body = ManagedBody::new(provider, request, extra);
    for (item, message) in analyzed.iter().enumerate() {
        let raw = request.items[item].get();
        if request.has_system_item && item == 0 {
            body.system(raw.to_string());
            continue;
        }
        if item == usize::from(request.has_system_item) {
            body.history_starts();
        }
        let role = message.parts.first().map_or(Role::User, |part| part.chat.role);
        body.message(raw, role, &blocks_of(message), &keep(item, message));
    }
    String::from_utf8(body.finish()).unwrap()
}

fn all_kept(provider: Provider, body: &str) -> String {
    let request = Request::parse(provider, body.as_bytes()).unwrap();
    write_back(provider, &request, Vec::new(), |_, message| kept(message, |_| None))
}

fn png_data(w: u32, h: u32) -> String {
    // A PNG signature and IHDR header, base64: enough for the size.
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    bytes.extend_from_slice(&w.to_be_bytes());
    bytes.extend_from_slice(&h.to_be_bytes());
    bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    base64(&bytes)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every OpenAI message kind, with odd spacing and key order inside the messages.
fn openai_kinds() -> Vec<String> {
    vec![
        r#"{"role":"developer","content":"Be brief."}"#.into(),
        r#"{"role": "system",  "content": [{"type":"text","text":"Cite files."}]}"#.into(),
        format!(
            r#"{{"role":"user","name":"ann","content":[{{"type":"text","text":"Look."}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{}","detail":"high"}}}},{{"type":"input_audio","input_audio":{{"data":"UklGRiQAAABXQVZF","format":"wav"}}}},{{"type":"file","file":{{"filename":"a.pdf","file_data":"data:application/pdf;base64,JVBERi0xLjQK"}}}},{{"type":"video_frames","frames":[1,2]}}]}}"#,
            png_data(640, 480)
        ),
        r#"{"content":null,"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"dir\": \".\"}"}},{"id":"c2","type":"function","function":{"name":"cat","arguments":"not json"}}]}"#.into(),
        r#"{"role":"tool","tool_call_id":"c1","content":"Cargo.toml\nsrc/"}"#.into(),
        r#"{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"fn main() {}"}]}"#.into(),
        r#"{"role":"assistant","content":null,"refusal":"I cannot help with that."}"#.into(),
        r#"{"role":"function","name":"legacy","content":"old style"}"#.into(),
        r#"{"role":"user","content":"Thanks.","metadata":{"k":[1, 2]}}"#.into(),
    ]
}

/// Every Anthropic block kind the API has (and one it may add), odd spacing included.
fn anthropic_kinds() -> Vec<String> {
    vec![
        format!(
            r#"{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{}"}}}},{{"type":"document","source":{{"type":"text","media_type":"text/plain","data":"The sky is blue."}},"citations":{{"enabled":true}}}},{{"type": "text", "text":"What colour is the sky?",  "cache_control":{{"type":"ephemeral"}}}}]}}"#,
            png_data(1000, 1000)
        ),
        r#"{"role":"assistant","content":[{"type":"thinking","thinking":"The document says blue.","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix"},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"sky colour"}},{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://example.com","title":"Sky","encrypted_content":"abc","page_age":null}]},{"type":"text","text":"Blue.","citations":[{"type":"char_location","cited_text":"The sky is blue.","document_index":0,"start_char_index":0,"end_char_index":16}]},{"type":"tool_use","id":"t1","name":"read_file","input":{"path": "sky.md"}}]}"#.into(),
        format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t1","content":[{{"type":"text","text":"Sky notes"}},{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{}"}}}}],"is_error":false}},{{"type":"text","text":"Go on.","cache_control":{{"type":"ephemeral","ttl":"1h"}}}}]}}"#,
            png_data(200, 200)
        ),
        r#"{"role":"assistant","content":[{"type":"mcp_tool_use","id":"m1","name":"q","server_name":"s","input":{}},{"type":"container_upload","file_id":"f1"},{"type":"text","text":"Done."}]}"#.into(),
        r#"{"role":"user","content":"A plain string turn."}"#.into(),
        r#"{"role":"assistant","content":[]}"#.into(),
    ]
}

#[test]
fn every_openai_block_kind_is_written_back_byte_for_byte() {
    let messages = openai_kinds();
    let body = format!(
        r#"{{"model":"gpt-4o","temperature":0.2,"messages":[{}],"tools":[{{"type":"function","function":{{"name":"ls","parameters":{{"type":"object"}}}}}}],"n":1}}"#,
        messages.join(",")
    );
    assert_eq!(all_kept(Provider::OpenAi, &body), body);
    // Each message alone too, and what analysis made of the opaque parts.
    let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
    for (item, raw) in messages.iter().enumerate() {
        assert_eq!(request.items[item].get(), raw);
    }
    let analyzed = analyze(Provider::OpenAi, &request).unwrap();
    let labels: Vec<&str> = analyzed[2].parts[0].opaque.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(labels, ["image 640x480", "audio 12 bytes", "file a.pdf 9 bytes", "video_frames"]);
    assert_eq!(analyzed[2].parts[0].opaque[0].tokens, 425); // 2 tiles of 512 × 170, plus 85
    assert_eq!(analyzed[6].parts[0].chat.content, "I cannot help with that.");
    assert_eq!(analyzed[7].parts[0].chat.role, Role::User);
}

#[test]
fn every_anthropic_block_kind_is_written_back_byte_for_byte() {
    let messages = anthropic_kinds();
    for system in [
        r#""You are careful.""#,
        r#"[{"type":"text","text":"You are careful.","cache_control":{"type":"ephemeral"}}]"#,
    ] {
        let body = format!(
            r#"{{"model":"claude","max_tokens":1024,"system":{system},"thinking":{{"type":"enabled","budget_tokens":2000}},"messages":[{}],"stream":true}}"#,
            messages.join(",")
        );
        assert_eq!(all_kept(Provider::Anthropic, &body), body);
    }
    let body = format!(r#"{{"model":"claude","messages":[{}]}}"#, messages.join(","));
    let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
    let analyzed = analyze(Provider::Anthropic, &request).unwrap();
    let first: Vec<&str> = analyzed[0].parts[0].opaque.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(first, ["image/png 1000x1000", "document"]);
    assert_eq!(analyzed[0].parts[0].opaque[0].tokens, 1_334);
    let thinking = &analyzed[1].parts[0];
    assert!(thinking.chat.content.starts_with("The document says blue.\nBlue."));
    assert_eq!(thinking.chat.tool_calls[0].arguments, r#"{"path":"sky.md"}"#);
    assert_eq!(thinking.blocks, [0, 1, 2, 3, 4, 5]);
    let result = &analyzed[2].parts[0];
    assert_eq!((result.chat.role, result.blocks.as_slice()), (Role::Tool, &[0][..]));
    assert_eq!(result.opaque[0].label, "image/png 200x200");
}

#[test]
fn openai_reduced_content_is_rewritten_and_nothing_else() {
    let messages = [
        r#"{"role":"user","content":"Build it."}"#,
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"build","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"log","arguments":"{}"}},{"id":"c3","type":"function","function":{"name":"shot","arguments":"{}"}}]}"#,
        r#"{"role":"tool", "tool_call_id":"c1","content":"line 1\nline 2\nexit 1"}"#,
        r#"{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]}"#,
        r#"{"role":"tool","tool_call_id":"c3","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}"#,
    ];
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
    let sent = write_back(Provider::OpenAi, &request, vec!["Goal: green.".into()], |item, m| {
        kept(m, |_| (item >= 2).then(|| format!("reduced {item}")))
    });
    let expected = [
        r#"{"content":"Goal: green.","role":"system"}"#,
        messages[0],
        messages[1],
        r#"{"role":"tool","tool_call_id":"c1","content":"reduced 2"}"#,
        r#"{"role":"tool","tool_call_id":"c2","content":[{"cache_control":{"type":"ephemeral"},"text":"reduced 3","type":"text"}]}"#,
        r#"{"role":"tool","tool_call_id":"c3","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}"#,
    ];
    assert_eq!(sent, format!(r#"{{"model":"m","messages":[{}]}}"#, expected.join(",")));
}

#[test]
fn anthropic_reduced_results_are_rewritten_and_other_blocks_stay() {
    let messages = anthropic_kinds();
    let body = format!(
        r#"{{"model":"claude","system":"Rules.","messages":[{},{}]}}"#,
        messages[1], messages[2]
    );
    let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
    // The first turn evicted (the window starts with the assistant's), the result reduced.
    let sent =
        write_back(Provider::Anthropic, &request, vec!["[Memory Summary] x".into()], |item, m| {
            match item {
                2 => kept(m, |part| (part == 0).then(|| "reduced".to_string())),
                _ => kept(m, |_| None),
            }
        });
    let value: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(
        value["system"],
        json!([{"type": "text", "text": "Rules."}, {"type": "text", "text": "[Memory Summary] x"}])
    );
    let turns = value["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    // The assistant's turn is first but for the opening turn, byte for byte.
    assert!(sent.contains(&format!(
        r#"{{"role":"user","content":"{MANAGED_OPENING_TEXT}"}},{}"#,
        messages[1]
    )));
    // The result with an image is sent whole; the text block after it keeps its bytes.
    assert!(sent.contains(
        r#"{"type":"text","text":"Go on.","cache_control":{"type":"ephemeral","ttl":"1h"}}"#
    ));
    assert_eq!(turns[2]["content"][0]["content"][1]["type"], "image");
    // With text blocks only, the result is reduced to one block.
    let text_only = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"long"}]},{"type":"tool_result","tool_use_id":"t2","content":"long too","is_error":true}]}"#;
    let body = format!(r#"{{"model":"claude","messages":[{}]}}"#, text_only);
    let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
    let sent = write_back(Provider::Anthropic, &request, Vec::new(), |_, m| {
        kept(m, |part| Some(format!("short {part}")))
    });
    assert_eq!(
        sent,
        r#"{"model":"claude","messages":[{"role":"user","content":[{"content":[{"text":"short 0","type":"text"}],"tool_use_id":"t1","type":"tool_result"},{"content":"short 1","is_error":true,"tool_use_id":"t2","type":"tool_result"}]}]}"#
    );
}

#[test]
fn messages_the_core_wrote_take_each_providers_shape() {
    let body = br#"{"model":"m","messages":[]}"#;
    let aborted = ChatMessage::tool_result("c1", "[no result: the call was abandoned]");
    let request = Request::parse(Provider::OpenAi, body).unwrap();
    let mut managed = ManagedBody::new(Provider::OpenAi, &request, Vec::new());
    managed.core_message(&aborted);
    assert_eq!(
        managed.finish(),
        br#"{"model":"m","messages":[{"content":"[no result: the call was abandoned]","role":"tool","tool_call_id":"c1"}]}"#
    );
    let request = Request::parse(Provider::Anthropic, body).unwrap();
    let mut managed = ManagedBody::new(Provider::Anthropic, &request, Vec::new());
    managed.core_message(&ChatMessage::text(Role::User, "Go on."));
    managed.core_message(&aborted);
    assert_eq!(
        String::from_utf8(managed.finish()).unwrap(),
        r#"{"model":"m","messages":[{"content":"Go on.","role":"user"},{"content":[{"content":"[no result: the call was abandoned]","tool_use_id":"c1","type":"tool_result"}],"role":"user"}]}"#
    );
}

/// A block no reader interprets: one of the kinds providers have (or may add), with
/// arbitrary fields, compact or pretty-printed.
fn opaque_block(kinds: &'static [&'static str]) -> impl Strategy<Value = String> {
    (proptest::sample::select(kinds), btree_map("[a-z_]{1,8}", json_value(), 0..4), any::<bool>())
        .prop_map(|(kind, fields, pretty)| {
            let mut block: serde_json::Map<String, Value> = fields.into_iter().collect();
            block.insert("type".into(), Value::from(kind));
            let value = Value::Object(block);
            if pretty { serde_json::to_string_pretty(&value).unwrap() } else { value.to_string() }
        })
}

const ANTHROPIC_OPAQUE: &[&str] = &[
    "image",
    "document",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
    "code_execution_tool_result",
    "mcp_tool_use",
    "search_result",
    "container_upload",
];

const OPENAI_OPAQUE: &[&str] = &["image_url", "input_audio", "file", "video", "x-custom"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn reading_any_bytes_never_panics(bytes in vec(any::<u8>(), 0..256)) {
        for provider in [Provider::OpenAi, Provider::Anthropic] {
            if let Ok(request) = Request::parse(provider, &bytes) {
                let _ = analyze(provider, &request);
            }
        }
    }

    #[test]
    fn analysing_any_json_never_panics(content in json_value(), role in "user|assistant|tool|system|x", extra in json_value()) {
        for provider in [Provider::OpenAi, Provider::Anthropic] {
            let message = json!({"role": role, "content": content, "tool_calls": extra, "tool_call_id": "c"});
            let _ = analyze_message(provider, &message);
            let _ = analyze_message(provider, &content);
            let body = json!({"model": "m", "system": extra, "messages": [message, content]}).to_string();
            if let Ok(request) = Request::parse(provider, body.as_bytes()) {
                let _ = analyze(provider, &request);
            }
        }
    }

    #[test]
    fn anthropic_opaque_blocks_are_written_back_byte_for_byte(
        user in vec(opaque_block(ANTHROPIC_OPAQUE), 1..4),
        assistant in vec(opaque_block(ANTHROPIC_OPAQUE), 1..4),
        reduce in any::<bool>(),
    ) {
        let user_turn = format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t0","content":"out"}},{}]}}"#,
            user.join(",")
        );
        let assistant_turn = format!(
            r#"{{"role":"assistant","content":[{},{{"type":"tool_use","id":"t1","name":"f","input":{{}}}}]}}"#,
            assistant.join(",")
        );
        let body = format!(r#"{{"model":"m","messages":[{user_turn},{assistant_turn}]}}"#);
        prop_assert_eq!(all_kept(Provider::Anthropic, &body), body.clone());
        let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
        let sent = write_back(Provider::Anthropic, &request, Vec::new(), |_, m| {
            kept(m, |part| (reduce && part == 0).then(|| "r".to_string()))
        });
        for block in user.iter().chain(&assistant) {
            prop_assert!(sent.contains(block.as_str()), "{} not in {}", block, sent);
        }
        // However it is serialized, a turn has one fingerprint.
        let value: Value = serde_json::from_str(&user_turn).unwrap();
        let pretty: Value = serde_json::from_str(&serde_json::to_string_pretty(&value).unwrap()).unwrap();
        prop_assert_eq!(
            analyze_message(Provider::Anthropic, &value).unwrap().fp,
            analyze_message(Provider::Anthropic, &pretty).unwrap().fp
        );
    }

    #[test]
    fn openai_opaque_parts_are_written_back_byte_for_byte(
        parts in vec(opaque_block(OPENAI_OPAQUE), 1..4),
        reduce in any::<bool>(),
    ) {
        let user = format!(r#"{{"role":"user","content":[{{"type":"text","text":"look"}},{}]}}"#, parts.join(","));
        let body = format!(r#"{{"model":"m","messages":[{user}]}}"#);
        prop_assert_eq!(all_kept(Provider::OpenAi, &body), body.clone());
        let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
        let sent = write_back(Provider::OpenAi, &request, Vec::new(), |_, m| {
            kept(m, |_| reduce.then(|| "r".to_string()))
        });
        for part in &parts {
            prop_assert!(sent.contains(part.as_str()), "{} not in {}", part, sent);
        }
    }
}

#[test]
fn a_user_request_after_a_turn_kept_ahead_of_a_gap_joins_its_tool_results() {
    // The core kept an old read (call and result) and the newest request; the turns between
    // left. Two user turns in a row would be refused: the request joins the results' turn.
    let body = r#"{"model":"claude","messages":[{"role":"user","content":"Fix it."},{"role":"assistant","content":[{"type":"tool_use","id":"r1","name":"Read","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"r1","content":"fn main() {}"}]},{"role":"assistant","content":"Done."},{"role":"user","content":"Now the tests."}]}"#;
    let request = Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
    let analyzed = analyze(Provider::Anthropic, &request).unwrap();
    let mut managed = ManagedBody::new(Provider::Anthropic, &request, Vec::new());
    for item in [1, 2, 4] {
        let message = &analyzed[item];
        let kept: Vec<KeptPart> =
            (0..message.parts.len()).map(|part| KeptPart { part, reduced: None }).collect();
        let role = message.parts[0].chat.role;
        managed.message(request.items[item].get(), role, &blocks_of(message), &kept);
    }
    let sent: Value = serde_json::from_slice(&managed.finish()).unwrap();
    let roles: Vec<&str> =
        sent["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{sent}");
    assert_eq!(
        sent["messages"][2]["content"],
        json!([{"type":"tool_result","tool_use_id":"r1","content":"fn main() {}"},{"text":"Now the tests.","type":"text"}])
    );
}
