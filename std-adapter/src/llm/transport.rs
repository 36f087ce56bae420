//! The HTTP under [`LlmClient`](super::LlmClient): one blocking `reqwest` client over rustls
//! (the HTTP stack and TLS setup the proxy uses, so a workspace builds one), one POST per
//! attempt, and what each failure means for retrying.

use std::error::Error as _;
use std::io::{self, Read};
use std::time::Duration;

use super::LlmError;
use super::retry::retry_after;

/// Largest response body read; chat answers are a few kilobytes.
const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;

/// The connection pool and the time limits of every attempt; cheap to clone (the pool is
/// shared).
///
/// `reqwest`'s blocking client runs its connections on a thread of its own: create, call and
/// drop it on ordinary threads, not on an async runtime's workers (use `spawn_blocking`
/// there). The session's LLM jobs run on their own worker thread.
#[derive(Clone)]
pub(super) struct Transport {
    http: reqwest::blocking::Client,
    timeout: Duration,
    connect_timeout: Duration,
}

/// What one attempt produced.
pub(super) enum Attempt {
    /// The server answered (any status) with this body, asking to wait `wait` before a retry.
    Answered { status: u16, body: String, wait: Option<Duration> },
    /// No usable answer; `retryable` when another attempt may get one.
    Failed { error: LlmError, retryable: bool },
}

impl Transport {
    /// A client whose attempts each end `timeout` after they start (connecting included,
    /// to the last byte of the answer), with `connect_timeout` for DNS, TCP and TLS.
    pub(super) fn new(timeout: Duration, connect_timeout: Duration) -> Result<Self, LlmError> {
        let http = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .user_agent(concat!("ctxwin/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| LlmError::Config(format!("cannot set up the HTTP client: {error}")))?;
        Ok(Self { http, timeout, connect_timeout })
    }

    /// POSTs the JSON `body` to `url` once and reads the answer (at most 4 MiB).
    pub(super) fn post(
        &self,
        url: &str,
        body: &str,
        request_id: &str,
        authorization: Option<&str>,
        attempts: u32,
    ) -> Attempt {
        let mut request = self
            .http
            .post(url)
            // Per request, the limit covers the body too (the client's covers the headers).
            .timeout(self.timeout)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .header("X-Request-Id", request_id)
            .body(body.to_owned());
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization);
        }
        let response = match request.send() {
            Ok(response) => response,
            Err(error) => return self.failed(url, attempts, &error),
        };
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
        let wait = retry_after(header("retry-after-ms"), header("retry-after"));
        let mut bytes = Vec::new();
        if let Err(error) = response.take(MAX_BODY_BYTES + 1).read_to_end(&mut bytes) {
            return self.failed_read(url, attempts, &error);
        }
        if bytes.len() as u64 > MAX_BODY_BYTES {
            let error = format!("response body longer than {MAX_BODY_BYTES} bytes");
            return Attempt::Failed { error: LlmError::Malformed(error), retryable: false };
        }
        match String::from_utf8(bytes) {
            Ok(body) => Attempt::Answered { status, body, wait },
            Err(_) => Attempt::Failed {
                error: LlmError::Malformed("the response body is not UTF-8".into()),
                retryable: false,
            },
        }
    }

    /// A request that got no answer: timeouts and connection failures are worth another
    /// attempt, a request that cannot be built is not.
    fn failed(&self, url: &str, attempts: u32, error: &reqwest::Error) -> Attempt {
        let unreachable =
            |reason: String| LlmError::Unreachable { url: url.to_owned(), attempts, reason };
        let timeout = |limit| LlmError::Timeout { url: url.to_owned(), attempts, limit };
        if error.is_builder() {
            let error = LlmError::Config(format!("invalid request: {}", chain(error)));
            return Attempt::Failed { error, retryable: false };
        }
        if error.is_timeout() {
            let limit = if error.is_connect() { self.connect_timeout } else { self.timeout };
            return Attempt::Failed { error: timeout(limit), retryable: true };
        }
        if error.is_redirect() {
            let error = LlmError::Malformed(format!("redirect refused: {}", chain(error)));
            return Attempt::Failed { error, retryable: false };
        }
        // Refused, reset, DNS, TLS, a server that hung up before answering.
        Attempt::Failed { error: unreachable(chain(error)), retryable: true }
    }

    /// Reading the answer's body failed: past the time limit, or the connection broke.
    fn failed_read(&self, url: &str, attempts: u32, error: &io::Error) -> Attempt {
        let timed_out = matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
            || error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
                .is_some_and(reqwest::Error::is_timeout);
        let error = if timed_out {
            LlmError::Timeout { url: url.to_owned(), attempts, limit: self.timeout }
        } else {
            LlmError::Unreachable { url: url.to_owned(), attempts, reason: error.to_string() }
        };
        Attempt::Failed { error, retryable: true }
    }
}

/// An error and its causes on one line (`reqwest`'s own message omits them: "error sending
/// request" says nothing without "connection refused").
fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    use super::*;

    fn transport() -> Transport {
        Transport::new(Duration::from_secs(5), Duration::from_secs(1)).unwrap()
    }

    /// A server that reads one request and answers 200 with `body` (then closes).
    fn answering(body: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut stream = reader.into_inner();
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        });
        url
    }

    #[test]
    fn a_refused_connection_is_unreachable_and_retryable_and_says_why() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
        drop(listener);
        match transport().post(&url, "{}", "r1", None, 1) {
            Attempt::Failed { error: LlmError::Unreachable { reason, .. }, retryable: true } => {
                assert!(reason.to_lowercase().contains("refused"), "{reason}");
            }
            Attempt::Failed { error, retryable } => panic!("{error:?} (retryable {retryable})"),
            Attempt::Answered { status, .. } => panic!("answered {status}"),
        }
    }

    #[test]
    fn bodies_over_the_limit_or_not_utf8_are_malformed_and_not_retried() {
        let too_long = usize::try_from(MAX_BODY_BYTES).unwrap() + 1;
        for body in [vec![b'x'; too_long], vec![0xff, 0xfe]] {
            let url = answering(body);
            assert!(matches!(
                transport().post(&url, "{}", "r1", None, 1),
                Attempt::Failed { error: LlmError::Malformed(_), retryable: false }
            ));
        }
        let url = answering(b"{\"ok\":true}".to_vec());
        assert!(matches!(
            transport().post(&url, "{}", "r1", Some("Bearer k"), 1),
            Attempt::Answered { status: 200, ref body, wait: None } if body == "{\"ok\":true}"
        ));
    }
}
