//! Task probes (issue 30's benchmark): a generated multi-task coding-agent history
//! (`ctxwin_benches::taskprobes`), replayed message by message; at each probe's moment a
//! payload is composed under a fixed budget (4,000 and 8,000 tokens) and the probe counts as
//! answered when every one of its evidence strings is in the payload.
//!
//! Rows: the plain sliding window (the newest messages that fit); ctxwin without task
//! handling, per strategy (sliding window, the default; importance; hierarchical), each
//! without retrieval and with recall for the probe's question from its archive; the
//! half-recent/half-BM25 baseline (newest messages in half the budget, the best BM25 matches
//! for the question among older messages in the other half); and ctxwin with tasks once the
//! task API exists (see [`ctxwin_with_tasks`]). The question itself is never part of a
//! payload: every contender gets the whole budget for context.
//!
//! Columns: the share of end probes answered (asked after the last message, about earlier
//! tasks), the share of repeat probes answered (asked when a recurring error shows up again:
//! is the earlier resolution in the payload?), and the mean tokens a payload spent.
//!
//! `cargo run --release -p ctxwin-benches --bin task_probes` (`TASK_SEED`, default 1;
//! `TASK_SEEDS`, default 3; `TASK_COUNT`, tasks per history, default 40). With
//! `TASK_DIAGNOSE=1` it prints instead where ctxwin with tasks loses each probe's evidence
//! (see [`diagnose`]).

use ctxwin_benches::taskprobes::{
    Bm25, Message, ProbeKind, Speaker, Task, TaskHistory, answered, generate, recent_and_bm25,
    sliding_window,
};
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;
use ctxwin_core::{Config, StrategyKind};
use ctxwin_std::session::{ComposeOptions, ComposedPayload, PushOptions, RecallFor};
use ctxwin_std::session::{Session, SessionBuilder};
use ctxwin_std::{ChatMessage, ToolCall, core::Role};

const BUDGETS: [u32; 2] = [4_000, 8_000];

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One probe's outcome under one contender.
#[derive(Clone, Copy, Debug, Default)]
struct Answer {
    found: bool,
    tokens: u32,
}

/// A task boundary, as the generator knows it.
#[derive(Clone, Copy, Debug)]
enum Boundary<'a> {
    /// Before the task's first message (the developer's request) is pushed.
    Start(&'a Task),
    /// After the task's last message is pushed.
    Done,
}

/// ctxwin's configuration for a payload budget: the history gets half of it as its working
/// level, summaries a quarter.
fn config(budget: u32, strategy: StrategyKind) -> Config {
    Config {
        context_window: budget + 1_024,
        reserved_for_reply: 1_024,
        permanent_budget: budget / 16,
        session_budget: budget / 4,
        working_budget: budget / 2,
        strategy,
        ..Config::DEFAULT
    }
}

fn chat(message: &Message) -> ChatMessage {
    match (message.speaker, &message.call, &message.call_id) {
        (Speaker::System, _, _) => ChatMessage::text(Role::System, message.content.clone()),
        (Speaker::User, _, _) => ChatMessage::text(Role::User, message.content.clone()),
        (Speaker::Assistant, Some((id, name, arguments)), _) => ChatMessage::assistant_calls(
            message.content.clone(),
            vec![ToolCall::new(id.clone(), name.clone(), arguments.clone())],
        ),
        (Speaker::Tool, _, Some(id)) => {
            ChatMessage::tool_result(id.clone(), message.content.clone())
        }
        _ => ChatMessage::text(Role::Assistant, message.content.clone()),
    }
}

/// Everything a composed payload shows the model: texts, tool calls' names and arguments.
fn payload_text(payload: &ComposedPayload) -> String {
    let mut text = String::new();
    for message in &payload.conversation.messages {
        text.push_str(&message.content);
        text.push('\n');
        for call in &message.tool_calls {
            text.push_str(&call.name);
            text.push(' ');
            text.push_str(&call.arguments);
            text.push('\n');
        }
    }
    text
}

/// Replays `history` into a ctxwin session (in-memory archive) at `budget` under `strategy`,
/// calling `boundary` at each task's start and end, and at each probe's moment composes two
/// payloads: without retrieval, and with recall for the probe's question. Returns the answers
/// of both, in probe order.
fn replay(
    history: &TaskHistory,
    budget: u32,
    strategy: StrategyKind,
    mut boundary: impl FnMut(&mut Session, Boundary<'_>),
) -> (Vec<Answer>, Vec<Answer>) {
    let mut session = SessionBuilder::new("task-probes")
        .config(config(budget, strategy))
        .archive_in_memory()
        .build()
        .expect("session");
    let mut plain = Vec::new();
    let mut recalled = Vec::new();
    let mut probes = history.probes.iter().peekable();
    for (i, message) in history.messages.iter().enumerate() {
        if let Some(task) = history.tasks.iter().find(|t| t.start == i) {
            boundary(&mut session, Boundary::Start(task));
        }
        let options = PushOptions { timestamp: Some(message.timestamp), ..PushOptions::default() };
        session.push_with(&chat(message), options).expect("push");
        if history.tasks.iter().any(|t| t.end == i + 1) {
            boundary(&mut session, Boundary::Done);
        }
        while let Some(probe) = probes.next_if(|p| p.at == i + 1) {
            let quiet = ComposeOptions::new(&[]).recall(RecallFor::Nothing);
            let payload = session.compose_with(quiet).expect("compose");
            assert!(payload.tokens <= budget, "{} > {budget}", payload.tokens);
            let found = answered(&payload_text(&payload), probe);
            plain.push(Answer { found, tokens: payload.tokens });
            let asked = ComposeOptions::new(&[]).recall(RecallFor::Query(&probe.question));
            let payload = session.compose_with(asked).expect("compose with recall");
            assert!(payload.tokens <= budget, "{} > {budget}", payload.tokens);
            let found = answered(&payload_text(&payload), probe);
            recalled.push(Answer { found, tokens: payload.tokens });
        }
    }
    assert_eq!(plain.len(), history.probes.len(), "every probe asked");
    (plain, recalled)
}

/// ctxwin without task handling: boundaries are not passed on.
fn ctxwin_without_tasks(
    history: &TaskHistory,
    budget: u32,
    strategy: StrategyKind,
) -> (Vec<Answer>, Vec<Answer>) {
    replay(history, budget, strategy, |_, _| {})
}

/// ctxwin with task boundaries (issue 30): the generator's boundaries passed through
/// `Session::start_task` (the task's request as its goal) and `Session::finish_task` (outcome
/// left to the summary), under the hierarchical strategy.
fn ctxwin_with_tasks(history: &TaskHistory, budget: u32) -> Option<(Vec<Answer>, Vec<Answer>)> {
    Some(replay(history, budget, StrategyKind::Hierarchical, |session, boundary| match boundary {
        Boundary::Start(task) => {
            session.start_task(&task.title).expect("start task");
        }
        Boundary::Done => {
            session.finish_task("").expect("finish task");
        }
    }))
}

/// Answers of a contender built outside ctxwin, probe by probe.
fn outside(history: &TaskHistory, build: impl Fn(&str, usize) -> (String, u32)) -> Vec<Answer> {
    history
        .probes
        .iter()
        .map(|probe| {
            let (text, tokens) = build(&probe.question, probe.at);
            Answer { found: answered(&text, probe), tokens }
        })
        .collect()
}

/// Sums of one contender at one budget over every seed.
#[derive(Clone, Debug, Default)]
struct Row {
    end: (usize, usize),
    repeats: (usize, usize),
    tokens: u64,
    payloads: usize,
    kinds: [(usize, usize); 6],
}

impl Row {
    fn add(&mut self, history: &TaskHistory, answers: &[Answer]) {
        for (probe, answer) in history.probes.iter().zip(answers) {
            let tally = match probe.kind {
                ProbeKind::Repeat => &mut self.repeats,
                _ => &mut self.end,
            };
            tally.0 += usize::from(answer.found);
            tally.1 += 1;
            let kind = ProbeKind::ALL.iter().position(|&k| k == probe.kind).unwrap_or(0);
            self.kinds[kind].0 += usize::from(answer.found);
            self.kinds[kind].1 += 1;
            self.tokens += u64::from(answer.tokens);
            self.payloads += 1;
        }
    }
}

fn share((found, of): (usize, usize)) -> f64 {
    found as f64 / of.max(1) as f64
}

fn main() {
    if env("TASK_DIAGNOSE", 0) == 1 {
        diagnose::run();
        return;
    }
    let first = env("TASK_SEED", 1);
    let seeds: Vec<u64> = (first..first + env("TASK_SEEDS", 3)).collect();
    let count = env("TASK_COUNT", 40) as usize;
    let estimator = Estimator::new();
    let overhead = u32::from(Config::DEFAULT.message_overhead);
    let call_overhead = u32::from(Config::DEFAULT.tool_call_overhead);
    let cost = |m: &Message| {
        estimator.count(&m.text()) + overhead + if m.call.is_some() { call_overhead } else { 0 }
    };
    let names = [
        "plain sliding window (newest that fit)",
        "ctxwin, sliding window (default), no tasks",
        "ctxwin, sliding window + recall, no tasks",
        "ctxwin, importance, no tasks",
        "ctxwin, importance + recall, no tasks",
        "ctxwin, hierarchical, no tasks",
        "ctxwin, hierarchical + recall, no tasks",
        "half recent / half BM25 baseline",
        "ctxwin with tasks",
        "ctxwin with tasks + recall",
    ];
    let strategies =
        [StrategyKind::SlidingWindow, StrategyKind::Importance, StrategyKind::Hierarchical];
    let mut rows = vec![vec![Row::default(); names.len()]; BUDGETS.len()];
    let mut wired = true;
    let (mut messages, mut tokens, mut probes) = (0usize, 0u64, 0usize);
    for &seed in &seeds {
        let history = generate(seed, count);
        messages += history.messages.len();
        tokens += history.messages.iter().map(|m| u64::from(cost(m))).sum::<u64>();
        probes += history.probes.len();
        let index = Bm25::new(
            history
                .messages
                .iter()
                .map(|m| m.text())
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        for (b, &budget) in BUDGETS.iter().enumerate() {
            let row = &mut rows[b];
            let window = outside(&history, |_, at| {
                let built = sliding_window(&history, at, budget, &cost);
                (built.text, built.tokens)
            });
            row[0].add(&history, &window);
            for (s, &strategy) in strategies.iter().enumerate() {
                let (plain, recalled) = ctxwin_without_tasks(&history, budget, strategy);
                row[1 + 2 * s].add(&history, &plain);
                row[2 + 2 * s].add(&history, &recalled);
            }
            let baseline = outside(&history, |question, at| {
                let built = recent_and_bm25(&history, &index, question, at, budget, &cost);
                (built.text, built.tokens)
            });
            row[7].add(&history, &baseline);
            match ctxwin_with_tasks(&history, budget) {
                Some((plain, recalled)) => {
                    row[8].add(&history, &plain);
                    row[9].add(&history, &recalled);
                }
                None => wired = false,
            }
        }
    }
    let end_probes = rows[0][0].end.1;
    let repeats = rows[0][0].repeats.1;
    println!(
        "task probes: {} histories (seeds {seeds:?}) of {count} tasks, {} messages and {} tokens on average; {probes} probes: {end_probes} about earlier tasks, {repeats} repeated errors",
        seeds.len(),
        messages / seeds.len().max(1),
        tokens / seeds.len().max(1) as u64,
    );
    println!(
        "\n{:<44} {:>22} {:>22}",
        "",
        format!("budget {}", BUDGETS[0]),
        format!("budget {}", BUDGETS[1])
    );
    println!(
        "{:<44} {:>7} {:>7} {:>6}  {:>7} {:>7} {:>6}",
        "contender", "probes", "repeats", "tokens", "probes", "repeats", "tokens"
    );
    for (i, name) in names.iter().enumerate() {
        if i >= 8 && !wired {
            println!("{name:<44} not wired: the task API has not landed (see ctxwin_with_tasks)");
            continue;
        }
        let cells: Vec<String> = rows
            .iter()
            .map(|row| {
                let r = &row[i];
                format!(
                    "{:>7.3} {:>7.3} {:>6.0}",
                    share(r.end),
                    share(r.repeats),
                    r.tokens as f64 / r.payloads.max(1) as f64
                )
            })
            .collect();
        println!("{name:<44} {}  {}", cells[0], cells[1]);
    }
    for (b, budget) in BUDGETS.iter().enumerate() {
        println!("\nby probe kind at {budget} (answered / asked)");
        print!("{:<44}", "");
        for kind in ProbeKind::ALL {
            print!(" {:>9}", kind.label());
        }
        println!();
        for (i, name) in names.iter().enumerate() {
            if i >= 8 && !wired {
                continue;
            }
            print!("{name:<44}");
            for (found, of) in rows[b][i].kinds {
                print!(" {:>9}", format!("{found}/{of}"));
            }
            println!();
        }
    }
}

/// Where ctxwin with tasks loses evidence (`TASK_DIAGNOSE=1`): per probe kind and per task
/// age (tasks finished since the one asked about), whether the evidence was in the task's
/// summary as written when it finished, in the session level when asked, in the payload
/// without retrieval, and in the payload with recall for the question; for repeated errors,
/// whether error memory found an earlier occurrence and whether its block holds the
/// resolution.
mod diagnose {
    use super::*;

    /// Task ages grouped: (label, first age, last age).
    const AGES: [(&str, usize, usize); 4] =
        [("1-4", 1, 4), ("5-10", 5, 10), ("11-20", 11, 20), ("21+", 21, usize::MAX)];

    /// Counts of one group: asked, in the summary at finish, in the session level, in the
    /// plain payload, in the recalled payload.
    #[derive(Clone, Copy, Default)]
    struct Tally([usize; 5]);

    impl Tally {
        fn add(&mut self, facts: [bool; 4]) {
            self.0[0] += 1;
            for (slot, fact) in self.0[1..].iter_mut().zip(facts) {
                *slot += usize::from(fact);
            }
        }

        fn cells(&self) -> String {
            let [n, a, b, c, d] = self.0;
            format!("{n:>6} {a:>8} {b:>8} {c:>8} {d:>8}")
        }
    }

    fn has_all(text: &str, evidence: &[String]) -> bool {
        evidence.iter().all(|e| text.contains(e.as_str()))
    }

    pub(super) fn run() {
        let first = env("TASK_SEED", 1);
        let seeds: Vec<u64> = (first..first + env("TASK_SEEDS", 3)).collect();
        let count = env("TASK_COUNT", 40) as usize;
        for &budget in &BUDGETS {
            let mut kinds = [Tally::default(); 6];
            let mut ages = [[Tally::default(); 4]; 6];
            // Repeats: asked, error memory found one, its block holds the resolution, plain, recalled.
            let mut repeats = Tally::default();
            for &seed in &seeds {
                let history = generate(seed, count);
                one(&history, budget, &mut kinds, &mut ages, &mut repeats);
            }
            println!(
                "\nbudget {budget}: where evidence is, per kind and task age (asked, in the summary at finish, in the session level when asked, in the payload, in the payload with recall)"
            );
            println!(
                "{:<18} {:>6} {:>8} {:>8} {:>8} {:>8}",
                "", "asked", "summary", "level", "plain", "recall"
            );
            for (k, kind) in ProbeKind::ALL.iter().enumerate() {
                if *kind == ProbeKind::Repeat {
                    continue;
                }
                println!("{:<18} {}", kind.label(), kinds[k].cells());
                for (a, (label, _, _)) in AGES.iter().enumerate() {
                    println!("{:<18} {}", format!("  age {label}"), ages[k][a].cells());
                }
            }
            println!(
                "repeats (asked, earlier error found, block holds the resolution, plain, recall): {}",
                repeats.cells()
            );
        }
    }

    fn one(
        history: &TaskHistory,
        budget: u32,
        kinds: &mut [Tally; 6],
        ages: &mut [[Tally; 4]; 6],
        repeats: &mut Tally,
    ) {
        let mut session = SessionBuilder::new("task-probes")
            .config(config(budget, StrategyKind::Hierarchical))
            .archive_in_memory()
            .build()
            .expect("session");
        // The summary text each task got when it finished, by task index.
        let mut written: Vec<String> = Vec::new();
        let mut probes = history.probes.iter().peekable();
        for (i, message) in history.messages.iter().enumerate() {
            if let Some(task) = history.tasks.iter().find(|t| t.start == i) {
                session.start_task(&task.title).expect("start task");
            }
            let options =
                PushOptions { timestamp: Some(message.timestamp), ..PushOptions::default() };
            session.push_with(&chat(message), options).expect("push");
            if history.tasks.iter().any(|t| t.end == i + 1) {
                let task = session.finish_task("").expect("finish task");
                // As recorded in the archive (the core may have merged it into a digest).
                session.sync_archive().expect("sync");
                let text = task
                    .summary_id()
                    .and_then(|id| {
                        let archive = session.archive().expect("archive");
                        archive.summary(session.scope(), id).expect("summary")
                    })
                    .map(|record| record.text)
                    .unwrap_or_default();
                if env("TASK_DEBUG", 0) == 1 && text.is_empty() {
                    let live =
                        task.summary_id().map(|id| session.manager().core().get(id).is_some());
                    println!(
                        "no summary for task {}: id {:?} live {live:?} stats {:?}",
                        task.number(),
                        task.summary_id(),
                        session.manager().core().stats().counters
                    );
                }
                written.push(text);
            }
            while let Some(probe) = probes.next_if(|p| p.at == i + 1) {
                let level: String = session
                    .manager()
                    .core()
                    .session()
                    .map(|m| m.content().to_string())
                    .collect::<Vec<_>>()
                    .join("\n");
                let quiet = ComposeOptions::new(&[]).recall(RecallFor::Nothing);
                let plain = payload_text(&session.compose_with(quiet).expect("compose"));
                let asked = ComposeOptions::new(&[]).recall(RecallFor::Query(&probe.question));
                let recalled = payload_text(&session.compose_with(asked).expect("compose"));
                let k = ProbeKind::ALL.iter().position(|&k| k == probe.kind).unwrap_or(0);
                if probe.kind == ProbeKind::Repeat {
                    let memory = session.error_memory();
                    repeats.add([
                        memory.is_some(),
                        memory.is_some_and(|m| has_all(&m.block, &probe.evidence)),
                        answered(&plain, probe),
                        answered(&recalled, probe),
                    ]);
                    continue;
                }
                let summary = written.get(probe.task).map_or("", String::as_str);
                if env("TASK_DEBUG", 0) == 1 && !answered(&recalled, probe) {
                    println!(
                        "--- {:?} task {} {:?}\nsummary: {summary}\npayload with recall: {recalled}",
                        probe.kind, probe.task, probe.evidence
                    );
                }
                let facts = [
                    has_all(summary, &probe.evidence),
                    has_all(&level, &probe.evidence),
                    answered(&plain, probe),
                    answered(&recalled, probe),
                ];
                kinds[k].add(facts);
                let age = history.tasks.len() - 1 - probe.task;
                if let Some(a) = AGES.iter().position(|&(_, lo, hi)| lo <= age && age <= hi) {
                    ages[k][a].add(facts);
                }
            }
        }
    }
}
