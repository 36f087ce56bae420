//! Damage on disk: every byte of a stored row's record in an SQLite archive file flipped, one
//! at a time, and every read that serves rows (get, get-many, paging, search, vectors, drill
//! down) run on the damaged file as a new process would open it. Each flip must end reported
//! (an error naming the damage) or harmless (everything read equals what was written); none may
//! serve changed text without an error.
//!
//! `cargo test -p ctxwin-std --test store_damage -- --nocapture` prints the figures.

use std::fs;
use std::path::Path;

use ctxwin_std::store::sqlite::SqliteArchive;
use ctxwin_std::store::{
    ArchiveStore, ArchivedMessage, Fence, Scope, SearchQuery, StoreError, SummaryRecord,
};
use ctxwin_std::{ChatMessage, ToolCall, core::Role};

const TARGET: &str = "the quarterly report for the northwind account is due on monday";

fn rows() -> Vec<ArchivedMessage> {
    let call = ToolCall::new("c1", "read_file", r#"{"path":"reports/q3.md"}"#);
    vec![
        ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "an intact neighbour before"))
            .with_timestamp(1_700_000_000_001)
            .with_tokens(9),
        ArchivedMessage::new(2, 2, ChatMessage::text(Role::User, TARGET))
            .with_timestamp(1_700_000_000_002)
            .with_tokens(17)
            .with_original(format!("{TARGET}, with the full appendix"))
            .with_raw(format!(r#"{{"role":"user","content":"{TARGET}"}}"#)),
        ArchivedMessage::new(3, 3, ChatMessage::assistant_calls("reading it", vec![call]))
            .with_timestamp(1_700_000_000_003)
            .with_tokens(21),
    ]
}

/// Everything the archive serves of `scope`, read as a caller would; an error when any read
/// reports damage.
fn read_all(archive: &SqliteArchive, scope: &Scope) -> Result<Vec<String>, StoreError> {
    let mut served = Vec::new();
    for row in archive.rows_after(scope, 0, 100)? {
        served.push(format!("{row:?}"));
    }
    for row in archive.get_many(scope, &[1, 2, 3])? {
        served.push(format!("{row:?}"));
    }
    if let Some(row) = archive.get(scope, 2)? {
        served.push(format!("{row:?}"));
    }
    for query in ["quarterly report northwind", "appendix", "read_file reports", "neighbour"] {
        for hit in archive.search(scope, &SearchQuery::new(query, 10).with_snippets())? {
            served.push(format!("{} {:?} {} {}", hit.id, hit.role, hit.unit, hit.content));
        }
    }
    for row in archive.vectors(scope, "m", 0)? {
        served.push(format!("{} {} {:?}", row.id, row.content, row.vector));
    }
    for row in archive.drill_down(scope, 10)? {
        served.push(format!("{row:?}"));
    }
    Ok(served)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// Writes the archive and closes it: its whole content in the main file, no WAL.
fn written(path: &Path, scope: &Scope) -> Vec<String> {
    let archive = SqliteArchive::open(path).unwrap();
    archive.put(scope, Fence::NONE, &rows()).unwrap();
    archive
        .put_summary(scope, Fence::NONE, &SummaryRecord::new(10, 1, "reports", vec![2, 3]))
        .unwrap();
    archive.put_vectors(scope, Fence::NONE, "m", &[(2, vec![0.25, -1.5])]).unwrap();
    let expected = read_all(&archive, scope).unwrap();
    drop(archive);
    assert!(!path.with_extension("db-wal").exists(), "the last close checkpoints the WAL");
    expected
}

#[test]
fn every_single_byte_flip_in_a_stored_row_is_reported_or_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let scope = Scope::new("acme", "damage");
    let clean = dir.path().join("clean.db");
    let expected = written(&clean, &scope);
    let saved = fs::read(&clean).unwrap();
    // The row's record: its header and integer fields before the content, the content, then
    // the tool calls, original, raw JSON and checksum after it.
    let content_at = find(&saved, TARGET.as_bytes()).expect("the row's content is in the file");
    let raw = format!(r#"{{"role":"user","content":"{TARGET}"}}"#);
    let raw_at =
        content_at + find(&saved[content_at..], raw.as_bytes()).expect("raw JSON after it");
    let start = content_at.saturating_sub(40);
    let end = (raw_at + raw.len() + 16).min(saved.len());
    let (mut reported, mut harmless, mut served_changed) = (0, 0, Vec::new());
    for (n, at) in (start..end).enumerate() {
        let mut bytes = saved.clone();
        bytes[at] ^= 0x5a;
        // A file of its own each time: a new process opening it runs SQLite's own checks too.
        let path = dir.path().join(format!("flip-{n}.db"));
        fs::write(&path, &bytes).unwrap();
        let outcome = SqliteArchive::open(&path).and_then(|archive| read_all(&archive, &scope));
        match outcome {
            Err(error) => {
                if std::env::var("DAMAGE_VERBOSE").is_ok() {
                    println!("{at}: {error}");
                }
                reported += 1
            }
            Ok(served) if served == expected => harmless += 1,
            Ok(served) => served_changed.push((at, served)),
        }
        let _ = fs::remove_file(&path);
    }
    println!(
        "row byte flips: {} bytes ({start}..{end}) flipped one at a time: {reported} reported, {harmless} harmless, {} served changed text",
        end - start,
        served_changed.len()
    );
    assert!(reported > (end - start) / 2, "{reported} of {}", end - start);
    assert!(
        served_changed.is_empty(),
        "served changed text without an error at offsets {:?}",
        served_changed.iter().map(|(at, _)| at).collect::<Vec<_>>()
    );
}
