//! Folding messages into a summary: the [`Summarizer`] seam, and [`Extractive`], the
//! deterministic one the core ships (no model).

mod extractive;
#[cfg(feature = "tasks")]
mod task;
mod text;

pub use extractive::{Extractive, line_source};
#[cfg(feature = "tasks")]
pub use task::{
    TaskHead, TaskMessage, TaskRequest, task_summary, task_summary_number, task_summary_of,
};
pub use text::TextBuffer;

use crate::counter::TokenCounter;
use crate::message::MessageRef;
use crate::view::{History, LevelMessages};

/// How much detail a summary keeps.
///
/// ```
/// use ctxwin_core::summarize::Detail;
/// assert!(Detail::Line.max_segments() < Detail::Paragraph.max_segments());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Detail {
    /// A few lines: the decisions, errors, paths, commands, identifiers and numbers.
    Paragraph,
    /// One line: the few statements that say something specific (a path, identifier, number,
    /// name, decision, error), best first within a line's budget; none if there are none.
    Line,
    /// Summaries merged when the session level overflows: as many of their best statements
    /// as the budget holds. Never shortened to a line by age.
    Digest,
}

impl Detail {
    /// Most statements a summary at this detail keeps.
    pub const fn max_segments(self) -> usize {
        match self {
            Detail::Paragraph => 12,
            Detail::Line => 3,
            Detail::Digest => usize::MAX,
        }
    }

    /// Value stored in a summary's header (`MessageRef::detail`).
    pub(crate) const fn code(self) -> u8 {
        match self {
            Detail::Paragraph => 1,
            Detail::Line => 2,
            Detail::Digest => 3,
        }
    }
}

/// The messages a summary stands for, oldest first: live history messages with ids in
/// `first..=last` (cloneable, so a summarizer may read them more than once).
///
/// ```
/// use ctxwin_core::{ContextManager, Message, summarize::SummarySource, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let first = manager.push(Message::user("plan the release"))?;
/// let last = manager.push(Message::assistant("release on Friday"))?;
/// let source = manager.summary_source(first, last);
/// assert_eq!(source.count(), 2);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SummarySource<'a> {
    messages: Messages<'a>,
    first: u64,
    last: u64,
}

/// Where a source's messages come from.
#[derive(Clone, Debug)]
enum Messages<'a> {
    None,
    History(History<'a>),
    Unit(LevelMessages<'a>),
}

impl<'a> SummarySource<'a> {
    pub(crate) fn new(history: History<'a>, first: u64, last: u64) -> Self {
        Self { messages: Messages::History(history), first, last }
    }

    /// The messages of one unit (or any run of one level's messages).
    pub(crate) fn unit(messages: LevelMessages<'a>, first: u64, last: u64) -> Self {
        Self { messages: Messages::Unit(messages), first, last }
    }

    /// No messages (when only a previous summary is being shortened).
    pub fn empty() -> Self {
        Self { messages: Messages::None, first: 1, last: 0 }
    }

    /// Id range covered, inclusive (empty when `first > last`).
    pub fn ids(&self) -> (u64, u64) {
        (self.first, self.last)
    }
}

impl<'a> Iterator for SummarySource<'a> {
    type Item = MessageRef<'a>;

    fn next(&mut self) -> Option<MessageRef<'a>> {
        let history = match &mut self.messages {
            Messages::None => return None,
            Messages::Unit(unit) => return unit.next(),
            Messages::History(history) => history,
        };
        loop {
            let message = history.next()?;
            if message.id() > self.last {
                self.messages = Messages::None;
                return None;
            }
            if message.id() >= self.first {
                return Some(message);
            }
        }
    }
}

/// What a summarizer is asked to do.
#[derive(Clone)]
pub struct SummaryRequest<'a> {
    /// Text of the summary being extended or shortened ("" for none). Its content must survive
    /// as far as the budget allows: it stands for messages that are gone.
    pub previous: &'a str,
    /// The messages to fold in.
    pub messages: SummarySource<'a>,
    /// Most tokens the summary may cost, as `counter` counts.
    pub budget: u32,
    /// How much detail to keep.
    pub detail: Detail,
    /// The manager's token counter.
    pub counter: &'a dyn TokenCounter,
}

/// Why a summarizer produced nothing; the manager then falls back to dropping (or, for an
/// LLM summarizer, the caller's fallback).
///
/// ```
/// assert_eq!(ctxwin_core::summarize::SummarizeError::Unavailable.to_string(), "summarizer unavailable");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum SummarizeError {
    /// The summarizer cannot run now (a model server is down, a worker is busy).
    Unavailable,
    /// It ran but its answer was unusable (empty, longer than its input, not a summary).
    Rejected,
    /// The messages hold nothing worth keeping at the detail asked for (chatter,
    /// acknowledgements, output the agent can fetch again): they leave without a summary, and
    /// this is not counted as a failure.
    NothingToKeep,
}

impl core::fmt::Display for SummarizeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            SummarizeError::Unavailable => "summarizer unavailable",
            SummarizeError::Rejected => "summary rejected",
            SummarizeError::NothingToKeep => "nothing worth keeping",
        })
    }
}

impl core::error::Error for SummarizeError {}

/// Folds messages (and a previous summary) into a shorter text.
///
/// Contract: write at most `request.budget` tokens (as `request.counter` counts) into `out`;
/// never allocate or panic; on error leave `out` as it was found or empty. The manager stores
/// what is written as a summary in the session level, standing for the messages' ids.
///
/// ```
/// use ctxwin_core::{summarize::Detail, summarize::SummarizeError, summarize::Summarizer, summarize::SummaryRequest, summarize::TextBuffer};
/// /// Keeps the first line of every message.
/// struct FirstLines;
/// impl Summarizer for FirstLines {
///     fn summarize(&mut self, request: &SummaryRequest<'_>, out: &mut TextBuffer<'_>) -> Result<(), SummarizeError> {
///         for message in request.messages.clone() {
///             out.push_line(message.content().lines().next().unwrap_or(""));
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait Summarizer {
    /// Writes the summary of `request` into `out`.
    fn summarize(
        &mut self,
        request: &SummaryRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError>;

    /// Writes the structured summary of a finished task into `out` (goal, outcome, files,
    /// errors and their resolutions, decisions), within `request.budget` tokens. The default
    /// is the core's extractive [`task_summary`]; a model-backed summarizer overrides it and
    /// falls back to it.
    #[cfg(feature = "tasks")]
    fn summarize_task(
        &mut self,
        request: &TaskRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        task_summary(request, out)
    }
}

impl<T: Summarizer + ?Sized> Summarizer for &mut T {
    fn summarize(
        &mut self,
        request: &SummaryRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        (**self).summarize(request, out)
    }

    #[cfg(feature = "tasks")]
    fn summarize_task(
        &mut self,
        request: &TaskRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        (**self).summarize_task(request, out)
    }
}
