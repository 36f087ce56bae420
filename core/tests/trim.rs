//! `trim` against a manager.
//!
//! The property test pushes every generated conversation into a sliding-window
//! `ContextManager` configured the way `trim` defines its semantics: the whole budget is
//! the payload (`reserved_for_reply` 0), the permanent level gets exactly what the pinned
//! messages cost, the working level everything else, the session and volatile levels
//! nothing, eviction from 100% with the low-water mark at 100% too and budgets taken as given
//! (`fit_budgets` off; so the manager evicts just enough to fit and its level
//! budgets do not bind), evicted units discarded, capacities that never bind. It then
//! composes and asserts that `trim` gives the same payload (the same messages, contents
//! reduced the same way, the same synthetic results, the same token count) or the same error.
//!
//! Where the two are allowed to differ, by construction, and what the test does about it:
//! with `Config::lock_newest_user` a manager keeps an *older* request that was locked
//! while the turn after it overflowed the budget, and only evicts it once the budget is
//! exceeded again; `trim` sees the final conversation only, where that request is not the
//! newest and leaves oldest-first. Such conversations are detected (after some push, the
//! manager's kept set has a gap right after a user message that is not the conversation's
//! newest: later evictions may hide the gap, not what it cost) and skipped. With
//! `UnansweredCalls::DropCalls`, a manager counted the calls it later drops while they
//! waited, and may have evicted units for them that the final conversation has room for:
//! there the test asserts that the manager's history is a suffix of `trim`'s (trim keeps at
//! least as much, never over the budget), the locked newest request aside: the manager may
//! keep it ahead of a gap, and `trim` must keep it somewhere before that suffix.

use proptest::prelude::*;

use ctxwin_core::capacity::{Capacities, Scratch};
use ctxwin_core::config::{Config, OutboxMode, UnansweredCalls};
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::entities::EntityTable;
use ctxwin_core::error::Error;
use ctxwin_core::manager::{ABORTED_RESULT, ContextManager};
use ctxwin_core::message::Message;
use ctxwin_core::payload::{Payload, PayloadItem};
use ctxwin_core::record::ToolCall;
use ctxwin_core::ring::Ring;
use ctxwin_core::role::Role;
use ctxwin_core::strategy::SlidingWindow;
use ctxwin_core::trim::{TrimError, TrimmedContent, TrimmedItem, trim};

struct Roomy;
impl Capacities for Roomy {
    type Permanent = Ring<8, 8_192>;
    type Session = Ring<4, 1_024>;
    type Working = Ring<512, 262_144>;
    type Volatile = Ring<4, 1_024>;
    type Scratch = Scratch<512>;
    type Entities = EntityTable<4, 32>;
}

/// Three counters: rounding down (`len / 4`), up, and by words.
#[derive(Clone, Copy, Debug)]
enum Counter {
    Down,
    Up,
    Words,
}

impl TokenCounter for Counter {
    fn count(&self, text: &str) -> u32 {
        match self {
            Counter::Down => (text.len() / 4) as u32,
            Counter::Up => text.len().div_ceil(4) as u32,
            Counter::Words => text.split_whitespace().count() as u32,
        }
    }
}

#[derive(Clone, Debug)]
enum Turn {
    User(usize),
    Assistant(usize),
    /// Calls (argument lengths) and results (call index, length; a length over 1,000 is
    /// reduced), in order.
    Calls(Vec<usize>, Vec<(usize, usize)>),
}

#[derive(Clone, Debug)]
struct Owned {
    role: Role,
    content: String,
    calls: Vec<(String, String, String)>,
    call_id: Option<String>,
}

fn text(len: usize, seed: usize) -> String {
    let words = ["ok ", "src/lib.rs ", "error: ", "line\n", "42 ", "parse_config ", "é "];
    let mut out = String::new();
    let mut i = seed;
    while out.len() < len {
        out.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

fn conversation(system: usize, turns: &[Turn]) -> Vec<Owned> {
    let mut out = Vec::new();
    let plain = |role, content| Owned { role, content, calls: vec![], call_id: None };
    for s in 0..system {
        out.push(plain(Role::System, text(40 + 30 * s, s)));
    }
    for (t, turn) in turns.iter().enumerate() {
        match turn {
            Turn::User(len) => out.push(plain(Role::User, text(*len, t))),
            Turn::Assistant(len) => out.push(plain(Role::Assistant, text(*len, t + 1))),
            Turn::Calls(calls, results) => {
                let calls: Vec<_> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, len)| (format!("c{t}_{i}"), "run".to_owned(), text(*len, i)))
                    .collect();
                let mut answered = vec![false; calls.len()];
                out.push(Owned {
                    role: Role::Assistant,
                    content: if t % 3 == 0 { text(20, t) } else { String::new() },
                    calls: calls.clone(),
                    call_id: None,
                });
                for &(pick, len) in results {
                    let index = pick % calls.len();
                    if !std::mem::replace(&mut answered[index], true) {
                        out.push(Owned {
                            role: Role::Tool,
                            content: text(len, pick),
                            calls: vec![],
                            call_id: Some(calls[index].0.clone()),
                        });
                    }
                }
            }
        }
    }
    out
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        3 => (0usize..300).prop_map(Turn::User),
        2 => (0usize..300).prop_map(Turn::Assistant),
        4 => (
            prop::collection::vec(0usize..60, 1..4),
            prop::collection::vec(
                (0usize..8, prop_oneof![4 => 0usize..400, 1 => 1_000usize..9_000]),
                0..4,
            ),
        )
            .prop_map(|(calls, results)| Turn::Calls(calls, results)),
    ]
}

/// A payload message as compared: role, content, call id, calls.
type Sent = (Role, String, Option<String>, Vec<String>);

type Outcome = (Result<(Vec<Sent>, u32), Error>, Result<(Vec<Sent>, u32), TrimError>, bool);

fn run(owned: &[Owned], config: &Config, counter: Counter) -> Outcome {
    let calls: Vec<Vec<ToolCall<'_>>> = owned
        .iter()
        .map(|m| m.calls.iter().map(|(i, n, a)| ToolCall::new(i, n, a)).collect())
        .collect();
    let messages: Vec<Message<'_>> = owned
        .iter()
        .zip(&calls)
        .map(|(m, c)| match &m.call_id {
            Some(id) => Message::tool_result(id, &m.content),
            None => Message::new(m.role, &m.content).with_tool_calls(c),
        })
        .collect();

    // The manager.
    let pinned: u32 = messages
        .iter()
        .take_while(|m| m.role == Role::System)
        .map(|m| counter.count(m.content) + u32::from(config.message_overhead))
        .sum::<u32>()
        .min(config.budget());
    let manager_config = Config {
        permanent_budget: pinned,
        session_budget: 0,
        working_budget: config.budget() - pinned,
        // Evict just enough at every push (no water-mark compaction), budgets taken as given.
        low_water_percent: 100,
        fit_budgets: false,
        ..*config
    };
    let mut manager = Box::new(
        ContextManager::<Roomy>::builder()
            .config(manager_config)
            .counter(counter)
            .strategy(SlidingWindow::new())
            .build()
            .expect("config"),
    );
    let sent_of = |payload: &Payload<'_>| -> Vec<Sent> {
        payload
            .items()
            .filter_map(|item| match item {
                PayloadItem::System(m) | PayloadItem::Message(m) => Some((
                    m.role(),
                    m.content().to_owned(),
                    m.tool_call_id().map(str::to_owned),
                    m.tool_calls().map(|c| c.id.to_owned()).collect(),
                )),
                _ => None,
            })
            .collect()
    };
    let mut refused = None;
    // A request locked while it was the newest may leave a gap that later evictions hide.
    let mut stale = false;
    for (pushed, message) in messages.iter().enumerate() {
        if let Err(error) = manager.push(*message) {
            refused = Some(error);
            break;
        }
        if config.lock_newest_user && !stale {
            if let Ok(payload) = manager.compose(&[]) {
                stale = stale_lock(owned, pushed + 1, &sent_of(&payload));
            }
        }
    }
    let from_manager = match refused {
        Some(error) => Err(error),
        None => manager.compose(&[]).map(|payload| (sent_of(&payload), payload.tokens())),
    };

    // trim.
    let from_trim = trim(&messages, &[], config, &counter).map(|kept| {
        let sent = kept
            .items()
            .map(|item| match item {
                TrimmedItem::Message { index, content, calls } => {
                    let m = messages[index];
                    let content = match content {
                        TrimmedContent::Plain(text) => text.to_owned(),
                        reduced => reduced.to_string(),
                    };
                    let ids = m
                        .tool_calls
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| calls & (1 << i) != 0)
                        .map(|(_, c)| c.id.to_owned())
                        .collect();
                    (m.role, content, m.tool_call_id.map(str::to_owned), ids)
                }
                TrimmedItem::Aborted { call_id } => {
                    (Role::Tool, ABORTED_RESULT.to_owned(), Some(call_id.to_owned()), vec![])
                }
            })
            .collect();
        (sent, kept.tokens())
    });

    // A stale locked request: a kept user message, not the newest, followed by a gap.
    let stale =
        stale || matches!(&from_manager, Ok((sent, _)) if stale_lock(owned, owned.len(), sent));
    (from_manager, from_trim, stale)
}

/// Whether `sent`, what a manager held after the first `pushed` messages of `owned`, keeps a
/// user message that is not the conversation's newest followed by a gap: a request locked
/// while it was the newest, which kept the manager from evicting it oldest first.
fn stale_lock(owned: &[Owned], pushed: usize, sent: &[Sent]) -> bool {
    let newest_user = owned.iter().rposition(|m| m.role == Role::User);
    let mut cursor = 0;
    let mut previous: Option<usize> = None;
    for (role, content, call_id, ids) in sent {
        if *role == Role::Tool && content == ABORTED_RESULT {
            continue;
        }
        let found = (cursor..pushed).find(|&i| {
            owned[i].role == *role
                && match call_id {
                    Some(id) => owned[i].call_id.as_deref() == Some(id),
                    None => {
                        owned[i].content == *content
                            && ids.iter().all(|id| owned[i].calls.iter().any(|c| c.0 == *id))
                    }
                }
        });
        let Some(index) = found else { break };
        if let Some(p) = previous {
            if index > p + 1 && owned[p].role == Role::User && Some(p) != newest_user {
                return true;
            }
        }
        previous = Some(index);
        cursor = index + 1;
    }
    false
}

/// Whether the assistant message at `index` has calls without results and a later message.
fn unanswered_then_more(owned: &[Owned], index: usize) -> bool {
    let m = &owned[index];
    if m.calls.is_empty() {
        return false;
    }
    let results = owned[index + 1..].iter().take_while(|r| r.role == Role::Tool).count();
    results < m.calls.len() && index + 1 + results < owned.len()
}

fn config() -> impl Strategy<Value = (Config, Counter)> {
    (
        (250u32..4_000, 0u16..6, 0u16..5, 0u16..5),
        (0u16..5, any::<bool>(), any::<bool>(), 32u32..600),
        prop_oneof![Just(Counter::Down), Just(Counter::Up), Just(Counter::Words)],
    )
        .prop_map(
            |((budget, message, request, call), (tail, lock_user, drop, limit), counter)| {
                let config = Config {
                    context_window: budget,
                    reserved_for_reply: 0,
                    permanent_budget: 0,
                    session_budget: 0,
                    working_budget: 0,
                    trigger_percent: 100,
                    locked_tail: tail,
                    observation_limit: limit,
                    message_overhead: message,
                    request_overhead: request,
                    tool_call_overhead: call,
                    lock_newest_user: lock_user,
                    unanswered_calls: if drop && cfg!(feature = "drop-calls") {
                        UnansweredCalls::DropCalls
                    } else {
                        UnansweredCalls::SynthesizeAborted
                    },
                    outbox: OutboxMode::Discard,
                    ..Config::DEFAULT
                };
                (config, counter)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn trim_keeps_what_a_manager_keeps(
        (config, counter) in config(),
        system in 0usize..3,
        turns in prop::collection::vec(turn(), 0..40),
    ) {
        let owned = conversation(system, &turns);
        let (manager, trimmed, stale) = run(&owned, &config, counter);
        prop_assume!(!stale);
        let dropped = config.unanswered_calls == UnansweredCalls::DropCalls
            && owned.windows(2).enumerate().any(|(i, _)| unanswered_then_more(&owned, i));
        match (&manager, &trimmed) {
            (Ok(expected), Ok(got)) if dropped => {
                // The manager counted the calls while they waited and may have evicted more.
                let pinned = expected.0.iter().take_while(|m| m.0 == Role::System).count();
                prop_assert_eq!(&expected.0[..pinned], &got.0[..pinned]);
                // A locked newest request may stand ahead of a gap in the manager's history;
                // trim keeps it too, ahead of at least as long a suffix.
                let rest = &expected.0[pinned..];
                let (request, suffix) = match rest.split_first() {
                    Some((first, after))
                        if config.lock_newest_user
                            && first.0 == Role::User
                            && after.iter().all(|m| m.0 != Role::User) =>
                    {
                        (Some(first), after)
                    }
                    _ => (None, rest),
                };
                prop_assert!(got.0.ends_with(suffix));
                if let Some(request) = request {
                    let before = got.0.len() - suffix.len();
                    prop_assert!(got.0[pinned..before].contains(request));
                }
                prop_assert!(got.1 >= expected.1 && got.1 <= config.budget());
            }
            (Ok(expected), Ok(got)) => prop_assert_eq!(expected, got),
            (
                Err(Error::PinnedOverBudget { .. }),
                Err(TrimError::Refused { error: Error::PinnedOverBudget { .. }, .. }),
            ) => {}
            (
                Err(Error::ToolCallsPending { unanswered: a }),
                Err(TrimError::Refused { error: Error::ToolCallsPending { unanswered: b }, .. }),
            ) => prop_assert_eq!(a, b),
            // A manager refuses at push a message the walk never reached.
            (Err(Error::MessageTooLarge { .. }), _) => {}
            _ => prop_assert!(false, "manager {:?}\ntrim {:?}", manager, trimmed),
        }
    }
}

#[test]
fn a_lone_newest_request_is_kept_before_the_suffix() {
    let big = "word ".repeat(470);
    let conversation = [
        Message::system("sys"),
        Message::user("the request"),
        Message::assistant(&big),
        Message::assistant("newest"),
    ];
    let config = Config {
        context_window: 600,
        reserved_for_reply: 0,
        permanent_budget: 0,
        session_budget: 0,
        working_budget: 0,
        locked_tail: 1,
        ..Config::DEFAULT
    };
    let counter = Counter::Up;
    let kept = trim(&conversation, &[], &config, &counter).unwrap();
    assert_eq!(kept.indices().collect::<Vec<_>>(), [0, 1, 3]);
    assert_eq!(kept.lone_user(), Some(1));
    let unlocked = Config { lock_newest_user: false, ..config };
    let kept = trim(&conversation, &[], &unlocked, &counter).unwrap();
    assert_eq!(kept.indices().collect::<Vec<_>>(), [0, 3]);
}

#[test]
fn a_result_marked_whole_is_not_reduced_to_the_observation_limit() {
    let calls = [ToolCall::new("r", "read", "{}")];
    let file = "let x = 1;\n".repeat(400);
    let conversation = |whole: bool| {
        let result = Message::tool_result("r", &file);
        [
            Message::system("sys"),
            Message::user("read it"),
            Message::assistant("").with_tool_calls(&calls),
            if whole { result.whole() } else { result },
        ]
    };
    let config = Config { context_window: 32_768, observation_limit: 200, ..Config::DEFAULT };
    let counter = Counter::Up;
    let sent = |conversation: &[Message<'_>]| {
        let kept = trim(conversation, &[], &config, &counter).unwrap();
        let reduced = kept.items().any(|item| {
            matches!(item, TrimmedItem::Message { content: TrimmedContent::Reduced(_), .. })
        });
        (kept.indices().count(), reduced)
    };
    assert_eq!(sent(&conversation(false)), (4, true));
    assert_eq!(sent(&conversation(true)), (4, false));
}

#[test]
#[cfg(feature = "compaction-cut")]
fn a_compaction_limit_is_for_a_manager() {
    let conversation = [Message::user("hi")];
    let config = Config { compaction_limit: 200, ..Config::DEFAULT };
    let refused = trim(&conversation[..], &[], &config, &Counter::Up).map(|kept| kept.tokens());
    assert_eq!(
        refused,
        Err(TrimError::Unsupported(ctxwin_core::trim::Unsupported::CompactionLimit))
    );
    assert!(refused.unwrap_err().to_string().contains("compaction_limit"));
}

#[test]
#[cfg(feature = "compaction-cut")]
fn a_supersede_key_is_for_a_manager() {
    let calls = [ToolCall::new("c1", "read", "{}")];
    let conversation = [
        Message::user("read it"),
        Message::assistant("").with_tool_calls(&calls),
        Message::tool_result("c1", "fn main() {}").superseding(7),
    ];
    let refused = trim(&conversation[..], &[], &Config::DEFAULT, &Counter::Up).map(|k| k.tokens());
    assert_eq!(
        refused,
        Err(TrimError::Unsupported(ctxwin_core::trim::Unsupported::SupersedeKey(2)))
    );
    assert!(refused.unwrap_err().to_string().contains("supersede key"));
}
