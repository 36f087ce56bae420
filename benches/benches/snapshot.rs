//! Snapshot and restore of a full default-size manager (every level's arena filled with
//! realistic turns): `cargo bench -p ctxwin-benches --bench snapshot`.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ctxwin_core::{Config, ContextManager, DefaultCapacities, Level, Message, ToolCall};

type Manager = ContextManager<DefaultCapacities>;

/// Fills every level to its byte or message capacity (budgets raised so nothing is evicted):
/// records average about the arena bytes per header, so both limits are nearly reached.
fn full_manager() -> Box<Manager> {
    let config = Config {
        context_window: 2_000_000,
        reserved_for_reply: 0,
        permanent_budget: 200_000,
        session_budget: 200_000,
        working_budget: 800_000,
        trigger_percent: 100,
        locked_tail: u16::MAX,
        ..Config::DEFAULT
    };
    let mut manager = Box::new(Manager::with_config(config).expect("valid config"));
    let rule = "Always run the tests before you commit; never force-push to main. ";
    while manager.push(Message::system(&rule.repeat(15))).is_ok() {}
    let summary = "Decided to move the ring arena to u32 offsets; tests in core/src/ring.rs. ";
    while manager.add_summary(&summary.repeat(10), &[(1, 40)], 0).is_ok() {}
    let mut turn = 0u64;
    loop {
        let ask =
            format!("Turn {turn}: why does `cargo test -p ctxwin-core` fail on ring.rs:{turn}?");
        if manager.push(Message::user(&ask).at(turn)).is_err() {
            break;
        }
        let id = format!("call_{turn}");
        let calls = [ToolCall::new(&id, "run", r#"{"cmd":"cargo test -p ctxwin-core"}"#)];
        if manager.push(Message::assistant("").with_tool_calls(&calls)).is_err() {
            break;
        }
        let output = format!("test ring::tests::wraps ... FAILED at line {turn}\n").repeat(20);
        if manager.push(Message::tool_result(&id, &output)).is_err() {
            break;
        }
        turn += 1;
    }
    let note = "verbose exploration note ".repeat(40);
    while manager.push(Message::assistant(&note).in_level(Level::Volatile)).is_ok() {}
    manager
}

fn bench(c: &mut Criterion) {
    let manager = full_manager();
    let stats = manager.stats();
    let bytes_len = manager.snapshot_len();
    println!(
        "full default manager: {} messages, {} text bytes, snapshot {} bytes (max {})",
        stats.levels.iter().map(|l| l.stored_messages).sum::<u32>(),
        stats.levels.iter().map(|l| l.bytes).sum::<u32>(),
        bytes_len,
        Manager::SNAPSHOT_MAX_SIZE
    );
    let mut buffer = vec![0u8; Manager::SNAPSHOT_MAX_SIZE];
    let snapshot = manager.snapshot_into(&mut buffer).expect("fits").to_vec();

    let mut group = c.benchmark_group("snapshot");
    group.throughput(Throughput::Bytes(bytes_len as u64));
    group.bench_function("snapshot_into", |b| {
        b.iter(|| manager.snapshot_into(&mut buffer).map(|bytes| bytes.len()))
    });
    group.bench_function("snapshot_to", |b| b.iter(|| manager.snapshot_to(&mut buffer[..])));
    group.bench_function("restore_from", |b| {
        b.iter_batched_ref(
            || Box::new(Manager::new()),
            |target| target.restore_from(&snapshot),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
