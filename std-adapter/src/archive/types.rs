//! The records the archive stores and returns.

use ctxwin_core::Level;

use crate::message::ChatMessage;

/// The integer the archive stores for a core [`Level`] (the `level` column of `messages`).
///
/// Spelled out rather than taken from [`Level::index`], so the values in existing archives
/// never depend on the order of the core's enum.
pub(crate) const fn level_code(level: Level) -> u8 {
    match level {
        Level::Permanent => 0,
        Level::Session => 1,
        Level::Working => 2,
        Level::Volatile => 3,
    }
}

/// The level stored as `code`, if any; the inverse of [`level_code`].
pub(crate) const fn level_from_code(code: u8) -> Option<Level> {
    match code {
        0 => Some(Level::Permanent),
        1 => Some(Level::Session),
        2 => Some(Level::Working),
        3 => Some(Level::Volatile),
        _ => None,
    }
}

/// One message as the archive keeps it.
///
/// `message.content` is what the core held (possibly reduced to head + `[Data Truncated]` +
/// tail); `original` is the full text when it was reduced, so nothing is lost.
///
/// ```
/// use ctxwin_std::archive::ArchivedMessage;
/// use ctxwin_std::core::Level;
/// use ctxwin_std::ChatMessage;
/// let m = ArchivedMessage::new(7, 3, ChatMessage::tool_result("c1", "head [Data Truncated] tail"))
///     .with_original("head middle tail")
///     .with_level(Level::Volatile);
/// assert_eq!(m.original.as_deref(), Some("head middle tail"));
/// assert_eq!(m.full_text(), "head middle tail");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivedMessage {
    /// The core's message id (monotonic within a session).
    pub id: u64,
    /// The unit the message was evicted with (an assistant message and its tool results share
    /// one).
    pub unit: u64,
    /// The level it lived in.
    pub level: Level,
    /// The message as the core held it.
    pub message: ChatMessage,
    /// When it was created, in the caller's milliseconds clock.
    pub timestamp: u64,
    /// Its token count as the core counted it.
    pub tokens: u32,
    /// The full text when `message.content` is a reduced form of it.
    pub original: Option<String>,
}

impl ArchivedMessage {
    /// A message at the working level, timestamp 0, 0 tokens, not reduced.
    ///
    /// ```
    /// use ctxwin_std::archive::ArchivedMessage;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"));
    /// assert_eq!((m.id, m.unit, m.tokens), (1, 1, 0));
    /// ```
    pub fn new(id: u64, unit: u64, message: ChatMessage) -> Self {
        Self { id, unit, level: Level::Working, message, timestamp: 0, tokens: 0, original: None }
    }

    /// Sets the level.
    ///
    /// ```
    /// # use ctxwin_std::archive::ArchivedMessage;
    /// use ctxwin_std::core::Level;
    /// # use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::System, "rules"))
    ///     .with_level(Level::Permanent);
    /// assert_eq!(m.level, Level::Permanent);
    /// ```
    pub fn with_level(mut self, level: Level) -> Self {
        self.level = level;
        self
    }

    /// Sets the timestamp (milliseconds, the caller's clock).
    ///
    /// ```
    /// # use ctxwin_std::archive::ArchivedMessage;
    /// # use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "x")).with_timestamp(5);
    /// assert_eq!(m.timestamp, 5);
    /// ```
    pub fn with_timestamp(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// Sets the token count.
    ///
    /// ```
    /// # use ctxwin_std::archive::ArchivedMessage;
    /// # use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "x")).with_tokens(4);
    /// assert_eq!(m.tokens, 4);
    /// ```
    pub fn with_tokens(mut self, tokens: u32) -> Self {
        self.tokens = tokens;
        self
    }

    /// Records the full text `message.content` was reduced from.
    ///
    /// ```
    /// # use ctxwin_std::archive::ArchivedMessage;
    /// # use ctxwin_std::ChatMessage;
    /// let m = ArchivedMessage::new(2, 1, ChatMessage::tool_result("c", "a…z")).with_original("a-z");
    /// assert!(m.original.is_some());
    /// ```
    pub fn with_original(mut self, original: impl Into<String>) -> Self {
        self.original = Some(original.into());
        self
    }

    /// The original text if the message was reduced, otherwise its content.
    ///
    /// ```
    /// # use ctxwin_std::archive::ArchivedMessage;
    /// # use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "short"));
    /// assert_eq!(m.full_text(), "short");
    /// ```
    pub fn full_text(&self) -> &str {
        self.original.as_deref().unwrap_or(&self.message.content)
    }
}

/// A summary that stands for earlier messages (or, one level up, for earlier summaries).
///
/// ```
/// use ctxwin_std::archive::SummaryRecord;
/// let s = SummaryRecord::new(100, 1, "user set up the parser", vec![3, 4, 5]);
/// assert_eq!(s.source_ids, [3, 4, 5]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRecord {
    /// The summary's id (the core's id of the summary message).
    pub id: u64,
    /// Hierarchy level: 1 summarizes messages, 2 summarizes level-1 summaries, and so on.
    pub level: u8,
    /// The summary text.
    pub text: String,
    /// What it stands for, oldest first: message ids, or summary ids of the same session.
    pub source_ids: Vec<u64>,
    /// When it was made (caller's milliseconds clock).
    pub created_at: u64,
    /// Tokens of the sources.
    pub tokens_before: u32,
    /// Tokens of the summary.
    pub tokens_after: u32,
}

impl SummaryRecord {
    /// A summary with zero timestamp and token counts.
    ///
    /// ```
    /// let s = ctxwin_std::archive::SummaryRecord::new(9, 1, "t", vec![1]);
    /// assert_eq!(s.created_at, 0);
    /// ```
    pub fn new(id: u64, level: u8, text: impl Into<String>, source_ids: Vec<u64>) -> Self {
        Self {
            id,
            level,
            text: text.into(),
            source_ids,
            created_at: 0,
            tokens_before: 0,
            tokens_after: 0,
        }
    }
}

/// One compression event, for the metrics table.
///
/// ```
/// use ctxwin_std::archive::CompressionRecord;
/// let r = CompressionRecord::new(1_000, 8_000, 3_000, "summarize-oldest");
/// assert_eq!(r.tokens_before - r.tokens_after, 5_000);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressionRecord {
    /// When it happened (caller's milliseconds clock).
    pub timestamp: u64,
    /// Context tokens before.
    pub tokens_before: u64,
    /// Context tokens after.
    pub tokens_after: u64,
    /// Units evicted to the archive.
    pub units_evicted: u32,
    /// Summaries produced.
    pub summaries_made: u32,
    /// Strategy name, as the caller names it.
    pub strategy: String,
}

impl CompressionRecord {
    /// An event with no units evicted and no summaries made.
    ///
    /// ```
    /// let r = ctxwin_std::archive::CompressionRecord::new(0, 10, 4, "reduce");
    /// assert_eq!(r.units_evicted, 0);
    /// ```
    pub fn new(
        timestamp: u64,
        tokens_before: u64,
        tokens_after: u64,
        strategy: impl Into<String>,
    ) -> Self {
        Self {
            timestamp,
            tokens_before,
            tokens_after,
            units_evicted: 0,
            summaries_made: 0,
            strategy: strategy.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_codes_are_the_stored_values() {
        let codes = Level::ALL.map(level_code);
        assert_eq!(codes, [0, 1, 2, 3]);
        for level in Level::ALL {
            assert_eq!(level_from_code(level_code(level)), Some(level));
        }
        assert_eq!(level_from_code(4), None);
    }
}
