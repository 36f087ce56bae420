//! Compile-time capacities of a manager's four levels.

use crate::{Ring, RingStorage};

/// The storage of each level, chosen at compile time. `size_of` of a
/// [`ContextManager`](crate::ContextManager) is the sum of these rings plus a few hundred bytes:
/// the manager's whole RAM cost.
///
/// Define your own to fit a device:
///
/// ```
/// use ctxwin_core::{Capacities, ContextManager, Ring};
/// struct Sensor;
/// impl Capacities for Sensor {
///     type Permanent = Ring<4, 1024>;
///     type Session = Ring<4, 1024>;
///     type Working = Ring<32, 8192>;
///     type Volatile = Ring<8, 2048>;
/// }
/// static MANAGER: ContextManager<Sensor> = ContextManager::new();
/// assert!(core::mem::size_of::<ContextManager<Sensor>>() < 15 * 1024);
/// # let _ = &MANAGER;
/// ```
pub trait Capacities {
    /// System prompt, rules, tool definitions.
    type Permanent: RingStorage;
    /// Summaries and key decisions.
    type Session: RingStorage;
    /// Recent turns.
    type Working: RingStorage;
    /// Verbose output and exploration.
    type Volatile: RingStorage;
}

/// Server-sized defaults (about 250 KiB): room for the default budgets' text several times
/// over, so evicted units can wait in the outbox.
///
/// ```
/// use ctxwin_core::{ContextManager, DefaultCapacities};
/// assert!(core::mem::size_of::<ContextManager<DefaultCapacities>>() < 300 * 1024);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultCapacities;

impl Capacities for DefaultCapacities {
    type Permanent = Ring<16, 16_384>;
    type Session = Ring<32, 24_576>;
    type Working = Ring<256, 98_304>;
    type Volatile = Ring<64, 65_536>;
}

/// A few KiB: for examples, tests and the smallest microcontrollers.
///
/// ```
/// use ctxwin_core::{ContextManager, TinyCapacities};
/// assert!(core::mem::size_of::<ContextManager<TinyCapacities>>() < 8 * 1024);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TinyCapacities;

impl Capacities for TinyCapacities {
    type Permanent = Ring<4, 1024>;
    type Session = Ring<4, 768>;
    type Working = Ring<24, 3072>;
    type Volatile = Ring<8, 1024>;
}

/// Header and byte capacity of each level, in [`Level::ALL`](crate::Level::ALL) order.
pub(crate) const fn capacities_of<C: Capacities>() -> [(usize, usize); 4] {
    [
        (C::Permanent::MESSAGES, C::Permanent::BYTES),
        (C::Session::MESSAGES, C::Session::BYTES),
        (C::Working::MESSAGES, C::Working::BYTES),
        (C::Volatile::MESSAGES, C::Volatile::BYTES),
    ]
}
