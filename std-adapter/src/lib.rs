//! ctxwin-std: what a desktop or server agent links on top of `ctxwin-core`.
#![deny(missing_docs)]

pub use ctxwin_core as core;

pub mod embed;
pub mod format;
pub mod llm;
pub mod message;
pub mod session;
pub mod statefs;
pub mod store;
pub mod tokens;

pub use message::{ChatMessage, Conversation, ToolCall, ToolDefinition};
pub use session::{Counter, Session, SessionBuilder, SessionError, SessionStats, SharedSession};
