//! The one place the cache-cost and cold-trim benches touch the core's API: building
//! managers, pushing messages, composing, and reading a payload back as owned messages.
//!
//! Everything else in [`crate::cache`], [`crate::conv10k`] and the two benches works on
//! [`Sent`] messages and plain numbers, so porting these benches to a new core API means
//! editing this file only. Core items used: `ContextManager::<DefaultCapacities>::with_config`,
//! `ContextManager::builder().config(..).counter(..).build()`, `Config` (fields and `DEFAULT`),
//! `StrategyKind`, `OutboxMode::Discard`, `TokenCounter`, `Estimator::new`, `Message`
//! (`new`, `tool_result`, `with_tool_calls`, `at`), `ToolCall::new`, `push`,
//! `drain_outbox`, `compose`, `Payload::items`, `PayloadItem`, `MessageRef` (`role`,
//! `content`, `tool_calls`, `tool_call_id`), `MemorySummary::parts`, `Role`.

use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;
use ctxwin_core::{
    Config, ContextManager, DefaultCapacities, Error, Message, OutboxMode, PayloadItem, Role,
    StrategyKind, ToolCall,
};
use ctxwin_std::ChatMessage;

use crate::replay::MESSAGE_INTERVAL_MS;

/// A message as the provider receives it: role, content, tool calls (id, name, arguments)
/// and the id a tool result answers. Two `Sent` are the same message when all four are
/// byte-equal (the cache-prefix rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Role.
    pub role: Role,
    /// Content.
    pub content: String,
    /// Tool calls: id, name, arguments.
    pub calls: Vec<(String, String, String)>,
    /// The call a tool result answers.
    pub call_id: Option<String>,
    /// Which payload part it is (for reporting where a prefix broke).
    pub part: Part,
}

/// Which part of a payload a [`Sent`] message comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// System prompt or tool definition (pinned).
    System,
    /// Dynamic context, entities (system messages composed every turn).
    Dynamic,
    /// The `[Memory Summary]` message.
    Summary,
    /// A history message.
    History,
}

impl Sent {
    /// A `Sent` copy of a replayed session message.
    pub fn of_chat(message: &ChatMessage, part: Part) -> Sent {
        Sent {
            role: message.role,
            content: message.content.clone(),
            calls: message
                .tool_calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
                .collect(),
            call_id: message.tool_call_id.clone(),
            part,
        }
    }
}

/// Tokens the core adds per message (role and separators) in the benches' configurations.
pub const MESSAGE_OVERHEAD: u32 = Config::DEFAULT.message_overhead as u32;
/// Tokens the core adds once per request.
pub const REQUEST_OVERHEAD: u32 = Config::DEFAULT.request_overhead as u32;
/// Tokens the core adds per tool call besides its strings (`CALL_OVERHEAD` in the core).
pub const CALL_OVERHEAD: u32 = 3;

/// The default estimator's count of `text` (the counter the managers use).
pub fn estimate(text: &str) -> u32 {
    Estimator::new().count(text)
}

/// The benches' 8,000-token configuration (see [`crate::workload::turn_config`]) with
/// `strategy`.
pub fn config_8k(strategy: StrategyKind) -> Config {
    crate::workload::turn_config(strategy)
}

/// [`Config::DEFAULT`] with a 128,000-token payload budget (`context_window` 132,096 minus the
/// default 4,096 reply reserve) and `strategy`; every level budget at its default.
pub fn config_128k(strategy: StrategyKind) -> Config {
    Config {
        context_window: 128_000 + Config::DEFAULT.reserved_for_reply,
        strategy,
        ..Config::DEFAULT
    }
}

/// A manager as the benches measure it: default capacities, the default estimator, the
/// built-in strategies.
#[derive(Clone, Debug)]
pub struct Replayer {
    manager: Managed,
    clock: u64,
}

/// The manager of a [`Replayer`]: the core's default capacities, or a std `Session`'s.
#[derive(Clone, Debug)]
enum Managed {
    Default(Box<ContextManager<DefaultCapacities>>),
    Server(Box<ContextManager<ctxwin_std::session::ServerCapacities>>),
}

/// Runs `$body` with `$m` bound to the replayer's manager, whatever its capacities.
macro_rules! with_manager {
    ($self:expr, $m:ident => $body:expr) => {
        match &mut $self.manager {
            Managed::Default($m) => $body,
            Managed::Server($m) => $body,
        }
    };
}

/// Dynamic context composed into every payload (the benches' workload string).
pub const DYNAMIC: [&str; 1] = crate::workload::DYNAMIC;

impl Replayer {
    /// A manager with `config`.
    ///
    /// # Errors
    ///
    /// A configuration the core refuses.
    pub fn new(config: Config) -> Result<Replayer, ctxwin_core::ConfigError> {
        Ok(Replayer {
            manager: Managed::Default(Box::new(ContextManager::with_config(config)?)),
            clock: 1_700_000_000_000,
        })
    }

    /// A manager with `config` and the capacities of a std `Session`
    /// (`ctxwin_std::session::ServerCapacities`: a 1 MiB working ring), as a server runs a
    /// 128k window.
    ///
    /// # Errors
    ///
    /// A configuration the core refuses.
    pub fn server(config: Config) -> Result<Replayer, ctxwin_core::ConfigError> {
        Ok(Replayer {
            manager: Managed::Server(Box::new(ContextManager::with_config(config)?)),
            clock: 1_700_000_000_000,
        })
    }

    /// The payload budget.
    pub fn budget(&mut self) -> u32 {
        with_manager!(self, m => m.budget())
    }

    /// Gives the manager another configuration (a calibrated window).
    ///
    /// # Errors
    ///
    /// A configuration the core refuses.
    pub fn set_config(&mut self, config: Config) -> Result<(), ctxwin_core::ConfigError> {
        with_manager!(self, m => m.set_config(config))
    }

    /// Pushes one session message (stamped with the replay clock, advancing
    /// [`MESSAGE_INTERVAL_MS`]) and drains the outbox into a no-op archive.
    ///
    /// # Errors
    ///
    /// What the push returns.
    pub fn push(&mut self, message: &ChatMessage) -> Result<(), Error> {
        let calls: Vec<ToolCall<'_>> = message
            .tool_calls
            .iter()
            .map(|c| ToolCall::new(&c.id, &c.name, &c.arguments))
            .collect();
        let core = match &message.tool_call_id {
            Some(id) if message.role == Role::Tool => Message::tool_result(id, &message.content),
            _ => Message::new(message.role, &message.content).with_tool_calls(&calls),
        };
        let at = self.clock;
        self.clock += MESSAGE_INTERVAL_MS;
        with_manager!(self, m => {
            m.push(core.at(at))?;
            m.drain_outbox(|unit| {
                std::hint::black_box(unit.len());
            });
        });
        Ok(())
    }

    /// Composes the payload (with [`DYNAMIC`]) and returns its messages in request order
    /// (tool definitions left out: they go to `tools`, not `messages`) and the core's own count.
    ///
    /// # Errors
    ///
    /// What `compose` returns.
    pub fn compose(&mut self) -> Result<(Vec<Sent>, u32), Error> {
        with_manager!(self, m => Self::sent(m.compose(&DYNAMIC)?))
    }

    fn sent(payload: ctxwin_core::Payload<'_>) -> Result<(Vec<Sent>, u32), Error> {
        let mut out = Vec::new();
        for item in payload.items() {
            let (message, part) = match item {
                PayloadItem::System(m) => (m, Part::System),
                PayloadItem::Message(m) => (m, Part::History),
                PayloadItem::ToolDefinition(_) => continue,
                PayloadItem::Dynamic(text) => {
                    out.push(Sent::text(Role::System, text, Part::Dynamic));
                    continue;
                }
                PayloadItem::Entities(entities) => {
                    out.push(Sent::text(Role::System, &format!("{entities:?}"), Part::Dynamic));
                    continue;
                }
                PayloadItem::MemorySummary(summary) => {
                    let text: String = summary.parts().collect();
                    out.push(Sent::text(Role::System, &text, Part::Summary));
                    continue;
                }
            };
            out.push(Sent {
                role: message.role(),
                content: message.content().to_owned(),
                calls: message
                    .tool_calls()
                    .map(|c| (c.id.to_owned(), c.name.to_owned(), c.arguments.to_owned()))
                    .collect(),
                call_id: message.tool_call_id().map(str::to_owned),
                part,
            });
        }
        Ok((out, payload.tokens()))
    }
}

impl Sent {
    fn text(role: Role, content: &str, part: Part) -> Sent {
        Sent { role, content: content.to_owned(), calls: Vec::new(), call_id: None, part }
    }
}

/// The content-only `len / 4` counter the cold-trim comparison uses; with
/// [`cold_trim_config`]'s `message_overhead` of 4 a plain message costs `len // 4 + 4`, as
/// the LangChain side counts it.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuarterLen;

impl TokenCounter for QuarterLen {
    fn count(&self, text: &str) -> u32 {
        u32::try_from(text.len() / 4).unwrap_or(u32::MAX)
    }
}

/// A manager counting with [`QuarterLen`] (sliding window).
pub type QuarterManager = ContextManager<DefaultCapacities, QuarterLen>;

/// What `ctxwin trim --budget N` configures, for the [`QuarterLen`] counter: the whole budget
/// is the payload (no reply reserve), the permanent level gets exactly `pinned` tokens, the
/// history the rest, eviction from 100%; 4 tokens per message, none per request, evicted
/// units discarded; tool results over 1,000 tokens reduced to head and tail (the default,
/// as the CLI does).
pub fn cold_trim_config(budget: u32, pinned: u32) -> Config {
    Config {
        context_window: budget,
        reserved_for_reply: 0,
        permanent_budget: pinned,
        session_budget: 0,
        working_budget: budget - pinned,
        trigger_percent: 100,
        message_overhead: 4,
        request_overhead: 0,
        outbox: OutboxMode::Discard,
        strategy: StrategyKind::SlidingWindow,
        ..Config::DEFAULT
    }
}

/// Cold path as today, up to the compose: a fresh [`QuarterManager`] whose permanent level
/// gets exactly what the system message(s) cost, every message of `core` (the converted
/// `messages`) pushed.
///
/// # Errors
///
/// What the core refuses.
pub fn cold_manager(
    messages: &[ChatMessage],
    core: &[Message<'_>],
    budget: u32,
) -> Result<Box<QuarterManager>, Box<dyn std::error::Error>> {
    let pinned: u32 = messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| QuarterLen.count(&m.content) + 4)
        .sum();
    let mut manager = Box::new(
        ContextManager::<DefaultCapacities>::builder()
            .config(cold_trim_config(budget, pinned))
            .counter(QuarterLen)
            .build()?,
    );
    for message in core {
        manager.push(*message)?;
    }
    Ok(manager)
}

/// Composes the payload and returns how many messages it holds.
///
/// # Errors
///
/// What `compose` refuses.
pub fn compose_count(manager: &mut QuarterManager) -> Result<usize, Error> {
    Ok(manager.compose(&[])?.items().count())
}

/// Indices (into `messages`) of the messages the payload keeps, matched back to the input in
/// order (by role and content; a tool result by its call id, since it may be stored reduced).
///
/// # Errors
///
/// What `compose` refuses.
pub fn kept_indices(
    manager: &mut QuarterManager,
    messages: &[ChatMessage],
) -> Result<Vec<usize>, Error> {
    let payload = manager.compose(&[])?;
    let mut kept = Vec::new();
    let mut next = 0;
    for item in payload.items() {
        let (PayloadItem::System(m) | PayloadItem::Message(m)) = item else { continue };
        let same = |c: &ChatMessage| {
            c.role == m.role()
                && match m.tool_call_id() {
                    Some(id) => c.tool_call_id.as_deref() == Some(id),
                    None => c.content == m.content(),
                }
        };
        while next < messages.len() && !same(&messages[next]) {
            next += 1;
        }
        if next < messages.len() {
            kept.push(next);
            next += 1;
        }
    }
    Ok(kept)
}

/// [`QuarterLen`] for contents only: tool calls and result ids cost nothing, so with a
/// message overhead of 4 and no per-call overhead a message costs `len(content) // 4 + 4`,
/// LangChain's rule exactly (`TokenCounter::count_tool_call` / `count_call_id`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ContentQuarterLen;

impl TokenCounter for ContentQuarterLen {
    fn count(&self, text: &str) -> u32 {
        QuarterLen.count(text)
    }

    fn count_tool_call(&self, _: &ToolCall<'_>) -> u32 {
        0
    }

    fn count_call_id(&self, _: &str) -> u32 {
        0
    }
}

/// The core's cold `trim` (issue 15): kept indices of `messages` under `budget` with
/// [`ContentQuarterLen`] and no per-call overhead (LangChain's `len(content) // 4 + 4`), the
/// configuration `ctxwin trim` builds.
pub fn core_trim(
    _messages: &[ChatMessage],
    core: &[Message<'_>],
    budget: u32,
) -> Option<Vec<usize>> {
    let config = Config { tool_call_overhead: 0, ..cold_trim_config(budget, 0) };
    let kept = ctxwin_core::trim::trim(core, &[], &config, &ContentQuarterLen).ok()?;
    Some(kept.indices().collect())
}

/// [`core_trim`] without collecting: the payload's token count (what the timing measures:
/// the walk, plus one pass over the kept items as writing the payload would make).
pub fn core_trim_tokens(core: &[Message<'_>], budget: u32) -> Option<(u32, usize)> {
    let config = Config { tool_call_overhead: 0, ..cold_trim_config(budget, 0) };
    let kept = ctxwin_core::trim::trim(core, &[], &config, &ContentQuarterLen).ok()?;
    Some((kept.tokens(), kept.items().count()))
}

/// Σ default-estimator counts of every text a manager counts in `messages` (contents, tool
/// call ids, names, arguments, result ids): the estimator's own cost, timed apart.
pub fn estimate_all(messages: &[ChatMessage]) -> u64 {
    let estimator = Estimator::new();
    messages
        .iter()
        .map(|m| {
            let calls: u32 = m
                .tool_calls
                .iter()
                .map(|c| {
                    estimator.count(&c.id)
                        + estimator.count(&c.name)
                        + estimator.count(&c.arguments)
                })
                .sum();
            u64::from(
                estimator.count(&m.content)
                    + calls
                    + m.tool_call_id.as_deref().map_or(0, |i| estimator.count(i)),
            )
        })
        .sum()
}

/// Σ [`QuarterLen`] counts of the same texts (its cost is negligible; for symmetry).
pub fn quarter_all(messages: &[ChatMessage]) -> u64 {
    messages.iter().map(|m| u64::from(QuarterLen.count(&m.content))).sum()
}

/// Core messages of `messages` (borrowing `calls`, from [`crate::replay::tool_calls`]).
pub fn core_messages<'a>(
    messages: &'a [ChatMessage],
    calls: &'a [Vec<ToolCall<'a>>],
) -> Vec<Message<'a>> {
    crate::replay::core_messages(messages, calls, 0)
}
