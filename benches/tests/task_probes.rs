//! The task-probes benchmark's generator and scorer (`ctxwin_benches::taskprobes`): the
//! history is deterministic, its probes' evidence is really in it (and only in the task it is
//! about, never in the question), a payload holding everything answers every probe and an
//! empty one none, and the baselines stay within their budget.

use ctxwin_benches::taskprobes::{
    Bm25, Message, ProbeKind, Speaker, answered, generate, recent_and_bm25, sliding_window,
};
use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;

#[test]
fn the_history_is_deterministic_and_has_tens_of_tasks_with_every_kind_of_probe() {
    let a = generate(3, 40);
    let b = generate(3, 40);
    assert_eq!(a.messages, b.messages);
    assert_eq!(a.probes, b.probes);
    assert_ne!(generate(4, 40).messages, a.messages, "the seed matters");
    assert_eq!(a.tasks.len(), 40);
    for kind in ProbeKind::ALL {
        let n = a.probes.iter().filter(|p| p.kind == kind).count();
        assert!(n >= 5, "{kind:?}: {n} probes");
    }
    // Tasks tile the history after the system prompt, each opened by the developer.
    assert_eq!(a.messages[0].speaker, Speaker::System);
    assert_eq!(a.tasks[0].start, 1);
    for pair in a.tasks.windows(2) {
        assert_eq!(pair[0].end, pair[1].start);
    }
    assert_eq!(a.tasks.last().map(|t| t.end), Some(a.messages.len()));
    assert!(a.tasks.iter().all(|t| a.messages[t.start].speaker == Speaker::User));
    // Every tool output answers the call just before it.
    for pair in a.messages.windows(2) {
        if pair[1].speaker == Speaker::Tool {
            let call = pair[0].call.as_ref().map(|(id, _, _)| id);
            assert_eq!(call, pair[1].call_id.as_ref());
        }
    }
}

#[test]
fn evidence_is_in_the_history_before_the_probe_in_its_own_task_only_and_not_in_the_question() {
    for seed in 1..=3 {
        let history = generate(seed, 40);
        for probe in &history.probes {
            assert!(!probe.evidence.is_empty());
            let before = history.text_until(probe.at);
            assert!(answered(&before, probe), "{probe:?}");
            for evidence in &probe.evidence {
                assert!(!probe.question.contains(evidence.as_str()), "{probe:?}");
                // Where it is said: only inside the task the probe is about.
                let holders: Vec<usize> = history.messages[..probe.at]
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.text().contains(evidence.as_str()))
                    .map(|(i, _)| i)
                    .collect();
                assert!(!holders.is_empty());
                for i in holders {
                    assert_eq!(history.task_of(i), Some(probe.task), "{evidence:?} at {i}");
                }
            }
            if probe.kind == ProbeKind::Repeat {
                // Asked right after the error came back, in a later task than its resolution.
                let output = &history.messages[probe.at - 1];
                assert_eq!(output.speaker, Speaker::Tool);
                assert!(output.content.contains(probe.question.as_str()));
                assert!(history.task_of(probe.at - 1) > Some(probe.task));
            } else {
                assert_eq!(probe.at, history.messages.len());
                assert!(probe.task + 1 < history.tasks.len(), "about an earlier task");
            }
        }
    }
}

#[test]
fn a_payload_with_everything_scores_one_and_an_empty_one_zero() {
    let history = generate(5, 30);
    let everything = history.text_until(history.messages.len());
    let score = |payload: &str| {
        history.probes.iter().filter(|p| answered(payload, p)).count() as f64
            / history.probes.len() as f64
    };
    assert_eq!(score(&everything), 1.0);
    assert_eq!(score(""), 0.0);
    // Only the last task's messages: no end probe is about it, so none is answered.
    let last = &history.tasks[history.tasks.len() - 1];
    let tail: String = history.messages[last.start..].iter().map(Message::text).collect();
    let end_probes = history.probes.iter().filter(|p| p.kind != ProbeKind::Repeat);
    assert_eq!(end_probes.filter(|p| answered(&tail, p)).count(), 0);
    // A probe needs all its evidence: a files probe with one path missing is not answered.
    let probe = history
        .probes
        .iter()
        .find(|p| p.kind == ProbeKind::Files && p.evidence.len() > 1)
        .expect("a task that changed several files");
    assert!(!answered(&probe.evidence[0], probe));
}

#[test]
fn the_baselines_fit_their_budget_and_bm25_finds_the_words_asked_for() {
    let history = generate(2, 40);
    let estimator = Estimator::new();
    let cost = |m: &Message| estimator.count(&m.text()) + 4;
    let texts: Vec<String> = history.messages.iter().map(Message::text).collect();
    let index = Bm25::new(texts.iter().map(String::as_str));
    let end = history.messages.len();
    for budget in [4_000, 8_000] {
        let window = sliding_window(&history, end, budget, &cost);
        assert!(window.tokens <= budget && window.tokens > budget * 3 / 4);
        assert!(window.text.contains(&history.messages[end - 1].content));
        let probe = &history.probes[0];
        let mixed = recent_and_bm25(&history, &index, &probe.question, probe.at, budget, &cost);
        assert!(mixed.tokens <= budget);
    }
    // The one message saying a unique error's signature ranks first for it.
    let probe = history.probes.iter().find(|p| p.kind == ProbeKind::Error).expect("an error");
    let ranked = index.rank(&probe.evidence[0], end);
    let top = ranked.first().map(|&(i, _)| i).expect("a match");
    assert!(texts[top].contains(probe.evidence[0].as_str()), "{}", texts[top]);
    assert!(index.rank("zzzz qqqq", end).is_empty());
    // A prefix sees only its own documents.
    assert!(index.rank(&probe.evidence[0], 10).iter().all(|&(i, _)| i < 10));
}
