//! Instruction counts per operation at several history lengths, for `measure.sh`.
//!
//! Plays the same session as the firmware and, at each checkpoint (messages pushed so far),
//! plays one more turn with every operation wrapped in the benchmark markers, then a
//! `compose` and a `write_openai`. After each measured region it logs `REGION <label>
//! <messages>`; `icount.py` pairs those lines, in order, with the instruction counts it
//! reads from QEMU's execution trace. Exit code 0 if every operation succeeded.
//!
//! Before a measured turn at a full-ring checkpoint (100 messages and more) the history is
//! settled, as the host benches settle theirs (`Driver::settle`): unmeasured turns are played
//! on until one of them compacted (the water-mark cycle's low point) and the next turn has the
//! same place in the four-turn cycle of volatile notes. Every checkpoint then measures the
//! same scenario turn at the same point of the compaction cycle, so the counts differ only in
//! what a flat cost must not depend on: the history's length.
#![no_std]
#![no_main]
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use core::cell::RefCell;
use cortex_m_rt::entry;
use cortex_m_semihosting::debug;
use critical_section::{CriticalSection, Mutex};
use ctxwin_core::OpenAiRequest;
use ctxwin_firmware_example::bench::measured;
use ctxwin_firmware_example::edge::{EDGE_CONFIG, EDGE_MANAGER, EdgeManager};
use ctxwin_firmware_example::scenario::{self, DYNAMIC, NoProbe, Op, Probe};
use ctxwin_firmware_example::summary::Digest;
use defmt::{error, info};
use defmt_semihosting as _;

/// History lengths (messages pushed) at which operations are measured.
const CHECKPOINTS: [u64; 4] = [10, 100, 1_000, 3_000];
/// From this checkpoint on the rings are full and the history is settled before measuring.
const SETTLED_FROM: u64 = 100;
/// Compactions a settling run waits for at least (the first may end a partial cycle).
const SETTLE_COMPACTIONS: u64 = 2;
/// Bound on the unmeasured turns of one settling run.
const SETTLE_TURNS: u32 = 256;
const PAYLOAD_BYTES: usize = 8 * 1024;
const REQUEST: OpenAiRequest<'static> =
    OpenAiRequest { model: Some("edge-agent"), max_tokens: Some(256) };

static MANAGER: Mutex<RefCell<EdgeManager>> = Mutex::new(RefCell::new(EDGE_MANAGER));
static PAYLOAD: Mutex<RefCell<[u8; PAYLOAD_BYTES]>> = Mutex::new(RefCell::new([0; PAYLOAD_BYTES]));

/// Wraps each operation of a turn in the markers and logs its label afterwards (outside the
/// measured region).
struct Markers {
    at: u64,
}

impl Probe for Markers {
    fn around<R>(&mut self, op: Op, run: impl FnOnce() -> R) -> R {
        let result = measured(run);
        info!("REGION {} {=u64}", op, self.at);
        result
    }
}

#[entry]
fn main() -> ! {
    if critical_section::with(run) {
        info!("ICOUNT DONE");
        debug::exit(debug::EXIT_SUCCESS);
    } else {
        debug::exit(debug::EXIT_FAILURE);
    }
    loop {
        cortex_m::asm::wfi();
    }
}

fn run(cs: CriticalSection<'_>) -> bool {
    let (Ok(mut manager), Ok(mut payload)) =
        (MANAGER.borrow(cs).try_borrow_mut(), PAYLOAD.borrow(cs).try_borrow_mut())
    else {
        return false;
    };
    if manager.set_config(EDGE_CONFIG).is_err() || scenario::setup(&mut manager).is_err() {
        return false;
    }
    let mut digest = Digest::new();
    let mut turn = 0u32;
    for checkpoint in CHECKPOINTS {
        while manager.stats().counters.messages_pushed < checkpoint {
            if let Err(e) = scenario::play_turn(&mut manager, turn, None, &mut digest, &mut NoProbe)
            {
                error!("turn {=u32} refused: {}", turn, e);
                return false;
            }
            turn += 1;
        }
        if checkpoint >= SETTLED_FROM {
            match settle(&mut manager, &mut turn, &mut digest) {
                Some(turns) => info!("settled after {=u32} turns", turns),
                None => {
                    error!(
                        "no settled point within {=u32} turns of {=u64}",
                        SETTLE_TURNS, checkpoint
                    );
                    return false;
                }
            }
        }
        let at = manager.stats().counters.messages_pushed;
        let mut markers = Markers { at };
        if let Err(e) = scenario::play_turn(&mut manager, turn, None, &mut digest, &mut markers) {
            error!("measured turn {=u32} refused: {}", turn, e);
            return false;
        }
        turn += 1;
        let composed = measured(|| manager.compose(&DYNAMIC).map(|p| p.tokens()));
        info!("REGION Compose {=u64}", at);
        let written = match manager.compose(&DYNAMIC) {
            Ok(payload_view) => measured(|| payload_view.write_openai(&mut payload[..], REQUEST)),
            Err(e) => Err(e),
        };
        info!("REGION WriteOpenai {=u64}", at);
        match (composed, written) {
            (Ok(tokens), Ok(len)) => {
                info!("checkpoint {=u64}: payload {=u32} tokens, {=usize} B", at, tokens, len)
            }
            _ => {
                error!("compose or write failed at {=u64}", at);
                return false;
            }
        }
    }
    true
}

/// Plays unmeasured turns until one compacted (at least [`SETTLE_COMPACTIONS`] since the
/// start) and the next, `turn`, is the fourth of its cycle (the one with a volatile note).
/// Returns the turns played, `None` past [`SETTLE_TURNS`] or on a refused turn.
fn settle(manager: &mut EdgeManager, turn: &mut u32, digest: &mut Digest) -> Option<u32> {
    let compactions = |m: &EdgeManager| m.stats().counters.compactions;
    let start = compactions(manager);
    for played in 1..=SETTLE_TURNS {
        let before = compactions(manager);
        scenario::play_turn(manager, *turn, None, digest, &mut NoProbe).ok()?;
        *turn += 1;
        let now = compactions(manager);
        if now > before && now - start >= SETTLE_COMPACTIONS && *turn % 4 == 3 {
            return Some(played);
        }
    }
    None
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    error!("panic");
    debug::exit(debug::EXIT_FAILURE);
    loop {
        cortex_m::asm::wfi();
    }
}
