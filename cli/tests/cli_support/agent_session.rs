//! A generated coding-agent session: a developer hands an agent tasks on a Rust web service;
//! the agent lists, greps and reads files (often in parallel), patches them, runs the tests
//! (one run prints a long log) and reports back. Deterministic, so the shipped
//! `examples/agent-session.jsonl` can be checked against it.

use ctxwin_core::Role;
use ctxwin_std::format::{self, Format};
use ctxwin_std::{ChatMessage, Conversation, ToolCall, ToolDefinition};

/// Tasks in the shipped example.
pub const EXAMPLE_TASKS: usize = 34;

const MODULES: [&str; 10] = [
    "orders",
    "inventory",
    "payments",
    "users",
    "shipping",
    "auth",
    "cart",
    "pricing",
    "reports",
    "webhooks",
];

const PROBLEMS: [&str; 8] = [
    "returns a 500 when the request body is empty",
    "double-counts items that appear twice in the same request",
    "ignores the `limit` query parameter and always returns every row",
    "panics on a negative quantity instead of answering 400",
    "logs the full bearer token at info level",
    "keeps a database connection open after a timeout",
    "rounds prices to whole cents before applying the discount",
    "sorts by insertion order instead of by `updated_at`",
];

/// A small deterministic generator (64-bit LCG), so the session is the same on every machine.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn tools() -> Vec<ToolDefinition> {
    let tool = |name: &str, description: &str, parameters: &str| ToolDefinition {
        name: name.into(),
        description: description.into(),
        parameters: parameters.into(),
    };
    vec![
        tool(
            "list_dir",
            "List the files of a directory of the repository.",
            r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        ),
        tool(
            "grep",
            "Search the repository for a regular expression; prints path:line: text.",
            r#"{"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]}"#,
        ),
        tool(
            "read_file",
            "Read a file of the repository.",
            r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#,
        ),
        tool(
            "write_file",
            "Replace a file of the repository with new content.",
            r#"{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"]}"#,
        ),
        tool(
            "run_command",
            "Run a shell command in the repository root and return its output.",
            r#"{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}"#,
        ),
    ]
}

const SYSTEM: &str = "You are a senior Rust engineer working on inventory-api, an axum web \
service backed by PostgreSQL (sqlx). Work in small steps: look before you change anything, \
keep patches minimal, run the relevant tests after every change and report what you changed \
and why. Never commit secrets, never disable a failing test to make the suite pass, and ask \
before changing a public API. The repository root is /srv/inventory-api.";

fn handler_source(module: &str, function: &str, lines: usize) -> String {
    let mut out = format!(
        "use axum::{{extract::{{Query, State}}, Json}};\nuse sqlx::PgPool;\n\nuse crate::error::ApiError;\nuse crate::{module}::model::{{Request, Row}};\n\n\
         pub async fn {function}(\n    State(pool): State<PgPool>,\n    Query(params): Query<Request>,\n) -> Result<Json<Vec<Row>>, ApiError> {{\n"
    );
    for step in 0..lines {
        out.push_str(&match step % 5 {
            0 => format!("    let rows_{step} = sqlx::query_as::<_, Row>(\"SELECT * FROM {module} WHERE tenant = $1\")\n"),
            1 => format!("        .bind(params.tenant_{step})\n        .fetch_all(&pool)\n        .await?;\n"),
            2 => format!("    tracing::debug!(count = rows_{}.len(), \"{module}: fetched\");\n", step - 2),
            3 => format!("    let total_{step}: i64 = rows_{}.iter().map(|r| r.quantity).sum();\n", step - 3),
            _ => format!("    if total_{} < 0 {{ return Err(ApiError::bad_request(\"negative total\")); }}\n", step - 1),
        });
    }
    out.push_str("    Ok(Json(Vec::new()))\n}\n");
    out
}

fn test_log(module: &str, tests: usize, failing: Option<usize>) -> String {
    let mut out = format!(
        "   Compiling inventory-api v0.4.2 (/srv/inventory-api)\n    Finished `test` profile [unoptimized + debuginfo] target(s) in 14.82s\n     Running unittests src/lib.rs (target/debug/deps/inventory_api-3f9c2a1b)\n\nrunning {tests} tests\n"
    );
    for i in 0..tests {
        let status = if Some(i) == failing { "FAILED" } else { "ok" };
        out.push_str(&format!(
            "test {module}::tests::case_{i:03}_{} ... {status}\n",
            ["empty", "single", "many", "limit", "unicode"][i % 5]
        ));
    }
    match failing {
        Some(i) => out.push_str(&format!(
            "\nfailures:\n\n---- {module}::tests::case_{i:03} stdout ----\nthread '{module}::tests::case_{i:03}' panicked at src/{module}/handlers.rs:41:9:\nassertion `left == right` failed\n  left: 500\n right: 400\n\ntest result: FAILED. {} passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.84s\n",
            tests - 1
        )),
        None => out.push_str(&format!(
            "\ntest result: ok. {tests} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.91s\n"
        )),
    }
    out
}

/// The messages of task number `task`.
fn task(task: usize, dice: &mut Dice) -> Vec<ChatMessage> {
    let module = MODULES[dice.below(MODULES.len())];
    let problem = PROBLEMS[dice.below(PROBLEMS.len())];
    let function = format!("{}_{module}", ["list", "create", "update", "delete"][dice.below(4)]);
    let path = format!("src/{module}/handlers.rs");
    let id = |n: usize| format!("call_{task:03}_{n}");
    let mut out = vec![ChatMessage::text(
        Role::User,
        format!(
            "Task {}: `{function}` in {path} {problem}. Please find the cause and fix it.",
            task + 1
        ),
    )];
    // Look around: list, grep and read in parallel.
    let calls = vec![
        ToolCall::new(id(1), "list_dir", format!(r#"{{"path":"src/{module}"}}"#)),
        ToolCall::new(id(2), "grep", format!(r#"{{"pattern":"fn {function}","path":"src"}}"#)),
        ToolCall::new(id(3), "read_file", format!(r#"{{"path":"{path}"}}"#)),
    ];
    out.push(ChatMessage::assistant_calls(
        format!("I'll look at the {module} module first: its files, where `{function}` is used, and the handler itself."),
        calls,
    ));
    out.push(ChatMessage::tool_result(
        id(1),
        "handlers.rs\nmodel.rs\nmod.rs\nqueries.sql\ntests.rs\n",
    ));
    out.push(ChatMessage::tool_result(
        id(2),
        format!("{path}:12:pub async fn {function}(\nsrc/routes.rs:{}:    .route(\"/{module}\", get({module}::handlers::{function}))\n", 30 + task % 40),
    ));
    // Every 11th task reads a long file; the rest a short one.
    let lines = if task % 11 == 5 { 240 } else { 10 + dice.below(20) };
    out.push(ChatMessage::tool_result(id(3), handler_source(module, &function, lines)));
    out.push(ChatMessage::assistant_calls(
        format!(
            "The handler never checks the input before the query, which is why it {problem}. I'll add the check and a regression test."
        ),
        vec![ToolCall::new(
            id(4),
            "write_file",
            serde_json::json!({"path": path, "content": format!("// patched: validate input first\n{}", handler_source(module, &function, 4))}).to_string(),
        )],
    ));
    out.push(ChatMessage::tool_result(
        id(4),
        format!("wrote {} bytes to {path}", 900 + dice.below(900)),
    ));
    // Every 9th task runs the whole suite: the long log.
    let (cmd, tests) = if task % 9 == 4 {
        ("cargo test".to_string(), 420)
    } else {
        (format!("cargo test {module}"), 6 + dice.below(12))
    };
    let fails = dice.below(4) == 0;
    out.push(ChatMessage::assistant_calls(
        "Running the tests.",
        vec![ToolCall::new(id(5), "run_command", serde_json::json!({ "cmd": cmd }).to_string())],
    ));
    out.push(ChatMessage::tool_result(id(5), test_log(module, tests, fails.then_some(tests / 2))));
    if fails {
        out.push(ChatMessage::assistant_calls(
            "One case still answers 500: the empty-body path returns before the check. Moving the check up and rerunning.",
            vec![ToolCall::new(id(6), "run_command", serde_json::json!({ "cmd": format!("cargo test {module}") }).to_string())],
        ));
        out.push(ChatMessage::tool_result(id(6), test_log(module, tests.min(20), None)));
    }
    out.push(ChatMessage::text(
        Role::Assistant,
        format!(
            "Fixed: `{function}` now validates its input before querying, so it no longer {problem}. Added a regression test in src/{module}/tests.rs; `cargo test {module}` passes."
        ),
    ));
    if dice.below(3) == 0 {
        out.push(ChatMessage::text(
            Role::User,
            format!("Thanks. Does the same bug exist in the other {module} handlers?"),
        ));
        out.push(ChatMessage::text(
            Role::Assistant,
            format!("No: the other {module} handlers go through `validate()` in src/{module}/model.rs already; only `{function}` skipped it."),
        ));
    }
    out
}

/// The session with `tasks` tasks.
pub fn agent_session(tasks: usize) -> Conversation {
    let mut dice = Dice(0x5eed_c7a1);
    let mut messages = vec![ChatMessage::text(Role::System, SYSTEM)];
    for n in 0..tasks {
        messages.extend(task(n, &mut dice));
    }
    Conversation { system: None, tools: tools(), messages }
}

/// A session of exactly `count` messages (whole tasks, then short chat to fill up).
pub fn agent_session_of(count: usize) -> Conversation {
    let mut dice = Dice(0x5eed_c7a1);
    let mut messages = vec![ChatMessage::text(Role::System, SYSTEM)];
    let mut n = 0;
    loop {
        let next = task(n, &mut dice);
        if messages.len() + next.len() > count {
            break;
        }
        messages.extend(next);
        n += 1;
    }
    while messages.len() < count {
        let role = if messages.len() % 2 == 0 { Role::User } else { Role::Assistant };
        messages
            .push(ChatMessage::text(role, format!("Status check {}: all green.", messages.len())));
    }
    Conversation { system: None, tools: tools(), messages }
}

/// `conversation` as OpenAI JSONL (a header line with the tools, then one message a line).
pub fn jsonl(conversation: &Conversation) -> String {
    format::write(conversation, Format::OpenAiJsonl).expect("the generated session writes")
}
