//! The structured summary of a finished task, written extractively: its goal, its outcome, the
//! files it touched, what was decided, and each error with what resolved it.

use core::fmt::Write as _;

use super::extractive::DECISION_CUES;
use super::{SummarizeError, SummarySource, TextBuffer};
use crate::counter::TokenCounter;
use crate::message::MessageRef;
use crate::role::Role;
use crate::small::contains_ignore_case;
use crate::task::{error_signature, looks_like_error};

/// Files a summary names, at most.
const MAX_FILES: usize = 8;
/// Decisions a summary quotes, at most.
const MAX_DECISIONS: usize = 3;
/// Errors a summary reports, at most (distinct signatures).
const MAX_ERRORS: usize = 3;
/// Bytes of one quoted statement (an outcome, a decision, an error line), at most.
const STATEMENT: usize = 160;
/// Bytes of a call's arguments quoted as an error's resolution, at most.
const ARGUMENTS: usize = 80;

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

/// Writes the structured summary of `request` into `out`, one line per part, most needed
/// first, as many parts as the budget holds:
///
/// ```text
/// Task 3: <goal>
/// Outcome: <outcome, else the last answer's first sentence>
/// Files: src/a.rs, Cargo.toml
/// Errors: <error line> -> fixed by <call>(<arguments>)
/// Decisions: <statement>; <statement>
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
    out.clear();
    let fits = |out: &mut TextBuffer<'_>, write: &dyn Fn(&mut TextBuffer<'_>)| {
        let before = out.len();
        write(out);
        let over = out.is_truncated() || request.counter.count(out.as_str()) > request.budget;
        if over {
            out.truncate(before);
        }
        !over
    };
    let head = |out: &mut TextBuffer<'_>| {
        let _ = write!(out, "Task {}: {}", request.number, clip(request.goal, STATEMENT));
    };
    if !fits(out, &head) {
        return Err(SummarizeError::Rejected);
    }
    let outcome = match request.outcome.trim() {
        "" => last_answer(request.messages.clone()).unwrap_or("not stated"),
        said => said,
    };
    fits(out, &|out| {
        out.push_line("Outcome: ");
        out.push_str(clip(outcome, STATEMENT));
    });
    let files = Files::of(request.messages.clone());
    if !files.is_empty() {
        fits(out, &|out| files.write(out));
    }
    let errors = Errors::of(request.messages.clone());
    if !errors.items.is_empty() {
        fits(out, &|out| errors.write(out));
    }
    let decisions = Decisions::of(request.messages.clone());
    if !decisions.items.is_empty() {
        fits(out, &|out| decisions.write(out));
    }
    Ok(())
}

/// `text` cut to `max` bytes at a char boundary, first line only.
fn clip(text: &str, max: usize) -> &str {
    let line = text.trim().lines().next().unwrap_or_default().trim();
    let mut end = line.len().min(max);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.get(..end).unwrap_or_default()
}

/// The first sentence of the last answer without calls.
fn last_answer<'a>(messages: SummarySource<'a>) -> Option<&'a str> {
    let mut answer = None;
    for message in messages {
        let content = message.content().trim();
        if message.role() == Role::Assistant
            && message.tool_call_count() == 0
            && !content.is_empty()
        {
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

/// Distinct file names, in order of first mention.
struct Files<'a> {
    names: heapless::Vec<&'a str, MAX_FILES>,
}

impl<'a> Files<'a> {
    fn of(messages: SummarySource<'a>) -> Self {
        let mut files = Files { names: heapless::Vec::new() };
        for message in messages {
            for call in message.tool_calls() {
                files.scan(call.arguments);
            }
            if message.role() != Role::Tool {
                files.scan(message.content());
            }
        }
        files
    }

    fn scan(&mut self, text: &'a str) {
        for token in crate::terms::tokens(text) {
            // A location (`src/main.rs:12:5`) names its file.
            let name = token.split(':').next().unwrap_or(token);
            if self.names.is_full() {
                return;
            }
            if is_file(name) && !self.names.contains(&name) {
                let _ = self.names.push(name);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    fn write(&self, out: &mut TextBuffer<'_>) {
        out.push_line("Files: ");
        for (i, name) in self.names.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(name);
        }
    }
}

/// An error and what ended it: the next call that did not fail.
struct Resolved<'a> {
    line: &'a str,
    signature: u32,
    fix: Option<(&'a str, &'a str)>,
}

struct Errors<'a> {
    items: heapless::Vec<Resolved<'a>, MAX_ERRORS>,
}

impl<'a> Errors<'a> {
    fn of(messages: SummarySource<'a>) -> Self {
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
            let fix = next_success(rest.clone());
            let _ = errors.items.push(Resolved { line, signature, fix });
        }
        errors
    }

    fn write(&self, out: &mut TextBuffer<'_>) {
        out.push_line("Errors: ");
        for (i, error) in self.items.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            out.push_str(error.line);
            match error.fix {
                Some((name, arguments)) => {
                    out.push_str(" -> fixed by ");
                    out.push_str(name);
                    if !arguments.is_empty() {
                        out.push_str(" ");
                        out.push_str(arguments);
                    }
                }
                None => out.push_str(" -> unresolved"),
            }
        }
    }
}

/// The error line of a tool result, clipped.
fn error_text(content: &str) -> &str {
    let line = content
        .lines()
        .find(|line| looks_like_error(line))
        .unwrap_or_else(|| content.lines().next().unwrap_or_default());
    clip(line, STATEMENT)
}

/// The call (name, clipped arguments) of the first tool result after an error that is not an
/// error itself.
fn next_success<'a>(messages: SummarySource<'a>) -> Option<(&'a str, &'a str)> {
    let mut calls: Option<MessageRef<'a>> = None;
    for message in messages {
        if message.tool_call_count() > 0 {
            calls = Some(message);
            continue;
        }
        if message.role() != Role::Tool || looks_like_error(message.content()) {
            continue;
        }
        let id = message.tool_call_id().unwrap_or_default();
        let call = calls.and_then(|unit| unit.tool_calls().find(|call| call.id == id));
        if let Some(call) = call {
            return Some((call.name, clip(call.arguments, ARGUMENTS)));
        }
    }
    None
}

/// Statements that record a decision, in order.
struct Decisions<'a> {
    items: heapless::Vec<&'a str, MAX_DECISIONS>,
}

impl<'a> Decisions<'a> {
    fn of(messages: SummarySource<'a>) -> Self {
        let mut decisions = Decisions { items: heapless::Vec::new() };
        for message in messages {
            if !matches!(message.role(), Role::User | Role::Assistant) {
                continue;
            }
            for line in message.content().lines() {
                for sentence in line.split(". ") {
                    if decisions.items.is_full() {
                        return decisions;
                    }
                    let sentence = sentence.trim();
                    if DECISION_CUES.iter().any(|cue| contains_ignore_case(sentence, cue)) {
                        let _ = decisions.items.push(clip(sentence, STATEMENT));
                    }
                }
            }
        }
        decisions
    }

    fn write(&self, out: &mut TextBuffer<'_>) {
        out.push_line("Decisions: ");
        for (i, decision) in self.items.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            out.push_str(decision);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
