//! postcard output flavors: count, fill a slice, or stream to an `embedded_io::Write`, all
//! without panicking (postcard's own `Slice` flavor asserts on its index).

use postcard::ser_flavors::Flavor;

use super::crc::Crc32;

/// Counts bytes.
pub(crate) struct Count(pub usize);

impl Flavor for Count {
    type Output = Self;

    fn try_push(&mut self, _: u8) -> postcard::Result<()> {
        self.0 += 1;
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0 += data.len();
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Self> {
        Ok(self)
    }
}

/// Fills a slice from its start.
pub(crate) struct Fill<'a> {
    pub buf: &'a mut [u8],
    pub at: usize,
}

impl Flavor for Fill<'_> {
    type Output = Self;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        let end = self.at + data.len();
        let target = self.buf.get_mut(self.at..end).ok_or(postcard::Error::SerializeBufferFull)?;
        target.copy_from_slice(data);
        self.at = end;
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Self> {
        Ok(self)
    }
}

/// Streams to a writer, keeping a CRC of everything written; an I/O failure is kept in
/// `error` (postcard's error type cannot carry it).
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

impl<W: embedded_io::Write> Flavor for Stream<W> {
    type Output = Self;

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.write(data).map_err(|kind| {
            self.error = Some(kind);
            postcard::Error::SerializeBufferFull
        })
    }

    fn finalize(self) -> postcard::Result<Self> {
        Ok(self)
    }
}
