use proptest::prelude::*;

use super::wire::{ConfigWire, RecordWire, StateWire};
use super::*;
use crate::header::{Header, flags};
use crate::manager::properties::{Model, Tight, config as any_config, op};
use crate::{
    Capacities, ContextManager, DefaultCapacities, Message, OpenAiRequest, Role, TinyCapacities,
    ToolCall, ring::Ring,
};

type Tiny = ContextManager<TinyCapacities>;

fn payload_json<C: Capacities>(manager: &mut ContextManager<C>) -> Result<Vec<u8>, crate::Error> {
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
        let (messages, bytes) = crate::capacity::capacities_of::<C>()[level.index()];
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
        // magic, version 2, flags 0, config fingerprint
        b'C', b'W', b'S', b'N', 2, 0, 0, 0, 120, 143, 194, 176,
        // capacities: (messages, bytes) per level
        4, 0, 0, 0, 0, 4, 0, 0, 4, 0, 0, 0, 0, 3, 0, 0,
        24, 0, 0, 0, 0, 12, 0, 0, 8, 0, 0, 0, 0, 4, 0, 0,
        // body length
        113, 0, 0, 0,
        // config: budgets, trigger 100, tail, limits, policies
        0x80, 0x80, 0x02, 0x80, 0x20, 0xd0, 0x0f, 0xa0, 0x1f, 0xc0, 0x3e, 100, 6, 0, 0xe8, 0x07, 4, 3, 0, 0,
        // config: strategy 0, threshold 10, batch 5, summary 400, importance 600, ages, checkpoint 50, no keys
        0, 10, 5, 0x90, 0x03, 0xd8, 0x04, 0xe0, 0xa7, 0x12, 0xc0, 0xee, 0x6d, 50, 0,
        // config (version 2): low water 50, fit budgets, dynamic after the tools
        50, 1, 0,
        // state: next id 3, turn 1, last user 2, no pending
        3, 1, 1, 2, 0,
        // counters: pushed 2, ingested 10, thirteen zeros, no last compression
        2, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        // counters (version 2): compactions, composes, extending, cached, new, prefix tokens 0,
        // prefix changes 3 (changed, permanent changed), dynamic digest 0
        0, 0, 0, 0, 0, 0, 3, 0,
        // live tokens per level, clock
        5, 0, 5, 0, 2,
        // permanent: 1 record: id 1, time 1, content 2, tokens 5/5, system, flags, items, detail, terms, "Hi"
        1, 1, 1, 2, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 2, b'H', b'i',
        // session: empty
        0,
        // working: 1 record, user "ok"
        1, 2, 2, 2, 5, 5, 1, 0, 0, 0, 0, 0, 0, 0, 2, b'o', b'k',
        // volatile: empty
        0,
        // entity table: 4 values, none set
        4, 0, 0, 0, 0,
        // CRC-32
        143, 234, 112, 253,
    ];
    assert_eq!(snapshot(&m), expected);
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
    let crc = crc::crc32(&bytes[..end]);
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

/// Assembles a snapshot from hand-made parts, with a correct header and CRC.
fn assemble(config: &Config, state: &StateWire, levels: [&[RecordWire<'_>]; 4]) -> Vec<u8> {
    let mut body = vec![0u8; 8192];
    let mut out = Fill { buf: &mut body, at: 0 };
    out = postcard::serialize_with_flavor(&ConfigWire::from(config), out).unwrap();
    out = postcard::serialize_with_flavor(state, out).unwrap();
    for records in levels {
        out = postcard::serialize_with_flavor(&(records.len() as u32), out).unwrap();
        for record in records {
            out = postcard::serialize_with_flavor(record, out).unwrap();
        }
    }
    out = postcard::serialize_with_flavor(&0u32, out).unwrap();
    let len = out.at;
    body.truncate(len);
    let capacities = crate::capacity::capacities_of::<TinyCapacities>();
    let mut bytes = header_bytes(config.fingerprint(), capacities, len).to_vec();
    bytes.extend_from_slice(&body);
    let crc = crc::crc32(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

fn record<'a>(id: u64, role: Role, content: &'a [u8], tokens: u32) -> RecordWire<'a> {
    let header = Header {
        id,
        role,
        content_len: content.len() as u32,
        tokens,
        original_tokens: tokens,
        ..Header::EMPTY
    };
    RecordWire::new(&header, content)
}

fn state(next_id: u64, tokens: [u32; 4]) -> StateWire {
    let mut state = crate::manager::State::NEW;
    state.issued = next_id - 1;
    state.tokens = tokens;
    StateWire::from(&state)
}

#[test]
fn decoded_state_that_breaks_an_invariant_is_refused() {
    let config = Config::DEFAULT;
    let invalid = |bytes: Vec<u8>| match restore_any(&bytes) {
        Err(SnapshotError::Invalid(why)) => why,
        other => panic!("expected an invariant error, got {other:?}"),
    };
    let user = record(1, Role::User, b"hi", 5);
    assert!(
        restore_any(&assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[user], &[]])).is_ok()
    );

    let result = [0x61u8, 0x61];
    let mut orphan = record(1, Role::Tool, &result, 5);
    orphan.content_len = 1;
    let working = Level::Working;
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[orphan], &[]])),
        Invariant::OrphanToolResult { level: working }
    );
    let not_utf8 = record(1, Role::User, &[0xff, 0xfe], 5);
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[not_utf8], &[]])),
        Invariant::Text { level: working }
    );
    let mut outside = record(1, Role::User, b"hi", 5);
    outside.content_len = 40;
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[outside], &[]])),
        Invariant::Span { level: working }
    );
    assert_eq!(
        invalid(assemble(
            &config,
            &state(2, [0, 0, 6, 0]),
            [&[], &[], &[record(1, Role::User, b"hi", 5)], &[]]
        )),
        Invariant::TokenTotals { level: working }
    );
    let twice = [record(1, Role::User, b"a", 5), record(1, Role::User, b"b", 5)];
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 10, 0]), [&[], &[], &twice, &[]])),
        Invariant::Order { level: working }
    );
    let mut tool_in_permanent = record(1, Role::Tool, b"xy", 5);
    tool_in_permanent.content_len = 1;
    assert_eq!(
        invalid(assemble(&config, &state(2, [5, 0, 0, 0]), [&[tool_in_permanent], &[], &[], &[]])),
        Invariant::Role { level: Level::Permanent }
    );
    let mut evicted_rule = record(1, Role::System, b"rule", 5);
    evicted_rule.flags = flags::EVICTED;
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 0, 0]), [&[evicted_rule], &[], &[], &[]])),
        Invariant::Role { level: Level::Permanent }
    );
    let mut unknown_flag = record(1, Role::User, b"hi", 5);
    unknown_flag.flags = 0x80;
    assert_eq!(
        invalid(assemble(&config, &state(2, [0, 0, 5, 0]), [&[], &[], &[unknown_flag], &[]])),
        Invariant::Flags { level: working }
    );
    let mut last_user = state(2, [0, 0, 5, 0]);
    last_user.last_user_id = Some(7);
    assert_eq!(
        invalid(assemble(&config, &last_user, [&[], &[], &[record(1, Role::User, b"hi", 5)], &[]])),
        Invariant::LastUser
    );
    let bad_config = Config { trigger_percent: 0, ..config };
    let bytes = assemble(&bad_config, &state(1, [0; 4]), [&[], &[], &[], &[]]);
    assert_eq!(invalid(bytes), Invariant::Config);
}

#[test]
fn an_unanswered_call_must_be_the_pending_unit() {
    let mut m = Tiny::new();
    let calls = [ToolCall::new("a", "ls", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls)).unwrap();
    let bytes = snapshot(&m);
    assert!(restore_any(&bytes).is_ok());
    // Forge the state so the unit is no longer marked pending: the decoder must notice.
    let body = &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN];
    let (config, rest) = postcard::take_from_bytes::<ConfigWire>(body).unwrap();
    let (mut state, _) = postcard::take_from_bytes::<StateWire>(rest).unwrap();
    state.pending = None;
    let header = *m.ring(Level::Working).first().unwrap();
    let record = RecordWire::new(&header, m.ring(Level::Working).record(&header));
    let forged = assemble(&config.to_config().unwrap(), &state, [&[], &[], &[record], &[]]);
    assert_eq!(
        restore_any(&forged),
        Err(SnapshotError::Invalid(Invariant::IncompleteUnit { level: Level::Working }))
    );
}

struct Odd;
impl Capacities for Odd {
    type Permanent = Ring<3, 700>;
    type Session = Ring<2, 300>;
    type Working = Ring<24, 4096>;
    type Volatile = Ring<8, 2048>;
    type Scratch = crate::capacity::Scratch<512>;
    type Entities = crate::entities::EntityTable<4, 32>;
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
        prop_assert_eq!(snapshot(&restored), bytes);
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

/// Found by `cargo fuzz`: counters restored at their maximum must not overflow on the next
/// push (they saturate).
#[test]
fn counters_at_their_maximum_saturate() {
    let mut state = crate::manager::State::NEW;
    state.issued = 4;
    state.turn = u64::MAX;
    state.counters = crate::stats::Counters {
        messages_pushed: u64::MAX,
        tokens_ingested: u64::MAX,
        units_evicted: u64::MAX,
        messages_evicted: u64::MAX,
        tokens_evicted: u64::MAX,
        ..crate::stats::Counters::default()
    };
    let bytes = assemble(&Config::DEFAULT, &StateWire::from(&state), [&[], &[], &[], &[]]);
    let mut m = Tiny::new();
    m.restore_from(&bytes).unwrap();
    m.push(Message::user("hi")).unwrap();
    assert_eq!(m.stats().counters.messages_pushed, u64::MAX);
    assert_eq!(m.turn(), u64::MAX);
    let mut too_far = state;
    too_far.issued = u64::MAX - 1;
    let bytes = assemble(&Config::DEFAULT, &StateWire::from(&too_far), [&[], &[], &[], &[]]);
    assert!(matches!(m.restore_from(&bytes), Err(SnapshotError::Invalid(Invariant::Order { .. }))));
}
