//! Snapshots: a manager's whole state as bytes (postcard body, versioned, CRC-checked),
//! restorable after a restart. The layout is specified in `core/SNAPSHOT.md`. The body is
//! encoded and decoded by hand (`wire`, `decode`), in postcard's wire format, byte for byte.
//!
//! ```
//! use ctxwin_core::{ContextManager, Message, TinyCapacities};
//! type Manager = ContextManager<TinyCapacities>;
//!
//! let mut manager = Manager::new();
//! manager.push(Message::user("remember the milk"))?;
//! let mut buffer = [0u8; Manager::SNAPSHOT_MAX_SIZE];
//! let bytes = manager.snapshot_into(&mut buffer)?;
//!
//! let mut restored = Manager::new();
//! restored.restore_from(bytes)?;
//! assert_eq!(restored.stats(), manager.stats());
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```

mod crc;
mod decode;
mod error;
mod flavor;
mod wire;

pub use error::{Invariant, SnapshotError};

use crate::capacity::{Capacities, capacities_of};
use crate::config::Config;
use crate::counter::TokenCounter;
use crate::entities::EntityStorage;
use crate::header::Header;
use crate::level::Level;
use crate::manager::ContextManager;
use crate::manager::State;
use crate::record::{SpanWriter, Trailer};
use crate::strategy::Strategy;
use crc::Crc32;
use decode::{Sink, Validate, decode};
use flavor::{Count, Fill, Out, Stream};
use wire::{FORMAT_VERSION, HEADER_LEN, MAGIC, OLDEST_READ, TRAILER_LEN};

/// Loads decoded records into a manager.
struct Load<'m, C: Capacities, K: TokenCounter, S: Strategy>(&'m mut ContextManager<C, K, S>);

impl<'a, C: Capacities, K: TokenCounter, S: Strategy> Sink<'a> for Load<'_, C, K, S> {
    fn config(&mut self, config: &Config) {
        self.0.reset_to(config);
    }

    fn state(&mut self, state: &State) {
        self.0.set_state(state);
    }

    fn record(&mut self, level: Level, header: &Header, trailer: Trailer, bytes: &'a [u8]) {
        let header = Header { flags: header.flags | trailer.flag(), ..*header };
        let _ = self.0.ring_mut(level).push_back(header, bytes.len() + trailer.len(), |span| {
            let mut out = SpanWriter::new(span);
            out.put(bytes);
            trailer.write(&mut out);
        });
    }

    fn entity(&mut self, index: usize, value: Option<&'a [u8]>) {
        self.0.load_entity(index, value);
    }

    #[cfg(feature = "tasks")]
    fn task(&mut self, task: &crate::task::Task) {
        self.0.load_task(task);
    }

    fn end(&mut self) {
        self.0.recount_live();
        self.0.recount_entities();
    }
}

/// The fixed header in front of the body, as bytes.
#[cfg(test)]
fn header_bytes(
    fingerprint: u32,
    capacities: [(usize, usize); 4],
    body_len: usize,
) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    let mut fill = Fill { buf: &mut header, at: 0 };
    assert!(wire::encode_header(&mut fill, fingerprint, capacities, body_len));
    header
}

fn le_u16(bytes: &[u8], at: usize) -> u16 {
    bytes.get(at..at + 2).and_then(|b| b.try_into().ok()).map_or(0, u16::from_le_bytes)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes)
}

/// The parts of a snapshot `open` checked: its body, its configuration fingerprint and its
/// format version.
struct Opened<'a> {
    body: &'a [u8],
    fingerprint: u32,
    version: u16,
}

/// Checks the header, length and CRC of `bytes`; returns the body, the header fingerprint and
/// the version.
fn open(bytes: &[u8], capacities: [(usize, usize); 4]) -> Result<Opened<'_>, SnapshotError> {
    let minimum = HEADER_LEN + TRAILER_LEN;
    if bytes.len() < minimum {
        return Err(SnapshotError::Truncated { needed: minimum, got: bytes.len() });
    }
    if bytes.get(..4) != Some(&MAGIC[..]) {
        return Err(SnapshotError::BadMagic);
    }
    let version = le_u16(bytes, 4);
    if !(OLDEST_READ..=FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion { found: version });
    }
    if le_u16(bytes, 6) != 0 {
        return Err(SnapshotError::UnsupportedFlags);
    }
    let body_len = le_u32(bytes, HEADER_LEN - 4) as usize;
    let total = minimum.saturating_add(body_len);
    if bytes.len() < total {
        return Err(SnapshotError::Truncated { needed: total, got: bytes.len() });
    }
    let covered = bytes.get(..HEADER_LEN + body_len).unwrap_or_default();
    let stored = le_u32(bytes, HEADER_LEN + body_len);
    let computed = crc::crc32(covered);
    if stored != computed {
        return Err(SnapshotError::CrcMismatch { stored, computed });
    }
    for level in Level::ALL {
        let (messages, capacity) = capacities.get(level.index()).copied().unwrap_or_default();
        let at = 12 + level.index() * 8;
        let (theirs_messages, theirs_bytes) = (le_u32(bytes, at), le_u32(bytes, at + 4));
        if theirs_messages as usize > messages || theirs_bytes as usize > capacity {
            return Err(SnapshotError::CapacityExceeded {
                level,
                messages: theirs_messages,
                bytes: theirs_bytes,
            });
        }
    }
    let body = covered.get(HEADER_LEN..).unwrap_or_default();
    Ok(Opened { body, fingerprint: le_u32(bytes, 8), version })
}

impl<C: Capacities, K: TokenCounter, S: Strategy> ContextManager<C, K, S> {
    /// Upper bound of this manager type's snapshot size, in bytes, for sizing a static buffer.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// static mut SNAPSHOT: [u8; ContextManager::<TinyCapacities>::SNAPSHOT_MAX_SIZE] =
    ///     [0; ContextManager::<TinyCapacities>::SNAPSHOT_MAX_SIZE];
    /// assert!(ContextManager::<TinyCapacities>::SNAPSHOT_MAX_SIZE < 10 * 1024);
    /// ```
    pub const SNAPSHOT_MAX_SIZE: usize =
        wire::max_size(capacities_of::<C>(), C::Entities::KEYS, C::Entities::VALUE_BYTES);

    /// Encodes the body into `out`; whether every byte was written.
    fn encode_body(&self, out: &mut dyn Out) -> bool {
        let rings = Level::ALL.map(|level| self.ring(level));
        let keys = C::Entities::KEYS;
        let entities = self.entity_values();
        #[cfg(feature = "tasks")]
        let written = wire::encode_body(
            out,
            self.config(),
            self.state(),
            &rings,
            entities,
            keys,
            self.tasks(),
        );
        #[cfg(not(feature = "tasks"))]
        let written = wire::encode_body(out, self.config(), self.state(), &rings, entities, keys);
        written
    }

    fn body_len(&self) -> usize {
        let mut count = Count(0);
        self.encode_body(&mut count);
        count.0
    }

    /// Exact size of the snapshot [`snapshot_into`](Self::snapshot_into) would write now.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// let manager = ContextManager::<TinyCapacities>::new();
    /// assert!(manager.snapshot_len() <= ContextManager::<TinyCapacities>::SNAPSHOT_MAX_SIZE);
    /// ```
    pub fn snapshot_len(&self) -> usize {
        HEADER_LEN + self.body_len() + TRAILER_LEN
    }

    /// Writes the whole state into `buf` and returns the bytes written. No allocation.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, SnapshotError, TinyCapacities};
    /// let manager = ContextManager::<TinyCapacities>::new();
    /// let mut small = [0u8; 8];
    /// assert!(matches!(manager.snapshot_into(&mut small), Err(SnapshotError::BufferTooSmall { .. })));
    /// let mut buffer = [0u8; 512];
    /// assert_eq!(&manager.snapshot_into(&mut buffer)?[..4], b"CWSN");
    /// # Ok::<(), SnapshotError>(())
    /// ```
    pub fn snapshot_into<'b>(&self, buf: &'b mut [u8]) -> Result<&'b [u8], SnapshotError> {
        let body_len = self.body_len();
        let needed = HEADER_LEN + body_len + TRAILER_LEN;
        if buf.len() < needed {
            return Err(SnapshotError::BufferTooSmall { needed });
        }
        let mut fill = Fill { buf: &mut *buf, at: 0 };
        let fingerprint = self.config().fingerprint();
        if !wire::encode_header(&mut fill, fingerprint, capacities_of::<C>(), body_len)
            || !self.encode_body(&mut fill)
        {
            return Err(SnapshotError::BufferTooSmall { needed });
        }
        let end = fill.at;
        let crc = crc::crc32(buf.get(..end).unwrap_or_default());
        let trailer = buf.get_mut(end..end + TRAILER_LEN).ok_or(SnapshotError::Malformed)?;
        trailer.copy_from_slice(&crc.to_le_bytes());
        Ok(buf.get(..end + TRAILER_LEN).unwrap_or_default())
    }

    /// Streams the whole state to `out` without a buffer; returns the bytes written.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hi"))?;
    /// let mut sink = [0u8; 1024];
    /// let written = manager.snapshot_to(&mut sink[..])?;
    /// assert_eq!(written, manager.snapshot_len());
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn snapshot_to<W: embedded_io::Write>(&self, out: W) -> Result<usize, SnapshotError> {
        let body_len = self.body_len();
        let fingerprint = self.config().fingerprint();
        let mut stream = Stream { out, crc: Crc32::new(), error: None };
        if !wire::encode_header(&mut stream, fingerprint, capacities_of::<C>(), body_len)
            || !self.encode_body(&mut stream)
        {
            return Err(SnapshotError::Io(stream.error.unwrap_or(embedded_io::ErrorKind::Other)));
        }
        let crc = stream.crc.finish();
        stream.write(&crc.to_le_bytes()).map_err(SnapshotError::Io)?;
        Ok(HEADER_LEN + body_len + TRAILER_LEN)
    }

    /// Replaces the whole state with the snapshot in `bytes` (bytes after the snapshot, such
    /// as flash padding, are ignored). All or nothing: on any error the manager is unchanged.
    /// The token counter is kept.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, SnapshotError, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("keep me"))?;
    /// let mut buffer = [0u8; 1024];
    /// let len = manager.snapshot_into(&mut buffer)?.len();
    /// buffer[60] ^= 1;
    /// assert!(matches!(manager.restore_from(&buffer[..len]), Err(SnapshotError::CrcMismatch { .. })));
    /// assert_eq!(manager.history().count(), 1);
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn restore_from(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let capacities = capacities_of::<C>();
        let Opened { body, fingerprint, version } = open(bytes, capacities)?;
        let entities = (C::Entities::KEYS, C::Entities::VALUE_BYTES);
        let runs = self.strategy().kind();
        let format = (fingerprint, version);
        decode(body, capacities, entities, format, runs, &mut Validate)?;
        // Decoding is deterministic, so the load pass cannot fail where validation passed.
        decode(body, capacities, entities, format, runs, &mut Load(self))
    }

    /// Reads a snapshot from `input` into `scratch`, then restores it. A restore that leaves
    /// the manager unchanged on error needs the whole snapshot first, hence the scratch buffer
    /// ([`SNAPSHOT_MAX_SIZE`](Self::SNAPSHOT_MAX_SIZE) bytes is always enough).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.push(Message::user("hi"))?;
    /// let mut stored = [0u8; 1024];
    /// let len = manager.snapshot_to(&mut stored[..])?;
    /// let mut restored = ContextManager::<TinyCapacities>::new();
    /// let mut scratch = [0u8; 1024];
    /// restored.restore_from_reader(&stored[..len], &mut scratch)?;
    /// assert_eq!(restored.history().count(), 1);
    /// # Ok::<(), Box<dyn core::error::Error>>(())
    /// ```
    pub fn restore_from_reader<R: embedded_io::Read>(
        &mut self,
        mut input: R,
        scratch: &mut [u8],
    ) -> Result<(), SnapshotError> {
        let mut read_exact = |from: usize,
                              to: usize,
                              scratch: &mut [u8]|
         -> Result<(), SnapshotError> {
            let mut at = from;
            while at < to {
                let target =
                    scratch.get_mut(at..to).ok_or(SnapshotError::BufferTooSmall { needed: to })?;
                match input.read(target) {
                    Ok(0) => return Err(SnapshotError::Truncated { needed: to, got: at }),
                    Ok(n) => at += n,
                    Err(error) => return Err(SnapshotError::Io(embedded_io::Error::kind(&error))),
                }
            }
            Ok(())
        };
        if scratch.len() < HEADER_LEN {
            return Err(SnapshotError::BufferTooSmall { needed: HEADER_LEN + TRAILER_LEN });
        }
        read_exact(0, HEADER_LEN, scratch)?;
        let total = HEADER_LEN + le_u32(scratch, HEADER_LEN - 4) as usize + TRAILER_LEN;
        if scratch.get(..4) != Some(&MAGIC[..]) {
            return Err(SnapshotError::BadMagic);
        }
        if total > scratch.len() {
            return Err(SnapshotError::BufferTooSmall { needed: total });
        }
        read_exact(HEADER_LEN, total, scratch)?;
        self.restore_from(scratch.get(..total).unwrap_or_default())
    }
}
