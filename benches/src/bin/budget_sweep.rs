//! Issue 31: long agent sessions under every window from 2,000 to 128,000 tokens and every
//! strategy. Each session is pushed message by message through a `ctxwin_std::Session` (the
//! CLI's path: in-memory archive, estimator, `reserved_for_reply = 0`, every other setting
//! the default, messages one minute apart as `ctxwin import` stamps untimed ones); after every
//! push the state must be within the budget and the summaries within their level's budget,
//! after every user message and every answered round of tool calls the payload is composed
//! (when an agent calls the model), and at the end it is built as `ctxwin build` does (with
//! retrieval for the live request).
//!
//! Sessions: the issue's 1,110-message coding-agent session and the shipped 367-message
//! example (both from the CLI tests' generator, `cli/tests/cli_support/agent_session.rs`), a
//! 3,000-message one from the same generator, and the benchmark sessions `conv_1000` and
//! `conv_10000` (`benches/data/`).
//!
//! Prints, per session, a Markdown table: for each window and strategy the composes that
//! returned a payload and those that failed, the pushes refused, the most tokens any state or
//! payload used against the budget, how many states or payloads were over it, and the
//! summaries written; then the totals, with the fullest the session level ever was against
//! its own budget. Exits 1 when anything failed, was over the budget, or the session level
//! was over its budget.
//!
//! ```text
//! cargo run --release -p ctxwin-benches --bin budget_sweep
//! SWEEP_SESSIONS=agent-1110,conv-1000 SWEEP_WINDOWS=2000,4000 cargo run --release -p ctxwin-benches --bin budget_sweep
//! ```

use std::time::Instant;

use ctxwin_benches::conv10k;
use ctxwin_benches::replay::CONV_1000_GZ;
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;
use ctxwin_core::{Config, Level, Role, StrategyKind};
use ctxwin_std::format::{self, Format};
use ctxwin_std::session::{
    ComposeOptions, PushOptions, RecallFor, RetrievalSettings, Session, SessionBuilder,
};
use ctxwin_std::{ChatMessage, Conversation};

/// The generator the CLI tests use for the shipped example and issue 31's session.
#[path = "../../../cli/tests/cli_support/agent_session.rs"]
#[allow(dead_code)]
mod agent_session;

const WINDOWS: [u32; 7] = [2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000];

/// Minutes between consecutive messages, as `ctxwin import` places untimed ones.
const MESSAGE_INTERVAL_MS: u64 = 60_000;

/// What one session under one configuration did.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    pushes: u64,
    /// Pushes the session refused.
    push_failures: u64,
    /// Composes that returned a payload.
    builds: u64,
    /// Composes that returned an error.
    build_failures: u64,
    /// States (after a push or a compose) and payloads over the budget.
    over: u64,
    /// Most tokens any state or payload used.
    max_used: u32,
    budget: u32,
    /// Largest session-level tokens / session-level budget.
    max_session_share: f64,
    summaries: u64,
}

impl Cell {
    fn merge(&mut self, other: &Cell) {
        self.pushes += other.pushes;
        self.push_failures += other.push_failures;
        self.builds += other.builds;
        self.build_failures += other.build_failures;
        self.over += other.over;
        self.max_session_share = self.max_session_share.max(other.max_session_share);
        self.summaries += other.summaries;
    }

    fn failures(&self) -> u64 {
        self.push_failures + self.build_failures
    }
}

fn sessions(selected: &[String]) -> Vec<(&'static str, Conversation)> {
    let wanted = |name: &str| selected.is_empty() || selected.iter().any(|s| s == name);
    let mut out = Vec::new();
    if wanted("agent-1110") {
        out.push(("agent-1110", agent_session::agent_session_of(1_110)));
    }
    if wanted("agent-367") {
        out.push(("agent-367", agent_session::agent_session(agent_session::EXAMPLE_TASKS)));
    }
    if wanted("agent-3000") {
        out.push(("agent-3000", agent_session::agent_session_of(3_000)));
    }
    if wanted("conv-1000") {
        let reader = flate2::read::GzDecoder::new(CONV_1000_GZ);
        let conversation = format::read_from(std::io::BufReader::new(reader), Format::OpenAiJsonl)
            .expect("the shipped conv_1000 parses");
        out.push(("conv-1000", conversation));
    }
    if wanted("conv-10000") {
        let messages = conv10k::load().expect("the shipped conv_10000 parses");
        out.push(("conv-10000", Conversation { messages, ..Conversation::default() }));
    }
    out
}

/// Pushes `conversation` into a session under `window` and `strategy`, checking after every
/// push and composing after every user message and every answered round of tool calls, then
/// builds once with retrieval.
fn run(conversation: &Conversation, window: u32, strategy: StrategyKind) -> Cell {
    let config =
        Config { context_window: window, reserved_for_reply: 0, strategy, ..Config::DEFAULT };
    let mut session = SessionBuilder::new("sweep")
        .config(config)
        .archive_in_memory()
        .retrieval(RetrievalSettings { auto: false, ..RetrievalSettings::DEFAULT })
        .build()
        .expect("an in-memory session");
    let mut cell = Cell { budget: session.manager().budget(), ..Cell::default() };
    for tool in &conversation.tools {
        if session.add_tool(tool).is_err() {
            cell.push_failures += 1;
        }
    }
    if let Some(system) = &conversation.system {
        let message = ChatMessage::text(Role::System, system.clone());
        if session.push(&message).is_err() {
            cell.push_failures += 1;
        }
    }
    let count = conversation.messages.len() as u64;
    let start = 1_800_000_000_000u64 - count * MESSAGE_INTERVAL_MS;
    let mut last_user = String::new();
    for (index, message) in conversation.messages.iter().enumerate() {
        let timestamp = start + index as u64 * MESSAGE_INTERVAL_MS;
        let options = PushOptions { timestamp: Some(timestamp), ..PushOptions::default() };
        cell.pushes += 1;
        if let Err(error) = session.push_with(message, options) {
            if cell.failures() == 0 {
                eprintln!("{window}, {}: push {index} refused: {error}", strategy.as_str());
            }
            cell.push_failures += 1;
            continue;
        }
        check(&session, &mut cell);
        if message.role == Role::User {
            last_user.clone_from(&message.content);
        }
        // The agent calls the model after the user's request and after each round of results.
        let answered = message.role == Role::Tool && session.manager().unanswered_calls() == 0;
        if message.role == Role::User || answered {
            compose(&mut session, &mut cell, None);
        }
    }
    // `ctxwin build`: retrieval for the live request.
    compose(&mut session, &mut cell, Some(&last_user));
    cell.summaries = session.manager().stats().counters.summaries_added;
    cell
}

/// Records the state's usage: over the budget, or its session level over its own.
fn check(session: &Session, cell: &mut Cell) {
    let manager = session.manager();
    let used = manager.used();
    cell.max_used = cell.max_used.max(used);
    if used > manager.budget() {
        cell.over += 1;
    }
    let level = manager.config().level_budget(Level::Session).max(1);
    let share = f64::from(manager.level_tokens(Level::Session)) / f64::from(level);
    cell.max_session_share = cell.max_session_share.max(share);
}

/// Composes the payload (with retrieval for `query`) and records its size or its failure.
fn compose(session: &mut Session, cell: &mut Cell, query: Option<&str>) {
    let recall = match query {
        Some(query) => RecallFor::Query(query),
        None => RecallFor::Settings,
    };
    match session.compose_with(ComposeOptions::new(&[]).recall(recall)) {
        Ok(payload) => {
            cell.builds += 1;
            cell.max_used = cell.max_used.max(payload.tokens);
            if payload.tokens > payload.budget {
                cell.over += 1;
            }
        }
        Err(error) => {
            if cell.failures() == 0 {
                let config = session.manager().config();
                let (window, strategy) = (config.context_window, config.strategy.as_str());
                let n = cell.builds + cell.build_failures + 1;
                eprintln!("{window}, {strategy}: compose {n} failed: {error}");
            }
            cell.build_failures += 1;
        }
    }
    check(session, cell);
}

/// Tokens of every message's text and tool-call arguments by the default estimator (the
/// session's size before any of it is left out; framing not counted).
fn history_tokens(conversation: &Conversation) -> u64 {
    let counter = Estimator::default();
    let count = |text: &str| u64::from(counter.count(text));
    let message = |m: &ChatMessage| {
        count(&m.content) + m.tool_calls.iter().map(|c| count(&c.arguments)).sum::<u64>()
    };
    conversation.system.as_deref().map_or(0, count)
        + conversation.messages.iter().map(message).sum::<u64>()
}

fn list(name: &str) -> Vec<String> {
    std::env::var(name)
        .map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
        .unwrap_or_default()
}

/// `n` with thousands separators.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn main() {
    let windows: Vec<u32> = match list("SWEEP_WINDOWS") {
        given if !given.is_empty() => {
            given.iter().map(|w| w.parse().expect("SWEEP_WINDOWS: numbers")).collect()
        }
        _ => WINDOWS.to_vec(),
    };
    let mut total = Cell::default();
    let mut worst_session = (0.0f64, String::new());
    let began = Instant::now();
    for (name, conversation) in sessions(&list("SWEEP_SESSIONS")) {
        println!(
            "\n{name}: {} messages, {} tokens of history",
            grouped(conversation.messages.len() as u64),
            grouped(history_tokens(&conversation))
        );
        println!(
            "| window | strategy | builds ok | build failures | push failures | max used / budget | over budget | summaries |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|");
        for &window in &windows {
            for kind in StrategyKind::ALL {
                let cell = run(&conversation, window, kind);
                println!(
                    "| {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                    grouped(u64::from(window)),
                    kind.as_str(),
                    grouped(cell.builds),
                    cell.build_failures,
                    cell.push_failures,
                    grouped(u64::from(cell.max_used)),
                    grouped(u64::from(cell.budget)),
                    cell.over,
                    grouped(cell.summaries)
                );
                if cell.max_session_share > worst_session.0 {
                    worst_session =
                        (cell.max_session_share, format!("{name}, {}, {window}", kind.as_str()));
                }
                total.merge(&cell);
            }
        }
    }
    println!(
        "\ntotal: {} pushes, {} builds ok, {} build failures, {} push failures, {} states or payloads over budget; max session level / its budget {:.3} ({}); {:.0} s",
        grouped(total.pushes),
        grouped(total.builds),
        total.build_failures,
        total.push_failures,
        total.over,
        worst_session.0,
        worst_session.1,
        began.elapsed().as_secs_f64()
    );
    if total.failures() > 0 || total.over > 0 || worst_session.0 > 1.0 {
        std::process::exit(1);
    }
}
