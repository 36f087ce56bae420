//! The session's LLM double buffer against small local HTTP servers.

use std::time::Duration;

use ctxwin_core::{Config, EntitySchema, Role, StrategyKind};

use super::{LlmOptions, Session, SessionBuilder};
use crate::ChatMessage;
use crate::llm::LlmClientBuilder;
use crate::llm::mock::responder;

const SUMMARY: &str = "Worked through the build steps; src/step files edited.";

fn config() -> Config {
    Config {
        strategy: StrategyKind::Summarization,
        summarize_threshold: 3,
        summarize_batch: 2,
        locked_tail: 2,
        entity_schema: EntitySchema::new(&["branch"]).unwrap(),
        ..Config::DEFAULT
    }
}

/// Answers summaries with [`SUMMARY`] and extractions with `{"branch": "fix-io"}`.
fn answer(body: &str) -> String {
    if body.contains("json_schema") { r#"{"branch": "fix-io"}"#.into() } else { SUMMARY.into() }
}

fn session(url: &str, options: LlmOptions) -> Session {
    let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
    SessionBuilder::new("llm")
        .config(config())
        .archive_in_memory()
        .llm(client)
        .llm_options(options)
        .build()
        .unwrap()
}

/// Pushes `turns` user/assistant turns; returns the ids and texts pushed.
fn push_turns(session: &mut Session, from: usize, turns: usize) -> Vec<(u64, String)> {
    let mut pushed = Vec::new();
    for turn in from..from + turns {
        for (role, text) in [
            (Role::User, format!("Step {turn}: edit src/step{turn}.rs and run cargo test")),
            (Role::Assistant, format!("Edited src/step{turn}.rs; cargo test: {turn} passed")),
        ] {
            let id = session.push(&ChatMessage::text(role, text.clone())).unwrap().id;
            pushed.push((id, text));
        }
    }
    pushed
}

fn rolling(session: &Session) -> (u64, String) {
    let summary = session.manager().session().find(|m| m.is_summary()).unwrap();
    (summary.id(), summary.content().to_owned())
}

#[test]
fn model_summaries_are_swapped_in_and_recorded() {
    let server = responder(Duration::ZERO, answer);
    let mut session = session(&server.url, LlmOptions::default());
    let pushed = push_turns(&mut session, 0, 6);
    let wait = session.wait_for_summaries(Duration::from_secs(20)).unwrap();
    assert_eq!(wait.pending, 0);
    let (id, text) = rolling(&session);
    assert_eq!(text, SUMMARY);
    let stats = session.llm_stats().unwrap();
    assert!(stats.summaries_swapped >= 1, "{stats:?}");
    assert_eq!(stats.summary_fallbacks.total(), 0, "{stats:?}");
    assert!(stats.summary_latency_p50_ms.is_some());
    let archive = session.archive().unwrap();
    let record = archive.summary("llm", id).unwrap().unwrap();
    assert_eq!(record.text, SUMMARY);
    let sources = archive.drill_down("llm", id).unwrap();
    assert!(!sources.is_empty());
    for (id, text) in &pushed {
        assert_eq!(&archive.get("llm", *id).unwrap().unwrap().message.content, text);
    }
    // The model's value for the declared key is set (the patterns find none here).
    assert_eq!(session.manager().entities().get("branch"), Some("fix-io"));
    assert!(stats.entity_values_set >= 1 && stats.extractions_accepted >= 1, "{stats:?}");
    let payload = session.compose(&[]).unwrap();
    assert!(payload.conversation.messages.iter().any(|m| m.content.contains(SUMMARY)));
    let table = session.stats().unwrap().to_string();
    assert!(table.contains("llm summaries"), "{table}");
}

#[test]
fn later_jobs_send_only_new_messages_on_top_of_the_model_text() {
    let server = responder(Duration::ZERO, answer);
    let options = LlmOptions { extraction: false, ..LlmOptions::default() };
    let mut session = session(&server.url, options);
    push_turns(&mut session, 0, 5);
    session.wait_for_summaries(Duration::from_secs(20)).unwrap();
    let requests_before = server.requests.lock().unwrap().len();
    push_turns(&mut session, 5, 3);
    session.wait_for_summaries(Duration::from_secs(20)).unwrap();
    let requests = server.requests.lock().unwrap();
    let later = requests.get(requests_before..).unwrap_or_default();
    assert!(!later.is_empty());
    for body in later {
        assert!(body.contains("Summary so far:"), "{body}");
        assert!(!body.contains("src/step0.rs"), "step 0 is covered by the model's text: {body}");
    }
}

#[test]
fn answers_to_summaries_changed_meanwhile_are_not_swapped_in() {
    let server = responder(Duration::from_millis(800), answer);
    let options = LlmOptions { extraction: false, ..LlmOptions::default() };
    let mut session = session(&server.url, options);
    // Pushed faster than the model answers: the rolling summary changes under running jobs.
    push_turns(&mut session, 0, 10);
    let wait = session.wait_for_summaries(Duration::from_secs(30)).unwrap();
    assert_eq!(wait.pending, 0);
    let stats = session.llm_stats().unwrap();
    assert!(stats.summaries_superseded >= 1 && stats.summaries_swapped >= 1, "{stats:?}");
    assert_eq!(rolling(&session).1, SUMMARY, "the last job's answer is swapped in: {stats:?}");
}

#[test]
fn a_dead_server_leaves_the_extractive_summaries_and_loses_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut session = session(&url, LlmOptions::default());
    let pushed = push_turns(&mut session, 0, 8);
    let wait = session.wait_for_summaries(Duration::from_secs(20)).unwrap();
    assert_eq!(wait.pending, 0);
    let stats = session.llm_stats().unwrap();
    assert_eq!(stats.summaries_swapped, 0);
    assert!(stats.summary_fallbacks.server_down >= 1, "{stats:?}");
    assert!(stats.extraction_fallbacks.server_down >= 1, "{stats:?}");
    assert_ne!(rolling(&session).1, SUMMARY);
    let archive = session.archive().unwrap();
    for (id, text) in &pushed {
        assert_eq!(&archive.get("llm", *id).unwrap().unwrap().message.content, text);
    }
    assert!(session.compose(&[]).is_ok());
}

#[test]
fn answers_that_do_not_fit_are_counted_and_the_extractive_text_stays() {
    let long: Vec<String> = (0..400).map(|i| format!("fact{i}")).collect();
    let long = long.join(" ");
    let server = responder(Duration::ZERO, move |_| long.clone());
    let options = LlmOptions { extraction: false, ..LlmOptions::default() };
    let mut session = session(&server.url, options);
    push_turns(&mut session, 0, 6);
    session.wait_for_summaries(Duration::from_secs(20)).unwrap();
    let stats = session.llm_stats().unwrap();
    assert_eq!(stats.summaries_swapped, 0);
    assert!(stats.summary_fallbacks.too_long >= 1, "{stats:?}");
    assert!(!rolling(&session).1.contains("fact1"));
}

#[test]
fn waiting_needs_an_llm() {
    let mut session = SessionBuilder::new("plain").build().unwrap();
    assert!(matches!(
        session.wait_for_summaries(Duration::ZERO),
        Err(super::SessionError::NoLlm { .. })
    ));
}
