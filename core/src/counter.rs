//! The token-counting seam: the core estimates, the std adapter can count exactly.

use crate::record::ToolCall;

/// Counts the tokens a piece of text costs in a model's prompt.
///
/// Contract:
/// - deterministic: the same `text` always gives the same count on every target;
/// - `count("")` is 0;
/// - cost is O(`text.len()`), without allocation;
/// - an estimate should err high, never low: the manager trusts it to keep a payload under the
///   provider's window.
///
/// What the manager passes, once per message at insert (the result is cached, never
/// recounted), so a peer can reproduce a message's cost exactly:
///
/// ```text
/// tokens(message) = count(content)
///                 + Σ over tool calls: count_tool_call(call) + Config::tool_call_overhead
///                 + count_call_id(tool_call_id)            (a tool result only)
///                 + Config::message_overhead               (role and separators)
/// payload         = Σ tokens(message) + Config::request_overhead (once, if the Σ is not 0)
/// ```
///
/// `count_tool_call` is by default `count(id) + count(name) + count(arguments)` and
/// `count_call_id` is `count(id)`: override them to count calls another way (e.g. 0 for a
/// content-only rule such as LangChain's `len(content) // 4 + 4`). A tool definition costs
/// `count(json) + message_overhead`; a summary `count(text) + message_overhead`.
///
/// Rounding: every piece is counted on its own and the counts are added, so a counter that
/// rounds down per call (`len / 4`) undercounts a concatenation by up to one token per piece
/// less than the whole; the manager only ever compares sums of the counts it made, never the
/// count of a concatenation, and observation reduction shrinks until the sum of its pieces'
/// counts fits its target (for any counter, rounding up or down).
///
/// ```
/// use ctxwin_core::counter::TokenCounter;
///
/// /// One token per four bytes, rounded up (a crude counter, for illustration).
/// struct QuarterBytes;
/// impl TokenCounter for QuarterBytes {
///     fn count(&self, text: &str) -> u32 {
///         u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
///     }
/// }
/// assert_eq!(QuarterBytes.count("hello world"), 3);
/// ```
pub trait TokenCounter {
    /// Tokens `text` costs (without per-message framing, which the manager adds).
    fn count(&self, text: &str) -> u32;

    /// Tokens one tool call's strings cost (without
    /// [`Config::tool_call_overhead`](crate::config::Config::tool_call_overhead)).
    fn count_tool_call(&self, call: &ToolCall<'_>) -> u32 {
        self.count(call.id)
            .saturating_add(self.count(call.name))
            .saturating_add(self.count(call.arguments))
    }

    /// Tokens the call id a tool result answers costs.
    fn count_call_id(&self, id: &str) -> u32 {
        self.count(id)
    }
}

impl<T: TokenCounter + ?Sized> TokenCounter for &T {
    fn count(&self, text: &str) -> u32 {
        (**self).count(text)
    }

    fn count_tool_call(&self, call: &ToolCall<'_>) -> u32 {
        (**self).count_tool_call(call)
    }

    fn count_call_id(&self, id: &str) -> u32 {
        (**self).count_call_id(id)
    }
}
