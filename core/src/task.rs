//! Tasks: the unit of an agent's work. A task is the run of messages between
//! [`start_task`](crate::manager::ContextManager::start_task) and
//! [`finish_task`](crate::manager::ContextManager::finish_task) (or the next start); the manager
//! keeps the newest [`MAX_TASKS`] of them as id spans in a fixed table, so a record needs no
//! field of its own: ids only grow, and a span names every message of its task.
//!
//! When a task finishes, one structured summary of it goes to the session level and its units
//! become the first to leave; when the next one starts, they leave with the volatile level in
//! one compaction. Within the open task, a tool call that failed before a later one succeeded
//! (a dead end) leaves before the path that worked.
//!
//! ```
//! use ctxwin_core::{ContextManager, Message, TinyCapacities};
//! let mut manager = ContextManager::<TinyCapacities>::new();
//! manager.start_task("fix the failing parser test", 1)?;
//! manager.push(Message::user("The parser test fails, fix it").at(1))?;
//! manager.push(Message::assistant("Fixed src/parser.rs: the lexer skipped tabs.").at(2))?;
//! let task = manager.finish_task("parser test passes", 3)?;
//! assert_eq!(task.goal(), "fix the failing parser test");
//! assert!(!task.is_open());
//! # Ok::<(), ctxwin_core::Error>(())
//! ```

use crate::small::lines;

/// Task spans a manager keeps (the oldest is forgotten when a new one needs its slot; its
/// summary stays in the session level). A span matters while its units are in the rings, and
/// a new task's compaction lets the previous ones' units go: four cover that, in 512 bytes.
pub const MAX_TASKS: usize = 4;

/// Bytes of a task's goal kept (longer goals are cut at a char boundary).
pub const GOAL_BYTES: usize = 64;

/// One task: its goal, the ids it spans, and how much its summary compressed it.
///
/// ```
/// use ctxwin_core::{ContextManager, TinyCapacities};
/// let mut manager = ContextManager::<TinyCapacities>::new();
/// manager.start_task("add a --json flag", 0)?;
/// let task = manager.current_task().unwrap();
/// assert_eq!((task.number(), task.goal(), task.is_open()), (1, "add a --json flag", true));
/// # Ok::<(), ctxwin_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub(crate) number: u32,
    pub(crate) first_id: u64,
    /// 0 while open.
    pub(crate) last_id: u64,
    pub(crate) started: u64,
    pub(crate) finished: u64,
    pub(crate) source_tokens: u32,
    pub(crate) summary_tokens: u32,
    /// Id of its summary in the session level (0 = none written).
    pub(crate) summary_id: u64,
    /// The manager's `tokens_ingested` counter when it started.
    pub(crate) ingested: u64,
    pub(crate) open: bool,
    pub(crate) goal_len: u8,
    pub(crate) goal: [u8; GOAL_BYTES],
}

impl Task {
    pub(crate) const EMPTY: Task = Task {
        number: 0,
        first_id: 0,
        last_id: 0,
        started: 0,
        finished: 0,
        source_tokens: 0,
        summary_tokens: 0,
        summary_id: 0,
        ingested: 0,
        open: false,
        goal_len: 0,
        goal: [0; GOAL_BYTES],
    };

    /// An open task starting at `first_id`, its goal cut to [`GOAL_BYTES`].
    pub(crate) fn open(number: u32, first_id: u64, started: u64, goal: &str) -> Task {
        let mut task = Task { number, first_id, started, open: true, ..Task::EMPTY };
        task.set_goal(goal.as_bytes());
        task
    }

    /// The same, started when the manager had ingested `ingested` tokens.
    pub(crate) fn ingested_from(mut self, ingested: u64) -> Task {
        self.ingested = ingested;
        self
    }

    /// Takes `goal` cut to [`GOAL_BYTES`] at a char boundary (invalid UTF-8 keeps its valid
    /// prefix).
    pub(crate) fn set_goal(&mut self, goal: &[u8]) {
        let valid = match core::str::from_utf8(goal) {
            Ok(text) => text,
            Err(error) => core::str::from_utf8(goal.get(..error.valid_up_to()).unwrap_or_default())
                .unwrap_or_default(),
        };
        let mut len = valid.len().min(GOAL_BYTES);
        while !valid.is_char_boundary(len) {
            len -= 1;
        }
        let source = valid.as_bytes().get(..len).unwrap_or_default();
        self.goal.iter_mut().zip(source).for_each(|(to, from)| *to = *from);
        self.goal_len = len as u8;
    }

    /// Its number: 1 for the first task of the manager, counting every task started.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The goal it was started with (at most [`GOAL_BYTES`]).
    pub fn goal(&self) -> &str {
        core::str::from_utf8(self.goal.get(..usize::from(self.goal_len)).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Id of its first message (the id the next push got when it started).
    pub fn first_id(&self) -> u64 {
        self.first_id
    }

    /// Id of its last message, once finished (`None` while open, or when it holds none).
    pub fn last_id(&self) -> Option<u64> {
        (!self.open && self.last_id >= self.first_id).then_some(self.last_id)
    }

    /// Whether it is still running.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Caller timestamp it started at.
    pub fn started_at(&self) -> u64 {
        self.started
    }

    /// Caller timestamp it finished at (`None` while open).
    pub fn finished_at(&self) -> Option<u64> {
        (!self.open).then_some(self.finished)
    }

    /// Tokens of its messages the summary stands for (their counts before any reduction),
    /// once finished.
    pub fn source_tokens(&self) -> u32 {
        self.source_tokens
    }

    /// Tokens of its summary (0 when none was written).
    pub fn summary_tokens(&self) -> u32 {
        self.summary_tokens
    }

    /// Id of its summary in the session level (`None` when none was written).
    pub fn summary_id(&self) -> Option<u64> {
        (self.summary_id != 0).then_some(self.summary_id)
    }

    /// How many times smaller its summary is than its messages (`None` without a summary).
    /// Under 2 the summary keeps too much detail.
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, Message, TinyCapacities};
    /// let mut manager = ContextManager::<TinyCapacities>::new();
    /// manager.start_task("explain the build", 0)?;
    /// manager.push(Message::user("Why does cargo build fail on src/net.rs?"))?;
    /// manager.push(Message::assistant("Decided: pin tokio to 1.38 in Cargo.toml; the build error E0277 in src/net.rs came from tokio 1.39. Everything else in the workspace builds cleanly after that change, and the tests pass again."))?;
    /// let task = manager.finish_task("build fixed", 1)?;
    /// assert!(task.compression_ratio().is_some_and(|ratio| ratio > 0.0));
    /// # Ok::<(), ctxwin_core::Error>(())
    /// ```
    pub fn compression_ratio(&self) -> Option<f32> {
        (self.summary_tokens > 0).then(|| self.source_tokens as f32 / self.summary_tokens as f32)
    }

    /// Whether message `id` belongs to it.
    pub fn contains(&self, id: u64) -> bool {
        id >= self.first_id && (self.open || id <= self.last_id)
    }
}

/// Messages of the running task whose relevance to it a caller can supply
/// ([`set_task_relevance`](crate::manager::ContextManager::set_task_relevance)): as many units
/// as the importance strategy scores per eviction.
pub const MAX_RELEVANCES: usize = 32;

/// Thousandths of relevance per step of a stored value (a byte holds 0..=250 steps).
const RELEVANCE_STEP: u16 = 4;

/// Relevance to the running task that the caller supplied (an embedder's similarity of each
/// message to the goal), by message: a fixed table of 161 bytes (ids as offsets from the
/// task's first id, values in steps of 4 thousandths), not kept in snapshots (the caller
/// supplies it again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relevances {
    offsets: [u32; MAX_RELEVANCES],
    steps: [u8; MAX_RELEVANCES],
    len: u8,
}

impl Relevances {
    pub(crate) const EMPTY: Relevances =
        Relevances { offsets: [0; MAX_RELEVANCES], steps: [0; MAX_RELEVANCES], len: 0 };

    /// Replaces the table with the first [`MAX_RELEVANCES`] of `entries` (ids at or after
    /// `first_id`, values in thousandths) that `keep` accepts, each value capped at 1000 and
    /// rounded to 4 thousandths. Returns how many it holds.
    pub(crate) fn replace(
        &mut self,
        entries: &[(u64, u16)],
        first_id: u64,
        keep: impl Fn(u64) -> bool,
    ) -> usize {
        *self = Relevances::EMPTY;
        let offset = |id: u64| u32::try_from(id.checked_sub(first_id)?).ok();
        let kept = entries
            .iter()
            .filter(|(id, _)| keep(*id))
            .filter_map(|&(id, value)| Some((offset(id)?, value)))
            .take(MAX_RELEVANCES);
        for ((offset, value), (to_offset, to_step)) in
            kept.zip(self.offsets.iter_mut().zip(self.steps.iter_mut()))
        {
            *to_offset = offset;
            let steps = (value.min(1000) + RELEVANCE_STEP / 2) / RELEVANCE_STEP;
            *to_step = u8::try_from(steps).unwrap_or(u8::MAX);
            self.len += 1;
        }
        usize::from(self.len)
    }

    /// The relevance supplied for message `id` of the task beginning at `first_id`, in
    /// thousandths.
    pub(crate) fn of(&self, id: u64, first_id: u64) -> Option<u16> {
        let offset = u32::try_from(id.checked_sub(first_id)?).ok()?;
        let len = usize::from(self.len);
        let offsets = self.offsets.get(..len).unwrap_or_default();
        let at = offsets.iter().position(|&known| known == offset)?;
        self.steps.get(at).map(|&steps| u16::from(steps) * RELEVANCE_STEP)
    }
}

/// The manager's task spans, oldest first, in a fixed table, and the relevance to the running
/// task its caller supplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tasks {
    spans: [Task; MAX_TASKS],
    len: u8,
    relevances: Relevances,
}

impl Tasks {
    pub(crate) const EMPTY: Tasks =
        Tasks { spans: [Task::EMPTY; MAX_TASKS], len: 0, relevances: Relevances::EMPTY };

    /// The spans kept, oldest first.
    pub(crate) fn as_slice(&self) -> &[Task] {
        self.spans.get(..usize::from(self.len)).unwrap_or_default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The newest task.
    pub(crate) fn last(&self) -> Option<&Task> {
        self.as_slice().last()
    }

    /// The newest task, mutable.
    pub(crate) fn last_mut(&mut self) -> Option<&mut Task> {
        let len = usize::from(self.len);
        self.spans.get_mut(..len).and_then(|spans| spans.last_mut())
    }

    /// The task still running.
    pub(crate) fn open(&self) -> Option<&Task> {
        self.last().filter(|task| task.open)
    }

    /// Adds `task` as the newest, forgetting the oldest when the table is full (and the
    /// relevances supplied for the task before it).
    pub(crate) fn push(&mut self, task: Task) {
        self.relevances = Relevances::EMPTY;
        if usize::from(self.len) == MAX_TASKS {
            self.spans.rotate_left(1);
            self.len -= 1;
        }
        if let Some(slot) = self.spans.get_mut(usize::from(self.len)) {
            *slot = task;
            self.len += 1;
        }
    }

    /// Whether message `id` belongs to a finished task.
    pub(crate) fn finished_holds(&self, id: u64) -> bool {
        self.as_slice().iter().any(|task| !task.open && task.contains(id))
    }

    /// Forgets every span.
    pub(crate) fn clear(&mut self) {
        *self = Tasks::EMPTY;
    }

    /// The relevances supplied for the running task.
    pub(crate) fn relevances(&self) -> &Relevances {
        &self.relevances
    }

    /// The relevances supplied for the running task, mutable.
    pub(crate) fn relevances_mut(&mut self) -> &mut Relevances {
        &mut self.relevances
    }
}

/// Bytes of a tool result read to tell whether it is an error.
const ERROR_SCAN: usize = 512;

/// Words that mark a tool result as a failure, lower case.
const ERROR_CUES: [&str; 12] = [
    "error",
    "failed",
    "failure",
    "exception",
    "traceback",
    "panicked",
    "fatal",
    "no such file",
    "not found",
    "permission denied",
    "timed out",
    "aborted",
];

/// Whether a tool result reads as a failure: an error cue (`error`, `failed`, `exception`,
/// `traceback`, `not found`, `aborted`…) in its first 512 bytes that is not a count of none
/// (`0 errors`, `no errors`).
///
/// ```
/// use ctxwin_core::task::looks_like_error;
/// assert!(looks_like_error("error[E0433]: failed to resolve: use of undeclared crate"));
/// assert!(looks_like_error("bash: ./run.sh: Permission denied"));
/// assert!(!looks_like_error("test result: ok. 12 passed; 0 failed; 0 errors"));
/// assert!(!looks_like_error("fn main() {}"));
/// ```
pub fn looks_like_error(text: &str) -> bool {
    error_line(text).is_some()
}

/// The first line of `text` holding an error cue that is not a count of none, looking at its
/// first 512 bytes, then at its last 512 (a test runner reports a failure deep in a long log
/// and sums it up at the end). Lines of source code and bare labels (`failures:`) are passed
/// over.
fn error_line(text: &str) -> Option<&str> {
    let mut end = text.len().min(ERROR_SCAN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut start = text.len().saturating_sub(ERROR_SCAN).max(end);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let head = text.get(..end).unwrap_or_default();
    let tail = text.get(start..).unwrap_or_default();
    lines(head)
        .chain(lines(tail))
        .filter(|line| !is_code(line) && !is_label(line))
        .find(|line| ERROR_CUES.iter().any(|cue| has_real_cue(line, cue)))
}

/// Whether a line reads as source code rather than a report: it ends a statement or opens or
/// closes a block (`;`, `{`, `}`), as a listing or a grep match does
/// (`fn parse() -> Result<(), Error> {`).
fn is_code(line: &str) -> bool {
    line.trim_end().ends_with([';', '{', '}'])
}

/// Whether a line is a bare label of at most two words ending with a colon (`failures:`): a
/// heading over what it names, which says nothing of its own.
fn is_label(line: &str) -> bool {
    let line = line.trim();
    line.ends_with(':') && line.split_whitespace().count() <= 2
}

/// Whether `cue` occurs in `line` (ASCII case-insensitive) as a word of its own (`error:`,
/// `error[E0425]`, `3 errors`; not `ApiError`, `crate::error::Kind` or `on_error`) other than
/// as "0 …" or "no …".
fn has_real_cue(line: &str, cue: &str) -> bool {
    let bytes = line.as_bytes();
    let needle = cue.as_bytes();
    if needle.is_empty() || bytes.len() < needle.len() {
        return false;
    }
    let joins = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    (0..=bytes.len() - needle.len()).any(|at| {
        let hit = bytes
            .get(at..at + needle.len())
            .is_some_and(|window| window.eq_ignore_ascii_case(needle));
        let before = at.checked_sub(1).and_then(|i| bytes.get(i)).copied();
        let mut end = at + needle.len();
        if bytes.get(end).is_some_and(|b| b.eq_ignore_ascii_case(&b's')) {
            end += 1;
        }
        let after = bytes.get(end).copied();
        let path = before == Some(b':') || bytes.get(end..end + 2) == Some(b"::");
        let word = !before.is_some_and(joins) && !after.is_some_and(joins) && !path;
        hit && word && !counts_none(bytes.get(..at).unwrap_or_default())
    })
}

/// Whether the bytes before a cue end with "0 " or "no " (a count of none).
fn counts_none(before: &[u8]) -> bool {
    let trimmed = before.strip_suffix(b" ").unwrap_or(before);
    let word_start = trimmed.iter().rposition(|b| !b.is_ascii_alphanumeric()).map_or(0, |i| i + 1);
    let word = trimmed.get(word_start..).unwrap_or_default();
    word == b"0" || word.eq_ignore_ascii_case(b"no")
}

/// The signature of a tool error: a hash of its first error line with what changes between
/// two occurrences of the same error stripped (numbers, paths, hex values, quoted names), so
/// the same failure in another file or at another line matches. `None` when the text does not
/// read as an error ([`looks_like_error`]).
///
/// ```
/// use ctxwin_core::task::error_signature;
/// let first = error_signature("error: could not open `/tmp/build-1234/out.o`: No such file (os error 2)");
/// let again = error_signature("error: could not open `/var/tmp/x/y.o`: No such file (os error 2)");
/// assert!(first.is_some());
/// assert_eq!(first, again);
/// let other = error_signature("error: linker `cc` not found");
/// assert_ne!(first, other);
/// assert_eq!(error_signature("all 12 tests passed"), None);
/// ```
pub fn error_signature(text: &str) -> Option<u32> {
    let line = error_line(text)?;
    let mut hash = 0x811c_9dc5u32;
    let mut words = 0usize;
    for word in line.split(|c: char| c.is_whitespace() || c == '`' || c == '\'' || c == '"') {
        if word.is_empty() || is_variable(word) {
            continue;
        }
        for byte in word.bytes().filter(|b| !b.is_ascii_digit()) {
            hash = (hash ^ u32::from(byte.to_ascii_lowercase())).wrapping_mul(0x0100_0193);
        }
        hash = (hash ^ u32::from(b' ')).wrapping_mul(0x0100_0193);
        words += 1;
    }
    (words > 0).then_some(hash.max(1))
}

/// Whether a word of an error line names something that differs between occurrences: a path,
/// a hex value, a number.
fn is_variable(word: &str) -> bool {
    let bytes = word.as_bytes();
    let path = bytes.contains(&b'/') || bytes.contains(&b'\\');
    let hex_prefix = word.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("0x"));
    let digits = bytes.iter().filter(|b| b.is_ascii_digit()).count();
    let long_hex = bytes.len() >= 7 && digits > 0 && bytes.iter().all(u8::is_ascii_hexdigit);
    let number = digits > 0 && bytes.iter().all(|b| !b.is_ascii_alphabetic());
    path || hex_prefix || long_hex || number
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_forgets_the_oldest_span() {
        let mut tasks = Tasks::EMPTY;
        for number in 1..=(MAX_TASKS as u32 + 2) {
            tasks.push(Task::open(number, u64::from(number) * 10, 0, "goal"));
        }
        assert_eq!(tasks.as_slice().len(), MAX_TASKS);
        assert_eq!(tasks.as_slice()[0].number(), 3);
        assert_eq!(tasks.last().map(Task::number), Some(MAX_TASKS as u32 + 2));
    }

    #[test]
    fn a_goal_is_cut_at_a_char_boundary() {
        let long = "é".repeat(GOAL_BYTES);
        let task = Task::open(1, 1, 0, &long);
        assert_eq!(task.goal().len(), GOAL_BYTES);
        let odd = format!("a{long}");
        assert_eq!(Task::open(1, 1, 0, &odd).goal().len(), GOAL_BYTES - 1);
    }

    #[test]
    fn signatures_ignore_numbers_paths_and_hex() {
        let a = error_signature("thread 'main' panicked at src/a.rs:10:5: index 3 out of bounds");
        let b = error_signature("thread 'main' panicked at src/b/c.rs:99:1: index 7 out of bounds");
        assert!(a.is_some());
        assert_eq!(a, b);
        let c = error_signature("Segmentation fault at 0xdeadbeef: fatal");
        let d = error_signature("Segmentation fault at 0x0badf00d: fatal");
        assert_eq!(c, d);
        assert_ne!(a, c);
    }

    #[test]
    fn counts_of_none_are_not_errors() {
        assert!(!looks_like_error("0 errors, 0 warnings"));
        assert!(!looks_like_error("no errors found"));
        assert!(looks_like_error("1 error: expected `;`"));
        assert!(looks_like_error("[ctxwin] Tool call aborted: no result was received."));
    }

    #[test]
    fn error_words_inside_identifiers_are_not_errors() {
        assert!(!looks_like_error("use crate::error::ApiError;\nfn on_error() {}"));
        assert!(!looks_like_error("let failed_count = 0; // ErrorKind"));
        assert!(looks_like_error("error: expected `;`"));
        assert!(looks_like_error("2 errors emitted"));
        assert!(looks_like_error("test parser::tabs ... FAILED"));
        // Source code naming an error type is not an error report.
        let listing = "use crate::error::Error;\n\npub struct Pool {\n    pub fn take(&mut self) -> Result<usize, Error> {\n        Err(Error::Empty)\n    }\n}";
        assert!(!looks_like_error(listing));
        assert!(!looks_like_error("src/pool.rs:12:    let e = Error::new(kind);"));
        assert!(looks_like_error("test result: FAILED. 3 passed; 1 failed; 0 ignored"));
    }

    #[test]
    fn a_failure_reported_at_the_end_of_a_long_log_is_an_error_named_by_its_line() {
        let passing: String =
            (0..40).map(|i| format!("test store::tests::case_{i} ... ok\n")).collect();
        let log = |name: &str| {
            format!(
                "running 41 tests\n{passing}\nfailures:\n\n---- {name} stdout ----\nthread '{name}' panicked at src/store.rs:12:5:\nassertion failed\n\ntest result: FAILED. 40 passed; 1 failed\n"
            )
        };
        let first = log("store::tests::keeps_order");
        assert!(looks_like_error(&first));
        let line = error_line(&first).unwrap();
        assert!(line.starts_with("thread 'store::tests::keeps_order' panicked"), "{line}");
        // Another test failing is another error; a passing log is none.
        assert_ne!(
            error_signature(&first),
            error_signature(&log("store::tests::survives_restart"))
        );
        assert!(!looks_like_error(&format!(
            "running 40 tests\n{passing}\ntest result: ok. 40 passed; 0 failed\n"
        )));
    }
}
