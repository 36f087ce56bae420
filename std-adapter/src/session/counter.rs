//! [`Counter`]: the token counter a session's manager uses, picked at run time.

use ctxwin_core::{counter::TokenCounter, estimator::Estimator};

use crate::tokens::CacheStats;
#[cfg(feature = "tokenizers")]
use crate::tokens::ExactCounter;

/// The token counter of a [`Session`](super::Session): the core's no-tokenizer estimator, or
/// an exact count with a real tokenizer. `Send + Sync`, so a session can move between
/// threads.
///
/// ```
/// use ctxwin_core::counter::TokenCounter;
/// use ctxwin_std::session::Counter;
/// use ctxwin_std::tokens::ExactCounter;
///
/// let estimated = Counter::default();
/// let exact = Counter::Exact(ExactCounter::cl100k()?);
/// assert_eq!(exact.count("hello world"), 2);
/// assert!(estimated.count("hello world") >= 2); // the estimator errs high
/// assert_eq!(exact.kind(), "exact");
/// # Ok::<(), ctxwin_std::tokens::TokenizerError>(())
/// ```
#[derive(Clone, Debug)]
pub enum Counter {
    /// The core's estimator (no tokenizer; about 8% mean error, with a safety margin).
    Estimator(Estimator),
    /// A Hugging Face tokenizer, with a per-text cache (cargo feature `tokenizers`).
    #[cfg(feature = "tokenizers")]
    Exact(ExactCounter),
}

impl Counter {
    /// `"estimator"` or `"exact"`.
    ///
    /// ```
    /// assert_eq!(ctxwin_std::session::Counter::default().kind(), "estimator");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Counter::Estimator(_) => "estimator",
            #[cfg(feature = "tokenizers")]
            Counter::Exact(_) => "exact",
        }
    }

    /// The exact counter's cache statistics; `None` for the estimator.
    ///
    /// ```
    /// assert!(ctxwin_std::session::Counter::default().cache_stats().is_none());
    /// ```
    pub fn cache_stats(&self) -> Option<CacheStats> {
        match self {
            Counter::Estimator(_) => None,
            #[cfg(feature = "tokenizers")]
            Counter::Exact(exact) => Some(exact.cache_stats()),
        }
    }
}

impl Default for Counter {
    fn default() -> Self {
        Counter::Estimator(Estimator::new())
    }
}

impl From<Estimator> for Counter {
    fn from(estimator: Estimator) -> Self {
        Counter::Estimator(estimator)
    }
}

#[cfg(feature = "tokenizers")]
impl From<ExactCounter> for Counter {
    fn from(exact: ExactCounter) -> Self {
        Counter::Exact(exact)
    }
}

impl TokenCounter for Counter {
    fn count(&self, text: &str) -> u32 {
        match self {
            Counter::Estimator(estimator) => estimator.count(text),
            #[cfg(feature = "tokenizers")]
            Counter::Exact(exact) => exact.count(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Counter>();
    }

    #[test]
    fn delegates_to_the_chosen_counter() {
        let estimator = Estimator::new();
        let text = "fn main() { println!(\"hi\"); }";
        assert_eq!(Counter::from(estimator).count(text), estimator.count(text));
        assert_eq!(Counter::default().count(""), 0);
    }
}
