//! Measurements of `ctxwin_std::session`, printed rather than asserted (speed belongs to
//! benches): run with
//! `cargo test --release -p ctxwin-std --test session_measure -- --ignored --nocapture`.

use ctxwin_std::session::SessionBuilder;

mod session_support;
use session_support::{generated, user};

/// Import time and archive size for 10k messages; push cost and exact-counting throughput.
#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn measure_import_archive_and_exact_counting() {
    use ctxwin_std::session::Counter;
    use ctxwin_std::tokens::ExactCounter;
    use std::time::Instant;

    let (conversation, _) = generated(10_000);
    let bytes: usize = conversation.messages.iter().map(|m| m.content.len()).sum();
    for (label, counter) in [
        ("estimator", Counter::default()),
        ("exact cl100k", Counter::Exact(ExactCounter::cl100k().unwrap())),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bulk.db");
        let mut session =
            SessionBuilder::new("bulk").counter(counter.clone()).archive(&path).build().unwrap();
        let started = Instant::now();
        let report = session.import(&conversation).unwrap();
        let elapsed = started.elapsed();
        let stats = session.stats().unwrap();
        drop(session);
        let on_disk: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().metadata().unwrap().len())
            .sum();
        println!(
            "import 10k ({label}): {:.0} ms, {} messages ({} KiB of text), {} units evicted, \
             archive {} KiB (db {} KiB)",
            elapsed.as_secs_f64() * 1e3,
            report.stored,
            bytes / 1024,
            report.units_evicted,
            on_disk / 1024,
            stats.archive.unwrap().store_bytes.unwrap_or(0) / 1024,
        );
    }

    // Exact counting inside a session: fresh texts (cache misses), pushed one by one.
    let exact = ExactCounter::cl100k().unwrap();
    let texts: Vec<String> = (0..2_000)
        .map(|i| {
            format!(
                "Turn {i}: the build on runner-{} failed in crate_{}::tests::case_{} with \
                 `assertion failed: left == right` (left: {}, right: {}); retrying with \
                 RUST_BACKTRACE=1 and --nocapture to see the panic location.",
                i % 17,
                i % 31,
                i,
                i * 7,
                i * 11
            )
        })
        .collect();
    let tokens: u64 = texts.iter().map(|t| u64::from(exact.count_uncached(t))).sum();
    for (label, counter, archive) in [
        ("estimator, no archive", Counter::default(), false),
        ("estimator, file archive", Counter::default(), true),
        ("exact, no archive", Counter::Exact(ExactCounter::cl100k().unwrap()), false),
        ("exact, file archive", Counter::Exact(ExactCounter::cl100k().unwrap()), true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = SessionBuilder::new("count").counter(counter);
        if archive {
            builder = builder.archive(dir.path().join("count.db"));
        }
        let mut session = builder.build().unwrap();
        let started = Instant::now();
        for text in &texts {
            session.push(&user(text.as_str())).unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let counters = session.stats().unwrap().counters;
        println!(
            "  rows written {}, units archived {}",
            counters.archive_rows_written, counters.units_archived
        );
        println!(
            "push 2,000 fresh messages ({label}): {:.1} µs/push, {:.0} tokens/s ({tokens} tokens)",
            elapsed * 1e6 / texts.len() as f64,
            tokens as f64 / elapsed
        );
    }
}

#[test]
#[ignore = "measurement"]
fn measure_archive_transactions() {
    use ctxwin_std::store::sqlite::SqliteArchive;
    use ctxwin_std::store::{ArchiveStore, ArchivedMessage, CompressionRecord, Fence, Scope};
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let archive = SqliteArchive::open(dir.path().join("a.db")).unwrap();
    let s = Scope::local("s");
    let started = Instant::now();
    for i in 1..=2_000u64 {
        let row = ArchivedMessage::new(
            i,
            i,
            user(format!("message {i} about crate_{} and runner-{}", i % 31, i % 17)),
        );
        archive.put(&s, Fence::NONE, &[row]).unwrap();
    }
    println!("put: {:.1} µs", started.elapsed().as_secs_f64() * 1e6 / 2_000.0);
    let started = Instant::now();
    for i in 1..=2_000u64 {
        archive
            .record_compression(&s, Fence::NONE, &CompressionRecord::new(i, 10, 5, "x"))
            .unwrap();
    }
    println!("record_compression: {:.1} µs", started.elapsed().as_secs_f64() * 1e6 / 2_000.0);
    let started = Instant::now();
    for i in 1..=2_000u64 {
        archive.get(&s, i).unwrap();
    }
    println!("get: {:.1} µs", started.elapsed().as_secs_f64() * 1e6 / 2_000.0);
}
