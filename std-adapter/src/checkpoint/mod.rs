//! Crash-safe on-disk checkpoints of manager snapshots.
//!
//! A [`CheckpointStore`] keeps opaque snapshot bytes in a directory
//! ([`DEFAULT_DIR`] = `.ctxwin/snapshots` by default), one `<id>.ckpt` file per checkpoint:
//!
//! - **Atomic and durable saves**: temp file, `fsync`, `rename`, directory `fsync`. A crash
//!   at any point leaves the previous checkpoints intact and the new one either complete or
//!   absent.
//! - **Self-checking files**: magic `CTXWCKPT`, format version, payload length and a CRC-32
//!   trailer ([`frame`] documents the layout). A torn or damaged file is reported and
//!   skipped; [`CheckpointStore::load_latest`] falls back to the newest intact one.
//! - **An order no clock can break**: every save raises a sequence number kept inside the
//!   file (under its CRC); the newest checkpoint is the one with the highest, whatever the
//!   clock said or a file is named. Ids sort by time too and never fall behind an existing
//!   one, and cannot name a path outside the store ([`CheckpointId`]).
//! - **Retention** of the newest N ([`CheckpointStore::with_keep`]) and a
//!   [`PeriodicCheckpointer`] that says when a [`CheckpointPolicy`]'s interval of messages
//!   has passed.
//!
//! # Examples
//!
//! ```
//! use ctxwin_std::checkpoint::{CheckpointPolicy, CheckpointStore, PeriodicCheckpointer};
//!
//! let dir = tempfile::tempdir()?;
//! let store = CheckpointStore::open(dir.path().join(ctxwin_std::checkpoint::DEFAULT_DIR))?;
//! let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(2));
//! for message in 1..=5u8 {
//!     if periodic.on_messages(1) {
//!         store.save(&[message])?;
//!         periodic.checkpointed();
//!     }
//! }
//! assert_eq!(store.load_latest()?.unwrap().bytes, [4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod clock;
mod error;
pub mod frame;
mod id;
mod periodic;
mod store;

pub use error::{CheckpointError, SkipReason, Skipped};
pub use frame::{FLAG_SEQUENCE, FORMAT_VERSION, FrameError, MAGIC};
pub use id::{CheckpointId, IdError};
pub use periodic::{CheckpointPolicy, PeriodicCheckpointer};
pub use store::{
    CheckpointInfo, CheckpointStatus, CheckpointStore, DEFAULT_DIR, DEFAULT_KEEP, Restored,
    STALE_TEMP_AGE,
};
