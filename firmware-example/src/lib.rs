//! ctxwin-core on a Cortex-M4: the pieces the firmware binaries share.
//!
//! - [`edge`]: the device's capacities and budgets, and the manager built from them at
//!   compile time.
//! - [`scenario`]: a deterministic edge-agent session (sensor readings, tool calls, a huge
//!   log) played one turn at a time through a [`scenario::Probe`].
//! - [`summary`]: a deterministic summary written from drained outbox units.
//! - [`sink`]: byte-slice helpers for checking request bodies.
//! - [`stack`] and [`bench`]: stack painting and instruction-count markers.
//! - [`vectors`]: the board's 32 interrupt vectors (cortex-m-rt's `device` feature).
//! - [`mem`]: byte-at-a-time `memcpy`/`memset`/`memcmp`, smaller than compiler-builtins'.
//! - `snapshot` (cargo feature `snapshot`): the snapshot/restore round trip.
//! - [`lean`] and [`report`]: the session of the `minimal` and `snapshot` binaries, reported
//!   as plain semihosting text (no defmt).
#![no_std]
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

pub mod bench;
pub mod check;
pub mod edge;
pub mod lean;
pub mod mem;
pub mod report;
pub mod scenario;
pub mod sink;
#[cfg(feature = "snapshot")]
pub mod snapshot;
pub mod stack;
pub mod summary;
pub mod text;
pub mod vectors;
