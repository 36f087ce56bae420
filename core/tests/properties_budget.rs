//! Issue 31: long generated agent histories (tasks of tool calls, outputs up to 16 KB, answers)
//! under every strategy and windows from the smallest the configuration accepts to 128k.
//! After every push and every compose:
//!
//! - the summaries stay within their level's budget;
//! - the state is within the budget, unless what cannot leave (the permanent level and the
//!   live request: the newest user message and the newest unit) is over it alone, with no
//!   summary and no other history left;
//! - `compose` succeeds whenever what it cannot leave out (permanent level, live request,
//!   dynamic context, framing) fits, and otherwise its error says exactly what that is.
//!
//! The live request is computed here from the public API, independently of the manager.

use proptest::prelude::*;

use ctxwin_core::counter::TokenCounter;
use ctxwin_core::error::Pinned;
use ctxwin_core::{
    Capacities, Config, ContextManager, EntitySchema, Error, Level, Message, OutboxMode,
    StrategyKind, ToolCall, capacity::Scratch, entities::EntityTable, payload, ring::Ring,
};

/// Room for a 128k window's history: the sizes of `ctxwin-std`'s server tier.
struct Server;
impl Capacities for Server {
    type Permanent = Ring<128, { 128 * 1024 }>;
    type Session = Ring<128, { 64 * 1024 }>;
    type Working = Ring<4096, { 1024 * 1024 }>;
    type Volatile = Ring<1024, { 256 * 1024 }>;
    type Scratch = Scratch<{ 16 * 1024 }>;
    type Entities = EntityTable<8, 256>;
}

type Manager = ContextManager<Server>;

const MINUTE: u64 = 60_000;

/// One task of a coding agent: the request, rounds of tool calls with their outputs, the
/// answer, and how much dynamic context the agent composes with.
#[derive(Clone, Debug)]
struct Task {
    ask: usize,
    rounds: Vec<Vec<usize>>,
    answer: usize,
    /// Rounds routed to the volatile level.
    volatile: bool,
    dynamic: usize,
}

fn task() -> impl Strategy<Value = Task> {
    let output = prop_oneof![8 => 20usize..1_500, 2 => 1_500usize..6_000, 1 => 6_000usize..16_000];
    let round = prop::collection::vec(output, 1..4);
    (
        prop_oneof![8 => 10usize..600, 1 => 600usize..4_000],
        prop::collection::vec(round, 0..4),
        10usize..1_200,
        prop::bool::weighted(0.15),
        prop_oneof![6 => Just(0usize), 3 => 1usize..400, 1 => 400usize..4_000],
    )
        .prop_map(|(ask, rounds, answer, volatile, dynamic)| Task {
            ask,
            rounds,
            answer,
            volatile,
            dynamic,
        })
}

/// Windows from 1 token (the smallest `Config` accepts) to 128k, spread over the scales.
fn window() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => 1u32..2_000,
        3 => 2_000u32..8_000,
        2 => 8_000u32..32_768,
        2 => 32_768u32..=131_072,
    ]
}

fn config() -> impl Strategy<Value = Config> {
    let marks = prop_oneof![Just((100u8, 50u8)), Just((80, 80)), Just((90, 30))];
    (
        window(),
        prop_oneof![Just(0u32), Just(4_096)],
        0usize..5,
        0u16..9,
        marks,
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(window, reply, kind, tail, (trigger, low), user, discard, entities)| {
            Config {
                context_window: window,
                reserved_for_reply: reply,
                strategy: StrategyKind::ALL[kind],
                locked_tail: tail,
                trigger_percent: trigger,
                low_water_percent: low,
                lock_newest_user: user,
                outbox: if discard { OutboxMode::Discard } else { OutboxMode::Hold },
                entity_schema: if entities && cfg!(feature = "entities") {
                    EntitySchema::new(&["branch", "error"]).unwrap_or_default()
                } else {
                    EntitySchema::EMPTY
                },
                ..Config::DEFAULT
            }
        })
}

/// [`config`], sometimes with results cut at a compaction and stored whole until then.
fn config_with_cuts() -> impl Strategy<Value = Config> {
    (config(), prop_oneof![3 => Just(0u32), 1 => 32u32..2_000], any::<bool>()).prop_map(
        |(config, cut, whole)| Config {
            compaction_limit: if cfg!(feature = "compaction-cut") { cut } else { 0 },
            observation_limit: if whole { u32::MAX } else { config.observation_limit },
            ..config
        },
    )
}

const WORDS: [&str; 24] = [
    "the",
    "handler",
    "src/orders/handlers.rs",
    "returns",
    "500",
    "error:",
    "decided",
    "to",
    "validate",
    "`cargo test orders`",
    "input",
    "before",
    "query",
    "tenant_42",
    "failed",
    "at",
    "line",
    "41",
    "ok.",
    "Ngozi",
    "owns",
    "billing.",
    "branch: fix-orders",
    "\n",
];

/// About `len` bytes of agent-ish text, different for every `seed`.
fn text(seed: usize, len: usize) -> String {
    let mut out = String::with_capacity(len + 32);
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i = i.wrapping_mul(2_654_435_761).wrapping_add(seed | 1) >> 3;
    }
    out
}

/// What the run reached, for the coverage test.
#[derive(Clone, Copy, Debug, Default)]
struct Reached {
    composes: u64,
    refused: u64,
    merges: u64,
    session_drops: u64,
    over_pinned: u64,
    summaries: u64,
}

/// Tokens of the live request: the units (a message and the results after it, in id order)
/// holding the newest message (with a locked tail at all) or the newest user message, and the
/// unit still waiting for results.
fn live_tokens(manager: &Manager) -> u32 {
    let config = manager.config();
    let history: Vec<_> = manager.history().collect();
    let from_id = match config.locked_tail {
        0 => u64::MAX,
        _ => history.last().map_or(0, |m| m.id()),
    };
    let user = history
        .iter()
        .rev()
        .find(|m| m.role() == ctxwin_core::Role::User)
        .map(|m| m.id())
        .filter(|_| config.lock_newest_user);
    let mut units: Vec<(bool, u32)> = Vec::new();
    for message in &history {
        let locked = message.id() >= from_id || Some(message.id()) == user;
        match units.last_mut() {
            Some(unit) if message.role() == ctxwin_core::Role::Tool => {
                unit.0 |= locked;
                unit.1 += message.tokens();
            }
            _ => units.push((locked, message.tokens())),
        }
    }
    if manager.unanswered_calls() > 0 {
        if let Some(last) = units.last_mut() {
            last.0 = true;
        }
    }
    units.iter().filter(|(locked, _)| *locked).map(|(_, tokens)| tokens).sum()
}

fn history_tokens(manager: &Manager) -> u32 {
    manager.level_tokens(Level::Working) + manager.level_tokens(Level::Volatile)
}

/// Tokens of the memory-summary block's framing when the session level is not empty.
fn summary_framing(manager: &Manager) -> u32 {
    match manager.level_tokens(Level::Session) {
        0 => 0,
        _ => {
            manager.counter().count(payload::MEMORY_SUMMARY_PREFIX)
                + u32::from(manager.config().message_overhead)
        }
    }
}

/// The state between operations: summaries within their level's budget, and the whole
/// within the budget unless only what cannot leave is left (the locked tail gives way too).
fn check_state(manager: &Manager, reached: &mut Reached) {
    let session = manager.level_tokens(Level::Session);
    let level = manager.config().level_budget(Level::Session);
    assert!(session <= level, "summaries outgrew their level: {session} / {level}");
    let recounted: u32 = manager.history().map(|m| m.tokens()).sum();
    assert_eq!(history_tokens(manager), recounted, "the live totals are what the records cost");
    let (used, budget) = (manager.used(), manager.budget());
    if used > budget {
        reached.over_pinned += 1;
        assert_eq!(session, 0, "over the budget ({used} / {budget}) with summaries left");
        assert_eq!(
            history_tokens(manager),
            live_tokens(manager),
            "over the budget ({used} / {budget}) with more history than the live request"
        );
    }
}

/// Composes with `dynamic` bytes of dynamic context: it succeeds exactly when what it cannot
/// leave out fits, and its refusal names those tokens.
fn compose(manager: &mut Manager, seed: usize, dynamic: usize, reached: &mut Reached) {
    if manager.unanswered_calls() > 0 {
        // A refused result leaves its call waiting until the next message closes it.
        return;
    }
    let text = text(seed, dynamic);
    let dynamic: Vec<&str> = if dynamic == 0 { Vec::new() } else { vec![text.as_str()] };
    let overhead = u32::from(manager.config().message_overhead);
    let dynamic_tokens: u32 = dynamic.iter().map(|t| manager.counter().count(t) + overhead).sum();
    let permanent = manager.level_tokens(Level::Permanent);
    let live = live_tokens(manager);
    let stored: u32 = Level::ALL.iter().map(|&l| manager.level_tokens(l)).sum();
    // The entity block and the request overhead: whatever `used` counts besides the levels.
    let framing = manager.used().saturating_sub(stored + summary_framing(manager));
    let mut pinned = permanent + live + dynamic_tokens + framing;
    if framing == 0 && pinned > 0 {
        pinned += u32::from(manager.config().request_overhead);
    }
    let budget = manager.budget();
    reached.composes += 1;
    match manager.compose(&dynamic) {
        Ok(payload) => {
            assert!(pinned <= budget, "composed although {pinned} are pinned, over {budget}");
            assert!(payload.tokens() <= budget, "{} > {budget}", payload.tokens());
        }
        Err(Error::PinnedOverBudget { needed, budget: refused_at, pinned: parts }) => {
            reached.refused += 1;
            assert!(pinned > budget, "refused although only {pinned} of {budget} are pinned");
            assert_eq!(refused_at, budget);
            assert_eq!(needed, pinned);
            let expected = Pinned { permanent, live, dynamic: dynamic_tokens };
            assert_eq!(parts, expected);
        }
        Err(other) => panic!("compose: {other}"),
    }
    check_state(manager, reached);
}

fn drain(manager: &mut Manager, reached: &mut Reached) {
    manager.drain_outbox(|unit| {
        if unit.level() == Level::Session {
            reached.session_drops += 1;
        }
    });
}

/// Pushes, and checks the state whether the push was taken or refused (a refusal must be a
/// size the configuration cannot hold).
fn push(manager: &mut Manager, message: Message<'_>, reached: &mut Reached) -> bool {
    let result = manager.push(message);
    if let Err(error) = result {
        assert!(
            matches!(error, Error::MessageTooLarge { .. } | Error::LevelOverBudget { .. }),
            "push refused: {error}"
        );
    }
    drain(manager, reached);
    check_state(manager, reached);
    result.is_ok()
}

/// An empty manager on the heap: the value (about 1.8 MiB) is built on a thread with a stack
/// that holds the copies an unoptimized build makes before `Box::new` moves it.
fn boxed(config: Config) -> Box<Manager> {
    let stack = core::mem::size_of::<Manager>() * 8 + (1 << 20);
    let worker = std::thread::Builder::new().stack_size(stack);
    let built = worker.spawn(move || Box::new(Manager::with_config(config).unwrap())).unwrap();
    built.join().unwrap()
}

/// Runs `tasks` under `config`, checking after every push and compose.
fn run(config: Config, tasks: &[Task]) -> Reached {
    let mut manager = boxed(config);
    let mut reached = Reached::default();
    let mut clock = 1_700_000_000_000u64;
    let mut seed = 0usize;
    let mut next = |len: usize| {
        seed += 1;
        text(seed, len)
    };
    let system = next(300);
    push(&mut manager, Message::system(&system).at(clock), &mut reached);
    let tool = r#"{"name":"run_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}"#;
    if manager.add_tool_definition(tool).is_ok() {
        check_state(&manager, &mut reached);
    }
    for (number, task) in tasks.iter().enumerate() {
        clock += MINUTE;
        let ask = format!("Task {number}: {}", next(task.ask));
        push(&mut manager, Message::user(&ask).at(clock), &mut reached);
        compose(&mut manager, number, task.dynamic, &mut reached);
        for (round, outputs) in task.rounds.iter().enumerate() {
            clock += MINUTE;
            let ids: Vec<String> =
                (0..outputs.len()).map(|i| format!("call_{number}_{round}_{i}")).collect();
            let arguments = format!(r#"{{"cmd":"cargo test {}"}}"#, next(20).trim());
            let calls: Vec<ToolCall<'_>> =
                ids.iter().map(|id| ToolCall::new(id, "run_command", &arguments)).collect();
            let mut message = Message::assistant("Checking.").with_tool_calls(&calls).at(clock);
            if task.volatile {
                message = message.in_level(Level::Volatile);
            }
            if !push(&mut manager, message, &mut reached) {
                continue;
            }
            for (i, (id, &len)) in ids.iter().zip(outputs).enumerate() {
                let output = next(len);
                let result = Message::tool_result(id, &output).at(clock);
                // Half the tasks key their results: a compaction cuts superseded ones and
                // keeps the newest of each key ahead of older turns.
                #[cfg(feature = "compaction-cut")]
                let result =
                    result.superseding(if number % 2 == 0 { (i % 3) as u32 + 1 } else { 0 });
                #[cfg(not(feature = "compaction-cut"))]
                let _ = i;
                push(&mut manager, result, &mut reached);
            }
            compose(&mut manager, number + round, task.dynamic, &mut reached);
        }
        if number % 17 == 9 {
            // Tool definitions declared mid-session take room from the history at once.
            let extra = format!(
                r#"{{"name":"tool_{number}","description":"{}","parameters":{{"type":"object"}}}}"#,
                next(200).replace(['"', '\n', '`'], "")
            );
            if manager.add_tool_definition(&extra).is_ok() {
                drain(&mut manager, &mut reached);
                check_state(&manager, &mut reached);
            }
        }
        clock += MINUTE;
        let answer = next(task.answer);
        push(&mut manager, Message::assistant(&answer).at(clock), &mut reached);
        compose(&mut manager, number, task.dynamic, &mut reached);
    }
    let counters = manager.stats().counters;
    reached.merges = counters.summaries_merged;
    reached.summaries = counters.summaries_added;
    reached
}

/// Cases per run: each is a long history (the summarizing strategies' cases take seconds
/// unoptimized), so 16 unless `PROPTEST_CASES` asks for more.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(16)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn long_histories_stay_within_budget_and_compose(
        config in config_with_cuts(),
        tasks in prop::collection::vec(task(), 20..120),
    ) {
        run(config, &tasks);
    }
}

/// The property must reach what it claims: every strategy under windows of every scale, merges
/// and dropped summaries, states and composes at the limit of what cannot leave.
#[test]
fn long_histories_reach_merges_drops_and_refusals() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut total = Reached::default();
    let mut summaries = [0u64; 5];
    let mut large_windows = 0;
    for _ in 0..16 {
        let config = config().new_tree(&mut runner).unwrap().current();
        let tasks = prop::collection::vec(task(), 40..120).new_tree(&mut runner).unwrap().current();
        let reached = run(config, &tasks);
        summaries[config.strategy as usize] += reached.summaries;
        large_windows += u32::from(config.context_window >= 32_768 && reached.summaries > 0);
        total.composes += reached.composes;
        total.refused += reached.refused;
        total.merges += reached.merges;
        total.session_drops += reached.session_drops;
        total.over_pinned += reached.over_pinned;
    }
    for kind in [StrategyKind::Summarization, StrategyKind::Importance, StrategyKind::Hierarchical]
    {
        assert!(summaries[kind as usize] > 0, "{kind:?}: {summaries:?}");
    }
    assert!(large_windows > 0, "a window of 32k or more was passed and summarized");
    assert!(total.merges > 0 && total.session_drops > 0, "{total:?}");
    assert!(total.refused > 0 && total.over_pinned > 0, "{total:?}");
    assert!(total.refused * 10 < total.composes, "most composes succeed: {total:?}");
}
