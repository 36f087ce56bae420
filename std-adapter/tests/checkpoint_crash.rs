//! Crash safety of the checkpoint store: a writer process is killed with SIGKILL at random
//! moments, over and over, and after every kill the store must restore a complete, valid
//! checkpoint and never show a partial one.
//!
//! The writer is this same test binary, re-executed with [`CHILD_DIR_ENV`] set so that
//! the ignored test [`checkpoint_writer_child`] runs the write loop. That needs nothing
//! beyond `cargo test`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ctxwin_std::store::{CheckpointDir, CheckpointSink, CheckpointStatus, Fence, Scope};

/// The directory of one conversation's checkpoints.
fn sink(dir: &Path) -> CheckpointDir {
    CheckpointDir::bound(dir, Scope::local("crash"))
}

/// Tells a re-executed test binary to act as the writer, storing into this directory.
const CHILD_DIR_ENV: &str = "CTXWIN_CHECKPOINT_CRASH_CHILD_DIR";
const CHILD_TEST: &str = "checkpoint_writer_child";
const READY: &str = "CHECKPOINT WRITER READY";
const CONTENT_MAGIC: &[u8; 8] = b"CRASHTST";
const MIN_LEN: u64 = 200_000;
const MAX_LEN: u64 = 2_000_000;
const KILLS: u32 = 80;
/// Kills land uniformly within this long after the writer reports ready.
const MAX_KILL_DELAY_MICROS: u64 = 60_000;
/// A writer whose parent has gone away stops by itself after this long.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);

fn splitmix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic, self-describing checkpoint content for sequence number `seq`:
/// magic, seq, total length, then pseudo-random bytes derived from seq.
fn content(seq: u64) -> Vec<u8> {
    let len = MIN_LEN + splitmix(seq) % (MAX_LEN - MIN_LEN);
    let len = usize::try_from(len).unwrap();
    let mut out = Vec::with_capacity(len + 8);
    out.extend_from_slice(CONTENT_MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    let mut state = seq;
    while out.len() < len {
        state = splitmix(state);
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The sequence number of `bytes` if they are exactly what the writer produced for it.
fn verify(bytes: &[u8]) -> Result<u64, String> {
    let header = bytes.get(..24).ok_or_else(|| format!("only {} bytes", bytes.len()))?;
    if &header[..8] != CONTENT_MAGIC {
        return Err("bad content magic".into());
    }
    let seq = u64::from_le_bytes(header[8..16].try_into().unwrap());
    let len = u64::from_le_bytes(header[16..24].try_into().unwrap());
    if len != bytes.len() as u64 {
        return Err(format!("seq {seq}: header says {len} bytes, got {}", bytes.len()));
    }
    if bytes != content(seq) {
        return Err(format!("seq {seq}: content differs from what the writer produced"));
    }
    Ok(seq)
}

/// Entry point of the writer process; a no-op unless re-executed by the crash test.
#[test]
#[ignore = "writer process of checkpoint_survives_repeated_sigkill; runs only when re-executed"]
fn checkpoint_writer_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else { return };
    let store = sink(Path::new(&dir));
    let scope = Scope::local("crash");
    let mut seq = match store.load_latest(&scope, &mut |_| Ok(())).unwrap() {
        Some(restored) => verify(&restored.bytes).unwrap() + 1,
        None => 0,
    };
    // libtest may already have printed "test name ... " on this line.
    println!("\n{READY}");
    // The parent normally kills us within milliseconds; these bounds only stop an orphan.
    let started = Instant::now();
    let parent = parent_id();
    while started.elapsed() < CHILD_LIFETIME && parent_id() == parent {
        store.save(&scope, Fence::NONE, &content(seq)).unwrap();
        store.prune(&scope, Fence::NONE, 4).unwrap();
        seq += 1;
    }
}

#[cfg(unix)]
fn parent_id() -> u32 {
    std::os::unix::process::parent_id()
}

#[cfg(not(unix))]
fn parent_id() -> u32 {
    0
}

/// Kills the writer if an assertion fails while it runs.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_writer(dir: &Path) -> KillOnDrop {
    let exe = std::env::current_exe().unwrap();
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([CHILD_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let ready =
        BufReader::new(stdout).lines().map_while(Result::ok).any(|line| line.contains(READY));
    assert!(ready, "writer exited before reporting ready");
    child
}

fn temp_files(dir: &Path) -> HashSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".tmp"))
        .collect()
}

#[test]
fn checkpoint_survives_repeated_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = seed;
    let mut seen_temps = HashSet::new();
    // A first checkpoint before any crash, so every restore below must find one.
    let scope = Scope::local("crash");
    sink(dir.path()).save(&scope, Fence::NONE, &content(0)).unwrap();
    let mut latest_seq = 0;
    let (mut mid_write, mut progressed, mut restored_total) = (0u32, 0u32, 0u32);

    for kill in 0..KILLS {
        let mut writer = spawn_writer(dir.path());
        rng = splitmix(rng);
        std::thread::sleep(Duration::from_micros(rng % MAX_KILL_DELAY_MICROS));
        writer.0.kill().unwrap();
        writer.0.wait().unwrap();

        let temps = temp_files(dir.path());
        if temps.difference(&seen_temps).next().is_some() {
            mid_write += 1;
        }
        seen_temps = temps;

        let store = sink(dir.path());
        for info in store.list(&scope).unwrap() {
            assert_eq!(info.status, CheckpointStatus::Ok, "kill {kill} (seed {seed}): {info:?}");
        }
        let restored = store
            .load_latest(&scope, &mut |_| Ok(()))
            .unwrap()
            .expect("the first checkpoint or a newer one");
        assert!(restored.skipped.is_empty(), "kill {kill} (seed {seed}): {:?}", restored.skipped);
        let seq = verify(&restored.bytes).unwrap_or_else(|why| {
            panic!("kill {kill} (seed {seed}) restored {}: {why}", restored.id)
        });
        assert!(
            seq >= latest_seq,
            "kill {kill} (seed {seed}): went back from {latest_seq} to {seq}"
        );
        progressed += u32::from(seq > latest_seq);
        latest_seq = seq;
        restored_total += 1;
    }

    eprintln!(
        "checkpoint crash test (seed {seed}): {KILLS} kills, {mid_write} mid-write (stray temp \
         file left), {restored_total} restores verified, newest checkpoint advanced after \
         {progressed} kills, last seq {latest_seq}"
    );
    assert_eq!(restored_total, KILLS);
    assert!(progressed > 0, "the writer never completed a checkpoint between kills");
    assert!(
        mid_write > 0,
        "no kill landed inside a write: the test did not exercise the crash window"
    );
}
