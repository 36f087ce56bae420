//! Integration tests of `ctxwin_std::session` against real files and a real SQLite database.

use std::collections::BTreeSet;
use std::path::Path;

use ctxwin_core::{Config, EntitySchema, Role, StrategyKind, reduce::TRUNCATION_MARKER};
use ctxwin_std::format::{self, Format};
use ctxwin_std::session::{PushReport, RestorePoint, Session, SessionBuilder, SessionError};
use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Scope, SearchQuery};
use ctxwin_std::{ChatMessage, ToolCall};

mod session_support;
use session_support::{assistant, generated, huge_output, tools, user};

/// A summarizing agent configuration small enough that a few turns evict and summarize.
fn agent_config() -> Config {
    Config {
        context_window: 16_384,
        reserved_for_reply: 2_048,
        permanent_budget: 3_000,
        session_budget: 1_500,
        working_budget: 6_000,
        strategy: StrategyKind::Summarization,
        summarize_threshold: 4,
        summarize_batch: 2,
        // Per-push eviction and plans (the water marks at today's 80%): these tests watch
        // summaries and evictions turn by turn.
        trigger_percent: 80,
        low_water_percent: 80,
        ..Config::DEFAULT
    }
}

/// Pushes one agent turn: a question, three parallel tool calls with their results (the
/// second huge on `huge` turns), and an answer. Returns every message with its report.
fn agent_turn(session: &mut Session, turn: usize, huge: bool) -> Vec<(ChatMessage, PushReport)> {
    let calls = vec![
        ToolCall::new(
            format!("t{turn}_a"),
            "read_file",
            format!(r#"{{"arg":"src/mod_{turn}.rs"}}"#),
        ),
        ToolCall::new(format!("t{turn}_b"), "run_tests", r#"{"arg":"--all"}"#),
        ToolCall::new(format!("t{turn}_c"), "grep", format!(r#"{{"arg":"fn handler_{turn}"}}"#)),
    ];
    let results = [
        format!("pub fn handler_{turn}() -> Result<(), Error> {{ todo!() }}"),
        if huge { huge_output() } else { format!("test result: ok. {turn} passed") },
        format!("src/mod_{turn}.rs:12: fn handler_{turn}"),
    ];
    let mut messages = vec![
        user(format!("Turn {turn}: fix handler_{turn} so the suite passes.")),
        ChatMessage::assistant_calls("Let me look.", calls.clone()),
    ];
    messages.extend(
        calls.iter().zip(results).map(|(call, text)| ChatMessage::tool_result(&call.id, text)),
    );
    messages.push(assistant(format!("handler_{turn} now returns Ok(()); tests pass.")));
    messages
        .into_iter()
        .map(|message| {
            let report = session.push(&message).unwrap();
            (message, report)
        })
        .collect()
}

/// The rows of unit `unit` of `scope`, in id order.
fn unit_rows(archive: &dyn ArchiveStore, scope: &Scope, unit: u64) -> Vec<ArchivedMessage> {
    let rows = archive.rows_after(scope, unit.saturating_sub(1), 64).unwrap();
    rows.into_iter().filter(|row| row.unit == unit).collect()
}

fn parse_json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{body}"))
}

#[test]
fn agent_session_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = SessionBuilder::new("agent")
        .config(agent_config())
        .archive(dir.path().join("archive.db"))
        .build()
        .unwrap();
    let system = ChatMessage::text(Role::System, "You are a careful coding agent.");
    let system_id = session.push(&system).unwrap().id;
    for tool in tools() {
        session.add_tool(&tool).unwrap();
    }
    let mut pushed = vec![(system.clone(), system_id)];
    let mut evicted_units = BTreeSet::new();
    let mut summaries = BTreeSet::new();
    let mut reduced = Vec::new();
    for turn in 0..16 {
        for (message, report) in agent_turn(&mut session, turn, turn % 5 == 2) {
            if message.role == Role::Tool {
                assert_eq!(
                    report.unit,
                    report.id
                        - 1
                        - pushed.iter().rev().take_while(|(m, _)| m.role == Role::Tool).count()
                            as u64
                );
            } else {
                assert_eq!(report.unit, report.id);
            }
            if let Some(reduction) = report.reduced {
                assert!(reduction.stored_tokens < reduction.original_tokens);
                reduced.push(report.id);
            }
            evicted_units.extend(report.evicted_units.iter().copied());
            summaries.extend(report.summaries.iter().copied());
            pushed.push((message, report.id));
        }
    }
    let archive = session.archive().unwrap();
    let scope = session.scope();

    // Every message is archived with its full text, tool calls and call id.
    assert_eq!(archive.usage(scope).unwrap().messages, pushed.len() as u64);
    for (message, id) in &pushed {
        let row = archive.get(scope, *id).unwrap().unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(row.full_text(), message.content, "message {id}");
        assert_eq!(row.message.role, message.role);
        assert_eq!(row.message.tool_calls, message.tool_calls);
        assert_eq!(row.message.tool_call_id, message.tool_call_id);
    }

    // The huge outputs were reduced in the core; the archive keeps both forms.
    assert_eq!(reduced.len(), 3);
    for id in &reduced {
        let row = archive.get(scope, *id).unwrap().unwrap();
        assert!(row.message.content.contains(TRUNCATION_MARKER));
        assert!(!row.message.content.contains("MIDDLE_MARKER_7f3a"));
        assert_eq!(row.original.as_deref(), Some(huge_output().as_str()));
        let found = archive.search(scope, &SearchQuery::new("MIDDLE_MARKER_7f3a", 10)).unwrap();
        assert!(found.iter().any(|hit| hit.id == *id));
    }

    // Every evicted unit is in the archive whole: a call and its three results together.
    assert!(evicted_units.len() >= 10, "{evicted_units:?}");
    for unit in &evicted_units {
        let messages = unit_rows(archive, scope, *unit);
        assert_eq!(messages.first().map(|m| m.id), Some(*unit));
        if messages[0].message.tool_calls.len() == 3 {
            assert_eq!(messages.len(), 4, "unit {unit}");
            assert!(messages[1..].iter().all(|m| m.message.role == Role::Tool));
        }
    }
    assert!(session.manager().stats().counters.units_evicted >= evicted_units.len() as u64);
    let counters = session.stats().unwrap().counters;
    assert!(counters.archive_rows_written >= pushed.len() as u64);

    // Summaries are recorded with drill-down to the messages they stand for.
    assert!(!summaries.is_empty());
    let first_user = pushed.iter().find(|(m, _)| m.role == Role::User).unwrap().1;
    let mut reaches_first = false;
    for id in &summaries {
        let record = archive.summary(scope, *id).unwrap().unwrap();
        assert!(!record.text.is_empty() && record.tokens_before > record.tokens_after);
        let sources = archive.drill_down(scope, *id).unwrap();
        assert!(!sources.is_empty());
        assert!(sources.iter().all(|m| record.source_ids.contains(&m.id)));
        reaches_first |= sources.iter().any(|m| m.id == first_user);
    }
    assert!(reaches_first, "no summary drills down to the first question");

    // The payload renders as valid OpenAI and Anthropic requests, under the budget.
    let payload = session.compose(&["Task: make the suite pass"]).unwrap();
    assert!(payload.tokens <= payload.budget);
    assert_eq!(payload.conversation.tools.len(), 3);
    let openai = parse_json(&payload.write(Format::OpenAiJson).unwrap());
    assert_eq!(openai["messages"][0]["content"], "You are a careful coding agent.");
    assert_eq!(openai["messages"][1]["content"], "Task: make the suite pass");
    // Archived turns matching the live request (the newest user message) come next, this
    // payload only.
    let summary_at = if payload.recall.ids.is_empty() { 2 } else { 3 };
    if summary_at == 3 {
        let block = openai["messages"][2]["content"].as_str().unwrap();
        assert!(block.starts_with("[Retrieved from archive]"), "{block}");
    }
    let summary = openai["messages"][summary_at]["content"].as_str().unwrap();
    assert!(summary.starts_with("[Memory Summary]"), "{summary}");
    assert_eq!(openai["tools"].as_array().unwrap().len(), 3);
    let anthropic = parse_json(&payload.write(Format::AnthropicJson).unwrap());
    assert!(anthropic["system"].to_string().contains("[Memory Summary]"));
    let turns = anthropic["messages"].as_array().unwrap();
    assert!(turns.windows(2).all(|pair| pair[0]["role"] != pair[1]["role"]));
    assert_eq!(anthropic["tools"][0]["name"], "read_file");
}

#[test]
fn zero_copy_body_matches_the_rendered_conversation() {
    let schema = EntitySchema::new(&["file", "branch"]).unwrap();
    let config = Config { entity_schema: schema, ..agent_config() };
    let mut session = SessionBuilder::new("body").config(config).build().unwrap();
    session.push(&ChatMessage::text(Role::System, "Be precise.")).unwrap();
    for tool in tools() {
        session.add_tool(&tool).unwrap();
    }
    for turn in 0..8 {
        agent_turn(&mut session, turn, turn == 3);
    }
    session.push(&user("file: src/main.rs, branch: \"feature/x\"")).unwrap();
    let dynamic = ["Retrieved: handler_2 was rewritten"];
    let options = ctxwin_std::session::ComposeOptions::new(&dynamic);
    let (body, tokens) = session.compose_openai_body(options, "gpt-4o").unwrap();
    let payload = session.compose(&dynamic).unwrap();
    assert_eq!(tokens, payload.tokens);
    let zero_copy = parse_json(&body);
    let rendered = parse_json(&format::write(&payload.conversation, Format::OpenAiJson).unwrap());
    assert_eq!(zero_copy["model"], "gpt-4o");
    let (a, b) =
        (zero_copy["messages"].as_array().unwrap(), rendered["messages"].as_array().unwrap());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x["role"], y["role"]);
        let text = |v: &serde_json::Value| v["content"].as_str().unwrap_or_default().to_string();
        assert_eq!(text(x), text(y));
        assert_eq!(x["tool_calls"], y["tool_calls"]);
        assert_eq!(x["tool_call_id"], y["tool_call_id"]);
    }
    assert!(
        a.iter().any(|m| m["content"].as_str().is_some_and(|c| c.starts_with("[Entities]\n{")))
    );
    let tools_a: Vec<_> =
        zero_copy["tools"].as_array().unwrap().iter().map(|t| &t["function"]["name"]).collect();
    let tools_b: Vec<_> =
        rendered["tools"].as_array().unwrap().iter().map(|t| &t["function"]["name"]).collect();
    assert_eq!(tools_a, tools_b);
}

fn restartable(dir: &Path, restore: bool) -> Result<Session, SessionError> {
    SessionBuilder::new("restart")
        .config(agent_config())
        .checkpoint_interval_messages(25)
        .archive(dir.join("archive.db"))
        .checkpoints(dir.join("snapshots"))
        .keep_checkpoints(3)
        .restore_latest(restore)
        .build()
}

#[test]
fn restart_continues_from_the_latest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = restartable(dir.path(), true).unwrap();
    session.push(&ChatMessage::text(Role::System, "You are a careful coding agent.")).unwrap();
    for tool in tools() {
        session.add_tool(&tool).unwrap();
    }
    let mut periodic = Vec::new();
    let mut pushed = Vec::new();
    for turn in 0..9 {
        for (message, report) in agent_turn(&mut session, turn, turn == 4 || turn == 8) {
            periodic.extend(report.checkpoint.clone());
            pushed.push((message, report.id));
        }
    }
    assert!(periodic.len() >= 2, "periodic checkpoints: {periodic:?}");
    session.record_usage(5_000, 5_400).unwrap();
    let before = session.compose(&["Task: ship it"]).unwrap();
    let checkpoint = session.checkpoint().unwrap();
    let stats = session.stats().unwrap();
    let next = session.push(&user("after the checkpoint")).unwrap().id;
    drop(session);

    let mut reopened = restartable(dir.path(), true).unwrap();
    let restored = reopened.stats().unwrap();
    assert_eq!(restored.last_checkpoint.as_deref(), Some(checkpoint.as_str()));
    assert_eq!(restored.calibration, stats.calibration);
    // The message pushed after the checkpoint is kept aside: its id is handed out again.
    let side = Scope::local(format!("restart@rewound-{checkpoint}"));
    let archive = reopened.archive().unwrap();
    assert_eq!(archive.get(&side, next).unwrap().unwrap().message.content, "after the checkpoint");
    assert_eq!(restored.core, {
        // The checkpoint was taken after `compose`: nothing in the core changed since.
        stats.core
    });
    assert_eq!(reopened.compose(&["Task: ship it"]).unwrap(), before);
    assert_eq!(reopened.push(&user("continuing")).unwrap().id, next);

    // Messages restored from the checkpoint leave the core later, and their rows (the full
    // text of the reduced output among them) survive that.
    for turn in 9..14 {
        pushed.extend(agent_turn(&mut reopened, turn, false).into_iter().map(|(m, r)| (m, r.id)));
    }
    let archive = reopened.archive().unwrap();
    for (message, id) in &pushed {
        assert!(reopened.manager().get(*id).is_none() || *id > next, "{id} still live");
        let row = archive.get(reopened.scope(), *id).unwrap().unwrap();
        assert_eq!(row.full_text(), message.content, "message {id}");
    }
}

#[test]
fn sessions_move_up_a_tier_and_checkpoints_of_either_tier_restore() {
    let dir = tempfile::tempdir().unwrap();
    // The default 32k window: its budgets let more text stay than the small tier holds.
    let restartable = |dir: &Path, restore: bool| {
        SessionBuilder::new("restart")
            .archive(dir.join("archive.db"))
            .checkpoints(dir.join("snapshots"))
            .restore_latest(restore)
            .build()
    };
    let mut session = restartable(dir.path(), true).unwrap();
    let first = session.push(&user("a short conversation stays in the small tier")).unwrap().id;
    assert_eq!(session.manager().tier(), "small");
    session.checkpoint().unwrap();
    drop(session);

    let mut reopened = restartable(dir.path(), true).unwrap();
    assert_eq!(reopened.manager().tier(), "small");
    let mut pushed = Vec::new();
    for turn in 0..8 {
        pushed.extend(agent_turn(&mut reopened, turn, true).into_iter().map(|(m, r)| (m, r.id)));
    }
    assert_eq!(reopened.manager().tier(), "server", "eight big tool outputs need the server tier");
    reopened.checkpoint().unwrap();
    let core = reopened.stats().unwrap().core;
    drop(reopened);

    // A checkpoint of the server tier (the only tier before tiers existed) restores into a
    // session that starts small, moving it up.
    let again = restartable(dir.path(), true).unwrap();
    assert_eq!(again.manager().tier(), "server");
    assert_eq!(again.stats().unwrap().core, core);
    let archive = again.archive().unwrap();
    assert!(archive.get(again.scope(), first).unwrap().is_some());
    for (message, id) in &pushed {
        let row = archive.get(again.scope(), *id).unwrap().unwrap();
        assert_eq!(row.full_text(), message.content, "message {id}");
    }
}

#[test]
fn a_damaged_newest_checkpoint_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = restartable(dir.path(), false).unwrap();
    for turn in 0..3 {
        agent_turn(&mut session, turn, false);
    }
    let good = session.checkpoint().unwrap();
    let good_stats = session.stats().unwrap().core;
    agent_turn(&mut session, 3, false);
    let damaged = session.checkpoint().unwrap();
    let path =
        session.checkpoints().unwrap().into_iter().find(|c| c.id == damaged).unwrap().location;
    drop(session);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();

    let reopened = restartable(dir.path(), true).unwrap();
    let stats = reopened.stats().unwrap();
    assert_eq!(stats.last_checkpoint.as_deref(), Some(good.as_str()));
    assert_eq!(stats.core, good_stats);
    // The turn after the good checkpoint is archived aside, not overwritten.
    let side = Scope::local(format!("restart@rewound-{good}"));
    assert_eq!(reopened.archive().unwrap().usage(&side).unwrap().messages, 6);
}

#[test]
fn restore_by_id_and_foreign_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = restartable(dir.path(), false).unwrap();
    first.push(&user("one")).unwrap();
    let id = first.checkpoint().unwrap();
    first.push(&user("two")).unwrap();
    let report = first.restore(RestorePoint::Id(id.clone())).unwrap();
    assert_eq!((report.id, report.rewound), (id.clone(), vec![2]));
    assert_eq!(first.manager().history().count(), 1);

    // A directory holds one session's checkpoints: another's payload there is refused.
    let snapshots = dir.path().join("snapshots");
    let foreign = ctxwin_std::store::CheckpointDir::bound(&snapshots, Scope::local("other"));
    let mut other =
        SessionBuilder::new("other").checkpoint_sink(std::sync::Arc::new(foreign)).build().unwrap();
    let error = other.restore(RestorePoint::Id(id)).unwrap_err();
    assert!(error.to_string().contains("belongs to session \"restart\""), "{error}");
}

#[test]
fn reusing_an_archived_name_without_a_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let build = || SessionBuilder::new("dup").archive(dir.path().join("a.db")).build();
    build().unwrap().push(&user("first run")).unwrap();
    let error = build().unwrap_err();
    assert!(matches!(error, SessionError::ArchiveInUse { messages: 1, .. }), "{error}");
}

/// An 8k window with fixed level budgets, for the calibration tests.
fn calibration_config() -> Config {
    Config {
        context_window: 8_192,
        reserved_for_reply: 1_024,
        permanent_budget: 500,
        session_budget: 500,
        working_budget: 6_000,
        fit_budgets: false,
        ..Config::DEFAULT
    }
}

#[test]
fn calibration_keeps_real_payloads_under_the_window() {
    let configured = Config { trigger_percent: 80, low_water_percent: 80, ..calibration_config() };
    let mut session = SessionBuilder::new("calibrated").config(configured).build().unwrap();
    session.push(&ChatMessage::text(Role::System, "You answer questions about logs.")).unwrap();
    for i in 0..200 {
        let text = format!(
            "Log {i}: worker {} restarted after {} ms; queue depth {}.",
            i % 7,
            i * 13,
            i * 3
        );
        session.push(&user(text)).unwrap();
        session.push(&assistant(format!("Noted restart {i}; nothing to do yet."))).unwrap();
    }
    let real_budget = configured.budget();
    let billed = |tokens: u32| u64::from(tokens) * 13 / 10;
    let first = session.compose(&[]).unwrap();
    assert!(billed(first.tokens) > u64::from(real_budget), "uncalibrated payload would fit anyway");

    for _ in 0..5 {
        let payload = session.compose(&[]).unwrap();
        session.record_usage(payload.tokens, billed(payload.tokens) as u32).unwrap();
        let after = session.compose(&[]).unwrap();
        assert!(
            billed(after.tokens) <= u64::from(real_budget),
            "{} billed over {real_budget}",
            billed(after.tokens)
        );
        session.push(&user("one more log line")).unwrap();
    }
    let stats = session.stats().unwrap();
    assert_eq!(stats.calibration.observations, 5);
    assert!((stats.calibration.ratio.unwrap() - 1.3).abs() < 0.01);
    assert!(stats.calibration.effective_window < stats.calibration.configured_window);
    assert_eq!(session.configured().context_window, 8_192);
}

#[test]
fn ten_thousand_messages_import_and_stay_retrievable() {
    let dir = tempfile::tempdir().unwrap();
    let mut session =
        SessionBuilder::new("bulk").archive(dir.path().join("bulk.db")).build().unwrap();
    let (conversation, planted) = generated(10_000);
    let report = session.import(&conversation).unwrap();
    assert_eq!(report.ids.len(), conversation.messages.len());
    assert_eq!((report.stored, report.tools), (conversation.messages.len() + 1, 3));
    assert!(report.reduced >= 6 && report.units_evicted > 1_000, "{report:?}");
    let archive = session.archive().unwrap();
    let scope = session.scope();
    assert_eq!(archive.usage(scope).unwrap().messages, report.stored as u64);
    for (message, id) in conversation.messages.iter().zip(&report.ids) {
        let row = archive.get(scope, *id).unwrap().unwrap();
        assert_eq!(row.full_text(), message.content);
        assert_eq!(row.message.tool_call_id, message.tool_call_id);
    }
    assert!(planted.len() >= 80);
    for (index, token) in &planted {
        let hits = archive.search(scope, &SearchQuery::new(token, 3)).unwrap();
        assert_eq!(hits.first().map(|h| h.id), Some(report.ids[*index]), "{token}");
    }
    // The session goes on after the import.
    let next = session.push(&user("and now?")).unwrap();
    assert_eq!(next.id, *report.ids.last().unwrap() + 1);
}

#[test]
fn summarizing_import_records_drillable_summaries() {
    let config =
        Config { strategy: StrategyKind::Summarization, low_water_percent: 100, ..Config::DEFAULT };
    let mut session =
        SessionBuilder::new("fold").config(config).archive_in_memory().build().unwrap();
    let (conversation, _) = generated(1_000);
    let report = session.import(&conversation).unwrap();
    assert!(report.summaries > 0, "{report:?}");
    let rolling = session.manager().session().find(|m| m.is_summary()).unwrap().id();
    let archive = session.archive().unwrap();
    let sources = archive.drill_down(session.scope(), rolling).unwrap();
    assert_eq!(sources.first().map(|m| m.id), Some(report.ids[0]));
    assert!(sources.len() > 500, "{}", sources.len());
}

/// A push the core takes only after the session drains its outbox, where summaries take ids
/// meanwhile: the message gets the id the core gives it, and no row is written under any
/// other.
#[test]
fn a_push_that_needs_drained_space_is_archived_under_the_id_it_got() {
    let config = Config {
        context_window: 200_000,
        working_budget: 150_000,
        strategy: StrategyKind::Hierarchical,
        working_age_ms: u64::MAX / 4,
        session_age_ms: u64::MAX / 4,
        ..Config::DEFAULT
    };
    let mut session =
        SessionBuilder::new("space").config(config).archive_in_memory().build().unwrap();
    // Text that is cheap in tokens and heavy in bytes fills the working arena first.
    let filler = |i: usize| {
        format!("Note {i}: the deploy of service-{i} finished cleanly.\n{}", "=".repeat(1_000))
    };
    let mut pushed = Vec::new();
    for i in 0..780 {
        let message = user(filler(i));
        pushed.push((session.push(&message).unwrap().id, message));
    }
    assert_eq!(session.stats().unwrap().core.counters.units_evicted, 0);
    let big = user(format!("{} the end", "=".repeat(250_000)));
    let next_before = session.manager().next_id();
    let report = session.push(&big).unwrap();
    assert!(report.id > next_before, "hierarchical summaries took ids while making room");
    assert!(!report.evicted_units.is_empty());
    pushed.push((report.id, big));
    let archive = session.archive().unwrap();
    let scope = session.scope();
    for (id, message) in &pushed {
        assert_eq!(archive.get(scope, *id).unwrap().unwrap().full_text(), message.content);
    }
    let rows = archive.rows_after(scope, 0, usize::MAX).unwrap();
    assert_eq!(rows.len(), pushed.len(), "a row for each message, none for the summaries' ids");
    for id in next_before..report.id {
        assert!(archive.get(scope, id).unwrap().is_none(), "a row under id {id}");
    }
}

#[test]
fn refused_messages_leave_no_row() {
    let mut session = SessionBuilder::new("refuse")
        .config(Config { working_budget: 2_000, ..Config::DEFAULT })
        .archive_in_memory()
        .build()
        .unwrap();
    let calls = vec![ToolCall::new("c1", "grep", "{}")];
    session.push(&ChatMessage::assistant_calls("", calls)).unwrap();
    let refusals = [
        ChatMessage::tool_result("nope", "orphan"),
        ChatMessage::text(Role::User, "word ".repeat(5_000)),
        ChatMessage::assistant_calls("", vec![ToolCall::new("", "x", "{}")]),
    ];
    for message in &refusals {
        assert!(matches!(session.push(message), Err(SessionError::Core(_))));
    }
    session.push(&ChatMessage::tool_result("c1", "found")).unwrap();
    assert!(matches!(
        session.push(&ChatMessage::tool_result("c1", "again")),
        Err(SessionError::Core(_))
    ));
    let archive = session.archive().unwrap();
    assert_eq!(archive.usage(session.scope()).unwrap().messages, 2);
}

/// A refusal only the core's push finds (its check passed): nothing was written before the
/// push, so nothing is left behind, and the next id goes to whatever comes next.
#[test]
fn a_late_refusal_leaves_nothing_behind() {
    let config = Config { working_budget: 2_000, ..Config::DEFAULT };
    let mut session =
        SessionBuilder::new("late").config(config).archive_in_memory().build().unwrap();
    // Calls whose arguments fill the working budget leave no room for even a reduced result:
    // only the core finds that out.
    use ctxwin_core::counter::TokenCounter;
    let counter = ctxwin_std::session::Counter::default();
    let cost = |arguments: &str| {
        counter.count("c1") + counter.count("grep") + counter.count(arguments) + 3 + 4
    };
    let arguments = (1..4_000)
        .map(|n| format!(r#"{{"arg":"{}"}}"#, "a ".repeat(n)))
        .find(|arguments| (1_972..=1_996).contains(&cost(arguments)))
        .unwrap();
    let calls = vec![ToolCall::new("c1", "grep", arguments)];
    let head = session.push(&ChatMessage::assistant_calls("", calls)).unwrap().id;
    let refused = session.push(&ChatMessage::tool_result("c1", "delta ".repeat(300)));
    assert!(matches!(refused, Err(SessionError::Core(ctxwin_core::Error::MessageTooLarge { .. }))));
    let tool = session.add_tool(&tools()[0]).unwrap();
    assert_eq!(tool, head + 1);
    let archive = session.archive().unwrap();
    assert_eq!(archive.rows_after(session.scope(), 0, 10).unwrap().len(), 1, "only the call");
}

#[test]
fn aborted_calls_are_archived_in_their_unit() {
    let mut session = SessionBuilder::new("abort").archive_in_memory().build().unwrap();
    let calls = vec![ToolCall::new("c1", "slow", "{}"), ToolCall::new("c2", "slower", "{}")];
    let head = session.push(&ChatMessage::assistant_calls("", calls)).unwrap().id;
    session.push(&ChatMessage::tool_result("c1", "done")).unwrap();
    let next = session.push(&user("never mind")).unwrap();
    assert_eq!(next.id, head + 3, "the synthetic result for c2 took an id");
    let unit = unit_rows(session.archive().unwrap(), session.scope(), head);
    assert_eq!(unit.len(), 3);
    assert_eq!(unit[2].message.tool_call_id.as_deref(), Some("c2"));
}

#[test]
fn retrieved_text_feeds_the_payload() {
    let config = Config { max_messages: 4, locked_tail: 2, ..Config::DEFAULT };
    let mut session =
        SessionBuilder::new("recall").config(config).archive_in_memory().build().unwrap();
    session.push(&user("The deploy key lives in vault path secret/deploy/prod.")).unwrap();
    for i in 0..10 {
        session.push(&user(format!("unrelated chatter {i}"))).unwrap();
    }
    assert!(session.manager().history().all(|m| !m.content().contains("vault")));
    let recall = session.recall("where is the deploy key vault", &[]).unwrap();
    let block = recall.block.clone();
    assert!(block.starts_with("[Retrieved from archive]") && block.contains("secret/deploy/prod"));
    let options = ctxwin_std::session::ComposeOptions::new(&[])
        .recall(ctxwin_std::session::RecallFor::Query("where is the deploy key vault"));
    let payload = session.compose_with(options).unwrap();
    assert_eq!(payload.conversation.messages[0].content, block);
    assert_eq!(payload.recall, recall);
    let without = SessionBuilder::new("x").build().unwrap().recall("q", &[]).unwrap();
    assert!(without.block.is_empty(), "no archive, nothing recalled");
}

#[test]
fn sessions_move_between_threads() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<Session>();
    let shared = SessionBuilder::new("threads").archive_in_memory().build().unwrap().into_shared();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for i in 0..5 {
                    shared
                        .lock()
                        .unwrap()
                        .push(&user(format!("worker {worker} message {i}")))
                        .unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let session = shared.lock().unwrap();
    assert_eq!(session.archive().unwrap().usage(session.scope()).unwrap().messages, 20);
    assert_eq!(session.stats().unwrap().counters.messages_pushed, 20);
}

#[test]
fn stats_print_as_a_table_and_json() {
    let mut session = SessionBuilder::new("stats").archive_in_memory().build().unwrap();
    agent_turn(&mut session, 0, true);
    let stats = session.stats().unwrap();
    let table = stats.to_string();
    for key in ["session", "budget / used", "permanent", "volatile", "reduced outputs", "archive"] {
        assert!(table.contains(key), "{key} missing:\n{table}");
    }
    let json = parse_json(&serde_json::to_string(&stats).unwrap());
    assert_eq!(json["core"]["counters"]["observations_reduced"], 1);
    assert_eq!(json["archive"]["messages"], 6);
}

/// With the dynamic context before the newest user message, the Anthropic body keeps it
/// there: a `[system]` text block in the newest user turn, never hoisted into the top-level
/// `system` (which would put text that changes every turn ahead of the whole history).
#[test]
fn anthropic_keeps_dynamic_context_before_the_newest_user_turn() {
    let config = Config {
        dynamic_placement: ctxwin_core::DynamicPlacement::BeforeNewestUser,
        ..Config::DEFAULT
    };
    let mut session = SessionBuilder::new("placed").config(config).build().unwrap();
    session.push(&ChatMessage::text(Role::System, "You are terse.")).unwrap();
    session.push(&user("first question")).unwrap();
    session.push(&assistant("first answer")).unwrap();
    session.push(&user("second question")).unwrap();
    let body = |session: &mut Session, task: &str| {
        let payload = session.compose(&[task]).unwrap();
        parse_json(&payload.write(Format::AnthropicJson).unwrap())
    };
    let first = body(&mut session, "Task: one");
    assert_eq!(first["system"], "You are terse.", "{first}");
    let messages = first["messages"].as_array().unwrap();
    let texts: Vec<String> = messages
        .iter()
        .map(|m| match &m["content"] {
            serde_json::Value::String(text) => format!("{}: {text}", m["role"].as_str().unwrap()),
            blocks => {
                let parts: Vec<&str> = blocks
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b["text"].as_str().unwrap_or("<block>"))
                    .collect();
                format!("{}: {}", m["role"].as_str().unwrap(), parts.join(" | "))
            }
        })
        .collect();
    assert_eq!(
        texts,
        [
            "user: first question",
            "assistant: first answer",
            "user: [system] Task: one | second question"
        ]
    );
    // The next turn with another task: everything before the newest turn is the same bytes.
    session.push(&assistant("second answer")).unwrap();
    session.push(&user("third question")).unwrap();
    let second = body(&mut session, "Task: two");
    assert_eq!(second["system"], first["system"]);
    let next = second["messages"].as_array().unwrap();
    assert_eq!(next[..2], messages[..2], "the cached turns moved");
    assert_eq!(next[2]["content"], "second question");
    assert_eq!(next[3]["content"], "second answer");
    let last = next[4]["content"].as_array().unwrap();
    assert_eq!(last[0]["text"], "[system] Task: two");
    assert_eq!(last[1]["text"], "third question");
    assert!(!second["system"].to_string().contains("Task"), "{second}");
}

/// A provider that bills less than the estimate (the default estimator's margin over-counts
/// most text): the calibrated window grows, payloads fill more of the real window, and a
/// payload billed at the observed ratio still fits it.
#[test]
fn calibration_fills_the_window_when_estimates_run_high() {
    let configured = calibration_config();
    let mut session = SessionBuilder::new("generous").config(configured).build().unwrap();
    session.push(&ChatMessage::text(Role::System, "You answer questions about logs.")).unwrap();
    let real_budget = configured.budget();
    let billed = |tokens: u32| u64::from(tokens) * 7 / 10;
    let mut largest_before = 0;
    let mut largest_after = 0;
    for i in 0..400 {
        let text = format!("Log {i}: worker {} restarted after {} ms; queue {}.", i % 7, i * 13, i);
        session.push(&user(text)).unwrap();
        session.push(&assistant(format!("Noted restart {i}; nothing to do yet."))).unwrap();
        let payload = session.compose(&[]).unwrap();
        assert!(payload.tokens <= payload.budget);
        assert!(billed(payload.tokens) <= u64::from(real_budget), "turn {i}: billed over");
        if i < 200 {
            largest_before = largest_before.max(payload.tokens);
        } else {
            largest_after = largest_after.max(payload.tokens);
            session.record_usage(payload.tokens, billed(payload.tokens) as u32).unwrap();
        }
    }
    assert!(largest_before <= real_budget);
    assert!(largest_after > real_budget, "{largest_after} estimated: the window did not grow");
    let stats = session.stats().unwrap();
    assert!(stats.calibration.effective_window > stats.calibration.configured_window);
    assert_eq!(session.configured().context_window, 8_192);
}

#[test]
fn an_untimed_import_ages_by_turn_order() {
    // Plans run at every push (no water marks), so ages act during the import itself.
    let config = Config {
        strategy: StrategyKind::Hierarchical,
        trigger_percent: 100,
        low_water_percent: 100,
        ..Config::DEFAULT
    };
    let mut session =
        SessionBuilder::new("turns").config(config).archive_in_memory().build().unwrap();
    let messages: Vec<ChatMessage> = (0..40)
        .map(|i| match i % 2 {
            0 => user(format!("Step {i}: rename the field `count_{i}` in the ledger module.")),
            _ => assistant(format!("Renamed `count_{}` and updated its callers.", i - 1)),
        })
        .collect();
    let conversation = ctxwin_std::Conversation { messages, ..Default::default() };
    let report = session.import(&conversation).unwrap();
    let stored = session.archive().unwrap().get_many(session.scope(), &report.ids).unwrap();
    assert_eq!(stored.len(), 40);
    for pair in stored.windows(2) {
        assert_eq!(
            pair[1].timestamp - pair[0].timestamp,
            ctxwin_std::session::UNTIMED_TURN_INTERVAL_MS,
            "one interval per turn"
        );
    }
    // Older turns than the working age (5 one-minute turns) were summarized by age.
    let working = session.manager().messages(ctxwin_core::Level::Working).count();
    assert!(working <= 8, "{working} turns still whole");
    let summaries = session.manager().messages(ctxwin_core::Level::Session).count();
    assert!(summaries >= 1, "no summary of the old turns");
}
