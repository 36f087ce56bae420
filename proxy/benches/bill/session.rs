//! The generated coding-agent session: what a Claude Code–like agent sends over ~200
//! requests of a working day, in the Anthropic messages API's shape, deterministic from a
//! seed (no network).
//!
//! Request `k` carries the system prompt, the tools and the messages `user[0], answer[0], …,
//! user[k]`; its answer is `answer[k]`. A user message is either a human turn (text, sometimes
//! a pasted PNG) or the results of the previous answer's tool calls. Every answer opens with a
//! signed `thinking` block (some add a `redacted_thinking` one), then text and 1–3 parallel
//! tool calls, or a server-side web search with cited text, or (closing a task) a summary.
//! Tool outputs are file reads in Claude Code's `cat -n` form, test and service logs of
//! 1–40 KB, grep output, errors, images; every `Edit`'s `old_string` is lines copied verbatim
//! from an earlier `Read` of the file that are still unchanged.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::png;
use crate::rng::Rng;
use crate::text::{self, Repo, numbered};

/// The Anthropic model the session asks for.
pub const ANTHROPIC_MODEL: &str = "claude-opus-4-5";
/// `max_tokens` of every request (what the client keeps free for the answer).
pub const MAX_TOKENS: u32 = 8_192;
/// The extended-thinking budget of every request.
pub const THINKING_BUDGET: u32 = 4_096;
/// Where the repository lives on the agent's machine.
pub const ROOT: &str = "/work/acme-billing";

/// An `Edit` call of an answer, and where its `old_string` came from.
#[derive(Clone, Debug)]
pub struct EditRef {
    /// The text the call replaces (lines of the file, without `cat -n` prefixes).
    pub old_string: String,
    /// The id of the `Read` call whose output showed those lines.
    pub read_id: String,
}

/// One request of the session and its scripted answer.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The newest user message (`{"role":"user","content":[…]}`, no `cache_control`).
    pub user: Value,
    /// The assistant message the upstream answers with.
    pub answer: Value,
    /// Whether the request asks for a stream.
    pub stream: bool,
    /// When the request is sent, in ms of simulated time since the session began.
    pub at_ms: u64,
    /// Whether `user` is a human turn (not tool results).
    pub human: bool,
    /// The `Edit` calls of `answer`.
    pub edits: Vec<EditRef>,
}

/// A generated session.
#[derive(Clone, Debug)]
pub struct Session {
    /// The seed it was generated from.
    pub seed: u64,
    /// The two system blocks (the second carries `cache_control`).
    pub system: Vec<Value>,
    /// The tool definitions (the last carries `cache_control`; the first is the server-side
    /// web search).
    pub tools: Vec<Value>,
    /// The requests, in order.
    pub turns: Vec<Turn>,
}

#[derive(Clone, Debug)]
struct Line {
    id: u64,
    text: String,
}

struct Read {
    id: String,
    shown: HashSet<u64>,
}

/// The generator's state: the repository as the agent has changed it and what it has read.
struct Gen {
    rng: Rng,
    files: Vec<(String, Vec<Line>)>,
    reads: HashMap<usize, Read>,
    next_line: u64,
    repo: Repo,
}

fn cache_control() -> Value {
    json!({"type": "ephemeral"})
}

fn system_prompt(rng: &mut Rng) -> Vec<Value> {
    let mut rules = String::from(
        "You are an interactive command-line agent that helps engineers with software tasks in their repository. Use the instructions below and the tools available to you.\n\n# Tone\nBe concise and direct. Explain non-trivial commands before running them. Do not add comments to code unless asked.\n\n# Doing tasks\n",
    );
    for i in 0..70 {
        let (a, b) = (text::verb(rng), text::noun(rng));
        rules.push_str(&match i % 5 {
            0 => format!("- Before you {a} a {b}, read the surrounding module and follow its conventions (naming, error types, logging).\n"),
            1 => format!("- When a test about {b}s fails, reproduce it first, then {a} the smallest change that fixes it; never weaken an assertion.\n"),
            2 => format!("- Prefer editing existing files to creating new ones; the {} module owns {b} logic.\n", text::module(rng)),
            3 => format!("- Run the project's checks after changing {b} code: `cargo test -p billing`, `cargo clippy -- -D warnings`, `npm test` in web/.\n"),
            _ => format!("- Never {a} secrets or customer {b} data into logs, commits or answers.\n"),
        });
    }
    rules.push_str(&format!(
        "\n# Environment\nWorking directory: {ROOT}\nIs directory a git repo: yes\nPlatform: linux\nToday's date: 2026-03-14\nModel: {ANTHROPIC_MODEL}\n\ngitStatus: This is the git status at the start of the conversation.\nCurrent branch: fix/rounding-{}\nMain branch: main\nStatus:\nM crates/billing/src/ledger/posting.rs\n?? notes/rounding.md\n",
        rng.hex(6)
    ));
    vec![
        json!({"type": "text", "text": "You are a coding agent running in the user's terminal."}),
        json!({"type": "text", "text": rules, "cache_control": cache_control()}),
    ]
}

fn tool(name: &str, about: &str, notes: usize, rng: &mut Rng, schema: Value) -> Value {
    let mut description = format!("{about}\n\nUsage notes:\n");
    for _ in 0..notes {
        description.push_str(&format!(
            "- {} When the {} is {}, {} it before calling this tool again; results over 30000 characters are truncated.\n",
            text::reasoning(rng, name, 1), text::noun(rng), text::verb(rng), text::verb(rng)
        ));
    }
    json!({"name": name, "description": description, "input_schema": schema})
}

fn tools(rng: &mut Rng) -> Vec<Value> {
    let path = json!({"type": "string", "description": "The absolute path to the file"});
    let mut list =
        vec![json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 5})];
    list.push(tool("Task", "Launch a sub-agent for a multi-step search or task.", 25, rng, json!({"type": "object", "properties": {"description": {"type": "string"}, "prompt": {"type": "string"}}, "required": ["description", "prompt"]})));
    list.push(tool("Bash", "Executes a bash command in a persistent shell session with an optional timeout.", 45, rng, json!({"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}, "timeout": {"type": "number"}}, "required": ["command"]})));
    list.push(tool("Glob", "Fast file pattern matching; returns matching paths sorted by modification time.", 8, rng, json!({"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"]})));
    list.push(tool("Grep", "A search tool built on ripgrep; supports full regex syntax and output modes.", 20, rng, json!({"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}, "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]}, "-n": {"type": "boolean"}}, "required": ["pattern"]})));
    list.push(tool("Read", "Reads a file from the local filesystem. Lines are returned in cat -n format, numbered from 1. Images (PNG, JPG) are shown visually.", 18, rng, json!({"type": "object", "properties": {"file_path": path, "offset": {"type": "number"}, "limit": {"type": "number"}}, "required": ["file_path"]})));
    list.push(tool("Edit", "Performs exact string replacements in files. old_string must match the file exactly (without the line-number prefix Read shows) and be unique in it. You must Read the file first.", 18, rng, json!({"type": "object", "properties": {"file_path": path, "old_string": {"type": "string"}, "new_string": {"type": "string"}, "replace_all": {"type": "boolean"}}, "required": ["file_path", "old_string", "new_string"]})));
    list.push(tool("Write", "Writes a file to the local filesystem, replacing it.", 8, rng, json!({"type": "object", "properties": {"file_path": path, "content": {"type": "string"}}, "required": ["file_path", "content"]})));
    list.push(tool("WebFetch", "Fetches a URL and answers a prompt about its content.", 10, rng, json!({"type": "object", "properties": {"url": {"type": "string"}, "prompt": {"type": "string"}}, "required": ["url", "prompt"]})));
    let mut todo = tool(
        "TodoWrite",
        "Creates and updates the session's task list.",
        30,
        rng,
        json!({"type": "object", "properties": {"todos": {"type": "array", "items": {"type": "object"}}}, "required": ["todos"]}),
    );
    todo["cache_control"] = cache_control();
    list.push(todo);
    list
}

impl Gen {
    fn tool_id(&mut self) -> String {
        format!("toolu_01{}", self.rng.base62(22))
    }

    fn file_text(&self, f: usize) -> String {
        self.files[f].1.iter().map(|l| l.text.as_str()).collect::<Vec<_>>().join("\n")
    }

    fn thinking(&mut self, subject: &str) -> Value {
        let n = self.rng.range(2, 14);
        let thinking = text::reasoning(&mut self.rng, subject, n);
        let n = self.rng.range(240, 640);
        let signature = self.rng.base64(n);
        json!({"type": "thinking", "thinking": thinking, "signature": signature})
    }

    fn read(&mut self, f: usize, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        let path = format!("{ROOT}/{}", self.files[f].0);
        let lines = &self.files[f].1;
        let (first, count, input) = if lines.len() > 240 && self.rng.chance(0.3) {
            let count = self.rng.range(100, 240);
            let first = self.rng.range(0, lines.len() - count);
            (first, count, json!({"file_path": path, "offset": first + 1, "limit": count}))
        } else {
            (0, lines.len(), json!({"file_path": path}))
        };
        let shown: Vec<&Line> = lines[first..first + count].iter().collect();
        let texts: Vec<String> = shown.iter().map(|l| l.text.clone()).collect();
        let content = numbered(&texts, first + 1);
        let ids = shown.iter().map(|l| l.id).collect();
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Read", "input": input}));
        results.push(json!({"type": "tool_result", "tool_use_id": id, "content": content}));
        self.reads.insert(f, Read { id, shown: ids });
    }

    /// An `Edit` of file `f` from lines its latest `Read` showed that are unchanged since.
    fn edit(
        &mut self,
        f: usize,
        blocks: &mut Vec<Value>,
        results: &mut Vec<Value>,
    ) -> Option<EditRef> {
        let read = self.reads.get(&f)?;
        let lines = &self.files[f].1;
        let text = self.file_text(f);
        let start = self.rng.range(0, lines.len().saturating_sub(1));
        let mut chosen = None;
        for offset in 0..lines.len() {
            let i = (start + offset) % lines.len();
            let line = &lines[i];
            if line.text.len() < 25 || !read.shown.contains(&line.id) {
                continue;
            }
            let mut k = 1;
            let want = self.rng.range(1, 4);
            while k < want && i + k < lines.len() && read.shown.contains(&lines[i + k].id) {
                k += 1;
            }
            let old: Vec<&str> = lines[i..i + k].iter().map(|l| l.text.as_str()).collect();
            let old = old.join("\n");
            if text.matches(&old).count() == 1 {
                chosen = Some((i, k, old));
                break;
            }
        }
        let (i, k, old_string) = chosen?;
        let read_id = read.id.clone();
        let mut new_lines: Vec<String> =
            self.files[f].1[i..i + k].iter().map(|l| l.text.clone()).collect();
        match self.rng.range(0, 2) {
            0 => {
                let indent: String = new_lines[0].chars().take_while(|c| *c == ' ').collect();
                new_lines.insert(
                    0,
                    format!(
                        "{indent}// Round once at the boundary (was per line item): {}.",
                        text::word(&mut self.rng)
                    ),
                );
            }
            1 => {
                let last = new_lines.len() - 1;
                new_lines[last] = new_lines[last].replacen("total", "subtotal", 1) + " // checked";
            }
            _ => {
                let indent: String = new_lines[0].chars().take_while(|c| *c == ' ').collect();
                new_lines.push(format!(
                    "{indent}debug_assert!(total.is_non_negative(), \"{}\");",
                    text::word(&mut self.rng)
                ));
            }
        }
        let new_string = new_lines.join("\n");
        let id = self.tool_id();
        let path = format!("{ROOT}/{}", self.files[f].0);
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Edit", "input": {"file_path": path, "old_string": old_string, "new_string": new_string}}));
        let replacement: Vec<Line> = new_lines
            .into_iter()
            .map(|text| {
                self.next_line += 1;
                Line { id: self.next_line, text }
            })
            .collect();
        let added = replacement.len();
        self.files[f].1.splice(i..i + k, replacement);
        let from = i.saturating_sub(4);
        let to = (i + added + 4).min(self.files[f].1.len());
        let snippet: Vec<String> =
            self.files[f].1[from..to].iter().map(|l| l.text.clone()).collect();
        results.push(json!({"type": "tool_result", "tool_use_id": id, "content": format!(
            "The file {path} has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\n{}",
            numbered(&snippet, from + 1)
        )}));
        Some(EditRef { old_string, read_id })
    }

    fn bash(&mut self, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        let (command, output, error) = match self.rng.range(0, 9) {
            0..=5 => {
                let failing = self.rng.chance(0.4);
                let bytes = self.rng.log_uniform(1_000, 40_000);
                (
                    "cargo test -p billing 2>&1 | tail -n 600".to_string(),
                    text::cargo_test_log(&mut self.rng, &self.repo, bytes, failing),
                    failing,
                )
            }
            6..=7 => {
                let bytes = self.rng.log_uniform(1_000, 40_000);
                (
                    "tail -n 500 logs/billing-api.log".to_string(),
                    text::server_log(&mut self.rng, bytes),
                    false,
                )
            }
            8 => (
                "cargo build -p billing 2>&1".to_string(),
                text::compile_error(&mut self.rng, &self.repo),
                true,
            ),
            _ => (
                "git status --short && git diff --stat".to_string(),
                format!(
                    " M crates/billing/src/ledger/posting.rs\n M {}\n 2 files changed, {} insertions(+), {} deletions(-)",
                    self.rng.pick(&self.repo.files).path,
                    self.rng.range(1, 40),
                    self.rng.range(1, 20)
                ),
                false,
            ),
        };
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command, "description": "Run the checks"}}));
        let mut result = json!({"type": "tool_result", "tool_use_id": id, "content": output});
        if error {
            result["is_error"] = json!(true);
        }
        results.push(result);
    }

    fn grep(&mut self, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        let pattern = text::word(&mut self.rng);
        let repo = Repo {
            files: self
                .files
                .iter()
                .map(|(p, l)| text::File {
                    path: p.clone(),
                    lines: l.iter().map(|l| l.text.clone()).collect(),
                })
                .collect(),
        };
        let output = text::grep(&repo, &pattern, 80);
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Grep", "input": {"pattern": pattern, "output_mode": "content", "-n": true}}));
        results.push(json!({"type": "tool_result", "tool_use_id": id, "content": output}));
    }

    fn glob(&mut self, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        let module = text::module(&mut self.rng);
        let paths: Vec<String> = self
            .files
            .iter()
            .filter(|(p, _)| p.contains(module) || self.rng.chance(0.2))
            .map(|(p, _)| format!("{ROOT}/{p}"))
            .collect();
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Glob", "input": {"pattern": format!("**/*{module}*")}}));
        results.push(json!({"type": "tool_result", "tool_use_id": id, "content": if paths.is_empty() { "No files found".to_string() } else { paths.join("\n") }}));
    }

    fn missing_file(&mut self, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("{ROOT}/src/{}/{}.rs", text::module(&mut self.rng), text::noun(&mut self.rng))}}));
        results.push(json!({"type": "tool_result", "tool_use_id": id, "is_error": true, "content": format!("<tool_use_error>File does not exist. Current working directory: {ROOT}</tool_use_error>")}));
    }

    fn read_image(&mut self, blocks: &mut Vec<Value>, results: &mut Vec<Value>) {
        let id = self.tool_id();
        let (w, h) = (self.rng.range(600, 1400) as u32, self.rng.range(400, 900) as u32);
        let data = png::screenshot(&mut self.rng, w, h);
        blocks.push(json!({"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("{ROOT}/docs/screenshots/{}-{}.png", text::module(&mut self.rng), self.rng.hex(4))}}));
        results.push(json!({"type": "tool_result", "tool_use_id": id, "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}));
    }

    /// The server-side web search blocks of an answer, and its cited text.
    fn web_search(&mut self, blocks: &mut Vec<Value>) {
        let id = format!("srvtoolu_01{}", self.rng.base62(22));
        let query = format!(
            "{} {} half-even rounding {}",
            text::verb(&mut self.rng),
            text::noun(&mut self.rng),
            self.rng.pick(&[
                "rust decimal",
                "postgres numeric",
                "stripe api",
                "ISO 4217 minor units"
            ])
        );
        let mut results = Vec::new();
        for i in 0..5 {
            let n = self.rng.range(1_500, 5_000);
            let encrypted = self.rng.base64(n);
            let host = self.rng.pick(&[
                "docs.rs",
                "stackoverflow.com",
                "github.com",
                "postgresql.org",
                "stripe.com",
                "blog.rust-lang.org",
            ]);
            results.push(json!({"type": "web_search_result", "url": format!("https://{host}/{}/{}", text::noun(&mut self.rng), self.rng.hex(8)), "title": format!("{} {} — {host} ({i})", text::verb(&mut self.rng), text::noun(&mut self.rng)), "encrypted_content": encrypted, "page_age": format!("{} days ago", self.rng.range(1, 900))}));
        }
        blocks.push(json!({"type": "text", "text": "Let me check how other libraries round money amounts."}));
        blocks.push(json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": query}}));
        blocks
            .push(json!({"type": "web_search_tool_result", "tool_use_id": id, "content": results}));
        let cite = |rng: &mut Rng, r: &Value| json!({"type": "web_search_result_location", "url": r["url"], "title": r["title"], "encrypted_index": rng.base64(96), "cited_text": text::reasoning(rng, "rounding", 1)});
        let citations = vec![cite(&mut self.rng, &results[0]), cite(&mut self.rng, &results[2])];
        blocks.push(json!({"type": "text", "text": "Banker's rounding (half to even) is applied once, on the final amount in minor units, not per line item.", "citations": citations}));
        blocks.push(json!({"type": "text", "text": format!(" So the {} should keep full precision until the total is computed.", text::noun(&mut self.rng))}));
    }
}

fn human_text(rng: &mut Rng, task: usize) -> String {
    let (noun, verb, module) = (text::noun(rng), text::verb(rng), text::module(rng));
    let n = rng.range(1, 4);
    let detail = text::reasoning(rng, module, n);
    match task % 4 {
        0 => format!(
            "The {noun} totals are off by one cent when a coupon and a tax rate apply together. Can you find out why and fix it? The failing test is {module}::tests::rounds_{noun}_half_even. {detail}"
        ),
        1 => format!(
            "Now please {verb} the {noun} export so it streams rows instead of loading the whole {module} table; keep the CSV columns the same. {detail}"
        ),
        2 => format!(
            "Something in {module} is slow in production, see the logs. Find the cause and make it faster without changing the API. {detail}"
        ),
        _ => format!(
            "Add a `{verb}_{noun}` endpoint to the {module} API with tests, following how the existing handlers are written. {detail}"
        ),
    }
}

impl Session {
    /// The session of `steps` requests generated from `seed`.
    pub fn generate(seed: u64, steps: usize) -> Session {
        let mut rng = Rng::new(seed);
        let system = system_prompt(&mut rng);
        let tools = tools(&mut rng);
        let repo = Repo::generate(&mut rng, 40);
        let mut next_line = 0u64;
        let files = repo
            .files
            .iter()
            .map(|f| {
                let lines = f.lines.iter().map(|t| {
                    next_line += 1;
                    Line { id: next_line, text: t.clone() }
                });
                (f.path.clone(), lines.collect())
            })
            .collect();
        let mut g = Gen { rng, files, reads: HashMap::new(), next_line, repo };
        let mut turns: Vec<Turn> = Vec::with_capacity(steps);
        let mut clock = 0u64;
        let mut task = 0;
        let mut pending: Option<Vec<Value>> = None;
        while turns.len() < steps {
            // A human turn opens a task.
            if task > 0 {
                clock += if g.rng.chance(0.25) {
                    g.rng.range(6 * 60_000, 45 * 60_000)
                } else {
                    g.rng.range(20_000, 240_000)
                } as u64;
            }
            let mut content = Vec::new();
            if g.rng.chance(0.2) {
                let (w, h) = (g.rng.range(800, 1500) as u32, g.rng.range(500, 950) as u32);
                content.push(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png::screenshot(&mut g.rng, w, h)}}));
            }
            content.push(json!({"type": "text", "text": human_text(&mut g.rng, task)}));
            let mut user = json!({"role": "user", "content": content});
            let mut human = true;
            let length = g.rng.range(5, 17);
            let focus: Vec<usize> =
                (0..g.rng.range(2, 4)).map(|_| g.rng.range(0, g.files.len() - 1)).collect();
            let search_task = g.rng.chance(0.3);
            for i in 0..length {
                if turns.len() >= steps {
                    break;
                }
                if i > 0 {
                    match pending.take() {
                        Some(results) => {
                            user = json!({"role": "user", "content": results});
                            human = false;
                        }
                        // An answer without tool calls inside a task: the human says go on.
                        None => {
                            user = json!({"role": "user", "content": [{"type": "text", "text": "Sounds right, go ahead and apply it."}]});
                            human = true;
                        }
                    }
                }
                let subject = g.files[focus[0]].0.clone();
                let mut blocks = vec![g.thinking(&subject)];
                if g.rng.chance(0.08) {
                    let n = g.rng.range(300, 1_500);
                    blocks.push(json!({"type": "redacted_thinking", "data": g.rng.base64(n)}));
                }
                let mut results = Vec::new();
                let mut edits = Vec::new();
                let last = i + 1 == length;
                if last {
                    let n = g.rng.range(3, 12);
                    blocks.push(json!({"type": "text", "text": format!("Done. {}\n\nChanged files:\n- {}\n- {}", text::reasoning(&mut g.rng, &subject, n), g.files[focus[0]].0, g.files[*focus.last().unwrap_or(&0)].0)}));
                } else {
                    if g.rng.chance(0.4) {
                        let n = g.rng.range(1, 2);
                        blocks.push(json!({"type": "text", "text": text::reasoning(&mut g.rng, &subject, n)}));
                    }
                    let editable: Vec<usize> =
                        focus.iter().copied().filter(|f| g.reads.contains_key(f)).collect();
                    let roll = g.rng.unit();
                    if i == 1 && search_task {
                        g.web_search(&mut blocks);
                        if g.rng.chance(0.5) {
                            g.read(focus[0], &mut blocks, &mut results);
                        }
                    } else if roll < 0.28 && i > 0 && (!editable.is_empty() || !g.reads.is_empty())
                    {
                        let calls = if g.rng.chance(0.2) { 2 } else { 1 };
                        for _ in 0..calls {
                            let f = if !editable.is_empty() && g.rng.chance(0.8) {
                                *g.rng.pick(&editable)
                            } else {
                                let known: Vec<usize> = g
                                    .reads
                                    .keys()
                                    .copied()
                                    .collect::<std::collections::BTreeSet<_>>()
                                    .into_iter()
                                    .collect();
                                *g.rng.pick(&known)
                            };
                            if let Some(edit) = g.edit(f, &mut blocks, &mut results) {
                                edits.push(edit);
                            }
                        }
                        if edits.is_empty() {
                            g.bash(&mut blocks, &mut results);
                        }
                    } else if roll < 0.54 {
                        let calls = match g.rng.unit() {
                            x if x < 0.5 => 1,
                            x if x < 0.8 => 2,
                            _ => 3,
                        };
                        for _ in 0..calls {
                            let f = if g.rng.chance(0.7) {
                                *g.rng.pick(&focus)
                            } else {
                                g.rng.range(0, g.files.len() - 1)
                            };
                            g.read(f, &mut blocks, &mut results);
                        }
                    } else if roll < 0.68 {
                        g.grep(&mut blocks, &mut results);
                        if g.rng.chance(0.5) {
                            let f = *g.rng.pick(&focus);
                            g.read(f, &mut blocks, &mut results);
                        }
                    } else if roll < 0.71 {
                        g.glob(&mut blocks, &mut results);
                    } else if roll < 0.74 {
                        g.missing_file(&mut blocks, &mut results);
                    } else if roll < 0.755 {
                        g.read_image(&mut blocks, &mut results);
                    } else {
                        g.bash(&mut blocks, &mut results);
                    }
                }
                let stream = g.rng.chance(0.3);
                turns.push(Turn {
                    user: user.clone(),
                    answer: json!({"role": "assistant", "content": blocks}),
                    stream,
                    at_ms: clock,
                    human,
                    edits,
                });
                pending = (!results.is_empty()).then_some(results);
                clock += g.rng.log_uniform(3_000, 40_000) as u64;
            }
            pending = None;
            task += 1;
        }
        Session { seed, system, tools, turns }
    }

    /// A one-shot request (a title or quota probe: system, tools, one user message), answered
    /// with a short text.
    pub fn one_shot() -> Session {
        let mut rng = Rng::new(1);
        let system = system_prompt(&mut rng);
        let tools = tools(&mut rng);
        let turn = Turn {
            user: json!({"role": "user", "content": [{"type": "text", "text": "quota"}]}),
            answer: json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}),
            stream: false,
            at_ms: 0,
            human: true,
            edits: Vec::new(),
        };
        Session { seed: 1, system, tools, turns: vec![turn] }
    }

    /// The same session with tool descriptions cut to their first paragraph (about 1,500
    /// tokens of tools instead of about 9,000): for a window too small for Claude Code's tools.
    pub fn with_lean_tools(mut self) -> Session {
        for tool in &mut self.tools {
            if let Some(description) = tool["description"].as_str() {
                let lean =
                    description.split("\n\nUsage notes:").next().unwrap_or(description).to_string();
                tool["description"] = Value::String(lean);
            }
        }
        self
    }

    /// Whether answer `k` ends its task (no tool calls).
    pub fn stop_reason(answer: &Value) -> &'static str {
        let calls =
            answer["content"].as_array().is_some_and(|b| b.iter().any(|b| b["type"] == "tool_use"));
        if calls { "tool_use" } else { "end_turn" }
    }
}
