//! Crate-private logging shim: forwards to `defmt` when the feature is on, compiles to nothing
//! otherwise, so eviction decisions are observable on a device at no cost on the host.
#![allow(unused_macros)]

macro_rules! trace {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::trace!($($arg)*);
    }};
}

macro_rules! debug {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::debug!($($arg)*);
    }};
}

macro_rules! warn {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::warn!($($arg)*);
    }};
}
