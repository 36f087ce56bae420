//! Restore from arbitrary bytes: raw, and wrapped in a valid header and CRC so the fuzzer
//! reaches the body decoder instead of stopping at the checksum. Whatever is accepted must
//! leave a manager that works.
#![no_main]

use ctxwin_core::{ContextManager, Message, OpenAiRequest, TinyCapacities};
use libfuzzer_sys::fuzz_target;

type Manager = ContextManager<TinyCapacities>;

fn exercise(bytes: &[u8]) {
    let mut manager = Manager::new();
    if manager.restore_from(bytes).is_ok() {
        let _ = manager.stats();
        let _ = manager.push(Message::user("after restore"));
        let mut body = [0u8; 16 * 1024];
        if let Ok(payload) = manager.compose(&["dynamic"]) {
            let _ = payload.write_openai(&mut body[..], OpenAiRequest::default());
        }
        manager.drain_outbox(|unit| {
            let _ = unit.messages().count();
        });
        let mut again = [0u8; Manager::SNAPSHOT_MAX_SIZE];
        let _ = manager.snapshot_into(&mut again);
    }
}

/// `body` framed as a snapshot of an empty TinyCapacities manager, with its CRC fixed.
fn framed(body: &[u8]) -> Vec<u8> {
    let mut template = [0u8; Manager::SNAPSHOT_MAX_SIZE];
    let empty = Manager::new().snapshot_into(&mut template).map(|b| b.to_vec()).unwrap_or_default();
    let mut bytes = empty[..48].to_vec();
    bytes[44..48].copy_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(body);
    let crc = crc32(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fuzz_target!(|data: &[u8]| {
    exercise(data);
    exercise(&framed(data));
});
