//! [`LlmClientBuilder`]: the settings of an [`LlmClient`] and their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::retry::Backoff;
use super::transport::Transport;
use super::wire::Endpoints;
use super::{LlmClient, LlmError, TokenCountFn};

/// Configures an [`LlmClient`]; every setting has a default fit for a local server.
///
/// ```
/// use std::time::Duration;
/// use ctxwin_std::llm::LlmClientBuilder;
///
/// let client = LlmClientBuilder::new("http://127.0.0.1:8089")
///     .model("smollm2")
///     .timeout(Duration::from_secs(30))
///     .max_retries(2)
///     .backoff(Duration::from_millis(200), Duration::from_secs(5))
///     .build()?;
/// assert_eq!(client.base_url(), "http://127.0.0.1:8089");
/// # Ok::<(), ctxwin_std::llm::LlmError>(())
/// ```
#[derive(Clone)]
pub struct LlmClientBuilder {
    base_url: String,
    model: Option<String>,
    api_key: Option<ApiKey>,
    timeout: Duration,
    connect_timeout: Duration,
    max_retries: u32,
    backoff: Backoff,
    retry_after_cap: Duration,
    temperature: f32,
    frequency_penalty: Option<f32>,
    input_token_budget: u32,
    extract_max_tokens: u32,
    keep_truncated_summaries: bool,
    json_mode: bool,
    counter: Option<TokenCountFn>,
}

#[derive(Clone)]
enum ApiKey {
    Literal(String),
    Env(String),
}

impl LlmClientBuilder {
    /// Starts a configuration for the server at `base_url` (`http://host:port`, with or
    /// without a trailing `/v1`).
    ///
    /// Defaults: no model name (llama-server ignores it), no API key, 60 s per attempt, 5 s to
    /// connect, 2 retries, backoff 250 ms doubling to 8 s, `Retry-After` honoured up to 30 s,
    /// temperature 0, an input budget of 2,048 tokens, 256 tokens for extraction answers in
    /// JSON mode, cut summaries rejected.
    ///
    /// ```
    /// let builder = ctxwin_std::llm::LlmClientBuilder::new("https://api.openai.com/v1");
    /// assert!(builder.build().is_ok());
    /// ```
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: None,
            api_key: None,
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            max_retries: 2,
            backoff: Backoff { base: Duration::from_millis(250), max: Duration::from_secs(8) },
            retry_after_cap: Duration::from_secs(30),
            temperature: 0.0,
            frequency_penalty: None,
            input_token_budget: 2048,
            extract_max_tokens: 256,
            keep_truncated_summaries: false,
            json_mode: true,
            counter: None,
        }
    }

    /// The `model` field of each request (omitted when unset).
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").model("gpt-4o-mini");
    /// assert!(b.build().is_ok());
    /// ```
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sends `Authorization: Bearer <key>`.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").api_key("sk-test");
    /// assert!(b.build().is_ok());
    /// ```
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::Literal(key.into()));
        self
    }

    /// Reads the bearer key from environment variable `var` when [`build`](Self::build) runs;
    /// `build` fails if it is unset or empty.
    ///
    /// ```
    /// use ctxwin_std::llm::{LlmClientBuilder, LlmError};
    /// let b = LlmClientBuilder::new("http://localhost:8080").api_key_env("CTXWIN_DOC_NO_SUCH_VAR");
    /// assert!(matches!(b.build(), Err(LlmError::Config(_))));
    /// ```
    pub fn api_key_env(mut self, var: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::Env(var.into()));
        self
    }

    /// Time limit of one attempt, from connecting to the last byte of the answer.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .timeout(std::time::Duration::from_secs(10));
    /// assert!(b.build().is_ok());
    /// ```
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = limit;
        self
    }

    /// Time limit for opening the connection (DNS, TCP, TLS).
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .connect_timeout(std::time::Duration::from_secs(2));
    /// assert!(b.build().is_ok());
    /// ```
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    /// Retries after the first attempt on connection failures, timeouts, 408, 429 and 5xx
    /// (never on other 4xx); 0 disables retrying.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").max_retries(0);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Wait before retry `n` (from 0): `base · 2^n` capped at `max`, drawn uniformly from its
    /// upper half (jitter).
    ///
    /// ```
    /// use std::time::Duration;
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .backoff(Duration::from_millis(100), Duration::from_secs(2));
    /// assert!(b.build().is_ok());
    /// ```
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff { base, max: max.max(base) };
        self
    }

    /// Longest `Retry-After` the client waits; a server asking for more ends the call with
    /// [`LlmError::RateLimited`].
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .retry_after_cap(std::time::Duration::from_secs(5));
    /// assert!(b.build().is_ok());
    /// ```
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// Sampling temperature sent with summary and extraction requests (default 0, so the same
    /// input gives the same answer).
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").temperature(0.2);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = if temperature.is_finite() { temperature.max(0.0) } else { 0.0 };
        self
    }

    /// OpenAI's `frequency_penalty` (-2 to 2), sent only when set; a positive value keeps
    /// small models from repeating themselves.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").frequency_penalty(0.5);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn frequency_penalty(mut self, penalty: f32) -> Self {
        self.frequency_penalty = penalty.is_finite().then(|| penalty.clamp(-2.0, 2.0));
        self
    }

    /// Keeps a summary that hit `max_summary_tokens` up to its last complete sentence
    /// (flagged [`LlmSummary::truncated`](super::LlmSummary::truncated)) instead of failing
    /// with [`LlmError::Truncated`]. Off by default; small models that rarely stop by
    /// themselves need it.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .keep_truncated_summaries(true);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn keep_truncated_summaries(mut self, keep: bool) -> Self {
        self.keep_truncated_summaries = keep;
        self
    }

    /// Sends `response_format: {"type": "json_schema", ...}` with extraction requests (on by
    /// default): a JSON schema declaring exactly the extraction keys, each a string of at most
    /// 120 characters or null. OpenAI, llama.cpp, vLLM and Ollama then constrain the answer
    /// to that shape. Turn it off for a server that rejects the field with HTTP 400.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").json_mode(false);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn json_mode(mut self, on: bool) -> Self {
        self.json_mode = on;
        self
    }

    /// Most tokens of conversation (or extraction text) put into one prompt; longer input is
    /// cut to fit. Leave room in the model's context for the instructions and the answer.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").input_token_budget(3000);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn input_token_budget(mut self, tokens: u32) -> Self {
        self.input_token_budget = tokens;
        self
    }

    /// `max_tokens` of extraction answers.
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080").extract_max_tokens(128);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn extract_max_tokens(mut self, tokens: u32) -> Self {
        self.extract_max_tokens = tokens.max(1);
        self
    }

    /// Counts tokens for the input budget and the "summary is shorter" check, e.g. an exact
    /// tokenizer of the model; the default is [`estimate_tokens`](super::estimate_tokens).
    ///
    /// ```
    /// let b = ctxwin_std::llm::LlmClientBuilder::new("http://localhost:8080")
    ///     .token_counter(|text: &str| text.split_whitespace().count() as u32);
    /// assert!(b.build().is_ok());
    /// ```
    pub fn token_counter(mut self, counter: impl Fn(&str) -> u32 + Send + Sync + 'static) -> Self {
        self.counter = Some(Arc::new(counter));
        self
    }

    /// Checks the configuration and builds the client.
    ///
    /// # Errors
    ///
    /// [`LlmError::Config`] for a base URL that is not `http(s)://host…`, an API key variable
    /// that is unset or empty, or a key with control characters.
    ///
    /// ```
    /// use ctxwin_std::llm::{LlmClientBuilder, LlmError};
    /// assert!(matches!(LlmClientBuilder::new("localhost:8080").build(), Err(LlmError::Config(_))));
    /// ```
    pub fn build(self) -> Result<LlmClient, LlmError> {
        let endpoints = Endpoints::parse(&self.base_url)?;
        let key = match self.api_key {
            None => None,
            Some(ApiKey::Literal(key)) => Some(key),
            Some(ApiKey::Env(var)) => match std::env::var(&var) {
                Ok(key) if !key.trim().is_empty() => Some(key),
                _ => {
                    return Err(LlmError::Config(format!(
                        "environment variable {var} holds no API key; export it or drop \
                         api_key_env"
                    )));
                }
            },
        };
        let authorization = match key.as_deref().map(str::trim) {
            Some(key) if key.is_empty() || key.chars().any(char::is_control) => {
                return Err(LlmError::Config(
                    "the API key is empty or has control characters (a stray newline?)".into(),
                ));
            }
            Some(key) => Some(format!("Bearer {key}")),
            None => None,
        };
        let transport = Transport::new(self.timeout, self.connect_timeout)?;
        Ok(LlmClient {
            transport,
            endpoints,
            model: self.model,
            authorization,
            timeout: self.timeout,
            max_retries: self.max_retries,
            backoff: self.backoff,
            retry_after_cap: self.retry_after_cap,
            temperature: self.temperature,
            frequency_penalty: self.frequency_penalty,
            input_token_budget: self.input_token_budget,
            extract_max_tokens: self.extract_max_tokens,
            keep_truncated_summaries: self.keep_truncated_summaries,
            json_mode: self.json_mode,
            counter: self.counter,
        })
    }
}

impl fmt::Debug for LlmClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmClientBuilder")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .finish_non_exhaustive()
    }
}
