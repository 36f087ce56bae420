//! How a proxied conversation's session is configured: its window, the room kept for the
//! reply (the request's `max_tokens`), what happens to large tool outputs, and retrieval.

use std::sync::Arc;

use ctxwin_std::core::{Config, Level, Role};
use ctxwin_std::session::{RetrievalSettings, SessionBuilder, TaskDetection};

use super::{Conv, ConvError};
use crate::config::{MIN_PROMPT, ProxyConfig, RETRIEVAL, SUPERSEDE};
use crate::wire::{Part, Request};

/// The settings a conversation is opened with ([`ConvSettings::for_model`]).
///
/// ```
/// use ctxwin_proxy::conv::ConvSettings;
/// let settings = ConvSettings::new(64_000, 4_096);
/// assert_eq!(settings.observation_limit, None);
/// assert_eq!(settings.session_config(64_000, 8_192, 0).reserved_for_reply, 8_192);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ConvSettings {
    /// The model's context window (a new conversation's: an existing one keeps its own).
    pub window: u32,
    /// Tokens kept free for the reply when the request names no `max_tokens`.
    pub reserve: u32,
    /// Tool outputs over this many tokens are stored reduced to head and tail; `None`: kept
    /// whole (reduced only when one output alone is more than the history may hold).
    pub observation_limit: Option<u32>,
    /// At a compaction, old tool outputs over this many tokens are cut to head and tail
    /// before whole turns leave; `None`: turns leave whole.
    pub compaction_limit: Option<u32>,
    /// Tools whose outputs are never reduced, by `observation_limit` or at a compaction
    /// (`Read`: the model quotes file contents back in its edits).
    pub never_cut: Arc<[String]>,
    /// Tools whose output a newer output of the same call supersedes: cut to a note at the
    /// next compaction ([`SessionBuilder::supersede`]; file reads by default).
    pub supersede: Arc<[String]>,
    /// Whether a cut tool output names its archived original and the `ctxwin_recall` tool
    /// is declared ([`ProxyConfig::declares_recall`]).
    pub recall_tool: bool,
    /// Whether archived turns matching the live request are retrieved once something of the
    /// conversation left the window (`[retrieval] auto`).
    pub recall: bool,
    /// How retrieval ranks and how much it brings (`[retrieval]`).
    pub retrieval: RetrievalSettings,
    /// How task boundaries are found (`[tasks] detect`).
    pub task_detection: TaskDetection,
}

impl ConvSettings {
    /// A `window`-token model with `reserve` tokens for the reply; tool outputs whole,
    /// retrieval off ([`RETRIEVAL`]).
    pub fn new(window: u32, reserve: u32) -> Self {
        Self {
            window,
            reserve,
            observation_limit: None,
            compaction_limit: None,
            never_cut: Arc::from([]),
            supersede: SUPERSEDE.iter().map(|tool| (*tool).to_string()).collect(),
            recall_tool: false,
            recall: RETRIEVAL.auto,
            retrieval: RETRIEVAL,
            task_detection: TaskDetection::Off,
        }
    }

    /// The settings `config` gives a conversation of `model`.
    pub fn for_model(config: &ProxyConfig, model: &str) -> Self {
        Self {
            observation_limit: config.observation_limit,
            compaction_limit: config.compaction_limit,
            never_cut: config.never_cut.clone().into(),
            supersede: config.supersede.clone().into(),
            recall_tool: config.declares_recall(),
            recall: config.retrieval.auto,
            retrieval: config.retrieval,
            task_detection: config.task_detection,
            ..Self::new(config.window_for(model), config.reserve)
        }
    }

    /// `builder` with the policies these settings give every session: task detection and
    /// the tools whose outputs a newer one supersedes.
    pub(super) fn policies(&self, builder: SessionBuilder) -> SessionBuilder {
        builder.task_detection(self.task_detection).supersede(self.supersede.iter().cloned())
    }

    /// The core configuration of a conversation of a `window`-token model whose replies get
    /// `reserve` tokens and whose pinned part (system prompt and tool definitions) costs
    /// `pinned` tokens (0 when not known yet): the budget is what the reply leaves of the
    /// window, so that the prompt plus the reply's `max_tokens` never pass the window.
    ///
    /// A compaction keeps `KEEP_PERCENT` of what the pinned part leaves the history (not a
    /// share of the budget: at 32k the pinned part of a coding agent is half of it), so that
    /// the history then grows for many requests with the provider's prompt cache holding:
    /// each compaction rewrites the cached prefix once, and the fewer tokens it keeps the
    /// longer until the next. The newest read of each file stays ahead of older turns within
    /// that share, so it also decides how many files the model still sees (`KEEP_PERCENT`).
    pub fn session_config(&self, window: u32, reserve: u32, pinned: u32) -> Config {
        let reserve = reserve.clamp(1, window.saturating_sub(MIN_PROMPT).max(1));
        let budget = window - reserve;
        // The pinned part may take 60% of a small window; the history levels share what the
        // pinned part leaves, and a tool output alone may take the working level's budget.
        let permanent = budget / 5 * 3;
        let session = budget / 50;
        let history = budget.saturating_sub(pinned.min(budget));
        let small = history < SMALL_HISTORY;
        let keep = if small { KEEP_PERCENT_SMALL } else { KEEP_PERCENT };
        let evicted = history / 100 * (100 - keep);
        let low_water = (u64::from(budget - evicted) * 100 / u64::from(budget.max(1))) as u8;
        Config {
            context_window: window,
            reserved_for_reply: reserve,
            permanent_budget: permanent,
            session_budget: session,
            working_budget: budget - permanent - session,
            observation_limit: self.observation_limit.unwrap_or(WHOLE),
            fit_budgets: false,
            low_water_percent: low_water.clamp(30, 90),
            compaction_limit: self.compaction_limit.unwrap_or(0),
            locked_tail: if small { LOCKED_TAIL_SMALL } else { Config::DEFAULT.locked_tail },
            ..Config::DEFAULT
        }
    }

    /// The retrieval settings for a session whose budget is `budget` tokens, `pinned` of them
    /// taken by the system prompt and tool definitions: the block takes at most
    /// `max_share_percent` of what the pinned part leaves the history, not of the budget.
    /// The block is frozen between compactions and its room is the history's: at 32k, where
    /// a coding agent's tools and system take half the budget, a tenth of the budget was a
    /// fifth of the history's room, and brought each compaction that much closer.
    ///
    /// ```
    /// use ctxwin_proxy::conv::ConvSettings;
    /// let settings = ConvSettings::new(32_000, 8_192);
    /// assert_eq!(settings.retrieval.max_share_percent, 10);
    /// // 23,808 tokens of budget, 11,200 pinned: a tenth of the other 12,608 is 5% of it.
    /// assert_eq!(settings.retrieval_within(23_808, 11_200).max_share_percent, 5);
    /// assert_eq!(settings.retrieval_within(23_808, 0).max_share_percent, 10);
    /// ```
    pub fn retrieval_within(&self, budget: u32, pinned: u32) -> RetrievalSettings {
        let history = u64::from(budget.saturating_sub(pinned));
        let share = u64::from(self.retrieval.max_share_percent);
        let percent = (history * share / u64::from(budget.max(1))).min(100) as u8;
        RetrievalSettings { max_share_percent: percent, ..self.retrieval }
    }

    /// The most tokens one recall call returns: [`RECALL_LIMIT_FACTOR`] times the larger
    /// limit that cuts tool outputs (the room left in the window bounds it too).
    ///
    /// ```
    /// use ctxwin_proxy::conv::ConvSettings;
    /// let settings = ConvSettings { compaction_limit: Some(2_000), ..ConvSettings::new(64_000, 4_096) };
    /// assert_eq!(settings.recall_cap(), 16_000);
    /// ```
    pub fn recall_cap(&self) -> u32 {
        let limit = self.observation_limit.max(self.compaction_limit).unwrap_or(0);
        limit.saturating_mul(RECALL_LIMIT_FACTOR)
    }

    /// Whether `tool`'s outputs are never reduced by the observation limit.
    pub fn never_cuts(&self, tool: &str) -> bool {
        self.never_cut.iter().any(|name| name == tool)
    }
}

impl Conv {
    /// Configures the session's reply reserve for `request`: its `max_tokens` (or
    /// `max_completion_tokens`), so that the prompt plus the reply fit the window; the
    /// configured reserve when it names none. The reserve only grows while the conversation
    /// is loaded: budgets that moved back and forth would compact the history each time.
    ///
    /// # Errors
    /// [`ConvError::BadRequest`] when `max_tokens` leaves the prompt less than
    /// [`MIN_PROMPT`] tokens of the window.
    pub(super) fn fit_reply(&mut self, request: &Request) -> Result<(), ConvError> {
        let asked = reply_tokens(request).unwrap_or(self.settings.reserve);
        let window = self.recorded.window;
        if asked > window.saturating_sub(MIN_PROMPT) {
            return Err(ConvError::BadRequest(format!(
                "max_tokens {asked} leaves less than {MIN_PROMPT} tokens of the {window}-token context window for the prompt: lower max_tokens, or give the model its real window in [proxy.windows]"
            )));
        }
        let reserve = self.reserve.unwrap_or(0).max(asked);
        let pinned = self.session.manager().level_tokens(Level::Permanent);
        let wanted = self.settings.session_config(window, reserve, pinned);
        let configured = self.session.configured();
        let same = configured.reserved_for_reply == wanted.reserved_for_reply
            && configured.low_water_percent == wanted.low_water_percent
            && configured.compaction_limit == wanted.compaction_limit
            && configured.locked_tail == wanted.locked_tail;
        if !same {
            self.session.reconfigure(|c| {
                (c.reserved_for_reply, c.low_water_percent) =
                    (wanted.reserved_for_reply, wanted.low_water_percent);
                c.compaction_limit = wanted.compaction_limit;
                c.locked_tail = wanted.locked_tail;
                (c.permanent_budget, c.session_budget, c.working_budget) =
                    (wanted.permanent_budget, wanted.session_budget, wanted.working_budget);
            })?;
        }
        self.reserve = Some(reserve);
        Ok(())
    }

    /// Whether tool output `part` is pushed whole ([`PushOptions::whole`]): its tool is one
    /// the settings never cut.
    ///
    /// [`PushOptions::whole`]: ctxwin_std::session::PushOptions::whole
    pub(super) fn keeps_whole(&self, part: &Part) -> bool {
        part.chat.role == Role::Tool
            && (self.settings.observation_limit.is_some()
                || self.settings.compaction_limit.is_some())
            && !self.settings.never_cut.is_empty()
            && self
                .tool_of(part.chat.tool_call_id.as_deref().unwrap_or_default())
                .is_some_and(|tool| self.settings.never_cuts(&tool))
    }

    /// The name of the tool call `call_id` answers: one of the newest recorded message's
    /// calls that has any (results follow their calls).
    fn tool_of(&self, call_id: &str) -> Option<String> {
        let entry = self.recorded.entries.iter().rev().find(|entry| entry.calls != 0)?;
        let manager = self.session.manager();
        entry.ids.iter().filter_map(|id| manager.get(*id)).find_map(|message| {
            message.tool_calls().find(|call| call.id == call_id).map(|call| call.name.to_string())
        })
    }
}

/// The reply tokens `request` asks for: `max_tokens`, or OpenAI's `max_completion_tokens`.
fn reply_tokens(request: &Request) -> Option<u32> {
    ["max_tokens", "max_completion_tokens"].iter().find_map(|field| {
        let raw = request.fields.get(*field)?;
        let tokens = serde_json::from_str::<u64>(raw.get()).ok()?;
        Some(u32::try_from(tokens).unwrap_or(u32::MAX))
    })
}

/// How many times the cutting limit one recall call may return: a cut output is read back in
/// pages of this size at most, so that a 2 MB log does not fill the window at once.
pub const RECALL_LIMIT_FACTOR: u32 = 8;

/// The share of what the pinned part leaves the history that a compaction keeps, in percent.
///
/// Half: in the bill bench (newest reads kept, retrieval off), bill× / cache read into the
/// messages / hidden `Edit` targets at Anthropic 200k / 64k / 32k and OpenAI 128k / 32k are
/// 0.58/96%/1, 0.25/94%/10, 0.16/84%/27, 0.37/93%/1, 0.10/73%/22 at 50%; at 35% 0.52/96%/1,
/// 0.22/92%/12, 0.16/83%/27, 0.33/94%/4, 0.09/72%/23; at 60% 0.61/96%/0, 0.28/94%/10,
/// 0.16/82%/27, 0.38/92%/1, 0.10/74%/22 (the naive trim: 0.88/90%/1, 0.28/85%/11,
/// 0.15/74%/27, 0.55/73%/3, 0.11/57%/21). At 50% every bill but 32k's is under the trim's and
/// the proxy hides no more than it but at OpenAI 32k, whose small room keeps
/// [`KEEP_PERCENT_SMALL`].
pub const KEEP_PERCENT: u32 = 50;

/// A history room under this many tokens is small: a compaction keeps [`KEEP_PERCENT_SMALL`] of
/// it and leaves [`LOCKED_TAIL_SMALL`] messages locked.
pub const SMALL_HISTORY: u32 = 16_384;

/// The share a compaction keeps of a small history room (a coding agent at a 32k window,
/// whose system prompt and tools take half the budget). Rewriting it costs little next to the
/// cached pinned part, and one file read (up to 10k tokens) is a large share of it. With
/// [`LOCKED_TAIL_SMALL`], in the bill bench (seeds 27 / 31), bill× / hidden `Edit` targets at
/// Anthropic and OpenAI 32k: 60% 0.15/29 and 0.09/20 / 0.19/30 and 0.11/28; 50% 0.14/28 and
/// 0.09/25 / 0.18/31 and 0.10/29; 70% 0.15/26 and 0.10/23 / 0.21/28 and 0.11/27 (the naive
/// trim: 0.15/27 and 0.11/21 / 0.21/35 and 0.12/32).
pub const KEEP_PERCENT_SMALL: u32 = 60;

/// The messages a compaction of a small history room leaves locked at its end (the core's
/// default is 6). Six messages of a coding agent (parallel file reads and their calls) can
/// fill a 32k window's history room: a compaction then could not reach its low-water mark,
/// and each next turn evicted again, rewriting the cached prefix (at Anthropic 32k, 76 of 200
/// requests' pushes evicted). The newest read of each file still stays ahead of older turns.
/// In the bill bench (seeds 27 / 31), bill× at Anthropic 32k: 0.15 / 0.19 with 2 against
/// 0.16 / 0.21 with 6 (keeping 60%), the naive trim's 0.15 / 0.21.
pub const LOCKED_TAIL_SMALL: u16 = 2;

/// The observation limit that keeps tool outputs whole: the core still reduces an output
/// larger than what its unit may hold of the history's budget.
pub const WHOLE: u32 = u32::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_the_replys_and_budgets_fit_the_window() {
        let settings = ConvSettings::new(32_768, 4_096);
        for reserve in [1, 4_096, 8_192, 16_384, 31_000, 40_000] {
            let config = settings.session_config(32_768, reserve, 13_000);
            config.validate().unwrap_or_else(|e| panic!("{reserve}: {e}"));
            assert_eq!(config.reply_reserve(), reserve.min(32_768 - MIN_PROMPT));
            assert!(config.budget() + config.reply_reserve() <= 32_768);
        }
        assert_eq!(settings.session_config(200_000, 8_192, 0).observation_limit, WHOLE);
        let limited = ConvSettings { observation_limit: Some(2_000), ..settings.clone() };
        assert_eq!(limited.session_config(200_000, 8_192, 0).observation_limit, 2_000);
        // A compaction keeps KEEP_PERCENT of what the pinned part leaves the history, and
        // KEEP_PERCENT_SMALL of a small room.
        let kept = |window: u32, pinned: u32| {
            let config = settings.session_config(window, 8_192, pinned);
            let history = config.budget() - pinned;
            f64::from(config.low_water_tokens() - pinned) / f64::from(history)
        };
        let small = kept(32_768, 12_288);
        assert!((small - f64::from(KEEP_PERCENT_SMALL) / 100.0).abs() < 0.03, "{small}");
        let large = kept(65_536, 12_288);
        assert!((large - f64::from(KEEP_PERCENT) / 100.0).abs() < 0.03, "{large}");
        assert_eq!(settings.session_config(200_000, 8_192, 0).low_water_percent, 50);
    }
}
