//! A generated multi-task coding-agent history with probe questions about earlier tasks
//! (issue 30's benchmark), and what scores a payload against them.
//!
//! The history is deterministic from a seed: a system prompt, then tens of tasks, each a user
//! request followed by the agent's tool loop (files read, grepped, edited; tests run; long logs),
//! with, per task, maybe a compile or test error and how it was fixed, an approach tried and
//! abandoned, a decision (taken by the agent or asked of the user), and a closing message.
//! Some environment errors recur in later tasks (the same signature, the same resolution).
//! Task boundaries are known here ([`Task`]), so a contender that takes them can be given them.
//!
//! Probes ([`Probe`]) are questions with their evidence: exact strings that a payload must
//! contain for the question to be answerable from it. End probes are asked after the last
//! message, about an earlier task: which files it changed, which error it hit, how that was
//! fixed, what was decided, which approach was abandoned. Repeat probes are asked the moment a
//! recurring error's output arrives again: is the earlier resolution in the payload? Evidence
//! strings are unique to their task (a file changed in one task is never touched by another),
//! and never part of the question.
//!
//! ```
//! use ctxwin_benches::taskprobes::{generate, answered};
//! let history = generate(7, 12);
//! assert_eq!(history.tasks.len(), 12);
//! let everything = history.text_until(history.messages.len());
//! assert!(history.probes.iter().all(|p| answered(&everything, p)));
//! assert!(history.probes.iter().all(|p| !answered("", p)));
//! ```

use std::collections::{BTreeSet, HashMap};

/// Who says a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    /// The system prompt.
    System,
    /// The developer.
    User,
    /// The agent (text, or a tool call with text before it).
    Assistant,
    /// A tool's output.
    Tool,
}

/// One message of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who says it.
    pub speaker: Speaker,
    /// Its text (a tool's output for [`Speaker::Tool`]).
    pub content: String,
    /// The tool call an assistant message makes: (call id, tool name, JSON arguments).
    pub call: Option<(String, String, String)>,
    /// The call a tool output answers.
    pub call_id: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
}

impl Message {
    /// Everything of it a payload can carry: its text and its call's name and arguments.
    pub fn text(&self) -> String {
        match &self.call {
            Some((_, name, arguments)) => format!("{}\n{name} {arguments}", self.content),
            None => self.content.clone(),
        }
    }
}

/// One task: its request and the agent's work on it, `messages[start..end]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// What the developer asked for (the task's first message says it).
    pub title: String,
    /// Index of its first message (the user's request).
    pub start: usize,
    /// Index one past its last message.
    pub end: usize,
    /// Files it changed.
    pub files: Vec<String>,
}

/// What a probe asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// Which files a task changed (every path is evidence).
    Files,
    /// Which error a task ran into.
    Error,
    /// How that error was fixed.
    Fix,
    /// What was decided.
    Decision,
    /// Which approach was abandoned.
    DeadEnd,
    /// Asked when a recurring error shows up again: how was it resolved before?
    Repeat,
}

impl ProbeKind {
    /// Every kind, in table order.
    pub const ALL: [ProbeKind; 6] = [
        ProbeKind::Files,
        ProbeKind::Error,
        ProbeKind::Fix,
        ProbeKind::Decision,
        ProbeKind::DeadEnd,
        ProbeKind::Repeat,
    ];

    /// A short column label.
    pub fn label(self) -> &'static str {
        match self {
            ProbeKind::Files => "files",
            ProbeKind::Error => "error",
            ProbeKind::Fix => "fix",
            ProbeKind::Decision => "decided",
            ProbeKind::DeadEnd => "dead end",
            ProbeKind::Repeat => "repeat",
        }
    }
}

/// A question about an earlier task and the strings its answer needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What it asks about.
    pub kind: ProbeKind,
    /// The task it is about (index into [`TaskHistory::tasks`]).
    pub task: usize,
    /// Asked once the first `at` messages are pushed.
    pub at: usize,
    /// The question (a retrieval query; not part of any payload).
    pub question: String,
    /// Strings that must all appear in the payload.
    pub evidence: Vec<String>,
}

/// A generated history, its task boundaries and its probes.
#[derive(Clone, Debug)]
pub struct TaskHistory {
    /// Every message, the system prompt first.
    pub messages: Vec<Message>,
    /// The tasks, in order; they cover every message but the system prompt.
    pub tasks: Vec<Task>,
    /// The probes, ordered by [`Probe::at`].
    pub probes: Vec<Probe>,
}

impl TaskHistory {
    /// The text of the first `at` messages, one after another (a payload holding all of them).
    pub fn text_until(&self, at: usize) -> String {
        let mut all = String::new();
        for message in self.messages.iter().take(at) {
            all.push_str(&message.text());
            all.push('\n');
        }
        all
    }

    /// The task message `index` belongs to (`None` for the system prompt).
    pub fn task_of(&self, index: usize) -> Option<usize> {
        self.tasks.iter().position(|t| t.start <= index && index < t.end)
    }
}

/// Whether `payload` holds every evidence string of `probe`.
pub fn answered(payload: &str, probe: &Probe) -> bool {
    probe.evidence.iter().all(|e| payload.contains(e.as_str()))
}

/// A small deterministic generator (xorshift64*), so the history is the same on every run.
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

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items.get(self.below(items.len())).copied().unwrap_or_default()
    }
}

/// Components of the service the agent works on: (name, directory).
const COMPONENTS: [(&str, &str); 10] = [
    ("billing", "src/billing"),
    ("auth", "src/auth"),
    ("storage", "src/storage"),
    ("api", "src/api"),
    ("jobs", "src/jobs"),
    ("cache", "src/cache"),
    ("net", "src/net"),
    ("config", "src/config"),
    ("export", "src/export"),
    ("search", "src/search"),
];

/// Task requests: (component index, what to do).
const REQUESTS: [(usize, &str); 40] = [
    (0, "add proration for mid-cycle plan changes"),
    (1, "rotate refresh tokens on every use"),
    (2, "make compaction of old segments incremental"),
    (3, "add cursor pagination to the invoices endpoint"),
    (4, "retry failed webhook deliveries with backoff"),
    (5, "evict cold entries from the session cache first"),
    (6, "reuse HTTP/2 connections to the payment provider"),
    (7, "reload the config file without a restart"),
    (8, "export ledgers as Parquet"),
    (9, "rank search results by recency as well as relevance"),
    (0, "round currency conversions the way accounting expects"),
    (1, "lock accounts after repeated failed logins"),
    (2, "checksum every segment written to disk"),
    (3, "return problem+json bodies for validation errors"),
    (4, "stop the nightly report job from running twice"),
    (5, "warm the cache after a deploy"),
    (6, "time out slow upstream calls after a deadline"),
    (7, "validate the config at startup with clear messages"),
    (8, "stream CSV exports instead of building them in memory"),
    (9, "index product descriptions in three languages"),
    (0, "issue credit notes for refunded invoices"),
    (1, "support passkeys for admin logins"),
    (2, "move blob storage behind a trait for the S3 backend"),
    (3, "rate-limit the public API per tenant"),
    (4, "add a dead-letter queue for poisoned jobs"),
    (5, "cap the cache's memory at a configured size"),
    (6, "add mTLS between the internal services"),
    (7, "read secrets from the vault instead of env vars"),
    (8, "sign export archives so customers can verify them"),
    (9, "suggest spelling corrections for empty searches"),
    (0, "apply tax rules per shipping country"),
    (1, "expire idle sessions after thirty minutes"),
    (2, "snapshot the ledger tables for point-in-time restore"),
    (3, "version the API under a /v2 prefix"),
    (4, "schedule jobs with cron expressions"),
    (5, "share the cache between worker processes"),
    (6, "retry DNS lookups that fail transiently"),
    (7, "layer per-environment config overrides"),
    (8, "export audit logs to the customer's bucket"),
    (9, "highlight matched terms in search snippets"),
];

const STEM_A: [&str; 24] = [
    "ledger", "invoice", "token", "segment", "cursor", "webhook", "session", "conn", "reload",
    "parquet", "rank", "rounding", "lockout", "checksum", "problem", "nightly", "warmup",
    "deadline", "schema", "csv", "lang", "credit", "passkey", "blob",
];
const STEM_B: [&str; 20] = [
    "window", "rotation", "planner", "pager", "retry", "eviction", "pool", "watcher", "writer",
    "scorer", "policy", "guard", "verifier", "mapper", "dedup", "loader", "budget", "encoder",
    "stream", "index",
];
const TESTS: [&str; 12] = [
    "handles_empty_input",
    "rejects_negative_amounts",
    "round_trips_through_json",
    "keeps_order_under_load",
    "expires_after_ttl",
    "survives_restart",
    "reports_clear_errors",
    "respects_the_limit",
    "is_idempotent",
    "merges_adjacent_ranges",
    "counts_every_retry",
    "parses_legacy_format",
];
const CRATES: [&str; 12] = [
    "moka",
    "governor",
    "dashmap",
    "arc-swap",
    "parking_lot",
    "tower",
    "backoff",
    "lru",
    "async-trait",
    "crossbeam",
    "rayon",
    "bytes",
];
const CHATTER: [&str; 8] = [
    "Let me look at the code first.",
    "I'll check how this is wired up.",
    "Looking for the other call sites.",
    "Running the tests to see where we stand.",
    "Let me read the module before changing it.",
    "Checking what depends on this.",
    "I'll run the test suite again.",
    "Let me verify the change.",
];

/// Recurring environment errors: (signature, resolution). The signature is what the tool
/// prints each time; the resolution is what ended it the first time.
const RECURRING: [(&str, &str); 8] = [
    (
        "error: linker `cc` not found",
        "installed `build-essential` in the dev container with apt-get",
    ),
    (
        "Error: Connection refused (os error 111) at tests/common/db.rs:27",
        "started the test database with `docker compose up -d postgres-test`",
    ),
    (
        "Error: SQLITE_BUSY: database is locked (code 5) in tests/common/fixtures.rs",
        "set `busy_timeout` to 5000 ms in tests/common/fixtures.rs",
    ),
    (
        "error: failed to run custom build command for `openssl-sys v0.9.104`",
        "installed `libssl-dev` and set `OPENSSL_NO_VENDOR=1`",
    ),
    (
        "thread 'proptest::strategies' has overflowed its stack",
        "ran the property tests with `RUST_MIN_STACK=8388608`",
    ),
    (
        "error: timed out waiting for lease renewal after 30s (tests/integration/lease.rs:112)",
        "raised `LEASE_RENEW_TIMEOUT` to 90 s in tests/integration/lease.rs",
    ),
    (
        "error[E0463]: can't find crate for `core` (target thumbv7em-none-eabihf)",
        "added the target with `rustup target add thumbv7em-none-eabihf`",
    ),
    (
        "error: no space left on device (os error 28) while writing target/debug/deps",
        "freed the disk with `cargo sweep --time 7` on target/",
    ),
];

/// A CamelCase type name for a snake_case stem.
fn camel(stem: &str) -> String {
    stem.split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map_or(String::new(), |c| c.to_ascii_uppercase().to_string() + chars.as_str())
        })
        .collect()
}

/// A source file's listing: plausible Rust around the file's own identifiers.
fn listing(rng: &mut Rng, stem: &str, lines: usize) -> String {
    let ty = camel(stem);
    let mut out = format!("use crate::error::Error;\n\npub struct {ty} {{\n");
    for i in 0..lines {
        out += &match i % 6 {
            0 => {
                format!("    pub fn step_{i}(&mut self, input: &[u8]) -> Result<usize, Error> {{\n")
            }
            1 => format!(
                "        let total = self.items.iter().map(|x| x.len()).sum::<usize>() + {};\n",
                rng.below(100)
            ),
            2 => "        if total > self.limit { return Err(Error::Limit(total)); }\n".to_string(),
            3 => format!("        self.items.push(input.to_vec()); // slot {}\n", rng.below(64)),
            4 => "        Ok(total)\n".to_string(),
            _ => "    }\n".to_string(),
        };
    }
    out + "}\n"
}

/// `cargo test` output: `tests` passing tests, with `failure` (a failing test's lines) among
/// them when given.
fn test_log(rng: &mut Rng, crate_name: &str, tests: usize, failure: Option<&str>) -> String {
    let mut out = format!(
        "   Compiling {crate_name} v0.4.{}\n    Finished `test` profile [unoptimized + debuginfo] target(s) in {}.{}s\n     Running unittests src/lib.rs (target/debug/deps/{}-{:016x})\n\nrunning {} tests\n",
        rng.below(9),
        3 + rng.below(40),
        rng.below(10),
        crate_name.replace('-', "_"),
        rng.next(),
        tests + usize::from(failure.is_some())
    );
    let failing_at = rng.below(tests.max(1));
    for i in 0..tests {
        let module = rng.pick(&STEM_A);
        let name = rng.pick(&TESTS);
        out += &format!("test {module}::tests::{name}_{i} ... ok\n");
        if i == failing_at
            && let Some(failure) = failure
        {
            out += &format!("test {failure} ... FAILED\n");
        }
    }
    match failure {
        Some(failure) => {
            out += &format!(
                "\nfailures:\n\nfailures:\n    {failure}\n\ntest result: FAILED. {tests} passed; 1 failed; 0 ignored; finished in {}.{:02}s\n",
                rng.below(20),
                rng.below(100)
            );
        }
        None => {
            out += &format!(
                "\ntest result: ok. {tests} passed; 0 failed; 0 ignored; finished in {}.{:02}s\n",
                rng.below(20),
                rng.below(100)
            );
        }
    }
    out
}

/// A unique compile or test error of a task: (tool output, evidence of the error, how it was
/// explained, evidence of the fix, the fix as edit arguments).
struct TaskError {
    output: String,
    signature: String,
    short: String,
    cause: String,
    fix: String,
}

fn task_error(rng: &mut Rng, stem: &str, file: &str, crate_name: &str) -> TaskError {
    let ty = camel(stem);
    let line = 20 + rng.below(300);
    let col = 5 + rng.below(40);
    let ident =
        format!("{stem}_{}", rng.pick(&["total", "limit", "cursor", "state", "count", "key"]));
    let (signature, short, cause, fix) = match rng.below(6) {
        0 => (
            format!(
                "error[E0599]: no method named `apply_{ident}` found for struct `{ty}` in the current scope"
            ),
            "E0599 missing method".to_string(),
            format!("the method lives on the `{ty}Ext` trait, which the module never imports"),
            format!("imported `{ty}Ext` in {file}"),
        ),
        1 => (
            format!("error[E0308]: mismatched types: expected `u64`, found `i64` for `{ident}`"),
            "E0308 type mismatch".to_string(),
            format!("`{ident}` comes from the database as a signed integer"),
            format!("converted `{ident}` with `u64::try_from` and return `{ty}Error::Negative`"),
        ),
        2 => (
            format!(
                "error[E0499]: cannot borrow `self.{ident}` as mutable more than once at a time"
            ),
            "E0499 double borrow".to_string(),
            format!("the loop holds a borrow of `self.{ident}` while calling `self.flush()`"),
            format!("collected the `{ident}` updates first and applied them after the loop"),
        ),
        3 => (
            format!("error[E0382]: borrow of moved value: `{ident}`"),
            "E0382 use after move".to_string(),
            format!("`{ident}` is moved into the spawned task on the first iteration"),
            format!("cloned `{ident}` into each spawned task (`let {ident} = {ident}.clone();`)"),
        ),
        4 => (
            format!("error[E0063]: missing field `{ident}` in initializer of `{ty}`"),
            "E0063 missing field".to_string(),
            format!("the new `{ident}` field is not set in `{ty}::new`"),
            format!("defaulted `{ident}` to `None` in `{ty}::new`"),
        ),
        _ => (
            format!("{stem}::tests::{ident}_matches_fixture"),
            "failing fixture test".to_string(),
            format!("`{ident}` is compared before rounding, so 0.005 differences fail"),
            format!("rounded `{ident}` with `round_half_even` before the comparison"),
        ),
    };
    let output = if signature.starts_with("error[") {
        format!(
            "   Compiling {crate_name} v0.4.{}\n{signature}\n  --> {file}:{line}:{col}\n   |\n{line} |         self.{ident} = next;\n   |         ^^^^^^^^^^^^^^^^^^^\n\nerror: could not compile `{crate_name}` (lib) due to 1 previous error\n",
            rng.below(9)
        )
    } else {
        let failure = format!(
            "{signature}\n\n---- {signature} stdout ----\nthread '{signature}' panicked at {file}:{line}:{col}:\nassertion `left == right` failed\n  left: {}.{:03}\n right: {}.{:03}",
            rng.below(900),
            rng.below(1000),
            rng.below(900),
            rng.below(1000)
        );
        let tests = 20 + rng.below(60);
        test_log(rng, crate_name, tests, Some(&failure))
    };
    TaskError { output, signature, short, cause, fix }
}

/// Builds the history message by message.
struct Writer {
    /// Its own generator for the clock, so callers can draw from theirs in the arguments.
    jitter: Rng,
    messages: Vec<Message>,
    clock: u64,
    calls: usize,
}

impl Writer {
    fn say(&mut self, speaker: Speaker, content: String) {
        self.clock += 10_000 + self.jitter.below(30_000) as u64;
        self.messages.push(Message {
            speaker,
            content,
            call: None,
            call_id: None,
            timestamp: self.clock,
        });
    }

    /// An assistant message calling `tool` with `arguments`, and the tool's `output`.
    fn call(&mut self, text: &str, tool: &str, arguments: String, output: String) {
        self.calls += 1;
        let id = format!("call_{:04}", self.calls);
        self.clock += 5_000 + self.jitter.below(20_000) as u64;
        self.messages.push(Message {
            speaker: Speaker::Assistant,
            content: text.to_string(),
            call: Some((id.clone(), tool.to_string(), arguments)),
            call_id: None,
            timestamp: self.clock,
        });
        self.clock += 1_000 + self.jitter.below(20_000) as u64;
        self.messages.push(Message {
            speaker: Speaker::Tool,
            content: output,
            call: None,
            call_id: Some(id),
            timestamp: self.clock,
        });
    }
}

/// JSON arguments of a tool call (values are plain: no quotes or backslashes to escape).
fn args(pairs: &[(&str, &str)]) -> String {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("\"{k}\": \"{v}\"")).collect();
    format!("{{{}}}", fields.join(", "))
}

/// Generates `tasks` tasks of agent work from `seed`, with their probes.
pub fn generate(seed: u64, tasks: usize) -> TaskHistory {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).max(1));
    let mut w = Writer {
        jitter: Rng(seed.wrapping_add(0x5DEE_CE66).max(1)),
        messages: Vec::new(),
        clock: 1_764_000_000_000,
        calls: 0,
    };
    w.say(Speaker::System,
        "You are a coding agent working in the ledgerd repository (a Rust service). Use the tools to read, search, edit and test; explain decisions briefly.".to_string(),
    );
    let mut used_stems = BTreeSet::new();
    let mut used_approaches = BTreeSet::new();
    let mut spans: Vec<Task> = Vec::new();
    let mut probes: Vec<Probe> = Vec::new();
    // Recurring errors: which task first hits each, and which later tasks hit it again.
    let mut recurring_first: HashMap<usize, usize> = HashMap::new();
    let mut recurring_at: Vec<Vec<usize>> = vec![Vec::new(); tasks];
    let mut order: Vec<usize> = (0..RECURRING.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    for (slot, &error) in order.iter().enumerate().take((tasks / 5).min(RECURRING.len())) {
        let first =
            (slot * tasks / (tasks / 5).max(1) / 2 + rng.below(3)).min(tasks.saturating_sub(8));
        recurring_at[first].push(error);
        recurring_first.insert(error, first);
        let mut later = first + 4 + rng.below(6);
        for _ in 0..1 + rng.below(2) {
            if later < tasks {
                recurring_at[later].push(error);
            }
            later += 5 + rng.below(10);
        }
    }
    for t in 0..tasks {
        let (component, what) = REQUESTS[t % REQUESTS.len()];
        let (component_name, dir) = COMPONENTS[component];
        let title = match t / REQUESTS.len() {
            0 => what.to_string(),
            round => format!("{what} (round {})", round + 1),
        };
        let crate_name = format!("ledgerd-{component_name}");
        let start = w.messages.len();
        let files: Vec<(String, String)> = (0..1 + rng.below(3))
            .map(|_| {
                loop {
                    let stem = format!("{}_{}", rng.pick(&STEM_A), rng.pick(&STEM_B));
                    if used_stems.insert(stem.clone()) {
                        break (format!("{dir}/{stem}.rs"), stem);
                    }
                }
            })
            .collect();
        let (main_file, main_stem) = files[0].clone();
        let request = match rng.below(3) {
            0 => format!("Next task: {title}. The code is in {dir}."),
            1 => format!("Can you {title}? Look around {dir} first."),
            _ => format!("New task — {title}. Keep the public API stable."),
        };
        w.say(Speaker::User, request);
        // Exploration: the component's module, the files to change, a grep.
        w.call(rng.pick(&CHATTER), "read_file", args(&[("path", &format!("{dir}/mod.rs"))]), {
            let lines = 18 + rng.below(20);
            listing(&mut rng, component_name, lines)
        });
        for (file, stem) in &files {
            w.call(rng.pick(&CHATTER), "read_file", args(&[("path", file)]), {
                let lines = 24 + rng.below(48);
                listing(&mut rng, stem, lines)
            });
        }
        let grep: String = (0..4 + rng.below(10))
            .map(|i| {
                format!(
                    "{dir}/{}.rs:{}:    let {}_{i} = ctx.{}();\n",
                    rng.pick(&["mod", "types", "util", "handlers"]),
                    10 + rng.below(400),
                    rng.pick(&STEM_B),
                    rng.pick(&STEM_A)
                )
            })
            .collect();
        w.call(
            "Looking for the other call sites.",
            "grep",
            args(&[("pattern", &camel(&main_stem)), ("path", dir)]),
            grep,
        );
        // Maybe an approach tried and abandoned.
        if rng.chance(45) {
            let approach = loop {
                let candidate = format!(
                    "the `{}` crate ({}.{}.{})",
                    rng.pick(&CRATES),
                    rng.below(2),
                    1 + rng.below(19),
                    rng.below(10)
                );
                if used_approaches.insert(candidate.clone()) {
                    break candidate;
                }
            };
            let (failure, reason) = match rng.below(3) {
                0 => (
                    format!(
                        "error: package requires rustc 1.9{} or newer, the workspace pins 1.87\n",
                        rng.below(4)
                    ),
                    "it needs a newer compiler than the workspace pins".to_string(),
                ),
                1 => (
                    format!(
                        "bench {main_stem}/hot_path  time: [{}.{} ms {}.{} ms {}.{} ms]  change: +{}%\n",
                        8 + rng.below(4),
                        rng.below(10),
                        9 + rng.below(4),
                        rng.below(10),
                        10 + rng.below(4),
                        rng.below(10),
                        140 + rng.below(200)
                    ),
                    "the hot path got more than twice as slow".to_string(),
                ),
                _ => (
                    format!(
                        "error[E0277]: `{}` cannot be shared between threads safely\n",
                        camel(&main_stem)
                    ),
                    "its handles are not Sync, and the worker pool needs them to be".to_string(),
                ),
            };
            w.say(Speaker::Assistant, format!("I'll try {approach} for this first."));
            w.call(
                "Trying it out.",
                "run",
                args(&[("cmd", &format!("cargo bench -p {crate_name} --bench {main_stem}"))]),
                failure,
            );
            w.say(
                Speaker::Assistant,
                format!(
                    "Dropping {approach}: {reason}. I'll do it by hand in {main_file} instead."
                ),
            );
            w.call(
                "Reverting the experiment.",
                "run",
                args(&[("cmd", "git checkout -- Cargo.toml Cargo.lock")]),
                "Updated 2 paths from the index".to_string(),
            );
            probes.push(Probe {
                kind: ProbeKind::DeadEnd,
                task: t,
                at: 0,
                question: format!(
                    "Which approach did we try and abandon when we had to {title}, and why?"
                ),
                evidence: vec![approach],
            });
        }
        // The edits.
        for (file, stem) in &files {
            let hunks = 1 + rng.below(3);
            w.call(
                &format!("Editing {}.", file.rsplit('/').next().unwrap_or_default()),
                "edit_file",
                args(&[
                    ("path", file),
                    ("old", &format!("fn {stem}(")),
                    ("new", &format!("fn {stem}_checked(")),
                ]),
                format!("Applied {hunks} hunk(s) (+{} -{}).", 3 + rng.below(40), rng.below(12)),
            );
        }
        // A decision, the agent's or the developer's.
        if rng.chance(70) {
            let n = 2 + rng.below(58);
            let options = [
                format!("a {n}-second TTL for {main_stem} entries"),
                format!("{n} retries with jittered backoff in {main_stem}"),
                format!("integer cents for every {main_stem} amount"),
                format!("the `{main_stem}_v2` feature flag, off by default"),
                format!("one {main_stem} worker per {n} tenants"),
            ];
            let choice = options[rng.below(options.len())].clone();
            if rng.chance(50) {
                w.say(Speaker::Assistant,
                    format!("Decision: we go with {choice}; it keeps the change small and the behaviour predictable."),
                );
            } else {
                w.say(Speaker::Assistant,
                    format!("Before I go on: should {main_stem} keep the current behaviour, or do you want a change here? I can think of a couple of options."),
                );
                w.say(Speaker::User, format!("Let's use {choice}."));
                w.say(Speaker::Assistant, "Understood, I'll do it that way.".to_string());
            }
            probes.push(Probe {
                kind: ProbeKind::Decision,
                task: t,
                at: 0,
                question: format!("What did we decide when we had to {title}?"),
                evidence: vec![choice],
            });
        }
        // Tests: maybe the task's own error, maybe a recurring one, then green.
        let run = args(&[("cmd", &format!("cargo test -p {crate_name}"))]);
        if rng.chance(65) {
            let error = task_error(&mut rng, &main_stem, &main_file, &crate_name);
            w.call("Running the tests to see where we stand.", "run", run.clone(), error.output);
            w.say(
                Speaker::Assistant,
                format!("That fails because {}. Fix: {}.", error.cause, error.fix),
            );
            w.call(
                "Applying the fix.",
                "edit_file",
                args(&[("path", &main_file), ("note", "fix for the failing build")]),
                "Applied 1 hunk(s).".to_string(),
            );
            probes.push(Probe {
                kind: ProbeKind::Error,
                task: t,
                at: 0,
                question: format!(
                    "Which error did the build or the tests hit when we had to {title}?"
                ),
                evidence: vec![error.signature.clone()],
            });
            probes.push(Probe {
                kind: ProbeKind::Fix,
                task: t,
                at: 0,
                question: format!("How did we fix the {} when we had to {title}?", error.short),
                evidence: vec![error.fix],
            });
        }
        for &e in &recurring_at[t] {
            let (signature, resolution) = RECURRING[e];
            let tests = 3 + rng.below(6);
            let noise = test_log(&mut rng, &crate_name, tests, None);
            let output =
                format!("{}\n{signature}\n", noise.lines().take(3).collect::<Vec<_>>().join("\n"));
            w.call("I'll run the test suite again.", "run", run.clone(), output);
            if recurring_first.get(&e) == Some(&t) {
                w.say(
                    Speaker::Assistant,
                    "That is the environment, not the code. Let me look into it.".to_string(),
                );
                w.call(
                    "Checking the environment.",
                    "run",
                    args(&[("cmd", "env | sort | head -40")]),
                    (0..20 + rng.below(20))
                        .map(|i| format!("VAR_{i}={}\n", rng.next() % 100_000))
                        .collect(),
                );
                w.say(Speaker::Assistant, format!("Resolved: I {resolution}."));
            } else {
                probes.push(Probe {
                    kind: ProbeKind::Repeat,
                    task: recurring_first.get(&e).copied().unwrap_or(t),
                    at: w.messages.len(),
                    question: signature.to_string(),
                    evidence: vec![resolution.to_string()],
                });
                w.say(
                    Speaker::Assistant,
                    "This one again; doing what worked last time.".to_string(),
                );
            }
        }
        let passing = 20 + rng.below(120);
        let log = test_log(&mut rng, &crate_name, passing, None);
        w.call("I'll run the test suite again.", "run", run, log);
        w.say(
            Speaker::Assistant,
            format!("Done: {title}. `cargo test -p {crate_name}` passes ({passing} tests)."),
        );
        probes.push(Probe {
            kind: ProbeKind::Files,
            task: t,
            at: 0,
            question: format!("Which files did we change when we had to {title}?"),
            evidence: files.iter().map(|(f, _)| f.clone()).collect(),
        });
        spans.push(Task {
            title,
            start,
            end: w.messages.len(),
            files: files.into_iter().map(|(f, _)| f).collect(),
        });
        // A pause between tasks.
        w.clock += 120_000 + rng.below(600_000) as u64;
    }
    let end = w.messages.len();
    // End probes are about earlier tasks: not the one still open at the end.
    let last = tasks.saturating_sub(1);
    probes.retain(|p| p.kind == ProbeKind::Repeat || p.task < last);
    for probe in &mut probes {
        if probe.kind != ProbeKind::Repeat {
            probe.at = end;
        }
    }
    probes.sort_by_key(|p| p.at);
    TaskHistory { messages: w.messages, tasks: spans, probes }
}

/// Lower-case words of `text` (letters and digits; everything else separates).
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase)
}

/// Words a query ignores.
const STOP: [&str; 24] = [
    "a", "an", "and", "the", "of", "in", "to", "we", "did", "do", "what", "which", "how", "when",
    "had", "is", "it", "for", "on", "at", "with", "why", "our", "by",
];

/// Okapi BM25 (k1 = 1.2, b = 0.75) over a prefix of a fixed list of documents: term
/// frequencies are counted once, document frequencies per query over the prefix.
pub struct Bm25 {
    docs: Vec<HashMap<String, u32>>,
    lens: Vec<u32>,
}

impl Bm25 {
    /// Indexes `texts`.
    pub fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut docs = Vec::new();
        let mut lens = Vec::new();
        for text in texts {
            let mut tf: HashMap<String, u32> = HashMap::new();
            let mut len = 0;
            for word in words(text) {
                *tf.entry(word).or_default() += 1;
                len += 1;
            }
            docs.push(tf);
            lens.push(len);
        }
        Bm25 { docs, lens }
    }

    /// Documents `0..upto` matching a word of `query`, best first (ties: the newer first).
    pub fn rank(&self, query: &str, upto: usize) -> Vec<(usize, f64)> {
        let upto = upto.min(self.docs.len());
        let mut terms: Vec<String> = words(query).filter(|w| !STOP.contains(&w.as_str())).collect();
        terms.sort();
        terms.dedup();
        let n = upto as f64;
        let average = self.lens[..upto].iter().map(|&l| f64::from(l)).sum::<f64>() / n.max(1.0);
        let idf: Vec<f64> = terms
            .iter()
            .map(|t| {
                let df = self.docs[..upto].iter().filter(|d| d.contains_key(t)).count() as f64;
                ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
            })
            .collect();
        let mut scored: Vec<(usize, f64)> = (0..upto)
            .filter_map(|i| {
                let doc = &self.docs[i];
                let norm = 1.2 * (0.25 + 0.75 * f64::from(self.lens[i]) / average.max(1.0));
                let score: f64 = terms
                    .iter()
                    .zip(&idf)
                    .filter_map(|(t, idf)| {
                        doc.get(t).map(|&f| idf * f64::from(f) * 2.2 / (f64::from(f) + norm))
                    })
                    .sum();
                (score > 0.0).then_some((i, score))
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
        scored
    }
}

/// A payload built outside ctxwin: its text and its token cost.
#[derive(Clone, Debug, Default)]
pub struct Built {
    /// Every message's text, one after another.
    pub text: String,
    /// Tokens it costs (messages framed).
    pub tokens: u32,
}

/// Messages `first..at` of `history` kept by a plain sliding window: the newest that fit
/// `room` tokens (`cost` per message), never starting with a tool output whose call is gone.
pub fn newest_that_fit(
    history: &TaskHistory,
    first: usize,
    at: usize,
    room: u32,
    cost: &dyn Fn(&Message) -> u32,
) -> (Vec<usize>, u32) {
    let mut kept = Vec::new();
    let mut spent = 0;
    for i in (first..at).rev() {
        let c = cost(&history.messages[i]);
        if spent + c > room {
            break;
        }
        spent += c;
        kept.push(i);
    }
    // A tool output at the window's start lost its call: it goes too.
    while let Some(&oldest) = kept.last() {
        if history.messages[oldest].speaker != Speaker::Tool {
            break;
        }
        spent -= cost(&history.messages[oldest]);
        kept.pop();
    }
    kept.reverse();
    (kept, spent)
}

/// The plain sliding window at `budget`: the system prompt and the newest messages that fit.
pub fn sliding_window(
    history: &TaskHistory,
    at: usize,
    budget: u32,
    cost: &dyn Fn(&Message) -> u32,
) -> Built {
    let system = cost(&history.messages[0]);
    let (kept, spent) = newest_that_fit(history, 1, at, budget.saturating_sub(system), cost);
    let mut text = history.messages[0].text();
    for i in kept {
        text.push('\n');
        text.push_str(&history.messages[i].text());
    }
    Built { text, tokens: system + spent }
}

/// The half-recent/half-BM25 baseline at `budget`: the system prompt, the newest messages in
/// half of what is left, then the best BM25 matches for `query` among the older ones (each
/// whole, best first, skipping what does not fit) in the rest.
pub fn recent_and_bm25(
    history: &TaskHistory,
    index: &Bm25,
    query: &str,
    at: usize,
    budget: u32,
    cost: &dyn Fn(&Message) -> u32,
) -> Built {
    let system = cost(&history.messages[0]);
    let room = budget.saturating_sub(system);
    let (recent, spent) = newest_that_fit(history, 1, at, room / 2, cost);
    let mut used = system + spent;
    let mut text = history.messages[0].text();
    let oldest_recent = recent.first().copied().unwrap_or(at);
    for (i, _) in index.rank(query, oldest_recent) {
        if i == 0 {
            continue;
        }
        let c = cost(&history.messages[i]);
        if used + c <= budget {
            used += c;
            text.push('\n');
            text.push_str(&history.messages[i].text());
        }
    }
    for i in recent {
        text.push('\n');
        text.push_str(&history.messages[i].text());
    }
    Built { text, tokens: used }
}
