//! The bill bench: what putting `ctxwin proxy` in front of a coding agent costs, against
//! sending the agent's requests direct, and against a naive client-side trim.
//!
//! ```sh
//! cargo bench -p ctxwin-proxy --bench bill
//! BILL_RUNS=anthropic-proxy-64k cargo bench -p ctxwin-proxy --bench bill   # a subset
//! ```
//!
//! A generated, deterministic coding-agent session ([`session`]: ~200 requests, Anthropic
//! messages API, history growing to ~495k tokens; converted to OpenAI chat completions by
//! [`conversation`]) is sent by a client that always sends its whole history ([`client`]) to
//! a fake upstream ([`upstream`]) that validates like the real API ([`validate`]) and bills
//! with the providers' documented prompt-cache models on the session's simulated clock
//! ([`cache`], [`tokens`]). Runs: direct; through the proxy (the `ctxwin-proxy` binary,
//! [`proxy`]) at windows of 200k, 64k, 32k (Anthropic) and 128k, 32k (OpenAI); a naive
//! client-side trim at the same windows. Then added latency with 0.1–2 MB bodies and 1–20
//! concurrent conversations, and 1,000 identical one-shot requests. `proxy/benches/README.md`
//! explains every column and knob.

mod cache;
mod client;
mod conversation;
mod png;
mod proxy;
mod rng;
mod session;
mod text;
mod tokens;
mod upstream;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use client::{Sent, Trim, Wire};
use conversation::{Conversation, Provider};
use proxy::ProxyProcess;
use session::{MAX_TOKENS, Session};
use upstream::{Record, Upstream};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// How a run sends the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Direct,
    Proxy(u32),
    Naive(u32),
}

#[derive(Clone, Debug)]
struct Spec {
    name: String,
    provider: Provider,
    kind: Kind,
}

impl Spec {
    fn new(provider: Provider, kind: Kind) -> Spec {
        let name = match kind {
            Kind::Direct => format!("{}-direct", provider.name()),
            Kind::Proxy(w) => format!("{}-proxy-{}k", provider.name(), w / 1000),
            Kind::Naive(w) => format!("{}-naive-{}k", provider.name(), w / 1000),
        };
        Spec { name, provider, kind }
    }

    fn window(&self) -> Option<u32> {
        match self.kind {
            Kind::Direct => None,
            Kind::Proxy(w) | Kind::Naive(w) => Some(w),
        }
    }
}

/// A run's requests: what the client saw and what the upstream saw, by step.
struct Outcome {
    spec: Spec,
    sent: Vec<Sent>,
    records: Vec<Record>,
    unscripted: usize,
    warnings: Vec<String>,
    /// The proxy process's CPU time over the run, ms.
    proxy_cpu_ms: Option<u64>,
    seconds: f64,
}

impl Outcome {
    /// The upstream's last record of each step.
    fn by_step(&self) -> HashMap<usize, &Record> {
        self.records.iter().map(|r| (r.step, r)).collect()
    }

    /// The bill of steps `from..` in base-input tokens (OpenAI's cached input at
    /// `openai_cached` × base).
    fn bill(&self, from: usize, openai_cached: f64) -> f64 {
        let bill = |u: &cache::Usage| match self.spec.provider {
            Provider::Anthropic => u.bill(true),
            Provider::OpenAi => u.bill_openai(openai_cached),
        };
        self.records
            .iter()
            .filter(|r| r.status == 200 && r.step >= from)
            .map(|r| bill(&r.usage))
            .sum()
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Per request: the client's time minus the upstream's own, in ms.
fn added_ms(sent: &[Sent], records: &HashMap<usize, &Record>) -> Vec<f64> {
    let mut out: Vec<f64> = sent
        .iter()
        .filter(|s| s.status == 200)
        .filter_map(|s| {
            records
                .get(&s.step)
                .map(|r| (s.client_us.saturating_sub(r.upstream_us)) as f64 / 1000.0)
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

async fn run(spec: Spec, wire: &Wire, http: &reqwest::Client, extra: &str) -> Outcome {
    let started = Instant::now();
    let (addr, upstream) = Upstream::start(vec![wire.conversation.clone()], 0).await;
    let proxy = match spec.kind {
        Kind::Proxy(window) => {
            Some(ProxyProcess::start(addr, &[(wire.conversation.model, window)], extra))
        }
        _ => None,
    };
    let base = proxy.as_ref().map_or_else(|| format!("http://{addr}"), |p| p.base.clone());
    let trim = match spec.kind {
        Kind::Naive(window) => Trim::Naive(window),
        _ => Trim::Full,
    };
    let steps: Vec<usize> = (0..wire.conversation.steps.len()).collect();
    let sent = client::run(http, &base, wire, 0, &steps, trim, &upstream).await;
    let warnings = proxy.as_ref().map(ProxyProcess::warnings).unwrap_or_default();
    let proxy_cpu_ms = proxy.as_ref().map(ProxyProcess::cpu_ms);
    drop(proxy);
    Outcome {
        spec,
        sent,
        records: upstream.records(),
        unscripted: upstream.unscripted(),
        warnings,
        proxy_cpu_ms,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// One line per hidden `Edit` target (`BILL_HIDDEN=1`): the request, the request whose
/// tool results brought its `Read`, whether that result was in the body reduced or gone, and
/// whether the whole history would have fit the window at that request.
fn print_hidden(o: &Outcome, wire: &Wire, window: Option<u32>) {
    let steps = &wire.conversation.steps;
    let read_step =
        |id: &str| steps.iter().position(|s| s.user.iter().any(|m| m.to_string().contains(id)));
    for r in o.records.iter().filter(|r| r.status == 200) {
        for (id, cut) in &r.hidden_reads {
            let from = read_step(id).map_or("?".to_string(), |s| s.to_string());
            let fits = window
                .is_none_or(|w| wire.full_tokens(r.step) + u64::from(MAX_TOKENS) <= u64::from(w));
            println!(
                "{:<22} hidden at request {:>3}: Read from request {from:>3}, {}, the whole history {}",
                "",
                r.step,
                if *cut { "reduced" } else { "gone" },
                if fits { "fit" } else { "did not fit" }
            );
        }
    }
}

fn print_table(outcomes: &[Outcome], wires: &HashMap<&'static str, &Wire>, openai_cached: f64) {
    println!(
        "\n{:<22} {:>6} {:>7} {:>8} {:>5} {:>5} {:>9} {:>9} {:>9} {:>6} {:>13} {:>11}",
        "run",
        "bill×",
        "last50×",
        "readmsg",
        "400",
        "!200",
        "streams",
        "hidden",
        "fit-hid",
        "over",
        "added p50/p99",
        "prompt M/max"
    );
    for o in outcomes {
        let direct = outcomes
            .iter()
            .find(|d| d.spec.provider == o.spec.provider && d.spec.kind == Kind::Direct);
        let n = o.sent.len();
        let from = n.saturating_sub(50);
        let answered = o.records.iter().any(|r| r.status == 200);
        let ratio = |from: usize| {
            if answered {
                direct
                    .map_or(f64::NAN, |d| o.bill(from, openai_cached) / d.bill(from, openai_cached))
            } else {
                f64::NAN
            }
        };
        let ok: Vec<&Record> = o.records.iter().filter(|r| r.status == 200).collect();
        let reads = ok.iter().filter(|r| r.usage.reads_messages).count();
        let upstream_400 = o.records.iter().filter(|r| r.status == 400).count();
        let not_200 = o.sent.iter().filter(|s| s.status != 200).count();
        let streams = o.sent.iter().filter(|s| s.stream && s.status == 200).count();
        let identical =
            o.sent.iter().filter(|s| s.stream && s.status == 200 && s.stream_identical).count();
        let edits: usize = ok.iter().map(|r| r.edits).sum();
        let hidden: usize = ok.iter().map(|r| r.hidden).sum();
        let cut: usize = ok.iter().map(|r| r.hidden_cut).sum();
        let wire = wires[o.spec.provider.name()];
        let window = o.spec.window();
        let fit_hidden: usize = ok
            .iter()
            .filter(|r| {
                window.is_some_and(|w| {
                    wire.full_tokens(r.step) + u64::from(MAX_TOKENS) <= u64::from(w)
                })
            })
            .map(|r| r.hidden)
            .sum();
        let over = window.map_or(0, |w| {
            ok.iter().filter(|r| r.usage.prompt() + u64::from(MAX_TOKENS) > u64::from(w)).count()
        });
        let added = added_ms(&o.sent, &o.by_step());
        let prompt: u64 = ok.iter().map(|r| r.usage.prompt()).sum();
        let max = ok.iter().map(|r| r.usage.prompt()).max().unwrap_or(0);
        println!(
            "{:<22} {:>6.2} {:>7.2} {:>7.0}% {:>5} {:>5} {:>9} {:>9} {:>9} {:>6} {:>13} {:>11}",
            o.spec.name,
            ratio(0),
            ratio(from),
            100.0 * reads as f64 / ok.len().max(1) as f64,
            upstream_400,
            not_200,
            format!("{identical}/{streams}"),
            format!("{hidden}/{edits}"),
            if window.is_some() { format!("{fit_hidden}") } else { "-".into() },
            if window.is_some() { format!("{over}") } else { "-".into() },
            format!("{:.1}/{:.1}", percentile(&added, 0.5), percentile(&added, 0.99)),
            format!("{:.1}/{}k", prompt as f64 / 1e6, max / 1000),
        );
        if let Some(cpu) = o.proxy_cpu_ms {
            println!("{:<22} proxy CPU {:.1} ms per request", "", cpu as f64 / n.max(1) as f64);
        }
        if hidden > 0 {
            println!(
                "{:<22} hidden Edit targets: {cut} in a reduced tool result, {} with their Read gone",
                "",
                hidden - cut
            );
        }
        if std::env::var_os("BILL_HIDDEN").is_some() {
            print_hidden(o, wire, window);
        }
        let answers_bad = o.sent.iter().filter(|s| s.status == 200 && !s.answer_ok).count();
        if answers_bad > 0 {
            println!("{:<22} answers not the scripted one: {answers_bad}", "");
        }
        if o.unscripted > 0 {
            println!("{:<22} requests to the upstream outside the script: {}", "", o.unscripted);
        }
        let mut reasons: HashMap<String, usize> = HashMap::new();
        for reason in o.records.iter().filter_map(|r| r.reason.as_ref()) {
            *reasons.entry(reason.chars().take(160).collect()).or_default() += 1;
        }
        for s in o.sent.iter().filter(|s| {
            s.status != 200 && !o.records.iter().any(|r| r.step == s.step && r.status == 400)
        }) {
            *reasons
                .entry(format!(
                    "{} from the proxy: {}",
                    s.status,
                    s.error.as_deref().unwrap_or("").chars().take(160).collect::<String>()
                ))
                .or_default() += 1;
        }
        for (reason, count) in reasons {
            println!("{:<22} {count} × {reason}", "");
        }
        if !o.warnings.is_empty() {
            println!(
                "{:<22} proxy log: {} warnings, first: {}",
                "",
                o.warnings.len(),
                o.warnings[0].chars().take(200).collect::<String>()
            );
        }
    }
}

fn write_csv(dir: &str, o: &Outcome) {
    let by_step = o.by_step();
    let mut csv = String::from(
        "step,status,stream,stream_identical,full_tokens,prompt,input,cache_write,cache_read,reads_messages,edits,hidden,client_us,upstream_us,sent_bytes,forwarded_bytes,miss\n",
    );
    for s in &o.sent {
        let r = by_step.get(&s.step).copied().cloned().unwrap_or_default();
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            s.step,
            s.status,
            s.stream,
            s.stream_identical,
            s.full_tokens,
            r.usage.prompt(),
            r.usage.input,
            r.usage.cache_write,
            r.usage.cache_read,
            r.usage.reads_messages,
            r.edits,
            r.hidden,
            s.client_us,
            r.upstream_us,
            s.body_bytes,
            r.body_bytes,
            r.miss
        ));
    }
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(format!("{dir}/{}.csv", o.spec.name), csv);
}

/// The body sizes the latency mode reports apart: the lower bound in bytes, and its label.
const SIZE_BUCKETS: [(usize, &str); 3] =
    [(0, "under 0.5 MB"), (500_000, "0.5–1 MB"), (1_000_000, "1 MB and over")];

/// The latency mode's settings.
struct LatencyPlan {
    seed: u64,
    steps: usize,
    lean_tools: bool,
    /// Places in each session where a burst starts.
    points: usize,
    /// Consecutive requests per burst.
    burst: usize,
    /// The fake model's answer time, ms.
    answer_ms: u64,
    window: u32,
    /// Whether conversation `i` of `n` starts `i / n` of an answer time after the first, as
    /// agents that began at different moments do; without it all send their first request at
    /// once (and stay in step: every answer takes the same time).
    stagger: bool,
}

/// Added latency with `conversations` at once. Each conversation (its own seed) sends bursts
/// of consecutive requests at `points` places spread from its first body of 0.1 MB to its last
/// (~2 MB); a burst's first request carries the turns skipped since the last burst (catch-up),
/// the others one turn each (steady state, what an agent does).
async fn latency(http: &reqwest::Client, plan: &LatencyPlan, conversations: usize, extra: &str) {
    let wires: Vec<Arc<Wire>> = (0..conversations)
        .map(|i| {
            let mut session = Session::generate(plan.seed + 1_000 + i as u64, plan.steps);
            if plan.lean_tools {
                session = session.with_lean_tools();
            }
            Arc::new(Wire::new(Arc::new(Conversation::anthropic(&session))))
        })
        .collect();
    let picks: Vec<Vec<(usize, bool)>> = wires
        .iter()
        .map(|w| {
            let n = w.conversation.steps.len();
            let first = (0..n).find(|&k| w.body(k, Trim::Full).0.len() >= 100_000).unwrap_or(0);
            let last = n.saturating_sub(plan.burst);
            let points = plan.points.max(2);
            let mut out = Vec::new();
            for p in 0..points {
                let start = first + (last.saturating_sub(first)) * p / (points - 1);
                for b in 0..plan.burst {
                    if start + b < n && out.last().is_none_or(|&(k, _)| k < start + b) {
                        out.push((start + b, b > 0));
                    }
                }
            }
            out
        })
        .collect();
    for through_proxy in [false, true] {
        let (addr, upstream) =
            Upstream::start(wires.iter().map(|w| w.conversation.clone()).collect(), plan.answer_ms)
                .await;
        let proxy = through_proxy
            .then(|| ProxyProcess::start(addr, &[(session::ANTHROPIC_MODEL, plan.window)], extra));
        let base = proxy.as_ref().map_or_else(|| format!("http://{addr}"), |p| p.base.clone());
        let tasks: Vec<_> = wires
            .iter()
            .zip(&picks)
            .enumerate()
            .map(|(i, (wire, picks))| {
                let (http, base, wire, upstream) =
                    (http.clone(), base.clone(), wire.clone(), upstream.clone());
                let steps: Vec<usize> = picks.iter().map(|&(k, _)| k).collect();
                let offset = match plan.stagger {
                    true => plan.answer_ms * i as u64 / conversations as u64,
                    false => 0,
                };
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis(offset)).await;
                    (i, client::run(&http, &base, &wire, i, &steps, Trim::Full, &upstream).await)
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            if let Ok(result) = task.await {
                all.push(result);
            }
        }
        let cpu = proxy.as_ref().map(ProxyProcess::cpu_ms);
        let records = upstream.records();
        let (mut steady, mut catch_up) = (Vec::new(), Vec::new());
        let mut by_size: Vec<Vec<f64>> = vec![Vec::new(); SIZE_BUCKETS.len()];
        let mut failures: HashMap<String, usize> = HashMap::new();
        let mut sizes = (usize::MAX, 0usize);
        for (conv, sent) in &all {
            let by_step: HashMap<usize, &Record> =
                records.iter().filter(|r| r.conv == *conv).map(|r| (r.step, r)).collect();
            let steady_steps: Vec<usize> =
                picks[*conv].iter().filter(|(_, s)| *s).map(|(k, _)| *k).collect();
            for s in sent {
                sizes = (sizes.0.min(s.body_bytes), sizes.1.max(s.body_bytes));
                if s.status != 200 {
                    *failures
                        .entry(format!(
                            "{} {}",
                            s.status,
                            s.error.as_deref().unwrap_or("").chars().take(120).collect::<String>()
                        ))
                        .or_default() += 1;
                }
            }
            let (a, b): (Vec<Sent>, Vec<Sent>) =
                sent.iter().cloned().partition(|s| steady_steps.contains(&s.step));
            for s in &a {
                let ms = added_ms(std::slice::from_ref(s), &by_step);
                let bucket = SIZE_BUCKETS.iter().rposition(|&(low, _)| s.body_bytes >= low);
                if let (Some(&ms), Some(bucket)) = (ms.first(), bucket) {
                    by_size[bucket].push(ms);
                }
            }
            steady.extend(added_ms(&a, &by_step));
            catch_up.extend(added_ms(&b, &by_step));
        }
        steady.sort_by(f64::total_cmp);
        catch_up.sort_by(f64::total_cmp);
        println!(
            "  {:>2} conversations {:<24} bodies {:.2}–{:.2} MB; steady state ({} requests) p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; catch-up ({}) p50 {:.1} ms, p99 {:.1} ms",
            conversations,
            if through_proxy {
                format!("through the proxy ({}k):", plan.window / 1000)
            } else {
                "direct:".to_string()
            },
            sizes.0 as f64 / 1e6,
            sizes.1 as f64 / 1e6,
            steady.len(),
            percentile(&steady, 0.5),
            percentile(&steady, 0.99),
            steady.last().copied().unwrap_or(f64::NAN),
            catch_up.len(),
            percentile(&catch_up, 0.5),
            percentile(&catch_up, 0.99),
        );
        for ((_, label), mut added) in SIZE_BUCKETS.iter().zip(by_size) {
            added.sort_by(f64::total_cmp);
            if !added.is_empty() {
                println!(
                    "      steady, bodies {label}: p50 {:.1} ms, p99 {:.1} ms ({} requests)",
                    percentile(&added, 0.5),
                    percentile(&added, 0.99),
                    added.len()
                );
            }
        }
        if let Some(cpu) = cpu {
            let requests: usize = all.iter().map(|(_, sent)| sent.len()).sum();
            println!("      proxy CPU {:.1} ms per request", cpu as f64 / requests.max(1) as f64);
        }
        for (reason, count) in failures {
            println!("      {count} × {reason}");
        }
    }
}

/// `count` identical one-shot requests through the proxy: how many are not answered 200.
async fn repeat(http: &reqwest::Client, provider: Provider, count: usize, extra: &str) {
    let one = Session::one_shot();
    let conversation = Arc::new(match provider {
        Provider::Anthropic => Conversation::anthropic(&one),
        Provider::OpenAi => Conversation::openai(&one),
    });
    let wire = Wire::new(conversation.clone());
    let (addr, upstream) = Upstream::start(vec![conversation.clone()], 0).await;
    let proxy = ProxyProcess::start(addr, &[(conversation.model, 200_000)], extra);
    let steps = vec![0usize; count];
    let sent = client::run(http, &proxy.base, &wire, 0, &steps, Trim::Full, &upstream).await;
    let failures: Vec<(usize, &Sent)> =
        sent.iter().enumerate().filter(|(_, s)| s.status != 200).collect();
    match failures.first() {
        None => println!("  {}: {count} identical one-shot requests: all 200", provider.name()),
        Some((first, s)) => println!(
            "  {}: {count} identical one-shot requests: {} not 200, the first at request {} ({}: {})",
            provider.name(),
            failures.len(),
            first + 1,
            s.status,
            s.error.as_deref().unwrap_or("").chars().take(160).collect::<String>()
        ),
    }
}

fn main() {
    let seed = env_usize("BILL_SEED", 27) as u64;
    let steps = env_usize("BILL_STEPS", 200);
    let selected: Vec<String> = std::env::var("BILL_RUNS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let wanted =
        |name: &str| selected.is_empty() || selected.iter().any(|s| name.contains(s.as_str()));
    let extra = std::env::var("BILL_PROXY_TOML").unwrap_or_default();
    let csv = std::env::var("BILL_CSV").ok();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async move {
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("an HTTP client");
        let started = Instant::now();
        let lean_tools = std::env::var("BILL_LEAN_TOOLS").is_ok_and(|v| v == "1");
        let mut session = Session::generate(seed, steps);
        if lean_tools {
            session = session.with_lean_tools();
        }
        let anthropic = Wire::new(Arc::new(Conversation::anthropic(&session)));
        let openai = Wire::new(Arc::new(Conversation::openai(&session)));
        let last = session.turns.len() - 1;
        let edits: usize = session.turns.iter().map(|t| t.edits.len()).sum();
        let streamed = session.turns.iter().filter(|t| t.stream).count();
        let pauses = session.turns.windows(2).filter(|w| w[1].at_ms - w[0].at_ms > cache::CACHE_TTL_MS).count();
        println!(
            "session seed {}{}: {} requests ({streamed} streamed), {} human turns, {edits} Edit calls, {pauses} pauses over 5 min, {:.1} h simulated; history at the last request {} tokens ({:.2} MB Anthropic, {:.2} MB OpenAI); tools + system {} tokens; generated in {:.1} s",
            session.seed,
            if lean_tools { " (lean tools)" } else { "" },
            session.turns.len(),
            session.turns.iter().filter(|t| t.human).count(),
            session.turns[last].at_ms as f64 / 3.6e6,
            anthropic.full_tokens(last),
            anthropic.body(last, Trim::Full).0.len() as f64 / 1e6,
            openai.body(last, Trim::Full).0.len() as f64 / 1e6,
            anthropic.full_tokens(0) - anthropic_first_message_tokens(&anthropic),
            started.elapsed().as_secs_f64()
        );
        println!("history by kind at the last request: {}", composition(&session));
        let mut specs = Vec::new();
        for (provider, windows) in [(Provider::Anthropic, vec![200_000, 64_000, 32_000]), (Provider::OpenAi, vec![128_000, 32_000])] {
            let mut runs: Vec<Spec> = windows.iter().map(|&w| Spec::new(provider, Kind::Proxy(w))).collect();
            runs.extend(windows.iter().map(|&w| Spec::new(provider, Kind::Naive(w))));
            let runs: Vec<Spec> = runs.into_iter().filter(|s| wanted(&s.name)).collect();
            let direct = Spec::new(provider, Kind::Direct);
            if !runs.is_empty() || wanted(&direct.name) {
                specs.push(direct);
            }
            specs.extend(runs);
        }
        let wires: HashMap<&'static str, &Wire> = [("anthropic", &anthropic), ("openai", &openai)].into_iter().collect();
        let mut outcomes = Vec::new();
        for spec in specs {
            let wire = wires[spec.provider.name()];
            let outcome = run(spec, wire, &http, &extra).await;
            eprintln!("  {} done in {:.1} s", outcome.spec.name, outcome.seconds);
            if let Some(dir) = &csv {
                write_csv(dir, &outcome);
            }
            outcomes.push(outcome);
        }
        if !outcomes.is_empty() {
            let openai_cached = std::env::var("BILL_OPENAI_CACHED").ok().and_then(|v| v.parse().ok()).unwrap_or(cache::OPENAI_CACHED_INPUT);
            println!(
                "\nbills in base-input tokens: Anthropic cache write ×{}, read ×{}; OpenAI cached input ×{openai_cached}{}",
                cache::ANTHROPIC_CACHE_WRITE,
                cache::ANTHROPIC_CACHE_READ,
                if openai_cached == cache::OPENAI_CACHED_INPUT { " (gpt-4o)" } else { " (BILL_OPENAI_CACHED)" }
            );
            print_table(&outcomes, &wires, openai_cached);
        }
        if wanted("latency") {
            let levels: Vec<usize> = std::env::var("BILL_CONCURRENCY")
                .unwrap_or_else(|_| "1,20".into())
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            let plan = LatencyPlan {
                seed,
                steps,
                lean_tools,
                points: env_usize("BILL_LAT_POINTS", 5),
                burst: env_usize("BILL_LAT_BURST", 3),
                answer_ms: env_usize("BILL_LAT_ANSWER_MS", 500) as u64,
                window: env_usize("BILL_LAT_WINDOW", 64_000) as u32,
                stagger: env_usize("BILL_LAT_STAGGER", 1) == 1,
            };
            println!(
                "\nadded latency: client time minus the upstream's own time (its {} ms answer included), ms; direct is the client↔upstream hop alone; conversations {}:",
                plan.answer_ms,
                match plan.stagger {
                    true => "started spread over one answer time (BILL_LAT_STAGGER=0: all at once)",
                    false => "all started at once, in step (BILL_LAT_STAGGER=1 spreads them)",
                }
            );
            for level in levels {
                latency(&http, &plan, level, &extra).await;
            }
        }
        if wanted("repeat") {
            let count = env_usize("BILL_REPEAT", 1_000);
            println!("\nrepeat:");
            for provider in [Provider::Anthropic, Provider::OpenAi] {
                repeat(&http, provider, count, &extra).await;
            }
        }
        eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
    });
}

/// Tokens of the first request's messages (to print tools + system alone).
fn anthropic_first_message_tokens(wire: &Wire) -> u64 {
    let conversation = &wire.conversation;
    let mut counter = tokens::Counter::default();
    conversation.steps[0]
        .user
        .iter()
        .map(|m| counter.anthropic_message(m).iter().map(|u| u64::from(u.tokens)).sum::<u64>())
        .sum()
}

/// Tokens of the session's whole history by what they are (tool outputs by tool).
fn composition(session: &Session) -> String {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut kinds: HashMap<String, u64> = HashMap::new();
    let mut total = 0u64;
    for turn in &session.turns {
        for message in [&turn.user, &turn.answer] {
            for block in message["content"].as_array().into_iter().flatten() {
                let tokens = u64::from(tokens::anthropic_block(block));
                total += tokens;
                let kind = match block["type"].as_str().unwrap_or("") {
                    "tool_use" => {
                        names.insert(
                            block["id"].as_str().unwrap_or("").to_string(),
                            block["name"].as_str().unwrap_or("").to_string(),
                        );
                        "tool calls".to_string()
                    }
                    "tool_result" => format!(
                        "{} output",
                        names
                            .get(block["tool_use_id"].as_str().unwrap_or(""))
                            .map_or("?", String::as_str)
                    ),
                    other => other.to_string(),
                };
                *kinds.entry(kind).or_default() += tokens;
            }
        }
    }
    let mut kinds: Vec<(String, u64)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    kinds
        .iter()
        .map(|(k, t)| format!("{k} {:.0}%", 100.0 * *t as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}
