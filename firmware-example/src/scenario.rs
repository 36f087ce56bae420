//! A scripted edge-agent session: a pump-station agent reads sensors every minute, calls a
//! tool, gets its result (once a huge log) and answers. Everything is deterministic, so two
//! runs push byte-identical messages.

use crate::edge::EdgeManager;
use crate::summary::{Digest, SUMMARY_BYTES};
use crate::text::TextBuf;
use ctxwin_core::{Error, Level, Message, ToolCall};

/// The permanent system prompt.
pub const SYSTEM_PROMPT: &str = "You are the maintenance agent of pump station 7. Read the \
    sensors with tools, act only when a reading is out of range, answer in one sentence.";

/// Tool definitions (OpenAI function objects).
pub const TOOL_DEFINITIONS: [&str; 2] = [
    r#"{"name":"read_log","description":"Sensor log of the last minutes","parameters":{"type":"object","properties":{"minutes":{"type":"integer"}},"required":["minutes"]}}"#,
    r#"{"name":"set_fan","description":"Set the cooling fan speed","parameters":{"type":"object","properties":{"percent":{"type":"integer"}},"required":["percent"]}}"#,
];

/// Dynamic context sent with every compose.
pub const DYNAMIC: [&str; 1] = ["Goal: keep the bearing temperature of pump 7 under 70.0C."];

/// Timestamp of turn 0, in milliseconds.
pub const START_MS: u64 = 1_700_000_000_000;
/// Time between turns, in milliseconds.
pub const TURN_MS: u64 = 60_000;
/// Drained units per summary.
pub const UNITS_PER_SUMMARY: u32 = 4;
/// Vibration above which the agent turns the fan up.
const VIBRATION_ALARM_MG: u32 = 40;

/// One operation of a turn, as seen by a [`Probe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, defmt::Format)]
pub enum Op {
    /// The user turn (a sensor reading).
    PushUser,
    /// The assistant message with a tool call.
    PushCall,
    /// The tool result.
    PushResult,
    /// A volatile-level note.
    PushNote,
    /// The assistant's answer.
    PushAnswer,
    /// `drain_outbox` into the digest.
    Drain,
    /// `add_summary` of the digest.
    Summarize,
}

/// Watches each operation of a turn (the `icount` binary wraps some in markers).
pub trait Probe {
    /// Runs `run`, the operation `op`.
    fn around<R>(&mut self, op: Op, run: impl FnOnce() -> R) -> R;
}

/// A probe that only runs the operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbe;

impl Probe for NoProbe {
    #[inline(always)]
    fn around<R>(&mut self, _op: Op, run: impl FnOnce() -> R) -> R {
        run()
    }
}

/// What a turn did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, defmt::Format)]
pub struct TurnOutcome {
    /// Messages stored.
    pub pushed: u32,
    /// Outbox units drained.
    pub drained: u32,
    /// Pushes refused with `OutboxFull` and retried after draining.
    pub outbox_retries: u32,
    /// Whether a summary was added.
    pub summarized: bool,
}

/// Sensor values of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Bearing temperature in tenths of a degree Celsius.
    pub tenths_c: u32,
    /// Relative humidity, percent.
    pub humidity: u32,
    /// Vibration, milli-g.
    pub vibration_mg: u32,
}

impl Reading {
    /// The (pseudo-random, deterministic) reading of `turn`.
    pub fn of(turn: u32) -> Self {
        let x = turn.wrapping_add(1).wrapping_mul(0x9E37_79B1);
        let spike = turn % 9 == 8;
        Self {
            tenths_c: 205 + (x >> 8) % 40,
            humidity: 40 + (x >> 16) % 20,
            vibration_mg: if spike { 48 } else { 8 + (x >> 24) % 10 },
        }
    }

    fn alarm(&self) -> bool {
        self.vibration_mg > VIBRATION_ALARM_MG
    }

    fn write(&self, turn: u32, out: &mut TextBuf<64>) {
        out.push_str("t=").push_u64(turn.into()).push_str(" temp=").push_tenths(self.tenths_c);
        out.push_str("C hum=").push_u64(self.humidity.into());
        out.push_str("% vib=").push_u64(self.vibration_mg.into()).push_str("mg");
    }
}

/// Stores the system prompt and the tool definitions.
pub fn setup(manager: &mut EdgeManager) -> Result<(), Error> {
    manager.push(Message::system(SYSTEM_PROMPT).at(START_MS))?;
    for tool in TOOL_DEFINITIONS {
        manager.add_tool_definition(tool)?;
    }
    Ok(())
}

/// Writes a sensor log of as many whole lines as fit in `buf` (a huge tool output) and
/// returns it.
pub fn write_sensor_log(buf: &mut [u8], turn: u32) -> &str {
    let mut at = 0;
    for minute in 0u32.. {
        let mut line = TextBuf::<64>::new();
        line.push_str("m").push_u64(minute.into()).push_str(" ");
        Reading::of(turn.wrapping_add(minute)).write(turn, &mut line);
        line.push_str(" ok\n");
        let line = line.as_str().as_bytes();
        let Some(target) = buf.get_mut(at..).and_then(|rest| rest.get_mut(..line.len())) else {
            break;
        };
        target.copy_from_slice(line);
        at += line.len();
    }
    core::str::from_utf8(buf.get(..at).unwrap_or_default()).unwrap_or_default()
}

/// Plays turn `turn`: a reading, a tool call and its result (`huge_result` if given), every
/// fourth turn a volatile note, the answer; then drains the outbox and, every
/// [`UNITS_PER_SUMMARY`] drained units, adds a summary of them.
pub fn play_turn<P: Probe>(
    manager: &mut EdgeManager,
    turn: u32,
    huge_result: Option<&str>,
    digest: &mut Digest,
    probe: &mut P,
) -> Result<TurnOutcome, Error> {
    let clock = START_MS + u64::from(turn) * TURN_MS;
    let reading = Reading::of(turn);
    let mut outcome = TurnOutcome::default();
    // One text buffer for every message: the manager copies what it stores.
    let mut text = TextBuf::<64>::new();

    reading.write(turn, &mut text);
    let message = Message::user(text.as_str()).at(clock);
    push(manager, message, Op::PushUser, digest, probe, &mut outcome)?;

    let mut call_id = TextBuf::<16>::new();
    call_id.push_str("c").push_u64(turn.into());
    let call = if reading.alarm() {
        ToolCall::new(call_id.as_str(), "set_fan", r#"{"percent":80}"#)
    } else {
        ToolCall::new(call_id.as_str(), "read_log", r#"{"minutes":10}"#)
    };
    let calls = [call];
    let message = Message::assistant("").with_tool_calls(&calls).at(clock + 500);
    push(manager, message, Op::PushCall, digest, probe, &mut outcome)?;

    text.clear();
    if reading.alarm() {
        text.push_str("fan=80% rpm=2400");
    } else {
        text.push_str("ok n=10 mean=").push_tenths(reading.tenths_c);
        text.push_str("C max=").push_tenths(reading.tenths_c + 6).push_str("C");
    }
    let content = huge_result.unwrap_or(text.as_str());
    let message = Message::tool_result(call_id.as_str(), content).at(clock + 1_500);
    push(manager, message, Op::PushResult, digest, probe, &mut outcome)?;

    if turn % 4 == 3 {
        text.clear();
        text.push_str("Trend t=").push_u64(turn.into()).push_str(": vibration flat, no action.");
        let message = Message::assistant(text.as_str()).in_level(Level::Volatile).at(clock + 1_800);
        push(manager, message, Op::PushNote, digest, probe, &mut outcome)?;
    }

    text.clear();
    text.push_str("Turn ").push_u64(turn.into());
    text.push_str(if reading.alarm() { ": vibration high, fan at 80%." } else { ": nominal." });
    let message = Message::assistant(text.as_str()).at(clock + 2_000);
    push(manager, message, Op::PushAnswer, digest, probe, &mut outcome)?;

    outcome.drained += drain(manager, digest, probe);
    if digest.units() >= UNITS_PER_SUMMARY {
        summarize(manager, digest, clock, probe)?;
        outcome.summarized = true;
        // A full session level evicts its oldest summary: fold it into the next one.
        outcome.drained += drain(manager, digest, probe);
    }
    Ok(outcome)
}

/// Plays turn `turn` without an outbox: the same messages as [`play_turn`] (a reading, a
/// tool call, its result, every fourth turn a volatile note, the answer), pushed with nothing
/// to drain (for a manager configured with [`OutboxMode::Discard`](ctxwin_core::OutboxMode)).
/// Returns the messages stored.
pub fn play_plain_turn(
    manager: &mut EdgeManager,
    turn: u32,
    huge_result: Option<&str>,
) -> Result<u32, Error> {
    let clock = START_MS + u64::from(turn) * TURN_MS;
    let reading = Reading::of(turn);
    let mut text = TextBuf::<64>::new();
    reading.write(turn, &mut text);
    manager.push(Message::user(text.as_str()).at(clock))?;

    let mut call_id = TextBuf::<16>::new();
    call_id.push_str("c").push_u64(turn.into());
    let call = if reading.alarm() {
        ToolCall::new(call_id.as_str(), "set_fan", r#"{"percent":80}"#)
    } else {
        ToolCall::new(call_id.as_str(), "read_log", r#"{"minutes":10}"#)
    };
    let calls = [call];
    manager.push(Message::assistant("").with_tool_calls(&calls).at(clock + 500))?;

    text.clear();
    if reading.alarm() {
        text.push_str("fan=80% rpm=2400");
    } else {
        text.push_str("ok n=10 mean=").push_tenths(reading.tenths_c);
        text.push_str("C max=").push_tenths(reading.tenths_c + 6).push_str("C");
    }
    let content = huge_result.unwrap_or(text.as_str());
    manager.push(Message::tool_result(call_id.as_str(), content).at(clock + 1_500))?;
    let mut pushed = 3;

    if turn % 4 == 3 {
        text.clear();
        text.push_str("Trend t=").push_u64(turn.into()).push_str(": vibration flat, no action.");
        manager
            .push(Message::assistant(text.as_str()).in_level(Level::Volatile).at(clock + 1_800))?;
        pushed += 1;
    }

    text.clear();
    text.push_str("Turn ").push_u64(turn.into());
    text.push_str(if reading.alarm() { ": vibration high, fan at 80%." } else { ": nominal." });
    manager.push(Message::assistant(text.as_str()).at(clock + 2_000))?;
    Ok(pushed + 1)
}

/// Adds a summary of `digest` and resets it. Not inlined: its text buffer should not sit in
/// the caller's frame while messages are pushed.
#[inline(never)]
fn summarize<P: Probe>(
    manager: &mut EdgeManager,
    digest: &mut Digest,
    clock: u64,
    probe: &mut P,
) -> Result<(), Error> {
    let mut text = TextBuf::<SUMMARY_BYTES>::new();
    digest.write(&mut text);
    let sources = digest.sources();
    probe.around(Op::Summarize, || manager.add_summary(text.as_str(), &sources, clock))?;
    digest.reset();
    Ok(())
}

/// Pushes `message`; if the outbox holds the space it needs, drains it and pushes again
/// (the caller's side of [`OutboxMode::Hold`](ctxwin_core::OutboxMode::Hold)).
fn push<P: Probe>(
    manager: &mut EdgeManager,
    message: Message<'_>,
    op: Op,
    digest: &mut Digest,
    probe: &mut P,
    outcome: &mut TurnOutcome,
) -> Result<u64, Error> {
    let id = match probe.around(op, || manager.push(message)) {
        Err(Error::OutboxFull { .. }) => {
            outcome.outbox_retries += 1;
            outcome.drained += drain(manager, digest, probe);
            probe.around(op, || manager.push(message))?
        }
        other => other?,
    };
    outcome.pushed += 1;
    Ok(id)
}

fn drain<P: Probe>(manager: &mut EdgeManager, digest: &mut Digest, probe: &mut P) -> u32 {
    probe.around(Op::Drain, || manager.drain_outbox(|unit| digest.absorb(&unit))) as u32
}
