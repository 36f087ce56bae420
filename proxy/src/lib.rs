//! ctxwin-proxy: any agent gets a managed context window by changing its base URL.
//!
//! The proxy speaks OpenAI's `POST /v1/chat/completions` and Anthropic's `POST /v1/messages`
//! and passes every other path (`/v1/models`, `/v1/embeddings`, …) through unchanged. Agents
//! resend their whole history on every call; the proxy keeps one [`ctxwin_std::Session`] per
//! conversation, pushes only the messages it has not seen (queued to the archive first),
//! composes the payload for the model's window and forwards that. Every request field other
//! than the messages (`tools`, `tool_choice`, `temperature`, `stream`, `max_tokens`, …)
//! reaches the upstream byte for byte, in its order.
//!
//! # Design
//!
//! * **Tenants and conversations.** A request belongs to a tenant: the credential it carries
//!   (`Authorization`, `x-api-key`, `api-key`), or the header the operator names in
//!   `[proxy] tenant_header`; without either, the one anonymous tenant. Within its tenant it
//!   belongs to the conversation named by `x-ctxwin-session` (its bytes, opaque), or without
//!   it to the canonical form of its system prompt and first user message. Both are
//!   HMAC-SHA-256 under a secret the state directory keeps (`<state_dir>/tenant.key`, created
//!   once, owner-only), full width: the key is `<tenant>.<conversation>`, 64 hex digits each
//!   ([`keys`]). Nothing of a credential or a session id is stored or reaches a path. Each
//!   conversation has a session named by its key in the archive shared by all of them
//!   (`<state_dir>/archive.db`, SQLite in WAL mode) and its checkpoints in
//!   `<state_dir>/<tenant>/<conversation>/checkpoints/`; every query of the archive names the
//!   conversation inside the statement. A message is stored once: its archive row (the core's
//!   text, and the client's raw JSON as [`ArchivedMessage::raw`](ctxwin_std::store::ArchivedMessage::raw)),
//!   plus the checkpoints. Opening a new conversation writes nothing; its directory is written
//!   at its first checkpoint. A conversation whose first life crashed before any checkpoint
//!   continues as a new generation (`<key>#1`), its earlier rows kept under the old name; so
//!   does one whose checkpoints an older proxy wrote (it kept its index of them in
//!   `<state_dir>/proxy.db`, which is no longer read: the proxy names a leftover one in a
//!   warning at start, and it can be deleted).
//! * **Dedupe.** Each conversation records the sequence of message fingerprints its session
//!   holds, in the session's checkpoints ([`Session::set_caller_state`](ctxwin_std::session::Session::set_caller_state)):
//!   a hash of each message's canonical form (role, text,
//!   tool calls with canonical arguments, opaque blocks as canonical JSON without
//!   `cache_control`, which clients move from turn to turn). The longest common prefix of an
//!   incoming history with that sequence is known; the rest is new and is pushed.
//! * **Branches.** A history that differs before the end of the recorded sequence (edited or
//!   rewound) goes to a branch conversation of the same tenant, keyed by a hash of the
//!   parent's key, the index where it leaves it and the fingerprint of its message there (or
//!   its end, for a rewind) ([`keys::branch_key`]); the original is never touched. A resend
//!   of the same edit finds the same branch, and each other edit at that index its own, one
//!   hop away; a history that also differs from its branch goes on to the branch's own
//!   branches, at a later index each time — so a request follows one hop per place its
//!   history was edited, never one per resend (at most 256). A resend of the recorded
//!   history itself (a retry, a regenerate) is no divergence at all (see Answers). One
//!   exception to exact matching: a last recorded message that is an answer an older proxy
//!   assembled itself is matched against the client's copy of it leniently (client libraries
//!   re-serialize answers).
//! * **Opaque blocks, byte-exact.** The core stores text. Images, documents, audio,
//!   thinking and redacted-thinking blocks and server-tool blocks are pushed as a text
//!   rendering whose token cost is the text plus the block's estimate (images from their
//!   declared size by the provider's published formula, documents and audio by size); each
//!   message's original JSON is in the archive row of its first part. When
//!   composing, the session says where each message of the payload comes from
//!   ([`Origin`](ctxwin_std::session::Origin): a message it holds, by id, or text the core
//!   added), and the proxy re-emits the original JSON of every message the payload keeps — as
//!   this request carried it, so `cache_control` marks and thinking signatures survive byte
//!   for byte. A thinking block is part of its assistant message, so it leaves the window only
//!   with that message's unit (its tool calls and their results). An Anthropic user turn
//!   carrying tool results is pushed as one tool result per block (plus the rest), and
//!   re-emitted with the blocks whose parts are kept. A tool output the core stored reduced
//!   (head and tail) is sent reduced when its content is a plain string or text blocks only
//!   (then as one text block, keeping the last block's `cache_control`). Reading, costing and
//!   re-emitting are [`ctxwin_std::format`]'s ([`Request`](ctxwin_std::format::Request),
//!   [`analyze_item`](ctxwin_std::format::analyze_item),
//!   [`ManagedBody`](ctxwin_std::format::ManagedBody)), which the CLI and the session use too.
//! * **The bill.** Between compactions the forwarded body only grows at its end, so the
//!   provider's prompt cache of the history holds: what the proxy adds (the block retrieved
//!   from the archive for the live request) is retrieved at a compaction and sent as the same
//!   bytes until the next one ([`conv::ConvSettings`]), and a compaction evicts down to about
//!   half of what the pinned part leaves the history, in one step. Tool outputs are sent whole while the
//!   window has room (the oldest units leave first); `[proxy] observation_limit` cuts them to
//!   head and tail, except the tools `never_cut` names. At a compaction a file read again
//!   (`[proxy] supersede`) is cut to a note in its older copies, and the newest read of each
//!   file stays ahead of older turns. A cut output names its archived original, which the
//!   model reads back through the `ctxwin_recall` tool the proxy declares and answers itself
//!   ([`recall`]). A request's `max_tokens` is kept free: the prompt plus it never pass the
//!   window.
//! * **Concurrency.** One `tokio::sync::Mutex` per conversation. A request whose work stays
//!   in memory (pushing its new messages and composing, tens of microseconds) runs on the
//!   async thread that read it; disk work (loading a conversation from its checkpoint,
//!   checkpoints, retrieval's full-text queries once something of the conversation left the
//!   core) runs in `spawn_blocking`, at most twice the cores at once. A conversation the proxy
//!   has never seen (not among those with stored rows at start, [`conv::persisted_keys`], nor
//!   loaded since) is created in memory without reading anything. Every conversation's session
//!   queues its archive rows to one [`Deferred`](ctxwin_std::store::Deferred) writer
//!   thread, which writes what many requests queued in one transaction on the one SQLite
//!   connection all of them share (a connection each cost about 200 KiB per resident
//!   conversation, and each reread the pages the others wrote); retrieval's searches read on
//!   connections of their own, one per blocking-pool worker, which in WAL mode never wait for
//!   the writer. At most `max_resident` conversations stay in memory: above it,
//!   the least recently used idle ones are checkpointed and unloaded, and reloaded from their
//!   checkpoint on their next request.
//! * **Request path.** Counting a request, timing what the proxy adds to it, the proxy key
//!   and the body limit are axum layers ([`middleware`]) around short handlers ([`routes`]);
//!   a managed request is a few steps ([`pipeline`]: parse, name the conversation, take its
//!   messages following branches, forward) and its answer another ([`respond`]).
//! * **Fleet.** With `[store] url = "postgres://…"` (or `CTXWIN_STORE_URL`) the proxy keeps
//!   its conversations in that PostgreSQL database instead of the state directory, through
//!   the storage ports ([`ctxwin_std::store::open`]), and any number of instances share it:
//!   any instance serves any conversation. The secret that names tenants and conversations
//!   is kept in the database ([`conv::fleet_secret`]), so every instance names them alike.
//!   Each conversation's session holds the conversation's lease, and every row it writes is
//!   checked against it in the database. A request first reads the newest fence (one query),
//!   unless the conversation stays on this instance: then its first write proves the lease
//!   (refused when another instance took it, and the request redone), and a request that
//!   writes nothing reads the fence after it. When another instance served the conversation
//!   since, the session reloads (the newest checkpoint and the rows after it) and the proxy
//!   rebuilds its record of the messages from the same two: the caller state of that
//!   checkpoint, then each archived message after it read again from its raw JSON
//!   ([`conv::Conv::catch_up`]). So rows are written in the request's own transactions,
//!   committed before it is forwarded, and no checkpoint is
//!   needed per request: a conversation is checkpointed once 32 messages were archived after
//!   its newest checkpoint (idle, or before it is unloaded), besides the checkpoints the
//!   session writes after an operation that pushes alone would not reproduce (a compose that
//!   evicted, a moved calibrated window). An instance taken over in the middle of a request
//!   (two instances serving one conversation at once) redoes the request whole on the new
//!   state, where its messages already written are known: the two serialize, neither
//!   interleaves nor drops the other's messages (`tests/fleet.rs`). An answer waits on the
//!   instance that forwarded it (in memory, and in its checkpoints) until the client's next
//!   request brings it back, wherever that goes: that copy is what is stored.
//! * **Crash safety.** A request's messages are queued to the archive's writer before the
//!   request is forwarded and committed within milliseconds, many requests to a transaction;
//!   commits do not wait for the disk (`synchronous = NORMAL`): the WAL is copied into the
//!   database file and synced every second by a task off the request path. A checkpoint waits
//!   until every row it covers is committed, so a checkpoint never refers to a message the
//!   archive lacks. A crash of the process can lose the rows still queued (milliseconds'
//!   worth), newer than any checkpoint: the client holds its whole history and resends
//!   them. A crash of the machine can lose the last second of commits. A checkpoint is written when a conversation has
//!   been idle for `checkpoint_idle` after a change, every `checkpoint_every` exchanges,
//!   before it is unloaded and on shutdown — off the request path. After a crash, a
//!   conversation restores its newest checkpoint, with what the conversation had recorded up
//!   to it; the client's next request resends the messages pushed after it, pushed again under the
//!   same ids, so the conversation's archive still holds each message once (the session
//!   copies the rows it rewound aside, under `<key>@rewound-…`, rather than lose them).
//! * **Answers.** Streams are passed through chunk by chunk while the assistant message is
//!   assembled on the side; a complete answer's `usage` feeds the calibrator at once, and the
//!   answer waits for the conversation's next request (kept in its checkpoints meanwhile).
//!   The client's history decides what is stored: a next request that carries the answer
//!   pushes the client's copy of it with its other new messages; one that does not (a retry
//!   after a lost answer, a "regenerate") supersedes it, and it is dropped — so the same
//!   request sent a thousand times stores its messages once (`tests/repeats.rs`). An answer
//!   no request follows stays in the checkpoints, not in the archive. A truncated stream
//!   records nothing and ends with an error event.
//!
//! * **Security.** The client's `Authorization` / `x-api-key` (and every other header but
//!   hop-by-hop ones and `x-ctxwin-*`) is forwarded upstream; headers are never logged, and
//!   only message bodies reach the archive. Listening off loopback needs a proxy key
//!   (`[proxy] api_key` / `CTXWIN_PROXY_KEY`) that clients send as `x-ctxwin-key`. Bodies
//!   above `body_limit` are refused with 413. With a proxy key, `/metrics` and
//!   `/metrics/conversations` need it too (`x-ctxwin-key`, or `Authorization: Bearer KEY` as
//!   Prometheus sends it).
//! * **What it costs** ([`conv::bill`], [`bills`]). Each conversation keeps its bill in its
//!   checkpoints: the upstream's billed prompt tokens, against an estimate of sending the
//!   client's body direct, and the stable share of its forwarded prompts' bytes; `/metrics`
//!   has the totals and the ten largest bills, `/metrics/conversations` each conversation's,
//!   [`stored_bills`] (`ctxwin stats --proxy`) reads them from the checkpoints.
//! * **Slow clients** ([`connections`]). A connection has `header_timeout` to send a
//!   request's headers (from when it opens or its previous answer ends: idle keep-alive
//!   connections are reaped by it too) and a request `body_timeout` for its body (then 408);
//!   at most `max_connections` are open (fewer if the file-descriptor limit, raised as far
//!   as needed, cannot hold them), and one more is answered 503 with `retry-after` and
//!   closed. A thousand connections stalled on their headers do not delay a valid request
//!   (`tests/hostile.rs`).
//!
//! # Limits
//!
//! * A resident session costs about 280–295 KiB in the load bench (RSS growth / sessions, the
//!   bench's own client and fake upstream connections included): its core manager starts in
//!   the `SmallCapacities` tier (about 100 KiB, all of it touched when built) and moves to
//!   `ServerCapacities` (1.7 MiB, windows up to 200k tokens) when its content needs it (past
//!   about 6 KiB of conversation). The archive connection is shared (its page cache is
//!   [`conv::ARCHIVE_CACHE_KIB`] for all).
//!   `max_resident` bounds the total.
//! * Retrieval from the archive runs only once something of the conversation has left the
//!   core (before, it could find nothing the payload lacks), once per compaction (the block is
//!   frozen until the next: a new question gets its block then); its full-text search matches the
//!   conversation's own rows only (the index holds each row's session), though BM25's word
//!   statistics count the whole archive every conversation shares.
//! * The budget counts opaque blocks by their estimate; a tool output the core reduced whose
//!   content mixes text with other blocks (images, documents) is sent whole (the budget counts
//!   what the core stored).
//! * Anthropic needs a user turn first: when eviction leaves an assistant turn first, a
//!   one-line user turn saying earlier turns were moved out of the window is sent before it.
//! * Only the first choice of an answer (`n > 1`) is recorded.
//!
//! Failures answer in the provider's error format (Anthropic's on `/v1/messages`, OpenAI's
//! elsewhere): 502/504 when the upstream is down or slow, 400 when the pinned part cannot fit,
//! the body does not parse (with where) or ends before its `Content-Length`, 413 above the
//! body limit, 415 for a managed body declared other than JSON (`text/plain`, forms,
//! multipart; no content type at all is read as JSON), 405 with `Allow` for a method a route
//! does not serve, 401 without the proxy key. Upstream HTTP errors pass through. A managed
//! request's query string (`?api-version=…`) reaches the upstream as it came.
//!
//! A request the proxy refuses stores nothing: its new messages are all read and checked
//! (each by the session, without storing; tool results paired with their calls as the
//! providers require) before the first is pushed (`tests/refused.rs`). One refusal comes
//! later: a payload whose pinned part cannot fit is found when composing, after the request's
//! messages were taken.

pub mod app;
pub mod assemble;
pub mod bills;
pub mod config;
pub mod connections;
pub mod conv;
pub mod errors;
pub mod hash;
pub mod keys;
pub mod metrics;
pub mod middleware;
pub mod parsed;
pub mod pipeline;
pub mod pool;
pub mod recall;
pub mod respond;
pub mod routes;
pub mod upstream;
pub mod wire;

use std::sync::Arc;

pub use app::App;
pub use config::{ConfigError, ProxyConfig};
pub use routes::router;

/// Each stored conversation's key and bill ([`conv::bill`]), from the newest checkpoints
/// where `config` keeps the conversations (its state directory, or its fleet's database),
/// the proxy running or not: what `ctxwin stats --proxy` shows. A state directory without an
/// archive holds none (nothing is created).
///
/// # Errors
/// What failed, naming the directory or the database.
pub fn stored_bills(config: &ProxyConfig) -> Result<Vec<(String, conv::bill::Bill)>, String> {
    let dir = &config.state_dir;
    let read = || -> Result<_, conv::ConvError> {
        let stores = match &config.store_url {
            Some(url) => conv::open_fleet(url)?,
            None if !dir.join("archive.db").is_file() => return Ok(Vec::new()),
            None => conv::prepare_state(dir, false)?,
        };
        conv::stored_bills(&stores, dir)
    };
    // The synchronous PostgreSQL client blocks on a runtime of its own: not on an async thread.
    std::thread::scope(|scope| scope.spawn(read).join())
        .map_err(|_| "reading the stored bills panicked".to_string())?
        .map_err(|e| match &config.store_url {
            Some(url) => format!("store {}: {e}", ctxwin_std::store::Location::parse(url)),
            None => format!("state directory {}: {e}", dir.display()),
        })
}

/// Why [`run`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The proxy cannot start (state directory, archive, HTTP client, runtime).
    #[error("{0}")]
    Start(String),
    /// Serving failed.
    #[error("{0}")]
    Serve(std::io::Error),
}

/// Binds `config.listen`, prints `ctxwin-proxy listening on http://ADDR` on standard output
/// and serves until Ctrl-C or SIGTERM, then checkpoints every resident conversation (see
/// [`serve`]). `config` should have passed [`ProxyConfig::validate`].
///
/// # Errors
/// [`RunError`].
pub async fn run(config: ProxyConfig) -> Result<(), RunError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| RunError::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_or_else(|_| config.listen.to_string(), |a| a.to_string());
    let upstream = config.upstream.clone();
    for note in config.notes() {
        tracing::info!("ctxwin-proxy: {note}");
    }
    let app = App::new(config).map_err(RunError::Start)?;
    tracing::info!(listen = %addr, upstream = %upstream, "ctxwin-proxy: listening");
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ctxwin-proxy listening on http://{addr}");
        let _ = out.flush();
    }
    serve(app, listener, shutdown_signal()).await.map_err(RunError::Serve)
}

/// [`run`] on a new multi-threaded tokio runtime, for callers without one (the `ctxwin`
/// CLI, the `ctxwin-proxy` binary).
///
/// # Errors
/// [`RunError`].
pub fn run_blocking(config: ProxyConfig) -> Result<(), RunError> {
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| RunError::Start(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(run(config))
}

/// Logs to standard error, at `info` unless `RUST_LOG` says otherwise (does nothing when a
/// subscriber is already set).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    term.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = ctrl_c => {},
            () = term => {},
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
    tracing::info!("ctxwin-proxy: shutting down, checkpointing conversations");
}

/// How often the archive's WAL is copied into its database file ([`App::checkpoint_wal`]).
const WAL_CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the proxy on `listener` until `shutdown` resolves, then checkpoints every resident
/// conversation. Connections are served under the limits of [`connections`] (header and
/// body timeouts, `max_connections`; the process's file-descriptor limit is raised as far as
/// that needs).
///
/// # Errors
/// None so far: a failed `accept` is retried after a pause ([`connections`]).
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let sweeper = {
        let app = app.clone();
        tokio::spawn(async move {
            let idle = app.config.checkpoint_idle;
            let mut tick =
                tokio::time::interval((idle / 2).max(std::time::Duration::from_millis(50)));
            loop {
                tick.tick().await;
                app.checkpoint_idle(idle).await;
            }
        })
    };
    let wal = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WAL_CHECKPOINT_EVERY);
            loop {
                tick.tick().await;
                app.checkpoint_wal().await;
            }
        })
    };
    connections::serve(app.clone(), listener, router(app.clone()), shutdown).await;
    sweeper.abort();
    wal.abort();
    app.checkpoint_all().await;
    let _ = (sweeper.await, wal.await);
    // A fleet's database connections close with the last reference to the app, and the
    // synchronous PostgreSQL client blocks as it closes one: not on an async thread.
    let _ = tokio::task::spawn_blocking(move || drop(app)).await;
    Ok(())
}
