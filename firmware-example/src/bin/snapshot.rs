//! The minimal firmware plus snapshots: after the session the manager is snapshotted into a
//! static buffer and restored into a second static manager; the second must snapshot to the
//! identical bytes and both must compose byte-identical request bodies (the restored one's
//! written into the then free snapshot buffer), and a truncated or damaged snapshot must be
//! refused. Plain semihosting text, no defmt. `measure.sh` holds it to 36 KiB of flash and
//! 2 KiB of stack, restore included.
#![no_std]
#![no_main]
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use core::cell::RefCell;
use cortex_m_rt::entry;
use cortex_m_semihosting::debug;
use critical_section::{CriticalSection, Mutex};
use ctxwin_firmware_example::edge::{EDGE_MANAGER, EdgeManager, LEAN_CONFIG};
use ctxwin_firmware_example::lean;
use ctxwin_firmware_example::report::Report;
use ctxwin_firmware_example::scenario::DYNAMIC;
use ctxwin_firmware_example::stack;

/// Request body buffer; also scratch for generating the huge log.
const PAYLOAD_BYTES: usize = 8 * 1024;
/// The most a snapshot of an [`EdgeManager`] can take.
const SNAPSHOT_BYTES: usize = EdgeManager::SNAPSHOT_MAX_SIZE;
/// Most stack the run may use: issue 16's 2 KiB target, met (painted 1,700 B, static worst
/// path 1,840 B, restore included), so a regression past it fails the run itself.
const STACK_LIMIT: usize = 2048;

static MANAGER: Mutex<RefCell<EdgeManager>> = Mutex::new(RefCell::new(EDGE_MANAGER));
static RESTORED: Mutex<RefCell<EdgeManager>> = Mutex::new(RefCell::new(EDGE_MANAGER));
static PAYLOAD: Mutex<RefCell<[u8; PAYLOAD_BYTES]>> = Mutex::new(RefCell::new([0; PAYLOAD_BYTES]));
static SNAPSHOT: Mutex<RefCell<[u8; SNAPSHOT_BYTES]>> =
    Mutex::new(RefCell::new([0; SNAPSHOT_BYTES]));

#[entry]
fn main() -> ! {
    stack::paint();
    let mut report = Report::new();
    critical_section::with(|cs| run(cs, &mut report));
    report.exit_checked(STACK_LIMIT)
}

fn run(cs: CriticalSection<'_>, report: &mut Report) {
    let (Ok(mut manager), Ok(mut restored), Ok(mut payload), Ok(mut snapshot)) = (
        MANAGER.borrow(cs).try_borrow_mut(),
        RESTORED.borrow(cs).try_borrow_mut(),
        PAYLOAD.borrow(cs).try_borrow_mut(),
        SNAPSHOT.borrow(cs).try_borrow_mut(),
    ) else {
        report.check(false, "statics borrowed once");
        return;
    };
    report.value("RAM: manager ", core::mem::size_of::<EdgeManager>() as u64, " B");
    if !report.check(manager.set_config(LEAN_CONFIG).is_ok(), "manager configured") {
        return;
    }
    if !lean::session(&mut manager, &mut payload[..], report) {
        return;
    }
    report.value("stack high-water after the session: ", stack::high_water() as u64, " B");
    round_trip(&mut manager, &mut restored, &mut snapshot[..], &mut payload[..], report);
}

/// Snapshots `original`, restores it into `restored` (after a damaged copy was refused) and
/// compares their stats and request bodies.
#[inline(never)]
fn round_trip(
    original: &mut EdgeManager,
    restored: &mut EdgeManager,
    snapshot: &mut [u8],
    payload: &mut [u8],
    report: &mut Report,
) {
    let Ok(len) = original.snapshot_into(snapshot).map(|bytes| bytes.len()) else {
        report.check(false, "snapshot_into succeeded");
        return;
    };
    report.value("snapshot bytes: ", len as u64, "");
    let truncated = snapshot.get(..len / 2).unwrap_or_default();
    report.check(restored.restore_from(truncated).is_err(), "a truncated snapshot is refused");
    if let Some(byte) = snapshot.get_mut(len / 2) {
        *byte ^= 0x40;
    }
    let damaged = snapshot.get(..len).unwrap_or_default();
    report.check(restored.restore_from(damaged).is_err(), "a damaged snapshot is refused");
    if let Some(byte) = snapshot.get_mut(len / 2) {
        *byte ^= 0x40;
    }
    let bytes = snapshot.get(..len).unwrap_or_default();
    if !report.check(restored.restore_from(bytes).is_ok(), "restore_from succeeded") {
        return;
    }
    let same = same_snapshot(restored, payload, bytes);
    report.check(same, "restored manager snapshots to the identical bytes");
    let written = lean::compose(original, payload, report);
    // The snapshot buffer is free again: the restored manager's body is written there, by the
    // same (one) instance of `write_openai` as the original's.
    let same = same_payload(restored, snapshot, payload.get(..written).unwrap_or_default());
    report.check(written > 0 && same, "restored manager composes the identical payload");
}

/// Whether `manager` composes exactly `expected`, written into `scratch`. Out of line: the
/// composed payload is not on the stack during the restore.
#[inline(never)]
fn same_payload(manager: &mut EdgeManager, scratch: &mut [u8], expected: &[u8]) -> bool {
    match manager.compose(&DYNAMIC).and_then(|composed| lean::write(&composed, scratch)) {
        Ok(len) => scratch.get(..len) == Some(expected),
        Err(_) => false,
    }
}

/// Whether `manager` snapshots to exactly `expected`, written into `scratch`: the same
/// configuration, state (counters included) and records. Out of line, as `same_payload`.
#[inline(never)]
fn same_snapshot(manager: &EdgeManager, scratch: &mut [u8], expected: &[u8]) -> bool {
    manager.snapshot_into(scratch).is_ok_and(|bytes| bytes == expected)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    Report::new().line("panic");
    debug::exit(debug::EXIT_FAILURE);
    loop {
        cortex_m::asm::wfi();
    }
}
