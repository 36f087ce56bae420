//! Task relevance in the importance score (issue 30, item 6): while a task runs, a unit that
//! speaks to its goal (lexically, or by the relevance a caller supplied) outlives an equally
//! old one that does not; without a running task nothing changes.
#![cfg(feature = "tasks")]

use ctxwin_core::{Config, ContextManager, DefaultCapacities, Message, StrategyKind};
use proptest::prelude::*;

type Manager = ContextManager<DefaultCapacities>;

const MINUTE: u64 = 60_000;

/// The importance strategy, choosing one victim per push (both water marks at 80%).
fn manager() -> Manager {
    let config = Config {
        strategy: StrategyKind::Importance,
        locked_tail: 1,
        working_budget: 400,
        trigger_percent: 80,
        low_water_percent: 80,
        ..Config::DEFAULT
    };
    Manager::with_config(config).unwrap()
}

/// Pushes `first` and `second` at the same time, a request that names neither ("go on": no
/// content words), then filler that mentions neither (shorter than either, so a push evicts
/// at most one of them), until one of the two leaves. Returns which left first: 0 for
/// `first`, 1 for `second`.
fn first_to_leave(m: &mut Manager, first: &str, second: &str, supply: Option<u16>) -> usize {
    let ids = [
        m.push(Message::assistant(first).at(0)).unwrap(),
        m.push(Message::assistant(second).at(0)).unwrap(),
    ];
    if let Some(relevance) = supply {
        assert_eq!(m.set_task_relevance(&[(ids[1], relevance)]).unwrap(), 1);
    }
    m.push(Message::user("go on").at(MINUTE)).unwrap();
    for i in 0..200u64 {
        let gone: Vec<usize> = (0..2).filter(|&k| m.get(ids[k]).is_none()).collect();
        match gone.as_slice() {
            [] => {}
            [one] => return *one,
            both => panic!("both left in one push: {both:?}"),
        }
        m.push(Message::assistant(&format!("step {i}: ok")).at((2 + i) * MINUTE)).unwrap();
    }
    panic!("neither left");
}

const ON_TOPIC: &str = "The tokenizer in src/lexer.rs drops tabs before keywords";
const OFF_TOPIC: &str = "The staging database backups finish nightly at three";

#[test]
fn a_unit_relevant_to_the_running_task_outlives_an_equally_old_irrelevant_one() {
    // Without a task the two tie (no word of the request in either): the older leaves first.
    let mut plain = manager();
    assert_eq!(first_to_leave(&mut plain, ON_TOPIC, OFF_TOPIC, None), 0);
    // With a task about the tokenizer, the unit about it stays and the other leaves.
    let mut tasked = manager();
    tasked.start_task("fix the tokenizer in src/lexer.rs", 0).unwrap();
    assert_eq!(first_to_leave(&mut tasked, ON_TOPIC, OFF_TOPIC, None), 1);
}

#[test]
fn a_finished_tasks_goal_no_longer_counts() {
    let mut m = manager();
    m.start_task("fix the tokenizer in src/lexer.rs", 0).unwrap();
    m.finish_task("done", 0).unwrap();
    assert_eq!(first_to_leave(&mut m, ON_TOPIC, OFF_TOPIC, None), 0);
}

#[test]
fn a_supplied_relevance_keeps_a_unit_that_shares_no_word_with_the_goal() {
    // "Speed up the build" and sccache share no word: only a supplied (semantic) relevance
    // tells them apart.
    let sccache = "Enabling sccache halves compile times on this machine";
    let mut lexical = manager();
    lexical.start_task("speed up the build", 0).unwrap();
    assert_eq!(first_to_leave(&mut lexical, sccache, OFF_TOPIC, None), 0, "a tie: oldest first");
    let mut supplied = manager();
    supplied.start_task("speed up the build", 0).unwrap();
    // The second unit (the backups) is the one said to be relevant here.
    assert_eq!(first_to_leave(&mut supplied, OFF_TOPIC, sccache, Some(900)), 0);
    let mut low = manager();
    low.start_task("speed up the build", 0).unwrap();
    assert_eq!(first_to_leave(&mut low, OFF_TOPIC, sccache, Some(0)), 0, "no relevance: a tie");
}

#[test]
fn supplied_relevance_needs_a_running_task_and_a_new_task_forgets_it() {
    let mut m = manager();
    let before = m.push(Message::assistant("outside any task").at(0)).unwrap();
    assert_eq!(m.set_task_relevance(&[(before, 500)]), Err(ctxwin_core::Error::NoOpenTask));
    m.start_task("one", 0).unwrap();
    let inside = m.push(Message::assistant("inside").at(0)).unwrap();
    // Messages outside the running task, unknown ids and values over 1000.
    assert_eq!(m.set_task_relevance(&[(before, 500), (inside, 5000), (999, 1)]).unwrap(), 1);
    assert_eq!(m.task_relevance(inside), Some(1000));
    assert_eq!(m.task_relevance(before), None);
    m.start_task("two", 0).unwrap();
    assert_eq!(m.task_relevance(inside), None);
}

/// Content words of goals, and of filler, from disjoint vocabularies.
const GOAL_WORDS: [&str; 8] =
    ["tokenizer", "parser", "lexer", "keywords", "grammar", "scanner", "indent", "unicode"];
const OTHER_WORDS: [&str; 8] =
    ["database", "backups", "staging", "nightly", "invoice", "holiday", "printer", "weather"];

fn words(pool: &'static [&'static str], picks: Vec<usize>) -> String {
    picks.into_iter().map(|i| pool[i % pool.len()]).collect::<Vec<_>>().join(" ")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the words and the order, the unit that shares the goal's words outlives the
    /// equally old one that shares none; the same pushes without a task evict the older first.
    #[test]
    fn relevance_to_the_running_task_decides_between_equals(
        goal in prop::collection::vec(0usize..8, 1..4),
        filler in prop::collection::vec(0usize..8, 2..8),
        relevant_first in any::<bool>(),
    ) {
        let goal_text = words(&GOAL_WORDS, goal.clone());
        // Both longer than a filler message, so one push evicts at most one of them.
        let on_topic = format!("{} {} noted for later", words(&OTHER_WORDS, filler.clone()), goal_text);
        let off_topic = format!("{} noted for later reference", words(&OTHER_WORDS, filler));
        let (first, second) =
            if relevant_first { (&on_topic, &off_topic) } else { (&off_topic, &on_topic) };
        let mut tasked = manager();
        tasked.start_task(&goal_text, 0).unwrap();
        let left = first_to_leave(&mut tasked, first, second, None);
        prop_assert_eq!(left == 0, !relevant_first, "the on-topic unit left first");
        let mut plain = manager();
        prop_assert_eq!(first_to_leave(&mut plain, first, second, None), 0);
    }

    /// Without a running task (the one started finished), the importance strategy evicts
    /// exactly as a manager that never had a task.
    #[test]
    fn without_a_running_task_nothing_changes(
        texts in prop::collection::vec(prop::collection::vec(0usize..8, 1..10), 10..40),
        goal in prop::collection::vec(0usize..8, 1..4),
    ) {
        let mut plain = manager();
        let mut other = manager();
        other.start_task(&words(&GOAL_WORDS, goal), 0).unwrap();
        other.finish_task("", 0).unwrap();
        for (i, picks) in texts.into_iter().enumerate() {
            let text = format!("{} {}", words(&GOAL_WORDS, picks.clone()), words(&OTHER_WORDS, picks));
            let message = if i % 3 == 0 { Message::user(&text) } else { Message::assistant(&text) };
            let at = i as u64 * MINUTE;
            plain.push(message.at(at)).unwrap();
            other.push(message.at(at)).unwrap();
            let kept = |m: &Manager| m.history().map(|m| m.content().to_string()).collect::<Vec<_>>();
            prop_assert_eq!(kept(&plain), kept(&other));
        }
    }
}
