//! Client connections: the accept loop, the connection limit and the header timeout, so a
//! flood of slow or idle clients cannot starve the others (the body timeout is the body
//! reader's, [`crate::middleware`]).
//!
//! Each connection is served by hyper's HTTP/1 server with a header read timeout
//! (`header_timeout`): a client that does not send a request's complete headers within it,
//! counted from when the connection opened or its previous answer ended, is disconnected —
//! which also reaps idle keep-alive connections. At most `max_connections` are open at once,
//! lowered to what the process's file-descriptor limit allows (raised first to its hard
//! limit, as far as needed); one over it is answered `503` with an error body and
//! `retry-after`, then closed. On shutdown the proxy stops accepting, lets each connection
//! finish the request it is serving and waits for all of them.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::app::App;
use crate::errors::error_body;

/// File descriptors kept for everything but client connections: the archive's connections,
/// checkpoints being written, the upstream client's idle pool.
const RESERVED_FDS: u64 = 512;
/// Refusals being written at once; past it, a connection over the limit is closed unanswered.
const MAX_REFUSING: usize = 64;
/// How long a refusal waits for its client to read it.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// The pause after `accept` fails for want of resources (descriptors, memory).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` resolves, then waits for the open
/// connections to finish their requests.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let cap = connection_cap(app.config.max_connections);
    let open = Arc::new(Semaphore::new(cap));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (stop, stopped) = watch::channel(());
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(app.config.header_timeout);
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // A streamed answer goes out chunk by chunk: with Nagle's algorithm each
                    // small write after the first waits for the client's delayed ACK (40 ms).
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "proxy: TCP_NODELAY not set");
                    }
                    stream
                }
                Err(error) => {
                    after_accept_error(&error).await;
                    continue;
                }
            },
        };
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let connection = Connection { app: app.clone(), permit, stopped: stopped.clone() };
                tokio::spawn(connection.serve(http.clone(), router.clone(), stream));
            }
            Err(_) => refuse(&app, stream, cap, &refusing),
        }
    }
    drop(listener);
    drop(stop);
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    let _ = open.acquire_many(all).await;
}

/// One accepted connection: its place under the limit and the shutdown signal.
struct Connection {
    app: Arc<App>,
    permit: OwnedSemaphorePermit,
    stopped: watch::Receiver<()>,
}

impl Connection {
    /// Serves the connection's requests until it closes (or times out); on shutdown, the
    /// request in progress is finished and the connection closed.
    async fn serve(mut self, http: http1::Builder, router: Router, stream: TcpStream) {
        self.app.metrics.connections.fetch_add(1, Relaxed);
        {
            let service = TowerToHyperService::new(router);
            let mut conn = pin!(http.serve_connection(TokioIo::new(stream), service));
            tokio::select! {
                _ = conn.as_mut() => {}
                // Resolves when the sender is dropped: the proxy is shutting down.
                _ = self.stopped.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        }
        self.app.metrics.connections.fetch_sub(1, Relaxed);
        // The app (its router's copy went with the connection) before the place under the
        // limit: once every place is back, the proxy's shutdown holds the last reference and
        // closes the stores off the async threads.
        let Connection { app, permit, .. } = self;
        drop(app);
        drop(permit);
    }
}

/// Answers a connection over the limit with 503 (without reading its request) and closes it.
fn refuse(app: &App, stream: TcpStream, cap: usize, refusing: &Arc<Semaphore>) {
    app.metrics.connections_refused.fetch_add(1, Relaxed);
    let Ok(permit) = refusing.clone().try_acquire_owned() else { return };
    let message = format!(
        "the proxy has its limit of {cap} connections open ([proxy] max_connections); retry shortly"
    );
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_LINGER, write_refusal(stream, &message)).await;
        drop(permit);
    });
}

/// Writes the 503 and reads what the client sends until it closes: closing a socket with
/// unread bytes resets it, and a reset can discard the answer before the client reads it.
async fn write_refusal(mut stream: TcpStream, message: &str) -> std::io::Result<()> {
    let body = error_body(None, StatusCode::SERVICE_UNAVAILABLE, message);
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 4_096];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

/// A failed `accept`: one connection's trouble (reset before it was accepted) is skipped; a
/// shortage (descriptors, memory) waits a little for connections to close.
async fn after_accept_error(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    if !matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        tracing::warn!(%error, "proxy: cannot accept a connection; pausing");
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }
}

/// The most connections to hold open: `configured`, unless the file-descriptor limit (raised
/// as far as `configured` needs, up to its hard limit) allows fewer. Each client connection
/// may hold an upstream connection too: two descriptors each, plus `RESERVED_FDS`.
pub fn connection_cap(configured: usize) -> usize {
    let needed = (configured as u64).saturating_mul(2).saturating_add(RESERVED_FDS);
    let limit = raise_fd_limit(needed);
    let cap = cap_under(configured, limit);
    if cap < configured {
        tracing::warn!(
            max_connections = configured,
            allowed = cap,
            fd_limit = limit,
            "proxy: the file-descriptor limit allows fewer connections than max_connections; raise it (ulimit -n) to serve more"
        );
    }
    cap
}

/// The connections a descriptor `limit` (`None`: unlimited) leaves room for, at most
/// `configured` (and at least one).
fn cap_under(configured: usize, limit: Option<u64>) -> usize {
    let allowed = limit.map_or(usize::MAX, |limit| {
        usize::try_from(limit.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX)
    });
    // The semaphore's own bound, and `acquire_many`'s.
    let most = Semaphore::MAX_PERMITS.min(u32::MAX as usize);
    configured.min(allowed).min(most).max(1)
}

/// Raises the process's soft limit of open files towards `needed` (up to its hard limit);
/// returns the soft limit now in effect, `None` when unlimited or unknown.
#[cfg(unix)]
fn raise_fd_limit(needed: u64) -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current?;
    if soft >= needed {
        return Some(soft);
    }
    let target = limit.maximum.map_or(needed, |hard| hard.min(needed));
    let raised = rustix::process::Rlimit { current: Some(target), maximum: limit.maximum };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => Some(target),
        Err(_) => Some(soft),
    }
}

#[cfg(not(unix))]
fn raise_fd_limit(_needed: u64) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_descriptor_limit() {
        assert_eq!(cap_under(4_096, Some(1_024)), 256);
        assert_eq!(cap_under(4_096, Some(20_000)), 4_096);
        assert_eq!(cap_under(4_096, Some(100)), 1);
        assert_eq!(cap_under(usize::MAX, None), u32::MAX as usize);
        // Raised as far as needed: 100 connections fit any usual limit.
        assert_eq!(connection_cap(100), 100);
    }
}
