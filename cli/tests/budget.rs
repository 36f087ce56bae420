//! Issue 31: a long coding-agent session imported under a small window. Whatever the strategy,
//! the state stays within its budget and every `build` produces a payload.

use std::fs;

use ctxwin_core::counter::TokenCounter;
use serde_json::Value;

mod cli_support;
use cli_support::Workdir;
use cli_support::agent_session;

/// A state directory configured as the user did: only the window, the reply reserve
/// and the strategy changed in the `ctxwin.toml` that `init` wrote.
fn configured(window: u32, strategy: &str) -> Workdir {
    let work = Workdir::init();
    let path = work.state().join("ctxwin.toml");
    let config = fs::read_to_string(&path).unwrap();
    let mut changed = 0;
    let edited: Vec<String> = config
        .lines()
        .map(|line| {
            let value = match line.split(" = ").next() {
                Some("context_window") => window.to_string(),
                Some("reserved_for_reply") => "0".to_string(),
                Some("strategy") => format!("{strategy:?}"),
                _ => return line.to_string(),
            };
            changed += 1;
            format!("{} = {value}", line.split(" = ").next().unwrap_or_default())
        })
        .collect();
    assert_eq!(changed, 3, "init's ctxwin.toml names the three settings:\n{config}");
    fs::write(&path, edited.join("\n") + "\n").unwrap();
    work
}

fn level(stats: &Value, name: &str) -> (u64, u64) {
    let level = &stats["levels"][name];
    (level["tokens"].as_u64().unwrap(), level["budget"].as_u64().unwrap())
}

#[test]
fn a_long_session_under_the_hierarchical_strategy_stays_in_budget_and_builds() {
    // 1,110 messages: about a hundred tasks of listing, grepping, reading, patching and testing.
    let session = agent_session::agent_session_of(1_110);
    let work = configured(4_000, "hierarchical");
    let file = work.write("session.jsonl", &agent_session::jsonl(&session));
    let report = work.json(&["import", file.to_str().unwrap()]);
    assert_eq!(report["stored"], 1_110, "{report}");

    let stats = work.json(&["stats"]);
    let (used, budget) =
        (stats["tokens"]["used"].as_u64().unwrap(), stats["tokens"]["budget"].as_u64().unwrap());
    assert_eq!(budget, 4_000);
    assert!(used <= budget, "the import left the context over its budget: {used} / {budget}");
    let (session_tokens, session_budget) = level(&stats, "session");
    assert!(
        session_tokens <= session_budget,
        "the summaries outgrew their level: {session_tokens} / {session_budget}"
    );
    assert!(stats["summaries"]["in_context"].as_u64().unwrap() >= 1, "{stats}");

    for _ in 0..2 {
        let body: Value = serde_json::from_str(&work.ok(&["build"]).stdout).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "system");
        let summary = messages.iter().any(|m| {
            m["content"].as_str().is_some_and(|text| text.starts_with("[Memory Summary]"))
        });
        assert!(summary, "the payload keeps a summary of what left");
    }
    let stats = work.json(&["stats"]);
    assert!(stats["tokens"]["used"].as_u64() <= stats["tokens"]["budget"].as_u64(), "{stats}");
}

#[test]
fn every_strategy_builds_the_long_session_at_small_windows() {
    let session = agent_session::agent_session_of(1_110);
    for strategy in ["sliding_window", "summarization", "entity_extraction", "importance"] {
        let work = configured(2_000, strategy);
        let file = work.write("session.jsonl", &agent_session::jsonl(&session));
        work.ok(&["import", file.to_str().unwrap()]);
        let stats = work.json(&["stats"]);
        assert!(
            stats["tokens"]["used"].as_u64() <= stats["tokens"]["budget"].as_u64(),
            "{strategy}: {stats}"
        );
        let (tokens, budget) = level(&stats, "session");
        assert!(tokens <= budget, "{strategy}: session {tokens} / {budget}");
        work.ok(&["build"]);
    }
}

#[test]
fn what_cannot_shrink_is_refused_naming_the_cause_and_the_excess() {
    let work = configured(2_000, "hierarchical");
    work.ok(&["add", "system", "You are a build assistant."]);
    work.ok(&["add", "user", "Summarize the release notes."]);
    let notes = "word ".repeat(3_000);
    let line = work.fails(&["build", "--dynamic", &notes], 5, "over the budget of 2000");
    assert!(line.contains("the dynamic context (--dynamic) takes"), "{line}");
    assert!(!line.contains("locked_tail"), "{line}");

    // The locked tail gives way: six messages of about 700 tokens each still build.
    let work = configured(2_000, "hierarchical");
    let long = "The build of module seven failed again on the same step. ".repeat(50);
    for _ in 0..6 {
        work.ok(&["add", "assistant", &long]);
    }
    work.ok(&["build"]);

    // The live request does not: a question and its answer of nearly the working level's
    // 1,000 tokens each, beside a 300-token system prompt.
    let work = configured(2_000, "hierarchical");
    work.ok(&["add", "system", &sized("Answer in full. ", 300)]);
    work.ok(&["add", "user", &sized("Why does the build fail? ", 950)]);
    work.ok(&["add", "assistant", &sized("The build fails in module seven. ", 950)]);
    let line = work.fails(&["build"], 5, "over the budget of 2000");
    assert!(line.contains("the live request"), "{line}");
    assert!(!line.contains("--dynamic") && !line.contains("locked_tail"), "{line}");
}

/// `phrase` repeated to about `tokens` tokens with the message framing, as the CLI's default
/// estimator counts them.
fn sized(phrase: &str, tokens: u32) -> String {
    let estimator = ctxwin_core::estimator::Estimator::new();
    let mut text = String::new();
    while estimator.count(&text) + estimator.count(phrase) + 4 <= tokens {
        text.push_str(phrase);
    }
    text
}
