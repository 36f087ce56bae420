//! `ctxwin._native.trim`: LangChain's `trim_messages` keywords over the core's stateless
//! [`trim`](ctxwin_core::trim): whole units (a call and its results) or nothing, newest first
//! (`strategy="last"`) or oldest first (`"first"`).
//!
//! `"last"` reads the messages from the end in chunks that grow fourfold (64, 256, ...) until
//! the core's walk stops inside one, so a trim of a 10,000-message history to a few thousand
//! tokens reads and counts a few hundred messages. `"first"` grows a prefix of whole units
//! (doubling, then bisecting) while it fits. The budget is the core's with no reply reserve,
//! no level quotas, no locks: a unit that does not fit ends the walk, as a message that does
//! not fit ends LangChain's.
//!
//! With a built-in counter the messages are read with the GIL held and the walk runs with it
//! released; a Python counter (called per message, as LangChain calls a per-message
//! `token_counter`) keeps it.

use std::cell::RefCell;
use std::collections::HashMap;

use ctxwin_core::counter::TokenCounter;
use ctxwin_core::estimator::Estimator;
use ctxwin_core::trim::{Conversation, TrimError, TrimmedContent, TrimmedItem, trim_from};
use ctxwin_core::{Config, Error as CoreError, Level, Message, Role, ToolCall};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{Part, Reader, Shape};
use crate::errors::{self, Kind};
use crate::tokenizer::Tokenizer;
use ctxwin_std::session::Counter;

/// The first chunk read from the end; each next one is four times larger.
const FIRST_CHUNK: usize = 64;

/// Trims `messages` (see `ctxwin.trim`, which calls this). Returns the kept messages as
/// entries `(index, None, None)` (message `index` as given), `(index, blocks, replaced)` (the
/// parts of message `index` listed in `blocks`, -1 standing for its non-tool-result content,
/// with `replaced` mapping a block to its reduced text) and `(-1, call_id, None)` (the
/// synthetic result of a call left unanswered), plus the tokens of the kept payload.
#[pyfunction]
#[pyo3(signature = (
    messages, shape, max_tokens, *, tokenizer=None, message_counter=None,
    counter_takes_message=false, strategy="last", include_system=false, allow_partial=false,
    end=None,
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn trim<'py>(
    py: Python<'py>,
    messages: Bound<'py, PyList>,
    shape: &str,
    max_tokens: u32,
    tokenizer: Option<PyRef<'py, Tokenizer>>,
    message_counter: Option<Bound<'py, PyAny>>,
    counter_takes_message: bool,
    strategy: &str,
    include_system: bool,
    allow_partial: bool,
    end: Option<usize>,
) -> PyResult<(Vec<Py<PyAny>>, u32)> {
    let reader = Reader::new(messages, Shape::parse(shape)?);
    let end = end.unwrap_or(reader.len()).min(reader.len());
    let first = match strategy {
        "last" => false,
        "first" => true,
        other => {
            return Err(errors::error(
                Kind::Usage,
                format!("unknown strategy {other:?}: use \"last\" or \"first\""),
            ));
        }
    };
    let options = Options {
        config: config(max_tokens, message_counter.is_some()),
        include_system: include_system && !first,
        allow_partial,
        end,
    };
    if let Err(error) = options.config.validate() {
        return Err(errors::error(Kind::Usage, format!("max_tokens={max_tokens}: {error}")));
    }
    let (parts, outcome) = match message_counter {
        Some(function) => {
            let counter = MessageCounter::new(function, counter_takes_message, &reader);
            let result = if first {
                trim_first(&reader, &options, &counter)
            } else {
                trim_last(&reader, &options, &counter)
            };
            if let Some(error) = counter.error.borrow_mut().take() {
                return Err(error);
            }
            result?
        }
        None => {
            let builtin = match &tokenizer {
                Some(tokenizer) => tokenizer.counter().clone(),
                None => Counter::default(),
            };
            if first {
                trim_first(&reader, &options, &builtin)?
            } else {
                trim_last(&reader, &options, &builtin)?
            }
        }
    };
    match outcome {
        Walk::Done { kept, tokens } => Ok((entries(py, &parts, kept)?, tokens)),
        Walk::Grow => Err(errors::error(Kind::Internal, "trim: the walk asked for more messages")),
        Walk::Failed(error, index) => {
            Err(errors::trim(error, |_| index.map_or(0, |i| parts.get(i).map_or(0, |p| p.source))))
        }
    }
}

/// The core configuration of a trim to `max_tokens`: all of it for the payload, no locks, no
/// quotas, tool results never reduced for their own size. A per-message counter counts the
/// framing itself.
fn config(max_tokens: u32, per_message: bool) -> Config {
    let framing = if per_message { 0 } else { 1 };
    Config {
        context_window: max_tokens,
        reserved_for_reply: 0,
        permanent_budget: 0,
        session_budget: 0,
        working_budget: max_tokens,
        trigger_percent: 100,
        locked_tail: 0,
        lock_newest_user: false,
        max_messages: 0,
        observation_limit: u32::MAX,
        message_overhead: Config::DEFAULT.message_overhead * framing,
        request_overhead: Config::DEFAULT.request_overhead * framing,
        tool_call_overhead: Config::DEFAULT.tool_call_overhead * framing,
        ..Config::DEFAULT
    }
}

struct Options {
    config: Config,
    include_system: bool,
    allow_partial: bool,
    /// Messages from this index on are left out (`end_on`).
    end: usize,
}

/// One kept message of a walk.
enum Kept {
    /// Part `index` of the parts read (pinned first), with its reduced text if it was reduced.
    Part { index: usize, reduced: Option<String> },
    /// The synthetic result of this call.
    Aborted(String),
}

/// What one walk over the messages read so far found.
enum Walk {
    Done {
        kept: Vec<Kept>,
        tokens: u32,
    },
    /// The walk reached the oldest message read: read more.
    Grow,
    /// A refusal, at this part (of the parts read) when one is to blame.
    Failed(TrimError, Option<usize>),
}

/// The messages the core walks: the pinned parts, then `tail`.
struct View<'a> {
    pinned: &'a [Part],
    tail: &'a [Part],
    pinned_calls: &'a [Vec<ToolCall<'a>>],
    tail_calls: &'a [Vec<ToolCall<'a>>],
}

impl View<'_> {
    fn part(&self, index: usize) -> Option<(&Part, &[ToolCall<'_>])> {
        let pinned = self.pinned.len();
        if index < pinned {
            Some((self.pinned.get(index)?, self.pinned_calls.get(index)?))
        } else {
            Some((self.tail.get(index - pinned)?, self.tail_calls.get(index - pinned)?))
        }
    }

    /// The first unit head after `index` (where the unit holding `index` ends).
    fn next_head(&self, index: usize) -> usize {
        let mut next = index + 1;
        while self.part(next).is_some_and(|(part, _)| part.message.role == Role::Tool) {
            next += 1;
        }
        next
    }
}

impl Conversation for View<'_> {
    fn len(&self) -> usize {
        self.pinned.len() + self.tail.len()
    }

    fn message(&self, index: usize) -> Option<Message<'_>> {
        let (part, calls) = self.part(index)?;
        let chat = &part.message;
        let message = match (chat.role, &chat.tool_call_id) {
            (Role::Tool, Some(id)) => Message::tool_result(id, part.content()),
            _ => Message::new(chat.role, part.content()).with_tool_calls(calls),
        };
        // Only the pinned system message is pinned; any other is history, as in LangChain.
        Some(if index >= self.pinned.len() { message.in_level(Level::Working) } else { message })
    }
}

fn core_calls(parts: &[Part]) -> Vec<Vec<ToolCall<'_>>> {
    parts.iter().map(|p| p.message.tool_calls.iter().map(|c| c.as_core()).collect()).collect()
}

/// Walks `pinned` + `tail` (`complete`: `tail` starts at the first message after the pinned
/// ones). A unit that does not fit (over the budget on its own, or reduced to fit when
/// partial messages are not allowed) ends the walk: what is newer is the answer.
fn walk<K: TokenCounter>(
    pinned: &[Part],
    tail: &[Part],
    complete: bool,
    options: &Options,
    counter: &K,
) -> Walk {
    let (pinned_calls, tail_calls) = (core_calls(pinned), core_calls(tail));
    let p = pinned.len();
    let mut cut = 0;
    let mut complete = complete;
    loop {
        let view = View {
            pinned,
            tail: tail.get(cut..).unwrap_or_default(),
            pinned_calls: &pinned_calls,
            tail_calls: tail_calls.get(cut..).unwrap_or_default(),
        };
        let read_index = |index: usize| if index < p { index } else { index + cut };
        match trim_from(&view, &[], &options.config, counter) {
            Ok(trimmed) => {
                if !complete && trimmed.suffix().start <= p {
                    return Walk::Grow;
                }
                let mut kept = Vec::with_capacity(trimmed.message_count());
                let mut reduced_at = None;
                for item in trimmed.items() {
                    match item {
                        TrimmedItem::Message { index, content, .. } => {
                            let reduced = match content {
                                TrimmedContent::Plain(_) => None,
                                reduced @ TrimmedContent::Reduced(_) => {
                                    reduced_at.get_or_insert(index);
                                    Some(reduced.to_string())
                                }
                            };
                            kept.push(Kept::Part { index: read_index(index), reduced });
                        }
                        TrimmedItem::Aborted { call_id } => {
                            kept.push(Kept::Aborted(call_id.to_owned()));
                        }
                    }
                }
                match reduced_at {
                    Some(index) if !options.allow_partial && index >= p => {
                        cut += view.next_head(index) - p;
                        complete = true;
                    }
                    _ => return Walk::Done { kept, tokens: trimmed.tokens() },
                }
            }
            Err(TrimError::Refused {
                error: CoreError::MessageTooLarge { .. },
                index: Some(index),
            }) if index >= p => {
                cut += view.next_head(index) - p;
                complete = true;
            }
            Err(TrimError::Refused { error: CoreError::OrphanToolResult, index: Some(index) })
                if !complete && index == p =>
            {
                return Walk::Grow;
            }
            Err(error) => {
                let at = match error {
                    TrimError::Refused { index, .. } => index.map(read_index),
                    TrimError::Unsupported(_) => None,
                };
                return Walk::Failed(error, at);
            }
        }
    }
}

/// A counter the walks can use: a built-in one (the walk runs with the GIL released) or a
/// Python function (it needs the GIL).
trait Counting: TokenCounter {
    /// Learns where the texts of `parts` are.
    fn see<'p>(&self, parts: impl Iterator<Item = &'p Part>);
    /// Runs [`walk`].
    fn walk(&self, pinned: &[Part], tail: &[Part], complete: bool, options: &Options) -> Walk;
}

impl Counting for Counter {
    fn see<'p>(&self, _parts: impl Iterator<Item = &'p Part>) {}

    fn walk(&self, pinned: &[Part], tail: &[Part], complete: bool, options: &Options) -> Walk {
        Python::attach(|py| py.detach(|| walk(pinned, tail, complete, options, self)))
    }
}

/// `strategy="last"`: chunks from the end until the walk stops inside one.
fn trim_last<K: Counting>(
    reader: &Reader<'_>,
    options: &Options,
    counter: &K,
) -> PyResult<(Vec<Part>, Walk)> {
    let end = options.end;
    let mut pinned = Vec::new();
    let mut from = 0;
    if options.include_system && end > 0 && reader.is_system(0)? {
        reader.read(0, &mut pinned)?;
        from = 1;
    }
    let mut tail: Vec<Part> = Vec::new();
    let mut read_from = end.max(from);
    let mut chunk = FIRST_CHUNK;
    loop {
        let start = read_from.saturating_sub(chunk).max(from);
        let mut older = Vec::new();
        for index in start..read_from {
            reader.read(index, &mut older)?;
        }
        tail.splice(0..0, older);
        read_from = start;
        counter.see(pinned.iter().chain(&tail));
        let complete = read_from == from;
        let outcome = counter.walk(&pinned, &tail, complete, options);
        if !matches!(outcome, Walk::Grow) || complete {
            let mut parts = pinned;
            parts.append(&mut tail);
            return Ok((parts, outcome));
        }
        chunk *= 4;
    }
}

/// `strategy="first"`: the longest prefix of whole units that fits, by doubling then
/// bisecting (each try walks the prefix).
fn trim_first<K: Counting>(
    reader: &Reader<'_>,
    options: &Options,
    counter: &K,
) -> PyResult<(Vec<Part>, Walk)> {
    let end = options.end;
    let mut parts: Vec<Part> = Vec::new();
    let mut read = 0;
    // Reads until part `n` exists (or everything is read), so that it tells whether a prefix
    // of `n` parts ends at a unit boundary.
    let mut ensure = |parts: &mut Vec<Part>, n: usize| -> PyResult<()> {
        while parts.len() <= n && read < end {
            reader.read(read, parts)?;
            read += 1;
        }
        Ok(())
    };
    let boundary =
        |parts: &[Part], n: usize| parts.get(n).is_none_or(|part| part.message.role != Role::Tool);
    let try_prefix = |parts: &[Part], n: usize| -> Walk {
        let prefix = parts.get(..n).unwrap_or_default();
        counter.see(prefix.iter());
        match counter.walk(&[], prefix, true, options) {
            Walk::Done { kept, tokens }
                if kept.iter().filter(|k| matches!(k, Kept::Part { .. })).count() == n =>
            {
                Walk::Done { kept, tokens }
            }
            Walk::Done { .. }
            | Walk::Failed(
                TrimError::Refused { error: CoreError::ToolCallsPending { .. }, .. },
                _,
            ) => Walk::Grow,
            other => other,
        }
    };
    let mut best = (0, Walk::Done { kept: Vec::new(), tokens: 0 });
    let mut too_long = None;
    let mut n = 1;
    loop {
        ensure(&mut parts, n)?;
        let mut cut = n.min(parts.len());
        while !boundary(&parts, cut) {
            cut += 1;
            ensure(&mut parts, cut)?;
        }
        if cut <= best.0 {
            break;
        }
        match try_prefix(&parts, cut) {
            Walk::Done { kept, tokens } => best = (cut, Walk::Done { kept, tokens }),
            Walk::Grow => {
                too_long = Some(cut);
                break;
            }
            failed => return Ok((parts, failed)),
        }
        if cut >= parts.len() {
            break;
        }
        n = cut * 2;
    }
    if let Some(mut high) = too_long {
        // Bisects between the longest prefix that fits and the shortest that does not.
        loop {
            let candidates: Vec<usize> =
                (best.0 + 1..high).filter(|&n| boundary(&parts, n)).collect();
            let Some(&mid) = candidates.get(candidates.len() / 2) else { break };
            match try_prefix(&parts, mid) {
                Walk::Done { kept, tokens } => best = (mid, Walk::Done { kept, tokens }),
                Walk::Grow => high = mid,
                failed => return Ok((parts, failed)),
            }
        }
    }
    Ok((parts, best.1))
}

/// The kept messages as entries for `ctxwin.trim` (see [`trim`]).
fn entries(py: Python<'_>, parts: &[Part], kept: Vec<Kept>) -> PyResult<Vec<Py<PyAny>>> {
    let mut out: Vec<Py<PyAny>> = Vec::with_capacity(kept.len());
    let mut group: Vec<(usize, Option<String>)> = Vec::new();
    let flush = |group: &mut Vec<(usize, Option<String>)>, out: &mut Vec<Py<PyAny>>| {
        let Some(&(first, _)) = group.first() else { return Ok::<(), PyErr>(()) };
        let Some(part) = parts.get(first) else { return Ok(()) };
        let source = part.source;
        let whole = parts.iter().filter(|p| p.source == source).count();
        if group.len() == whole && group.iter().all(|(_, reduced)| reduced.is_none()) {
            out.push((source, py.None(), py.None()).into_pyobject(py)?.into_any().unbind());
        } else {
            let blocks = PyList::empty(py);
            let replaced = PyDict::new(py);
            for (index, reduced) in group.iter() {
                let code = parts.get(*index).map_or(-1, |p| p.block.code());
                blocks.append(code)?;
                if let Some(text) = reduced {
                    replaced.set_item(code, text)?;
                }
            }
            out.push((source, blocks, replaced).into_pyobject(py)?.into_any().unbind());
        }
        group.clear();
        Ok(())
    };
    for item in kept {
        match item {
            Kept::Part { index, reduced } => {
                let source = parts.get(index).map(|p| p.source);
                let same = group
                    .first()
                    .and_then(|(first, _)| parts.get(*first))
                    .is_some_and(|p| Some(p.source) == source);
                if !same {
                    flush(&mut group, &mut out)?;
                }
                group.push((index, reduced));
            }
            Kept::Aborted(call_id) => {
                flush(&mut group, &mut out)?;
                out.push((-1, call_id, py.None()).into_pyobject(py)?.into_any().unbind());
            }
        }
    }
    flush(&mut group, &mut out)?;
    Ok(out)
}

/// A Python `token_counter` called once per message, as LangChain calls one: with the
/// message (`takes_message`: a counter whose first parameter is annotated `BaseMessage`) or
/// with a list of it. The core asks for the count of a message's content; the address of the
/// part's text says which message it is. Text ctxwin makes itself (a reduced tool output, the
/// result of an unanswered call) is counted with the built-in estimator.
struct MessageCounter<'r, 'py> {
    function: Bound<'py, PyAny>,
    takes_message: bool,
    reader: &'r Reader<'py>,
    /// Text address → (length, message index, whether the part is its message's first).
    parts: RefCell<HashMap<usize, (usize, usize, bool)>>,
    /// Message index → its count.
    counts: RefCell<HashMap<usize, u32>>,
    /// The first error the function raised (the walk then stops; `trim` raises it).
    error: RefCell<Option<PyErr>>,
    fallback: Estimator,
}

impl<'r, 'py> MessageCounter<'r, 'py> {
    fn new(function: Bound<'py, PyAny>, takes_message: bool, reader: &'r Reader<'py>) -> Self {
        MessageCounter {
            function,
            takes_message,
            reader,
            parts: RefCell::new(HashMap::new()),
            counts: RefCell::new(HashMap::new()),
            error: RefCell::new(None),
            fallback: Estimator::new(),
        }
    }

    fn call(&self, index: usize) -> PyResult<u32> {
        let message = self.reader.message(index)?;
        let value = if self.takes_message {
            self.function.call1((message,))?
        } else {
            self.function.call1((PyList::new(self.reader.py(), [message])?,))?
        };
        let count = match value.extract::<i64>() {
            Ok(count) => count,
            Err(_) => value.extract::<f64>()?.ceil() as i64,
        };
        u32::try_from(count).map_err(|_| {
            errors::error(
                Kind::InvalidInput,
                format!(
                    "token_counter returned {count} for message {index}; it must count 0 or more"
                ),
            )
        })
    }
}

impl TokenCounter for MessageCounter<'_, '_> {
    fn count(&self, text: &str) -> u32 {
        let known = self.parts.borrow().get(&(text.as_ptr() as usize)).copied();
        match known {
            Some((len, index, first)) if len == text.len() => {
                if !first {
                    return 0;
                }
                if let Some(count) = self.counts.borrow().get(&index) {
                    return *count;
                }
                match self.call(index) {
                    Ok(count) => {
                        self.counts.borrow_mut().insert(index, count);
                        count
                    }
                    Err(error) => {
                        self.error.borrow_mut().get_or_insert(error);
                        u32::MAX
                    }
                }
            }
            _ => self.fallback.count(text),
        }
    }

    fn count_tool_call(&self, _call: &ToolCall<'_>) -> u32 {
        0
    }

    fn count_call_id(&self, _id: &str) -> u32 {
        0
    }
}

impl Counting for MessageCounter<'_, '_> {
    fn see<'p>(&self, parts: impl Iterator<Item = &'p Part>) {
        let mut known = self.parts.borrow_mut();
        let mut previous = None;
        for part in parts {
            let first = previous != Some(part.source);
            previous = Some(part.source);
            let text = part.content();
            known.insert(text.as_ptr() as usize, (text.len(), part.source, first));
        }
    }

    fn walk(&self, pinned: &[Part], tail: &[Part], complete: bool, options: &Options) -> Walk {
        walk(pinned, tail, complete, options, self)
    }
}
