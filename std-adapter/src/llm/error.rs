//! What can go wrong when asking the model, and what to do about it.

use std::time::Duration;

/// Every failure of [`LlmClient`](super::LlmClient) calls, each message saying what to do.
///
/// Two families matter to callers:
///
/// - **Transport** errors ([`Unreachable`](Self::Unreachable), [`Timeout`](Self::Timeout),
///   [`Http`](Self::Http), [`RateLimited`](Self::RateLimited), [`Malformed`](Self::Malformed)):
///   the request did not produce an answer, after the configured retries.
/// - **Rejected answers** ([`is_rejected_answer`](Self::is_rejected_answer)): the server
///   answered, but the text is not usable (empty, cut off, not shorter than its input, not a
///   summary, not the JSON asked for). With small models these are normal; the caller falls
///   back (keep the previous summary, truncate instead of summarizing, keep the old facts).
///
/// ```
/// use ctxwin_std::llm::LlmError;
/// let err = LlmError::EmptyAnswer;
/// assert!(err.is_rejected_answer());
/// assert!(err.to_string().contains("fall back"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The client or the call was set up wrongly (bad base URL, missing API key variable,
    /// empty extraction schema).
    #[error("LLM client misconfigured: {0}")]
    Config(String),
    /// [`summarize`](super::LlmClient::summarize) was given no messages.
    #[error("nothing to summarize: pass at least one message")]
    NothingToSummarize,
    /// No connection could be made (refused, DNS failure, reset) on any attempt.
    #[error(
        "LLM server {url} is unreachable after {attempts} attempt(s): {reason}; check that the \
         server runs and that the base URL (scheme, host, port) is right"
    )]
    Unreachable {
        /// The URL requested.
        url: String,
        /// Attempts made, retries included.
        attempts: u32,
        /// The last transport error.
        reason: String,
    },
    /// Every attempt ran past the configured time limit.
    #[error(
        "LLM request to {url} timed out after {attempts} attempt(s) ({limit:?} limit each); \
         raise the timeout, shorten the input or check the server's load"
    )]
    Timeout {
        /// The URL requested.
        url: String,
        /// Attempts made, retries included.
        attempts: u32,
        /// The per-attempt time limit.
        limit: Duration,
    },
    /// The server answered with an error status that retrying did not fix (or that is never
    /// retried: 4xx other than 408 and 429).
    #[error("LLM server answered HTTP {status} after {attempts} attempt(s): {hint}; body: {body}")]
    Http {
        /// HTTP status code.
        status: u16,
        /// The start of the response body (at most 300 characters).
        body: String,
        /// Attempts made, retries included.
        attempts: u32,
        /// What to check for this status.
        hint: &'static str,
    },
    /// The server rate-limits and asks to wait longer than the client's retry cap allows.
    #[error(
        "LLM server is busy or rate-limiting and asks to retry after {retry_after:?}, more than the \
         {cap:?} the client may wait; retry later or raise retry_after_cap"
    )]
    RateLimited {
        /// What `Retry-After` asked for.
        retry_after: Duration,
        /// The longest wait the client allows between attempts.
        cap: Duration,
    },
    /// The response is not the JSON shape the API defines.
    #[error(
        "LLM server sent a malformed response ({0}); check that the base URL points at an \
         OpenAI-compatible /v1/chat/completions endpoint"
    )]
    Malformed(String),
    /// The answer has no text, or only whitespace.
    #[error("the model gave an empty answer; fall back (keep what you had) or try another model")]
    EmptyAnswer,
    /// The answer stopped at the token limit (`finish_reason: "length"`) where a complete
    /// answer is required.
    #[error(
        "the model's answer was cut at the {max_tokens}-token limit; raise the limit or fall \
         back"
    )]
    Truncated {
        /// The `max_tokens` the request allowed.
        max_tokens: u32,
    },
    /// The summary is not shorter than the text it summarizes.
    #[error(
        "the summary ({summary_tokens} tokens) is not shorter than its input ({input_tokens} \
         tokens); fall back to truncation"
    )]
    NotShorter {
        /// Estimated tokens of the summary.
        summary_tokens: u32,
        /// Estimated tokens of the input it summarizes.
        input_tokens: u32,
    },
    /// The answer is not a summary: a refusal, the instructions echoed back, or a copy of
    /// the last message.
    #[error("the model's answer is not a summary ({0}); fall back to truncation")]
    NotASummary(&'static str),
    /// No JSON object could be read from the extraction answer.
    #[error("the model did not answer with a JSON object ({0}); fall back (keep the old values)")]
    NotJson(String),
    /// The extraction answer names a key the schema does not declare.
    #[error("the model's answer names the undeclared key {0:?}; fall back (keep the old values)")]
    UndeclaredKey(String),
    /// The extraction answer gives a declared key a value that is neither a string, a number,
    /// a boolean nor null.
    #[error(
        "the model gave key {key:?} a {found} value, not a string or null; fall back (keep the \
         old values)"
    )]
    BadValue {
        /// The key.
        key: String,
        /// The JSON type found (`"array"` or `"object"`).
        found: &'static str,
    },
}

impl LlmError {
    /// True for answers the server gave but that are unusable; the caller is expected to
    /// fall back rather than report a failure.
    ///
    /// ```
    /// use ctxwin_std::llm::LlmError;
    /// assert!(LlmError::NotASummary("refusal").is_rejected_answer());
    /// assert!(!LlmError::Malformed("no choices".into()).is_rejected_answer());
    /// ```
    pub fn is_rejected_answer(&self) -> bool {
        matches!(
            self,
            Self::EmptyAnswer
                | Self::Truncated { .. }
                | Self::NotShorter { .. }
                | Self::NotASummary(_)
                | Self::NotJson(_)
                | Self::UndeclaredKey(_)
                | Self::BadValue { .. }
        )
    }

    /// True when trying again later may succeed: the server was unreachable, slow, busy or
    /// rate-limiting.
    ///
    /// ```
    /// use ctxwin_std::llm::LlmError;
    /// let busy = LlmError::RateLimited {
    ///     retry_after: std::time::Duration::from_secs(120),
    ///     cap: std::time::Duration::from_secs(30),
    /// };
    /// assert!(busy.is_transient());
    /// assert!(!LlmError::EmptyAnswer.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::RateLimited { .. } => true,
            Self::Http { status, .. } => is_retryable_status(*status),
            _ => false,
        }
    }
}

/// Statuses worth another attempt: request timeout, rate limit and server errors.
pub(crate) fn is_retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

/// What to check for an HTTP error status.
pub(crate) fn status_hint(status: u16) -> &'static str {
    match status {
        400 => {
            "the server rejected the request; the prompt may exceed the model's context \
             (lower the input token budget) or a parameter is unsupported (try \
             json_mode(false))"
        }
        401 | 403 => "check the API key (LlmClientBuilder::api_key or api_key_env)",
        404 => "check the base URL and the model name",
        408 | 504 => "the server timed out; retry later or shorten the input",
        413 => "the request is too large; lower the input token budget",
        429 => "rate limited; retry later",
        500..=599 => "the server failed; retry later or check its logs",
        _ => "check the request and the server's documentation",
    }
}

/// The first `max_chars` characters of `body`, on one line, for error messages.
pub(crate) fn excerpt(body: &str, max_chars: usize) -> String {
    let flat: String = body
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max_chars.saturating_add(1))
        .collect();
    if flat.chars().count() > max_chars {
        let mut cut: String = flat.chars().take(max_chars).collect();
        cut.push('…');
        cut
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_statuses_are_408_429_and_5xx() {
        for status in [408, 429, 500, 502, 503, 599] {
            assert!(is_retryable_status(status), "{status}");
        }
        for status in [200, 400, 401, 403, 404, 413, 422, 600] {
            assert!(!is_retryable_status(status), "{status}");
        }
    }

    #[test]
    fn excerpt_cuts_and_flattens() {
        assert_eq!(excerpt("a\nb", 10), "a b");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("ééé", 3), "ééé");
    }

    #[test]
    fn every_message_says_what_to_do() {
        let errors = [
            LlmError::EmptyAnswer,
            LlmError::Truncated { max_tokens: 5 },
            LlmError::NotShorter { summary_tokens: 9, input_tokens: 3 },
            LlmError::NotASummary("refusal"),
            LlmError::NotJson("no object".into()),
            LlmError::UndeclaredKey("x".into()),
            LlmError::Malformed("no choices".into()),
        ];
        for err in errors {
            let text = err.to_string();
            assert!(
                text.contains("fall back") || text.contains("check") || text.contains("raise"),
                "{text}"
            );
        }
    }
}
