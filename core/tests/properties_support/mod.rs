//! The property model shared by `properties.rs` and `snapshot.rs`: random operations and
//! configurations, and a harness that checks invariants over random operation sequences,
//! configurations and capacities:
//! (a) a payload never exceeds the budget; (b) never holds a result without its call or a call
//! without all its results; (c) permanent content is never evicted; (d) the newest K messages
//! stay live unless the budget cannot hold them (the newest never leaves); (e) every message
//! is live, waiting in the outbox, or drained exactly once;
//! and a refused operation changes nothing but (for `OutboxFull`) evictions.
// Each test file uses a subset of these.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashSet};

use proptest::prelude::*;

use ctxwin_core::{
    Capacities, Config, ContextManager, Error, Level, Message, OpenAiRequest, OutboxMode,
    PayloadItem, Role, StrategyKind, ToolCall, UnansweredCalls, counter::TokenCounter, ring::Ring,
};

pub struct Tight;
impl Capacities for Tight {
    type Permanent = Ring<4, 1024>;
    type Session = Ring<4, 1024>;
    type Working = Ring<24, 4096>;
    type Volatile = Ring<8, 2048>;
    type Scratch = ctxwin_core::capacity::Scratch<512>;
    type Entities = ctxwin_core::entities::EntityTable<4, 32>;
}

#[derive(Clone, Debug)]
pub enum Op {
    User { len: usize, volatile: bool },
    Assistant { len: usize, volatile: bool },
    Calls { count: u8, args: usize, volatile: bool, empty: bool },
    Result { pick: usize, len: usize, bogus: bool },
    System { len: usize },
    ToolDefinition,
    Summary { len: usize },
    Compose { dynamic: usize },
    Drain,
    Abort,
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..400, prop::bool::weighted(0.2)).prop_map(|(len, volatile)| Op::User { len, volatile }),
        5 => (0usize..600, prop::bool::weighted(0.2)).prop_map(|(len, volatile)| Op::Assistant { len, volatile }),
        4 => (1u8..5, 0usize..80, prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(count, args, volatile, empty)| Op::Calls { count, args, volatile, empty }),
        8 => (any::<usize>(), prop_oneof![0usize..300, 1000usize..6000], prop::bool::weighted(0.1))
            .prop_map(|(pick, len, bogus)| Op::Result { pick, len, bogus }),
        1 => (0usize..300).prop_map(|len| Op::System { len }),
        1 => Just(Op::ToolDefinition),
        1 => (1usize..300).prop_map(|len| Op::Summary { len }),
        3 => (0usize..400).prop_map(|dynamic| Op::Compose { dynamic }),
        3 => Just(Op::Drain),
        1 => Just(Op::Abort),
    ]
}

pub fn config() -> impl Strategy<Value = Config> {
    let policies =
        (any::<bool>(), prop::bool::weighted(0.2), prop_oneof![Just(0u32), 3u32..30], 32u32..600);
    let strategy = (0usize..5, 1u16..6, 1u16..4, 1u64..4, any::<bool>());
    // Low-water marks from 0 (compact to the locked tail) to 100 (per-push eviction, as
    // before water marks), and level budgets as given or fitted to the window.
    let marks = (50u8..=100, prop_oneof![Just(100u8), 0u8..=100], any::<bool>());
    (300u32..6000, 0u16..8, marks, policies, strategy).prop_map(
        |(
            budget,
            tail,
            (trigger, low_water, fit_budgets),
            (drop_calls, discard, max_messages, observation_limit),
            strategy,
        )| {
            let (kind, threshold, batch, minutes, entities) = strategy;
            Config {
                context_window: budget + 256,
                reserved_for_reply: 256,
                permanent_budget: budget / 6,
                session_budget: budget / 6,
                working_budget: budget / 2,
                trigger_percent: trigger,
                locked_tail: tail,
                max_messages,
                observation_limit,
                unanswered_calls: if drop_calls && cfg!(feature = "drop-calls") {
                    UnansweredCalls::DropCalls
                } else {
                    UnansweredCalls::SynthesizeAborted
                },
                outbox: if discard { OutboxMode::Discard } else { OutboxMode::Hold },
                strategy: StrategyKind::ALL[kind],
                summarize_threshold: threshold,
                summarize_batch: batch,
                summary_tokens: 48,
                importance_threshold: 300,
                // Steps are the clock (one per op), so ages of a few steps compress often.
                working_age_ms: minutes,
                session_age_ms: minutes * 3,
                entity_schema: if entities && cfg!(feature = "entities") {
                    ctxwin_core::EntitySchema::new(&["value", "decision", "k"]).unwrap_or_default()
                } else {
                    ctxwin_core::EntitySchema::EMPTY
                },
                low_water_percent: low_water,
                fit_budgets,
                ..Config::DEFAULT
            }
        },
    )
}

const WORDS: [&str; 14] = [
    "error",
    "src/main.rs",
    "42",
    "the",
    "decision",
    "cargo",
    "test",
    "é",
    "日本",
    "{\"k\":1}",
    "\n",
    "value",
    "\nvalue: 42",
    "decision = ship friday;",
];

pub fn text(seed: usize, len: usize) -> String {
    let mut out = String::new();
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// What the harness knows independently of the manager.
#[derive(Clone, Default)]
pub struct Model {
    /// Call ids of the unit waiting for results.
    pending: Vec<String>,
    /// Whether the pending unit's assistant message is empty (DropCalls may remove it).
    pending_empty: bool,
    pending_answered: usize,
    permanent: Vec<u64>,
    pushed: BTreeSet<u64>,
    /// History ids ever seen (live, in the outbox, or drained).
    history: BTreeSet<u64>,
    drained: HashSet<u64>,
    /// History ids known to have left (evicted or removed with dropped calls).
    gone: HashSet<u64>,
    removed_by_drop: u64,
    next_call: usize,
    /// Summaries pushed: they may be superseded (merged, rewritten) without the outbox.
    summaries: HashSet<u64>,
    /// Tokens of the dynamic context of the last operation (a compose), 0 for the others.
    dynamic: u32,
}

/// Checks that `history` pairs every call with all its results and nothing else; with
/// `open_end`, the last unit may still wait for results.
pub fn assert_pairs<'a>(
    history: impl Iterator<Item = ctxwin_core::MessageRef<'a>>,
    open_end: bool,
) {
    let mut open: Option<Vec<&str>> = None;
    for message in history {
        if message.role() == Role::Tool {
            let open = open.as_mut().expect("tool result without its call");
            let id = message.tool_call_id().unwrap();
            let at = open.iter().position(|c| *c == id).expect("result for a call not in its unit");
            open.remove(at);
        } else {
            assert!(open.take().is_none_or(|rest| rest.is_empty()), "call without all its results");
            if message.tool_call_count() > 0 {
                open = Some(message.tool_calls().map(|c| c.id).collect());
            }
        }
    }
    assert!(
        open_end || open.is_none_or(|rest| rest.is_empty()),
        "call without all its results at the end"
    );
}

pub struct Snapshot {
    used: u32,
    pushed: u64,
    summaries: u64,
    ids: Vec<u64>,
}

pub fn observe<C: Capacities, K: TokenCounter>(manager: &ContextManager<C, K>) -> Snapshot {
    Snapshot {
        used: manager.used(),
        pushed: manager.stats().counters.messages_pushed,
        summaries: manager.stats().counters.summaries_added,
        ids: Level::ALL.iter().flat_map(|&l| manager.messages(l).map(|m| m.id())).collect(),
    }
}

impl Model {
    fn push_history(&mut self, result: &Result<u64, Error>) {
        if result.is_ok() {
            if !self.pending.is_empty() && self.pending_empty && self.pending_answered == 0 {
                self.removed_by_drop += 1;
            }
            self.pending.clear();
        }
    }

    /// Applies `op`, checking what the op itself promises.
    pub fn apply<C: Capacities>(&mut self, manager: &mut ContextManager<C>, op: &Op, step: usize) {
        let before = observe(manager);
        self.dynamic = 0;
        let drop_calls = manager.config().unanswered_calls == UnansweredCalls::DropCalls;
        let result: Result<u64, Error> = match op {
            Op::User { len, volatile } | Op::Assistant { len, volatile } => {
                let content = text(step, *len);
                let mut message = match op {
                    Op::User { .. } => Message::user(&content),
                    _ => Message::assistant(&content),
                };
                if *volatile {
                    message = message.in_level(Level::Volatile);
                }
                let result = manager.push(message.at(step as u64));
                if drop_calls {
                    self.push_history(&result)
                } else if result.is_ok() {
                    self.pending.clear()
                }
                result
            }
            Op::Calls { count, args, volatile, empty } => {
                let ids: Vec<String> =
                    (0..*count).map(|i| format!("call_{}_{i}", self.next_call)).collect();
                self.next_call += 1;
                let arguments = text(step, *args);
                let calls: Vec<ToolCall<'_>> =
                    ids.iter().map(|id| ToolCall::new(id, "tool", &arguments)).collect();
                let content = if *empty { String::new() } else { text(step, 20) };
                let mut message = Message::assistant(&content).with_tool_calls(&calls);
                if *volatile {
                    message = message.in_level(Level::Volatile);
                }
                let result = manager.push(message);
                if drop_calls {
                    self.push_history(&result)
                } else if result.is_ok() {
                    self.pending.clear()
                }
                if result.is_ok() {
                    self.pending = ids.clone();
                    self.pending_empty = *empty;
                    self.pending_answered = 0;
                }
                result
            }
            Op::Result { pick, len, bogus } => {
                let content = text(step, *len);
                let id = if *bogus || self.pending.is_empty() {
                    "no_such_call".to_string()
                } else {
                    self.pending[pick % self.pending.len()].clone()
                };
                let result = manager.push(Message::tool_result(&id, &content));
                if id == "no_such_call" {
                    assert_eq!(result, Err(Error::OrphanToolResult));
                } else {
                    assert!(
                        !matches!(
                            result,
                            Err(Error::OrphanToolResult | Error::DuplicateToolResult)
                        ),
                        "{result:?}"
                    );
                    if result.is_ok() {
                        self.pending.retain(|p| *p != id);
                        self.pending_answered += 1;
                    }
                }
                result
            }
            Op::System { len } => {
                let result = manager.push(Message::system(&text(step, *len)));
                if let Ok(id) = result {
                    self.permanent.push(id);
                }
                result
            }
            Op::ToolDefinition => {
                let result = manager
                    .add_tool_definition(r#"{"name":"tool","parameters":{"type":"object"}}"#);
                if let Ok(id) = result {
                    self.permanent.push(id);
                }
                result
            }
            Op::Summary { len } => {
                let result =
                    manager.add_summary(&text(step, *len), &[(1, step as u64)], step as u64);
                if let Ok(id) = result {
                    self.summaries.insert(id);
                }
                result
            }
            Op::Compose { dynamic } => {
                self.compose(manager, *dynamic, step);
                return;
            }
            Op::Drain => {
                self.drain(manager);
                return;
            }
            Op::Abort => {
                let result = manager.abort_pending_calls().map(|()| 0);
                if drop_calls {
                    self.push_history(&result)
                } else if result.is_ok() {
                    self.pending.clear()
                }
                if result.is_err() {
                    assert!(matches!(
                        result,
                        Err(Error::OutboxFull { .. } | Error::LevelFull { .. })
                    ));
                }
                return;
            }
        };
        match result {
            Ok(id) => {
                self.pushed.insert(id);
            }
            Err(Error::OutboxFull { .. }) => {
                // Evicting may leave summaries behind; the refused message itself is not stored.
                let counters = manager.stats().counters;
                assert_eq!(
                    counters.messages_pushed - counters.summaries_added,
                    before.pushed - before.summaries,
                    "OutboxFull stored the message"
                );
            }
            Err(error) => {
                let after = observe(manager);
                assert_eq!(
                    (after.used, after.pushed, &after.ids),
                    (before.used, before.pushed, &before.ids),
                    "{error}"
                );
            }
        }
    }

    fn compose<C: Capacities>(&mut self, manager: &mut ContextManager<C>, len: usize, step: usize) {
        let budget = manager.budget();
        let overhead = u32::from(manager.config().message_overhead);
        let request_overhead = u32::from(manager.config().request_overhead);
        let dynamic_text = text(step, len);
        let dynamic = [dynamic_text.as_str()];
        let dynamic: &[&str] = if len == 0 { &[] } else { &dynamic };
        let unanswered = manager.unanswered_calls();
        let counter = *manager.counter();
        self.dynamic = dynamic.iter().map(|text| counter.count(text) + overhead).sum();
        match manager.compose(dynamic) {
            Ok(payload) => {
                assert_eq!(unanswered, 0);
                assert!(payload.tokens() <= budget, "{} > {budget}", payload.tokens());
                let mut sum = 0u32;
                for item in payload.items() {
                    sum += match item {
                        PayloadItem::System(m)
                        | PayloadItem::ToolDefinition(m)
                        | PayloadItem::Message(m) => m.tokens(),
                        PayloadItem::Dynamic(text) => counter.count(text) + overhead,
                        PayloadItem::Entities(entities) => {
                            let pairs = entities.iter().map(|(k, v)| {
                                counter.count(k) + v.map_or(1, |v| counter.count(v)) + 3
                            });
                            counter.count(ctxwin_core::payload::ENTITIES_PREFIX)
                                + 2
                                + pairs.sum::<u32>()
                                + overhead
                        }
                        PayloadItem::MemorySummary(summary) => {
                            counter.count(ctxwin_core::payload::MEMORY_SUMMARY_PREFIX)
                                + overhead
                                + summary.entries().map(|e| e.tokens()).sum::<u32>()
                        }
                    };
                }
                if sum > 0 {
                    sum += request_overhead;
                }
                assert_eq!(sum, payload.tokens(), "payload tokens add up");
                assert_pairs(payload.history(), false);
                let mut body = vec![0u8; 64 * 1024];
                let len = payload.write_openai(&mut body[..], OpenAiRequest::default()).unwrap();
                let json: serde_json::Value = serde_json::from_slice(&body[..len]).unwrap();
                let messages = json["messages"].as_array().unwrap();
                assert_eq!(
                    messages.len(),
                    payload
                        .items()
                        .filter(|i| !matches!(i, PayloadItem::ToolDefinition(_)))
                        .count()
                );
            }
            Err(Error::ToolCallsPending { unanswered: n }) => assert_eq!(n, unanswered),
            Err(Error::PinnedOverBudget { needed, budget: b, .. }) => {
                assert!(needed > b);
                assert_eq!(b, budget);
            }
            Err(other) => panic!("compose: {other}"),
        }
    }

    fn drain<C: Capacities>(&mut self, manager: &mut ContextManager<C>) {
        let mut units = Vec::new();
        manager.drain_outbox(|unit| {
            assert!(!unit.is_empty());
            assert_pairs(unit.messages(), false);
            units.push(unit.messages().map(|m| (m.id(), m.level())).collect::<Vec<_>>());
        });
        for (id, level) in units.into_iter().flatten() {
            assert!(self.drained.insert(id), "message {id} drained twice");
            if level.is_history() {
                self.history.insert(id);
            }
        }
    }

    /// Checks the invariants that hold between operations.
    pub fn check<C: Capacities>(&mut self, manager: &ContextManager<C>) {
        let stats = manager.stats();
        let hold = manager.config().outbox == OutboxMode::Hold;
        let live: u64 = stats.levels.iter().map(|l| u64::from(l.messages)).sum();
        assert_eq!(
            stats.counters.messages_pushed,
            live + stats.counters.messages_evicted
                + self.removed_by_drop
                + stats.counters.summaries_replaced,
            "every message is live, evicted, removed with its dropped calls, or a superseded summary"
        );
        for id in &self.permanent {
            assert!(manager.get(*id).is_some(), "permanent message {id} lost");
        }
        let mut waiting = HashSet::new();
        for unit in manager.outbox() {
            for message in unit.messages() {
                waiting.insert(message.id());
                if message.level().is_history() {
                    self.history.insert(message.id());
                }
            }
        }
        for message in manager.history() {
            self.history.insert(message.id());
        }
        if hold {
            for id in self.pushed.iter().chain(self.history.iter()) {
                if self.summaries.contains(id) {
                    continue;
                }
                let live = manager.get(*id).is_some();
                let accounted =
                    live as u8 + waiting.contains(id) as u8 + self.drained.contains(id) as u8;
                assert!(
                    accounted == 1 || (accounted == 0 && self.removed_by_drop > 0),
                    "message {id}: {accounted}"
                );
            }
            // A message that left during this operation was not among the newest K then.
            let tail = usize::from(manager.config().locked_tail);
            let removed: HashSet<u64> = self
                .history
                .iter()
                .filter(|id| {
                    manager.get(**id).is_none()
                        && !waiting.contains(id)
                        && !self.drained.contains(id)
                })
                .copied()
                .collect();
            let newest: Vec<u64> = self
                .history
                .iter()
                .rev()
                .filter(|id| !removed.contains(id))
                .take(tail)
                .copied()
                .collect();
            // The locked tail gives way only to the budget: had what left in this operation
            // stayed (whole units, volatile ones first), its payload would have been over the
            // budget. The newest message never leaves.
            let mut left = HashSet::new();
            let mut left_tail = HashSet::new();
            for id in &self.history {
                if manager.get(*id).is_none() && self.gone.insert(*id) {
                    assert!(
                        tail == 0 || newest.first() != Some(id),
                        "the newest message {id} left"
                    );
                    left.insert(*id);
                    if !removed.contains(id) && newest.contains(id) {
                        left_tail.insert(*id);
                    }
                }
            }
            if !left_tail.is_empty() {
                let units: u32 = manager
                    .outbox()
                    .filter(|unit| unit.messages().any(|m| left.contains(&m.id())))
                    .map(|unit| unit.tokens())
                    .sum();
                let overhead = u32::from(manager.config().request_overhead);
                assert!(
                    manager.used() + units + self.dynamic + overhead > manager.budget(),
                    "messages {left_tail:?} left from the newest {tail} though {} + {units} fit {}",
                    manager.used(),
                    manager.budget()
                );
            }
        }
        assert_pairs(manager.history(), manager.unanswered_calls() > 0);
        let history: Vec<u64> = manager.history().map(|m| m.id()).collect();
        assert!(history.windows(2).all(|w| w[0] < w[1]), "history out of order");
    }
}
