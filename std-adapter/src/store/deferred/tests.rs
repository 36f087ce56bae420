use super::*;
use crate::message::ChatMessage;
use crate::store::{Faulty, MemoryStore, conformance};
use ctxwin_core::Role;

fn row(id: u64, text: &str) -> ArchivedMessage {
    ArchivedMessage::new(id, id, ChatMessage::text(Role::User, text)).with_timestamp(id)
}

/// Request `request` of a conversation: a question, an answer, and an update of the previous
/// request's answer (an upsert of an id written before: only the last text may remain).
fn rows_of(conversation: usize, request: u64) -> Vec<ArchivedMessage> {
    let id = request * 2 + 1;
    vec![
        row(id, &format!("s{conversation} r{request} question")),
        row(id + 1, &format!("s{conversation} r{request} answer")),
        row(id.saturating_sub(1).max(1), &format!("s{conversation} r{request} edit")),
    ]
}

fn fast() -> DeferredOptions {
    DeferredOptions {
        retry_min: Duration::from_millis(2),
        retry_max: Duration::from_millis(20),
        ..DeferredOptions::DEFAULT
    }
}

fn scope(n: usize) -> Scope {
    Scope::local(format!("s{n}"))
}

fn dump(store: &dyn ArchiveStore, scope: &Scope) -> Vec<ArchivedMessage> {
    store.rows_after(scope, 0, usize::MAX).unwrap()
}

type Held = Deferred<Faulty<MemoryStore>>;

fn faulty(options: DeferredOptions) -> Arc<Held> {
    Arc::new(Deferred::spawn_with(Faulty::new(MemoryStore::new()), options).unwrap())
}

#[test]
fn passes_the_archive_conformance_suite() {
    conformance::archive(&|| Arc::new(Deferred::spawn_with(MemoryStore::new(), fast()).unwrap()));
}

#[test]
fn many_conversations_from_many_threads_land_once_and_in_order() {
    let direct = Arc::new(MemoryStore::new());
    let deferred = faulty(fast());
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let (direct, deferred) = (direct.clone(), deferred.clone());
            std::thread::spawn(move || {
                for request in 0..25 {
                    for conversation in (thread * 10)..(thread * 10 + 10) {
                        let rows = rows_of(conversation, request);
                        direct.put(&scope(conversation), Fence::NONE, &rows).unwrap();
                        deferred.put(&scope(conversation), Fence::NONE, &rows).unwrap();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    deferred.flush_all().unwrap();
    for conversation in 0..40 {
        let expected = dump(direct.as_ref(), &scope(conversation));
        assert_eq!(expected.len(), 50);
        assert_eq!(dump(deferred.as_ref(), &scope(conversation)), expected);
    }
    let stats = deferred.stats();
    assert_eq!(stats.rows_committed, 40 * 25 * 3);
    assert_eq!(stats.queued_rows, 0);
    assert!(stats.transactions < stats.submissions, "{stats:?}");
}

#[test]
fn everything_queued_meanwhile_is_one_transaction() {
    let deferred = faulty(DeferredOptions { max_batch_rows: 1_000, ..fast() });
    let hold = deferred.inner().faults().hold();
    for conversation in 0..100 {
        deferred.put(&scope(conversation), Fence::NONE, &rows_of(conversation, 0)).unwrap();
    }
    drop(hold);
    deferred.flush_all().unwrap();
    let stats = deferred.stats();
    assert_eq!((stats.submissions, stats.rows_committed), (100, 300));
    // The first write may have been taken alone before the rest were queued.
    assert!(stats.transactions <= 2, "{stats:?}");
}

#[test]
fn a_failed_write_keeps_the_rows_and_a_later_flush_succeeds() {
    let deferred = faulty(fast());
    deferred.inner().faults().fail_writes("injected failure");
    deferred.put(&scope(0), Fence::NONE, &rows_of(0, 0)).unwrap();
    deferred.put(&scope(1), Fence::NONE, &rows_of(1, 0)).unwrap();
    let error = deferred.flush(&scope(1)).unwrap_err();
    match &error {
        StoreError::Deferred { reason, queued_rows, failures, cause } => {
            assert!(reason.contains("injected failure"), "{reason}");
            assert!(*failures >= 1);
            assert_eq!((*queued_rows, *cause), (6, ErrorKind::Io));
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(error.to_string().contains("retried"), "{error}");
    deferred.inner().faults().heal();
    deferred.flush(&scope(1)).unwrap();
    assert_eq!(dump(deferred.as_ref(), &scope(0)).len(), 2);
    assert_eq!(dump(deferred.as_ref(), &scope(1)).len(), 2);
    let stats = deferred.stats();
    assert!(stats.failed_attempts >= 1 && stats.queued_rows == 0, "{stats:?}");
}

#[test]
fn a_write_waits_for_room_and_never_passes_the_bound() {
    let deferred = faulty(DeferredOptions { max_batch_rows: 6, max_queued_rows: 12, ..fast() });
    let hold = deferred.inner().faults().hold();
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let producer = {
        let (deferred, written) = (deferred.clone(), written.clone());
        std::thread::spawn(move || {
            for request in 0..20 {
                deferred.put(&scope(0), Fence::NONE, &rows_of(0, request)).unwrap();
                written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    // 12 rows fit: four writes of three (the first may be in the writer's hands).
    let stuck = written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(stuck <= 5, "{stuck} writes passed a 12-row bound");
    assert!(deferred.stats().queued_rows <= 12);
    drop(hold);
    producer.join().unwrap();
    deferred.flush_all().unwrap();
    let stats = deferred.stats();
    assert!(stats.peak_queued_rows <= 12, "{stats:?}");
    assert!(stats.waited_for_room > 0, "{stats:?}");
    assert_eq!(stats.rows_committed, 60);
    assert_eq!(dump(deferred.as_ref(), &scope(0)).len(), 40);
}

#[test]
fn a_write_waiting_for_room_fails_when_a_write_fails_and_queues_nothing() {
    let deferred = faulty(DeferredOptions { max_batch_rows: 3, max_queued_rows: 3, ..fast() });
    deferred.inner().faults().fail_writes("injected failure");
    deferred.put(&scope(0), Fence::NONE, &rows_of(0, 0)).unwrap();
    let refused = deferred.put(&scope(0), Fence::NONE, &rows_of(0, 1)).unwrap_err();
    assert!(matches!(refused, StoreError::Deferred { .. }), "{refused:?}");
    deferred.inner().faults().heal();
    deferred.flush(&scope(0)).unwrap();
    assert_eq!(dump(deferred.as_ref(), &scope(0)).len(), 2);
    let stats = deferred.stats();
    assert!(stats.longest_write > Duration::ZERO && stats.write_time >= stats.longest_write);
}

#[test]
fn a_bad_row_is_refused_and_nothing_of_it_queued() {
    let deferred = faulty(fast());
    let bad = row(1, "x").with_timestamp(u64::MAX);
    let refused = deferred.put(&scope(0), Fence::NONE, &[row(2, "y"), bad]).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Invalid);
    deferred.flush_all().unwrap();
    assert_eq!(deferred.stats().submissions, 0);
    assert!(dump(deferred.as_ref(), &scope(0)).is_empty());
}

#[test]
fn a_stale_fence_is_dropped_and_reported_to_its_scope_alone() {
    let deferred = Arc::new(Deferred::spawn_with(MemoryStore::new(), fast()).unwrap());
    let (mine, other) = (scope(0), scope(1));
    let old = deferred.acquire(&mine).unwrap();
    deferred.acquire(&mine).unwrap();
    let hold_rows = rows_of(1, 0);
    deferred.put(&other, Fence::NONE, &hold_rows).unwrap();
    deferred.put(&mine, old, &rows_of(0, 0)).unwrap();
    deferred.put(&other, Fence::NONE, &rows_of(1, 1)).unwrap();
    assert_eq!(deferred.flush(&mine).unwrap_err().kind(), ErrorKind::Fenced);
    deferred.flush(&mine).unwrap();
    deferred.flush(&other).unwrap();
    assert!(dump(deferred.as_ref(), &mine).is_empty());
    assert_eq!(dump(deferred.as_ref(), &other).len(), 4);
}

#[test]
#[cfg(feature = "sqlite")]
fn dropping_it_writes_what_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let archive = crate::store::sqlite::SqliteArchive::open(&path).unwrap();
    let deferred = Deferred::spawn_with(Faulty::new(archive.clone()), fast()).unwrap();
    let hold = deferred.inner().faults().hold();
    for conversation in 0..10 {
        deferred.put(&scope(conversation), Fence::NONE, &rows_of(conversation, 0)).unwrap();
    }
    let dropping = std::thread::spawn(move || drop(deferred));
    std::thread::sleep(Duration::from_millis(20));
    drop(hold);
    dropping.join().unwrap();
    drop(archive);
    let reopened = crate::store::sqlite::SqliteArchive::open(&path).unwrap();
    assert_eq!(reopened.stats().unwrap().messages, 20);
}

#[test]
fn a_writer_that_cannot_write_at_close_gives_up_and_stops() {
    let faulty = Faulty::new(MemoryStore::new());
    faulty.faults().fail_writes("always");
    let options = DeferredOptions { close_attempts: 2, ..fast() };
    let deferred = Deferred::spawn_with(faulty, options).unwrap();
    deferred.put(&scope(0), Fence::NONE, &rows_of(0, 0)).unwrap();
    let started = Instant::now();
    drop(deferred);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn it_is_send_sync_and_debug_is_short() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Deferred<MemoryStore>>();
    let deferred = Deferred::spawn(MemoryStore::new()).unwrap();
    deferred.put(&scope(0), Fence::NONE, &[row(1, &"x".repeat(10_000))]).unwrap();
    let text = format!("{deferred:?}");
    assert!(text.len() < 800 && text.contains("Deferred"), "{text}");
}

/// A read run on a thread of its own, giving ids.
type Read = Box<dyn FnOnce(&Held) -> Vec<u64> + Send>;

#[test]
fn a_read_waits_only_for_the_writes_it_wants() {
    use std::sync::mpsc;
    let deferred = faulty(fast());
    let s = scope(0);
    deferred.put(&s, Fence::NONE, &[row(1, "kennel question"), row(2, "kennel answer")]).unwrap();
    deferred.flush(&s).unwrap();
    let hold = deferred.inner().faults().hold();
    deferred.put(&s, Fence::NONE, &[row(3, "kennel again"), row(4, "kennel reply")]).unwrap();
    let in_thread = |read: Read| {
        let (deferred, (tx, rx)) = (deferred.clone(), mpsc::channel());
        std::thread::spawn(move || tx.send(read(&deferred)).unwrap());
        rx
    };
    let wait = Duration::from_secs(5);
    // Rows committed, rows held by the reader, summaries: answered while 3 and 4 are written.
    let got =
        in_thread(Box::new(|d| d.get(&scope(0), 1).unwrap().into_iter().map(|r| r.id).collect()));
    assert_eq!(got.recv_timeout(wait).unwrap(), [1]);
    let got = in_thread(Box::new(|d| {
        let ids = d.get_many(&scope(0), &[1, 2]).unwrap();
        ids.into_iter().map(|r| r.id).collect()
    }));
    assert_eq!(got.recv_timeout(wait).unwrap(), [1, 2]);
    let got = in_thread(Box::new(|d| {
        let query = SearchQuery::new("kennel", 10);
        let hits = d.search_beyond(&scope(0), &query, &|id| id >= 3).unwrap();
        let mut ids: Vec<u64> = hits.into_iter().map(|h| h.id).collect();
        ids.sort_unstable();
        ids
    }));
    assert_eq!(got.recv_timeout(wait).unwrap(), [1, 2]);
    let got = in_thread(Box::new(|d| {
        d.search_summaries(&scope(0), &SearchQuery::new("kennel", 10)).unwrap();
        Vec::new()
    }));
    assert!(got.recv_timeout(wait).is_ok());
    // A read that wants row 3 waits for it.
    let got = in_thread(Box::new(|d| {
        let hits = d.search(&scope(0), &SearchQuery::new("kennel", 10)).unwrap();
        let mut ids: Vec<u64> = hits.into_iter().map(|h| h.id).collect();
        ids.sort_unstable();
        ids
    }));
    let wanted =
        in_thread(Box::new(|d| d.get(&scope(0), 3).unwrap().into_iter().map(|r| r.id).collect()));
    assert!(got.recv_timeout(Duration::from_millis(200)).is_err(), "did not wait");
    drop(hold);
    assert_eq!(got.recv_timeout(wait).unwrap(), [1, 2, 3, 4]);
    assert_eq!(wanted.recv_timeout(wait).unwrap(), [3]);
}

/// The nice value of the thread `tid` of this process (field 19 of its `stat`).
#[cfg(target_os = "linux")]
fn nice_of(tid: &str) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[16].parse().unwrap()
}

#[cfg(target_os = "linux")]
#[test]
fn the_writer_thread_yields_the_cpu_by_its_nice_value() {
    let own = nice_of(&rustix::thread::gettid().as_raw_nonzero().to_string());
    let writers = || -> Vec<i64> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| {
                let tid = task.ok()?.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                comm.starts_with("ctxwin-deferred").then(|| nice_of(&tid))
            })
            .collect()
    };
    let _deferred =
        Deferred::spawn_with(MemoryStore::new(), DeferredOptions { nice: 7, ..fast() }).unwrap();
    // The thread lowers its own priority as it starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !writers().contains(&(own + 7).min(19)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(writers().contains(&(own + 7).min(19)), "{:?} (own {own})", writers());
}
