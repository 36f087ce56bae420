//! Budgets, thresholds and policies of a manager.

use crate::entities::EntitySchema;

/// What happens to tool calls that never got a result when the conversation moves on.
///
/// ```
/// use ctxwin_core::UnansweredCalls;
/// assert_eq!(UnansweredCalls::default(), UnansweredCalls::SynthesizeAborted);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum UnansweredCalls {
    /// Store a synthetic result saying the call was aborted, so the model learns it failed.
    #[default]
    SynthesizeAborted,
    /// Remove the unanswered calls from their assistant message (needs the `drop-calls`
    /// cargo feature, on by default).
    DropCalls,
}

/// What happens to evicted units.
///
/// ```
/// use ctxwin_core::OutboxMode;
/// assert_eq!(OutboxMode::default(), OutboxMode::Hold);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum OutboxMode {
    /// Keep evicted units, in place, until the caller drains them
    /// ([`ContextManager::drain_outbox`](crate::manager::ContextManager::drain_outbox)). A push that
    /// needs their space fails with [`Error::OutboxFull`](crate::error::Error::OutboxFull) until then.
    #[default]
    Hold,
    /// Release evicted units at once, counting them in
    /// [`Counters::units_discarded`](crate::stats::Counters::units_discarded). For callers that keep no archive.
    Discard,
}

/// A manager's budgets and policies. [`Config::DEFAULT`] is a 32k-token window
/// with 4k reserved for the reply (see it for every value).
///
/// The total budget is `context_window - reserved_for_reply`. The permanent, session and working
/// levels have their own budgets; the volatile level gets the rest. Level budgets are quotas:
/// they bound what a level may hold when the window is contended, and what a level does not use
/// is available to the history. With [`fit_budgets`](Config::fit_budgets) (the default) the
/// reply reserve and the level budgets are ceilings, capped to shares of the window so that any
/// window from 2,048 tokens up is valid as it is.
///
/// ```
/// use ctxwin_core::Config;
/// let config = Config { context_window: 16_384, reserved_for_reply: 2_048, ..Config::DEFAULT };
/// assert_eq!(config.budget(), 14_336);
/// assert_eq!(config.volatile_budget(), 14_336 - 2_000 - 3_584 - 7_168);
/// assert!(config.validate().is_ok());
/// let small = Config { context_window: 8_000, ..Config::DEFAULT };
/// assert_eq!(small.budget(), 6_000);
/// assert!(small.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct Config {
    /// The model's context window, in tokens.
    pub context_window: u32,
    /// Tokens kept free for the model's reply.
    pub reserved_for_reply: u32,
    /// Budget of the permanent level (system prompt, rules, tool definitions).
    pub permanent_budget: u32,
    /// Budget of the session level (summaries, key decisions).
    pub session_budget: u32,
    /// Budget of the working level (recent turns).
    pub working_budget: u32,
    /// High-water mark: usage, in percent of the total budget (and of each level's byte and
    /// message capacity), above which a compaction starts. A compaction evicts (and
    /// summarizes, per strategy) down to [`low_water_percent`](Config::low_water_percent) in
    /// one step; between compactions pushes only append, so each payload extends the previous
    /// one and the provider's prompt cache holds.
    pub trigger_percent: u8,
    /// The newest messages that are never evicted while the budget holds them: when they are
    /// over it beside the permanent level (summaries have given way already), their oldest
    /// units leave first, down to the newest unit (kept with any tail at all) and the newest
    /// user message.
    pub locked_tail: u16,
    /// Most messages kept in the history (working + volatile); 0 for no limit.
    pub max_messages: u32,
    /// Tool results over this many tokens are stored reduced to head and tail lines.
    pub observation_limit: u32,
    /// Tokens added to every message for its role and separators.
    pub message_overhead: u16,
    /// Tokens added once per request (the reply primer).
    pub request_overhead: u16,
    /// What to do with calls that never got a result.
    pub unanswered_calls: UnansweredCalls,
    /// What to do with evicted units.
    pub outbox: OutboxMode,
    /// Which built-in strategy runs (with [`Builtin`](crate::strategy::Builtin)).
    pub strategy: StrategyKind,
    /// Summarization: user turns in the history above which the oldest are folded.
    pub summarize_threshold: u16,
    /// Summarization: user turns folded at a time.
    pub summarize_batch: u16,
    /// Most tokens one summary may cost.
    pub summary_tokens: u32,
    /// Importance: score (in thousandths) from which a leaving unit is summarized, not dropped.
    pub importance_threshold: u16,
    /// Hierarchical: age (caller's clock, milliseconds) after which a history unit becomes a
    /// paragraph summary.
    pub working_age_ms: u64,
    /// Hierarchical: age after which a paragraph summary becomes one line.
    pub session_age_ms: u64,
    /// Declared entity keys; extraction runs on user messages when there is at least one
    /// (needs the `entities` cargo feature, on by default).
    pub entity_schema: EntitySchema,
    /// Low-water mark: a compaction evicts down to this share of the budget (and of each
    /// level's byte and message capacity). At or above `trigger_percent`, eviction evicts just
    /// enough at every push and the strategy's plans run on every push (ctxwin before 0.2).
    pub low_water_percent: u8,
    /// The reply reserve and the level budgets are ceilings, capped to fit the window: the
    /// reserve to a quarter of the window, the permanent and session budgets to a quarter of
    /// the total budget each, the working budget to half. `false` takes them as given and
    /// refuses a window they do not fit ([`ConfigError::LevelBudgetsExceedTotal`]).
    pub fit_budgets: bool,
    /// Where dynamic context (task, retrieved text) goes in the payload.
    pub dynamic_placement: DynamicPlacement,
    /// Tokens one tool call costs besides its id, name and arguments (the `type` and
    /// `function` framing); see [`TokenCounter`](crate::counter::TokenCounter) for what the
    /// manager counts. 3 by default.
    pub tool_call_overhead: u16,
    /// Whether the newest user message (the live request) is never evicted, wherever it is in
    /// the history. On by default; off, it leaves oldest-first like any other unit.
    pub lock_newest_user: bool,
    /// At a compaction, before whole units leave, tool results over this many tokens are
    /// reduced to it, oldest first, until usage is under the low-water mark: results stored
    /// whole while there was room give way when the window needs it, never those of the live
    /// request, the locked tail or one pushed [`whole`](crate::message::Message::whole).
    /// 0 (the default) turns it off; otherwise at least 32, like `observation_limit`.
    pub compaction_limit: u32,
}

/// Where [`compose`](crate::manager::ContextManager::compose)'s dynamic context goes.
///
/// Providers cache the longest prompt prefix they have seen: text that changes every turn
/// breaks the cache for everything after it.
///
/// ```
/// use ctxwin_core::DynamicPlacement;
/// assert_eq!(DynamicPlacement::default(), DynamicPlacement::AfterTools);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum DynamicPlacement {
    /// system → tools → dynamic → summary → history: the dynamic text reads as standing
    /// instructions, but when it changes the cache holds only the system prompt and tools.
    #[default]
    AfterTools,
    /// system → tools → summary → history up to the newest user message → dynamic → the
    /// newest user message and what follows: a change of the dynamic text costs only the
    /// newest turn's tokens, the history before it stays cached.
    BeforeNewestUser,
}

impl Config {
    /// The defaults: a 32k window with 4k reserved for the reply, level budgets
    /// 2,000 / 4,000 / 8,000 / the rest (capped to fit smaller windows), compaction when the
    /// budget is full down to 50% (swept on conv_10000 with the estimator alone and with the
    /// std side's calibrator: `benches/README.md`), the newest 6
    /// messages and the newest user message locked, tool results reduced above 1,000 tokens, the
    /// sliding window; summarization folds 5 turns past 10; importance summarizes from 0.6;
    /// hierarchical compresses after 5 and 30 minutes; dynamic context after the tools; 3 tokens
    /// per tool call besides its strings.
    pub const DEFAULT: Config = Config {
        context_window: 32_768,
        reserved_for_reply: 4_096,
        permanent_budget: 2_000,
        session_budget: 4_000,
        working_budget: 8_000,
        trigger_percent: 100,
        locked_tail: 6,
        max_messages: 0,
        observation_limit: 1_000,
        message_overhead: 4,
        request_overhead: 3,
        unanswered_calls: UnansweredCalls::SynthesizeAborted,
        outbox: OutboxMode::Hold,
        strategy: StrategyKind::SlidingWindow,
        summarize_threshold: 10,
        summarize_batch: 5,
        summary_tokens: 400,
        importance_threshold: 600,
        working_age_ms: 5 * 60 * 1000,
        session_age_ms: 30 * 60 * 1000,
        entity_schema: EntitySchema::EMPTY,
        low_water_percent: 50,
        fit_budgets: true,
        dynamic_placement: DynamicPlacement::AfterTools,
        tool_call_overhead: 3,
        lock_newest_user: true,
        compaction_limit: 0,
    };

    /// Total token budget of a payload: the window minus the reply reserve.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Config::DEFAULT.budget(), 28_672);
    /// ```
    #[inline(never)]
    pub const fn budget(&self) -> u32 {
        self.context_window.saturating_sub(self.reply_reserve())
    }

    /// Tokens kept free for the reply: `reserved_for_reply`, capped to a quarter of the
    /// window with [`fit_budgets`](Config::fit_budgets).
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// assert_eq!(Config::DEFAULT.reply_reserve(), 4_096);
    /// assert_eq!(Config { context_window: 2_048, ..Config::DEFAULT }.reply_reserve(), 512);
    /// ```
    pub const fn reply_reserve(&self) -> u32 {
        if self.fit_budgets {
            min(self.reserved_for_reply, self.context_window / 4)
        } else {
            self.reserved_for_reply
        }
    }

    /// The volatile level's budget: what the other levels leave of the total.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Config::DEFAULT.volatile_budget(), 14_672);
    /// ```
    pub const fn volatile_budget(&self) -> u32 {
        let budget = self.budget();
        budget
            .saturating_sub(self.capped(self.permanent_budget, budget / 4))
            .saturating_sub(self.capped(self.session_budget, budget / 4))
            .saturating_sub(self.capped(self.working_budget, budget / 2))
    }

    /// A level's `given` budget, at most `cap` with [`fit_budgets`](Config::fit_budgets). (Not
    /// through [`level_budget`](Config::level_budget), which calls
    /// [`volatile_budget`](Config::volatile_budget): no recursion for firmware's static stack
    /// analysis to give up on.)
    const fn capped(&self, given: u32, cap: u32) -> u32 {
        if self.fit_budgets { min(given, cap) } else { given }
    }

    /// Budget of `level`, as capped by [`fit_budgets`](Config::fit_budgets).
    ///
    /// ```
    /// use ctxwin_core::{Config, Level};
    /// assert_eq!(Config::DEFAULT.level_budget(Level::Working), 8_000);
    /// let small = Config { context_window: 8_000, ..Config::DEFAULT };
    /// assert_eq!(small.level_budget(Level::Working), 3_000);
    /// ```
    pub const fn level_budget(&self, level: crate::level::Level) -> u32 {
        let budget = self.budget();
        match level {
            crate::level::Level::Permanent => self.capped(self.permanent_budget, budget / 4),
            crate::level::Level::Session => self.capped(self.session_budget, budget / 4),
            crate::level::Level::Working => self.capped(self.working_budget, budget / 2),
            crate::level::Level::Volatile => self.volatile_budget(),
        }
    }

    /// Usage above which a compaction starts (the high-water mark): `trigger_percent` of the
    /// budget.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Config::DEFAULT.trigger_tokens(), 28_672);
    /// ```
    pub const fn trigger_tokens(&self) -> u32 {
        percent_of(self.budget(), self.trigger_percent)
    }

    /// Usage a compaction evicts down to (the low-water mark): `low_water_percent` of the
    /// budget, never above the high-water mark.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Config::DEFAULT.low_water_tokens(), 14_336);
    /// ```
    pub const fn low_water_tokens(&self) -> u32 {
        percent_of(self.budget(), self.low_water())
    }

    /// The low-water mark in percent, never above `trigger_percent`.
    pub(crate) const fn low_water(&self) -> u8 {
        if self.low_water_percent < self.trigger_percent {
            self.low_water_percent
        } else {
            self.trigger_percent
        }
    }

    /// Whether compactions cut down to a low-water mark below the trigger (`false`: evict
    /// just enough at every push, and run the strategy's plans on every push).
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// assert!(Config::DEFAULT.compacts());
    /// assert!(!Config { trigger_percent: 80, low_water_percent: 80, ..Config::DEFAULT }.compacts());
    /// ```
    pub const fn compacts(&self) -> bool {
        self.low_water_percent < self.trigger_percent
    }

    /// Checks the settings make sense together.
    ///
    /// ```
    /// use ctxwin_core::{Config, ConfigError};
    /// let bad = Config { reserved_for_reply: 40_000, fit_budgets: false, ..Config::DEFAULT };
    /// assert_eq!(bad.validate(), Err(ConfigError::NoBudget));
    /// let tight = Config { context_window: 8_000, fit_budgets: false, ..Config::DEFAULT };
    /// assert!(tight.validate().unwrap_err().to_string().starts_with(
    ///     "permanent_budget 2000 + session_budget 4000 + working_budget 8000 = 14000 exceed the total budget 3904"
    /// ));
    /// ```
    pub const fn validate(&self) -> Result<(), ConfigError> {
        if self.budget() == 0 {
            return Err(ConfigError::NoBudget);
        }
        if self.trigger_percent == 0 || self.trigger_percent > 100 || self.low_water_percent > 100 {
            return Err(ConfigError::TriggerOutOfRange);
        }
        use crate::level::Level;
        let (permanent, session, working) = (
            self.level_budget(Level::Permanent),
            self.level_budget(Level::Session),
            self.level_budget(Level::Working),
        );
        if permanent as u64 + session as u64 + working as u64 > self.budget() as u64 {
            return Err(ConfigError::LevelBudgetsExceedTotal {
                permanent,
                session,
                working,
                budget: self.budget(),
            });
        }
        if self.observation_limit < 32 || (self.compaction_limit != 0 && self.compaction_limit < 32)
        {
            return Err(ConfigError::ObservationLimitTooSmall);
        }
        if self.summarize_batch == 0 || self.summary_tokens < 16 || self.importance_threshold > 1000
        {
            return Err(ConfigError::StrategySettings);
        }
        if matches!(self.unanswered_calls, UnansweredCalls::DropCalls)
            && !cfg!(feature = "drop-calls")
        {
            return Err(ConfigError::Unsupported);
        }
        if !self.entity_schema.is_empty() && !cfg!(feature = "entities") {
            return Err(ConfigError::Unsupported);
        }
        if self.compaction_limit != 0 && !cfg!(feature = "compaction-cut") {
            return Err(ConfigError::Unsupported);
        }
        Ok(())
    }

    /// A 32-bit FNV-1a digest of every setting, stored in snapshots so a restore can tell
    /// whether it runs under the configuration it was taken with.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// let other = Config { locked_tail: 8, ..Config::DEFAULT };
    /// assert_ne!(Config::DEFAULT.fingerprint(), other.fingerprint());
    /// ```
    pub fn fingerprint(&self) -> u32 {
        self.fingerprint_with(RETIRED_CHECKPOINT_INTERVAL)
    }

    /// [`fingerprint`](Self::fingerprint) with `checkpoint_interval` in the place of the
    /// retired `checkpoint_interval_messages` setting: a snapshot verifies the value it carries.
    pub(crate) fn fingerprint_with(&self, checkpoint_interval: u32) -> u32 {
        let words = [
            self.context_window,
            self.reserved_for_reply,
            self.permanent_budget,
            self.session_budget,
            self.working_budget,
            u32::from(self.trigger_percent),
            u32::from(self.locked_tail),
            self.max_messages,
            self.observation_limit,
            u32::from(self.message_overhead),
            u32::from(self.request_overhead),
            self.unanswered_calls as u32,
            self.outbox as u32,
            self.strategy as u32,
            u32::from(self.summarize_threshold),
            u32::from(self.summarize_batch),
            self.summary_tokens,
            u32::from(self.importance_threshold),
            self.working_age_ms as u32,
            (self.working_age_ms >> 32) as u32,
            self.session_age_ms as u32,
            (self.session_age_ms >> 32) as u32,
            checkpoint_interval,
            u32::from(self.low_water_percent),
            u32::from(self.fit_budgets),
            self.dynamic_placement as u32,
            u32::from(self.tool_call_overhead),
            u32::from(self.lock_newest_user),
        ];
        let keys = self.entity_schema.keys().flat_map(|key| key.bytes().chain([0]));
        // Hashed only when set: fingerprints of configurations without it stay as they were.
        let compaction = (self.compaction_limit != 0).then_some(self.compaction_limit);
        words
            .iter()
            .copied()
            .chain(compaction)
            .flat_map(|word| word.to_le_bytes())
            .chain(keys)
            .fold(0x811c_9dc5u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
    }
}

/// What the retired `checkpoint_interval_messages` setting (now the std adapter's) defaulted
/// to: snapshots still carry it and fingerprints still hash it, so their bytes stay the same.
pub(crate) const RETIRED_CHECKPOINT_INTERVAL: u32 = 50;

impl Config {
    /// Every field zero: the configuration of [`ContextManager::UNCONFIGURED`]
    /// (crate::manager::ContextManager::UNCONFIGURED), which refuses work until configured.
    pub(crate) const ZERO: Config = Config {
        context_window: 0,
        reserved_for_reply: 0,
        permanent_budget: 0,
        session_budget: 0,
        working_budget: 0,
        trigger_percent: 0,
        locked_tail: 0,
        max_messages: 0,
        observation_limit: 0,
        message_overhead: 0,
        request_overhead: 0,
        unanswered_calls: UnansweredCalls::SynthesizeAborted,
        outbox: OutboxMode::Hold,
        strategy: StrategyKind::SlidingWindow,
        summarize_threshold: 0,
        summarize_batch: 0,
        summary_tokens: 0,
        importance_threshold: 0,
        working_age_ms: 0,
        session_age_ms: 0,
        entity_schema: EntitySchema::EMPTY,
        low_water_percent: 0,
        fit_budgets: false,
        dynamic_placement: DynamicPlacement::AfterTools,
        tool_call_overhead: 0,
        lock_newest_user: false,
        compaction_limit: 0,
    };
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

const fn min(a: u32, b: u32) -> u32 {
    if a < b { a } else { b }
}

/// `value · percent / 100`, rounded down (saturating), in 32-bit arithmetic: a 64-bit
/// division is a compiler-builtins helper of almost 1 KiB on a 32-bit device.
/// With `value = 100·q + r`, the result is exactly `q·percent + r·percent / 100`.
pub(crate) const fn percent_of(value: u32, percent: u8) -> u32 {
    let percent = percent as u32;
    (value / 100).saturating_mul(percent).saturating_add(value % 100 * percent / 100)
}

/// Why a [`Config`] was refused.
///
/// ```
/// use ctxwin_core::{Config, ConfigError};
/// let bad = Config { trigger_percent: 0, ..Config::DEFAULT };
/// assert_eq!(bad.validate(), Err(ConfigError::TriggerOutOfRange));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigError {
    /// `reserved_for_reply` leaves no tokens of the window.
    NoBudget,
    /// `trigger_percent` is not in 1..=100, or `low_water_percent` is over 100.
    TriggerOutOfRange,
    /// Permanent + session + working budgets exceed the total budget (with `fit_budgets`
    /// off: the numbers are taken as given).
    LevelBudgetsExceedTotal {
        /// The permanent level's budget.
        permanent: u32,
        /// The session level's budget.
        session: u32,
        /// The working level's budget.
        working: u32,
        /// The total budget: context window minus the reply reserve.
        budget: u32,
    },
    /// `observation_limit` (or a `compaction_limit` other than 0) is below 32 tokens: no room
    /// for head, marker and tail.
    ObservationLimitTooSmall,
    /// `summarize_batch` is 0, `summary_tokens` below 16, or `importance_threshold` over 1000.
    StrategySettings,
    /// `strategy` names a built-in kind the manager's strategy does not run: only
    /// [`Builtin`](crate::strategy::Builtin) follows `Config::strategy`; any other strategy
    /// takes a configuration whose `strategy` is the kind it runs (see
    /// [`Strategy::kind`](crate::strategy::Strategy::kind)), so a choice is never ignored.
    StrategyMismatch {
        /// What the configuration names.
        configured: StrategyKind,
        /// What the manager's strategy runs.
        runs: StrategyKind,
    },
    /// A setting this build of the core left out: `unanswered_calls: DropCalls` without the
    /// `drop-calls` cargo feature, a declared `entity_schema` without `entities`.
    Unsupported,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ConfigError::NoBudget => "reserved_for_reply leaves no room in context_window",
            ConfigError::TriggerOutOfRange => {
                "trigger_percent must be between 1 and 100, low_water_percent at most 100"
            }
            ConfigError::LevelBudgetsExceedTotal { permanent, session, working, budget } => {
                return write!(
                    f,
                    "permanent_budget {permanent} + session_budget {session} + working_budget {working} = {} exceed the total budget {budget} (context_window minus reserved_for_reply); lower them or set fit_budgets = true",
                    u64::from(*permanent) + u64::from(*session) + u64::from(*working)
                );
            }
            ConfigError::ObservationLimitTooSmall => {
                "observation_limit and a compaction_limit must be at least 32 tokens"
            }
            ConfigError::StrategySettings => {
                "summarize_batch must be at least 1, summary_tokens at least 16, importance_threshold at most 1000"
            }
            ConfigError::StrategyMismatch { configured, runs } => {
                return write!(
                    f,
                    "strategy {configured} is configured, but the manager's strategy runs {runs}"
                );
            }
            ConfigError::Unsupported => {
                "unanswered_calls = drop_calls and entity_schema need ctxwin-core's drop-calls and entities features"
            }
        })
    }
}

impl core::error::Error for ConfigError {}

/// The built-in strategies.
///
/// | kind | what leaves first | what happens to it |
/// |---|---|---|
/// | [`SlidingWindow`](StrategyKind::SlidingWindow) | oldest unit | dropped (to the outbox) |
/// | [`Summarization`](StrategyKind::Summarization) | oldest turns, past `summarize_threshold` | folded into one rolling summary |
/// | [`EntityExtraction`](StrategyKind::EntityExtraction) | everything outside the locked tail | dropped: the entity table keeps the state |
/// | [`Importance`](StrategyKind::Importance) | lowest importance score | a paragraph above `importance_threshold`, else one line if it says something specific |
/// | [`Hierarchical`](StrategyKind::Hierarchical) | units older than `working_age_ms`, then oldest | kept as a paragraph, then a line after `session_age_ms` |
///
/// ```
/// use ctxwin_core::StrategyKind;
/// assert_eq!(StrategyKind::default(), StrategyKind::SlidingWindow);
/// assert_eq!(StrategyKind::parse("importance"), Some(StrategyKind::Importance));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum StrategyKind {
    /// Pure FIFO over units within the budget.
    #[default]
    SlidingWindow,
    /// A rolling summary absorbs the oldest turns.
    Summarization,
    /// Only the extracted state and the locked tail.
    EntityExtraction,
    /// Scores units; keeps the valuable, summarizes the important.
    Importance,
    /// Full text, then a paragraph, then a line, by age.
    Hierarchical,
}

impl StrategyKind {
    /// Every kind.
    pub const ALL: [StrategyKind; 5] = [
        StrategyKind::SlidingWindow,
        StrategyKind::Summarization,
        StrategyKind::EntityExtraction,
        StrategyKind::Importance,
        StrategyKind::Hierarchical,
    ];

    /// Snake-case name.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::StrategyKind::SlidingWindow.as_str(), "sliding_window");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            StrategyKind::SlidingWindow => "sliding_window",
            StrategyKind::Summarization => "summarization",
            StrategyKind::EntityExtraction => "entity_extraction",
            StrategyKind::Importance => "importance",
            StrategyKind::Hierarchical => "hierarchical",
        }
    }

    /// Parses a snake-case name.
    pub fn parse(name: &str) -> Option<StrategyKind> {
        StrategyKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl core::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, ConfigError, UnansweredCalls, percent_of};
    use proptest::prelude::*;

    /// Dropping unanswered calls is accepted exactly when the build links it.
    #[test]
    fn drop_calls_needs_its_feature() {
        let config = Config { unanswered_calls: UnansweredCalls::DropCalls, ..Config::DEFAULT };
        let expected =
            if cfg!(feature = "drop-calls") { Ok(()) } else { Err(ConfigError::Unsupported) };
        assert_eq!(config.validate(), expected);
    }

    /// A schema is accepted exactly when the build links entities.
    #[test]
    fn a_schema_needs_the_entities_feature() {
        let schema = crate::entities::EntitySchema::new(&["city"]).unwrap();
        let config = Config { entity_schema: schema, ..Config::DEFAULT };
        let expected =
            if cfg!(feature = "entities") { Ok(()) } else { Err(ConfigError::Unsupported) };
        assert_eq!(config.validate(), expected);
    }

    proptest! {
        /// 32-bit `percent_of` equals the 64-bit formula it replaces.
        #[test]
        fn percent_of_is_the_64_bit_formula(value: u32, percent in 0u8..=100) {
            let expected = (u64::from(value) * u64::from(percent) / 100) as u32;
            prop_assert_eq!(percent_of(value, percent), expected);
        }
    }
}
