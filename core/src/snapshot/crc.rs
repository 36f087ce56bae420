//! CRC-32/ISO-HDLC (the zlib/PNG CRC), nibble-table driven: 64 bytes of table, two lookups a
//! byte; small enough for flash, fast enough for snapshots.

const POLY: u32 = 0xEDB8_8320;

// Evaluated at compile time: an index out of range fails the build, it cannot panic at run time.
#[allow(clippy::indexing_slicing)]
const TABLE: [u32; 16] = {
    let mut table = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 4 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A running CRC-32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Crc32(u32);

impl Crc32 {
    pub(crate) const fn new() -> Self {
        Crc32(0xFFFF_FFFF)
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        let step = |crc: u32| (crc >> 4) ^ TABLE.get((crc & 0xF) as usize).copied().unwrap_or(0);
        for &byte in bytes {
            self.0 = step(step(self.0 ^ u32::from(byte)));
        }
    }

    pub(crate) const fn finish(self) -> u32 {
        self.0 ^ 0xFFFF_FFFF
    }
}

/// CRC-32 of `bytes`.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = Crc32::new();
    crc.update(bytes);
    crc.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_standard_check_value() {
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(super::crc32(b""), 0);
        let mut split = super::Crc32::new();
        split.update(b"1234");
        split.update(b"56789");
        assert_eq!(split.finish(), 0xCBF4_3926);
    }
}
