//! The wall clock checkpoint ids are made from, with an override for tests.
//!
//! **Test only:** when the environment variable [`TEST_NOW_VAR`] holds milliseconds since the
//! Unix epoch, [`now`] returns that instant instead of the system clock. Tests use it to step
//! the clock back and forth between `ctxwin` processes; nothing else should set it. Message
//! timestamps and everything else keep the real clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The variable [`now`] reads: milliseconds since the Unix epoch (tests only).
pub const TEST_NOW_VAR: &str = "CTXWIN_TEST_NOW_UNIX_MS";

/// The time new checkpoint ids are made from: the system clock, or [`TEST_NOW_VAR`] when set
/// to a number.
///
/// ```
/// let now = ctxwin_std::store::checkpoint::clock::now();
/// assert!(now > std::time::UNIX_EPOCH);
/// ```
pub fn now() -> SystemTime {
    std::env::var(TEST_NOW_VAR)
        .ok()
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        .unwrap_or_else(SystemTime::now)
}
