//! Why a snapshot could not be written or restored.

use crate::level::Level;

/// Why a snapshot could not be written or restored. A failed restore leaves the manager as it
/// was.
///
/// ```
/// use ctxwin_core::{ContextManager, SnapshotError, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// assert_eq!(manager.restore_from(b"CWSN"), Err(SnapshotError::Truncated { needed: 52, got: 4 }));
/// assert_eq!(manager.restore_from(&[0u8; 64]), Err(SnapshotError::BadMagic));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum SnapshotError {
    /// The output buffer is smaller than the snapshot.
    BufferTooSmall {
        /// Bytes the snapshot needs.
        needed: usize,
    },
    /// The input ends before the snapshot does.
    Truncated {
        /// Bytes the snapshot needs.
        needed: usize,
        /// Bytes there were.
        got: usize,
    },
    /// The input does not start with the snapshot magic `CWSN`.
    BadMagic,
    /// The snapshot was written in a format version this build does not read.
    UnsupportedVersion {
        /// Version found.
        found: u16,
    },
    /// Header flags this build does not know.
    UnsupportedFlags,
    /// The CRC-32 trailer does not match the content.
    CrcMismatch {
        /// CRC stored in the snapshot.
        stored: u32,
        /// CRC of the bytes read.
        computed: u32,
    },
    /// The snapshot was written by a manager with a larger capacity in `level`.
    CapacityExceeded {
        /// Level whose capacity is too small here.
        level: Level,
        /// Messages the snapshot's level could hold.
        messages: u32,
        /// Bytes the snapshot's level could hold.
        bytes: u32,
    },
    /// The body does not decode.
    Malformed,
    /// The body decodes but breaks an invariant.
    Invalid(Invariant),
    /// Reading or writing failed.
    Io(embedded_io::ErrorKind),
}

/// The invariant a decoded snapshot breaks.
///
/// ```
/// use ctxwin_core::{snapshot::Invariant, Level};
/// let why = Invariant::OrphanToolResult { level: Level::Working };
/// assert_eq!(why.to_string(), "working level: a tool result without its call");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Invariant {
    /// The configuration is invalid, has unknown values, or names a built-in strategy the
    /// manager's strategy does not run.
    Config,
    /// The header's fingerprint does not match the body's configuration.
    Fingerprint,
    /// Text that is not UTF-8.
    Text {
        /// Level of the record.
        level: Level,
    },
    /// A length that points outside its record.
    Span {
        /// Level of the record.
        level: Level,
    },
    /// Unknown flag bits or detail level.
    Flags {
        /// Level of the record.
        level: Level,
    },
    /// A kind of message the level does not hold (or an unknown role).
    Role {
        /// Level of the record.
        level: Level,
    },
    /// Ids not increasing within the level, or not below the next id.
    Order {
        /// Level of the record.
        level: Level,
    },
    /// A tool result without its call (or a second result for one call).
    OrphanToolResult {
        /// Level of the record.
        level: Level,
    },
    /// A call without all its results that is not the pending unit.
    IncompleteUnit {
        /// Level of the unit.
        level: Level,
    },
    /// The pending-call state does not match the stored unit.
    Pending,
    /// A unit only partly evicted.
    Eviction {
        /// Level of the unit.
        level: Level,
    },
    /// Stored token totals do not add up to the records'.
    TokenTotals {
        /// Level whose totals are wrong.
        level: Level,
    },
    /// The newest user message the lock refers to is missing.
    LastUser,
    /// More messages than the level can hold.
    TooManyMessages {
        /// The level.
        level: Level,
    },
    /// More bytes than the level can hold.
    TooManyBytes {
        /// The level.
        level: Level,
    },
    /// A tool definition that is not a JSON object.
    ToolDefinition,
    /// Entity values that do not fit the table or the schema, or are not UTF-8.
    Entities,
    /// A task table that does not fit the manager: too many tasks, out of order, overlapping,
    /// more than the newest one open, ids not yet issued, a goal too long or not UTF-8, or any
    /// task at all in a build without the `tasks` feature.
    Tasks,
}

impl core::fmt::Display for Invariant {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Invariant::Config => f.write_str("invalid configuration"),
            Invariant::Fingerprint => f.write_str("configuration fingerprint mismatch"),
            Invariant::Text { level } => write!(f, "{level} level: text that is not UTF-8"),
            Invariant::Span { level } => write!(f, "{level} level: a span outside its record"),
            Invariant::Flags { level } => write!(f, "{level} level: unknown flags"),
            Invariant::Role { level } => {
                write!(f, "{level} level: a message the level does not hold")
            }
            Invariant::Order { level } => write!(f, "{level} level: ids out of order"),
            Invariant::OrphanToolResult { level } => {
                write!(f, "{level} level: a tool result without its call")
            }
            Invariant::IncompleteUnit { level } => {
                write!(f, "{level} level: a call without all its results")
            }
            Invariant::Pending => f.write_str("pending tool calls do not match the stored unit"),
            Invariant::Eviction { level } => write!(f, "{level} level: a unit only partly evicted"),
            Invariant::TokenTotals { level } => {
                write!(f, "{level} level: token totals do not add up")
            }
            Invariant::LastUser => f.write_str("the newest user message is missing"),
            Invariant::TooManyMessages { level } => {
                write!(f, "{level} level: more messages than it holds")
            }
            Invariant::TooManyBytes { level } => {
                write!(f, "{level} level: more bytes than it holds")
            }
            Invariant::ToolDefinition => f.write_str("a tool definition that is not a JSON object"),
            Invariant::Entities => f.write_str("entity values that do not fit the table or schema"),
            Invariant::Tasks => f.write_str("a task table that does not fit the manager"),
        }
    }
}

impl core::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SnapshotError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: the snapshot needs {needed} bytes")
            }
            SnapshotError::Truncated { needed, got } => {
                write!(f, "snapshot truncated: {got} of {needed} bytes")
            }
            SnapshotError::BadMagic => f.write_str("not a ctxwin snapshot (bad magic)"),
            SnapshotError::UnsupportedVersion { found } => {
                write!(f, "unsupported snapshot format version {found}")
            }
            SnapshotError::UnsupportedFlags => f.write_str("unsupported snapshot header flags"),
            SnapshotError::CrcMismatch { stored, computed } => {
                write!(f, "snapshot corrupt: CRC {computed:08x}, stored {stored:08x}")
            }
            SnapshotError::CapacityExceeded { level, messages, bytes } => write!(
                f,
                "snapshot {level} level holds up to {messages} messages / {bytes} bytes, more than this manager"
            ),
            SnapshotError::Malformed => f.write_str("snapshot body does not decode"),
            SnapshotError::Invalid(why) => write!(f, "snapshot invalid: {why}"),
            SnapshotError::Io(kind) => write!(f, "snapshot I/O failed: {kind:?}"),
        }
    }
}

impl core::error::Error for SnapshotError {}
