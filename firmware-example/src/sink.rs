//! Byte-slice helpers for checking request bodies.

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|window| window == needle)
}

/// A request body's destination in a byte buffer: `&mut [u8]`'s `embedded_io::Write`, copying
/// byte by byte. `&mut [u8]`'s own impl checks a slice length the optimizer cannot prove at
/// opt-level "z", which links a panic path (the handler logging through defmt) under
/// `write_openai`: about 300 B more on the full example's worst stack path.
///
/// ```
/// use embedded_io::Write;
/// let mut buf = [0u8; 4];
/// let mut out = ctxwin_firmware_example::sink::SliceOut::new(&mut buf);
/// assert_eq!(out.write(b"abcdef"), Ok(4));
/// assert_eq!(out.write(b"g"), Ok(0));
/// assert_eq!(&buf, b"abcd");
/// ```
pub struct SliceOut<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> SliceOut<'a> {
    /// Writes into `buf` from its start.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }
}

impl embedded_io::ErrorType for SliceOut<'_> {
    type Error = core::convert::Infallible;
}

impl embedded_io::Write for SliceOut<'_> {
    /// Copies what fits; `Ok(0)` once the buffer is full (the JSON writer reports that).
    fn write(&mut self, bytes: &[u8]) -> Result<usize, Self::Error> {
        let free = self.buf.get_mut(self.len..).unwrap_or_default();
        let copied = free.iter_mut().zip(bytes).map(|(to, from)| *to = *from).count();
        self.len += copied;
        Ok(copied)
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
