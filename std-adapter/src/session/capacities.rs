//! [`SmallCapacities`] and [`ServerCapacities`]: ring sizes of the two tiers of a session's
//! manager, and allocating a server-tier manager on the heap.

use ctxwin_core::{
    Capacities, Config, ContextManager, Level, capacity::Scratch, entities::EntityTable,
    ring::Ring, ring::RingStorage,
};

use super::{Counter, SessionError};

/// Capacities for server and desktop agents with 32k–200k-token windows (about 1.8 MiB of
/// heap per session).
///
/// Text costs about 4 bytes per token in English prose and 3 in code or JSON, and the core
/// starts evicting a level when its bytes or message slots pass `trigger_percent` (80%) of
/// capacity, so each arena is sized for the largest budget a 200k window gives that level:
///
/// | level | messages | bytes | why |
/// |---|---:|---:|---|
/// | permanent | 128 | 128 KiB | a system prompt of a few thousand tokens plus 50–100 tool definitions with JSON schemas (0.5–1.5 KiB each) |
/// | session | 128 | 64 KiB | summaries and decisions: up to a 16k-token session budget, 400-token summaries |
/// | working | 4,096 | 1 MiB | the conversation: 80% of 1 MiB is ~200k tokens of prose, ~260k of code; 3,276 live messages average ≥ 60 tokens at a full 200k window, which agent turns (tool calls, 1–4k-token tool outputs) exceed |
/// | volatile | 1,024 | 256 KiB | verbose output a caller routes there explicitly |
///
/// A 4,000-token tool output is ~16 KiB: above the default `observation_limit` (1,000 tokens)
/// it is stored reduced to ~4 KiB, and even unreduced 50 of them fit the working arena. The
/// 16 KiB scratch caps one summary at ~4k tokens; the entity table holds the core's maximum of
/// 8 keys with values up to 256 bytes. Budgets come from the [`Config`]: these capacities only
/// need to be large enough not to be what evicts first.
///
/// ```
/// use ctxwin_std::session::ServerManager;
/// let size = core::mem::size_of::<ServerManager>();
/// assert!(size > 1_500_000 && size < 2_000_000, "{size}");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerCapacities;

/// Capacities every session starts with (about 100 KiB): a short conversation never needs
/// more, and a proxy holds hundreds of them resident.
///
/// The session moves to [`ServerCapacities`] before any ring passes 40% of its bytes or
/// slots (see [`SessionManager::has_room`](super::SessionManager::has_room)), far below the
/// `trigger_percent` at which the core would evict for lack of room, so the budgets of the
/// [`Config`] decide evictions in both tiers alike. The scratch buffer and entity table are
/// the server tier's: a summary can be as long in either tier.
///
/// | level | messages | bytes |
/// |---|---:|---:|
/// | permanent | 32 | 8 KiB |
/// | session | 32 | 40 KiB |
/// | working | 256 | 16 KiB |
/// | volatile | 16 | 4 KiB |
///
/// The session ring keeps 40 KiB so that a summary as long as the scratch buffer (16 KiB)
/// stored at the growth mark stays under the core's trigger. The working ring holds about
/// 6 KiB of conversation (1,500 tokens) below the mark: every byte of the tier is touched when
/// it is built, so it is sized for short conversations, and longer ones pay for the server
/// tier when they get there.
///
/// ```
/// use ctxwin_std::session::SmallManager;
/// let size = core::mem::size_of::<SmallManager>();
/// assert!(size < 110 * 1024, "{size}");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SmallCapacities;

impl Capacities for SmallCapacities {
    type Permanent = Ring<32, { 8 * 1024 }>;
    type Session = Ring<32, { 40 * 1024 }>;
    type Working = Ring<256, { 16 * 1024 }>;
    type Volatile = Ring<16, { 4 * 1024 }>;
    type Scratch = Scratch<{ 16 * 1024 }>;
    type Entities = EntityTable<8, 256>;
}

impl Capacities for ServerCapacities {
    type Permanent = Ring<128, { 128 * 1024 }>;
    type Session = Ring<128, { 64 * 1024 }>;
    type Working = Ring<4096, { 1024 * 1024 }>;
    type Volatile = Ring<1024, { 256 * 1024 }>;
    type Scratch = Scratch<{ 16 * 1024 }>;
    type Entities = EntityTable<8, 256>;
}

impl ServerCapacities {
    /// Bytes of text `level` can hold: the largest message it could ever take.
    ///
    /// ```
    /// use ctxwin_core::Level;
    /// use ctxwin_std::session::ServerCapacities;
    /// assert_eq!(ServerCapacities::arena_bytes(Level::Working), 1024 * 1024);
    /// ```
    pub const fn arena_bytes(level: Level) -> usize {
        type C = ServerCapacities;
        match level {
            Level::Permanent => <<C as Capacities>::Permanent as RingStorage>::BYTES,
            Level::Session => <<C as Capacities>::Session as RingStorage>::BYTES,
            Level::Working => <<C as Capacities>::Working as RingStorage>::BYTES,
            Level::Volatile => <<C as Capacities>::Volatile as RingStorage>::BYTES,
        }
    }
}

/// The core manager with [`ServerCapacities`] (about 1.7 MiB).
pub type ServerManager = ContextManager<ServerCapacities, Counter>;

/// The core manager with [`SmallCapacities`] (about 100 KiB).
pub type SmallManager = ContextManager<SmallCapacities, Counter>;

/// Builds an empty server-tier manager directly on the heap.
///
/// The manager is almost 2 MiB and a value is built on the stack before `Box::new` moves it;
/// unoptimized builds keep several copies there, more than a 2 MiB thread stack holds. The
/// core has no in-place constructor and this crate uses no `unsafe`, so the value is built on
/// a short-lived thread with a stack large enough, and only the `Box` comes back.
pub(crate) fn boxed_server(
    config: Config,
    counter: Counter,
) -> Result<Box<ServerManager>, SessionError> {
    let stack = core::mem::size_of::<ServerManager>().saturating_mul(8).saturating_add(1 << 20);
    let worker = std::thread::Builder::new()
        .name("ctxwin-session-alloc".into())
        .stack_size(stack)
        .spawn(move || {
            ContextManager::<ServerCapacities>::builder()
                .config(config)
                .counter(counter)
                .build()
                .map(Box::new)
        })
        .map_err(|error| SessionError::Allocation(error.to_string()))?;
    let built = worker
        .join()
        .map_err(|_| SessionError::Allocation("the allocating thread panicked".into()))?;
    Ok(built?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxwin_core::{Level, counter::TokenCounter};

    #[test]
    fn builds_on_a_small_stack_thread() {
        let handle = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| boxed_server(Config::DEFAULT, Counter::default()).map(|m| m.budget()))
            .unwrap();
        assert_eq!(handle.join().unwrap().unwrap(), Config::DEFAULT.budget());
    }

    #[test]
    fn a_200k_window_fits_the_working_arena() {
        let manager = boxed_server(Config::DEFAULT, Counter::default()).unwrap();
        let working = manager.stats().level(Level::Working);
        let prose = "The quick brown fox jumps over the lazy dog. ".repeat(1000);
        let bytes_per_token = prose.len() as f64 / f64::from(Counter::default().count(&prose));
        let tokens_at_trigger = f64::from(working.byte_capacity) * 0.8 / bytes_per_token;
        // The estimator's margin makes prose look cheaper per byte than it is.
        assert!(tokens_at_trigger > 150_000.0, "{tokens_at_trigger}");
    }

    #[test]
    fn refuses_an_invalid_config() {
        let bad = Config { trigger_percent: 0, ..Config::DEFAULT };
        assert!(matches!(boxed_server(bad, Counter::default()), Err(SessionError::Config(_))));
    }
}
