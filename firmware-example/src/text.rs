//! A fixed-capacity text buffer with integer formatting, so the firmware needs no `core::fmt`
//! (which would cost several KiB of flash).

/// `(value / 10, value % 10)` by long division on 16-bit limbs in 32-bit registers: no call
/// to the 64-bit division helper (~0.9 KiB of flash on a 32-bit MCU).
fn div10(value: u64) -> (u64, u8) {
    let mut quotient = 0u64;
    let mut remainder = 0u32;
    for shift in [48u32, 32, 16, 0] {
        let limb = (remainder << 16) | ((value >> shift) as u32 & 0xFFFF);
        quotient = (quotient << 16) | u64::from(limb / 10);
        remainder = limb % 10;
    }
    (quotient, remainder as u8)
}

/// Up to `N` bytes of UTF-8 text; pushes past the end are cut at a char boundary.
#[derive(Clone, Copy, Debug)]
pub struct TextBuf<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Default for TextBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> TextBuf<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        Self { bytes: [0; N], len: 0 }
    }

    /// Empties the buffer.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }

    /// Appends as much of `text` as fits, whole chars only.
    pub fn push_str(&mut self, text: &str) -> &mut Self {
        let room = N - self.len;
        let mut take = text.len().min(room);
        while !text.is_char_boundary(take) {
            take -= 1;
        }
        let end = self.len + take;
        if let (Some(target), Some(source)) =
            (self.bytes.get_mut(self.len..end), text.as_bytes().get(..take))
        {
            target.copy_from_slice(source);
            self.len = end;
        }
        self
    }

    /// Appends `value` in decimal.
    pub fn push_u64(&mut self, mut value: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            let (quotient, digit) = div10(value);
            if let Some(slot) = digits.get_mut(at) {
                *slot = b'0' + digit;
            }
            value = quotient;
            if value == 0 || at == 0 {
                break;
            }
        }
        let text = core::str::from_utf8(digits.get(at..).unwrap_or_default()).unwrap_or_default();
        self.push_str(text)
    }

    /// Appends `tenths / 10` with one decimal, e.g. 215 as `21.5`.
    pub fn push_tenths(&mut self, tenths: u32) -> &mut Self {
        self.push_u64(u64::from(tenths / 10)).push_str(".").push_u64(u64::from(tenths % 10))
    }
}
