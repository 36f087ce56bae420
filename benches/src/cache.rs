//! Prompt-cache cost of a replay (issue 14): how much of each turn's payload a provider's
//! prefix cache could reuse from the previous turn, and what the input costs under that
//! cache model, for the managers' strategies and two baselines.
//!
//! - **Turn**: the session is pushed message by message; a turn ends (a payload is composed
//!   and "sent") after an assistant message without tool calls or after the last result of an
//!   assistant message's calls. conv_10000 has 4,554 such turns.
//! - **Same message**: role, content, tool calls (id, name, arguments) and tool-call id all
//!   byte-equal ([`Sent`]'s `==`).
//! - **Cached prefix**: the longest run of payload messages, from the first, equal message by
//!   message to the previous turn's payload. A turn is *stable* when the whole previous
//!   payload is that prefix (the first turn, with no previous payload, is not counted in the
//!   stable share).
//! - **Cache model** (Anthropic-style): the cached prefix's tokens are read at 0.1×, every
//!   other token is written at 1.25×; *uncached* sends all tokens at 1.0×. Cost ratio =
//!   Σ cached-model cost / Σ uncached cost; cost per 1,000 turns in input-token equivalents.
//! - **Tokens**: exact cl100k_base counts ([`ExactCounter`], cached per text): per message
//!   content + each tool call's id, name and arguments + 3 + the result's call id + 4 framing,
//!   plus 3 per request (the core's framing rule with exact counts).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use ctxwin_core::{Role, StrategyKind};
use ctxwin_std::ChatMessage;
use ctxwin_std::tokens::{Calibrator, ExactCounter, TokenizerError};

use crate::api::{
    CALL_OVERHEAD, DYNAMIC, MESSAGE_OVERHEAD, Part, REQUEST_OVERHEAD, Replayer, Sent,
};

/// Exact cl100k counts of payload messages, cached per text.
pub struct ExactTokens {
    counter: ExactCounter,
    hasher: RandomState,
    cache: HashMap<(u64, usize), u32>,
}

impl ExactTokens {
    /// The shipped cl100k_base tokenizer.
    ///
    /// # Errors
    ///
    /// None in practice (the tokenizer is embedded in ctxwin-std).
    pub fn cl100k() -> Result<ExactTokens, TokenizerError> {
        Ok(ExactTokens {
            counter: ExactCounter::cl100k()?,
            hasher: RandomState::new(),
            cache: HashMap::new(),
        })
    }

    /// Exact tokens of `text`.
    pub fn text(&mut self, text: &str) -> u32 {
        if text.is_empty() {
            return 0;
        }
        let key = (self.hasher.hash_one(text), text.len());
        let counter = &self.counter;
        *self.cache.entry(key).or_insert_with(|| counter.count_uncached(text))
    }

    /// Exact tokens of a sent message, framing included.
    pub fn message(&mut self, message: &Sent) -> u32 {
        let calls: u32 = message
            .calls
            .iter()
            .map(|(id, name, args)| {
                self.text(id) + self.text(name) + self.text(args) + CALL_OVERHEAD
            })
            .sum();
        let id = message.call_id.as_deref().map_or(0, |id| self.text(id));
        self.text(&message.content) + calls + id + MESSAGE_OVERHEAD
    }
}

/// The measures of one replay.
#[derive(Clone, Debug, Default)]
pub struct CacheStats {
    /// Turns (payloads composed).
    pub turns: u64,
    /// Turns after the first whose previous payload was a prefix of theirs.
    pub stable: u64,
    /// Breaks where the first differing message was the memory summary.
    pub summary_breaks: u64,
    /// Σ cached-prefix tokens.
    pub cached: u64,
    /// Σ payload tokens.
    pub total: u64,
    /// Σ cost under the cache model (0.1 cached + 1.25 written).
    pub cost: f64,
    /// Smallest and largest payload, exact tokens.
    pub min_fill: u32,
    /// Largest payload, exact tokens.
    pub max_fill: u32,
    /// Σ of history's exact tokens over turns after the session filled the budget.
    pub history_full: u64,
    /// Smallest history, exact tokens, after the session filled the budget.
    pub history_full_min: u32,
    /// Turns after the session filled the budget.
    pub turns_full: u64,
    /// The payload budget.
    pub budget: u32,
    /// With a calibrator: the budget (estimated tokens) the manager planned with at the end,
    /// and the calibrator's mean billed/estimated ratio.
    pub calibrated: Option<(u32, f64)>,
}

impl CacheStats {
    fn new(budget: u32) -> CacheStats {
        CacheStats { min_fill: u32::MAX, history_full_min: u32::MAX, budget, ..Default::default() }
    }

    /// Share of turns (after the first) that were cache-stable.
    pub fn stable_share(&self) -> f64 {
        self.stable as f64 / self.turns.saturating_sub(1).max(1) as f64
    }

    /// Share of input tokens read from the cache.
    pub fn cacheable_share(&self) -> f64 {
        self.cached as f64 / self.total.max(1) as f64
    }

    /// Mean payload, share of the budget.
    pub fn mean_fill(&self) -> f64 {
        self.total as f64 / self.turns.max(1) as f64 / f64::from(self.budget)
    }

    /// Smallest payload, share of the budget.
    pub fn min_fill_share(&self) -> f64 {
        f64::from(self.min_fill) / f64::from(self.budget)
    }

    /// Cached-model cost / uncached cost.
    pub fn cost_ratio(&self) -> f64 {
        self.cost / self.total.max(1) as f64
    }

    /// Cost per 1,000 turns, input-token equivalents.
    pub fn cost_per_1000(&self) -> f64 {
        self.cost / self.turns.max(1) as f64 * 1_000.0
    }

    /// Mean history share of the budget once the session filled it (`None` before).
    pub fn history_share(&self) -> Option<(f64, f64)> {
        (self.turns_full > 0).then(|| {
            let budget = f64::from(self.budget);
            (
                self.history_full as f64 / self.turns_full as f64 / budget,
                f64::from(self.history_full_min) / budget,
            )
        })
    }

    /// Records a turn's payload against the previous one; returns its exact tokens (what a
    /// provider would bill as `usage.prompt_tokens`).
    fn record(
        &mut self,
        previous: &[Sent],
        payload: &[Sent],
        exact: &mut ExactTokens,
        full: bool,
    ) -> u32 {
        let tokens: Vec<u32> = payload.iter().map(|m| exact.message(m)).collect();
        let total = tokens.iter().sum::<u32>() + REQUEST_OVERHEAD;
        let prefix = previous.iter().zip(payload).take_while(|(a, b)| a == b).count();
        if self.turns > 0 {
            if prefix == previous.len() {
                self.stable += 1;
            } else if payload.get(prefix).is_some_and(|m| m.part == Part::Summary)
                || previous.get(prefix).is_some_and(|m| m.part == Part::Summary)
            {
                self.summary_breaks += 1;
            }
        }
        let cached: u32 = tokens[..prefix].iter().sum();
        self.turns += 1;
        self.cached += u64::from(cached);
        self.total += u64::from(total);
        self.cost += 0.1 * f64::from(cached) + 1.25 * f64::from(total - cached);
        self.min_fill = self.min_fill.min(total);
        self.max_fill = self.max_fill.max(total);
        if full {
            let history: u32 = payload
                .iter()
                .zip(&tokens)
                .filter(|(m, _)| m.part == Part::History)
                .map(|(_, t)| t)
                .sum();
            self.turns_full += 1;
            self.history_full += u64::from(history);
            self.history_full_min = self.history_full_min.min(history);
        }
        total
    }
}

/// What produces each turn's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// A `ContextManager` with a built-in strategy (today's code: per-push eviction).
    Manager(StrategyKind),
    /// The same with the std side's `Calibrator` fed each payload's exact cl100k count as the
    /// provider's `usage.prompt_tokens`, its calibrated configuration applied after every turn
    /// (what `Session::record_usage` does).
    Calibrated(StrategyKind),
    /// Baseline: a bench-side model of today's per-push eviction (sliding window), fixed
    /// here so it keeps measuring today's behaviour after the core changes.
    PerPush,
    /// Baseline: system message(s) pinned, then the newest whole units that fit, starting at
    /// a user message, recomputed from all messages every turn (LangChain's
    /// `trim_messages(strategy="last", start_on="human")`).
    Trim,
}

impl Policy {
    /// Every row the bench prints: the five strategies and the two baselines.
    pub fn all() -> Vec<Policy> {
        let mut rows: Vec<Policy> = StrategyKind::ALL.into_iter().map(Policy::Manager).collect();
        rows.push(Policy::Calibrated(StrategyKind::SlidingWindow));
        rows.push(Policy::Calibrated(StrategyKind::Hierarchical));
        rows.push(Policy::PerPush);
        rows.push(Policy::Trim);
        rows
    }

    /// Row label.
    pub fn label(&self) -> String {
        match self {
            Policy::Manager(kind) => kind.as_str().to_owned(),
            Policy::Calibrated(kind) => format!("{} + calibrator", kind.as_str()),
            Policy::PerPush => "baseline: per-push eviction".to_owned(),
            Policy::Trim => "baseline: newest-first trim".to_owned(),
        }
    }
}

/// Where each turn ends: the indices after whose push a payload is composed.
pub fn turn_ends(messages: &[ChatMessage]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut waiting = 0usize;
    for (index, message) in messages.iter().enumerate() {
        match message.role {
            Role::Assistant if message.tool_calls.is_empty() => ends.push(index),
            Role::Assistant => waiting = message.tool_calls.len(),
            Role::Tool => {
                waiting = waiting.saturating_sub(1);
                if waiting == 0 {
                    ends.push(index);
                }
            }
            _ => {}
        }
    }
    ends
}

/// The default estimator against exact cl100k counts on `messages`, by content class: one
/// row per class with (label, texts, exact tokens, estimate at ×1, estimate at the default
/// margin, share of texts under their exact count at the default margin).
pub fn estimator_by_class(
    messages: &[ChatMessage],
    exact: &mut ExactTokens,
) -> Vec<(&'static str, usize, u64, u64, u64, f64)> {
    use ctxwin_core::counter::TokenCounter;
    use ctxwin_core::estimator::{Estimator, Margin};
    let tight = Estimator::new().with_margin(Margin::TIGHT);
    let safe = Estimator::new();
    let mut classes: Vec<(&'static str, Vec<&str>)> = vec![
        ("prose: user messages", Vec::new()),
        ("prose: assistant text", Vec::new()),
        ("JSON: tool-call arguments", Vec::new()),
        ("tool output (log lines)", Vec::new()),
        ("ids and names (calls, results)", Vec::new()),
    ];
    for message in messages {
        let class = match message.role {
            Role::User => Some(0),
            Role::Assistant => Some(1),
            Role::Tool => Some(3),
            Role::System => None,
        };
        if let Some(class) = class.filter(|_| !message.content.is_empty()) {
            classes[class].1.push(&message.content);
        }
        for call in &message.tool_calls {
            classes[2].1.push(&call.arguments);
            classes[4].1.push(&call.id);
            classes[4].1.push(&call.name);
        }
        if let Some(id) = &message.tool_call_id {
            classes[4].1.push(id);
        }
    }
    classes
        .into_iter()
        .map(|(label, texts)| {
            let (mut x, mut t, mut e, mut under) = (0u64, 0u64, 0u64, 0usize);
            for text in &texts {
                let n = exact.text(text);
                let s = safe.count(text);
                x += u64::from(n);
                t += u64::from(tight.count(text));
                e += u64::from(s);
                under += usize::from(s < n);
            }
            (label, texts.len(), x, t, e, under as f64 / texts.len().max(1) as f64)
        })
        .collect()
}

/// Estimated (default estimator, framed) tokens of a session message.
pub fn estimated(message: &ChatMessage) -> u32 {
    use crate::api::estimate;
    let calls: u32 = message
        .tool_calls
        .iter()
        .map(|c| estimate(&c.id) + estimate(&c.name) + estimate(&c.arguments) + CALL_OVERHEAD)
        .sum();
    let id = message.tool_call_id.as_deref().map_or(0, estimate);
    estimate(&message.content) + calls + id + MESSAGE_OVERHEAD
}

/// Replays `messages` (the system prompt first) under `policy` with `config`'s budget and
/// measures every turn. "Full" turns (for the history share) are those after the estimated
/// tokens pushed so far first exceed the budget.
///
/// # Errors
///
/// What the manager refuses.
pub fn replay(
    messages: &[ChatMessage],
    policy: Policy,
    config: ctxwin_core::Config,
    exact: &mut ExactTokens,
) -> Result<CacheStats, Box<dyn std::error::Error>> {
    replay_with(messages, policy, config, exact, false)
}

/// [`replay`], the manager rows with a std `Session`'s capacities when `server` (a server's
/// 128k window: the core's default rings hold about 25k tokens of history).
///
/// # Errors
///
/// What the manager refuses.
pub fn replay_with(
    messages: &[ChatMessage],
    policy: Policy,
    config: ctxwin_core::Config,
    exact: &mut ExactTokens,
    server: bool,
) -> Result<CacheStats, Box<dyn std::error::Error>> {
    let ends = turn_ends(messages);
    let budget = config.budget();
    let mut stats = CacheStats::new(budget);
    let mut previous: Vec<Sent> = Vec::new();
    let mut pushed = 0u64;
    let mut next_end = ends.iter().peekable();
    let mut manager = match policy {
        Policy::Manager(kind) | Policy::Calibrated(kind) if server => {
            Some(Replayer::server(ctxwin_core::Config { strategy: kind, ..config })?)
        }
        Policy::Manager(kind) | Policy::Calibrated(kind) => {
            Some(Replayer::new(ctxwin_core::Config { strategy: kind, ..config })?)
        }
        _ => None,
    };
    let configured = match policy {
        Policy::Calibrated(kind) => ctxwin_core::Config { strategy: kind, ..config },
        _ => config,
    };
    let mut calibrator = matches!(policy, Policy::Calibrated(_)).then(Calibrator::new);
    let mut model = PerPushModel::new(config);
    for (index, message) in messages.iter().enumerate() {
        pushed += u64::from(estimated(message));
        match &mut manager {
            Some(manager) => manager.push(message)?,
            None if policy == Policy::PerPush => model.push(messages, index),
            None => {}
        }
        if next_end.peek() != Some(&&index) {
            continue;
        }
        next_end.next();
        let (payload, estimated) = match (&mut manager, policy) {
            (Some(manager), _) => manager.compose()?,
            (None, Policy::PerPush) => (model.payload(messages), 0),
            _ => (trim(&messages[..=index], budget), 0),
        };
        let billed = stats.record(&previous, &payload, exact, pushed > u64::from(budget));
        if let (Some(calibrator), Some(manager)) = (&mut calibrator, &mut manager) {
            calibrator.observe(estimated, billed)?;
            manager.set_config(calibrator.calibrated_config(&configured))?;
        }
        previous = payload;
    }
    if let (Some(calibrator), Some(manager)) = (&calibrator, &mut manager) {
        stats.calibrated = Some((manager.budget(), calibrator.ratio().unwrap_or(1.0)));
    }
    Ok(stats)
}

/// The dynamic-context message every payload carries.
fn dynamic() -> Vec<Sent> {
    DYNAMIC
        .iter()
        .map(|text| Sent {
            role: Role::System,
            content: (*text).to_owned(),
            calls: Vec::new(),
            call_id: None,
            part: Part::Dynamic,
        })
        .collect()
}

fn dynamic_tokens() -> u32 {
    DYNAMIC.iter().map(|t| crate::api::estimate(t) + MESSAGE_OVERHEAD).sum()
}

/// Units of `messages` (after the system prompts): each non-tool message with the tool
/// results that follow it, as index ranges.
fn units(messages: &[ChatMessage]) -> Vec<std::ops::Range<usize>> {
    let mut units: Vec<std::ops::Range<usize>> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if message.role == Role::System {
            continue;
        }
        match units.last_mut() {
            Some(unit) if message.role == Role::Tool && unit.end == index => unit.end += 1,
            _ => units.push(index..index + 1),
        }
    }
    units
}

/// The newest-first trim baseline: system message(s) + dynamic context pinned, then the
/// newest whole units whose estimated (framed) tokens fit the rest of `budget`, stopping at
/// the first that does not (a result over the budget empties the history, as LangChain's
/// trim does), then leading messages dropped until a user message (`start_on="human"`). No
/// reduction of large results.
pub fn trim(messages: &[ChatMessage], budget: u32) -> Vec<Sent> {
    let system: Vec<&ChatMessage> = messages.iter().filter(|m| m.role == Role::System).collect();
    let pinned: u32 =
        system.iter().map(|m| estimated(m)).sum::<u32>() + dynamic_tokens() + REQUEST_OVERHEAD;
    let mut room = budget.saturating_sub(pinned);
    let mut first = messages.len();
    for unit in units(messages).into_iter().rev() {
        let cost: u32 = messages[unit.clone()].iter().map(estimated).sum();
        if cost > room {
            break;
        }
        room -= cost;
        first = unit.start;
    }
    // LangChain's start_on="human": the kept history opens with a user message.
    while first < messages.len() && messages[first].role != Role::User {
        first += 1;
    }
    let mut payload: Vec<Sent> = system.iter().map(|m| Sent::of_chat(m, Part::System)).collect();
    payload.extend(dynamic());
    payload.extend(
        messages[first..]
            .iter()
            .filter(|m| m.role != Role::System)
            .map(|m| Sent::of_chat(m, Part::History)),
    );
    payload
}

/// A bench-side model of today's per-push eviction (sliding window), so the baseline stays
/// today's after the core changes. After every push, while the history is over the working
/// budget or the whole payload over `trigger_percent` of the budget, the oldest unit leaves,
/// except units holding one of the newest `locked_tail` messages, the newest user message,
/// or calls still waiting. A tool result over `observation_limit` (or over what its level has
/// left) is cut to head and tail lines, as the core does (approximately: halves of the limit,
/// whole lines, a marker line).
#[derive(Clone, Debug)]
pub struct PerPushModel {
    config: ctxwin_core::Config,
    /// Live units, oldest first: (message indices, per-message estimated tokens, contents
    /// where reduced).
    units: std::collections::VecDeque<ModelUnit>,
    system: Vec<usize>,
    system_tokens: u32,
    waiting: usize,
    last_user: Option<usize>,
}

#[derive(Clone, Debug)]
struct ModelUnit {
    messages: Vec<(usize, u32, Option<String>)>,
}

impl ModelUnit {
    fn tokens(&self) -> u32 {
        self.messages.iter().map(|m| m.1).sum()
    }
}

impl PerPushModel {
    /// An empty model for `config`'s budgets, with today's 80% trigger whatever `config`
    /// says (the core's default trigger is now the high-water mark of compactions).
    pub fn new(config: ctxwin_core::Config) -> PerPushModel {
        PerPushModel {
            config: ctxwin_core::Config { trigger_percent: 80, ..config },
            units: Default::default(),
            system: Vec::new(),
            system_tokens: 0,
            waiting: 0,
            last_user: None,
        }
    }

    fn history_tokens(&self) -> u32 {
        self.units.iter().map(ModelUnit::tokens).sum()
    }

    /// Pushes `messages[index]`.
    pub fn push(&mut self, messages: &[ChatMessage], index: usize) {
        let message = &messages[index];
        let tokens = estimated(message);
        match message.role {
            Role::System => {
                self.system.push(index);
                self.system_tokens += tokens;
                return;
            }
            Role::Tool => {
                let unit_tokens = self.units.back().map_or(0, ModelUnit::tokens);
                let frame = estimated(&ChatMessage { content: String::new(), ..message.clone() });
                let limit = self.config.observation_limit.min(
                    self.config.working_budget.saturating_sub(unit_tokens).saturating_sub(frame),
                );
                let raw = tokens - frame;
                let (tokens, reduced) = if raw > limit {
                    let text = reduce(&message.content, limit);
                    (crate::api::estimate(&text) + frame, Some(text))
                } else {
                    (tokens, None)
                };
                self.waiting = self.waiting.saturating_sub(1);
                if let Some(unit) = self.units.back_mut() {
                    unit.messages.push((index, tokens, reduced));
                }
            }
            _ => {
                if message.role == Role::User {
                    self.last_user = Some(index);
                }
                self.waiting = message.tool_calls.len();
                self.units.push_back(ModelUnit { messages: vec![(index, tokens, None)] });
            }
        }
        self.collect();
    }

    fn collect(&mut self) {
        let trigger =
            u64::from(self.config.budget()) * u64::from(self.config.trigger_percent) / 100;
        let locked_from = {
            let tail = usize::from(self.config.locked_tail);
            let mut seen = 0;
            let mut from = usize::MAX;
            'outer: for unit in self.units.iter().rev() {
                for m in unit.messages.iter().rev() {
                    seen += 1;
                    from = m.0;
                    if seen == tail {
                        break 'outer;
                    }
                }
            }
            from
        };
        loop {
            let history = self.history_tokens();
            let used = self.system_tokens + history + REQUEST_OVERHEAD;
            if history <= self.config.working_budget && u64::from(used) <= trigger {
                break;
            }
            let count = self.units.len();
            let victim = self.units.iter().enumerate().position(|(i, unit)| {
                let pending = i + 1 == count && self.waiting > 0;
                let locked =
                    unit.messages.iter().any(|m| m.0 >= locked_from || Some(m.0) == self.last_user);
                !pending && !locked
            });
            match victim {
                Some(i) => {
                    self.units.remove(i);
                }
                None => break,
            }
        }
    }

    /// The payload: system, dynamic context, history.
    pub fn payload(&self, messages: &[ChatMessage]) -> Vec<Sent> {
        let mut payload: Vec<Sent> =
            self.system.iter().map(|&i| Sent::of_chat(&messages[i], Part::System)).collect();
        payload.extend(dynamic());
        for unit in &self.units {
            for (index, _, reduced) in &unit.messages {
                let mut sent = Sent::of_chat(&messages[*index], Part::History);
                if let Some(text) = reduced {
                    sent.content.clone_from(text);
                }
                payload.push(sent);
            }
        }
        payload
    }
}

/// Head and tail lines of `text` within about `limit` estimated tokens, with a marker line.
fn reduce(text: &str, limit: u32) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let half = limit.saturating_sub(8) / 2;
    let mut head = 0;
    let mut used = 0;
    while head < lines.len() {
        let cost = crate::api::estimate(lines[head]) + 1;
        if used + cost > half {
            break;
        }
        used += cost;
        head += 1;
    }
    let mut tail = lines.len();
    used = 0;
    while tail > head {
        let cost = crate::api::estimate(lines[tail - 1]) + 1;
        if used + cost > half {
            break;
        }
        used += cost;
        tail -= 1;
    }
    let mut out = lines[..head].join("\n");
    out.push_str(&format!(
        "\n{} ({} lines)\n",
        ctxwin_core::reduce::TRUNCATION_MARKER,
        tail - head
    ));
    out.push_str(&lines[tail..].join("\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_end_at_answers_and_at_the_last_result() {
        use ctxwin_std::ToolCall;
        let messages = vec![
            ChatMessage::text(Role::System, "s"),
            ChatMessage::text(Role::User, "u"),
            ChatMessage::assistant_calls(
                "",
                vec![ToolCall::new("a", "f", "{}"), ToolCall::new("b", "f", "{}")],
            ),
            ChatMessage::tool_result("a", "1"),
            ChatMessage::tool_result("b", "2"),
            ChatMessage::text(Role::Assistant, "done"),
        ];
        assert_eq!(turn_ends(&messages), [4, 5]);
        let payload = trim(&messages, 8_000);
        assert_eq!(payload.len(), 1 + DYNAMIC.len() + 5);
    }
}
