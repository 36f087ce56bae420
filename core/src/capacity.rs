//! Compile-time capacities of a manager's four levels.

use crate::entities::{EntityStorage, EntityTable};
use crate::ring::{Ring, RingStorage};

/// The storage of each level, chosen at compile time. `size_of` of a
/// [`ContextManager`](crate::manager::ContextManager) is the sum of these rings plus a few hundred bytes:
/// the manager's whole RAM cost.
///
/// Define your own to fit a device:
///
/// ```
/// use ctxwin_core::{Capacities, ContextManager, entities::EntityTable, ring::Ring, capacity::Scratch};
/// struct Sensor;
/// impl Capacities for Sensor {
///     type Permanent = Ring<4, 1024>;
///     type Session = Ring<4, 1024>;
///     type Working = Ring<32, 8192>;
///     type Volatile = Ring<8, 2048>;
///     type Scratch = Scratch<256>;
///     type Entities = EntityTable<2, 32>;
/// }
/// static MANAGER: ContextManager<Sensor> = ContextManager::new();
/// assert!(core::mem::size_of::<ContextManager<Sensor>>() < 16 * 1024);
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
    /// Where summaries are written before they are stored; its size caps one summary.
    type Scratch: ScratchStorage;
    /// Entity values (keys come from the configuration's schema).
    type Entities: EntityStorage;
}

mod sealed {
    pub trait Sealed {}
}

/// A scratch buffer of `N` bytes (sealed storage trait for [`Capacities::Scratch`]).
///
/// ```
/// use ctxwin_core::{capacity::Scratch, capacity::ScratchStorage};
/// assert_eq!(<Scratch<512> as ScratchStorage>::EMPTY.bytes().len(), 512);
/// ```
#[derive(Clone, Debug)]
pub struct Scratch<const N: usize>([u8; N]);

/// Storage for [`Capacities::Scratch`], implemented by [`Scratch`] only (sealed).
pub trait ScratchStorage: sealed::Sealed {
    /// A zeroed buffer, usable in `const` context.
    const EMPTY: Self;
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl<const N: usize> sealed::Sealed for Scratch<N> {}

impl<const N: usize> ScratchStorage for Scratch<N> {
    const EMPTY: Self = Scratch([0; N]);

    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// Server-sized defaults (about 220 KiB): room for the default budgets' text several times
/// over, so evicted units can wait in the outbox; a 4 KiB summary scratch; 8 entities.
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
    type Scratch = Scratch<4096>;
    type Entities = EntityTable<8, 128>;
}

/// A few KiB: for examples, tests and the smallest microcontrollers.
///
/// ```
/// use ctxwin_core::{ContextManager, TinyCapacities};
/// assert!(core::mem::size_of::<ContextManager<TinyCapacities>>() < 9 * 1024);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TinyCapacities;

impl Capacities for TinyCapacities {
    type Permanent = Ring<4, 1024>;
    type Session = Ring<4, 768>;
    type Working = Ring<24, 3072>;
    type Volatile = Ring<8, 1024>;
    type Scratch = Scratch<512>;
    type Entities = EntityTable<4, 32>;
}

/// Header and byte capacity of each level, in [`Level::ALL`](crate::level::Level::ALL) order.
pub(crate) const fn capacities_of<C: Capacities>() -> [(usize, usize); 4] {
    [
        (C::Permanent::MESSAGES, C::Permanent::BYTES),
        (C::Session::MESSAGES, C::Session::BYTES),
        (C::Working::MESSAGES, C::Working::BYTES),
        (C::Volatile::MESSAGES, C::Volatile::BYTES),
    ]
}
