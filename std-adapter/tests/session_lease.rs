//! Sessions of one conversation in several processes, on a store with leases: the memory
//! store, and a real PostgreSQL (`CTXWIN_PG_URL`, as `scripts/pg-server.sh start` prints;
//! with the `postgres` feature; each test in a fresh schema, and says it skipped without the
//! variable).
//!
//! Two sessions take turns on one conversation, each overtaken by the other at every turn:
//! every push is refused as stale, reloaded (newest checkpoint plus the rows after it) and
//! done again. They must end exactly where one session doing the same pushes, composes and
//! usage reports ends: the same ids, evictions, summaries, rows and payloads — no message
//! lost, duplicated or interleaved. Then two threads push at once, each retrying what was
//! refused, and every acknowledged message is there once, in each thread's order.

use std::sync::Arc;

use ctxwin_core::{Config, Role, StrategyKind};
use ctxwin_std::session::{ComposeOptions, PushOptions, Session, SessionBuilder, SessionError};
use ctxwin_std::store::{ArchiveStore, ErrorKind, MemoryStore, Ports, Scope};
use ctxwin_std::{ChatMessage, ToolCall};

const CONVERSATION: &str = "shared";

fn memory_ports() -> Ports {
    let store = Arc::new(MemoryStore::new());
    Ports { archive: store.clone(), checkpoints: store }
}

/// A small window, so that pushes evict, summarize and reduce tool outputs.
fn config() -> Config {
    Config {
        context_window: 2_048,
        reserved_for_reply: 256,
        strategy: StrategyKind::Summarization,
        summarize_threshold: 6,
        ..Config::DEFAULT
    }
}

fn open(ports: &Ports) -> Session {
    SessionBuilder::new(CONVERSATION)
        .tenant("acme")
        .config(config())
        .ports(ports.clone())
        .checkpoint_interval_messages(9)
        .keep_checkpoints(3)
        .restore_latest(true)
        .build()
        .expect("a session on the store")
}

/// One step of the scripted conversation.
enum Step {
    Push(ChatMessage),
    /// Compose a payload (and report usage for it, billed `percent` of the estimate).
    Compose {
        percent: u32,
    },
}

/// An agent's conversation: questions, tool calls with outputs (some large), answers, and a
/// payload composed after every answer.
fn script(turns: usize) -> Vec<Step> {
    let mut steps = vec![Step::Push(ChatMessage::text(Role::System, "You operate the build."))];
    for turn in 0..turns {
        let question =
            format!("turn {turn}: why did crate_{} fail on runner {}?", turn % 7, turn % 3);
        steps.push(Step::Push(ChatMessage::text(Role::User, question)));
        if turn % 2 == 0 {
            let call = ToolCall::new(format!("c{turn}"), "logs", format!(r#"{{"run":{turn}}}"#));
            steps.push(Step::Push(ChatMessage::assistant_calls("", vec![call])));
            let lines = if turn % 4 == 0 { 300 } else { 12 };
            let output =
                format!("error[E0{turn:03}]: crate_{} line {turn}\n", turn % 7).repeat(lines);
            steps.push(Step::Push(ChatMessage::tool_result(format!("c{turn}"), output)));
        }
        let answer =
            format!("crate_{} failed on runner {} because of change {turn}", turn % 7, turn % 3);
        steps.push(Step::Push(ChatMessage::text(Role::Assistant, answer)));
        steps.push(Step::Compose { percent: 100 + (turn as u32 % 5) * 4 });
    }
    steps
}

fn options(n: usize) -> PushOptions<'static> {
    PushOptions { timestamp: Some(1_750_000_000_000 + n as u64 * 45_000), ..Default::default() }
}

/// The scripted conversation, its steps taken in turns by `pair` (each step by the session
/// that did not take the previous one) and by `single` alone; every outcome compared.
fn take_turns(pair: [&Ports; 2], single: &Ports, turns: usize) {
    let mut sessions = [open(pair[0]), open(pair[1])];
    let mut alone = open(single);
    let mut compared = 0;
    let mut summaries = Vec::new();
    for (n, step) in script(turns).into_iter().enumerate() {
        let session = &mut sessions[n % 2];
        match step {
            Step::Push(message) => {
                let got = session.push_with(&message, options(n)).expect("the pair's push");
                let want = alone.push_with(&message, options(n)).expect("the single push");
                assert_eq!(
                    (got.id, got.unit, &got.evicted_units, &got.summaries, got.reduced),
                    (want.id, want.unit, &want.evicted_units, &want.summaries, want.reduced),
                    "step {n}"
                );
                summaries.extend(want.summaries);
            }
            Step::Compose { percent } => {
                let got =
                    session.compose_with(ComposeOptions::new(&[])).expect("the pair's compose");
                let want =
                    alone.compose_with(ComposeOptions::new(&[])).expect("the single compose");
                assert_eq!(got, want, "payload of step {n}");
                let billed = got.tokens * percent / 100;
                session.record_usage(got.tokens, billed).unwrap();
                alone.record_usage(want.tokens, billed).unwrap();
                compared += 1;
            }
        }
    }
    assert!(compared > 10);
    for session in &sessions {
        assert!(session.stats().unwrap().counters.reloads > 0, "each was overtaken");
    }
    let stats = alone.stats().unwrap();
    assert!(stats.core.counters.units_evicted > 0 && stats.core.counters.summaries_added > 0);
    assert!(stats.core.counters.observations_reduced > 0);

    // The store holds what the single session's store holds: every row once, in order.
    let scope = Scope::new("acme", CONVERSATION);
    let rows = |ports: &Ports| ports.archive.rows_after(&scope, 0, 100_000).unwrap();
    let (theirs, mine) = (rows(pair[0]), rows(single));
    assert_eq!(theirs.len(), mine.len());
    assert_eq!(theirs, mine, "the rows of the pair and of the single session");
    let texts: Vec<String> = theirs
        .iter()
        .map(|row| {
            format!("{:?}", (&row.message.tool_calls, &row.message.tool_call_id, row.full_text()))
        })
        .collect();
    let mut unique = texts.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), texts.len(), "no message stored twice");
    assert!(!summaries.is_empty());
    for id in summaries {
        let summary = |ports: &Ports| ports.archive.summary(&scope, id).unwrap();
        assert_eq!(summary(pair[0]), summary(single), "summary {id}");
    }
    // Whoever serves next starts from the same state: the same payload.
    let [first, second] = &mut sessions;
    second.reload().unwrap();
    let payload = |session: &mut Session| session.compose_with(ComposeOptions::new(&[])).unwrap();
    let want = payload(&mut alone);
    assert_eq!(payload(second), want);
    assert_eq!(payload(first), want, "the first one, overtaken by the reload, reloads too");
}

/// Two threads push their own messages at once into one conversation, each retrying what
/// the store refused; every message acknowledged is stored once, each thread's in order.
fn push_at_once(ports: &Ports) {
    const EACH: usize = 30;
    let threads: Vec<_> = (0..2)
        .map(|thread| {
            let ports = ports.clone();
            std::thread::spawn(move || {
                let mut session = open(&ports);
                let mut ids = Vec::new();
                for n in 0..EACH {
                    let message =
                        ChatMessage::text(Role::User, format!("thread {thread} message {n}"));
                    let mut tries = 0;
                    let id = loop {
                        match session.push(&message) {
                            Ok(report) => break report.id,
                            Err(error) if is_stale(&error) && tries < 100 => tries += 1,
                            Err(error) => panic!("thread {thread} message {n}: {error}"),
                        }
                    };
                    ids.push(id);
                }
                ids
            })
        })
        .collect();
    let acknowledged: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let scope = Scope::new("acme", CONVERSATION);
    let rows = ports.archive.rows_after(&scope, 0, 10_000).unwrap();
    assert_eq!(rows.len(), 2 * EACH, "every acknowledged message, once");
    for (thread, ids) in acknowledged.iter().enumerate() {
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "thread {thread}'s order");
        for (n, id) in ids.iter().enumerate() {
            let row = rows.iter().find(|row| row.id == *id).expect("an acknowledged id is stored");
            assert_eq!(row.message.content, format!("thread {thread} message {n}"));
        }
    }
    // A third process reloads one history holding both threads' messages, in id order.
    let reader = open(ports);
    let history: Vec<u64> = reader.manager().history().map(|m| m.id()).collect();
    assert!(history.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(reader.manager().next_id(), rows.last().unwrap().id + 1);
}

/// Whether the store refused the push as stale every time the session tried.
fn is_stale(error: &SessionError) -> bool {
    match error {
        SessionError::Store(error) => error.kind() == ErrorKind::Fenced,
        SessionError::AfterStore { source, .. } => is_stale(source),
        _ => false,
    }
}

#[test]
fn sessions_taking_turns_on_the_memory_store_end_as_one_session() {
    let pair = memory_ports();
    take_turns([&pair, &pair], &memory_ports(), 60);
}

#[test]
fn sessions_pushing_at_once_on_the_memory_store_lose_and_duplicate_nothing() {
    push_at_once(&memory_ports());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use ctxwin_std::store::postgres::testing::TestSchema;

    fn schema(test: &str) -> Option<TestSchema> {
        TestSchema::new(test).map(|schema| schema.expect("a fresh schema on the test server"))
    }

    /// Both ports on one `PgStore` (one pool): one process.
    fn process(schema: &TestSchema) -> Ports {
        let store = Arc::new(schema.open().unwrap());
        Ports { archive: store.clone(), checkpoints: store }
    }

    #[test]
    fn sessions_in_two_processes_taking_turns_on_postgres_end_as_one_session() {
        let Some(shared) = schema("lease turns") else { return };
        let Some(alone) = schema("lease single") else { return };
        take_turns([&process(&shared), &process(&shared)], &process(&alone), 60);
    }

    #[test]
    fn sessions_pushing_at_once_on_postgres_lose_and_duplicate_nothing() {
        let Some(schema) = schema("lease at once") else { return };
        push_at_once(&process(&schema));
    }
}
