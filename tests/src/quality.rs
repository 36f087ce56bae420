//! Memory quality: a long generated agent session with planted facts, replayed under a budget
//! of a tenth of its tokens; how many facts does the final payload still carry, per strategy?
//!
//! The session is deterministic (seeded). Facts are planted inside ordinary messages, among
//! chatter, logs, code and JSON tool output, so a strategy keeps them only if it tells them
//! apart. About half are mentioned again 10-40 turns later (agents come back to what
//! matters), never in the final stretch, so a re-mention has to survive compression too. One
//! fact, a deploy key, is stated once, early, and never again.

use ctxwin_core::{
    Capacities, Config, ContextManager, Message, OpenAiRequest, StrategyKind, ToolCall,
    capacity::Scratch, counter::TokenCounter, entities::EntityTable, ring::Ring,
};

/// Capacities roomy enough that the token budget, not the rings, decides.
pub struct QualityCapacities;

impl Capacities for QualityCapacities {
    type Permanent = Ring<8, 8192>;
    type Session = Ring<64, 32_768>;
    type Working = Ring<512, 196_608>;
    type Volatile = Ring<64, 65_536>;
    type Scratch = Scratch<32_768>;
    type Entities = EntityTable<8, 64>;
}

/// A small deterministic generator (xorshift64*), so the session is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// What a planted fact is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactKind {
    /// A file path.
    Path,
    /// A number with a meaning.
    Number,
    /// A decision taken.
    Decision,
    /// A person's name.
    Name,
    /// A secret stated once, early.
    Key,
}

/// A planted fact: the sentence that states it and the string a payload must contain.
#[derive(Clone, Debug)]
pub struct Fact {
    /// Its kind.
    pub kind: FactKind,
    /// The sentence planted in a message.
    pub statement: String,
    /// What must still be in the final payload.
    pub probe: String,
    /// Turn it is stated in.
    pub turn: usize,
    /// Turn it is mentioned again in, if any.
    pub mentioned_again: Option<usize>,
    /// Whether the user states it (else the assistant does).
    pub by_user: bool,
}

const CHATTER: [&str; 12] = [
    "Let me take a look at that for you.",
    "Sure, I can help with that. Give me a moment to go through it.",
    "Okay, that makes sense so far; I will keep going.",
    "Thanks, that context helps a lot.",
    "I looked through the surrounding code and nothing else seems to depend on it.",
    "That should be straightforward, but let me double-check the edge cases first.",
    "Good point, I had not considered that case yet.",
    "Running a quick sanity check before moving on to the next step.",
    "The change looks fine to me, though we should keep an eye on it.",
    "I will summarize what I found once the remaining checks are done.",
    "Nothing unusual in the output, everything behaves as expected here.",
    "Alright, moving on to the next part of the task now.",
];
const ASKS: [&str; 8] = [
    "Can you check why the nightly job was slow yesterday?",
    "Please look at the failing integration test again.",
    "What does the latest profile say about memory use?",
    "Could you tidy up the logging in the worker?",
    "Is the new endpoint documented anywhere?",
    "Why does the cache miss so often after deploys?",
    "Please review the open pull request for the parser.",
    "Can we make the retry backoff less aggressive?",
];
const TOOLS: [&str; 4] = ["read_file", "run", "grep", "http_get"];
const DIRS: [&str; 8] = [
    "src/net",
    "src/storage",
    "src/api",
    "core/src",
    "tools/ci",
    "src/auth",
    "lib/parse",
    "app/billing",
];
const STEMS: [&str; 10] = [
    "retry_policy",
    "segment_cache",
    "router",
    "ring_buffer",
    "token_bucket",
    "session_store",
    "decoder",
    "ledger",
    "rate_limiter",
    "audit_log",
];
const QUANTITIES: [&str; 8] = [
    "the p99 latency budget",
    "the connection pool size",
    "the batch size",
    "the cache TTL in seconds",
    "the max payload in KiB",
    "the worker count",
    "the retry limit",
    "the shard count",
];
const CHOICES: [&str; 10] = [
    "PostgreSQL 16",
    "Redis Streams",
    "gRPC over HTTP/2",
    "zstd level 9",
    "Tokio 1.38",
    "SQLite in WAL mode",
    "protobuf v3",
    "Argon2id",
    "OpenTelemetry traces",
    "Kafka 3.7",
];
const PURPOSES: [&str; 10] = [
    "the archive",
    "the job queue",
    "the internal API",
    "log compression",
    "the runtime",
    "the edge cache",
    "the wire format",
    "password hashing",
    "observability",
    "the event bus",
];
const FIRST: [&str; 10] =
    ["Ngozi", "Mateo", "Aiko", "Lars", "Priya", "Tomasz", "Amara", "Hugo", "Leilani", "Dmitri"];
const LAST: [&str; 10] = [
    "Adeyemi",
    "Quispe",
    "Tanaka",
    "Lindqvist",
    "Raman",
    "Kowalczyk",
    "Okafor",
    "Moreau",
    "Kahale",
    "Volkov",
];
const AREAS: [&str; 10] = [
    "the billing service",
    "the release process",
    "the storage layer",
    "the mobile client",
    "the search index",
    "on-call this week",
    "the data migration",
    "the security review",
    "the design doc",
    "the load tests",
];

/// A tool output of `lines` lines: logs, code or JSON.
fn tool_output(rng: &mut Rng, lines: usize) -> String {
    let mut out = String::new();
    match rng.below(3) {
        0 => {
            for i in 0..lines {
                out += &format!(
                    "2026-11-22T10:{:02}:{:02}Z INFO worker-{} processed batch ok in {}ms\n",
                    i % 60,
                    rng.below(60),
                    rng.below(8),
                    20 + rng.below(300)
                );
            }
        }
        1 => {
            for i in 0..lines {
                out += &format!(
                    "    let value_{i} = compute(input, {}).unwrap_or_default();\n",
                    rng.below(1000)
                );
            }
        }
        _ => {
            out += "{\"items\": [";
            for i in 0..lines {
                out += &format!(
                    "{{\"id\": {i}, \"status\": \"ok\", \"score\": {}}}, ",
                    rng.below(100)
                );
            }
            out += "]}";
        }
    }
    out
}

/// A fact's sentence and probe. Each kind has three phrasings, not all of them with a cue
/// word, so a strategy cannot keep facts by matching one template.
fn plant(rng: &mut Rng, kind: FactKind, index: usize) -> (String, String) {
    let i = index % 10;
    let form = rng.below(3);
    match kind {
        FactKind::Path => {
            let path = format!("{}/{}_{index}.rs", DIRS[i % DIRS.len()], STEMS[i]);
            let statement = match form {
                0 => format!("The code for this lives in {path}, so that is where the fix goes."),
                1 => format!(
                    "Found it: the handler is defined in {path} around line {}.",
                    10 + rng.below(900)
                ),
                _ => format!("I moved the helper into {path} to keep the module small."),
            };
            (statement, path)
        }
        FactKind::Number => {
            let value = 1000 + rng.below(8999);
            let quantity = QUANTITIES[i % QUANTITIES.len()];
            let statement = match form {
                0 => format!("We measured it again: {quantity} is {value}."),
                1 => format!("After the change {quantity} came out at {value}."),
                _ => format!("Set {quantity} to {value} in the config."),
            };
            (statement, value.to_string())
        }
        FactKind::Decision => {
            let choice = format!("{} #{index}", CHOICES[i]);
            let purpose = PURPOSES[i];
            let statement = match form {
                0 => format!("Decision: we go with {choice} for {purpose}."),
                1 => format!("We settled on {choice} for {purpose}, the alternatives were slower."),
                _ => format!("Let's use {choice} for {purpose}."),
            };
            (statement, choice)
        }
        FactKind::Name => {
            let name = format!("{} {}", FIRST[i], LAST[(i + index) % LAST.len()]);
            let area = AREAS[i];
            let statement = match form {
                0 => format!("For the record, {name} owns {area} from now on."),
                1 => format!("Ask {name} before touching {area}; they wrote most of it."),
                _ => format!("{name} will review anything that changes {area}."),
            };
            (statement, name)
        }
        FactKind::Key => {
            let key = format!("K-{}-ALPHA", 1000 + rng.below(8999));
            (format!("The deploy key for staging is {key}; keep it handy."), key)
        }
    }
}

/// A generated session: its messages (in push order, with tool calls) and its facts.
pub struct Session {
    /// Turns, each a list of messages.
    pub turns: Vec<Vec<Turn>>,
    /// The planted facts.
    pub facts: Vec<Fact>,
}

/// One message of a turn.
#[derive(Clone, Debug)]
pub enum Turn {
    /// A user message.
    User(String),
    /// An assistant message calling tools: (id, name, arguments).
    Calls(String, Vec<(String, String, String)>),
    /// A tool result: (call id, output).
    Result(String, String),
    /// A plain assistant message.
    Assistant(String),
}

/// Generates a session of `turns` turns with `facts` planted facts.
pub fn generate(seed: u64, turns: usize, facts: usize) -> Session {
    let mut rng = Rng(seed.max(1));
    let kinds = [FactKind::Path, FactKind::Number, FactKind::Decision, FactKind::Name];
    let mut planted: Vec<Fact> = Vec::new();
    // The key in the first tenth; the rest spread over the session, none in the last tenth.
    let (key, key_value) = plant(&mut rng, FactKind::Key, 0);
    planted.push(Fact {
        kind: FactKind::Key,
        statement: key,
        probe: key_value,
        turn: 2 + rng.below(turns / 10),
        mentioned_again: None,
        by_user: false,
    });
    for index in 1..facts {
        let kind = kinds[index % kinds.len()];
        let (statement, probe) = plant(&mut rng, kind, index);
        let turn = turns / 10 + rng.below(turns * 7 / 10);
        let again = (rng.below(2) == 0).then(|| (turn + 10 + rng.below(30)).min(turns * 85 / 100));
        planted.push(Fact {
            kind,
            statement,
            probe,
            turn,
            mentioned_again: again,
            by_user: index % 3 == 0,
        });
    }
    let mut session = Session { turns: Vec::new(), facts: planted };
    for turn in 0..turns {
        let stated: Vec<&Fact> = session.facts.iter().filter(|f| f.turn == turn).collect();
        let again: Vec<&Fact> =
            session.facts.iter().filter(|f| f.mentioned_again == Some(turn)).collect();
        let mut messages = Vec::new();
        let mut ask = if turn + 1 == turns {
            "Last thing: write the release notes. List every decision, file path, number, owner and key from this session.".to_string()
        } else {
            rng.pick(&ASKS).to_string()
        };
        for fact in &again {
            ask += &format!(" Also, remember {} from earlier? It matters for this.", fact.probe);
        }
        for fact in stated.iter().filter(|f| f.by_user) {
            ask = format!("{} {ask}", fact.statement);
        }
        messages.push(Turn::User(ask));
        let calls: Vec<(String, String, String)> = (0..1 + rng.below(2))
            .map(|c| {
                let tool = rng.pick(&TOOLS);
                (
                    format!("call_{turn}_{c}"),
                    tool.to_string(),
                    format!("{{\"target\": \"item {}\"}}", rng.below(500)),
                )
            })
            .collect();
        messages.push(Turn::Calls(rng.pick(&CHATTER).to_string(), calls.clone()));
        for (id, _, _) in &calls {
            let lines = if rng.below(9) == 0 { 120 } else { 4 + rng.below(12) };
            messages.push(Turn::Result(id.clone(), tool_output(&mut rng, lines)));
        }
        let mut answer = format!("{} {}", rng.pick(&CHATTER), rng.pick(&CHATTER));
        for fact in stated.iter().filter(|f| !f.by_user) {
            // Planted mid-answer, between chatter.
            answer = format!("{answer} {} {}", fact.statement, rng.pick(&CHATTER));
        }
        messages.push(Turn::Assistant(answer));
        session.turns.push(messages);
    }
    session
}

/// One strategy's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Facts the final payload carries.
    pub kept: usize,
    /// Facts planted.
    pub facts: usize,
    /// The key stated once, early: kept?
    pub key_kept: bool,
    /// Tokens of the final payload.
    pub payload_tokens: u32,
    /// Tokens of the whole session (as pushed).
    pub session_tokens: u64,
    /// Facts kept by kind: (kind, kept, planted).
    pub by_kind: Vec<(FactKind, usize, usize)>,
}

impl Outcome {
    /// Share of facts kept, in percent.
    pub fn percent(&self) -> f64 {
        100.0 * self.kept as f64 / self.facts.max(1) as f64
    }

    /// Session tokens over payload tokens.
    pub fn compression(&self) -> f64 {
        self.session_tokens as f64 / f64::from(self.payload_tokens.max(1))
    }
}

/// Tokens the session costs as pushed (contents, calls and framing), by `counter`.
pub fn session_tokens(session: &Session, counter: &impl TokenCounter) -> u64 {
    let mut total = 0u64;
    for turn in &session.turns {
        for message in turn {
            total += 4 + u64::from(match message {
                Turn::User(text) | Turn::Assistant(text) => counter.count(text),
                Turn::Calls(text, calls) => {
                    counter.count(text)
                        + calls
                            .iter()
                            .map(|(i, n, a)| {
                                counter.count(i) + counter.count(n) + counter.count(a) + 3
                            })
                            .sum::<u32>()
                }
                Turn::Result(id, text) => counter.count(id) + counter.count(text),
            });
        }
    }
    total
}

/// Replays `session` under `strategy` at a budget of `session tokens / ratio` and counts the
/// facts in the final payload.
pub fn run(session: &Session, strategy: StrategyKind, ratio: u64) -> Outcome {
    let estimator = ctxwin_core::estimator::Estimator::new();
    let total = session_tokens(session, &estimator);
    let budget = u32::try_from(total / ratio).unwrap_or(u32::MAX);
    let schema = ctxwin_core::EntitySchema::new(&["owner", "decision", "key"]).unwrap_or_default();
    let config = Config {
        context_window: budget + 1024,
        reserved_for_reply: 1024,
        permanent_budget: budget / 20,
        session_budget: budget * 2 / 5,
        working_budget: budget / 2,
        locked_tail: 6,
        observation_limit: 400,
        strategy,
        summary_tokens: 400,
        entity_schema: if strategy == StrategyKind::EntityExtraction {
            schema
        } else {
            Default::default()
        },
        // The split above as written (a 2/5 session level), not capped to the window's shares.
        fit_budgets: false,
        ..Config::DEFAULT
    };
    let mut manager: Box<ContextManager<QualityCapacities>> =
        Box::new(ContextManager::with_config(config).unwrap_or_else(|e| panic!("config: {e}")));
    let _ = manager.push(Message::system(
        "You are a coding agent working on a large service. Keep track of decisions.",
    ));
    let mut clock = 0u64;
    for turn in &session.turns {
        clock += 60_000;
        for message in turn {
            let push = |manager: &mut ContextManager<QualityCapacities>| match message {
                Turn::User(text) => manager.push(Message::user(text).at(clock)),
                Turn::Assistant(text) => manager.push(Message::assistant(text).at(clock)),
                Turn::Calls(text, calls) => {
                    let calls: Vec<ToolCall<'_>> =
                        calls.iter().map(|(i, n, a)| ToolCall::new(i, n, a)).collect();
                    manager.push(Message::assistant(text).with_tool_calls(&calls).at(clock))
                }
                Turn::Result(id, text) => manager.push(Message::tool_result(id, text).at(clock)),
            };
            if let Err(error) = push(&mut manager) {
                panic!("push refused: {error}");
            }
            // What an agent with an archive does: take the evicted units every turn.
            manager.drain_outbox(|_| {});
        }
    }
    let mut body = vec![0u8; 1 << 20];
    let window = manager.budget();
    let payload = manager.compose(&[]).unwrap_or_else(|e| panic!("compose: {e}"));
    assert!(payload.tokens() <= window, "the payload fits the budget");
    let payload_tokens = payload.tokens();
    let len = payload
        .write_openai(&mut body[..], OpenAiRequest::default())
        .unwrap_or_else(|e| panic!("write: {e}"));
    let text = String::from_utf8_lossy(&body[..len]).to_string();
    let kinds =
        [FactKind::Path, FactKind::Number, FactKind::Decision, FactKind::Name, FactKind::Key];
    let kept_fact = |fact: &Fact| text.contains(fact.probe.as_str());
    let by_kind = kinds
        .iter()
        .map(|&kind| {
            let of_kind: Vec<&Fact> = session.facts.iter().filter(|f| f.kind == kind).collect();
            (kind, of_kind.iter().filter(|f| kept_fact(f)).count(), of_kind.len())
        })
        .collect();
    Outcome {
        strategy,
        kept: session.facts.iter().filter(|f| kept_fact(f)).count(),
        facts: session.facts.len(),
        key_kept: session.facts.iter().filter(|f| f.kind == FactKind::Key).all(kept_fact),
        payload_tokens,
        session_tokens: total,
        by_kind,
    }
}
