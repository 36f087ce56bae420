//! Instruction-count markers: `measure.sh` runs the `icount` binary under
//! `qemu -d exec -singlestep` and counts the instructions executed between a call of
//! [`ctxwin_bench_start`] and the next call of [`ctxwin_bench_end`].
#![allow(unsafe_code)]

use core::hint::black_box;

/// Opens a measured region. `no_mangle` so the trace script finds it by name; its body
/// differs from [`ctxwin_bench_end`]'s so the linker cannot fold the two.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn ctxwin_bench_start() {
    // `black_box` is an opaque side effect: without one, calls to an empty function are deleted.
    black_box(1u32);
}

/// Closes a measured region.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn ctxwin_bench_end() {
    black_box(2u32);
}

/// Runs `f` between the markers.
#[inline(always)]
pub fn measured<R>(f: impl FnOnce() -> R) -> R {
    ctxwin_bench_start();
    let result = f();
    ctxwin_bench_end();
    result
}
