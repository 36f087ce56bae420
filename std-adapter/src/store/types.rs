//! The records an archive store keeps and returns, and the questions it answers.

use ctxwin_core::{Level, Role};

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
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
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
/// use ctxwin_std::store::ArchivedMessage;
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
    /// The message exactly as the client sent it (its provider JSON), when the caller kept
    /// it: a proxy writes a message back from it byte for byte.
    pub raw: Option<String>,
}

impl ArchivedMessage {
    /// A message at the working level, timestamp 0, 0 tokens, not reduced.
    ///
    /// ```
    /// use ctxwin_std::store::ArchivedMessage;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"));
    /// assert_eq!((m.id, m.unit, m.tokens), (1, 1, 0));
    /// ```
    pub fn new(id: u64, unit: u64, message: ChatMessage) -> Self {
        Self {
            id,
            unit,
            level: Level::Working,
            message,
            timestamp: 0,
            tokens: 0,
            original: None,
            raw: None,
        }
    }

    /// Sets the level.
    ///
    /// ```
    /// # use ctxwin_std::store::ArchivedMessage;
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
    /// # use ctxwin_std::store::ArchivedMessage;
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
    /// # use ctxwin_std::store::ArchivedMessage;
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
    /// # use ctxwin_std::store::ArchivedMessage;
    /// # use ctxwin_std::ChatMessage;
    /// let m = ArchivedMessage::new(2, 1, ChatMessage::tool_result("c", "a…z")).with_original("a-z");
    /// assert!(m.original.is_some());
    /// ```
    pub fn with_original(mut self, original: impl Into<String>) -> Self {
        self.original = Some(original.into());
        self
    }

    /// Records the client's raw JSON of the message.
    ///
    /// ```
    /// # use ctxwin_std::store::ArchivedMessage;
    /// # use ctxwin_std::{ChatMessage, core::Role};
    /// let raw = r#"{"role":"user","content":"hi"}"#;
    /// let m = ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi")).with_raw(raw);
    /// assert_eq!(m.raw.as_deref(), Some(raw));
    /// ```
    pub fn with_raw(mut self, raw: impl Into<String>) -> Self {
        self.raw = Some(raw.into());
        self
    }

    /// The original text if the message was reduced, otherwise its content.
    ///
    /// ```
    /// # use ctxwin_std::store::ArchivedMessage;
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
/// use ctxwin_std::store::SummaryRecord;
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
    /// let s = ctxwin_std::store::SummaryRecord::new(9, 1, "t", vec![1]);
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
/// use ctxwin_std::store::CompressionRecord;
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
    /// let r = ctxwin_std::store::CompressionRecord::new(0, 10, 4, "reduce");
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

/// A full-text search of one conversation ([`ArchiveStore::search`](super::ArchiveStore::search)).
///
/// `text` is plain user text: every adapter treats operators of its query language in it as
/// words, so no input makes a search fail; a text with no words finds nothing.
///
/// ```
/// use ctxwin_std::store::SearchQuery;
/// let query = SearchQuery::new("which postgres version", 20);
/// assert!(!query.snippets);
/// assert!(query.with_snippets().snippets);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchQuery<'a> {
    /// The user's words.
    pub text: &'a str,
    /// Most hits returned.
    pub limit: usize,
    /// Whether each hit carries a snippet (costs the adapter more).
    pub snippets: bool,
}

impl<'a> SearchQuery<'a> {
    /// `text`, at most `limit` hits, no snippets.
    pub const fn new(text: &'a str, limit: usize) -> Self {
        Self { text, limit, snippets: false }
    }

    /// The same query, hits with snippets.
    #[must_use]
    pub const fn with_snippets(self) -> Self {
        Self { snippets: true, ..self }
    }
}

/// One message a search found.
///
/// **Scores are normalised, the same for every adapter:** in `(0, 1]`, the best hit of a
/// search scores `1.0` and every other hit its relevance divided by the best's (an adapter's
/// BM25 for the lexical ones), so a ranking combines them without knowing the adapter. Hits
/// come best first, ties newest (highest id) last.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    /// Message id.
    pub id: u64,
    /// Unit id.
    pub unit: u64,
    /// Author.
    pub role: Role,
    /// Caller's timestamp (ms).
    pub timestamp: u64,
    /// The stored content (the reduced form when the message was reduced), verified.
    pub content: String,
    /// A short excerpt around the match, matched words in `«»` (empty unless asked for).
    pub snippet: String,
    /// Relevance in `(0, 1]`: see the type's documentation.
    pub score: f64,
}

/// One summary a search found.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryHit {
    /// Summary id (give it to [`drill_down`](super::ArchiveStore::drill_down)).
    pub id: u64,
    /// Hierarchy level.
    pub level: u8,
    /// The summary text, verified.
    pub text: String,
    /// Relevance in `(0, 1]`, normalised as [`SearchHit::score`].
    pub score: f64,
}

/// An archived message as an embedding index sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorRow {
    /// Message id.
    pub id: u64,
    /// The message's content (what its vector describes).
    pub content: String,
    /// Its cached vector for the model asked about, if any.
    pub vector: Option<Vec<f32>>,
}

/// What to forget ([`ArchiveStore::forget`](super::ArchiveStore::forget)).
///
/// ```
/// use ctxwin_std::store::Forget;
/// let what = Forget { ids: &[3], texts: &["sk-live-123"] };
/// assert_eq!(what.ids, [3]);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forget<'a> {
    /// Messages whose whole text goes (their rows stay, so ids and units keep their meaning).
    pub ids: &'a [u64],
    /// Texts whose every occurrence goes, in messages (content, tool calls, original, raw
    /// JSON) and summaries.
    pub texts: &'a [&'a str],
}

/// What replaces forgotten text.
pub const FORGOTTEN: &str = "[forgotten]";

/// What [`forget`](super::ArchiveStore::forget) changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Messages whose text was replaced, by id.
    pub messages: Vec<u64>,
    /// Summaries that quoted forgotten text or stand for a forgotten message: their text is
    /// scrubbed, and they are to be rewritten from their (scrubbed) sources.
    pub summaries: Vec<u64>,
}

/// What one conversation holds in a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Messages.
    pub messages: u64,
    /// Summaries.
    pub summaries: u64,
    /// Cached vectors (every model).
    pub vectors: u64,
    /// Compression events recorded.
    pub compression_events: u64,
    /// Bytes the whole store takes on its medium, when the adapter can tell.
    pub store_bytes: Option<u64>,
}

/// Totals of the compression events of one strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StrategyMetrics {
    /// Strategy name.
    pub strategy: String,
    /// Events recorded.
    pub events: u64,
    /// Sum of tokens before.
    pub tokens_before: u64,
    /// Sum of tokens after.
    pub tokens_after: u64,
    /// Sum of units evicted.
    pub units_evicted: u64,
    /// Sum of summaries made.
    pub summaries_made: u64,
}

impl StrategyMetrics {
    /// Tokens removed from the context (before − after, 0 if it grew).
    ///
    /// ```
    /// let m = ctxwin_std::store::StrategyMetrics { tokens_before: 10, tokens_after: 4, ..Default::default() };
    /// assert_eq!(m.tokens_saved(), 6);
    /// ```
    pub fn tokens_saved(&self) -> u64 {
        self.tokens_before.saturating_sub(self.tokens_after)
    }

    /// `tokens_after / tokens_before` (1.0 when nothing was recorded): lower is stronger.
    ///
    /// ```
    /// let m = ctxwin_std::store::StrategyMetrics { tokens_before: 10, tokens_after: 4, ..Default::default() };
    /// assert!((m.ratio() - 0.4).abs() < 1e-9);
    /// ```
    pub fn ratio(&self) -> f64 {
        if self.tokens_before == 0 {
            1.0
        } else {
            self.tokens_after as f64 / self.tokens_before as f64
        }
    }

    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &StrategyMetrics) {
        self.events = self.events.saturating_add(other.events);
        self.tokens_before = self.tokens_before.saturating_add(other.tokens_before);
        self.tokens_after = self.tokens_after.saturating_add(other.tokens_after);
        self.units_evicted = self.units_evicted.saturating_add(other.units_evicted);
        self.summaries_made = self.summaries_made.saturating_add(other.summaries_made);
    }
}

/// Totals over all compression events of a conversation, and per strategy (by name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSummary {
    /// Totals over every strategy (its `strategy` is empty).
    pub total: StrategyMetrics,
    /// One entry per strategy name, sorted by name.
    pub by_strategy: Vec<StrategyMetrics>,
}

/// Scrubs `row` as [`forget`](super::ArchiveStore::forget) says: rows `what.ids` lose their
/// whole text, every other occurrence of `what.texts` becomes [`FORGOTTEN`]; tool calls that
/// hold a text are dropped, and so is raw JSON that holds one (in any of its escapings: its
/// strings are read as JSON).
pub(crate) fn scrub_row(row: &mut ArchivedMessage, what: &Forget<'_>) {
    if what.ids.contains(&row.id) {
        row.message.content = FORGOTTEN.to_string();
        row.message.tool_calls.clear();
        row.original = None;
        row.raw = None;
    }
    for text in what.texts.iter().filter(|t| !t.is_empty()) {
        if row.message.content.contains(text) {
            row.message.content = row.message.content.replace(text, FORGOTTEN);
        }
        if let Some(original) = row.original.as_mut().filter(|o| o.contains(text)) {
            *original = original.replace(text, FORGOTTEN);
        }
        let calls = &row.message.tool_calls;
        if calls.iter().any(|c| [&c.id, &c.name, &c.arguments].iter().any(|f| f.contains(text))) {
            row.message.tool_calls.clear();
        }
        if row.raw.as_deref().is_some_and(|raw| json_holds(raw, text)) {
            row.raw = None;
        }
    }
}

/// Whether `raw` holds `text`: as bytes, or in one of its strings once JSON escapes are read.
fn json_holds(raw: &str, text: &str) -> bool {
    fn strings_hold(value: &serde_json::Value, text: &str) -> bool {
        match value {
            serde_json::Value::String(s) => s.contains(text),
            serde_json::Value::Array(items) => items.iter().any(|v| strings_hold(v, text)),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains(text) || strings_hold(v, text))
            }
            _ => false,
        }
    }
    raw.contains(text)
        || serde_json::from_str::<serde_json::Value>(raw).is_ok_and(|v| strings_hold(&v, text))
}

/// Normalises raw relevance scores (higher better, positive) in place as
/// [`SearchHit::score`] says: divided by the best, so the best is `1.0`.
pub(crate) fn normalise(scores: &mut [f64]) {
    let best = scores.iter().copied().fold(0.0_f64, f64::max);
    for score in scores.iter_mut() {
        *score = if best > 0.0 { (*score / best).clamp(f64::MIN_POSITIVE, 1.0) } else { 1.0 };
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
