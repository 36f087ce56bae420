//! The extractive summarizer: keeps the statements summaries usually lose.
//!
//! Every message is cut into statements (lines, then sentences; tool calls become `ran name
//! arguments`). Each statement is scored for what an agent needs back later: decisions, errors,
//! file paths, commands, identifiers, numbers and names score high; acknowledgements and chatter
//! score nothing. The best statements are written in their original order, one per line, until
//! the token budget is spent. Deterministic, no model, no allocation: the candidates live in a
//! fixed array of [`MAX_CANDIDATES`] entries.

use super::{SummarizeError, Summarizer, SummaryRequest, TextBuffer};
use crate::message::MessageRef;
use crate::terms::{is_term, tokens};
use crate::{Role, TokenCounter};

/// Statements kept as candidates while scanning (the best ones win).
pub const MAX_CANDIDATES: usize = 12;
/// Longest statement kept, in bytes; longer ones are cut.
const MAX_STATEMENT: usize = 240;

const DECISION_CUES: [&str; 14] = [
    "decided",
    "decision",
    "we will",
    "we'll",
    "chose",
    "agreed",
    "going with",
    "must ",
    "always ",
    "never ",
    "instead",
    "switch to",
    "settled",
    "prefer",
];
const ERROR_CUES: [&str; 13] = [
    "error",
    "failed",
    "failure",
    "exception",
    "panic",
    "traceback",
    "denied",
    "not found",
    "timeout",
    "timed out",
    "refused",
    "invalid",
    "cannot",
];
const COMMANDS: [&str; 16] = [
    "cargo", "git", "npm", "pip", "python", "make", "docker", "kubectl", "curl", "ls", "cd",
    "grep", "rg", "sed", "bash", "ssh",
];
const FILLER: [&str; 10] =
    ["ok", "okay", "sure", "thanks", "thank you", "let me", "i'll", "i will", "great", "got it"];

/// Where a statement's text lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The previous summary.
    Previous,
    /// A message's content.
    Content,
    /// A message's tool call `n` (its arguments).
    Call(u8),
}

#[derive(Clone, Copy, Debug)]
struct Statement {
    /// Index of the message in the source (0 for the previous summary).
    message: u16,
    part: Part,
    role: Role,
    start: u32,
    end: u32,
    score: u16,
    /// Position in reading order, for writing the winners in order.
    order: u32,
}

/// How much an agent would miss this statement.
fn score(text: &str, role: Role, part: Part) -> u16 {
    let text = text.trim();
    let mut terms = 0u16;
    let mut term_points = 0u16;
    let mut names = 0u16;
    for (index, token) in tokens(text).enumerate() {
        if is_term(token) {
            terms += 1;
            // Paths are what summaries lose most, then identifiers, then bare numbers.
            let extension =
                crate::small::last_byte(token, b'.').and_then(|dot| token.get(dot + 1..));
            let path = token.bytes().any(|b| b == b'/')
                || extension.is_some_and(|ext| ext.bytes().all(|b| b.is_ascii_alphabetic()));
            term_points += if path {
                4
            } else if token.bytes().any(|b| b.is_ascii_alphabetic()) {
                3
            } else {
                2
            };
        } else if index > 0
            && token.len() >= 3
            && token.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
            && token.bytes().skip(1).any(|b| b.is_ascii_lowercase())
        {
            names += 1;
        }
    }
    let mut score = term_points.min(12) + 2 * names.min(3);
    if DECISION_CUES.iter().any(|cue| crate::small::contains_ignore_case(text, cue)) {
        score += 6;
    }
    if ERROR_CUES.iter().any(|cue| crate::small::contains_ignore_case(text, cue)) {
        score += 5;
    }
    let first = tokens(text).next().unwrap_or_default();
    if text.bytes().any(|b| b == b'`')
        || text.starts_with("$ ")
        || COMMANDS.iter().any(|c| c.eq_ignore_ascii_case(first))
    {
        score += 5;
    }
    if matches!(part, Part::Call(_)) {
        score += 3;
    }
    let filler = FILLER.iter().any(|f| {
        text.len() >= f.len()
            && text.as_bytes().get(..f.len()).is_some_and(|p| p.eq_ignore_ascii_case(f.as_bytes()))
    });
    if filler && terms == 0 {
        return 0;
    }
    // Any real statement keeps the gist when nothing better is there; filler never does.
    if score == 0 && tokens(text).count() >= 3 {
        score = 1;
    }
    if score == 0 {
        return 0;
    }
    match (role, part) {
        (_, Part::Previous) => score + 3,
        (Role::User, _) => score + 1,
        _ => score,
    }
}

/// Statements of `text`: lines, split further at sentence ends; each a byte range.
fn statements(text: &str, mut visit: impl FnMut(usize, usize)) {
    let mut line_start = 0usize;
    for line in crate::small::split_lines(text) {
        let mut start = 0usize;
        let bytes = line.as_bytes();
        for (at, pair) in bytes.windows(2).enumerate() {
            if matches!(pair, [b'.' | b'!' | b'?', b' ']) {
                visit(line_start + start, line_start + at + 1);
                start = at + 2;
            }
        }
        visit(line_start + start, line_start + line.len());
        line_start += line.len();
    }
}

/// The fixed-size pool of best statements.
struct Pool {
    items: [Option<Statement>; MAX_CANDIDATES],
}

impl Pool {
    fn offer(&mut self, statement: Statement) {
        if statement.score == 0 {
            return;
        }
        if let Some(slot) = self.items.iter_mut().find(|s| s.is_none()) {
            *slot = Some(statement);
            return;
        }
        // Replace the weakest, the oldest among equals, if the newcomer beats it.
        let weakest = self.items.iter_mut().flatten().min_by_key(|s| (s.score, s.order));
        if let Some(weakest) = weakest {
            if statement.score > weakest.score {
                *weakest = statement;
            }
        }
    }

    /// Orders the candidates best first (ties: the newer first), empty slots last.
    fn rank(&mut self) {
        crate::small::sort_by_key(&mut self.items, |s| {
            core::cmp::Reverse(s.map(|s| (s.score, s.order)))
        });
    }
}

/// The deterministic summarizer the core ships: no model, no allocation.
///
/// ```
/// use ctxwin_core::{ContextManager, Detail, Extractive, Message, Summarizer, SummaryRequest, TextBuffer, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// let first = manager.push(Message::user("Hi! Can you look at the build?"))?;
/// manager.push(Message::assistant("Sure, let me check."))?;
/// let last = manager.push(Message::assistant("Decided: pin tokio to 1.38 in Cargo.toml; src/net.rs fails with error E0277."))?;
/// let mut bytes = [0u8; 256];
/// let mut out = TextBuffer::new(&mut bytes);
/// let request = SummaryRequest {
///     previous: "",
///     messages: manager.summary_source(first, last),
///     budget: 60,
///     detail: Detail::Paragraph,
///     counter: manager.counter(),
/// };
/// Extractive.summarize(&request, &mut out).unwrap();
/// assert!(out.as_str().contains("tokio to 1.38"));
/// assert!(!out.as_str().contains("let me check"));
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extractive;

impl Extractive {
    fn text_of<'a>(previous: &'a str, message: Option<&MessageRef<'a>>, part: Part) -> &'a str {
        match (part, message) {
            (Part::Previous, _) => previous,
            (Part::Content, Some(m)) => m.content(),
            (Part::Call(n), Some(m)) => {
                m.tool_calls().nth(usize::from(n)).map_or("", |c| c.arguments)
            }
            _ => "",
        }
    }

    /// The text of `statement`, trimmed and cut to [`MAX_STATEMENT`] bytes, and the prefix
    /// that says whose it is.
    fn render<'a>(
        request: &SummaryRequest<'a>,
        statement: &Statement,
    ) -> (&'static str, &'a str, &'a str) {
        let message = request.messages.clone().nth(usize::from(statement.message));
        let text = Self::text_of(request.previous, message.as_ref(), statement.part);
        let piece =
            text.get(statement.start as usize..statement.end as usize).unwrap_or_default().trim();
        let piece = piece.strip_prefix("- ").unwrap_or(piece).trim();
        let mut end = piece.len().min(MAX_STATEMENT);
        while !piece.is_char_boundary(end) {
            end -= 1;
        }
        let piece = piece.get(..end).unwrap_or_default();
        match (statement.part, statement.role) {
            (Part::Previous, _) => ("", "", piece),
            (Part::Call(n), _) => {
                let name =
                    message.and_then(|m| m.tool_calls().nth(usize::from(n))).map_or("", |c| c.name);
                ("ran ", name, piece)
            }
            (_, Role::User) => ("user: ", "", piece),
            (_, Role::Tool) => ("tool: ", "", piece),
            _ => ("", "", piece),
        }
    }

    /// Tokens a rendered line costs (pieces counted apart: never less than the whole).
    fn cost(counter: &dyn TokenCounter, (prefix, name, piece): (&str, &str, &str)) -> u32 {
        counter.count(prefix) + counter.count(name) + counter.count(piece) + 2
    }

    /// Writes one line (newlines inside become spaces), cut to `room` bytes.
    fn write_line(
        out: &mut TextBuffer<'_>,
        (prefix, name, piece): (&str, &str, &str),
        room: usize,
    ) {
        if !out.is_empty() {
            out.push_str("\n");
        }
        let start = out.len();
        let separator = if name.is_empty() { "" } else { " " };
        for part in [prefix, name, separator, piece] {
            for (index, line) in part.split(['\n', '\r']).enumerate() {
                if index > 0 {
                    out.push_str(" ");
                }
                out.push_str(line);
            }
        }
        if out.len() - start > room {
            out.truncate(start + room);
        }
    }
}

impl Summarizer for Extractive {
    fn summarize(
        &mut self,
        request: &SummaryRequest<'_>,
        out: &mut TextBuffer<'_>,
    ) -> Result<(), SummarizeError> {
        let mut pool = Pool { items: [None; MAX_CANDIDATES] };
        let mut order = 0u32;
        let mut offer = |pool: &mut Pool, text: &str, message: u16, part: Part, role: Role| {
            statements(text, |start, end| {
                let piece = text.get(start..end).unwrap_or_default();
                let score = score(piece, role, part);
                pool.offer(Statement {
                    message,
                    part,
                    role,
                    start: start as u32,
                    end: end as u32,
                    score,
                    order,
                });
                order += 1;
            });
        };
        offer(&mut pool, request.previous, 0, Part::Previous, Role::System);
        for (index, message) in request.messages.clone().enumerate() {
            let index = u16::try_from(index).unwrap_or(u16::MAX);
            offer(&mut pool, message.content(), index, Part::Content, message.role());
            for (call, tool_call) in message.tool_calls().enumerate() {
                offer(
                    &mut pool,
                    tool_call.arguments,
                    index,
                    Part::Call(call as u8),
                    message.role(),
                );
            }
        }
        // Best statements first, while they fit the budget, moved to the front of the pool (no
        // second array: the stack is small on a device); then written in reading order.
        pool.rank();
        let mut count = 0usize;
        let mut left = request.budget;
        let mut cut_first = None;
        for index in 0..pool.items.len() {
            if count >= request.detail.max_segments() {
                break;
            }
            let Some(statement) = pool.items.get(index).copied().flatten() else { break };
            let rendered = Self::render(request, &statement);
            let duplicate = pool
                .items
                .iter()
                .take(count)
                .flatten()
                .any(|kept| Self::render(request, kept).2 == rendered.2);
            let cost = Self::cost(request.counter, rendered);
            if duplicate {
                continue;
            }
            if cost > left {
                // The best statement alone is too long: keep its start rather than nothing.
                if count == 0 && cut_first.is_none() {
                    cut_first = Some(statement);
                }
                continue;
            }
            left -= cost;
            crate::small::swap(&mut pool.items, count, index);
            count += 1;
        }
        // Tokens never exceed bytes, so a line cut to `budget` bytes stays within budget.
        let mut room = usize::MAX;
        if count == 0 {
            if let (Some(statement), Some(slot)) = (cut_first, pool.items.first_mut()) {
                *slot = Some(statement);
                count = 1;
                room = request.budget.saturating_sub(2) as usize;
            }
        }
        let chosen = pool.items.get_mut(..count).unwrap_or_default();
        crate::small::sort_by_key(chosen, |s| s.map_or(u32::MAX, |s| s.order));
        for statement in chosen.iter().flatten() {
            Self::write_line(out, Self::render(request, statement), room);
        }
        while request.counter.count(out.as_str()) > request.budget && !out.is_empty() {
            let keep = crate::small::last_byte(out.as_str(), b'\n').unwrap_or(out.len() / 2);
            out.truncate(keep);
        }
        if out.is_empty() {
            return Err(SummarizeError::Rejected);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_what_agents_need_back() {
        let high = [
            "Decided to use PostgreSQL 16 for the archive.",
            "error[E0277]: the trait bound is not satisfied in src/main.rs",
            "Run `cargo test -p ctxwin-core` before pushing.",
            "The timeout is 4517 ms.",
        ];
        let low =
            ["Sure, let me check.", "Okay!", "Thanks for the patience, this is taking a while"];
        for text in high {
            assert!(score(text, Role::Assistant, Part::Content) >= 5, "{text}");
        }
        for text in low {
            assert_eq!(score(text, Role::Assistant, Part::Content), 0, "{text}");
        }
    }

    #[test]
    fn statements_split_lines_and_sentences() {
        let text = "One. Two! Three\nFour? Five";
        let mut found = Vec::new();
        statements(text, |s, e| found.push(text[s..e].trim().to_string()));
        assert_eq!(found, ["One.", "Two!", "Three", "Four?", "Five"]);
    }
}
