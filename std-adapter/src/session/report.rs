//! What [`push`](super::Session::push), [`import`](super::Session::import),
//! [`restore`](super::Session::restore) and [`reload`](super::Session::reload) report back.

use crate::store::{CheckpointId, Fence, Skipped};

/// The outcome of a [`reload`](super::Session::reload): the lease taken, the checkpoint
/// restored, the rows pushed again after it.
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
/// let report = session.reload()?;
/// assert_eq!((report.checkpoint, report.replayed, report.dropped), (None, 0, 0));
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadReport {
    /// The fence the session writes with now ([`Fence::NONE`] on a store without leases).
    pub fence: Fence,
    /// The checkpoint restored; `None` when the conversation had none (the rows were replayed
    /// on an empty context).
    pub checkpoint: Option<CheckpointId>,
    /// Archived messages written after it, pushed into the core again.
    pub replayed: usize,
    /// Writes held in the journal that the store had refused, dropped.
    pub dropped: usize,
    /// Whether the session kept its state and replayed only the rows written after its own
    /// (it was what the newest checkpoint and the rows up to its own reproduce): nothing was
    /// restored, `checkpoint` is the one it continued from.
    pub resumed: bool,
}

/// A message the core stored shorter than it arrived (a tool output cut to head and tail).
///
/// ```
/// let r = ctxwin_std::session::Reduction { original_tokens: 4_000, stored_tokens: 900 };
/// assert_eq!(r.saved(), 3_100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Reduction {
    /// Tokens of the message as pushed (framing included).
    pub original_tokens: u32,
    /// Tokens of what the context holds.
    pub stored_tokens: u32,
}

impl Reduction {
    /// Tokens the reduction saved.
    pub fn saved(&self) -> u32 {
        self.original_tokens.saturating_sub(self.stored_tokens)
    }
}

/// The outcome of one [`push`](super::Session::push).
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut session = SessionBuilder::new("s").build()?;
/// let report = session.push(&ChatMessage::text(Role::User, "hi"))?;
/// assert_eq!((report.id, report.unit, report.reduced), (1, 1, None));
/// assert!(report.evicted_units.is_empty());
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushReport {
    /// The message's id in the core and the archive.
    pub id: u64,
    /// Its unit: its own id, or for a tool result the id of the assistant message that called.
    pub unit: u64,
    /// Set when the core stored it reduced; the archive keeps the full text.
    pub reduced: Option<Reduction>,
    /// Units evicted by this push (their first message ids), now in the archive.
    pub evicted_units: Vec<u64>,
    /// Messages in those units.
    pub evicted_messages: usize,
    /// Summaries the core made or changed, now recorded in the archive with their sources.
    pub summaries: Vec<u64>,
    /// The periodic checkpoint this push triggered, if any.
    pub checkpoint: Option<CheckpointId>,
}

/// The outcome of an [`import`](super::Session::import).
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// use ctxwin_std::{ChatMessage, Conversation, core::Role};
/// let mut session = SessionBuilder::new("s").build()?;
/// let conversation = Conversation {
///     system: Some("be brief".into()),
///     messages: vec![ChatMessage::text(Role::User, "hi")],
///     ..Default::default()
/// };
/// let report = session.import(&conversation)?;
/// assert_eq!((report.stored, report.ids.clone()), (2, vec![2]));
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Messages stored (the system prompt included).
    pub stored: usize,
    /// Tool definitions added (those already declared are skipped).
    pub tools: usize,
    /// The id of each of `Conversation::messages`, in order.
    pub ids: Vec<u64>,
    /// Tool outputs stored reduced.
    pub reduced: usize,
    /// Tokens those reductions saved.
    pub tokens_saved: u64,
    /// Units evicted to the archive.
    pub units_evicted: usize,
    /// Messages in those units.
    pub messages_evicted: usize,
    /// Summaries recorded in the archive.
    pub summaries: usize,
    /// Archive rows written for the imported messages.
    pub rows_written: usize,
    /// The checkpoint written at the end, when one was due.
    pub checkpoint: Option<CheckpointId>,
}

/// The outcome of a [`restore`](super::Session::restore).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    /// The checkpoint restored.
    pub id: CheckpointId,
    /// Newer checkpoints passed over, with the reason.
    pub skipped: Vec<Skipped>,
    /// Archived messages newer than the checkpoint (their ids will be reused): copied to
    /// session [`rewound_to`](Self::rewound_to) before anything overwrites them.
    pub rewound: Vec<u64>,
    /// Where the rewound messages were copied, when there were any.
    pub rewound_to: Option<String>,
}
