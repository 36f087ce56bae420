//! The per-turn workload a user pays, the 8,000-token configuration it runs under, and a
//! [`Driver`] that replays the session to any history length.

use ctxwin_core::{
    Config, ContextManager, DefaultCapacities, Error, Message, OpenAiRequest, StrategyKind,
};

use crate::WorkloadError;
use crate::replay::{MESSAGE_INTERVAL_MS, Session, core_messages, tool_calls};

/// The manager the benches measure: default capacities (about 230 KiB), the default
/// estimator (cl100k weights, ×5/4), the built-in strategies.
pub type Manager = ContextManager<DefaultCapacities>;

/// The payload budget: what a model with an 8k prompt window gets.
pub const BUDGET: u32 = 8_000;

/// Tokens reserved for the reply, on top of [`BUDGET`] (`context_window` = 9,000).
pub const REPLY_RESERVE: u32 = 1_000;

/// History lengths (messages already pushed) the benches compare.
pub const HISTORY_LENGTHS: [usize; 4] = [100, 1_000, 10_000, 100_000];

/// Dynamic context composed into every payload (sent as a system message).
pub const DYNAMIC: [&str; 1] = ["Current task: keep the test suite green; the CI log of the \
                                 last run is attached by the archive when asked."];

/// Size of the request-body buffer `write_openai` writes into (a full 8k payload is ~40 KB).
pub const BODY_CAPACITY: usize = 256 * 1024;

/// The benches' configuration: an 8,000-token budget (`context_window` 9,000 minus a 1,000
/// reply reserve) split 1,000 permanent / 1,000 session / 5,500 working / 500 volatile
/// (the rest), with every other setting at its default and the given strategy.
///
/// ```
/// use ctxwin_benches::workload::{turn_config, BUDGET};
/// use ctxwin_core::{Level, StrategyKind};
/// let config = turn_config(StrategyKind::SlidingWindow);
/// assert_eq!(config.budget(), BUDGET);
/// assert_eq!(config.level_budget(Level::Volatile), 500);
/// assert!(config.validate().is_ok());
/// ```
pub const fn turn_config(strategy: StrategyKind) -> Config {
    Config {
        context_window: BUDGET + REPLY_RESERVE,
        reserved_for_reply: REPLY_RESERVE,
        permanent_budget: 1_000,
        session_budget: 1_000,
        working_budget: 5_500,
        strategy,
        // The split as written, not capped to the window's shares.
        fit_budgets: false,
        ..Config::DEFAULT
    }
}

/// One turn as a user runs it: push the turn's messages, hand evicted units to the archive
/// (here a no-op sink), compose the payload with [`DYNAMIC`] and write the OpenAI request body
/// into `body`. Returns the body's length.
///
/// # Errors
///
/// The first [`Error`] a push, the compose or the write returns.
///
/// ```
/// use ctxwin_benches::workload::{run_turn, turn_config, Manager};
/// use ctxwin_core::{Message, StrategyKind};
/// let mut manager = Box::new(Manager::with_config(turn_config(StrategyKind::SlidingWindow))?);
/// let mut body = vec![0u8; 4096];
/// let len = run_turn(&mut manager, &[Message::user("hi")], &mut body)?;
/// assert!(std::str::from_utf8(&body[..len])?.contains("\"hi\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_turn(
    manager: &mut Manager,
    messages: &[Message<'_>],
    body: &mut [u8],
) -> Result<usize, Error> {
    for message in messages {
        manager.push(*message)?;
    }
    manager.drain_outbox(|unit| {
        std::hint::black_box(unit.len());
    });
    let payload = manager.compose(&DYNAMIC)?;
    payload.write_openai(body, OpenAiRequest::default())
}

/// Replays the session through a manager, turn by turn, running [`run_turn`] on each.
///
/// Cloning a driver clones the manager, so one replay can fork probes at several lengths.
#[derive(Clone, Debug)]
pub struct Driver<'s> {
    session: &'s Session,
    manager: Box<Manager>,
    next_turn: usize,
    messages: usize,
    clock: u64,
    body: Vec<u8>,
    copies: usize,
}

impl<'s> Driver<'s> {
    /// A manager with `config` holding the session's system prompt.
    ///
    /// # Errors
    ///
    /// A configuration the core refuses, or a system prompt over the permanent budget.
    pub fn new(session: &'s Session, config: Config) -> Result<Driver<'s>, WorkloadError> {
        let mut manager = Box::new(Manager::with_config(config)?);
        let mut clock = 1_700_000_000_000;
        for system in &session.system {
            manager.push(Message::system(&system.content).at(clock))?;
            clock += MESSAGE_INTERVAL_MS;
        }
        Ok(Driver {
            session,
            manager,
            next_turn: 0,
            messages: session.system.len(),
            clock,
            body: vec![0; BODY_CAPACITY],
            copies: 0,
        })
    }

    /// Messages pushed so far: the history length.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Turns run so far.
    pub fn turns(&self) -> usize {
        self.next_turn
    }

    /// The caller's clock for the next message.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// The manager.
    pub fn manager(&self) -> &Manager {
        &self.manager
    }

    /// The manager, mutable.
    pub fn manager_mut(&mut self) -> &mut Manager {
        &mut self.manager
    }

    /// A copy of the manager (for per-iteration setup).
    pub fn manager_clone(&self) -> Box<Manager> {
        self.manager.clone()
    }

    /// The next turn of the replay, as owned messages; advances the replay position and the
    /// clock but runs nothing (for callers that time [`run_turn`] themselves, see
    /// [`Driver::run_messages`]).
    pub fn take_turn(&mut self) -> (crate::replay::Turn, u64) {
        let turn = self.session.replayed_turn(self.next_turn);
        let clock = self.clock;
        self.next_turn += 1;
        self.messages += turn.messages.len();
        self.clock += turn.messages.len() as u64 * MESSAGE_INTERVAL_MS;
        (turn, clock)
    }

    /// Runs [`run_turn`] on already converted `messages` (counted in by [`Driver::take_turn`]).
    ///
    /// # Errors
    ///
    /// As [`run_turn`].
    pub fn run_messages(&mut self, messages: &[Message<'_>]) -> Result<usize, Error> {
        run_turn(&mut self.manager, messages, &mut self.body)
    }

    /// Runs the next turn of the replay.
    ///
    /// # Errors
    ///
    /// As [`run_turn`].
    pub fn run_next_turn(&mut self) -> Result<usize, Error> {
        let (turn, clock) = self.take_turn();
        let calls = tool_calls(&turn.messages);
        let messages = core_messages(&turn.messages, &calls, clock);
        self.run_messages(&messages)
    }

    /// Runs turns until at least `messages` messages have been pushed (a turn boundary).
    ///
    /// # Errors
    ///
    /// As [`run_turn`].
    pub fn advance_to(&mut self, messages: usize) -> Result<(), Error> {
        while self.messages < messages {
            self.run_next_turn()?;
        }
        Ok(())
    }

    /// Runs a copy of the session's first turn with tool-call ids no earlier copy used;
    /// returns `false` (running nothing) for a session without turns.
    ///
    /// # Errors
    ///
    /// As [`run_turn`].
    ///
    /// ```
    /// use ctxwin_benches::replay::Session;
    /// use ctxwin_benches::workload::{turn_config, Driver};
    /// use ctxwin_core::StrategyKind;
    /// let session = Session::load()?;
    /// let mut driver = Driver::new(&session, turn_config(StrategyKind::SlidingWindow))?;
    /// let before = driver.messages();
    /// assert!(driver.run_copy()? && driver.run_copy()?);
    /// assert_eq!(driver.messages(), before + 12);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_copy(&mut self) -> Result<bool, Error> {
        let Some(first) = self.session.turns.first() else { return Ok(false) };
        let turn = first.with_id_prefix(&format!("copy{}_", self.copies));
        self.copies += 1;
        let calls = tool_calls(&turn.messages);
        let messages = core_messages(&turn.messages, &calls, self.clock);
        self.messages += messages.len();
        self.clock += messages.len() as u64 * MESSAGE_INTERVAL_MS;
        self.run_messages(&messages)?;
        Ok(true)
    }

    /// Runs copies of the session's first turn (fresh tool-call ids each time) through at
    /// least `compactions` compactions and on to the first compaction that leaves the same fill
    /// as the one two before it and no more than the one before it, stopping right after it
    /// (at most 10,000 turns); returns whether it got there. After two compactions the window holds the system prompt and
    /// copies of that turn only; the water-mark cycle over identical turns settles into a
    /// loop of one or two compactions (measured on the benches' configuration: alternating
    /// between two fills), and stopping at its low point puts
    /// every manager at the same state whatever history came before. Probes on managers settled
    /// this way differ only in the history's length (ids, counters, ring positions), which is
    /// what a flat per-turn cost must not depend on.
    ///
    /// # Errors
    ///
    /// As [`run_turn`].
    ///
    /// ```
    /// use ctxwin_benches::replay::Session;
    /// use ctxwin_benches::workload::{turn_config, Driver};
    /// use ctxwin_core::StrategyKind;
    /// let session = Session::load()?;
    /// let mut driver = Driver::new(&session, turn_config(StrategyKind::SlidingWindow))?;
    /// assert!(driver.settle(2)?);
    /// assert!(driver.manager().stats().counters.compactions >= 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(&mut self, compactions: u64) -> Result<bool, Error> {
        const MAX_TURNS: usize = 10_000;
        let start = self.manager.stats().counters.compactions;
        let mut seen = start;
        // The fills the last two compactions left, newest last.
        let mut fills: [Option<u32>; 2] = [None, None];
        for _ in 0..MAX_TURNS {
            if !self.run_copy()? {
                return Ok(false);
            }
            let now = self.manager.stats().counters.compactions;
            if now == seen {
                continue;
            }
            seen = now;
            let fill = self.manager.used();
            let [before_last, last] = fills;
            let in_loop_low = before_last == Some(fill) && last.is_some_and(|l| fill <= l);
            if now - start >= compactions && in_loop_low {
                return Ok(true);
            }
            fills = [last, Some(fill)];
        }
        Ok(false)
    }
}

/// Managers after replaying the session to each of `lengths` (ascending) messages under
/// `config`, in one pass; each with the exact history length reached (the next turn
/// boundary at or after the length asked for).
///
/// # Errors
///
/// As [`run_turn`].
///
/// ```
/// use ctxwin_benches::replay::Session;
/// use ctxwin_benches::workload::{managers_at, turn_config};
/// use ctxwin_core::StrategyKind;
/// let session = Session::load()?;
/// let managers = managers_at(&session, turn_config(StrategyKind::SlidingWindow), &[10, 50])?;
/// assert!(managers[0].0 >= 10 && managers[1].0 >= 50);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn managers_at<'s>(
    session: &'s Session,
    config: Config,
    lengths: &[usize],
) -> Result<Vec<(usize, Driver<'s>)>, WorkloadError> {
    let mut driver = Driver::new(session, config)?;
    let mut out = Vec::with_capacity(lengths.len());
    for &length in lengths {
        driver.advance_to(length)?;
        out.push((driver.messages(), driver.clone()));
    }
    Ok(out)
}

/// As [`managers_at`], then each manager [settled](Driver::settle) by two compactions, so
/// every history's window holds the same messages at the same point of the water-mark cycle.
///
/// # Errors
///
/// As [`run_turn`], and [`WorkloadError::NoCompaction`] when the compactions do not come.
///
/// ```
/// use ctxwin_benches::replay::Session;
/// use ctxwin_benches::workload::{managers_settled, turn_config};
/// use ctxwin_core::StrategyKind;
/// let session = Session::load()?;
/// let config = turn_config(StrategyKind::SlidingWindow);
/// let managers = managers_settled(&session, config, &[100, 500])?;
/// let used: Vec<u32> = managers.iter().map(|(_, d)| d.manager().used()).collect();
/// assert_eq!(used[0], used[1], "{used:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn managers_settled<'s>(
    session: &'s Session,
    config: Config,
    lengths: &[usize],
) -> Result<Vec<(usize, Driver<'s>)>, WorkloadError> {
    let mut out = managers_at(session, config, lengths)?;
    for (reached, driver) in &mut out {
        if !driver.settle(2)? {
            return Err(WorkloadError::NoCompaction { after: driver.messages() });
        }
        *reached = driver.messages();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_replays_three_thousand_messages_within_the_budget() {
        let session = Session::load().unwrap();
        for strategy in StrategyKind::ALL {
            let mut driver = Driver::new(&session, turn_config(strategy)).unwrap();
            while driver.messages() < 3_000 {
                driver.run_next_turn().unwrap_or_else(|e| {
                    panic!("{strategy}: turn {} failed: {e:?}", driver.turns())
                });
                let used = driver.manager().used();
                assert!(used <= BUDGET, "{strategy}: {used} tokens after {}", driver.messages());
            }
            assert_eq!(driver.manager().outbox().count(), 0, "{strategy}");
        }
    }

    #[test]
    fn a_turn_writes_a_request_body_with_the_newest_message() {
        let session = Session::load().unwrap();
        let mut driver = Driver::new(&session, turn_config(StrategyKind::SlidingWindow)).unwrap();
        driver.advance_to(1_000).unwrap();
        let mut manager = driver.manager_clone();
        let turn = session.typical_turn();
        let calls = tool_calls(&turn.messages);
        let messages = core_messages(&turn.messages, &calls, driver.clock());
        let mut body = vec![0; BODY_CAPACITY];
        let len = run_turn(&mut manager, &messages, &mut body).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body[..len]).unwrap();
        let sent = json["messages"].as_array().unwrap();
        let last = sent.last().unwrap();
        assert_eq!(last["content"], turn.messages.last().unwrap().content.as_str());
        assert_eq!(sent[0]["role"], "system");
    }

    #[test]
    fn managers_at_reaches_each_length_at_a_turn_boundary() {
        let session = Session::load().unwrap();
        let config = turn_config(StrategyKind::SlidingWindow);
        let managers = managers_at(&session, config, &[100, 1_000]).unwrap();
        for ((reached, driver), asked) in managers.iter().zip([100, 1_000]) {
            assert!(*reached >= asked && *reached < asked + 12, "{reached} for {asked}");
            assert_eq!(driver.manager().stats().counters.messages_pushed as usize, *reached);
        }
    }
}
