//! Invariants over random operation sequences, configurations and capacities (the model is
//! in `properties_support`): every operation keeps them, and so does replacing summaries.

use ctxwin_core::{Config, ContextManager, Level};
use proptest::prelude::*;

mod properties_support;
use properties_support::{Model, Op, Tight, config, op, text};

proptest! {
    #[test]
    fn invariants_hold_over_random_sessions(config in config(), ops in prop::collection::vec(op(), 1..150)) {
        let mut manager = ContextManager::<Tight>::with_config(config).unwrap();
        let mut model = Model::default();
        for (step, op) in ops.iter().enumerate() {
            model.apply(&mut manager, op, step);
            model.check(&manager);
        }
    }
}

/// The harness must reach what it claims to cover: summaries made by every summarizing
/// strategy, merges, entities, drops and reductions.
#[test]
fn random_sessions_exercise_every_strategy() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut summaries = [0u64; 5];
    let (mut merged, mut replaced, mut entities_seen) = (0u64, 0u64, 0usize);
    for _ in 0..300 {
        let config = config().new_tree(&mut runner).unwrap().current();
        let ops = prop::collection::vec(op(), 100..150).new_tree(&mut runner).unwrap().current();
        let kind = config.strategy as usize;
        let mut manager = ContextManager::<Tight>::with_config(config).unwrap();
        let mut model = Model::default();
        for (step, op) in ops.iter().enumerate() {
            model.apply(&mut manager, op, step);
        }
        let counters = manager.stats().counters;
        summaries[kind] += counters.summaries_added;
        merged += counters.summaries_merged;
        replaced += counters.summaries_replaced;
        entities_seen += manager.entities().iter().filter(|(_, v)| v.is_some()).count();
    }
    // Summarization, importance and hierarchical all summarize (sliding and entity only drop,
    // but random sessions also push summaries directly).
    for kind in [1, 3, 4] {
        assert!(summaries[kind] > summaries[0], "{summaries:?}");
    }
    // Without the `entities` feature the configurations declare no schema.
    let entities_expected = cfg!(feature = "entities");
    assert!(merged > 0 && replaced > 0, "{merged} {replaced}");
    assert_eq!(entities_seen > 0, entities_expected, "{entities_seen}");
}

/// Random sessions run through [`replacements`] for one configuration and operation list:
/// replaces a live summary after each operation, checking the invariants; counts the
/// replacements made and refused.
fn replacements(config: Config, ops: &[(Op, usize, usize)]) -> (u32, u32) {
    let mut manager = ContextManager::<Tight>::with_config(config).unwrap();
    let mut model = Model::default();
    let (mut made, mut refused) = (0, 0);
    for (step, (op, pick, len)) in ops.iter().enumerate() {
        model.apply(&mut manager, op, step);
        model.check(&manager);
        let summaries: Vec<u64> =
            manager.session().filter(|m| m.is_summary()).map(|m| m.id()).collect();
        let Some(&id) = summaries.get(pick % summaries.len().max(1)) else { continue };
        let text = text(step, *len);
        let before = manager.stats();
        match manager.replace_summary(id, &text) {
            Ok(same) => {
                assert_eq!(same, id);
                let budget = manager.config().level_budget(Level::Session);
                assert!(manager.level_tokens(Level::Session) <= budget);
                assert!(manager.used() <= manager.budget() || before.used > manager.budget());
                made += 1;
            }
            Err(_) => {
                assert_eq!(manager.stats(), before);
                refused += 1;
            }
        }
        model.check(&manager);
        model.apply(&mut manager, &Op::Compose { dynamic: 0 }, step);
        model.check(&manager);
    }
    (made, refused)
}

fn ops() -> impl proptest::strategy::Strategy<Value = Vec<(Op, usize, usize)>> {
    prop::collection::vec((op(), 0usize..6, 0usize..200), 1..120)
}

/// The property below must reach what it claims: replacements made and refused.
#[test]
fn random_sessions_replace_and_refuse() {
    use proptest::strategy::{Strategy as _, ValueTree};
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut made, mut refused) = (0, 0);
    for _ in 0..100 {
        let config = config().new_tree(&mut runner).unwrap().current();
        let ops = ops().new_tree(&mut runner).unwrap().current();
        let (m, r) = replacements(config, &ops);
        made += m;
        refused += r;
    }
    assert!(made > 100 && refused > 10, "{made} made, {refused} refused");
}

proptest! {
    #[test]
    fn replacing_summaries_keeps_the_invariants(config in config(), ops in ops()) {
        replacements(config, &ops);
    }
}
