//! ctxwin-core: an allocation-free, bounded-time context-window manager for LLM agents.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)
)]

pub mod counter;
pub mod estimator;
pub mod role;

pub use counter::TokenCounter;
pub use estimator::{Estimator, Margin, Weights};
pub use role::Role;
