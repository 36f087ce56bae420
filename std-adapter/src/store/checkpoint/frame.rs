//! The framing around a payload inside a `.ckpt` file.
//!
//! Layout, all integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `CTXWCKPT` |
//! | 2 | format version ([`FORMAT_VERSION`]) |
//! | 2 | flags: 0, or [`FLAG_SEQUENCE`] |
//! | 8 | payload length |
//! | n | payload |
//! | 4 | CRC-32 (IEEE) of the payload |
//!
//! With [`FLAG_SEQUENCE`] the payload's first 8 bytes are the checkpoint's sequence number
//! (a u64 the store raises by one with every save, whatever the clock says; files without the
//! flag, from older builds, count as sequence 0), covered by the CRC like the rest.
//!
//! The trailer sits last so that a file cut short anywhere fails either the length check
//! or the CRC, never both silently.

use std::ops::Range;

/// First eight bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"CTXWCKPT";
/// Version of the framing written by this crate.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes before the payload.
pub(crate) const HEADER_LEN: usize = 20;
/// Flag: the payload starts with the checkpoint's sequence number (u64, little-endian).
pub const FLAG_SEQUENCE: u16 = 1;
/// Bytes of the sequence number.
pub(crate) const SEQUENCE_LEN: usize = 8;
/// Bytes after the payload.
pub(crate) const TRAILER_LEN: usize = 4;

/// Why the bytes of a checkpoint file are not a complete, intact frame.
///
/// ```
/// use ctxwin_std::store::checkpoint::FrameError;
/// let error = FrameError::CrcMismatch { stored: 1, computed: 2 };
/// assert!(error.to_string().contains("CRC"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The file ends inside the header: a write that never finished.
    #[error("torn file: {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    Torn {
        /// Actual file length.
        len: u64,
    },
    /// The file does not start with [`MAGIC`].
    #[error("bad magic {found:02x?}, expected \"CTXWCKPT\"")]
    BadMagic {
        /// The first eight bytes found.
        found: [u8; 8],
    },
    /// The file was written by a newer (or unknown) framing version.
    #[error("unsupported checkpoint format version {version}, this build reads {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// Version found in the header.
        version: u16,
    },
    /// Flags this build does not understand.
    #[error("unknown checkpoint flags {flags:#06x}")]
    UnknownFlags {
        /// Flags found in the header.
        flags: u16,
    },
    /// The file is shorter than its header promises.
    #[error("truncated file: {actual} bytes, header promises {expected}")]
    Truncated {
        /// Length implied by the header.
        expected: u64,
        /// Actual file length.
        actual: u64,
    },
    /// The file is longer than its header promises.
    #[error("trailing garbage: {actual} bytes, header promises {expected}")]
    TrailingBytes {
        /// Length implied by the header.
        expected: u64,
        /// Actual file length.
        actual: u64,
    },
    /// The payload does not match its checksum.
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC-32 from the trailer.
        stored: u32,
        /// CRC-32 of the payload as read.
        computed: u32,
    },
}

/// The header to write before `payload`.
#[cfg(test)]
pub(crate) fn header(payload: &[u8]) -> [u8; HEADER_LEN] {
    header_with_flags(payload, 0)
}

fn header_with_flags(payload: &[u8], flag_bits: u16) -> [u8; HEADER_LEN] {
    let mut header = [0; HEADER_LEN];
    let (magic, rest) = header.split_at_mut(MAGIC.len());
    magic.copy_from_slice(&MAGIC);
    let (version, rest) = rest.split_at_mut(2);
    version.copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let (flags, len) = rest.split_at_mut(2);
    flags.copy_from_slice(&flag_bits.to_le_bytes());
    // usize always fits u64 on supported targets.
    len.copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header
}

/// The trailer to write after `payload`.
/// A whole file: `payload` framed with sequence number `sequence` ([`FLAG_SEQUENCE`]).
pub(crate) fn sequenced(sequence: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(SEQUENCE_LEN + payload.len());
    body.extend_from_slice(&sequence.to_le_bytes());
    body.extend_from_slice(payload);
    let mut file = Vec::with_capacity(HEADER_LEN + body.len() + TRAILER_LEN);
    file.extend_from_slice(&header_with_flags(&body, FLAG_SEQUENCE));
    file.extend_from_slice(&body);
    file.extend_from_slice(&checksum(FLAG_SEQUENCE, &body).to_le_bytes());
    file
}

/// The sequence number a file's first bytes claim (unverified: for ordering only; 0 without
/// [`FLAG_SEQUENCE`]), or `None` when they are no checkpoint header.
pub(crate) fn peek_sequence(start: &[u8]) -> Option<u64> {
    let header = start.get(..HEADER_LEN)?;
    if header.get(..8)? != MAGIC {
        return None;
    }
    let flags = u16::from_le_bytes([header[10], header[11]]);
    if flags & FLAG_SEQUENCE == 0 {
        return Some(0);
    }
    let bytes = start.get(HEADER_LEN..HEADER_LEN + SEQUENCE_LEN)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// The verified sequence number and payload range of a whole file.
pub(crate) fn open(file: &[u8]) -> Result<(u64, Range<usize>), FrameError> {
    let range = payload_range(file)?;
    let flags = u16::from_le_bytes([file[10], file[11]]);
    if flags & FLAG_SEQUENCE == 0 {
        return Ok((0, range));
    }
    let body = &file[range.clone()];
    let sequence = body
        .first_chunk::<SEQUENCE_LEN>()
        .map(|bytes| u64::from_le_bytes(*bytes))
        .ok_or(FrameError::Torn { len: file.len() as u64 })?;
    Ok((sequence, range.start + SEQUENCE_LEN..range.end))
}

/// The CRC a frame with `flags` stores: of the payload alone for unflagged frames (as older
/// builds wrote them), of the flags and the payload otherwise, so that no flipped flag bit
/// goes unnoticed.
fn checksum(flags: u16, payload: &[u8]) -> u32 {
    if flags == 0 {
        return crc32fast::hash(payload);
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&flags.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

#[cfg(test)]
pub(crate) fn trailer(payload: &[u8]) -> [u8; TRAILER_LEN] {
    crc32fast::hash(payload).to_le_bytes()
}

/// Checks a whole file and returns where its payload lies.
pub(crate) fn payload_range(file: &[u8]) -> Result<Range<usize>, FrameError> {
    let actual = file.len() as u64;
    let (header, rest) =
        file.split_first_chunk::<HEADER_LEN>().ok_or(FrameError::Torn { len: actual })?;
    let (magic, fields) =
        header.split_first_chunk::<8>().ok_or(FrameError::Torn { len: actual })?;
    if *magic != MAGIC {
        return Err(FrameError::BadMagic { found: *magic });
    }
    let field =
        |at: usize| fields.get(at..at + 2).and_then(|b| b.try_into().ok()).map(u16::from_le_bytes);
    let version = field(0).unwrap_or_default();
    if version != FORMAT_VERSION {
        return Err(FrameError::UnsupportedVersion { version });
    }
    let flags = field(2).unwrap_or_default();
    if flags & !FLAG_SEQUENCE != 0 {
        return Err(FrameError::UnknownFlags { flags });
    }
    let payload_len = fields
        .get(4..12)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or_default();
    let expected = payload_len.saturating_add((HEADER_LEN + TRAILER_LEN) as u64);
    if actual < expected {
        return Err(FrameError::Truncated { expected, actual });
    }
    if actual > expected {
        return Err(FrameError::TrailingBytes { expected, actual });
    }
    let (payload, trailer) =
        rest.split_last_chunk::<TRAILER_LEN>().ok_or(FrameError::Torn { len: actual })?;
    let stored = u32::from_le_bytes(*trailer);
    let computed = checksum(flags, payload);
    if stored != computed {
        return Err(FrameError::CrcMismatch { stored, computed });
    }
    Ok(HEADER_LEN..HEADER_LEN + payload.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        [&header(payload)[..], payload, &trailer(payload)[..]].concat()
    }

    #[test]
    fn sequenced_frames_carry_their_number_under_the_crc() {
        let file = sequenced(42, b"state");
        assert_eq!(peek_sequence(&file), Some(42));
        let (sequence, range) = open(&file).unwrap();
        assert_eq!((sequence, &file[range]), (42, &b"state"[..]));
        assert_eq!(open(&frame(b"old")).unwrap().0, 0, "unflagged files are sequence 0");
        let mut flipped = file.clone();
        flipped[HEADER_LEN] ^= 1;
        assert!(matches!(open(&flipped), Err(FrameError::CrcMismatch { .. })));
        assert_eq!(peek_sequence(b"short"), None);
    }

    #[test]
    fn round_trips_and_reports_each_defect() {
        let payload = b"snapshot bytes";
        let good = frame(payload);
        assert_eq!(&good[payload_range(&good).unwrap()], payload);
        assert_eq!(payload_range(&frame(b"")).unwrap(), HEADER_LEN..HEADER_LEN);

        assert_eq!(payload_range(&good[..7]), Err(FrameError::Torn { len: 7 }));
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(payload_range(&bad), Err(FrameError::BadMagic { .. })));
        let mut bad = good.clone();
        bad[8] = 9;
        assert_eq!(payload_range(&bad), Err(FrameError::UnsupportedVersion { version: 9 }));
        let mut bad = good.clone();
        bad[10] = 2;
        assert_eq!(payload_range(&bad), Err(FrameError::UnknownFlags { flags: 2 }));
        let full = good.len() as u64;
        assert_eq!(
            payload_range(&good[..good.len() - 1]),
            Err(FrameError::Truncated { expected: full, actual: full - 1 })
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            payload_range(&long),
            Err(FrameError::TrailingBytes { expected: full, actual: full + 1 })
        );
        let mut flipped = good.clone();
        flipped[HEADER_LEN] ^= 1;
        assert!(matches!(payload_range(&flipped), Err(FrameError::CrcMismatch { .. })));
        let mut huge = good;
        huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            payload_range(&huge),
            Err(FrameError::Truncated { expected: u64::MAX, .. })
        ));
    }

    proptest! {
        #[test]
        fn every_proper_prefix_is_refused(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let file = frame(&payload);
            for cut in 0..file.len() {
                prop_assert!(payload_range(&file[..cut]).is_err());
            }
            prop_assert_eq!(&file[payload_range(&file).unwrap()], &payload[..]);
        }

        #[test]
        fn any_single_bit_flip_is_refused(
            payload in proptest::collection::vec(any::<u8>(), 1..300),
            at in any::<prop::sample::Index>(),
            bit in 0..8u8,
        ) {
            let mut file = frame(&payload);
            let at = at.index(file.len());
            file[at] ^= 1 << bit;
            prop_assert!(payload_range(&file).is_err());
        }
    }
}
