//! The session of the `minimal` and `snapshot` binaries: the scripted turns pushed into a
//! manager configured with [`LEAN_CONFIG`](crate::edge::LEAN_CONFIG), a payload composed and
//! written with `write_openai` every few turns, each checked, reported without defmt.

use crate::edge::EdgeManager;
use crate::report::Report;
use crate::scenario::{self, DYNAMIC};
use crate::sink::contains;
use ctxwin_core::{OpenAiRequest, Payload, Role, reduce::TRUNCATION_MARKER};

/// Turns of the session: enough to fill every ring several times over.
pub const TURNS: u32 = 48;
/// The turn whose tool returns a huge log.
pub const HUGE_TURN: u32 = 5;
/// Compose a payload every this many turns.
pub const COMPOSE_EVERY: u32 = 8;
/// The request fields written before the messages.
pub const REQUEST: OpenAiRequest<'static> =
    OpenAiRequest { model: Some("edge-agent"), max_tokens: Some(256) };

/// Plays the whole session in `manager` (configured), `payload` holding the request bodies
/// (and, at the huge turn, the generated log). Returns whether every turn was stored.
#[inline(never)]
pub fn session(manager: &mut EdgeManager, payload: &mut [u8], report: &mut Report) -> bool {
    if !report.check(scenario::setup(manager).is_ok(), "system prompt and tools stored") {
        return false;
    }
    for turn in 0..TURNS {
        let log = (turn == HUGE_TURN).then(|| scenario::write_sensor_log(payload, turn));
        if scenario::play_plain_turn(manager, turn, log).is_err() {
            report.value("turn refused: ", turn.into(), "");
            report.check(false, "every turn stored");
            return false;
        }
        if turn == HUGE_TURN {
            check_reduced(manager, report);
        }
        if turn % COMPOSE_EVERY == COMPOSE_EVERY - 1 {
            compose(manager, payload, report);
        }
    }
    report.check(true, "every turn stored");
    check_final(manager, report);
    true
}

/// The huge log must be stored reduced, with the truncation marker.
#[inline(never)]
fn check_reduced(manager: &EdgeManager, report: &mut Report) {
    let reduced = manager.history().rev().find(|m| m.role() == Role::Tool);
    let ok = reduced.is_some_and(|m| {
        m.was_reduced() && contains(m.content().as_bytes(), TRUNCATION_MARKER.as_bytes())
    });
    report.check(ok, "huge log reduced to head and tail");
}

/// Composes a payload, writes its request body into `payload` and checks it. Returns the
/// body's length (0 if it failed).
#[inline(never)]
pub fn compose(manager: &mut EdgeManager, payload: &mut [u8], report: &mut Report) -> usize {
    let budget = manager.budget();
    let written = compose_payload(manager)
        .and_then(|composed| write(&composed, payload).map(|len| (composed.tokens(), len)));
    let Ok((tokens, len)) = written else {
        report.check(false, "payload composed and written");
        return 0;
    };
    report.value("payload bytes: ", len as u64, "");
    let json = payload.get(..len).unwrap_or_default();
    report.check(tokens <= budget, "payload within the token budget");
    report.check(
        json.starts_with(
            br#"{"model":"edge-agent","max_tokens":256,"messages":[{"role":"system","#,
        ),
        "body opens with model, max_tokens and system prompt",
    );
    report.check(json.ends_with(b"}]}"), "body ends with the tools list");
    report.check(contains(json, br#""tools":[{"type":"function""#), "tools written");
    report.check(contains(json, DYNAMIC[0].as_bytes()), "dynamic context written");
    len
}

/// The payload of this turn. Out of line: compose's working state is gone by the time the
/// payload is written (inlined, it stayed in the caller's frame under the writer's).
#[inline(never)]
fn compose_payload(manager: &mut EdgeManager) -> Result<Payload<'_>, ctxwin_core::Error> {
    manager.compose(&DYNAMIC)
}

/// Writes the request body of `composed` into `payload`. Out of line: the JSON writer's
/// frame is not stacked on the compose path's.
#[inline(never)]
pub fn write(composed: &Payload<'_>, payload: &mut [u8]) -> Result<usize, ctxwin_core::Error> {
    composed.write_openai(payload, REQUEST)
}

#[inline(never)]
fn check_final(manager: &EdgeManager, report: &mut Report) {
    // The counters alone: `stats()` would walk every level and the outbox for them.
    let counters = manager.counters();
    report.value("units evicted: ", counters.units_evicted, "");
    report.check(counters.units_evicted > 0, "the session forced eviction");
    // Discarded units leave no outbox behind (`outbox()` would link 0.3 KiB to walk it).
    report.check(counters.units_discarded == counters.units_evicted, "evicted units released");
    report.check(counters.observations_reduced == 1, "one tool output reduced");
    report.check(manager.used() <= manager.budget(), "usage within the budget");
    let newest = manager.history().next_back();
    report.check(
        newest.is_some_and(|m| m.content().as_bytes().starts_with(b"Turn 47:")),
        "newest message is the last answer",
    );
}
