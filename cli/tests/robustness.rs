//! The `ctxwin` binary against a hostile user (issue 17): clock steps, damaged or swapped
//! archives, synthetic results evicted at once, absurd settings, symlinks in the state
//! directory, slow and endless inputs, wrong exit codes, failed imports and racing inits.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod cli_support;
use cli_support::Workdir;

const BAD_INPUT: i32 = 3;
const IO: i32 = 4;
const CORRUPT: i32 = 6;
const NO_STATE: i32 = 7;
const CONFIG: i32 = 8;

fn archived(work: &Workdir) -> u64 {
    work.json(&["stats"])["messages"]["archived"].as_u64().unwrap()
}

fn in_context(work: &Workdir) -> u64 {
    work.json(&["stats"])["messages"]["in_context"].as_u64().unwrap()
}

/// The contents of session `main`'s archived messages, read straight from the file.
fn archive_contents(state: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(state.join("archive.db")).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = 'main' ORDER BY m.id",
        )
        .unwrap();
    stmt.query_map([], |row| row.get(0)).unwrap().map(Result::unwrap).collect()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn add_config(work: &Workdir, extra: &str) {
    let path = work.state().join("ctxwin.toml");
    let text = fs::read_to_string(&path).unwrap();
    fs::write(&path, text + extra).unwrap();
}

/// Case 1: a clock step back (or a checkpoint renamed far into the future) loses nothing.
#[test]
fn a_clock_step_back_loses_no_acknowledged_message() {
    let work = Workdir::init();
    work.ok(&["add", "user", "m1"]);
    let ahead = (now_ms() + 3_600_000).to_string();
    let run =
        work.run_with(&["add", "user", "m2"], None, &[("CTXWIN_TEST_NOW_UNIX_MS", ahead.as_str())]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    for message in ["m3", "m4", "m5"] {
        work.ok(&["add", "user", message]);
    }
    let build = work.ok(&["build", "--format", "text"]).stdout;
    for message in ["m1", "m2", "m3", "m4", "m5"] {
        assert!(build.contains(&format!("[user]\n{message}\n")), "{message} lost:\n{build}");
    }
    assert_eq!((in_context(&work), archived(&work)), (5, 5));
    assert_eq!(archive_contents(&work.state()), ["m1", "m2", "m3", "m4", "m5"]);

    // An older checkpoint renamed to a year-2099 id is not preferred over a newer one.
    let dir = work.state().join("checkpoints");
    let mut ids: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ids.sort();
    fs::rename(dir.join(&ids[1]), dir.join("20991231T000000.000000Z-000000.ckpt")).unwrap();
    work.ok(&["add", "user", "m6"]);
    work.ok(&["add", "user", "m7"]);
    assert_eq!(
        archive_contents(&work.state()),
        ["m1", "m2", "m3", "m4", "m5", "m6", "m7"],
        "nothing lost or duplicated"
    );
    assert_eq!(in_context(&work), 7);
    // And the newest renamed far ahead stays the newest: later checkpoints sort after it.
    let listed = work.json(&["checkpoints"]);
    assert!(listed[0]["id"].as_str().unwrap() > "20991231", "{listed}");
}

/// Case 2: an emptied, swapped or damaged archive is corruption (6), never "0 archived".
#[test]
fn the_archive_is_verified_against_its_checkpoints() {
    let work = Workdir::init();
    work.ok(&["add", "user", "kept in the archive"]);
    let archive = work.state().join("archive.db");

    let saved = fs::read(&archive).unwrap();
    fs::write(&archive, b"").unwrap();
    work.fails(&["stats"], CORRUPT, "not the one checkpoint");
    fs::write(&archive, &saved).unwrap();
    assert_eq!(archived(&work), 1);

    let other = Workdir::init();
    fs::copy(other.state().join("archive.db"), &archive).unwrap();
    work.fails(&["stats"], CORRUPT, "not the one checkpoint");
    fs::write(&archive, &saved).unwrap();

    // Same archive, messages gone (an older backup of it).
    let conn = rusqlite::Connection::open(&archive).unwrap();
    conn.execute("DELETE FROM messages", []).unwrap();
    drop(conn);
    work.fails(&["stats"], CORRUPT, "messages are missing");
    fs::write(&archive, &saved).unwrap();

    // A malformed row is corruption, not a bug.
    let conn = rusqlite::Connection::open(&archive).unwrap();
    conn.execute("UPDATE messages SET tool_calls = '{x'", []).unwrap();
    drop(conn);
    let run = work.run(&["search", "archive"]);
    assert_eq!(run.code, CORRUPT, "{}", run.stderr);
    assert!(!run.stderr.contains("bug"), "{}", run.stderr);
    fs::write(&archive, &saved).unwrap();

    // A missing table.
    let conn = rusqlite::Connection::open(&archive).unwrap();
    conn.execute_batch("DROP TABLE messages_fts").unwrap();
    drop(conn);
    let run = work.run(&["add", "user", "more"]);
    assert_eq!(run.code, CORRUPT, "{}", run.stderr);
    fs::write(&archive, &saved).unwrap();
    assert_eq!(archived(&work), 1);
}

/// Case 2: single-byte damage anywhere in the header and in a sample of pages is reported as
/// corruption or harmless: never a bug, an I/O error, or messages silently gone.
#[test]
fn byte_flips_in_the_archive_are_caught_or_harmless() {
    let work = Workdir::init();
    for n in 0..30 {
        work.ok(&["add", "user", &format!("message number {n} with some words to index")]);
    }
    let archive = work.state().join("archive.db");
    let saved = fs::read(&archive).unwrap();
    assert!(saved.len() >= 4096 * 4, "{}", saved.len());
    let page = 4096;
    // Every byte of the 100-byte header, then every 193rd byte of the remaining pages.
    let offsets: Vec<usize> = (0..100).chain((100..saved.len()).step_by(193)).collect();
    let (mut caught, mut harmless) = (0, 0);
    for &at in &offsets {
        let mut bytes = saved.clone();
        bytes[at] ^= 0x5a;
        fs::write(&archive, &bytes).unwrap();
        for suffix in ["-wal", "-shm"] {
            let _ = fs::remove_file(work.state().join(format!("archive.db{suffix}")));
        }
        let run = work.run(&["stats", "--json"]);
        match run.code {
            0 => {
                let count = run.json()["messages"]["archived"].as_u64();
                assert_eq!(count, Some(30), "flip at {at} (page {}) lost messages", at / page);
                harmless += 1;
            }
            CORRUPT => caught += 1,
            code => panic!("flip at {at}: exit {code}: {}", run.stderr),
        }
    }
    fs::write(&archive, &saved).unwrap();
    eprintln!(
        "archive byte flips: {} tried, {caught} reported corrupt, {harmless} harmless",
        offsets.len()
    );
    assert!(caught > 0);
}

/// Case 3: a synthetic "aborted" result evicted in the operation that made it is archived.
#[test]
fn a_synthetic_result_evicted_at_once_is_archived() {
    let work = Workdir::init();
    add_config(&work, "");
    let config = work.state().join("ctxwin.toml");
    let text =
        fs::read_to_string(&config).unwrap().replace("max_messages = 0", "max_messages = 40");
    fs::write(&config, text).unwrap();
    work.ok(&["add", "user", "q"]);
    work.ok(&["add", "assistant", "", "--tool-calls", r#"[{"id":"c1","name":"ls"}]"#]);
    let lines: String =
        (0..600).map(|n| format!("{{\"role\":\"user\",\"content\":\"plain {n}\"}}\n")).collect();
    let file = work.write("plain.jsonl", &lines);
    let report = work.json(&["import", file.to_str().unwrap()]);
    assert!(report["units_evicted"].as_u64() > Some(0), "{report}");
    let conn = rusqlite::Connection::open(work.state().join("archive.db")).unwrap();
    let (id, unit): (i64, i64) = conn
        .query_row(
            "SELECT id, unit FROM messages WHERE role = 'tool' AND tool_call_id = 'c1'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the synthetic result has its row");
    assert_eq!((id, unit), (3, 2));
    assert_eq!(archived(&work), 603);
}

/// Case 4: a huge wait_secs is a configuration error, never a panic.
#[test]
fn absurd_durations_are_configuration_errors() {
    let work = Workdir::init();
    add_config(&work, "");
    let config = work.state().join("ctxwin.toml");
    let text = fs::read_to_string(&config).unwrap().replace(
        "# wait_secs = 120",
        "wait_secs = 18446744073709551615\nurl = \"http://127.0.0.1:9\"",
    );
    fs::write(&config, text).unwrap();
    work.fails(&["stats"], CONFIG, "wait_secs must be at most 86400");
    work.fails(&["add", "user", "x"], CONFIG, "wait_secs");
}

/// Case 5: nothing is written through symlinks in the state directory.
#[cfg(unix)]
#[test]
fn symlinks_in_the_state_directory_are_never_followed() {
    use std::os::unix::fs::symlink;
    let work = Workdir::init();
    let outside = work.write("outside.txt", "precious");
    symlink(&outside, work.state().join("cli.json.tmp")).unwrap();
    for n in 0..12 {
        let text = format!("message {n} about the parser ").repeat(30);
        work.ok(&["add", "user", &text]);
    }
    work.ok(&["compress", "--target", "1"]);
    work.ok(&["build", "--retrieve", "parser"]);
    assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
    assert!(work.state().join("cli.json").is_file(), "the notes were written in place");

    fs::remove_file(work.state().join("lock")).unwrap();
    let target = work.path("created-by-lock");
    symlink(&target, work.state().join("lock")).unwrap();
    work.fails(&["stats"], CORRUPT, "symlink");
    assert!(!target.exists(), "the lock symlink's target is not created");
    fs::remove_file(work.state().join("lock")).unwrap();

    fs::remove_file(work.state().join("cli.json")).unwrap();
    symlink(&outside, work.state().join("cli.json")).unwrap();
    let run = work.run(&["stats"]);
    assert_eq!(run.code, CORRUPT, "{}", run.stderr);
    fs::remove_file(work.state().join("cli.json")).unwrap();

    // A hard link is refused too: writing the lock in place would write the other file.
    fs::hard_link(&outside, work.state().join("lock")).unwrap();
    work.fails(&["stats"], CORRUPT, "hard link");
    assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
    fs::remove_file(work.state().join("lock")).unwrap();
    work.ok(&["stats"]);
}

/// Case 6: input is read before the lock; a held lock is waited on with a bounded wait that
/// names its holder.
#[test]
fn the_lock_is_not_held_while_input_is_read_and_waits_are_bounded() {
    let work = Workdir::init();
    let mut slow = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
        .arg("--dir")
        .arg(work.state())
        .args(["add", "user", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    work.ok(&["stats"]);
    // Stats ran to the end while `add` still waits for its input: the lock was not held.
    assert!(slow.try_wait().unwrap().is_none(), "the slow add ended before its input came");
    slow.stdin.take().unwrap().write_all(b"from a slow pipe").unwrap();
    assert!(slow.wait().unwrap().success());
    assert_eq!(in_context(&work), 1);

    // A holder that never lets go: the wait ends with an error naming it.
    add_config(&work, "");
    let config = work.state().join("ctxwin.toml");
    let text =
        fs::read_to_string(&config).unwrap().replace("# lock_wait_secs = 30", "lock_wait_secs = 2");
    fs::write(&config, text).unwrap();
    let lock = fs::OpenOptions::new().write(true).open(work.state().join("lock")).unwrap();
    lock.lock().unwrap();
    fs::write(work.state().join("lock"), "pid 4242 (ctxwin test holder)\n").unwrap();
    let run = work.run(&["stats"]);
    assert_eq!(run.code, IO, "{}", run.stderr);
    assert!(run.stderr.contains("pid 4242 (ctxwin test holder)"), "{}", run.stderr);
    assert!(run.stderr.contains("waiting for"), "a waiting message first: {}", run.stderr);
    drop(lock);
    work.ok(&["stats"]);
}

/// Case 7: endless inputs stop at the cap with a clear error.
#[cfg(unix)]
#[test]
fn endless_inputs_stop_at_the_cap() {
    let work = Workdir::init();
    add_config(&work, "");
    let config = work.state().join("ctxwin.toml");
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("# max_input_bytes = 67108864", "max_input_bytes = 1000000");
    fs::write(&config, text).unwrap();
    let config_arg = config.to_str().unwrap();
    for args in [
        &["add", "user", "@/dev/zero"][..],
        &["add", "user", "@/dev/urandom"],
        &["import", "/dev/zero"],
        // Stateless, but `--config`'s limit holds too.
        &["trim", "/dev/zero", "--budget", "1000", "--config", config_arg],
    ] {
        work.fails(args, BAD_INPUT, "larger than the 1000000 bytes allowed");
    }
    let mut yes = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
        .arg("--dir")
        .arg(work.state())
        .args(["add", "user", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = yes.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let line = b"y\n".repeat(4096);
        while stdin.write_all(&line).is_ok() {}
    });
    let output = yes.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(output.status.code(), Some(BAD_INPUT));
    assert!(String::from_utf8_lossy(&output.stderr).contains("standard input is larger"));
    assert_eq!(in_context(&work), 0);
}

/// Case 8: binary input is bad input (3); a non-UTF-8 configuration is a configuration error
/// (8).
#[test]
fn wrong_encodings_get_the_documented_exit_codes() {
    let work = Workdir::init();
    let binary = work.path("binary.bin");
    fs::write(&binary, [0u8, 159, 146, 150, 0xff, 0]).unwrap();
    let at = format!("@{}", binary.display());
    work.fails(&["add", "user", &at], BAD_INPUT, "not UTF-8 text");
    work.fails(&["import", binary.to_str().unwrap()], BAD_INPUT, "not UTF-8 text");
    let latin1 = work.path("latin1.jsonl");
    fs::write(&latin1, b"{\"role\":\"user\",\"content\":\"caf\xe9\"}\n").unwrap();
    work.fails(&["import", latin1.to_str().unwrap()], BAD_INPUT, "not UTF-8 text");
    let config = work.state().join("ctxwin.toml");
    fs::write(&config, b"session = \"caf\xe9\"\n").unwrap();
    work.fails(&["stats"], CONFIG, "not UTF-8");
}

/// Case 9: an import that fails half-way keeps nothing, and a retry stores each message once.
#[test]
fn a_failed_import_keeps_nothing_and_a_retry_does_not_duplicate() {
    let work = Workdir::init();
    work.ok(&["add", "user", "before the import"]);
    let mut lines: String = (0..1_200)
        .map(|n| format!("{{\"role\":\"user\",\"content\":\"imported {n}\"}}\n"))
        .collect();
    let good = work.write("good.jsonl", &lines);
    lines.insert_str(
        lines.match_indices('\n').nth(998).unwrap().0 + 1,
        "{\"role\":\"tool\",\"tool_call_id\":\"nobody\",\"content\":\"orphan\"}\n",
    );
    let bad = work.write("bad.jsonl", &lines);
    let line = work.fails(&["import", bad.to_str().unwrap()], BAD_INPUT, "message 1000 of 1201");
    assert!(line.contains("nothing of the file was kept"), "{line}");
    assert_eq!((in_context(&work), archived(&work)), (1, 1));
    assert_eq!(archive_contents(&work.state()), ["before the import"]);
    work.ok(&["import", good.to_str().unwrap()]);
    let contents = archive_contents(&work.state());
    assert_eq!(contents.len(), 1_201, "each message once");
    let mut unique = contents.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 1_201);
}

/// Case 10: concurrent inits: exactly one wins, the others say so and delete nothing of it;
/// a killed init leaves nothing that blocks the next.
#[test]
fn init_is_atomic() {
    for _ in 0..3 {
        let work = Workdir::new();
        let children: Vec<_> = (0..4)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_ctxwin"))
                    .arg("--dir")
                    .arg(work.state())
                    .arg("init")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes: Vec<i32> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap().status.code().unwrap())
            .collect();
        assert_eq!(codes.iter().filter(|&&c| c == 0).count(), 1, "{codes:?}");
        assert!(codes.iter().all(|&c| c == 0 || c == NO_STATE), "{codes:?}");
        work.ok(&["add", "user", "the winner's state works"]);
        assert_eq!(archived(&work), 1);
    }
    // An existing directory with other files in it is initialized in place, its files kept.
    let work = Workdir::new();
    fs::create_dir(work.state()).unwrap();
    fs::write(work.state().join("README"), "mine").unwrap();
    work.ok(&["init"]);
    assert_eq!(fs::read_to_string(work.state().join("README")).unwrap(), "mine");
    work.ok(&["add", "user", "in place"]);
    work.fails(&["init"], NO_STATE, "already holds");

    for delay in [0u64, 2, 5, 8, 12, 16, 20, 30, 40, 60, 80] {
        let work = Workdir::new();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ctxwin"))
            .arg("--dir")
            .arg(work.state())
            .arg("init")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        if work.state().exists() {
            // The state appeared whole: configuration, archive and the first checkpoint.
            let listed = work.json(&["checkpoints"]);
            assert_eq!(listed.as_array().map(Vec::len), Some(1), "killed after {delay} ms");
            assert!(work.state().join("archive.db").is_file());
            work.ok(&["stats"]);
        } else {
            work.ok(&["init"]);
            work.ok(&["stats"]);
        }
    }
}

/// Case 10b: `init` completes a half-made state (a configuration, no checkpoint, no message
/// stored) with its own configuration, and refuses a state whose archive holds messages.
#[test]
fn init_completes_a_half_made_state() {
    let work = Workdir::init();
    add_config(&work, "\n# kept by the completing init\n");
    let config = fs::read_to_string(work.state().join("ctxwin.toml")).unwrap();
    fs::remove_file(work.state().join("archive.db")).unwrap();
    fs::remove_dir_all(work.state().join("checkpoints")).unwrap();
    work.fails(&["stats"], CORRUPT, "archive.db is missing");
    work.fails(&["init", "--config", "other.toml"], NO_STATE, "without --config");
    work.ok(&["init"]);
    assert_eq!(fs::read_to_string(work.state().join("ctxwin.toml")).unwrap(), config);
    assert_eq!(work.json(&["checkpoints"]).as_array().map(Vec::len), Some(1));
    work.ok(&["add", "user", "the completed state works"]);
    assert_eq!(archived(&work), 1);
    work.fails(&["init"], NO_STATE, "already holds");

    // An empty archive and an empty checkpoints directory: completed as well.
    let work = Workdir::init();
    fs::remove_dir_all(work.state().join("checkpoints")).unwrap();
    fs::create_dir(work.state().join("checkpoints")).unwrap();
    work.ok(&["init"]);
    work.ok(&["stats"]);

    // Messages in the archive and no checkpoint: not half-made, nothing is overwritten.
    let work = Workdir::init();
    work.ok(&["add", "user", "a message that must not be lost"]);
    fs::remove_dir_all(work.state().join("checkpoints")).unwrap();
    work.fails(&["init"], CORRUPT, "ctxwin recover");
    assert_eq!(archive_contents(&work.state()), ["a message that must not be lost"]);
    work.fails(&["stats"], CORRUPT, "ctxwin recover");
    work.ok(&["recover"]);
    let payload = work.ok(&["build", "--format", "text"]).stdout;
    assert!(payload.contains("a message that must not be lost"), "{payload}");
}

/// Case 11: with every checkpoint damaged, `recover` rebuilds the context from the archive;
/// a swapped archive is refused until `recover` rebuilds from it.
#[test]
fn recover_rebuilds_the_context_from_the_archive() {
    let work = Workdir::init();
    let big = "a long tool output line\n".repeat(2_000);
    work.ok(&["add", "user", "first question"]);
    work.ok(&["add", "assistant", "", "--tool-calls", r#"[{"id":"c1","name":"cat"}]"#]);
    work.ok(&["add", "tool", &big, "--tool-call-id", "c1"]);
    work.ok(&["add", "user", "second question"]);
    let before = work.ok(&["build", "--format", "text"]).stdout;
    for entry in fs::read_dir(work.state().join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    }
    work.fails(&["stats"], CORRUPT, "restore latest");
    work.fails(&["restore", "latest"], CORRUPT, "ctxwin recover");
    let report = work.json(&["recover"]);
    assert_eq!(report["messages"], 4, "{report}");
    assert!(report["kept_in"].as_str().unwrap().starts_with("main@recovered-"));
    assert_eq!(work.ok(&["build", "--format", "text"]).stdout, before);
    assert_eq!(archive_contents(&work.state()).len(), 4);
    let conn = rusqlite::Connection::open(work.state().join("archive.db")).unwrap();
    let full: String = conn
        .query_row(
            "SELECT coalesce(m.original, m.content) FROM messages m
             JOIN sessions s ON s.id = m.session_id WHERE s.name = 'main' AND m.role = 'tool'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    drop(conn);
    assert_eq!(full, big, "the full text is back");
    work.ok(&["add", "user", "third question"]);
    assert_eq!((in_context(&work), archived(&work)), (5, 5));
    // A second recover changes nothing that was acknowledged.
    work.ok(&["recover"]);
    assert_eq!(archive_contents(&work.state()).len(), 5);
}

/// Case 6: a model server that accepts and never answers holds the state no longer than
/// `[llm] wait_secs` in all.
#[test]
fn a_silent_llm_server_is_waited_on_within_wait_secs() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().take(16) {
            open.push(stream);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    let work = Workdir::init();
    let config = work.state().join("ctxwin.toml");
    let text = fs::read_to_string(&config).unwrap().replace(
        "# wait_secs = 120",
        &format!("wait_secs = 4\nurl = \"{url}\"\ntimeout_secs = 60"),
    );
    fs::write(&config, text).unwrap();
    for n in 0..40 {
        work.ok(&["add", "user", &format!("message {n} for the summary ").repeat(10)]);
    }
    let run = work.run(&["summarize", "--keep", "4"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The command gave up on the model while the server still held every connection open
    // (it never answers): the wait was bounded, not ended by the server.
    assert!(!held.is_finished(), "summarize outlived the silent server's 60 s");
    drop(held);
}
