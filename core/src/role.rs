//! Who wrote a message.

/// The author of a chat message, as chat-completion APIs name them.
///
/// ```
/// use ctxwin_core::Role;
/// assert_eq!(Role::Tool.as_str(), "tool");
/// assert_eq!(Role::parse("assistant"), Some(Role::Assistant));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Role {
    /// Instructions from the application: system prompt, rules, injected context.
    System,
    /// The human (or the upstream program) talking to the agent.
    #[default]
    User,
    /// The model; may carry tool calls.
    Assistant,
    /// The result of one tool call, answering it by id.
    Tool,
}

impl Role {
    /// The lower-case name OpenAI and Anthropic use on the wire.
    ///
    /// ```
    /// assert_eq!(ctxwin_core::Role::System.as_str(), "system");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses a wire name (`system`, `developer`, `user`, `assistant`, `tool`).
    ///
    /// ```
    /// use ctxwin_core::Role;
    /// assert_eq!(Role::parse("developer"), Some(Role::System));
    /// assert_eq!(Role::parse("robot"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

impl core::fmt::Display for Role {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
