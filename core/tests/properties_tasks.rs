//! Tasks never break the invariants (issue 30): random sessions of the shared property model
//! (`properties_support`) with task starts and finishes mixed in, under every strategy and
//! configuration. After every step the model's checks hold (budget of every payload, calls
//! paired with their results, the permanent level kept, the locked tail kept unless the
//! budget cannot hold it, every message live, waiting in the outbox or drained exactly once),
//! and so do the task table's: spans in order, only the newest open, a refused task operation
//! changes nothing, and the table survives a snapshot.
#![cfg(feature = "tasks")]

use ctxwin_core::{ContextManager, Error};
use proptest::prelude::*;

mod properties_support;
use properties_support::{Model, Op, Tight, config, op, text};

#[derive(Clone, Debug)]
enum Step {
    Op(Op),
    Start { goal: usize },
    Finish { outcome: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        14 => op().prop_map(Step::Op),
        1 => (0usize..120).prop_map(|goal| Step::Start { goal }),
        1 => (0usize..60).prop_map(|outcome| Step::Finish { outcome }),
    ]
}

type Manager = ContextManager<Tight>;

/// Applies a task step, checking what it promises: a refusal changes nothing.
fn task_step(manager: &mut Manager, step: &Step, at: usize) {
    let used = manager.used();
    let ids: Vec<u64> = manager.history().map(|m| m.id()).collect();
    let tasks_before = manager.tasks().to_vec();
    let unanswered = manager.unanswered_calls();
    let result = match step {
        Step::Start { goal } => manager.start_task(&text(at, *goal), at as u64).map(|_| ()),
        Step::Finish { outcome } => manager.finish_task(&text(at, *outcome), at as u64).map(|_| ()),
        Step::Op(_) => unreachable!(),
    };
    match result {
        Ok(()) => {
            assert_eq!(unanswered, 0);
            let newest = manager.tasks().last().copied().unwrap();
            match step {
                Step::Start { .. } => {
                    assert!(newest.is_open());
                    assert_eq!(newest.first_id(), manager.next_id());
                }
                _ => assert!(!newest.is_open()),
            }
        }
        Err(error) => {
            match error {
                Error::ToolCallsPending { unanswered: n } => assert_eq!(n, unanswered),
                Error::NoOpenTask => assert!(tasks_before.last().is_none_or(|t| !t.is_open())),
                other => panic!("task step refused: {other}"),
            }
            assert_eq!(manager.tasks(), &tasks_before[..]);
            assert_eq!(manager.used(), used);
            assert_eq!(manager.history().map(|m| m.id()).collect::<Vec<_>>(), ids);
        }
    }
}

fn check_tasks(manager: &Manager) {
    let tasks = manager.tasks();
    for pair in tasks.windows(2) {
        assert!(pair[0].number() < pair[1].number());
        assert!(!pair[0].is_open(), "only the newest task may be open");
        assert!(pair[0].last_id().is_none_or(|last| last < pair[1].first_id()));
    }
    for task in tasks {
        assert!(task.first_id() <= manager.next_id());
        assert!(task.goal().len() <= ctxwin_core::task::GOAL_BYTES);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn tasks_keep_the_invariants(config in config(), steps in prop::collection::vec(step(), 1..150)) {
        let mut manager = Manager::with_config(config).unwrap();
        let mut model = Model::default();
        for (at, step) in steps.iter().enumerate() {
            match step {
                Step::Op(op) => model.apply(&mut manager, op, at),
                _ => task_step(&mut manager, step, at),
            }
            model.check(&manager);
            check_tasks(&manager);
        }
        let mut buffer = vec![0u8; Manager::SNAPSHOT_MAX_SIZE];
        let bytes = manager.snapshot_into(&mut buffer).unwrap();
        let mut restored = Manager::with_config(*manager.config()).unwrap();
        restored.restore_from(bytes).unwrap();
        prop_assert_eq!(restored.tasks(), manager.tasks());
        prop_assert_eq!(restored.stats(), manager.stats());
    }
}

/// The harness must reach what it claims to cover: tasks started and finished with a
/// summary, refusals while calls wait, and task starts that evict.
#[test]
fn random_sessions_exercise_tasks() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut summarized, mut refused, mut evicting_starts) = (0u32, 0u32, 0u32);
    for _ in 0..64 {
        let config = config().new_tree(&mut runner).unwrap().current();
        let steps =
            prop::collection::vec(step(), 100..150).new_tree(&mut runner).unwrap().current();
        let mut manager = Manager::with_config(config).unwrap();
        let mut model = Model::default();
        for (at, step) in steps.iter().enumerate() {
            match step {
                Step::Op(op) => model.apply(&mut manager, op, at),
                Step::Start { goal } => {
                    let before = manager.counters().units_evicted;
                    match manager.start_task(&text(at, *goal), at as u64) {
                        Ok(_) => {
                            evicting_starts += u32::from(manager.counters().units_evicted > before)
                        }
                        Err(_) => refused += 1,
                    }
                }
                Step::Finish { outcome } => {
                    if let Ok(task) = manager.finish_task(&text(at, *outcome), at as u64) {
                        summarized += u32::from(task.summary_id().is_some());
                    }
                }
            }
        }
    }
    assert!(summarized > 20, "{summarized} task summaries");
    assert!(refused > 5, "{refused} refusals");
    assert!(evicting_starts > 10, "{evicting_starts} task starts that evicted");
}
