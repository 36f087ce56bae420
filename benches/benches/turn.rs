//! Per-turn cost against history length, and its parts: `cargo bench -p ctxwin-benches --bench turn`.
//!
//! Every manager runs the 8,000-token configuration of `ctxwin_benches::workload` with the
//! shipped session replayed to 100, 1k, 10k and 100k messages (built once). Each timed
//! iteration starts from a fresh copy of that state (copied outside the timed region), so
//! every sample measures the same operation on the same history.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ctxwin_benches::replay::{Session, Turn, core_messages, tool_calls};
use ctxwin_benches::workload::{
    BODY_CAPACITY, DYNAMIC, Driver, HISTORY_LENGTHS, Manager, managers_at, run_turn, turn_config,
};
use ctxwin_core::{Config, ContextManager, DefaultCapacities, Message, StrategyKind, ToolCall};

/// Copies of a prepared manager for `iter_batched_ref`: 16 per batch (~4 MB).
const BATCH: BatchSize = BatchSize::NumIterations(16);

/// History length the single-operation benches run at.
const STEADY: usize = 10_000;

fn bench(c: &mut Criterion) {
    let session = Session::load().expect("shipped session");
    let sliding = turn_config(StrategyKind::SlidingWindow);
    let drivers = managers_at(&session, sliding, &HISTORY_LENGTHS).expect("replay");
    for (reached, driver) in &drivers {
        let stats = driver.manager().stats();
        println!(
            "history {reached:>6} messages ({} turns): window {} messages, {} of {} tokens",
            driver.turns(),
            driver.manager().history().count(),
            stats.used,
            stats.budget
        );
    }
    per_turn(c, &session, &drivers);
    per_strategy(c, &session);
    let steady = &drivers.iter().find(|(n, _)| *n >= STEADY).expect("10k history").1;
    push_alone(c, &session, steady);
    compose_alone(c, &drivers);
    eviction(c, &session);
    observation_reduction(c, &session, steady);
}

/// Times [`run_turn`] of `turn` on copies of `driver`'s manager.
fn bench_turn(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    (name, history): (&str, usize),
    driver: &Driver<'_>,
    turn: &Turn,
) {
    let calls = tool_calls(&turn.messages);
    let messages = core_messages(&turn.messages, &calls, driver.clock());
    let mut body = vec![0u8; BODY_CAPACITY];
    {
        let mut check = driver.manager_clone();
        let len = run_turn(&mut check, &messages, &mut body).expect("probe turn runs");
        println!("{name}/{history}: request body {len} bytes");
    }
    group.bench_function(BenchmarkId::new(name, history), |b| {
        b.iter_batched_ref(
            || driver.manager_clone(),
            |manager| run_turn(manager, &messages, &mut body),
            BATCH,
        )
    });
}

fn per_turn(c: &mut Criterion, session: &Session, drivers: &[(usize, Driver<'_>)]) {
    let mut group = c.benchmark_group("turn");
    group.sample_size(30).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let probes = [("typical", session.typical_turn()), ("heavy", session.heavy_turn())];
    for (name, turn) in &probes {
        for ((_, driver), nominal) in drivers.iter().zip(HISTORY_LENGTHS) {
            bench_turn(&mut group, (name, nominal), driver, turn);
        }
    }
    group.finish();
}

fn per_strategy(c: &mut Criterion, session: &Session) {
    let mut group = c.benchmark_group("turn_by_strategy");
    group.sample_size(20).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let turn = session.typical_turn();
    for strategy in StrategyKind::ALL {
        let drivers = managers_at(session, turn_config(strategy), &[STEADY]).expect("replay");
        bench_turn(&mut group, (strategy.as_str(), STEADY), &drivers[0].1, &turn);
    }
    group.finish();
}

fn push_alone(c: &mut Criterion, session: &Session, driver: &Driver<'_>) {
    let mut group = c.benchmark_group("push");
    group.sample_size(30).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let turn = session.typical_turn();
    let calls = tool_calls(&turn.messages);
    let messages = core_messages(&turn.messages, &calls, driver.clock());
    let (user, assistant, result) = (messages[0], messages[1], messages[2]);
    group.bench_function(BenchmarkId::new("user", STEADY), |b| {
        b.iter_batched_ref(|| driver.manager_clone(), |m| m.push(user), BATCH)
    });
    group.bench_function(BenchmarkId::new("assistant_3_calls", STEADY), |b| {
        b.iter_batched_ref(|| driver.manager_clone(), |m| m.push(assistant), BATCH)
    });
    let with_call = || {
        let mut manager = driver.manager_clone();
        manager.push(user).expect("user");
        manager.push(assistant).expect("assistant");
        manager
    };
    group.bench_function(BenchmarkId::new("tool_result", STEADY), |b| {
        b.iter_batched_ref(with_call, |m| m.push(result), BATCH)
    });
    group.finish();
}

fn compose_alone(c: &mut Criterion, drivers: &[(usize, Driver<'_>)]) {
    let mut group = c.benchmark_group("compose");
    group.sample_size(30).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let mut body = vec![0u8; BODY_CAPACITY];
    for ((_, driver), nominal) in drivers.iter().zip(HISTORY_LENGTHS) {
        // Composing the state a turn left is idempotent: nothing more to evict.
        let mut manager = driver.manager_clone();
        group.bench_function(BenchmarkId::new("write_openai", nominal), |b| {
            b.iter(|| {
                let payload = manager.compose(&DYNAMIC)?;
                payload.write_openai(&mut body[..], ctxwin_core::OpenAiRequest::default())
            })
        });
        if nominal == STEADY {
            group.bench_function(BenchmarkId::new("payload_only", nominal), |b| {
                b.iter(|| manager.compose(&DYNAMIC).map(|payload| payload.tokens()))
            });
        }
    }
    group.finish();
}

/// Sizes of the filled working level `evict` compares (its capacity is 256 headers and
/// 96 KiB; past 80% of either a push compacts, so 180 is the largest fill a push leaves).
const LEVEL_FILLS: [usize; 3] = [60, 120, 180];

/// A manager whose working level holds `fill` one-message units (180 fill 180 of 256
/// headers and ~66 of 96 KiB), budgets raised so nothing was evicted yet; and the tokens
/// `make_space` must free to evict every unit outside the locked tail.
fn full_working_level(
    session: &Session,
    fill: usize,
) -> (Box<ContextManager<DefaultCapacities>>, u32) {
    let config = Config {
        context_window: 400_000,
        reserved_for_reply: 0,
        working_budget: 300_000,
        trigger_percent: 100,
        ..turn_config(StrategyKind::SlidingWindow)
    };
    let mut manager = Box::new(Manager::with_config(config).expect("valid config"));
    let texts: Vec<String> = session
        .turns
        .iter()
        .flat_map(|t| &t.messages)
        .filter(|m| m.tool_calls.is_empty() && m.role == ctxwin_core::Role::Assistant)
        .map(|m| m.content.chars().take(375).collect())
        .filter(|text: &String| text.len() > 200)
        .collect();
    for (i, text) in texts.iter().cycle().take(fill).enumerate() {
        manager.push(Message::assistant(text).at(i as u64)).expect("fits");
    }
    let locked = usize::from(config.locked_tail);
    let history: Vec<u32> = manager.history().map(|m| m.tokens()).collect();
    assert_eq!(history.len(), fill, "nothing evicted while filling");
    let evictable: u32 = history[..history.len() - locked].iter().sum();
    let tokens = manager.budget() - manager.used() + evictable;
    let mut check = manager.clone();
    check.make_space(tokens).expect("room");
    assert_eq!(check.history().count(), locked, "every unlocked unit leaves");
    (manager, tokens)
}

fn eviction(c: &mut Criterion, session: &Session) {
    let mut group = c.benchmark_group("evict");
    group.sample_size(30).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    for fill in LEVEL_FILLS {
        let (manager, tokens) = full_working_level(session, fill);
        let working = manager.stats().level(ctxwin_core::Level::Working);
        println!(
            "working level: {} of {} messages, {} of {} bytes",
            working.stored_messages, working.message_capacity, working.bytes, working.byte_capacity
        );
        group.throughput(Throughput::Elements((fill - 6) as u64));
        group.bench_function(BenchmarkId::new("working_level", fill), |b| {
            b.iter_batched_ref(|| manager.clone(), |m| m.make_space(tokens), BATCH)
        });
        group.bench_function(BenchmarkId::new("working_level+drain", fill), |b| {
            b.iter_batched_ref(
                || manager.clone(),
                |m| {
                    m.make_space(tokens)?;
                    Ok::<usize, ctxwin_core::Error>(m.drain_outbox(|unit| {
                        black_box(unit.len());
                    }))
                },
                BATCH,
            )
        });
    }
    group.finish();
}

fn observation_reduction(c: &mut Criterion, session: &Session, driver: &Driver<'_>) {
    let mut group = c.benchmark_group("reduce");
    group.sample_size(30).warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    let output = session.tool_output(40 * 1024);
    let calls = [ToolCall::new("probe_obs", "run", r#"{"cmd":"cargo test --workspace"}"#)];
    let with_call = || {
        let mut manager = driver.manager_clone();
        manager.push(Message::user("Run the whole test suite.")).expect("user");
        manager.push(Message::assistant("").with_tool_calls(&calls)).expect("call");
        manager
    };
    let result = Message::tool_result("probe_obs", &output);
    let mut check = with_call();
    let before = check.stats().counters.observations_reduced;
    check.push(result).expect("reduced result fits");
    assert_eq!(check.stats().counters.observations_reduced, before + 1, "the output is reduced");
    group.throughput(Throughput::Bytes(output.len() as u64));
    group.bench_function(BenchmarkId::new("tool_output", "40KiB"), |b| {
        b.iter_batched_ref(with_call, |m| m.push(result), BATCH)
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = bench
}
criterion_main!(benches);
