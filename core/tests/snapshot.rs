//! Snapshots through the public API: round trips (also over random sessions of the property
//! model), streaming, the size bound, golden bytes, and damage that must be refused.

use ctxwin_core::ring::{Ring, RingStorage};
use ctxwin_core::{
    Capacities, Config, ContextManager, DefaultCapacities, Level, Message, OpenAiRequest, Role,
    SnapshotError, TinyCapacities, ToolCall,
};
use proptest::prelude::*;

mod properties_support;
use properties_support::{Model, Tight, config as any_config, op};

/// Bytes before the body and after it (`core/SNAPSHOT.md`).
const HEADER_LEN: usize = 48;
const TRAILER_LEN: usize = 4;

/// CRC-32/ISO-HDLC, as the format uses, bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// `(messages, bytes)` of `level` in capacities `C`.
fn capacity<C: Capacities>(level: Level) -> (usize, usize) {
    match level {
        Level::Permanent => (C::Permanent::MESSAGES, C::Permanent::BYTES),
        Level::Session => (C::Session::MESSAGES, C::Session::BYTES),
        Level::Working => (C::Working::MESSAGES, C::Working::BYTES),
        _ => (C::Volatile::MESSAGES, C::Volatile::BYTES),
    }
}

type Tiny = ContextManager<TinyCapacities>;

fn payload_json<C: Capacities>(
    manager: &mut ContextManager<C>,
) -> Result<Vec<u8>, ctxwin_core::Error> {
    let mut body = vec![0u8; 256 * 1024];
    let len =
        manager.compose(&["dynamic"])?.write_openai(&mut body[..], OpenAiRequest::default())?;
    body.truncate(len);
    Ok(body)
}

fn snapshot<C: Capacities>(manager: &ContextManager<C>) -> Vec<u8> {
    let mut buffer = vec![0u8; ContextManager::<C>::SNAPSHOT_MAX_SIZE];
    let len = manager.snapshot_into(&mut buffer).unwrap().len();
    buffer.truncate(len);
    buffer
}

/// A manager with something in every level: rules, a tool, a summary, a reduced output,
/// evicted units waiting in the outbox, and a unit still waiting for one result.
fn busy() -> Tiny {
    let mut m = Tiny::new();
    m.push(Message::system("Be terse.")).unwrap();
    m.add_tool_definition(r#"{"name":"ls","parameters":{}}"#).unwrap();
    m.add_summary("Earlier: chose Rust.", &[(1, 3)], 5).unwrap();
    m.push(Message::user("go").at(10)).unwrap();
    let calls = [ToolCall::new("a", "ls", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let long: String = (0..400).map(|i| format!("line {i}\n")).collect();
    m.push(Message::tool_result("a", &long)).unwrap();
    for i in 0..12 {
        let _ = m.push(Message::assistant(&format!("step {i} {}", "x".repeat(150))).at(20 + i));
    }
    m.push(Message::assistant("noise").in_level(Level::Volatile).important()).unwrap();
    let calls = [ToolCall::new("b", "cat", "{}"), ToolCall::new("c", "cat", "{}")];
    m.push(Message::assistant("two reads").with_tool_calls(&calls)).unwrap();
    m.push(Message::tool_result("c", "done")).unwrap();
    assert!(m.outbox().count() > 0, "the fixture should hold evicted units");
    assert_eq!(m.unanswered_calls(), 1);
    m
}

#[test]
fn round_trip_restores_everything_and_behaves_the_same() {
    let mut original = busy();
    let bytes = snapshot(&original);
    assert_eq!(bytes.len(), original.snapshot_len());
    let mut restored = Tiny::new();
    restored.restore_from(&bytes).unwrap();
    assert_eq!(restored.stats(), original.stats());
    assert_eq!(restored.config(), original.config());
    assert_eq!(snapshot(&restored), bytes, "snapshot of the restored manager is identical");
    let outbox = |m: &Tiny| m.outbox().map(|u| (u.first_id(), u.len())).collect::<Vec<_>>();
    assert_eq!(outbox(&restored), outbox(&original));
    for m in [&mut original, &mut restored] {
        m.push(Message::tool_result("b", "late")).unwrap();
        m.drain_outbox(|_| {});
    }
    assert_eq!(payload_json(&mut restored).unwrap(), payload_json(&mut original).unwrap());
}

#[test]
fn streaming_and_buffered_snapshots_are_the_same_bytes() {
    let manager = busy();
    let mut streamed = vec![0u8; Tiny::SNAPSHOT_MAX_SIZE];
    let len = manager.snapshot_to(&mut streamed[..]).unwrap();
    assert_eq!(&streamed[..len], &snapshot(&manager)[..]);
    let mut restored = Tiny::new();
    let mut scratch = vec![0u8; Tiny::SNAPSHOT_MAX_SIZE];
    restored.restore_from_reader(&streamed[..len], &mut scratch).unwrap();
    assert_eq!(restored.stats(), manager.stats());
    let mut tiny_scratch = [0u8; 100];
    assert!(matches!(
        restored.restore_from_reader(&streamed[..len], &mut tiny_scratch),
        Err(SnapshotError::BufferTooSmall { .. })
    ));
    let mut full = [0u8; 64];
    assert!(matches!(manager.snapshot_to(&mut full[..]), Err(SnapshotError::Io(_))));
}

/// Fills every header slot and every arena byte of every level.
fn full<C: Capacities>() -> ContextManager<C> {
    let config = Config {
        context_window: 10_000_000,
        reserved_for_reply: 0,
        permanent_budget: 1_000_000,
        session_budget: 1_000_000,
        working_budget: 1_000_000,
        trigger_percent: 100,
        locked_tail: u16::MAX,
        ..Config::DEFAULT
    };
    let mut m = ContextManager::<C>::with_config(config).unwrap();
    let fill = |m: &mut ContextManager<C>, level: Level| {
        let (messages, bytes) = capacity::<C>(level);
        let per = bytes / messages;
        for i in 0..messages {
            let len = if i + 1 == messages { bytes - per * (messages - 1) } else { per };
            let text = "z".repeat(len);
            let id = match level {
                Level::Session => m.add_summary(&text, &[], u64::MAX),
                _ => m.push(Message::new(Role::User, &text).in_level(level).at(u64::MAX)),
            };
            id.unwrap();
        }
    };
    for level in Level::ALL {
        fill(&mut m, level);
    }
    m
}

#[test]
fn a_full_manager_fits_the_declared_maximum() {
    let tiny = full::<TinyCapacities>();
    assert_eq!(tiny.stats().levels.iter().map(|l| l.bytes).sum::<u32>(), 1024 + 768 + 3072 + 1024);
    assert!(
        tiny.snapshot_len() <= Tiny::SNAPSHOT_MAX_SIZE,
        "{} > {}",
        tiny.snapshot_len(),
        Tiny::SNAPSHOT_MAX_SIZE
    );
    let default = full::<DefaultCapacities>();
    let max = ContextManager::<DefaultCapacities>::SNAPSHOT_MAX_SIZE;
    assert!(default.snapshot_len() <= max);
    // The bound is tight enough to be useful: within a tenth of a full snapshot.
    assert!(max - default.snapshot_len() < max / 10, "{} vs {max}", default.snapshot_len());
}

/// The bytes of a small fixed state. A change here is a format change: bump
/// `FORMAT_VERSION` and update `core/SNAPSHOT.md` rather than the expectation alone.
#[test]
fn golden_bytes() {
    let mut m = Tiny::new();
    m.push(Message::system("Hi").at(1)).unwrap();
    m.push(Message::user("ok").at(2)).unwrap();
    #[rustfmt::skip]
    let expected: &[u8] = &[
        // magic, version 5, flags 0, config fingerprint
        b'C', b'W', b'S', b'N', 5, 0, 0, 0, 202, 228, 193, 184,
        // capacities: (messages, bytes) per level
        4, 0, 0, 0, 0, 4, 0, 0, 4, 0, 0, 0, 0, 3, 0, 0,
        24, 0, 0, 0, 0, 12, 0, 0, 8, 0, 0, 0, 0, 4, 0, 0,
        // body length
        119, 0, 0, 0,
        // config: budgets, trigger 100, tail, limits, policies
        0x80, 0x80, 0x02, 0x80, 0x20, 0xd0, 0x0f, 0xa0, 0x1f, 0xc0, 0x3e, 100, 6, 0, 0xe8, 0x07, 4, 3, 0, 0,
        // config: strategy 0, threshold 10, batch 5, summary 400, importance 600, ages, checkpoint 50, no keys
        0, 10, 5, 0x90, 0x03, 0xd8, 0x04, 0xe0, 0xa7, 0x12, 0xc0, 0xee, 0x6d, 50, 0,
        // config (version 2): low water 50, fit budgets, dynamic after the tools, tool-call
        // overhead 3, newest user locked
        50, 1, 0, 3, 1,
        // config (version 4): no compaction limit
        0,
        // state: next id 3, turn 1, last user 2, no pending
        3, 1, 1, 2, 0,
        // counters: pushed 2, ingested 10, thirteen zeros, no last compression
        2, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        // counters (version 2): compactions, composes, extending, cached, new, prefix tokens 0,
        // prefix changes 3 (changed, permanent changed), dynamic digest 0
        0, 0, 0, 0, 0, 0, 3, 0,
        // live tokens per level, clock
        5, 0, 5, 0, 2,
        // permanent: 1 record: id 1, time 1, content 2, tokens 5/5, system, flags, items, detail,
        // terms, supersede key (version 5), "Hi"
        1, 1, 1, 2, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, b'H', b'i',
        // session: empty
        0,
        // working: 1 record, user "ok"
        1, 2, 2, 2, 5, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, b'o', b'k',
        // volatile: empty
        0,
        // entity table: 4 values, none set
        4, 0, 0, 0, 0,
        // task table (version 3): no tasks
        0,
        // CRC-32
        4, 114, 174, 240,
    ];
    assert_eq!(snapshot(&m), expected);

    // The same state as version 4 wrote it (no supersede keys), byte for byte as that
    // version's golden test pinned it, still restores.
    let mut v4 = expected[..expected.len() - 4].to_vec();
    let (first_key, second_key) = (expected.len() - 34, expected.len() - 15);
    assert_eq!((v4[first_key + 1], v4[second_key + 1]), (2, 2), "the keys precede the texts");
    v4.remove(second_key);
    v4.remove(first_key);
    v4[4] = 4;
    v4[44] = 117;
    let crc = crc32(&v4);
    assert_eq!(crc.to_le_bytes(), [1, 97, 107, 122], "version 4's pinned CRC");
    v4.extend_from_slice(&crc.to_le_bytes());
    let mut restored = Tiny::new();
    restored.restore_from(&v4).unwrap();
    assert_eq!(snapshot(&restored), expected, "written again as version 5");

    // The same state as version 3 wrote it (no compaction limit), byte for byte as that
    // version's golden test pinned it, still restores.
    let compaction_limit = 48 + 40;
    let mut v3 = v4[..v4.len() - 4].to_vec();
    v3.remove(compaction_limit);
    v3[4] = 3;
    v3[44] = 116;
    let crc = crc32(&v3);
    assert_eq!(crc.to_le_bytes(), [204, 226, 174, 138], "version 3's pinned CRC");
    v3.extend_from_slice(&crc.to_le_bytes());
    let mut restored = Tiny::new();
    restored.restore_from(&v3).unwrap();
    assert_eq!(snapshot(&restored), expected, "written again as version 5");

    // The same state as version 2 wrote it (no task table), byte for byte as that version's
    // golden test pinned it, still restores.
    let mut v2 = v3[..v3.len() - 5].to_vec();
    v2[4] = 2;
    v2[44] = 115;
    let crc = crc32(&v2);
    assert_eq!(crc.to_le_bytes(), [30, 7, 143, 61], "version 2's pinned CRC");
    v2.extend_from_slice(&crc.to_le_bytes());
    let mut restored = Tiny::new();
    restored.restore_from(&v2).unwrap();
    assert_eq!(restored.stats(), m.stats());
    assert_eq!(payload_json(&mut restored), payload_json(&mut m));
}

/// Restores `bytes` into a fresh manager; if it is accepted, the manager must be usable.
fn restore_any(bytes: &[u8]) -> Result<(), SnapshotError> {
    let mut m = Tiny::new();
    let result = m.restore_from(bytes);
    if result.is_ok() {
        let _ = m.stats();
        let _ = payload_json(&mut m);
        let _ = m.push(Message::user("after"));
        m.drain_outbox(|_| {});
    }
    result
}

fn with_fixed_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let body_len = le_u32(&bytes, HEADER_LEN - 4) as usize;
    let end = (HEADER_LEN + body_len).min(bytes.len());
    let crc = crc32(&bytes[..end]);
    if let Some(trailer) = bytes.get_mut(end..end + 4) {
        trailer.copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

#[test]
fn every_byte_flip_and_truncation_is_an_error_or_a_valid_state() {
    let bytes = snapshot(&busy());
    for at in 0..bytes.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut flipped = bytes.clone();
            flipped[at] ^= mask;
            assert!(restore_any(&flipped).is_err(), "flip at {at} went unnoticed");
            // With the CRC forged, the decoder's own checks must hold the line.
            let _ = restore_any(&with_fixed_crc(flipped));
        }
    }
    for len in 0..bytes.len() {
        assert!(restore_any(&bytes[..len]).is_err(), "truncation to {len} accepted");
    }
}

#[test]
fn a_failed_restore_leaves_the_manager_unchanged() {
    let mut m = busy();
    let before = snapshot(&m);
    let mut other = snapshot(&busy());
    // The first body byte starts the configuration: a change there breaks the fingerprint.
    other[HEADER_LEN] ^= 0x55;
    for bad in [with_fixed_crc(other.clone()), other, b"garbage".to_vec(), vec![]] {
        assert!(m.restore_from(&bad).is_err());
        assert_eq!(snapshot(&m), before);
    }
}

#[test]
fn header_errors_are_typed() {
    let bytes = snapshot(&Tiny::new());
    let mut version = bytes.clone();
    version[4] = 9;
    assert_eq!(restore_any(&version), Err(SnapshotError::UnsupportedVersion { found: 9 }));
    let mut magic = bytes.clone();
    magic[0] = b'X';
    assert_eq!(restore_any(&magic), Err(SnapshotError::BadMagic));
    let mut flagged = bytes.clone();
    flagged[6] = 1;
    assert_eq!(restore_any(&flagged), Err(SnapshotError::UnsupportedFlags));
    assert!(matches!(restore_any(&bytes[..bytes.len() - 1]), Err(SnapshotError::Truncated { .. })));
    let big = snapshot(&ContextManager::<DefaultCapacities>::new());
    assert!(matches!(
        restore_any(&big),
        Err(SnapshotError::CapacityExceeded { level: Level::Permanent, .. })
    ));
    let mut padded = bytes.clone();
    padded.extend_from_slice(&[0xff; 32]);
    assert_eq!(restore_any(&padded), Ok(()), "flash padding after the snapshot is ignored");
}

struct Odd;
impl Capacities for Odd {
    type Permanent = Ring<3, 700>;
    type Session = Ring<2, 300>;
    type Working = Ring<24, 4096>;
    type Volatile = Ring<8, 2048>;
    type Scratch = ctxwin_core::capacity::Scratch<512>;
    type Entities = ctxwin_core::entities::EntityTable<4, 32>;
}

#[test]
fn restoring_into_larger_capacities_works() {
    let m = busy();
    let mut bigger = ContextManager::<DefaultCapacities>::new();
    bigger.restore_from(&snapshot(&m)).unwrap();
    assert_eq!(bigger.stats().counters, m.stats().counters);
    assert!(ContextManager::<Odd>::new().restore_from(&snapshot(&m)).is_err());
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = restore_any(&bytes);
        let mut framed = snapshot(&Tiny::new());
        framed.truncate(HEADER_LEN);
        framed[HEADER_LEN - 4..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        framed.extend_from_slice(&bytes);
        framed.extend_from_slice(&[0; 4]);
        let _ = restore_any(&with_fixed_crc(framed));
    }

    /// restore(snapshot(m)) composes the same payload, reports the same stats, and behaves
    /// identically for every later operation.
    #[test]
    fn round_trip_is_an_identity(
        config in any_config(),
        before in prop::collection::vec(op(), 0..80),
        after in prop::collection::vec(op(), 0..40),
    ) {
        let mut original = ContextManager::<Tight>::with_config(config).unwrap();
        let mut model = Model::default();
        for (step, op) in before.iter().enumerate() {
            model.apply(&mut original, op, step);
        }
        let bytes = snapshot(&original);
        let mut restored = ContextManager::<Tight>::new();
        restored.restore_from(&bytes).unwrap();
        prop_assert_eq!(restored.stats(), original.stats());
        prop_assert_eq!(snapshot(&restored), bytes.clone());
        let mut twin = model.clone();
        let mut model_after = model;
        for (step, op) in after.iter().enumerate() {
            let step = before.len() + step;
            model_after.apply(&mut original, op, step);
            twin.apply(&mut restored, op, step);
            prop_assert_eq!(restored.stats(), original.stats());
            prop_assert_eq!(payload_json(&mut restored), payload_json(&mut original));
        }
        prop_assert_eq!(snapshot(&restored), snapshot(&original));
    }
}

/// Writes fuzzing seeds (whole snapshots, and bodies for the fuzz target's framed path) to
/// the directory in `CTXWIN_FUZZ_SEEDS`: `CTXWIN_FUZZ_SEEDS=fuzz/seeds/restore cargo test -p
/// ctxwin-core write_fuzz_seeds -- --ignored`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let Ok(dir) = std::env::var("CTXWIN_FUZZ_SEEDS") else { return };
    std::fs::create_dir_all(&dir).unwrap();
    let mut small = Tiny::new();
    small.push(Message::user("hi")).unwrap();
    for (name, manager) in [("empty", Tiny::new()), ("small", small), ("busy", busy())] {
        let bytes = snapshot(&manager);
        std::fs::write(format!("{dir}/{name}.snapshot"), &bytes).unwrap();
        std::fs::write(format!("{dir}/{name}.body"), &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN])
            .unwrap();
    }
}
