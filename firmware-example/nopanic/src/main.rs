//! Calls every ctxwin-core API the firmware uses, and runs all five built-in strategies (the
//! extractive summarizer, digests, importance scoring, entity extraction), on inputs the
//! optimiser cannot see (`black_box`), with `panic-never` as the panic handler: if any panic
//! path of that code survives optimisation, this binary does not link. It also runs: exit code
//! 0 when every call behaved.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

#[path = "../../src/edge.rs"]
mod edge;
#[path = "../../src/summary.rs"]
mod summary;
#[path = "../../src/text.rs"]
mod text;

use core::cell::RefCell;
use core::hint::black_box;
use cortex_m_rt::entry;
use cortex_m_semihosting::debug;
use critical_section::Mutex;
use ctxwin_core::{
    Config, ContextManager, EntitySchema, Error, Level, Message, OpenAiRequest, PayloadItem,
    StrategyKind, ToolCall,
};
use edge::{EDGE_CONFIG, EDGE_MANAGER, EdgeManager};
use panic_never as _;
use summary::{Digest, SUMMARY_BYTES};
use text::TextBuf;

const BODY_BYTES: usize = 8 * 1024;

static MANAGER: Mutex<RefCell<EdgeManager>> = Mutex::new(RefCell::new(EDGE_MANAGER));
static BODY: Mutex<RefCell<[u8; BODY_BYTES]>> = Mutex::new(RefCell::new([0; BODY_BYTES]));
#[cfg(feature = "snapshot")]
static RESTORED: Mutex<RefCell<EdgeManager>> = Mutex::new(RefCell::new(EDGE_MANAGER));
/// The five built-in strategies, with the core's summarizer, extractor and scoring linked.
static BUILTIN: Mutex<RefCell<BuiltinManager>> =
    Mutex::new(RefCell::new(BuiltinManager::UNCONFIGURED));

type BuiltinManager = ContextManager<edge::SummarizingCapacities>;

#[entry]
fn main() -> ! {
    let result = critical_section::with(|cs| {
        match (MANAGER.borrow(cs).try_borrow_mut(), BODY.borrow(cs).try_borrow_mut()) {
            (Ok(mut manager), Ok(mut body)) => exercise(&mut manager, &mut body[..]),
            _ => Err(Error::OrphanToolResult),
        }
    });
    let result = result.and_then(|_| {
        critical_section::with(|cs| {
            match (BUILTIN.borrow(cs).try_borrow_mut(), BODY.borrow(cs).try_borrow_mut()) {
                (Ok(mut manager), Ok(mut body)) => exercise_strategies(&mut manager, &mut body[..]),
                _ => Err(Error::OrphanToolResult),
            }
        })
    });
    #[cfg(feature = "snapshot")]
    let result = result.and_then(|_| {
        critical_section::with(|cs| {
            let (Ok(manager), Ok(mut restored), Ok(mut body)) = (
                MANAGER.borrow(cs).try_borrow(),
                RESTORED.borrow(cs).try_borrow_mut(),
                BODY.borrow(cs).try_borrow_mut(),
            ) else {
                return Err(Error::OrphanToolResult);
            };
            round_trip(&manager, &mut restored, &mut body[..]).ok_or(Error::OrphanToolResult)
        })
    });
    debug::exit(if black_box(result).is_ok() { debug::EXIT_SUCCESS } else { debug::EXIT_FAILURE });
    loop {
        cortex_m::asm::wfi();
    }
}

/// Fills `buf` with log lines (a huge tool output the reducer must cut).
fn log_into(buf: &mut [u8], lines: u32) -> &str {
    let mut at = 0;
    for minute in 0..lines {
        let mut line = TextBuf::<48>::new();
        line.push_str("m").push_u64(minute.into()).push_str(" temp=");
        line.push_tenths(205 + minute % 40).push_str("C vib=12mg ok\n");
        let line = line.as_str().as_bytes();
        let Some(target) = buf.get_mut(at..).and_then(|rest| rest.get_mut(..line.len())) else {
            break;
        };
        target.copy_from_slice(line);
        at += line.len();
    }
    core::str::from_utf8(buf.get(..at).unwrap_or_default()).unwrap_or_default()
}

fn exercise(manager: &mut EdgeManager, body: &mut [u8]) -> Result<usize, Error> {
    let mut checksum = 0usize;
    manager.set_config(black_box(EDGE_CONFIG))?;
    manager.push(Message::system(black_box("You are the agent of pump 7.")))?;
    manager.add_tool_definition(black_box(r#"{"name":"read_log","parameters":{}}"#))?;
    if manager.add_tool_definition(black_box("not json")).is_ok() {
        return Err(Error::InvalidToolDefinition);
    }
    let mut digest = Digest::new();
    let dynamic = [black_box("Goal: bearing under 70C.")];
    for turn in 0..black_box(64u32) {
        let clock = u64::from(turn) * 60_000;
        manager.push(Message::user(black_box("t=1 temp=21.5C hum=48% vib=12mg")).at(clock))?;
        let calls = [
            ToolCall::new(black_box("c1"), black_box("read_log"), black_box(r#"{"minutes":10}"#)),
            ToolCall::new(black_box("c2"), black_box("set_fan"), black_box(r#"{"percent":80}"#)),
        ];
        manager.push(Message::assistant(black_box("")).with_tool_calls(&calls).at(clock))?;
        if manager.compose(&dynamic).is_ok() {
            return Err(Error::ToolCallsPending { unanswered: 2 });
        }
        let result = if turn % 16 == 5 { log_into(body, black_box(300)) } else { "ok n=10" };
        manager.push(Message::tool_result(black_box("c1"), result).at(clock))?;
        if manager.push(Message::tool_result(black_box("c9"), "orphan")).is_ok() {
            return Err(Error::OrphanToolResult);
        }
        // c2 never answers: the next history message closes it with an "aborted" result.
        let note = Message::assistant(black_box("Trend flat.")).in_level(Level::Volatile);
        manager.push(note.important())?;
        manager.push(Message::assistant(black_box("Turn done: nominal.")).at(clock))?;
        if turn % 8 == 7 {
            manager.abort_pending_calls()?;
        }
        checksum += manager.drain_outbox(|unit| {
            digest.absorb(&unit);
            for message in unit.messages() {
                let calls =
                    message.tool_calls().map(|c| c.id.len() + c.arguments.len()).sum::<usize>();
                black_box((calls, message.tool_call_id(), message.timestamp(), message.tokens()));
            }
        });
        if digest.units() >= 4 {
            let mut text = TextBuf::<SUMMARY_BYTES>::new();
            digest.write(&mut text);
            manager.add_summary(text.as_str(), &digest.sources(), clock)?;
            digest.reset();
        }
        let payload = manager.compose(&dynamic)?;
        checksum += payload.write_openai(
            &mut body[..],
            OpenAiRequest {
                model: Some(black_box("edge-agent")),
                max_tokens: Some(black_box(256)),
            },
        )?;
        checksum += payload.tokens() as usize;
        for item in payload.items() {
            if let PayloadItem::MemorySummary(summary) = item {
                checksum += summary.parts().map(str::len).sum::<usize>();
            }
        }
        let stats = manager.stats();
        checksum += stats.counters.messages_pushed as usize + stats.levels.len();
        checksum += manager.history().rev().map(|m| m.original_tokens() as usize).sum::<usize>();
        checksum += manager.session().count() + usize::from(manager.used() > 0);
    }
    Ok(checksum)
}

/// Every built-in strategy over a session of facts, chatter and tool output, with ages that
/// trigger folding, age compression, digests and entity updates.
fn exercise_strategies(manager: &mut BuiltinManager, body: &mut [u8]) -> Result<usize, Error> {
    let mut checksum = 0usize;
    let schema = EntitySchema::new(&["pump", "limit"]).unwrap_or_default();
    for strategy in StrategyKind::ALL {
        let config = Config {
            strategy,
            summarize_threshold: black_box(4),
            summarize_batch: black_box(2),
            summary_tokens: black_box(120),
            importance_threshold: black_box(300),
            working_age_ms: black_box(120_000),
            session_age_ms: black_box(600_000),
            entity_schema: schema,
            ..EDGE_CONFIG
        };
        manager.set_config(black_box(config))?;
        if strategy == StrategyKind::SlidingWindow {
            // The permanent level keeps it across the reconfigurations.
            manager.push(Message::system(black_box("You are the agent of pump 7.")))?;
        }
        for turn in 0..black_box(48u32) {
            let clock = u64::from(turn) * 60_000;
            let ask = if turn % 5 == 0 { "my limit is 70C, pump: P-7" } else { "status?" };
            manager.push(Message::user(black_box(ask)).at(clock))?;
            let calls = [ToolCall::new(black_box("c1"), black_box("read_log"), black_box("{}"))];
            manager.push(Message::assistant(black_box("Checking.")).with_tool_calls(&calls))?;
            let result = if turn % 7 == 3 { log_into(body, black_box(120)) } else { "ok n=10" };
            manager.push(Message::tool_result(black_box("c1"), result).at(clock))?;
            let answer = if turn % 3 == 0 {
                "Decided: fan at 80% in src/fan.rs; bearing_temp is 61.5C. Okay, done."
            } else {
                "Sure, nothing unusual, everything nominal."
            };
            manager.push(Message::assistant(black_box(answer)).at(clock))?;
            checksum += manager.drain_outbox(|unit| {
                black_box(unit.messages().count());
            });
            let payload = manager.compose(&[])?;
            checksum += payload.tokens() as usize;
        }
        let payload = manager.compose(&[])?;
        checksum += payload.write_openai(&mut body[..], OpenAiRequest::default())?;
        checksum += manager.session().map(|s| s.content().len()).sum::<usize>();
    }
    Ok(checksum)
}

/// Snapshot into `buf`, restore into `restored`; the snapshot's length.
#[cfg(feature = "snapshot")]
fn round_trip(manager: &EdgeManager, restored: &mut EdgeManager, buf: &mut [u8]) -> Option<usize> {
    let len = manager.snapshot_into(buf).ok()?.len();
    restored.restore_from(buf.get(..len)?).ok()?;
    Some(len)
}
