//! Where an encoded snapshot goes: counted, written into a slice, or streamed to an
//! `embedded_io::Write` with a running CRC. One small trait object, so the encoder is compiled
//! once for all three (and for every manager type), and none of them can panic.

use super::crc::Crc32;

/// A byte sink; `put` returns `false` once the bytes do not fit or could not be written.
pub(crate) trait Out {
    fn put(&mut self, data: &[u8]) -> bool;
}

/// Counts bytes.
pub(crate) struct Count(pub usize);

impl Out for Count {
    fn put(&mut self, data: &[u8]) -> bool {
        self.0 += data.len();
        true
    }
}

/// Fills a slice from its start.
pub(crate) struct Fill<'a> {
    pub buf: &'a mut [u8],
    pub at: usize,
}

impl Out for Fill<'_> {
    fn put(&mut self, data: &[u8]) -> bool {
        let end = self.at + data.len();
        let Some(target) = self.buf.get_mut(self.at..end) else { return false };
        target.copy_from_slice(data);
        self.at = end;
        true
    }
}

/// Streams to a writer, keeping a CRC of everything written; an I/O failure is kept in
/// `error`.
pub(crate) struct Stream<W> {
    pub out: W,
    pub crc: Crc32,
    pub error: Option<embedded_io::ErrorKind>,
}

impl<W: embedded_io::Write> Stream<W> {
    pub(crate) fn write(&mut self, mut data: &[u8]) -> Result<(), embedded_io::ErrorKind> {
        self.crc.update(data);
        while !data.is_empty() {
            match self.out.write(data) {
                Ok(0) => return Err(embedded_io::ErrorKind::WriteZero),
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(error) => return Err(embedded_io::Error::kind(&error)),
            }
        }
        Ok(())
    }
}

impl<W: embedded_io::Write> Out for Stream<W> {
    fn put(&mut self, data: &[u8]) -> bool {
        match self.write(data) {
            Ok(()) => true,
            Err(kind) => {
                self.error = Some(kind);
                false
            }
        }
    }
}
