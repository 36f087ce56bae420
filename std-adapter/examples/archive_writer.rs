//! Measures what the archive port's wrappers save: 200 sessions sharing one SQLite archive
//! file, 20 requests each of two messages (a question and an answer), written (a) directly,
//! one transaction per push, (b) through a `Batched` archive flushed once per request (one
//! transaction per request), and (c) through a `Deferred` archive (one background thread, many
//! requests per transaction). Prints wall and process CPU time (the writer's thread included;
//! the final flush too), transactions, and per request the time of the whole request (two
//! pushes and the flush: the core's work too) and of the flush alone (the archive's part;
//! direct writes commit inside the pushes).
//!
//! ```sh
//! cargo run --release -p ctxwin-std --example archive_writer -- [--threads 4] [--sessions 200] [--requests 20] [--mode all|none|direct|batched|deferred]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxwin_std::session::{Session, SessionBuilder};
use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{ArchiveStore, Batched, Deferred};
use ctxwin_std::{ChatMessage, core::Role};

struct Args {
    threads: usize,
    sessions: usize,
    requests: usize,
    mode: String,
}

fn args() -> Args {
    let mut parsed = Args { threads: 4, sessions: 200, requests: 20, mode: "all".to_string() };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    for pair in raw.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--threads" => parsed.threads = value.parse().unwrap_or(parsed.threads).max(1),
            "--sessions" => parsed.sessions = value.parse().unwrap_or(parsed.sessions),
            "--requests" => parsed.requests = value.parse().unwrap_or(parsed.requests),
            "--mode" => parsed.mode = value,
            other => eprintln!("ignoring {other}"),
        }
    }
    parsed
}

/// Deterministic text of about `words` words (a small xorshift over a vocabulary), so that the
/// full-text and keyword indexes do real work.
fn text(seed: u64, words: usize) -> String {
    const VOCAB: [&str; 24] = [
        "parser", "lexer", "token", "build", "cargo", "test", "failed", "green", "deploy",
        "staging", "postgres", "index", "query", "latency", "thread", "mutex", "archive", "commit",
        "window", "budget", "summary", "session", "proxy", "request",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = String::with_capacity(words * 8);
    for i in 0..words {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let word = VOCAB[(state % VOCAB.len() as u64) as usize];
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if state.is_multiple_of(5) {
            out.push_str(&format!("_{}", state % 997));
        }
    }
    out
}

/// The process's CPU time (user + system), from /proc (Linux).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis comes field 3 (the state); utime and stime are
    // fields 14 and 15, in clock ticks (100 a second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |at: usize| fields.get(at).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    Duration::from_millis(ticks * 10)
}

struct Outcome {
    wall: Duration,
    cpu: Duration,
    transactions: u64,
    rows: u64,
    request_times: Vec<Duration>,
    end_batch_times: Vec<Duration>,
}

/// How the sessions archive.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No archive at all: the core's own cost, for reference.
    None,
    /// One transaction per push.
    Direct,
    /// Through a `Batched` archive flushed after each request.
    Batched,
    /// Through a `Deferred` archive.
    Deferred,
}

fn run(args: &Args, mode: Mode) -> Outcome {
    let dir = tempfile::tempdir().expect("temporary directory");
    let archive = SqliteArchive::open(dir.path().join("archive.db")).expect("archive");
    let deferred = (mode == Mode::Deferred)
        .then(|| Arc::new(Deferred::spawn(archive.clone()).expect("writer thread")));
    let store: Option<Arc<dyn ArchiveStore>> = match mode {
        Mode::None => None,
        Mode::Direct => Some(Arc::new(archive.clone())),
        Mode::Batched => Some(Arc::new(Batched::new(archive.clone()))),
        Mode::Deferred => deferred.clone().map(|d| d as Arc<dyn ArchiveStore>),
    };
    let per_thread = args.sessions.div_ceil(args.threads);
    let cpu_start = cpu_time();
    let start = Instant::now();
    let threads: Vec<_> = (0..args.threads)
        .map(|thread| {
            let store = store.clone();
            let requests = args.requests;
            let names: Vec<String> = (thread * per_thread
                ..((thread + 1) * per_thread).min(args.sessions))
                .map(|i| format!("conversation-{i}"))
                .collect();
            std::thread::spawn(move || {
                let mut sessions: Vec<Session> = names
                    .iter()
                    .map(|name| {
                        let builder = SessionBuilder::new(name);
                        match &store {
                            Some(store) => builder.archive_store(store.clone()),
                            None => builder,
                        }
                        .build()
                        .expect("session")
                    })
                    .collect();
                let mut times = Vec::with_capacity(requests * sessions.len());
                let mut ends = Vec::with_capacity(requests * sessions.len());
                for request in 0..requests {
                    for (index, session) in sessions.iter_mut().enumerate() {
                        let seed = (index * 1_000 + request) as u64;
                        let question = ChatMessage::text(Role::User, text(seed, 40));
                        let answer = ChatMessage::text(Role::Assistant, text(seed + 7, 160));
                        let began = Instant::now();
                        session.push(&question).expect("push");
                        session.push(&answer).expect("push");
                        let ending = Instant::now();
                        if mode == Mode::Batched {
                            session.sync_archive().expect("flush");
                        }
                        ends.push(ending.elapsed());
                        times.push(began.elapsed());
                    }
                }
                for session in &mut sessions {
                    session.sync_archive().expect("sync");
                }
                (times, ends)
            })
        })
        .collect();
    let mut request_times = Vec::new();
    let mut end_batch_times = Vec::new();
    for thread in threads {
        let (times, ends) = thread.join().expect("worker thread");
        request_times.extend(times);
        end_batch_times.extend(ends);
    }
    if let Some(deferred) = &deferred {
        deferred.flush_all().expect("flush");
    }
    let wall = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu_start);
    let rows = archive.stats().expect("count").messages;
    if let Some(deferred) = &deferred {
        let stats = deferred.stats();
        println!(
            "  deferred: {} rows in {} transactions ({:.0} rows each), {:.2} s writing, longest {:.1} ms, peak queue {} rows",
            stats.rows_committed,
            stats.transactions,
            stats.rows_committed as f64 / stats.transactions.max(1) as f64,
            stats.write_time.as_secs_f64(),
            stats.longest_write.as_secs_f64() * 1e3,
            stats.peak_queued_rows,
        );
    }
    let transactions = match (&deferred, mode) {
        (Some(deferred), _) => deferred.stats().transactions,
        (None, Mode::None) => 0,
        (None, Mode::Direct) => (args.sessions * args.requests * 2) as u64,
        // One flush, one transaction, per request.
        (None, _) => (args.sessions * args.requests) as u64,
    };
    request_times.sort();
    end_batch_times.sort();
    Outcome { wall, cpu, transactions, rows, request_times, end_batch_times }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn main() {
    let args = args();
    println!(
        "{} sessions x {} requests x 2 messages, {} threads, one shared archive file",
        args.sessions, args.requests, args.threads
    );
    println!(
        "{:<28} {:>8} {:>8} {:>13} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "mode",
        "wall s",
        "cpu s",
        "transactions",
        "rows",
        "req p50",
        "req p99",
        "req max",
        "flush p50",
        "flush p99"
    );
    let none = (Mode::None, "no archive (reference)");
    let direct = (Mode::Direct, "direct (1 tx per push)");
    let batched = (Mode::Batched, "Batched (1 tx per request)");
    let deferred = (Mode::Deferred, "Deferred");
    let modes = match args.mode.as_str() {
        "none" => vec![none],
        "direct" => vec![direct],
        "batched" => vec![batched],
        "deferred" => vec![deferred],
        _ => vec![none, direct, batched, deferred],
    };
    for (mode, name) in modes {
        let outcome = run(&args, mode);
        println!(
            "{:<28} {:>8.2} {:>8.2} {:>13} {:>7} {:>8.0}µs {:>8.0}µs {:>8.0}µs {:>8.0}µs {:>8.0}µs",
            name,
            outcome.wall.as_secs_f64(),
            outcome.cpu.as_secs_f64(),
            outcome.transactions,
            outcome.rows,
            percentile(&outcome.request_times, 0.50).as_secs_f64() * 1e6,
            percentile(&outcome.request_times, 0.99).as_secs_f64() * 1e6,
            outcome.request_times.last().copied().unwrap_or_default().as_secs_f64() * 1e6,
            percentile(&outcome.end_batch_times, 0.50).as_secs_f64() * 1e6,
            percentile(&outcome.end_batch_times, 0.99).as_secs_f64() * 1e6,
        );
    }
}
