//! Each built-in strategy's own behaviour; the shared invariants run for all five in the
//! manager's property harness.

use ctxwin_core::config::{Config, StrategyKind};
use ctxwin_core::entities::Extractor;
use ctxwin_core::level::Level;
use ctxwin_core::strategy::*;
use ctxwin_core::summarize::Summarizer;
use ctxwin_core::{
    Capacities, ContextManager, Message, ToolCall, capacity::Scratch, entities::EntityTable,
    entities::Patterns, ring::Ring, summarize::Extractive,
};

struct Roomy;
impl Capacities for Roomy {
    type Permanent = Ring<4, 2048>;
    type Session = Ring<16, 8192>;
    type Working = Ring<64, 16384>;
    type Volatile = Ring<8, 4096>;
    type Scratch = Scratch<2048>;
    type Entities = EntityTable<4, 64>;
}

type Manager = ContextManager<Roomy>;

/// Per-push eviction and plans (both water marks at 80%, level budgets as caps): these tests
/// watch a strategy's choices one push at a time. Compactions make the same choices, many at
/// once; the property harness runs every strategy under both policies.
const PER_PUSH: Config = Config { trigger_percent: 80, low_water_percent: 80, ..Config::DEFAULT };
const MINUTE: u64 = 60_000;

fn manager(strategy: StrategyKind, tail: u16) -> Manager {
    let config = Config { strategy, locked_tail: tail, ..PER_PUSH };
    Manager::with_config(config).unwrap()
}

fn history(m: &Manager) -> Vec<String> {
    m.history().map(|m| m.content().to_string()).collect()
}

/// A session entry: text, detail, source ranges.
type Entry = (String, u8, Vec<(u64, u64)>);

fn summaries(m: &Manager) -> Vec<Entry> {
    m.session()
        .map(|s| (s.content().to_string(), s.detail(), s.summary_sources().collect()))
        .collect()
}

#[test]
fn summarization_folds_the_oldest_turns_into_one_rolling_summary() {
    let config = Config {
        strategy: StrategyKind::Summarization,
        summarize_threshold: 3,
        summarize_batch: 2,
        locked_tail: 2,
        ..PER_PUSH
    };
    let mut m = Manager::with_config(config).unwrap();
    let turns = [
        ("Which database?", "Decided: PostgreSQL 16 for the archive."),
        ("Where is the config?", "It lives in src/config/loader.rs."),
        ("How long is the timeout?", "The timeout is 4517 ms."),
        ("Who reviews?", "Ngozi Adeyemi reviews the schema change."),
        ("Anything else?", "Nothing else for now."),
        ("Deploy key?", "The deploy key is K-7731-ALPHA."),
        ("Done?", "Done."),
    ];
    let mut ids = Vec::new();
    for (ask, answer) in turns {
        ids.push(m.push(Message::user(ask)).unwrap());
        m.push(Message::assistant(answer)).unwrap();
    }
    let session = summaries(&m);
    assert_eq!(session.len(), 1, "one rolling summary: {session:?}");
    let (text, detail, sources) = &session[0];
    assert_eq!(*detail, 3, "a rolling summary is a digest: no statement cap");
    for fact in ["PostgreSQL 16", "src/config/loader.rs", "4517 ms", "Ngozi Adeyemi"] {
        assert!(text.contains(fact), "{fact} lost: {text}");
    }
    assert_eq!(sources.first().map(|r| r.0), Some(ids[0]));
    assert!(!history(&m).iter().any(|h| h.contains("PostgreSQL")), "folded turns left the history");
    let mut folded = Vec::new();
    m.drain_outbox(|unit| folded.extend(unit.messages().map(|m| m.content().to_string())));
    assert!(folded.iter().any(|f| f.contains("PostgreSQL 16")), "originals went to the outbox");
    assert!(
        m.stats().counters.summaries_replaced >= 1,
        "the rolling summary was extended in place"
    );
}

#[cfg(feature = "entities")]
#[test]
fn entity_extraction_keeps_state_and_only_the_tail() {
    let schema = ctxwin_core::EntitySchema::new(&["destination", "date", "seats"]).unwrap();
    let config = Config {
        strategy: StrategyKind::EntityExtraction,
        locked_tail: 2,
        entity_schema: schema,
        ..PER_PUSH
    };
    let mut m = Manager::with_config(config).unwrap();
    m.push(Message::user("Book a flight. My destination is Lisbon.")).unwrap();
    m.push(Message::assistant("Sure. Which date?")).unwrap();
    m.push(Message::user("date: 3 May")).unwrap();
    m.push(Message::assistant("How many seats?")).unwrap();
    m.push(Message::user("Two adults, seats = 2")).unwrap();
    assert_eq!(m.entities().get("destination"), Some("Lisbon"));
    assert_eq!(m.entities().get("date"), Some("3 May"));
    assert_eq!(m.entities().get("seats"), Some("2"));
    assert!(m.history().count() <= 3, "{:?}", history(&m));
    let mut body = vec![0u8; 4096];
    let budget = m.budget();
    let payload = m.compose(&[]).unwrap();
    assert!(payload.tokens() <= budget);
    let len = payload.write_openai(&mut body[..], ctxwin_core::OpenAiRequest::default()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&body[..len]).unwrap();
    let block = json["messages"][0]["content"].as_str().unwrap();
    let object: serde_json::Value =
        serde_json::from_str(block.strip_prefix("[Entities]\n").unwrap()).unwrap();
    assert_eq!(object, serde_json::json!({"destination": "Lisbon", "date": "3 May", "seats": "2"}));
}

#[test]
fn importance_evicts_the_least_valuable_first_and_summarizes_the_important() {
    let config = Config {
        strategy: StrategyKind::Importance,
        locked_tail: 1,
        working_budget: 400,
        importance_threshold: 250,
        ..PER_PUSH
    };
    let mut m = Manager::with_config(config).unwrap();
    m.push(Message::assistant("Chatter about the weather, nothing to keep here at all.").at(0))
        .unwrap();
    m.push(Message::assistant("The parser entry point is parse_config in src/config.rs").at(0))
        .unwrap();
    m.push(Message::assistant("More chatter: lunch was good and the coffee was fine.").at(0))
        .unwrap();
    m.push(
        Message::user("Fix parse_config in src/config.rs, it rejects empty lines").at(10 * MINUTE),
    )
    .unwrap();
    let filler = "lorem ipsum dolor sit amet ".repeat(3);
    // The push at which each unit left (the outbox lists a push's evictions in id order).
    let mut left: Vec<(usize, String)> = Vec::new();
    for i in 0..30 {
        let at = (11 + i as u64) * MINUTE;
        m.push(Message::assistant(&format!("step {i}: {filler}")).at(at)).unwrap();
        m.drain_outbox(|unit| left.extend(unit.messages().map(|m| (i, m.content().to_string()))));
    }
    let step = |needle: &str| {
        left.iter().find(|(_, e)| e.contains(needle)).map_or(usize::MAX, |(i, _)| *i)
    };
    let relevant = step("parse_config in src/config.rs");
    assert!(step("weather") < relevant && step("lunch") < relevant, "{left:?}");
    assert!(
        summaries(&m).iter().any(|(text, _, _)| text.contains("parse_config"))
            || relevant == usize::MAX,
        "the relevant unit stayed or left a summary: {:?}",
        summaries(&m)
    );
    assert!(
        !summaries(&m).iter().any(|(text, _, _)| text.contains("weather")),
        "chatter is dropped"
    );
}

#[test]
fn hierarchical_compresses_by_age_paragraph_then_line() {
    let mut m = manager(StrategyKind::Hierarchical, 1);
    let first = m.push(Message::user("Set up CI for ctxwin").at(0)).unwrap();
    let calls = [ToolCall::new("c1", "run", r#"{"cmd":"cargo test --workspace"}"#)];
    m.push(Message::assistant("Running the suite first.").with_tool_calls(&calls).at(1_000))
        .unwrap();
    let last = m.push(Message::tool_result("c1", "error[E0433]: failed to resolve: use of undeclared crate `serde_json` in tests/main.rs").at(2_000)).unwrap();
    m.push(Message::user("Fix it").at(6 * MINUTE)).unwrap();
    let session = summaries(&m);
    assert!(!session.is_empty(), "units older than 5 minutes became summaries");
    assert!(session.iter().all(|(_, detail, _)| *detail == 1));
    let all_sources: Vec<(u64, u64)> = session.iter().flat_map(|(_, _, s)| s.clone()).collect();
    assert!(all_sources.iter().any(|&(a, b)| a <= last && b >= last), "drill-down ids kept");
    assert!(all_sources.iter().any(|&(a, _)| a == first));
    assert!(
        session.iter().any(|(text, _, _)| text.contains("serde_json") || text.contains("E0433")),
        "{session:?}"
    );
    m.push(Message::user("Status?").at(40 * MINUTE)).unwrap();
    let session = summaries(&m);
    assert!(
        session.iter().any(|(_, detail, _)| *detail == 2),
        "after 30 minutes a line: {session:?}"
    );
    assert!(session.iter().filter(|(_, d, _)| *d == 2).all(|(text, _, _)| !text.contains('\n')));
}

#[test]
fn session_overflow_merges_summaries_keeping_the_informative_statements() {
    let config = Config { session_budget: 80, ..PER_PUSH };
    let mut m = Manager::with_config(config).unwrap();
    let facts = [
        "Decided: ship on Friday 14 June.",
        "The flaky test is tests/e2e/login.rs.",
        "Lunch was nice, nothing else to report today really.",
        "Port 8443 must stay open for the webhook.",
        "Another pleasant afternoon with nothing notable going on.",
    ];
    for (i, fact) in facts.iter().enumerate() {
        m.add_summary(fact, &[(i as u64 * 10, i as u64 * 10 + 9)], i as u64).unwrap();
    }
    assert!(m.level_tokens(Level::Session) <= 80);
    let counters = m.stats().counters;
    assert!(counters.summaries_merged > 0);
    let text: String = m.session().map(|s| s.content().to_string()).collect::<Vec<_>>().join("\n");
    for kept in ["14 June", "tests/e2e/login.rs", "8443"] {
        assert!(text.contains(kept), "{kept} lost from {text}");
    }
    assert!(!text.contains("Lunch"), "filler goes first: {text}");
    let ranges: Vec<(u64, u64)> =
        m.session().flat_map(|s| s.summary_sources().collect::<Vec<_>>()).collect();
    assert!(ranges.iter().any(|&(a, _)| a == 0), "merged summaries keep their sources: {ranges:?}");
}

/// A strategy of the caller's own: biggest units first.
struct BiggestFirst {
    summarizer: Extractive,
    extractor: Patterns,
}

impl Strategy for BiggestFirst {
    fn oldest_first(&self, _: &Env<'_>) -> bool {
        false
    }
    fn value(&mut self, unit: &UnitView<'_>, _: &Env<'_>) -> u32 {
        u32::MAX - unit.tokens()
    }
    fn summarizer(&mut self) -> &mut dyn Summarizer {
        &mut self.summarizer
    }
    fn extractor(&mut self) -> &mut dyn Extractor {
        &mut self.extractor
    }
}

#[test]
fn a_custom_strategy_decides_and_the_invariants_still_hold() {
    let config = Config { locked_tail: 1, working_budget: 200, ..PER_PUSH };
    let strategy = BiggestFirst { summarizer: Extractive, extractor: Patterns };
    let mut m =
        ContextManager::<Roomy>::builder().config(config).strategy(strategy).build().unwrap();
    m.push(Message::assistant("small one")).unwrap();
    m.push(Message::assistant(&"big ".repeat(120))).unwrap();
    m.push(Message::assistant("small two")).unwrap();
    for i in 0..3 {
        m.push(Message::assistant(&format!("new {i} {}", "x ".repeat(30)))).unwrap();
    }
    let kept: Vec<String> = m.history().map(|m| m.content().to_string()).collect();
    assert!(kept.iter().any(|k| k == "small one"), "the big unit went first: {kept:?}");
    assert!(!kept.iter().any(|k| k.starts_with("big")));
}

#[test]
fn importance_keeps_a_line_of_an_unimportant_unit_only_when_it_states_something() {
    let config = Config {
        strategy: StrategyKind::Importance,
        locked_tail: 1,
        working_budget: 300,
        ..PER_PUSH
    };
    let mut m = Manager::with_config(config).unwrap();
    m.push(Message::assistant("Sure, that makes sense, I will keep going with it.").at(0)).unwrap();
    m.push(
        Message::assistant(
            "Okay. The deploy key for staging is K-4821-ALPHA. Thanks, that helps a lot.",
        )
        .at(0),
    )
    .unwrap();
    for i in 0..12 {
        let at = (60 + i as u64) * MINUTE;
        m.push(Message::assistant(&format!("step {i}: {}", "lorem ipsum ".repeat(8))).at(at))
            .unwrap();
    }
    let session = summaries(&m);
    assert!(
        session.iter().any(|(text, _, _)| text.contains("K-4821-ALPHA")),
        "an hour old and never mentioned again, yet kept as a line: {session:?}"
    );
    assert!(!session.iter().any(|(text, _, _)| text.contains("makes sense")), "{session:?}");
    assert_eq!(m.stats().counters.summaries_failed, 0, "declining chatter is not a failure");
}

#[test]
fn an_overflowing_session_becomes_one_digest_that_keeps_its_facts() {
    let config = Config {
        strategy: StrategyKind::Hierarchical,
        locked_tail: 1,
        session_budget: 600,
        working_budget: 200,
        ..PER_PUSH
    };
    let mut m = Manager::with_config(config).unwrap();
    for i in 0..40u64 {
        let at = i * 10 * MINUTE;
        m.push(
            Message::user(&format!("Okay, what about part {}?", ["one", "two"][i as usize % 2]))
                .at(at),
        )
        .unwrap();
        m.push(
            Message::assistant(&format!("Sure. The value of setting_{i} is {}.", 1000 + i)).at(at),
        )
        .unwrap();
        m.drain_outbox(|_| {});
    }
    let session = summaries(&m);
    let digests: Vec<&Entry> = session.iter().filter(|(_, detail, _)| *detail == 3).collect();
    assert_eq!(digests.len(), 1, "{session:?}");
    assert!(m.stats().counters.summaries_merged > 0);
    let text: String = session.iter().map(|(t, _, _)| t.as_str()).collect::<Vec<_>>().join("\n");
    let kept =
        (0..40u64).filter(|i| text.contains(&format!("setting_{i} is {}", 1000 + i))).count();
    let live = (0..40u64)
        .filter(|i| history(&m).iter().any(|h| h.contains(&format!("setting_{i} "))))
        .count();
    assert!(kept + live >= 30, "{kept} in summaries, {live} live, of 40: {text}");
    assert!(!text.contains("what about part"), "questions without specifics go: {text}");
    assert!(m.level_tokens(Level::Session) <= 600);
    // Ages past session_age_ms do not cut the digest down to a line.
    m.push(Message::user("Status?").at(600 * MINUTE)).unwrap();
    assert!(summaries(&m).iter().any(|(t, d, _)| *d == 3 && t.lines().count() > 3));
}
