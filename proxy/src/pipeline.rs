//! A managed request (`POST /v1/chat/completions`, `POST /v1/messages`) as short steps: parse
//! the body, name its conversation, take its new messages into the conversation (following
//! branches when its history diverges) and compose the payload, forward it, answer.
//!
//! Authentication, the body limit and the request's metrics are layers around this
//! ([`crate::middleware`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use crate::app::{App, Guard};
use crate::conv::{Composed, Conv, ConvError, Ingest};
use crate::errors::Failure;
use crate::keys::{branch_key, conversation_key, tenant};
use crate::recall;
use crate::respond::{self, release};
use crate::upstream;
use crate::wire::{self, Provider, Request};

/// Branches a request may follow before it is refused: one hop per place its history was
/// edited ([`branch_key`]), so only a history edited in more places than this is.
const MAX_HOPS: usize = 256;

/// Answers a managed request of `provider`: the upstream's answer, or the failure in the
/// provider's error format. Its `query` string (`api-version=…`) is forwarded as it came.
pub async fn managed(
    app: Arc<App>,
    provider: Provider,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
) -> Response {
    match handle(&app, provider, &headers, query.as_deref(), &body).await {
        Ok(response) => response,
        Err(failure) => {
            if failure.status.is_server_error() {
                tracing::warn!(endpoint = provider.as_str(), status = failure.status.as_u16(), reason = %failure.message, "proxy: request failed");
            }
            failure.respond(Some(provider))
        }
    }
}

async fn handle(
    app: &Arc<App>,
    provider: Provider,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
) -> Result<Response, Failure> {
    let bad_request = |e: wire::BadRequest| Failure::new(StatusCode::BAD_REQUEST, e.0);
    let tenant_header = app.config.tenant_header.as_deref();
    let request = app
        .parsed
        .parse(&tenant(&app.keys, tenant_header, headers), provider, body)
        .map_err(bad_request)?;
    let key = conversation_key(&app.keys, tenant_header, headers, &request, provider)
        .map_err(bad_request)?;
    let at_ms = request_time(app, headers);
    let (guard, composed) = take(app, key, provider, request, at_ms).await?;
    count(app, &composed);
    let path = match provider {
        Provider::OpenAi => "/v1/chat/completions",
        Provider::Anthropic => "/v1/messages",
    };
    let url = match query {
        Some(query) => app.config.upstream_url(&format!("{path}?{query}")),
        None => app.config.upstream_url(path),
    };
    let sent_tokens = composed.tokens;
    let sent_at = Instant::now();
    let body = Bytes::from(composed.body);
    match upstream::post_json(&app.client, &app.config, &url, headers, body.clone()).await {
        Ok(answer) if composed.recall => {
            let (tokens, room, at) = (sent_tokens, composed.room, sent_at);
            let sent = recall::Sent { url: &url, headers, body, tokens, room, at };
            recall::answer(app, provider, guard, answer, sent).await
        }
        Ok(answer) => respond::answer(app, provider, guard, answer, sent_tokens, sent_at).await,
        Err(failure) => {
            release(app.clone(), guard);
            Err(failure.waited(sent_at.elapsed()))
        }
    }
}

/// Counts a composed payload in the metrics.
fn count(app: &App, composed: &Composed) {
    app.metrics.managed.fetch_add(1, Relaxed);
    app.metrics.tokens_sent.fetch_add(u64::from(composed.tokens), Relaxed);
    app.metrics.compactions.fetch_add(composed.evicted as u64, Relaxed);
    if composed.cache_stable {
        app.metrics.cache_stable.fetch_add(1, Relaxed);
    }
    for &ratio in &composed.tasks_finished {
        app.metrics.task_finished(ratio);
    }
}

/// Takes the request into conversation `key` and composes its payload; a history that
/// diverges from the conversation goes on to the branch for what it has there
/// ([`branch_key`]). Returns the locked
/// conversation (released once the answer is recorded) and the payload.
async fn take(
    app: &Arc<App>,
    mut key: String,
    provider: Provider,
    request: Arc<Request>,
    at_ms: u64,
) -> Result<(Guard, Composed), Failure> {
    let hashes: Arc<[u64]> = request.item_hashes().into();
    let bad = |e: wire::BadRequest| Failure::new(StatusCode::BAD_REQUEST, e.0);
    for hop in 0..=MAX_HOPS {
        let mut guard = app.lock(&key, provider, &request.model).await?;
        if let Some(conv) = guard.as_mut() {
            conv.set_request_time(at_ms);
        }
        let (guard, step) = take_once(app, guard, &request, &hashes).await?;
        match step {
            Ok(Step::Composed(composed, tokens_in)) => {
                app.metrics.tokens_in.fetch_add(tokens_in, Relaxed);
                return Ok((guard, composed));
            }
            Ok(Step::Diverged(_)) if hop == MAX_HOPS => break,
            Ok(Step::Diverged(at)) => {
                drop(guard);
                let next = match request.items.get(at) {
                    Some(_) => Some(wire::analyze_item(provider, &request, at).map_err(bad)?.fp),
                    None => None,
                };
                let branch = branch_key(&key, at, next);
                tracing::info!(session = %key, branch = %branch, at, "proxy: history diverges; using a branch");
                app.metrics.branches.fetch_add(1, Relaxed);
                key = branch;
            }
            Err(error) => {
                let failure = Failure::from(&error);
                release(app.clone(), guard);
                return Err(failure);
            }
        }
    }
    Err(Failure::new(
        StatusCode::BAD_REQUEST,
        format!("this history was edited in more than {MAX_HOPS} places: start a new conversation"),
    ))
}

/// The request's time by its `[proxy] clock_header` (ms since the Unix epoch); 0 (the wall
/// clock) without one, or when it does not read as a number.
fn request_time(app: &App, headers: &HeaderMap) -> u64 {
    let header = app.config.clock_header.as_deref();
    let value = header.and_then(|name| headers.get(name)).and_then(|v| v.to_str().ok());
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// New request bytes up to which a request the session serves from memory is taken on the
/// async thread. Ingesting costs some nanoseconds per byte (read, counted, hashed, queued):
/// a catch-up request bringing megabytes of new tool output would hold an async thread for
/// tens of milliseconds, and every connection queued on it would wait, where the blocking
/// pool's threads are preempted by the kernel as any other.
const INLINE_NEW_BYTES: usize = 64 << 10;

/// One conversation's try at the request. A request the session serves from memory with
/// little new in it takes tens of microseconds: it runs here, as a hop to the blocking pool
/// (a permit, a thread woken and switched to) would cost more than it and queue behind other
/// conversations' disk work.
async fn take_once(
    app: &App,
    mut guard: Guard,
    request: &Arc<Request>,
    hashes: &Arc<[u64]>,
) -> Result<(Guard, Result<Step, ConvError>), Failure> {
    let inline = guard.as_ref().is_some_and(|conv| {
        conv.request_in_memory() && conv.new_bytes(request) <= INLINE_NEW_BYTES
    });
    let (guard, progress) = if inline {
        let progress = take_request(&mut guard, request, hashes, true);
        (guard, progress)
    } else {
        let (req, hashes) = (request.clone(), hashes.clone());
        app.on_pool(guard, move |guard| take_request(guard, &req, &hashes, false)).await?
    };
    match progress {
        Ok(Progress::Done(step)) => Ok((guard, Ok(step))),
        // The payload needs the archive (a new retrieved block) or the writer is far behind.
        Ok(Progress::Taken { tokens_in, evicted }) => {
            let req = request.clone();
            app.on_pool(guard, move |guard| compose(guard, &req, tokens_in, evicted)).await
        }
        Err(error) => Ok((guard, Err(error))),
    }
}

enum Step {
    Diverged(usize),
    Composed(Composed, u64),
}

/// How far [`take_request`] went.
enum Progress {
    Done(Step),
    /// The request's messages were taken and its payload is still to compose (off the async
    /// threads): `tokens_in` and the units `evicted` so far.
    Taken {
        tokens_in: u64,
        evicted: usize,
    },
}

/// Times a request is redone on the state another instance of a fleet left, when one took
/// the conversation while this one was taking the request (each time), before the error is
/// returned.
const REDO: usize = 4;

/// Takes the request's new messages and composes its payload. `inline` (on an async thread):
/// stops with [`Progress::Taken`] after taking them when the rest would wait for the disk (a
/// writer far behind), or when composing needs an archive search (a new retrieved block,
/// [`Conv::compose_in_memory`]).
///
/// In a fleet the conversation first catches up with what other instances wrote, unless its
/// first write proves the lease ([`Conv::lease_proved_by_writes`]); when one takes it
/// midway, the request is redone whole on the new state, where what this one wrote already
/// is known ([`Conv::catch_up`]).
fn take_request(
    guard: &mut Guard,
    request: &Request,
    hashes: &[u64],
    inline: bool,
) -> Result<Progress, ConvError> {
    let mut redone = 0;
    loop {
        let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
        let unchecked = redone == 0 && conv.lease_proved_by_writes();
        if !unchecked {
            conv.catch_up()?;
        }
        let written = conv.writes();
        let attempt = take_attempt(guard, request, hashes, inline);
        let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
        match attempt {
            // Nothing written proved the lease: read it now, and redo what was done on a
            // state another instance has moved past.
            Ok(_) if unchecked && conv.writes() == written && conv.catch_up()? => {
                redone += 1;
                tracing::info!(
                    redone,
                    "proxy: another instance took the conversation; redoing the request on its state"
                );
            }
            Err(error) if error.is_overtaken() && redone < REDO => {
                conv.overtaken();
                redone += 1;
                tracing::info!(%error, redone, "proxy: another instance took the conversation; redoing the request on its state");
            }
            done => return done,
        }
    }
}

/// One try of [`take_request`].
fn take_attempt(
    guard: &mut Guard,
    request: &Request,
    hashes: &[u64],
    inline: bool,
) -> Result<Progress, ConvError> {
    let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
    match conv.ingest(request, hashes)? {
        Ingest::Diverged(at) => Ok(Progress::Done(Step::Diverged(at))),
        Ingest::Extended { tokens_in, evicted, .. } if inline && !conv.request_in_memory() => {
            Ok(Progress::Taken { tokens_in, evicted })
        }
        Ingest::Extended { tokens_in, evicted, .. } if inline => {
            match conv.compose_in_memory(request)? {
                Some(composed) => {
                    Ok(Progress::Done(measured(conv, request, composed, tokens_in, evicted)))
                }
                None => Ok(Progress::Taken { tokens_in, evicted }),
            }
        }
        Ingest::Extended { tokens_in, evicted, .. } => {
            compose(guard, request, tokens_in, evicted).map(Progress::Done)
        }
    }
}

/// A composed payload measured for the conversation's bill ([`Conv::measure`]), with the
/// units its request's pushes `evicted`.
fn measured(
    conv: &mut Conv,
    request: &Request,
    mut composed: Composed,
    tokens_in: u64,
    evicted: usize,
) -> Step {
    conv.measure(request, &composed);
    composed.evicted += evicted;
    Step::Composed(composed, tokens_in)
}

/// Composes the payload of a request whose messages were taken, measured for the
/// conversation's bill ([`Conv::measure`]).
fn compose(
    guard: &mut Guard,
    request: &Request,
    tokens_in: u64,
    evicted: usize,
) -> Result<Step, ConvError> {
    let conv = guard.as_mut().ok_or(ConvError::Unloaded)?;
    let composed = conv.compose(request)?;
    Ok(measured(conv, request, composed, tokens_in, evicted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::Mutex as AsyncMutex;

    #[test]
    fn the_request_that_first_evicts_composes_off_the_async_thread() {
        let dir = tempfile::tempdir().unwrap();
        let stores = crate::conv::prepare_state(dir.path(), false).unwrap();
        let conv = Conv::create(
            dir.path(),
            &stores,
            "t",
            Provider::OpenAi,
            &crate::conv::tests::retrieving(20_000, 256),
        )
        .unwrap();
        let mut guard = Arc::new(AsyncMutex::new(Some(conv))).try_lock_owned().unwrap();
        let mut messages = vec![json!({"role": "user", "content": "Staging runs Postgres 16."})];
        for n in 0..200 {
            assert!(guard.as_ref().unwrap().request_in_memory(), "turn {n}");
            let body = json!({"model": "m", "messages": messages}).to_string();
            let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
            let hashes = request.item_hashes().to_vec();
            match take_request(&mut guard, &request, &hashes, true).unwrap() {
                Progress::Done(Step::Composed(..)) => {}
                Progress::Done(Step::Diverged(at)) => panic!("diverged at {at}"),
                Progress::Taken { evicted, .. } => {
                    let Step::Composed(composed, _) =
                        compose(&mut guard, &request, 0, evicted).unwrap()
                    else {
                        panic!("not composed")
                    };
                    assert!(composed.evicted > 0, "a compaction retrieves");
                    assert!(String::from_utf8(composed.body).unwrap().contains("Postgres 16"));
                    // The next request, without a compaction, reuses the block on the async
                    // thread.
                    messages.push(json!({"role": "assistant", "content": "Postgres 16."}));
                    messages.push(json!({"role": "user", "content": "Thanks."}));
                    let body = json!({"model": "m", "messages": messages}).to_string();
                    let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
                    let hashes = request.item_hashes().to_vec();
                    let searches = guard.as_ref().unwrap().session().archive_searches();
                    let progress = take_request(&mut guard, &request, &hashes, true).unwrap();
                    let composed = match progress {
                        Progress::Done(Step::Composed(composed, _)) => composed,
                        Progress::Taken { evicted, .. } => panic!("not composed inline: {evicted}"),
                        Progress::Done(_) => panic!("not composed"),
                    };
                    assert_eq!(composed.evicted, 0);
                    assert!(String::from_utf8(composed.body).unwrap().contains("Postgres 16"));
                    assert_eq!(guard.as_ref().unwrap().session().archive_searches(), searches);
                    return;
                }
            }
            // Long enough replies that a 20,000-token window (a large room) compacts.
            let filler = "The nightly job runs the integration suite, then the linters. ".repeat(8);
            messages.push(json!({"role": "assistant", "content": format!("Reply {n}: three pull requests are open and one job fails. {filler}")}));
            messages.push(json!({"role": "user", "content": format!("Turn {n}: which Postgres version runs on staging, and who owns the failing job?")}));
        }
        panic!("nothing was evicted in 200 turns");
    }

    /// A conversation of a fleet, on `stores`, whose requests go through [`take_request`] as
    /// an instance's do; the body it forwards, or where the request diverged.
    struct Instance(Guard);

    impl Instance {
        fn open(stores: &crate::conv::Stores) -> Self {
            let settings = crate::conv::ConvSettings::new(32_768, 1_024);
            let dir = std::path::Path::new("unused");
            let conv = Conv::open(dir, stores, "k", Provider::OpenAi, &settings).unwrap();
            Self(Arc::new(AsyncMutex::new(Some(conv))).try_lock_owned().unwrap())
        }

        fn take(&mut self, messages: &[serde_json::Value]) -> Result<String, usize> {
            let body = json!({"model": "m", "messages": messages}).to_string();
            let request = Request::parse(Provider::OpenAi, body.as_bytes()).unwrap();
            let hashes = request.item_hashes().to_vec();
            match take_request(&mut self.0, &request, &hashes, false).unwrap() {
                Progress::Done(Step::Composed(composed, _)) => {
                    Ok(String::from_utf8(composed.body).unwrap())
                }
                Progress::Done(Step::Diverged(at)) => Err(at),
                Progress::Taken { .. } => panic!("composed on the pool"),
            }
        }

        fn conv(&self) -> &Conv {
            self.0.as_ref().unwrap()
        }
    }

    /// A conversation kept on one instance takes its requests without reading the lease
    /// first (its writes prove it); once another instance served it, a write refused as
    /// stale redoes the request on the reloaded state, the lease is read first until two
    /// reads find the conversation still here, and a request that writes nothing reads the
    /// lease after it: the payloads, the rows and a rewind found are one instance's.
    #[test]
    fn a_fleet_request_whose_writes_prove_the_lease_reads_it_only_when_overtaken() {
        use ctxwin_std::store::{MemoryStore, Ports};
        let fleet = || {
            let store = Arc::new(MemoryStore::new());
            crate::conv::Stores::Fleet(Ports { archive: store.clone(), checkpoints: store })
        };
        let (shared, alone) = (fleet(), fleet());
        let (mut a, mut single) = (Instance::open(&shared), Instance::open(&alone));
        let mut messages = vec![json!({"role": "user", "content": "Which port does staging use?"})];
        let mut requests = Vec::new();
        for turn in 0..8 {
            requests.push(messages.clone());
            messages.push(json!({"role": "assistant", "content": format!("Answer {turn}.")}));
            messages.push(json!({"role": "user", "content": format!("Question {}?", turn + 1)}));
        }
        for request in &requests[..3] {
            assert_eq!(a.take(request), single.take(request));
        }
        assert!(a.conv().lease_proved_by_writes(), "new here, kept here");
        assert_eq!(a.conv().session().counters().reloads, 0);
        // Another instance opens the conversation (taking its lease: it was served before,
        // so it reads the lease first) and serves the next request; `a`'s first write is
        // refused as stale, and the request redone on the reloaded state.
        let mut b = Instance::open(&shared);
        assert!(!b.conv().lease_proved_by_writes());
        assert_eq!(b.take(&requests[3]), single.take(&requests[3]));
        assert_eq!(a.take(&requests[4]), single.take(&requests[4]));
        assert_eq!(a.conv().session().counters().reloads, 1);
        assert!(!a.conv().lease_proved_by_writes(), "it moved: the lease is read first");
        for request in &requests[5..7] {
            assert_eq!(a.take(request), single.take(request));
        }
        assert!(a.conv().lease_proved_by_writes(), "two reads found it here");
        assert_eq!(b.take(&requests[7]), single.take(&requests[7]));
        // `a` gets a request bringing nothing new to its state (a rewind to what it served):
        // nothing written proves the lease, so it reads it after, reloads and finds the
        // rewind one instance finds.
        let rewound = single.take(&requests[6]);
        assert!(rewound.is_err(), "{rewound:?}");
        assert_eq!(a.take(&requests[6]), rewound);
        assert_eq!(a.conv().session().counters().reloads, 2);
        let rows = |stores: &crate::conv::Stores| {
            let crate::conv::Stores::Fleet(ports) = stores else { unreachable!() };
            let scope = ctxwin_std::store::Scope::local("k");
            let rows = ports.archive.rows_after(&scope, 0, 1_000).unwrap();
            rows.iter().map(|r| (r.id, r.full_text().to_string())).collect::<Vec<_>>()
        };
        assert_eq!(rows(&shared), rows(&alone), "each message once, in order");
    }
}
