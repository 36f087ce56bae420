//! Exact instruction counts (valgrind callgrind, through gungraun) of a turn, push, compose,
//! snapshot and restore at 100, 1k, 10k and 100k messages of history, and of the typical turn
//! under each strategy at 10k, so a regression shows up as a number rather than as noise.
//!
//! ```text
//! cargo install --locked gungraun-runner --version 0.20.0   # once; must match gungraun
//! cargo bench -p ctxwin-benches --bench instructions -- --save-baseline=main
//! cargo bench -p ctxwin-benches --bench instructions -- --baseline=main --callgrind-limits='ir=1%'
//! ```
//!
//! The last command exits with code 3 when any count grew by more than 1%. Without the
//! runner (or valgrind) on `PATH` the bench prints how to install it and exits 0, unless
//! `CTXWIN_REQUIRE_GUNGRAUN` is set.
//!
//! The histories are built natively once, by the global setup, and saved as snapshots under
//! the target directory; each benchmark's setup (not counted) restores one. Each history is
//! then settled (`Driver::settle`): copies of one turn run until two compactions, so every
//! history's window holds the same messages at the same point of the water-mark cycle. A
//! turn's cost follows the size of the window it writes, which the water marks let range from
//! half the budget to all of it; settled histories differ only in their length, which is
//! what the counts must not grow with.

use std::hint::black_box;
use std::path::PathBuf;

use ctxwin_benches::replay::{Session, Turn, core_messages, tool_calls};
use ctxwin_benches::workload::{
    BODY_CAPACITY, DYNAMIC, Driver, HISTORY_LENGTHS, Manager, managers_at, managers_settled,
    run_turn, turn_config,
};
use ctxwin_core::{Message, OpenAiRequest, StrategyKind};
use gungraun::{library_benchmark, library_benchmark_group};

/// Where the global setup leaves the histories' snapshots.
const HISTORY_DIR: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/ctxwin-instructions");

fn history_path(length: usize) -> PathBuf {
    PathBuf::from(HISTORY_DIR).join(format!("history-{length}.bin"))
}

/// History length of the per-strategy probes (as the `turn` bench's `turn_by_strategy`).
const STRATEGY_HISTORY: usize = 10_000;

fn strategy_path(strategy: StrategyKind) -> PathBuf {
    PathBuf::from(HISTORY_DIR).join(format!("strategy-{}.bin", strategy.as_str()))
}

fn before_compaction_path(length: usize) -> PathBuf {
    PathBuf::from(HISTORY_DIR).join(format!("before-compaction-{length}.bin"))
}

/// Global setup: replays the session to every history length and saves each manager as
/// the caller's clock (8 bytes, little endian) followed by its snapshot.
fn write_histories() {
    let session = Session::load().expect("shipped session");
    let config = turn_config(StrategyKind::SlidingWindow);
    let drivers = managers_settled(&session, config, &HISTORY_LENGTHS).expect("replay");
    std::fs::create_dir_all(HISTORY_DIR).expect("history directory");
    let mut buffer = vec![0u8; Manager::SNAPSHOT_MAX_SIZE];
    for ((reached, driver), length) in drivers.iter().zip(HISTORY_LENGTHS) {
        save(&mut buffer, driver, &history_path(length));
        let before = before_compaction(driver);
        save(&mut buffer, &before, &before_compaction_path(length));
        eprintln!("history {length}: {reached} messages, compaction after {}", before.messages());
    }
    // Each strategy's own history, replayed under it (not settled: the strategies that
    // summarize do not fall into the sliding window's two-fill loop).
    for strategy in StrategyKind::ALL {
        let config = turn_config(strategy);
        let drivers = managers_at(&session, config, &[STRATEGY_HISTORY]).expect("replay");
        let (reached, driver) = drivers.first().expect("one history");
        save(&mut buffer, driver, &strategy_path(strategy));
        eprintln!("history {STRATEGY_HISTORY} under {}: {reached} messages", strategy.as_str());
    }
}

/// `driver` advanced by copies of the probe turn to the last turn boundary before the next
/// compaction: the probe turn run there compacts.
fn before_compaction<'s>(driver: &Driver<'s>) -> Driver<'s> {
    let compacts_next = |driver: &Driver<'_>| {
        let mut trial = driver.clone();
        let before = trial.manager().stats().counters.compactions;
        assert!(trial.run_copy().expect("copy runs"), "session has turns");
        trial.manager().stats().counters.compactions != before
    };
    let mut at = driver.clone();
    for _ in 0..1_000 {
        if compacts_next(&at) {
            return at;
        }
        at.run_copy().expect("copy runs");
    }
    panic!("no compaction within 1,000 copies of the probe turn");
}

/// Saves the driver's clock (8 bytes, little endian) followed by its manager's snapshot.
fn save(buffer: &mut [u8], driver: &Driver<'_>, path: &std::path::Path) {
    let snapshot = driver.manager().snapshot_into(buffer).expect("snapshot fits");
    let mut file = driver.clock().to_le_bytes().to_vec();
    file.extend_from_slice(snapshot);
    std::fs::write(path, file).expect("write history");
}

/// The manager saved for `length`, and the clock for its next message.
fn history(length: usize) -> (Box<Manager>, u64) {
    load(&history_path(length))
}

/// The manager saved at `path` by [`save`], and the clock for its next message.
fn load(path: &std::path::Path) -> (Box<Manager>, u64) {
    let file = std::fs::read(path).expect("history written by the setup");
    let (clock, snapshot) = file.split_at(8);
    let clock = u64::from_le_bytes(clock.try_into().expect("8 bytes"));
    let mut manager = Box::new(Manager::new());
    manager.restore_from(snapshot).expect("valid snapshot");
    (manager, clock)
}

/// A turn's core messages, leaked so the benchmark can take them by value.
fn leaked_messages(turn: Turn, clock: u64) -> Vec<Message<'static>> {
    let chat: &'static [_] = Vec::leak(turn.messages);
    let calls: &'static [_] = Vec::leak(tool_calls(chat));
    core_messages(chat, calls, clock)
}

/// A manager at some history, a turn to run on it, and a request-body buffer.
struct Probe {
    manager: Box<Manager>,
    messages: Vec<Message<'static>>,
    body: Vec<u8>,
}

fn probe(length: usize, turn: fn(&Session) -> Turn) -> Probe {
    probe_at(&history_path(length), turn)
}

fn probe_at(path: &std::path::Path, turn: fn(&Session) -> Turn) -> Probe {
    let session = Session::load().expect("shipped session");
    let (manager, clock) = load(path);
    Probe {
        manager,
        messages: leaked_messages(turn(&session), clock),
        body: vec![0; BODY_CAPACITY],
    }
}

fn typical(length: usize) -> Probe {
    probe(length, Session::typical_turn)
}

/// The typical turn on a history one turn before a compaction: the turn compacts.
fn compacting(length: usize) -> Probe {
    probe_at(&before_compaction_path(length), Session::typical_turn)
}

/// The typical turn on `strategy`'s own 10k history.
fn under(strategy: StrategyKind) -> Probe {
    probe_at(&strategy_path(strategy), Session::typical_turn)
}

fn heavy(length: usize) -> Probe {
    probe(length, Session::heavy_turn)
}

/// The typical turn already pushed and the outbox drained: what compose starts from.
fn pushed(length: usize) -> Probe {
    let mut probe = typical(length);
    for message in &probe.messages {
        probe.manager.push(*message).expect("push");
    }
    probe.manager.drain_outbox(|_| {});
    probe
}

fn saved(length: usize) -> (Box<Manager>, Vec<u8>) {
    (history(length).0, vec![0; Manager::SNAPSHOT_MAX_SIZE])
}

fn to_restore(length: usize) -> (Box<Manager>, Vec<u8>) {
    let (manager, mut buffer) = saved(length);
    let len = manager.snapshot_into(&mut buffer).expect("snapshot fits").len();
    buffer.truncate(len);
    (Box::new(Manager::new()), buffer)
}

// Push, drain, compose and write the request body: the whole per-turn cost.
#[library_benchmark]
#[bench::h100(args = (100), setup = typical)]
#[bench::h1k(args = (1_000), setup = typical)]
#[bench::h10k(args = (10_000), setup = typical)]
#[bench::h100k(args = (100_000), setup = typical)]
fn turn_typical(mut probe: Probe) -> Probe {
    let len = run_turn(&mut probe.manager, &probe.messages, &mut probe.body);
    black_box(len.expect("turn runs"));
    probe
}

// The typical turn where it passes the high-water mark: the compaction down to the low one
// is part of the turn.
#[library_benchmark]
#[bench::h100(args = (100), setup = compacting)]
#[bench::h1k(args = (1_000), setup = compacting)]
#[bench::h10k(args = (10_000), setup = compacting)]
#[bench::h100k(args = (100_000), setup = compacting)]
fn turn_compacting(mut probe: Probe) -> Probe {
    let compactions = probe.manager.stats().counters.compactions;
    let len = run_turn(&mut probe.manager, &probe.messages, &mut probe.body);
    black_box(len.expect("turn runs"));
    assert_ne!(probe.manager.stats().counters.compactions, compactions, "the turn compacts");
    probe
}

// The same for a turn with a 25 KB tool output (reduced on push).
#[library_benchmark]
#[bench::h100(args = (100), setup = heavy)]
#[bench::h1k(args = (1_000), setup = heavy)]
#[bench::h10k(args = (10_000), setup = heavy)]
#[bench::h100k(args = (100_000), setup = heavy)]
fn turn_heavy(mut probe: Probe) -> Probe {
    let len = run_turn(&mut probe.manager, &probe.messages, &mut probe.body);
    black_box(len.expect("turn runs"));
    probe
}

// The typical turn at 10k messages of history under each strategy: what issue 31's summary
// merges and budget fitting add to the strategies that write summaries.
#[library_benchmark]
#[bench::sliding_window(args = (StrategyKind::SlidingWindow), setup = under)]
#[bench::summarization(args = (StrategyKind::Summarization), setup = under)]
#[bench::entity_extraction(args = (StrategyKind::EntityExtraction), setup = under)]
#[bench::importance(args = (StrategyKind::Importance), setup = under)]
#[bench::hierarchical(args = (StrategyKind::Hierarchical), setup = under)]
fn turn_by_strategy(mut probe: Probe) -> Probe {
    let len = run_turn(&mut probe.manager, &probe.messages, &mut probe.body);
    black_box(len.expect("turn runs"));
    probe
}

// Pushing the typical turn's six messages (no drain, no compose).
#[library_benchmark]
#[bench::h100(args = (100), setup = typical)]
#[bench::h1k(args = (1_000), setup = typical)]
#[bench::h10k(args = (10_000), setup = typical)]
#[bench::h100k(args = (100_000), setup = typical)]
fn push(mut probe: Probe) -> Probe {
    for message in &probe.messages {
        black_box(probe.manager.push(*message).expect("push"));
    }
    probe
}

// Composing the payload after the typical turn and writing the OpenAI request body.
#[library_benchmark]
#[bench::h100(args = (100), setup = pushed)]
#[bench::h1k(args = (1_000), setup = pushed)]
#[bench::h10k(args = (10_000), setup = pushed)]
#[bench::h100k(args = (100_000), setup = pushed)]
fn compose(mut probe: Probe) -> Probe {
    let payload = probe.manager.compose(&DYNAMIC).expect("compose");
    let len = payload.write_openai(&mut probe.body[..], OpenAiRequest::default());
    black_box(len.expect("body fits"));
    probe
}

// `snapshot_into` of the whole manager.
#[library_benchmark]
#[bench::h100(args = (100), setup = saved)]
#[bench::h1k(args = (1_000), setup = saved)]
#[bench::h10k(args = (10_000), setup = saved)]
#[bench::h100k(args = (100_000), setup = saved)]
fn snapshot(state: (Box<Manager>, Vec<u8>)) -> (Box<Manager>, Vec<u8>) {
    let (manager, mut buffer) = state;
    black_box(manager.snapshot_into(&mut buffer).map(|bytes| bytes.len()).expect("fits"));
    (manager, buffer)
}

// `restore_from` into an empty manager.
#[library_benchmark]
#[bench::h100(args = (100), setup = to_restore)]
#[bench::h1k(args = (1_000), setup = to_restore)]
#[bench::h10k(args = (10_000), setup = to_restore)]
#[bench::h100k(args = (100_000), setup = to_restore)]
fn restore(state: (Box<Manager>, Vec<u8>)) -> (Box<Manager>, Vec<u8>) {
    let (mut manager, bytes) = state;
    manager.restore_from(&bytes).expect("valid snapshot");
    (manager, bytes)
}

library_benchmark_group!(
    name = per_turn;
    benchmarks = turn_typical, turn_compacting, turn_heavy, turn_by_strategy
);
library_benchmark_group!(name = parts; benchmarks = push, compose);
library_benchmark_group!(name = snapshots; benchmarks = snapshot, restore);

/// Whether `gungraun-runner` can be found the way the gungraun library looks for it.
fn runner_available() -> bool {
    if option_env!("GUNGRAUN_RUNNER").is_some() {
        return true;
    }
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
    };
    on_path("gungraun-runner") && on_path("valgrind")
}

fn run_gungraun() {
    gungraun::main!(
        setup = write_histories();
        library_benchmark_groups = per_turn, parts, snapshots
    );
    main();
}

fn main() {
    // The runner calls this binary back with `--gungraun-run …` for setups and benchmarks.
    let called_by_runner = std::env::args().nth(1).is_some_and(|arg| arg == "--gungraun-run");
    if !called_by_runner && !runner_available() {
        eprintln!(
            "instructions: gungraun-runner 0.20.0 and valgrind are needed: \
             `cargo install --locked gungraun-runner --version 0.20.0`, `apt-get install valgrind`"
        );
        if std::env::var_os("CTXWIN_REQUIRE_GUNGRAUN").is_some() {
            std::process::exit(1);
        }
        eprintln!("instructions: skipped");
        return;
    }
    run_gungraun();
}
