//! Opening conversations: a new one writes nothing (no side-store row, no directory) until
//! its first checkpoint, and what it was created with survives a restart.
//!
//! The measurement is printed rather than asserted: run it with
//! `cargo test --release -p ctxwin-proxy --test open -- --ignored --nocapture`.

use std::path::Path;
use std::time::{Duration, Instant};

use ctxwin_proxy::conv::{Conv, Ingest, Stores, conv_dir, prepare_state};
use ctxwin_proxy::wire::{Provider, Request, raw_hashes};
use serde_json::{Value, json};

fn open(state: &Path, stores: &Stores, key: &str, window: u32) -> Conv {
    Conv::open(state, stores, key, Provider::OpenAi, window, 512).unwrap()
}

fn turn(conv: &mut Conv, messages: &[Value]) {
    let body = json!({"model": "m", "messages": messages}).to_string();
    let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
    let hashes = raw_hashes(&request);
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
}

/// Rows of conversation `key` in the side store's table `table`.
fn rows(stores: &Stores, table: &str, key: &str) -> i64 {
    let db = stores.side.lock().unwrap();
    db.query_row(&format!("SELECT count(*) FROM {table} WHERE conv = ?1"), [key], |row| row.get(0))
        .unwrap()
}

fn meta(stores: &Stores, key: &str, name: &str) -> Option<String> {
    let db = stores.side.lock().unwrap();
    db.query_row("SELECT value FROM meta WHERE conv = ?1 AND key = ?2", [key, name], |row| {
        row.get(0)
    })
    .ok()
}

fn window_of(conv: &Conv) -> u32 {
    conv.session().configured().context_window
}

#[test]
fn a_new_conversation_opens_without_writing_and_keeps_its_window() {
    let state = tempfile::tempdir().unwrap();
    let stores = prepare_state(state.path()).unwrap();
    let changes = stores.side.lock().unwrap().total_changes();
    let mut conv = open(state.path(), &stores, "k", 8_192);
    assert_eq!((rows(&stores, "meta", "k"), rows(&stores, "entries", "k")), (0, 0));
    assert_eq!(stores.side.lock().unwrap().total_changes(), changes, "no row written");
    assert!(!conv_dir(state.path(), "k").exists(), "no directory created");
    assert_eq!(window_of(&conv), 8_192);

    let messages = [json!({"role": "user", "content": "Keep the release notes short."})];
    turn(&mut conv, &messages);
    assert_eq!(rows(&stores, "meta", "k"), 0, "written with the entries, at the checkpoint");
    conv.checkpoint().unwrap();
    assert_eq!(meta(&stores, "k", "window").as_deref(), Some("8192"));
    assert_eq!(rows(&stores, "entries", "k"), 1);
    assert!(conv_dir(state.path(), "k").join("checkpoints").is_dir());
    drop(conv);
    drop(stores);

    // A restart, configured for another window: the conversation keeps its own.
    let stores = prepare_state(state.path()).unwrap();
    let mut conv = open(state.path(), &stores, "k", 32_768);
    assert_eq!(window_of(&conv), 8_192);
    assert_eq!(conv.session().name(), "k");
    assert_eq!(conv.len(), 1);
    turn(&mut conv, &[messages[0].clone(), json!({"role": "assistant", "content": "Understood."})]);
    conv.checkpoint().unwrap();
    assert_eq!(meta(&stores, "k", "window").as_deref(), Some("8192"));
}

#[test]
fn a_crash_before_the_first_checkpoint_starts_the_next_generation() {
    let state = tempfile::tempdir().unwrap();
    let stores = prepare_state(state.path()).unwrap();
    let mut conv = open(state.path(), &stores, "g", 8_192);
    let mut messages = vec![json!({"role": "user", "content": "first words"})];
    turn(&mut conv, &messages);
    // Killed before any checkpoint: archived rows, nothing else.
    drop(conv);
    let archive = &stores.archive;
    assert_eq!(
        ctxwin_std::store::ArchiveStore::usage(archive, &ctxwin_std::store::Scope::local("g"))
            .unwrap()
            .messages,
        1
    );
    assert_eq!(rows(&stores, "meta", "g"), 0);

    let mut conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!(conv.session().name(), "g#1");
    assert_eq!(meta(&stores, "g", "generation").as_deref(), Some("1"));
    assert_eq!(conv.len(), 0, "nothing restored: the client's resend is taken again");
    messages.push(json!({"role": "assistant", "content": "hello"}));
    turn(&mut conv, &messages);
    conv.checkpoint().unwrap();
    assert_eq!(meta(&stores, "g", "window").as_deref(), Some("8192"));
    drop(conv);

    // Another crash after that checkpoint: the generation restores, the first one's rows stay.
    let mut conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!((conv.session().name(), conv.len()), ("g#1", 2));
    messages.push(json!({"role": "user", "content": "never checkpointed"}));
    turn(&mut conv, &messages);
    drop(conv);
    let conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!((conv.session().name(), conv.len(), window_of(&conv)), ("g#1", 2, 8_192));
    assert_eq!(
        ctxwin_std::store::ArchiveStore::usage(archive, &ctxwin_std::store::Scope::local("g"))
            .unwrap()
            .messages,
        1
    );
    assert_eq!(
        ctxwin_std::store::ArchiveStore::usage(archive, &ctxwin_std::store::Scope::local("g#1"))
            .unwrap()
            .messages,
        2
    );
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

#[test]
#[ignore = "measurement; run in release with --ignored --nocapture"]
fn measure_opening_200_new_conversations() {
    // On the disk the state directory lives on (the temp directory may be a RAM disk, where
    // an fsync costs nothing).
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let stores = prepare_state(state.path()).unwrap();
    let count = 200;
    let started = Instant::now();
    let mut each: Vec<Duration> = (0..count)
        .map(|n| {
            let one = Instant::now();
            drop(open(state.path(), &stores, &format!("conv-{n}"), 32_768));
            one.elapsed()
        })
        .collect();
    let total = started.elapsed();
    each.sort_unstable();
    println!(
        "open {count} new conversations: total {:.1} ms, per open p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(total),
        ms(each[count / 2]),
        ms(each[count * 99 / 100]),
        ms(each[count - 1]),
    );
}
