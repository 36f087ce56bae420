//! Stack high-water mark by painting: fill the unused stack with a pattern at boot, then find
//! the lowest word the program overwrote.
//!
//! The only `unsafe` of the firmware besides the benchmark markers: raw reads and writes of
//! the memory between cortex-m-rt's `_stack_end` (lowest stack address) and the live stack.
#![allow(unsafe_code)]

const PAINT: u32 = 0xCCCC_CCCC;

/// Bytes below the stack pointer left unpainted: room for `paint`'s own callees.
const GUARD: usize = 64;

unsafe extern "C" {
    static _stack_start: u32;
    static _stack_end: u32;
}

fn bounds() -> (usize, usize) {
    (&raw const _stack_end as usize, &raw const _stack_start as usize)
}

/// Fills the free stack (below the current frame) with the paint pattern. Call first thing
/// in `main`.
#[inline(never)]
pub fn paint() {
    let (bottom, _) = bounds();
    let limit = (cortex_m::register::msp::read() as usize).saturating_sub(GUARD) & !3;
    let mut at = bottom;
    while at < limit {
        // SAFETY: `bottom..limit` is inside RAM, below every live frame (cortex-m-rt puts the
        // stack between `_stack_end` and `_stack_start`), word-aligned, and nothing else owns it.
        unsafe { core::ptr::write_volatile(at as *mut u32, PAINT) };
        at += 4;
    }
}

/// Bytes of stack used so far at most (since [`paint`]): from the top of RAM down to the
/// lowest overwritten word.
pub fn high_water() -> usize {
    let (bottom, top) = bounds();
    let mut at = bottom;
    while at < top {
        // SAFETY: as in `paint`: aligned words of the stack region, read without references.
        if unsafe { core::ptr::read_volatile(at as *const u32) } != PAINT {
            break;
        }
        at += 4;
    }
    top - at
}

/// Bytes between the stack's lowest address and the top of RAM: what the stack may grow to.
pub fn size() -> usize {
    let (bottom, top) = bounds();
    top - bottom
}
