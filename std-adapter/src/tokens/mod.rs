//! Exact token counts, chat framing overheads, and calibration against provider usage.
//!
//! - [`ExactCounter`] (cargo feature `tokenizers`, on by default): a
//!   [`TokenCounter`](ctxwin_core::counter::TokenCounter) backed by a Hugging Face
//!   `tokenizer.json` (the pure-Rust `tokenizers` crate), with a bounded per-text cache.
//!   `cl100k_base` and SmolLM2 ship inside the crate; any other file loads by path.
//! - [`ChatFraming`]: per-message and per-request tokens a chat API adds around contents,
//!   for the core's `Config::message_overhead` / `request_overhead`.
//! - [`Calibrator`]: learns from billed prompt tokens how far estimates are off and
//!   recommends a budget (or an estimator margin) under which real payloads still fit.
//!
//! # Examples
//!
//! ```
//! use ctxwin_core::{Config, ContextManager, Message, TinyCapacities};
//! use ctxwin_std::tokens::{Calibrator, ChatFraming, ExactCounter};
//!
//! let counter = ExactCounter::smollm2()?;
//! let config = ChatFraming::chatml(&counter).apply(Config::DEFAULT);
//! let mut manager = ContextManager::<TinyCapacities>::builder().config(config).counter(counter).build()?;
//! manager.push(Message::system("You are terse."))?;
//! manager.push(Message::user("Hi"))?;
//! let estimated = manager.compose(&[])?.tokens();
//!
//! let mut calibrator = Calibrator::new();
//! calibrator.observe(estimated, estimated)?; // what the server reported
//! assert_eq!(calibrator.ratio(), Some(1.0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The count cache serves `ExactCounter` and retrieval's line costs; `CacheStats` is the
// sessions' stats type either way.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
mod cache;
pub(crate) mod calibration;
#[cfg(feature = "tokenizers")]
mod exact;
mod overhead;

pub(crate) use cache::CountCache;
pub use cache::{CacheStats, DEFAULT_CACHE_CAPACITY};
pub use calibration::{CalibrationError, Calibrator, CalibratorConfig, Observation};
#[cfg(feature = "tokenizers")]
pub use exact::{ExactCounter, MAX_TOKENIZER_BYTES, TokenizerError};
pub use overhead::{CHATML_REPLY_PRIMER, CHATML_ROLES, ChatFraming, render_chatml};
