//! What `tests/fleet.rs` runs: a deterministic fake upstream (its answers depend only on what
//! it receives, so two runs of the same requests get the same answers), proxy processes,
//! scripted clients that go round-robin over them and retry on the next one, an instance
//! killer, and readers of what each store archived.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use ctxwin_proxy::hash::KeyedHash;
use ctxwin_std::store::{ArchiveStore, Scope};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{RwLock, Semaphore};

/// The key every client sends (the conversation key is keyed by it).
pub const AUTHORIZATION: &str = "Bearer fleet-test-key";

/// The fake upstream: answers from what it receives, records every body.
pub struct Upstream {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Bytes>>>,
}

impl Upstream {
    pub async fn start() -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self { addr, received }
    }

    /// Every body received since the last call.
    pub fn take(&self) -> Vec<Bytes> {
        std::mem::take(&mut *self.received.lock().unwrap())
    }
}

/// A short stable hash of `value`.
fn tag(value: &Value) -> String {
    format!("{:08x}", ctxwin_proxy::hash::hash_str(&value.to_string()) as u32)
}

fn wants_tools(request: &Value, last: &Value) -> bool {
    let text = match &last["content"] {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    };
    request["tools"].as_array().is_some_and(|t| !t.is_empty()) && text.contains("use tools")
}

async fn openai(State(received): State<Arc<Mutex<Vec<Bytes>>>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    received.lock().unwrap().push(body.clone());
    let last = request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    let t = tag(&last);
    let message = if last["role"] == "user" && wants_tools(&request, &last) {
        let call = |n: usize| json!({"id": format!("call_{t}_{n}"), "type": "function", "function": {"name": "run", "arguments": format!("{{\"step\":{n}}}")}});
        json!({"role": "assistant", "content": null, "tool_calls": [call(0), call(1)], "refusal": null})
    } else {
        json!({"role": "assistant", "content": format!("ack {t}: noted, the build is green and the deploy waits for review."), "refusal": null})
    };
    let prompt = (body.len() / 4) as u64;
    json!({"id": format!("chatcmpl-{t}"), "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 9, "total_tokens": prompt + 9}})
    .to_string()
    .into_response()
}

async fn anthropic(State(received): State<Arc<Mutex<Vec<Bytes>>>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    received.lock().unwrap().push(body.clone());
    let last = request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    let t = tag(&last);
    let content = if last["role"] == "user" && wants_tools(&request, &last) {
        let call = |n: usize| json!({"type": "tool_use", "id": format!("toolu_{t}_{n}"), "name": "run", "input": {"step": n}});
        json!([{"type": "text", "text": format!("calling {t}")}, call(0), call(1)])
    } else {
        json!([{"type": "text", "text": format!("ack {t}: noted, the build is green.")}])
    };
    let prompt = (body.len() / 4) as u64;
    json!({"id": format!("msg_{t}"), "type": "message", "role": "assistant", "model": request["model"],
        "content": content, "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": prompt, "output_tokens": 9}})
    .to_string()
    .into_response()
}

/// A `ctxwin-proxy` process.
pub struct Instance {
    child: tokio::process::Child,
    pub url: String,
}

impl Instance {
    /// Starts one in front of `upstream`: on `state` alone, or with `store_url` in the fleet's
    /// database (the state directory then holds nothing).
    pub async fn spawn(upstream: SocketAddr, state: &Path, store_url: Option<&str>) -> Self {
        let config = state.join("proxy.toml");
        std::fs::write(&config, "[proxy]\ncheckpoint_idle_ms = 300\n").unwrap();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctxwin-proxy"));
        command
            .args(["--upstream", &format!("http://{upstream}"), "--listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(state)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .env_remove("CTXWIN_STORE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(url) = store_url {
            command.env("CTXWIN_STORE_URL", url);
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the proxy did not start within 60 s")
            .unwrap()
            .expect("the proxy exited before listening");
        let url = line.rsplit(' ').next().unwrap().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{line}");
        Self { child, url }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// SIGKILL: nothing of it runs after this.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, and waits for it to checkpoint its conversations and exit.
    pub async fn stop(mut self) {
        let pid = self.child.id().unwrap();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        assert!(sent.unwrap().success());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
        assert!(status.expect("the proxy did not stop within 60 s").unwrap().success());
    }
}

/// Kills instance `victim` when the clients have sent `at_requests[n]` requests, and restarts
/// it.
pub struct Killer {
    pub victim: usize,
    pub at_requests: Vec<usize>,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Requests answered with 200.
    pub acknowledged: usize,
    /// Requests sent again to another instance after one failed (a kill).
    pub retried: usize,
    pub kills: usize,
    /// What the instances sent to PostgreSQL (their `ctxwin_proxy_pg_*` metrics, summed
    /// over the instances running at the end), by metric.
    pub postgres: std::collections::BTreeMap<String, f64>,
    /// Each conversation's items at the end (Anthropic's `system` first), its last answer
    /// included.
    pub histories: Vec<Vec<Value>>,
    /// CPU seconds spent while the requests ran (from their first to the last answer).
    pub cpu: Cpu,
    /// What PostgreSQL ran meanwhile (`pg_stat_statements`, when the server preloads it):
    /// calls, execution ms, rows, statement.
    pub statements: Vec<(i64, f64, i64, String)>,
}

/// CPU seconds (user + system) of the instances and of the PostgreSQL server of
/// `CTXWIN_PG_URL` (every process of it: backends, and those that exited meanwhile through
/// the postmaster's children's times), from `/proc`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub instances: f64,
    pub postgres: f64,
}

impl Cpu {
    fn sample(pids: &[u32]) -> Self {
        let instances = pids.iter().filter_map(|pid| proc_times(*pid)).map(|t| t[0] + t[1]).sum();
        Self { instances, postgres: postgres_cpu().unwrap_or(0.0) }
    }

    fn since(self, before: Self) -> Self {
        Self {
            instances: self.instances - before.instances,
            postgres: self.postgres - before.postgres,
        }
    }
}

/// utime, stime, cutime, cstime of process `pid`, in seconds; and its parent's id.
fn proc_stat(pid: u32) -> Option<([f64; 4], u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).map(|v| v / 100.0);
    let parent = fields.get(1)?.parse().ok()?;
    Some(([tick(11)?, tick(12)?, tick(13)?, tick(14)?], parent))
}

fn proc_times(pid: u32) -> Option<[f64; 4]> {
    proc_stat(pid).map(|(times, _)| times)
}

/// The CPU seconds the PostgreSQL server listening on `CTXWIN_PG_URL`'s port used so far:
/// its postmaster's own and reaped children's, and every live child's.
fn postgres_cpu() -> Option<f64> {
    let url = std::env::var("CTXWIN_PG_URL").ok()?;
    let port = url.rsplit_once(':')?.1.split('/').next()?.to_string();
    let mut processes = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if let Some(stat) = proc_stat(pid) {
            processes.push((
                pid,
                stat,
                args.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>(),
            ));
        }
    }
    let postmaster = processes.iter().find(|(_, _, args)| {
        args.first().is_some_and(|a| a.ends_with("/postgres"))
            && args.windows(2).any(|w| w[0] == "-p" && w[1] == port)
    })?;
    let (master, (own, _), _) = postmaster;
    let children: f64 = processes
        .iter()
        .filter(|(_, (_, parent), _)| parent == master)
        .map(|(_, (times, _), _)| times[0] + times[1])
        .sum();
    Some(own.iter().sum::<f64>() + children)
}

/// 200 conversations of a few turns: OpenAI ones, every fourth Anthropic (with a top-level
/// system prompt); every second uses tools, whose calls come two at a time (an Anthropic
/// turn of two tool results is stored as two parts).
pub struct Scenario {
    pub conversations: usize,
    pub turns: usize,
    /// Requests in flight at once.
    pub clients: usize,
    /// Request `k` of conversation `i` goes to instance `(i + k) % n` (so a conversation
    /// changes instance on nearly every request); otherwise always to `i % n` (the affinity
    /// a load balancer keyed on the session header gives).
    pub round_robin: bool,
}

/// One scripted client conversation.
#[derive(Clone, Debug)]
struct Client {
    index: usize,
    anthropic: bool,
    tools: bool,
    /// OpenAI: the messages; Anthropic: `system` then the messages.
    items: Vec<Value>,
    turn: usize,
    requests: usize,
}

impl Client {
    fn new(index: usize) -> Self {
        let anthropic = index % 4 == 3;
        let system = format!("You are agent {index}. Keep answers short.");
        let items = if anthropic {
            vec![json!(system)]
        } else {
            vec![json!({"role": "system", "content": system})]
        };
        let mut client =
            Self { index, anthropic, tools: index.is_multiple_of(2), items, turn: 0, requests: 0 };
        client.ask();
        client
    }

    /// Adds the next user turn.
    fn ask(&mut self) {
        let tools = if self.tools && self.turn % 2 == 1 { " Please use tools." } else { "" };
        let text = format!(
            "Conversation {} turn {}: which service failed on staging, and who owns it?{tools}",
            self.index, self.turn
        );
        self.items.push(json!({"role": "user", "content": text}));
        self.turn += 1;
    }

    fn path(&self) -> &'static str {
        if self.anthropic { "/v1/messages" } else { "/v1/chat/completions" }
    }

    fn body(&self) -> String {
        let mut body = json!({"model": "fleet-model", "max_tokens": 256});
        if self.anthropic {
            body["system"] = self.items[0].clone();
            body["messages"] = Value::Array(self.items[1..].to_vec());
        } else {
            body["messages"] = Value::Array(self.items.clone());
        }
        if self.tools {
            body["tools"] = if self.anthropic {
                json!([{"name": "run", "description": "Runs a step.", "input_schema": {"type": "object"}}])
            } else {
                json!([{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}])
            };
        }
        body.to_string()
    }

    /// Takes the answer; whether the conversation goes on.
    fn answered(&mut self, answer: &Value, turns: usize) -> bool {
        let message = if self.anthropic {
            json!({"role": "assistant", "content": answer["content"]})
        } else {
            answer["choices"][0]["message"].clone()
        };
        self.items.push(message.clone());
        let calls: Vec<String> = if self.anthropic {
            let blocks = message["content"].as_array().cloned().unwrap_or_default();
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap().to_string())
                .collect()
        } else {
            let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
            calls.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect()
        };
        if !calls.is_empty() {
            self.results(&calls);
            return true;
        }
        if self.turn >= turns {
            return false;
        }
        self.ask();
        true
    }

    fn results(&mut self, calls: &[String]) {
        if self.anthropic {
            let blocks: Vec<Value> = calls
                .iter()
                .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": format!("step {id}: ok, 3 files changed")}))
                .collect();
            self.items.push(json!({"role": "user", "content": blocks}));
        } else {
            for id in calls {
                self.items.push(json!({"role": "tool", "tool_call_id": id, "content": format!("step {id}: ok, 3 files changed")}));
            }
        }
    }
}

/// The instances of a run, replaceable while it goes.
struct Fleet {
    urls: RwLock<Vec<String>>,
    sent: AtomicUsize,
    retried: AtomicUsize,
}

impl Scenario {
    /// Runs every conversation to its end through `instances` (request `k` of conversation
    /// `i` to instance `(i + k) % n`, the next one on a failure), `killer` killing and
    /// restarting one meanwhile; then stops every instance (SIGTERM: they checkpoint).
    pub async fn run(&self, instances: Vec<Instance>, killer: Option<Killer>) -> Outcome {
        let fleet = Arc::new(Fleet {
            urls: RwLock::new(instances.iter().map(|i| i.url.clone()).collect()),
            sent: AtomicUsize::new(0),
            retried: AtomicUsize::new(0),
        });
        let instances =
            Arc::new(tokio::sync::Mutex::new(instances.into_iter().map(Some).collect::<Vec<_>>()));
        let killing = killer
            .map(|killer| tokio::spawn(kill_and_restart(fleet.clone(), instances.clone(), killer)));
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let permits = Arc::new(Semaphore::new(self.clients));
        let pids: Vec<u32> = instances.lock().await.iter().flatten().map(Instance::pid).collect();
        tokio::task::block_in_place(
            ctxwin_std::store::postgres::testing::TestSchema::statement_stats,
        );
        let cpu = Cpu::sample(&pids);
        let mut tasks = Vec::new();
        for index in 0..self.conversations {
            let (fleet, http, permits, turns) =
                (fleet.clone(), http.clone(), permits.clone(), self.turns);
            let round_robin = self.round_robin;
            tasks.push(tokio::spawn(async move {
                let mut client = Client::new(index);
                let mut acknowledged = 0;
                loop {
                    let permit = permits.acquire().await.unwrap();
                    let answer = send(&fleet, &http, &client, round_robin).await;
                    drop(permit);
                    client.requests += 1;
                    acknowledged += 1;
                    if !client.answered(&answer, turns) {
                        return (client.items, acknowledged);
                    }
                }
            }));
        }
        let mut outcome = Outcome::default();
        for task in tasks {
            let (items, acknowledged) = task.await.unwrap();
            outcome.histories.push(items);
            outcome.acknowledged += acknowledged;
        }
        outcome.cpu = Cpu::sample(&pids).since(cpu);
        outcome.statements = tokio::task::block_in_place(
            ctxwin_std::store::postgres::testing::TestSchema::statement_stats,
        )
        .unwrap_or_default();
        if let Some(killing) = killing {
            outcome.kills = killing.await.unwrap();
        }
        for instance in instances.lock().await.iter().flatten() {
            for (name, value) in postgres_counts(&http, &instance.url).await {
                *outcome.postgres.entry(name).or_insert(0.0) += value;
            }
        }
        for instance in instances.lock().await.drain(..).flatten() {
            instance.stop().await;
        }
        outcome.retried = fleet.retried.load(Ordering::Relaxed);
        outcome
    }
}

/// The `ctxwin_proxy_pg_*` lines of the instance at `url`'s `/metrics`.
async fn postgres_counts(http: &reqwest::Client, url: &str) -> Vec<(String, f64)> {
    let Ok(response) =
        http.get(format!("{url}/metrics")).header("authorization", AUTHORIZATION).send().await
    else {
        return Vec::new();
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|line| line.starts_with("ctxwin_proxy_pg_"))
        .filter_map(|line| line.rsplit_once(' '))
        .filter_map(|(name, value)| Some((name.to_string(), value.parse().ok()?)))
        .collect()
}

/// Sends `client`'s next request until an instance answers it with 200.
async fn send(fleet: &Fleet, http: &reqwest::Client, client: &Client, round_robin: bool) -> Value {
    let body = client.body();
    let first = client.index + if round_robin { client.requests } else { 0 };
    for (attempt, target) in (0..200u64).zip(first..) {
        let url = {
            let urls = fleet.urls.read().await;
            format!("{}{}", urls[target % urls.len()], client.path())
        };
        fleet.sent.fetch_add(1, Ordering::Relaxed);
        let sent = http
            .post(&url)
            .header("authorization", AUTHORIZATION)
            .header("x-ctxwin-session", format!("conversation-{}", client.index))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                // A body cut off by a kill is retried like a refused connection.
                if let Ok(answer) = response.json::<Value>().await {
                    return answer;
                }
            }
            Ok(response) => {
                let status = response.status();
                panic!(
                    "conversation {}: {status}: {}",
                    client.index,
                    response.text().await.unwrap_or_default()
                );
            }
            Err(_) => {}
        }
        // The instance is gone (killed): the next one.
        fleet.retried.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10 * (attempt % 10 + 1))).await;
    }
    panic!("conversation {}: no instance answered", client.index);
}

/// Kills instance `victim` as the request count passes each threshold, and restarts it.
async fn kill_and_restart(
    fleet: Arc<Fleet>,
    instances: Arc<tokio::sync::Mutex<Vec<Option<Instance>>>>,
    killer: Killer,
) -> usize {
    let mut kills = 0;
    for at in killer.at_requests {
        while fleet.sent.load(Ordering::Relaxed) < at {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut instances = instances.lock().await;
        let victim = instances[killer.victim].take().unwrap();
        victim.kill().await;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let restarted = respawn(&fleet, killer.victim).await;
        instances[killer.victim] = Some(restarted);
    }
    kills
}

/// Starts instance `n` again with the settings it was started with.
async fn respawn(fleet: &Fleet, n: usize) -> Instance {
    let (upstream, state, store_url) = RESPAWN.lock().unwrap().clone().expect("respawn settings");
    let instance = Instance::spawn(upstream, &state, store_url.as_deref()).await;
    fleet.urls.write().await[n] = instance.url.clone();
    instance
}

/// How the killed instance is started again: set by [`respawn_with`].
static RESPAWN: Mutex<Option<(SocketAddr, std::path::PathBuf, Option<String>)>> = Mutex::new(None);

/// The settings a killed instance restarts with.
pub fn respawn_with(upstream: SocketAddr, state: &Path, store_url: Option<&str>) {
    *RESPAWN.lock().unwrap() = Some((upstream, state.to_path_buf(), store_url.map(str::to_string)));
}

/// One archived row, as compared between runs: its message by fingerprint (the proxy keeps
/// an answer's raw JSON as the upstream sent it or as the client echoed it, whichever came
/// first: `"refusal": null` or not, the same message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub id: u64,
    pub role: String,
    pub text: String,
    pub message: Option<String>,
}

/// Conversation `index`'s provider.
fn provider(index: usize) -> ctxwin_proxy::wire::Provider {
    if index % 4 == 3 {
        ctxwin_proxy::wire::Provider::Anthropic
    } else {
        ctxwin_proxy::wire::Provider::OpenAi
    }
}

/// A message's fingerprint (the proxy's: canonical form), or a JSON value that is not a
/// message (Anthropic's top-level `system`) as it is.
fn fingerprint(index: usize, value: &Value) -> String {
    if !value.is_object() {
        return value.to_string();
    }
    match ctxwin_proxy::wire::analyze_message(provider(index), value) {
        Ok(analyzed) => format!("{:016x}", analyzed.fp),
        Err(reason) => format!("unreadable: {reason}"),
    }
}

fn key(keys: &KeyedHash, index: usize) -> String {
    use ctxwin_proxy::wire::{Provider, Request};
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("authorization", AUTHORIZATION.parse().unwrap());
    headers.insert("x-ctxwin-session", format!("conversation-{index}").parse().unwrap());
    let request = Request::parse(Provider::OpenAi, br#"{"model":"m","messages":[]}"#).unwrap();
    ctxwin_proxy::keys::conversation_key(keys, None, &headers, &request, Provider::OpenAi).unwrap()
}

fn rows_of(archive: &dyn ArchiveStore, keys: &KeyedHash, conversations: usize) -> Vec<Vec<Row>> {
    (0..conversations)
        .map(|index| {
            let scope = Scope::local(key(keys, index).as_str());
            let rows = archive.rows_after(&scope, 0, 100_000).unwrap();
            rows.iter()
                .map(|row| Row {
                    id: row.id,
                    role: format!("{:?}", row.message.role),
                    text: row.full_text().to_string(),
                    message: row.raw.as_deref().map(|raw| {
                        fingerprint(index, &serde_json::from_str(raw).unwrap_or_default())
                    }),
                })
                .collect()
        })
        .collect()
}

/// Every conversation's rows in a single instance's state directory.
pub fn local_rows(state: &Path, scenario: &Scenario) -> Vec<Vec<Row>> {
    let archive = ctxwin_std::store::sqlite::SqliteArchive::open(state.join("archive.db")).unwrap();
    let keys = KeyedHash::for_state_dir(state).unwrap();
    rows_of(&archive, &keys, scenario.conversations)
}

/// Every conversation's rows in the fleet's database (opened off the async threads).
pub fn fleet_rows(url: &str, scenario: &Scenario) -> Vec<Vec<Row>> {
    tokio::task::block_in_place(|| {
        let Ok(ctxwin_proxy::conv::Stores::Fleet(ports)) = ctxwin_proxy::conv::open_fleet(url)
        else {
            panic!("the fleet's database does not open")
        };
        let keys = KeyedHash::new(&ctxwin_proxy::conv::fleet_secret(&ports).unwrap());
        rows_of(ports.archive.as_ref(), &keys, scenario.conversations)
    })
}

/// The names of the conversations with rows in the fleet's database.
pub fn fleet_conversations(url: &str) -> Vec<String> {
    tokio::task::block_in_place(|| {
        let Ok(ctxwin_proxy::conv::Stores::Fleet(ports)) = ctxwin_proxy::conv::open_fleet(url)
        else {
            panic!("the fleet's database does not open")
        };
        ports.archive.conversations("", "").unwrap()
    })
}

/// Whether the rows of conversation `index` hold the messages the client sent, in order,
/// each once: its history `items` but the last answer, which no request carried yet (it waits
/// in a checkpoint until the client's next request brings its copy). The rows that keep a
/// message's raw JSON (its first part's) are the items, by fingerprint.
pub fn holds_history(index: usize, rows: &[Row], items: &[Value]) -> Result<(), String> {
    let items = match items.split_last() {
        Some((last, sent)) if last["role"] == "assistant" => sent,
        _ => items,
    };
    let stored: Vec<&String> = rows.iter().filter_map(|row| row.message.as_ref()).collect();
    if stored.len() != items.len() {
        return Err(format!("{} messages stored, the client holds {}", stored.len(), items.len()));
    }
    for (at, (stored, item)) in stored.iter().zip(items).enumerate() {
        if **stored != fingerprint(index, item) {
            return Err(format!("message {at} is not the one sent: {item}"));
        }
    }
    Ok(())
}

/// The payloads the upstream received, by conversation (its system prompt names it), in
/// order; with `drop_repeats`, a payload equal to the one before (a request forwarded by an
/// instance killed before it answered, then by the next one) counts once. Also how many were
/// dropped.
pub fn by_conversation(payloads: &[Bytes], drop_repeats: bool) -> (Vec<Vec<Bytes>>, usize) {
    let mut by: std::collections::BTreeMap<usize, Vec<Bytes>> = Default::default();
    let mut repeats = 0;
    for body in payloads {
        let value: Value = serde_json::from_slice(body).unwrap();
        let system = value["system"].as_str().or_else(|| value["messages"][0]["content"].as_str());
        let index: usize = system
            .and_then(|s| s.strip_prefix("You are agent "))
            .and_then(|s| s.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a payload names no conversation: {value}"));
        let list = by.entry(index).or_default();
        if drop_repeats && list.last() == Some(body) {
            repeats += 1;
            continue;
        }
        list.push(body.clone());
    }
    (by.into_values().collect(), repeats)
}

/// Leases taken and checkpoints written in the fleet's database, over every conversation.
#[derive(Debug)]
pub struct Usage {
    pub leases: i64,
    pub checkpoints: i64,
}

impl Usage {
    pub fn of(schema: &ctxwin_std::store::postgres::testing::TestSchema) -> Self {
        tokio::task::block_in_place(|| {
            let mut client = schema.client().unwrap();
            let row = client
                .query_one(
                    "SELECT coalesce(sum(fence), 0)::bigint, coalesce(sum(checkpoint_seq), 0)::bigint FROM conversations WHERE tenant = ''",
                    &[],
                )
                .unwrap();
            Self { leases: row.get(0), checkpoints: row.get(1) }
        })
    }
}

/// The load average over the last minute.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}
