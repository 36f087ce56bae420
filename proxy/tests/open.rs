//! Opening conversations: a new one writes nothing (no archive row, no directory) until its
//! first messages and checkpoint, what it was created with survives a restart, and a
//! conversation the proxy cannot continue (a crash before its first checkpoint, an older
//! proxy's checkpoints) continues as a new generation, its rows kept.
//!
//! The measurement is printed rather than asserted: run it with
//! `cargo test --release -p ctxwin-proxy --test open -- --ignored --nocapture`.

use std::path::Path;
use std::time::{Duration, Instant};

use ctxwin_proxy::conv::{
    Conv, ConvSettings, Ingest, LEFTOVER_SIDE_STORE, Stores, conv_dir, prepare_state,
};
use ctxwin_proxy::wire::{Provider, Request, raw_hashes};
use ctxwin_std::session::SessionBuilder;
use ctxwin_std::store::{ArchiveStore, Scope};
use ctxwin_std::{ChatMessage, core::Role};
use serde_json::{Value, json};

fn open(state: &Path, stores: &Stores, key: &str, window: u32) -> Conv {
    Conv::open(state, stores, key, Provider::OpenAi, &ConvSettings::new(window, 512)).unwrap()
}

fn turn(conv: &mut Conv, messages: &[Value]) {
    let raw: Vec<String> = messages.iter().map(Value::to_string).collect();
    turn_raw(conv, &raw.iter().map(String::as_str).collect::<Vec<_>>());
}

/// A request whose messages are `raw`, byte for byte.
fn turn_raw(conv: &mut Conv, raw: &[&str]) {
    let body = format!(r#"{{"model": "m", "messages": [{}]}}"#, raw.join(", "));
    let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
    let hashes = raw_hashes(&request);
    assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
}

fn rows(stores: &Stores, name: &str) -> u64 {
    stores.local().unwrap().archive.usage(&Scope::local(name)).unwrap().messages
}

fn window_of(conv: &Conv) -> u32 {
    conv.session().configured().context_window
}

/// Every file under `dir` with its size.
fn files(dir: &Path) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push((path.display().to_string(), entry.metadata().unwrap().len()));
        }
    }
    found.sort();
    found
}

#[test]
fn a_new_conversation_opens_without_writing_and_keeps_its_window() {
    let state = tempfile::tempdir().unwrap();
    let stores = prepare_state(state.path(), false).unwrap();
    let before = files(state.path());
    let mut conv = open(state.path(), &stores, "k", 8_192);
    assert_eq!(files(state.path()), before, "nothing written");
    assert!(!conv_dir(state.path(), "k").exists(), "no directory created");
    assert_eq!(window_of(&conv), 8_192);

    let raw = r#"{"role": "user",  "content": "Keep the release notes short."}"#;
    let messages = [serde_json::from_str::<Value>(raw).unwrap()];
    turn_raw(&mut conv, &[raw]);
    conv.checkpoint().unwrap();
    assert!(conv_dir(state.path(), "k").join("checkpoints").is_dir());
    // The message is stored once: its archive row, with the JSON as the client sent it.
    let row = stores.local().unwrap().writer.get(&Scope::local("k"), 1).unwrap().unwrap();
    assert_eq!(row.raw.as_deref(), Some(raw));
    assert!(!state.path().join(LEFTOVER_SIDE_STORE).exists(), "no side store");
    drop(conv);
    drop(stores);

    // A restart, configured for another window: the conversation keeps its own.
    let stores = prepare_state(state.path(), false).unwrap();
    let mut conv = open(state.path(), &stores, "k", 32_768);
    assert_eq!(window_of(&conv), 8_192);
    assert_eq!(conv.session().name(), "k");
    assert_eq!(conv.len(), 1);
    turn(&mut conv, &[messages[0].clone(), json!({"role": "assistant", "content": "Understood."})]);
    conv.checkpoint().unwrap();
    drop(conv);
    let conv = open(state.path(), &stores, "k", 1_024);
    assert_eq!((window_of(&conv), conv.len()), (8_192, 2));
}

#[test]
fn a_crash_before_the_first_checkpoint_starts_the_next_generation() {
    let state = tempfile::tempdir().unwrap();
    let stores = prepare_state(state.path(), false).unwrap();
    let mut conv = open(state.path(), &stores, "g", 8_192);
    let mut messages = vec![json!({"role": "user", "content": "first words"})];
    turn(&mut conv, &messages);
    // Killed before any checkpoint: archived rows, nothing else.
    drop(conv);
    assert_eq!(rows(&stores, "g"), 1);

    let mut conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!(conv.session().name(), "g#1");
    assert_eq!(conv.len(), 0, "nothing restored: the client's resend is taken again");
    messages.push(json!({"role": "assistant", "content": "hello"}));
    turn(&mut conv, &messages);
    conv.checkpoint().unwrap();
    drop(conv);

    // Another crash after that checkpoint: the generation restores, the first one's rows stay.
    let mut conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!((conv.session().name(), conv.len()), ("g#1", 2));
    messages.push(json!({"role": "user", "content": "never checkpointed"}));
    turn(&mut conv, &messages);
    drop(conv);
    let conv = open(state.path(), &stores, "g", 8_192);
    assert_eq!((conv.session().name(), conv.len(), window_of(&conv)), ("g#1", 2, 8_192));
    assert_eq!((rows(&stores, "g"), rows(&stores, "g#1")), (1, 2));
}

#[test]
fn an_older_proxys_conversation_continues_as_the_next_generation() {
    let state = tempfile::tempdir().unwrap();
    let stores = prepare_state(state.path(), false).unwrap();
    // What an older proxy left: a checkpoint without the recorded messages (it kept them in
    // proxy.db, which is not read any more), and proxy.db itself.
    let mut old = SessionBuilder::new("o")
        .archive_store(stores.local().unwrap().writer.clone())
        .checkpoints(conv_dir(state.path(), "o").join("checkpoints"))
        .build()
        .unwrap();
    old.push(&ChatMessage::text(Role::User, "from the old proxy")).unwrap();
    old.checkpoint().unwrap();
    drop(old);
    std::fs::write(state.path().join(LEFTOVER_SIDE_STORE), b"SQLite format 3\0").unwrap();
    drop(stores);

    let stores = prepare_state(state.path(), false).unwrap();
    let mut conv = open(state.path(), &stores, "o", 8_192);
    assert_eq!((conv.session().name(), conv.len()), ("o#1", 0));
    turn(&mut conv, &[json!({"role": "user", "content": "from the old proxy"})]);
    conv.checkpoint().unwrap();
    drop(conv);
    assert_eq!((rows(&stores, "o"), rows(&stores, "o#1")), (1, 1));
    let conv = open(state.path(), &stores, "o", 8_192);
    assert_eq!((conv.session().name(), conv.len()), ("o#1", 1));
    assert_eq!(std::fs::read(state.path().join(LEFTOVER_SIDE_STORE)).unwrap().len(), 16);
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
    let stores = prepare_state(state.path(), false).unwrap();
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
