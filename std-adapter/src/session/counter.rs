//! [`Counter`]: the token counter a session's manager uses, picked at run time.

use std::sync::{Mutex, PoisonError};

use ctxwin_core::{counter::TokenCounter, estimator::Estimator};

use crate::format::fingerprint::raw_hash;
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
    /// The core's estimator (no tokenizer; about 8% mean error, with a safety margin), and
    /// the counts of the last long texts it counted.
    Estimator(Estimator, RecentCounts),
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
            Counter::Estimator(..) => "estimator",
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
            Counter::Estimator(..) => None,
            #[cfg(feature = "tokenizers")]
            Counter::Exact(exact) => Some(exact.cache_stats()),
        }
    }
}

impl Default for Counter {
    fn default() -> Self {
        Counter::Estimator(Estimator::new(), RecentCounts::default())
    }
}

impl From<Estimator> for Counter {
    fn from(estimator: Estimator) -> Self {
        Counter::Estimator(estimator, RecentCounts::default())
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
            Counter::Estimator(estimator, last) => last.count(text, |text| estimator.count(text)),
            #[cfg(feature = "tokenizers")]
            Counter::Exact(exact) => exact.count(text),
        }
    }
}

/// Texts this long or longer are remembered by [`RecentCounts`]: hashing a shorter one costs
/// about what counting it does.
pub(crate) const REMEMBERED_BYTES: usize = 1_024;

/// How many long texts' counts [`RecentCounts`] remembers: a request's new messages are all
/// checked before they are all pushed, and a coding agent's turn brings several tool outputs.
pub(crate) const REMEMBERED_TEXTS: usize = 8;

/// The counts of the last 8 texts of at least 1,024 bytes a counter
/// counted, by their length and hash: a session checks a request's messages (counting them)
/// before it pushes them (counting them again), and the estimator's pass over a 40 KB tool
/// output costs several times its hash.
///
/// ```
/// use ctxwin_core::counter::TokenCounter;
/// use ctxwin_std::session::Counter;
/// let counter = Counter::default();
/// let long = "fn main() {}\n".repeat(200);
/// assert_eq!(counter.count(&long), counter.count(&long));
/// assert!(counter.count(&long[..1_300]) < counter.count(&long));
/// ```
#[derive(Debug, Default)]
pub struct RecentCounts(Box<Mutex<Recent>>);

/// Remembered (length, hash, tokens), and the slot the next count takes.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    counts: [(usize, u64, u32); REMEMBERED_TEXTS],
    next: usize,
}

impl Clone for RecentCounts {
    fn clone(&self) -> Self {
        Self(Box::new(Mutex::new(*self.0.lock().unwrap_or_else(PoisonError::into_inner))))
    }
}

impl RecentCounts {
    /// `text`'s count: the remembered one when `text` is one of the last long texts counted,
    /// else `count`'s (remembered when `text` is long, in place of the oldest).
    fn count(&self, text: &str, count: impl FnOnce(&str) -> u32) -> u32 {
        if text.len() < REMEMBERED_BYTES {
            return count(text);
        }
        let (len, hash) = (text.len(), raw_hash(text.as_bytes()));
        let recent = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&(_, _, tokens)) =
            recent.counts.iter().find(|&&(was_len, was_hash, _)| (was_len, was_hash) == (len, hash))
        {
            return tokens;
        }
        let tokens = count(text);
        let mut recent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = recent.next;
        if let Some(remembered) = recent.counts.get_mut(slot) {
            *remembered = (len, hash, tokens);
        }
        recent.next = (slot + 1) % REMEMBERED_TEXTS;
        tokens
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
    fn a_long_text_is_counted_once_and_another_of_its_length_again() {
        let estimator = Estimator::new();
        let counter = Counter::from(estimator);
        let (a, b) = ("a".repeat(2_000), "b ".repeat(1_000));
        assert_eq!(counter.count(&a), estimator.count(&a));
        assert_eq!(counter.count(&a), estimator.count(&a));
        assert_eq!(counter.count(&b), estimator.count(&b), "same length, other text");
        assert_ne!(estimator.count(&a), estimator.count(&b));
        let recent = RecentCounts::default();
        let mut counted = Vec::new();
        for text in [&a, &a, &b, &a, &a[..500], &a[..500]] {
            recent.count(text, |t| {
                counted.push(t.len());
                estimator.count(t)
            });
        }
        assert_eq!(counted, [2_000, 2_000, 500, 500], "once per long text, short ones always");
    }

    #[test]
    fn the_last_eight_long_texts_are_remembered_and_the_oldest_forgotten() {
        let estimator = Estimator::new();
        let recent = RecentCounts::default();
        let texts: Vec<String> =
            (0..=REMEMBERED_TEXTS).map(|n| format!("{n} ").repeat(REMEMBERED_BYTES)).collect();
        let mut counted = Vec::new();
        let mut count = |n: usize| {
            let tokens = recent.count(&texts[n], |t| {
                counted.push(n);
                estimator.count(t)
            });
            assert_eq!(tokens, estimator.count(&texts[n]));
        };
        // Checked, then pushed: eight texts counted once.
        (0..REMEMBERED_TEXTS).chain(0..REMEMBERED_TEXTS).for_each(&mut count);
        // A ninth takes the oldest's place.
        count(REMEMBERED_TEXTS);
        count(0);
        count(REMEMBERED_TEXTS - 1);
        assert_eq!(counted, (0..=REMEMBERED_TEXTS).chain([0]).collect::<Vec<_>>());
    }

    #[test]
    fn delegates_to_the_chosen_counter() {
        let estimator = Estimator::new();
        let text = "fn main() { println!(\"hi\"); }";
        assert_eq!(Counter::from(estimator).count(text), estimator.count(text));
        assert_eq!(Counter::default().count(""), 0);
    }
}
