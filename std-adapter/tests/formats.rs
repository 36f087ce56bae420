//! Provider formats: fixtures, conversions between OpenAI and Anthropic, large JSONL,
//! malformed input, and round-trip properties; requests (every block kind read and written
//! back byte for byte, reduced content) in [`requests`].

#[path = "formats/requests.rs"]
mod requests;

use std::io::{BufReader, Cursor};
use std::path::PathBuf;

use ctxwin_std::core::Role;
use ctxwin_std::format::{Format, FormatError, Problem, detect, read, read_from, write};
use ctxwin_std::{ChatMessage, Conversation, ToolCall, ToolDefinition};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats").join(name)
}

fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

fn convert(conv: &Conversation, via: Format) -> Conversation {
    read(&write(conv, via).unwrap(), via).unwrap()
}

/// What the OpenAI writer and reader make of a conversation: `system` as the first message,
/// no `is_error`.
fn as_openai(conv: &Conversation) -> Conversation {
    let mut out = conv.clone();
    if let Some(system) = out.system.take() {
        out.messages.insert(0, ChatMessage::text(Role::System, system));
    }
    for message in &mut out.messages {
        message.is_error = false;
    }
    out
}

/// What JSONL writers make of embedded JSON text: line breaks between tokens become spaces.
fn flattened(conv: &Conversation) -> Conversation {
    let flat = |text: &str| text.replace(['\n', '\r'], " ");
    let mut out = conv.clone();
    for tool in &mut out.tools {
        tool.parameters = flat(&tool.parameters);
    }
    out
}

/// Also flattens tool-call arguments, which Anthropic embeds as JSON (OpenAI as strings).
fn flattened_arguments(conv: &Conversation) -> Conversation {
    let mut out = flattened(conv);
    for call in out.messages.iter_mut().flat_map(|m| m.tool_calls.iter_mut()) {
        call.arguments = call.arguments.replace(['\n', '\r'], " ");
    }
    out
}

fn roles(conv: &Conversation) -> Vec<Role> {
    conv.messages.iter().map(|m| m.role).collect()
}

/// The Anthropic roles of a written document alternate and start with the user.
fn assert_alternates(anthropic_json: &str) {
    let doc: Value = serde_json::from_str(anthropic_json).unwrap();
    let turns = doc["messages"].as_array().unwrap();
    for (i, turn) in turns.iter().enumerate() {
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(turn["role"], expected, "turn {i}: {turn}");
    }
}

#[test]
fn openai_session_sample_reads_rewrites_identically_and_converts() {
    let text = fixture_text("openai-session.jsonl");
    assert_eq!(detect(&text), Some(Format::OpenAiJsonl));
    let file = std::fs::File::open(fixture("openai-session.jsonl")).unwrap();
    let conv = read_from(BufReader::new(file), Format::OpenAiJsonl).unwrap();

    assert_eq!(conv.messages.len(), 60);
    let count = |role| conv.messages.iter().filter(|m| m.role == role).count();
    assert_eq!(
        [count(Role::System), count(Role::User), count(Role::Assistant), count(Role::Tool)],
        [1, 14, 24, 21]
    );
    let calls: Vec<&ToolCall> = conv.messages.iter().flat_map(|m| &m.tool_calls).collect();
    assert_eq!(calls.len(), 21);
    assert_eq!(calls[0].id, "call_000000_0_0");
    assert_eq!(calls[0].arguments, r#"{"limit": 107, "target": "/src/error/719.rs"}"#);
    for (i, result) in conv.messages.iter().enumerate().filter(|(_, m)| m.role == Role::Tool) {
        let id = result.tool_call_id.as_deref().unwrap();
        assert!(conv.messages[..i].iter().flat_map(|m| &m.tool_calls).any(|c| c.id == id), "{id}");
    }

    assert_eq!(
        write(&conv, Format::OpenAiJsonl).unwrap(),
        text,
        "OpenAI JSONL rewrite is byte-identical"
    );

    let anthropic = write(&conv, Format::AnthropicJson).unwrap();
    assert_alternates(&anthropic);
    let doc: Value = serde_json::from_str(&anthropic).unwrap();
    assert!(
        doc["system"].as_str().unwrap().starts_with("You are a careful autonomous coding agent.")
    );
    assert_eq!(
        doc["messages"][1]["content"][0]["input"],
        json!({"limit": 107, "target": "/src/error/719.rs"})
    );

    let from_anthropic = read(&anthropic, Format::AnthropicJson).unwrap();
    assert_eq!(as_openai(&from_anthropic), conv);
    assert_eq!(as_openai(&convert(&conv, Format::AnthropicJsonl)), conv);
}

#[test]
fn openai_agent_body_converts_to_anthropic_and_back() {
    let conv = read(&fixture_text("openai-agent.json"), Format::OpenAiJson).unwrap();
    assert_eq!(detect(&fixture_text("openai-agent.json")), Some(Format::OpenAiJson));
    assert_eq!(conv.system, None);
    assert_eq!(
        roles(&conv),
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Tool,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::User
        ]
    );
    assert_eq!(
        conv.messages[1].content,
        "The build fails on CI.\nFind out why and fix it — the log says “unresolved import”."
    );
    assert_eq!(conv.messages[2].tool_calls.len(), 3);
    assert_eq!(conv.messages[6].content, "");
    assert_eq!(conv.tools.len(), 2);
    assert_eq!(conv.tools[1].name, "run");
    let schema: Value = serde_json::from_str(&conv.tools[1].parameters).unwrap();
    assert_eq!(schema["required"], json!(["cmd"]));

    let anthropic = write(&conv, Format::AnthropicJson).unwrap();
    assert_alternates(&anthropic);
    let doc: Value = serde_json::from_str(&anthropic).unwrap();
    assert_eq!(doc["system"], "You are a careful coding agent. Never invent tool output.");
    let results = doc["messages"][2]["content"].as_array().unwrap();
    let ids: Vec<&str> = results.iter().map(|b| b["tool_use_id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["call_a1", "call_a2", "call_a3"],
        "parallel results share one user turn, in order"
    );
    assert_eq!(doc["messages"][1]["content"][0]["type"], "text");
    assert_eq!(doc["messages"][1]["content"][3]["input"]["timeout_s"], 120);
    assert_eq!(doc["tools"][0]["input_schema"]["required"], json!(["path"]));

    for via in [Format::AnthropicJson, Format::AnthropicJsonl] {
        assert_eq!(as_openai(&convert(&conv, via)), conv, "via {via}");
    }
    assert_eq!(convert(&conv, Format::OpenAiJsonl), flattened(&conv));
}

#[test]
fn anthropic_agent_body_reads_and_survives_openai_except_is_error() {
    let text = fixture_text("anthropic-agent.json");
    assert_eq!(detect(&text), Some(Format::AnthropicJson));
    let conv = read(&text, Format::AnthropicJson).unwrap();
    assert_eq!(
        conv.system.as_deref(),
        Some("You are a careful coding agent.\nNever invent tool output.")
    );
    assert_eq!(
        roles(&conv),
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    let calls = &conv.messages[1].tool_calls;
    assert_eq!(conv.messages[1].content, "I'll search for it.");
    assert_eq!(
        calls[0],
        ToolCall::new("toolu_01", "grep", r#"{"pattern": "retry", "dir": "src"}"#)
    );
    assert_eq!(calls[1].id, "toolu_02");
    assert!(!conv.messages[2].is_error);
    assert!(conv.messages[3].is_error);
    assert_eq!(conv.messages[3].content, "file not found");
    assert_eq!(conv.messages[4].content, "Also check the env vars.");
    assert_eq!(conv.messages[5].content, "");
    assert_eq!(conv.tools[1].description, "");

    assert_eq!(convert(&conv, Format::AnthropicJson), conv);
    assert_eq!(convert(&conv, Format::AnthropicJsonl), flattened(&conv));

    let via_openai = read(&write(&conv, Format::OpenAiJson).unwrap(), Format::OpenAiJson).unwrap();
    assert_eq!(via_openai, as_openai(&conv));
    let back = convert(&via_openai, Format::AnthropicJson);
    let mut expected = conv.clone();
    expected.messages[3].is_error = false;
    assert_eq!(back, expected, "OpenAI has no is_error; everything else survives");
}

#[test]
fn mid_conversation_system_becomes_prefixed_user_text() {
    let mut conv = Conversation::default();
    conv.messages.push(ChatMessage::text(Role::System, "first rules"));
    conv.messages.push(ChatMessage::text(Role::User, "hi"));
    conv.messages.push(ChatMessage::text(Role::System, "be brief"));
    conv.messages.push(ChatMessage::text(Role::Assistant, "ok"));

    let anthropic = write(&conv, Format::AnthropicJson).unwrap();
    let doc: Value = serde_json::from_str(&anthropic).unwrap();
    assert_eq!(doc["system"], "first rules");
    assert_eq!(
        doc["messages"][0]["content"],
        json!([{"type": "text", "text": "hi"}, {"type": "text", "text": "[system] be brief"}])
    );

    let back = read(&anthropic, Format::AnthropicJson).unwrap();
    assert_eq!(back.system.as_deref(), Some("first rules"));
    assert_eq!(back.messages[1], ChatMessage::text(Role::User, "[system] be brief"));
    // The prefix is never promoted back to a system message.
    let reread = convert(&back, Format::AnthropicJson);
    assert_eq!(reread.messages[1].role, Role::User);
}

#[test]
fn several_leading_system_messages_join_into_one_prompt() {
    let mut conv = Conversation { system: Some("a".into()), ..Conversation::default() };
    conv.messages.push(ChatMessage::text(Role::System, "b"));
    conv.messages.push(ChatMessage::text(Role::User, "q"));
    let anthropic = write(&conv, Format::AnthropicJson).unwrap();
    let doc: Value = serde_json::from_str(&anthropic).unwrap();
    assert_eq!(
        doc["system"],
        json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    );
    assert_eq!(read(&anthropic, Format::AnthropicJson).unwrap().system.as_deref(), Some("a\nb"));
}

fn big_conversation(messages: usize) -> Conversation {
    let mut conv =
        Conversation { system: Some("You are a test agent.".into()), ..Conversation::default() };
    conv.tools.push(ToolDefinition {
        name: "grep".into(),
        description: "search".into(),
        parameters: r#"{"type":"object","properties":{"q":{"type":"string"}}}"#.into(),
    });
    let mut turn = 0;
    while conv.messages.len() < messages {
        conv.messages
            .push(ChatMessage::text(Role::User, format!("question {turn}: where is \"x\"?")));
        let calls = vec![
            ToolCall::new(format!("c{turn}a"), "grep", format!(r#"{{"q":"x{turn}"}}"#)),
            ToolCall::new(format!("c{turn}b"), "grep", r#"{"q":"y"}"#),
        ];
        conv.messages.push(ChatMessage::assistant_calls("searching", calls));
        conv.messages.push(ChatMessage::tool_result(
            format!("c{turn}a"),
            format!("src/{turn}.rs:1: x\nmore"),
        ));
        let mut failed = ChatMessage::tool_result(format!("c{turn}b"), "error: timeout");
        failed.is_error = true;
        conv.messages.push(failed);
        conv.messages.push(ChatMessage::text(Role::Assistant, format!("answer {turn}")));
        turn += 1;
    }
    conv
}

#[test]
fn ten_thousand_message_jsonl_round_trips_through_both_providers() {
    let conv = big_conversation(10_000);
    assert_eq!(conv.messages.len(), 10_000);

    let anthropic = write(&conv, Format::AnthropicJsonl).unwrap();
    // Header plus user / assistant / user(results) / assistant per 5 messages.
    assert_eq!(anthropic.lines().count(), 1 + 10_000 / 5 * 4);
    let streamed = read_from(Cursor::new(anthropic.as_bytes()), Format::AnthropicJsonl).unwrap();
    assert_eq!(streamed, conv);
    assert_eq!(read(&anthropic, Format::AnthropicJsonl).unwrap(), conv);

    let openai = write(&conv, Format::OpenAiJsonl).unwrap();
    assert_eq!(openai.lines().count(), 1 + 1 + 10_000);
    let from_openai = read_from(BufReader::new(openai.as_bytes()), Format::OpenAiJsonl).unwrap();
    assert_eq!(from_openai, as_openai(&conv));
    assert_eq!(detect(&openai), Some(Format::OpenAiJsonl));
    assert_eq!(detect(&anthropic), Some(Format::AnthropicJsonl));
}

/// One malformed input and the error it must produce.
struct Bad {
    input: &'static str,
    format: Format,
    line: usize,
    message: Option<usize>,
    field: &'static str,
    problem: fn(&Problem) -> bool,
}

#[test]
fn malformed_inputs_name_line_message_and_field() {
    let cases = [
        Bad {
            input: "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"b\"\n",
            format: Format::OpenAiJsonl,
            line: 2,
            message: None,
            field: "",
            problem: |p| matches!(p, Problem::Syntax { .. }),
        },
        Bad {
            input: "{\"role\":\"user\",\"content\":\"a\"}\n\n{\"role\":\"tool\",\"content\":\"out\"}\n",
            format: Format::OpenAiJsonl,
            line: 3,
            message: Some(1),
            field: "messages[1].tool_call_id",
            problem: |p| matches!(p, Problem::Missing),
        },
        Bad {
            input: "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]}",
            format: Format::OpenAiJsonl,
            line: 1,
            message: Some(0),
            field: "messages[0].tool_calls[0].function.arguments",
            problem: |p| {
                matches!(p, Problem::WrongType { expected: "a string", found: "an object" })
            },
        },
        Bad {
            input: "[\n  {\"role\": \"user\", \"content\": \"hi\"},\n  {\"role\": \"assistant\",\n   \"tool_calls\": [\n     {\"id\": 7, \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}\n]",
            format: Format::OpenAiJson,
            line: 5,
            message: Some(1),
            field: "messages[1].tool_calls[0].id",
            problem: |p| {
                matches!(p, Problem::WrongType { expected: "a string", found: "a number" })
            },
        },
        Bad {
            input: "{\"model\": \"m\",\n \"messages\": [\n {\"role\": \"function\", \"content\": \"x\"}]}",
            format: Format::OpenAiJson,
            line: 3,
            message: Some(0),
            field: "messages[0].role",
            problem: |p| matches!(p, Problem::UnknownRole(r) if r == "function"),
        },
        Bad {
            input: "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\"}}]}]",
            format: Format::OpenAiJson,
            line: 1,
            message: Some(0),
            field: "messages[0].content[0].type",
            problem: |p| matches!(p, Problem::Unsupported(what) if what.contains("image_url")),
        },
        Bad {
            input: "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":\"{}\"}}],\"messages\":[]}",
            format: Format::OpenAiJson,
            line: 1,
            message: None,
            field: "tools[0].function.parameters",
            problem: |p| {
                matches!(p, Problem::WrongType { expected: "an object", found: "a string" })
            },
        },
        Bad {
            input: "\"just a string\"",
            format: Format::OpenAiJson,
            line: 1,
            message: None,
            field: "",
            problem: |p| matches!(p, Problem::WrongType { found: "a string", .. }),
        },
        Bad {
            input: "{\"system\":\"s\"}\n{\"role\":\"user\",\"content\":\"q\"}\n{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":\"{}\"}]}\n",
            format: Format::AnthropicJsonl,
            line: 3,
            message: Some(1),
            field: "messages[1].content[0].input",
            problem: |p| {
                matches!(p, Problem::WrongType { expected: "an object", found: "a string" })
            },
        },
        Bad {
            input: "{\"messages\": [\n  {\"role\": \"user\", \"content\": [\n    {\"type\": \"tool_result\", \"content\": \"x\"}]}]}",
            format: Format::AnthropicJson,
            line: 3,
            message: Some(0),
            field: "messages[0].content[0].tool_use_id",
            problem: |p| matches!(p, Problem::Missing),
        },
        Bad {
            input: "[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"data\":\"\"}}]}]",
            format: Format::AnthropicJson,
            line: 1,
            message: Some(0),
            field: "messages[0].content[0].type",
            problem: |p| matches!(p, Problem::Unsupported(what) if what.contains("`image`")),
        },
        Bad {
            input: "{\"role\":\"tool\",\"content\":\"x\"}",
            format: Format::AnthropicJsonl,
            line: 1,
            message: Some(0),
            field: "messages[0].role",
            problem: |p| matches!(p, Problem::UnknownRole(r) if r == "tool"),
        },
        Bad {
            input: "{\"messages\": {\"role\": \"user\"}}",
            format: Format::AnthropicJson,
            line: 1,
            message: None,
            field: "messages",
            problem: |p| matches!(p, Problem::WrongType { found: "an object", .. }),
        },
        Bad {
            input: "[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\",\"is_error\":\"yes\"}]}]",
            format: Format::AnthropicJson,
            line: 1,
            message: Some(0),
            field: "messages[0].content[0].is_error",
            problem: |p| matches!(p, Problem::WrongType { expected: "a boolean", .. }),
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let err: FormatError = match read(case.input, case.format) {
            Ok(conv) => panic!("case {i}: accepted {conv:?}"),
            Err(err) => err,
        };
        assert_eq!(err.line, Some(case.line), "case {i}: {err}");
        assert_eq!(err.message, case.message, "case {i}: {err}");
        assert_eq!(err.field, case.field, "case {i}: {err}");
        assert!((case.problem)(&err.problem), "case {i}: {err:?}");
        let shown = err.to_string();
        assert!(
            !shown.contains('\n') && shown.starts_with(&format!("line {}: ", case.line)),
            "case {i}: {shown}"
        );
        assert!(shown.contains(case.field), "case {i}: {shown}");
    }
}

#[test]
fn writing_invalid_arguments_to_anthropic_names_message_and_call() {
    let mut conv = Conversation::default();
    conv.messages.push(ChatMessage::text(Role::User, "go"));
    conv.messages.push(ChatMessage::assistant_calls(
        "",
        vec![ToolCall::new("c1", "run", "{\"cmd\": \"ls\"")],
    ));
    for format in [Format::AnthropicJson, Format::AnthropicJsonl] {
        let err = write(&conv, format).unwrap_err();
        assert_eq!((err.line, err.message), (None, Some(1)));
        assert_eq!(err.field, "messages[1].tool_calls[0].arguments");
        assert!(matches!(err.problem, Problem::InvalidJsonText(_)), "{err:?}");
    }
    // OpenAI carries arguments as text, so the same conversation is written as is.
    let back = convert(&conv, Format::OpenAiJson);
    assert_eq!(back.messages[1].tool_calls[0].arguments, "{\"cmd\": \"ls\"");
}

/// The core's zero-copy OpenAI body (the session's `compose_openai_body`) reads back as the
/// conversation the writer here writes for the same payload: two writers, one layout.
#[test]
fn the_cores_zero_copy_body_reads_back_like_the_conversation_writers() {
    use ctxwin_std::session::{ComposeOptions, SessionBuilder};
    let mut session = SessionBuilder::new("s").build().unwrap();
    session
        .add_tool(&ToolDefinition {
            name: "ls".into(),
            description: "List files.".into(),
            parameters: r#"{"type":"object","properties":{"dir":{"type":"string"}}}"#.into(),
        })
        .unwrap();
    for message in [
        ChatMessage::text(Role::System, "Be \"terse\"."),
        ChatMessage::text(Role::User, "List the files.\nThen stop."),
        ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", r#"{"dir": "."}"#)]),
        ChatMessage::tool_result("c1", "Cargo.toml\nsrc/"),
        ChatMessage::assistant_calls("Checking.", vec![ToolCall::new("c2", "ls", "{}")]),
        ChatMessage::tool_result("c2", "main.rs"),
        ChatMessage::text(Role::Assistant, "Two entries, then one."),
    ] {
        session.push(&message).unwrap();
    }
    let dynamic = ["Goal: list the files."];
    let (body, _) = session.compose_openai_body(ComposeOptions::new(&dynamic), "m").unwrap();
    let payload = session.compose(&dynamic).unwrap();
    let from_core = read(&body, Format::OpenAiJson).unwrap();
    let written = write(&payload.conversation, Format::OpenAiJson).unwrap();
    assert_eq!(from_core, read(&written, Format::OpenAiJson).unwrap());
    assert_eq!(from_core.messages.len(), 8);
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z \n\"\\\\]{0,12}", Just(String::new())]
}

fn some_text() -> impl Strategy<Value = String> {
    "[\\PC\n\"\\\\]{1,24}"
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON object as text, compact or pretty-printed (line breaks between tokens).
fn json_object_text() -> impl Strategy<Value = String> {
    (btree_map("[a-z_]{1,6}", json_value(), 0..4), any::<bool>()).prop_map(|(map, pretty)| {
        let value = Value::Object(map.into_iter().collect());
        if pretty { serde_json::to_string_pretty(&value).unwrap() } else { value.to_string() }
    })
}

fn tools() -> impl Strategy<Value = Vec<ToolDefinition>> {
    vec(
        ("[a-z_]{1,10}", any_text(), json_object_text()).prop_map(
            |(name, description, parameters)| ToolDefinition { name, description, parameters },
        ),
        0..3,
    )
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    ("[a-zA-Z0-9_]{1,12}", "[a-z_]{1,10}", json_object_text())
        .prop_map(|(id, name, args)| ToolCall::new(id, name, args))
}

/// Any message OpenAI can carry: every role anywhere, any text, any argument text, names.
fn openai_message() -> impl Strategy<Value = ChatMessage> {
    let name = proptest::option::of("[a-z]{1,8}");
    prop_oneof![
        (prop_oneof![Just(Role::System), Just(Role::User)], any_text(), name.clone()).prop_map(
            |(role, text, name)| { ChatMessage { name, ..ChatMessage::text(role, text) } }
        ),
        (any_text(), vec((any_text(), any_text(), any_text()), 0..3), name.clone()).prop_map(
            |(text, calls, name)| {
                let calls =
                    calls.into_iter().map(|(id, f, args)| ToolCall::new(id, f, args)).collect();
                ChatMessage { name, ..ChatMessage::assistant_calls(text, calls) }
            }
        ),
        (any_text(), any_text(), name).prop_map(|(id, text, name)| ChatMessage {
            name,
            ..ChatMessage::tool_result(id, text)
        }),
    ]
}

fn openai_conversation() -> impl Strategy<Value = Conversation> {
    (proptest::option::of(any_text()), tools(), vec(openai_message(), 0..12))
        .prop_map(|(system, tools, messages)| Conversation { system, tools, messages })
}

/// One assistant tool round: calls, their results (some failed), maybe user text after them.
fn tool_round() -> impl Strategy<Value = Vec<ChatMessage>> {
    (
        prop_oneof![Just(String::new()), some_text()],
        vec((tool_call(), any_text(), any::<bool>()), 1..4),
        proptest::option::of(some_text()),
    )
        .prop_map(|(text, calls, after)| {
            let mut out = vec![ChatMessage::assistant_calls(
                text,
                calls.iter().map(|c| c.0.clone()).collect(),
            )];
            for (call, output, failed) in calls {
                out.push(ChatMessage {
                    is_error: failed,
                    ..ChatMessage::tool_result(call.id, output)
                });
            }
            out.extend(after.map(|text| ChatMessage::text(Role::User, text)));
            out
        })
}

/// User text (one or two messages), tool rounds, a final answer.
fn episode() -> impl Strategy<Value = Vec<ChatMessage>> {
    (vec(some_text(), 1..3), vec(tool_round(), 0..3), some_text()).prop_map(
        |(asks, rounds, answer)| {
            let mut out: Vec<ChatMessage> =
                asks.into_iter().map(|t| ChatMessage::text(Role::User, t)).collect();
            out.extend(rounds.into_iter().flatten());
            out.push(ChatMessage::text(Role::Assistant, answer));
            out
        },
    )
}

/// A conversation both providers express: top-level system only, no names.
fn shared_conversation() -> impl Strategy<Value = Conversation> {
    (proptest::option::of(any_text()), tools(), vec(episode(), 0..4)).prop_map(
        |(system, tools, episodes)| Conversation {
            system,
            tools,
            messages: episodes.into_iter().flatten().collect(),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn openai_reads_back_what_it_writes(conv in openai_conversation()) {
        prop_assert_eq!(convert(&conv, Format::OpenAiJson), as_openai(&conv));
        prop_assert_eq!(convert(&conv, Format::OpenAiJsonl), flattened(&as_openai(&conv)));
    }

    #[test]
    fn anthropic_reads_back_what_it_writes(conv in shared_conversation()) {
        let text = write(&conv, Format::AnthropicJson).unwrap();
        assert_alternates(&text);
        prop_assert_eq!(read(&text, Format::AnthropicJson).unwrap(), conv.clone());
        prop_assert_eq!(convert(&conv, Format::AnthropicJsonl), flattened_arguments(&conv));
    }

    #[test]
    fn shared_conversations_survive_both_directions(conv in shared_conversation()) {
        let openai = convert(&conv, Format::OpenAiJson);
        prop_assert_eq!(&openai, &as_openai(&conv));
        // Anthropic -> OpenAI -> Anthropic: only is_error is lost.
        let mut no_errors = conv.clone();
        no_errors.messages.iter_mut().for_each(|m| m.is_error = false);
        prop_assert_eq!(convert(&openai, Format::AnthropicJson), no_errors);
        // OpenAI -> Anthropic -> OpenAI.
        let there = convert(&openai, Format::AnthropicJson);
        prop_assert_eq!(convert(&there, Format::OpenAiJson), openai);
    }

    #[test]
    fn detect_recognises_written_shared_conversations(conv in shared_conversation()) {
        prop_assume!(!conv.messages.is_empty());
        // Plain user/assistant text is valid in both providers, so only the layout is certain.
        let has_signal = conv.system.is_some()
            || !conv.tools.is_empty()
            || conv.messages.iter().any(|m| !m.tool_calls.is_empty());
        for format in Format::ALL {
            let text = write(&conv, format).unwrap();
            let detected = detect(&text).unwrap();
            prop_assert_eq!(detected.is_jsonl(), format.is_jsonl(), "{}", text);
            if has_signal {
                prop_assert_eq!(detected, format, "{}", text);
            }
            prop_assert!(read(&text, detected).is_ok());
        }
    }
}
