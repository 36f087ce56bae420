//! [`Deferred`]: writes queued to one background thread, which writes what many conversations
//! queued in one transaction.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::to_i64;
use super::port::{ArchiveStore, PendingOp, PendingWrite, Unwritten, Write};
use super::{
    ArchivedMessage, ErrorKind, Fence, Forget, Forgotten, MetricsSummary, Scope, SearchHit,
    SearchQuery, StoreError, SummaryHit, SummaryRecord, Usage, VectorRow,
};

/// How a [`Deferred`] batches, bounds its queue and retries.
///
/// ```
/// use ctxwin_std::store::DeferredOptions;
/// let options = DeferredOptions { max_queued_rows: 50_000, ..DeferredOptions::DEFAULT };
/// assert_eq!(options.max_batch_rows, DeferredOptions::DEFAULT.max_batch_rows);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeferredOptions {
    /// Most rows written in one transaction (a write holding more is written alone). The
    /// writer holds the inner store for the transaction (an SQLite connection other users
    /// wait for), and past a few hundred rows larger batches save nothing.
    pub max_batch_rows: usize,
    /// Most rows queued or being written; a write waits for room beyond it. At least
    /// `max_batch_rows` (raised to it).
    pub max_queued_rows: usize,
    /// Most bytes of row text queued or being written (an estimate: texts plus a fixed cost
    /// per row); a write waits for room beyond it. One write larger than this is still queued
    /// when the queue is empty.
    pub max_queued_bytes: usize,
    /// The pause after a failed transaction; it doubles with each failure in a row.
    pub retry_min: Duration,
    /// The longest pause between attempts.
    pub retry_max: Duration,
    /// Failed attempts in a row after which a closing writer (its last handle dropped) stops
    /// and logs the rows it could not write (at least 1).
    pub close_attempts: u32,
    /// How far the writer thread yields the CPU to the threads that queue writes: its nice
    /// value is raised by this much (Linux; ignored elsewhere; 0: the caller's priority). A
    /// busy proxy's requests then wait less behind its indexing, and a queue the writer
    /// cannot drain still holds writers back by its bounds.
    pub nice: u8,
}

impl DeferredOptions {
    /// 256 rows a transaction; 20,000 rows or 64 MiB queued; retries after 10 ms, doubling
    /// up to 1 s; 5 attempts at shutdown; the writer at nice +10.
    pub const DEFAULT: DeferredOptions = DeferredOptions {
        max_batch_rows: 256,
        max_queued_rows: 20_000,
        max_queued_bytes: 64 << 20,
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_secs(1),
        close_attempts: 5,
        nice: 10,
    };
}

impl Default for DeferredOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a [`Deferred`] has done so far, and its queue now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeferredStats {
    /// Writes queued.
    pub submissions: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Rows committed.
    pub rows_committed: u64,
    /// Transactions that failed (their writes were queued again).
    pub failed_attempts: u64,
    /// Writes that had to wait for room in the queue.
    pub waited_for_room: u64,
    /// Rows queued or being written now.
    pub queued_rows: usize,
    /// Bytes queued or being written now (the estimate the bound uses).
    pub queued_bytes: usize,
    /// The most rows ever queued at once.
    pub peak_queued_rows: usize,
    /// The most bytes ever queued at once.
    pub peak_queued_bytes: usize,
    /// Time spent writing, failed attempts included.
    pub write_time: Duration,
    /// The longest attempt: how long the inner store may be held by the writer.
    pub longest_write: Duration,
}

/// One queued write.
#[derive(Debug)]
struct Job {
    ticket: u64,
    write: PendingWrite,
    rows: usize,
    bytes: usize,
}

/// The last failed attempt.
#[derive(Debug)]
struct Failure {
    reason: String,
    kind: ErrorKind,
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
    /// Each scope's newest uncommitted ticket.
    newest: HashMap<Scope, u64>,
    /// Failed attempts since the last commit.
    failures_in_row: u64,
    /// Failed attempts ever: waiters notice a new one by it.
    failures_total: u64,
    last_failure: Option<Failure>,
    /// The last handle is gone: write what is queued, then end.
    closing: bool,
    /// The thread has ended.
    stopped: bool,
    /// The next batch takes one write: a batch was refused for good, and the write that
    /// caused it is being found.
    isolate: bool,
    /// Writes the inner store refused for good (a stale fence), by scope: reported to the
    /// scope's next flush or read, then forgotten.
    rejected: HashMap<Scope, StoreError>,
    /// What each scope has queued or being written: a read that wants none of it need not
    /// wait ([`Deferred::settle_for`]).
    uncommitted: HashMap<Scope, Uncommitted>,
    stats: DeferredStats,
}

/// A scope's writes not committed yet.
#[derive(Debug, Default)]
struct Uncommitted {
    /// Message ids written, each with its number of writes.
    ids: HashMap<u64, u32>,
    /// Writes other than rows (summaries, compression events).
    other: u32,
}

impl State {
    /// Counts `write` as uncommitted (`add`) or as committed or dropped.
    fn track(&mut self, write: &PendingWrite, add: bool) {
        let step = |n: &mut u32| *n = if add { n.saturating_add(1) } else { n.saturating_sub(1) };
        let entry = self.uncommitted.entry(write.scope.clone()).or_default();
        match &write.op {
            PendingOp::Rows(rows) => {
                for row in rows {
                    let n = entry.ids.entry(row.id).or_default();
                    step(n);
                    if *n == 0 {
                        entry.ids.remove(&row.id);
                    }
                }
            }
            _ => step(&mut entry.other),
        }
        if entry.ids.is_empty() && entry.other == 0 {
            self.uncommitted.remove(&write.scope);
        }
    }

    fn failure_error(&self) -> StoreError {
        match &self.last_failure {
            Some(failure) => StoreError::Deferred {
                reason: failure.reason.clone(),
                cause: failure.kind,
                failures: self.failures_in_row,
                queued_rows: self.rows,
            },
            None => StoreError::Stopped { rows: self.rows },
        }
    }

    fn has_room(&self, rows: usize, bytes: usize, options: &DeferredOptions) -> bool {
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
    /// Waiters and writers waiting for room wait here for commits and failures.
    settled: Condvar,
    options: DeferredOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_settled<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.settled.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until ticket `ticket` is committed.
    fn wait(&self, ticket: u64) -> Result<(), StoreError> {
        let mut state = self.lock();
        let mut seen_failures = state.failures_total;
        loop {
            if state.committed >= ticket {
                return Ok(());
            }
            if state.failures_total != seen_failures {
                if state.last_failure.is_some() {
                    return Err(state.failure_error());
                }
                seen_failures = state.failures_total;
            }
            if state.stopped {
                return Err(StoreError::Stopped { rows: state.rows });
            }
            state = self.wait_settled(state);
        }
    }
}

/// Writes queued to one background thread instead of committed on the caller's path: a
/// wrapper around any [`ArchiveStore`] (share it as an `Arc`).
///
/// A transaction costs more than the few rows a request adds (an SQLite archive's WAL frames,
/// its full-text index's new segment), and conversations that each commit a few rows per
/// request (a proxy's) pay it on the request's path and queue for the shared store. Through
/// `Deferred`, [`write`](ArchiveStore::write) only checks and queues; the thread takes
/// everything queued (up to [`DeferredOptions::max_batch_rows`]) and writes it with one
/// [`write`](ArchiveStore::write) of the inner store.
///
/// * **Reads see their own scope's writes.** A read of a scope (a search, a get) first waits
///   until the writes queued for that scope are committed; other scopes' queues do not delay
///   it. [`flush`](ArchiveStore::flush) waits the same way.
/// * **Order.** First in, first out, batches written in queue order: writes of one scope land
///   in the order they were made.
/// * **Durability.** A write is durable once a later [`flush`](ArchiveStore::flush) of its
///   scope (or a read of it) returns `Ok`, not before: a crash loses what was queued and not
///   yet committed. A session never checkpoints before its scope is flushed, so a crash never
///   loses anything a checkpoint covers.
/// * **Failures lose nothing.** When a transaction fails, its writes go back to the head of
///   the queue and are written again after a pause ([`DeferredOptions::retry_min`], doubling
///   up to [`DeferredOptions::retry_max`]). A wait whose writes are not committed returns the
///   next failed attempt's error ([`StoreError::Deferred`]); waiting again later succeeds once
///   the cause is gone.
/// * **Bounded memory.** When the rows queued would pass [`DeferredOptions::max_queued_rows`]
///   or [`DeferredOptions::max_queued_bytes`], a write waits until the thread has caught up
///   (backpressure); it never drops rows.
/// * **Shutdown.** Dropping it writes what is queued and joins the thread (giving up, with
///   an error logged, only after [`DeferredOptions::close_attempts`] failed attempts).
///
/// ```
/// use std::sync::Arc;
/// use ctxwin_std::store::{ArchiveStore, ArchivedMessage, Deferred, Fence, MemoryStore, Scope};
/// use ctxwin_std::{ChatMessage, core::Role};
///
/// let store = Arc::new(Deferred::spawn(MemoryStore::new())?);
/// let row = |id| ArchivedMessage::new(id, id, ChatMessage::text(Role::User, format!("turn {id}")));
/// let (a, b) = (Scope::local("a"), Scope::local("b"));
/// store.put(&a, Fence::NONE, &[row(1), row(2)])?; // queued
/// store.put(&b, Fence::NONE, &[row(1)])?;
/// store.flush(&b)?;
/// assert_eq!(store.get(&a, 2)?.unwrap().message.content, "turn 2"); // a read waits for a's rows
/// assert_eq!(store.stats().rows_committed, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Deferred<S: ArchiveStore + 'static> {
    shared: Arc<Shared>,
    inner: Arc<S>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<S: ArchiveStore + 'static> std::fmt::Debug for Deferred<S> {
    // The queue may hold thousands of rows: show its size instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("inner", &self.inner)
            .field("options", &self.shared.options)
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
        + row.raw.as_ref().map_or(0, String::len)
        + message.tool_call_id.as_ref().map_or(0, String::len)
        + message.name.as_ref().map_or(0, String::len);
    texts + calls + std::mem::size_of::<ArchivedMessage>()
}

/// Rows and bytes of a queued write.
fn size(write: &PendingWrite) -> (usize, usize) {
    match &write.op {
        PendingOp::Rows(rows) => (rows.len(), rows.iter().map(row_bytes).sum()),
        PendingOp::Summary(summary) => (0, summary.text.len() + 8 * summary.source_ids.len() + 64),
        PendingOp::Compression(event) => (0, event.strategy.len() + 64),
    }
}

/// What the inner store would refuse of `write` for its values (checked before queuing, so a
/// bad write fails on the caller's path, not in the thread).
fn check(write: &Write<'_>) -> Result<(), StoreError> {
    if let super::WriteOp::Rows(rows) = write.op {
        for row in rows {
            to_i64("message id", row.id)?;
            to_i64("unit id", row.unit)?;
            to_i64("timestamp", row.timestamp)?;
        }
    }
    Ok(())
}

impl<S: ArchiveStore + 'static> Deferred<S> {
    /// Starts the writer thread for `inner` with [`DeferredOptions::DEFAULT`].
    ///
    /// # Errors
    /// The operating system's error when the thread cannot be started.
    pub fn spawn(inner: S) -> std::io::Result<Self> {
        Self::spawn_with(inner, DeferredOptions::DEFAULT)
    }

    /// Starts the writer thread for `inner` with `options`.
    ///
    /// # Errors
    /// The operating system's error when the thread cannot be started.
    pub fn spawn_with(inner: S, options: DeferredOptions) -> std::io::Result<Self> {
        let max_batch_rows = options.max_batch_rows.max(1);
        let options = DeferredOptions {
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
        let inner = Arc::new(inner);
        let thread = {
            let (shared, inner) = (shared.clone(), inner.clone());
            std::thread::Builder::new().name("ctxwin-deferred-writer".into()).spawn(move || {
                yield_cpu(options.nice);
                run(&shared, inner.as_ref());
            })?
        };
        Ok(Self { shared, inner, thread: Mutex::new(Some(thread)) })
    }

    /// The store it writes to.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What it has done so far, and its queue now.
    ///
    /// ```
    /// let store = ctxwin_std::store::Deferred::spawn(ctxwin_std::store::MemoryStore::new())?;
    /// assert_eq!(store.stats().queued_rows, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> DeferredStats {
        let state = self.shared.lock();
        DeferredStats { queued_rows: state.rows, queued_bytes: state.bytes, ..state.stats }
    }

    /// Blocks until everything queued so far is committed, whatever its scope.
    ///
    /// # Errors
    /// [`StoreError::Deferred`] when an attempt fails first (the writes stay queued);
    /// [`StoreError::Stopped`].
    pub fn flush_all(&self) -> Result<(), StoreError> {
        let issued = self.shared.lock().issued;
        self.shared.wait(issued)
    }

    /// Waits until the writes queued for `scope` are committed (before reading it); a write
    /// of the scope the inner store refused for good meanwhile is reported (once).
    fn settle(&self, scope: &Scope) -> Result<(), StoreError> {
        self.settle_for(scope, &|_| true)
    }

    /// [`settle`](Self::settle) for a read that wants only the messages `wanted` says: it
    /// waits only when the scope has such a message, or a write other than rows, not yet
    /// committed.
    fn settle_for(&self, scope: &Scope, wanted: &dyn Fn(u64) -> bool) -> Result<(), StoreError> {
        let pending = {
            let state = self.shared.lock();
            let ticket =
                state.newest.get(scope).copied().filter(|&ticket| ticket > state.committed);
            ticket.filter(|_| {
                state.uncommitted.get(scope).is_none_or(|writes| {
                    writes.other > 0 || writes.ids.keys().any(|&id| wanted(id))
                })
            })
        };
        if let Some(ticket) = pending {
            self.shared.wait(ticket)?;
        }
        match self.shared.lock().rejected.remove(scope) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Queues `write`, waiting for room first.
    fn enqueue(&self, write: PendingWrite) -> Result<(), StoreError> {
        self.enqueue_owned(write).map_err(|refused| refused.0)
    }

    /// Queues `write`, waiting for room first; handed back when it could not be queued.
    fn enqueue_owned(&self, write: PendingWrite) -> Result<(), Box<(StoreError, PendingWrite)>> {
        let shared = &self.shared;
        let (rows, bytes) = size(&write);
        let mut state = shared.lock();
        let seen_failures = state.failures_total;
        let mut waited = false;
        while !state.stopped && !state.has_room(rows, bytes, &shared.options) {
            if state.failures_total != seen_failures && state.last_failure.is_some() {
                return Err(Box::new((state.failure_error(), write)));
            }
            waited = true;
            state = shared.wait_settled(state);
        }
        if state.stopped {
            return Err(Box::new((StoreError::Stopped { rows: state.rows }, write)));
        }
        state.issued = state.issued.saturating_add(1);
        let ticket = state.issued;
        state.rows = state.rows.saturating_add(rows);
        state.bytes = state.bytes.saturating_add(bytes);
        let (queued_rows, queued_bytes) = (state.rows, state.bytes);
        let stats = &mut state.stats;
        stats.submissions = stats.submissions.saturating_add(1);
        stats.waited_for_room = stats.waited_for_room.saturating_add(u64::from(waited));
        stats.peak_queued_rows = stats.peak_queued_rows.max(queued_rows);
        stats.peak_queued_bytes = stats.peak_queued_bytes.max(queued_bytes);
        match state.newest.get_mut(&write.scope) {
            Some(newest) => *newest = ticket,
            None => {
                state.newest.insert(write.scope.clone(), ticket);
            }
        }
        state.track(&write, true);
        state.queue.push_back(Job { ticket, write, rows, bytes });
        shared.work.notify_one();
        Ok(())
    }
}

impl<S: ArchiveStore + 'static> Drop for Deferred<S> {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.work.notify_all();
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("deferred writer: the writer thread panicked");
        }
    }
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
        if !batch.is_empty() && rows.saturating_add(job.rows.max(1)) > max_rows {
            break;
        }
        rows = rows.saturating_add(job.rows);
        if let Some(job) = queue.pop_front() {
            batch.push(job);
        }
    }
    batch
}

/// The next batch to write, waiting for one; `None` once closing with nothing queued.
fn next_batch(shared: &Shared) -> Option<Vec<Job>> {
    let mut state = shared.lock();
    while state.queue.is_empty() && !state.closing {
        state = shared.work.wait(state).unwrap_or_else(PoisonError::into_inner);
    }
    if state.queue.is_empty() {
        return None;
    }
    let max_rows = if state.isolate { 1 } else { shared.options.max_batch_rows };
    Some(take_batch(&mut state.queue, max_rows))
}

/// Records a committed batch.
fn committed(shared: &Shared, batch: &[Job]) {
    let mut state = shared.lock();
    let rows: usize = batch.iter().map(|job| job.rows).sum();
    let bytes: usize = batch.iter().map(|job| job.bytes).sum();
    state.rows = state.rows.saturating_sub(rows);
    state.bytes = state.bytes.saturating_sub(bytes);
    for job in batch {
        if state.newest.get(&job.write.scope) == Some(&job.ticket) {
            state.newest.remove(&job.write.scope);
        }
        state.track(&job.write, false);
    }
    if let Some(last) = batch.last() {
        state.committed = state.committed.max(last.ticket);
    }
    state.stats.transactions = state.stats.transactions.saturating_add(1);
    state.stats.rows_committed = state.stats.rows_committed.saturating_add(rows as u64);
    state.failures_in_row = 0;
    state.last_failure = None;
    state.isolate = false;
    drop(state);
    shared.settled.notify_all();
}

/// Whether trying `error`'s write again cannot succeed (a fence another writer has passed).
fn is_permanent(error: &StoreError) -> bool {
    matches!(error.kind(), ErrorKind::Fenced | ErrorKind::Invalid)
}

/// A batch refused for good: a single write is dropped and reported to its scope; a larger
/// batch is queued again, to be written one write at a time until the culprit is found.
fn refused(shared: &Shared, mut batch: Vec<Job>, error: StoreError) {
    let mut state = shared.lock();
    if batch.len() == 1
        && let Some(job) = batch.pop()
    {
        tracing::error!(%error, scope = %job.write.scope, "deferred writer: a write was refused for good and dropped");
        state.rows = state.rows.saturating_sub(job.rows);
        state.bytes = state.bytes.saturating_sub(job.bytes);
        if state.newest.get(&job.write.scope) == Some(&job.ticket) {
            state.newest.remove(&job.write.scope);
        }
        state.committed = state.committed.max(job.ticket);
        state.track(&job.write, false);
        state.rejected.insert(job.write.scope, error);
    } else {
        state.isolate = true;
        for job in batch.into_iter().rev() {
            state.queue.push_front(job);
        }
    }
    drop(state);
    shared.settled.notify_all();
}

/// Records a failed batch (queued again at the head); whether the thread gives up.
fn failed(shared: &Shared, batch: Vec<Job>, error: &StoreError) -> bool {
    let mut state = shared.lock();
    state.failures_in_row = state.failures_in_row.saturating_add(1);
    state.failures_total = state.failures_total.saturating_add(1);
    state.stats.failed_attempts = state.stats.failed_attempts.saturating_add(1);
    state.last_failure = Some(Failure { reason: error.to_string(), kind: error.kind() });
    for job in batch.into_iter().rev() {
        state.queue.push_front(job);
    }
    tracing::warn!(
        %error,
        rows = state.rows,
        failures = state.failures_in_row,
        "deferred writer: write failed; kept and retried"
    );
    let give_up =
        state.closing && state.failures_in_row >= u64::from(shared.options.close_attempts);
    if give_up {
        tracing::error!(rows = state.rows, %error, "deferred writer: closing after repeated failures; queued rows were not written");
    }
    drop(state);
    shared.settled.notify_all();
    give_up
}

/// Raises the calling thread's nice value by `by` (Linux: nice is per thread).
#[cfg(target_os = "linux")]
fn yield_cpu(by: u8) {
    if by == 0 {
        return;
    }
    let thread = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(thread)).unwrap_or(0);
    if let Err(error) = rustix::process::setpriority_process(Some(thread), now + i32::from(by)) {
        tracing::debug!(%error, "deferred writer: nice value not raised");
    }
}

#[cfg(not(target_os = "linux"))]
fn yield_cpu(_by: u8) {}

/// The writer thread: takes what is queued, writes it in one batch, repeats.
fn run(shared: &Shared, inner: &dyn ArchiveStore) {
    let _stop = StopGuard(shared);
    let options = shared.options;
    let mut pause = options.retry_min;
    while let Some(batch) = next_batch(shared) {
        let writes: Vec<Write<'_>> = batch.iter().map(|job| job.write.as_write()).collect();
        let started = Instant::now();
        let result = inner.write(&writes);
        let took = started.elapsed();
        drop(writes);
        {
            let mut state = shared.lock();
            state.stats.write_time = state.stats.write_time.saturating_add(took);
            state.stats.longest_write = state.stats.longest_write.max(took);
        }
        match result {
            Ok(()) => {
                committed(shared, &batch);
                pause = options.retry_min;
            }
            Err(error) if is_permanent(&error) => refused(shared, batch, error),
            Err(error) => {
                if failed(shared, batch, &error) {
                    return;
                }
                std::thread::sleep(pause);
                pause = pause.saturating_mul(2).min(options.retry_max);
            }
        }
    }
}

impl<S: ArchiveStore + 'static> ArchiveStore for Deferred<S> {
    fn write(&self, writes: &[Write<'_>]) -> Result<(), StoreError> {
        writes.iter().try_for_each(check)?;
        for write in writes {
            self.enqueue(write.to_pending())?;
        }
        Ok(())
    }

    /// Queues the writes themselves (no copy); those not queued (a failure while waiting for
    /// room) come back.
    fn write_owned(&self, writes: Vec<PendingWrite>) -> Result<(), Unwritten> {
        if let Err(error) = writes.iter().try_for_each(|write| check(&write.as_write())) {
            return Err(Unwritten { error, writes });
        }
        let mut rest = writes.into_iter();
        while let Some(write) = rest.next() {
            if let Err(refused) = self.enqueue_owned(write) {
                let (error, write) = *refused;
                let writes = std::iter::once(write).chain(rest).collect();
                return Err(Unwritten { error, writes });
            }
        }
        Ok(())
    }

    /// Waits only for the writes of the rows asked for.
    fn get_many(&self, scope: &Scope, ids: &[u64]) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.settle_for(scope, &|id| ids.contains(&id))?;
        self.inner.get_many(scope, ids)
    }

    fn get(&self, scope: &Scope, id: u64) -> Result<Option<ArchivedMessage>, StoreError> {
        self.settle_for(scope, &|written| written == id)?;
        self.inner.get(scope, id)
    }

    fn rows_after(
        &self,
        scope: &Scope,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.settle(scope)?;
        self.inner.rows_after(scope, after, limit)
    }

    fn max_id(&self, scope: &Scope) -> Result<Option<u64>, StoreError> {
        self.settle(scope)?;
        self.inner.max_id(scope)
    }

    fn search(&self, scope: &Scope, query: &SearchQuery<'_>) -> Result<Vec<SearchHit>, StoreError> {
        self.settle(scope)?;
        self.inner.search(scope, query)
    }

    /// Waits only for the writes of messages not `held`.
    fn search_beyond(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
        held: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<SearchHit>, StoreError> {
        self.settle_for(scope, &|id| !held(id))?;
        self.inner.search(scope, query)
    }

    fn summary(&self, scope: &Scope, id: u64) -> Result<Option<SummaryRecord>, StoreError> {
        self.settle(scope)?;
        self.inner.summary(scope, id)
    }

    fn search_summaries(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        // Summaries only: rows being written are not waited for.
        self.settle_for(scope, &|_| false)?;
        self.inner.search_summaries(scope, query)
    }

    fn drill_down(&self, scope: &Scope, id: u64) -> Result<Vec<ArchivedMessage>, StoreError> {
        self.settle(scope)?;
        self.inner.drill_down(scope, id)
    }

    fn put_vectors(
        &self,
        scope: &Scope,
        fence: Fence,
        model: &str,
        vectors: &[(u64, Vec<f32>)],
    ) -> Result<(), StoreError> {
        self.settle(scope)?;
        self.inner.put_vectors(scope, fence, model, vectors)
    }

    fn vectors(
        &self,
        scope: &Scope,
        model: &str,
        after: u64,
    ) -> Result<Vec<VectorRow>, StoreError> {
        self.settle(scope)?;
        self.inner.vectors(scope, model, after)
    }

    fn metrics(&self, scope: &Scope) -> Result<MetricsSummary, StoreError> {
        self.settle(scope)?;
        self.inner.metrics(scope)
    }

    fn usage(&self, scope: &Scope) -> Result<Usage, StoreError> {
        self.settle(scope)?;
        self.inner.usage(scope)
    }

    fn forget(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.settle(scope)?;
        self.inner.forget(scope, fence, what)
    }

    fn delete_from(&self, scope: &Scope, fence: Fence, first: u64) -> Result<u64, StoreError> {
        self.settle(scope)?;
        self.inner.delete_from(scope, fence, first)
    }

    fn delete_conversation(&self, scope: &Scope, fence: Fence) -> Result<u64, StoreError> {
        self.settle(scope)?;
        self.inner.delete_conversation(scope, fence)
    }

    fn conversations(&self, tenant: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.flush_all()?;
        self.inner.conversations(tenant, prefix)
    }

    fn identity(&self) -> Result<String, StoreError> {
        self.inner.identity()
    }

    fn acquire(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.inner.acquire(scope)
    }

    fn current_fence(&self, scope: &Scope) -> Result<Fence, StoreError> {
        self.inner.current_fence(scope)
    }

    fn acquire_if_overtaken(
        &self,
        scope: &Scope,
        held: Fence,
    ) -> Result<Option<Fence>, StoreError> {
        self.inner.acquire_if_overtaken(scope, held)
    }

    fn flush(&self, scope: &Scope) -> Result<(), StoreError> {
        self.settle(scope)?;
        self.inner.flush(scope)
    }
}

#[cfg(test)]
mod tests;
