//! Opening sessions the way the proxy does (a shared archive, a checkpoint directory each,
//! restore at build): a new session touches the disk only at its first checkpoint.
//!
//! The measurement is printed rather than asserted: run it with
//! `cargo test --release -p ctxwin-std --test session_open -- --ignored --nocapture`.

use std::path::Path;
use std::time::{Duration, Instant};

use ctxwin_core::{Config, Role};
use ctxwin_std::ChatMessage;
use std::sync::Arc;

use ctxwin_std::session::{Session, SessionBuilder, SessionError};
use ctxwin_std::store::ArchiveStore;
use ctxwin_std::store::sqlite::SqliteArchive;

/// The proxy's configuration for a 32k-token model (`ctxwin_proxy::conv::session_config`).
fn proxy_config() -> Config {
    let (window, reserve) = (32_768, 1_024);
    let budget = window - reserve;
    Config {
        context_window: window,
        reserved_for_reply: reserve,
        permanent_budget: budget / 4,
        session_budget: budget / 20,
        working_budget: budget * 65 / 100,
        ..Config::DEFAULT
    }
}

/// A session built with the proxy's options: conversation `name`'s checkpoints in
/// `<state>/<name>/checkpoints`.
fn open(state: &Path, archive: &Arc<SqliteArchive>, name: &str) -> Result<Session, SessionError> {
    SessionBuilder::new(name)
        .config(proxy_config())
        .archive_store(archive.clone())
        .checkpoints(state.join(name).join("checkpoints"))
        .keep_checkpoints(3)
        .checkpoint_interval_messages(0)
        .restore_latest(true)
        .build()
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::text(Role::User, text)
}

fn history(session: &Session) -> Vec<String> {
    session.manager().history().map(|message| message.content().to_string()).collect()
}

#[test]
fn a_new_session_creates_its_checkpoint_directory_at_the_first_checkpoint() {
    let state = tempfile::tempdir().unwrap();
    let archive = Arc::new(SqliteArchive::open(state.path().join("archive.db")).unwrap());
    let conv = state.path().join("c1");
    let mut session = open(state.path(), &archive, "c1").unwrap();
    assert!(!conv.exists(), "building a new session creates nothing");
    assert!(session.checkpoints().unwrap().is_empty());
    assert_eq!(session.stats().unwrap().checkpoints_kept, Some(0));
    assert!(!conv.exists(), "listing creates nothing either");

    session.push(&user("The deploy key lives in vault path ops/deploy.")).unwrap();
    let id = session.checkpoint().unwrap();
    assert!(conv.join("checkpoints").is_dir());
    drop(session);

    let reopened = open(state.path(), &archive, "c1").unwrap();
    assert_eq!(reopened.checkpoints().unwrap()[0].id, id);
    assert_eq!(history(&reopened), ["The deploy key lives in vault path ops/deploy."]);
}

#[test]
fn a_crash_after_the_first_checkpoint_restores_it() {
    let state = tempfile::tempdir().unwrap();
    let archive = Arc::new(SqliteArchive::open(state.path().join("archive.db")).unwrap());
    let mut session = open(state.path(), &archive, "c2").unwrap();
    session.push(&user("first")).unwrap();
    let id = session.checkpoint().unwrap();
    session.push(&user("second, never checkpointed")).unwrap();
    session.push(&user("third, never checkpointed")).unwrap();
    // A crash: the session goes away without a checkpoint.
    drop(session);

    let mut reopened = open(state.path(), &archive, "c2").unwrap();
    assert_eq!(reopened.checkpoints().unwrap()[0].id, id);
    assert_eq!(history(&reopened), ["first"]);
    let c2 = ctxwin_std::store::Scope::local("c2");
    assert_eq!(archive.usage(&c2).unwrap().messages, 1, "the later rows were set aside");
    reopened.push(&user("second, again")).unwrap();
    reopened.checkpoint().unwrap();
    drop(reopened);
    assert_eq!(history(&open(state.path(), &archive, "c2").unwrap()), ["first", "second, again"]);
}

#[test]
fn a_crash_before_the_first_checkpoint_is_still_refused() {
    let state = tempfile::tempdir().unwrap();
    let archive = Arc::new(SqliteArchive::open(state.path().join("archive.db")).unwrap());
    let mut session = open(state.path(), &archive, "c3").unwrap();
    session.push(&user("archived, then the process died")).unwrap();
    drop(session);
    assert!(!state.path().join("c3").exists());
    match open(state.path(), &archive, "c3") {
        Err(SessionError::ArchiveInUse { messages, .. }) => assert_eq!(messages, 1),
        other => panic!("expected ArchiveInUse, got {other:?}"),
    }
    assert!(!state.path().join("c3").exists(), "a refused build creates nothing");
}

#[test]
fn a_damaged_checkpoint_directory_is_reported_not_replaced() {
    let state = tempfile::tempdir().unwrap();
    let archive = Arc::new(SqliteArchive::open(state.path().join("archive.db")).unwrap());
    std::fs::create_dir(state.path().join("c4")).unwrap();
    std::fs::write(state.path().join("c4/checkpoints"), b"a file where the directory goes")
        .unwrap();
    assert!(open(state.path(), &archive, "c4").is_err());
    assert!(state.path().join("c4/checkpoints").is_file());
}

/// Per-build times, sorted, of `count` new sessions opened one after the other.
fn build_serially(
    state: &Path,
    archive: &Arc<SqliteArchive>,
    count: usize,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let mut each: Vec<Duration> = (0..count)
        .map(|n| {
            let one = Instant::now();
            drop(open(state, archive, &format!("serial-{n}")).unwrap());
            one.elapsed()
        })
        .collect();
    each.sort_unstable();
    (started.elapsed(), each)
}

/// The same, from `threads` threads at once (the proxy opens sessions on blocking threads).
fn build_concurrently(
    state: &Path,
    archive: &Arc<SqliteArchive>,
    count: usize,
    threads: usize,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let mut each: Vec<Duration> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t..count)
                        .step_by(threads)
                        .map(|n| {
                            let one = Instant::now();
                            drop(open(state, archive, &format!("burst-{n}")).unwrap());
                            one.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect()
    });
    each.sort_unstable();
    (started.elapsed(), each)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn measure_building_200_new_sessions() {
    // On the disk the state directory lives on (the temp directory may be a RAM disk, where
    // an fsync costs nothing).
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let archive = Arc::new(SqliteArchive::open(state.path().join("archive.db")).unwrap());
    let count = 200;
    let report = |label: &str, (total, each): (Duration, Vec<Duration>)| {
        println!(
            "build {count} new sessions ({label}): total {:.1} ms, per build p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            ms(total),
            ms(each[each.len() / 2]),
            ms(each[each.len() * 99 / 100]),
            ms(each[each.len() - 1]),
        );
    };
    report("serially", build_serially(state.path(), &archive, count));
    report("8 threads", build_concurrently(state.path(), &archive, count, 8));
}
