//! The blocking HTTP client: configuration, one chat completion, retries.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{excerpt, is_retryable_status, status_hint};
use super::retry::{Backoff, request_id};
use super::transport::{Attempt, Transport};
use super::wire::{ChatRequest, ChatResponse, Endpoints, ResponseFormat, WireMessage};
use super::{LlmError, estimate_tokens};

/// The client's token-counting closure: tokens of a text; set with
/// [`LlmClientBuilder::token_counter`](super::LlmClientBuilder::token_counter).
///
/// A shared closure, not the core's [`TokenCounter`](ctxwin_core::counter::TokenCounter) trait (which
/// also reports its name and overhead): the client only needs a count to cut its input.
///
/// ```
/// use ctxwin_std::llm::TokenCountFn;
/// let words: TokenCountFn = std::sync::Arc::new(|text: &str| text.split_whitespace().count() as u32);
/// assert_eq!(words("two words"), 2);
/// ```
pub type TokenCountFn = Arc<dyn Fn(&str) -> u32 + Send + Sync>;

/// A blocking client for an OpenAI-compatible chat-completions server; cheap to clone, safe
/// to share between threads. Build it with [`LlmClientBuilder`](super::LlmClientBuilder).
///
/// Besides [`complete`](Self::complete) it offers [`summarize`](Self::summarize),
/// [`extract`](Self::extract) and [`tokenize`](Self::tokenize).
///
/// Its calls block, and its connections live on a thread of their own (`reqwest`'s blocking
/// client): build, call and drop it on ordinary threads, not on an async runtime's workers
/// (wrap it in `spawn_blocking` there).
#[derive(Clone)]
pub struct LlmClient {
    pub(super) transport: Transport,
    pub(super) endpoints: Endpoints,
    pub(super) model: Option<String>,
    pub(super) authorization: Option<String>,
    pub(super) timeout: Duration,
    pub(super) max_retries: u32,
    pub(super) backoff: Backoff,
    pub(super) retry_after_cap: Duration,
    pub(super) temperature: f32,
    pub(super) frequency_penalty: Option<f32>,
    pub(super) input_token_budget: u32,
    pub(super) extract_max_tokens: u32,
    pub(super) keep_truncated_summaries: bool,
    pub(super) json_mode: bool,
    pub(super) counter: Option<TokenCountFn>,
}

impl fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmClient")
            .field("base_url", &self.endpoints.root)
            .field("model", &self.model)
            .field("authorization", &self.authorization.as_ref().map(|_| "Bearer ***"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}

/// Token usage the server reported for one completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlmUsage {
    /// Tokens of the prompt.
    pub prompt_tokens: u32,
    /// Tokens of the answer.
    pub completion_tokens: u32,
}

/// One chat completion's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// `choices[0].message.content`, never empty or only whitespace.
    pub text: String,
    /// `choices[0].finish_reason` (`"stop"`, `"length"`, …).
    pub finish_reason: Option<String>,
    /// Token usage, when the server reported both counts.
    pub usage: Option<LlmUsage>,
    /// Wall time of the call, retries and waits included.
    pub latency: Duration,
    /// Attempts made (1 without retries).
    pub attempts: u32,
}

impl Completion {
    /// True when the answer stopped at the `max_tokens` limit.
    ///
    /// ```
    /// let c = ctxwin_std::llm::Completion {
    ///     text: "The user".into(),
    ///     finish_reason: Some("length".into()),
    ///     usage: None,
    ///     latency: std::time::Duration::ZERO,
    ///     attempts: 1,
    /// };
    /// assert!(c.was_truncated());
    /// ```
    pub fn was_truncated(&self) -> bool {
        self.finish_reason.as_deref() == Some("length")
    }
}

/// A successful HTTP exchange after retries.
pub(super) struct Exchange {
    pub(super) body: String,
    pub(super) latency: Duration,
    pub(super) attempts: u32,
    pub(super) request_id: String,
}

impl LlmClient {
    /// The server root the client talks to (without `/v1`).
    ///
    /// ```
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089/v1/").build()?;
    /// assert_eq!(client.base_url(), "http://127.0.0.1:8089");
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn base_url(&self) -> &str {
        &self.endpoints.root
    }

    /// Tokens of `text` by the configured counter ([`estimate_tokens`] by default).
    ///
    /// ```
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").build()?;
    /// assert_eq!(client.count_tokens("abcdef"), 2);
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn count_tokens(&self, text: &str) -> u32 {
        match &self.counter {
            Some(counter) => counter(text),
            None => estimate_tokens(text),
        }
    }

    /// Sends a system and a user message to `POST {base}/v1/chat/completions` and returns the
    /// first choice, retrying transient failures.
    ///
    /// # Errors
    ///
    /// Transport errors ([`LlmError::Unreachable`], [`LlmError::Timeout`], [`LlmError::Http`],
    /// [`LlmError::RateLimited`]), [`LlmError::Malformed`] for a body that is not a
    /// chat-completions response, [`LlmError::EmptyAnswer`] for an answer without text. An
    /// answer cut at `max_tokens` is returned (see [`Completion::was_truncated`]).
    ///
    /// ```no_run
    /// let client = ctxwin_std::llm::LlmClientBuilder::new("http://127.0.0.1:8089").build()?;
    /// let answer = client.complete("Answer in one word.", "Capital of France?", 8)?;
    /// println!("{} ({:?})", answer.text, answer.latency);
    /// # Ok::<(), ctxwin_std::llm::LlmError>(())
    /// ```
    pub fn complete(
        &self,
        system: &str,
        user: &str,
        max_tokens: u32,
    ) -> Result<Completion, LlmError> {
        self.chat(system, user, max_tokens, None)
    }

    /// [`complete`](Self::complete), constraining the answer to `format` when given.
    pub(super) fn chat(
        &self,
        system: &str,
        user: &str,
        max_tokens: u32,
        format: Option<ResponseFormat>,
    ) -> Result<Completion, LlmError> {
        let request = ChatRequest {
            model: self.model.as_deref(),
            messages: [
                WireMessage { role: "system", content: system },
                WireMessage { role: "user", content: user },
            ],
            max_tokens: max_tokens.max(1),
            temperature: self.temperature,
            frequency_penalty: self.frequency_penalty,
            response_format: format,
            stream: false,
        };
        let body = serde_json::to_string(&request)
            .map_err(|err| LlmError::Malformed(format!("cannot encode the request: {err}")))?;
        let exchange = self.post_json(&self.endpoints.chat, &body)?;
        let completion = parse_completion(&exchange)?;
        tracing::debug!(
            request_id = %exchange.request_id,
            latency_ms = completion.latency.as_millis() as u64,
            attempts = completion.attempts,
            prompt_tokens = completion.usage.map(|u| u.prompt_tokens),
            completion_tokens = completion.usage.map(|u| u.completion_tokens),
            finish_reason = completion.finish_reason.as_deref(),
            "LLM completion received"
        );
        Ok(completion)
    }

    /// POSTs `body` to `url`, retrying connection failures, timeouts, 408, 429 and 5xx with
    /// backoff; returns the first 2xx body.
    pub(super) fn post_json(&self, url: &str, body: &str) -> Result<Exchange, LlmError> {
        let request_id = request_id();
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts = attempts.saturating_add(1);
            tracing::debug!(request_id = %request_id, url, attempt = attempts, "LLM request");
            let authorization = self.authorization.as_deref();
            let attempt = self.transport.post(url, body, &request_id, authorization, attempts);
            let (error, wait) = match attempt {
                Attempt::Answered { status, body, .. } if (200..300).contains(&status) => {
                    return Ok(Exchange { body, latency: started.elapsed(), attempts, request_id });
                }
                Attempt::Answered { status, body, wait } => {
                    let error = LlmError::Http {
                        status,
                        body: excerpt(&body, 300),
                        attempts,
                        hint: status_hint(status),
                    };
                    if !is_retryable_status(status) {
                        return Err(error);
                    }
                    (error, wait)
                }
                Attempt::Failed { error, retryable: false } => return Err(error),
                Attempt::Failed { error, retryable: true } => (error, None),
            };
            if attempts > self.max_retries {
                return Err(error);
            }
            let wait = match wait {
                Some(asked) if asked > self.retry_after_cap => {
                    return Err(LlmError::RateLimited {
                        retry_after: asked,
                        cap: self.retry_after_cap,
                    });
                }
                Some(asked) => asked,
                None => self.backoff.delay(attempts.saturating_sub(1)),
            };
            tracing::warn!(
                request_id = %request_id,
                attempt = attempts,
                wait_ms = wait.as_millis() as u64,
                error = %error,
                "LLM request failed; retrying"
            );
            std::thread::sleep(wait);
        }
    }
}

fn parse_completion(exchange: &Exchange) -> Result<Completion, LlmError> {
    let response: ChatResponse = serde_json::from_str(&exchange.body).map_err(|err| {
        LlmError::Malformed(format!(
            "body is not a chat-completions JSON object ({err}); it starts {:?}",
            excerpt(&exchange.body, 120)
        ))
    })?;
    if let Some(id) = &response.id {
        tracing::trace!(request_id = %exchange.request_id, response_id = %id, "LLM response id");
    }
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| LlmError::Malformed("the response has no choices".into()))?;
    let message =
        choice.message.ok_or_else(|| LlmError::Malformed("choices[0] has no message".into()))?;
    let text = message.content.unwrap_or_default();
    if text.trim().is_empty() {
        return Err(LlmError::EmptyAnswer);
    }
    let usage = response.usage.and_then(|usage| {
        Some(LlmUsage {
            prompt_tokens: usage.prompt_tokens?,
            completion_tokens: usage.completion_tokens?,
        })
    });
    Ok(Completion {
        text,
        finish_reason: choice.finish_reason,
        usage,
        latency: exchange.latency,
        attempts: exchange.attempts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmClientBuilder;

    fn exchange(body: &str) -> Exchange {
        Exchange {
            body: body.into(),
            latency: Duration::from_millis(7),
            attempts: 1,
            request_id: "t".into(),
        }
    }

    #[test]
    fn completions_parse_text_reason_and_usage() {
        let body = r#"{"id":"x","choices":[{"message":{"role":"assistant","content":"Done."},
            "finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let completion = parse_completion(&exchange(body)).unwrap();
        assert_eq!(completion.text, "Done.");
        assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
        assert_eq!(completion.usage, Some(LlmUsage { prompt_tokens: 12, completion_tokens: 3 }));
        assert!(!completion.was_truncated());
    }

    #[test]
    fn missing_usage_is_none_and_missing_text_is_empty_answer() {
        let no_usage = r#"{"choices":[{"message":{"content":"ok"},"finish_reason":"length"}]}"#;
        let completion = parse_completion(&exchange(no_usage)).unwrap();
        assert_eq!(completion.usage, None);
        assert!(completion.was_truncated());
        for body in [
            r#"{"choices":[{"message":{"content":null}}]}"#,
            r#"{"choices":[{"message":{"content":" \n "}}]}"#,
        ] {
            assert!(matches!(parse_completion(&exchange(body)), Err(LlmError::EmptyAnswer)));
        }
    }

    #[test]
    fn wrong_shapes_are_malformed() {
        for body in ["not json", "[]", r#"{"choices":[]}"#, r#"{"choices":[{}]}"#] {
            assert!(
                matches!(parse_completion(&exchange(body)), Err(LlmError::Malformed(_))),
                "{body}"
            );
        }
    }

    #[test]
    fn debug_output_hides_the_key() {
        let client = LlmClientBuilder::new("http://h:1").api_key("sk-secret").build().unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("Bearer ***"));
    }

    #[test]
    fn keys_with_newlines_are_refused() {
        let result = LlmClientBuilder::new("http://h:1").api_key("sk-\nx").build();
        assert!(matches!(result, Err(LlmError::Config(_))));
    }
}
