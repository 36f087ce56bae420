//! Fault injection: `ctxwin add`, `import`, `compress` and `checkpoint` killed with SIGKILL at
//! random points, at least 200 times, each kill followed by a check that every acknowledged
//! message (its command exited 0) is in the session's archive exactly once, and in the
//! context or archived, never twice.
//!
//! Bounded to under three minutes (about 90 s alone in a debug build); run it alone with
//! `cargo test -p ctxwin-std --test fault_injection -- --nocapture` to see the figures.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod cli_support;
use cli_support::Workdir;

/// A small deterministic generator (xorshift), seeded by the run's start time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The contents of session `main`'s archived messages, with how often each appears.
fn archived_counts(state: &Path) -> BTreeMap<String, u32> {
    let conn = rusqlite::Connection::open(state.join("archive.db")).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = 'main'",
        )
        .unwrap();
    let mut counts = BTreeMap::new();
    for content in stmt.query_map([], |row| row.get::<_, String>(0)).unwrap() {
        *counts.entry(content.unwrap()).or_insert(0) += 1;
    }
    counts
}

enum Op {
    Add(String),
    Import(Vec<String>),
    Compress,
    Checkpoint,
}

#[test]
fn sigkill_at_random_points_loses_and_duplicates_nothing() {
    const KILLS: u32 = 200;
    let budget = Duration::from_secs(170);
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
            | 1;
    let mut rng = Rng(seed);
    let work = Workdir::init();
    let config = work.state().join("ctxwin.toml");
    // A small window, so that adds and imports evict and summarize all the time, and
    // periodic checkpoints inside a command.
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("max_messages = 0", "max_messages = 60")
        .replace("strategy = \"sliding_window\"", "strategy = \"summarization\"")
        .replace("checkpoint_interval_messages = 50", "checkpoint_interval_messages = 7");
    fs::write(&config, text).unwrap();

    let start = Instant::now();
    let mut acknowledged: Vec<String> = Vec::new();
    let (mut kills, mut runs, mut serial) = (0u32, 0u32, 0u32);
    let mut slowest_ms = 40u64;
    while kills < KILLS && start.elapsed() < budget {
        let op = match rng.below(10) {
            0..=4 => {
                serial += 1;
                Op::Add(format!("fault message {serial} seed {seed:x}"))
            }
            5..=7 => Op::Import(
                (0..1 + rng.below(40))
                    .map(|_| {
                        serial += 1;
                        format!("fault import {serial} seed {seed:x}")
                    })
                    .collect(),
            ),
            8 => Op::Compress,
            _ => Op::Checkpoint,
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxwin"));
        command.arg("--dir").arg(work.state()).stdout(Stdio::null()).stderr(Stdio::piped());
        match &op {
            Op::Add(text) => {
                command.args(["add", "user", text]);
            }
            Op::Import(texts) => {
                let lines: String = texts
                    .iter()
                    .map(|t| format!("{{\"role\":\"user\",\"content\":\"{t}\"}}\n"))
                    .collect();
                let file = work.write("batch.jsonl", &lines);
                command.arg("import").arg(file);
            }
            Op::Compress => {
                command.args(["compress", "--target", "30"]);
            }
            Op::Checkpoint => {
                command.arg("checkpoint");
            }
        }
        let began = Instant::now();
        let mut child = command.spawn().unwrap();
        // Seven in eight runs are killed somewhere inside the command's usual run time.
        let kill_at = (rng.below(8) > 0).then(|| Duration::from_millis(rng.below(slowest_ms)));
        let status = match kill_at {
            Some(delay) => {
                std::thread::sleep(delay);
                match child.try_wait().unwrap() {
                    Some(status) => Some(status),
                    None => {
                        child.kill().unwrap();
                        child.wait().unwrap();
                        kills += 1;
                        None
                    }
                }
            }
            None => Some(child.wait().unwrap()),
        };
        runs += 1;
        if let Some(status) = status {
            let elapsed = began.elapsed().as_millis() as u64;
            slowest_ms = slowest_ms.max(elapsed.min(400));
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                use std::io::Read;
                let _ = pipe.read_to_string(&mut stderr);
            }
            assert!(status.success(), "an unkilled run failed: {stderr}");
            match op {
                Op::Add(text) => acknowledged.push(text),
                Op::Import(texts) => acknowledged.extend(texts),
                Op::Compress | Op::Checkpoint => {}
            }
        }
        // The next command must work on what the kill left, and lose nothing acknowledged.
        let stats = work.run(&["stats"]);
        assert_eq!(stats.code, 0, "after run {runs}: {}", stats.stderr);
        let counts = archived_counts(&work.state());
        for text in &acknowledged {
            assert_eq!(counts.get(text), Some(&1), "after run {runs}: {text:?} lost or duplicated");
        }
    }
    // Final check through the command line too: the archive count covers everything.
    let counts = archived_counts(&work.state());
    let lost = acknowledged.iter().filter(|t| !counts.contains_key(*t)).count();
    let duplicated = acknowledged.iter().filter(|t| counts.get(*t).is_some_and(|&n| n > 1)).count();
    println!(
        "fault injection: {runs} runs, {kills} SIGKILLs, {} acknowledged messages, {lost} lost, {duplicated} duplicated, {:.0} s (seed {seed:#x})",
        acknowledged.len(),
        start.elapsed().as_secs_f64()
    );
    assert_eq!((lost, duplicated), (0, 0));
    assert!(kills >= KILLS, "only {kills} kills in {budget:?}");
}
