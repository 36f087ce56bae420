//! The fixed-size record the rings keep for every stored message.

use crate::role::Role;

/// Per-message bookkeeping, 32 bytes; the text lives in the ring's byte arena, and what only
/// some messages need (a count before reduction, term hashes) in the record's trailer
/// (`record::Trailer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Manager-wide message id, increasing with every push, as an offset from the manager's
    /// id base ([`id_base`] of `State::id_epoch`; `RingRef::id` adds it back).
    pub id: u32,
    /// Caller-supplied timestamp (no clock in `no_std`); milliseconds by convention.
    pub timestamp: u64,
    /// Offset of the record in the arena.
    pub start: u32,
    /// Bytes of the record: content, then role-specific data (see `record`).
    pub len: u32,
    /// Bytes of the content at the start of the record.
    pub content_len: u32,
    /// Cached token cost, per-message overhead included.
    pub tokens: u32,
    /// Author.
    pub role: Role,
    /// [`flags`] bits.
    pub flags: u8,
    /// Tool calls carried (assistant) or source ranges (summary).
    pub items: u8,
    /// Hierarchical detail level of the stored text (0 = full).
    pub detail: u8,
}

/// Id bases are multiples of 2^31, so views carry a 32-bit epoch instead of a 64-bit base.
const EPOCH_SHIFT: u32 = 31;

/// The id base of `epoch`.
pub(crate) const fn id_base(epoch: u32) -> u64 {
    (epoch as u64) << EPOCH_SHIFT
}

/// The largest epoch whose base is at or below `id`.
pub(crate) const fn epoch_below(id: u64) -> u32 {
    let epoch = id >> EPOCH_SHIFT;
    if epoch > u32::MAX as u64 { u32::MAX } else { epoch as u32 }
}

/// The smallest epoch whose base is at or above `id`.
pub(crate) const fn epoch_above(id: u64) -> u32 {
    epoch_below(id.saturating_add((1 << EPOCH_SHIFT) - 1))
}

/// The manager-wide id of a header offset under `epoch`.
pub(crate) const fn full_id(epoch: u32, offset: u32) -> u64 {
    id_base(epoch) + offset as u64
}

const _: () = assert!(core::mem::size_of::<Header>() == 32, "a header is 32 bytes");

/// Bits of [`Header::flags`].
pub(crate) mod flags {
    /// The caller marked the message important.
    pub const IMPORTANT: u8 = 1;
    /// The content was reduced (observation reduction or compression).
    pub const REDUCED: u8 = 1 << 1;
    /// Written by the manager (an aborted-call result, a summary).
    pub const SYNTHETIC: u8 = 1 << 2;
    /// A tool definition (permanent level).
    pub const TOOL_DEFINITION: u8 = 1 << 3;
    /// Evicted: waiting in the outbox for the caller to drain it.
    pub const EVICTED: u8 = 1 << 4;
    /// A summary standing for earlier messages.
    pub const SUMMARY: u8 = 1 << 5;
    /// The one rolling summary the summarization strategy keeps extending.
    pub const ROLLING: u8 = 1 << 6;
    /// The record ends with a trailer (`record::Trailer`): the manager's own bit, never in a
    /// snapshot.
    pub const TRAILER: u8 = 1 << 7;
    /// Every bit a snapshot's record may carry.
    pub const KNOWN: u8 =
        IMPORTANT | REDUCED | SYNTHETIC | TOOL_DEFINITION | EVICTED | SUMMARY | ROLLING;
}

impl Header {
    /// An unused slot.
    pub const EMPTY: Header = Header {
        id: 0,
        timestamp: 0,
        start: 0,
        len: 0,
        content_len: 0,
        tokens: 0,
        role: Role::System,
        flags: 0,
        items: 0,
        detail: 0,
    };

    /// Whether `flag` is set.
    pub const fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Whether the message is still part of the context (not waiting in the outbox).
    pub const fn is_live(&self) -> bool {
        !self.has(flags::EVICTED)
    }

    /// End offset of the record in the arena.
    pub const fn end(&self) -> u32 {
        self.start.saturating_add(self.len)
    }
}
