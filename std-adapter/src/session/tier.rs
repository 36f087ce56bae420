//! [`SessionManager`]: the core manager of a session, in one of two sizes. A session starts
//! in the [`SmallCapacities`] tier and moves to [`ServerCapacities`] (snapshot, then restore
//! into the larger manager) before its content could make the small rings evict.

use ctxwin_core::config::ConfigError;
use ctxwin_core::entities::{Entities, EntityError};
use ctxwin_core::manager::{EvictedUnit, Outbox, ReplaceError};
use ctxwin_core::strategy::Builtin;
use ctxwin_core::summarize::SummarySource;
use ctxwin_core::view::{History, LevelMessages};
use ctxwin_core::{
    Config, ContextManager, Error, Level, Message, MessageRef, Payload, SnapshotError, Stats,
};

use super::capacities::{ServerCapacities, SmallCapacities, boxed_server};
use super::{Counter, SessionError};

/// The core manager with [`ServerCapacities`] (about 1.7 MiB).
pub type ServerManager = ContextManager<ServerCapacities, Counter>;

/// The core manager with [`SmallCapacities`] (about 100 KiB).
pub type SmallManager = ContextManager<SmallCapacities, Counter>;

/// Share of a small ring (bytes or message slots) past which the session moves up a tier
/// before storing more: the core evicts a level when it passes `trigger_percent` (80% by
/// default) of its ring, so the small tier must never get close to it.
const GROW_PERCENT: usize = 40;

/// The core manager a [`Session`](super::Session) drives: small until its content needs the
/// server tier. Both tiers answer the same calls; [`tier`](Self::tier) tells which is in use.
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
pub enum SessionManager {
    /// Rings for short conversations.
    Small(Box<SmallManager>),
    /// Rings for 32k–200k-token windows.
    Server(Box<ServerManager>),
}

macro_rules! both {
    ($self:expr, $m:ident => $body:expr) => {
        match $self {
            SessionManager::Small($m) => $body,
            SessionManager::Server($m) => $body,
        }
    };
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
        Ok(Self::Small(Box::new(manager)))
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
        Ok(Self::Server(boxed_server(config, counter)?))
    }

    /// The tier in use: `"small"` or `"server"`.
    ///
    /// ```
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let manager = SessionManager::small(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// assert_eq!(manager.tier(), "small");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn tier(&self) -> &'static str {
        match self {
            Self::Small(_) => "small",
            Self::Server(_) => "server",
        }
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
        let Self::Small(manager) = self else { return true };
        let stats = manager.stats();
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
    /// manager with the same counter (the configuration travels in the snapshot). The small
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
        let Self::Small(small) = self else { return Ok(()) };
        let mut bytes = vec![0u8; small.snapshot_len()];
        let len = small.snapshot_into(&mut bytes).map_err(SessionError::Snapshot)?.len();
        let mut server = boxed_server(*small.config(), small.counter().clone())?;
        server.restore_from(&bytes[..len]).map_err(SessionError::Snapshot)?;
        tracing::info!(bytes = len, "session: manager moved to the server tier");
        *self = Self::Server(server);
        Ok(())
    }

    /// [`grow`](Self::grow)s unless storing `bytes` more in `level` keeps the small tier under
    /// its mark ([`has_room`](Self::has_room)).
    ///
    /// # Errors
    /// As [`grow`](Self::grow).
    ///
    /// ```
    /// use ctxwin_core::Level;
    /// use ctxwin_std::session::{Counter, SessionManager};
    /// let mut manager = SessionManager::small(ctxwin_core::Config::DEFAULT, Counter::default())?;
    /// manager.grow_for(Level::Working, 100)?;
    /// assert_eq!(manager.tier(), "small");
    /// manager.grow_for(Level::Working, 1_000_000)?;
    /// assert_eq!(manager.tier(), "server");
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
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
        match self.restore_from(snapshot) {
            Err(SnapshotError::CapacityExceeded { .. }) if matches!(self, Self::Small(_)) => {
                let mut server = boxed_server(*self.config(), self.counter().clone())?;
                server.restore_from(snapshot).map_err(SessionError::Snapshot)?;
                *self = Self::Server(server);
                Ok(())
            }
            other => other.map_err(SessionError::Snapshot),
        }
    }

    /// See [`ContextManager::push`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn push(&mut self, message: Message<'_>) -> Result<u64, Error> {
        both!(self, m => m.push(message))
    }

    /// See [`ContextManager::check`].
    ///
    /// # Errors
    /// What [`push`](Self::push) would refuse.
    pub fn check(&self, message: &Message<'_>) -> Result<u32, Error> {
        both!(self, m => m.check(message))
    }

    /// See [`ContextManager::add_tool_definition`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn add_tool_definition(&mut self, function_json: &str) -> Result<u64, Error> {
        both!(self, m => m.add_tool_definition(function_json))
    }

    /// See [`ContextManager::add_summary`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn add_summary(
        &mut self,
        text: &str,
        sources: &[(u64, u64)],
        timestamp: u64,
    ) -> Result<u64, Error> {
        both!(self, m => m.add_summary(text, sources, timestamp))
    }

    /// See [`ContextManager::abort_pending_calls`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn abort_pending_calls(&mut self) -> Result<(), Error> {
        both!(self, m => m.abort_pending_calls())
    }

    /// See [`ContextManager::replace_summary`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn replace_summary(&mut self, id: u64, text: &str) -> Result<u64, ReplaceError> {
        both!(self, m => m.replace_summary(id, text))
    }

    /// See [`ContextManager::set_entity`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn set_entity(&mut self, key: &str, value: Option<&str>) -> Result<(), EntityError> {
        both!(self, m => m.set_entity(key, value))
    }

    /// See [`ContextManager::set_config`].
    ///
    /// # Errors
    /// A configuration the core refuses.
    pub fn set_config(&mut self, config: Config) -> Result<(), ConfigError> {
        both!(self, m => m.set_config(config))
    }

    /// See [`ContextManager::compose`].
    ///
    /// # Errors
    /// The core's refusals.
    pub fn compose<'a>(&'a mut self, dynamic: &'a [&'a str]) -> Result<Payload<'a>, Error> {
        both!(self, m => m.compose(dynamic))
    }

    /// See [`ContextManager::drain_outbox`].
    pub fn drain_outbox(&mut self, sink: impl FnMut(EvictedUnit<'_>)) -> usize {
        both!(self, m => m.drain_outbox(sink))
    }

    /// See [`ContextManager::snapshot_len`].
    pub fn snapshot_len(&self) -> usize {
        both!(self, m => m.snapshot_len())
    }

    /// See [`ContextManager::snapshot_into`].
    ///
    /// # Errors
    /// A buffer too small.
    pub fn snapshot_into<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], SnapshotError> {
        both!(self, m => m.snapshot_into(buf))
    }

    /// See [`ContextManager::restore_from`] (in this tier; [`restore_tiered`](Self::restore_tiered)
    /// moves up when needed).
    ///
    /// # Errors
    /// The core's refusals.
    pub fn restore_from(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        both!(self, m => m.restore_from(bytes))
    }

    /// See [`ContextManager::get`].
    pub fn get(&self, id: u64) -> Option<MessageRef<'_>> {
        both!(self, m => m.get(id))
    }

    /// See [`ContextManager::history`].
    pub fn history(&self) -> History<'_> {
        both!(self, m => m.history())
    }

    /// See [`ContextManager::messages`].
    pub fn messages(&self, level: Level) -> LevelMessages<'_> {
        both!(self, m => m.messages(level))
    }

    /// See [`ContextManager::session`].
    pub fn session(&self) -> LevelMessages<'_> {
        both!(self, m => m.session())
    }

    /// See [`ContextManager::outbox`].
    pub fn outbox(&self) -> Outbox<'_> {
        both!(self, m => m.outbox())
    }

    /// See [`ContextManager::summary_source`].
    pub fn summary_source(&self, first: u64, last: u64) -> SummarySource<'_> {
        both!(self, m => m.summary_source(first, last))
    }

    /// See [`ContextManager::entities`].
    pub fn entities(&self) -> Entities<'_> {
        both!(self, m => m.entities())
    }

    /// See [`ContextManager::config`].
    pub fn config(&self) -> &Config {
        both!(self, m => m.config())
    }

    /// See [`ContextManager::counter`].
    pub fn counter(&self) -> &Counter {
        both!(self, m => m.counter())
    }

    /// See [`ContextManager::strategy`].
    pub fn strategy(&self) -> &Builtin {
        both!(self, m => m.strategy())
    }

    /// See [`ContextManager::stats`].
    pub fn stats(&self) -> Stats {
        both!(self, m => m.stats())
    }

    /// See [`ContextManager::budget`].
    pub fn budget(&self) -> u32 {
        both!(self, m => m.budget())
    }

    /// See [`ContextManager::used`].
    pub fn used(&self) -> u32 {
        both!(self, m => m.used())
    }

    /// See [`ContextManager::level_tokens`].
    pub fn level_tokens(&self, level: Level) -> u32 {
        both!(self, m => m.level_tokens(level))
    }

    /// See [`ContextManager::next_id`].
    pub fn next_id(&self) -> u64 {
        both!(self, m => m.next_id())
    }

    /// See [`ContextManager::unanswered_calls`].
    pub fn unanswered_calls(&self) -> u8 {
        both!(self, m => m.unanswered_calls())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_tier_is_a_tenth_of_the_server_tier() {
        let small = core::mem::size_of::<SmallManager>();
        assert!(small < 200 * 1024, "{small}");
        assert!(small * 10 < core::mem::size_of::<ServerManager>());
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
                    tiered.drain_outbox(|_| {});
                    server.drain_outbox(|_| {});
                    proptest::prop_assert_eq!(tiered.push(Message::user("retry")).ok(), server.push(Message::user("retry")).ok());
                }
                proptest::prop_assert_eq!(contents(&tiered), contents(&server));
                tiered.drain_outbox(|_| {});
                server.drain_outbox(|_| {});
            }
        }
    }
}
