//! The extractive summarizer: keeps the statements summaries usually lose.
//!
//! Every message is cut into statements (lines, then sentences; tool calls become `ran name
//! arguments`). Each statement is scored for what an agent needs back later: decisions, errors,
//! facts about people, secrets and settings, file paths, commands, identifiers, numbers and
//! names score high; acknowledgements and chatter score nothing; tool output, which the agent
//! can fetch again, scores half. The best statements are written in their original order, one
//! per line, until the token budget is spent.
//!
//! Deterministic, no model, no allocation, and no limit on candidates: a first pass tallies
//! the cost of the statements at each score, which gives the lowest score that still fits the
//! budget; a second pass writes every statement above it, and the newest that fit at it.

use super::{Detail, SummarizeError, Summarizer, SummaryRequest, TextBuffer};
use crate::counter::TokenCounter;
use crate::role::Role;
use crate::terms::{is_hyphenated_word, is_stop_word, is_term, tokens};

/// Longest statement kept, in bytes; longer ones are cut.
const MAX_STATEMENT: usize = 240;
/// Scores are tallied up to this; higher ones count as this.
const TOP_SCORE: usize = 47;
/// Least score of a statement that says something specific (a term, a name, a decision, an
/// error, a command, a call): what a one-line summary needs, else there is nothing to keep.
const SPECIFIC: u16 = 5;

/// Cues of a statement that records a decision: extractive summaries score by them, task
/// summaries quote the statements that hold one.
pub(super) const DECISION_CUES: [&str; 12] = [
    "decided",
    "decision",
    "we will",
    "we'll",
    "chose",
    "agreed",
    "going with",
    "instead",
    "switch to",
    "settled",
    "from now on",
    "will use",
];
/// Cues of a rule or preference the conversation sets: scored as decisions are.
const RULE_CUES: [&str; 6] = ["go with", "must ", "always ", "never ", "prefer", "from here on"];
/// Facts that are stated once and asked for later: who owns what, secrets, settings.
const FACT_CUES: [&str; 14] = [
    "owns ",
    "owner",
    "responsible for",
    "in charge of",
    "maintainer",
    "password",
    "secret",
    "api key",
    "deploy key",
    "token is",
    "credential",
    "set to",
    "for the record",
    "remember",
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

/// Words of small talk: a short statement made only of these, stop words and names
/// ("Thanks, Mel!", "Haha, totally.", "Talk soon!") says nothing a summary needs.
#[rustfmt::skip]
const PLEASANTRY: &[&str] = &[
    "amazing", "awesome", "aww", "best", "bye", "care", "catch", "chat", "cheers", "congrats",
    "congratulations", "cool", "day", "doing", "exactly", "fair", "feeling", "fun", "glad",
    "going", "good", "great", "guess", "ha", "haha", "happy", "hey", "hmm", "honestly", "know",
    "later", "lol", "long", "love", "lovely", "minute", "morning", "new", "nice", "night", "oh",
    "really", "right", "same", "sounds", "soon", "sweet", "take", "talk", "thank", "thanks",
    "that's", "time", "totally", "true", "way", "week", "wow", "yeah", "yep", "you're",
];

/// Whether `text` is only small talk: at most six words, each a pleasantry, a stop word or a
/// capitalized name, and no term.
fn is_pleasantry(text: &str) -> bool {
    let mut words = 0;
    for token in tokens(text) {
        words += 1;
        let word = token.trim_end_matches(['!', '?', ',', '.']);
        let small = word.len() <= 1
            || is_stop_word(word)
            || PLEASANTRY.iter().any(|p| p.eq_ignore_ascii_case(word))
            || (word.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
                && word.bytes().skip(1).all(|b| b.is_ascii_lowercase()));
        if words > 6 || is_term(token) || !small {
            return false;
        }
    }
    words > 0
}

/// Words a session or date header is made of ("Session 3 · 8 May 2023, 1:56 pm").
#[rustfmt::skip]
const HEADER_WORDS: &[&str] = &[
    "am", "apr", "april", "aug", "august", "chapter", "date", "day", "dec", "december", "feb",
    "february", "fri", "friday", "jan", "january", "jul", "july", "jun", "june", "mar", "march",
    "may", "mon", "monday", "nov", "november", "oct", "october", "on", "part", "pm", "sat",
    "saturday", "sep", "sept", "september", "session", "sun", "sunday", "thu", "thursday", "time",
    "tue", "tuesday", "wed", "wednesday", "week",
];

/// Whether `text` is a header with no content of its own: a Markdown heading, a short
/// bracketed or colon-ended label, or a session/date line ("Session 3, 8 May 2023").
fn is_header(text: &str) -> bool {
    let text = text.trim();
    let words = tokens(text).count();
    if words == 0 {
        return false;
    }
    let heading =
        text.starts_with('#') && text.trim_start_matches('#').starts_with(' ') && words <= 8;
    let label =
        ((text.starts_with('[') && text.ends_with(']')) || text.ends_with(':')) && words <= 8;
    let dated = tokens(text).all(|token| {
        !token.chars().any(char::is_alphanumeric)
            || token.bytes().all(|b| b.is_ascii_digit() || matches!(b, b':' | b'.' | b'/' | b'-'))
            || HEADER_WORDS.iter().any(|w| w.eq_ignore_ascii_case(token))
    }) && tokens(text).any(|t| HEADER_WORDS.iter().any(|w| w.eq_ignore_ascii_case(t)));
    heading || label || dated
}

/// Where a statement's text lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The previous summary.
    Previous,
    /// A message's content.
    Content,
    /// A message's tool call.
    Call,
}

/// A statement as written: the id of the message it comes from (0 when the text already
/// names it, as an earlier summary's lines do), a prefix saying whose it is, a tool name,
/// and the text.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    id: u64,
    prefix: &'static str,
    name: &'a str,
    piece: &'a str,
}

/// A summary line's source tag, `#ID ` (the message id, for drill-down), as text on the stack.
struct IdTag {
    bytes: [u8; 24],
    len: usize,
}

impl IdTag {
    /// `#ID `, or nothing for id 0.
    fn new(id: u64) -> Self {
        let mut tag = IdTag { bytes: [0; 24], len: 0 };
        if id == 0 {
            return tag;
        }
        let mut digits = [0u8; 20];
        let mut count = 0usize;
        let mut rest = id;
        while rest > 0 {
            if let Some(slot) = digits.get_mut(count) {
                *slot = b'0' + (rest % 10) as u8;
            }
            count += 1;
            rest /= 10;
        }
        let mut push = |byte: u8| {
            if let Some(slot) = tag.bytes.get_mut(tag.len) {
                *slot = byte;
                tag.len += 1;
            }
        };
        push(b'#');
        for at in (0..count).rev() {
            push(digits.get(at).copied().unwrap_or(b'0'));
        }
        push(b' ');
        tag
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }
}

/// The message id a summary line starts with (`#42 user: …` gives 42) and the rest of it.
///
/// Summary lines written by [`Extractive`] name their source message this way, so a reader
/// (or the archive's drill-down) finds the original without scanning the summary's range.
///
/// ```
/// use ctxwin_core::summarize::line_source;
/// assert_eq!(line_source("#42 user: I moved to Lisbon."), Some((42, "user: I moved to Lisbon.")));
/// assert_eq!(line_source("no tag here"), None);
/// ```
pub fn line_source(line: &str) -> Option<(u64, &str)> {
    let rest = line.trim_start().strip_prefix('#')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (number, rest) = (rest.get(..digits)?, rest.get(digits..)?);
    let rest = rest.strip_prefix(' ')?;
    let id = number.parse().ok().filter(|&id| id > 0)?;
    Some((id, rest))
}

/// How much an agent would miss this statement.
fn score(text: &str, role: Role, part: Part) -> u16 {
    let text = text.trim();
    let mut terms = 0u16;
    let mut term_points = 0u16;
    let mut names = 0u16;
    let mut previous_was_name = false;
    let mut full_names = 0u16;
    for (index, token) in tokens(text).enumerate() {
        let name = index > 0
            && token.len() >= 3
            && token.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
            && token.bytes().skip(1).any(|b| b.is_ascii_lowercase());
        if is_hyphenated_word(token) {
            term_points += 1;
        } else if is_term(token) {
            terms += 1;
            // Paths are what summaries lose most, then identifiers, then bare numbers.
            let extension =
                crate::small::last_byte(token, b'.').and_then(|dot| token.get(dot + 1..));
            let path = token.bytes().any(|b| b == b'/')
                || extension.is_some_and(|ext| ext.bytes().all(|b| b.is_ascii_alphabetic()));
            term_points += if path {
                6
            } else if token.bytes().any(|b| b.is_ascii_alphabetic()) || token.len() >= 3 {
                3
            } else {
                2
            };
        } else if name {
            names += 1;
            full_names += u16::from(previous_was_name);
        }
        previous_was_name = name && !is_term(token);
    }
    let mut score = term_points.min(12) + 2 * names.min(3) + 2 * full_names.min(1);
    let cue = |cues: &[&str]| cues.iter().any(|cue| crate::small::contains_ignore_case(text, cue));
    let error = cue(&ERROR_CUES);
    if cue(&DECISION_CUES) || cue(&RULE_CUES) {
        score += 6;
    }
    if cue(&FACT_CUES) {
        score += 5;
    }
    if error {
        score += 5;
    }
    let first = tokens(text).next().unwrap_or_default();
    if text.bytes().any(|b| b == b'`')
        || text.starts_with("$ ")
        || COMMANDS.iter().any(|c| c.eq_ignore_ascii_case(first))
    {
        score += 5;
    }
    if part == Part::Call {
        score += 2;
    } else if role != Role::Tool && terms + names > 0 {
        // Something said about a specific thing: what summaries lose and agents need back.
        score += 3;
    }
    let filler = FILLER.iter().any(|f| {
        text.len() >= f.len()
            && text.as_bytes().get(..f.len()).is_some_and(|p| p.eq_ignore_ascii_case(f.as_bytes()))
    });
    if (filler && terms == 0) || is_pleasantry(text) || is_header(text) {
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
        // Output the agent can fetch again is worth less than what was concluded from it,
        // unless it reports a failure.
        (Role::Tool, _) if !error => score.div_ceil(3),
        _ => score,
    }
}

/// Whose a line of an earlier summary was, from the prefix [`Extractive`] wrote, so merged
/// summaries score their statements as the originals were scored.
fn origin(line: &str, role: Role, part: Part) -> (Role, Part, &str) {
    if role != Role::System && part != Part::Previous {
        return (role, part, line);
    }
    let line = line.trim_start();
    let line = line_source(line).map_or(line, |(_, rest)| rest);
    if let Some(rest) = line.strip_prefix("tool: ") {
        (Role::Tool, Part::Content, rest)
    } else if let Some(rest) = line.strip_prefix("user: ") {
        (Role::User, Part::Content, rest)
    } else if let Some(rest) = line.strip_prefix("ran ") {
        // `ran name arguments`: calls were scored on their arguments.
        let arguments = rest.split_once(' ').map_or("", |(_, arguments)| arguments);
        (Role::Assistant, Part::Call, arguments)
    } else {
        (role, part, line)
    }
}

/// Statements of `text`: lines, split further at sentence ends; each a byte range.
/// `visit` learns whether the statement starts its line.
fn statements(text: &str, mut visit: impl FnMut(usize, usize, bool)) {
    let mut line_start = 0usize;
    for line in crate::small::split_lines(text) {
        let mut start = 0usize;
        let bytes = line.as_bytes();
        for (at, pair) in bytes.windows(2).enumerate() {
            if matches!(pair, [b'.' | b'!' | b'?', b' ']) {
                visit(line_start + start, line_start + at + 1, start == 0);
                start = at + 2;
            }
        }
        visit(line_start + start, line_start + line.len(), start == 0);
        line_start += line.len();
    }
}

/// One statement met while reading the request.
#[derive(Clone, Copy, Debug)]
struct Candidate<'a> {
    /// Position in reading order.
    order: u32,
    score: u16,
    /// Whether it says something specific, whatever summary it came from.
    specific: bool,
    line: Line<'a>,
}

impl Candidate<'_> {
    fn bucket(&self) -> usize {
        usize::from(self.score).min(TOP_SCORE)
    }
}

/// Calls `visit` with every scored statement of the request, in reading order: the previous
/// summary, then each message's content and tool calls.
fn each_candidate<'a>(request: &SummaryRequest<'a>, mut visit: impl FnMut(Candidate<'a>)) {
    let mut order = 0u32;
    // The source of the earlier summary's current line: its later sentences name it too.
    let mut line_id = 0u64;
    let mut read = |text: &'a str, role: Role, part: Part, name: &'a str, id: u64| {
        statements(text, |start, end, first| {
            let piece = text.get(start..end).unwrap_or_default();
            // An earlier summary (the previous one, or summaries being merged) names its
            // sources in its lines already.
            let id = if part == Part::Previous || role == Role::System {
                match line_source(piece) {
                    // The piece carries its tag.
                    Some((tagged, _)) => {
                        line_id = tagged;
                        0
                    }
                    None if first => {
                        line_id = 0;
                        0
                    }
                    None => line_id,
                }
            } else {
                id
            };
            // A digest of merged summaries and a one-line summary spend their room on facts:
            // no source tags (their ranges still name the messages they stand for). A tag
            // costs a few of a line's 40 tokens, enough to push a second fact out.
            let (id, piece) = if request.detail != Detail::Paragraph {
                (0, line_source(piece).map_or(piece, |(_, rest)| rest))
            } else {
                (id, piece)
            };
            let (scored_role, scored_part, scored) = origin(piece, role, part);
            let own = score(scored, scored_role, scored_part);
            // An earlier summary's lines stand for messages that are gone.
            let score = match scored_part {
                Part::Previous => own,
                _ if part == Part::Previous => own + 3,
                _ => own,
            };
            let specific =
                own.saturating_sub(if scored_part == Part::Previous { 3 } else { 0 }) >= SPECIFIC;
            if score > 0 {
                let line = Extractive::render(piece, role, part, name, id);
                visit(Candidate { order, score, specific, line });
            }
            order = order.wrapping_add(1);
        });
    };
    read(request.previous, Role::System, Part::Previous, "", 0);
    for message in request.messages.clone() {
        read(message.content(), message.role(), Part::Content, "", message.id());
        for call in message.tool_calls() {
            read(call.arguments, message.role(), Part::Call, call.name, message.id());
        }
    }
}

/// What a statement takes: tokens, bytes written (with its newline) and one line.
#[derive(Clone, Copy, Debug, Default)]
struct Size {
    tokens: u32,
    bytes: u32,
    lines: u32,
}

impl Size {
    fn of(counter: &dyn TokenCounter, line: Line<'_>) -> Size {
        let Line { id, prefix, name, piece } = line;
        let bytes = IdTag::new(id).len
            + prefix.len()
            + name.len()
            + usize::from(!name.is_empty())
            + piece.len()
            + 1;
        Size { tokens: Extractive::cost(counter, line), bytes: bytes as u32, lines: 1 }
    }

    fn plus(self, other: Size) -> Size {
        Size {
            tokens: self.tokens.saturating_add(other.tokens),
            bytes: self.bytes.saturating_add(other.bytes),
            lines: self.lines.saturating_add(other.lines),
        }
    }

    /// How far `self` is over `limit`, per measure (zero where it fits).
    fn excess(self, limit: Size) -> Size {
        Size {
            tokens: self.tokens.saturating_sub(limit.tokens),
            bytes: self.bytes.saturating_sub(limit.bytes),
            lines: self.lines.saturating_sub(limit.lines),
        }
    }

    fn is_zero(self) -> bool {
        self.tokens == 0 && self.bytes == 0 && self.lines == 0
    }

    /// `self` less `other`, per measure, stopping at zero.
    fn minus(self, other: Size) -> Size {
        Size {
            tokens: self.tokens.saturating_sub(other.tokens),
            bytes: self.bytes.saturating_sub(other.bytes),
            lines: self.lines.saturating_sub(other.lines),
        }
    }
}

/// Which statements a summary keeps: all scoring above `partial`, and at `partial` the newest
/// ones, after skipping the oldest until the rest fit.
#[derive(Clone, Copy, Debug)]
struct Selection {
    partial: usize,
    skip: Size,
}

impl Selection {
    /// The lowest score whose statements, with all better ones, fit `limit`.
    fn of(tally: &[Size; TOP_SCORE + 1], limit: Size) -> Selection {
        let mut kept = Size::default();
        for bucket in (1..=TOP_SCORE).rev() {
            let next = kept.plus(tally.get(bucket).copied().unwrap_or_default());
            let excess = next.excess(limit);
            if !excess.is_zero() {
                return Selection { partial: bucket, skip: excess };
            }
            kept = next;
        }
        Selection { partial: 0, skip: Size::default() }
    }

    /// Whether `candidate` (taking `size`) is kept; called in reading order.
    fn keeps(&mut self, candidate: &Candidate<'_>, size: Size) -> bool {
        let bucket = candidate.bucket();
        if bucket != self.partial {
            return bucket > self.partial;
        }
        if self.skip.is_zero() {
            return true;
        }
        self.skip = self.skip.minus(size);
        false
    }
}

/// The deterministic summarizer the core ships: no model, no allocation.
///
/// ```
/// use ctxwin_core::{ContextManager, summarize::Detail, summarize::Extractive, Message, summarize::Summarizer, summarize::SummaryRequest, summarize::TextBuffer, TinyCapacities};
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
    /// A statement as written: trimmed, cut to [`MAX_STATEMENT`] bytes, with the prefix that
    /// says whose it is.
    fn render<'a>(piece: &'a str, role: Role, part: Part, name: &'a str, id: u64) -> Line<'a> {
        let piece = piece.trim();
        let piece = piece.strip_prefix("- ").unwrap_or(piece).trim();
        let mut end = piece.len().min(MAX_STATEMENT);
        while !piece.is_char_boundary(end) {
            end -= 1;
        }
        let piece = piece.get(..end).unwrap_or_default();
        let (prefix, name) = match (part, role) {
            (Part::Previous, _) => ("", ""),
            (Part::Call, _) => ("ran ", name),
            (_, Role::User) => ("user: ", ""),
            (_, Role::Tool) => ("tool: ", ""),
            _ => ("", ""),
        };
        Line { id, prefix, name, piece }
    }

    /// Tokens a written line costs (pieces counted apart: never less than the whole).
    fn cost(counter: &dyn TokenCounter, line: Line<'_>) -> u32 {
        counter.count(IdTag::new(line.id).as_str())
            + counter.count(line.prefix)
            + counter.count(line.name)
            + counter.count(line.piece)
            + 2
    }

    /// Whether `out` already has `line` as one of its lines.
    fn has_line(out: &str, line: Line<'_>) -> bool {
        let tag = IdTag::new(line.id);
        let separator = if line.name.is_empty() { "" } else { " " };
        let parts = [tag.as_str(), line.prefix, line.name, separator, line.piece];
        let len: usize = parts.iter().map(|part| part.len()).sum();
        crate::small::split_lines(out).any(|written| {
            let written = written.strip_suffix('\n').unwrap_or(written);
            written.len() == len
                && parts
                    .into_iter()
                    .try_fold(written, |rest, part| rest.strip_prefix(part))
                    .is_some()
        })
    }

    /// Writes one line (newlines inside become spaces), cut to `room` bytes.
    fn write_line(out: &mut TextBuffer<'_>, line: Line<'_>, room: usize, detail: Detail) {
        if !out.is_empty() {
            // A one-line summary keeps its few statements on one line.
            out.push_str(if detail == Detail::Line { " " } else { "\n" });
        }
        let start = out.len();
        let tag = IdTag::new(line.id);
        let separator = if line.name.is_empty() { "" } else { " " };
        for part in [tag.as_str(), line.prefix, line.name, separator, line.piece] {
            for (index, text) in part.split(['\n', '\r']).enumerate() {
                if index > 0 {
                    out.push_str(" ");
                }
                out.push_str(text);
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
        let counter = request.counter;
        // A line is only worth its room when it says something specific.
        let eligible =
            |candidate: &Candidate<'_>| request.detail != Detail::Line || candidate.specific;
        let mut tally = [Size::default(); TOP_SCORE + 1];
        let mut best: Option<(u16, u32)> = None;
        each_candidate(request, |candidate| {
            if !eligible(&candidate) {
                return;
            }
            if let Some(sum) = tally.get_mut(candidate.bucket()) {
                *sum = sum.plus(Size::of(counter, candidate.line));
            }
            // Ties go to the newer statement.
            if best.is_none_or(|(score, _)| candidate.score >= score) {
                best = Some((candidate.score, candidate.order));
            }
        });
        let limit = Size {
            tokens: request.budget,
            // The first line has no newline before it.
            bytes: u32::try_from(out.remaining()).unwrap_or(u32::MAX).saturating_add(1),
            lines: u32::try_from(request.detail.max_segments()).unwrap_or(u32::MAX),
        };
        if best.is_none() {
            return Err(SummarizeError::NothingToKeep);
        }
        let mut selection = Selection::of(&tally, limit);
        each_candidate(request, |candidate| {
            if !eligible(&candidate) {
                return;
            }
            let size = Size::of(counter, candidate.line);
            if selection.keeps(&candidate, size) && !Self::has_line(out.as_str(), candidate.line) {
                Self::write_line(out, candidate.line, usize::MAX, request.detail);
            }
        });
        // Tokens never exceed bytes, so a line cut to `budget` bytes stays within budget.
        if out.is_empty() {
            let room = request.budget.saturating_sub(2) as usize;
            each_candidate(request, |candidate| {
                if best.is_some_and(|(_, order)| order == candidate.order) {
                    Self::write_line(out, candidate.line, room, request.detail);
                }
            });
        }
        let separator = if request.detail == Detail::Line { b' ' } else { b'\n' };
        while counter.count(out.as_str()) > request.budget && !out.is_empty() {
            let keep = crate::small::last_byte(out.as_str(), separator).unwrap_or(out.len() / 2);
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
    fn pleasantries_score_nothing() {
        for text in
            ["Thanks, Mel!", "Haha, totally.", "Talk soon, Caroline!", "Aww, that's so sweet."]
        {
            assert_eq!(score(text, Role::User, Part::Content), 0, "{text}");
        }
        for text in ["Mel moved to Lisbon in May.", "Thanks, the fix is in src/lib.rs"] {
            assert!(score(text, Role::User, Part::Content) > 0, "{text}");
        }
    }

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
    fn tool_output_scores_below_what_was_concluded_from_it() {
        let log = "2026-11-22T10:02:11Z INFO worker-0 processed batch ok in 39ms";
        let fact = "The code for this lives in src/net/retry.rs, so that is where the fix goes.";
        let failure = "error[E0433]: failed to resolve `serde_json` in tests/main.rs";
        let chatter = "That should be straightforward, but let me double-check the edge cases.";
        assert!(score(log, Role::Tool, Part::Content) < SPECIFIC);
        assert!(score(fact, Role::Assistant, Part::Content) >= SPECIFIC);
        assert!(score(failure, Role::Tool, Part::Content) >= SPECIFIC, "failures stay");
        assert!(score(chatter, Role::Assistant, Part::Content) < SPECIFIC);
    }

    #[test]
    fn summary_lines_are_scored_as_their_originals() {
        let line = "tool: 2026-11-22T10:02:11Z INFO worker-0 processed batch ok in 39ms";
        let (role, part, text) = origin(line, Role::System, Part::Content);
        assert_eq!((role, part), (Role::Tool, Part::Content));
        assert_eq!(score(text, role, part), score(&line[6..], Role::Tool, Part::Content));
        let (_, part, text) = origin(r#"ran grep {"q": "item 7"}"#, Role::System, Part::Content);
        assert_eq!((part, text), (Part::Call, r#"{"q": "item 7"}"#), "scored on its arguments");
    }

    fn summarize_texts(
        texts: &[&str],
        detail: Detail,
        budget: u32,
        room: usize,
    ) -> Result<String, SummarizeError> {
        use crate::{ContextManager, DefaultCapacities, Message};
        let mut manager = Box::new(ContextManager::<DefaultCapacities>::new());
        let ids: Vec<u64> =
            texts.iter().map(|t| manager.push(Message::assistant(t)).unwrap()).collect();
        let mut bytes = vec![0u8; room];
        let mut out = TextBuffer::new(&mut bytes);
        let request = SummaryRequest {
            previous: "",
            messages: manager.summary_source(ids[0], *ids.last().unwrap()),
            budget,
            detail,
            counter: manager.counter(),
        };
        Extractive.summarize(&request, &mut out).map(|()| out.as_str().to_string())
    }

    #[test]
    fn a_line_keeps_the_specific_statements_or_declines() {
        let chatter = ["Sure, let me check.", "Okay, that makes sense so far; I will keep going."];
        assert_eq!(
            summarize_texts(&chatter, Detail::Line, 40, 512),
            Err(SummarizeError::NothingToKeep)
        );
        let two = ["Okay. The pool size is 4738. Fine. Ngozi Adeyemi owns billing. Thanks."];
        let line = summarize_texts(&two, Detail::Line, 40, 512).unwrap();
        assert!(line.contains("4738") && line.contains("Ngozi Adeyemi"), "{line}");
        assert!(!line.contains('\n') && !line.contains("Thanks"), "{line}");
    }

    #[test]
    fn a_line_spends_its_room_on_facts_not_source_tags() {
        // Two planted facts in one answer, as the memory-quality bench writes them: a
        // one-line summary (40 tokens) has room for both only without `#ID` tags (its
        // ranges name the source; the importance strategy kept 13 fewer facts of 1,200 with
        // the tags).
        let answer = [
            "Sure, I can help with that. We measured it again: the worker count is 4738. Alright, moving on. For the record, Ngozi Adeyemi owns the billing service from now on. Thanks.",
        ];
        let line = summarize_texts(&answer, Detail::Line, 40, 512).unwrap();
        assert!(line_source(&line).is_none(), "{line}");
        assert!(line.contains("4738") && line.contains("Ngozi Adeyemi"), "{line}");
    }

    #[test]
    fn a_digest_has_no_statement_cap_and_writes_whole_lines_only() {
        let facts: Vec<String> =
            (0..30).map(|i| format!("The value of setting_{i} is {}.", 1000 + i)).collect();
        let texts: Vec<&str> = facts.iter().map(String::as_str).collect();
        let digest = summarize_texts(&texts, Detail::Digest, 2000, 4096).unwrap();
        assert_eq!(digest.lines().count(), 30, "{digest}");
        let paragraph = summarize_texts(&texts, Detail::Paragraph, 2000, 4096).unwrap();
        assert_eq!(paragraph.lines().count(), Detail::Paragraph.max_segments());
        assert!(paragraph.contains("setting_29"), "ties keep the newest: {paragraph}");
        let small = summarize_texts(&texts, Detail::Digest, 2000, 100).unwrap();
        assert!(
            small.lines().all(|l| l.starts_with("The value of setting_") && l.ends_with('.')),
            "{small}"
        );
    }

    #[test]
    fn summary_lines_name_their_source_in_chronological_order() {
        let texts = [
            "Hey Mel! How's your week going?",
            "I moved to Lisbon in March, near the harbor.",
            "Thanks, Caroline!",
            "[Session 2, 8 May 2023]",
            "## Notes",
            "Session 3 · 9 May 2023, 1:56 pm",
            "My sister Ingrid is getting married in June.",
            "Decided: the reunion is on June 14 in Porto.",
        ];
        let summary = summarize_texts(&texts, Detail::Paragraph, 400, 4096).unwrap();
        let sources: Vec<(u64, &str)> = summary.lines().map(|l| line_source(l).unwrap()).collect();
        // Pleasantries and headers with no content are not kept.
        assert_eq!(sources.len(), 3, "{summary}");
        assert!(sources.windows(2).all(|w| w[0].0 < w[1].0), "chronological: {summary}");
        // Each line names the message it quotes (pushed ids start at 1).
        for (id, rest) in &sources {
            let original = texts[*id as usize - 1];
            assert!(original.starts_with(rest.trim_end_matches('.')), "{id}: {rest}");
        }
        for header in ["[Session 2, 8 May 2023]", "## Notes", "Session 3 · 9 May 2023, 1:56 pm"] {
            assert!(is_header(header), "{header}");
        }
        assert!(!is_header("I moved to Lisbon in March.") && !is_header("May 14 works for me."));
    }

    #[test]
    fn a_merged_summary_keeps_the_source_of_each_line() {
        let previous = "#7 user: I moved to Lisbon. The flat is near the harbor.\n#9 Decided: pin tokio to 1.38.";
        let manager = Box::new(crate::ContextManager::<crate::DefaultCapacities>::new());
        let request = SummaryRequest {
            previous,
            messages: crate::summarize::SummarySource::empty(),
            budget: 200,
            detail: Detail::Paragraph,
            counter: manager.counter(),
        };
        let mut bytes = vec![0u8; 1024];
        let mut out = TextBuffer::new(&mut bytes);
        Extractive.summarize(&request, &mut out).unwrap();
        for line in out.as_str().lines() {
            assert!(line_source(line).is_some(), "{line} in {}", out.as_str());
        }
        assert!(out.as_str().contains("#7 The flat is near the harbor"), "{}", out.as_str());
        // A digest drops the tags: its room goes to facts.
        let digest = SummaryRequest { detail: Detail::Digest, ..request };
        let mut bytes = vec![0u8; 1024];
        let mut out = TextBuffer::new(&mut bytes);
        Extractive.summarize(&digest, &mut out).unwrap();
        assert!(out.as_str().lines().all(|l| line_source(l).is_none()), "{}", out.as_str());
    }

    #[test]
    fn statements_split_lines_and_sentences() {
        let text = "One. Two! Three\nFour? Five";
        let mut found = Vec::new();
        statements(text, |s, e, _| found.push(text[s..e].trim().to_string()));
        assert_eq!(found, ["One.", "Two!", "Three", "Four?", "Five"]);
    }
}
