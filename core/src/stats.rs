//! The metrics block: what the manager holds, and what it has evicted, reduced and summarized.

use crate::level::Level;

/// Running totals since the manager was created (kept across snapshots).
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::user("hi"))?;
/// assert_eq!(manager.stats().counters.messages_pushed, 1);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counters {
    /// Messages stored (synthetic ones included: aborted-call results, summaries).
    pub messages_pushed: u64,
    /// Tokens of everything accepted, as counted before any reduction.
    pub tokens_ingested: u64,
    /// Units evicted (to the outbox or discarded).
    pub units_evicted: u64,
    /// Messages in those units.
    pub messages_evicted: u64,
    /// Tokens in those units.
    pub tokens_evicted: u64,
    /// Evicted units released without being drained ([`OutboxMode::Discard`](crate::config::OutboxMode::Discard)).
    pub units_discarded: u64,
    /// Units the caller drained from the outbox.
    pub units_drained: u64,
    /// Tool results stored reduced to head and tail.
    pub observations_reduced: u64,
    /// Tokens saved by those reductions.
    pub tokens_saved_by_reduction: u64,
    /// Synthetic results written for calls that never got one.
    pub calls_aborted: u64,
    /// Unanswered calls removed from their assistant message.
    pub calls_dropped: u64,
    /// Summaries added to the session level.
    pub summaries_added: u64,
    /// Summaries merged into one when the session level overflowed.
    pub summaries_merged: u64,
    /// Summaries the summarizer could not produce (the unit just left).
    pub summaries_failed: u64,
    /// Summaries superseded by a newer version of themselves (rolling updates, merges,
    /// compression to a line, or dropped when nothing in them was worth a line): they leave
    /// without the outbox, their sources already archived.
    pub summaries_replaced: u64,
    /// Turn of the last eviction or summary (`None` before the first).
    pub last_compression_turn: Option<u64>,
    /// Compactions: pushes or composes that went over the high-water mark (or a level's
    /// capacity trigger) and evicted down to the low-water mark in one step.
    pub compactions: u64,
    /// Payloads composed. Each [`compose`](crate::manager::ContextManager::compose) counts
    /// as one turn of the cache accounting: a caller that composes several times per model
    /// call should compose once per call.
    pub composes: u64,
    /// Composes whose payload began with the whole previous payload, message by message (its
    /// trailing dynamic context excepted when that is placed before the newest user message):
    /// a provider's prompt cache holds all of it.
    pub composes_extending: u64,
    /// Prompt tokens of those payloads a provider could read from its cache: the previous
    /// payload when it is extended, else the system prompt and tools when they did not change.
    pub prompt_tokens_cached: u64,
    /// Prompt tokens of those payloads not in the cache (written to it).
    pub prompt_tokens_new: u64,
    /// Tokens of the previous payload's cacheable part (0 before the first compose).
    pub last_prefix_tokens: u32,
    /// Bit 0: something in the previous payload changed since it was composed (an eviction,
    /// a summary or entity update, a rewrite of a stored message). Bit 1: the permanent level
    /// changed. Bit 2: a payload was composed.
    pub prefix_changes: u8,
    /// Digest of the previous compose's dynamic context.
    pub last_dynamic_digest: u32,
}

/// Adds `by` to `counter`, saturating. Out of line: a 64-bit saturating add is about 20 B
/// of Thumb code, and the manager bumps a counter at some 25 places.
#[inline(never)]
pub(crate) fn bump(counter: &mut u64, by: u64) {
    *counter = counter.saturating_add(by);
}

impl Counters {
    pub(crate) const NEW: Counters = Counters {
        messages_pushed: 0,
        tokens_ingested: 0,
        units_evicted: 0,
        messages_evicted: 0,
        tokens_evicted: 0,
        units_discarded: 0,
        units_drained: 0,
        observations_reduced: 0,
        tokens_saved_by_reduction: 0,
        calls_aborted: 0,
        calls_dropped: 0,
        summaries_added: 0,
        summaries_merged: 0,
        summaries_failed: 0,
        summaries_replaced: 0,
        last_compression_turn: None,
        compactions: 0,
        composes: 0,
        composes_extending: 0,
        prompt_tokens_cached: 0,
        prompt_tokens_new: 0,
        last_prefix_tokens: 0,
        prefix_changes: 0,
        last_dynamic_digest: 0,
    };

    /// `prefix_changes`: the previous payload changed.
    pub(crate) const CHANGED: u8 = 1;
    /// `prefix_changes`: the permanent level changed.
    pub(crate) const PERMANENT_CHANGED: u8 = 2;
    /// `prefix_changes`: a payload was composed.
    pub(crate) const COMPOSED: u8 = 4;

    /// Share of composes, in thousandths, whose payload extended the previous one (the first
    /// compose never does).
    ///
    /// ```
    /// let counters = ctxwin_core::stats::Counters { composes: 4, composes_extending: 3, ..Default::default() };
    /// assert_eq!(counters.extending_permille(), 750);
    /// ```
    pub fn extending_permille(&self) -> u64 {
        self.composes_extending.saturating_mul(1000) / self.composes.max(1)
    }

    /// Share of prompt tokens, in thousandths, a provider could read from its cache.
    ///
    /// ```
    /// let counters = ctxwin_core::stats::Counters { prompt_tokens_cached: 9, prompt_tokens_new: 1, ..Default::default() };
    /// assert_eq!(counters.cached_permille(), 900);
    /// ```
    pub fn cached_permille(&self) -> u64 {
        let total = self.prompt_tokens_cached.saturating_add(self.prompt_tokens_new);
        self.prompt_tokens_cached.saturating_mul(1000) / total.max(1)
    }

    /// Input cost under a provider cache model, in thousandths of sending the same prompts
    /// uncached: cached tokens at `read_permille`, new tokens at `write_permille` (Anthropic:
    /// 100 and 1,250; OpenAI: 500 and 1,000).
    ///
    /// ```
    /// let counters = ctxwin_core::stats::Counters { prompt_tokens_cached: 900, prompt_tokens_new: 100, ..Default::default() };
    /// assert_eq!(counters.cost_permille(100, 1_250), 215);
    /// ```
    pub fn cost_permille(&self, read_permille: u64, write_permille: u64) -> u64 {
        let total = self.prompt_tokens_cached.saturating_add(self.prompt_tokens_new);
        let cost = self
            .prompt_tokens_cached
            .saturating_mul(read_permille)
            .saturating_add(self.prompt_tokens_new.saturating_mul(write_permille));
        cost / total.max(1)
    }
}

/// Usage of one level.
///
/// ```
/// use ctxwin_core::{ContextManager, Level, TinyCapacities};
/// let manager = ContextManager::<TinyCapacities>::new();
/// let working = manager.stats().level(Level::Working);
/// assert_eq!((working.messages, working.budget), (0, 8_000));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LevelStats {
    /// Live tokens.
    pub tokens: u32,
    /// The level's token budget.
    pub budget: u32,
    /// Live messages.
    pub messages: u32,
    /// Messages stored, evicted ones waiting in the outbox included.
    pub stored_messages: u32,
    /// Bytes of text stored.
    pub bytes: u32,
    /// Header capacity.
    pub message_capacity: u32,
    /// Arena capacity in bytes.
    pub byte_capacity: u32,
}

/// The metrics block: budget, per-level usage and running totals.
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.push(Message::user("hello"))?;
/// let stats = manager.stats();
/// assert!(stats.used <= stats.budget);
/// assert_eq!(stats.messages(), 1);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    /// Total budget (window minus reply reserve).
    pub budget: u32,
    /// Tokens a payload without dynamic context costs now.
    pub used: u32,
    /// Usage above which eviction starts.
    pub trigger: u32,
    /// Per level, in [`Level::ALL`] order.
    pub levels: [LevelStats; 4],
    /// User messages pushed so far.
    pub turn: u64,
    /// Evicted units waiting to be drained.
    pub outbox_units: u32,
    /// Running totals.
    pub counters: Counters,
}

impl Stats {
    /// Usage of `level`.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Level, TinyCapacities};
    /// let stats = ContextManager::<TinyCapacities>::new().stats();
    /// assert_eq!(stats.level(Level::Session).tokens, 0);
    /// ```
    pub fn level(&self, level: Level) -> LevelStats {
        self.levels.get(level.index()).copied().unwrap_or_default()
    }

    /// Live messages across all levels.
    ///
    /// ```
    /// let stats = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new().stats();
    /// assert_eq!(stats.messages(), 0);
    /// ```
    pub fn messages(&self) -> u32 {
        self.levels.iter().map(|level| level.messages).sum()
    }

    /// Summaries in the session level.
    ///
    /// ```
    /// let stats = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new().stats();
    /// assert_eq!(stats.summaries(), 0);
    /// ```
    pub fn summaries(&self) -> u32 {
        self.level(Level::Session).messages
    }

    /// Compression ratio in thousandths: tokens ingested over tokens in context
    /// (1000 = nothing compressed; 10000 = ten times).
    ///
    /// ```
    /// let stats = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new().stats();
    /// assert_eq!(stats.compression_permille(), 1000);
    /// ```
    pub fn compression_permille(&self) -> u64 {
        let in_context: u64 = self.levels.iter().map(|level| u64::from(level.tokens)).sum();
        if in_context == 0 || self.counters.tokens_ingested <= in_context {
            return 1000;
        }
        self.counters.tokens_ingested.saturating_mul(1000) / in_context
    }

    /// Usage in percent of the budget.
    ///
    /// ```
    /// let stats = ctxwin_core::ContextManager::<ctxwin_core::TinyCapacities>::new().stats();
    /// assert_eq!(stats.percent_used(), 0);
    /// ```
    pub fn percent_used(&self) -> u32 {
        (u64::from(self.used) * 100 / u64::from(self.budget.max(1))) as u32
    }
}

impl core::fmt::Display for Stats {
    /// The aligned metrics table.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        writeln!(
            f,
            "tokens      {:>7} / {:<7} ({}%)",
            self.used,
            self.budget,
            self.percent_used()
        )?;
        for level in Level::ALL {
            let stats = self.level(level);
            writeln!(
                f,
                "  {:<9} {:>7} / {:<7} {:>5} msgs",
                level.as_str(),
                stats.tokens,
                stats.budget,
                stats.messages
            )?;
        }
        let ratio = self.compression_permille();
        writeln!(f, "messages    {:>7}", self.messages())?;
        writeln!(f, "summaries   {:>7}", self.summaries())?;
        writeln!(f, "evicted     {:>7} units", self.counters.units_evicted)?;
        writeln!(f, "reduced     {:>7} tool outputs", self.counters.observations_reduced)?;
        writeln!(f, "compression {:>4}.{:02}x", ratio / 1000, (ratio % 1000) / 10)?;
        let c = &self.counters;
        writeln!(f, "compactions {:>7}", c.compactions)?;
        let (extending, cached) = (c.extending_permille(), c.cached_permille());
        writeln!(
            f,
            "cache       {:>3}.{}% of {} composes extended the previous, {}.{}% of prompt tokens cached",
            extending / 10,
            extending % 10,
            c.composes,
            cached / 10,
            cached % 10
        )?;
        match self.counters.last_compression_turn {
            Some(turn) => writeln!(f, "last compression  turn {turn} (now {})", self.turn),
            None => writeln!(f, "last compression  never (turn {})", self.turn),
        }
    }
}
