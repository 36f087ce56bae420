//! The four memory levels a message can live in.

/// Where a message is stored, which decides how long it survives.
///
/// | level | holds | evicted |
/// |---|---|---|
/// | [`Permanent`](Level::Permanent) | system prompt, rules, tool definitions | never |
/// | [`Session`](Level::Session) | summaries, key decisions | merged or evicted when the level is over its budget |
/// | [`Working`](Level::Working) | recent turns | oldest unit first, outside the locked tail |
/// | [`Volatile`](Level::Volatile) | verbose output, exploration | first |
///
/// ```
/// use ctxwin_core::Level;
/// assert_eq!(Level::ALL.len(), 4);
/// assert_eq!(Level::Volatile.as_str(), "volatile");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Level {
    /// Never evicted: system prompt, project rules, tool definitions.
    Permanent,
    /// Summaries and key decisions, rendered as the `[Memory Summary]` block.
    Session,
    /// Recent turns: the conversation history the model sees.
    Working,
    /// Verbose output and exploration: part of the history, evicted before working units.
    Volatile,
}

impl Level {
    /// Every level, in payload order.
    pub const ALL: [Level; 4] = [Level::Permanent, Level::Session, Level::Working, Level::Volatile];

    /// Lower-case name.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Level::Session.as_str(), "session");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Level::Permanent => "permanent",
            Level::Session => "session",
            Level::Working => "working",
            Level::Volatile => "volatile",
        }
    }

    /// Parses a lower-case name.
    ///
    /// ```
    /// use ctxwin_core::Level;
    /// assert_eq!(Level::parse("working"), Some(Level::Working));
    /// assert_eq!(Level::parse("Working"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|level| level.as_str() == name)
    }

    /// Position in [`Level::ALL`].
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Level::Working.index(), 2);
    /// ```
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether messages here are part of the conversation history (working or volatile).
    ///
    /// ```
    /// use ctxwin_core::Level;
    /// assert!(Level::Volatile.is_history());
    /// assert!(!Level::Session.is_history());
    /// ```
    pub const fn is_history(self) -> bool {
        matches!(self, Level::Working | Level::Volatile)
    }
}

impl core::fmt::Display for Level {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
