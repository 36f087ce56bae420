//! The device-specific part of the vector table: the 32 interrupt lines of the MPS2 AN386's
//! Cortex-M4 (UARTs, timers, GPIO), all routed to cortex-m-rt's `DefaultHandler`; the firmware
//! enables none of them.
//!
//! Without its `device` feature, cortex-m-rt reserves the architectural maximum of 240
//! vectors: 960 B of flash for interrupts this board does not have. With the feature on, the
//! application provides `__INTERRUPTS` itself (and `device.x`, written empty by `build.rs`),
//! which costs 128 B here.
#![allow(unsafe_code)]

/// External interrupt lines of the MPS2 AN386 (Cortex-M4 FPGA image).
pub const INTERRUPTS: usize = 32;

unsafe extern "C" {
    fn DefaultHandler();
}

/// One interrupt vector: a handler address (the reserved-slot variant keeps the layout the
/// Cortex-M ABI expects).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)]
pub union Vector {
    handler: unsafe extern "C" fn(),
    reserved: usize,
}

/// The interrupt part of the vector table, placed by cortex-m-rt's `link.x` right after the
/// 16 exception vectors.
#[unsafe(link_section = ".vector_table.interrupts")]
#[unsafe(no_mangle)]
pub static __INTERRUPTS: [Vector; INTERRUPTS] = [Vector { handler: DefaultHandler }; INTERRUPTS];
