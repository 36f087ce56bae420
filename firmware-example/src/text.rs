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

/// `value` in decimal, written at the end of `digits`.
pub fn decimal(mut value: u64, digits: &mut [u8; 20]) -> &str {
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
    core::str::from_utf8(digits.get(at..).unwrap_or_default()).unwrap_or_default()
}

/// Appends as much of `text` as fits after the first `len` bytes of `bytes`, whole chars
/// only; returns the new length. Not generic, so every buffer size shares one copy.
#[inline(never)]
fn append(bytes: &mut [u8], len: usize, text: &str) -> usize {
    let room = bytes.len().saturating_sub(len);
    let mut take = text.len().min(room);
    while !text.is_char_boundary(take) {
        take -= 1;
    }
    let end = len + take;
    match (bytes.get_mut(len..end), text.as_bytes().get(..take)) {
        (Some(target), Some(source)) => {
            target.copy_from_slice(source);
            end
        }
        _ => len,
    }
}

/// The first `len` bytes of `bytes` as text.
#[inline(never)]
fn text_of(bytes: &[u8], len: usize) -> &str {
    core::str::from_utf8(bytes.get(..len).unwrap_or_default()).unwrap_or_default()
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
        text_of(&self.bytes, self.len)
    }

    /// Appends as much of `text` as fits, whole chars only.
    pub fn push_str(&mut self, text: &str) -> &mut Self {
        self.len = append(&mut self.bytes, self.len, text);
        self
    }

    /// Appends `value` in decimal.
    pub fn push_u64(&mut self, value: u64) -> &mut Self {
        self.push_str(decimal(value, &mut [0; 20]))
    }

    /// Appends `tenths / 10` with one decimal, e.g. 215 as `21.5`.
    pub fn push_tenths(&mut self, tenths: u32) -> &mut Self {
        self.push_u64(u64::from(tenths / 10)).push_str(".").push_u64(u64::from(tenths % 10))
    }
}
