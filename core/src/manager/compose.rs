//! Composing the payload under the budget.

use super::ContextManager;
use crate::capacity::Capacities;
use crate::config::DynamicPlacement;
use crate::counter::TokenCounter;
use crate::error::Error;
use crate::level::Level;
use crate::payload::Payload;
use crate::stats::{Counters, bump};
use crate::strategy::Strategy;

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Composes this turn's payload: system block, tool definitions, `dynamic` context (task
    /// goals, retrieved text: each sent as a system message), the memory summary, and the
    /// history, oldest to newest.
    ///
    /// Evicts history units to the outbox if `dynamic` needs their room. The payload's tokens
    /// never exceed the budget: when pinned content alone would, it returns
    /// [`Error::PinnedOverBudget`] and evicts nothing. While tool calls still wait for results
    /// it returns [`Error::ToolCallsPending`] (a provider would reject the payload).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Error, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::system("You are terse."))?;
    /// manager.push(Message::user("What changed?"))?;
    /// let dynamic = ["Retrieved: commit 3f2a renamed parse() to decode()"];
    /// let payload = manager.compose(&dynamic)?;
    /// assert!(payload.tokens() <= 28_672);
    /// assert_eq!(payload.items().count(), 3);
    ///
    /// let huge = "word ".repeat(40_000);
    /// let too_much = [huge.as_str()];
    /// assert!(matches!(manager.compose(&too_much), Err(Error::PinnedOverBudget { .. })));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn compose<'a>(&'a mut self, dynamic: &'a [&'a str]) -> Result<Payload<'a>, Error> {
        self.ensure_configured()?;
        if let Some(pending) = self.state().pending() {
            if pending.unanswered() > 0 {
                return Err(Error::ToolCallsPending { unanswered: pending.unanswered() });
            }
        }
        let dynamic_tokens =
            dynamic.iter().fold(0u32, |sum, text| sum.saturating_add(self.dynamic_tokens(text)));
        self.refresh_entities();
        self.collect();
        self.make_space(dynamic_tokens)?;
        let tokens = self.needed(dynamic_tokens);
        self.account_compose(dynamic, tokens, dynamic_tokens);
        let this: &'a Self = self;
        let placement = this.config().dynamic_placement;
        Ok(Payload::new(
            this.messages(Level::Permanent),
            this.session(),
            this.history(),
            dynamic,
            this.entities(),
            tokens,
        )
        .placed(placement, this.state().last_user_id))
    }

    /// Tokens `text` costs as one piece of a payload's dynamic context: its count plus the
    /// message framing (what [`compose`](Self::compose) charges for it).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// let manager = ContextManager::<TinyCapacities>::new();
    /// let framing = u32::from(manager.config().message_overhead);
    /// assert!(manager.dynamic_tokens("Retrieved: commit 3f2a") > framing);
    /// assert_eq!(manager.dynamic_tokens(""), framing);
    /// ```
    pub fn dynamic_tokens(&self, text: &str) -> u32 {
        self.counter().count(text).saturating_add(u32::from(self.config().message_overhead))
    }

    /// Tokens more dynamic context may cost in a payload composed with `dynamic`, without
    /// [`compose`](Self::compose) evicting anything for it: the budget less the live messages,
    /// `dynamic` and the request overhead. What a caller filling free room (retrieval) sizes
    /// its text by.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("What changed?"))?;
    /// let room = manager.dynamic_room(&["task: keep CI green"]);
    /// let block = "Retrieved: commit 3f2a renamed parse()";
    /// assert!(manager.dynamic_tokens(block) <= room);
    /// let tokens = manager.compose(&["task: keep CI green", block])?.tokens();
    /// assert_eq!(manager.outbox().count(), 0, "nothing was evicted for it");
    /// assert!(tokens <= manager.budget());
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn dynamic_room(&self, dynamic: &[&str]) -> u32 {
        let used = self.used();
        let dynamic_tokens =
            dynamic.iter().fold(0u32, |sum, text| sum.saturating_add(self.dynamic_tokens(text)));
        let mut spent = used.saturating_add(dynamic_tokens);
        if used == 0 {
            spent = spent.saturating_add(u32::from(self.config().request_overhead));
        }
        self.budget().saturating_sub(spent)
    }

    /// The cache accounting of one compose, in O(1) besides hashing `dynamic`: whether this
    /// payload begins with the whole previous one (nothing in it changed since, see
    /// [`Counters::prefix_changes`]), and how many of its tokens a provider's prompt cache
    /// could serve. Out of line: its history walk stays off the frame that builds the payload.
    #[inline(never)]
    fn account_compose(&mut self, dynamic: &[&str], tokens: u32, dynamic_tokens: u32) {
        // With the dynamic context before the newest user message, what the next payload can
        // reuse ends before it; what follows (the newest turn) is paid for again.
        let tail = match (self.config.dynamic_placement, dynamic.is_empty()) {
            (DynamicPlacement::BeforeNewestUser, false) => {
                let user = self.state.last_user_id.unwrap_or(u64::MAX);
                let after: u32 =
                    self.history().rev().take_while(|m| m.id() >= user).map(|m| m.tokens()).sum();
                Some(dynamic_tokens.saturating_add(after))
            }
            _ => None,
        };
        let digest = dynamic.iter().fold(0x811c_9dc5u32, |hash, text| {
            text.bytes()
                .chain([0xff])
                .fold(hash, |h, byte| (h ^ u32::from(byte)).wrapping_mul(0x0100_0193))
        });
        let permanent = self.level_tokens(Level::Permanent);
        let counters = &mut self.state.counters;
        let changes = counters.prefix_changes;
        let composed = changes & Counters::COMPOSED != 0;
        let same_dynamic = tail.is_some() || digest == counters.last_dynamic_digest;
        let extends = composed && changes & Counters::CHANGED == 0 && same_dynamic;
        let cached = if extends {
            counters.last_prefix_tokens
        } else if composed && changes & Counters::PERMANENT_CHANGED == 0 {
            permanent
        } else {
            0
        }
        .min(tokens);
        bump(&mut counters.composes, 1);
        bump(&mut counters.composes_extending, u64::from(extends));
        bump(&mut counters.prompt_tokens_cached, u64::from(cached));
        bump(&mut counters.prompt_tokens_new, u64::from(tokens - cached));
        counters.last_prefix_tokens = tokens.saturating_sub(tail.unwrap_or(0));
        counters.last_dynamic_digest = digest;
        counters.prefix_changes = Counters::COMPOSED;
    }
}
