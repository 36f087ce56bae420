//! Checksums of stored rows: what every adapter stores beside a row and verifies on every
//! read, so that damage to a row (bit rot, a stray write, a row moved to another
//! conversation) is reported as [`StoreError::Damaged`](super::StoreError::Damaged) and never
//! served as text.
//!
//! A checksum is CRC-32 (IEEE) over a canonical encoding of the row's values *and its scope*
//! (each field length-prefixed, so no two rows encode alike), not over a backend's bytes:
//! every adapter computes the same value, and a row that another conversation's id comes to
//! name fails it. A message's checksum is two halves: the high 32 bits cover what a search
//! returns (ids, role, content, tool calls, …), the low 32 bits its original text and raw
//! JSON, so that a search verifies what it serves without reading megabytes of originals.
//!
//! ```
//! use ctxwin_std::store::{ArchivedMessage, Scope, checksum};
//! use ctxwin_std::{ChatMessage, core::Role};
//! let row = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hello"));
//! let sum = checksum::message(&Scope::local("s"), &row);
//! assert_eq!(sum, checksum::message(&Scope::local("s"), &row.clone()));
//! assert_ne!(sum, checksum::message(&Scope::local("t"), &row), "the scope is covered");
//! let mut changed = row.clone();
//! changed.message.content = "hellp".into();
//! assert_ne!(checksum::head(sum), checksum::head(checksum::message(&Scope::local("s"), &changed)));
//! ```

use super::Scope;
use super::types::{ArchivedMessage, SummaryRecord, level_code};

/// A running CRC-32 over length-prefixed fields.
struct Fields(crc32fast::Hasher);

impl Fields {
    fn new(tag: &[u8], scope: &Scope) -> Self {
        let mut fields = Self(crc32fast::Hasher::new());
        fields.bytes(tag);
        fields.bytes(scope.tenant.as_bytes());
        fields.bytes(scope.conversation.as_bytes());
        fields
    }

    fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    fn text(&mut self, text: &str) -> &mut Self {
        self.bytes(text.as_bytes())
    }

    fn number(&mut self, value: u64) -> &mut Self {
        self.0.update(&value.to_le_bytes());
        self
    }

    fn optional(&mut self, text: Option<&str>) -> &mut Self {
        match text {
            Some(text) => self.number(1).text(text),
            None => self.number(0),
        }
    }

    fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The checksum of message `row` of `scope` (see the [module](self) documentation).
pub fn message(scope: &Scope, row: &ArchivedMessage) -> u64 {
    (u64::from(message_head(scope, row)) << 32) | u64::from(message_tail(scope, row))
}

/// The half of [`message`] that covers what a search serves.
pub fn head(checksum: u64) -> u32 {
    (checksum >> 32) as u32
}

/// The high half of a message's checksum: everything but the original text and raw JSON.
pub fn message_head(scope: &Scope, row: &ArchivedMessage) -> u32 {
    let mut fields = Fields::new(b"message", scope);
    let m = &row.message;
    fields
        .number(row.id)
        .number(row.unit)
        .number(u64::from(level_code(row.level)))
        .text(m.role.as_str())
        .text(&m.content)
        .number(m.tool_calls.len() as u64);
    for call in &m.tool_calls {
        fields.text(&call.id).text(&call.name).text(&call.arguments);
    }
    fields
        .optional(m.tool_call_id.as_deref())
        .optional(m.name.as_deref())
        .number(u64::from(m.is_error))
        .number(row.timestamp)
        .number(u64::from(row.tokens));
    fields.finish()
}

/// The low half of a message's checksum: its original text and raw JSON.
pub fn message_tail(scope: &Scope, row: &ArchivedMessage) -> u32 {
    let mut fields = Fields::new(b"original", scope);
    fields.number(row.id).optional(row.original.as_deref()).optional(row.raw.as_deref());
    fields.finish()
}

/// The checksum of summary `record` of `scope`, its sources included.
///
/// ```
/// use ctxwin_std::store::{Scope, SummaryRecord, checksum};
/// let a = SummaryRecord::new(9, 1, "set up CI", vec![1, 2]);
/// let b = SummaryRecord::new(9, 1, "set up CI", vec![1, 3]);
/// let s = Scope::local("s");
/// assert_ne!(checksum::summary(&s, &a), checksum::summary(&s, &b));
/// ```
pub fn summary(scope: &Scope, record: &SummaryRecord) -> u64 {
    let mut fields = Fields::new(b"summary", scope);
    fields
        .number(record.id)
        .number(u64::from(record.level))
        .text(&record.text)
        .number(record.created_at)
        .number(u64::from(record.tokens_before))
        .number(u64::from(record.tokens_after))
        .number(record.source_ids.len() as u64);
    for source in &record.source_ids {
        fields.number(*source);
    }
    u64::from(fields.finish())
}

/// The checksum of the vector of message `id` of `scope` for `model`.
///
/// ```
/// use ctxwin_std::store::{Scope, checksum};
/// let s = Scope::local("s");
/// assert_ne!(checksum::vector(&s, 1, "m", &[1.0]), checksum::vector(&s, 1, "m", &[1.5]));
/// ```
pub fn vector(scope: &Scope, id: u64, model: &str, vector: &[f32]) -> u64 {
    let mut fields = Fields::new(b"vector", scope);
    fields.number(id).text(model).number(vector.len() as u64);
    for x in vector {
        fields.0.update(&x.to_le_bytes());
    }
    u64::from(fields.finish())
}

/// The checksum of `record` of `scope`: its collection, key, value and fields (as their
/// JSON text).
///
/// ```
/// use ctxwin_std::store::{Record, Scope, checksum};
/// let a = Record::new("c", "k", b"value".to_vec());
/// let s = Scope::new("t", "n");
/// assert_ne!(checksum::record(&s, &a), checksum::record(&Scope::new("t", "m"), &a));
/// assert_ne!(checksum::record(&s, &a), checksum::record(&s, &Record::new("c", "k", b"valud".to_vec())));
/// ```
pub fn record(scope: &Scope, record: &super::Record) -> u64 {
    record_parts(
        scope,
        &record.collection,
        &record.key,
        &record.value,
        record.fields_text().as_deref(),
    )
}

/// [`record`] of a record's parts as stored (`fields`: the JSON text stored).
pub(crate) fn record_parts(
    scope: &Scope,
    collection: &str,
    key: &str,
    value: &[u8],
    fields: Option<&str>,
) -> u64 {
    let mut sum = Fields::new(b"record", scope);
    sum.text(collection).text(key).bytes(value).optional(fields);
    u64::from(sum.finish())
}

/// The [`StoreError::Damaged`](super::StoreError::Damaged) of a checksum mismatch of `what`.
pub(crate) fn mismatch(what: String, stored: u64, computed: u64) -> super::StoreError {
    super::StoreError::damaged(
        what,
        format!("checksum mismatch (stored {stored:#018x}, computed {computed:#018x})"),
    )
}
