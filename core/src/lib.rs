//! An allocation-free, bounded-time context-window manager for LLM agents.
//!
//! An agent's context window is finite. [`ContextManager`] decides, under a token budget, what
//! the model sees each turn: it keeps the system prompt and tool definitions, evicts the oldest
//! conversation units first (an assistant message with tool calls leaves together with all its
//! results), locks the newest messages and the live user request, reduces huge tool outputs to
//! their first and last lines, and injects a `[Memory Summary]` where history was cut.
//!
//! Because every buffer has a capacity fixed at compile time ([`Capacities`], [`Ring`](ring::Ring)), the
//! manager needs no allocator, can live in a `static`, costs exactly `size_of` in RAM, and
//! bounds every operation by those capacities, never by how long the session has run.
//! Nothing is dropped silently: evicted units wait in an [outbox](ContextManager::drain_outbox)
//! until the caller has archived them, and every refusal is a typed [`Error`].
//!
//! ```
//! use ctxwin_core::{ContextManager, Message, TinyCapacities};
//!
//! let mut manager = ContextManager::<TinyCapacities>::new();
//! manager.push(Message::system("Answer in one sentence."))?;
//! manager.push(Message::user("What is a context window?"))?;
//! let payload = manager.compose(&[])?;
//! assert_eq!(payload.items().count(), 2);
//! # Ok::<(), ctxwin_core::Error>(())
//! ```
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

// The logging shim must come first so every module sees its macros.
#[macro_use]
mod fmt;

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub mod capacity;
pub mod config;
pub mod counter;
pub mod entities;
pub mod error;
pub mod estimator;
mod header;
mod json;
pub mod level;
pub mod manager;
pub mod message;
pub mod payload;
pub mod record;
pub mod reduce;
pub mod ring;
pub mod role;
mod small;
pub mod snapshot;
pub mod stats;
pub mod strategy;
pub mod summarize;
#[cfg(feature = "tasks")]
pub mod task;
pub mod terms;
pub mod trim;
pub mod view;

// What a user needs to push, compose, write, snapshot and configure; everything else is
// reachable through its module (the strategy and summarizer seams, custom capacities, views).
pub use capacity::{Capacities, DefaultCapacities, TinyCapacities};
pub use config::{
    Config, ConfigError, DynamicPlacement, OutboxMode, StrategyKind, UnansweredCalls,
};
pub use entities::EntitySchema;
pub use error::{Error, InvalidMessage};
pub use level::Level;
pub use manager::ContextManager;
pub use message::{Message, MessageRef, ToolCall};
pub use payload::{OpenAiRequest, Payload, PayloadItem};
pub use role::Role;
pub use snapshot::SnapshotError;
pub use stats::Stats;
