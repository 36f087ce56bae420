//! A blocking client for OpenAI-compatible chat-completion servers, and the two jobs ctxwin
//! gives a model: rolling summaries of evicted history and key/value fact extraction.
//!
//! - [`LlmClientBuilder`] → [`LlmClient`]: `POST {base}/v1/chat/completions` over
//!   `reqwest`'s blocking client (rustls, the proxy's HTTP stack), bearer auth, per-attempt and connect timeouts, bounded
//!   retries with exponential backoff and jitter on connection errors, timeouts, 408, 429 and
//!   5xx (honouring `Retry-After` up to a cap), never on other 4xx.
//! - [`LlmClient::summarize`]: the previous summary plus new messages in, a checked
//!   [`LlmSummary`] out.
//! - [`LlmClient::extract`]: declared keys, current values and text in, updated values out.
//! - [`LlmClient::tokenize`]: the model's own token ids (llama-server's `/tokenize`).
//! - [`LlmClient::embeddings`]: one vector per input text (`POST {base}/v1/embeddings`).
//!
//! - [`LlmSummarizer`] and [`LlmExtractor`]: the core's `Summarizer` and `Extractor` seams
//!   answered by the model (blocking), falling back to the core's extractive summarizer and
//!   pattern extractor on every failure, counted by [`FallbackReason`]. A
//!   [`Session`](crate::session::Session) runs the model off the critical path instead
//!   ([`SessionBuilder::llm`](crate::session::SessionBuilder::llm)).
//!
//! Small models often answer badly; such answers come back as errors for which
//! [`LlmError::is_rejected_answer`] is true, and the caller falls back.
//!
//! # Examples
//!
//! ```no_run
//! use ctxwin_std::llm::LlmClientBuilder;
//! use ctxwin_std::{ChatMessage, ToolCall, core::Role};
//!
//! let client = LlmClientBuilder::new("http://127.0.0.1:8089").max_retries(1).build()?;
//! let evicted = [
//!     ChatMessage::text(Role::User, "Why does CI fail?"),
//!     ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "run", r#"{"cmd":"cargo test"}"#)]),
//!     ChatMessage::tool_result("c1", "test io::reads_back ... FAILED"),
//! ];
//! let summary = client.summarize(Some("Task: keep CI green."), &evicted, 200)?;
//! println!("{} ({:?}, {:?})", summary.text, summary.latency, summary.usage);
//! # Ok::<(), ctxwin_std::llm::LlmError>(())
//! ```

mod budget;
mod builder;
mod client;
mod embeddings;
mod error;
mod extract;
mod extractor;
mod fallback;
#[cfg(test)]
pub(crate) mod mock;
mod prompts;
mod retry;
mod summarize;
mod summarizer;
mod tokenize;
mod transport;
mod wire;
pub(crate) mod worker;

pub use budget::estimate_tokens;
pub use builder::LlmClientBuilder;
pub use client::{Completion, LlmClient, LlmUsage, TokenCountFn};
pub use embeddings::Embeddings;
pub use error::LlmError;
pub use extract::parse_extraction;
pub use extractor::LlmExtractor;
pub use fallback::{CallTally, FallbackCounts, FallbackReason, Latencies};
pub use prompts::{EXTRACT_SYSTEM_PROMPT, SUMMARY_SYSTEM_PROMPT};
pub use summarize::LlmSummary;
pub use summarizer::LlmSummarizer;
pub use tokenize::TokenPiece;
