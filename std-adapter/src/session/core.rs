//! [`SessionManager`]: the core manager of a session, in one of two sizes, behind one
//! object-safe trait ([`SessionCore`]) implemented once for every
//! [`ContextManager`]`<C, Counter>`. A session starts in the [`SmallCapacities`] tier and moves
//! to [`ServerCapacities`](super::ServerCapacities) (snapshot, then restore into the larger manager) before its content
//! could make the small rings evict.

use ctxwin_core::config::ConfigError;
use ctxwin_core::entities::{Entities, EntityError};
use ctxwin_core::manager::{EvictedUnit, Outbox, ReplaceError};
use ctxwin_core::strategy::Builtin;
use ctxwin_core::summarize::SummarySource;
use ctxwin_core::task::Task;
use ctxwin_core::view::{History, LevelMessages};
use ctxwin_core::{
    Capacities, Config, ContextManager, Error, Level, Message, MessageRef, Payload, SnapshotError,
    Stats,
};

use super::capacities::{SmallCapacities, boxed_server};
use super::{Counter, SessionError};

/// Share of a small ring (bytes or message slots) past which the session moves up a tier
/// before storing more: the core evicts a level when it passes `trigger_percent` (80% by
/// default) of its ring, so the small tier must never get close to it.
const GROW_PERCENT: usize = 40;

/// What a session asks of its core manager, whatever the manager's capacities: the
/// [`ContextManager`] methods it and its callers use, object-safe, implemented once for every
/// `ContextManager<C, Counter>` (each method is the core's: see its documentation there).
#[allow(missing_docs)]
pub trait SessionCore: Send {
    fn push(&mut self, message: Message<'_>) -> Result<u64, Error>;
    fn check(&self, message: &Message<'_>) -> Result<u32, Error>;
    fn add_tool_definition(&mut self, function_json: &str) -> Result<u64, Error>;
    fn add_summary(
        &mut self,
        text: &str,
        sources: &[(u64, u64)],
        timestamp: u64,
    ) -> Result<u64, Error>;
    fn abort_pending_calls(&mut self) -> Result<(), Error>;
    fn make_space(&mut self, tokens: u32) -> Result<(), Error>;
    fn replace_summary(&mut self, id: u64, text: &str) -> Result<u64, ReplaceError>;
    fn set_entity(&mut self, key: &str, value: Option<&str>) -> Result<(), EntityError>;
    fn set_config(&mut self, config: Config) -> Result<(), ConfigError>;
    fn compose<'a>(&'a mut self, dynamic: &'a [&'a str]) -> Result<Payload<'a>, Error>;
    fn dynamic_tokens(&self, text: &str) -> u32;
    fn dynamic_room(&self, dynamic: &[&str]) -> u32;
    fn drain_outbox(&mut self, sink: &mut dyn FnMut(EvictedUnit<'_>)) -> usize;
    fn snapshot_len(&self) -> usize;
    fn snapshot_into<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], SnapshotError>;
    fn restore_from(&mut self, bytes: &[u8]) -> Result<(), SnapshotError>;
    fn get(&self, id: u64) -> Option<MessageRef<'_>>;
    fn history(&self) -> History<'_>;
    fn messages(&self, level: Level) -> LevelMessages<'_>;
    fn session(&self) -> LevelMessages<'_>;
    fn outbox(&self) -> Outbox<'_>;
    fn summary_source(&self, first: u64, last: u64) -> SummarySource<'_>;
    fn entities(&self) -> Entities<'_>;
    fn config(&self) -> &Config;
    fn counter(&self) -> &Counter;
    fn strategy(&self) -> &Builtin;
    fn stats(&self) -> Stats;
    fn budget(&self) -> u32;
    fn used(&self) -> u32;
    fn level_tokens(&self, level: Level) -> u32;
    fn next_id(&self) -> u64;
    fn unanswered_calls(&self) -> u8;
    fn start_task(&mut self, goal: &str, timestamp: u64) -> Result<u32, Error>;
    fn push_opening_task(&mut self, message: Message<'_>, goal: &str) -> Result<u64, Error>;
    fn set_task_relevance(&mut self, relevances: &[(u64, u16)]) -> Result<usize, Error>;
    fn task_relevance(&self, id: u64) -> Option<u16>;
    fn finish_task(&mut self, outcome: &str, timestamp: u64) -> Result<Task, Error>;
    fn tasks(&self) -> &[Task];
    fn current_task(&self) -> Option<&Task>;
}

impl<C: Capacities + Send> SessionCore for ContextManager<C, Counter>
where
    ContextManager<C, Counter>: Send,
{
    fn push(&mut self, message: Message<'_>) -> Result<u64, Error> {
        ContextManager::push(self, message)
    }
    fn check(&self, message: &Message<'_>) -> Result<u32, Error> {
        ContextManager::check(self, message)
    }
    fn add_tool_definition(&mut self, function_json: &str) -> Result<u64, Error> {
        ContextManager::add_tool_definition(self, function_json)
    }
    fn add_summary(
        &mut self,
        text: &str,
        sources: &[(u64, u64)],
        timestamp: u64,
    ) -> Result<u64, Error> {
        ContextManager::add_summary(self, text, sources, timestamp)
    }
    fn abort_pending_calls(&mut self) -> Result<(), Error> {
        ContextManager::abort_pending_calls(self)
    }
    fn make_space(&mut self, tokens: u32) -> Result<(), Error> {
        ContextManager::make_space(self, tokens)
    }
    fn replace_summary(&mut self, id: u64, text: &str) -> Result<u64, ReplaceError> {
        ContextManager::replace_summary(self, id, text)
    }
    fn set_entity(&mut self, key: &str, value: Option<&str>) -> Result<(), EntityError> {
        ContextManager::set_entity(self, key, value)
    }
    fn set_config(&mut self, config: Config) -> Result<(), ConfigError> {
        ContextManager::set_config(self, config)
    }
    fn compose<'a>(&'a mut self, dynamic: &'a [&'a str]) -> Result<Payload<'a>, Error> {
        ContextManager::compose(self, dynamic)
    }
    fn dynamic_tokens(&self, text: &str) -> u32 {
        ContextManager::dynamic_tokens(self, text)
    }
    fn dynamic_room(&self, dynamic: &[&str]) -> u32 {
        ContextManager::dynamic_room(self, dynamic)
    }
    fn drain_outbox(&mut self, sink: &mut dyn FnMut(EvictedUnit<'_>)) -> usize {
        ContextManager::drain_outbox(self, sink)
    }
    fn snapshot_len(&self) -> usize {
        ContextManager::snapshot_len(self)
    }
    fn snapshot_into<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], SnapshotError> {
        ContextManager::snapshot_into(self, buf)
    }
    fn restore_from(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        ContextManager::restore_from(self, bytes)
    }
    fn get(&self, id: u64) -> Option<MessageRef<'_>> {
        ContextManager::get(self, id)
    }
    fn history(&self) -> History<'_> {
        ContextManager::history(self)
    }
    fn messages(&self, level: Level) -> LevelMessages<'_> {
        ContextManager::messages(self, level)
    }
    fn session(&self) -> LevelMessages<'_> {
        ContextManager::session(self)
    }
    fn outbox(&self) -> Outbox<'_> {
        ContextManager::outbox(self)
    }
    fn summary_source(&self, first: u64, last: u64) -> SummarySource<'_> {
        ContextManager::summary_source(self, first, last)
    }
    fn entities(&self) -> Entities<'_> {
        ContextManager::entities(self)
    }
    fn config(&self) -> &Config {
        ContextManager::config(self)
    }
    fn counter(&self) -> &Counter {
        ContextManager::counter(self)
    }
    fn strategy(&self) -> &Builtin {
        ContextManager::strategy(self)
    }
    fn stats(&self) -> Stats {
        ContextManager::stats(self)
    }
    fn budget(&self) -> u32 {
        ContextManager::budget(self)
    }
    fn used(&self) -> u32 {
        ContextManager::used(self)
    }
    fn level_tokens(&self, level: Level) -> u32 {
        ContextManager::level_tokens(self, level)
    }
    fn next_id(&self) -> u64 {
        ContextManager::next_id(self)
    }
    fn unanswered_calls(&self) -> u8 {
        ContextManager::unanswered_calls(self)
    }
    fn start_task(&mut self, goal: &str, timestamp: u64) -> Result<u32, Error> {
        ContextManager::start_task(self, goal, timestamp)
    }
    fn push_opening_task(&mut self, message: Message<'_>, goal: &str) -> Result<u64, Error> {
        ContextManager::push_opening_task(self, message, goal)
    }
    fn set_task_relevance(&mut self, relevances: &[(u64, u16)]) -> Result<usize, Error> {
        ContextManager::set_task_relevance(self, relevances)
    }
    fn task_relevance(&self, id: u64) -> Option<u16> {
        ContextManager::task_relevance(self, id)
    }
    fn finish_task(&mut self, outcome: &str, timestamp: u64) -> Result<Task, Error> {
        ContextManager::finish_task(self, outcome, timestamp)
    }
    fn tasks(&self) -> &[Task] {
        ContextManager::tasks(self)
    }
    fn current_task(&self) -> Option<&Task> {
        ContextManager::current_task(self)
    }
}

/// The core manager a [`Session`](super::Session) drives: small until its content needs the
/// server tier. It dereferences to the [`SessionCore`] in use, so the core's calls read as on
/// a [`ContextManager`]; [`tier`](Self::tier) tells which is in use.
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut session = SessionBuilder::new("s").build()?;
/// assert_eq!(session.manager().tier(), "small");
/// session.push(&ChatMessage::text(Role::User, "word ".repeat(5_000)))?;
/// assert_eq!(session.manager().tier(), "server");
/// assert_eq!(session.manager().history().count(), 1);
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
pub struct SessionManager {
    core: Box<dyn SessionCore>,
    /// Whether `core` has the small tier's capacities.
    small: bool,
}

impl std::ops::Deref for SessionManager {
    type Target = dyn SessionCore;

    fn deref(&self) -> &Self::Target {
        &*self.core
    }
}

impl std::ops::DerefMut for SessionManager {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.core
    }
}

impl SessionManager {
    /// An empty manager of the small tier.
    ///
    /// # Errors
    /// [`SessionError::Config`] when the core refuses `config`.
    ///
    /// ```
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let manager = SessionManager::small(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// assert_eq!((manager.tier(), manager.used()), ("small", 0));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn small(config: Config, counter: Counter) -> Result<Self, SessionError> {
        let manager =
            ContextManager::<SmallCapacities>::builder().config(config).counter(counter).build()?;
        Ok(Self { core: Box::new(manager), small: true })
    }

    /// An empty manager of the server tier.
    ///
    /// # Errors
    /// [`SessionError::Config`]; [`SessionError::Allocation`] when the building thread fails.
    ///
    /// ```
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let manager = SessionManager::server(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// assert_eq!(manager.tier(), "server");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn server(config: Config, counter: Counter) -> Result<Self, SessionError> {
        Ok(Self { core: boxed_server(config, counter)?, small: false })
    }

    /// The tier in use: `"small"` or `"server"`.
    pub fn tier(&self) -> &'static str {
        if self.small { "small" } else { "server" }
    }

    /// The core manager, as the trait object the session drives.
    pub fn core(&self) -> &dyn SessionCore {
        &*self.core
    }

    /// Whether storing `bytes` more in `level` (and one more summary in the session level)
    /// keeps every ring of the small tier under its growth mark; always true on the server
    /// tier.
    ///
    /// ```
    /// use ctxwin_core::Level;
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let manager = SessionManager::small(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// assert!(manager.has_room(Level::Working, 1_000));
    /// assert!(!manager.has_room(Level::Working, 1_000_000));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn has_room(&self, level: Level, bytes: usize) -> bool {
        if !self.small {
            return true;
        }
        let stats = self.core.stats();
        Level::ALL.into_iter().all(|l| {
            let s = stats.level(l);
            let (adding, slots) = if l == level { (bytes, 2) } else { (0, 1) };
            let used = (s.bytes as usize).saturating_add(adding);
            let messages = (s.stored_messages as usize).saturating_add(slots);
            used.saturating_mul(100) <= (s.byte_capacity as usize).saturating_mul(GROW_PERCENT)
                && messages.saturating_mul(100)
                    <= (s.message_capacity as usize).saturating_mul(GROW_PERCENT)
        })
    }

    /// Moves a small manager to the server tier: its snapshot restored into a new server
    /// manager with the same counter (the configuration travels in the snapshot), with the
    /// task relevance supplied to it (which snapshots do not keep). The small
    /// manager stays in place if anything fails; nothing happens on the server tier.
    ///
    /// # Errors
    /// [`SessionError::Snapshot`]; as [`server`](Self::server).
    ///
    /// ```
    /// use ctxwin_core::Message;
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let mut manager = SessionManager::small(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// let id = manager.push(Message::user("kept across the move"))?;
    /// manager.grow()?;
    /// assert_eq!(manager.tier(), "server");
    /// assert_eq!(manager.get(id).unwrap().content(), "kept across the move");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grow(&mut self) -> Result<(), SessionError> {
        if !self.small {
            return Ok(());
        }
        let mut bytes = vec![0u8; self.core.snapshot_len()];
        let len = self.core.snapshot_into(&mut bytes).map_err(SessionError::Snapshot)?.len();
        let mut server = boxed_server(*self.core.config(), self.core.counter().clone())?;
        server.restore_from(&bytes[..len]).map_err(SessionError::Snapshot)?;
        // Snapshots do not keep the task relevance a caller supplied: carried over here.
        let relevances: Vec<(u64, u16)> = self
            .core
            .history()
            .filter_map(|m| Some((m.id(), self.core.task_relevance(m.id())?)))
            .collect();
        if !relevances.is_empty() {
            server.set_task_relevance(&relevances)?;
        }
        tracing::info!(bytes = len, "session: manager moved to the server tier");
        *self = Self { core: server, small: false };
        Ok(())
    }

    /// [`grow`](Self::grow)s unless storing `bytes` more in `level` keeps the small tier under
    /// its mark ([`has_room`](Self::has_room)).
    ///
    /// # Errors
    /// As [`grow`](Self::grow).
    pub fn grow_for(&mut self, level: Level, bytes: usize) -> Result<(), SessionError> {
        if self.has_room(level, bytes) { Ok(()) } else { self.grow() }
    }

    /// Restores `snapshot`, moving to the server tier when the small one cannot hold it (a
    /// snapshot written by a server-tier manager). All or nothing, as the core's restore.
    ///
    /// # Errors
    /// The core's refusal; as [`server`](Self::server).
    ///
    /// ```
    /// use ctxwin_core::Message;
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let config = ctxwin_core::Config::DEFAULT;
    /// let mut big = SessionManager::server(config, Counter::default())?;
    /// big.push(Message::user("from a server-tier checkpoint"))?;
    /// let mut bytes = vec![0u8; big.snapshot_len()];
    /// let len = big.snapshot_into(&mut bytes)?.len();
    /// let mut manager = SessionManager::small(config, Counter::default())?;
    /// manager.restore_tiered(&bytes[..len])?;
    /// assert_eq!((manager.tier(), manager.history().count()), ("server", 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn restore_tiered(&mut self, snapshot: &[u8]) -> Result<(), SessionError> {
        match self.core.restore_from(snapshot) {
            Err(SnapshotError::CapacityExceeded { .. }) if self.small => {
                let mut server = boxed_server(*self.core.config(), self.core.counter().clone())?;
                server.restore_from(snapshot).map_err(SessionError::Snapshot)?;
                *self = Self { core: server, small: false };
                Ok(())
            }
            other => other.map_err(SessionError::Snapshot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::capacities::{ServerManager, SmallManager};
    use super::*;

    #[test]
    fn the_small_tier_is_a_tenth_of_the_server_tier() {
        let small = core::mem::size_of::<SmallManager>();
        assert!(small < 200 * 1024, "{small}");
        assert!(small * 10 < core::mem::size_of::<ServerManager>());
    }

    #[test]
    fn growth_keeps_the_task_relevance_supplied() {
        let mut manager = SessionManager::small(Config::DEFAULT, Counter::default()).unwrap();
        manager.start_task("speed up the build", 0).unwrap();
        let id = manager.push(Message::assistant("sccache halves compile times")).unwrap();
        manager.set_task_relevance(&[(id, 900)]).unwrap();
        manager.grow().unwrap();
        assert_eq!(manager.tier(), "server");
        assert_eq!(manager.task_relevance(id), Some(900));
    }

    #[test]
    fn growth_keeps_everything_and_the_configuration() {
        let config = Config { context_window: 8_192, ..Config::DEFAULT };
        let mut manager = SessionManager::small(config, Counter::default()).unwrap();
        let mut ids = Vec::new();
        while manager.has_room(Level::Working, 400) {
            ids.push(manager.push(Message::user(&"word ".repeat(80))).unwrap());
        }
        assert_eq!(manager.outbox().count(), 0, "no small ring evicted before the mark");
        let before = manager.stats();
        manager.grow().unwrap();
        assert_eq!(manager.tier(), "server");
        assert_eq!(manager.stats().used, before.used);
        assert_eq!(manager.config(), &config);
        assert!(ids.iter().all(|id| manager.get(*id).is_some()));
        assert!(manager.has_room(Level::Working, 1 << 30));
    }

    /// What a manager holds, comparable across tiers: every live and evicted record.
    fn contents(manager: &SessionManager) -> Vec<(u64, Level, String, u32)> {
        let live = Level::ALL.into_iter().flat_map(|level| manager.messages(level));
        let evicted = manager.outbox().flat_map(|unit| unit.messages().collect::<Vec<_>>());
        live.chain(evicted)
            .map(|m| (m.id(), m.level(), m.content().to_string(), m.tokens()))
            .collect()
    }

    proptest::proptest! {
        /// A manager that starts small and grows when a push would pass the mark holds
        /// exactly what a server-tier manager holds after the same pushes: same ids, levels,
        /// texts, counts and evictions.
        #[test]
        fn a_growing_manager_matches_a_server_manager(
            sizes in proptest::collection::vec((1usize..3_000, 0u8..4), 1..120),
        ) {
            let config = Config { context_window: 16_384, ..Config::DEFAULT };
            let mut tiered = SessionManager::small(config, Counter::default()).unwrap();
            let mut server = SessionManager::server(config, Counter::default()).unwrap();
            for (n, (size, kind)) in sizes.into_iter().enumerate() {
                let text = format!("message {n} ") + &"lorem ipsum dolor ".repeat(size / 18 + 1);
                let (message, level) = match kind {
                    0 => (Message::user(&text), Level::Working),
                    1 => (Message::assistant(&text), Level::Working),
                    2 => (Message::system(&text), Level::Permanent),
                    _ => (Message::user(&text).in_level(Level::Volatile), Level::Volatile),
                };
                if !tiered.has_room(level, text.len()) {
                    tiered.grow().unwrap();
                }
                let a = tiered.push(message);
                let b = server.push(message);
                proptest::prop_assert_eq!(&a, &b);
                if a.is_err() {
                    tiered.drain_outbox(&mut |_| {});
                    server.drain_outbox(&mut |_| {});
                    proptest::prop_assert_eq!(tiered.push(Message::user("retry")).ok(), server.push(Message::user("retry")).ok());
                }
                proptest::prop_assert_eq!(contents(&tiered), contents(&server));
                tiered.drain_outbox(&mut |_| {});
                server.drain_outbox(&mut |_| {});
            }
        }
    }
}
