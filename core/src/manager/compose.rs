//! Composing the payload under the budget.

use super::ContextManager;
use crate::capacity::Capacities;
use crate::counter::TokenCounter;
use crate::error::Error;
use crate::level::Level;
use crate::payload::Payload;
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
        let overhead = u32::from(self.config().message_overhead);
        let dynamic_tokens = dynamic.iter().fold(0u32, |sum, text| {
            sum.saturating_add(self.counter().count(text)).saturating_add(overhead)
        });
        self.refresh_entities();
        self.collect();
        self.make_space(dynamic_tokens)?;
        let mut tokens = self.used().saturating_add(dynamic_tokens);
        if tokens > 0 && self.used() == 0 {
            tokens = tokens.saturating_add(u32::from(self.config().request_overhead));
        }
        let this: &'a Self = self;
        Ok(Payload::new(
            this.messages(Level::Permanent),
            this.session(),
            this.history(),
            dynamic,
            this.entities(),
            tokens,
        ))
    }
}
