//! Replays a generated agent session through the core with its embedded defaults (estimator,
//! sliding window, default capacities), then prints the composed payload and the stats.
//!
//! ```text
//! cargo run --release -p ctxwin-core --example agent_session [turns] [--json]
//! ```

use ctxwin_core::{ContextManager, Message, OpenAiRequest, PayloadItem, ToolCall};

const SYSTEM: &str = "You are a build assistant for the ctxwin repository. Run tools to inspect and \
                      fix the code; never guess file contents.";
const TOOLS: [&str; 3] = [
    r#"{"name":"read_file","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}"#,
    r#"{"name":"run","description":"Run a shell command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}"#,
    r#"{"name":"grep","description":"Search the tree","parameters":{"type":"object","properties":{"pattern":{"type":"string"}},"required":["pattern"]}}"#,
];
const FILES: [&str; 5] =
    ["src/main.rs", "core/src/ring.rs", "Cargo.toml", "README.md", "tests/e2e.rs"];

/// A tool output: short for most calls, a 40 KB test log every seventh turn.
fn tool_output(turn: usize, call: usize) -> String {
    if turn % 7 == 3 && call == 0 {
        return (0..1500).map(|i| format!("test suite::case_{i:04} ... ok\n")).collect();
    }
    let file = FILES[(turn + call) % FILES.len()];
    format!("{file}: {} lines\nfn step_{turn}() {{ /* call {call} */ }}\n", 40 + turn * 3)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let turns: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200);
    let json = std::env::args().any(|a| a == "--json");

    let mut manager: Box<ContextManager> = Box::default();
    manager.push(Message::system(SYSTEM))?;
    for tool in TOOLS {
        manager.add_tool_definition(tool)?;
    }
    let mut archived_units = 0usize;
    let mut clock = 1_700_000_000_000u64;
    for turn in 0..turns {
        clock += 30_000;
        let ask =
            format!("Turn {turn}: check {} and fix any failing test.", FILES[turn % FILES.len()]);
        manager.push(Message::user(&ask).at(clock))?;

        let ids: Vec<String> = (0..1 + turn % 3).map(|c| format!("call_{turn}_{c}")).collect();
        let args: Vec<String> =
            ids.iter().enumerate().map(|(c, _)| format!(r#"{{"path":"{}"}}"#, FILES[c])).collect();
        let calls: Vec<ToolCall<'_>> = ids
            .iter()
            .zip(&args)
            .enumerate()
            .map(|(c, (id, args))| ToolCall::new(id, ["read_file", "run", "grep"][c % 3], args))
            .collect();
        manager.push(Message::assistant("").with_tool_calls(&calls).at(clock + 1_000))?;
        for (c, id) in ids.iter().enumerate() {
            manager.push(Message::tool_result(id, &tool_output(turn, c)).at(clock + 2_000))?;
        }
        let answer =
            format!("Done with turn {turn}: {} is fine after the fix.", FILES[turn % FILES.len()]);
        manager.push(Message::assistant(&answer).at(clock + 3_000))?;
        // An archive would store these; the example only counts them.
        archived_units += manager.drain_outbox(|_| {});
    }

    let dynamic = ["Current task: keep the test suite green."];
    let budget = manager.budget();
    let payload = manager.compose(&dynamic)?;
    if json {
        let mut body = vec![0u8; 1 << 20];
        let len = payload.write_openai(
            &mut body[..],
            OpenAiRequest { model: Some("gpt-4o-mini"), max_tokens: None },
        )?;
        println!("{}", std::str::from_utf8(&body[..len])?);
        return Ok(());
    }
    println!(
        "payload: {} items, {} tokens (budget {budget})",
        payload.items().count(),
        payload.tokens()
    );
    let count = payload.items().count();
    for (index, item) in payload.items().enumerate() {
        // The head and the newest turns tell the story; the middle is more of the same.
        if index == 8 && count > 24 {
            println!("  ... {} more history messages ...", count - 24);
        }
        if index >= 8 && index + 16 < count {
            continue;
        }
        let (kind, text) = match &item {
            PayloadItem::System(m) => ("system", m.content().to_string()),
            PayloadItem::ToolDefinition(m) => ("tool", m.content().to_string()),
            PayloadItem::Dynamic(text) => ("dynamic", text.to_string()),
            PayloadItem::Entities(entities) => {
                ("entities", format!("{} keys", entities.iter().count()))
            }
            PayloadItem::MemorySummary(summary) => ("summary", summary.parts().collect()),
            PayloadItem::Message(m) => (m.role().as_str(), m.content().to_string()),
        };
        let first_line = text.lines().next().unwrap_or("");
        let shown: String = first_line.chars().take(90).collect();
        println!("  {kind:<9} {shown}");
    }
    println!();
    print!("{}", manager.stats());
    println!("archived    {archived_units:>7} units drained from the outbox");
    println!(
        "RAM         {:>7} B: size_of::<ContextManager>() (default capacities), all of it",
        core::mem::size_of::<ContextManager>()
    );
    Ok(())
}
