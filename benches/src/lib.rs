//! Shared helpers for the ctxwin benches: the recorded agent session they replay
//! ([`replay`]), the per-turn workload and managers at given history lengths ([`workload`]),
//! the estimator's accuracy corpus and statistics ([`corpus`], [`accuracy`]), and the
//! generated histories the quality benches score ([`longchat`], [`taskprobes`]).
//!
//! Everything here runs outside the timed regions: loading, decompressing, converting
//! `ChatMessage`s to core `Message`s, building long histories.
//!
//! ```
//! use ctxwin_benches::replay::Session;
//! use ctxwin_benches::workload::{Driver, turn_config};
//! use ctxwin_core::StrategyKind;
//!
//! let session = Session::load()?;
//! let mut driver = Driver::new(&session, turn_config(StrategyKind::SlidingWindow))?;
//! driver.advance_to(100)?;
//! assert!(driver.messages() >= 100);
//! assert!(driver.manager().used() <= 8_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod accuracy;
pub mod api;
pub mod cache;
pub mod conv10k;
pub mod corpus;
pub mod embedcache;
mod error;
pub mod longchat;
pub mod replay;
pub mod taskprobes;
pub mod workload;

pub use error::{DataError, WorkloadError};

/// Whether a `harness = false` bench named `name` should run, given the command line:
/// `cargo bench -- FILTER` passes FILTER to every bench binary, and those that print a
/// report run only when no filter is given or one is a substring of their name.
///
/// ```
/// let args = ["bench-binary", "--bench", "latency"].map(String::from);
/// assert!(ctxwin_benches::selected("latency", args.iter().cloned()));
/// assert!(!ctxwin_benches::selected("tokens", args.into_iter()));
/// ```
pub fn selected(name: &str, args: impl Iterator<Item = String>) -> bool {
    let filters: Vec<String> = args.skip(1).filter(|a| !a.starts_with('-')).collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}
