//! [`ArchiveWriter`]: archive rows written later, by one background thread, many callers' rows
//! in one transaction.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::ArchiveError;
use super::{Archive, ArchivedMessage, store};

/// A place in an [`ArchiveWriter`]'s queue: committed once the rows submitted with it (and
/// everything submitted before) are. Tickets grow with each submission; [`Ticket::NONE`] is
/// always committed.
///
/// ```
/// use ctxwin_std::archive::Ticket;
/// assert!(Ticket::NONE < Ticket::from_raw(1));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// The ticket of nothing: waiting for it returns at once.
    pub const NONE: Ticket = Ticket(0);

    /// A ticket from its number (for storing one; the writer hands them out).
    ///
    /// ```
    /// assert_eq!(ctxwin_std::archive::Ticket::from_raw(7).raw(), 7);
    /// ```
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The ticket's number.
    ///
    /// ```
    /// assert_eq!(ctxwin_std::archive::Ticket::NONE.raw(), 0);
    /// ```
    pub const fn raw(self) -> u64 {
        self.0
    }
}

/// How an [`ArchiveWriter`] batches, bounds its queue and retries.
///
/// ```
/// use ctxwin_std::archive::WriterOptions;
/// let options = WriterOptions { max_queued_rows: 50_000, ..WriterOptions::DEFAULT };
/// assert_eq!(options.max_batch_rows, WriterOptions::DEFAULT.max_batch_rows);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Most rows written in one transaction (a submission larger than this is queued in
    /// pieces). The writer holds the archive's connection for the transaction, and other
    /// users of the connection (reads on a request's path) wait meanwhile. A row costs about
    /// 50 µs to write whatever the batch (one archive file, release build), so past a few
    /// hundred rows larger batches save nothing and only hold the connection longer.
    pub max_batch_rows: usize,
    /// Most rows queued or being written; `submit` waits for room beyond it. At least
    /// `max_batch_rows` (raised to it).
    pub max_queued_rows: usize,
    /// Most bytes of row text queued or being written (an estimate: texts plus a fixed cost
    /// per row); `submit` waits for room beyond it. A single piece larger than this is still
    /// queued when the queue is empty.
    pub max_queued_bytes: usize,
    /// The pause after a failed transaction; it doubles with each failure in a row.
    pub retry_min: Duration,
    /// The longest pause between attempts.
    pub retry_max: Duration,
    /// Failed attempts in a row after which a writer whose last handle was dropped stops and
    /// logs the rows it could not write (at least 1).
    pub close_attempts: u32,
}

impl WriterOptions {
    /// 256 rows a transaction; 20,000 rows or 64 MiB queued; retries after 10 ms, doubling
    /// up to 1 s; 5 attempts at shutdown.
    pub const DEFAULT: WriterOptions = WriterOptions {
        max_batch_rows: 256,
        max_queued_rows: 20_000,
        max_queued_bytes: 64 << 20,
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_secs(1),
        close_attempts: 5,
    };
}

impl Default for WriterOptions {
    /// [`WriterOptions::DEFAULT`].
    ///
    /// ```
    /// use ctxwin_std::archive::WriterOptions;
    /// assert_eq!(WriterOptions::default(), WriterOptions::DEFAULT);
    /// ```
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What an [`ArchiveWriter`] has done so far.
///
/// ```
/// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
/// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&archive)?;
/// assert_eq!(writer.stats().transactions, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Submissions queued (pieces of large ones counted apart).
    pub submissions: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Rows committed.
    pub rows_committed: u64,
    /// Transactions that failed (their rows were queued again).
    pub failed_attempts: u64,
    /// Submissions that had to wait for room in the queue.
    pub waited_for_room: u64,
    /// Rows queued or being written now.
    pub queued_rows: usize,
    /// Bytes queued or being written now (the estimate the bound uses).
    pub queued_bytes: usize,
    /// The most rows ever queued at once.
    pub peak_queued_rows: usize,
    /// The most bytes ever queued at once.
    pub peak_queued_bytes: usize,
    /// Time spent writing (encoding, then the transaction), failed attempts included.
    pub write_time: Duration,
    /// The longest attempt: how long the archive's connection may be held by the writer
    /// (other users of the connection wait for it meanwhile).
    pub longest_write: Duration,
}

/// Rows an [`ArchiveWriter`] did not queue, handed back with the reason: a row it cannot
/// store (an id or timestamp above `i64::MAX`; nothing of the submission was queued), a
/// failed write while the submission waited for room, or a stopped writer.
///
/// ```
/// use ctxwin_std::archive::{Archive, ArchiveError, ArchiveWriter, ArchivedMessage};
/// use ctxwin_std::{ChatMessage, core::Role};
/// let writer = ArchiveWriter::spawn(&Archive::open_in_memory()?)?;
/// let bad = ArchivedMessage::new(u64::MAX, 1, ChatMessage::text(Role::User, "x"));
/// let refused = writer.submit("s", vec![bad]).unwrap_err();
/// assert!(matches!(refused.error, ArchiveError::OutOfRange { .. }));
/// assert_eq!((refused.rows.len(), refused.queued), (1, None));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct SubmitError {
    /// Why the rows were not queued.
    #[source]
    pub error: ArchiveError,
    /// The rows not queued, in order.
    pub rows: Vec<ArchivedMessage>,
    /// The ticket of the pieces of this submission queued before it failed, if any.
    pub queued: Option<Ticket>,
}

/// One submission (or a piece of a large one).
#[derive(Debug)]
struct Job {
    ticket: u64,
    session: String,
    rows: Vec<ArchivedMessage>,
    bytes: usize,
}

/// The last failed attempt.
#[derive(Debug)]
struct Failure {
    reason: String,
    failure: Option<super::SqliteFailure>,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    /// Rows and bytes queued or being written (not committed yet).
    rows: usize,
    bytes: usize,
    /// The last ticket handed out.
    issued: u64,
    /// Every ticket up to this one is committed.
    committed: u64,
    /// Each session's newest uncommitted ticket.
    newest: HashMap<String, u64>,
    /// Failed attempts since the last commit.
    failures_in_row: u64,
    /// Failed attempts ever: waiters notice a new one by it.
    failures_total: u64,
    last_failure: Option<Failure>,
    /// The last handle is gone: write what is queued, then end.
    closing: bool,
    /// The thread has ended.
    stopped: bool,
    stats: WriterStats,
}

impl State {
    fn failure_error(&self) -> ArchiveError {
        match &self.last_failure {
            Some(failure) => ArchiveError::DeferredWrite {
                reason: failure.reason.clone(),
                failure: failure.failure,
                failures: self.failures_in_row,
                queued_rows: self.rows,
            },
            None => ArchiveError::WriterStopped { rows: self.rows },
        }
    }

    fn has_room(&self, rows: usize, bytes: usize, options: &WriterOptions) -> bool {
        self.rows == 0
            || (self.rows.saturating_add(rows) <= options.max_queued_rows
                && self.bytes.saturating_add(bytes) <= options.max_queued_bytes)
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The thread waits here for work (or for closing).
    work: Condvar,
    /// Waiters and submitters waiting for room wait here for commits and failures.
    settled: Condvar,
    options: WriterOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_settled<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.settled.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }
}

/// The last handle's owner of the thread: closes and joins it when dropped.
struct Handle {
    shared: Arc<Shared>,
    archive: Archive,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.closing = true;
        }
        self.shared.work.notify_all();
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("archive writer: the writer thread panicked");
        }
    }
}

/// A handle on one background thread that writes archive rows for many sessions, batching
/// what they queue into one transaction. Clones share the thread.
///
/// A transaction costs more than the few rows a request adds (the WAL frames of every page
/// it touches, the full-text index's new segment), and sessions that each commit a few rows
/// per request (the proxy's) pay it on the request's path and queue for the shared
/// connection. Through a writer, [`submit`](ArchiveWriter::submit) only queues the rows and returns a
/// [`Ticket`]; the writer's thread takes everything queued (up to
/// [`WriterOptions::max_batch_rows`]) and writes it in one transaction, encoding the rows
/// (keywords, JSON) off the caller's path too. [`wait`](ArchiveWriter::wait) blocks until a
/// ticket is committed.
///
/// * **Order.** The queue is first in, first out, and batches are written in queue order, so
///   rows of one session (upserts by id) land in the order they were submitted, and a ticket
///   is committed once every earlier ticket is.
/// * **Failures lose nothing.** When a transaction fails, its rows go back to the head of the
///   queue and are written again after a pause ([`WriterOptions::retry_min`], doubling up to
///   [`WriterOptions::retry_max`]). A [`wait`](ArchiveWriter::wait) whose ticket is not
///   committed returns the next failed attempt's error ([`ArchiveError::DeferredWrite`]);
///   waiting again later succeeds once the cause is gone.
/// * **Bounded memory.** When the rows queued (and being written) would pass
///   [`WriterOptions::max_queued_rows`] or [`WriterOptions::max_queued_bytes`], `submit` blocks
///   until the writer has caught up (backpressure); it never drops rows.
/// * **Shutdown.** Dropping the last handle writes what is queued and joins the thread (giving
///   up, with an error logged, only after [`WriterOptions::close_attempts`] failed attempts).
///
/// ```
/// use ctxwin_std::archive::{Archive, ArchiveWriter, ArchivedMessage};
/// use ctxwin_std::{ChatMessage, core::Role};
///
/// let archive = Archive::open_in_memory()?;
/// let writer = ArchiveWriter::spawn(&archive)?;
/// let row = |id| ArchivedMessage::new(id, id, ChatMessage::text(Role::User, format!("turn {id}")));
/// let a = writer.submit("a", vec![row(1), row(2)])?;
/// let b = writer.submit("b", vec![row(1)])?;
/// writer.wait(b)?; // `a` came first: committed too
/// assert!(writer.is_committed(a));
/// assert_eq!(archive.message_count(None)?, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ArchiveWriter {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for ArchiveWriter {
    // The queue may hold thousands of rows: show its size instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveWriter")
            .field("options", &self.handle.shared.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Bytes a row holds in memory, roughly: its texts plus a fixed cost.
fn row_bytes(row: &ArchivedMessage) -> usize {
    let message = &row.message;
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| call.id.len() + call.name.len() + call.arguments.len() + 72)
        .sum();
    let texts = message.content.len()
        + row.original.as_ref().map_or(0, String::len)
        + message.tool_call_id.as_ref().map_or(0, String::len)
        + message.name.as_ref().map_or(0, String::len);
    texts + calls + std::mem::size_of::<ArchivedMessage>()
}

impl ArchiveWriter {
    /// Starts a writer for `archive` (it keeps a clone: the same connection) with
    /// [`WriterOptions::DEFAULT`].
    ///
    /// # Errors
    /// The operating system's error when the thread cannot be started.
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&archive)?;
    /// assert!(writer.archive().shares_connection(&archive));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn(archive: &Archive) -> std::io::Result<Self> {
        Self::spawn_with(archive, WriterOptions::DEFAULT)
    }

    /// Starts a writer for `archive` with `options`.
    ///
    /// # Errors
    /// The operating system's error when the thread cannot be started.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchiveWriter, WriterOptions};
    /// let options = WriterOptions { max_queued_rows: 4_000, ..WriterOptions::DEFAULT };
    /// let writer = ArchiveWriter::spawn_with(&Archive::open_in_memory()?, options)?;
    /// assert_eq!(writer.stats().queued_rows, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn_with(archive: &Archive, options: WriterOptions) -> std::io::Result<Self> {
        let max_batch_rows = options.max_batch_rows.max(1);
        let options = WriterOptions {
            max_batch_rows,
            max_queued_rows: options.max_queued_rows.max(max_batch_rows),
            close_attempts: options.close_attempts.max(1),
            ..options
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            settled: Condvar::new(),
            options,
        });
        let thread = {
            let shared = shared.clone();
            let archive = archive.clone();
            std::thread::Builder::new()
                .name("ctxwin-archive-writer".into())
                .spawn(move || run(&shared, archive))?
        };
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                archive: archive.clone(),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The archive this writer writes to (a clone of the handle it was started with).
    ///
    /// ```
    /// let archive = ctxwin_std::archive::Archive::open_in_memory()?;
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&archive)?;
    /// assert_eq!(writer.archive().message_count(None)?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn archive(&self) -> &Archive {
        &self.handle.archive
    }

    /// Queues `rows` of `session` (upserts by id, written in this order after everything
    /// queued before) and returns their ticket at once, unless the queue is full: then it
    /// waits until the writer has made room. Rows are checked first (ids and timestamps must
    /// fit SQLite's integers); nothing of a submission with a bad row is queued. Empty `rows`
    /// get [`Ticket::NONE`].
    ///
    /// # Errors
    /// [`SubmitError`] with the rows not queued: [`ArchiveError::OutOfRange`] for a bad row,
    /// [`ArchiveError::DeferredWrite`] when a write failed while this waited for room,
    /// [`ArchiveError::WriterStopped`] when the writer has ended.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchiveWriter, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let writer = ArchiveWriter::spawn(&Archive::open_in_memory()?)?;
    /// let ticket = writer.submit("s", vec![ArchivedMessage::new(1, 1, ChatMessage::text(Role::User, "hi"))])?;
    /// writer.wait(ticket)?;
    /// assert_eq!(writer.archive().get("s", 1)?.unwrap().message.content, "hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit(&self, session: &str, rows: Vec<ArchivedMessage>) -> Result<Ticket, SubmitError> {
        if let Err(error) = rows.iter().try_for_each(|row| store::sql_keys(row).map(drop)) {
            return Err(SubmitError { error, rows, queued: None });
        }
        let shared = &self.handle.shared;
        let options = &shared.options;
        let mut rest = rows;
        let mut state = shared.lock();
        let mut queued = None;
        while !rest.is_empty() {
            let tail = if rest.len() > options.max_batch_rows {
                rest.split_off(options.max_batch_rows)
            } else {
                Vec::new()
            };
            let piece = std::mem::replace(&mut rest, tail);
            let bytes: usize = piece.iter().map(row_bytes).sum();
            let seen_failures = state.failures_total;
            let mut waited = false;
            while !state.stopped && !state.has_room(piece.len(), bytes, options) {
                if state.failures_total != seen_failures && state.last_failure.is_some() {
                    let error = state.failure_error();
                    return Err(SubmitError { error, rows: rejoin(piece, rest), queued });
                }
                waited = true;
                state = shared.wait_settled(state);
            }
            if state.stopped {
                let error = ArchiveError::WriterStopped { rows: state.rows };
                return Err(SubmitError { error, rows: rejoin(piece, rest), queued });
            }
            state.issued = state.issued.saturating_add(1);
            let ticket = state.issued;
            state.rows = state.rows.saturating_add(piece.len());
            state.bytes = state.bytes.saturating_add(bytes);
            let (queued_rows, queued_bytes) = (state.rows, state.bytes);
            let stats = &mut state.stats;
            stats.submissions = stats.submissions.saturating_add(1);
            stats.waited_for_room = stats.waited_for_room.saturating_add(u64::from(waited));
            stats.peak_queued_rows = stats.peak_queued_rows.max(queued_rows);
            stats.peak_queued_bytes = stats.peak_queued_bytes.max(queued_bytes);
            match state.newest.get_mut(session) {
                Some(newest) => *newest = ticket,
                None => {
                    state.newest.insert(session.to_string(), ticket);
                }
            }
            state.queue.push_back(Job { ticket, session: session.to_string(), rows: piece, bytes });
            queued = Some(Ticket(ticket));
            shared.work.notify_one();
        }
        Ok(queued.unwrap_or(Ticket::NONE))
    }

    /// Blocks until `ticket` is committed.
    ///
    /// # Errors
    /// [`ArchiveError::DeferredWrite`] when an attempt to write fails before the ticket is
    /// committed (the rows stay queued and are retried: wait again later);
    /// [`ArchiveError::WriterStopped`] when the writer has ended without committing it.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchiveWriter, Ticket};
    /// let writer = ArchiveWriter::spawn(&Archive::open_in_memory()?)?;
    /// writer.wait(Ticket::NONE)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(&self, ticket: Ticket) -> Result<(), ArchiveError> {
        let shared = &self.handle.shared;
        let mut state = shared.lock();
        let mut seen_failures = state.failures_total;
        loop {
            if state.committed >= ticket.0 {
                return Ok(());
            }
            if state.failures_total != seen_failures {
                if state.last_failure.is_some() {
                    return Err(state.failure_error());
                }
                seen_failures = state.failures_total;
            }
            if state.stopped {
                return Err(ArchiveError::WriterStopped { rows: state.rows });
            }
            state = shared.wait_settled(state);
        }
    }

    /// Blocks until everything queued so far is committed.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    ///
    /// ```
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&ctxwin_std::archive::Archive::open_in_memory()?)?;
    /// writer.flush()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&self) -> Result<(), ArchiveError> {
        let issued = self.handle.shared.lock().issued;
        self.wait(Ticket(issued))
    }

    /// Whether `ticket` is committed (without waiting).
    ///
    /// ```
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&ctxwin_std::archive::Archive::open_in_memory()?)?;
    /// assert!(writer.is_committed(ctxwin_std::archive::Ticket::NONE));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_committed(&self, ticket: Ticket) -> bool {
        self.handle.shared.lock().committed >= ticket.0
    }

    /// The newest ticket of `session` not committed yet, whoever submitted it (`None` when all
    /// its rows are committed): what to wait for before reading that session's rows.
    ///
    /// ```
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&ctxwin_std::archive::Archive::open_in_memory()?)?;
    /// assert_eq!(writer.pending_ticket("s"), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pending_ticket(&self, session: &str) -> Option<Ticket> {
        let state = self.handle.shared.lock();
        state.newest.get(session).filter(|&&ticket| ticket > state.committed).map(|&t| Ticket(t))
    }

    /// What the writer has done so far, and its queue now.
    ///
    /// ```
    /// let writer = ctxwin_std::archive::ArchiveWriter::spawn(&ctxwin_std::archive::Archive::open_in_memory()?)?;
    /// assert_eq!(writer.stats().rows_committed, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> WriterStats {
        let state = self.handle.shared.lock();
        WriterStats { queued_rows: state.rows, queued_bytes: state.bytes, ..state.stats }
    }
}

/// `piece` followed by `rest`.
fn rejoin(mut piece: Vec<ArchivedMessage>, rest: Vec<ArchivedMessage>) -> Vec<ArchivedMessage> {
    piece.extend(rest);
    piece
}

/// Marks the writer stopped when its thread ends, however it ends (a panic included), so no
/// waiter blocks forever.
struct StopGuard<'a>(&'a Shared);

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().stopped = true;
        self.0.settled.notify_all();
    }
}

/// Takes jobs from the head of the queue up to `max_rows` rows (at least one job).
fn take_batch(queue: &mut VecDeque<Job>, max_rows: usize) -> Vec<Job> {
    let mut batch = Vec::new();
    let mut rows = 0_usize;
    while let Some(job) = queue.front() {
        if !batch.is_empty() && rows.saturating_add(job.rows.len()) > max_rows {
            break;
        }
        rows = rows.saturating_add(job.rows.len());
        if let Some(job) = queue.pop_front() {
            batch.push(job);
        }
    }
    batch
}

/// The writer thread: takes what is queued, writes it in one transaction, repeats.
fn run(shared: &Shared, mut archive: Archive) {
    let _stop = StopGuard(shared);
    let options = shared.options;
    let mut pause = options.retry_min;
    loop {
        let batch = {
            let mut state = shared.lock();
            while state.queue.is_empty() && !state.closing {
                state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            if state.queue.is_empty() {
                return;
            }
            take_batch(&mut state.queue, options.max_batch_rows)
        };
        let groups: Vec<(&str, &[ArchivedMessage])> =
            batch.iter().map(|job| (job.session.as_str(), job.rows.as_slice())).collect();
        let started = Instant::now();
        let result = archive.store_sessions(&groups);
        let took = started.elapsed();
        drop(groups);
        let mut state = shared.lock();
        state.stats.write_time = state.stats.write_time.saturating_add(took);
        state.stats.longest_write = state.stats.longest_write.max(took);
        match result {
            Ok(_) => {
                let rows: usize = batch.iter().map(|job| job.rows.len()).sum();
                let bytes: usize = batch.iter().map(|job| job.bytes).sum();
                state.rows = state.rows.saturating_sub(rows);
                state.bytes = state.bytes.saturating_sub(bytes);
                for job in &batch {
                    if state.newest.get(&job.session) == Some(&job.ticket) {
                        state.newest.remove(&job.session);
                    }
                }
                if let Some(last) = batch.last() {
                    state.committed = state.committed.max(last.ticket);
                }
                state.stats.transactions = state.stats.transactions.saturating_add(1);
                state.stats.rows_committed = state.stats.rows_committed.saturating_add(rows as u64);
                state.failures_in_row = 0;
                state.last_failure = None;
                pause = options.retry_min;
                drop(state);
                shared.settled.notify_all();
            }
            Err(error) => {
                state.failures_in_row = state.failures_in_row.saturating_add(1);
                state.failures_total = state.failures_total.saturating_add(1);
                state.stats.failed_attempts = state.stats.failed_attempts.saturating_add(1);
                state.last_failure =
                    Some(Failure { reason: error.to_string(), failure: error.sqlite_failure() });
                for job in batch.into_iter().rev() {
                    state.queue.push_front(job);
                }
                tracing::warn!(
                    %error,
                    rows = state.rows,
                    failures = state.failures_in_row,
                    "archive writer: write failed; rows kept and retried"
                );
                let give_up =
                    state.closing && state.failures_in_row >= u64::from(options.close_attempts);
                if give_up {
                    tracing::error!(
                        rows = state.rows,
                        %error,
                        "archive writer: closing after repeated failures; queued rows were not written"
                    );
                    return;
                }
                drop(state);
                shared.settled.notify_all();
                std::thread::sleep(pause);
                pause = pause.saturating_mul(2).min(options.retry_max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ChatMessage;
    use ctxwin_core::Role;

    fn row(id: u64, text: &str) -> ArchivedMessage {
        ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text)).with_timestamp(id)
    }

    /// Request `request` of a session: a question, an answer, and an update of the previous
    /// request's answer (an upsert of an id written before: only the last text may remain).
    fn rows_of(session: usize, request: u64) -> Vec<ArchivedMessage> {
        let id = request * 2 + 1;
        vec![
            row(id, &format!("s{session} r{request} question")),
            row(id + 1, &format!("s{session} r{request} answer")),
            row(id.saturating_sub(1).max(1), &format!("s{session} r{request} edit")),
        ]
    }

    fn fast() -> WriterOptions {
        WriterOptions {
            retry_min: Duration::from_millis(2),
            retry_max: Duration::from_millis(20),
            ..WriterOptions::DEFAULT
        }
    }

    fn dump(archive: &Archive, session: &str) -> Vec<ArchivedMessage> {
        archive.recent(session, 10_000).unwrap()
    }

    #[test]
    fn many_sessions_from_many_threads_land_once_and_in_order() {
        let direct = Archive::open_in_memory().unwrap();
        let deferred = Archive::open_in_memory().unwrap();
        let writer = ArchiveWriter::spawn_with(&deferred, fast()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let writer = writer.clone();
                let mut direct = direct.clone();
                std::thread::spawn(move || {
                    let mut last = Ticket::NONE;
                    for request in 0..25 {
                        for session in (thread * 10)..(thread * 10 + 10) {
                            let name = format!("s{session}");
                            let rows = rows_of(session, request);
                            direct.store_messages(&name, &rows).unwrap();
                            last = writer.submit(&name, rows).unwrap();
                        }
                    }
                    last
                })
            })
            .collect();
        for thread in threads {
            let last = thread.join().unwrap();
            writer.wait(last).unwrap();
        }
        writer.flush().unwrap();
        for session in 0..40 {
            let name = format!("s{session}");
            let expected = dump(&direct, &name);
            assert_eq!(expected.len(), 50);
            assert_eq!(dump(&deferred, &name), expected, "{name}");
        }
        assert_eq!(deferred.message_count(None).unwrap(), 40 * 50);
        let stats = writer.stats();
        assert_eq!(stats.rows_committed, 40 * 25 * 3);
        assert_eq!(stats.queued_rows, 0);
        assert!(stats.transactions < stats.submissions, "{stats:?}");
    }

    #[test]
    fn everything_queued_meanwhile_is_one_transaction() {
        let archive = Archive::open_in_memory().unwrap();
        let options = WriterOptions { max_batch_rows: 1_000, ..fast() };
        let writer = ArchiveWriter::spawn_with(&archive, options).unwrap();
        let held = archive.conn();
        let mut last = Ticket::NONE;
        for session in 0..100 {
            last = writer.submit(&format!("s{session}"), rows_of(session, 0)).unwrap();
        }
        assert!(!writer.is_committed(last));
        drop(held);
        writer.wait(last).unwrap();
        let stats = writer.stats();
        assert_eq!((stats.submissions, stats.rows_committed), (100, 300));
        // The first submission may have been taken alone before the rest were queued.
        assert!(stats.transactions <= 2, "{stats:?}");
        assert_eq!(archive.message_count(None).unwrap(), 200);
    }

    #[test]
    fn a_failed_write_keeps_the_rows_and_a_later_wait_succeeds() {
        let archive = Archive::open_in_memory().unwrap();
        archive.fail_writes_for_tests("injected failure");
        let writer = ArchiveWriter::spawn_with(&archive, fast()).unwrap();
        let first = writer.submit("a", rows_of(0, 0)).unwrap();
        let second = writer.submit("b", rows_of(1, 0)).unwrap();
        let error = writer.wait(second).unwrap_err();
        match &error {
            ArchiveError::DeferredWrite { reason, queued_rows, failures, .. } => {
                assert!(reason.contains("injected failure"), "{reason}");
                assert!(*failures >= 1);
                assert_eq!(*queued_rows, 6);
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(error.to_string().contains("retried"), "{error}");
        assert!(!writer.is_committed(first));
        assert_eq!(writer.pending_ticket("a"), Some(first));
        assert_eq!(archive.message_count(None).unwrap(), 0);
        archive.heal_writes_for_tests();
        writer.wait(second).unwrap();
        assert_eq!(writer.pending_ticket("a"), None);
        assert_eq!(dump(&archive, "a").len(), 2);
        assert_eq!(dump(&archive, "b").len(), 2);
        let stats = writer.stats();
        assert!(stats.failed_attempts >= 1 && stats.queued_rows == 0, "{stats:?}");
    }

    #[test]
    fn submit_waits_for_room_and_never_passes_the_bound() {
        let archive = Archive::open_in_memory().unwrap();
        let options = WriterOptions { max_batch_rows: 6, max_queued_rows: 12, ..fast() };
        let writer = ArchiveWriter::spawn_with(&archive, options).unwrap();
        let held = archive.conn();
        let submitted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let producer = {
            let writer = writer.clone();
            let submitted = submitted.clone();
            std::thread::spawn(move || {
                for request in 0..20 {
                    writer.submit("s", rows_of(0, request)).unwrap();
                    submitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // 12 rows fit: four submissions of three (the first may be in the writer's hands).
        let stuck = submitted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(stuck <= 4, "{stuck} submissions passed a 12-row bound");
        assert!(writer.stats().queued_rows <= 12);
        drop(held);
        producer.join().unwrap();
        writer.flush().unwrap();
        let stats = writer.stats();
        assert!(stats.peak_queued_rows <= 12, "{stats:?}");
        assert!(stats.waited_for_room > 0, "{stats:?}");
        assert_eq!(stats.rows_committed, 60);
        assert_eq!(dump(&archive, "s").len(), 40);
    }

    #[test]
    fn a_submit_waiting_for_room_gets_its_rows_back_when_a_write_fails() {
        let archive = Archive::open_in_memory().unwrap();
        archive.fail_writes_for_tests("injected failure");
        let options = WriterOptions { max_batch_rows: 3, max_queued_rows: 3, ..fast() };
        let writer = ArchiveWriter::spawn_with(&archive, options).unwrap();
        let first = writer.submit("s", rows_of(0, 0)).unwrap();
        let refused = writer.submit("s", rows_of(0, 1)).unwrap_err();
        assert!(matches!(refused.error, ArchiveError::DeferredWrite { .. }), "{:?}", refused.error);
        assert_eq!(refused.rows, rows_of(0, 1));
        assert_eq!(refused.queued, None);
        archive.heal_writes_for_tests();
        writer.wait(first).unwrap();
        let again = writer.submit("s", refused.rows).unwrap();
        writer.wait(again).unwrap();
        assert_eq!(dump(&archive, "s").len(), 4);
        let stats = writer.stats();
        assert!(stats.longest_write > Duration::ZERO && stats.write_time >= stats.longest_write);
    }

    #[test]
    fn a_large_submission_is_queued_in_pieces() {
        let archive = Archive::open_in_memory().unwrap();
        let options = WriterOptions { max_batch_rows: 10, max_queued_rows: 10, ..fast() };
        let writer = ArchiveWriter::spawn_with(&archive, options).unwrap();
        let rows: Vec<_> = (1..=35).map(|id| row(id, "bulk")).collect();
        let ticket = writer.submit("s", rows).unwrap();
        writer.wait(ticket).unwrap();
        assert_eq!(archive.message_count(Some("s")).unwrap(), 35);
        assert_eq!(writer.stats().submissions, 4);
        assert!(writer.stats().peak_queued_rows <= 10);
    }

    #[test]
    fn a_bad_row_is_refused_and_nothing_of_it_queued() {
        let archive = Archive::open_in_memory().unwrap();
        let writer = ArchiveWriter::spawn_with(&archive, fast()).unwrap();
        let bad = row(1, "x").with_timestamp(u64::MAX);
        let refused = writer.submit("s", vec![row(2, "y"), bad]).unwrap_err();
        assert!(matches!(refused.error, ArchiveError::OutOfRange { what: "timestamp", .. }));
        assert_eq!(refused.rows.len(), 2);
        writer.flush().unwrap();
        assert_eq!(writer.stats().submissions, 0);
        assert_eq!(archive.message_count(None).unwrap(), 0);
    }

    #[test]
    fn dropping_the_last_handle_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let archive = Archive::open(&path).unwrap();
        let writer = ArchiveWriter::spawn_with(&archive, fast()).unwrap();
        let held = archive.conn();
        let other = writer.clone();
        for session in 0..10 {
            writer.submit(&format!("s{session}"), rows_of(session, 0)).unwrap();
        }
        drop(writer);
        drop(held);
        drop(other);
        drop(archive);
        let reopened = Archive::open(&path).unwrap();
        assert_eq!(reopened.message_count(None).unwrap(), 20);
    }

    #[test]
    fn a_writer_that_cannot_write_at_close_gives_up_and_stops() {
        let archive = Archive::open_in_memory().unwrap();
        archive
            .conn()
            .execute_batch(
                "CREATE TRIGGER fail_writes BEFORE INSERT ON messages
                 BEGIN SELECT RAISE(ABORT, 'always'); END;",
            )
            .unwrap();
        let options = WriterOptions { close_attempts: 2, ..fast() };
        let writer = ArchiveWriter::spawn_with(&archive, options).unwrap();
        writer.submit("s", rows_of(0, 0)).unwrap();
        let started = Instant::now();
        drop(writer);
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(archive.message_count(None).unwrap(), 0);
    }

    #[test]
    fn handles_are_send_sync_and_debug_is_short() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ArchiveWriter>();
        let writer = ArchiveWriter::spawn(&Archive::open_in_memory().unwrap()).unwrap();
        writer.submit("s", vec![row(1, &"x".repeat(10_000))]).unwrap();
        let text = format!("{writer:?}");
        assert!(text.len() < 600 && text.contains("ArchiveWriter"), "{text}");
    }
}
