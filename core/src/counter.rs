//! The token-counting seam: the core estimates, the std adapter can count exactly.

/// Counts the tokens a piece of text costs in a model's prompt.
///
/// Contract:
/// - deterministic: the same `text` always gives the same count on every target;
/// - `count("")` is 0;
/// - cost is O(`text.len()`), without allocation;
/// - an estimate should err high, never low: the manager trusts it to keep a payload under the
///   provider's window.
///
/// The manager calls it once per message at insert and caches the result; it never recounts.
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
}

impl<T: TokenCounter + ?Sized> TokenCounter for &T {
    fn count(&self, text: &str) -> u32 {
        (**self).count(text)
    }
}
