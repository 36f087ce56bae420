use std::fs::{self, File};
use std::time::{Duration, SystemTime};

use super::*;
use crate::store::checkpoint::{SkipReason, frame};
use crate::store::{CheckpointStatus, ErrorKind, conformance};

fn scope() -> Scope {
    Scope::local("s")
}

fn sink() -> (tempfile::TempDir, CheckpointDir) {
    let dir = tempfile::tempdir().unwrap();
    let sink = CheckpointDir::bound(dir.path(), scope());
    (dir, sink)
}

fn path(sink: &CheckpointDir, id: &CheckpointId) -> std::path::PathBuf {
    sink.path_of(&scope(), id).unwrap()
}

#[test]
fn passes_the_checkpoint_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let count = std::sync::atomic::AtomicUsize::new(0);
    conformance::checkpoints(&|| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::sync::Arc::new(CheckpointDir::per_scope(root.path().join(n.to_string())))
    });
    let damage_root = root.path().join("damage");
    let sink = CheckpointDir::per_scope(&damage_root);
    let damage = |scope: &Scope, id: &CheckpointId| {
        let path = sink.path_of(scope, id).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        fs::write(&path, bytes).is_ok()
    };
    conformance::damaged_checkpoint(&sink, &damage);
}

#[test]
fn saves_round_trip_and_list_newest_first() {
    let (_dir, sink) = sink();
    let s = scope();
    let saved: Vec<_> =
        (0..300u32).map(|n| sink.save(&s, Fence::NONE, &n.to_le_bytes()).unwrap()).collect();
    assert!(saved.windows(2).all(|pair| pair[0] < pair[1]), "ids created fast still sort");
    let listed = sink.list(&s).unwrap();
    let listed_ids: Vec<_> = listed.iter().map(|info| info.id.clone()).collect();
    let mut expected = saved.clone();
    expected.reverse();
    assert_eq!(listed_ids, expected);
    assert!(listed.iter().all(|info| info.status == CheckpointStatus::Ok));
    assert!(listed.iter().all(|info| info.size
        == (frame::HEADER_LEN + frame::SEQUENCE_LEN + 4 + frame::TRAILER_LEN) as u64));
    for (n, id) in saved.iter().enumerate() {
        assert_eq!(sink.load(&s, id).unwrap(), (n as u32).to_le_bytes());
    }
    let latest = sink.load_latest(&s, &mut |_| Ok(())).unwrap().unwrap();
    assert_eq!(latest.id, saved[299]);
    assert!(latest.skipped.is_empty());
}

#[test]
fn prune_keeps_only_the_newest_n() {
    let (_dir, sink) = sink();
    let s = scope();
    let saved: Vec<_> = (0..7u8).map(|n| sink.save(&s, Fence::NONE, &[n]).unwrap()).collect();
    assert_eq!(
        sink.prune(&s, Fence::NONE, 3).unwrap(),
        saved[..4].iter().rev().cloned().collect::<Vec<_>>()
    );
    assert_eq!(sink.ids(&s).unwrap(), [saved[6].clone(), saved[5].clone(), saved[4].clone()]);
    assert_eq!(sink.load(&s, &saved[0]).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn torn_and_damaged_files_are_skipped_with_fallback() {
    let (_dir, sink) = sink();
    let s = scope();
    let good = sink.save(&s, Fence::NONE, b"good state").unwrap();
    let flipped = sink.save(&s, Fence::NONE, b"bit rot here").unwrap();
    let torn = sink.save(&s, Fence::NONE, b"torn write").unwrap();
    let cut = sink.save(&s, Fence::NONE, b"cut short").unwrap();

    let mut bytes = fs::read(path(&sink, &flipped)).unwrap();
    bytes[frame::HEADER_LEN + frame::SEQUENCE_LEN + 2] ^= 0x40;
    fs::write(path(&sink, &flipped), bytes).unwrap();
    fs::write(path(&sink, &torn), b"CTXWCK").unwrap();
    let bytes = fs::read(path(&sink, &cut)).unwrap();
    fs::write(path(&sink, &cut), &bytes[..bytes.len() - 3]).unwrap();

    let restored = sink.load_latest(&s, &mut |_| Ok(())).unwrap().unwrap();
    assert_eq!((restored.id, restored.bytes), (good.clone(), b"good state".to_vec()));
    let skipped: Vec<_> = restored.skipped.iter().map(|s| s.id.clone()).collect();
    assert_eq!(skipped, [cut, torn.clone(), flipped.clone()]);
    assert!(restored.skipped.iter().all(|s| matches!(s.reason, SkipReason::Damaged(_))));
    assert!(restored.skipped[1].reason.to_string().contains("torn"), "{}", restored.skipped[1]);
    assert_eq!(restored.skipped[1].location, path(&sink, &torn).display().to_string());

    let statuses: Vec<_> =
        sink.list(&s).unwrap().into_iter().map(|info| (info.id, info.status)).collect();
    assert!(matches!(&statuses[1], (id, CheckpointStatus::Damaged(_)) if *id == torn));
    assert_eq!(statuses[3], (good, CheckpointStatus::Ok));
    assert_eq!(sink.load(&s, &flipped).unwrap_err().kind(), ErrorKind::Damaged);
}

#[test]
fn no_intact_checkpoint_is_an_error_and_no_file_is_none() {
    let (dir, sink) = sink();
    let s = scope();
    assert_eq!(sink.load_latest(&s, &mut |_| Ok(())).unwrap(), None);
    let only = sink.save(&s, Fence::NONE, b"x").unwrap();
    fs::write(path(&sink, &only), b"garbage that is long enough to hold a header").unwrap();
    match sink.load_latest(&s, &mut |_| Ok(())) {
        Err(StoreError::NoUsableCheckpoint { place, skipped }) => {
            assert_eq!(place, dir.path().display().to_string());
            assert_eq!(skipped.len(), 1);
            assert!(matches!(skipped[0].reason, SkipReason::Damaged(_)));
        }
        other => panic!("expected NoUsableCheckpoint, got {other:?}"),
    }
}

#[test]
fn rejected_payloads_are_skipped() {
    let (_dir, sink) = sink();
    let s = scope();
    let accepted = sink.save(&s, Fence::NONE, b"ok:1").unwrap();
    let rejected = sink.save(&s, Fence::NONE, b"bad:2").unwrap();
    let restored = sink
        .load_latest(&s, &mut |bytes| {
            if bytes.starts_with(b"ok:") {
                Ok(())
            } else {
                Err(format!("{} bytes refused", bytes.len()))
            }
        })
        .unwrap()
        .unwrap();
    assert_eq!(restored.id, accepted);
    assert_eq!(restored.skipped[0].id, rejected);
    assert_eq!(restored.skipped[0].reason, SkipReason::Rejected("5 bytes refused".into()));
}

#[test]
fn temp_and_foreign_files_are_ignored() {
    let (dir, sink) = sink();
    let s = scope();
    let good = sink.save(&s, Fence::NONE, b"good").unwrap();
    let newer = CheckpointId::parse("99991231T235959.999999Z-999999").unwrap();
    fs::write(dir.path().join(format!("{newer}.tmp")), b"half a write").unwrap();
    fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    fs::write(dir.path().join("latest.ckpt"), b"not an id").unwrap();
    fs::write(dir.path().join(format!("{newer}.ckpt.bak")), b"backup").unwrap();
    fs::create_dir(dir.path().join("20000101T000000.000000Z-000000.ckpt")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        "/etc/hostname",
        dir.path().join("21000101T000000.000000Z-000000.ckpt"),
    )
    .unwrap();
    assert_eq!(sink.ids(&s).unwrap(), std::slice::from_ref(&good));
    assert_eq!(sink.list(&s).unwrap().len(), 1);
    for _ in 0..3 {
        sink.save(&s, Fence::NONE, b"more").unwrap();
    }
    sink.prune(&s, Fence::NONE, 2).unwrap();
    assert_eq!(sink.ids(&s).unwrap().len(), 2);
    for kept in ["notes.txt", "latest.ckpt", "20000101T000000.000000Z-000000.ckpt"] {
        assert!(dir.path().join(kept).exists(), "{kept} must survive pruning");
    }
    assert!(dir.path().join(format!("{newer}.tmp")).exists(), "a fresh temp file is left alone");
}

#[test]
fn a_missing_directory_reads_as_empty_and_the_first_save_creates_it() {
    let root = tempfile::tempdir().unwrap();
    let nested = root.path().join("conv/checkpoints");
    let s = scope();
    let sink = CheckpointDir::bound(&nested, s.clone());
    assert_eq!(sink.ids(&s).unwrap(), []);
    assert_eq!(sink.list(&s).unwrap(), []);
    assert_eq!(sink.load_latest(&s, &mut |_| Ok(())).unwrap(), None);
    assert_eq!(sink.prune(&s, Fence::NONE, 1).unwrap(), []);
    assert_eq!(sink.rewrite(&s, Fence::NONE, &|_| None).unwrap(), 0);
    let id = CheckpointId::parse("20260101T000000.000000Z-000000").unwrap();
    assert_eq!(sink.load(&s, &id).unwrap_err().kind(), ErrorKind::NotFound);
    assert!(!root.path().join("conv").exists(), "reads create nothing");
    sink.save(&s, Fence::NONE, b"first").unwrap();
    assert!(nested.is_dir());
}

#[test]
fn a_file_where_the_directory_goes_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let at = root.path().join("checkpoints");
    fs::write(&at, b"not a directory").unwrap();
    let s = scope();
    let sink = CheckpointDir::bound(&at, s.clone());
    assert_eq!(sink.ids(&s).unwrap_err().kind(), ErrorKind::Io);
    assert!(sink.save(&s, Fence::NONE, b"x").is_err());
    assert_eq!(fs::read(&at).unwrap(), b"not a directory");
}

#[test]
fn saves_remove_only_stale_temp_files() {
    let (dir, sink) = sink();
    let old = dir.path().join("20200101T000000.000000Z-000001.tmp");
    let fresh = dir.path().join("20200101T000000.000000Z-000002.tmp");
    let foreign = dir.path().join("editor-swap.tmp");
    for path in [&old, &fresh, &foreign] {
        fs::write(path, b"partial").unwrap();
    }
    let long_ago = SystemTime::now() - STALE_TEMP_AGE - Duration::from_secs(5);
    for path in [&old, &foreign] {
        File::options().write(true).open(path).unwrap().set_modified(long_ago).unwrap();
    }
    sink.save(&scope(), Fence::NONE, b"x").unwrap();
    assert!(!old.exists());
    assert!(fresh.exists());
    assert!(foreign.exists());
}

#[test]
fn rewrite_masks_intact_and_damaged_files_and_keeps_the_order() {
    let (_dir, sink) = sink();
    let s = scope();
    let old = sink.save(&s, Fence::NONE, b"the secret is 42").unwrap();
    let new = sink.save(&s, Fence::NONE, b"still the secret").unwrap();
    let broken = sink.save(&s, Fence::NONE, b"secret in a torn file").unwrap();
    let bytes = fs::read(path(&sink, &broken)).unwrap();
    fs::write(path(&sink, &broken), &bytes[..bytes.len() - 2]).unwrap();
    let mask = |bytes: &[u8]| -> Option<Vec<u8>> {
        let text = String::from_utf8_lossy(bytes);
        text.contains("secret").then(|| text.replace("secret", "******").into_bytes())
    };
    assert_eq!(sink.rewrite(&s, Fence::NONE, &mask).unwrap(), 3);
    assert_eq!(sink.load(&s, &old).unwrap(), b"the ****** is 42");
    assert_eq!(sink.ids(&s).unwrap(), [broken.clone(), new, old]);
    assert!(!String::from_utf8_lossy(&fs::read(path(&sink, &broken)).unwrap()).contains("secret"));
}

#[test]
fn scopes_map_to_escaped_directories() {
    assert_eq!(escape(""), "-");
    assert_eq!(escape("-"), "%2D");
    assert_eq!(escape("a.b/../c"), "a%2Eb%2F%2E%2E%2Fc");
    assert_eq!(escape("chat_7"), "chat_7");
}
