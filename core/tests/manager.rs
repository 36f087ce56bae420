//! Behaviour of the manager, one rule per test.

use ctxwin_core::{
    Capacities, Config, ContextManager, Error, Level, Message, OpenAiRequest, OutboxMode,
    PayloadItem, TinyCapacities, ToolCall, ring::Ring,
};

struct Small;
impl Capacities for Small {
    type Permanent = Ring<4, 2048>;
    type Session = Ring<4, 1024>;
    type Working = Ring<32, 8192>;
    type Volatile = Ring<8, 2048>;
    type Scratch = ctxwin_core::capacity::Scratch<512>;
    type Entities = ctxwin_core::entities::EntityTable<4, 32>;
}

fn config(tail: u16, budget: u32) -> Config {
    Config {
        context_window: budget + 512,
        reserved_for_reply: 512,
        permanent_budget: budget / 8,
        session_budget: budget / 8,
        working_budget: budget / 2,
        locked_tail: tail,
        // The numbers as given: a 512-token reserve, not capped to a quarter of the window.
        fit_budgets: false,
        ..Config::DEFAULT
    }
}

fn manager(tail: u16, budget: u32) -> ContextManager<Small> {
    ContextManager::with_config(config(tail, budget)).unwrap()
}

fn contents<C: Capacities>(manager: &ContextManager<C>) -> Vec<String> {
    manager.history().map(|m| m.content().to_string()).collect()
}

fn drained_contents<C: Capacities>(manager: &mut ContextManager<C>) -> Vec<Vec<String>> {
    let mut units = Vec::new();
    manager.drain_outbox(|unit| {
        units.push(unit.messages().map(|m| m.content().to_string()).collect())
    });
    units
}

#[test]
fn a_call_and_its_results_leave_together() {
    let mut m = manager(1, 800);
    m.push(Message::user("start")).unwrap();
    let calls = [ToolCall::new("a", "read", "{}"), ToolCall::new("b", "read", "{}")];
    m.push(Message::assistant("reading").with_tool_calls(&calls)).unwrap();
    m.push(Message::tool_result("a", "alpha")).unwrap();
    m.push(Message::tool_result("b", "beta")).unwrap();
    let mut units = Vec::new();
    for i in 0..40 {
        m.push(Message::assistant(&format!("note {i} {}", "filler ".repeat(10)))).unwrap();
        units.extend(drained_contents(&mut m));
    }
    let unit = units
        .iter()
        .find(|u| u.first().is_some_and(|c| c == "reading"))
        .expect("call unit evicted");
    assert_eq!(unit, &["reading", "alpha", "beta"]);
    assert!(!contents(&m).iter().any(|c| c == "alpha" || c == "beta"));
}

#[test]
fn orphan_and_duplicate_results_are_refused_and_not_stored() {
    let mut m = manager(6, 4000);
    assert_eq!(m.push(Message::tool_result("x", "?")), Err(Error::OrphanToolResult));
    let calls = [ToolCall::new("a", "f", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    assert_eq!(m.push(Message::tool_result("zzz", "?")), Err(Error::OrphanToolResult));
    m.push(Message::tool_result("a", "ok")).unwrap();
    assert_eq!(m.push(Message::tool_result("a", "ok again")), Err(Error::OrphanToolResult));
    assert_eq!(m.history().count(), 2);
}

#[test]
fn unanswered_calls_get_aborted_results_when_the_user_moves_on() {
    let mut m = manager(6, 4000);
    let calls = [ToolCall::new("a", "f", "{}"), ToolCall::new("b", "g", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    m.push(Message::tool_result("b", "done")).unwrap();
    assert_eq!(m.compose(&[]).err(), Some(Error::ToolCallsPending { unanswered: 1 }));
    m.push(Message::user("forget it")).unwrap();
    let history: Vec<_> =
        m.history().map(|h| (h.role(), h.tool_call_id(), h.is_synthetic())).collect();
    assert_eq!(history.len(), 4);
    assert_eq!(history[2], (ctxwin_core::Role::Tool, Some("a"), true));
    assert_eq!(m.stats().counters.calls_aborted, 1);
    assert!(m.compose(&[]).is_ok());
}

#[cfg(feature = "drop-calls")]
#[test]
fn unanswered_calls_can_be_dropped_instead() {
    let cfg =
        Config { unanswered_calls: ctxwin_core::UnansweredCalls::DropCalls, ..config(6, 4000) };
    let mut m = ContextManager::<Small>::with_config(cfg).unwrap();
    let calls = [
        ToolCall::new("a", "f", "{\"x\":1}"),
        ToolCall::new("b", "g", "{}"),
        ToolCall::new("c", "h", "[]"),
    ];
    m.push(Message::assistant("thinking").with_tool_calls(&calls)).unwrap();
    m.push(Message::tool_result("b", "done")).unwrap();
    let before = m.used();
    m.push(Message::user("next")).unwrap();
    let assistant = m.history().next().unwrap();
    let kept: Vec<_> = assistant.tool_calls().map(|c| (c.id, c.name, c.arguments)).collect();
    assert_eq!(kept, [("b", "g", "{}")]);
    assert_eq!(assistant.content(), "thinking");
    assert!(m.used() < before + 20, "dropped calls no longer counted");
    assert_eq!(m.stats().counters.calls_dropped, 2);

    // An empty assistant message whose calls all go unanswered disappears entirely.
    let calls = [ToolCall::new("z", "f", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    m.push(Message::user("again")).unwrap();
    assert_eq!(contents(&m), ["thinking", "done", "next", "again"]);
}

#[test]
fn huge_tool_output_is_reduced_not_allowed_to_empty_the_window() {
    let mut m = ContextManager::<TinyCapacities>::new();
    m.push(Message::user("run the tests")).unwrap();
    let calls = [ToolCall::new("t", "sh", "{\"cmd\":\"cargo test\"}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let output: String = (0..2000).map(|i| format!("test case_{i} ... ok\n")).collect();
    m.push(Message::tool_result("t", &output)).unwrap();
    let result = m.history().next_back().unwrap();
    assert!(result.was_reduced());
    assert!(result.content().starts_with("test case_0 ... ok\n"));
    assert!(result.content().ends_with("test case_1999 ... ok\n"));
    assert!(result.content().contains("[Data Truncated]\n... ("));
    assert!(result.original_tokens() > 5 * result.tokens());
    assert!(result.tokens() <= 1000 + 10);
    assert_eq!(m.history().count(), 3, "nothing else was pushed out");
    assert_eq!(m.stats().counters.observations_reduced, 1);
}

#[test]
fn a_tool_output_pushed_whole_is_not_reduced_to_the_observation_limit() {
    struct Roomy;
    impl Capacities for Roomy {
        type Permanent = Ring<4, 2048>;
        type Session = Ring<4, 1024>;
        type Working = Ring<32, 65_536>;
        type Volatile = Ring<8, 2048>;
        type Scratch = ctxwin_core::capacity::Scratch<512>;
        type Entities = ctxwin_core::entities::EntityTable<4, 32>;
    }
    let mut m = ContextManager::<Roomy>::new();
    m.push(Message::user("read it and run the tests")).unwrap();
    let calls = [ToolCall::new("r", "read", "{\"path\":\"a.rs\"}"), ToolCall::new("t", "sh", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let file: String = (0..300).map(|i| format!("{i:>6}\tlet x{i} = {i};\n")).collect();
    let log: String = (0..300).map(|i| format!("test case_{i} ... ok\n")).collect();
    let read = m.push(Message::tool_result("r", &file).whole()).unwrap();
    let test = m.push(Message::tool_result("t", &log)).unwrap();
    let (read, test) = (m.get(read).unwrap(), m.get(test).unwrap());
    assert!(read.tokens() > m.config().observation_limit, "{}", read.tokens());
    assert!(!read.was_reduced() && read.content() == file);
    assert!(test.was_reduced(), "the same size, not whole: reduced");
    // Whole is not unbounded: an output over what its unit may hold is still reduced.
    m.push(Message::user("and the big one")).unwrap();
    m.push(Message::assistant("").with_tool_calls(&calls[..1])).unwrap();
    let huge = file.repeat(40);
    let id = m.push(Message::tool_result("r", &huge).whole()).unwrap();
    let stored = m.get(id).unwrap();
    assert!(stored.was_reduced() && stored.tokens() <= m.config().level_budget(Level::Working));
}

#[test]
fn the_newest_messages_and_the_live_user_message_stay() {
    let mut m = manager(3, 600);
    m.push(Message::user("THE TASK")).unwrap();
    for i in 0..60 {
        m.push(Message::assistant(&format!("step {i} {}", "x ".repeat(20)))).unwrap();
        m.drain_outbox(|_| {});
    }
    let history = contents(&m);
    assert_eq!(history.first().map(String::as_str), Some("THE TASK"));
    assert!(history.ends_with(&[
        format!("step 57 {}", "x ".repeat(20)),
        format!("step 58 {}", "x ".repeat(20)),
        format!("step 59 {}", "x ".repeat(20)),
    ]));
    assert!(history.len() < 30, "older steps were evicted");
}

#[test]
fn pinned_content_over_budget_is_an_error_and_evicts_nothing() {
    let mut m = manager(2, 400);
    m.push(Message::user("a")).unwrap();
    m.push(Message::user("b")).unwrap();
    m.push(Message::user("c")).unwrap();
    let big = "lorem ipsum ".repeat(200);
    let dynamic = [big.as_str()];
    let err = m.compose(&dynamic).err().unwrap();
    let Error::PinnedOverBudget { needed, budget: 400, pinned } = err else { panic!("{err}") };
    assert!(needed > 400 && pinned.dynamic > 400, "{err}");
    // The live request: the newest user message, which is also the newest unit.
    let live: u32 = m.history().next_back().map(|message| message.tokens()).unwrap();
    assert_eq!((pinned.permanent, pinned.live), (0, live), "{err}");
    assert_eq!(needed, pinned.total() + u32::from(m.config().request_overhead));
    assert_eq!(m.outbox().count(), 0);
    assert_eq!(contents(&m), ["a", "b", "c"]);
}

#[test]
fn dynamic_context_evicts_the_oldest_units_to_fit() {
    let mut m = manager(1, 1000);
    for i in 0..6 {
        m.push(Message::user(&format!("message number {i} {}", "word ".repeat(20)))).unwrap();
    }
    assert_eq!(m.outbox().count(), 0);
    // Dynamic context for about 90% of what is left after the newest message.
    let mut text = String::new();
    while ctxwin_core::counter::TokenCounter::count(m.counter(), &text) < 800 {
        text.push_str("retrieved ");
    }
    let dynamic = [text.as_str()];
    let payload = m.compose(&dynamic).unwrap();
    assert!(payload.tokens() <= 1000);
    assert!(payload.history().count() < 6);
    let newest = payload.history().next_back().map(|m| m.content().to_string());
    assert!(newest.unwrap().starts_with("message number 5"));
}

#[test]
fn payload_order_is_system_tools_dynamic_summary_history() {
    let mut m = manager(6, 4000);
    m.push(Message::user("hi")).unwrap();
    m.add_summary("earlier: chose Rust", &[(1, 1)], 0).unwrap();
    m.add_tool_definition(r#"{"name":"ls","parameters":{}}"#).unwrap();
    m.push(Message::system("be brief")).unwrap();
    let dynamic = ["task: greet"];
    let payload = m.compose(&dynamic).unwrap();
    let order: Vec<String> = payload
        .items()
        .map(|item| match item {
            PayloadItem::System(m) => format!("system:{}", m.content()),
            PayloadItem::ToolDefinition(_) => "tool".into(),
            PayloadItem::Dynamic(text) => format!("dynamic:{text}"),
            PayloadItem::Entities(_) => "entities".into(),
            PayloadItem::MemorySummary(s) => s.parts().collect(),
            PayloadItem::Message(m) => format!("history:{}", m.content()),
        })
        .collect();
    assert_eq!(
        order,
        [
            "system:be brief",
            "tool",
            "dynamic:task: greet",
            "[Memory Summary]\nearlier: chose Rust",
            "history:hi"
        ]
    );
}

#[test]
fn openai_body_is_valid_json_with_calls_results_and_tools() {
    let mut m = manager(6, 4000);
    m.push(Message::system("You \"quote\" things.\n")).unwrap();
    m.add_tool_definition(r#"{"name":"read","parameters":{"type":"object"}}"#).unwrap();
    m.push(Message::user("read a\tb")).unwrap();
    let calls =
        [ToolCall::new("c1", "read", r#"{"path":"a\\b.txt"}"#), ToolCall::new("c2", "read", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    m.push(Message::tool_result("c2", "second")).unwrap();
    m.push(Message::tool_result("c1", "first \u{1} é")).unwrap();
    m.add_summary("summary line", &[], 0).unwrap();
    let mut body = vec![0u8; 4096];
    let len = m
        .compose(&["ctx"])
        .unwrap()
        .write_openai(&mut body[..], OpenAiRequest { model: Some("gpt"), max_tokens: Some(256) })
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&body[..len]).unwrap();
    assert_eq!(value["model"], "gpt");
    assert_eq!(value["max_tokens"], 256);
    let messages = value["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "system", "system", "user", "assistant", "tool", "tool"]);
    assert_eq!(messages[0]["content"], "You \"quote\" things.\n");
    assert_eq!(messages[2]["content"], "[Memory Summary]\nsummary line");
    assert_eq!(messages[4]["content"], serde_json::Value::Null);
    assert_eq!(messages[4]["tool_calls"][0]["function"]["arguments"], r#"{"path":"a\\b.txt"}"#);
    assert_eq!(messages[5]["tool_call_id"], "c2");
    assert_eq!(messages[6]["content"], "first \u{1} é");
    assert_eq!(value["tools"][0]["function"]["name"], "read");
}

#[test]
fn hold_mode_asks_to_drain_and_the_retry_succeeds() {
    let cfg = Config { trigger_percent: 100, ..config(1, 100_000) };
    let mut m = ContextManager::<Small>::with_config(cfg).unwrap();
    let text = "y".repeat(900);
    let mut outbox_full = 0;
    for _ in 0..40 {
        match m.push(Message::assistant(&text)) {
            Ok(_) => {}
            Err(Error::OutboxFull { level: Level::Working }) => {
                outbox_full += 1;
                assert!(m.outbox().count() > 0);
                m.drain_outbox(|_| {});
                m.push(Message::assistant(&text)).unwrap();
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(outbox_full > 0);
    assert_eq!(m.stats().counters.messages_pushed, 40);
}

#[test]
fn discard_mode_releases_evicted_units_at_once() {
    let cfg = Config { outbox: OutboxMode::Discard, trigger_percent: 100, ..config(1, 100_000) };
    let mut m = ContextManager::<Small>::with_config(cfg).unwrap();
    let text = "y".repeat(900);
    for _ in 0..40 {
        m.push(Message::assistant(&text)).unwrap();
    }
    assert_eq!(m.outbox().count(), 0);
    let counters = m.stats().counters;
    assert_eq!(counters.units_discarded, counters.units_evicted);
    assert!(counters.units_evicted > 30);
}

#[test]
fn a_level_full_of_locked_messages_refuses_instead_of_dropping() {
    let mut m = manager(32, 100_000);
    let text = "z".repeat(1000);
    for _ in 0..8 {
        m.push(Message::assistant(&text)).unwrap();
    }
    assert_eq!(m.push(Message::assistant(&text)), Err(Error::LevelFull { level: Level::Working }));
    assert_eq!(m.history().count(), 8);
}

#[test]
fn permanent_over_its_budget_is_refused() {
    let mut m = manager(6, 800);
    let rules = "rule ".repeat(60);
    m.push(Message::system(&rules)).unwrap();
    let err = m.push(Message::system(&rules)).unwrap_err();
    assert!(matches!(err, Error::LevelOverBudget { level: Level::Permanent, .. }));
}

#[test]
fn session_overflow_merges_into_one_summary_within_budget() {
    let mut m = manager(6, 800);
    for i in 0..6 {
        m.add_summary(
            &format!("summary {i}: decided to keep file_{i}.rs {}", "words ".repeat(10)),
            &[(i, i)],
            0,
        )
        .unwrap();
        assert!(m.level_tokens(Level::Session) <= 100);
    }
    assert!(m.stats().counters.summaries_merged > 0);
    let text: String = m.session().map(|s| s.content().to_string()).collect();
    assert!(text.contains("file_5.rs"), "{text}");
    let sources: Vec<(u64, u64)> =
        m.session().flat_map(|s| s.summary_sources().collect::<Vec<_>>()).collect();
    assert!(
        sources.iter().any(|&(a, _)| a == 0),
        "merged summaries keep every source: {sources:?}"
    );
}

#[test]
fn max_messages_caps_the_history() {
    let cfg = Config { max_messages: 5, ..config(2, 100_000) };
    let mut m = ContextManager::<Small>::with_config(cfg).unwrap();
    for i in 0..12 {
        m.push(Message::assistant(&format!("m{i}"))).unwrap();
    }
    assert_eq!(contents(&m), ["m7", "m8", "m9", "m10", "m11"]);
}

#[test]
fn invalid_messages_are_refused() {
    use ctxwin_core::InvalidMessage::*;
    let mut m = manager(6, 4000);
    let calls = [ToolCall::new("a", "f", "{}")];
    assert_eq!(
        m.push(Message::user("x").with_tool_calls(&calls)),
        Err(ToolCallsOnNonAssistant.into())
    );
    let twice = [ToolCall::new("a", "f", "{}"), ToolCall::new("a", "g", "{}")];
    assert_eq!(
        m.push(Message::assistant("").with_tool_calls(&twice)),
        Err(DuplicateToolCallId.into())
    );
    let empty = [ToolCall::new("", "f", "{}")];
    assert_eq!(m.push(Message::assistant("").with_tool_calls(&empty)), Err(EmptyToolCallId.into()));
    let mut orphan_id = Message::user("x");
    orphan_id.tool_call_id = Some("a");
    assert_eq!(m.push(orphan_id), Err(UnexpectedToolCallId.into()));
    let mut no_id = Message::tool_result("a", "x");
    no_id.tool_call_id = None;
    assert_eq!(m.push(no_id), Err(MissingToolCallId.into()));
    let in_session = Message::assistant("").with_tool_calls(&calls).in_level(Level::Session);
    assert_eq!(m.push(in_session), Err(WrongLevel(Level::Session).into()));
    assert_eq!(m.stats().counters.messages_pushed, 0);
}

#[test]
fn volatile_units_go_before_working_ones() {
    // Per-push eviction (low-water mark at the trigger), so the first unit to leave shows.
    let cfg = Config {
        permanent_budget: 40,
        session_budget: 40,
        working_budget: 420,
        trigger_percent: 80,
        low_water_percent: 80,
        ..config(1, 600)
    };
    let mut m = ContextManager::<Small>::with_config(cfg).unwrap();
    m.push(Message::assistant("working old")).unwrap();
    let verbose = format!("volatile old {}", "v ".repeat(100));
    m.push(Message::assistant(&verbose).in_level(Level::Volatile)).unwrap();
    for i in 0..30 {
        m.push(Message::assistant(&format!("w{i} {}", "pad ".repeat(40)))).unwrap();
        if m.stats().counters.units_evicted > 0 {
            break;
        }
    }
    assert_eq!(m.stats().counters.units_evicted, 1);
    assert_eq!(drained_contents(&mut m), [[verbose]]);
    assert_eq!(contents(&m).first().map(String::as_str), Some("working old"));
}

#[test]
fn a_tool_result_joins_its_call_in_the_volatile_level() {
    let mut m = manager(6, 4000);
    let calls = [ToolCall::new("a", "grep", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls).in_level(Level::Volatile)).unwrap();
    m.push(Message::tool_result("a", "matches")).unwrap();
    assert_eq!(m.messages(Level::Volatile).count(), 2);
    assert_eq!(m.messages(Level::Working).count(), 0);
}

#[test]
fn between_compactions_every_payload_extends_the_previous_one() {
    let cfg = Config { trigger_percent: 90, low_water_percent: 50, ..config(2, 2000) };
    let mut m = manager_with(cfg);
    m.push(Message::system("rules")).unwrap();
    let mut previous: Vec<String> = Vec::new();
    let (mut compactions, mut extended) = (0, 0);
    for i in 0..120 {
        let before = m.stats().counters.compactions;
        m.push(Message::user(&format!("question {i} {}", "word ".repeat(15)))).unwrap();
        m.push(Message::assistant(&format!("answer {i} {}", "text ".repeat(15)))).unwrap();
        m.drain_outbox(|_| {});
        let payload = m.compose(&["task: answer"]).unwrap();
        assert!(payload.tokens() <= 2000);
        let now: Vec<String> = payload.history().map(|h| h.content().to_string()).collect();
        let grew = now.len() >= previous.len() && now[..previous.len()] == previous[..];
        let compacted = m.stats().counters.compactions > before;
        assert!(grew || compacted, "turn {i}: the history changed without a compaction");
        if compacted {
            compactions += 1;
            assert!(m.used() <= 1000 + 200, "compacted to the low-water mark: {}", m.used());
        } else if i > 0 {
            extended += 1;
        }
        previous = now;
    }
    let counters = m.stats().counters;
    assert_eq!(counters.composes, 120);
    assert_eq!(counters.composes_extending, extended);
    assert!(compactions > 3 && extended > 90, "{compactions} compactions, {extended} extended");
    assert!(counters.cached_permille() > 700, "{counters:?}");
}

#[test]
fn per_push_eviction_breaks_the_prefix_at_every_push_once_full() {
    let cfg = Config { trigger_percent: 80, low_water_percent: 80, ..config(2, 2000) };
    let mut m = manager_with(cfg);
    for i in 0..120 {
        m.push(Message::user(&format!("question {i} {}", "word ".repeat(15)))).unwrap();
        m.push(Message::assistant(&format!("answer {i} {}", "text ".repeat(15)))).unwrap();
        m.drain_outbox(|_| {});
        m.compose(&[]).unwrap();
    }
    assert!(m.stats().counters.extending_permille() < 300, "{:?}", m.stats().counters);
}

#[test]
fn dynamic_context_can_sit_before_the_newest_user_message() {
    let cfg = Config {
        dynamic_placement: ctxwin_core::DynamicPlacement::BeforeNewestUser,
        ..config(2, 4000)
    };
    let mut m = manager_with(cfg);
    m.push(Message::system("rules")).unwrap();
    m.push(Message::user("first")).unwrap();
    m.push(Message::assistant("one")).unwrap();
    m.push(Message::user("second")).unwrap();
    let kinds: Vec<String> = m
        .compose(&["task"])
        .unwrap()
        .items()
        .map(|item| match item {
            PayloadItem::System(s) => s.content().to_string(),
            PayloadItem::Dynamic(d) => format!("dynamic {d}"),
            PayloadItem::Message(h) => h.content().to_string(),
            _ => "other".to_string(),
        })
        .collect();
    assert_eq!(kinds, ["rules", "first", "one", "dynamic task", "second"]);
    // A new dynamic text each turn: the history before the newest user message stays cached.
    m.push(Message::assistant("two")).unwrap();
    m.push(Message::user("third")).unwrap();
    m.compose(&["another task"]).unwrap();
    assert_eq!(m.stats().counters.composes_extending, 1);
}

#[test]
fn small_windows_are_valid_by_default_and_impossible_ones_name_the_numbers() {
    for window in [2_048, 4_096, 8_000, 128_000] {
        let cfg = Config { context_window: window, ..Config::DEFAULT };
        assert!(cfg.validate().is_ok(), "{window}");
        assert!(cfg.budget() >= window / 2);
    }
    let fixed = Config { context_window: 8_000, fit_budgets: false, ..Config::DEFAULT };
    let message = fixed.validate().unwrap_err().to_string();
    assert!(message.contains("2000") && message.contains("3904"), "{message}");
}

fn manager_with(cfg: Config) -> ContextManager<Small> {
    ContextManager::with_config(cfg).unwrap()
}
