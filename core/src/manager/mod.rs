//! [`ContextManager`]: the four levels, the budget, and every operation on them.

mod builder;
mod compose;
mod entities;
mod evict;
mod outbox;
mod plan;
mod push;
mod replace;
#[cfg(feature = "compaction-cut")]
mod shrink;
mod summary;
#[cfg(feature = "tasks")]
mod task;
mod victim;
mod views;

pub use builder::Builder;
pub use outbox::{EvictedUnit, Outbox};
pub use push::ABORTED_RESULT;
pub(crate) use push::validate;
pub use replace::ReplaceError;
#[cfg(feature = "compaction-cut")]
pub use shrink::SUPERSEDED_NOTE;
pub use summary::MAX_SUMMARY_RANGES;

use crate::capacity::{Capacities, DefaultCapacities, ScratchStorage};
use crate::config::{Config, ConfigError};
use crate::counter::TokenCounter;
use crate::entities::{Entities, EntityStorage};
use crate::estimator::Estimator;
use crate::header::Header;
use crate::level::Level;
use crate::payload::MEMORY_SUMMARY_PREFIX;
use crate::ring::{RingMut, RingRef, RingStorage};
use crate::stats::{Counters, LevelStats, Stats};
use crate::strategy::{Builtin, Strategy};

/// Marks the entity-token cache as not filled yet.
pub(crate) const ENTITIES_UNCOUNTED: u32 = u32::MAX;

/// A call unit still waiting for results: always the newest unit of its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    pub level: Level,
    /// Calls in the unit's assistant message.
    pub calls: u8,
    /// Bit `i` set once call `i` has its result.
    pub answered: u64,
}

impl Pending {
    // Out of line: a 64-bit popcount is ~40 B of Thumb code, asked for in three places.
    #[inline(never)]
    pub(crate) fn unanswered(&self) -> u8 {
        self.calls.saturating_sub(self.answered.count_ones() as u8)
    }
}

/// The pending unit as stored: level index + 1 (0 = none), so an empty state is all zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PendingSlot {
    level: u8,
    calls: u8,
    answered: u64,
}

/// Everything besides the rings that defines a manager's state. Every field of a new state is
/// zero, so a `static` manager can be all zeros and land in `.bss`, not in flash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    /// Ids issued so far; the next message gets `issued + 1`.
    pub issued: u64,
    /// Whose base (`header::id_base`) stored headers count their ids from (they keep 32-bit
    /// offsets): 0 until a session issues 2^32 ids, then the epoch at or below the oldest
    /// stored id (see `push::next_header_id`).
    pub id_epoch: u32,
    /// User messages pushed so far (the turn clock).
    pub turn: u64,
    /// Newest user message in the history, always locked.
    pub last_user_id: Option<u64>,
    pending: PendingSlot,
    /// Live (not evicted) tokens per level.
    pub tokens: [u32; 4],
    /// Live messages per level.
    pub live: [u32; 4],
    /// Live record bytes per level.
    pub bytes: [u32; 4],
    /// The caller's clock: the newest timestamp pushed.
    pub now: u64,
    /// Tokens of the entity block in the payload (0 without a schema).
    pub entity_tokens: u32,
    pub counters: Counters,
}

impl State {
    /// The unit still waiting for results.
    pub(crate) fn pending(&self) -> Option<Pending> {
        let level = Level::ALL.get(usize::from(self.pending.level).checked_sub(1)?).copied()?;
        Some(Pending { level, calls: self.pending.calls, answered: self.pending.answered })
    }

    pub(crate) fn set_pending(&mut self, pending: Option<Pending>) {
        self.pending = match pending {
            Some(p) => {
                PendingSlot { level: p.level as u8 + 1, calls: p.calls, answered: p.answered }
            }
            None => PendingSlot::default(),
        };
    }

    /// The id the next message gets.
    pub(crate) fn next_id(&self) -> u64 {
        self.issued.saturating_add(1)
    }

    /// Hands out the next id.
    pub(crate) fn issue_id(&mut self) -> u64 {
        self.issued = self.issued.saturating_add(1);
        self.issued
    }

    pub(crate) const NEW: State = State {
        issued: 0,
        id_epoch: 0,
        turn: 0,
        last_user_id: None,
        pending: PendingSlot { level: 0, calls: 0, answered: 0 },
        tokens: [0; 4],
        live: [0; 4],
        bytes: [0; 4],
        now: 0,
        entity_tokens: 0,
        counters: Counters::NEW,
    };
}

/// An agent's context window: four levels of fixed-capacity rings, a token budget, and the
/// rules that decide what the model sees each turn.
///
/// All storage is inline (no heap); every operation costs at most O(capacity), never
/// O(session length). `C` fixes the capacities at compile time, `K` counts tokens (the
/// no-tokenizer [`Estimator`] by default).
///
/// ```
/// use ctxwin_core::{ContextManager, Message, PayloadItem, TinyCapacities, ToolCall};
///
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::system("You are a build assistant."))?;
/// manager.push(Message::user("Is the build green?").at(1_000))?;
/// let calls = [ToolCall::new("c1", "run", r#"{"cmd":"cargo test"}"#)];
/// manager.push(Message::assistant("").with_tool_calls(&calls).at(1_100))?;
/// manager.push(Message::tool_result("c1", "test result: ok. 42 passed").at(1_900))?;
///
/// let budget = manager.budget();
/// let payload = manager.compose(&[])?;
/// assert!(payload.tokens() <= budget);
/// assert_eq!(payload.items().count(), 4);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ContextManager<
    C: Capacities = DefaultCapacities,
    K: TokenCounter = Estimator,
    S: Strategy = Builtin,
> {
    permanent: C::Permanent,
    session: C::Session,
    working: C::Working,
    volatile: C::Volatile,
    counter: K,
    config: Config,
    state: State,
    strategy: S,
    scratch: C::Scratch,
    entities: C::Entities,
    #[cfg(feature = "tasks")]
    tasks: crate::task::Tasks,
}

impl<C: Capacities> ContextManager<C, Estimator, Builtin> {
    /// An empty manager with [`Config::DEFAULT`] and the default estimator; `const`, so it can
    /// be a `static`.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// static MANAGER: ContextManager<TinyCapacities> = ContextManager::new();
    /// assert_eq!(MANAGER.used(), 0);
    /// ```
    pub const fn new() -> Self {
        Self::from_parts(Config::DEFAULT, Estimator::new(), Builtin::new())
    }

    /// An empty manager with `config` and the default estimator.
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, TinyCapacities};
    /// let config = Config {
    ///     context_window: 8_192,
    ///     reserved_for_reply: 1_024,
    ///     working_budget: 4_000,
    ///     session_budget: 1_000,
    ///     ..Config::DEFAULT
    /// };
    /// let manager = ContextManager::<TinyCapacities>::with_config(config)?;
    /// assert_eq!(manager.budget(), 7_168);
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub const fn with_config(config: Config) -> Result<Self, ConfigError> {
        match config.validate() {
            Ok(()) => Ok(Self::from_parts(config, Estimator::new(), Builtin::new())),
            Err(error) => Err(error),
        }
    }

    /// A [`Builder`] for a manager with a token counter or a strategy of your own (the one
    /// way to choose them; [`Config::strategy`] chooses among the built-in strategies).
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, TinyCapacities};
    /// use ctxwin_core::counter::TokenCounter;
    /// use ctxwin_core::strategy::SlidingWindow;
    /// struct Words;
    /// impl TokenCounter for Words {
    ///     fn count(&self, text: &str) -> u32 { text.split_whitespace().count() as u32 }
    /// }
    /// let manager = ContextManager::<TinyCapacities>::builder()
    ///     .config(Config { locked_tail: 2, ..Config::DEFAULT })
    ///     .counter(Words)
    ///     .strategy(SlidingWindow::new())
    ///     .build()?;
    /// assert_eq!(manager.counter().count("two words"), 2);
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub const fn builder() -> Builder<C, Estimator, Builtin> {
        Builder::new()
    }
}

/// Refuses a configuration naming a built-in strategy that `strategy` does not run.
fn check_strategy<S: Strategy>(config: &Config, strategy: &S) -> Result<(), ConfigError> {
    match strategy.kind() {
        Some(runs) if runs != config.strategy => {
            Err(ConfigError::StrategyMismatch { configured: config.strategy, runs })
        }
        _ => Ok(()),
    }
}

impl<C: Capacities, S: crate::strategy::ConstStrategy> ContextManager<C, Estimator, S> {
    /// A manager that is all zero bytes and refuses work until configured with
    /// [`set_config`](Self::set_config):
    /// a `static` initialised with it lands in `.bss`, so it costs no flash (an initialised
    /// manager's image would cost its whole size in flash as well as in RAM).
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, Error, estimator::Estimator, Message, strategy::SlidingWindow, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::UNCONFIGURED;
    /// assert!(matches!(manager.push(Message::user("hi")), Err(Error::InvalidConfig(_))));
    /// manager.set_config(Config::DEFAULT)?;
    /// manager.push(Message::user("hi"))?;
    ///
    /// // The smallest footprint: the sliding window without summarizer or extractor code.
    /// static LEAN: ContextManager<TinyCapacities, Estimator, SlidingWindow> = ContextManager::UNCONFIGURED;
    /// # let _ = &LEAN;
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub const UNCONFIGURED: Self = Self::from_parts(Config::ZERO, Estimator::new(), S::NEW);
}

impl<C: Capacities> Default for ContextManager<C, Estimator, Builtin> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    pub(super) const fn from_parts(config: Config, counter: K, strategy: S) -> Self {
        Self {
            permanent: C::Permanent::EMPTY,
            session: C::Session::EMPTY,
            working: C::Working::EMPTY,
            volatile: C::Volatile::EMPTY,
            counter,
            config,
            state: State {
                entity_tokens: if config.entity_schema.is_empty() { 0 } else { ENTITIES_UNCOUNTED },
                ..State::NEW
            },
            strategy,
            scratch: C::Scratch::EMPTY,
            entities: C::Entities::EMPTY,
            #[cfg(feature = "tasks")]
            tasks: crate::task::Tasks::EMPTY,
        }
    }

    /// The strategy.
    pub fn strategy(&self) -> &S {
        &self.strategy
    }

    /// The strategy, mutable (e.g. to swap its summarizer's settings).
    pub fn strategy_mut(&mut self) -> &mut S {
        &mut self.strategy
    }

    /// The current entity values (empty without a schema).
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert!(!manager.entities().is_declared());
    /// ```
    pub fn entities(&self) -> Entities<'_> {
        Entities::new(&self.config.entity_schema, self.entities.parts())
    }

    /// The configuration.
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert_eq!(manager.config().locked_tail, 6);
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replaces the configuration (and configures an
    /// [`UNCONFIGURED`](ContextManager::UNCONFIGURED) manager); the next push or compose
    /// applies new budgets (evicting to the outbox if they shrank). Refuses a configuration
    /// whose `strategy` the manager's strategy does not run ([`ConfigError::StrategyMismatch`]).
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.set_config(Config { locked_tail: 2, ..Config::DEFAULT })?;
    /// assert_eq!(manager.config().locked_tail, 2);
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub fn set_config(&mut self, config: Config) -> Result<(), ConfigError> {
        config.validate()?;
        check_strategy(&config, &self.strategy)?;
        let schema_changed =
            cfg!(feature = "entities") && config.entity_schema != self.config.entity_schema;
        self.config = config;
        if schema_changed {
            // Values are stored by key position: a new schema starts from unknown values.
            let parts = self.entities.parts_mut();
            parts.lens.fill(crate::entities::UNSET);
            self.recount_entities();
            self.mark_changed(Level::Session);
        }
        Ok(())
    }

    /// Refuses work while the manager is [`UNCONFIGURED`](ContextManager::UNCONFIGURED).
    pub(crate) fn ensure_configured(&self) -> Result<(), crate::error::Error> {
        match self.config.budget() {
            0 => Err(crate::error::Error::InvalidConfig(ConfigError::NoBudget)),
            _ => Ok(()),
        }
    }

    /// The token counter.
    ///
    /// ```
    /// use ctxwin_core::counter::TokenCounter;
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert!(manager.counter().count("hello world") >= 2);
    /// ```
    pub fn counter(&self) -> &K {
        &self.counter
    }

    /// The token counter, mutable (e.g. to change the estimator's margin). Counts already
    /// cached in stored messages are not recomputed.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, estimator::Margin, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// *manager.counter_mut() = manager.counter().with_margin(Margin::TIGHT);
    /// assert_eq!(manager.counter().margin(), Margin::TIGHT);
    /// ```
    pub fn counter_mut(&mut self) -> &mut K {
        &mut self.counter
    }

    /// Total budget: the window minus the reply reserve.
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert_eq!(manager.budget(), 28_672);
    /// ```
    pub fn budget(&self) -> u32 {
        self.config.budget()
    }

    /// Tokens a payload without dynamic context costs now: every live message, the summary
    /// block's framing and the request overhead.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// assert_eq!(manager.used(), 0);
    /// manager.push(Message::user("hello"))?;
    /// assert!(manager.used() > 0);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn used(&self) -> u32 {
        let stored = self.state.tokens.iter().fold(0u32, |sum, t| sum.saturating_add(*t));
        let entities = match self.state.entity_tokens {
            _ if !cfg!(feature = "entities") => 0,
            ENTITIES_UNCOUNTED => self.count_entity_tokens(),
            cached => cached,
        };
        if stored == 0 && entities == 0 {
            return 0;
        }
        stored
            .saturating_add(self.summary_framing_tokens())
            .saturating_add(entities)
            .saturating_add(u32::from(self.config.request_overhead))
    }

    /// Tokens left under the budget.
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert_eq!(manager.remaining(), manager.budget());
    /// ```
    pub fn remaining(&self) -> u32 {
        self.budget().saturating_sub(self.used())
    }

    /// Usage in percent of the budget (may exceed 100 only transiently, before eviction).
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert_eq!(manager.percent_used(), 0);
    /// ```
    pub fn percent_used(&self) -> u32 {
        let budget = u64::from(self.budget().max(1));
        (u64::from(self.used()) * 100 / budget) as u32
    }

    /// Whether `tokens` more fit under the budget without evicting anything.
    ///
    /// ```
    /// let manager = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new();
    /// assert!(manager.has_space(1_000));
    /// assert!(!manager.has_space(1_000_000));
    /// ```
    pub fn has_space(&self, tokens: u32) -> bool {
        self.used().saturating_add(tokens) <= self.budget()
    }

    /// Live tokens stored in `level`.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::system("rules"))?;
    /// assert!(manager.level_tokens(Level::Permanent) > 0);
    /// assert_eq!(manager.level_tokens(Level::Working), 0);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn level_tokens(&self, level: Level) -> u32 {
        self.state.tokens.get(level.index()).copied().unwrap_or(0)
    }

    /// User messages pushed so far (the turn clock).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("one"))?;
    /// assert_eq!(manager.turn(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn turn(&self) -> u64 {
        self.state.turn
    }

    /// Calls still waiting for results.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities, ToolCall};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// let calls = [ToolCall::new("c1", "ls", "{}")];
    /// manager.push(Message::assistant("").with_tool_calls(&calls))?;
    /// assert_eq!(manager.unanswered_calls(), 1);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn unanswered_calls(&self) -> u8 {
        self.state.pending().map_or(0, |pending| pending.unanswered())
    }

    /// A snapshot of the counters and per-level usage (budgets, usage and capacity of every level, and the event counters).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hello"))?;
    /// let stats = manager.stats();
    /// assert_eq!(stats.level(Level::Working).messages, 1);
    /// assert_eq!(stats.used, manager.used());
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let mut levels = [LevelStats::default(); 4];
        let capacities = crate::capacity::capacities_of::<C>();
        for ((slot, level), (messages, bytes)) in levels.iter_mut().zip(Level::ALL).zip(capacities)
        {
            let ring = self.ring(level);
            *slot = LevelStats {
                tokens: self.level_tokens(level),
                budget: self.config.level_budget(level),
                messages: self.state.live.get(level.index()).copied().unwrap_or(0),
                stored_messages: ring.len() as u32,
                bytes: ring.bytes_used() as u32,
                message_capacity: messages as u32,
                byte_capacity: bytes as u32,
            };
        }
        Stats {
            budget: self.budget(),
            used: self.used(),
            trigger: self.config.trigger_tokens(),
            levels,
            turn: self.state.turn,
            outbox_units: self.outbox().count() as u32,
            counters: self.state.counters,
        }
    }

    /// The event counters alone: what [`stats`](Self::stats) reports in `counters`, without
    /// walking the levels and the outbox.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hello"))?;
    /// assert_eq!(manager.counters().messages_pushed, 1);
    /// assert_eq!(*manager.counters(), manager.stats().counters);
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn counters(&self) -> &Counters {
        &self.state.counters
    }

    /// Tokens of the memory-summary framing (prefix and message overhead), 0 when the session
    /// level is empty.
    pub(crate) fn summary_framing_tokens(&self) -> u32 {
        if self.level_tokens(Level::Session) == 0 {
            return 0;
        }
        self.counter
            .count(MEMORY_SUMMARY_PREFIX)
            .saturating_add(u32::from(self.config.message_overhead))
    }

    pub(crate) fn ring(&self, level: Level) -> RingRef<'_> {
        let ring = match level {
            Level::Permanent => self.permanent.view(),
            Level::Session => self.session.view(),
            Level::Working => self.working.view(),
            Level::Volatile => self.volatile.view(),
        };
        ring.with_id_epoch(self.state.id_epoch)
    }

    #[inline(never)]
    pub(crate) fn ring_mut(&mut self, level: Level) -> RingMut<'_> {
        match level {
            Level::Permanent => self.permanent.view_mut(),
            Level::Session => self.session.view_mut(),
            Level::Working => self.working.view_mut(),
            Level::Volatile => self.volatile.view_mut(),
        }
    }

    /// Per-level totals recomputed from the rings (used to validate restored state).
    pub(crate) fn recount_live(&mut self) {
        self.state.tokens = [0; 4];
        self.state.live = [0; 4];
        self.state.bytes = [0; 4];
        for level in Level::ALL {
            let ring = self.ring(level);
            let (mut tokens, mut count, mut bytes) = (0u32, 0u32, 0u32);
            for header in ring.iter().filter(|h| h.is_live()) {
                tokens = tokens.saturating_add(header.tokens);
                count += 1;
                bytes = bytes.saturating_add(header.len);
            }
            let i = level.index();
            if let (Some(t), Some(c), Some(b)) = (
                self.state.tokens.get_mut(i),
                self.state.live.get_mut(i),
                self.state.bytes.get_mut(i),
            ) {
                (*t, *c, *b) = (tokens, count, bytes);
            }
        }
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// Empties every ring and takes `config` (snapshot restore; the caller then sets the
    /// state, stores the records and recounts the live totals).
    pub(crate) fn reset_to(&mut self, config: &Config) {
        for level in Level::ALL {
            self.ring_mut(level).retain(|_| false);
        }
        #[cfg(feature = "tasks")]
        self.tasks.clear();
        self.config = *config;
    }

    /// Takes `state` (snapshot restore, after [`reset_to`](Self::reset_to)).
    pub(crate) fn set_state(&mut self, state: &State) {
        self.state = *state;
    }

    /// Live bytes of `level`.
    pub(crate) fn level_bytes(&self, level: Level) -> u32 {
        self.state.bytes.get(level.index()).copied().unwrap_or(0)
    }

    /// Counts a header into its level's live totals.
    fn add_live(&mut self, level: Level, header: &Header) {
        let i = level.index();
        if let (Some(tokens), Some(count), Some(bytes)) =
            (self.state.tokens.get_mut(i), self.state.live.get_mut(i), self.state.bytes.get_mut(i))
        {
            *tokens = tokens.saturating_add(header.tokens);
            *count = count.saturating_add(1);
            *bytes = bytes.saturating_add(header.len);
        }
        // History grows at its end; anything else changes what a payload begins with.
        if !level.is_history() {
            self.mark_changed(level);
        }
    }

    /// Records that a composed payload's content changed (for the cache accounting).
    pub(crate) fn mark_changed(&mut self, level: Level) {
        let changes = &mut self.state.counters.prefix_changes;
        *changes |= Counters::CHANGED;
        if level == Level::Permanent {
            *changes |= Counters::PERMANENT_CHANGED;
        }
    }

    /// Takes a header out of its level's live totals.
    fn remove_live(&mut self, level: Level, header: &Header) {
        let i = level.index();
        if let (Some(tokens), Some(count), Some(bytes)) =
            (self.state.tokens.get_mut(i), self.state.live.get_mut(i), self.state.bytes.get_mut(i))
        {
            *tokens = tokens.saturating_sub(header.tokens);
            *count = count.saturating_sub(1);
            *bytes = bytes.saturating_sub(header.len);
        }
        self.mark_changed(level);
    }
}
