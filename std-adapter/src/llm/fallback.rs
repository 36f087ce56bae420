//! Why an LLM answer was not used, counted by reason, and how long the calls took.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::LlmError;

/// Why the deterministic fallback (the core's extractive summarizer or pattern extractor) ran
/// instead of the model. Every failure maps to one reason, so fallbacks can be counted.
///
/// ```
/// use ctxwin_std::llm::{FallbackReason, LlmError};
/// assert_eq!(FallbackReason::of(&LlmError::EmptyAnswer), FallbackReason::EmptyAnswer);
/// assert_eq!(FallbackReason::ServerDown.to_string(), "server_down");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackReason {
    /// No connection could be made ([`LlmError::Unreachable`]).
    ServerDown,
    /// Every attempt ran past its time limit ([`LlmError::Timeout`]).
    Timeout,
    /// An HTTP error status or a rate limit ([`LlmError::Http`], [`LlmError::RateLimited`]).
    HttpError,
    /// A body that is not a chat-completions response ([`LlmError::Malformed`]).
    BadResponse,
    /// An answer without text ([`LlmError::EmptyAnswer`]).
    EmptyAnswer,
    /// An answer longer than what it summarizes, cut at the token limit, or over the
    /// summary's token budget ([`LlmError::NotShorter`], [`LlmError::Truncated`]).
    TooLong,
    /// A refusal, the instructions echoed, the last message repeated, a loop
    /// ([`LlmError::NotASummary`]).
    NotASummary,
    /// An extraction answer that is not a JSON object of declared keys and text values
    /// ([`LlmError::NotJson`], [`LlmError::UndeclaredKey`], [`LlmError::BadValue`]).
    BadExtraction,
    /// The background worker thread is gone (it panicked or could not start).
    WorkerGone,
    /// Anything else (a misconfigured client, nothing to summarize).
    Other,
}

impl FallbackReason {
    /// Every reason, in the order [`FallbackCounts`] lists them.
    pub const ALL: [FallbackReason; 10] = [
        FallbackReason::ServerDown,
        FallbackReason::Timeout,
        FallbackReason::HttpError,
        FallbackReason::BadResponse,
        FallbackReason::EmptyAnswer,
        FallbackReason::TooLong,
        FallbackReason::NotASummary,
        FallbackReason::BadExtraction,
        FallbackReason::WorkerGone,
        FallbackReason::Other,
    ];

    /// The reason for `error`.
    ///
    /// ```
    /// use ctxwin_std::llm::{FallbackReason, LlmError};
    /// let error = LlmError::NotShorter { summary_tokens: 90, input_tokens: 80 };
    /// assert_eq!(FallbackReason::of(&error), FallbackReason::TooLong);
    /// ```
    pub fn of(error: &LlmError) -> FallbackReason {
        match error {
            LlmError::Unreachable { .. } => FallbackReason::ServerDown,
            LlmError::Timeout { .. } => FallbackReason::Timeout,
            LlmError::Http { .. } | LlmError::RateLimited { .. } => FallbackReason::HttpError,
            LlmError::Malformed(_) => FallbackReason::BadResponse,
            LlmError::EmptyAnswer => FallbackReason::EmptyAnswer,
            LlmError::Truncated { .. } | LlmError::NotShorter { .. } => FallbackReason::TooLong,
            LlmError::NotASummary(_) => FallbackReason::NotASummary,
            LlmError::NotJson(_) | LlmError::UndeclaredKey(_) | LlmError::BadValue { .. } => {
                FallbackReason::BadExtraction
            }
            _ => FallbackReason::Other,
        }
    }

    /// Snake-case name, as in JSON stats.
    pub const fn as_str(self) -> &'static str {
        match self {
            FallbackReason::ServerDown => "server_down",
            FallbackReason::Timeout => "timeout",
            FallbackReason::HttpError => "http_error",
            FallbackReason::BadResponse => "bad_response",
            FallbackReason::EmptyAnswer => "empty_answer",
            FallbackReason::TooLong => "too_long",
            FallbackReason::NotASummary => "not_a_summary",
            FallbackReason::BadExtraction => "bad_extraction",
            FallbackReason::WorkerGone => "worker_gone",
            FallbackReason::Other => "other",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fallbacks counted by [`FallbackReason`].
///
/// ```
/// use ctxwin_std::llm::{FallbackCounts, FallbackReason};
/// let mut counts = FallbackCounts::default();
/// counts.add(FallbackReason::ServerDown);
/// counts.add(FallbackReason::ServerDown);
/// counts.add(FallbackReason::EmptyAnswer);
/// assert_eq!((counts.server_down, counts.total()), (2, 3));
/// assert_eq!(counts.to_string(), "server_down 2, empty_answer 1");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FallbackCounts {
    /// [`FallbackReason::ServerDown`].
    pub server_down: u64,
    /// [`FallbackReason::Timeout`].
    pub timeout: u64,
    /// [`FallbackReason::HttpError`].
    pub http_error: u64,
    /// [`FallbackReason::BadResponse`].
    pub bad_response: u64,
    /// [`FallbackReason::EmptyAnswer`].
    pub empty_answer: u64,
    /// [`FallbackReason::TooLong`].
    pub too_long: u64,
    /// [`FallbackReason::NotASummary`].
    pub not_a_summary: u64,
    /// [`FallbackReason::BadExtraction`].
    pub bad_extraction: u64,
    /// [`FallbackReason::WorkerGone`].
    pub worker_gone: u64,
    /// [`FallbackReason::Other`].
    pub other: u64,
}

impl FallbackCounts {
    fn slot(&mut self, reason: FallbackReason) -> &mut u64 {
        match reason {
            FallbackReason::ServerDown => &mut self.server_down,
            FallbackReason::Timeout => &mut self.timeout,
            FallbackReason::HttpError => &mut self.http_error,
            FallbackReason::BadResponse => &mut self.bad_response,
            FallbackReason::EmptyAnswer => &mut self.empty_answer,
            FallbackReason::TooLong => &mut self.too_long,
            FallbackReason::NotASummary => &mut self.not_a_summary,
            FallbackReason::BadExtraction => &mut self.bad_extraction,
            FallbackReason::WorkerGone => &mut self.worker_gone,
            FallbackReason::Other => &mut self.other,
        }
    }

    /// Counts one fallback for `reason`.
    pub fn add(&mut self, reason: FallbackReason) {
        let slot = self.slot(reason);
        *slot = slot.saturating_add(1);
    }

    /// Fallbacks counted for `reason`.
    ///
    /// ```
    /// use ctxwin_std::llm::{FallbackCounts, FallbackReason};
    /// assert_eq!(FallbackCounts::default().get(FallbackReason::Timeout), 0);
    /// ```
    pub fn get(&self, reason: FallbackReason) -> u64 {
        let mut copy = *self;
        *copy.slot(reason)
    }

    /// Fallbacks of every reason.
    pub fn total(&self) -> u64 {
        FallbackReason::ALL.iter().map(|&reason| self.get(reason)).sum()
    }
}

impl fmt::Display for FallbackCounts {
    /// The non-zero counts, `reason n` joined by commas (`none` when all are zero).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for reason in FallbackReason::ALL {
            let count = self.get(reason);
            if count > 0 {
                write!(f, "{}{reason} {count}", if first { "" } else { ", " })?;
                first = false;
            }
        }
        if first { f.write_str("none") } else { Ok(()) }
    }
}

/// What a blocking model seam ([`LlmSummarizer`](super::LlmSummarizer),
/// [`LlmExtractor`](super::LlmExtractor)) did: answers used, fallbacks by reason, call
/// durations.
///
/// ```
/// use ctxwin_std::llm::CallTally;
/// let tally = CallTally::default();
/// assert_eq!((tally.accepted(), tally.fallbacks().total(), tally.latencies().count()), (0, 0, 0));
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallTally {
    accepted: u64,
    fallbacks: FallbackCounts,
    latencies: Latencies,
}

impl CallTally {
    /// Answers the model gave that were used.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Calls the fallback answered, by why the model's answer was not used.
    pub fn fallbacks(&self) -> &FallbackCounts {
        &self.fallbacks
    }

    /// Durations of the calls to the server (failed ones included).
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    pub(super) fn accept(&mut self) {
        self.accepted = self.accepted.saturating_add(1);
    }

    pub(super) fn fall_back(&mut self, reason: FallbackReason) {
        self.fallbacks.add(reason);
    }

    pub(super) fn record(&mut self, took: Duration) {
        self.latencies.record(took);
    }
}

/// Durations of LLM calls: the newest [`Latencies::KEPT`] of them, for a median, percentiles
/// and a maximum.
///
/// ```
/// use std::time::Duration;
/// use ctxwin_std::llm::Latencies;
/// let mut latencies = Latencies::default();
/// assert_eq!(latencies.median(), None);
/// for ms in [30, 10, 20] {
///     latencies.record(Duration::from_millis(ms));
/// }
/// assert_eq!(latencies.median(), Some(Duration::from_millis(20)));
/// assert_eq!(latencies.max(), Some(Duration::from_millis(30)));
/// assert_eq!(latencies.percentile(90), Some(Duration::from_millis(30)));
/// assert_eq!(latencies.count(), 3);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Latencies {
    recent: std::collections::VecDeque<Duration>,
    count: u64,
}

impl Latencies {
    /// Durations kept.
    pub const KEPT: usize = 1024;

    /// Adds one call's duration.
    pub fn record(&mut self, elapsed: Duration) {
        if self.recent.len() == Self::KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(elapsed);
        self.count = self.count.saturating_add(1);
    }

    /// Calls recorded (all of them, not only those kept).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The median of the kept durations (the upper one of an even count).
    pub fn median(&self) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }

    /// The `percent`th percentile of the kept durations (nearest rank: the smallest duration
    /// at least `percent`% of them do not exceed; `percent` above 100 counts as 100).
    pub fn percentile(&self, percent: u8) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let rank = (sorted.len() * usize::from(percent.min(100))).div_ceil(100);
        sorted.get(rank.saturating_sub(1)).copied()
    }

    /// The longest kept duration.
    pub fn max(&self) -> Option<Duration> {
        self.recent.iter().copied().max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_reason() {
        let cases = [
            (
                LlmError::Unreachable { url: "u".into(), attempts: 1, reason: "r".into() },
                FallbackReason::ServerDown,
            ),
            (
                LlmError::Timeout { url: "u".into(), attempts: 2, limit: Duration::from_secs(1) },
                FallbackReason::Timeout,
            ),
            (
                LlmError::Http { status: 500, body: String::new(), attempts: 3, hint: "" },
                FallbackReason::HttpError,
            ),
            (LlmError::Malformed("x".into()), FallbackReason::BadResponse),
            (LlmError::Truncated { max_tokens: 5 }, FallbackReason::TooLong),
            (LlmError::NotASummary("refusal"), FallbackReason::NotASummary),
            (LlmError::UndeclaredKey("k".into()), FallbackReason::BadExtraction),
            (LlmError::NotJson("x".into()), FallbackReason::BadExtraction),
            (LlmError::NothingToSummarize, FallbackReason::Other),
        ];
        for (error, reason) in cases {
            assert_eq!(FallbackReason::of(&error), reason, "{error}");
        }
    }

    #[test]
    fn counts_add_up_and_serialize_by_name() {
        let mut counts = FallbackCounts::default();
        for reason in FallbackReason::ALL {
            counts.add(reason);
            assert_eq!(counts.get(reason), 1, "{reason}");
        }
        assert_eq!(counts.total(), FallbackReason::ALL.len() as u64);
        let json = serde_json::to_value(counts).unwrap();
        for reason in FallbackReason::ALL {
            assert_eq!(json[reason.as_str()], 1, "{reason}");
        }
        assert_eq!(FallbackCounts::default().to_string(), "none");
    }

    #[test]
    fn latencies_keep_the_newest() {
        let mut latencies = Latencies::default();
        for ms in 0..(Latencies::KEPT as u64 + 10) {
            latencies.record(Duration::from_millis(ms));
        }
        assert_eq!(latencies.count(), Latencies::KEPT as u64 + 10);
        assert_eq!(latencies.max(), Some(Duration::from_millis(Latencies::KEPT as u64 + 9)));
        assert_eq!(
            latencies.median(),
            Some(Duration::from_millis(10 + Latencies::KEPT as u64 / 2))
        );
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut latencies = Latencies::default();
        assert_eq!(latencies.percentile(90), None);
        for ms in (1..=10).rev() {
            latencies.record(Duration::from_millis(ms * 100));
        }
        let ms = |p| latencies.percentile(p).map(|d| d.as_millis());
        assert_eq!(
            (ms(0), ms(10), ms(50), ms(90), ms(91), ms(100)),
            (Some(100), Some(100), Some(500), Some(900), Some(1000), Some(1000))
        );
        assert_eq!(ms(250), Some(1000));
    }
}
