//! A seeded random number generator (SplitMix64): the session must come out the same on every
//! machine and every toolchain, which a crate's `StdRng` does not promise across versions.

/// SplitMix64 (Steele, Lea and Flood 2014): 64 bits of state, every seed a full-period stream.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// A float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() - 1)]
    }

    /// A number between `lo` and `hi` drawn log-uniformly (sizes of files and logs).
    pub fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(lo + 1) as f64).ln());
        (a + (b - a) * self.unit()).exp().round() as usize
    }

    /// `n` characters of the base64 alphabet (signatures, encrypted blobs, ids).
    pub fn base64(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..n).map(|_| ALPHABET[(self.next_u64() % 64) as usize] as char).collect()
    }

    /// `n` characters of `[0-9A-Za-z]` (the tail of Anthropic ids).
    pub fn base62(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        (0..n).map(|_| ALPHABET[(self.next_u64() % 62) as usize] as char).collect()
    }

    /// `n` lowercase hex digits.
    pub fn hex(&mut self, n: usize) -> String {
        (0..n).map(|_| char::from_digit((self.next_u64() % 16) as u32, 16).unwrap_or('0')).collect()
    }
}
