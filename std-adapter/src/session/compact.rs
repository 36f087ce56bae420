//! [`Session::compact`]: a compaction the caller asks for, before the history reaches its
//! high-water mark.

use ctxwin_core::Error as CoreError;

use super::{Session, SessionError};

impl Session {
    /// Compacts the history now, as the core does when a push passes its high-water mark:
    /// the superseded and over-limit tool outputs are cut, then whole units leave, oldest
    /// first (the locked tail and the live request stay), until usage is under the low-water
    /// mark; what left is archived. For a caller that knows a compaction costs nothing now
    /// and saves one later: the proxy, when the provider's prompt cache has expired (the
    /// next request rewrites the prefix anyway). Returns the units evicted (0: usage is under
    /// the low-water mark already, or nothing could leave). Under a lease the new state is
    /// checkpointed, as after any change a replay of the rows would not make.
    ///
    /// # Errors
    /// Archive errors, the lease's.
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::{Config, Role}, session::SessionBuilder};
    /// let config = Config { context_window: 4_096, reserved_for_reply: 96, ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// let low = session.manager().config().low_water_tokens();
    /// for n in 0.. {
    ///     session.push(&ChatMessage::text(Role::User, format!("question {n}: {}", "why ".repeat(40))))?;
    ///     if session.manager().used() > low { break }
    /// }
    /// assert!(session.compact()? > 0);
    /// assert!(session.manager().used() <= low);
    /// assert_eq!(session.compact()?, 0, "under the low-water mark already");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compact(&mut self) -> Result<usize, SessionError> {
        self.serving(true, Self::compact_once)
    }

    fn compact_once(&mut self) -> Result<usize, SessionError> {
        if self.manager.used() <= self.manager.config().low_water_tokens() {
            return Ok(0);
        }
        self.commit()?;
        self.ensure_reproducible()?;
        let before = self.manager.stats().counters.units_evicted;
        let since = self.manager.next_id();
        // Asking for one token more than is free makes the core evict, and an eviction it
        // must make compacts to the low-water mark.
        let wanted = self.manager.budget().saturating_sub(self.manager.used()).saturating_add(1);
        let mut made = self.manager.make_space(wanted);
        if matches!(made, Err(CoreError::OutboxFull { .. })) {
            self.after_op(since, &|_| false)?;
            made = self.manager.make_space(wanted);
        }
        match made {
            // Only the pinned part and the live request are left: nothing more can leave.
            Ok(()) | Err(CoreError::PinnedOverBudget { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        self.after_op(since, &|_| false)?;
        let evicted = self.manager.stats().counters.units_evicted.saturating_sub(before);
        Ok(usize::try_from(evicted).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ctxwin_core::{Config, Role};

    use crate::ChatMessage;
    use crate::session::SessionBuilder;
    use crate::store::MemoryStore;

    #[test]
    fn what_a_compaction_evicts_is_archived_and_a_short_history_stays() {
        let config = Config { context_window: 4_096, reserved_for_reply: 96, ..Config::DEFAULT };
        let builder =
            SessionBuilder::new("s").config(config).archive_store(Arc::new(MemoryStore::new()));
        let mut session = builder.build().unwrap();
        session.push(&ChatMessage::text(Role::User, "hello")).unwrap();
        assert_eq!(session.compact().unwrap(), 0, "the live request is locked");
        let low = session.manager().config().low_water_tokens();
        let mut n = 0;
        while n < 4 || session.manager().used() <= low {
            assert!(n < 100, "never over the low-water mark");
            let text = format!("turn {n}: {}", "words ".repeat(40));
            session.push(&ChatMessage::text(Role::User, text.clone())).unwrap();
            session.push(&ChatMessage::text(Role::Assistant, text)).unwrap();
            n += 1;
        }
        let live: Vec<u64> = session.manager().history().map(|m| m.id()).collect();
        let evicted = session.compact().unwrap();
        assert!(evicted > 0);
        assert!(session.manager().used() <= low);
        let kept: Vec<u64> = session.manager().history().map(|m| m.id()).collect();
        let gone: Vec<u64> = live.iter().copied().filter(|id| !kept.contains(id)).collect();
        assert!(!gone.is_empty() && gone.iter().all(|id| id < &kept[0]), "oldest first");
        session.sync_archive().unwrap();
        let archive = session.archive().unwrap();
        for id in gone {
            assert!(archive.get(session.scope(), id).unwrap().is_some(), "row {id} archived");
        }
        assert_eq!(session.compact().unwrap(), 0, "under the low-water mark already");
    }
}
