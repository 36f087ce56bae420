//! Snapshot round trip (cargo feature `snapshot`): the manager is written into a static
//! buffer, restored into a second manager, which must snapshot to the identical bytes, and
//! both must compose byte-identical request bodies (the second written into the then free
//! snapshot buffer).

use crate::check::Checks;
use crate::edge::EdgeManager;
use crate::scenario::DYNAMIC;
use crate::sink::SliceOut;
use ctxwin_core::OpenAiRequest;
use defmt::{error, info};

/// Size of the snapshot buffer: the most a snapshot of an [`EdgeManager`] can take.
pub const SNAPSHOT_BYTES: usize = EdgeManager::SNAPSHOT_MAX_SIZE;

/// Snapshots `original` into `snapshot`, restores it into `restored` and compares the two
/// managers' payloads (the first written into `payload`, the second compared against it on
/// the fly). Not inlined, so its locals are not on the stack while the session runs.
#[inline(never)]
pub fn round_trip(
    original: &mut EdgeManager,
    restored: &mut EdgeManager,
    snapshot: &mut [u8],
    payload: &mut [u8],
    request: OpenAiRequest<'_>,
    checks: &mut Checks,
) {
    let Ok(len) = original.snapshot_into(snapshot).map(|bytes| bytes.len()) else {
        checks.check(false, "snapshot_into succeeded");
        return;
    };
    info!("snapshot: {=usize} B (buffer {=usize} B)", len, SNAPSHOT_BYTES);
    let bytes = snapshot.get(..len).unwrap_or_default();
    if !checks.check(restored.restore_from(bytes).is_ok(), "restore_from succeeded") {
        return;
    }
    let same = same_snapshot(restored, payload, bytes);
    checks.check(same, "restored manager snapshots to the identical bytes");
    let Ok(written) = write_payload(original, payload, request) else {
        error!("original manager failed to compose after the snapshot");
        checks.check(false, "original composes after the snapshot");
        return;
    };
    // The snapshot buffer is free again: the restored manager's body is written there, by the
    // same (one) instance of `write_openai` as the original's.
    let same =
        same_payload(restored, snapshot, payload.get(..written).unwrap_or_default(), request);
    info!("restored manager composes {=usize} B of JSON, identical: {=bool}", written, same);
    checks.check(same, "restored manager composes the identical payload");
}

// The helpers below are not inlined: a composed payload, its writer and two `Stats` values
// should not all sit in one frame.

/// Composes `manager`'s payload into `out`; returns the bytes written.
#[inline(never)]
fn write_payload(
    manager: &mut EdgeManager,
    out: &mut [u8],
    request: OpenAiRequest<'_>,
) -> Result<usize, ctxwin_core::Error> {
    manager
        .compose(&DYNAMIC)
        .and_then(|composed| composed.write_openai(SliceOut::new(out), request))
}

/// Whether `manager` composes exactly `expected`, written into `scratch`.
#[inline(never)]
fn same_payload(
    manager: &mut EdgeManager,
    scratch: &mut [u8],
    expected: &[u8],
    request: OpenAiRequest<'_>,
) -> bool {
    write_payload(manager, scratch, request).is_ok_and(|len| scratch.get(..len) == Some(expected))
}

/// Whether `manager` snapshots to exactly `expected`, written into `scratch`: the same
/// configuration, state (counters included) and records.
#[inline(never)]
fn same_snapshot(manager: &EdgeManager, scratch: &mut [u8], expected: &[u8]) -> bool {
    manager.snapshot_into(scratch).is_ok_and(|bytes| bytes == expected)
}
