//! When to checkpoint: every `checkpoint_interval_messages` messages (set with
//! [`SessionBuilder::checkpoint_interval_messages`](crate::session::SessionBuilder::checkpoint_interval_messages)),
//! and the session's checkpoint bookkeeping.

use ctxwin_core::Config;

use crate::store::CheckpointId;

/// A session's checkpointing: when the next one is due, the newest written or restored, and
/// the caller's state that travels in every checkpoint.
#[derive(Debug)]
pub(crate) struct Checkpointing {
    pub(crate) periodic: PeriodicCheckpointer,
    /// The newest checkpoint written or restored.
    pub(crate) last: Option<CheckpointId>,
    /// Opaque bytes of the caller's, kept in checkpoints
    /// ([`Session::set_caller_state`](super::Session::set_caller_state)).
    pub(crate) caller_state: Vec<u8>,
    /// The configuration the newest checkpoint written or restored was written under
    /// (`None`: none yet, or one of an older build, which did not record it).
    pub(crate) configured: Option<Config>,
}

impl Checkpointing {
    pub(crate) fn new(policy: CheckpointPolicy) -> Self {
        Self {
            periodic: PeriodicCheckpointer::new(policy),
            last: None,
            caller_state: Vec::new(),
            configured: None,
        }
    }
}

/// How often a session checkpoints.
///
/// ```
/// use ctxwin_std::session::CheckpointPolicy;
/// assert!(CheckpointPolicy::every(20).is_enabled());
/// assert!(!CheckpointPolicy::DISABLED.is_enabled());
/// assert_eq!(CheckpointPolicy::default(), CheckpointPolicy::every(50));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CheckpointPolicy {
    /// Messages between two checkpoints; 0 turns periodic checkpoints off.
    pub interval_messages: u32,
}

impl CheckpointPolicy {
    /// Never checkpoint on a message count.
    pub const DISABLED: Self = Self { interval_messages: 0 };

    /// Every 50 messages: a [`Session`](crate::session::Session)'s default.
    pub const DEFAULT: Self = Self { interval_messages: 50 };

    /// Checkpoint after every `interval_messages` messages (0 disables).
    ///
    /// ```
    /// # use ctxwin_std::session::CheckpointPolicy;
    /// assert_eq!(CheckpointPolicy::every(5).interval_messages, 5);
    /// ```
    pub const fn every(interval_messages: u32) -> Self {
        Self { interval_messages }
    }

    /// Whether message counts can ever make a checkpoint due.
    ///
    /// ```
    /// # use ctxwin_std::session::CheckpointPolicy;
    /// assert!(!CheckpointPolicy::every(0).is_enabled());
    /// ```
    pub const fn is_enabled(self) -> bool {
        self.interval_messages > 0
    }
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Counts messages since the last checkpoint and says when the next one is due.
///
/// Pure bookkeeping: the session calls [`on_messages`](Self::on_messages) as messages
/// arrive, saves when told a checkpoint is due, and then calls
/// [`checkpointed`](Self::checkpointed). A failed save simply leaves the checkpoint due,
/// so the next message retries it.
///
/// # Examples
///
/// ```
/// use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
/// let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(3));
/// assert!(!periodic.on_messages(2));
/// assert!(periodic.on_messages(1));
/// periodic.checkpointed();
/// assert_eq!(periodic.pending(), 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeriodicCheckpointer {
    policy: CheckpointPolicy,
    pending: u32,
}

impl PeriodicCheckpointer {
    /// A counter with nothing pending.
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(10));
    /// assert!(!periodic.is_due());
    /// ```
    pub const fn new(policy: CheckpointPolicy) -> Self {
        Self { policy, pending: 0 }
    }

    /// Records `count` new messages; returns whether a checkpoint is now due.
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(4));
    /// assert!(periodic.on_messages(7));
    /// assert!(periodic.on_messages(0), "stays due until checkpointed");
    /// ```
    pub fn on_messages(&mut self, count: u32) -> bool {
        self.pending = self.pending.saturating_add(count);
        self.is_due()
    }

    /// Whether enough messages have arrived since the last checkpoint.
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let mut off = PeriodicCheckpointer::new(CheckpointPolicy::DISABLED);
    /// off.on_messages(u32::MAX);
    /// assert!(!off.is_due());
    /// ```
    pub const fn is_due(&self) -> bool {
        self.policy.is_enabled() && self.pending >= self.policy.interval_messages
    }

    /// Records that a checkpoint was written; the count starts again from zero.
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(1));
    /// periodic.on_messages(1);
    /// periodic.checkpointed();
    /// assert!(!periodic.is_due());
    /// ```
    pub fn checkpointed(&mut self) {
        self.pending = 0;
    }

    /// Messages recorded since the last checkpoint (saturating at `u32::MAX`).
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(10));
    /// periodic.on_messages(3);
    /// assert_eq!(periodic.pending(), 3);
    /// ```
    pub const fn pending(&self) -> u32 {
        self.pending
    }

    /// The policy in force.
    ///
    /// ```
    /// # use ctxwin_std::session::{CheckpointPolicy, PeriodicCheckpointer};
    /// let periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(8));
    /// assert_eq!(periodic.policy(), CheckpointPolicy::every(8));
    /// ```
    pub const fn policy(&self) -> CheckpointPolicy {
        self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn due_exactly_at_each_interval() {
        let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(3));
        let mut due_at = Vec::new();
        for message in 1..=10 {
            if periodic.on_messages(1) {
                due_at.push(message);
                periodic.checkpointed();
            }
        }
        assert_eq!(due_at, [3, 6, 9]);
        assert_eq!(periodic.pending(), 1);
    }

    #[test]
    fn failed_save_stays_due_and_counter_saturates() {
        let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(2));
        assert!(periodic.on_messages(2));
        assert!(periodic.on_messages(1));
        assert_eq!(periodic.pending(), 3);
        periodic.on_messages(u32::MAX);
        assert_eq!(periodic.pending(), u32::MAX);
        assert!(periodic.is_due());
    }

    proptest! {
        #[test]
        fn due_iff_pending_reaches_interval(
            interval in 0..50u32,
            steps in proptest::collection::vec((0..20u32, any::<bool>()), 0..100),
        ) {
            let mut periodic = PeriodicCheckpointer::new(CheckpointPolicy::every(interval));
            let mut since_last = 0u32;
            for (count, save_when_due) in steps {
                since_last += count;
                let due = periodic.on_messages(count);
                prop_assert_eq!(due, interval > 0 && since_last >= interval);
                prop_assert_eq!(periodic.pending(), since_last);
                if due && save_when_due {
                    periodic.checkpointed();
                    since_last = 0;
                }
            }
        }
    }
}
