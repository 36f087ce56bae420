//! The structured summary of a finished task, written extractively: its goal, its outcome, the
//! files it changed and read, each error with how it was resolved, what was decided, and the
//! approaches it abandoned.
//!
//! The writer reads any run of messages ([`TaskMessage`]): the core's own records when a task
//! finishes ([`task_summary`]), or a caller's copies of the whole task read back from its
//! archive ([`task_summary_of`]), so a summary can stand for messages that left the window
//! while the task ran.

use core::fmt::Write as _;

use super::extractive::DECISION_CUES;
use super::{SummarizeError, SummarySource, TextBuffer};
use crate::counter::TokenCounter;
use crate::message::{Message, MessageRef};
use crate::record::ToolCall;
use crate::role::Role;
use crate::small::contains_ignore_case;
use crate::small::lines;
use crate::task::{error_signature, looks_like_error};

/// Files a summary names, at most.
const MAX_FILES: usize = 8;
/// Files considered while reading a task (changed ones displace read ones beyond
/// [`MAX_FILES`]).
const FILE_CANDIDATES: usize = 2 * MAX_FILES;
/// Decisions a summary quotes, at most.
const MAX_DECISIONS: usize = 3;
/// Errors a summary reports, at most (distinct signatures).
const MAX_ERRORS: usize = 3;
/// Abandoned approaches a summary quotes, at most.
const MAX_DEAD_ENDS: usize = 2;
/// Sentences quoted for how one error was resolved, at most.
const RESOLUTION_SENTENCES: usize = 2;
/// Messages after an error read for its resolution, at most.
const RESOLUTION_WINDOW: usize = 12;
/// Bytes of one quoted statement (an outcome, a decision, an error line), at most.
const STATEMENT: usize = 160;
/// Bytes of a call's arguments quoted as an error's resolution, at most.
const ARGUMENTS: usize = 80;

/// Word beginnings of a sentence that says how an error was resolved or what caused it.
const RESOLUTION_CUES: [&str; 7] =
    ["fix", "resolv", "solv", "solution", "workaround", "because", "caused"];

/// Word beginnings of a sentence that gives an approach up.
const DEAD_END_CUES: [&str; 14] = [
    "abandon",
    "dropping",
    "dropped",
    "giving up",
    "give up",
    "gave up",
    "roll back",
    "rolled back",
    "back out",
    "dead end",
    "doesn't work",
    "didn't work",
    "does not work",
    "did not work",
];

/// Word beginnings of a tool name that changes files (edit, write, patch, create…): the paths
/// in its arguments are files the task changed.
const CHANGE_TOOL_CUES: [&str; 10] =
    ["edit", "write", "patch", "create", "replace", "insert", "delete", "remove", "rename", "move"];

/// A message a task summary reads: the core's records ([`MessageRef`]) or a caller's messages
/// ([`Message`], such as a task's archived messages read back).
///
/// ```
/// use ctxwin_core::{Message, Role, summarize::TaskMessage};
/// let message = Message::user("fix src/lib.rs");
/// assert_eq!((TaskMessage::role(&message), TaskMessage::content(&message)), (Role::User, "fix src/lib.rs"));
/// assert_eq!(message.call_count(), 0);
/// ```
pub trait TaskMessage<'a>: Copy {
    /// Its author.
    fn role(&self) -> Role;
    /// Its text.
    fn content(&self) -> &'a str;
    /// How many tool calls it makes.
    fn call_count(&self) -> usize;
    /// Its call `index`.
    fn call(&self, index: usize) -> Option<ToolCall<'a>>;
    /// The call a tool result answers.
    fn answers(&self) -> Option<&'a str>;
}

impl<'a> TaskMessage<'a> for MessageRef<'a> {
    fn role(&self) -> Role {
        MessageRef::role(self)
    }
    fn content(&self) -> &'a str {
        MessageRef::content(self)
    }
    fn call_count(&self) -> usize {
        self.tool_call_count()
    }
    fn call(&self, index: usize) -> Option<ToolCall<'a>> {
        self.tool_calls().nth(index)
    }
    fn answers(&self) -> Option<&'a str> {
        self.tool_call_id()
    }
}

impl<'a> TaskMessage<'a> for Message<'a> {
    fn role(&self) -> Role {
        self.role
    }
    fn content(&self) -> &'a str {
        self.content
    }
    fn call_count(&self) -> usize {
        self.tool_calls.len()
    }
    fn call(&self, index: usize) -> Option<ToolCall<'a>> {
        self.tool_calls.get(index).copied()
    }
    fn answers(&self) -> Option<&'a str> {
        self.tool_call_id
    }
}

/// What a task summary is written from.
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities, summarize::TaskRequest};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let first = manager.push(Message::user("rename the crate"))?;
/// let source = manager.summary_source(first, first);
/// let request = TaskRequest {
///     number: 1,
///     goal: "rename the crate",
///     outcome: "renamed",
///     messages: source,
///     budget: 100,
///     counter: manager.counter(),
/// };
/// assert_eq!(request.messages.clone().count(), 1);
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone)]
pub struct TaskRequest<'a> {
    /// The task's number ([`Task::number`](crate::task::Task::number)).
    pub number: u32,
    /// Its goal, as started.
    pub goal: &'a str,
    /// How it ended, as the caller said ("" when not said).
    pub outcome: &'a str,
    /// Its messages still in the history, oldest first.
    pub messages: SummarySource<'a>,
    /// Most tokens the summary may cost, as `counter` counts.
    pub budget: u32,
    /// The manager's token counter.
    pub counter: &'a dyn TokenCounter,
}

/// What a task summary says besides its messages ([`task_summary_of`]).
///
/// ```
/// let counter = ctxwin_core::estimator::Estimator::new();
/// let head = ctxwin_core::summarize::TaskHead { number: 2, goal: "g", outcome: "", budget: 50, counter: &counter };
/// assert_eq!(head.number, 2);
/// ```
#[derive(Clone, Copy)]
pub struct TaskHead<'a> {
    /// The task's number.
    pub number: u32,
    /// Its goal, as started.
    pub goal: &'a str,
    /// How it ended, as the caller said ("" when not said).
    pub outcome: &'a str,
    /// Most tokens the summary may cost, as `counter` counts.
    pub budget: u32,
    /// The token counter.
    pub counter: &'a dyn TokenCounter,
}

/// The task number of a summary's text when it is a task summary (it starts with the
/// `Task N:` line every task summary opens with).
///
/// ```
/// use ctxwin_core::summarize::task_summary_number;
/// assert_eq!(task_summary_number("Task 12: add a flag\nOutcome: done"), Some(12));
/// assert_eq!(task_summary_number("Decided to ship on Friday."), None);
/// ```
pub fn task_summary_number(text: &str) -> Option<u32> {
    let rest = text.trim_start().strip_prefix("Task ")?;
    let (number, _) = rest.split_once(':')?;
    number.parse().ok()
}

/// Writes the structured summary of `request` into `out`, one line per part, most needed
/// first, as many items as the budget holds:
///
/// ```text
/// Task 3: <goal>
/// Outcome: <outcome, else the last answer's first sentence>
/// Files: <changed files first>, <then files read or named>
/// Errors: <error line> -> fixed by <call> <arguments>: <what the agent said resolved it>
/// Decisions: <statement>; <a reply to the agent's question>
/// Dead ends: <an approach given up, as said>
/// ```
///
/// ```
/// use ctxwin_core::{ContextManager, Message, TinyCapacities, ToolCall};
/// use ctxwin_core::summarize::{TaskRequest, TextBuffer, task_summary};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let first = manager.push(Message::user("make the tests pass"))?;
/// let calls = [ToolCall::new("c1", "run", r#"{"cmd":"cargo test"}"#)];
/// manager.push(Message::assistant("").with_tool_calls(&calls))?;
/// manager.push(Message::tool_result("c1", "error[E0425]: cannot find value `x` in src/lib.rs"))?;
/// let calls = [ToolCall::new("c2", "edit", r#"{"path":"src/lib.rs"}"#)];
/// manager.push(Message::assistant("").with_tool_calls(&calls))?;
/// manager.push(Message::tool_result("c2", "ok"))?;
/// let last = manager.push(Message::assistant("Decided to declare x in src/lib.rs. Tests pass."))?;
/// let request = TaskRequest {
///     number: 1, goal: "make the tests pass", outcome: "",
///     messages: manager.summary_source(first, last), budget: 200, counter: manager.counter(),
/// };
/// let mut bytes = [0u8; 512];
/// let mut out = TextBuffer::new(&mut bytes);
/// task_summary(&request, &mut out)?;
/// let text = out.as_str();
/// assert!(text.starts_with("Task 1: make the tests pass\nOutcome: Decided to declare x"));
/// assert!(text.contains("Files: src/lib.rs"));
/// assert!(text.contains("Errors: error[E0425]: cannot find value `x` in src/lib.rs -> fixed by edit"));
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
pub fn task_summary(
    request: &TaskRequest<'_>,
    out: &mut TextBuffer<'_>,
) -> Result<(), SummarizeError> {
    let head = TaskHead {
        number: request.number,
        goal: request.goal,
        outcome: request.outcome,
        budget: request.budget,
        counter: request.counter,
    };
    task_summary_of(&head, request.messages.clone(), out)
}

/// [`task_summary`] of any run of a task's `messages`, oldest first: how a caller that keeps
/// the task's messages elsewhere (a session's archive) summarizes the whole task once part of
/// it left the window. Reads the messages a bounded number of times (once per part, and at
/// most `RESOLUTION_WINDOW` more per error).
///
/// ```
/// use ctxwin_core::{Message, Role, ToolCall, estimator::Estimator};
/// use ctxwin_core::summarize::{TaskHead, TextBuffer, task_summary_of};
/// let calls = [ToolCall::new("c1", "edit_file", r#"{"path":"src/lease.rs"}"#)];
/// let messages = [
///     Message::user("Raise the lease timeout"),
///     Message::assistant("").with_tool_calls(&calls),
///     Message::tool_result("c1", "Applied 1 hunk"),
///     Message::assistant("Should it be 60 or 90 seconds?"),
///     Message::user("90 seconds."),
///     Message::assistant("Done: the lease waits 90 s."),
/// ];
/// let counter = Estimator::new();
/// let head = TaskHead { number: 4, goal: "raise the lease timeout", outcome: "", budget: 200, counter: &counter };
/// let mut bytes = [0u8; 512];
/// let mut out = TextBuffer::new(&mut bytes);
/// task_summary_of(&head, messages.iter().copied(), &mut out)?;
/// assert_eq!(out.as_str(), "Task 4: raise the lease timeout\nOutcome: Done: the lease waits 90 s.\nFiles: src/lease.rs\nDecisions: 90 seconds.");
/// # Ok::<(), ctxwin_core::summarize::SummarizeError>(())
/// ```
pub fn task_summary_of<'a, M, I>(
    head: &TaskHead<'_>,
    messages: I,
    out: &mut TextBuffer<'_>,
) -> Result<(), SummarizeError>
where
    M: TaskMessage<'a>,
    I: Iterator<Item = M> + Clone,
{
    out.clear();
    let mut writer = Writer { out, budget: head.budget, counter: head.counter };
    let title = |out: &mut TextBuffer<'_>| {
        let _ = write!(out, "Task {}: {}", head.number, clip(head.goal, STATEMENT));
    };
    if !writer.fits(&title) {
        return Err(SummarizeError::Rejected);
    }
    let outcome = match head.outcome.trim() {
        "" => last_answer(messages.clone()).unwrap_or("not stated"),
        said => said,
    };
    writer.fits(&|out| {
        out.push_line("Outcome: ");
        out.push_str(clip(outcome, STATEMENT));
    });
    let files = Files::of(messages.clone());
    writer.list(
        "Files: ",
        ", ",
        files.names().map(|name| move |out: &mut TextBuffer<'_>| out.push_str(name)),
    );
    let errors = Errors::of(messages.clone());
    writer.list(
        "Errors: ",
        "; ",
        errors.items.iter().map(|error| move |out: &mut TextBuffer<'_>| error.write(out)),
    );
    let decisions = Decisions::of(messages.clone());
    writer.list(
        "Decisions: ",
        "; ",
        decisions.items.iter().map(|d| move |out: &mut TextBuffer<'_>| out.push_str(d)),
    );
    let dead_ends = DeadEnds::of(messages, &errors);
    writer.list(
        "Dead ends: ",
        "; ",
        dead_ends.items.iter().map(|d| move |out: &mut TextBuffer<'_>| out.push_str(d)),
    );
    Ok(())
}

/// The summary being written, within its budget.
struct Writer<'o, 'b> {
    out: &'o mut TextBuffer<'b>,
    budget: u32,
    counter: &'o dyn TokenCounter,
}

impl Writer<'_, '_> {
    /// Writes `write`, undone when it does not fit; whether it was kept.
    fn fits(&mut self, write: &dyn Fn(&mut TextBuffer<'_>)) -> bool {
        let before = self.out.len();
        write(self.out);
        let over = self.out.is_truncated() || self.counter.count(self.out.as_str()) > self.budget;
        if over {
            self.out.truncate(before);
        }
        !over
    }

    /// A line of `label` and the `items` that fit, separated by `separator`; nothing when
    /// not even the first fits.
    fn list<F: Fn(&mut TextBuffer<'_>)>(
        &mut self,
        label: &str,
        separator: &str,
        items: impl Iterator<Item = F>,
    ) {
        let mut first = true;
        for item in items {
            let fitted = self.fits(&|out| {
                if first {
                    out.push_line(label);
                } else {
                    out.push_str(separator);
                }
                item(out);
            });
            if !fitted {
                return;
            }
            first = false;
        }
    }
}

/// `text` cut to `max` bytes at a char boundary, first line only.
fn clip(text: &str, max: usize) -> &str {
    let line = lines(text.trim()).next().unwrap_or_default().trim();
    let mut end = line.len().min(max);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.get(..end).unwrap_or_default()
}

/// Whether `text` holds one of `cues` at the start of a word (ASCII case-insensitive).
fn has_word_cue(text: &str, cues: &[&str]) -> bool {
    let bytes = text.as_bytes();
    cues.iter().any(|cue| {
        let needle = cue.as_bytes();
        bytes.len() >= needle.len()
            && (0..=bytes.len() - needle.len()).any(|at| {
                let starts = at == 0
                    || bytes.get(at - 1).is_some_and(|b| !b.is_ascii_alphanumeric() && *b != b'_');
                starts
                    && bytes
                        .get(at..at + needle.len())
                        .is_some_and(|window| window.eq_ignore_ascii_case(needle))
            })
    })
}

/// The sentences of a statement (split at ". " and at line ends), trimmed, non-empty.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    lines(text).flat_map(|line| line.split(". ")).map(str::trim).filter(|s| !s.is_empty())
}

/// The first sentence of the last answer without calls.
fn last_answer<'a, M: TaskMessage<'a>>(messages: impl Iterator<Item = M>) -> Option<&'a str> {
    let mut answer = None;
    for message in messages {
        let content = message.content().trim();
        if message.role() == Role::Assistant && message.call_count() == 0 && !content.is_empty() {
            answer = Some(content);
        }
    }
    answer.map(|text| text.split(". ").next().unwrap_or(text))
}

/// Extensions a file name without a slash must have (a dotted word such as `rows.len` or
/// `self.items` is a method or a field, not a file).
const EXTENSIONS: [&str; 40] = [
    "rs", "py", "js", "ts", "tsx", "jsx", "go", "java", "kt", "c", "h", "cc", "cpp", "hpp", "cs",
    "rb", "php", "swift", "scala", "sh", "md", "rst", "txt", "toml", "json", "yaml", "yml", "xml",
    "html", "css", "sql", "proto", "lock", "cfg", "ini", "conf", "env", "csv", "log", "mod",
];

/// Whether `token` names a file: a path with a slash, or a name with a file extension.
fn is_file(token: &str) -> bool {
    if crate::small::contains(token, "://") || crate::small::contains(token, "::") {
        return false;
    }
    let has_letter = |part: &str| part.bytes().any(|b| b.is_ascii_alphabetic());
    if token.contains('/') {
        return has_letter(token) && token.len() > 2;
    }
    match token.rsplit_once('.') {
        Some((stem, ext)) => {
            stem.len() >= 2
                && has_letter(stem)
                && EXTENSIONS.iter().any(|known| known.eq_ignore_ascii_case(ext))
        }
        None => false,
    }
}

/// Distinct file names in order of first mention, each marked when a call that changes files
/// named it.
struct Files<'a> {
    names: heapless::Vec<(&'a str, bool), FILE_CANDIDATES>,
}

impl<'a> Files<'a> {
    fn of<M: TaskMessage<'a>>(messages: impl Iterator<Item = M>) -> Self {
        let mut files = Files { names: heapless::Vec::new() };
        for message in messages {
            for call in (0..message.call_count()).filter_map(|i| message.call(i)) {
                files.scan(call.arguments, has_word_cue(call.name, &CHANGE_TOOL_CUES));
            }
            if message.role() != Role::Tool {
                files.scan(message.content(), false);
            }
        }
        files
    }

    fn scan(&mut self, text: &'a str, changed: bool) {
        for token in crate::terms::tokens(text) {
            // A location (`src/main.rs:12:5`) names its file.
            let name = token.split(':').next().unwrap_or(token);
            if !is_file(name) {
                continue;
            }
            if let Some(known) = self.names.iter_mut().find(|(known, _)| *known == name) {
                known.1 |= changed;
                continue;
            }
            if !self.names.is_full() {
                let _ = self.names.push((name, changed));
            } else if changed {
                // A changed file displaces the newest one only read.
                if let Some(read) = self.names.iter_mut().rev().find(|(_, was)| !was) {
                    *read = (name, true);
                }
            }
        }
    }

    /// Changed files first, then the others, at most [`MAX_FILES`]; a name another one holds
    /// (`lexer.rs` beside `src/lexer.rs`, the directory `src` beside `src/lexer.rs`) is left
    /// out.
    fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        let changed = self.names.iter().filter(|(_, changed)| *changed);
        let read = self.names.iter().filter(|(_, changed)| !changed);
        changed
            .chain(read)
            .map(|(name, _)| *name)
            .filter(|name| !self.names.iter().any(|(other, _)| within(name, other)))
            .take(MAX_FILES)
    }
}

/// Whether the file name `name` is part of the longer path `other`: its last components, or
/// a directory it is in.
fn within(name: &str, other: &str) -> bool {
    other.len() > name.len()
        && ((other.ends_with(name)
            && other.as_bytes().get(other.len() - name.len() - 1) == Some(&b'/'))
            || (other.starts_with(name) && other.as_bytes().get(name.len()) == Some(&b'/')))
}

/// An error, the call that ended it (the next one that did not fail) and what was said about
/// how it was resolved.
struct Resolved<'a> {
    line: &'a str,
    signature: u32,
    fix: Option<(&'a str, &'a str)>,
    said: heapless::Vec<&'a str, RESOLUTION_SENTENCES>,
}

impl Resolved<'_> {
    fn write(&self, out: &mut TextBuffer<'_>) {
        out.push_str(self.line);
        match self.fix {
            Some((name, arguments)) => {
                out.push_str(" -> fixed by ");
                out.push_str(name);
                // What was said names the fix better than the call's arguments.
                if !arguments.is_empty() && self.said.is_empty() {
                    out.push_str(" ");
                    out.push_str(arguments);
                }
            }
            None if self.said.is_empty() => out.push_str(" -> unresolved"),
            None => out.push_str(" ->"),
        }
        for (i, sentence) in self.said.iter().enumerate() {
            out.push_str(match i {
                0 if self.fix.is_some() => ": ",
                0 => " ",
                _ => ". ",
            });
            out.push_str(sentence);
        }
    }
}

struct Errors<'a> {
    items: heapless::Vec<Resolved<'a>, MAX_ERRORS>,
}

impl<'a> Errors<'a> {
    fn of<M: TaskMessage<'a>, I: Iterator<Item = M> + Clone>(messages: I) -> Self {
        let mut errors = Errors { items: heapless::Vec::new() };
        let mut rest = messages;
        while !errors.items.is_full() {
            let Some(message) = rest.next() else { break };
            if message.role() != Role::Tool || !looks_like_error(message.content()) {
                continue;
            }
            let Some(signature) = error_signature(message.content()) else { continue };
            let seen = errors.items.iter().any(|e| e.signature == signature);
            if seen {
                continue;
            }
            let line = error_text(message.content());
            // What follows up to another error is about this one.
            let after = rest.clone().take(RESOLUTION_WINDOW).take_while(|m| {
                m.role() != Role::Tool
                    || error_signature(m.content()).is_none_or(|other| other == signature)
            });
            let fix = next_success(after.clone());
            let said = resolution_said(after);
            let _ = errors.items.push(Resolved { line, signature, fix, said });
        }
        errors
    }

    /// Whether a sentence is quoted already as an error's resolution.
    fn quotes(&self, sentence: &str) -> bool {
        self.items.iter().any(|e| e.said.contains(&sentence))
    }
}

/// The error line of a tool result, clipped.
fn error_text(content: &str) -> &str {
    let line = lines(content)
        .find(|line| looks_like_error(line))
        .unwrap_or_else(|| lines(content).next().unwrap_or_default());
    clip(line, STATEMENT)
}

/// The call (name, clipped arguments) of the first tool result after an error that is not an
/// error itself.
fn next_success<'a, M: TaskMessage<'a>>(
    messages: impl Iterator<Item = M>,
) -> Option<(&'a str, &'a str)> {
    let mut calls: Option<M> = None;
    for message in messages {
        if message.call_count() > 0 {
            calls = Some(message);
            continue;
        }
        if message.role() != Role::Tool || looks_like_error(message.content()) {
            continue;
        }
        let id = message.answers().unwrap_or_default();
        let call = calls.and_then(|unit| {
            (0..unit.call_count()).filter_map(|i| unit.call(i)).find(|call| call.id == id)
        });
        if let Some(call) = call {
            return Some((call.name, clip(call.arguments, ARGUMENTS)));
        }
    }
    None
}

/// What was said about how an error was resolved: among the statements from the error to the
/// first result that did not fail, and the answer right after that result, the sentences that
/// name a fix or a cause; else the first sentence of the first answer after the error.
fn resolution_said<'a, M: TaskMessage<'a>>(
    messages: impl Iterator<Item = M>,
) -> heapless::Vec<&'a str, RESOLUTION_SENTENCES> {
    let mut cued: heapless::Vec<&'a str, RESOLUTION_SENTENCES> = heapless::Vec::new();
    let mut first: Option<&'a str> = None;
    let mut succeeded = false;
    for message in messages {
        match message.role() {
            Role::Tool if !looks_like_error(message.content()) => {
                succeeded = true;
                continue;
            }
            Role::Tool | Role::System => continue,
            Role::User | Role::Assistant => {}
        }
        // After the success, only the answer that follows it counts.
        if succeeded && message.call_count() > 0 {
            break;
        }
        for sentence in sentences(message.content()) {
            if has_word_cue(sentence, &RESOLUTION_CUES) && !cued.is_full() {
                let _ = cued.push(clip(sentence, STATEMENT));
            }
        }
        if first.is_none() && message.call_count() == 0 {
            first = sentences(message.content()).next().map(|s| clip(s, STATEMENT));
        }
        if succeeded {
            break;
        }
    }
    if cued.is_empty()
        && let Some(first) = first
    {
        let _ = cued.push(first);
    }
    cued
}

/// Statements that record a decision, in order: sentences with a decision cue, and replies
/// to a question the agent asked (the developer's choice).
struct Decisions<'a> {
    items: heapless::Vec<&'a str, MAX_DECISIONS>,
}

impl<'a> Decisions<'a> {
    fn of<M: TaskMessage<'a>>(messages: impl Iterator<Item = M>) -> Self {
        let mut decisions = Decisions { items: heapless::Vec::new() };
        let mut asked = false;
        for message in messages {
            let role = message.role();
            if !matches!(role, Role::User | Role::Assistant) {
                asked = false;
                continue;
            }
            let content = message.content();
            let reply = role == Role::User && asked && !content.trim_end().ends_with('?');
            asked = role == Role::Assistant
                && message.call_count() == 0
                && lines(content).any(|line| line.trim_end().ends_with('?') || line.contains("? "));
            for (i, sentence) in sentences(content).enumerate() {
                if decisions.items.is_full() {
                    return decisions;
                }
                let cued = DECISION_CUES.iter().any(|cue| contains_ignore_case(sentence, cue));
                let quoted = clip(sentence, STATEMENT);
                if (cued || (reply && i == 0)) && !decisions.items.contains(&quoted) {
                    let _ = decisions.items.push(quoted);
                }
            }
        }
        decisions
    }
}

/// Approaches the task gave up, as said (sentences with a cue such as "dropping" or
/// "didn't work"), leaving out what an error's resolution quotes already.
struct DeadEnds<'a> {
    items: heapless::Vec<&'a str, MAX_DEAD_ENDS>,
}

impl<'a> DeadEnds<'a> {
    fn of<M: TaskMessage<'a>>(messages: impl Iterator<Item = M>, errors: &Errors<'a>) -> Self {
        let mut dead_ends = DeadEnds { items: heapless::Vec::new() };
        for message in messages {
            if !matches!(message.role(), Role::User | Role::Assistant) {
                continue;
            }
            for sentence in sentences(message.content()) {
                if dead_ends.items.is_full() {
                    return dead_ends;
                }
                let quoted = clip(sentence, STATEMENT);
                if has_word_cue(sentence, &DEAD_END_CUES)
                    && !errors.quotes(quoted)
                    && !dead_ends.items.contains(&quoted)
                {
                    let _ = dead_ends.items.push(quoted);
                }
            }
        }
        dead_ends
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::Estimator;

    /// The summary of `messages` within `budget` tokens.
    fn summary(messages: &[Message<'_>], budget: u32) -> heapless::String<2048> {
        let counter = Estimator::new();
        let head = TaskHead {
            number: 7,
            goal: "speed up the export",
            outcome: "",
            budget,
            counter: &counter,
        };
        let mut bytes = [0u8; 2048];
        let mut out = TextBuffer::new(&mut bytes);
        task_summary_of(&head, messages.iter().copied(), &mut out).unwrap();
        let mut text = heapless::String::new();
        let _ = text.push_str(out.as_str());
        text
    }

    #[test]
    fn errors_keep_what_the_agent_said_resolved_them_and_dead_ends_and_replies_are_kept() {
        let read = [ToolCall::new("r", "read_file", r#"{"path":"src/export/mod.rs"}"#)];
        let test = [ToolCall::new("t", "run", r#"{"cmd":"cargo test"}"#)];
        let bench = [ToolCall::new("b", "run", r#"{"cmd":"cargo bench"}"#)];
        let edit = [ToolCall::new("e", "edit_file", r#"{"path":"src/export/csv_writer.rs"}"#)];
        let messages = [
            Message::user("Stream the CSV export"),
            Message::assistant("Reading it.").with_tool_calls(&read),
            Message::tool_result("r", "pub struct Export;"),
            Message::assistant("I'll try the `rayon` crate first.").with_tool_calls(&bench),
            Message::tool_result(
                "b",
                "error[E0277]: `Export` cannot be shared between threads safely",
            ),
            Message::assistant(
                "Dropping the `rayon` crate: its handles are not Sync. I'll write it by hand.",
            ),
            Message::assistant("").with_tool_calls(&test),
            Message::tool_result(
                "t",
                "error[E0599]: no method named `flush_rows` found for struct `Export`",
            ),
            Message::assistant(
                "That fails because the trait is not imported. Fix: import `ExportExt` in src/export/csv_writer.rs.",
            ),
            Message::assistant("Applying it.").with_tool_calls(&edit),
            Message::tool_result("e", "Applied 1 hunk(s)."),
            Message::assistant("Should rows be flushed every 100 or every 1000 lines?"),
            Message::user("Every 1000 lines."),
            Message::assistant("Done: the export streams."),
        ];
        let text = summary(&messages, 400);
        let lines: heapless::Vec<&str, 8> = text.lines().collect();
        assert_eq!(lines[0], "Task 7: speed up the export");
        assert_eq!(lines[1], "Outcome: Done: the export streams.");
        // The file the task changed comes first.
        assert_eq!(lines[2], "Files: src/export/csv_writer.rs, src/export/mod.rs", "{text}");
        // Each error with what ended it, up to the next error.
        assert!(
            lines[3].contains(
                "cannot be shared between threads safely -> Dropping the `rayon` crate: its handles are not Sync; "
            ),
            "{text}"
        );
        assert!(
            lines[3].ends_with(
                "no method named `flush_rows` found for struct `Export` -> fixed by edit_file: That fails because the trait is not imported. Fix: import `ExportExt` in src/export/csv_writer.rs."
            ),
            "{text}"
        );
        assert_eq!(lines[4], "Decisions: Every 1000 lines.", "{text}");
        assert_eq!(lines.len(), 5, "the dead end is quoted once, with its error: {text}");
        // A dead end without an error has a line of its own.
        let said = [
            Message::user("Stream the CSV export"),
            Message::assistant(
                "The `csv-async` crate didn't work with our runtime, so I gave up on it.",
            ),
            Message::assistant("Done."),
        ];
        let text = summary(&said, 400);
        assert!(
            text.ends_with(
                "Dead ends: The `csv-async` crate didn't work with our runtime, so I gave up on it."
            ),
            "{text}"
        );
        // A small budget keeps the first items of each part that fit.
        let short = summary(&messages, 60);
        assert!(short.starts_with("Task 7: speed up the export\nOutcome:"), "{short}");
        assert!(Estimator::new().count(&short) <= 60);
    }

    #[test]
    fn task_summaries_are_told_by_their_first_line() {
        assert_eq!(task_summary_number("Task 3: fix it\nOutcome: fixed"), Some(3));
        assert_eq!(task_summary_number("Tasks: many"), None);
        assert_eq!(task_summary_number("Task x: y"), None);
    }

    #[test]
    fn files_are_paths_and_names_with_extensions() {
        for yes in ["src/main.rs", "Cargo.toml", "a/b", "README.md", "tests/it.py"] {
            assert!(is_file(yes), "{yes}");
        }
        for no in [
            "1.38",
            "std::io",
            "https://x.org/a",
            "e.g",
            "i.e",
            "v2",
            "ok.",
            "a.",
            "rows_0.len",
            "self.items",
        ] {
            assert!(!is_file(no), "{no}");
        }
    }
}
