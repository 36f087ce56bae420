//! Helpers shared by the session test files: messages, tool definitions and a generated
//! agent conversation.
// Each test file uses a subset of these.
#![allow(dead_code)]

use std::collections::HashMap;

use ctxwin_core::Role;
use ctxwin_std::{ChatMessage, Conversation, ToolCall, ToolDefinition};

pub fn user(text: impl Into<String>) -> ChatMessage {
    ChatMessage::text(Role::User, text)
}

pub fn assistant(text: impl Into<String>) -> ChatMessage {
    ChatMessage::text(Role::Assistant, text)
}

pub fn tools() -> Vec<ToolDefinition> {
    ["read_file", "run_tests", "grep"]
        .into_iter()
        .map(|name| ToolDefinition {
            name: name.into(),
            description: format!("{name} in the workspace"),
            parameters: r#"{"type":"object","properties":{"arg":{"type":"string"}}}"#.into(),
        })
        .collect()
}

/// A test log of about 5,000 tokens, with a marker in its middle that reduction cuts out.
pub fn huge_output() -> String {
    let mut log = String::new();
    for i in 0..400 {
        log.push_str(&format!("test parser::case_{i:03} ... ok ({} ms)\n", i * 7 % 97));
        if i == 200 {
            log.push_str("note: MIDDLE_MARKER_7f3a flaky retry\n");
        }
    }
    log.push_str("test result: ok. 400 passed; 0 failed\n");
    log
}

/// A generated agent conversation of exactly `len` messages, with planted tokens.
pub fn generated(len: usize) -> (Conversation, HashMap<usize, String>) {
    let mut messages = Vec::with_capacity(len);
    let mut planted = HashMap::new();
    let mut turn = 0;
    while messages.len() < len {
        let mut text = format!("Step {turn}: check service {} for regressions.", turn % 13);
        if turn % 25 == 0 {
            let token = format!("plantq{turn}x");
            text.push_str(&format!(" Ticket {token}."));
            planted.insert(messages.len(), token);
        }
        messages.push(user(text));
        let calls = vec![
            ToolCall::new(
                format!("c{turn}a"),
                "read_file",
                format!(r#"{{"arg":"svc/{turn}.log"}}"#),
            ),
            ToolCall::new(format!("c{turn}b"), "grep", r#"{"arg":"ERROR"}"#),
        ];
        messages.push(ChatMessage::assistant_calls("", calls));
        let log = if turn % 40 == 7 {
            huge_output()
        } else {
            format!("svc {turn}: 0 errors, p99 {} ms", turn % 50)
        };
        messages.push(ChatMessage::tool_result(format!("c{turn}a"), log));
        messages.push(ChatMessage::tool_result(
            format!("c{turn}b"),
            format!("no ERROR lines in svc/{turn}.log"),
        ));
        messages.push(assistant(format!("Service {} is healthy at step {turn}.", turn % 13)));
        turn += 1;
    }
    messages.truncate(len);
    // A conversation cut inside a unit would leave calls unanswered: end on a full turn.
    while messages.last().is_some_and(|m| m.role != Role::Assistant || !m.tool_calls.is_empty()) {
        messages.pop();
    }
    let conversation =
        Conversation { system: Some("You watch services.".into()), tools: tools(), messages };
    (conversation, planted)
}
