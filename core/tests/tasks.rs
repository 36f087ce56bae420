//! Tasks as the unit of memory (issue 30): the summary a finished task leaves, the one
//! compaction a new task starts with, which units leave first, and snapshots of the task table.
#![cfg(feature = "tasks")]

use ctxwin_core::{
    Config, ContextManager, DefaultCapacities, Error, Level, Message, OutboxMode, StrategyKind,
    TinyCapacities, ToolCall,
};

type Manager = ContextManager<DefaultCapacities>;

fn manager(config: Config) -> Manager {
    ContextManager::with_config(config).unwrap()
}

/// Pushes one tool round: a call to `name` with `arguments`, and its `result`.
fn round(m: &mut Manager, id: &str, name: &str, arguments: &str, result: &str) -> (u64, u64) {
    let calls = [ToolCall::new(id, name, arguments)];
    let head = m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let tail = m.push(Message::tool_result(id, result)).unwrap();
    (head, tail)
}

/// A coding task: a request, an edit that fails, a fix, a final answer.
fn coding_task(m: &mut Manager, n: usize) -> (u64, u64) {
    let first =
        m.push(Message::user(&format!("Task {n}: make test_{n} pass in src/mod_{n}.rs"))).unwrap();
    round(
        m,
        &format!("a{n}"),
        "run",
        r#"{"cmd":"cargo test"}"#,
        "error[E0425]: cannot find value `x` in src/lib.rs",
    );
    round(m, &format!("b{n}"), "edit", &format!(r#"{{"path":"src/mod_{n}.rs"}}"#), "applied");
    round(
        m,
        &format!("c{n}"),
        "run",
        r#"{"cmd":"cargo test"}"#,
        "test result: ok. 3 passed; 0 failed",
    );
    let last = m
        .push(Message::assistant(&format!(
            "Decided to declare x in src/mod_{n}.rs. test_{n} passes."
        )))
        .unwrap();
    (first, last)
}

#[test]
fn a_finished_task_leaves_one_structured_summary_in_the_session_level() {
    let mut m = manager(Config::DEFAULT);
    m.start_task("make test_1 pass", 10).unwrap();
    let (first, last) = coding_task(&mut m, 1);
    let task = m.finish_task("test_1 passes", 20).unwrap();
    assert_eq!((task.first_id(), task.last_id()), (first, Some(last)));
    assert!(!task.is_open());
    let summary = m.get(task.summary_id().unwrap()).unwrap();
    assert!(summary.is_summary());
    assert_eq!(summary.summary_sources().collect::<Vec<_>>(), [(first, last)]);
    let text = summary.content();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Task 1: make test_1 pass");
    assert_eq!(lines[1], "Outcome: test_1 passes");
    assert_eq!(lines[2], "Files: src/mod_1.rs", "{text}");
    assert!(
        lines[3].starts_with(
            "Errors: error[E0425]: cannot find value `x` in src/lib.rs -> fixed by edit"
        ),
        "{text}"
    );
    assert!(lines[4].starts_with("Decisions: Decided to declare x"), "{text}");
    assert_eq!(task.summary_tokens(), summary.tokens());
    assert!(task.source_tokens() > task.summary_tokens());
    assert!(task.compression_ratio().unwrap() > 1.0);
    // The messages are still there until room is needed or the next task starts.
    assert_eq!(m.history().count(), 8);
}

#[test]
fn finishing_without_a_task_or_with_calls_waiting_is_refused_and_changes_nothing() {
    let mut m = manager(Config::DEFAULT);
    assert_eq!(m.finish_task("", 0), Err(Error::NoOpenTask));
    m.start_task("look around", 0).unwrap();
    let calls = [ToolCall::new("c1", "ls", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let used = m.used();
    assert_eq!(m.finish_task("", 1), Err(Error::ToolCallsPending { unanswered: 1 }));
    assert_eq!(m.start_task("other", 1), Err(Error::ToolCallsPending { unanswered: 1 }));
    assert_eq!(m.used(), used);
    assert!(m.current_task().is_some_and(|t| t.number() == 1));
    m.push(Message::tool_result("c1", "Cargo.toml src")).unwrap();
    assert!(m.finish_task("", 2).is_ok());
}

#[test]
fn a_new_task_compresses_the_previous_one_and_clears_volatile_in_one_compaction() {
    let config = Config { locked_tail: 2, ..Config::DEFAULT };
    let mut m = manager(config);
    m.start_task("make test_1 pass", 0).unwrap();
    coding_task(&mut m, 1);
    m.push(Message::assistant("cargo build -vv: 4000 lines of output").in_level(Level::Volatile))
        .unwrap();
    m.push(Message::assistant("Done.")).unwrap();
    m.push(Message::assistant("Ready for the next task.")).unwrap();
    let before = *m.counters();
    // No finish_task: starting the next one finishes this one.
    assert_eq!(m.start_task("make test_2 pass", 1).unwrap(), 2);
    let after = *m.counters();
    assert_eq!(after.compactions - before.compactions, 1, "one compaction");
    assert_eq!(after.summaries_added - before.summaries_added, 1, "one task summary");
    assert_eq!(m.messages(Level::Volatile).count(), 0);
    // What is left of task 1 is the locked tail: the newest two messages and the newest user
    // message.
    let left: Vec<u64> = m.history().map(|msg| msg.id()).collect();
    assert_eq!(left.len(), 3, "{left:?}");
    let task1 = m.tasks()[0];
    assert!(!task1.is_open());
    assert!(m.session().next().unwrap().content().starts_with("Task 1: make test_1 pass"));
    // Everything that left is in the outbox for the archive.
    let waiting: usize = m.outbox().map(|unit| unit.len()).sum();
    assert_eq!(waiting, 11 - 3);
}

#[test]
fn a_finished_tasks_units_leave_before_older_history() {
    let config = Config {
        context_window: 3_000,
        reserved_for_reply: 0,
        working_budget: 2_000,
        session_budget: 600,
        permanent_budget: 200,
        locked_tail: 2,
        ..Config::DEFAULT
    };
    let mut m = manager(config);
    let early =
        m.push(Message::user("Before any task: the deploy key lives in vault/ops.")).unwrap();
    m.push(Message::assistant("Noted.")).unwrap();
    m.start_task("make test_1 pass", 0).unwrap();
    let (first, last) = coding_task(&mut m, 1);
    m.finish_task("", 1).unwrap();
    // Keep talking without a new task until the older history leaves too.
    let filler = "more discussion of the plan with src/plan.rs details ".repeat(20);
    let mut i = 0;
    while m.get(early).is_some() {
        m.push(Message::user(&format!("{i}: {filler}"))).unwrap();
        i += 1;
        assert!(i < 50, "the older history never left");
        let task_left = (first..=last).filter(|&id| m.get(id).is_none()).count();
        assert!(
            m.get(early).is_some() || task_left == (last - first + 1) as usize,
            "older history left while {task_left} of the finished task's messages had"
        );
    }
}

#[test]
fn dead_ends_leave_before_the_path_that_worked() {
    let config = Config {
        context_window: 2_400,
        reserved_for_reply: 0,
        working_budget: 1_600,
        session_budget: 400,
        permanent_budget: 200,
        locked_tail: 2,
        ..Config::DEFAULT
    };
    let mut m = manager(config);
    m.start_task("get the build green", 0).unwrap();
    let ask = m.push(Message::user("The build is red; fix it.")).unwrap();
    let (dead, _) =
        round(&mut m, "d1", "run", r#"{"cmd":"make build"}"#, "make: *** [build] Error 2");
    let (good, _) = round(&mut m, "g1", "run", r#"{"cmd":"cargo build"}"#, "Finished dev profile");
    m.push(Message::user("Also check the docs build.")).unwrap();
    let filler = "notes on the build ".repeat(30);
    let mut i = 0;
    // The request is older than the dead end and no longer the newest user message, yet the
    // dead end leaves first; the path that worked leaves last.
    while m.get(good).is_some() {
        m.push(Message::assistant(&format!("{i}: {filler}"))).unwrap();
        i += 1;
        assert!(i < 50, "the path that worked never left");
        assert!(
            m.get(ask).is_none() <= m.get(dead).is_none(),
            "the request left before the dead end"
        );
    }
    assert!(m.get(dead).is_none(), "the path that worked left before the dead end");
    assert!(m.get(ask).is_none());
}

#[test]
fn a_session_without_tasks_evicts_as_before() {
    // Same pushes with and without the feature's code path: no task, no difference in what
    // is kept (the victim order is the strategy's).
    let config = Config {
        context_window: 1_500,
        reserved_for_reply: 0,
        working_budget: 1_000,
        session_budget: 300,
        permanent_budget: 200,
        locked_tail: 2,
        outbox: OutboxMode::Discard,
        ..Config::DEFAULT
    };
    let mut m = manager(config);
    let ask = m.push(Message::user("fix it")).unwrap();
    let dead = round(&mut m, "d1", "run", "{}", "error: boom").0;
    round(&mut m, "g1", "run", "{}", "fine");
    m.push(Message::user("and the docs")).unwrap();
    let filler = "words ".repeat(40);
    while m.get(ask).is_some() {
        m.push(Message::assistant(&filler)).unwrap();
        // Oldest first: the failed call never leaves before the older request.
        assert!(m.get(dead).is_none() <= m.get(ask).is_none());
    }
}

#[test]
fn the_task_table_survives_a_snapshot_and_version_2_snapshots_still_restore() {
    let mut m = manager(Config::DEFAULT);
    m.start_task("make test_1 pass", 5).unwrap();
    coding_task(&mut m, 1);
    m.finish_task("done", 6).unwrap();
    m.start_task("résumé the notes", 7).unwrap();
    m.push(Message::user("go")).unwrap();
    let mut buffer = vec![0u8; Manager::SNAPSHOT_MAX_SIZE];
    let bytes = m.snapshot_into(&mut buffer).unwrap().to_vec();
    assert_eq!(&bytes[4..6], &5u16.to_le_bytes());
    let mut restored = manager(Config::DEFAULT);
    restored.restore_from(&bytes).unwrap();
    assert_eq!(restored.tasks(), m.tasks());
    assert_eq!(restored.current_task().map(|t| t.goal()), Some("résumé the notes"));

    // The same state written by a version-2 build: no task table after the entities.
    let mut plain = manager(Config::DEFAULT);
    plain.push(Message::user("hello")).unwrap();
    let mut v2 = plain.snapshot_into(&mut buffer).unwrap().to_vec();
    v2.truncate(v2.len() - 4);
    assert_eq!(v2.pop(), Some(0), "an empty task table is one zero byte");
    // Nor (version 4 on) the compaction limit ending the configuration: byte 40 of the body
    // under the default configuration, 0.
    assert_eq!(v2.remove(48 + 40), 0);
    // Nor (version 5 on) the record's supersede key, just before its text.
    let text = v2.windows(6).position(|w| w == b"\x05hello").unwrap();
    assert_eq!(v2.remove(text - 1), 0);
    v2[4..6].copy_from_slice(&2u16.to_le_bytes());
    let body = (v2.len() - 48) as u32;
    v2[44..48].copy_from_slice(&body.to_le_bytes());
    let crc = crc32(&v2);
    v2.extend_from_slice(&crc.to_le_bytes());
    let mut old = manager(Config::DEFAULT);
    old.restore_from(&v2).unwrap();
    assert_eq!(old.history().count(), 1);
    assert!(old.tasks().is_empty());
    assert_eq!(old.stats(), plain.stats());
}

#[test]
fn a_damaged_task_table_is_refused() {
    let mut m = ContextManager::<TinyCapacities>::new();
    m.start_task("one", 0).unwrap();
    let mut buffer = [0u8; ContextManager::<TinyCapacities>::SNAPSHOT_MAX_SIZE];
    let bytes = m.snapshot_into(&mut buffer).unwrap().to_vec();
    // The open flag of the only task (before its goal: length 3, "one") set to 2.
    let at = bytes.len() - 4 - 4 - 1;
    assert_eq!(&bytes[at + 1..at + 5], b"\x03one");
    let mut bad = bytes.clone();
    bad[at] = 2;
    let end = bad.len() - 4;
    let crc = crc32(&bad[..end]);
    bad[end..].copy_from_slice(&crc.to_le_bytes());
    let mut fresh = ContextManager::<TinyCapacities>::new();
    assert_eq!(
        fresh.restore_from(&bad),
        Err(ctxwin_core::SnapshotError::Invalid(ctxwin_core::snapshot::Invariant::Tasks))
    );
    assert!(fresh.tasks().is_empty());
}

#[test]
fn the_summary_stays_a_task_summary_under_every_strategy() {
    for strategy in StrategyKind::ALL {
        let mut m = manager(Config { strategy, ..Config::DEFAULT });
        m.start_task("make test_1 pass", 0).unwrap();
        coding_task(&mut m, 1);
        let task = m.finish_task("", 1).unwrap();
        let summary = m.get(task.summary_id().unwrap()).unwrap();
        assert!(
            summary.content().starts_with("Task 1: make test_1 pass\nOutcome: Decided"),
            "{strategy:?}"
        );
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
