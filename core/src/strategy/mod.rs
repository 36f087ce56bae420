//! Pluggable strategies: what leaves the window first, and what happens to it.
//!
//! The manager owns the mechanics (locking, units, budgets, the outbox); a [`Strategy`] only
//! decides, through a few hooks, so a strategy of your own cannot break a pair or the budget.
//! [`Builtin`] runs the five strategies named in [`StrategyKind`], picked by
//! [`Config::strategy`](crate::config::Config::strategy).

mod importance;

pub use importance::{ImportanceScore, importance};

use crate::config::{Config, StrategyKind};
use crate::entities::{Extractor, Patterns};
use crate::level::Level;
use crate::message::MessageRef;
use crate::role::Role;
use crate::summarize::{Detail, Extractive, Summarizer};
use crate::terms::share_a_term;
use crate::view::{History, LevelMessages};

/// What happens to a unit leaving the window (it always goes to the outbox too).
///
/// ```
/// use ctxwin_core::{summarize::Detail, strategy::Leave};
/// let keep_gist = Leave::Summarize { detail: Detail::Line, rolling: false };
/// assert_ne!(keep_gist, Leave::Drop);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Nothing stays in the context.
    Drop,
    /// A summary stays in the session level, standing for the unit's ids.
    Summarize {
        /// How much detail it keeps.
        detail: Detail,
        /// Fold it into the one rolling summary instead of adding a summary of its own.
        rolling: bool,
    },
}

/// Work a strategy asks for after a push, before budget-driven eviction.
///
/// ```
/// use ctxwin_core::strategy::Plan;
/// assert_eq!(Plan::default(), Plan::Nothing);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Plan {
    /// Nothing.
    #[default]
    Nothing,
    /// Fold the oldest `turns` user turns of the history (outside the locked tail) into the
    /// rolling summary and evict them.
    FoldOldestTurns {
        /// Turns to fold.
        turns: u16,
    },
    /// Compress history units older than `history_age` to a paragraph summary each, and
    /// paragraph summaries older than `session_age` to one line (ages in the caller's clock
    /// units, against the newest timestamp pushed).
    CompressByAge {
        /// Age after which a history unit becomes a paragraph.
        history_age: u64,
        /// Age after which a paragraph becomes a line.
        session_age: u64,
    },
    /// Evict every history unit outside the locked tail.
    TrimToTail,
}

/// A unit considered for eviction.
#[derive(Clone, Debug)]
pub struct UnitView<'a> {
    level: Level,
    messages: LevelMessages<'a>,
    first: MessageRef<'a>,
    last_id: u64,
    tokens: u32,
    important: bool,
    terms: [u16; 4],
    newest: u64,
}

impl<'a> UnitView<'a> {
    pub(crate) fn new(level: Level, mut messages: LevelMessages<'a>) -> Option<Self> {
        let all = messages;
        let first = messages.next()?;
        let mut unit = UnitView {
            level,
            messages: all,
            first,
            last_id: first.id(),
            tokens: first.tokens(),
            important: first.is_important(),
            terms: first.terms(),
            newest: first.timestamp(),
        };
        for message in messages {
            unit.last_id = message.id();
            unit.tokens = unit.tokens.saturating_add(message.tokens());
            unit.important |= message.is_important();
            unit.newest = unit.newest.max(message.timestamp());
            for term in message.terms() {
                if term != 0 && !unit.terms.contains(&term) {
                    if let Some(slot) = unit.terms.iter_mut().find(|t| **t == 0) {
                        *slot = term;
                    }
                }
            }
        }
        Some(unit)
    }

    /// Level it lives in.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Its messages, in order.
    pub fn messages(&self) -> LevelMessages<'a> {
        self.messages
    }

    /// Its first message (a tool unit's assistant message).
    pub fn head(&self) -> MessageRef<'a> {
        self.first
    }

    /// Ids it covers, inclusive.
    pub fn ids(&self) -> (u64, u64) {
        (self.first.id(), self.last_id)
    }

    /// Tokens it costs.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Timestamp of its newest message.
    pub fn newest_timestamp(&self) -> u64 {
        self.newest
    }

    /// Whether the caller marked any of its messages important.
    pub fn is_important(&self) -> bool {
        self.important
    }

    pub(crate) fn terms(&self) -> &[u16; 4] {
        &self.terms
    }
}

/// The manager as strategies see it: read-only.
#[derive(Clone, Debug)]
pub struct Env<'a> {
    config: &'a Config,
    now: u64,
    /// The newest user message's id; its text is looked up once, on first use.
    task_id: Option<u64>,
    // A `Cell`, not a `OnceCell`: `get_or_init` has a panic path (re-entrant init).
    task: core::cell::Cell<Option<&'a str>>,
    history: History<'a>,
    /// The manager's tasks, when it keeps any.
    #[cfg(feature = "tasks")]
    tasks: Option<&'a crate::task::Tasks>,
}

impl<'a> Env<'a> {
    pub(crate) fn new(
        config: &'a Config,
        now: u64,
        task_id: Option<u64>,
        history: History<'a>,
    ) -> Self {
        Self {
            config,
            now,
            task_id,
            task: core::cell::Cell::new(None),
            history,
            #[cfg(feature = "tasks")]
            tasks: None,
        }
    }

    /// The same, seeing the manager's tasks.
    #[cfg(feature = "tasks")]
    pub(crate) fn with_tasks(mut self, tasks: &'a crate::task::Tasks) -> Self {
        self.tasks = (!tasks.is_empty()).then_some(tasks);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &'a Config {
        self.config
    }

    /// The caller's clock: the newest timestamp pushed so far.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// The current request: the newest user message.
    pub fn task(&self) -> &'a str {
        if let Some(task) = self.task.get() {
            return task;
        }
        let task = self.task_id.map_or("", |id| {
            self.history().rev().find(|m| m.id() == id).map_or("", |m| m.content())
        });
        self.task.set(Some(task));
        task
    }

    /// The goal of the task running now
    /// ([`start_task`](crate::manager::ContextManager::start_task)), if one is.
    #[cfg(feature = "tasks")]
    pub fn task_goal(&self) -> Option<&'a str> {
        self.tasks?.open().map(crate::task::Task::goal)
    }

    /// The relevance to the running task the caller supplied for `unit`
    /// ([`set_task_relevance`](crate::manager::ContextManager::set_task_relevance), e.g. an
    /// embedder's similarity to the goal), in thousandths: the highest of its messages'.
    #[cfg(feature = "tasks")]
    pub fn supplied_relevance(&self, unit: &UnitView<'_>) -> Option<u32> {
        let tasks = self.tasks?;
        let first_id = tasks.open()?.first_id();
        let relevances = tasks.relevances();
        unit.messages().filter_map(|m| relevances.of(m.id(), first_id)).max().map(u32::from)
    }

    /// The live history, oldest first.
    pub fn history(&self) -> History<'a> {
        self.history
    }

    /// How many later history messages mention one of `unit`'s identifiers, paths or numbers.
    pub fn references(&self, unit: &UnitView<'_>) -> u32 {
        if unit.terms().iter().all(|&t| t == 0) {
            return 0;
        }
        let (_, last) = unit.ids();
        let later = self.history().rev().take_while(|m| m.id() > last);
        later.filter(|m| share_a_term(unit.terms(), &m.terms())).count() as u32
    }

    /// Live user turns in the history.
    pub fn user_turns(&self) -> u32 {
        self.history().filter(|m| m.role() == Role::User).count() as u32
    }
}

/// The per-message work a strategy reads, so the manager does only that work.
///
/// Term hashing (identifiers, paths and numbers of each message, for
/// [`Env::references`]), importance scoring and the summary bookkeeping of leaving units cost
/// most of a push; a sliding window reads none of them. A field the strategy does not need is
/// not computed: a message pushed without `terms` stores none (snapshots restore it as "not
/// computed", and a strategy switched on later sees no references for it).
///
/// ```
/// use ctxwin_core::{Config, StrategyKind};
/// use ctxwin_core::strategy::{Builtin, Needs, SlidingWindow, Strategy};
/// assert_eq!(SlidingWindow::new().needs(&Config::DEFAULT), Needs::NOTHING);
/// let importance = Config { strategy: StrategyKind::Importance, ..Config::DEFAULT };
/// assert!(Builtin::new().needs(&importance).terms);
/// // Plans after a push: entity extraction trims to the tail, summarization folds turns.
/// let entities = Config { strategy: StrategyKind::EntityExtraction, ..Config::DEFAULT };
/// assert!(Builtin::new().needs(&entities).plans);
/// assert!(!Builtin::new().needs(&Config::DEFAULT).plans);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    /// Term hashes of every pushed message ([`Env::references`]).
    pub terms: bool,
    /// Unit values ([`Strategy::value`]): asked only when this is set and
    /// [`Strategy::oldest_first`] is false.
    pub importance: bool,
    /// What becomes of a leaving unit ([`Strategy::on_leave`]) and the unit view it reads;
    /// without it every leaving unit is dropped.
    pub summary_sources: bool,
    /// Work after a push ([`Strategy::after_push`]): asked only when this is set, so a
    /// strategy without plans links none of the plans' code (folding, compressing by age).
    pub plans: bool,
    /// User messages go through [`Strategy::extractor`] when a schema is declared; without
    /// it the entity values change only by restoring a snapshot (and no extraction code is
    /// linked).
    pub entities: bool,
}

impl Needs {
    /// Everything: the default for strategies of your own.
    pub const ALL: Needs =
        Needs { terms: true, importance: true, summary_sources: true, plans: true, entities: true };
    /// Nothing: a sliding window.
    pub const NOTHING: Needs = Needs {
        terms: false,
        importance: false,
        summary_sources: false,
        plans: false,
        entities: false,
    };
}

/// Decides what leaves the window and what becomes of it; the manager does the rest.
///
/// Every hook has a default, so the smallest strategy is `impl Strategy for Mine { fn
/// summarizer(..) .. fn extractor(..) .. }`: a sliding window.
///
/// ```
/// use ctxwin_core::{strategy::Env, summarize::Extractive, entities::Extractor, strategy::Leave, entities::Patterns, strategy::Strategy, summarize::Summarizer, strategy::UnitView};
/// /// Evicts the biggest units first and keeps nothing of them.
/// struct BiggestFirst { summarizer: Extractive, extractor: Patterns }
/// impl Strategy for BiggestFirst {
///     fn oldest_first(&self, _: &Env<'_>) -> bool { false }
///     fn value(&mut self, unit: &UnitView<'_>, _: &Env<'_>) -> u32 { u32::MAX - unit.tokens() }
///     fn summarizer(&mut self) -> &mut dyn Summarizer { &mut self.summarizer }
///     fn extractor(&mut self) -> &mut dyn Extractor { &mut self.extractor }
/// }
/// ```
pub trait Strategy {
    /// Whether units simply leave oldest first ([`value`](Self::value) is then not asked).
    fn oldest_first(&self, env: &Env<'_>) -> bool {
        let _ = env;
        true
    }

    /// How much keeping `unit` is worth; the lowest-valued evictable unit leaves first (ties:
    /// the oldest). Asked for at most the 32 oldest evictable units of a level.
    fn value(&mut self, unit: &UnitView<'_>, env: &Env<'_>) -> u32 {
        let _ = (unit, env);
        0
    }

    /// What happens to `unit` as it leaves.
    fn on_leave(&mut self, unit: &UnitView<'_>, env: &Env<'_>) -> Leave {
        let _ = (unit, env);
        Leave::Drop
    }

    /// Work to do after a push.
    fn after_push(&mut self, env: &Env<'_>) -> Plan {
        let _ = env;
        Plan::Nothing
    }

    /// The summarizer used for [`Leave::Summarize`], plans and merging summaries.
    fn summarizer(&mut self) -> &mut dyn Summarizer;

    /// What the strategy reads under `config`; the manager skips the rest of a push's work.
    /// Everything by default, so a strategy of your own sees what it always saw.
    #[inline]
    fn needs(&self, config: &Config) -> Needs {
        let _ = config;
        Needs::ALL
    }

    /// The extractor that updates entities from user messages (when a schema is declared).
    fn extractor(&mut self) -> &mut dyn Extractor;

    /// The built-in kind this strategy runs, which a manager's
    /// [`Config::strategy`](crate::config::Config::strategy) must name
    /// ([`ConfigError::StrategyMismatch`](crate::config::ConfigError::StrategyMismatch)
    /// otherwise), or `None` for [`Builtin`], which runs whatever kind the configuration names.
    /// The default, the default kind, is for strategies of your own: their configuration
    /// leaves `strategy` at its default, so no configured kind is silently ignored.
    ///
    /// ```
    /// use ctxwin_core::StrategyKind;
    /// use ctxwin_core::strategy::{Builtin, SlidingWindow, Strategy};
    /// assert_eq!(SlidingWindow::new().kind(), Some(StrategyKind::SlidingWindow));
    /// assert_eq!(Builtin::new().kind(), None);
    /// ```
    fn kind(&self) -> Option<StrategyKind> {
        Some(StrategyKind::default())
    }
}

/// A strategy that can be built in `const` context, so a manager using it can be a `static`
/// ([`ContextManager::UNCONFIGURED`](crate::manager::ContextManager::UNCONFIGURED)).
pub trait ConstStrategy: Strategy {
    /// The strategy's initial value.
    const NEW: Self;
}

impl ConstStrategy for Builtin {
    const NEW: Self = Builtin::new();
}

impl ConstStrategy for SlidingWindow {
    const NEW: Self = SlidingWindow::new();
}

/// The sliding window alone: oldest units leave first, nothing is summarized or extracted, and
/// no summarizer or extractor code is linked. The smallest footprint, for firmware that writes
/// its own summaries with [`add_summary`](crate::manager::ContextManager::add_summary), if any. (A
/// session level that overflows drops its oldest entries.)
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities};
/// use ctxwin_core::strategy::SlidingWindow;
/// let mut manager = ContextManager::<TinyCapacities>::builder().strategy(SlidingWindow::new()).build()?;
/// manager.push(Message::user("hi"))?;
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SlidingWindow {
    none: Nothing,
}

impl SlidingWindow {
    /// The sliding window.
    pub const fn new() -> Self {
        SlidingWindow { none: Nothing }
    }
}

/// A summarizer that never summarizes and an extractor that never extracts.
#[derive(Clone, Copy, Debug, Default)]
struct Nothing;

impl Summarizer for Nothing {
    fn summarize(
        &mut self,
        _: &crate::summarize::SummaryRequest<'_>,
        _: &mut crate::summarize::TextBuffer<'_>,
    ) -> Result<(), crate::summarize::SummarizeError> {
        Err(crate::summarize::SummarizeError::Unavailable)
    }
}

impl Extractor for Nothing {
    fn extract(&mut self, _: &str, _: &mut crate::entities::EntitiesMut<'_>) {}
}

impl Strategy for SlidingWindow {
    fn summarizer(&mut self) -> &mut dyn Summarizer {
        &mut self.none
    }

    #[inline]
    fn needs(&self, _: &Config) -> Needs {
        Needs::NOTHING
    }

    fn kind(&self) -> Option<StrategyKind> {
        Some(StrategyKind::SlidingWindow)
    }

    fn extractor(&mut self) -> &mut dyn Extractor {
        &mut self.none
    }
}

/// The five built-in strategies, selected by [`Config::strategy`](crate::config::Config::strategy),
/// with a pluggable summarizer and extractor (the core's deterministic ones by default).
///
/// ```
/// use ctxwin_core::{strategy::Builtin, Config, ContextManager, StrategyKind, TinyCapacities};
/// let config = Config { strategy: StrategyKind::Hierarchical, ..Config::DEFAULT };
/// let manager = ContextManager::<TinyCapacities>::with_config(config)?;
/// assert_eq!(manager.config().strategy, StrategyKind::Hierarchical);
/// # Ok::<(), ctxwin_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Builtin<Z = Extractive, X = Patterns> {
    /// Summarizer for summaries, folds and merges.
    pub summarizer: Z,
    /// Extractor for entities.
    pub extractor: X,
}

impl Builtin {
    /// The built-in strategies with the core's extractive summarizer and pattern extractor.
    pub const fn new() -> Self {
        Builtin { summarizer: Extractive, extractor: Patterns }
    }
}

impl<Z: Summarizer, X: Extractor> Strategy for Builtin<Z, X> {
    fn oldest_first(&self, env: &Env<'_>) -> bool {
        env.config().strategy != StrategyKind::Importance
    }

    fn value(&mut self, unit: &UnitView<'_>, env: &Env<'_>) -> u32 {
        match env.config().strategy {
            StrategyKind::Importance => importance(unit, env).total,
            _ => 0,
        }
    }

    fn on_leave(&mut self, unit: &UnitView<'_>, env: &Env<'_>) -> Leave {
        let config = env.config();
        match config.strategy {
            StrategyKind::SlidingWindow | StrategyKind::EntityExtraction => Leave::Drop,
            StrategyKind::Summarization => {
                Leave::Summarize { detail: Detail::Paragraph, rolling: true }
            }
            StrategyKind::Importance
                if importance(unit, env).total >= u32::from(config.importance_threshold) =>
            {
                Leave::Summarize { detail: Detail::Paragraph, rolling: false }
            }
            // Below the threshold a unit keeps one line, and only if it says something
            // specific (the summarizer declines chatter): dropping it outright lost every
            // planted fact in the memory-quality bench.
            StrategyKind::Importance => Leave::Summarize { detail: Detail::Line, rolling: false },
            StrategyKind::Hierarchical => {
                Leave::Summarize { detail: Detail::Paragraph, rolling: false }
            }
        }
    }

    fn after_push(&mut self, env: &Env<'_>) -> Plan {
        let config = env.config();
        match config.strategy {
            StrategyKind::Summarization
                if env.user_turns() > u32::from(config.summarize_threshold) =>
            {
                Plan::FoldOldestTurns { turns: config.summarize_batch }
            }
            StrategyKind::Hierarchical => Plan::CompressByAge {
                history_age: config.working_age_ms,
                session_age: config.session_age_ms,
            },
            StrategyKind::EntityExtraction => Plan::TrimToTail,
            _ => Plan::Nothing,
        }
    }

    fn summarizer(&mut self) -> &mut dyn Summarizer {
        &mut self.summarizer
    }

    #[inline]
    fn needs(&self, config: &Config) -> Needs {
        match config.strategy {
            StrategyKind::SlidingWindow => Needs { entities: true, ..Needs::NOTHING },
            StrategyKind::EntityExtraction => {
                Needs { plans: true, entities: true, ..Needs::NOTHING }
            }
            StrategyKind::Summarization | StrategyKind::Hierarchical => {
                Needs { summary_sources: true, plans: true, entities: true, ..Needs::NOTHING }
            }
            StrategyKind::Importance => Needs::ALL,
        }
    }

    fn extractor(&mut self) -> &mut dyn Extractor {
        &mut self.extractor
    }

    fn kind(&self) -> Option<StrategyKind> {
        None
    }
}
